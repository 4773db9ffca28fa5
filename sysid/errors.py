"""Errors of `sysid`: one root, typed, raised before computation where possible.

Every user-facing error of `sysid` derives from ``SysidError``; the command line catches that one
class at one boundary (`sysid.cli.main`), prints ``error: <message>`` on one line and exits with
status 2; every message says what was wrong and what to do about it. The other layers add their own
subclasses beside their code (``sysid.engine.errors.EngineError``, ``sysid.plan.task.PlanError``,
``sysid.fit.fanout.FanoutError``, ...).

``ingest`` is a leaf package that never imports `sysid`, so its errors keep their own root
(``ingest.errors.IngestError``); `sysid` translates them by class where it calls ingest
(`sysid.ingest_errors.from_ingest`). This module imports nothing, so the engine may import it without
pulling in ingest.
"""

from __future__ import annotations

import importlib
from typing import Any


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


class ResultsError(SysidError):
    """A saved results or parameter file cannot be read back."""


class SceneError(SysidError, ValueError):
    """A robot description or scene request is invalid; the message says what to fix (raised by the
    engine's scene builders, `sysid.robot.scenes`; a ValueError as well, as it always was)."""


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
