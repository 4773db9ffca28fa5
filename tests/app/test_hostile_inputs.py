"""Hostile input to `sysid`: configs, parameter files, robot descriptions, manifests, run files and
results files that are malformed, huge, binary, not regular files, alias bombs or full of values no
physics allows. Each stops with one line ``error: ...`` naming the file (or setting) and what to do,
exit status 2, before any work (where work would start, the test makes it fail loudly instead) and
with the inputs byte-identical afterwards. A replay that diverges keeps the fit: every output is
written, its figures read ``n/a`` and a warning names the run.

Everything runs on the kinematic baseline with small synthetic run files (a 10 s arc), except the one
config check that needs the engine's parameter rules (no engine kernel is compiled or run).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from sysid.cli import main as sysid_main
from tests.helpers.hostile import bomb, run_program

ROOT = Path(__file__).resolve().parents[2]
ROBOT = ROOT / "models" / "helhest" / "robot.yaml"
LIMIT_ENV = "SYSID_MAX_INPUT_MB"
V, W = 0.5, 0.4  # [m/s], [rad/s] the arc
R, TRACK = 0.36, 0.72  # [m] the Helhest's wheel radius and track


def arc_run(t_wheels: tuple[float, float] = (-0.2, 10.0), ramp_from: int | None = None) -> dict:
    """A JSON run file's object: 10 s of an arc (odometry at 20 Hz, wheel speeds at 50 Hz over
    ``t_wheels`` [s]); ``ramp_from``: from that odometry sample on, x grows tenfold per sample to 1e300 m."""
    t_o = np.arange(0.0, 10.0, 0.05)
    yaw = W * t_o
    pts = [{"t": float(t), "x": float(V / W * np.sin(a)), "y": float(V / W * (1 - np.cos(a))), "yaw": float(a)}
           for t, a in zip(t_o, yaw, strict=True)]
    if ramp_from is not None:
        for i, p in enumerate(pts[ramp_from:]):
            p["x"] = 10.0 ** min(300, 10 * (i + 1))
    left, right = (V - W * TRACK / 2) / R, (V + W * TRACK / 2) / R
    return {"trajectory": {"points": pts},
            "wheel_velocities": {"timeseries": [{"t": float(t), "left": left, "right": right, "rear": V / R}
                                                for t in np.arange(*t_wheels, 0.02)]}}


def bomb_value(levels: int = 9) -> str:
    """A "billion laughs" as one flow value (its anchors inside it): a list whose last item expands to
    9**levels strings, for a config key whose value is printed or compared."""
    items = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]" for k in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry of ``folder``: a file's bytes, else what it is."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = (f"link -> {os.readlink(p)}" if p.is_symlink() else "fifo" if p.is_fifo()
                    else "dir" if p.is_dir() else p.read_bytes())
    return out


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace: two run files, a kinematic fit config over them, a parameter file."""
    (tmp_path / "a.json").write_text(json.dumps(arc_run()))
    (tmp_path / "b.json").write_text(json.dumps(arc_run()))
    write_config(tmp_path / "fit.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"parameters": {
        "kp": {"value": 250.0, "bounds": [10.0, 5000.0]}, "mu": {"value": 0.8, "bounds": [0.05, 2.0]}}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_config(path: Path, **sections: object) -> Path:
    cfg: dict = {"robot": str(ROBOT), "simulator": "kinematic", "data": {"train": ["a.json"], "held_out": ["b.json"]},
                 "fit": {"dt": 0.05, "max_iter": 3, "calibration": False}, "sweep": False}
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_sysid(argv: list[str], capsys: pytest.CaptureFixture[str], seconds: float = 60) -> tuple[int, str, str]:
    return run_program(sysid_main, argv, capsys, seconds)


def one_line(err: str) -> str:
    """The one ``error:`` line of stderr (no traceback, no internal error)."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The results document of one kinematic fit of the workspace's runs (for the report tests)."""
    folder = tmp_path_factory.mktemp("fitted")
    for name in ("a.json", "b.json"):
        (folder / name).write_text(json.dumps(arc_run()))
    write_config(folder / "fit.yaml")
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        assert sysid_main(["fit", "-c", "fit.yaml", "-o", "out", "-q"]) == 0
    finally:
        os.chdir(cwd)
    return json.loads((folder / "out" / "report.json").read_text())


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading runs or fitting fails the test: the error must come first."""
    import sysid.app.evaluate as evaluate
    import sysid.app.pipeline as pipeline
    import sysid.app.sweep as sweep

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("work started before the check")

    for command in (pipeline, evaluate, sweep):  # every command that loads runs
        monkeypatch.setattr(command, "load_runs", boom)
    monkeypatch.setattr(pipeline, "calibrate_and_fit", boom)


@pytest.fixture
def no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit (the first simulation) fails the test; loading the runs is allowed."""
    import sysid.app.pipeline as pipeline

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("the fit started before the check")

    monkeypatch.setattr(pipeline, "calibrate_and_fit", boom)


