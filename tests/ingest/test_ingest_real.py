"""Real bags recorded by real ROS (../shared/data/bags) and the real helhest runs (JSON)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import BagReader, IngestError, TopicError, UnknownTypeError, cloud_to_xyz
from ingest.inspect import format_report, inspect_bag
from tests.helpers.ingest_fixtures import BAGS, HELHEST

pytestmark = pytest.mark.skipif(
    not BAGS.exists(), reason=f"shared data not found at {BAGS} (the ../shared checkout is absent)"
)

ODOM_TWIST = {"topics": {"wheel_cmd": {"source": "odom_twist"}}}


@pytest.mark.parametrize(
    "bag,topic,rate,count",
    [
        ("robot_localization_test1_husky.bag", "/husky_velocity_controller/odom", 10.0, 3952),
        ("robot_localization_test2_jackal.bag", "/jackal_velocity_controller/odom", 50.0, 3060),
    ],
)
def test_real_odometry_into_runs(bag: str, topic: str, rate: float, count: int) -> None:
    path = BAGS / bag
    run = ingest.load_run(path, ODOM_TWIST, dt=None, resample_odom=False, normalize_start=False, progress=False)
    assert run.meta["roles"]["odom"]["topic"] == topic and run.meta["roles"]["odom"]["auto"]
    assert run.meta["rates_hz"][topic] == pytest.approx(rate, rel=0.01)
    assert run.meta["clocks"][topic] == "header"
    # Native stamps: every odometry message is a row (the command stream is the same topic).
    assert len(run.odom) == count
    dt = np.diff(run.odom["t"].to_numpy())
    assert np.median(dt) == pytest.approx(1 / rate, rel=0.03)
    # The pose is the bag's own: compare the first row with the first message.
    with BagReader(path) as b:
        first = next(iter(b.messages([topic]))).msg.pose.pose
    assert run.odom["x"].iloc[0] == pytest.approx(first.position.x)
    assert run.odom["qz"].iloc[0] == pytest.approx(first.orientation.z)
    # Resampled on a 10 ms grid the run still spans the bag.
    r2 = ingest.load_run(path, ODOM_TWIST, dt=0.01, progress=False)
    assert r2.duration == pytest.approx(run.duration, abs=0.011)
    assert np.allclose(np.diff(r2.odom["t"]), 0.01)
    assert r2.odom[["x", "y"]].iloc[0].abs().max() < 1e-12  # normalised start
    assert "cruise" in r2.segments


def test_sick_pointcloud2_point_count() -> None:
    with BagReader(BAGS / "sick_scan_xd_rms_lms_movement_off.bag") as b:
        assert b.topics["/radar"].decodable  # custom sick_scan type embedded in the bag
        clouds = [cloud_to_xyz(m.msg) for m in b.messages(["/cloud"])]
        radar = [cloud_to_xyz(m.msg) for m in b.messages(["/cloud_radar_track"])]
    assert len(clouds) == 89
    assert {c.shape for c in clouds} == {(541, 3)}
    assert all(c.dtype == np.float32 and np.isfinite(c).all() for c in clouds)
    # A 2-D scanner: all points in one plane, within the LMS1xx range.
    r = np.linalg.norm(clouds[0], axis=1)
    assert r.max() < 30.0 and r.min() >= 0.0
    assert all(c.shape[1] == 3 for c in radar)


def test_edge_case_sqlite_split_without_definitions() -> None:
    path = BAGS / "edge_cases" / "rosbag2_wbag_sqlite3_nodefs"
    with BagReader(path) as b:
        assert len(b.paths) == 1 and not b.is_ros1
        assert all(i.decodable for i in b.topics.values())
        msgs = list(b.messages(sorted(b.topics)))
    assert len(msgs) == sum(i.count for i in b.topics.values()) == 6074
    assert all(isinstance(m.msg.data, str) for m in msgs)
    with pytest.raises(TopicError, match="no odometry topic.*AAA"):
        ingest.load_run(path, progress=False)


def test_edge_case_mixed_definitions_db3() -> None:
    path = BAGS / "edge_cases" / "rosbag2_topics_and_services_mixeddefs.db3"
    with BagReader(path) as b:
        assert b.topics["/parameter_events"].decodable
        assert not b.topics["/add_two_ints/_service_event"].decodable
        events = list(b.messages(["/parameter_events"]))
        assert len(events) == 7
        with pytest.raises(UnknownTypeError, match="AddTwoInts_Event"):
            list(b.messages(["/add_two_ints/_service_event"]))


def test_edge_case_service_event_mcap_reads_normal_topics() -> None:
    path = BAGS / "edge_cases" / "rosbag2_service_events_mcap"
    with BagReader(path) as b:
        assert not b.topics["/test_service1/_service_event"].decodable
        msgs = list(b.messages(["/test_topic1", "/test_topic2"]))
    assert len(msgs) == 2
    assert all(m.msgtype == "test_msgs/msg/Strings" for m in msgs)
    assert isinstance(msgs[0].msg.string_value, str)


@pytest.mark.parametrize("item", sorted(p.name for p in (BAGS / "edge_cases").iterdir()) if BAGS.exists() else [])
def test_every_edge_case_reads_or_fails_clearly(item: str) -> None:
    path = BAGS / "edge_cases" / item
    stats, info = inspect_bag(path)
    assert stats and info["messages"] > 0
    assert "topic" in format_report(stats, info)
    try:
        ingest.load_run(path, progress=False)
    except IngestError as err:
        assert "Topics in the bag" in str(err) or "topic" in str(err)
    else:  # pragma: no cover - none of these bags holds odometry
        pytest.fail("an edge-case bag without odometry produced a run")


def test_inspect_real_bag_rates() -> None:
    stats, info = inspect_bag(BAGS / "robot_localization_test2_jackal.bag")
    by = {s.topic: s for s in stats}
    assert by["/jackal_velocity_controller/odom"].rate_hz == pytest.approx(50.0, rel=1e-3)
    assert by["/jackal_velocity_controller/odom"].count == 3060
    assert by["/imu/data"].duration_s == pytest.approx(61.2, abs=0.05)
    assert info["duration_s"] == pytest.approx(61.2, abs=0.05)


# -- helhest JSON --------------------------------------------------------------------------------


@pytest.mark.skipif(not HELHEST.exists(), reason=f"helhest runs not found at {HELHEST}")
@pytest.mark.parametrize(
    "name", ["right_turn_a", "left_circle", "helhest_2026_04_13-09_55_01", "helhest_2026_04_13-09_57_51"]
)
def test_helhest_json_runs(name: str, tmp_path: Path) -> None:
    import json

    path = HELHEST / f"{name}.json"
    data = json.loads(path.read_text())
    run = ingest.load_run(path, dt=0.01)
    traj = data["trajectory"]["points"]
    assert run.meta["format"] == "helhest-json"
    assert run.meta["rates_hz"]["trajectory"] == pytest.approx(20.0, rel=0.02)
    assert np.allclose(np.diff(run.wheel_cmd["t"]), 0.01)
    assert run.duration == pytest.approx(
        traj[-1]["t"] - max(traj[0]["t"], data["wheel_velocities"]["timeseries"][0]["t"]), abs=0.011
    )
    # Positions are linearly interpolated from the trajectory (which starts at the origin, heading +x).
    tt = np.array([p["t"] for p in traj])
    raw = ingest.load_helhest_json(path, dt=0.01, normalize_start=False)
    grid = raw.odom["t"].to_numpy() + raw.meta["t0_s"]
    np.testing.assert_allclose(raw.odom["x"], np.interp(grid, tt, [p["x"] for p in traj]), atol=1e-6)
    np.testing.assert_allclose(raw.odom["y"], np.interp(grid, tt, [p["y"] for p in traj]), atol=1e-6)
    assert run.wheel_meas is not None
    np.testing.assert_allclose(
        run.wheel_cmd[["left", "right", "rear"]].abs().max().to_numpy(),
        np.max(np.abs([[p["left"], p["right"], p["rear"]] for p in data["wheel_velocities"]["timeseries"]]), axis=0),
        rtol=0.05,
    )
    if name == "right_turn_a":
        assert run.meta["cmd_vel"] == [0.75, 0.0, -0.6]
        assert run.odom["yaw"].iloc[-1] < -2.0  # a right turn
    # Cache round trip in both formats.
    for suffix in (".npz", ".parquet"):
        p = run.save(tmp_path / f"{name}{suffix}")
        back = ingest.load_run(p)
        assert back.name == run.name and back.segments == run.segments
        np.testing.assert_array_equal(back.odom.to_numpy(), run.odom.to_numpy())
        np.testing.assert_array_equal(back.wheel_cmd.to_numpy(), run.wheel_cmd.to_numpy())
        assert back.meta["cmd_vel"] == run.meta["cmd_vel"]
