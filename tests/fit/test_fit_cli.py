"""The `sysid` command line: help, bad configs stop before computation, fit end to end on the
test double, evaluate / sweep-dt / report, Ctrl-C leaves no output."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from sysid.cli import main  # noqa: E402
from tests.helpers.fit_doubles import TRUTH, KinematicDouble, make_runs, write_dataset  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
DOUBLE = "tests.helpers.fit_doubles:make_double"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom",))


def write_config(path: Path, dataset: Path, **changes) -> Path:
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": DOUBLE},
        "data": {"train": [str(dataset / "train-*.npz")], "held_out": [str(dataset / "held-*.npz")]},
        "parameters": {"kp": {"bounds": [10, 2000]}},
        "fit": {"dt": 0.05, "max_iter": 25},
        "sweep": {"dts": [0.025, 0.05, 0.1]},
        "truth": {k: v for k, v in TRUTH.items() if k != "chassis_mass"},
        "output": {
            "params": str(path.parent / "out" / "params.yaml"),
            "report": str(path.parent / "out" / "r.html"),
        },
    }
    for dotted, value in changes.items():
        node = cfg
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "sysid.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_help_lists_every_subcommand():
    res = run_cli("--help")
    assert res.returncode == 0
    for cmd in ("fit", "evaluate", "sweep-dt", "report", "synth"):
        assert cmd in res.stdout


@pytest.mark.parametrize(
    "cmd, flags",
    [
        (
            "fit",
            [
                "--config",
                "--train",
                "--held-out",
                "--optimizer",
                "--max-iter",
                "--dt",
                "--no-calibration",
                "--sweep-dts",
                "--params-out",
                "--report",
                "--free",
                "--freeze",
                "--simulator",
                "--odometry-jumps",
                "--no-baseline",
            ],
        ),
        ("evaluate", ["--config", "--params", "--runs", "--dt", "--output", "--odometry-jumps"]),
        ("sweep-dt", ["--config", "--params", "--runs", "--dts", "--output", "--odometry-jumps"]),
        ("report", ["RESULTS.JSON", "--output"]),
    ],
)
def test_subcommand_help_is_complete(cmd, flags, capsys):
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for f in flags:
        assert f in out, f


def test_synth_subcommand_is_registered():
    res = run_cli("synth", "--help")
    assert res.returncode in (0, 2)
    if res.returncode == 2:
        assert res.stderr.startswith("error:") and "synth" in res.stderr


BAD = [
    ({"parameters__friction_rolling": {"nominal": 0.1, "bounds": [0, 1]}}, "unknown parameter"),
    ({"parameters__kp": {"bounds": [500, 10]}}, "reversed"),
    ({"data__train": ["/nonexistent/run.bag"]}, "does not exist"),
    ({"data__train": ["/nonexistent/*.npz"]}, "matches no file"),
    ({"data__train": []}, "training set is empty"),
    ({"fit__optimizer": "bfgs"}, "optimizer"),
    ({"fit__bogus": 1}, "unknown key"),
    ({"fit__weights": {"no-such-run": 2.0}}, "unknown run"),
    ({"fit__segment": "climb"}, "climb"),
    ({"simulator": {"name": "no_such_engine"}}, "unknown simulator"),
    ({"data__split": -2.0}, "data.split"),
    ({"data__odometry_jumps": {"action": "ignore"}}, "odometry_jumps.action"),
    ({"data__odometry_jumps": {"max_accel": -1.0}}, "odometry_jumps.max_accel"),
    ({"data__odometry_jumps": {"max_accel": None, "action": "drop"}}, "needs max_accel"),
    ({"data__odometry_jumps": {"threshold": 3}}, "unknown key"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[m for _c, m in BAD])
def test_bad_config_stops_before_computation(tmp_path, dataset, capsys, change, message):
    cfg = write_config(tmp_path / "fit.yaml", dataset, **change)
    before = KinematicDouble.total_calls
    assert main(["fit", "--config", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert KinematicDouble.total_calls == before  # no simulation ran
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    not (SHARED / "bags" / "robot_localization_test2_jackal.bag").exists(),
    reason="../shared/data/bags is absent",
)
def test_missing_topic_is_reported_before_computation(tmp_path, dataset, capsys):
    bag = SHARED / "bags" / "robot_localization_test2_jackal.bag"
    cfg = write_config(
        tmp_path / "fit.yaml",
        dataset,
        data__train=[str(bag)],
        data__topics={"topics": {"odom": {"topic": "/no/such/odom"}}},
    )
    before = KinematicDouble.total_calls
    assert main(["fit", "--config", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err
    assert "/no/such/odom" in err and "/jackal_velocity_controller/odom" in err, err
    assert KinematicDouble.total_calls == before


def test_flags_override_config(tmp_path, dataset):
    from sysid.cli import build_parser
    from sysid.cli.common import merged_config

    cfg_file = write_config(tmp_path / "fit.yaml", dataset)
    args = build_parser().parse_args(
        [
            "fit",
            "--config",
            str(cfg_file),
            "--dt",
            "0.1",
            "--optimizer",
            "adam",
            "--freeze",
            "mu",
            "--set",
            "kp=300",
            "--no-sweep",
        ]
    )
    cfg = merged_config(args)
    assert cfg.fit.dt == 0.1 and cfg.fit.optimizer == "adam" and cfg.sweep.enabled is False
    assert cfg.parameters["mu"].frozen is True and cfg.parameters["kp"].nominal == 300.0
    assert cfg.parameters["kp"].bounds == (10, 2000)  # file values survive where no flag is given


def test_fit_end_to_end_then_evaluate_sweep_report(tmp_path, dataset, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    assert main(["fit", "--config", str(cfg), "-q"]) == 0
    out = capsys.readouterr().out
    assert "held_out" in out and "wrote" in out
    params = tmp_path / "out" / "params.yaml"
    doc = yaml.safe_load(params.read_text())
    for n in ("kp", "mu", "mu_lateral", "cmd_scale"):
        assert doc["parameters"][n]["value"] == pytest.approx(TRUTH[n], rel=0.02), n
    assert doc["metadata"]["held_out_runs"] == ["held-0-slalom"]
    results = json.loads((tmp_path / "out" / "r.json").read_text())
    assert results["runs"][-1]["metrics_identified"]["combined"] < 0.01
    # turn efficiency per tightness bin: at the identified (true) parameters the replay turns as the log does
    turns = results["runs"][-1]["turns"]
    used = [i for i, w in enumerate(turns["wheels"]) if w > 0.3]
    assert used, turns
    for i in used:
        assert turns["sim_identified"][i] == pytest.approx(turns["measured"][i], rel=0.02, abs=0.01), (i, turns)
    assert "<h2>Turn efficiency</h2>" in (tmp_path / "out" / "r.html").read_text()
    assert results["sweep"]["plateau"] is not None
    assert (tmp_path / "out" / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temp files

    ev_json = tmp_path / "ev.json"
    assert main(["evaluate", "--config", str(cfg), "--params", str(params), "--json", str(ev_json), "-q"]) == 0
    ev = json.loads(ev_json.read_text())
    assert ev["runs"][0]["name"] == "held-0-slalom" and ev["runs"][0]["combined"] < 0.01

    assert main(["sweep-dt", "--config", str(cfg), "--params", str(params), "--dts", "0.05,0.1", "-q"]) == 0
    assert "plateau" in capsys.readouterr().out

    html = tmp_path / "again.html"
    assert main(["report", str(tmp_path / "out" / "r.json"), "-o", str(html)]) == 0
    assert html.read_text().count('class="fig"') == (tmp_path / "out" / "r.html").read_text().count('class="fig"')


def test_default_params_path_is_models_robot_date(tmp_path, dataset, monkeypatch):
    cfg = write_config(tmp_path / "fit.yaml", dataset, output__params=None, sweep={"enabled": False})
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(cfg), "-q", "--max-iter", "3"]) == 0
    written = list((tmp_path / "models" / "helhest").glob("params-*.yaml"))
    assert len(written) == 1 and len(written[0].stem) == len("params-2026-01-01")


def test_ctrl_c_leaves_no_half_written_outputs(tmp_path, dataset, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset, simulator={"name": DOUBLE, "options": {"interrupt_after": 30}})
    assert main(["fit", "--config", str(cfg), "-q"]) == 130
    assert "interrupted" in capsys.readouterr().err
    out = tmp_path / "out"
    assert not out.exists() or not list(out.iterdir())


def test_evaluate_rejects_foreign_parameter_file(tmp_path, dataset, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump({"parameters": {"gear_ratio": {"value": 2.0, "bounds": [1, 3]}}}))
    assert main(["evaluate", "--config", str(cfg), "--params", str(bad), "-q"]) == 2
    assert "gear_ratio" in capsys.readouterr().err


def test_fit_scored_on_a_segment(tmp_path, dataset, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset, fit__segment="manoeuvre", sweep={"enabled": False})
    assert main(["fit", "--config", str(cfg), "-q", "--max-iter", "8"]) == 0
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    assert doc["config"]["segment"] == "manoeuvre"
    held = [r for r in doc["runs"] if r["split"] == "held_out"][0]
    assert held["t"][-1] <= 5.0 and held["metrics_identified"]["combined"] < 0.05


def test_fit_on_runs_split_into_pieces(tmp_path, dataset, capsys):
    """--split 2.5 cuts each 5 s run into two pieces replayed from their own start: the fit and the
    held-out evaluation see pieces (named run[a-b s]), every piece starts at its odometry and the
    fit lowers every piece's error; a weight on a parent run applies to its pieces. (The double
    starts each replay at rest, so pieces that begin in motion do not recover the truth exactly.)"""
    cfg = write_config(tmp_path / "fit.yaml", dataset, sweep={"enabled": False},
                       fit__weights={"train-0-turn": 2.0})
    assert main(["fit", "--config", str(cfg), "-q", "--split", "2.5"]) == 0
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    assert doc["config"]["split"] == 2.5
    assert "cut into 2.5 s pieces" in (tmp_path / "out" / "r.html").read_text()
    names = [r["name"] for r in doc["runs"]]
    assert names == ["train-0-turn[0.0-2.5 s]", "train-0-turn[2.5-5.0 s]", "train-1-accel[0.0-2.5 s]",
                     "train-1-accel[2.5-5.0 s]", "held-0-slalom[0.0-2.5 s]", "held-0-slalom[2.5-5.0 s]"], names
    for r in doc["runs"]:
        assert r["t"][-1] - r["t"][0] == pytest.approx(2.5, abs=0.06)
        assert r["sim_identified"]["x"][0] == pytest.approx(r["measured"]["x"][0], abs=1e-6)
        assert r["metrics_identified"]["combined"] < r["metrics_initial"]["combined"]


@pytest.mark.parametrize("action", ["report", "drop"])
def test_odometry_jumps_reported_or_dropped(tmp_path, dataset, capsys, action):
    """A training run whose odometry position jumps 0.3 m between two samples at 2.5 s (implied
    acceleration ~0.3 m / (50 ms)^2 = 120 m/s^2, above the 30 m/s^2 default): `report` keeps it and
    warns with its time; `drop` leaves it out of the fit and the scores, lists it in the results and
    the report, and still fits the truth from the other run. The clean runs show 0 jumps."""
    from ingest.run import Run

    d = tmp_path / "runs"
    d.mkdir()
    for src in sorted(dataset.glob("*.npz")):
        run = Run.load(src)
        if "accel" in run.name:
            run.odom.loc[run.odom["t"] >= run.odom["t"].iloc[0] + 2.5, "x"] += 0.3
        run.save(d / src.name)
    cfg = write_config(tmp_path / "fit.yaml", d, sweep={"enabled": False})
    assert main(["fit", "--config", str(cfg), "-q", "--odometry-jumps", action]) == 0
    err = capsys.readouterr().err
    assert re.search(r"\n  train-1-accel +train +jumps +2\.4\d s +1 jump <= 0\.3\d m", err), err
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    html = (tmp_path / "out" / "r.html").read_text()
    names = [r["name"] for r in doc["runs"]]
    assert doc["config"]["odometry_jumps"] == {"max_accel": 30.0, "action": action}
    clean = [r for r in doc["runs"] if r["name"] != "train-1-accel"]
    assert all(r["meta"]["odometry_jumps"] == [] for r in clean)
    if action == "report":
        assert "train-1-accel" in names and doc["dropped_runs"] == []
        jumped = next(r for r in doc["runs"] if r["name"] == "train-1-accel")["meta"]["odometry_jumps"]
        assert len(jumped) == 1 and jumped[0]["step"] == pytest.approx(0.3, rel=0.1)
        assert "1 (≤ 0.30 m)" in html
    else:
        assert "train-1-accel" not in names
        dropped = [(x["name"], x["split"], len(x["jumps"])) for x in doc["dropped_runs"]]
        assert dropped == [("train-1-accel", "train", 1)]
        assert "Left out (1)" in html and "train-1-accel (train, 1 jumps)" in html
        values = {p["name"]: p["value"] for p in doc["parameters"]}
        assert values["cmd_scale"] == pytest.approx(TRUTH["cmd_scale"], rel=0.02)
        # evaluate and sweep-dt screen their runs the same way
        params, ev_json = tmp_path / "out" / "params.yaml", tmp_path / "ev.json"
        jumped, clean_run = d / "train-1-accel.npz", d / "held-0-slalom.npz"
        assert main(["evaluate", "--config", str(cfg), "--params", str(params), "--runs", str(jumped),
                     "--runs", str(clean_run), "--odometry-jumps", "drop", "--json", str(ev_json), "-q"]) == 0
        ev = json.loads(ev_json.read_text())
        assert [r["name"] for r in ev["runs"]] == ["held-0-slalom"]
        assert [x["name"] for x in ev["dropped_runs"]] == ["train-1-accel"] and len(ev["warnings"]) == 1
        capsys.readouterr()
        for cmd in (["evaluate", "--params", str(params)], ["sweep-dt", "--dts", "0.05"]):
            assert main([*cmd, "--config", str(cfg), "--runs", str(jumped), "--odometry-jumps", "drop", "-q"]) == 2
            assert "have odometry jumps" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "helhest-real").is_dir(), reason="../shared/data/helhest-real is absent")
def test_odometry_lag_named_once_per_run():
    """The Helhest logs' odometry speed trails the wheels by ~1 s while the heading does not
    (tests/ingest/test_ingest_quality.py): the fit names each such run once, however many pieces it is cut
    into, keeps the measurement in the run metadata and shows it in the report's run table."""
    from sysid.app.config import FitConfig
    from sysid.app.document import _run_meta
    from sysid.app.report import _meta_table
    from sysid.app.runs import load_runs, screen_odometry

    cfg = FitConfig().replaced({"data.split": 10.0})
    src = [SHARED / "helhest-real" / f"{n}.json" for n in ("right_turn_a", "left_circle")]
    runs = load_runs(cfg, src, "train", progress=False)
    assert len(runs) == 6  # 1 + 5 pieces
    _kept, _dropped, findings = screen_odometry(cfg, runs, "train")
    lags = [f["text"] for f in findings if f["kind"] == "lag"]
    assert len(lags) == 2 and "'right_turn_a'" in lags[0] and "'left_circle'" in lags[1], lags
    meta = _run_meta(runs[1])
    assert meta["odometry_lag"]["delay"] > 0.7
    html = _meta_table([{"name": runs[1].name, "split": "train", "meta": meta}])
    assert f"{meta['odometry_lag']['translation']:.2f} / {meta['odometry_lag']['yaw']:.2f}" in html


