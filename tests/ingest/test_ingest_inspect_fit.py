"""`ingest inspect` says whether a bag can be fitted, gives sane rates for bags with bad stamps, keeps
notes whole, and run caches are written like any file the user writes (issue 20, point 7)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import ingest
from ingest import bagio
from ingest.inspect import _short, fit_readiness, format_report, inspect_bag
from sysid.cli.ingest_program import main
from tests.helpers.ingest_fixtures import T0_NS, drive_config, write_drive

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "pallet-sample"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "bags"


def _odom_only(tmp: Path, name: str = "odom.bag") -> Path:
    msgs = [("/robot/odom", "nav_msgs/msg/Odometry", T0_NS + i * 50_000_000,
             bagio.odometry(T0_NS + i * 50_000_000, (0.01 * i, 0, 0))) for i in range(40)]
    (p,) = bagio.write_bag(tmp / name, msgs)
    return p


def test_drive_bag_can_be_fitted_and_names_its_topics(tmp_path: Path, capsys) -> None:
    path, _ = write_drive(tmp_path, "ros2-mcap")
    assert main(["inspect", "-q", str(path)]) == 0
    out = capsys.readouterr().out
    assert "for a fit" in out and "can be fitted: odometry" in out
    assert main(["inspect", "-q", "--json", str(path)]) == 0
    fit = json.loads(capsys.readouterr().out)["info"]["fit"]
    assert fit["fittable"] and {"odom", "wheel_cmd"} <= set(fit["roles"]) and fit["missing"] == []


def test_odometry_only_bag_cannot_be_fitted_and_says_what_to_do(tmp_path: Path, capsys) -> None:
    p = _odom_only(tmp_path)
    assert main(["inspect", "-q", str(p)]) == 0
    out = capsys.readouterr().out
    assert "odometry:        /robot/odom [nav_msgs/msg/Odometry] (auto-detected)" in out
    assert "wheel commands:  -" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("  cannot be fitted: missing a wheel command or wheel speed topic"), verdict
    assert "the odometry alone, the robot's own motion, identifies nothing" in verdict
    assert "/cmd_vel" in verdict and "/joint_states" in verdict
    assert "odom_twist" not in out  # no map is suggested whose run could identify nothing
    # a topic map deriving the commands from the odometry's twist does not make it fittable
    tm = tmp_path / "map.yaml"
    tm.write_text("topics:\n  wheel_cmd: {source: odom_twist}\n")
    assert main(["inspect", "-q", "--topics", str(tm), str(p)]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("  cannot be fitted:") and "identifies nothing" in verdict, verdict
    # ... and `ingest load` with it stops before reading the bag, with one line saying why
    out_run = tmp_path / "run.npz"
    assert main(["load", "-q", str(p), "--topics", str(tm), "-o", str(out_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: topic map {str(tm)!r} derives the wheel commands from the "
                                                "odometry's twist"), err
    assert "identifies nothing" in err[0] and not out_run.exists()


def test_measured_wheel_speeds_are_offered_as_the_command(tmp_path: Path, capsys) -> None:
    """A bag with odometry and measured wheel speeds but no command: inspect names the map that
    drives the replay with the measured speeds (as the helhest-real runs are fitted), and that map
    makes it fittable."""
    msgs = []
    for i in range(40):
        ns = T0_NS + i * 50_000_000
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns,
                     bagio.odometry(ns, (0.05 * i, 0, 0), (0, 0, 0, 1), (1, 0, 0), (0, 0, 0))))
        msgs.append(("/joint_states", "sensor_msgs/msg/JointState", ns,
                     bagio.joint_state(ns, ["left", "right", "rear"], [2.8, 2.8, 2.8])))
    p = tmp_path / "meas.mcap"
    bagio.write_bag(p, msgs)
    assert main(["inspect", "-q", str(p)]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert "the measured wheel speeds /joint_states can drive the replay" in verdict, verdict
    assert "`topics: wheel_cmd: {topic: /joint_states}`" in verdict
    tm = tmp_path / "map.yaml"
    tm.write_text("topics:\n  wheel_cmd: {topic: /joint_states}\n")
    assert main(["inspect", "-q", "--topics", str(tm), str(p)]) == 0
    assert "can be fitted: odometry /odom, wheel commands /joint_states" in capsys.readouterr().out
    assert main(["load", "-q", str(p), "--topics", str(tm)]) == 0


def test_topic_map_naming_a_missing_topic_is_reported_not_raised(tmp_path: Path) -> None:
    p = _odom_only(tmp_path)
    with ingest.BagReader(p) as bag:
        fit = fit_readiness(bag.topics, ingest.TopicMap.from_dict({"topics": {"odom": {"topic": "/nope"}}}))
    assert not fit["fittable"] and "'/nope' is not in the bag" in fit["verdict"]


@pytest.mark.skipif(not (SAMPLE / "run_10").exists(), reason="datasets/pallet-sample missing")
def test_bundled_sample_is_fittable() -> None:
    _, info = inspect_bag(SAMPLE / "run_10")
    roles = info["fit"]["roles"]
    assert roles["odom"]["topic"] == "/local_odom" and roles["wheel_cmd"]["topic"] == "/wheel_cmd"
    assert roles["cloud"]["topic"] == "/lidar/points"


def test_messages_recorded_in_a_burst_have_no_rate(tmp_path: Path) -> None:
    # 500 messages within 5 us of record time (as rosbag2's test bags): no 1e8 Hz rate
    msgs = [("/s", "std_msgs/msg/String", T0_NS + 10 * i, bagio.typestore(2).types["std_msgs/msg/String"](data="x"))
            for i in range(500)]
    (p,) = bagio.write_bag(tmp_path / "burst.mcap", msgs)
    stats, info = inspect_bag(p)
    s = stats[0]
    assert s.rate_hz is None and s.gaps == [] and "no rate" in s.notes[0]
    assert "no rate" in format_report(stats, info)


def test_header_stamps_that_disagree_with_record_times_are_not_used_for_the_rate(tmp_path: Path) -> None:
    # recorded at 10 Hz over 4 s, but header stamps 1 us apart (a node stamping with a broken clock)
    msgs = [("/odom", "nav_msgs/msg/Odometry", T0_NS + i * 100_000_000, bagio.odometry(T0_NS + i * 1000, (0, 0, 0)))
            for i in range(41)]
    (p,) = bagio.write_bag(tmp_path / "bad.bag", msgs)
    (s,) = inspect_bag(p)[0]
    assert s.clock == "record" and s.rate_hz == pytest.approx(10.0)
    assert any("header.stamp spans" in n for n in s.notes)


def test_notes_are_shortened_at_a_word_boundary() -> None:
    text = "its embedded definition does not parse (TypesysError: Could not parse: 'MSG: pkg/Type bool value')"
    short = _short(text, 60)
    assert len(short) <= 60 and short.endswith(" ...")
    assert text.startswith(short[: -len(" ...")])
    kept = short[: -len(" ...")]
    assert text[len(kept)] == " "  # cut between words


@pytest.mark.skipif(not (SHARED / "edge_cases" / "rosbag2_wbag_sqlite3_nodefs").exists(),
                    reason="../shared/data/bags missing")
def test_real_edge_case_bags_have_sane_rates() -> None:
    stats, _ = inspect_bag(SHARED / "edge_cases" / "rosbag2_wbag_sqlite3_nodefs")
    assert all(s.rate_hz is None for s in stats)
    stats, _ = inspect_bag(SHARED / "sick_scan_xd_rms_lms_movement_off.bag")
    rates = {s.topic: s.rate_hz for s in stats}
    assert rates["/rosout"] is None and rates["/cloud"] == pytest.approx(49.9, abs=0.2)
    assert all(r is None or r < 1000 for r in rates.values())


def test_json_run_is_not_sent_to_rosbag_reindex(tmp_path: Path, capsys) -> None:
    f = tmp_path / "run.json"
    f.write_text('{"trajectory": {"points": []}}')
    assert main(["inspect", str(f)]) == 2
    err = capsys.readouterr().err
    assert "JSON run" in err and "reindex" not in err


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_run_cache_is_written_0644_under_umask_022(tmp_path: Path, suffix: str) -> None:
    path, _ = write_drive(tmp_path, "ros2-mcap")
    run = ingest.load_run(path, config=drive_config(), progress=False, fit_pallet=False)
    old = os.umask(0o022)
    try:
        out = run.save(tmp_path / f"run{suffix}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


@pytest.mark.skipif(not (SHARED / "robot_localization_test1_husky.bag").exists(), reason="../shared/data/bags absent")
@pytest.mark.parametrize("bag", ["robot_localization_test1_husky.bag", "robot_localization_test2_jackal.bag"])
def test_real_wheel_odometry_bags_say_what_is_missing(bag: str) -> None:
    """The real Husky and Jackal logs hold wheel odometry and an IMU, nothing that drives the wheels:
    not fittable, the missing wheel command or wheel speed topic named, no map suggested."""
    _, info = inspect_bag(SHARED / bag)
    fit = info["fit"]
    assert not fit["fittable"] and fit["roles"]["odom"]["type"] == "nav_msgs/msg/Odometry"
    assert fit["verdict"].startswith("cannot be fitted: missing a wheel command or wheel speed topic"), fit["verdict"]
    assert "odom_twist" not in fit["verdict"]


@pytest.mark.skipif(not (SHARED / "sick_scan_xd_rms_lms_movement_off.bag").exists(),
                    reason="../shared/data/bags absent")
def test_lidar_bag_takes_no_tf_as_odometry() -> None:
    """The SICK lidar log's /tf holds the sensors' mounts, not a robot's pose: no odometry is
    auto-detected, and the verdict says how to name /tf with its frames if it were one."""
    _, info = inspect_bag(SHARED / "sick_scan_xd_rms_lms_movement_off.bag")
    fit = info["fit"]
    assert "odom" not in fit["roles"] and not fit["fittable"]
    assert "/tf (TF) is the robot's pose only if" in fit["verdict"]
    assert "`topics: odom: {topic: /tf, frames: [odom, base_link]}`" in fit["verdict"]


@pytest.mark.skipif(not (SHARED / "robot_localization_test1_husky.bag").exists(), reason="../shared/data/bags absent")
def test_loading_the_real_husky_bag_from_its_own_twist_is_refused(tmp_path: Path, capsys) -> None:
    tm = tmp_path / "husky-topics.yaml"
    tm.write_text("topics:\n  wheel_cmd: {source: odom_twist}\n")
    out = tmp_path / "husky.npz"
    assert main(["load", "-q", str(SHARED / "robot_localization_test1_husky.bag"), "--robot", "husky",
                 "--topics", str(tm), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "identifies nothing" in err[0] and not out.exists(), err
