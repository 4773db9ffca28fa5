"""Run files in the helhest-real JSON format for any wheeled robot: the wheel keys of
``wheel_velocities.timeseries`` become the run's wheel columns, checked against the robot that
replays them (each wheel driven by one of its log names, every key driving some wheel), and a
robot whose wheel map names the log's joints drives runs ingested with it by the wheels' own names.

The files are small synthetic ones written here (an arc at v = 0.5 m/s, w = 0.4 rad/s: a skid-steer
wheel turns at (v -+ w track / 2) / r, left / right), not the shared real runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest.decode import WheelLayout
from ingest.errors import DataError, IngestError, RunFormatError

ROOT = Path(__file__).resolve().parents[2]
HUSKY = ROOT / "models" / "husky" / "husky.urdf"
HUSKY_WHEELS = ("front_left_wheel", "rear_left_wheel", "front_right_wheel", "rear_right_wheel")
R, TRACK = 0.1651, 0.555  # [m] models/husky/husky.urdf
V, W = 0.5, 0.4  # [m/s], [rad/s]


def arc_json(path: Path, wheels: dict[str, float], duration: float = 3.0) -> Path:
    """A run file: odometry of the arc at 20 Hz, the given constant wheel speeds [rad/s] at 50 Hz."""
    t_o = np.arange(0.0, duration, 0.05)
    yaw = W * t_o
    x, y = V / W * np.sin(yaw), V / W * (1 - np.cos(yaw))
    t_w = np.arange(-0.2, duration, 0.02)
    data = {
        "trajectory": {"points": [{"t": float(t), "x": float(a), "y": float(b), "yaw": float(c)}
                                  for t, a, b, c in zip(t_o, x, y, yaw)]},
        "wheel_velocities": {"timeseries": [{"t": float(t), **wheels} for t in t_w]},
    }
    path.write_text(json.dumps(data))
    return path


def husky_speeds() -> dict[str, float]:
    left, right = (V - W * TRACK / 2) / R, (V + W * TRACK / 2) / R
    return {"front_left_wheel": left, "rear_left_wheel": left, "front_right_wheel": right, "rear_right_wheel": right}


@pytest.fixture(scope="module")
def reader():
    from sysid.robot import load_robot

    return load_robot


def test_four_wheel_run_file_with_the_husky(tmp_path: Path, reader) -> None:
    """A Husky's run file: four wheel columns under its joint names, each the skid-steer speed."""
    src = arc_json(tmp_path / "husky_arc.json", husky_speeds())
    run = ingest.load_run(src, dt=0.01, robot=HUSKY, robot_reader=reader)
    assert run.wheel_names == list(HUSKY_WHEELS)
    left, right = (V - W * TRACK / 2) / R, (V + W * TRACK / 2) / R
    np.testing.assert_allclose(run.wheel_cmd["front_left_wheel"], left)
    np.testing.assert_allclose(run.wheel_cmd["rear_right_wheel"], right)
    assert run.wheel_cmd["t"].iloc[0] == 0.0  # the overlap of odometry and wheels (wheels start 0.2 s early)
    # the loader alone (no robot) reads any wheel keys
    assert ingest.load_helhest_json(src, dt=0.01).wheel_names == list(HUSKY_WHEELS)


def test_per_side_run_file_drives_the_husky(tmp_path: Path, reader) -> None:
    """One speed per side (`left`, `right`: log names of the Husky's wheels) drives both wheels of a side."""
    left, right = (V - W * TRACK / 2) / R, (V + W * TRACK / 2) / R
    src = arc_json(tmp_path / "sides.json", {"left": left, "right": right})
    run = ingest.load_run(src, dt=0.01, robot=HUSKY, robot_reader=reader)
    assert reader(HUSKY).log_columns(run.wheel_cmd.columns, run.name) == ["left", "left", "right", "right"]


def test_helhest_run_file_with_the_husky_is_a_clear_error(tmp_path: Path, reader) -> None:
    """The Helhest's columns (left, right, rear) with the Husky: `rear` would drive nothing; said at load."""
    src = arc_json(tmp_path / "helhest.json", {"left": 1.0, "right": 2.0, "rear": 1.5})
    with pytest.raises(DataError, match=r"\['rear'\] drive none of them.*robot that recorded it") as err:
        ingest.load_run(src, dt=0.01, robot=HUSKY, robot_reader=reader)
    assert isinstance(err.value, IngestError)  # ingest's one error type
    run = ingest.load_run(src, dt=0.01)  # with no robot named: the Helhest's columns, read as before
    assert run.wheel_names == ["left", "right", "rear"]