# -- 4: a diverged replay keeps the fit ----------------------------------------------------------------------


def test_diverged_replay_writes_every_output_with_n_a_and_a_warning(ws: Path, capsys) -> None:
    """A held-out run whose odometry runs off to 1e300 m: its errors are not finite. The fit finishes,
    writes its three outputs, prints and reports the run's figures as n/a (its odometry jump too)
    and warns naming the run; the report re-renders from the results."""
    (ws / "b.json").write_text(json.dumps(arc_run(ramp_from=100)))
    before = snapshot(ws)
    rc, out, err = run_sysid(["fit", "-c", "fit.yaml", "-o", "out", "-q"], capsys, seconds=120)
    assert rc == 0, err
    assert sorted(p.name for p in (ws / "out").iterdir()) == ["params.yaml", "report.html", "report.json"]
    (row,) = [x for x in out.splitlines() if x.split()[:2] == ["held_out", "b"]]
    assert row.split()[2:4] == ["combined", "n/a"] and row.endswith("mean xy n/a m")
    (mean,) = [x for x in out.splitlines() if x.startswith("mean held_out:")]
    assert mean.startswith("mean held_out: combined n/a m") and "mean xy n/a m" in mean
    assert ("warning: b at the identified parameters: combined, mean_xy, final_xy not finite: the replay diverged "
            "(or the odometry is out of range); its errors and the means over them are written as n/a") in err
    assert "1 jump <= n/a m (n/a m/s^2)" in err  # the odometry finding's table
    assert "RuntimeWarning" not in err
    html = (ws / "out" / "report.html").read_text()
    assert "1 (≤ n/a m)" in html and "n/a" in html
    assert {k: v for k, v in snapshot(ws).items() if not k.startswith("out")} == before  # inputs untouched
    rc, _out, err = run_sysid(["report", "out/report.json", "-o", "again.html"], capsys)
    assert rc == 0, err


def test_report_of_an_engine_replay_with_a_non_finite_residual(ws: Path, capsys, fitted: dict) -> None:
    """The results of an engine fit whose replay's worst Newton residual was not finite (written as
    null): `sysid report` renders it (before: a TypeError formatting None), showing n/a."""
    doc = json.loads(json.dumps(fitted))
    for r in doc["runs"]:
        r["solver"] = {"residual_max": None, "unconverged_steps": 0.95}
    (ws / "engine.json").write_text(json.dumps(doc))
    rc, out, err = run_sysid(["report", "engine.json", "-o", "engine.html"], capsys)
    assert rc == 0, err
    assert "95% / n/a" in (ws / "engine.html").read_text()


def test_every_replay_figure_null_renders_as_n_a(fitted: dict, capsys) -> None:
    """Every figure a replay produces, null (what a non-finite value becomes in the results JSON): the
    report and the printed summary still render, showing n/a."""
    from sysid.app.report import render_report
    from sysid.cli.fit import print_fit

    def nulled(node: object) -> object:
        if isinstance(node, dict):
            return {k: nulled(v) for k, v in node.items()}
        if isinstance(node, list):
            return [nulled(v) for v in node]
        return None if isinstance(node, float) else node

    doc = json.loads(json.dumps(fitted))
    for r in doc["runs"]:
        r["solver"] = {"residual_max": None, "unconverged_steps": None}
        for key in ("metrics_initial", "metrics_identified", "sim_identified"):
            r[key] = nulled(r[key])
    for key in ("summary", "generalisation"):
        doc[key] = nulled(doc[key])
    for key in ("loss_initial", "loss_final", "wall_time", "condition_number"):
        doc["fit"][key] = None
    if doc["fit"].get("weakest"):
        doc["fit"]["weakest"] = nulled(doc["fit"]["weakest"])
    html = render_report(doc)
    assert "n/a" in html
    print_fit(doc)
    out, _err = capsys.readouterr()
    assert "combined n/a" in out and "mean xy n/a m" in out


