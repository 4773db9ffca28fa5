"""Trajectory error metrics of the paper (Ostrich §IV-A), all in SI units.

Poses are arrays ``(T, 8)``: ``t`` [s], ``x, y, z`` [m], ``qx, qy, qz, qw`` (unit quaternion, world
from base). The combined error of one run is

    E = sqrt( mean_t |p_sim - p_meas|^2 + (L * RMSE(yaw_sim - yaw_meas))^2 )      [m]

with lever arm ``L = 0.5 m``: a heading error of 1 rad weighs like 0.5 m of position error.
Yaw differences are wrapped to (-pi, pi] so a trajectory crossing +-pi is not penalised.
"""

from __future__ import annotations

import numpy as np

from ingest.transforms import euler_to_quat as yaw_quat  # noqa: F401  (re-exported: callers name it so)
from ingest.transforms import quat_yaw as quat_yaw  # re-exported (explicitly, for mypy): callers name it so

LEVER_ARM = 0.5  # [m] the paper's L


def wrap_angle(a: np.ndarray | float) -> np.ndarray:
    """Wrap angles [rad] to the half-open interval (-pi, pi]."""
    a = np.asarray(a, dtype=float)
    return np.pi - np.mod(np.pi - a, 2.0 * np.pi)


def _check(sim: np.ndarray, meas: np.ndarray) -> None:
    if sim.shape != meas.shape or sim.ndim != 2 or sim.shape[1] != 8:
        raise ValueError(f"poses must both be (T, 8) arrays; got {sim.shape} and {meas.shape}")


def position_errors(sim: np.ndarray, meas: np.ndarray, planar: bool = False) -> np.ndarray:
    """Per-sample position error |p_sim - p_meas| [m] (xy only when ``planar``)."""
    _check(sim, meas)
    cols = slice(1, 3) if planar else slice(1, 4)
    err: np.ndarray = np.linalg.norm(sim[:, cols] - meas[:, cols], axis=1)
    return err


def yaw_errors(sim: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """Per-sample heading error [rad], wrapped to (-pi, pi]."""
    _check(sim, meas)
    return wrap_angle(quat_yaw(sim[:, 4:8]) - quat_yaw(meas[:, 4:8]))


def mean_xy_distance(sim: np.ndarray, meas: np.ndarray) -> float:
    """Mean planar distance [m] between simulated and measured base positions."""
    return float(np.mean(position_errors(sim, meas, planar=True)))


def yaw_rmse(sim: np.ndarray, meas: np.ndarray) -> float:
    """Root-mean-square heading error [rad] (wrapped differences)."""
    return float(np.sqrt(np.mean(yaw_errors(sim, meas) ** 2)))


def combined_error(sim: np.ndarray, meas: np.ndarray, lever_arm: float = LEVER_ARM) -> float:
    """The paper's yaw-aware combined error [m]; non-finite simulations give ``inf``."""
    if not np.all(np.isfinite(sim)):
        return float("inf")
    dp2 = np.mean(position_errors(sim, meas) ** 2)
    return float(np.sqrt(dp2 + (lever_arm * yaw_rmse(sim, meas)) ** 2))


def run_metrics(sim: np.ndarray, meas: np.ndarray, lever_arm: float = LEVER_ARM) -> dict[str, float]:
    """All scalar metrics of one run: combined [m], mean/final xy distance [m], yaw RMSE [rad]."""
    if not np.all(np.isfinite(sim)):
        inf = float("inf")
        return {"combined": inf, "mean_xy": inf, "final_xy": inf, "yaw_rmse": inf, "z_rmse": inf}
    with np.errstate(over="ignore", invalid="ignore"):  # odometry out of range (1e300 m): infinite errors
        return {
            "combined": combined_error(sim, meas, lever_arm),
            "mean_xy": mean_xy_distance(sim, meas),
            "final_xy": float(position_errors(sim, meas, planar=True)[-1]),
            "yaw_rmse": yaw_rmse(sim, meas),
            "z_rmse": float(np.sqrt(np.mean((sim[:, 3] - meas[:, 3]) ** 2))),
        }


TIGHTNESS_BINS = (0.0, 0.25, 0.5, 0.75, 0.95, 1.0)  # turn tightness |wR - wL| / (|wR| + |wL|)
MIN_TURN_RATE = 0.2  # [rad/s] samples whose wheels command a slower turn do not count


def turn_efficiency(
    t: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    yaws: dict[str, np.ndarray],
    radius: float,
    track: float,
    bins: tuple[float, ...] = TIGHTNESS_BINS,
    min_rate: float = MIN_TURN_RATE,
) -> dict[str, list[float]]:
    """How much of the heading change its wheels command a skid-steer robot turns, by turn tightness.

    Over each interval ``[t_k, t_k+1]`` the wheels (angular speeds ``left``, ``right`` [rad/s] at
    ``t``, wheel ``radius`` and ``track`` width [m]) command the heading change
    ``dpsi_w = radius (right - left) / track * dt``; its turn tightness is
    ``|right - left| / (|right| + |left|)`` (0 driving straight, 1 turning on the spot). Per tightness
    bin the result holds ``wheels``: the sum of ``|dpsi_w|`` [rad], and for every yaw series in
    ``yaws`` (e.g. measured and simulated, [rad] at ``t``) the heading it turned in the commanded
    sense, ``sum(sign(dpsi_w) * wrap(dpsi))`` [rad]; the ratio is the turn efficiency (1: the body
    turns as fast as its wheels say, a skid-steer robot slips to about 0.5-0.8). Intervals whose
    commanded turn rate is below ``min_rate`` [rad/s] are left out (straight driving, standing).
    """
    t = np.asarray(t, dtype=float)
    left, right = np.asarray(left, dtype=float), np.asarray(right, dtype=float)
    rate = radius * (right - left) / track
    tight = np.abs(right - left) / np.maximum(np.abs(right) + np.abs(left), 1e-12)
    mid_rate, mid_tight = 0.5 * (rate[1:] + rate[:-1]), 0.5 * (tight[1:] + tight[:-1])
    dpsi_w = mid_rate * np.diff(t)
    use = np.abs(mid_rate) >= min_rate
    which = np.clip(np.searchsorted(bins, mid_tight, side="right") - 1, 0, len(bins) - 2)
    out: dict[str, list[float]] = {"bins": [float(b) for b in bins]}
    out["wheels"] = [float(np.abs(dpsi_w[use & (which == i)]).sum()) for i in range(len(bins) - 1)]
    for key, yaw in yaws.items():
        turned = np.sign(dpsi_w) * wrap_angle(np.diff(np.asarray(yaw, dtype=float)))
        out[key] = [float(turned[use & (which == i)].sum()) for i in range(len(bins) - 1)]
    return out
