"""The segmenter on generated runs: a flat run whose odometry z and pitch are noisy and drift marks no
climb and a cruise at its steady part; a real 0.15 m rise is a climb; a rise the lidar shows no obstacle
for is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import pallet
from ingest.build import make_run
from ingest.errors import PalletFitError
from ingest.run import Run
from ingest.segments import detect_segments, z_noise
from ingest.transforms import euler_to_quat
from tests.helpers.ingest_fixtures import drive_config, write_drive

STEADY_FROM = 1.5  # [s] the commands of the generated run settle here
DURATION = 8.0  # [s]


def lidar_odometry_run(rise: float = 0.0, rise_at: float = 5.0, seed: int = 0) -> Run:
    """A skid-steer drive like the Husky's logs: at rest 0.3 s, the wheel commands ramp to a turn in
    1.2 s and hold it (wheel speeds measured at 20 Hz with 3 % noise); the odometry at 10 Hz (ICP) has
    z noise of 4 mm std, a z drift of +4 cm over the run and a pitch drift of 4.5 deg (more than the
    old thresholds: 2.5 cm, 3 deg). ``rise`` [m]: a real step up climbed in 0.8 s from ``rise_at``."""
    rng = np.random.default_rng(seed)
    t_cmd = np.arange(0.0, DURATION, 0.05)
    ramp = np.clip((t_cmd - 0.3) / (STEADY_FROM - 0.3), 0.0, 1.0)
    left, right = 6.0 * ramp, 4.0 * ramp
    cmd = np.column_stack([left, right, left, right]) * (1 + 0.03 * rng.standard_normal((t_cmd.size, 4)))
    t = np.arange(0.0, DURATION, 0.1)
    r, track = 0.165, 0.555
    sl, sr = np.interp(t, t_cmd, left) * r, np.interp(t, t_cmd, right) * r
    v, w = 0.8 * (sl + sr) / 2, 0.8 * (sr - sl) / track
    yaw = np.concatenate([[0.0], np.cumsum(w[:-1] * 0.1)])
    x = np.concatenate([[0.0], np.cumsum(v[:-1] * np.cos(yaw[:-1]) * 0.1)])
    y = np.concatenate([[0.0], np.cumsum(v[:-1] * np.sin(yaw[:-1]) * 0.1)])
    z = 0.04 * t / DURATION + 0.004 * rng.standard_normal(t.size)
    z += rise * np.clip((t - rise_at) / 0.8, 0.0, 1.0)
    pitch = np.deg2rad(-4.5) * t / DURATION + np.deg2rad(0.3) * rng.standard_normal(t.size)
    pose = np.column_stack([x, y, z, euler_to_quat(yaw, pitch)])
    names = ("front_left_wheel", "front_right_wheel", "rear_left_wheel", "rear_right_wheel")
    return make_run("flat", t, pose, t_cmd, cmd, dt=0.01, t_meas=t_cmd, meas=cmd, wheel_names=names)


def test_flat_run_with_noisy_drifting_z_has_no_climb_and_a_steady_cruise() -> None:
    run = lidar_odometry_run()
    segs, info = detect_segments(run)
    assert "climb" not in segs, info["climb_check"]
    # the noise estimate is the z noise, not the drift: 4 mm std, seen at 10 Hz through a 100 Hz grid
    assert 0.002 < info["climb_check"]["z_noise_m"] < 0.006
    assert info["climb_check"]["rise_needed_m"] >= 0.08
    c0, c1 = segs["cruise"]
    assert STEADY_FROM <= c0 <= STEADY_FROM + 1.0  # after the ramp, once the commands have settled
    assert c1 >= DURATION - 0.3  # and to the end of the run


def test_real_rise_is_a_climb_and_ends_the_cruise() -> None:
    run = lidar_odometry_run(rise=0.15, rise_at=5.0)
    segs, info = detect_segments(run)
    assert "climb" in segs, info["climb_check"]
    onset = info["climb_onset"]["t"]
    assert 4.85 <= onset <= 5.15
    assert segs["climb"][0] == onset
    c0, c1 = segs["cruise"]
    assert STEADY_FROM <= c0 and c1 < onset  # the steady part before the climb
    # the same rise without an obstacle in the lidar is no climb, and the cruise runs on
    segs, info = detect_segments(run, obstacle=False)
    assert "climb" not in segs and info["climb_check"]["rejected"]
    assert segs["cruise"][1] >= DURATION - 0.3


@pytest.mark.parametrize("rise", [0.03, 0.05])
def test_a_rise_below_the_minimum_is_no_climb(rise: float) -> None:
    """A few cm of rise (with the drift, as the Husky's ICP drifts up to 0.06 m in 6 s) is below the 0.08 m minimum."""
    segs, info = detect_segments(lidar_odometry_run(rise=rise))
    assert "climb" not in segs
    assert info["climb_check"]["rise_max_m"] > rise - 0.01


def test_z_noise_ignores_a_climb() -> None:
    """The running-median residual passes a monotone climb: the noise estimate barely moves."""
    t = np.arange(0.0, 6.0, 0.01)
    z = 0.003 * np.random.default_rng(1).standard_normal(t.size)
    step = 0.15 * np.clip((t - 3.0) / 0.8, 0.0, 1.0)
    assert z_noise(t, z) == pytest.approx(0.003, rel=0.15)
    assert z_noise(t, z + step) == pytest.approx(z_noise(t, z), rel=0.1)


def test_lidar_without_an_obstacle_drops_the_climb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bag with a lidar whose pallet fit finds nothing: the odometry's rise is not a climb; the run
    says why in its warnings."""
    def no_pallet(*_a: object, **_k: object) -> None:
        raise PalletFitError("no pallet-sized cluster in the clouds")

    monkeypatch.setattr(pallet, "fit_pallet_from_clouds", no_pallet)
    path, _d = write_drive(tmp_path, "ros2-mcap")
    run = ingest.load_run(path, drive_config(), dt=0.01, progress=False)
    assert run.pallet is None and "climb" not in run.segments
    assert run.meta["segments_info"]["climb_check"]["rejected"] == "no obstacle in the lidar"
    assert any("lidar shows no obstacle" in w for w in run.meta["warnings"])
    assert "cruise" in run.segments
