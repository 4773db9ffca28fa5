"""The report's "What each run decides" table and the results' ``fit.run_shifts``: five training runs,
one replayed at another command scale than the four others; `sysid fit` names it, the report marks its
cell past the interval, and with ``fit.intervals: runs`` the interval holds the runs' spread."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml

from sysid.cli import main
from tests.helpers.fit_doubles import make_runs, scaled_runs

ROOT = Path(__file__).resolve().parents[2]


def fit(folder: Path, **fit_section) -> tuple[dict, str]:
    for run in scaled_runs([0.92, 0.92, 0.92, 0.92, 0.80], prefix="train"):
        run.save(folder / f"{run.name}.npz")
    held = make_runs(("slalom",), duration=5.0, noise=0.01, seed=9, truth_dt=0.05, prefix="held")[0]
    held.save(folder / f"{held.name}.npz")
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": "kinematic"},
        "data": {"train": ["train*.npz"], "held_out": ["held*.npz"]},
        "parameters": {n: {"frozen": True} for n in ("kp", "mu", "mu_lateral")},
        "fit": {"dt": 0.05, "max_iter": 20, "calibration": {"enabled": False}, **fit_section},
        "sweep": False,
        "output": {"params": "out/params.yaml", "report": "out/report.html"},
    }
    (folder / "fit.yaml").write_text(yaml.safe_dump(cfg))
    here = Path.cwd()
    os.chdir(folder)
    try:
        assert main(["fit", "-q", "--config", "fit.yaml"]) == 0
    finally:
        os.chdir(here)
    return json.loads((folder / "out" / "report.json").read_text()), (folder / "out" / "report.html").read_text()


def test_the_run_the_model_describes_differently_is_named_and_marked(tmp_path):
    doc, html = fit(tmp_path)
    shifts = doc["fit"]["run_shifts"]
    assert sorted(shifts) == [f"train{i}-0-turn" for i in range(5)]
    odd = max(shifts, key=lambda r: abs(shifts[r]["cmd_scale"]))
    assert odd == "train4-0-turn" and shifts[odd]["cmd_scale"] > 0
    assert any(w.startswith("the runs disagree") and odd in w for w in doc["fit"]["warnings"])
    table = html[html.index("What each run decides"):]
    table = table[:table.index("</table>")]
    row = re.search(rf"<td class='l'>{odd}</td>(.*?)</tr>", table)
    assert row is not None and "class='bad'" in row.group(1)
    others = re.findall(r"<td class='l'>train[0-3]-0-turn</td>(.*?)</tr>", table)
    assert len(others) == 4 and not any("class='bad'" in o for o in others)


def test_intervals_from_the_runs_hold_their_spread(tmp_path):
    doc, html = fit(tmp_path, intervals="runs")
    row = next(r for r in doc["parameters"] if r["name"] == "cmd_scale")
    lo, hi = row["ci95"]
    assert lo < 0.896 < hi  # the five runs' mean scale
    assert not any(w.startswith("the runs disagree") for w in doc["fit"]["warnings"])
    assert "the runs' jackknife" in html


def test_an_unbounded_interval_marks_no_shift():
    """An interval end written as None (infinite variance) is unbounded: no shift passes it, either way."""
    from types import SimpleNamespace

    from sysid.app.report import run_shift_table

    res = SimpleNamespace(parameters=[{"name": "mu", "value": 0.5}, {"name": "kp", "value": 100.0}],
                          fit={"run_shifts": {"a": {"mu": -5.0, "kp": 50.0}, "b": {"mu": 0.01, "kp": -80.0}},
                               "identifiability": {"mu": {"interval": [None, None]},
                                                   "kp": {"interval": [60.0, 140.0]}}})
    html = run_shift_table(res)
    rows = dict(re.findall(r"<td class='l'>(\w)</td>(.*?)</tr>", html))
    assert rows["a"].count("class='bad'") == 1 and "class='bad'>+50" in rows["a"]  # kp past 140, mu unbounded
    assert "class='bad'>-80" in rows["b"] and rows["b"].count("class='bad'") == 1


def test_cv_report_shows_each_folds_run_shifts(tmp_path):
    """`sysid cv` keeps each fold's run shifts and its HTML shows them per fold, the odd run marked
    in every fold that trains on it."""
    for run in scaled_runs([0.92, 0.92, 0.92, 0.92, 0.92, 0.80], prefix="r"):
        run.save(tmp_path / f"{run.name}.npz")
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": "kinematic"},
        "data": {"train": ["r*.npz"]},
        "parameters": {n: {"frozen": True} for n in ("kp", "mu", "mu_lateral")},
        "fit": {"dt": 0.05, "max_iter": 20, "calibration": {"enabled": False}, "baseline": False},
        "cv": {"folds": [["r0-0-turn"], ["r1-0-turn"]]},
        "sweep": False,
    }
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["cv", "-q", "--config", str(tmp_path / "fit.yaml"), "--output", str(tmp_path / "cv")]) == 0
    doc = json.loads((tmp_path / "cv" / "cv.json").read_text())
    html = (tmp_path / "cv" / "cv.html").read_text()
    odd = "r5-0-turn"
    sections = html.split("data-fold=")[1:]
    assert len(sections) == len(doc["folds"]) == 2
    for fold, section in zip(doc["folds"], sections, strict=True):
        trained = fold["train_runs"]
        assert sorted(fold["run_shifts"]) == sorted(trained) and "What each run decides" in section
        row = re.search(rf"<td class='l'>{odd}</td>(.*?)</tr>", section)
        assert (row is not None) == (odd in trained)
        if row is not None:
            assert "class='bad'" in row.group(1)
