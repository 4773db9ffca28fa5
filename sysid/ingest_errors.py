"""Ingest's errors as `sysid`'s: ``from_ingest`` re-raises an ``ingest.errors.IngestError`` as the matching
`sysid.errors.SysidError`, by class.

``ingest`` is a leaf package that never imports `sysid`, so its errors have their own root (``IngestError``).
Where `sysid` calls ingest it does so inside ``from_ingest``, so that the command line's one boundary over
`SysidError` reports both. This lives apart from `sysid.errors`, which the engine imports: the engine may not
import ingest, not even its errors (import-linter).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import TracebackType
from typing import ParamSpec, TypeVar

import ingest.errors as ingest_errors
from sysid.errors import ConfigError, DataError, SysidError

P = ParamSpec("P")
R = TypeVar("R")

# ingest error class -> the sysid error it becomes (the first that matches); every other ingest error is bad data
TRANSLATION: tuple[tuple[type[ingest_errors.IngestError], type[SysidError]], ...] = (
    (ingest_errors.ConfigError, ConfigError),
)


def translate_ingest(exc: BaseException, prefix: str = "", error: type[SysidError] | None = None
                     ) -> SysidError | None:
    """The sysid error an ingest error becomes: ``error`` if given, else the class its class maps to
    (``TRANSLATION``, else `DataError`), with the message ``prefix + str(exc)``; None when ``exc`` is not
    an ingest error."""
    if not isinstance(exc, ingest_errors.IngestError):
        return None
    if error is None:
        error = next((ours for theirs, ours in TRANSLATION if isinstance(exc, theirs)), DataError)
    return error(prefix + str(exc))


class from_ingest:  # noqa: N801 - used as a lower-case context manager / decorator, like contextlib's
    """Re-raise an ``ingest.errors.IngestError`` raised inside as the matching `SysidError` with the
    same message, chained (``raise ... from``): ingest's ``ConfigError`` becomes ``ConfigError``,
    every other ingest error ``DataError``. Other exceptions pass through untouched.

    ``prefix`` is put before the message (which file it was about) and ``error`` forces the class
    where the caller knows better (a topic map that cannot be applied to a run is bad data).

    ``with from_ingest(): run = ingest.load_run(path)``, or ``@from_ingest()`` on a function.
    """

    def __init__(self, prefix: str = "", error: type[SysidError] | None = None) -> None:
        self.prefix = prefix
        self.error = error

    def __enter__(self) -> from_ingest:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # never swallows: re-raises translated, else propagates
        if exc is None:
            return
        mapped = translate_ingest(exc, self.prefix, self.error)
        if mapped is not None:
            raise mapped from exc

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapped
