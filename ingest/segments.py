"""Named time segments of a run: stationary, flat cruise, obstacle climb (onset from z and pitch).

Thresholds are in SI units; they suit a ~0.1-0.2 m obstacle under a ~0.7 m wheelbase robot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.ndimage import median_filter, uniform_filter1d

from .run import Run


@dataclass(frozen=True)
class SegmentParams:
    v_still: float = 0.03  # [m/s] below: not moving
    w_still: float = 0.05  # [rad/s]
    cmd_still: float = 0.1  # [rad/s] wheel command magnitude below: no command
    min_still_s: float = 0.5  # [s] shortest stationary segment
    v_move: float = 0.05  # [m/s] above: cruising
    min_cruise_s: float = 0.5  # [s]
    z_climb: float = 0.025  # [m] rise above the flat baseline that means "on the obstacle"
    pitch_climb_deg: float = 3.0  # [deg] pitch change that means "climbing"
    onset_fraction: float = 0.25  # walk back from detection to this fraction of the thresholds
    cruise_margin_s: float = 0.3  # [s] cruise ends this long before the climb onset
    smooth_s: float = 0.2  # [s] smoothing window for speeds / pitch


def _intervals(mask: np.ndarray, t: np.ndarray, min_len: float) -> list[tuple[float, float]]:
    out = []
    m = np.r_[False, mask, False].astype(int)
    starts = np.flatnonzero(np.diff(m) == 1)
    ends = np.flatnonzero(np.diff(m) == -1) - 1
    for a, b in zip(starts, ends):
        if t[b] - t[a] >= min_len:
            out.append((float(t[a]), float(t[b])))
    return out


def body_speeds(run: Run, smooth_s: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Forward speed v [m/s] and yaw rate w [rad/s] at the odometry samples (finite differences)."""
    od = run.odom
    t = od["t"].to_numpy()
    dtm = float(np.median(np.diff(t)))
    k = max(1, int(round(smooth_s / dtm)))
    x = uniform_filter1d(od["x"].to_numpy(), k, mode="nearest")
    y = uniform_filter1d(od["y"].to_numpy(), k, mode="nearest")
    yaw = od["yaw"].to_numpy()
    vx, vy = np.gradient(x, t), np.gradient(y, t)
    v = vx * np.cos(yaw) + vy * np.sin(yaw)
    w = uniform_filter1d(np.gradient(yaw, t), k, mode="nearest")
    return v, w


def detect_segments(
    run: Run, params: SegmentParams | None = None
) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    """Segments {name: (t0, t1)} [s] and details (climb onset time/pose, baselines).

    - ``stationary`` (and ``stationary_2``, ...): not moving and no wheel command.
    - ``climb``: from the onset (z or pitch leave the flat baseline; walked back to where they first
      start to change) until the robot is back on flat ground or the run ends.
    - ``cruise``: the longest moving, flat interval before the climb onset (minus a margin); the
      whole run when there is no climb.
    """
    p = params or SegmentParams()
    od = run.odom
    t = od["t"].to_numpy()
    if t.size < 3:
        return {}, {}
    dtm = float(np.median(np.diff(t)))
    k = max(1, int(round(p.smooth_s / dtm)))
    v, w = body_speeds(run, p.smooth_s)
    cmd = run.wheel_cmd
    cmag = np.zeros_like(t)
    for c in [c for c in cmd.columns if c != "t"]:  # every wheel column
        cmag = np.maximum(cmag, np.abs(np.interp(t, cmd["t"].to_numpy(), cmd[c].to_numpy())))
    still = (np.abs(v) < p.v_still) & (np.abs(w) < p.w_still) & (cmag < p.cmd_still)
    segs: dict[str, tuple[float, float]] = {}
    for i, iv in enumerate(_intervals(still, t, p.min_still_s)):
        segs["stationary" if i == 0 else f"stationary_{i + 1}"] = iv
    info: dict[str, Any] = {}

    z = median_filter(od["z"].to_numpy(), size=k, mode="nearest")
    pitch = median_filter(od["pitch"].to_numpy(), size=k, mode="nearest")
    base_n = max(2, int(round(1.0 / dtm)))
    moving_idx = np.flatnonzero(np.abs(v) > p.v_move)
    first_move = int(moving_idx[0]) if moving_idx.size else 0
    base_sl = slice(0, max(base_n, first_move + 1))
    z0, p0 = float(np.median(z[base_sl])), float(np.median(pitch[base_sl]))
    info["baseline"] = {"z": z0, "pitch": p0}
    pth = np.deg2rad(p.pitch_climb_deg)
    dz, dp = z - z0, pitch - p0
    hit = (dz > p.z_climb) | (np.abs(dp) > pth)
    # Require the excursion to last (noise spikes are shorter than a wheel climbing a step).
    sustain = max(1, int(round(0.1 / dtm)))
    run_len = np.convolve(hit.astype(int), np.ones(sustain, int), mode="full")[: hit.size]
    det = np.flatnonzero(run_len >= sustain)
    onset_t = None
    if det.size:
        j = int(det[0]) - sustain + 1
        calm = (dz < p.onset_fraction * p.z_climb) & (np.abs(dp) < p.onset_fraction * pth)
        back = np.flatnonzero(calm[: j + 1])
        i0 = int(back[-1]) if back.size else 0
        onset_t = float(t[i0])
        # Climb ends when the robot is back on flat ground for 0.5 s (or the run ends).
        flat_after = _intervals(~hit & (np.arange(t.size) > j), t, 0.5)
        end_t = flat_after[0][0] if flat_after else float(t[-1])
        if end_t > onset_t:
            segs["climb"] = (onset_t, end_t)
        info["climb_onset"] = {
            "t": onset_t,
            "x": float(od["x"].iloc[i0]),
            "y": float(od["y"].iloc[i0]),
            "yaw": float(od["yaw"].iloc[i0]),
            "detected_t": float(t[j]),
        }
    flat = (np.abs(dp) < pth) & (dz < p.z_climb)
    moving = (np.abs(v) > p.v_move) & flat
    if onset_t is not None:
        moving &= t < onset_t - p.cruise_margin_s
    cruises = _intervals(moving, t, p.min_cruise_s)
    if cruises:
        segs["cruise"] = max(cruises, key=lambda ab: ab[1] - ab[0])
    return segs, info
