"""Calibration of one parameter (the wheel-command scale) on a flat segment of each run before the
main fit (paper §IV-A; config ``fit.calibration``)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.optimize

from sysid.errors import ConfigError, SimulatorError
from sysid.fit.metrics import LEVER_ARM, quat_yaw
from sysid.fit.optimizer import FitResult
from sysid.fit.options import FitOptions
from sysid.fit.params import ParameterSet
from sysid.fit.residuals import RunSet
from sysid.fit.trace import Progress
from sysid.fit.uncertainty import covariance_details
from sysid.simulators.protocol import Simulator, rollout_many

if TYPE_CHECKING:
    from ingest.run import Run


# [rad/m] a suggested fit.calibration.max_curvature: a chord is straight when the measured heading turns by at
# most this much per metre of it. Replayed over the Husky's sweep, the engine at its starting and at its
# identified values drives the runs this straight within 1 % of each other and its tightest turns 15 % apart
# (docs/fit.md, pipeline step 2)
STRAIGHT = 0.15
YAW_NOISE = 0.01  # [rad] heading change over a chord allowed for the odometry's own noise


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
    max_curvature: float | None = None,
) -> Calibration:
    """Calibrate only ``parameter`` on the ``segment`` window of each run that has it (paper §IV-A:
    the wheel-command scale on the steady pre-obstacle cruise, disjoint from the scored climb). Other
    parameters stay at their current values.

    The residual compares speeds, not poses: at every sample of the window, the distance the base
    covers over the next ``SPEED_WINDOW`` (its chord in the plane), simulated minus measured. A speed
    scale is then not asked to make up for a turn the model at its start values turns too little or
    too much (on a circling cruise a pose residual would take the scale far off, 1.33 for the
    kinematic baseline on the Helhest's circle), and the start-up transient before the window,
    which depends on the other, not yet identified parameters, leaves no offset; the replay's first
    ``SETTLE`` s are not compared (a piece cut from a run starts its replay there). Runs weigh like
    the fit's (each its mean over its samples); a run left with nothing to compare is skipped.

    With ``max_curvature`` [rad/m] (e.g. ``STRAIGHT``) only straight chords are compared: those within
    which the measured heading departs from its value at the chord's start by at most that times the
    chord (plus ``YAW_NOISE``). In a turn the model's speed depends on its not yet identified friction
    and slip parameters (a skid-steer loses forward speed in a turn by an amount they set), so a scale
    calibrated there depends on their start values. Where no training run has a straight chord, every
    chord is compared and a warning says so. ``None`` (the default) compares every chord: on noisy
    odometry the straightness test keeps a random subset of a straight cruise's chords.

    The value does not depend on the parameter's start: the loss is scanned over its bounds
    (``GRID`` points, one batched replay) and the best cell solved to ``XTOL`` (bounded Brent); the
    start only gives ``fit.loss_initial``. ``fit`` carries the std and interval (from the residuals'
    derivative by central differences, time-correlation corrected as the fit's ``ess`` intervals),
    ``iterations`` the replays spent; ``progress`` sees one entry at the end. ``lever_arm`` and
    ``max_iter`` are accepted for the fit's signature and unused. Raises ConfigError when no run has
    the segment."""
    del lever_arm, max_iter
    if parameter not in params:
        raise ConfigError(f"calibration parameter {parameter!r} is not among the parameters {list(params.names)}")
    have = [r for r in runs if segment in r.segments]
    skipped = [r.name for r in runs if segment not in r.segments]
    if not have:
        raise ConfigError(
            f"no training run has a {segment!r} segment for calibrating {parameter!r}; "
            "set fit.calibration.enabled: false or give runs with that segment"
        )
    t0 = time.perf_counter()
    data = RunSet.build(have, [r.segments[segment] for r in have])
    speeds = SpeedResiduals(sim, data, params, parameter, dt, max_curvature)
    turning = None
    if not speeds.names and max_curvature is not None:
        turning = SpeedResiduals(sim, data, params, parameter, dt, None)
        if turning.names:
            speeds = turning
    if not speeds.names:
        raise ConfigError(f"no training run's {segment!r} segment lasts past its first {SETTLE:g} s plus "
                          f"{SPEED_WINDOW:g} s, the least the calibration of {parameter!r} compares; set "
                          "fit.calibration.enabled: false or give longer runs")
    skipped += [n for n in data.names if n not in speeds.names]
    start = float(params[parameter].value)
    value, loss_start = speeds.solve(start)
    r, jac = speeds.residuals(value), speeds.derivative(value)
    out = params.copy()
    out[parameter].value = value
    fit = FitResult(params=out, names=(parameter,), optimizer="scan+brent", success=True,
                    message=f"converged: the loss's minimum over the bounds to {XTOL:g} of their span",
                    iterations=speeds.calls, loss_initial=loss_start, loss_final=float(np.dot(r, r)),
                    train_errors_initial={}, train_errors_final={}, convergence="xtol",
                    wall_time=time.perf_counter() - t0, n_sim_calls=speeds.calls)
    # one channel laid out as the fit's four (x, y, z, L yaw) with three empty: the same ess intervals
    r4, j4 = np.zeros((len(r), 4)), np.zeros((len(r), 4))
    r4[:, 0], j4[:, 0] = r, jac
    blocks = [slice(4 * b.start, 4 * b.stop) for b in speeds.slices]
    cov, half, _taus, n_eff = covariance_details(r4.ravel(), j4.reshape(-1, 1), 4 * len(r), FitOptions().alpha,
                                                 1e-12, blocks, "ess", 0.01)
    fit.n_eff = float(n_eff)
    if np.isfinite(cov[0, 0]) and cov[0, 0] >= 0:
        fit.std = {parameter: float(math.sqrt(cov[0, 0]))}
        lo, hi = params[parameter].lower, params[parameter].upper
        fit.intervals = {parameter: (float(max(value - half[0], lo)), float(min(value + half[0], hi)))}
    else:
        fit.std = {parameter: math.inf}
    if turning is not None and speeds is turning:
        fit.warnings.append(
            f"calibration of {parameter}: no training run's {segment!r} segment has a straight stretch (heading "
            f"turning less than {max_curvature:g} rad/m over {SPEED_WINDOW:g} s), so it was calibrated on turns, "
            "where the model's speed depends on the start values of its friction and slip parameters; give a "
            "run that drives straight, or set fit.calibration.enabled: false to fit it with the others")
    side = out[parameter].at_bound()
    if side is not None:
        fit.warnings.append(f"calibrated {parameter} = {value:.4g} is at its {side} bound: the cruise asks for a "
                            "value outside the bounds; widen them or check the runs' cruise segments")
    if progress is not None:
        progress({"iter": 0, "loss": fit.loss_final, "evaluations": speeds.calls, "theta": {parameter: value}})
    return Calibration(parameter, segment, value, speeds.names, skipped, fit)


GRID = 7  # points of the scan over the calibrated parameter's bounds
# The 1-D solve's tolerance as a share of the bounds' span. The scan and the solve never see the start
# value, so any two starts give the same value exactly; this is its distance to the minimum.
XTOL = 1e-4
SPEED_WINDOW = 0.5  # [s] the calibration compares the distances covered over this long
# [s] after a replay's first sample, not compared: its start-up transient (from rest, or from the logged
# wheels' speed) depends on the other, not yet identified parameters; a piece cut from a run starts one
SETTLE = 1.0


def _compared(run: Run, meas: np.ndarray, max_curvature: float | None = None) -> tuple[int, np.ndarray]:
    """(samples per ``SPEED_WINDOW``, which samples of the window ``meas`` start a compared chord): past
    the replay's first ``SETTLE`` s and, with ``max_curvature`` [rad/m], straight."""
    t = meas[:, 0]
    lag = max(1, int(round(SPEED_WINDOW / float(np.median(np.diff(t)))))) if len(t) > 1 else 1
    keep = t[: max(len(t) - lag, 0)] >= float(run.odom["t"].iloc[0]) + SETTLE
    if max_curvature is not None and keep.any():
        # the heading's largest departure within the chord from its start (a slalom's swing that ends
        # where it began is no straight stretch)
        yaw = np.unwrap(quat_yaw(meas[:, 4:8]))
        turn = np.abs(np.lib.stride_tricks.sliding_window_view(yaw, lag + 1) - yaw[: len(yaw) - lag, None]).max(axis=1)
        chord = SpeedResiduals.chords(meas, lag)
        keep &= turn <= max_curvature * chord + YAW_NOISE
    return lag, keep


def compared_runs(runs: Sequence[Run], segment: str = "cruise") -> list[str]:
    """Names of the runs whose ``segment`` the calibration can compare: it lasts past the replay's
    first ``SETTLE`` s plus ``SPEED_WINDOW`` s (pieces cut short by ``data.split`` may not)."""
    have = [r for r in runs if segment in r.segments]
    if not have:
        return []
    data = RunSet.build(have, [r.segments[segment] for r in have])
    return [n for n, run, meas in zip(data.names, data.runs, data.measured, strict=True)
            if _compared(run, meas)[1].any()]


class SpeedResiduals:
    """The calibration's residuals as a function of the one calibrated parameter's value (the other
    parameters at their values in ``params``): per run (``data``, windows = the segments), at each
    window sample, the chord the base covers over the next ``SPEED_WINDOW`` s in the plane [m],
    simulated minus measured, times sqrt(weight / samples); the first ``SETTLE`` s of each replay are
    left out, and with ``max_curvature`` [rad/m] every chord that turns more than that (`_compared`). A
    run left with no chord is skipped (``names``: the runs compared)."""

    def __init__(self, sim: Simulator, data: RunSet, params: ParameterSet, name: str, dt: float,
                 max_curvature: float | None = None):
        self.sim, self.data, self.name, self.dt = sim, data, name, float(dt)
        self.theta = params.values()
        self.par = params[name]
        self.calls = 0
        self.slices: list[slice] = []
        self.meas: list[np.ndarray] = []
        self.lags: list[int] = []
        self.keep: list[np.ndarray] = []  # per run, which window samples start a compared chord
        k = 0
        for run, meas in zip(data.runs, data.measured, strict=True):
            lag, keep = _compared(run, meas, max_curvature)
            self.lags.append(lag)
            self.keep.append(keep)
            self.meas.append(self.chords(meas, lag)[keep] if keep.any() else np.zeros(0))
            self.slices.append(slice(k, k + int(keep.sum())))
            k += int(keep.sum())
        self.names = [n for n, m in zip(data.names, self.meas, strict=True) if len(m)]

    @staticmethod
    def chords(pose: np.ndarray, lag: int) -> np.ndarray:
        return np.asarray(np.hypot(pose[lag:, 1] - pose[:-lag, 1], pose[lag:, 2] - pose[:-lag, 2]), float)

    def _assemble(self, poses: Sequence[np.ndarray]) -> np.ndarray:
        out = [np.zeros(0)]
        for i, (mask, meas) in enumerate(zip(self.data.masks, self.meas, strict=True)):
            pose = np.asarray(poses[i], float)
            if pose.shape != (len(mask), 8):
                raise SimulatorError(f"simulator returned poses of shape {pose.shape} for run "
                                     f"{self.data.names[i]!r}; expected ({len(mask)}, 8)")
            if not len(meas):
                continue
            sim = self.chords(pose[mask], self.lags[i])[self.keep[i]]
            out.append(math.sqrt(self.data.weights[i] / len(sim)) * (sim - meas))
        return np.concatenate(out)

    def residuals(self, value: float) -> np.ndarray:
        self.calls += 1
        return self._assemble(self.sim.rollout(self.data.runs, {**self.theta, self.name: value}, self.dt))

    def loss(self, value: float) -> float:
        try:
            r = self.residuals(value)
        except SimulatorError:
            return math.inf
        loss = float(np.dot(r, r))
        return loss if math.isfinite(loss) else math.inf

    def losses(self, values: Sequence[float]) -> np.ndarray:
        """The loss at several values, replayed as one batch where the simulator can."""
        try:
            self.calls += 1
            batch = rollout_many(self.sim, self.data.runs, [{**self.theta, self.name: v} for v in values], self.dt)
            out = np.array([float(np.dot(r, r)) for r in (self._assemble(p) for p in batch)])
        except SimulatorError:
            out = np.array([self.loss(v) for v in values])
        return np.where(np.isfinite(out), out, np.inf)

    def _grid(self) -> np.ndarray:
        lo, hi = self.par.lower, self.par.upper
        if self.par.log_scale:
            return np.asarray(np.exp(np.linspace(math.log(lo), math.log(hi), GRID)), float)
        return np.linspace(lo, hi, GRID)

    def solve(self, start: float) -> tuple[float, float]:
        """The minimiser over the bounds and the loss at ``start`` (scan, then bounded Brent)."""
        grid = self._grid()
        losses = self.losses([*grid, start])
        k = int(np.argmin(losses[:GRID]))
        if not np.isfinite(losses[k]):
            raise SimulatorError(f"calibration: the replay fails or diverges at every scanned {self.name}")
        to_u, from_u = ((math.log, math.exp) if self.par.log_scale else (float, float))
        lo, hi = to_u(grid[max(k - 1, 0)]), to_u(grid[min(k + 1, GRID - 1)])
        span = to_u(self.par.upper) - to_u(self.par.lower)
        sol = scipy.optimize.minimize_scalar(lambda u: self.loss(from_u(u)), bounds=(lo, hi), method="bounded",
                                             options={"xatol": XTOL * span})
        value = float(from_u(sol.x)) if np.isfinite(sol.fun) and sol.fun <= losses[k] else float(grid[k])
        return value, float(losses[GRID])

    def derivative(self, value: float) -> np.ndarray:
        """d residuals / d value by central differences (one batched replay)."""
        h = 1e-3 * (self.par.upper - self.par.lower)
        a, b = max(value - h, self.par.lower), min(value + h, self.par.upper)
        self.calls += 1
        lo, hi = rollout_many(self.sim, self.data.runs, [{**self.theta, self.name: a}, {**self.theta, self.name: b}],
                              self.dt)
        return np.asarray((self._assemble(hi) - self._assemble(lo)) / (b - a), float)
