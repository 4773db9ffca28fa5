"""The odometry's lag and jumps as one table (issue 20, point 6): the real example used to print nine
long warnings (four lagging runs, five pieces with jumps) and repeat each as a box in the report; now
`sysid fit` / `evaluate` / `sweep-dt` print one warning line with one table below it (run, split,
kind, time, size, action), and the report shows one table."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from sysid.app import findings
from sysid.app.config import FitConfig
from sysid.app.sources import expand_sources

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT.parent / "shared" / "data" / "helhest-real"

LAG = {"split": "train", "run": "right_turn_a", "piece": None, "kind": "lag", "action": "scored",
       "speed_lag_s": 0.83, "heading_lag_s": 0.06, "text": "train run 'right_turn_a': its odometry speed trails ..."}
JUMPS = {"split": "held_out", "run": "09_57_51", "piece": "09_57_51[11.5-23.0 s]", "kind": "jumps", "action": "scored",
         "times_s": [12.07, 12.77, 13.53, 16.49], "max_step_m": 0.43, "max_accel": 174.2, "text": "held_out run ..."}


def test_cells_and_summary() -> None:
    assert findings.cells(LAG) == ("right_turn_a", "train", "lag", "whole run", "speed 0.83 s, heading 0.06 s late",
                                   "scored")
    assert findings.cells(JUMPS) == ("09_57_51[11.5-23.0 s]", "held-out", "jumps", "12.07 .. 16.49 s",
                                     "4 jumps <= 0.43 m (174 m/s^2)", "scored")
    assert findings.cells(JUMPS, every_time=True)[3] == "12.07, 12.77, 13.53, 16.49 s"
    assert findings.summary([LAG, JUMPS]) == ("odometry lag in 1 run, jumps in 1 piece; not modelled, scored as "
                                              "logged (--odometry-jumps drop leaves out pieces with jumps)")
    dropped = {**JUMPS, "action": "dropped"}
    assert "jumps in 1 piece (1 left out); not modelled; the pieces with jumps are left out" in findings.summary(
        [dropped])
    assert findings.terminal_text([]) == ""
    # a config that fits odom_delay models the lag: said once, and only the jumps stay unmodelled
    lag_m = {**LAG, "action": "modelled"}
    assert findings.cells(lag_m)[5] == "modelled"
    assert findings.summary([lag_m, JUMPS]) == ("odometry lag in 1 run (modelled: odom_delay), jumps in 1 piece; "
                                                "jumps not modelled, scored as logged (--odometry-jumps drop leaves "
                                                "out pieces with jumps)")
    assert findings.summary([lag_m]) == "odometry lag in 1 run (modelled: odom_delay)"
    assert findings.summary([LAG]) == "odometry lag in 1 run; not modelled, scored as logged (fit odom_delay to " \
                                      "model the lag)"


def test_terminal_text_is_one_warning_and_an_aligned_table() -> None:
    lines = findings.terminal_text([LAG, JUMPS, LAG]).splitlines()
    assert len(lines) == 1 + 1 + 3 and lines[0].startswith("warning: odometry lag in 2 runs")
    assert sum(line.startswith("warning:") for line in lines) == 1
    header = lines[1]
    for col in findings.COLUMNS:
        assert col in header
    starts = [header.index(c) for c in findings.COLUMNS]
    for row in lines[2:]:  # every column starts where its header does
        assert all(row[s - 1] == " " for s in starts[1:]), row


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/helhest-real is absent")
def test_real_example_gives_one_table_of_nine_rows() -> None:
    """examples/helhest-real.yaml's four runs cut into 10 s pieces (loading only, no fit): four runs
    lag (~1 s) and five pieces jump; one warning line, nine table rows, none of them long."""
    from sysid.app.runs import load_runs, screen_odometry

    cfg = FitConfig.from_file(ROOT / "examples" / "helhest-real.yaml")
    train = load_runs(cfg, expand_sources(cfg, cfg.data.train, "train"), "train", progress=False)
    held = load_runs(cfg, expand_sources(cfg, cfg.data.held_out, "held"), "held-out", progress=False)
    found = screen_odometry(cfg, train, "train")[2] + screen_odometry(cfg, held, "held_out", required=False)[2]
    kinds = [f["kind"] for f in found]
    assert kinds.count("lag") == 4 and kinds.count("jumps") == 5, kinds
    text = findings.terminal_text(found)
    lines = text.splitlines()
    assert len(lines) == 11 and text.count("warning:") == 1
    assert lines[0] == ("warning: odometry lag in 4 runs (modelled: odom_delay), jumps in 5 pieces; jumps not "
                        "modelled, scored as logged (--odometry-jumps drop leaves out pieces with jumps):")
    assert max(len(line) for line in lines[1:]) <= 130, text
    assert re.search(r"helhest_2026_04_13-09_55_01\[18\.4-27\.6 s\] +train +jumps +18\.46 \.\. 23\.85 s +6 jumps <= "
                     r"0\.51 m \(205 m/s\^2\) +scored", text), text
    assert re.search(r"left_circle +train +lag +whole run +speed 1\.06 s, heading 0\.01 s late +modelled", text), text
    jumped = next(f for f in found if f.get("piece") == "helhest_2026_04_13-09_55_01[9.2-18.4 s]")
    assert jumped["run"] == "helhest_2026_04_13-09_55_01" and len(jumped["times_s"]) == 7


def test_report_and_cli_show_one_table_not_a_box_per_run(tmp_path: Path) -> None:
    """A results document with the findings: the report has one findings table (a row each, every
    jump time listed) under one warning box, and no box per run; `sysid fit`'s printout the same."""
    from sysid.app.report import render_report
    from sysid.cli.fit import print_fit
    from tests.helpers.report_fixtures import fit_with_pieces

    doc, _ = fit_with_pieces(tmp_path)  # a kinematic fit of seconds
    doc["odometry_findings"] = [LAG, JUMPS, {**JUMPS, "piece": "09_57_51[0.0-11.5 s]", "times_s": [10.25]}]
    html = render_report(doc)
    assert html.count("data-table='odometry-findings'") == 1
    table = html[html.index("data-table='odometry-findings'"):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 1 + 3
    assert "12.07, 12.77, 13.53, 16.49 s" in table and "09_57_51[0.0-11.5 s]" in table
    boxes = re.findall(r"<div class='warn'[^>]*>(.*?)</div>", html)
    assert sum(b.startswith("odometry ") for b in boxes) == 1, boxes
    assert not any("trails the wheels" in b or "odometry jump(s)" in b for b in boxes)

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        print_fit(doc)
    err_lines = err.getvalue().splitlines()
    odo = [line for line in err_lines if line.startswith("warning: odometry")]
    assert len(odo) == 1 and odo[0].startswith("warning: odometry lag in 1 run, jumps in 2 pieces")
    assert sum(bool(re.match(r"  (right_turn_a|09_57_51\[)", line)) for line in err_lines) == 3
