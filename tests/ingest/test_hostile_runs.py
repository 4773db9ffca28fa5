"""Hostile input files to `ingest` and to the readers both programs share (`ingest.inputs`): each is
refused with one line naming the file and what to do (exit status 2 from the command line), before
any work, without blocking on a named pipe, without reading a file above the size limit, and the
inputs are left as they were. The degenerate data that stays accepted (a wheel log overlapping the
odometry only in part, a lidar point at the lidar itself) gives a warning with the figures, or none,
instead of numpy's RuntimeWarning lines.

Every file here is small and synthetic (a 10 s arc at 0.5 m/s); no bag is parsed but one tiny mcap.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

import ingest
from ingest.errors import ConfigError, UnknownTypeError
from sysid.cli.ingest_program import main as ingest_main
from tests.helpers.hostile import bomb, deadline, run_program
from tests.helpers.ingest_fixtures import write_drive

LIMIT_ENV = "SYSID_MAX_INPUT_MB"  # the documented way to raise the size limit of JSON and YAML inputs
V, W = 0.5, 0.4  # [m/s], [rad/s]
R, TRACK = 0.36, 0.72  # [m] the Helhest's wheel radius and track


def arc_run(t_odom: tuple[float, float] = (0.0, 10.0), t_wheels: tuple[float, float] = (-0.2, 10.0)) -> dict:
    """A JSON run file's object: the arc's odometry at 20 Hz over ``t_odom`` [s], its wheel speeds at
    50 Hz over ``t_wheels`` [s]."""
    t_o = np.arange(*t_odom, 0.05)
    yaw = W * t_o
    t_w = np.arange(*t_wheels, 0.02)
    left, right = (V - W * TRACK / 2) / R, (V + W * TRACK / 2) / R
    return {
        "trajectory": {"points": [{"t": float(t), "x": float(V / W * np.sin(a)), "y": float(V / W * (1 - np.cos(a))),
                                   "yaw": float(a)} for t, a in zip(t_o, yaw, strict=True)]},
        "wheel_velocities": {"timeseries": [{"t": float(t), "left": left, "right": right, "rear": V / R} for t in t_w]},
    }


def _ingest(argv: list[str], capsys: pytest.CaptureFixture[str], seconds: float = 30) -> tuple[int, str, str]:
    return run_program(ingest_main, argv, capsys, seconds)


def _one_error_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry of ``folder``: a file's bytes, else what it is (a FIFO, a link, a folder)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = f"link -> {os.readlink(p)}"
        elif p.is_fifo():
            out[key] = "fifo"
        elif p.is_dir():
            out[key] = "dir"
        else:
            out[key] = p.read_bytes()
    return out


# -- JSON run files of the wrong shape -----------------------------------------------------------------------

CMD_VEL = "cmd_vel must be a JSON object with a list 'commands' (or absent), got "
WRONG_TYPES = [
    ("cmd_vel", "fast", CMD_VEL + '"fast"'),
    ("cmd_vel", [1, 2], CMD_VEL + "a list of 2 values"),
    ("cmd_vel", {"commands": 5}, CMD_VEL + '{"commands": 5}'),
    ("trajectory", [1, 2], "missing or malformed field trajectory.points (got trajectory a list of 2 values)"),
    ("wheel_velocities", {"timeseries": 7}, "missing or malformed field wheel_velocities.timeseries (got 7)"),
]


@pytest.mark.parametrize(("key", "value", "line"), WRONG_TYPES, ids=[f"{k}={json.dumps(v)}" for k, v, _ in WRONG_TYPES])
def test_json_run_with_a_wrong_typed_field_is_one_line(tmp_path: Path, capsys, key: str, value: object,
                                                       line: str) -> None:
    src = tmp_path / "run.json"
    src.write_text(json.dumps({**arc_run(), key: value}))
    before = _snapshot(tmp_path)
    rc, out, err = _ingest(["load", str(src), "-o", str(tmp_path / "run.npz")], capsys)
    assert rc == 2
    assert _one_error_line(err).startswith(f"error: {src}: {line}"), err
    assert _snapshot(tmp_path) == before  # nothing written, the input untouched


def test_json_nested_200000_deep_is_one_line(tmp_path: Path, capsys) -> None:
    src = tmp_path / "deep.json"
    src.write_text("[" * 200_000 + "]" * 200_000)
    rc, _out, err = _ingest(["load", str(src)], capsys)
    assert rc == 2
    assert _one_error_line(err) == (f"error: run file {str(src)!r} is nested too deeply to read (thousands of "
                                    "levels); expected a helhest run file\n")


def test_json_run_above_the_size_limit_is_refused_unread(tmp_path: Path, capsys, monkeypatch) -> None:
    """A 3 MiB junk file with the limit at 1 MiB: refused by its size (the message names the limit and
    how to raise it), not read; with the limit raised it is read and found not to be JSON."""
    src = tmp_path / "junk.json"
    src.write_bytes(b"x" * (3 << 20))
    monkeypatch.setenv(LIMIT_ENV, "1")
    read = []
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or real_read_bytes(self))
    rc, _out, err = _ingest(["load", str(src)], capsys)
    assert rc == 2 and read == []
    assert _one_error_line(err) == (f"error: run file {str(src)!r} is 3 MiB, more than the 1 MiB a JSON input may be "
                                    f"(is it the file you meant?); if it is, raise the limit: {LIMIT_ENV}=<MiB>\n")
    monkeypatch.setenv(LIMIT_ENV, "4")
    rc, _out, err = _ingest(["load", str(src)], capsys)
    assert rc == 2 and f"run file {str(src)!r} is not valid JSON (line 1, column 1" in _one_error_line(err)


# -- what is not a regular file ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["run.json", "run.npz", "drive.bag"])
def test_fifo_as_input_is_not_a_regular_file_and_never_blocks(tmp_path: Path, capsys, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    t0 = time.monotonic()
    rc, _out, err = _ingest(["load", str(fifo)], capsys, seconds=20)
    assert rc == 2 and time.monotonic() - t0 < 20
    assert "is a named pipe (FIFO), not a regular file; give a file" in _one_error_line(err)
    assert str(fifo) in err and "does not exist" not in err and "not found" not in err
    assert fifo.is_fifo()


def test_fifo_or_folder_as_topic_map_is_not_a_regular_file(tmp_path: Path, capsys) -> None:
    src = tmp_path / "run.json"
    src.write_text(json.dumps(arc_run()))
    fifo, folder = tmp_path / "topics.yaml", tmp_path / "folder.yaml"
    os.mkfifo(fifo)
    folder.mkdir()
    for path, what in ((fifo, "a named pipe (FIFO)"), (folder, "a directory")):
        rc, _out, err = _ingest(["load", str(src), "--topics", str(path)], capsys, seconds=20)
        assert rc == 2
        assert _one_error_line(err) == f"error: topic map {str(path)!r} is {what}, not a regular file; give a file\n"


def test_symlink_loop_as_input_is_named(tmp_path: Path, capsys) -> None:
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    rc, _out, err = _ingest(["load", str(loop)], capsys)
    assert rc == 2
    assert _one_error_line(err) == (f"error: run file {str(loop)!r} is a symbolic-link loop (a link that leads back "
                                    "to itself); point it at the file\n")
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b.name)
    b.symlink_to(a.name)
    rc, _out, err = _ingest(["load", str(a)], capsys)
    assert rc == 2 and f"bag {str(a)!r} is a symbolic-link loop" in _one_error_line(err)



def test_nul_byte_in_a_path_is_named(tmp_path: Path, capsys) -> None:
    """A path the OS cannot take (a NUL byte in it, found by the CLI's property test) is a one-line error, not an
    internal one."""
    src = tmp_path / "run.json"
    src.write_text(json.dumps(arc_run()))
    rc, _out, err = _ingest(["load", str(src), "--topics", "a\x00b.yaml"], capsys)
    assert rc == 2
    assert _one_error_line(err) == ("error: topic map 'a\\x00b.yaml' is not a valid path (it contains a NUL byte); "
                                    "check how it was typed or generated\n")

# -- run caches and bags that are not what their name says ---------------------------------------------------


def test_junk_npz_is_not_a_run_cache_file(tmp_path: Path, capsys) -> None:
    """Neither numpy's pickle advice (a file that is not a zip archive) nor a missing-key error (an
    archive without the run's header): the file is not a run cache."""
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"junk")
    other = tmp_path / "other.npz"
    np.savez(other, a=np.arange(3))
    for path, detail in ((junk, "a .npz file starts otherwise"), (other, "an .npz archive without the run's header")):
        rc, _out, err = _ingest(["load", str(path)], capsys)
        assert rc == 2
        assert f"error: {path} is not a run cache file ({detail}); give a run" in _one_error_line(err)
        assert "pickle" not in err and "allow_pickle" not in err


