"""Building runs from bags: one clock, resampling, interpolation, segments, pallet, cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import bagio
from ingest.build import world_to_run
from ingest.decode import SkidSteer
from ingest.timeline import interp_quat, step_average, zoh
from ingest.transforms import quat_to_euler
from tests.helpers.ingest_fixtures import PALLET, T0_NS, TRACK, WHEEL_R, drive_config, make_drive, write_drive


@pytest.mark.parametrize("fmt", ["ros1", "ros2-sqlite3", "ros2-mcap"])
def test_drive_run_end_to_end(tmp_path: Path, fmt: str) -> None:
    path, d = write_drive(tmp_path, fmt)
    run = ingest.load_run(path, drive_config(), dt=0.01, progress=False)
    # One grid for commands and odometry, starting at 0.
    t = run.odom["t"].to_numpy()
    assert t[0] == 0.0 and np.allclose(np.diff(t), 0.01)
    np.testing.assert_array_equal(t, run.wheel_cmd["t"].to_numpy())
    # Commands: 100 Hz samples on a 10 ms grid -> zero-order hold returns them unchanged.
    idx = np.searchsorted(d.cmd_t, t + run.meta["t0_s"] - 1e-9)
    np.testing.assert_allclose(run.wheel_cmd[["left", "right", "rear"]].to_numpy(), d.cmd[idx], atol=1e-12)
    # Odometry: positions match the truth (expressed in the normalised run frame).
    truth_x = np.interp(t + run.meta["t0_s"], d.t, d.pose[:, 0])
    truth_y = np.interp(t + run.meta["t0_s"], d.t, d.pose[:, 1])
    for k in (0, len(t) // 2, len(t) - 1):
        xy, _ = world_to_run(run, np.array([truth_x[k], truth_y[k]]))
        assert run.odom["x"].iloc[k] == pytest.approx(xy[0], abs=1e-9)
        assert run.odom["y"].iloc[k] == pytest.approx(xy[1], abs=1e-9)
    assert abs(run.odom["yaw"]).max() < 1e-9  # straight drive, normalised heading
    assert run.meta["start_pose"]["yaw"] == pytest.approx(d.start_yaw)
    # Segments: stationary start, cruise, climb onset within 3 cm of the truth.
    assert run.segments["stationary"][0] == 0.0
    assert run.segments["stationary"][1] == pytest.approx(1.0, abs=0.1)
    onset = run.meta["segments_info"]["climb_onset"]["t"] + run.meta["t0_s"]
    assert abs(onset - d.onset_t) * d.v < 0.03
    c0, c1 = run.segments["cruise"]
    assert c0 > run.segments["stationary"][1] - 0.05 and c1 < run.segments["climb"][0]
    # Pallet from accumulated 16-beam clouds, in the run frame.
    assert run.pallet is not None, run.meta.get("pallet_error")
    pxy, pyaw = world_to_run(run, np.array(d.pallet[:2]), d.pallet[2])
    assert np.hypot(run.pallet.x - pxy[0], run.pallet.y - pxy[1]) < 0.05
    assert abs((run.pallet.yaw - pyaw + np.pi / 2) % np.pi - np.pi / 2) < np.deg2rad(2.0)
    assert run.pallet.size == PALLET and run.pallet.quality < 0.02
    chk = run.meta["pallet_check"]
    assert chk["consistent"] and abs(chk["discrepancy_m"]) < 0.05


def test_cloud_thinning(tmp_path: Path) -> None:
    path, d = write_drive(tmp_path, "ros2-mcap")
    n_all = sum(1 for m in d.messages if m.topic == "/lidar/points")
    cfg = drive_config(pallet={"max_clouds": 4, "cloud_range_m": 12.0})
    run = ingest.load_run(path, cfg, dt=0.02, progress=False)
    assert run.meta["n_clouds"] == 4 < n_all
    assert run.pallet is not None
    pxy, _ = world_to_run(run, np.array(d.pallet[:2]))
    assert np.hypot(run.pallet.x - pxy[0], run.pallet.y - pxy[1]) < 0.05


@pytest.mark.parametrize(
    "cmd_type", ["std_msgs/msg/Float64MultiArray", "geometry_msgs/msg/TwistStamped", "geometry_msgs/msg/Twist"]
)
def test_command_types(tmp_path: Path, cmd_type: str) -> None:
    path, d = write_drive(tmp_path, "ros2-mcap", cmd_type=cmd_type, with_clouds=False)
    run = ingest.load_run(path, drive_config(), dt=0.01, progress=False)
    assert run.meta["roles"]["wheel_cmd"]["type"] == cmd_type
    late = run.wheel_cmd[run.wheel_cmd["t"] > 2.0]
    np.testing.assert_allclose(late[["left", "right", "rear"]].to_numpy(), d.v / WHEEL_R, rtol=1e-12)
    assert run.wheel_cmd[["left", "right", "rear"]].iloc[0].abs().max() == 0.0
    expected_clock = "record" if cmd_type in ("std_msgs/msg/Float64MultiArray", "geometry_msgs/msg/Twist") else "header"
    assert run.meta["clocks"]["/wheel_cmd"] == expected_clock


def test_twist_skid_steer_conversion(tmp_path: Path) -> None:
    geo = SkidSteer(WHEEL_R, TRACK)
    v, w = 0.5, 0.4
    np.testing.assert_allclose(
        geo.wheels(np.array(v), np.array(w)),
        [(v - w * TRACK / 2) / WHEEL_R, (v + w * TRACK / 2) / WHEEL_R, v / WHEEL_R],
    )
    msgs = []
    for i in range(40):
        ns = T0_NS + i * 50_000_000
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns, (0, 0, 0))))
        msgs.append(("/cmd_vel", "geometry_msgs/msg/TwistStamped", ns, bagio.twist_stamped(ns, (v, 0, 0), (0, 0, w))))
    (p,) = bagio.write_bag(tmp_path / "t.bag", msgs)
    run = ingest.load_run(p, {"geometry": {"wheel_radius": WHEEL_R, "track_width": TRACK}}, dt=0.05, progress=False)
    assert run.meta["roles"]["wheel_cmd"] == {
        "topic": "/cmd_vel",
        "type": "geometry_msgs/msg/TwistStamped",
        "auto": True,
    }
    np.testing.assert_allclose(run.wheel_cmd[["left", "right", "rear"]].to_numpy()[0], geo.wheels(v, w))


def test_zoh_and_step_average() -> None:
    t = np.array([0.0, 0.013, 0.027, 0.05])
    v = np.array([[1.0], [2.0], [4.0], [8.0]])
    grid = np.array([0.0, 0.01, 0.02, 0.03, 0.04])
    np.testing.assert_array_equal(zoh(t, v, grid)[:, 0], [1, 1, 2, 4, 4])
    avg = step_average(t, v, grid, 0.01)[:, 0]
    # [0.01, 0.02): 0.003 s of 1 and 0.007 s of 2; [0.02, 0.03): 0.007 s of 2, 0.003 s of 4.
    np.testing.assert_allclose(avg, [1.0, 1.7, 2.6, 4.0, 4.0])


def test_resample_average_in_run(tmp_path: Path) -> None:
    msgs = []
    for i in range(60):
        ns = T0_NS + i * 33_000_000  # ~30 Hz commands, 10 ms grid
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns, (0, 0, 0))))
        msgs.append(("/wheel_cmd", "std_msgs/msg/Float64MultiArray", ns, bagio.float64_multiarray([i, 2 * i, 3 * i])))
    (p,) = bagio.write_bag(tmp_path / "a.mcap", msgs)
    z = ingest.load_run(p, dt=0.01, resample="zoh", progress=False)
    a = ingest.load_run(p, dt=0.01, resample="average", progress=False)
    tc = np.arange(60) * 0.033
    vals = np.arange(60, dtype=float)[:, None] * [1, 2, 3]
    np.testing.assert_allclose(z.wheel_cmd[["left", "right", "rear"]], zoh(tc, vals, z.wheel_cmd["t"].to_numpy()))
    np.testing.assert_allclose(
        a.wheel_cmd[["left", "right", "rear"]], step_average(tc, vals, a.wheel_cmd["t"].to_numpy(), 0.01)
    )
    assert not np.allclose(z.wheel_cmd["left"].to_numpy()[: len(a.wheel_cmd)], a.wheel_cmd["left"].to_numpy())


def test_odometry_slerp_and_native_rate(tmp_path: Path) -> None:
    msgs = []
    rate = 1.3  # [rad/s] yaw rate; 10 Hz odometry
    for i in range(30):
        ns = T0_NS + i * 100_000_000
        yaw = rate * i * 0.1
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns, (i * 0.1, 0, 0), bagio.yaw_quat(yaw))))
        msgs.append(("/wheel_cmd", "std_msgs/msg/Float64MultiArray", ns, bagio.float64_multiarray([1, 1, 1])))
    (p,) = bagio.write_bag(tmp_path / "s.db3", msgs)
    run = ingest.load_run(p, dt=0.01, normalize_start=False, progress=False)
    t = run.odom["t"].to_numpy()
    np.testing.assert_allclose(run.odom["yaw"], rate * t, atol=1e-9)  # slerp = linear angle about one axis
    np.testing.assert_allclose(run.odom["x"], t, atol=1e-9)  # linear positions
    q = run.odom[["qx", "qy", "qz", "qw"]].to_numpy()
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-12)
    native = ingest.load_run(p, dt=0.01, resample_odom=False, progress=False)
    assert len(native.odom) == 30 and native.meta["rates_hz"]["/odom"] == pytest.approx(10.0)
    # Quaternion interpolation helper across the +-pi wrap stays continuous.
    tt = np.array([0.0, 1.0])
    qq = np.array([bagio.yaw_quat(3.0), bagio.yaw_quat(-3.0)])
    mid = interp_quat(tt, qq, np.array([0.5]))
    assert abs(abs(quat_to_euler(mid)[0][0]) - np.pi) < 1e-9


def test_clock_offsets_reported_and_normalisation(tmp_path: Path) -> None:
    path, d = write_drive(tmp_path, "ros2-mcap", with_clouds=False, header_offset_ns=-250_000_000)
    run = ingest.load_run(path, drive_config(), dt=0.01, normalize_start=False, progress=False)
    offs = run.meta["clock_offsets_s"]
    assert offs["/odom"] == pytest.approx(0.25) and offs["/wheel_cmd"] == pytest.approx(0.25)
    assert run.meta["clocks"] == {"/odom": "header", "/wheel_cmd": "header"}
    assert run.odom["x"].iloc[0] == pytest.approx(d.start_xy[0]) and run.odom["y"].iloc[0] == pytest.approx(
        d.start_xy[1]
    )
    rec = ingest.load_run(path, {**drive_config(), "time": "record"}, dt=0.01, progress=False)
    assert rec.meta["clocks"]["/odom"] == "record"
    assert rec.meta["t0_ns"] - run.meta["t0_ns"] == 250_000_000


def test_cache_parses_bag_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = write_drive(tmp_path, "ros1", with_clouds=False)
    cache = tmp_path / "cache"
    first = ingest.load_run(path, drive_config(), dt=0.02, cache=cache, progress=False)
    files = list(cache.glob("*.npz"))
    assert len(files) == 1 and first.meta["cache_file"] == str(files[0])

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("bag parsed again")

    monkeypatch.setattr("ingest.load.BagReader", boom)
    again = ingest.load_run(path, drive_config(), dt=0.02, cache=cache, progress=False)
    np.testing.assert_array_equal(again.odom.to_numpy(), first.odom.to_numpy())
    assert again.segments == first.segments
    with pytest.raises(AssertionError, match="parsed again"):  # other options -> another cache entry
        ingest.load_run(path, drive_config(), dt=0.05, cache=cache, progress=False)



def test_cache_is_not_reused_by_other_ingest_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cached by other ingest code (another version, another checkout sharing ~/.cache) is parsed
    anew: ingest's source hash is part of the key."""
    path, _ = write_drive(tmp_path, "ros1", with_clouds=False)
    cache = tmp_path / "cache"
    ingest.load_run(path, drive_config(), dt=0.02, cache=cache, progress=False)
    monkeypatch.setattr("ingest.load.code_digest", lambda: "other-ingest-code")

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("bag parsed again")

    monkeypatch.setattr("ingest.load.BagReader", boom)
    with pytest.raises(AssertionError, match="parsed again"):
        ingest.load_run(path, drive_config(), dt=0.02, cache=cache, progress=False)

