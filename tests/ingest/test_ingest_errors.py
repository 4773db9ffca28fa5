"""Bad input: a named IngestError saying what is wrong and how to fix it; nothing written to the cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import bagio, errors
from tests.helpers.ingest_fixtures import T0_NS, drive_config, files_under, make_drive, write_drive


def _load_fails(
    tmp: Path, source: object, err: type[errors.IngestError], match: str, **kwargs: object
) -> errors.IngestError:
    """load_run raises ``err`` (matching ``match``) and leaves the cache directory empty."""
    cache = tmp / "cache"
    kwargs.setdefault("progress", False)
    with pytest.raises(err, match=match) as info:
        ingest.load_run(source, cache=cache, **kwargs)  # type: ignore[arg-type]
    assert files_under(cache) == [], "partial output left in the cache"
    return info.value


def _simple(
    n: int = 40,
    dt_ns: int = 50_000_000,
    odom_t: list[int] | None = None,
    pos: list[tuple[float, float, float]] | None = None,
) -> list[tuple]:
    msgs = []
    stamps = odom_t if odom_t is not None else [T0_NS + i * dt_ns for i in range(n)]
    for i, ns in enumerate(stamps):
        p = pos[i] if pos is not None else (0.01 * i, 0.0, 0.0)
        msgs.append(("/odom", "nav_msgs/msg/Odometry", T0_NS + i * dt_ns, bagio.odometry(ns, p)))
        msgs.append(
            (
                "/wheel_cmd",
                "std_msgs/msg/Float64MultiArray",
                T0_NS + i * dt_ns,
                bagio.float64_multiarray([1.0, 1.0, 1.0]),
            )
        )
    return msgs


def test_missing_file(tmp_path: Path) -> None:
    err = _load_fails(tmp_path, tmp_path / "nope.bag", errors.BagReadError, "not found")
    assert "nope.bag" in str(err)


@pytest.mark.parametrize("fmt", ["ros1", "ros2-sqlite3", "ros2-mcap"])
def test_truncated_bag(tmp_path: Path, fmt: str) -> None:
    path, _ = write_drive(tmp_path, fmt, with_clouds=False)
    files = [path] if path.is_file() else [f for f in path.iterdir() if f.suffix in (".db3", ".mcap")]
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])
    _load_fails(tmp_path, path, errors.BagReadError, "truncated|corrupt", config=drive_config())


def test_not_a_bag_and_empty_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bag"
    junk.write_bytes(b"hello, I am not a bag" * 10)
    _load_fails(tmp_path, junk, errors.BagReadError, "not a bag")
    empty = tmp_path / "empty.mcap"
    empty.write_bytes(b"")
    _load_fails(tmp_path, empty, errors.BagReadError, "empty")
    wrong = tmp_path / "ros1.db3"
    (p,) = bagio.write_bag(tmp_path / "real.mcap", _simple())
    wrong.write_bytes(p.read_bytes())
    _load_fails(tmp_path, wrong, errors.BagReadError, "rename")
    (tmp_path / "emptydir").mkdir()
    _load_fails(tmp_path, tmp_path / "emptydir", errors.BagReadError, "directory")


def test_missing_and_misnamed_topic_lists_topics(tmp_path: Path) -> None:
    (p,) = bagio.write_bag(tmp_path / "a.bag", _simple())
    odom = {"topics": {"odom": {"topic": "/odometry"}}}
    err = _load_fails(tmp_path, p, errors.TopicError, "not in the bag", config=odom)
    assert "/odom [nav_msgs/msg/Odometry]" in str(err) and "/wheel_cmd" in str(err)
    # No command topic at all.
    (q,) = bagio.write_bag(tmp_path / "b.bag", [m for m in _simple() if m[0] == "/odom"])
    err = _load_fails(tmp_path, q, errors.TopicError, "no wheel-command topic")
    assert "odom_twist" in str(err)
    with ingest.BagReader(p) as bag, pytest.raises(errors.TopicError, match="Did you mean '/odom'"):
        bag.require("/robot/odom")


def test_wrong_message_type(tmp_path: Path) -> None:
    (p,) = bagio.write_bag(tmp_path / "a.mcap", _simple())
    err = _load_fails(
        tmp_path,
        p,
        errors.MessageTypeError,
        "carries std_msgs/msg/Float64MultiArray",
        config={"topics": {"odom": {"topic": "/wheel_cmd"}}},
    )
    assert "expected" in str(err)


def test_unknown_custom_type(tmp_path: Path) -> None:
    from rosbags.rosbag1 import Writer

    defs = {"my_pkg/msg/WheelCmd": "float64 left\nfloat64 right\nfloat64 rear\n"}
    ts = bagio._store(1, defs)
    p = tmp_path / "custom.bag"
    with Writer(p) as w:
        co = w.add_connection("/odom", "nav_msgs/msg/Odometry", typestore=bagio.typestore(1))
        cc = w.add_connection("/wheel_cmd", "my_pkg/msg/WheelCmd", msgdef="", md5sum="0" * 32)
        for i in range(10):
            ns = T0_NS + i * 50_000_000
            od = bagio.convert_message(bagio.odometry(ns, (0, 0, 0)), "nav_msgs/msg/Odometry", ts)
            w.write(co, ns, ts.serialize_ros1(od, "nav_msgs/msg/Odometry"))
            cmd = ts.types["my_pkg/msg/WheelCmd"](left=1.0, right=1.0, rear=1.0)
            w.write(cc, ns, ts.serialize_ros1(cmd, "my_pkg/msg/WheelCmd"))
    cfg = {"topics": {"wheel_cmd": {"topic": "/wheel_cmd", "type": "my_pkg/msg/WheelCmd"}}}
    err = _load_fails(tmp_path, p, errors.UnknownTypeError, "cannot be decoded", config=cfg)
    assert "custom_types" in str(err)
    # With the definition supplied, the type decodes (and is then refused as a wheel command).
    with_defs = {**cfg, "custom_types": defs}
    _load_fails(tmp_path, p, errors.MessageTypeError, "cannot read wheel commands", config=with_defs)


def test_nan_and_inf_values(tmp_path: Path) -> None:
    pos = [(0.01 * i, 0.0, 0.0) for i in range(40)]
    pos[17] = (float("nan"), 0.0, 0.0)
    (p,) = bagio.write_bag(tmp_path / "n.mcap", _simple(pos=pos))
    err = _load_fails(tmp_path, p, errors.DataError, "non-finite")
    assert "sample 17" in str(err) and "non-finite position.x (nan)" in str(err) and " s from the topic" in str(err)
    pos[17] = (0.0, float("inf"), 0.0)
    (q,) = bagio.write_bag(tmp_path / "i.bag", _simple(pos=pos))
    err = _load_fails(tmp_path, q, errors.DataError, "non-finite")
    assert "position.y (inf)" in str(err)


def test_nan_value_in_json_run_names_field_and_time(tmp_path: Path) -> None:
    pts = [{"t": 0.05 * i, "x": 0.01 * i, "y": 0.0, "yaw": 0.0} for i in range(20)]
    pts[7]["yaw"] = float("nan")
    data = {
        "trajectory": {"points": pts},
        "wheel_velocities": {"timeseries": [{"t": 0.02 * i, "left": 0, "right": 0, "rear": 0} for i in range(50)]},
    }
    f = tmp_path / "nanval.json"
    f.write_text(json.dumps(data))
    err = _load_fails(tmp_path, f, errors.DataError, re.escape("trajectory.points[7].yaw is nan at t=0.350 s"))
    assert "1 bad samples" in str(err)


def test_nan_timestamps_in_json_run(tmp_path: Path) -> None:
    data = {
        "trajectory": {"points": [{"t": 0.05 * i, "x": 0.0, "y": 0.0, "yaw": 0.0} for i in range(20)]},
        "wheel_velocities": {"timeseries": [{"t": 0.02 * i, "left": 0, "right": 0, "rear": 0} for i in range(50)]},
    }
    data["trajectory"]["points"][5]["t"] = float("nan")
    f = tmp_path / "run.json"
    f.write_text(json.dumps(data))
    _load_fails(tmp_path, f, errors.TimestampError, "non-finite")
    f.write_text("{not json")
    _load_fails(tmp_path, f, errors.RunFormatError, "not valid JSON")
    f.write_text(json.dumps({"trajectory": {}}))
    _load_fails(tmp_path, f, errors.RunFormatError, "missing or malformed")


def test_out_of_order_timestamps(tmp_path: Path) -> None:
    stamps = [T0_NS + i * 50_000_000 for i in range(40)]
    stamps[20], stamps[21] = stamps[21], stamps[20]
    (p,) = bagio.write_bag(tmp_path / "o.db3", _simple(odom_t=stamps))
    err = _load_fails(tmp_path, p, errors.TimestampError, "backwards")
    assert "sample 21" in str(err) and "disorder: sort" in str(err)
    run = ingest.load_run(p, {"disorder": "sort"}, progress=False)
    assert run.odom["t"].is_monotonic_increasing


def test_time_gap_and_jump(tmp_path: Path) -> None:
    stamps = [T0_NS + i * 50_000_000 for i in range(40)]
    stamps = stamps[:20] + [s + 3_000_000_000 for s in stamps[20:]]  # 3 s silence
    (p,) = bagio.write_bag(tmp_path / "g.bag", _simple(odom_t=stamps))
    err = _load_fails(tmp_path, p, errors.TimestampError, "gap")
    assert "t=0.950 s" in str(err) and "max_gap_s" in str(err)
    run = ingest.load_run(p, {"max_gap_s": 5.0}, progress=False)
    assert run.duration == pytest.approx(1.95)  # commands (record time) end before the odometry
    # A clock jump of an hour on the header stamps.
    stamps = [T0_NS + i * 50_000_000 for i in range(40)]
    stamps = stamps[:30] + [s + 3600 * 1_000_000_000 for s in stamps[30:]]
    (q,) = bagio.write_bag(tmp_path / "j.bag", _simple(odom_t=stamps))
    _load_fails(tmp_path, q, errors.TimestampError, "time jump")


def _cloud_bag(tmp: Path, clouds: list[np.ndarray]) -> Path:
    d = make_drive(with_clouds=False, duration=4.0)
    msgs = list(d.messages)
    for i, c in enumerate(clouds):
        ns = T0_NS + int(i * 0.5e9)
        msgs.append(("/lidar/points", "sensor_msgs/msg/PointCloud2", ns, bagio.point_cloud2(ns, c)))
    msgs.sort(key=lambda m: m[2])
    (p,) = bagio.write_bag(tmp / "c.mcap", msgs)
    return p


def test_empty_and_all_nan_clouds(tmp_path: Path) -> None:
    nan = np.full((50, 3), np.nan, np.float32)
    p = _cloud_bag(tmp_path, [np.zeros((0, 3), np.float32), nan, nan])
    _load_fails(tmp_path, p, errors.CloudError, "empty or all-NaN", config=drive_config(), fit_pallet=True)
    run = ingest.load_run(p, drive_config(), progress=False)  # auto: the run loads, the failure is recorded
    assert run.pallet is None and "CloudError" in run.meta["pallet_error"]


def test_pallet_not_found(tmp_path: Path) -> None:
    from ingest.simlidar import beam_pattern, scan

    ground = [
        scan(beam_pattern(16, h_res_deg=1.0), (0.0, 0.0, 0.5), None, [], ground_z=-0.36, seed=i) for i in range(3)
    ]
    p = _cloud_bag(tmp_path, ground)
    err = _load_fails(tmp_path, p, errors.PalletFitError, "no object found", config=drive_config(), fit_pallet=True)
    assert "in the lidar's view" in str(err)


def test_bad_config_and_arguments(tmp_path: Path) -> None:
    (p,) = bagio.write_bag(tmp_path / "a.bag", _simple())
    _load_fails(tmp_path, p, errors.ConfigError, "unknown keys", config={"topicz": {}})
    _load_fails(tmp_path, p, errors.ConfigError, "unknown role", config={"topics": {"lidar": "/x"}})
    _load_fails(tmp_path, p, errors.ConfigError, "time must be", config={"time": "gps"})
    _load_fails(tmp_path, p, errors.ConfigError, "not found", config=tmp_path / "missing.yaml")
    _load_fails(tmp_path, p, errors.IngestError, "resample", resample="cubic")


def test_non_overlapping_clocks(tmp_path: Path) -> None:
    msgs = []
    for i in range(40):
        ns = T0_NS + i * 50_000_000
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns - 10**12, (0, 0, 0))))  # sim-time stamps
        msgs.append(("/wheel_cmd", "geometry_msgs/msg/TwistStamped", ns, bagio.twist_stamped(ns, (1, 0, 0))))
    (p,) = bagio.write_bag(tmp_path / "c.bag", msgs)
    _load_fails(tmp_path, p, errors.TimestampError, "do not overlap.*time: record")
    run = ingest.load_run(p, {"time": "record"}, progress=False)
    assert run.meta["clock_offsets_s"]["/odom"] == pytest.approx(1000.0)


def test_failed_save_leaves_nothing(tmp_path: Path) -> None:
    (p,) = bagio.write_bag(tmp_path / "a.bag", _simple())
    run = ingest.load_run(p, progress=False)
    run.meta["bad"] = object()  # not JSON: stringified, still saves
    out = run.save(tmp_path / "ok.npz")
    assert out.exists()
    with pytest.raises(errors.RunFormatError, match=".npz or .parquet"):
        run.save(tmp_path / "run.csv")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"garbage")
    with pytest.raises(errors.RunFormatError, match="is not a run cache file"):
        ingest.Run.load(broken)
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []


def test_bad_arguments_to_the_writers_are_ingest_errors(tmp_path: Path) -> None:
    """The bag writer and the simulated lidar (used by tests and `sysid synth`) refuse bad arguments with ingest's
    own ConfigError (and a message type missing from the target store with UnknownTypeError), so that sysid's
    error handling, which catches ingest's root class, reports them as one line."""
    from ingest import simlidar

    with pytest.raises(errors.ConfigError, match="unknown bag format 'ros3'"):
        bagio.write_bag(tmp_path / "a.bag", _simple(), fmt="ros3")
    with pytest.raises(errors.ConfigError, match="cannot infer the bag format"):
        bagio.write_bag(tmp_path / "a.txt", _simple())
    with pytest.raises(errors.ConfigError, match="split is only supported for ROS 1"):
        bagio.write_bag(tmp_path / "a.mcap", _simple(), split=2)
    with pytest.raises(errors.ConfigError, match=r"points must be \(N, 3\)"):
        bagio.point_cloud2(0, np.zeros((4, 2)))
    with pytest.raises(errors.UnknownTypeError, match="not in the target typestore"):
        bagio.convert_message(object(), "my_msgs/msg/Nothing", bagio.typestore(2))
    with pytest.raises(errors.ConfigError, match="n_beams"):
        simlidar.beam_pattern(0)
    with pytest.raises(errors.ConfigError, match="h_res_deg"):
        simlidar.beam_pattern(16, h_res_deg=0.0)
    with pytest.raises(errors.ConfigError, match="orientation must be"):
        simlidar.scan(simlidar.beam_pattern(16), sensor_position=(0, 0, 1), sensor_orientation=(1.0, 2.0))


def test_ingest_raises_only_its_own_errors() -> None:
    """IngestError is ingest's one root: no module raises a bare built-in exception for bad input. Left as they
    are: two private readers whose ValueError their callers handle (a truncated header becomes a BagReadError, a
    truncated mcap record ends the metadata scan), the package's lazy ``__getattr__`` (AttributeError is Python's
    protocol) and the bag writer's FileExistsError for an existing file (an OSError; sysid checks its output
    folders before writing)."""
    import ast
    import builtins

    left = {("inspect.py", "_raw_stamp", "ValueError"), ("mcapmeta.py", "_string", "ValueError"),
            ("lazy.py", "lazy_getattr", "AttributeError"), ("lazy.py", "__getattr__", "AttributeError"),
            ("bagio.py", "write_bag", "FileExistsError")}
    found = []
    for path in sorted(Path(ingest.__file__).parent.glob("*.py")):
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    builtin = getattr(builtins, exc.id, None) if isinstance(exc, ast.Name) else None
                    if isinstance(builtin, type) and issubclass(builtin, Exception) \
                            and (path.name, func.name, exc.id) not in left:
                        found.append(f"{path.name}:{node.lineno} {exc.id}")
    assert not found, found