def test_damaged_schema_of_a_standard_type_says_the_bag_is_damaged(tmp_path: Path) -> None:
    bag, _drive = write_drive(tmp_path, "ros2-mcap")
    mcap = next(bag.glob("*.mcap"))
    data = mcap.read_bytes()
    assert data.count(b"geometry_msgs/Pose pose") >= 1
    mcap.write_bytes(data.replace(b"geometry_msgs/Pose pose", b"geometry_msgs/P@se p{se"))
    with pytest.raises(UnknownTypeError) as info:
        ingest.load_run(bag, progress=False)
    msg = str(info.value)
    assert "'nav_msgs/msg/Odometry', which cannot be decoded: its definition embedded in the bag does not parse" in msg
    assert msg.endswith("The bag's schema record is damaged: re-copy or re-record the bag")
    assert "custom_types" not in msg  # a standard type needs no definition from the user


# -- degenerate data that stays accepted -----------------------------------------------------------------------


def test_partial_overlap_of_wheels_and_odometry_warns_with_the_figures(tmp_path: Path, capsys) -> None:
    """The wheel log starts 8.6 s into the 10 s odometry: the run is cut to the 1.4 s they share, and
    ingest says so with the figures (before: silently)."""
    src = tmp_path / "late.json"
    src.write_text(json.dumps(arc_run(t_wheels=(8.55, 18.75))))
    run = ingest.load_run(src, dt=0.01)
    assert run.duration == pytest.approx(1.4, abs=0.02)
    (w,) = run.meta["warnings"]
    assert w == ("late: the wheel log [8.55, 18.73] s overlaps the odometry [0.00, 9.95] s for only 1.40 s: the run "
                 "is cut from 9.95 s to 1.40 s (are both logs of one drive, on one clock?)")
    rc, _out, err = _ingest(["load", str(src)], capsys)
    assert rc == 0 and f"warning: {w}" in err
    # a wheel log that starts a little early (the usual case) says nothing
    assert "warnings" not in ingest.load_run(_write(tmp_path / "ok.json", arc_run()), dt=0.01).meta


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_resampling_to_a_tiny_step_is_refused_with_the_number(tmp_path: Path, capsys) -> None:
    src = _write(tmp_path / "arc.json", arc_run())
    rc, _out, err = _ingest(["load", str(src), "--dt", "1e-9"], capsys)
    assert rc == 2
    assert _one_error_line(err) == (
        "error: arc: resampling its 10.0 s at dt = 1e-09 s would make 9.95e+09 samples (about 1.33e+03 GiB), more "
        "than 20,000,000; give a dt of at least 5e-07 s (data.ingest.dt, --dt; 0.01 s is usual)\n")


