"""Issue 15: bags onto N named wheels — JointState names from the wheel map, cmd_vel through the
drive's kinematics, and a robot that does not fit the bag said so.

Small synthetic bags (odometry at 20 Hz, a command topic at 50 Hz), read with the Husky's
description (`models/husky`: 4 wheels, r = 0.1651 m, track 0.555 m) or the default Helhest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import bagio
from ingest.decode import WheelLayout
from ingest.errors import TopicError
from tests.helpers.ingest_fixtures import BAGS, T0_NS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HUSKY_WHEELS = ("front_left_wheel", "rear_left_wheel", "front_right_wheel", "rear_right_wheel")
R, TRACK = 0.1651, 0.555  # [m] models/husky/husky.urdf


@pytest.fixture(scope="module")
def husky():
    from sysid.robot import load_robot

    return load_robot(ROOT / "models" / "husky" / "husky.urdf")


def ns(t: float) -> int:
    return T0_NS + int(round(t * 1e9))


def write(tmp: Path, cmd: str, *, names=HUSKY_WHEELS, odom_topic: str = "/odom", v: float = 0.5,
          w: float = 0.4, duration: float = 3.0) -> Path:
    """A bag driving an arc (v [m/s], w [rad/s]) with commands of kind ``cmd``: ``joint_state``
    (per-wheel speeds (v -+ w track/2)/r under ``names``, in a shuffled order with an extra joint),
    ``twist`` (cmd_vel), ``array2`` (Float64MultiArray left, right) or ``none``."""
    msgs = []
    t = np.arange(0.0, duration, 0.05)
    for tt in t:
        yaw = w * tt
        xy = (v / w * np.sin(yaw), v / w * (1 - np.cos(yaw)))
        msgs.append((odom_topic, "nav_msgs/msg/Odometry", ns(tt),
                     bagio.odometry(ns(tt), (*xy, 0.0), bagio.yaw_quat(yaw), (v, 0, 0), (0, 0, w))))
    left, right = (v - w * TRACK / 2) / R, (v + w * TRACK / 2) / R
    speed = {"front_left_wheel": left, "rear_left_wheel": left, "front_right_wheel": right,
             "rear_right_wheel": right}
    for tt in np.arange(0.0, duration, 0.02):
        if cmd == "joint_state":
            order = [names[2], "arm_joint", names[0], names[3], names[1]]
            vel = [speed.get(HUSKY_WHEELS[names.index(n)], 0.0) if n in names else 9.9 for n in order]
            msgs.append(("/joint_cmd", "sensor_msgs/msg/JointState", ns(tt), bagio.joint_state(ns(tt), order, vel)))
        elif cmd == "twist":
            msgs.append(("/cmd_vel", "geometry_msgs/msg/Twist", ns(tt), bagio.twist((v, 0, 0), (0, 0, w))))
        elif cmd == "array2":
            msgs.append(("/wheel_cmd", "std_msgs/msg/Float64MultiArray", ns(tt),
                         bagio.float64_multiarray([left, right])))
    msgs.sort(key=lambda m: m[2])
    path = tmp / f"{cmd}.mcap"
    bagio.write_bag(path, msgs)
    return path


def expected(run: ingest.Run, v: float = 0.5, w: float = 0.4) -> None:
    assert run.wheel_names == list(HUSKY_WHEELS)
    mid = run.wheel_cmd.iloc[len(run.wheel_cmd) // 2]
    for name in HUSKY_WHEELS:
        lever = -TRACK / 2 if "left" in name else TRACK / 2
        assert mid[name] == pytest.approx((v + w * lever) / R, rel=1e-9), name


def test_joint_state_names_from_the_wheel_map(tmp_path: Path, husky) -> None:
    """Auto-detected topics; the JointState's joints (shuffled, one extra) picked by the wheel map's names."""
    run = ingest.load_run(write(tmp_path, "joint_state"), robot=husky, progress=False)
    expected(run)
    assert run.meta["roles"]["wheel_cmd"]["topic"] == "/joint_cmd"
    assert "warnings" not in run.meta
    assert husky.log_columns(run.wheel_cmd.columns, run.name) == list(HUSKY_WHEELS)  # what the fit reads


def test_joint_state_names_by_substring_and_topic_map_joints(tmp_path: Path, husky) -> None:
    """Joint names that only contain the wheel's name (a `_joint` suffix) are matched when exactly
    one does; the topic map can list the joints instead, one per wheel in the robot's order."""
    names = tuple(f"{n}_joint" for n in HUSKY_WHEELS)
    bag = write(tmp_path, "joint_state", names=names)
    expected(ingest.load_run(bag, robot=husky, progress=False))
    cfg = {"topics": {"wheel_cmd": {"topic": "/joint_cmd", "joints": list(names)}}}
    expected(ingest.load_run(bag, config=cfg, robot=husky, progress=False))
    cfg["topics"]["wheel_cmd"]["joints"] = list(names[:3])
    with pytest.raises(TopicError, match=r"lists 3 joints .* for the 4 wheels of robot husky"):
        ingest.load_run(bag, config=cfg, robot=husky, progress=False)


