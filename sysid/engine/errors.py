"""Errors of the engine: an unsupported model or bad solver input, each message saying what to change.

`EngineError` derives from `sysid.errors.SysidError` (which imports nothing), so the command line's one
error boundary also reports engine errors, while the engine stays free of the layers above it.
"""

from __future__ import annotations

from sysid.errors import SysidError


class EngineError(SysidError):
    """Base error of the engine: an unsupported model or bad solver input, with what to change."""


class UnsupportedModelError(EngineError):
    """The newton model holds something the engine does not simulate (joint type, world layout)."""


class OptionsError(EngineError, ValueError):
    """A solver setting is out of its range or not one of its choices: a `SolverOptions` field
    (`SolverOptions.validate`), a friction-combining rule, a lane width. Also a ValueError (a bad value),
    which callers that check arguments catch."""


class ParameterError(EngineError, ValueError):
    """Parameter values that do not fit the registered parameters (`torch_bridge`: theta's size). Also a
    ValueError (a bad value)."""
