"""SIGINT and SIGTERM at the command line: both stop a command the same way.

``handled_signals()`` (entered by the ``sysid`` and ``ingest`` entry points) makes SIGINT (Ctrl-C)
and SIGTERM (what ``timeout``, systemd, docker and SLURM send) raise `Interrupted`, a
``KeyboardInterrupt``, so that every cleanup written for Ctrl-C runs for both. The command line's
boundary (``ingest.clikit.run_guarded``) prints one line and exits with 128 + the signal number
(130 for SIGINT, 143 for SIGTERM).

The commit of a set of outputs (`sysid.app.outputs.commit_outputs`) holds a signal back while it
renames (``deferred()``), so an interruption leaves the whole earlier set or the whole new set,
and records which is on disk (``set_outcome``); the printed line says it.

Imports only the standard library: the entry points install the handlers before anything slow.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Interrupted", "deferred", "handled_signals", "outcome", "set_outcome", "take_pending"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A command stopped by SIGINT or SIGTERM. ``signum`` is the signal, ``status`` the exit status
    (128 + signum) and ``outcome`` what the interruption left on disk (None: nothing was written)."""

    def __init__(self, signum: int = signal.SIGINT, outcome: str | None = None) -> None:
        super().__init__(signum, outcome)
        self.signum = int(signum)
        self.outcome = outcome

    @property
    def status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return self.outcome or ""


class _State:
    depth = 0  # nesting of deferred()
    pending: int | None = None  # the signal held back by deferred()
    outcome: str | None = None  # what is on disk after the last commit of this command


_state = _State()


def _handler(signum: int, _frame: FrameType | None) -> None:
    if _state.depth:
        if _state.pending is None:
            _state.pending = signum
        return
    raise Interrupted(signum, _state.outcome)


@contextmanager
def handled_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` inside the block (the earlier handlers are restored
    after it). Only the main thread can install handlers; elsewhere this does nothing."""
    _state.outcome, _state.pending = None, None
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    earlier = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in earlier.items():
            signal.signal(s, h)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back inside the block (the first one is kept: ``take_pending``), so
    that a short step that must not be cut in two (the renames of a commit) completes."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1


def take_pending() -> int | None:
    """The signal held back by ``deferred()`` since the last call (None when none came)."""
    signum, _state.pending = _state.pending, None
    return signum


def set_outcome(text: str | None) -> None:
    """Record what is on disk now (said by the line printed when a signal stops the command later)."""
    _state.outcome = text


def outcome() -> str | None:
    return _state.outcome