def test_cmd_vel_through_the_drive_kinematics(tmp_path: Path, husky) -> None:
    """cmd_vel: each wheel (v -+ w track/2) / r by its side, the Husky's r and track."""
    expected(ingest.load_run(write(tmp_path, "twist"), robot=husky, progress=False))


def test_odometry_twist_as_the_command(tmp_path: Path, husky) -> None:
    """No command in the bag: `source: odom_twist` turns the odometry twist into the 4 wheels."""
    bag = write(tmp_path, "none")
    cfg = {"topics": {"wheel_cmd": {"source": "odom_twist"}}}
    expected(ingest.load_run(bag, config=cfg, robot=husky, progress=False))


def test_two_value_array_drives_each_side(tmp_path: Path, husky) -> None:
    expected(ingest.load_run(write(tmp_path, "array2"), robot=husky, progress=False))


def test_robot_from_the_topic_map_and_round_trip(tmp_path: Path) -> None:
    """`robot: husky` in the topic map (a bundled name) sets the wheels; to_dict / from_dict keep them
    (the ingest cache key)."""
    from sysid.robot import load_robot

    tm = ingest.TopicMap.from_dict({"robot": "husky"}, robot_reader=load_robot)
    assert tm.wheel_names == HUSKY_WHEELS
    assert (tm.geometry.wheel_radius, tm.geometry.track_width) == pytest.approx((R, TRACK))
    back = ingest.TopicMap.from_dict(tm.to_dict())
    assert back.wheels == tm.wheels and back.to_dict() == tm.to_dict()
    expected(ingest.load_run(write(tmp_path, "twist"), config=tm, progress=False))
    with pytest.raises(ingest.ConfigError, match="not a bundled robot"):
        ingest.TopicMap.from_dict({"robot": "no_such_robot"})


def test_joint_state_of_another_robot_is_an_error(tmp_path: Path, husky) -> None:
    """The Helhest's JointState read as the Husky: a named error listing both sides and the fixes."""
    bag = write(tmp_path, "joint_state", names=("left_wheel_j", "rear_wheel_j", "right_wheel_j", "spare_j"))
    with pytest.raises(TopicError, match=r"match none of the 4 wheels of robot husky .* give the right robot"):
        ingest.load_run(bag, robot=husky, progress=False)


