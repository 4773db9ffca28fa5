"""Cross-validation (`sysid cv`, sysid/app/cv.py): folds over a config's runs, each fitting the model and
the kinematic baseline on the same training runs; the Ray path (one task per fold on a local
cluster) gives the serial path's results; a failing fold is reported while the others finish;
Ctrl-C leaves nothing written; the command line writes its outputs and stops bad flags in one line."""

import copy
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from sysid.app.config import FitConfig  # noqa: E402
from sysid.app.cv import LOO, cross_validate, fold_indices, format_table, parse_folds, write_cv  # noqa: E402
from sysid.cli import main  # noqa: E402
from sysid.errors import ConfigError  # noqa: E402
from sysid.simulators.protocol import allow_simulator  # noqa: E402
from tests.helpers.fit_doubles import KinematicDouble, write_dataset  # noqa: E402

DOUBLE = "tests.helpers.fit_doubles:make_double"


class FailingDouble(KinematicDouble):
    """The kinematic double, failing whenever it is asked to fit (Jacobian) on a batch holding the
    run ``held-1-random``: the fold that trains on it fails, the fold that holds it out does not."""

    def rollout_with_jacobian(self, runs, theta, dt, names):
        if any(r.name.startswith("held-1-random") for r in runs):
            raise RuntimeError("simulated solver failure on held-1-random")
        return super().rollout_with_jacobian(runs, theta, dt, names)


def make_failing_double(robot=None, **options):
    return FailingDouble(robot, **options)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom", "random"))


