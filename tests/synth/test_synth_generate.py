"""Generated bags: contents vs manifest (read with rosbags alone), the climb, determinism, ingest."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_typestore

from sysid.synth import (
    ContactParams,
    LidarConfig,
    Pallet,
    SensorConfig,
    ServoParams,
    SynthError,
    generate_dataset,
    load_manifest,
    make_run,
    replay_commands,
)
from sysid.synth.cli import main as synth_main

# A short run (~12 s simulated): 1 m/s, 40 deg heading change, coarse lidar for speed.
SIM_DT = 1e-3
SENSORS = SensorConfig(lidar=LidarConfig(beams=16, h_res_deg=1.0, max_range=30.0))


def short_spec(seed: int = 11, index: int = 0):
    rng = np.random.default_rng(seed)
    return make_run(index, seed, 1.0, 40.0, rng, name=f"short_{seed}", cruise_time=1.5)


def gen(out: Path, seed: int = 11, fmt: str = "mcap") -> dict:
    return generate_dataset(out, fmt=fmt, sensors=SENSORS, specs=[short_spec(seed)], progress=False)


def read_bag(path: Path, ros: int = 2) -> dict[str, list]:
    """topic -> [(header stamp [ns] or record time, message)] using rosbags only."""
    ts = get_typestore(Stores.ROS2_HUMBLE if ros == 2 else Stores.ROS1_NOETIC)
    out: dict[str, list] = {}
    with AnyReader([path], default_typestore=ts) as reader:
        for conn, t, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            h = getattr(msg, "header", None)
            st = h.stamp.sec * 10**9 + h.stamp.nanosec if h is not None else t
            out.setdefault(conn.topic, []).append((st, msg, conn.msgtype))
    return out


def files_digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(f.relative_to(path.parent)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth")
    return out, gen(out)


def test_manifest_matches_bag_read_with_rosbags(dataset) -> None:
    out, manifest = dataset
    assert load_manifest(out) == manifest
    run = manifest["runs"][0]
    msgs = read_bag(out / run["bag"])
    assert set(msgs) == set(run["topics"])
    expected_rates = {"/wheel_cmd": 100, "/joint_states": 50, "/local_odom": 20, "/imu": 100, "/lidar/points": 10}
    for topic, info in run["topics"].items():
        stamps = np.array([s for s, _, _ in msgs[topic]], dtype=np.int64)
        assert len(stamps) == info["count"], topic
        assert msgs[topic][0][2] == info["type"]
        assert math.isclose((stamps[-1] - stamps[0]) / 1e9, info["duration"], abs_tol=1e-6)
        if topic in expected_rates:
            assert np.all(np.diff(stamps) > 0)
            assert math.isclose(info["rate_hz"], expected_rates[topic], rel_tol=1e-6)
            assert math.isclose(1e9 / np.median(np.diff(stamps)), expected_rates[topic], rel_tol=1e-6)
            assert stamps[0] == run["start_time_ns"]
    # Durations: the whole run is covered by the 100 Hz command stream.
    assert math.isclose(run["topics"]["/wheel_cmd"]["duration"], run["duration"], abs_tol=0.011)
    cmd = msgs["/wheel_cmd"][len(msgs["/wheel_cmd"]) // 2][1]
    assert list(cmd.name) == ["left", "right", "rear"] and len(cmd.velocity) == 3
    assert manifest["splits"]["train"] + manifest["splits"]["heldout"] == [run["name"]]


def test_robot_climbs_the_pallet(dataset) -> None:
    out, manifest = dataset
    run = manifest["runs"][0]
    truth = read_bag(out / run["bag"])["/ground_truth/pose"]
    t = (np.array([s for s, _, _ in truth]) - run["start_time_ns"]) / 1e9
    z = np.array([m.pose.position.z for _, m, _ in truth])
    c0, c1 = run["segments"]["cruise"]
    k0, k1 = run["segments"]["climb"]
    assert c1 <= k0
    flat = z[(t >= c0) & (t <= c1)]
    assert np.ptp(flat) < 0.01
    rise = z[(t >= k0) & (t <= k1)].max() - np.median(flat)
    assert 0.13 < rise < 0.17, rise  # the pallet is 0.144 m tall
    assert math.isclose(rise, run["measured"]["climb_rise"], abs_tol=1e-3)
    assert z[(t < k0)].max() - np.median(flat) < 0.01  # nothing climbs before the window


def test_odometry_is_noisy_but_close_to_truth(dataset) -> None:
    out, manifest = dataset
    run = manifest["runs"][0]
    msgs = read_bag(out / run["bag"])
    truth = {s: m.pose.position for s, m, _ in msgs["/ground_truth/pose"]}
    err = []
    for s, m, _ in msgs["/local_odom"]:
        p, q = m.pose.pose.position, truth[s]
        err.append(math.hypot(p.x - q.x, p.y - q.y))
        assert m.header.frame_id == "odom" and m.child_frame_id == "base_link"
    err = np.array(err)
    assert err[0] == 0.0  # LIO starts at the start pose
    assert 0.0005 < np.median(err) < 0.05


def test_open_loop_replay_of_logged_commands_reproduces_the_truth(dataset) -> None:
    out, manifest = dataset
    run = manifest["runs"][0]
    msgs = read_bag(out / run["bag"])
    cmd = np.array([m.velocity for _, m, _ in msgs["/wheel_cmd"]])
    truth = np.array(
        [[m.pose.position.x, m.pose.position.y, m.pose.position.z] for _, m, _ in msgs["/ground_truth/pose"]]
    )
    c, sv, p = run["true_params"]["contact"], run["true_params"]["servo"], run["pallet"]
    contact = ContactParams(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
    poses = replay_commands(
        cmd, contact, ServoParams(**sv), Pallet(p["x"], p["y"], p["yaw"], tuple(p["size"])), timestep=SIM_DT
    )
    assert np.abs(poses[:, :3] - truth).max() < 1e-6
    # ... and the replay is sensitive: 10 % less command scale ends far off.
    slow = replay_commands(
        cmd[:600], contact, ServoParams(**dict(sv, cmd_scale=0.9 * sv["cmd_scale"])), timestep=SIM_DT
    )
    assert np.abs(slow[-1, 0] - truth[599, 0]) > 0.1


def test_same_seed_gives_identical_bytes_and_other_seed_differs(dataset, tmp_path) -> None:
    out, manifest = dataset
    bag = out / manifest["runs"][0]["bag"]
    again = gen(tmp_path / "a")
    assert files_digest(tmp_path / "a" / again["runs"][0]["bag"]) == files_digest(bag)
    assert (tmp_path / "a" / "manifest.yaml").read_bytes() == (out / "manifest.yaml").read_bytes()
    other = gen(tmp_path / "b", seed=12)
    assert files_digest(tmp_path / "b" / other["runs"][0]["bag"]).values() != files_digest(bag).values()


def test_ingest_loads_the_run_and_fits_the_pallet(dataset) -> None:
    ingest = pytest.importorskip("ingest")
    out, manifest = dataset
    run = manifest["runs"][0]
    r = ingest.load_run(out / run["bag"], config=out / manifest["ingest_topic_map"], progress=False)
    assert len(r.wheel_cmd) > 100 and r.pallet is not None
    true = run["pallet"]
    dxy = math.hypot(r.pallet.x - true["x"], r.pallet.y - true["y"])
    dyaw = (r.pallet.yaw - true["yaw"] + math.pi / 2) % math.pi - math.pi / 2  # a box is symmetric
    assert dxy < 0.03, dxy
    assert abs(math.degrees(dyaw)) < 1.0, math.degrees(dyaw)


@pytest.mark.parametrize("fmt, ros", [("ros1", 1), ("sqlite3", 2)])
def test_other_formats_open_with_rosbags(tmp_path, fmt: str, ros: int) -> None:
    m = gen(tmp_path, fmt=fmt)
    run = m["runs"][0]
    path = tmp_path / run["bag"]
    assert path.suffix == (".bag" if fmt == "ros1" else "")
    msgs = read_bag(path, ros)
    assert {t: len(v) for t, v in msgs.items()} == {t: i["count"] for t, i in run["topics"].items()}


def test_cli_lists_the_design_and_rejects_bad_input(tmp_path, capsys) -> None:
    assert synth_main(["--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 14 and sum("train" in ln for ln in lines) == 4
    assert synth_main(["--out", str(tmp_path), "--runs", "run_99", "--no-progress"]) == 2
    assert "unknown run" in capsys.readouterr().err
    assert synth_main(["--runs", "run_01"]) == 2  # no --out


def test_bad_configuration_raises(tmp_path) -> None:
    with pytest.raises(SynthError, match="beams"):
        generate_dataset(tmp_path, sensors=SensorConfig(lidar=LidarConfig(beams=32)), specs=[short_spec()])
    with pytest.raises(SynthError, match="format"):
        generate_dataset(tmp_path, fmt="zip", specs=[short_spec()], progress=False)


@pytest.mark.slow
def test_full_design_every_run_climbs_and_its_pallet_fits(tmp_path) -> None:
    """All 14 designed runs (light lidar): climb ~0.144 m, ingest pallet fit within 3 cm / 1 deg."""
    ingest = pytest.importorskip("ingest")
    from sysid.synth.cli import SAMPLE_LIDAR

    m = generate_dataset(tmp_path, sensors=SensorConfig(lidar=LidarConfig(**SAMPLE_LIDAR)), progress=False)
    assert len(m["runs"]) == 14 and len(m["splits"]["train"]) == 4
    speeds = [r["design"]["speed"] for r in m["runs"]]
    assert min(speeds) == 0.12 and max(speeds) == 2.05
    assert max(abs(r["design"]["heading_change_deg"]) for r in m["runs"]) == pytest.approx(130.0)
    for r in m["runs"]:
        assert 0.13 < r["measured"]["climb_rise"] < 0.17, r["name"]
        run = ingest.load_run(tmp_path / r["bag"], config=tmp_path / m["ingest_topic_map"], progress=False)
        true = r["pallet"]
        dxy = math.hypot(run.pallet.x - true["x"], run.pallet.y - true["y"])
        dyaw = math.degrees((run.pallet.yaw - true["yaw"] + math.pi / 2) % math.pi - math.pi / 2)
        assert dxy < 0.03 and abs(dyaw) < 1.0, (r["name"], dxy, dyaw)
