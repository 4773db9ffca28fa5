"""The typed results document (`sysid.app.results.FitResults`): what the pipeline produces is what
the results JSON holds, keys in the written order; reading the JSON back gives the same document."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from sysid.app.results import KEYS, FitResults, as_results, load_results
from tests.helpers.report_fixtures import fit_with_pieces


def test_results_json_round_trips_through_the_typed_document(tmp_path: Path) -> None:
    doc, report = fit_with_pieces(tmp_path)
    assert tuple(doc) == KEYS
    res = load_results(report.with_suffix(".json"))
    assert isinstance(res, FitResults)
    assert json.dumps(res.to_dict()) == json.dumps(doc)  # same keys, same order, same values
    assert res.simulator.name == doc["simulator"]["name"] == "kinematic"
    assert res.outputs.params == doc["outputs"]["params"] and res.outputs.results == doc["outputs"]["results"]
    assert [r["name"] for r in res.runs_of("held_out")] == [r["name"] for r in doc["runs"] if r["split"] == "held_out"]
    assert dict(res) == doc and res["runs"] is res.runs  # it reads as the JSON's mapping too


def test_an_earlier_results_file_reads_with_empty_sections(tmp_path: Path) -> None:
    doc, _ = fit_with_pieces(tmp_path)
    old = copy.deepcopy(doc)
    for key in ("generalisation", "baseline", "odometry_findings", "nuisance", "timing", "sweep"):
        old.pop(key)
    res = as_results(old)
    assert res.generalisation is None and res.baseline is None and res.sweep is None
    assert res.odometry_findings == [] and res.nuisance == [] and res.timing == {}
    assert res.parameters == doc["parameters"] and as_results(res) is res
