"""Odometry consistency check (`ingest.quality.odometry_jumps`): closed-form cases and the real runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest.errors import DataError
from ingest.quality import odometry_jumps

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "helhest-real"


def odom(t: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> pd.DataFrame:
    return pd.DataFrame({"t": t, "x": x, "y": np.zeros_like(t) if y is None else y, "z": np.zeros_like(t)})


def resample(df: pd.DataFrame, rate: float) -> pd.DataFrame:
    """Linear interpolation onto a finer grid, as ingest does."""
    t = np.arange(df.t.iloc[0], df.t.iloc[-1] + 1e-9, 1.0 / rate)
    return pd.DataFrame({c: np.interp(t, df.t, df[c]) for c in ("x", "y", "z")} | {"t": t})


def test_smooth_motion_has_no_jumps():
    """A circle at 1 m/s, radius 0.5 m (centripetal acceleration v^2/r = 2 m/s^2) plus 2 m/s^2
    braking, 20 Hz and resampled to 100 Hz: nothing near 30 m/s^2."""
    t = np.arange(0, 10, 0.05)
    s = t - 0.5 * 0.1 * t**2  # arc length with speed 1 - 0.1 t (deceleration 0.1 m/s^2)
    df = odom(t, 0.5 * np.sin(s / 0.5), 0.5 * (1 - np.cos(s / 0.5)))
    assert odometry_jumps(df) == [] and odometry_jumps(resample(df, 100)) == []


@pytest.mark.parametrize("a", [12.0, 25.0, 45.0])
def test_constant_acceleration_reads_exactly(a):
    """x = a t^2 / 2: the second difference over w is a w^2, so the implied acceleration is a; the
    whole stretch is one jump exactly when a exceeds the threshold."""
    t = np.arange(0, 2, 0.01)
    df = odom(t, 0.5 * a * t**2)
    jumps = odometry_jumps(df, max_accel=20.0)
    if a <= 20:
        assert jumps == []
    else:
        assert len(jumps) == 1 and jumps[0].accel == pytest.approx(a, rel=1e-6)
        assert jumps[0].t == pytest.approx(0.05) and jumps[0].t_end == pytest.approx(1.94, abs=0.011)


@pytest.mark.parametrize("rate", [20.0, 100.0])
def test_step_and_freeze_are_found(rate):
    """Cruise at 2 m/s; at 3 s the position jumps 0.3 m ahead; from 6 to 6.5 s it freezes (stopping
    from 2 m/s within one 50 ms sample: 40 m/s^2) and then catches up (1 m in one sample): three
    jumps, whatever the resampling; the step is the displacement against the neighbours' path."""
    t = np.arange(0, 10, 0.05)
    x = 2 * t + 0.3 * (t >= 3.0)
    frozen = (t >= 6.0) & (t < 6.5)
    x[frozen] = x[np.searchsorted(t, 6.0)]
    df = odom(t, x) if rate == 20.0 else resample(odom(t, x), rate)
    jumps = odometry_jumps(df)
    assert [round(j.t, 1) for j in jumps] == pytest.approx([2.9, 6.0, 6.4], abs=0.11), jumps
    assert jumps[0].step == pytest.approx(0.3, rel=0.05)
    assert jumps[1].step == pytest.approx(0.1, rel=0.05)  # 2 m/s x 50 ms not travelled
    assert jumps[2].step == pytest.approx(1.0, rel=0.05)
    assert all(j.accel > 30 for j in jumps)


def test_bad_arguments_are_named():
    df = odom(np.arange(0, 1, 0.05), np.zeros(20))
    with pytest.raises(DataError, match="max_accel"):
        odometry_jumps(df, max_accel=-1.0)
    with pytest.raises(DataError, match="window"):
        odometry_jumps(df, window=0.0)
    assert odometry_jumps(df.iloc[:2]) == []  # too short to judge: nothing flagged


@pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is absent")
def test_real_runs_constant_twist_clean_joystick_jumpy():
    """The two constant-twist runs are physically consistent; the two joystick runs' lidar odometry
    jumps by decimetres between samples (a dozen times each), while their wheels never exceed 4 m/s."""
    from ingest.load import load_helhest_json

    counts = {}
    for name in ("right_turn_a", "left_circle", "helhest_2026_04_13-09_55_01", "helhest_2026_04_13-09_57_51"):
        jumps = odometry_jumps(load_helhest_json(DATA / f"{name}.json", dt=0.01).odom)
        counts[name] = (len(jumps), max((j.step for j in jumps), default=0.0))
    print(counts)
    assert counts["right_turn_a"][0] == 0 and counts["left_circle"][0] == 0
    for name in ("helhest_2026_04_13-09_55_01", "helhest_2026_04_13-09_57_51"):
        assert counts[name][0] >= 10 and counts[name][1] > 0.25, counts