def test_pallet_fit_with_points_at_the_lidar_prints_no_runtime_warning() -> None:
    """A cloud whose rays start at their own endpoints (zero-length rays) made the free-space test
    subtract +-1.8e308 (numpy's 'overflow encountered in subtract'); such a ray crosses no free space."""
    from ingest.pallet import fit_box

    rng = np.random.default_rng(0)
    ground = np.c_[rng.uniform(-5, 5, (5000, 2)), rng.normal(0, 0.005, 5000)]
    box = np.c_[rng.uniform(1.0, 2.2, (800, 1)), rng.uniform(-0.4, 0.4, (800, 1)), rng.uniform(0, 0.14, (800, 1))]
    pts = np.r_[ground, box]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = fit_box(pts, pts.copy())
    assert abs(fit.x - 1.6) < 0.3 and abs(fit.y) < 0.1


# -- the YAML loader every reader uses ------------------------------------------------------------------------


def test_alias_bomb_is_refused_at_once() -> None:
    from ingest.inputs import load_yaml

    t0 = time.monotonic()
    with deadline(20), pytest.raises(yaml.YAMLError) as info:
        load_yaml(bomb() + "robot: *l8\n")
    assert time.monotonic() - t0 < 5
    expected = "its aliases (*name) expand to more than 100,000 values (a YAML alias bomb?)"
    assert expected in str(info.value)
    # aliases that expand a little stay allowed (a merge key, a list used twice)
    doc = load_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\ntwice: [*b, *b]\n")
    assert doc["d"] == {"x": 3, "y": 2} and doc["twice"] == [{"x": 1, "y": 2}] * 2