def test_husky_named_bag_read_as_the_helhest_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Husky-named bag without a robot: the run gets the Helhest's three wheels, and says so."""
    bag = write(tmp_path, "none", odom_topic="/husky_velocity_controller/odom")
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  wheel_cmd: {source: odom_twist}\n")
    run = ingest.load_run(bag, config=topics, progress=False)
    assert run.wheel_names == ["left", "right", "rear"]
    warns = run.meta["warnings"]
    assert any("default robot helhest" in w and "--robot" in w for w in warns), warns
    assert any("name robot husky" in w for w in warns), warns
    from sysid.cli.ingest_program import main

    # the program reads bags with a command (a map deriving it from the odometry is refused: test_ingest_cli)
    bag = write(tmp_path, "twist", odom_topic="/husky_velocity_controller/odom")
    assert main(["load", str(bag), "-q"]) == 0
    err = capsys.readouterr().err
    assert "warning: the bag's topics ['/husky_velocity_controller/odom'] name robot husky" in err
    assert main(["load", str(bag), "--robot", "husky", "-q"]) == 0
    cap = capsys.readouterr()
    assert "warning" not in cap.err and "front_left_wheel" in cap.out


def test_layout_kinematics_closed_form() -> None:
    lay = WheelLayout(("l", "r", "c"), (("l",), ("r",), ("c",)), ("left", "right", "center"), 0.2, 0.6)
    w = lay.wheels(np.array([1.0]), np.array([2.0]))
    assert w[0].tolist() == pytest.approx([(1 - 0.6) / 0.2, (1 + 0.6) / 0.2, 1 / 0.2])
    with pytest.raises(TopicError, match="side"):
        WheelLayout(("a",), (("a",),), ("up",), 0.2, 0.6)


@pytest.mark.skipif(not (BAGS / "robot_localization_test1_husky.bag").exists(),
                    reason="../shared/data/bags/robot_localization_test1_husky.bag absent")
def test_real_husky_bag_with_the_husky(husky) -> None:
    """The real Husky log (wheel odometry, IMU, GPS; no command): its odometry twist onto the
    Husky's 4 wheels, the left and right pairs equal."""
    run = ingest.load_run(BAGS / "robot_localization_test1_husky.bag", robot=husky, progress=False,
                          config={"topics": {"wheel_cmd": {"source": "odom_twist"}}}, segments=False)
    assert run.wheel_names == list(HUSKY_WHEELS)
    assert run.duration == pytest.approx(395.3, abs=0.1)
    wc = run.wheel_cmd
    assert np.array_equal(wc["front_left_wheel"], wc["rear_left_wheel"])
    assert wc["front_left_wheel"].abs().max() * R == pytest.approx(1.02, abs=0.1)  # ~1 m/s top speed
    assert "warnings" not in run.meta


def test_ingest_reads_a_plain_robot_yaml_as_sysid_does_and_asks_for_the_reader_otherwise() -> None:
    """ingest imports no sysid: a plain robot.yaml it reads itself (the same layout as sysid's robot
    reader gives), a wheel map or URDF needs the reader passed in (`ingest.topicmap.RobotReader`)."""
    from ingest.topicmap import layout_from_robot, robot_yaml_layout
    from sysid.robot import load_robot

    helhest = ROOT / "models" / "helhest" / "robot.yaml"
    assert robot_yaml_layout(helhest) == layout_from_robot("helhest") == layout_from_robot(helhest, reader=load_robot)
    for spec in ("husky", ROOT / "models" / "husky" / "husky.urdf"):
        with pytest.raises(ingest.ConfigError, match="needs sysid's robot reader"):
            layout_from_robot(spec)
        assert layout_from_robot(spec, reader=load_robot).names == HUSKY_WHEELS
    with pytest.raises(ingest.ConfigError, match="needs sysid's robot reader"):
        ingest.TopicMap.from_dict({"robot": "husky"})


def test_ingest_imports_no_sysid() -> None:
    """The leaf: reading a bag's topic map with a bundled robot.yaml loads no sysid module."""
    import subprocess
    import sys

    code = ("import sys, ingest\n"
            "ingest.TopicMap.from_dict({'robot': 'helhest'})\n"
            "print(sorted(m for m in sys.modules if m == 'sysid' or m.startswith('sysid.')))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
