"""Calibration of one parameter (the wheel-command scale) on a flat segment of each run before the
main fit (paper §IV-A; config ``fit.calibration``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sysid.errors import ConfigError
from sysid.fit.metrics import LEVER_ARM
from sysid.fit.optimizer import FitResult, optimize
from sysid.fit.params import ParameterSet
from sysid.fit.residuals import RunSet
from sysid.fit.trace import Progress
from sysid.simulators.protocol import Simulator

if TYPE_CHECKING:
    from ingest.run import Run


@dataclass
class Calibration:
    """Result of calibrating one parameter (the wheel-command scale) on a flat segment."""

    parameter: str
    segment: str
    value: float
    runs: list[str]
    skipped: list[str]
    fit: FitResult


def calibrate(
    sim: Simulator,
    runs: Sequence[Run],
    params: ParameterSet,
    dt: float,
    *,
    parameter: str = "cmd_scale",
    segment: str = "cruise",
    lever_arm: float = LEVER_ARM,
    max_iter: int = 30,
    progress: Progress | None = None,
) -> Calibration:
    """Fit only ``parameter`` on the ``segment`` window of each run that has it (paper §IV-A: the
    wheel-command scale is calibrated on the flat pre-obstacle cruise, disjoint from the scored
    climb). Other parameters stay at their current values. The residual compares displacements
    within the segment (``RunSet(anchor=True)``), so the offset left by the start-up transient,
    which depends on the other, not yet identified parameters, does not bias the scale.
    ``progress`` sees every accepted iterate (`sysid.fit.optimize`). Raises ConfigError when no run
    has the segment."""
    if parameter not in params:
        raise ConfigError(f"calibration parameter {parameter!r} is not among the parameters {list(params.names)}")
    have = [r for r in runs if segment in r.segments]
    skipped = [r.name for r in runs if segment not in r.segments]
    if not have:
        raise ConfigError(
            f"no training run has a {segment!r} segment for calibrating {parameter!r}; "
            "set fit.calibration.enabled: false or give runs with that segment"
        )
    sub = params.copy()
    sub.freeze(sub.names)
    sub.freeze([parameter], frozen=False)
    data = RunSet.build(have, [r.segments[segment] for r in have], anchor=True)
    fit = optimize(sim, data, sub, dt, optimizer="lm", max_iter=max_iter, lever_arm=lever_arm, progress=progress)
    return Calibration(parameter, segment, fit.params[parameter].value, [r.name for r in have], skipped, fit)
