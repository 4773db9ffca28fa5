"""Metrics of the paper: combined error, mean xy distance, yaw RMSE with wrapped yaw."""

import math

import numpy as np
import pytest

from sysid.fit.metrics import (
    combined_error,
    mean_xy_distance,
    quat_yaw,
    run_metrics,
    turn_efficiency,
    wrap_angle,
    yaw_quat,
    yaw_rmse,
)


def poses(x, y, yaw, z=0.36):
    n = len(x)
    out = np.zeros((n, 8))
    out[:, 0] = np.arange(n) * 0.1
    out[:, 1], out[:, 2], out[:, 3] = x, y, z
    out[:, 4:8] = yaw_quat(np.asarray(yaw, float))
    return out


def test_wrap_angle_half_open_interval():
    a = wrap_angle(np.array([math.pi, -math.pi, 3 * math.pi, 0.1, -0.1 - 2 * math.pi]))
    assert np.allclose(a, [math.pi, math.pi, math.pi, 0.1, -0.1])
    assert np.all(a > -math.pi) and np.all(a <= math.pi)


def test_yaw_quat_roundtrip():
    yaw = np.linspace(-3.1, 3.1, 50)
    assert np.allclose(quat_yaw(yaw_quat(yaw)), yaw)


def test_combined_error_known_value():
    meas = poses([0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 0])
    sim = poses([0.3, 1.3, 2.3, 3.3], [0.4, 0.4, 0.4, 0.4], [0.2, 0.2, 0.2, 0.2])
    # |dp| = 0.5 m everywhere, yaw error 0.2 rad -> L * 0.2 = 0.1 m
    assert combined_error(sim, meas) == pytest.approx(math.sqrt(0.25 + 0.01))
    assert mean_xy_distance(sim, meas) == pytest.approx(0.5)
    assert yaw_rmse(sim, meas) == pytest.approx(0.2)
    assert combined_error(sim, meas, lever_arm=1.0) == pytest.approx(math.sqrt(0.25 + 0.04))


def test_yaw_error_is_wrapped_across_pi():
    meas = poses([0, 0], [0, 0], [math.pi - 0.05, -math.pi + 0.05])
    sim = poses([0, 0], [0, 0], [-math.pi + 0.05, math.pi - 0.05])
    assert yaw_rmse(sim, meas) == pytest.approx(0.1)  # not 2 pi - 0.1


def test_z_counts_in_position_but_not_in_xy():
    meas = poses([0, 1], [0, 0], [0, 0], z=0.36)
    sim = poses([0, 1], [0, 0], [0, 0], z=0.50)
    assert mean_xy_distance(sim, meas) == 0.0
    assert combined_error(sim, meas) == pytest.approx(0.14)


def test_non_finite_simulation_is_infinite_error():
    meas = poses([0, 1], [0, 0], [0, 0])
    sim = meas.copy()
    sim[1, 1] = np.nan
    assert combined_error(sim, meas) == math.inf
    assert run_metrics(sim, meas)["mean_xy"] == math.inf


def test_shape_mismatch_rejected():
    with pytest.raises(ValueError):
        combined_error(np.zeros((3, 8)), np.zeros((4, 8)))


def test_turn_efficiency_by_tightness():
    """Three 4 s phases at 100 Hz, wheel radius r = 0.36 m, track 0.72 m, commanded turn rate
    r (wR - wL) / track: a straight drive (wL = wR = 2 rad/s: left out), a right turn (wL = 3, wR = 1:
    tightness |1 - 3| / (1 + 3) = 0.5, rate -1 rad/s) turned at efficiency 0.7, and a left pivot
    (wL = -2, wR = 2: tightness 1, rate 2 rad/s) turned at 0.55 (the yaw wraps across pi on the way).
    Per bin: commanded |dpsi| = |rate| * 4 s, turned = efficiency * that."""
    r, track = 0.36, 0.72
    t = np.arange(0.0, 12.0, 0.01)
    phase = np.minimum((t // 4.0).astype(int), 2)
    left = np.array([2.0, 3.0, -2.0])[phase]
    right = np.array([2.0, 1.0, 2.0])[phase]
    rate = r * (right - left) / track
    eff = np.array([1.0, 0.7, 0.55])[phase]
    yaw = wrap_angle(np.concatenate([[0.0], np.cumsum((eff * rate)[:-1] * 0.01)]))
    out = turn_efficiency(t, left, right, {"measured": yaw, "perfect": np.cumsum(np.r_[0, rate[:-1] * 0.01])}, r, track)
    assert out["bins"] == [0.0, 0.25, 0.5, 0.75, 0.95, 1.0]
    wheels, measured, perfect = (np.array(out[k]) for k in ("wheels", "measured", "perfect"))
    # the interval across each phase change averages its ends: at most one 10 ms step off per bin
    assert wheels[[0, 1, 3]] == pytest.approx([0, 0, 0], abs=0.03)
    assert wheels[2] == pytest.approx(1.0 * 4.0, abs=0.03) and wheels[4] == pytest.approx(2.0 * 4.0, abs=0.03)
    assert measured[2] / wheels[2] == pytest.approx(0.7, abs=0.01)
    assert measured[4] / wheels[4] == pytest.approx(0.55, abs=0.01)
    assert perfect[2] / wheels[2] == pytest.approx(1.0, abs=0.01)
    assert perfect[4] / wheels[4] == pytest.approx(1.0, abs=0.01)