def write_config(path: Path, dataset: Path, simulator=DOUBLE, **fit) -> Path:
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": simulator if isinstance(simulator, dict) else {"name": simulator},
        "data": {"train": [str(dataset / "train-*.npz")], "held_out": [str(dataset / "held-*.npz")], "split": 2.5},
        "parameters": {"kp": {"bounds": [10, 2000]}, "mu_lateral": {"bounds": [0.05, 5.0]}},
        "fit": {"dt": 0.05, "max_iter": 10, **fit},
        "sweep": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster (2 CPUs) for the module: cross_validate uses an initialised session as it is."""
    ray = pytest.importorskip("ray")
    from sysid.fit.fanout import cluster

    with cluster(2, None):
        yield ray


@pytest.fixture(scope="module")
def config(dataset, tmp_path_factory):
    return FitConfig.from_file(write_config(tmp_path_factory.mktemp("cfg") / "fit.yaml", dataset))


@pytest.fixture(scope="module")
def serial(config):
    return cross_validate(config, 2, workers=1)


def comparable(doc: dict) -> dict:
    """The document without what differs by construction between runs: creation time, wall times, pids."""
    d = copy.deepcopy(doc)
    d.pop("created")
    d.pop("execution")
    for f in d["folds"]:
        f.pop("execution")
    return d


def test_folds():
    assert parse_folds("loo") == parse_folds("leave-one-run-out") == LOO and parse_folds("3") == 3
    for bad in ("1", "0", "x", "2.5"):
        with pytest.raises(ConfigError):
            parse_folds(bad)
    assert fold_indices(4, "loo") == [[0], [1], [2], [3]]
    assert fold_indices(5, 2) == [[0, 1, 2], [3, 4]]
    shuffled = fold_indices(5, 2, shuffle_seed=0)
    assert sorted(i for f in shuffled for i in f) == [0, 1, 2, 3, 4] and shuffled == fold_indices(5, 2, shuffle_seed=0)
    with pytest.raises(ConfigError, match="only 4 runs"):
        fold_indices(4, 5)


def test_two_fold_cv_document(serial):
    doc = serial
    s = doc["summary"]
    assert doc["format"] == "sysid-cv" and doc["folds_spec"] == 2 and doc["baseline"] == "kinematic"
    assert s["n_folds"] == 2 and s["n_ok"] == 2 and s["n_failed"] == 0
    # every run held out exactly once, with all its pieces in the fold that holds it out
    held = {r["run"]: r for r in s["runs"]}
    assert sorted(held) == ["held-0-slalom", "held-1-random", "train-0-turn", "train-1-accel"]
    for f in doc["folds"]:
        assert set(f["train_runs"]).isdisjoint(f["held_out_runs"])
        assert sorted(f["train_runs"] + f["held_out_runs"]) == sorted(held)
        for p in f["pieces"]:
            assert p["run"] in f["held_out_runs"] and p["name"].startswith(p["run"] + "[")
    assert all(len(r["pieces"]) == 2 for r in s["runs"])  # two 5 s runs cut into 2.5 s pieces
    # model, its starting values and the baseline side by side; the means are over runs, folds and pieces
    assert s["has_start"] and s["wins_start"] == sum(r["model"]["mean_xy"] < r["start"]["mean_xy"] for r in s["runs"])
    for who in ("model", "start", "baseline"):
        for key in ("mean_xy", "combined"):
            runs = [r[who][key] for r in s["runs"]]
            assert s[who]["mean_over_runs"][key] == pytest.approx(sum(runs) / 4)
            pieces = [p[who][key] for f in doc["folds"] for p in f["pieces"]]
            assert s[who]["mean_over_pieces"][key] == pytest.approx(sum(pieces) / 8)
            for r in s["runs"]:
                mine = [p[who][key] for f in doc["folds"] for p in f["pieces"] if p["run"] == r["run"]]
                assert r[who][key] == pytest.approx(sum(mine) / len(mine))
    assert s["verdict"].startswith("cross-validated over 2 folds, the model beats both its starting values and the "
                                   "kinematic baseline on the held-out runs: mean xy distance over 4 runs: identified ")
    table = format_table(doc)
    assert "(identified | starting values | kinematic baseline)" in table and s["verdict"] in table
    mean = next(ln for ln in table.splitlines() if ln.lstrip().startswith("mean over 4 runs"))
    want: list[str] = []
    for w in ("model", "start", "baseline"):
        want += (["|"] if want else []) + [f"{s[w]['mean_over_runs']['mean_xy']:.3f}", "/",
                                            f"{s[w]['mean_over_runs']['combined']:.3f}"]
    assert mean.split()[-11:] == want
    # per-fold parameters with intervals and their spread across folds
    kp = next(p for p in doc["parameters"]["model"] if p["name"] == "kp")
    vals = [pf["value"] for pf in kp["folds"]]
    assert kp["free"] and len(vals) == 2 and kp["mean"] == pytest.approx(sum(vals) / 2)
    assert kp["min"] == min(vals) and kp["max"] == max(vals) and kp["std"] > 0
    assert all(pf["ci95"][0] <= pf["value"] <= pf["ci95"][1] for pf in kp["folds"])
    assert {p["name"] for p in doc["parameters"]["baseline"]} >= {"kp", "mu", "mu_lateral", "cmd_scale"}
    # the printed table: a name longer than the name column (slip_speed_lat) keeps a gap before its values
    long = copy.deepcopy(doc)
    long["parameters"]["model"][0]["name"] = "slip_speed_lat_long"
    row = next(ln for ln in format_table(long).splitlines() if ln.lstrip().startswith("slip_speed_lat_long"))
    assert row.startswith("  slip_speed_lat_long  "), row


def test_ray_equals_serial(serial, config, ray_cluster):
    ray = cross_validate(config, 2, workers=2)
    assert ray["execution"]["backend"] == "ray" and serial["execution"]["backend"] == "serial"
    pids = {f["execution"]["pid"] for f in ray["folds"]}
    assert pids and all(p != __import__("os").getpid() for p in pids)  # the folds ran in Ray's workers
    assert format_table(ray) == format_table(serial)  # to the printed digits
    assert json.dumps(comparable(ray), sort_keys=True) == json.dumps(comparable(serial), sort_keys=True)


def test_failed_fold_reported_others_finish(dataset, tmp_path, ray_cluster):
    failing = "tests.fit.test_cv:make_failing_double"
    allow_simulator(failing)
    cfg = FitConfig.from_file(write_config(tmp_path / "fit.yaml", dataset, simulator=failing))
    doc = cross_validate(cfg, 2, workers=2)
    s = doc["summary"]
    assert s["n_failed"] == 1 and s["n_ok"] == 1
    bad, good = sorted(doc["folds"], key=lambda f: f["status"])  # "failed" < "ok"
    assert bad["status"] == "failed" and "simulated solver failure on held-1-random" in bad["error"]
    assert "RuntimeError" in bad["error"] and "Traceback" in bad["traceback"]
    assert good["status"] == "ok" and sorted(good["held_out_runs"]) == ["held-0-slalom", "held-1-random"]
    assert [r["run"] for r in s["runs"]] == good["held_out_runs"]  # the means are over the finished fold
    text = format_table(doc)
    assert "FAILED: RuntimeError: simulated solver failure" in text
    jp, hp = write_cv(doc, tmp_path / "out")
    html = hp.read_text()
    assert "simulated solver failure on held-1-random" in html and "data-fold='0'" in html
    assert json.loads(jp.read_text())["summary"]["n_failed"] == 1


def test_interrupt_cancels_and_writes_nothing(config, ray_cluster, tmp_path):
    seen = []

    def on_fold(rec):
        seen.append(rec["index"])
        raise KeyboardInterrupt  # as Ctrl-C while the driver waits for the other folds

    with pytest.raises(KeyboardInterrupt):
        cross_validate(config, "loo", workers=2, on_fold=on_fold)
    assert len(seen) == 1
    assert ray_cluster.get(ray_cluster.remote(lambda: 1).remote()) == 1  # the cluster is still usable


def test_cli_writes_outputs(dataset, tmp_path, ray_cluster, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    out = tmp_path / "cv"
    assert main(["cv", "--config", str(cfg), "--folds", "2", "--workers", "2", "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "cv.json").read_text())
    assert doc["format"] == "sysid-cv" and doc["summary"]["n_ok"] == 2
    assert format_table(doc) in printed and f"wrote {out / 'cv.html'}" in printed
    html = (out / "cv.html").read_text()
    assert "<h2>Held-out error</h2>" in html and "Parameters across folds: model" in html
    assert "id='sysid-render-status'" in html and html.count("<figure class=\"fig\"") >= 3
    assert sorted(p.name for p in out.iterdir()) == ["cv.html", "cv.json"]  # no temporary files left
    # the header names the simulator's options (what every fold's pieces start from, how the odometry is seen)
    from sysid.app.cv_report import render_cv_report

    doc["simulator"]["options"] = {"initial_speed": "wheels", "odom_history": "odometry"}
    head = render_cv_report(doc).split("<p class='muted'>model ", 1)[1].split("</p>")[0]
    assert "with initial_speed wheels, odom_history odometry, timestep" in head, head


def test_cli_interrupt_leaves_no_output(dataset, tmp_path, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset, simulator={"name": DOUBLE, "options": {"interrupt_after": 3}})
    out = tmp_path / "cv"
    assert main(["cv", "--config", str(cfg), "--folds", "2", "--workers", "1", "--out", str(out), "-q"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--folds", "1"], "--folds"),
    (["--folds", "many"], "--folds"),
    (["--workers", "0"], "--workers"),
    (["--bogus"], "unrecognized arguments"),
])
def test_cli_bad_flags_one_line(argv, fragment, dataset, tmp_path, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    with pytest.raises(SystemExit) as exc:
        main(["cv", "--config", str(cfg), *argv, "--out", str(tmp_path / "cv")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "cv").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--folds", "5"], "only 4 runs"),
    (["--workers", "1", "--ray-address", "auto"], "serially"),
])
def test_cli_bad_values_one_line(argv, fragment, dataset, tmp_path, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    assert main(["cv", "--config", str(cfg), *argv, "--out", str(tmp_path / "cv"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "cv").exists()


def test_without_baseline(dataset, tmp_path):
    cfg = FitConfig.from_file(write_config(tmp_path / "fit.yaml", dataset, baseline=False))
    doc = cross_validate(cfg, 2, workers=1)
    s = doc["summary"]
    assert doc["baseline"] is None and not s["has_baseline"] and "baseline" not in s
    assert s["verdict"].startswith("cross-validated over 2 folds, the model beats its starting values on the held-out "
                                   "runs") and "kinematic" not in s["verdict"]
    assert doc["parameters"]["baseline"] == [] and s["model"]["mean_over_runs"]["mean_xy"] > 0
    assert format_table(doc).splitlines()[2].count("|") == 1  # two column pairs: identified | starting values
    _jp, hp = write_cv(doc, tmp_path / "out")
    assert "No kinematic baseline to compare with" in hp.read_text()


def test_intervals_that_are_the_bounds_count_as_not_determined():
    """Four folds: mu's interval is its whole bound range in two of them (not determined): those hold
    any mean, so they are counted apart, never as 'intervals holding the mean'."""
    from sysid.app.cv import parameter_spread

    def fold(i, value, ci, determined):
        row = {"name": "mu", "unit": "1", "initial": 0.8, "value": value, "lower": 0.05, "upper": 2.0,
               "frozen": False, "calibrated": False, "std": 0.1, "ci95": ci, "at_bound": None,
               "determined": determined, "interval": ci, "reaches": None}
        return {"index": i, "status": "ok", "parameters": {"model": [row]}}

    folds = [fold(0, 0.5, [0.4, 0.6], "determined"), fold(1, 0.55, [0.45, 0.65], "determined"),
             fold(2, 1.2, [0.05, 2.0], "not determined"), fold(3, 0.3, [0.05, 2.0], "not determined")]
    (mu,) = parameter_spread(folds)
    assert (mu["folds_ci_contain_mean"], mu["folds_with_ci"], mu["folds_not_determined"]) == (1, 2, 2)
    # documents written before the field: an interval that is the whole bound range counts the same
    for f in folds:
        del f["parameters"]["model"][0]["determined"]
    (old,) = parameter_spread(folds)
    assert (old["folds_ci_contain_mean"], old["folds_with_ci"], old["folds_not_determined"]) == (1, 2, 2)
    doc = {"summary": {"n_folds": 4, "n_ok": 4, "n_failed": 0, "has_baseline": False, "runs": [], "failed": [],
                       "n_runs": 0, "n_pieces": 0, "verdict": None},
           "folds_spec": 4, "simulator": {"name": "ostrich"}, "config": {}, "parameters": {"model": [mu]}}
    line = next(ln for ln in format_table(doc).splitlines() if ln.lstrip().startswith("mu "))
    assert "intervals holding the mean 1 of 2, not determined in 2" in line
    assert "[0.05 (bound), 2 (bound)] not determined" in line


def test_cv_report_renders_in_chromium(serial, tmp_path):
    from tests.fit.test_fit_report import CHROMIUM, render_in_chromium, status

    if CHROMIUM is None:
        pytest.skip("headless chromium not installed (apt-get install chromium)")
    _jp, hp = write_cv(serial, tmp_path / "out")
    html = hp.read_text()
    assert "<script src" not in html and "<link" not in html  # self-contained
    dom, log = render_in_chromium(hp)
    st = status(dom)
    assert st["ok"] == "true" and st["figures"] == st["rendered"] == "3" and st["errors"] == "0", st
    assert not [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
