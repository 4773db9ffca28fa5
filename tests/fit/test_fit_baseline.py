"""The kinematic baseline beside the model: `sysid fit` fits it on the same training runs (pieces),
scores it on the same held-out runs, and the report's first section compares the two per run
(mean over each run's pieces) and on average; `--no-baseline` / `fit.baseline: false` skip it."""

import json
import math
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from sysid.cli import main  # noqa: E402
from tests.helpers.fit_doubles import KinematicDouble, write_dataset  # noqa: E402

DOUBLE = "tests.helpers.fit_doubles:make_double"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom", "random"))


def write_config(path: Path, dataset: Path, **fit) -> Path:
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": DOUBLE},
        "data": {"train": [str(dataset / "train-*.npz")], "held_out": [str(dataset / "held-*.npz")], "split": 2.5},
        # a setting of a shared parameter carries over to the baseline; slip_speed would not (not shared)
        "parameters": {"kp": {"bounds": [10, 2000]}, "mu_lateral": {"bounds": [0.05, 5.0]}},
        "fit": {"dt": 0.05, "max_iter": 15, **fit},
        "sweep": {"enabled": False},
        "output": {"params": str(path.parent / "out" / "params.yaml"), "report": str(path.parent / "out" / "r.html")},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def first_section(html: str) -> str:
    """The HTML from the first <h2> to the second."""
    heads = [m.start() for m in re.finditer("<h2>", html)]
    return html[heads[0] : heads[1]]


def cells(section: str, split: str, run: str) -> list[str]:
    table = re.search(rf"<table data-gen='{split}'>(.*?)</table>", section, re.S).group(1)
    row = re.search(rf"<tr data-run='{re.escape(run)}'>(.*?)</tr>", table, re.S).group(1)
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


