"""Named time segments of a run: stationary, steady cruise, obstacle climb (from the base's rise).

A ``climb`` needs a real rise of the base: above the odometry's own z noise on the run and above
``SegmentParams.rise_min``, which is more than the drift of a lidar odometry's z over a run on flat
ground. Where the run has a lidar, the caller also requires an obstacle in it (``ingest.load``:
``detect_segments(..., obstacle=False)`` when the pallet fit found none). The ``cruise`` is the
longest part where the robot moves at a steady speed (steady wheel commands, after the robot has
had time to follow them), before the climb's onset when there is one. Thresholds are in SI units;
they suit a ~0.1-0.2 m obstacle under a ~0.7 m wheelbase robot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.ndimage import maximum_filter1d, median_filter, uniform_filter1d

from .run import Run


@dataclass(frozen=True)
class SegmentParams:
    v_still: float = 0.03  # [m/s] below: not moving
    w_still: float = 0.05  # [rad/s]
    cmd_still: float = 0.1  # [rad/s] wheel command magnitude below: no command
    min_still_s: float = 0.5  # [s] shortest stationary segment
    v_move: float = 0.05  # [m/s] above: moving (or turning faster than w_move)
    w_move: float = 0.1  # [rad/s] a turn on the spot moves too
    min_cruise_s: float = 0.5  # [s]
    # Climb. rise_min: half a 0.144 m pallet or a 0.15 m kerb, above the flat-ground drift of lidar
    # odometry's z over a run (up to 0.06 m in 6 s on the Husky's ICP); rise_noise: a climb rises at least
    # this many times the z noise, the robust spread (1.4826 MAD) of z about its running median over
    # noise_window_s (a climb's monotone ramp passes a median filter, so it does not inflate the estimate).
    rise_min: float = 0.08  # [m]
    rise_noise: float = 8.0
    noise_window_s: float = 1.0  # [s]
    # The onset: walked back from the detection to where z is within max(onset_fraction * z_climb, 3 noise)
    # of the ground before the rise; the end: back within max(z_climb, 3 noise) of that ground for 0.5 s.
    z_climb: float = 0.025  # [m]
    onset_fraction: float = 0.25
    onset_lookback_s: float = 3.0  # [s] the rise is measured from the lowest z of this long before it
    cruise_margin_s: float = 0.3  # [s] cruise ends this long before the climb onset
    smooth_s: float = 0.2  # [s] smoothing window for speeds / pitch / z
    move_smooth_s: float = 0.5  # [s] smoothing of the speeds that say "moving" (odometry at ~10 Hz is jerky)
    # Steady speed: over steady_window_s every wheel command (median-filtered over that window) changes by
    # less than steady_abs + steady_rel * its magnitude; the cruise starts settle_s after they settle.
    steady_window_s: float = 0.5  # [s]
    steady_abs: float = 0.2  # [rad/s]
    steady_rel: float = 0.1
    settle_s: float = 0.5  # [s]


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


def z_noise(t: np.ndarray, z: np.ndarray, window_s: float = 1.0) -> float:
    """Robust z noise [m] of an odometry: 1.4826 MAD of z about its running median over ``window_s``.
    A climb's rise is monotone and passes the median filter, so it hardly enters the estimate."""
    if t.size < 3:
        return 0.0
    dtm = float(np.median(np.diff(t)))
    k = max(3, int(round(window_s / dtm)) | 1)
    hp = z - median_filter(z, size=k, mode="nearest")
    return float(1.4826 * np.median(np.abs(hp - np.median(hp))))


