"""Errors of the identification layer: typed, raised before computation where possible.

The command line catches ``SysidError`` at one boundary, prints ``error: <message>`` and exits
with status 2; every message says what was wrong and what to do about it.
"""

from __future__ import annotations


class SysidError(Exception):
    """Base class of every user-facing error of `sysid` (bad input, not a bug)."""


class ConfigError(SysidError):
    """A configuration value is invalid: unknown parameter, reversed bounds, missing file, ..."""


class DataError(SysidError):
    """Runs could not be loaded or do not hold what the fit needs (topics, segments, samples)."""


class SimulatorError(SysidError):
    """The simulator is unknown, not installed, or returned something that breaks the protocol."""


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