def test_split_runs_pieces():
    from ingest.run import Run
    from sysid.app.runs import split_runs

    run = make_runs(("turn",), duration=9.0, truth_dt=0.05)[0]
    pieces = split_runs([run], 4.0)  # round(9 / 4) = 2 pieces of 4.5 s
    assert [p.name for p in pieces] == [f"{run.name}[0.0-4.5 s]", f"{run.name}[4.5-9.0 s]"]
    assert all(isinstance(p, Run) and p.meta["split_of"] == run.name for p in pieces)
    assert pieces[0].odom["t"].iloc[-1] <= pieces[1].odom["t"].iloc[0] + 1e-9
    assert sum(len(p.odom) for p in pieces) >= len(run.odom)
    assert split_runs([run], 20.0) == [run]  # shorter than one piece: whole


def test_constant_height_offset_is_not_an_error(dataset):
    """A simulator whose world puts the base 0.36 m above the odometry's z = 0 scores like one that
    does not: heights are compared relative to the start."""
    from ingest.run import Run
    from sysid.fit import evaluate
    from sysid.simulators.kinematic import KinematicSkidSteer

    class Lifted(KinematicSkidSteer):
        def rollout(self, runs, theta, dt):
            out = super().rollout(runs, theta, dt)
            for p in out:
                p[:, 3] += 0.36
            return out

    run = Run.load(sorted(dataset.glob("held-*.npz"))[0])
    a, _ = evaluate(KinematicSkidSteer(), [run], dict(TRUTH), 0.05)
    b, _ = evaluate(Lifted(), [run], dict(TRUTH), 0.05)
    assert b[0]["combined"] == pytest.approx(a[0]["combined"]) and b[0]["z_rmse"] < 1e-9

    from sysid.app.document import run_entries

    _, poses = evaluate(Lifted(), [run], dict(TRUTH), 0.05)
    entry = run_entries([run], "held_out", poses, poses, b, b)[0]
    assert entry["sim_identified"]["z"][0] == pytest.approx(entry["measured"]["z"][0])  # plotted as scored


def test_unconverged_engine_replay_is_reported(tmp_path, dataset, capsys):
    """A replay whose Newton solve ran out of iterations is named in a warning, in the run's line
    and in the report's run table, with its share of unconverged steps and worst residual."""
    cfg = write_config(tmp_path / "fit.yaml", dataset,
                       simulator={"name": "tests.helpers.fit_doubles:make_unconverged_double"},
                       sweep=None, fit__max_iter=5)
    assert main(["fit", "--config", str(cfg), "--quiet", "--no-sweep"]) == 0
    err = capsys.readouterr().err
    assert "engine replay of held-0-slalom at the identified parameters: 20% of steps" in err
    assert "worst Newton residual 0.5 m/s" in err
    assert "engine replay of train" not in err  # converged runs are not flagged
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    by_name = {r["name"]: r for r in doc["runs"]}
    assert by_name["held-0-slalom"]["solver"] == {"residual_max": 0.5, "unconverged_steps": 0.2}
    html = (tmp_path / "out" / "r.html").read_text()
    assert "unconverged steps / worst residual" in html and "20% / 0.5" in html
