"""`ingest inspect` / `ingest load` command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import bagio
from sysid.cli.ingest_program import main
from tests.helpers.ingest_fixtures import T0_NS, drive_config, write_drive


def _gappy_bag(tmp: Path) -> Path:
    msgs = []
    for i in range(50):
        ns = T0_NS + i * 20_000_000 + (2_000_000_000 if i >= 30 else 0)  # 50 Hz with a 2 s gap
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns - 5_000_000, (0, 0, 0))))
        msgs.append(("/cmd", "std_msgs/msg/Float64MultiArray", ns, bagio.float64_multiarray([0, 0, 0])))
    (p,) = bagio.write_bag(tmp / "g.bag", msgs)
    return p


def test_inspect_prints_topics_rates_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _gappy_bag(tmp_path)
    assert main(["inspect", "-q", str(p)]) == 0
    out = capsys.readouterr().out
    assert "ROS 1 bag" in out and "/odom" in out and "nav_msgs/msg/Odometry" in out
    assert "std_msgs/msg/Float64MultiArray" in out
    line = next(l for l in out.splitlines() if l.startswith("/odom"))
    cols = line.split()
    assert int(cols[2]) == 50
    assert float(cols[5]) == pytest.approx(2.02, abs=1e-3)  # max gap [s]
    assert float(cols[6]) == pytest.approx(0.005, abs=1e-6)  # record - header clock offset [s]
    assert "gap(s)" in out and "t=0.580 s (2.020 s)" in out
    assert main(["inspect", "-q", "--json", str(p)]) == 0
    data = json.loads(capsys.readouterr().out)
    odom = next(t for t in data["topics"] if t["topic"] == "/odom")
    assert odom["count"] == 50 and odom["clock"] == "header"


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing.bag")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bag not found") and "Traceback" not in err and err.count("\n") == 1
    p = _gappy_bag(tmp_path)
    assert main(["load", "-q", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "gap" in err and err.count("\n") == 1, err


def test_cli_load_saves_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = write_drive(tmp_path, "ros2-mcap")
    cfg = tmp_path / "map.yaml"
    cfg.write_text(ingest.TopicMap.from_dict(drive_config()).to_yaml())
    out = tmp_path / "run.parquet"
    assert main(["load", "-q", str(path), "-c", str(cfg), "--dt", "0.02", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pallet: x=" in text and "segment climb" in text
    climb = next(line for line in text.splitlines() if "climb-onset check" in line)
    assert "{" not in climb and "m ahead of the nearer front wheel" in climb, climb  # words, not a dict
    assert "odometry jumps (implied acceleration > 30 m/s^2): 0" in text  # a smooth simulated drive
    run = ingest.Run.load(out)
    assert np.allclose(np.diff(run.odom["t"]), 0.02) and run.pallet is not None


def test_pose_sources_meas_and_split(tmp_path: Path) -> None:
    msgs = []
    for i in range(40):
        ns = T0_NS + i * 50_000_000
        msgs.append(
            ("/tf", "tf2_msgs/msg/TFMessage", ns, bagio.tf_message(ns, (0.1 * i, 0, 0), child_frame_id="base_link"))
        )
        msgs.append(("/pose", "geometry_msgs/msg/PoseStamped", ns, bagio.pose_stamped(ns, (0.2 * i, 0, 0))))
        msgs.append(
            (
                "/wheel_cmd",
                "sensor_msgs/msg/JointState",
                ns,
                bagio.joint_state(ns, ["rear_j", "left_j", "right_j"], [3.0, 1.0, 2.0]),
            )
        )
        msgs.append(
            (
                "/joint_states",
                "sensor_msgs/msg/JointState",
                ns,
                bagio.joint_state(ns, ["rear_j", "left_j", "right_j"], [0.3, 0.1, 0.2]),
            )
        )
    parts = bagio.write_bag(tmp_path / "p.bag", msgs, split=2)
    run = ingest.load_run(parts, dt=0.05, progress=False)  # split bag as a list
    assert run.meta["roles"]["odom"]["topic"] == "/pose"  # PoseStamped preferred over TF
    assert run.odom["x"].iloc[-1] == pytest.approx(0.2 * 39)
    np.testing.assert_allclose(run.wheel_cmd[["left", "right", "rear"]].iloc[0], [1.0, 2.0, 3.0])
    assert run.meta["roles"]["wheel_meas"]["topic"] == "/joint_states"
    np.testing.assert_allclose(run.wheel_meas[["left", "right", "rear"]].iloc[0], [0.1, 0.2, 0.3])
    tf = ingest.load_run(tmp_path, {"topics": {"odom": {"topic": "/tf"}}}, dt=0.05, progress=False)  # directory
    assert tf.meta["tf_frames"] == ["odom", "base_link"]
    assert tf.odom["x"].iloc[-1] == pytest.approx(0.1 * 39)


def test_climb_onset_check_reads_as_a_sentence() -> None:
    from sysid.cli.ingest_program import climb_check_line

    chk = {"onset_t": 8.1, "onset_xy": [6.5, -1.0], "edge_distance_lidar_m": 0.275, "edge_distance_per_wheel_m": {},
           "edge_distance_expected_m": 0.288, "discrepancy_m": -0.013, "consistent": True}
    assert climb_check_line(chk) == (
        "climb-onset check: at the onset of the climb (8.10 s) the lidar's pallet edge is 0.275 m ahead of the "
        "nearer front wheel, 0.288 m expected from the wheel radius and pallet height (-0.013 m): consistent")
    off = climb_check_line({**chk, "edge_distance_lidar_m": 0.5, "consistent": False})
    assert off.endswith("(+0.212 m): NOT consistent: check the lidar extrinsic or the odometry")
    none = climb_check_line({**chk, "edge_distance_lidar_m": None, "consistent": None})
    assert none.endswith("neither front wheel heads for the lidar's pallet: not checked")