def steady_commands(run: Run, t: np.ndarray, p: SegmentParams) -> tuple[np.ndarray, np.ndarray]:
    """Per odometry sample: whether every wheel command is steady (``SegmentParams``), and the largest
    command magnitude [rad/s]."""
    cmd = run.wheel_cmd
    cols = [c for c in cmd.columns if c != "t"]
    dtm = float(np.median(np.diff(t)))
    k = max(1, int(round(p.steady_window_s / dtm)))
    h = max(1, k // 2)
    steady = np.ones(t.size, bool)
    cmag = np.zeros(t.size)
    for c in cols:  # every wheel column
        u = np.interp(t, cmd["t"].to_numpy(), cmd[c].to_numpy())
        cmag = np.maximum(cmag, np.abs(u))
        um = median_filter(u, size=k, mode="nearest")
        ahead, behind = um[np.minimum(np.arange(t.size) + h, t.size - 1)], um[np.maximum(np.arange(t.size) - h, 0)]
        steady &= np.abs(ahead - behind) < p.steady_abs + p.steady_rel * np.abs(um)
    return steady, cmag


def detect_segments(
    run: Run, params: SegmentParams | None = None, *, obstacle: bool | None = None
) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    """Segments {name: (t0, t1)} [s] and details (climb onset time/pose, z noise, rise, baselines).

    - ``stationary`` (and ``stationary_2``, ...): not moving and no wheel command.
    - ``climb``: where the base rises by more than ``max(rise_min, rise_noise * z noise)`` above the
      ground before it (``info["climb_check"]`` says why a rise was not a climb); from the onset
      (walked back to where z starts to rise) until the robot is back on the ground or
      the run ends. ``obstacle=False`` (the run's lidar saw no obstacle): no climb, whatever z does.
    - ``cruise``: the longest moving, steady-speed interval (``steady_commands``, starting
      ``settle_s`` after the commands settle), before the climb onset (minus a margin) when there is one.
    """
    p = params or SegmentParams()
    od = run.odom
    t = od["t"].to_numpy()
    if t.size < 3:
        return {}, {}
    dtm = float(np.median(np.diff(t)))
    k = max(1, int(round(p.smooth_s / dtm)))
    v, w = body_speeds(run, p.smooth_s)
    steady, cmag = steady_commands(run, t, p)
    still = (np.abs(v) < p.v_still) & (np.abs(w) < p.w_still) & (cmag < p.cmd_still)
    segs: dict[str, tuple[float, float]] = {}
    for i, iv in enumerate(_intervals(still, t, p.min_still_s)):
        segs["stationary" if i == 0 else f"stationary_{i + 1}"] = iv
    info: dict[str, Any] = {}

    z_raw = od["z"].to_numpy()
    z = median_filter(z_raw, size=k, mode="nearest")
    pitch = median_filter(od["pitch"].to_numpy(), size=k, mode="nearest")
    base_n = max(2, int(round(1.0 / dtm)))
    vm, wm = body_speeds(run, p.move_smooth_s)
    moving = (np.abs(vm) > p.v_move) | (np.abs(wm) > p.w_move)
    moving_idx = np.flatnonzero(np.abs(v) > p.v_move)
    first_move = int(moving_idx[0]) if moving_idx.size else 0
    base_sl = slice(0, max(base_n, first_move + 1))
    z0, p0 = float(np.median(z[base_sl])), float(np.median(pitch[base_sl]))
    info["baseline"] = {"z": z0, "pitch": p0}
    noise = z_noise(t, z_raw, p.noise_window_s)
    need = max(p.rise_min, p.rise_noise * noise)
    # the rise above the lowest ground of the last onset_lookback_s (a drifting z is no climb)
    look = max(1, int(round(p.onset_lookback_s / dtm)))
    floor = -_running_max(-z, look)
    rise = z - floor
    sustain = max(1, int(round(0.1 / dtm)))
    run_len = np.convolve((rise > need).astype(int), np.ones(sustain, int), mode="full")[: t.size]
    det = np.flatnonzero(run_len >= sustain)
    info["climb_check"] = {"z_noise_m": noise, "rise_needed_m": need, "rise_max_m": float(rise.max()),
                           "obstacle": obstacle}
    onset_t = None
    if det.size and obstacle is not False:
        j = int(det[0]) - sustain + 1
        # the ground before the rise: the median of the last second of samples below half the rise
        before = z[max(0, j - look) : j + 1]
        zg = float(np.median(before[before < z[j] - 0.5 * need][-max(2, int(round(1.0 / dtm))) :]))
        tol = max(p.onset_fraction * p.z_climb, 3.0 * noise)
        back = np.flatnonzero(z[: j + 1] - zg < tol)
        i0 = int(back[-1]) if back.size else 0
        onset_t = float(t[i0])
        # Climb ends when the robot is back on that ground for 0.5 s (or the run ends).
        ground = z - zg < max(p.z_climb, 3.0 * noise)
        flat_after = _intervals(ground & (np.arange(t.size) > j), t, 0.5)
        end_t = flat_after[0][0] if flat_after else float(t[-1])
        if end_t > onset_t:
            segs["climb"] = (onset_t, end_t)
        info["climb_onset"] = {
            "t": onset_t,
            "x": float(od["x"].iloc[i0]),
            "y": float(od["y"].iloc[i0]),
            "yaw": float(od["yaw"].iloc[i0]),
            "detected_t": float(t[j]),
            "ground_z": zg,
        }
    elif det.size:
        info["climb_check"]["rejected"] = "no obstacle in the lidar"
    cruise = moving & _settled(steady, max(0, int(round(p.settle_s / dtm))))
    if onset_t is not None:
        cruise &= t < onset_t - p.cruise_margin_s
    cruises = _intervals(cruise, t, p.min_cruise_s)
    if cruises:
        segs["cruise"] = max(cruises, key=lambda ab: ab[1] - ab[0])
    return segs, info


def _running_max(x: np.ndarray, n: int) -> np.ndarray:
    """max(x[i - n : i + 1]) at every i (the window clipped at the start)."""
    # origin shifts the window to end at i: size n + 1 covering [i - n, i]
    return np.asarray(maximum_filter1d(x, size=n + 1, origin=n // 2, mode="nearest"))


def _settled(steady: np.ndarray, n: int) -> np.ndarray:
    """``steady`` without the first ``n`` samples of each of its intervals."""
    if n == 0:
        return steady
    m = np.r_[False, steady].astype(int)
    starts = np.flatnonzero(np.diff(m) == 1)
    out = steady.copy()
    for a in starts:
        out[a : a + n] = False
    return out
