"""The error per segment (`sysid.app.segment_scores`): each replay's mean xy distance and combined error over a
run's cruise and climb segments, after the climb and over the whole run, in the results and the report."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from sysid.app.report import render_report
from sysid.app.segment_scores import entry_segment_scores, segment_scores

T = np.round(np.arange(0.0, 10.0 + 1e-9, 0.1), 10)  # 101 samples, 0.1 s apart
CRUISE, CLIMB = (1.0, 3.0), (4.0, 6.0)  # 21 samples each; after the climb: 40 samples (6.1 .. 10.0 s)


def _series(dx: Any = 0.0, dy: Any = 0.0, dyaw: Any = 0.0) -> dict[str, list[float]]:
    """A straight drive along x at 1 m/s, offset by ``dx``, ``dy`` [m] and ``dyaw`` [rad] (scalars or per sample)."""
    n = len(T)
    return {"x": list(T + dx), "y": list(np.zeros(n) + dy), "z": [0.0] * n, "yaw": list(np.zeros(n) + dyaw)}


def _entry(segments: dict[str, list[float]] | None) -> dict[str, Any]:
    """A run entry whose identified replay is 0.1 m off in x during the climb only and whose starting
    values' replay is 0.3 m off in y and 0.8 rad in heading throughout (no kinematic baseline)."""
    climb = (T >= CLIMB[0]) & (T <= CLIMB[1])
    entry: dict[str, Any] = {
        "name": "synthetic", "run": "synthetic", "split": "held_out", "t": list(T),
        "measured": _series(), "sim_identified": _series(dx=np.where(climb, 0.1, 0.0)),
        "sim_initial": _series(dy=0.3, dyaw=0.8),
        "metrics_initial": {"combined": 0.5, "mean_xy": 0.3, "final_xy": 0.3, "yaw_rmse": 0.8, "z_rmse": 0.0},
        "metrics_identified": {"combined": 0.1 * 21 / 101, "mean_xy": 0.1 * 21 / 101, "final_xy": 0.0,
                               "yaw_rmse": 0.0, "z_rmse": 0.0},
        "pallet": None, "meta": {},
    }
    if segments is not None:
        entry["segments"] = segments
    return entry


START_COMBINED = float(np.hypot(0.3, 0.5 * 0.8))  # sqrt(0.3^2 + (L 0.8)^2) = 0.5 m with L = 0.5 m


def test_the_climb_error_shows_in_the_climb_only():
    scores = entry_segment_scores(_entry({"cruise": list(CRUISE), "climb": list(CLIMB)}), lever_arm=0.5)
    assert list(scores) == ["cruise", "climb", "after", "whole run"]
    assert [scores[w]["samples"] for w in scores] == [21, 21, 40, 101]
    assert scores["after"]["t"] == [6.0, 10.0]
    model = {w: scores[w]["model"] for w in scores}
    assert model["cruise"] == {"mean_xy": 0.0, "combined": 0.0}
    assert model["climb"]["mean_xy"] == pytest.approx(0.1) and model["climb"]["combined"] == pytest.approx(0.1)
    assert model["after"] == {"mean_xy": 0.0, "combined": 0.0}
    assert model["whole run"]["mean_xy"] == pytest.approx(0.1 * 21 / 101)
    assert model["whole run"]["combined"] == pytest.approx(0.1 * np.sqrt(21 / 101))
    for w in scores:  # the starting values are off by the same everywhere; no baseline in this entry
        assert scores[w]["start"]["mean_xy"] == pytest.approx(0.3)
        assert scores[w]["start"]["combined"] == pytest.approx(START_COMBINED)
        assert "baseline" not in scores[w]


def test_a_run_without_segments_has_the_whole_run_only():
    scores = entry_segment_scores(_entry(None), lever_arm=0.5)
    assert list(scores) == ["whole run"]
    assert scores["whole run"]["model"]["mean_xy"] == pytest.approx(0.1 * 21 / 101)
    only_cruise = entry_segment_scores(_entry({"cruise": list(CRUISE)}), lever_arm=0.5)
    assert list(only_cruise) == ["cruise", "whole run"]  # no climb: nothing after it either


def test_a_replay_diverged_in_a_window_is_infinite_there_only():
    sim = _series()
    sim["x"] = [None if t > 8.0 else x for t, x in zip(T, sim["x"], strict=True)]  # the JSON's non-finite
    scores = segment_scores(T, _series(), {"model": sim}, {"cruise": CRUISE, "climb": CLIMB}, 0.5)
    assert scores["cruise"]["model"]["mean_xy"] == 0.0 and scores["climb"]["model"]["mean_xy"] == 0.0
    assert scores["after"]["model"]["mean_xy"] == np.inf and scores["whole run"]["model"]["combined"] == np.inf


