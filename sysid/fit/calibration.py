"""Calibration of one parameter (the wheel-command scale) on a flat segment of each run before the
main fit (paper §IV-A; config ``fit.calibration``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.optimize

from sysid.errors import ConfigError, SimulatorError
from sysid.fit.metrics import LEVER_ARM
from sysid.fit.optimizer import FitResult, optimize
from sysid.fit.params import ParameterSet
from sysid.fit.residuals import Residuals, RunSet
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

    The value does not depend on the parameter's own start: the loss is scanned over its bounds
    (``GRID`` points, one batched rollout), the best cell is solved to ``XTOL`` (bounded Brent), and
    LM started there only adds the interval (a Gauss-Newton step from a minimum barely moves it). LM
    from the start value alone stops on its relative-loss tolerance on the flat valley of this loss,
    short of the minimum by up to ~1e-2 in the scale.
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
    res = Residuals(sim, data, sub, dt, lever_arm=lever_arm)
    z_start = res.z_start()
    z_best, loss_start = solve_1d(res, z_start)
    sub[parameter].value = float(res.theta_free(np.array([z_best]))[0])
    fit = optimize(sim, data, sub, dt, optimizer="lm", max_iter=max_iter, lever_arm=lever_arm, progress=progress)
    fit.loss_initial = loss_start  # before the calibration: at the parameter's start value
    return Calibration(parameter, segment, fit.params[parameter].value, [r.name for r in have], skipped, fit)


GRID = 7  # points of the scan over the calibrated parameter's bounds (normalised coordinate 0..1)
# The 1-D solve's tolerance in the normalised coordinate (the bounds' span is 1). The scan and the solve
# never see the start value, so any two starts give the same value exactly; this is its distance to the minimum.
XTOL = 1e-4


def solve_1d(res: Residuals, z_start: np.ndarray) -> tuple[float, float]:
    """The minimiser of the loss over the one free coordinate of ``res`` in [0, 1] and the loss at
    ``z_start``: a scan of ``GRID`` points (one batched rollout, the start among them), then bounded
    Brent on the best point's neighbouring cells to ``XTOL``. A point whose replay fails or is not
    finite counts as an infinite loss."""
    if res.n_free != 1 or res.n_nuisance:
        raise ConfigError("the calibration solves for exactly one parameter")
    grid = np.linspace(0.0, 1.0, GRID)
    zs = np.concatenate([grid, np.clip(z_start, 0.0, 1.0)])[:, None]
    try:
        losses = np.array([res.loss(r) for r in res.evaluate_many(zs)], float)
    except SimulatorError:
        losses = np.array([_loss(res, z) for z in zs[:, 0]])
    losses = np.where(np.isfinite(losses), losses, np.inf)
    k = int(np.argmin(losses[:GRID]))
    if not np.isfinite(losses[k]):
        raise SimulatorError("calibration: the replay fails or diverges at every scanned value of the parameter")
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, GRID - 1)]
    sol = scipy.optimize.minimize_scalar(lambda z: _loss(res, z), bounds=(lo, hi), method="bounded",
                                         options={"xatol": XTOL})
    z = float(sol.x) if np.isfinite(sol.fun) and sol.fun <= losses[k] else float(grid[k])
    return z, float(losses[GRID])


def _loss(res: Residuals, z: float) -> float:
    try:
        loss = res.loss(res.evaluate(np.array([z]))[0])
    except SimulatorError:
        return math.inf
    return loss if math.isfinite(loss) else math.inf