def test_solver_warning_fires_on_the_share_of_unconverged_steps() -> None:
    """An engine replay whose worst step is below 0.1 m/s but whose steps end unconverged 40 % of
    the time is warned about (before: only a worst step above 0.1 m/s was); a diverged solve too."""
    from ingest.run import Run
    from sysid.app.runs import replay_warnings

    runs = [Run.__new__(Run) for _ in range(4)]
    for run, name in zip(runs, ("poor", "fine", "worst", "nan"), strict=True):
        run.name = name
    metrics = [{"combined": 0.3, "mean_xy": 0.2}] * 4
    health = [{"residual_max": worst, "unconverged_steps": share}
              for worst, share in ((0.01, 0.4), (0.01, 0.01), (0.5, 0.01), (float("nan"), 0.9))]
    out = replay_warnings(runs, metrics, health, " at the identified parameters")
    assert out == [
        "engine replay of poor at the identified parameters: 40% of steps above 0.001 m/s, worst Newton residual "
        "0.01 m/s (errors there include solver error; try simulator.options.extra_iters: 48)",
        "engine replay of worst at the identified parameters: 1% of steps above 0.001 m/s, worst Newton residual "
        "0.5 m/s (errors there include solver error; try simulator.options.extra_iters: 48)",
        "engine replay of nan at the identified parameters: the Newton solve diverged in some steps (a non-finite "
        "residual; 90% of steps above 0.001 m/s): its errors include solver failure (try "
        "simulator.options.extra_iters: 48, a smaller fit.dt or narrower bounds)",
    ]


# -- 5: YAML alias bombs and duplicate keys ---------------------------------------------------------------------

BOMB_KEYS = ["robot", "truth.kp", "parameters.kp.unit", "fit.intervals"]


