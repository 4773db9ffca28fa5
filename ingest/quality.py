"""Physical-consistency checks of a run's odometry.

Lidar-inertial odometry sometimes freezes its translation and then catches up, or relocalises, so
the position jumps by decimetres between two samples while the heading (integrated from the gyro)
stays smooth. A simulator replaying the wheel commands cannot follow such a jump, and a score
across it measures the odometry's error, not the model's. `odometry_jumps` finds them by the
acceleration they imply: a wheeled robot on the ground accelerates at most ``mu g`` (about 1 g
even on grippy ground), so an implied acceleration above 3 g is not motion.

`odometry_lag` measures how far the odometry's translation and heading trail the wheels, by
cross-correlating speeds and turn rates. A rigid robot's speed and turn rate both follow its wheels
within the time its traction needs (the engine's replays: under 0.2 s); in the Helhest logs the
lidar odometry's speed trails the wheels by 0.8-1.1 s while its heading trails them by under
0.06 s (it starts translating a second late, then moves faster than its wheels to catch up). The
lag is not a constant delay of the whole pose (the path's direction matches the heading of the same
instant, not of a second earlier); ingest reports it and leaves the data as logged, and a fit can model
it as the odometry's observation (sysid's ``odom_delay``: a delayed body velocity along the current
heading).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .errors import DataError, RunFormatError
from .run import Run, side_speeds

MAX_ACCEL = 30.0  # [m/s^2] default threshold: about 3 g
WINDOW = 0.05  # [s] differencing interval: one sample of 20 Hz lidar odometry, whatever the resampling


@dataclass(frozen=True)
class OdometryJump:
    """One implausible stretch of odometry: times on the run's clock [s], the largest implied
    acceleration [m/s^2] and the largest position step against the surrounding motion [m]."""

    t: float
    t_end: float
    accel: float
    step: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def odometry_jumps(odom: pd.DataFrame, max_accel: float = MAX_ACCEL, window: float = WINDOW) -> list[OdometryJump]:
    """Stretches where the odometry position implies an acceleration above ``max_accel`` [m/s^2].

    The acceleration at each sample time ``t`` is the second difference of the position (x, y, z)
    over ``window`` [s], ``|p(t + w) - 2 p(t) + p(t - w)| / w^2`` (positions interpolated linearly,
    so a log resampled to a higher rate gives the same figure as the raw one); flagged samples less
    than ``window`` apart form one jump. ``step`` is that second difference times ``w^2``: how far
    the position left the path its neighbours predict.
    """
    if not (np.isfinite(max_accel) and max_accel > 0):
        raise DataError(f"max_accel must be a positive acceleration [m/s^2], got {max_accel}")
    if not (np.isfinite(window) and window > 0):
        raise DataError(f"window must be a positive duration [s], got {window}")
    t = odom["t"].to_numpy(float)
    if t.size < 3 or t[-1] - t[0] < 2 * window:
        return []
    p = odom[["x", "y", "z"]].to_numpy(float)
    tc = t[(t >= t[0] + window) & (t <= t[-1] - window)]

    def at(times: np.ndarray) -> np.ndarray:
        return np.stack([np.interp(times, t, p[:, k]) for k in range(3)], axis=1)

    with np.errstate(over="ignore", invalid="ignore"):  # positions near 1e308: an infinite jump, flagged
        second = at(tc + window) - 2.0 * at(tc) + at(tc - window)
        step = np.linalg.norm(second, axis=1)
    step = np.where(np.isnan(step), np.inf, step)
    accel = step / window**2
    flagged = np.flatnonzero(accel > max_accel)
    jumps: list[OdometryJump] = []
    start: int | None = None
    prev = 0  # the last flagged index, read once start is set
    for i in map(int, flagged):
        if start is not None and tc[i] - tc[prev] > window + 1e-9:
            jumps.append(_jump(tc, accel, step, start, prev))
            start = None
        if start is None:
            start = i
        prev = i
    if start is not None:
        jumps.append(_jump(tc, accel, step, start, prev))
    return jumps


def _jump(tc: np.ndarray, accel: np.ndarray, step: np.ndarray, a: int, b: int) -> OdometryJump:
    return OdometryJump(t=float(tc[a]), t_end=float(tc[b]), accel=float(accel[a : b + 1].max()),
                        step=float(step[a : b + 1].max()))


MAX_LAG = 2.0  # [s] default search range of odometry_lag
MAX_SPEED = 1e6  # [m/s], [rad/s] odometry faster than this is out of range: no lag is measured on it
MIN_CORRELATION = 0.5  # below this peak correlation a lag estimate says nothing


@dataclass(frozen=True)
class OdometryLag:
    """How far the odometry trails the wheel series [s] (positive: the odometry is later), and the
    peak correlations that found it. ``delay`` = translation - yaw lag: how far the position trails
    the heading, which a rigid robot cannot do (both follow the same wheels)."""

    translation: float
    yaw: float
    r_translation: float
    r_yaw: float

    @property
    def delay(self) -> float:
        return self.translation - self.yaw

    def as_dict(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in asdict(self).items()}, "delay": float(self.delay)}


def odometry_lag(run: Run, max_lag: float = MAX_LAG, step: float = 0.01) -> OdometryLag:
    """Lag of the odometry's speed and turn rate behind the wheels' (``wheel_meas`` when logged,
    else ``wheel_cmd``), each the shift in [-max_lag, max_lag] [s] (on a ``step`` [s] grid) that
    maximises the Pearson correlation of

    - translation: odometry speed ``|d(x, y)/dt|`` with the wheels' mean speed ``|left + right| / 2``,
    - yaw: odometry yaw rate ``d yaw/dt`` with the wheels' difference ``right - left``.

    Correlation is scale-free, so no wheel radius or track width enters. Raises DataError when the
    run is too short or does not move (nothing to correlate).
    """
    if not (np.isfinite(max_lag) and max_lag > 0 and np.isfinite(step) and 0 < step < max_lag):
        raise DataError(f"odometry_lag needs 0 < step < max_lag [s], got step={step}, max_lag={max_lag}")
    odom = run.odom
    wheels = run.wheel_meas if run.wheel_meas is not None else run.wheel_cmd
    t = odom["t"].to_numpy(float)
    tw = wheels["t"].to_numpy(float)
    t0, t1 = max(t[0], tw[0]), min(t[-1], tw[-1])
    if t1 - t0 < 4 * max_lag:
        raise DataError(f"run {run.name!r}: odometry and wheels overlap for {max(t1 - t0, 0):.2f} s; the lag "
                        f"search over +/-{max_lag:g} s needs at least {4 * max_lag:g} s")
    grid = np.arange(t0, t1, step)
    speed = np.hypot(np.gradient(odom["x"].to_numpy(float), t), np.gradient(odom["y"].to_numpy(float), t))
    yaw_rate = np.gradient(np.unwrap(odom["yaw"].to_numpy(float)), t)
    if not (np.all(np.abs(speed) < MAX_SPEED) and np.all(np.abs(yaw_rate) < MAX_SPEED)):
        raise DataError(f"run {run.name!r}: the odometry moves faster than {MAX_SPEED:g} m/s (positions out of "
                        "range); no lag can be measured")
    try:
        meta = getattr(run, "meta", None)
        left, right = side_speeds(wheels, meta.get("wheel_sides") if isinstance(meta, dict) else None)
    except RunFormatError as err:
        raise DataError(f"run {run.name!r}: {err}") from None
    k = int(round(max_lag / step))
    out = []
    for odo, whl, what in ((speed, np.abs(left + right) / 2, "speed"), (yaw_rate, right - left, "turn rate")):
        a, b = np.interp(grid, t, odo), np.interp(grid, tw, whl)
        if np.std(a) < 1e-9 or np.std(b) < 1e-9:
            raise DataError(f"run {run.name!r}: the {what} is constant; there is no motion to find a lag in")
        best = max((_corr(a[s:], b[: b.size - s]) if s >= 0 else _corr(a[:s], b[-s:]), s) for s in range(-k, k + 1))
        out.append((best[1] * step, best[0]))
    return OdometryLag(translation=out[0][0], yaw=out[1][0], r_translation=out[0][1], r_yaw=out[1][1])


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = a.std(), b.std()
    if sa < 1e-12 or sb < 1e-12:
        return -1.0
    return float(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb))