def test_topic_map_yaml_round_trip(tmp_path: Path) -> None:
    text = """
geometry: {wheel_radius: 0.3, track_width: 0.6}
time: record
max_gap_s: 2.0
topics:
  odom: {topic: /odom, type: nav_msgs/msg/Odometry}
  wheel_cmd: {topic: /wheel_cmd, joints: [l, r, b]}
  cloud: /lidar/points
lidar_extrinsic: {xyz: [0.1, 0, 0.5]}
pallet: {size: [1.0, 1.0, 0.1]}
"""
    tm = ingest.TopicMap.from_yaml(text)
    assert tm.geometry == SkidSteer(0.3, 0.6) and tm.time == "record" and tm.max_gap_s == 2.0
    assert tm.wheel_cmd.joints == ["l", "r", "b"] and tm.cloud.topic == "/lidar/points"
    assert tm.lidar_xyz == (0.1, 0.0, 0.5) and tm.pallet_size == (1.0, 1.0, 0.1)
    f = tmp_path / "map.yaml"
    f.write_text(tm.to_yaml())
    assert ingest.TopicMap.from_yaml(f).to_dict() == tm.to_dict()
    robot = ingest.TopicMap.from_yaml(f"robot: {Path(__file__).resolve().parents[2] / 'models/helhest/robot.yaml'}\n")
    assert robot.geometry == SkidSteer(0.36, 0.72)


def test_make_drive_truth_is_consistent() -> None:
    d = make_drive(with_clouds=False)
    assert d.onset_t is not None and d.pose.shape[1] == 7
    assert np.allclose(np.linalg.norm(d.pose[:, 3:], axis=1), 1.0)
