"""Round trips: bags written by the tests (ROS 1, ROS 2 sqlite3, ROS 2 mcap) read back exactly."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from ingest import BagReader, bagio, cloud_to_xyz

FORMATS = ["ros1", "ros2-sqlite3", "ros2-mcap"]
T0 = 1_650_000_000_123_456_789


def _messages(ros: int) -> list[bagio.BagMessage]:
    rng = np.random.default_rng(42)
    out = []
    for i in range(5):
        ns = T0 + i * 50_000_000
        pts = rng.normal(0, 5, size=(200 + i, 3)).astype(np.float32)
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        out += [
            bagio.BagMessage(
                "/odom",
                "nav_msgs/msg/Odometry",
                ns,
                bagio.odometry(ns + 7, rng.normal(size=3), q, rng.normal(size=3), rng.normal(size=3), ros=ros),
            ),
            bagio.BagMessage(
                "/joint_cmd",
                "sensor_msgs/msg/JointState",
                ns,
                bagio.joint_state(ns, ["left", "right", "rear"], rng.normal(size=3), ros=ros),
            ),
            bagio.BagMessage(
                "/array_cmd",
                "std_msgs/msg/Float64MultiArray",
                ns,
                bagio.float64_multiarray(rng.normal(size=3), ["wheels"], ros=ros),
            ),
            bagio.BagMessage(
                "/cmd_vel",
                "geometry_msgs/msg/TwistStamped",
                ns,
                bagio.twist_stamped(ns, rng.normal(size=3), rng.normal(size=3), ros=ros),
            ),
            bagio.BagMessage("/points", "sensor_msgs/msg/PointCloud2", ns, bagio.point_cloud2(ns, pts, ros=ros)),
            bagio.BagMessage("/imu", "sensor_msgs/msg/Imu", ns, bagio.imu(ns, q, ros=ros)),
        ]
    return out


def _equal(a: object, b: object) -> bool:
    fa, fb = bagio.message_fields(a), bagio.message_fields(b)

    def eq(x: object, y: object) -> bool:
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return isinstance(y, list) and len(x) == len(y) and all(eq(u, v) for u, v in zip(x, y))
        if isinstance(x, np.ndarray):
            return np.array_equal(x, np.asarray(y))
        return x == y

    return eq(fa, fb)


def _path(tmp: Path, fmt: str, name: str = "bag") -> Path:
    return tmp / (f"{name}.bag" if fmt == "ros1" else name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_exact(tmp_path: Path, fmt: str) -> None:
    ros = 1 if fmt == "ros1" else 2
    msgs = _messages(ros)
    paths = bagio.write_bag(_path(tmp_path, fmt), msgs, fmt=fmt)
    with BagReader(paths) as bag:
        assert bag.is_ros1 == (fmt == "ros1")
        assert {t: i.msgtype for t, i in bag.topics.items()} == {m.topic: m.msgtype for m in msgs}
        got = list(bag.messages(sorted({m.topic for m in msgs})))
    assert len(got) == len(msgs)
    by_topic = {}
    for m in msgs:
        by_topic.setdefault(m.topic, []).append(m)
    for topic, expected in by_topic.items():
        back = [g for g in got if g.topic == topic]
        assert [g.record_ns for g in back] == [m.stamp_ns for m in expected]
        for g, m in zip(back, expected):
            assert _equal(g.msg, m.msg), f"{fmt} {topic} differs"
    # header.stamp is read separately from the record time (odometry header is +7 ns).
    od = [g for g in got if g.topic == "/odom"]
    assert [g.header_ns - g.record_ns for g in od] == [7] * len(od)
    # PointCloud2 decodes back to the exact float32 points.
    clouds = [g for g in got if g.topic == "/points"]
    src = [m for m in msgs if m.topic == "/points"]
    for g, m in zip(clouds, src):
        assert np.array_equal(cloud_to_xyz(g.msg), cloud_to_xyz(m.msg))
        assert cloud_to_xyz(g.msg).shape[0] == m.msg.width


def test_ros1_compressed_and_split(tmp_path: Path) -> None:
    msgs = _messages(1)
    for comp in ("bz2", "lz4"):
        (p,) = bagio.write_bag(tmp_path / f"c_{comp}.bag", msgs, compression=comp)
        with BagReader(p) as bag:
            assert sum(1 for _ in bag.messages(list(bag.topics))) == len(msgs)
    parts = bagio.write_bag(tmp_path / "split.bag", msgs, split=3)
    assert len(parts) == 3 and all(p.exists() for p in parts)
    for src in (parts, str(tmp_path / "split_*.bag")):
        with BagReader(src) as bag:
            got = list(bag.messages(list(bag.topics)))
        assert len(got) == len(msgs)
        assert [g.record_ns for g in got] == sorted(m.stamp_ns for m in msgs)


def test_ros2_bare_storage_files_and_zstd(tmp_path: Path) -> None:
    msgs = _messages(2)
    for name in ("bare.db3", "bare.mcap"):
        (p,) = bagio.write_bag(tmp_path / name, msgs)
        assert p.is_file() and not (tmp_path / "metadata.yaml").exists()
        with BagReader(p) as bag:
            assert not bag.is_ros1
            assert sum(1 for _ in bag.messages(list(bag.topics))) == len(msgs)
    (p,) = bagio.write_bag(tmp_path / "z", msgs, fmt="ros2-mcap", compression="zstd")
    with BagReader(p) as bag:
        got = [g for g in bag.messages(["/odom"])]
    assert _equal(got[0].msg, msgs[0].msg)


@pytest.mark.parametrize("fmt", FORMATS)
def test_writer_is_deterministic(tmp_path: Path, fmt: str) -> None:
    ros = 1 if fmt == "ros1" else 2

    def digest(root: Path) -> dict[str, str]:
        files = [root] if root.is_file() else sorted(x for x in root.rglob("*") if x.is_file())
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (a,) = bagio.write_bag(_path(tmp_path / "a", fmt), _messages(ros), fmt=fmt)
    (b,) = bagio.write_bag(_path(tmp_path / "b", fmt), _messages(ros), fmt=fmt)
    da, db = digest(a), digest(b)
    assert da == db and len(da) >= 1


def test_ros1_and_ros2_builders_convert(tmp_path: Path) -> None:
    """Messages built for ROS 2 are written to ROS 1 (Header.seq = 0) and read back the same."""
    ns = T0
    m2 = bagio.odometry(ns, (1.0, 2.0, 3.0), (0.0, 0.0, 0.0, 1.0), ros=2)
    (p,) = bagio.write_bag(tmp_path / "x.bag", [("/odom", "nav_msgs/msg/Odometry", ns, m2)])
    with BagReader(p) as bag:
        (got,) = list(bag.messages(["/odom"]))
    assert got.msg.header.seq == 0
    assert got.msg.pose.pose.position.x == 1.0 and got.msg.pose.pose.position.z == 3.0
    assert got.header_ns == ns


def test_custom_types_embedded(tmp_path: Path) -> None:
    """A custom message type embedded in the bag is decoded by the reader."""
    defs = {"my_pkg/msg/WheelCmd": "float64 left\nfloat64 right\nfloat64 rear\n"}
    ts = bagio._store(2, defs)
    msg = ts.types["my_pkg/msg/WheelCmd"](left=1.0, right=2.0, rear=3.0)
    (p,) = bagio.write_bag(tmp_path / "c.mcap", [("/wc", "my_pkg/msg/WheelCmd", T0, msg)], custom_types=defs)
    with BagReader(p) as bag:
        assert bag.topics["/wc"].decodable
        (got,) = list(bag.messages(["/wc"]))
    assert (got.msg.left, got.msg.right, got.msg.rear) == (1.0, 2.0, 3.0)
