"""Errors of `sysid`: one root, typed, raised before computation where possible.

Every user-facing error of `sysid` derives from ``SysidError``; the command line catches that one
class at one boundary (`sysid.cli.main`), prints ``error: <message>`` on one line and exits with
status 2; every message says what was wrong and what to do about it. The other layers add their own
subclasses beside their code (``sysid.engine.errors.EngineError``, ``sysid.plan.control.PlanError``,
``sysid.fit.fanout.FanoutError``, ...).

``ingest`` is a leaf package that never imports `sysid`, so its errors keep their own root
(``ingest.errors.IngestError``); `sysid` translates them where it calls ingest, through
``from_ingest``. This module imports nothing (the engine may import it without pulling in ingest):
``from_ingest`` recognises ingest's errors by their class's module instead of importing it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class SysidError(Exception):
    """Base class of every user-facing error of `sysid` (bad input, not a bug)."""


class ConfigError(SysidError):
    """A configuration value is invalid: unknown parameter, reversed bounds, missing file, ..."""


class DataError(SysidError):
    """Runs could not be loaded or do not hold what the fit needs (topics, segments, samples)."""


class SimulatorError(SysidError):
    """The simulator is unknown, not installed, or returned something that breaks the protocol."""


class OutputError(SysidError):
    """The outputs could not be written (after the work): none of them was, the message says so."""


class SynthError(SysidError):
    """Bad input to `sysid.synth` (the synthetic-dataset generator)."""


INGEST_ERRORS_MODULE = "ingest.errors"
# ingest error class name -> the sysid error it becomes; every other ingest error is bad data.
INGEST_TRANSLATION: dict[str, type[SysidError]] = {"ConfigError": ConfigError}


def ingest_error_class(exc_type: type[BaseException]) -> str | None:
    """The name of the most derived ``ingest.errors`` class of ``exc_type`` (None when it is not an
    ingest error)."""
    for cls in exc_type.__mro__:
        if cls.__module__ == INGEST_ERRORS_MODULE:
            return cls.__name__
    return None


def translate_ingest(exc: BaseException, prefix: str = "", error: type[SysidError] | None = None
                     ) -> SysidError | None:
    """The sysid error an ingest error becomes: ``error`` if given, else the class matching the
    ingest class (``INGEST_TRANSLATION``), with the message ``prefix + str(exc)``; None when ``exc``
    is not an ingest error."""
    name = ingest_error_class(type(exc))
    if name is None:
        return None
    if isinstance(exc, SysidError):  # pragma: no cover - ingest never raises sysid errors
        return exc
    return (error or INGEST_TRANSLATION.get(name, DataError))(prefix + str(exc))


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
        if mapped is not None and mapped is not exc:
            raise mapped from exc

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapped


class ResultsError(SysidError):
    """A saved results or parameter file cannot be read back."""


class SceneError(SysidError, ValueError):
    """A robot description or scene request is invalid; the message says what to fix (raised by the
    engine's scene builders, `sysid.engine.scenes`; a ValueError as well, as it always was)."""


class RobotDescriptionError(SceneError, ConfigError):
    """The robot description cannot be read or does not fit together: a missing or malformed
    robot.yaml / wheel map / URDF, a wheel map naming a joint the URDF lacks, a robot without driven
    wheels, a run whose wheel names match none of the robot's wheels. A user error (``sysid`` prints
    it as one line): the message says what was wrong and what to do."""


class MissingDependencyError(SysidError):
    """An optional dependency (an extra of the package) is not installed."""


def optional_import(module: str, extra: str, purpose: str) -> Any:
    """``import module`` for ``purpose``, or a `MissingDependencyError` naming the extra that installs it
    (``pip install 'sysid[extra]'``): the main job needs none of the optional extras."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs the Python package {module!r}, which is not installed (or does not import: {exc}); "
            f"install it with pip install 'sysid[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        ) from exc
