"""What the hostile-input tests of both programs share: a deadline that turns a hang into a failure,
a command-line run with its exit status and output, and a YAML alias bomb."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """A TimeoutError in the test where the code under test hangs (an alias bomb being expanded, a
    named pipe opened for reading: the signal interrupts the blocking open)."""

    def expire(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_program(main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str],
                seconds: float) -> tuple[int, str, str]:
    """``main(argv)`` within ``deadline(seconds)``: its exit status (a SystemExit's code too), stdout, stderr."""
    with deadline(seconds):
        try:
            rc = int(main(argv))
        except SystemExit as exc:
            rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML block: ``*l8`` expands to 9**levels strings."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"