def test_run_file_of_another_robot_names_the_missing_wheels(tmp_path: Path, reader) -> None:
    src = arc_json(tmp_path / "other.json", {"wheel_fl": 1.0, "wheel_fr": 2.0})
    with pytest.raises(DataError, match=r"match none of the wheels of robot husky: no column for front_left_wheel"):
        ingest.load_run(src, dt=0.01, robot=HUSKY, robot_reader=reader)


def test_run_file_without_wheel_speeds(tmp_path: Path) -> None:
    src = arc_json(tmp_path / "bad.json", {})
    with pytest.raises(RunFormatError, match="no wheel speeds, only t"):
        ingest.load_helhest_json(src, dt=0.01)


def test_run_file_samples_need_the_same_wheels(tmp_path: Path) -> None:
    src = arc_json(tmp_path / "bad.json", {"left": 1.0, "right": 2.0, "rear": 1.5})
    data = json.loads(src.read_text())
    del data["wheel_velocities"]["timeseries"][3]["right"]
    src.write_text(json.dumps(data))
    with pytest.raises(RunFormatError, match=r"timeseries\[3\] has wheel keys \['left', 'rear'\], the first sample "
                                             r"\['left', 'rear', 'right'\]"):
        ingest.load_helhest_json(src, dt=0.01)


def test_wheel_name_is_always_a_log_name(tmp_path: Path, reader) -> None:
    """A robot.yaml whose wheels list log names without their own (`log: [left_wheel_j]` for wheel
    `lw`): a run ingested with it names its columns by the wheels (lw, rw, cw), and the engine's
    replay and the layout find them (before, the replay knew only the listed log names)."""
    import yaml

    desc = yaml.safe_load((ROOT / "models" / "helhest" / "robot.yaml").read_text())
    for j, (name, log) in zip(desc["wheels"]["joints"], (("lw", "left_wheel_j"), ("rw", "right_wheel_j"),
                                                         ("cw", "rear_wheel_j"))):
        j["name"], j["log"] = name, [log]
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(desc))
    robot = reader(path)
    assert robot.wheel_logs == [("left_wheel_j", "lw"), ("right_wheel_j", "rw"), ("rear_wheel_j", "cw")]
    assert robot.log_columns(["t", "lw", "rw", "cw"]) == ["lw", "rw", "cw"]
    layout = WheelLayout.from_description(robot)
    assert layout.run_columns(["t", "left_wheel_j", "rw", "cw"]) == ["left_wheel_j", "rw", "cw"]
    src = arc_json(tmp_path / "trio.json", {"lw": 1.0, "rw": 2.0, "cw": 1.5})
    assert ingest.load_run(src, dt=0.01, robot=path, robot_reader=reader).wheel_names == ["lw", "rw", "cw"]


def test_fit_evaluates_a_husky_run_file(tmp_path: Path, reader) -> None:
    """`sysid evaluate` of a Husky run file with the kinematic baseline, started at the wheels' speed,
    turn efficiency 1 (mu_lateral = 0): the arc is the baseline's own model, so the replay follows the
    odometry to a few mm if every column reached its wheel (left and right swapped: ~1 m off)."""
    from sysid.cli import main as sysid_main

    src = arc_json(tmp_path / "husky_arc.json", husky_speeds())
    params = tmp_path / "params.yaml"
    params.write_text("robot: husky\nparameters: {cmd_scale: {value: 1.0, bounds: [0.5, 1.5]},\n"
                      "  mu_lateral: {value: 0.0, bounds: [0.0, 1.0]}}\n")
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"robot: {HUSKY}\nsimulator: {{name: kinematic, options: {{initial_speed: wheels}}}}\n")
    out = tmp_path / "eval.json"
    rc = sysid_main(["evaluate", "-c", str(cfg), "--runs", str(src), "-p", str(params), "--dt", "0.01",
                     "-o", str(out), "-q"])
    assert rc == 0
    res = json.loads(out.read_text())
    print("\nhusky run file, kinematic replay: mean xy", res["runs"][0]["mean_xy"])
    assert res["runs"][0]["mean_xy"] < 0.01