@pytest.fixture(scope="module")
def fitted(dataset, tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    cfg = write_config(d / "fit.yaml", dataset)
    assert main(["fit", "--config", str(cfg), "-q"]) == 0
    return (json.loads((d / "out" / "r.json").read_text()), (d / "out" / "r.html").read_text(),
            yaml.safe_load((d / "out" / "params.yaml").read_text()))


def test_baseline_fitted_on_the_same_training_pieces(fitted):
    doc, _html, params = fitted
    base = doc["baseline"]
    assert base["status"] == "fitted" and base["simulator"] == "kinematic" and base["dt"] == 0.02
    train = [r["name"] for r in doc["runs"] if r["split"] == "train"]
    assert len(train) == 4  # two 5 s runs cut into 2.5 s pieces
    assert sorted(base["fit"]["train_errors_final"]) == sorted(train)  # fitted on exactly the model's pieces
    assert sorted(doc["fit"]["train_errors_final"]) == sorted(train)
    rows = {p["name"]: p for p in base["parameters"]}
    assert set(rows) == {"kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass"}  # its own, no engine-only ones
    assert rows["kp"]["upper"] == 2000 and rows["mu_lateral"]["upper"] == 5.0  # the config's shared settings
    assert rows["cmd_scale"]["calibrated"] and base["calibration"]["segment"] == "cruise"
    assert base["fit"]["loss_final"] < base["fit"]["loss_initial"]
    # every run record carries both scores; the parameter file holds the model's parameters only
    assert all(r["metrics_baseline"]["combined"] > 0 for r in doc["runs"])
    assert set(params["parameters"]) == {p["name"] for p in doc["parameters"]}
    model_kp = next(p["value"] for p in doc["parameters"] if p["name"] == "kp")
    assert params["parameters"]["kp"]["value"] == pytest.approx(model_kp) != rows["kp"]["value"]
    assert set(params["metadata"]["baseline_held_out_per_run"]) == {"held-0-slalom", "held-1-random"}


def test_generalisation_is_the_mean_over_each_runs_pieces(fitted):
    doc, _html, _params = fitted
    gen = doc["generalisation"]
    assert gen["model"] == DOUBLE and gen["baseline"] == "kinematic"
    for split in ("held_out", "train"):
        pieces = [r for r in doc["runs"] if r["split"] == split]
        block = gen[split]
        assert block["n_runs"] == 2 and block["n_pieces"] == 4 and block["in_sample"] == (split == "train")
        for row in block["runs"]:
            mine = [r for r in pieces if r["name"].startswith(row["run"] + "[")]
            assert row["pieces"] == [r["name"] for r in mine] and len(mine) == 2
            for who, field in (("model", "metrics_identified"), ("start", "metrics_initial"),
                               ("baseline", "metrics_baseline")):
                for key in ("mean_xy", "combined"):
                    assert row[who][key] == pytest.approx(sum(r[field][key] for r in mine) / 2)
        for who in ("model", "start", "baseline"):
            for key in ("mean_xy", "combined"):
                assert block["mean_over_runs"][who][key] == pytest.approx(
                    sum(r[who][key] for r in block["runs"]) / 2)
        wins = {w: sum(r["model"]["mean_xy"] < r[w]["mean_xy"] for r in block["runs"]) for w in ("start", "baseline")}
        m = block["mean_over_runs"]
        assert (f"identified {m['model']['mean_xy']:.3f} m, starting values {m['start']['mean_xy']:.3f} m, "
                f"kinematic baseline {m['baseline']['mean_xy']:.3f} m" in block["verdict"])
        assert (f"lower than the start on {wins['start']} of 2 runs, than the kinematic baseline on "
                f"{wins['baseline']} of 2" in block["verdict"])


def test_report_leads_with_the_generalisation_table(fitted):
    doc, html, _params = fitted
    sec = first_section(html)
    assert sec.startswith("<h2>Generalisation</h2>")
    assert html.index("<h2>Generalisation</h2>") < html.index("<h2>Parameters</h2>")
    gen = doc["generalisation"]
    v = gen["held_out"]["verdict"]
    assert v[0].upper() + v[1:] in sec
    assert "Held-out runs (out of sample)" in sec and "Training runs (in-sample" in sec
    for split in ("held_out", "train"):
        block = gen[split]
        rows = [(r["run"], r) for r in block["runs"]] + [("mean_over_runs", block["mean_over_runs"]),
                                                         ("mean_over_pieces", block["mean_over_pieces"])]
        for name, r in rows:  # identified, starting values, kinematic baseline; mean xy, then combined
            want = [f"{r[w][key]:.3f}" for key in ("mean_xy", "combined") for w in ("model", "start", "baseline")]
            assert cells(sec, split, name)[-6:] == want, (split, name)
    assert "starting values</th>" in sec and "kinematic baseline</th>" in sec
    kp = next(p for p in doc["baseline"]["parameters"] if p["name"] == "kp")["value"]
    assert f"kp {kp:.4g}" in sec


def test_fit_summary_shows_the_starting_values_and_the_baseline(fitted, capsys):
    from sysid.cli.fit import print_fit

    doc, _html, _params = fitted
    print_fit(doc)
    out = capsys.readouterr().out
    assert "held-out runs, mean over each run's pieces: mean xy / combined [m] (identified | starting values | " \
        "kinematic baseline)" in out
    block = doc["generalisation"]["held_out"]
    m = block["mean_over_runs"]
    line = next(x for x in out.splitlines() if x.strip().startswith("mean over 2 runs"))
    assert line.split()[-11:] == [f"{m['model']['mean_xy']:.3f}", "/", f"{m['model']['combined']:.3f}", "|",
                                  f"{m['start']['mean_xy']:.3f}", "/", f"{m['start']['combined']:.3f}", "|",
                                  f"{m['baseline']['mean_xy']:.3f}", "/", f"{m['baseline']['combined']:.3f}"]
    assert block["verdict"] in out
    # the parameter table: every free parameter says whether the runs determine it, intervals unclipped
    for p in doc["parameters"]:
        if not p["frozen"]:
            assert p["determined"] in ("determined", "weakly determined", "not determined"), p
            row = next(x for x in out.splitlines() if x.startswith(p["name"] + " "))
            assert p["determined"] in row
    assert "least-determined combination: [" in out


def test_parameter_file_and_report_say_what_the_runs_determine(fitted):
    """The free parameters' identifiability reaches the parameter file and the report; a parameter the
    runs do not determine is red in the report with the remedies, unless a prior holds it."""
    import copy

    from sysid.app.report import render_report

    doc, html, params = fitted
    free = [p for p in doc["parameters"] if not p["frozen"]]
    assert free and all(params["parameters"][p["name"]]["determined"] == p["determined"] for p in free)
    assert all(params["parameters"][p["name"]]["ci95_reaches"] == p["reaches"] for p in free)
    assert "<th class='l'>determined by these runs</th>" in html and "data-identifiability='weakest'" in html
    loose = copy.deepcopy(doc)
    row = next(p for p in loose["parameters"] if p["name"] == "mu")
    row.update(determined="not determined", interval=[-0.5, 3.0], reaches="both")
    red = render_report(loose)
    assert "<span class='bad' data-determined='not'" in red and "[0.05 (bound), 2 (bound)]" in red
    assert "Not determined by these runs: <b>mu</b>" in red and "freeze it" in red and "add runs" in red
    row["prior"] = {"mean": 0.6, "std": 0.1}
    held = render_report(loose)
    assert "data-determined='not'" not in held and "held by its prior" in held and "prior N(0.6, 0.1²)" in held


def test_evaluate_scores_the_starting_values_and_the_baseline(fitted, tmp_path, capsys):
    """`sysid evaluate` replays the parameter file, the config's starting values and the kinematic
    baseline at the parameters its fit wrote into the file: on the fit's held-out runs the three
    scores are the fit's own."""
    doc, _html, params = fitted
    assert set(params["metadata"]["baseline_parameters"]) == {p["name"] for p in doc["baseline"]["parameters"]}
    out_json = tmp_path / "eval.json"
    assert main(["evaluate", "-c", doc["config"]["source"], "-p", doc["outputs"]["params"], "-q",
                 "-o", str(out_json)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out_json.read_text())
    held = {r["name"]: r for r in doc["runs"] if r["split"] == "held_out"}
    assert sorted(r["name"] for r in res["runs"]) == sorted(held)
    for r in res["runs"]:
        mine = held[r["name"]]
        assert r["combined"] == pytest.approx(mine["metrics_identified"]["combined"], rel=1e-6)
        assert r["start"]["combined"] == pytest.approx(mine["metrics_initial"]["combined"], rel=1e-6)
        assert r["baseline"]["combined"] == pytest.approx(mine["metrics_baseline"]["combined"], rel=1e-6)
    assert res["verdict"] == doc["generalisation"]["held_out"]["verdict"].replace("held-out runs", "evaluated runs")
    assert "mean xy, start [m]" in printed and "mean xy, kinematic [m]" in printed and res["verdict"] in printed
    assert res["mean_start"]["mean_xy"] > 0 and res["mean_baseline"]["mean_xy"] > 0


def test_no_baseline_skips_it(dataset, tmp_path):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    assert main(["fit", "--config", str(cfg), "-q", "--no-baseline", "--max-iter", "5"]) == 0
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    assert doc["baseline"] == {"simulator": "kinematic", "status": "skipped",
                               "reason": "not fitted (fit.baseline: false or --no-baseline)"}
    assert doc["config"]["baseline"] is False
    assert not any("metrics_baseline" in r for r in doc["runs"])
    gen = doc["generalisation"]
    assert gen["baseline"] is None and "baseline" not in gen["held_out"]["mean_over_runs"]
    assert gen["held_out"]["verdict"].startswith("the tests.helpers.fit_doubles:make_double simulator beats its "
                                                 "starting values on the held-out runs")
    assert gen["held_out"]["n_runs"] == 2  # per-run figures all the same
    sec = first_section((tmp_path / "out" / "r.html").read_text())
    assert sec.startswith("<h2>Generalisation</h2>") and "No kinematic baseline to compare with" in sec
    assert "kinematic baseline</th>" not in sec
    row = gen["held_out"]["runs"][0]
    assert cells(sec, "held_out", row["run"])[-4:] == [f"{row[w][k]:.3f}" for k in ("mean_xy", "combined")
                                                       for w in ("model", "start")]


def test_baseline_config_keys():
    from sysid.app.config import FitConfig, build_baseline_parameters
    from sysid.errors import ConfigError
    from sysid.simulators.kinematic import PARAMETERS

    assert FitConfig().fit.baseline.enabled is True
    assert FitConfig.from_mapping({"fit": {"baseline": False}}).fit.baseline.enabled is False
    cfg = FitConfig.from_mapping({
        "parameters": {"mu": {"nominal": 0.15}, "slip_speed": {"nominal": 0.1, "bounds": [0.005, 1.0]},
                       "slip_ratio": {"nominal": 1.0, "bounds": [0, 5]}},
        "fit": {"baseline": {"dt": 0.01, "max_iter": 7,
                             "parameters": {"turn_speed": {"nominal": 3.0, "bounds": [0.3, 50]}}}},
    })
    assert cfg.fit.baseline.enabled and cfg.fit.baseline.dt == 0.01 and cfg.fit.baseline.max_iter == 7
    ps = build_baseline_parameters(cfg, {}, PARAMETERS)
    assert ps["mu"].nominal == 0.15  # shared: carried over
    assert "slip_speed" not in ps and "slip_ratio" not in ps  # the engine's, not the baseline's
    assert ps["turn_speed"].upper == 50 and not ps["turn_speed"].frozen
    ratio = {"slip_ratio": {"nominal": 1, "bounds": [0, 5]}}
    bad = FitConfig.from_mapping({"fit": {"baseline": {"parameters": ratio}}})
    with pytest.raises(ConfigError, match="fit.baseline.parameters: unknown parameter"):
        build_baseline_parameters(bad, {}, PARAMETERS)
    with pytest.raises(ConfigError, match="fit.baseline: unknown key"):
        FitConfig.from_mapping({"fit": {"baseline": {"enable": True}}})


def test_bad_baseline_parameter_stops_before_computation(dataset, tmp_path, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset,
                       baseline={"parameters": {"slip_ratio": {"nominal": 1.0, "bounds": [0.0, 5.0]}}})
    before = KinematicDouble.total_calls
    assert main(["fit", "--config", str(cfg), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: fit.baseline.parameters") and "slip_ratio" in err, err
    assert KinematicDouble.total_calls == before and not (tmp_path / "out").exists()


def test_kinematic_model_skips_the_baseline():
    from sysid.app.config import FitConfig
    from sysid.app.fitting import baseline_status
    from sysid.simulators.kinematic import KinematicSkidSteer

    assert "itself the kinematic baseline" in baseline_status(FitConfig().replaced({"simulator.name": "kinematic"}),
                                                         KinematicSkidSteer())
    assert baseline_status(FitConfig().replaced({"simulator.name": DOUBLE}), KinematicDouble()) is None
    assert "fit.baseline: false" in baseline_status(
        FitConfig().replaced({"simulator.name": DOUBLE, "fit.baseline.enabled": False}), KinematicDouble())


def test_per_run_aggregation_closed_form():
    """Run a: pieces 0.1 and 0.3 m (mean 0.2), run b: one piece 0.6 m; the mean over runs weighs
    each run once (0.4), the mean over pieces each piece (1.0 / 3); a diverged piece makes its
    run's mean infinite (None in the results) and counts as lost."""
    from sysid.app.results import aggregate_split, generalisation

    def piece(name, run, model, base):
        return {"name": name, "run": run, "split": "held_out",
                "metrics_identified": {"mean_xy": model, "combined": 2 * model if model is not None else None},
                "metrics_baseline": {"mean_xy": base, "combined": 2 * base}}

    entries = [piece("a[0-1 s]", "a", 0.1, 0.2), piece("a[1-2 s]", "a", 0.3, 0.6), piece("b", "b", 0.6, 0.5)]
    agg = aggregate_split(entries)
    assert [r["run"] for r in agg["runs"]] == ["a", "b"] and agg["runs"][0]["pieces"] == ["a[0-1 s]", "a[1-2 s]"]
    assert agg["runs"][0]["model"]["mean_xy"] == pytest.approx(0.2)
    assert agg["runs"][0]["baseline"]["combined"] == pytest.approx(0.8)
    assert agg["mean_over_runs"]["model"]["mean_xy"] == pytest.approx(0.4)
    assert agg["mean_over_runs"]["baseline"]["mean_xy"] == pytest.approx(0.45)
    assert agg["mean_over_pieces"]["model"]["mean_xy"] == pytest.approx(1.0 / 3)
    assert agg["mean_over_pieces"]["baseline"]["combined"] == pytest.approx(2 * 1.3 / 3)
    gen = generalisation(entries, "ostrich", {"status": "fitted"})
    assert gen["held_out"]["verdict"] == (
        "the engine beats the kinematic baseline on the held-out runs: mean xy distance over 2 runs: identified "
        "0.400 m, kinematic baseline 0.450 m (lower than the kinematic baseline on 1 of 2 runs); combined error "
        "0.800 / 0.900 m")
    entries[2] = piece("b", "b", None, 0.5)  # diverged
    gen = generalisation(entries, "ostrich", {"status": "fitted"})
    assert gen["held_out"]["runs"][1]["model"]["mean_xy"] is None
    assert gen["held_out"]["mean_over_runs"]["model"]["mean_xy"] is None
    assert "does not beat the kinematic baseline" in gen["held_out"]["verdict"]
    assert "identified diverged, kinematic baseline 0.450 m (lower than the kinematic baseline on 1 of 2 runs)" in \
        gen["held_out"]["verdict"]
    assert aggregate_split([piece("c", None, 0.1, 0.2)])["runs"][0]["run"] == "c"  # whole run: its own name
    assert math.isnan(aggregate_split([])["mean_over_runs"]["model"]["mean_xy"])


def test_verdict_and_warning_against_the_starting_values():
    """The starting values are a baseline of their own: a fit that predicts the held-out runs worse than
    its start is said to in the verdict and warned about, naming the parameters that moved most."""
    from sysid.app.fitting import start_warning
    from sysid.app.results import aggregate_split, generalisation
    from sysid.fit.params import default_parameters

    def piece(name, model, start, base):
        return {"name": name, "run": name, "split": "held_out",
                "metrics_identified": {"mean_xy": model, "combined": 2 * model},
                "metrics_initial": {"mean_xy": start, "combined": 2 * start},
                "metrics_baseline": {"mean_xy": base, "combined": 2 * base}}

    entries = [piece("turn", 0.244, 0.085, 0.465), piece("launch", 0.661, 0.784, 0.883)]
    gen = generalisation(entries, "ostrich", {"status": "fitted"})
    assert gen["held_out"]["verdict"] == (
        "the engine beats the kinematic baseline but not its starting values on the held-out runs: mean xy distance "
        "over 2 runs: identified 0.453 m, starting values 0.434 m, kinematic baseline 0.674 m (lower than the start "
        "on 1 of 2 runs, than the kinematic baseline on 2 of 2); combined error 0.905 / 0.869 / 1.348 m")
    initial, identified = default_parameters(), default_parameters()
    identified.set_values({"mu": 1.2, "kp": 300.0})
    identified["chassis_mass"].value = 150.0  # frozen: not the fit's doing, never named
    text = start_warning(aggregate_split(entries), initial, identified)
    assert text.startswith("the identified parameters predict the held-out runs worse than the starting values: "
                           "mean xy distance 0.453 vs 0.434 m over 2 runs")
    assert "moved most: mu 0.8 -> 1.2 (11% of its range), kp 250 -> 300 N m s/rad (3% of its range)" in text
    assert "chassis_mass" not in text and "prior" in text and "sysid cv" in text
    better = [piece("turn", 0.08, 0.085, 0.465)]
    assert start_warning(aggregate_split(better), initial, identified) is None
    alone = [{k: v for k, v in better[0].items() if k != "metrics_baseline"}]  # no kinematic baseline fitted
    assert generalisation(alone, "ostrich", None)["held_out"]["verdict"].startswith(
        "the engine beats its starting values on the held-out runs: mean xy distance over 1 run: identified 0.080 m, "
        "starting values 0.085 m (lower than the start on 1 of 1 run)")


def test_report_of_older_results_still_leads_with_generalisation(fitted):
    """Results written before the baseline existed (no ``generalisation``, ``baseline`` or per-record
    ``run``): the report aggregates what it has, each record its own run, and says there is no baseline."""
    from sysid.app.report import render_report

    doc, _html, _params = fitted
    old = {k: v for k, v in doc.items() if k not in ("generalisation", "baseline")}
    old["runs"] = [{k: v for k, v in r.items() if k not in ("run", "metrics_baseline")} for r in doc["runs"]]
    sec = first_section(render_report(old))
    assert sec.startswith("<h2>Generalisation</h2>") and "No kinematic baseline to compare with" in sec
    r = old["runs"][-1]
    assert cells(sec, "held_out", r["name"])[-4:] == [f"{r[m][k]:.3f}" for k in ("mean_xy", "combined")
                                                     for m in ("metrics_identified", "metrics_initial")]