def test_recursive_alias_is_refused() -> None:
    from ingest.inputs import load_yaml

    with pytest.raises(yaml.YAMLError, match="refers to a node that contains it"):
        load_yaml("a: &a [1, *a]\n")


@pytest.mark.parametrize(("text", "key", "where", "first"), [
    ("fit: {dt: 0.1}\nrobot: helhest\nfit: {max_iter: 5}\n", "'fit'", "line 3, column 1", 1),
    ("parameters:\n  kp: {value: 1}\n  kp: {value: 2}\n", "'kp'", "line 3, column 3", 2),
    ("a: 1\nyes: 2\ntrue: 3\n", "True", "line 3, column 1", 2),  # YAML 1.1: yes and true are one key
])
def test_duplicate_key_is_refused_naming_key_and_line(tmp_path: Path, text: str, key: str, where: str,
                                                      first: int) -> None:
    from ingest.inputs import read_yaml_file

    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml_file(p, ConfigError, "config file")
    assert str(info.value) == (f"config file is not valid YAML: {p}, {where}: the key {key} appears twice in one "
                               f"mapping (first on line {first}); keep one of them (a second one would replace the "
                               "first)")


def test_yaml_readers_of_ingest_refuse_bombs_and_binary(tmp_path: Path, capsys) -> None:
    """The topic map (--topics, and one given as text) and a fit config read by `ingest -c` go
    through the same loader: an alias bomb, a duplicate key and a binary file are one line each."""
    src = _write(tmp_path / "arc.json", arc_run())
    cases = {
        "bomb.yaml": (bomb() + "topics: {odom: *l8}\n").encode(),
        "dup.yaml": b"topics: {odom: /odom}\ntopics: {odom: /odom2}\n",
        "binary.yaml": b"\x89MCAP0\r\n\x00\x01\x02",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    with deadline(20), pytest.raises(ConfigError, match="alias bomb"):
        ingest.TopicMap.from_yaml(cases["bomb.yaml"].decode())
    for name, line in (("bomb.yaml", "expand to more than"), ("dup.yaml", "the key 'topics' appears twice"),
                       ("binary.yaml", "is not a text YAML file (byte 0x89 at offset 0 is not UTF-8): did you pass a "
                                       "bag or another binary file?")):
        for flag in ("--topics", "-c"):
            rc, _out, err = _ingest(["load", str(src), flag, str(tmp_path / name)], capsys, seconds=20)
            assert rc == 2, (name, flag, err)
            assert line in _one_error_line(err) and name in err