def test_a_fit_scores_the_windows_at_the_odometrys_full_rate():
    """`run_entries` scores the full-rate replays (more samples than the document keeps), each translated onto
    the odometry's start, the kinematic baseline's beside the model's."""
    from ingest.run import Run
    from sysid.app.document import MAX_POINTS, run_entries
    from tests.helpers.fit_doubles import command_profile, odom_stub

    t = np.arange(0.0, 12.0, 0.01)  # 1200 samples > MAX_POINTS
    assert len(t) > MAX_POINTS
    run = Run("r", odom_stub(t), command_profile("turn", 12.0), segments={"cruise": (1.0, 3.0), "climb": (4.0, 6.0)})
    meas = run.odom[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]].to_numpy(float)
    climb = (t >= 4.0) & (t <= 6.0)
    final = meas.copy()
    final[:, 1] += np.where(climb, 0.1, 0.0)
    start = meas.copy()
    start[:, 1:4] += [5.0, 5.0, -0.36]  # another frame: translated onto the odometry's start before scoring
    base = meas.copy()
    base[:, 2] += np.where(t > 6.0, 0.2, 0.0)
    zero = {"combined": 0.0, "mean_xy": 0.0, "final_xy": 0.0, "yaw_rmse": 0.0, "z_rmse": 0.0}
    (entry,) = run_entries([run], "train", [start], [final], [zero], [zero], poses_baseline=[base])
    scores = entry["segment_scores"]
    assert list(scores) == ["cruise", "climb", "after", "whole run"]
    assert scores["whole run"]["samples"] == len(t)
    assert scores["climb"]["model"]["mean_xy"] == pytest.approx(0.1)
    assert scores["whole run"]["model"]["mean_xy"] == pytest.approx(0.1 * climb.sum() / len(t))
    assert scores["after"]["baseline"]["mean_xy"] == pytest.approx(0.2)
    assert scores["climb"]["baseline"]["mean_xy"] == 0.0
    assert all(scores[w]["start"] == {"mean_xy": 0.0, "combined": 0.0} for w in scores)


def _row(html: str, run: str, replay: str) -> list[str]:
    """The text of a segment table row's window cells (after the run, split and replay cells)."""
    row = re.search(rf"<tr data-run='{run}' data-replay='{replay}'>(.*?)</tr>", html)
    assert row, (run, replay)
    return [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))]


def test_the_report_shows_the_error_per_segment(tmp_path):
    """After the accuracy table: a row per run and replay, a column pair per window, "–" for a missing one."""
    train = _entry(None)
    train.update(name="flat", run="flat", split="train")
    doc = {"format": "sysid-results", "robot": "helhest", "simulator": {"name": "ostrich"},
           "config": {"dt": 0.1, "optimizer": "lm", "lever_arm": 0.5, "segment": None, "split": None},
           "fit": {"optimizer": "lm", "message": "converged", "iterations": 3, "loss_initial": 1.0,
                   "loss_final": 0.5, "wall_time": 1.0},
           "runs": [_entry({"cruise": list(CRUISE), "climb": list(CLIMB)}), train]}
    html = render_report(doc, base=tmp_path)
    assert "<h3>Error per segment</h3>" in html
    # after the accuracy table, before the run figures and the runs' metadata
    assert (html.index("<th>combined, identified [m]</th>") < html.index("data-table='segments'")
            < html.index("<h3>synthetic</h3>") < html.index("<th>odom samples</th>"))
    head = ["synthetic", "held-out", "identified"]
    assert _row(html, "synthetic", "model") == [*head, "0.000", "0.000", "0.100", "0.100", "0.000", "0.000",
                                                 f"{0.1 * 21 / 101:.3f}", f"{0.1 * np.sqrt(21 / 101):.3f}"]
    assert _row(html, "synthetic", "start") == ["starting values"] + ["0.300", f"{START_COMBINED:.3f}"] * 4
    assert "data-replay='baseline'" not in html
    assert _row(html, "flat", "model") == ["flat", "training", "identified", "–", "–", "–", "–", "–", "–",
                                           f"{0.1 * 21 / 101:.3f}", f"{0.1 * np.sqrt(21 / 101):.3f}"]


def test_a_fits_whole_run_scores_are_its_accuracy_tables(baseline_fit):
    """Scoring whole runs, a fit's ``whole run`` window holds each replay's mean xy distance and combined error
    of the accuracy table (`run_metrics` over the same full-rate samples)."""
    doc, _report = baseline_fit
    assert doc["config"]["segment"] is None
    for r in doc["runs"]:
        whole = r["segment_scores"]["whole run"]
        for who, key in (("model", "metrics_identified"), ("start", "metrics_initial"),
                         ("baseline", "metrics_baseline")):
            for k in ("mean_xy", "combined"):
                assert whole[who][k] == pytest.approx(r[key][k], rel=1e-9, abs=1e-12), (r["name"], who, k)