@pytest.mark.parametrize("where", BOMB_KEYS)
def test_alias_bomb_in_a_config_is_refused_at_once(ws: Path, capsys, no_work, where: str) -> None:
    """Under these keys the expanded value was printed or compared (str(...), {v!r}): the process
    hung with memory growing to GBs. Now the loader refuses the document, naming file and line."""
    head, *rest = where.split(".")
    cfg = yaml.safe_load((ws / "fit.yaml").read_text())
    section = cfg.pop(head, None)
    value = bomb_value()
    for key in reversed(rest):
        value = f"{{{key}: {value}}}"
    if isinstance(section, dict):  # the section's other settings stay
        value = "{" + ", ".join([*(f"{k}: {json.dumps(v)}" for k, v in section.items()), value[1:-1]]) + "}"
    (ws / "bomb.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False) + f"{head}: {value}\n")
    rc, _out, err = run_sysid(["fit", "-c", "bomb.yaml", "-o", "out"], capsys, seconds=20)
    assert rc == 2
    line = one_line(err)
    assert line.startswith("error: config file is not valid YAML: bomb.yaml, line ")
    assert line.endswith("its aliases (*name) expand to more than 100,000 values (a YAML alias bomb?); write the "
                         "values out instead of nesting aliases")
    assert not (ws / "out").exists()


def test_alias_bomb_in_params_robot_and_manifest_files(ws: Path, capsys, no_work) -> None:
    """The parameter file, the robot description and the manifest go through the same loader."""
    (ws / "params.yaml").write_text(bomb() + "parameters: {kp: {value: 250, bounds: [10, 5000], unit: *l8}}\n")
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml"], capsys, seconds=20)
    assert rc == 2 and "parameter file is not valid YAML: params.yaml, line" in one_line(err)
    assert "alias bomb" in err
    robot = ws / "robot.yaml"
    robot.write_text(ROBOT.read_text() + bomb() + "name_bomb: *l8\n")
    rc, _out, err = run_sysid(["fit", "-c", "fit.yaml", "--robot", str(robot), "-o", "out"], capsys, seconds=20)
    assert rc == 2 and f"robot description is not valid YAML: {robot}, line" in one_line(err) and "alias bomb" in err
    (ws / "manifest.yaml").write_text(bomb() + "train: [a.json]\ntruth: {kp: *l8}\n")
    write_config(ws / "m.yaml", data={"train": [], "held_out": [], "manifest": "manifest.yaml"})
    rc, _out, err = run_sysid(["fit", "-c", "m.yaml", "-o", "out"], capsys, seconds=20)
    assert rc == 2 and f"manifest is not valid YAML/JSON: {ws / 'manifest.yaml'}, line" in one_line(err)
    assert "alias bomb" in err


def test_duplicate_key_in_a_config_names_key_and_line(ws: Path, capsys, no_work) -> None:
    """A second `fit:` block silently replaced the first; now it is one line naming the key and line."""
    text = (ws / "fit.yaml").read_text() + "fit:\n  dt: 0.02\n"
    (ws / "dup.yaml").write_text(text)
    rc, _out, err = run_sysid(["fit", "-c", "dup.yaml", "-o", "out"], capsys)
    assert rc == 2
    n = len(text.splitlines()) - 1  # the second fit: line
    first = next(i for i, x in enumerate(text.splitlines(), 1) if x.startswith("fit:"))
    assert one_line(err) == (f"error: config file is not valid YAML: dup.yaml, line {n}, column 1: the key 'fit' "
                             f"appears twice in one mapping (first on line {first}); keep one of them (a second one "
                             "would replace the first)")


# -- 6: internal errors on bad input become one line, exit 2 --------------------------------------------------


def test_json_run_with_wrong_types_as_training_run(ws: Path, capsys, no_fit) -> None:
    (ws / "a.json").write_text(json.dumps({**arc_run(), "cmd_vel": "fast"}))
    before = snapshot(ws)
    rc, _out, err = run_sysid(["fit", "-c", "fit.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == (f"error: cannot ingest {str(ws / 'a.json')!r}: {ws / 'a.json'}: cmd_vel must be a JSON "
                             "object with a list 'commands' (or absent), got \"fast\"; fix or remove it (the run is "
                             "replayed from its wheel speeds)")
    assert snapshot(ws) == before


def test_deeply_nested_results_file(ws: Path, capsys) -> None:
    (ws / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    rc, _out, err = run_sysid(["report", "deep.json", "-o", "r.html"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: results file 'deep.json' is nested too deeply to read (thousands of levels); "
                             "give the results file written next to the report by `sysid fit`")


@pytest.mark.parametrize("role", ["--train", "--robot", "report"])
def test_symlink_loop_as_input(ws: Path, capsys, no_work, role: str) -> None:
    loop = ws / "loop.yaml"
    loop.symlink_to(loop.name)
    argv = (["report", str(loop), "-o", "r.html"] if role == "report"
            else ["fit", "-c", "fit.yaml", role, str(loop), "-o", "out"])
    before = snapshot(ws)
    rc, _out, err = run_sysid(argv, capsys)
    assert rc == 2
    what = {"--train": "data.train:", "--robot": "robot description", "report": "results file"}[role]
    assert one_line(err) == (f"error: {what} {str(loop)!r} is a symbolic-link loop (a link that leads back to "
                             "itself); point it at the file")
    assert snapshot(ws) == before


def test_binary_file_as_config_or_params(ws: Path, capsys, no_work) -> None:
    """A bag passed as -c by mistake (or as -p): not a text YAML file, said with the byte."""
    (ws / "drive.yaml").write_bytes(b"\x89MCAP0\r\n\x00\x01junk")
    rc, _out, err = run_sysid(["fit", "-c", "drive.yaml"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: config file 'drive.yaml' is not a text YAML file (byte 0x89 at offset 0 is not "
                             "UTF-8): did you pass a bag or another binary file? Give the YAML file")
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "drive.yaml"], capsys)
    assert rc == 2 and "error: parameter file 'drive.yaml' is not a text YAML file (byte 0x89" in one_line(err)


def test_parameter_entry_that_is_not_a_mapping(ws: Path, capsys, no_work) -> None:
    (ws / "params.yaml").write_text("parameters: {kp: 5}\n")
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: parameter file 'params.yaml': entry 'kp' must be a mapping such as {value: 250, "
                             "bounds: [20, 5000]}, got 5")


@pytest.mark.parametrize(("drop", "field"), [(("config", "dt"), "config.dt"),
                                              (("runs", 0, "metrics_identified"), "runs[0].metrics_identified")])
def test_report_of_results_missing_a_field(ws: Path, capsys, fitted: dict, drop: tuple, field: str) -> None:
    doc = json.loads(json.dumps(fitted))
    node = doc
    for k in drop[:-1]:
        node = node[k]
    del node[drop[-1]]
    (ws / "cut.json").write_text(json.dumps(doc))
    rc, _out, err = run_sysid(["report", "cut.json", "-o", "cut.html"], capsys)
    assert rc == 2 and not (ws / "cut.html").exists()
    assert one_line(err) == (f"error: results file 'cut.json' lacks {field}: it was cut short or edited; run sysid "
                             "fit again to write a complete one")


def test_sizes_that_would_exhaust_memory_are_refused_with_the_number(ws: Path, capsys, no_fit) -> None:
    """fit.dt 1e-7 s over a 10 s run (1e8 steps), data.ingest.dt 1e-9 s (1e10 samples), fit.starts 1e9:
    each refused before the fit starts, with the figure."""
    write_config(ws / "dt.yaml", fit={"dt": 1e-7})
    rc, _out, err = run_sysid(["fit", "-c", "dt.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: fit.dt = 1e-07 s would replay run 'a' (10.0 s) in 9.95e+07 steps, more than "
                             "2,000,000 (each step's state is kept); give a timestep of at least 5e-06 s (the "
                             "engine's default is 0.1 s) or cut the runs into pieces with data.split")
    write_config(ws / "ingest.yaml", data={"ingest": {"dt": 1e-9}})
    rc, _out, err = run_sysid(["fit", "-c", "ingest.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == (f"error: cannot ingest {str(ws / 'a.json')!r}: a: resampling its 10.0 s at dt = 1e-09 s "
                             "would make 9.95e+09 samples (about 1.33e+03 GiB), more than 20,000,000; give a dt of at "
                             "least 5e-07 s (data.ingest.dt, --dt; 0.01 s is usual)")
    write_config(ws / "starts.yaml", fit={"starts": 1_000_000_000})
    rc, _out, err = run_sysid(["fit", "-c", "starts.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: fit.starts 1,000,000,000 is more than 10,000: every start is a replay of every "
                             "training run (62,500,000 batched rollouts); give at most 10,000")
    assert not (ws / "out").exists()


def test_engine_parameter_it_cannot_take_is_refused_before_ingest(ws: Path, capsys, no_work) -> None:
    """mu: {nominal: 0, bounds: [0, 2]} with the engine: its rule (mu > 0) is checked before any run is read."""
    write_config(ws / "engine.yaml", simulator="ostrich", fit={"dt": 0.1},
                 parameters={"mu": {"nominal": 0.0, "bounds": [0.0, 2.0]}})
    rc, _out, err = run_sysid(["fit", "-c", "engine.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: parameters.mu: bounds [0, 2] reach 0, but simulator 'ostrich' needs mu > 0; give "
                             "a lower bound above 0")


# -- 7: values that were silently accepted -------------------------------------------------------------------

PARAM_VALUES = [
    (".nan", "error: parameter file 'params.yaml': kp value must be a finite number, got nan"),
    (".inf", "error: parameter file 'params.yaml': kp value must be a finite number, got inf"),
    ("-5", "error: parameter file 'params.yaml': kp value -5 lies outside its bounds [10, 5000]; fix the value or "
           "the bounds"),
    ("7000", "error: parameter file 'params.yaml': kp value 7000 lies outside its bounds [10, 5000]; fix the value "
             "or the bounds"),
]


@pytest.mark.parametrize(("value", "line"), PARAM_VALUES, ids=[v for v, _ in PARAM_VALUES])
def test_parameter_file_value_not_finite_or_outside_its_bounds(ws: Path, capsys, no_work, value: str,
                                                               line: str) -> None:
    (ws / "params.yaml").write_text(f"parameters:\n  kp: {{value: {value}, bounds: [10, 5000]}}\n")
    before = snapshot(ws)
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml", "-o", "e.json"], capsys)
    assert rc == 2 and one_line(err) == line
    assert snapshot(ws) == before


def test_bounds_outside_the_physical_domain(ws: Path, capsys, no_work) -> None:
    """Negative friction in a config, and a negative gain's bounds in a parameter file."""
    write_config(ws / "neg.yaml", parameters={"mu": {"nominal": 0.5, "bounds": [-1.0, 1.0]}})
    rc, _out, err = run_sysid(["fit", "-c", "neg.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: parameters.mu: bounds [-1, 1] reach outside its physical domain: a friction "
                             "coefficient is >= 0; give bounds inside it")
    (ws / "params.yaml").write_text("parameters:\n  kp: {value: 5, bounds: [-10, 5000]}\n")
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml"], capsys)
    assert rc == 2
    assert one_line(err) == ("error: parameter file 'params.yaml': parameter 'kp': bounds [-10, 5000] reach outside "
                             "its physical domain: a servo gain is > 0; give bounds inside it")


def test_negative_lever_arm_in_a_config(ws: Path, capsys, no_work) -> None:
    write_config(ws / "lever.yaml", fit={"lever_arm": -1})
    rc, _out, err = run_sysid(["fit", "-c", "lever.yaml", "-o", "out"], capsys)
    assert rc == 2
    assert one_line(err) == "error: fit.lever_arm must be a length >= 0 [m] (the heading error's weight), got -1"


def test_partial_overlap_is_warned_in_evaluate(ws: Path, capsys) -> None:
    """A run file whose wheel log overlaps its odometry for 1.4 s of 10 s: evaluated, with the figures."""
    (ws / "b.json").write_text(json.dumps(arc_run(t_wheels=(8.55, 18.75))))
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml", "-o", "e.json"], capsys)
    assert rc == 0, err
    expected = ("b: the wheel log [8.55, 18.73] s overlaps the odometry [0.00, 9.95] s for only 1.40 s: the run is cut "
                "from 9.95 s to 1.40 s (are both logs of one drive, on one clock?)")
    assert f"warning: {expected}" in err
    assert expected in json.loads((ws / "e.json").read_text())["warnings"]


# -- 8: a named pipe, a folder or a device as an input file ---------------------------------------------------


@pytest.mark.parametrize("role", ["-c", "--train", "--params"])
def test_fifo_as_input_is_not_a_regular_file(ws: Path, capsys, no_work, role: str) -> None:
    fifo = ws / ("pipe.json" if role == "--train" else "pipe.yaml")
    os.mkfifo(fifo)
    argv = {"-c": ["fit", "-c", "pipe.yaml"], "--train": ["fit", "-c", "fit.yaml", "--train", "pipe.json"],
            "--params": ["evaluate", "-c", "fit.yaml", "--params", "pipe.yaml"]}[role]
    rc, _out, err = run_sysid(argv, capsys, seconds=20)
    assert rc == 2
    line = one_line(err)
    assert line.endswith("is a named pipe (FIFO), not a regular file; give a file") and "pipe." in line
    assert "does not exist" not in line
    assert fifo.is_fifo()


def test_folder_or_device_as_config(ws: Path, capsys) -> None:
    (ws / "conf.yaml").mkdir()
    rc, _out, err = run_sysid(["fit", "-c", "conf.yaml"], capsys)
    assert rc == 2
    assert one_line(err) == "error: config file 'conf.yaml' is a directory, not a regular file; give a file"
    rc, _out, err = run_sysid(["fit", "-c", "/dev/zero"], capsys, seconds=20)
    assert rc == 2
    assert one_line(err) == "error: config file '/dev/zero' is a character device, not a regular file; give a file"


# -- 10: sizes and messages ----------------------------------------------------------------------------------


def test_junk_yaml_above_the_size_limit_is_refused_unread(ws: Path, capsys, monkeypatch) -> None:
    (ws / "junk.yaml").write_bytes(b"a" * (3 << 20))
    monkeypatch.setenv(LIMIT_ENV, "1")
    read = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or real(self))
    rc, _out, err = run_sysid(["fit", "-c", "junk.yaml"], capsys)
    assert rc == 2 and read == []
    assert one_line(err) == ("error: config file 'junk.yaml' is 3 MiB, more than the 1 MiB a YAML input may be (is it "
                             f"the file you meant?); if it is, raise the limit: {LIMIT_ENV}=<MiB>")


def test_unknown_parameter_in_a_parameter_file_is_named(ws: Path, capsys, no_work) -> None:
    """Not 'lower must be a finite number, got -inf' (an entry without bounds read as unbounded)."""
    (ws / "params.yaml").write_text("parameters:\n  kp: {value: 250, bounds: [10, 5000]}\n  grip: {value: 1}\n")
    rc, _out, err = run_sysid(["evaluate", "-c", "fit.yaml", "-p", "params.yaml"], capsys)
    assert rc == 2
    line = one_line(err)
    assert line.startswith("error: parameter file 'params.yaml': unknown parameter 'grip'; the simulator knows "
                           "kp, mu, ")
    assert "-inf" not in line
