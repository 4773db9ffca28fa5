"""The one error type of the synthetic-dataset generator (`sysid.errors.SynthError`, a `SysidError`)."""

from __future__ import annotations

from sysid.errors import SynthError

__all__ = ["SynthError"]
