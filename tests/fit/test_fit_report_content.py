"""What the report says (issue 20, point 5): pieces are called pieces and every run gets its mean over
its pieces, every parameter has a unit, the run figures' segment bands have a legend, flat-ground z
panels span at least 5 cm, wide tables scroll, a sweep plateau that reaches the sweep's edge is said
to be the edge, a run whose replay misses the pallet climb its odometry makes is flagged, and the
ESS intervals are described as such."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

import sysid.app.report as report
import sysid.app.run_figure as run_figure
from sysid.app.report import render_report
from sysid.fit.params import DEFAULT_SPECS, EXTRA_UNITS, unit_of
from sysid.simulators import kinematic
from sysid.simulators import ostrich as replay
from tests.helpers.report_fixtures import fit_with_pieces


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit_with_pieces(tmp_path_factory.mktemp("report-content"))


def _table(html: str, name: str) -> str:
    m = re.search(rf"<table data-table='{name}'>.*?</table>", html, re.S)
    assert m, f"no table {name!r}"
    return m.group(0)


def _cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def test_pieces_are_called_pieces_and_each_run_has_its_mean(fitted):
    doc, path = fitted
    html = path.read_text()
    assert "<h2>Held-out pieces</h2>" in html and "3 pieces of 1 held-out run" in html
    assert "<h2>Training pieces (6 pieces of 2 runs)" in html
    assert "<th class='l'>piece</th>" in _table(html, "pieces")
    assert "<h2>Pieces</h2>" in html and "<h2>Held-out runs</h2>" not in html
    per_run = _table(html, "per-run")
    for parent in ("held-0-slalom", "train-0-turn", "train-1-accel"):
        pieces = [r for r in doc["runs"] if r["run"] == parent]
        row = re.search(rf"<tr data-run='{re.escape(parent)}'>.*?</tr>", per_run).group(0)
        cells = _cells(row)
        assert cells[2] == str(len(pieces)) == "3"
        # identified, then the starting values' combined and mean xy, then the identified's other scores
        for col, field, key in ((3, "metrics_identified", "combined"), (4, "metrics_identified", "mean_xy"),
                                (5, "metrics_initial", "combined"), (6, "metrics_initial", "mean_xy"),
                                (7, "metrics_identified", "final_xy"), (8, "metrics_identified", "yaw_rmse")):
            assert float(cells[col]) == pytest.approx(np.mean([p[field][key] for p in pieces]), abs=6e-5), key


def test_a_report_without_pieces_has_no_per_run_table(fitted):
    doc, _ = fitted
    whole = copy.deepcopy(doc)
    whole["config"]["split"] = None
    seen = set()
    whole["runs"] = [r for r in whole["runs"] if not (r["run"] in seen or seen.add(r["run"]))]
    for r in whole["runs"]:
        r["name"] = r["run"]
    html = render_report(whole)
    assert "data-table='per-run'" not in html and "<h2>Held-out runs</h2>" in html
    assert "<th class='l'>run</th>" in _table(html, "runs")


def test_every_parameter_has_a_unit():
    for name in set(replay.PARAMETERS) | set(kinematic.PARAMETERS):
        assert unit_of(name), f"no unit for {name}"
    assert unit_of("slip_speed") == "m/s" and unit_of("slip_ratio") == "1" and unit_of("cmd_delay") == "s"
    assert unit_of("slip_speed_lat") == "m/s" and unit_of("kp") == "N m s/rad" and unit_of("mu") == "1"
    assert not set(EXTRA_UNITS) & set(DEFAULT_SPECS)  # the extras stay out of the default parameters


def test_report_shows_units_also_for_results_without_them(fitted):
    doc, _ = fitted
    old = copy.deepcopy(doc)
    row = dict(old["parameters"][0], name="slip_ratio", unit="", value=1.7, initial=1.0, lower=0.0, upper=5.0)
    old["parameters"] = [dict(r, unit="") for r in old["parameters"]] + [dict(row), dict(row, name="slip_speed")]
    html = render_report(old)
    units = dict(re.findall(r"<td class='l'><b>(\w+)</b></td><td>([^<]*)</td>", html))
    assert units["slip_ratio"] == "1" and units["slip_speed"] == "m/s" and units["kp"] == "N m s/rad"
    assert all(u and u != "–" for u in units.values()), units


def test_segment_bands_have_a_legend(fitted):
    doc, path = fitted
    html = path.read_text()
    # each run figure's time panels: the cruise band (the fixture's runs have a cruise segment) in a legend
    figs = re.findall(r'<figure class="fig" data-fig="run-[^"]*">.*?</figure>', html, re.S)
    assert len(figs) == len(doc["runs"])
    for run, fig in zip(doc["runs"], figs, strict=True):
        assert ("cruise segment" in fig) == ("cruise" in run["segments"]), run["name"]
    assert sum("cruise" in r["segments"] for r in doc["runs"]) >= 3
    assert "Time panels:" in html and "cruise segment (the calibration" in html


def _capture_run_figure(run, monkeypatch):
    figs = []
    monkeypatch.setattr(run_figure, "svg", lambda fig, salt: figs.append(fig) or "<svg></svg>")
    run_figure.run_figure(run, 0)
    return figs[0]


def test_flat_ground_z_panel_spans_at_least_5_cm(fitted, monkeypatch):
    doc, _ = fitted
    run = copy.deepcopy(doc["runs"][0])
    n = len(run["t"])
    for key in ("measured", "sim_initial", "sim_identified"):
        run[key]["z"] = list(0.36 + 1e-4 * np.sin(np.arange(n) + len(key)))  # 0.1 mm of noise on flat ground
    fig = _capture_run_figure(run, monkeypatch)
    ax_z = next(ax for ax in fig.axes if ax.get_ylabel() == "z [m]")
    lo, hi = ax_z.get_ylim()
    assert hi - lo == pytest.approx(report.MIN_Z_SPAN) and lo < 0.36 < hi
    run["measured"]["z"] = list(0.36 + np.linspace(0, 0.144, n))  # a climb keeps its own scale
    fig = _capture_run_figure(run, monkeypatch)
    ax_z = next(ax for ax in fig.axes if ax.get_ylabel() == "z [m]")
    assert ax_z.get_ylim()[1] - ax_z.get_ylim()[0] > 0.144


def test_wide_tables_scroll(fitted):
    _, path = fitted
    html = path.read_text()
    for name in ("runs", "pieces", "per-run", "sweep"):
        assert f"<div class='scroll'><table data-table='{name}'>" in html, name
    assert ".scroll { overflow-x: auto;" in html


def test_sweep_edge_is_said_to_be_the_edge(fitted):
    doc, path = fitted
    assert doc["sweep"]["plateau"][1] == max(doc["sweep"]["dts"])
    html = path.read_text()
    finding = re.search(r"<p data-sweep='(\w+)'>(.*?)</p>", html).groups()
    assert finding[0] == "edge" and "edge of the sweep" in finding[1] and "not found here" in finding[1]
    inside = dict(doc["sweep"], dts=[0.02, 0.05, 0.1], errors=[0.05, 0.05, 1.0], plateau=[0.02, 0.05])
    assert "the largest usable timestep is 0.05 s" in report.sweep_finding(inside)
    assert "data-sweep='none'" in report.sweep_finding(dict(inside, plateau=None))


def test_a_run_that_misses_the_climb_is_flagged(fitted):
    doc, _ = fitted
    d = copy.deepcopy(doc)
    n = len(d["runs"][0]["t"])
    climb = list(np.clip(np.linspace(-0.1, 0.3, n), 0, 0.144))
    d["runs"][0]["measured"]["z"] = climb  # a training piece: the odometry climbs 0.144 m ...
    d["runs"][0]["sim_identified"]["z"] = list(0.45 * np.asarray(climb))  # ... the replay 0.065 m
    held = next(r for r in d["runs"] if r["split"] == "held_out")
    held["measured"]["z"] = climb  # a held-out piece that climbs in both
    held["sim_identified"]["z"] = list(0.9 * np.asarray(climb))
    for r in (d["runs"][0], held):
        r["segments"] = {**(r.get("segments") or {}), "climb": [r["t"][len(r["t"]) // 2], r["t"][-1]]}
    drifting = d["runs"][1] if d["runs"][1] is not held else d["runs"][2]
    drifting["measured"]["z"] = list(np.linspace(0.0, 0.06, len(drifting["t"])))  # flat ground, z drifting 6 cm
    drifting["segments"] = {k: v for k, v in (drifting.get("segments") or {}).items() if k != "climb"}
    html = render_report(d)
    name = d["runs"][0]["name"]
    warn = [w for w in re.findall(r"<div class='warn'>(.*?)</div>", html) if "does not climb" in w]
    assert len(warn) == 1 and warn[0].startswith(f"training run {report.esc(name)} does not climb the pallet"), warn
    assert "rises 0.065 m at the identified parameters, the odometry 0.144 m" in warn[0]
    assert html.count("data-climb='missed'") == 1
    assert "does not climb" not in render_report(doc)  # flat runs: nothing to flag


def test_ess_intervals_are_described(fitted):
    doc, path = fitted
    assert doc["fit"]["options"]["intervals"] == "ess"
    html = path.read_text()
    cap = re.search(r"<p class='muted' data-intervals='ess'>(.*?)</p>", html).group(1)
    assert "effective sample size" in cap and f"{doc['fit']['n_eff']:.3g}" in cap and "marked (bound)" in cap
    iid = copy.deepcopy(doc)
    iid["fit"]["options"]["intervals"] = "iid"
    assert "lower bound on the uncertainty" in render_report(iid)


def test_cli_sweep_line_says_edge():
    """The command line's sweep line: a plateau ending at the sweep's largest timestep is its edge
    (the largest usable h lies at or beyond it), one ending inside is the largest usable h."""
    from sysid.cli.fit import sweep_line

    edge = sweep_line({"plateau": [0.025, 0.2], "dts": [0.025, 0.05, 0.1, 0.2]})
    inside = sweep_line({"plateau": [0.025, 0.1], "dts": [0.025, 0.05, 0.1, 0.2]})
    assert "0.2 s or more" in edge and "largest usable h = " not in edge
    assert "largest usable h = 0.1 s" in inside


def test_cli_warnings_include_the_missed_climb():
    """sysid fit's printed warnings (cli.fit_warnings) hold the report's missed-climb check: a run
    whose odometry rises 0.15 m while its replay rises 0.06 m is named; one that climbs is not."""
    from sysid.cli.fit import fit_warnings

    t = [0.0, 1.0, 2.0]

    def run(name, z_sim):
        return {"name": name, "split": "train", "measured": {"t": t, "z": [0.0, 0.15, 0.15]},
                "sim_identified": {"t": t, "z": z_sim}}

    doc = {"fit": {"warnings": ["w1"]}, "baseline": {"fit": {"warnings": ["w2"]}},
           "runs": [run("run_x", [0.0, 0.06, 0.06]), run("run_y", [0.0, 0.14, 0.15])]}
    out = fit_warnings(doc)
    assert out[:2] == ["w1", "kinematic baseline: w2"]
    assert len(out) == 3 and "run_x" in out[2] and "run_y" not in out[2]


def test_header_names_the_simulator_options(fitted):
    """What a piece starts from and how the odometry is observed change every figure: the header says so."""
    doc, _ = fitted
    d = copy.deepcopy(doc)
    d["simulator"]["options"] = {"initial_speed": "wheels", "odom_history": "odometry"}
    head = re.search(r"<p class='muted'>simulator (.*?)</p>", render_report(d)).group(1)
    assert "with initial_speed wheels, odom_history odometry, timestep" in head, head
    d["simulator"]["options"] = {}
    assert " with " not in re.search(r"<p class='muted'>simulator (.*?)</p>", render_report(d)).group(1)
