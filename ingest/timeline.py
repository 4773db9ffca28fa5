"""Timestamps: validation (NaN, disorder, jumps, gaps), resampling of commands and odometry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from .errors import TimestampError


@dataclass
class TimeReport:
    """What ``check_times`` found on one stream (times in seconds on the run clock)."""

    n: int
    rate_hz: float
    duplicates: int
    gaps: list[tuple[float, float]]  # (start time, length) of silences longer than the tolerance
    sorted_fixes: int = 0


def auto_max_gap(t: np.ndarray) -> float:
    """Default gap tolerance [s]: 10x the median period, at least 0.25 s."""
    if t.size < 2:
        return np.inf
    return max(0.25, 10.0 * float(np.median(np.diff(t))))


def check_times(
    t: np.ndarray,
    name: str,
    max_gap_s: float | None = None,
    disorder: str = "error",
    origin: float = 0.0,
) -> tuple[np.ndarray, TimeReport]:
    """Validate a time vector [s]; returns (order index to apply, report).

    Raises ``TimestampError`` (naming the sample and the fix) for non-finite times, backwards steps
    (unless ``disorder == "sort"``) and silences longer than ``max_gap_s`` (default ``auto_max_gap``).
    Exact duplicates are dropped (the later sample wins) and counted. ``origin`` [s] only shifts the
    times quoted in messages.
    """
    t = np.asarray(t, dtype=float)
    if t.size == 0:
        raise TimestampError(f"{name}: no messages; check that the topic was recorded")
    bad = ~np.isfinite(t)
    if bad.any():
        i = int(np.argmax(bad))
        raise TimestampError(
            f"{name}: timestamp {i} of {t.size} is {t[i]}; {int(bad.sum())} non-finite stamps. "
            "The recorder's clock or the log is broken; use `time: record` in the topic map"
        )
    order = np.arange(t.size)
    fixes = 0
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        if disorder != "sort":
            i = int(back[0])
            raise TimestampError(
                f"{name}: time goes backwards at sample {i + 1} (t={t[i] - origin:.6f} s then "
                f"{t[i + 1] - origin:.6f} s, a jump of {t[i + 1] - t[i]:.6f} s); {back.size} such steps. "
                "Set `disorder: sort` in the topic map to sort them, or `time: record` to use record time"
            )
        order = np.argsort(t, kind="stable")
        fixes = int(back.size)
    ts = t[order]
    # Drop exact duplicates, keeping the last sample of each stamp.
    keep = np.append(np.diff(ts) > 0, True)
    dups = int((~keep).sum())
    order = order[keep]
    ts = ts[keep]
    if ts.size < 2:
        raise TimestampError(f"{name}: only {ts.size} distinct timestamp(s); need at least 2")
    dt = np.diff(ts)
    tol = auto_max_gap(ts) if max_gap_s is None else float(max_gap_s)
    gi = np.flatnonzero(dt > tol)
    gaps = [(float(ts[i] - origin), float(dt[i])) for i in gi]
    rate = float((ts.size - 1) / (ts[-1] - ts[0]))  # mean rate: robust to jittery record times
    report = TimeReport(int(ts.size), rate, dups, gaps, fixes)
    if gaps:
        where = ", ".join(f"{g:.0f}+{d:.3f} s" if d > 1e3 else f"t={g:.3f} s ({d:.3f} s)" for g, d in gaps[:5])
        raise TimestampError(
            f"{name}: {len(gaps)} gap(s)/time jump(s) longer than {tol:.3f} s at {where}"
            f"{' ...' if len(gaps) > 5 else ''} (median period {np.median(dt):.4f} s). "
            "Cut the run before the gap, or raise `max_gap_s` in the topic map if the gap is harmless"
        )
    return order, report


def zoh(t: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Zero-order hold of samples (t, values (N, k)) at ``grid``: the last value at or before each time."""
    idx = np.searchsorted(t, grid, side="right") - 1
    return values[np.clip(idx, 0, len(t) - 1)]


def held_integral(t: np.ndarray, values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The running integral F(s) of the zero-order-held samples (t [s], values (N, k)) from t[0]:
    F(s) = F(t_j) + v_j (s - t_j) with j the last sample <= s; before t[0] the first value is held,
    beyond t[-1] the last (exact, piecewise linear). Returns F, taking times (M,) to (M, k)."""
    t = np.asarray(t, float)
    values = np.asarray(values, float)
    seg = np.diff(t)[:, None] * values[:-1]
    F = np.vstack([np.zeros((1, values.shape[1])), np.cumsum(seg, axis=0)])

    def integral(s: np.ndarray) -> np.ndarray:
        j = np.clip(np.searchsorted(t, s, side="right") - 1, 0, len(t) - 1)
        out: np.ndarray = F[j] + values[j] * (s - t[j])[:, None]
        return out

    return integral


def step_average(t: np.ndarray, values: np.ndarray, grid: np.ndarray, dt: float) -> np.ndarray:
    """Mean of the zero-order-held signal over each step [grid_k, grid_k + dt) (exact, piecewise const)."""
    integral = held_integral(t, values)
    mean: np.ndarray = (integral(grid + dt) - integral(grid)) / dt
    return mean


def step_grid_average(t: np.ndarray, values: np.ndarray, t0: float, h: float, steps: int) -> np.ndarray:
    """Mean of the zero-order-held signal over each simulation step [t0 + k h, t0 + (k+1) h] ->
    (steps, k): the command grid a simulator integrates (the step edges are ``t0 + h * k`` exactly)."""
    edges = t0 + h * np.arange(steps + 1)
    return np.diff(held_integral(t, values)(edges), axis=0) / h


def interp_linear(t: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Per-column linear interpolation (clamped at the ends)."""
    return np.stack([np.interp(grid, t, values[:, i]) for i in range(values.shape[1])], axis=1)


def interp_quat(t: np.ndarray, quats: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Slerp of unit quaternions (x, y, z, w) at ``grid`` (clamped at the ends); sign-continuous output."""
    rot = Rotation.from_quat(quats)
    g = np.clip(grid, t[0], t[-1])
    q: np.ndarray = Slerp(t, rot)(g).as_quat()
    # Keep the hemisphere continuous so downstream differencing is smooth.
    flip = np.cumsum(np.r_[False, (q[1:] * q[:-1]).sum(axis=1) < 0]) % 2 == 1
    q[flip] *= -1
    if q[0, 3] < 0:
        q *= -1
    return q
