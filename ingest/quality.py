"""Physical-consistency checks of a run's odometry.

Lidar-inertial odometry sometimes freezes its translation and then catches up, or relocalises, so
the position jumps by decimetres between two samples while the heading (integrated from the gyro)
stays smooth. A simulator replaying the wheel commands cannot follow such a jump, and a score
across it measures the odometry's error, not the model's. `odometry_jumps` finds them by the
acceleration they imply: a wheeled robot on the ground accelerates at most ``mu g`` (about 1 g
even on grippy ground), so an implied acceleration above 3 g is not motion.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .errors import DataError

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

    second = at(tc + window) - 2.0 * at(tc) + at(tc - window)
    step = np.linalg.norm(second, axis=1)
    accel = step / window**2
    flagged = np.flatnonzero(accel > max_accel)
    jumps: list[OdometryJump] = []
    start = prev = None
    for i in flagged:
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
