"""``sysid evaluate``: the held-out error of a parameter file on runs (`sysid.app.evaluate.run_evaluate`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from sysid.app.findings import summary as odometry_summary
from sysid.app.findings import terminal_text as odometry_terminal_text
from sysid.cli import common
from sysid.cli.common import fmt


def add_parser(subparsers: common.Subparsers) -> argparse.ArgumentParser:
    """Add ``evaluate`` to the ``sysid`` command's subparsers; returns its parser."""
    ev = common.add_replay_parser(
        subparsers,
        "evaluate",
        run,
        params="parameter file from `sysid fit`",
        runs="runs to evaluate (repeatable)",
        required=True,
        help="held-out error of a parameter file on runs",
        description="Replay runs open-loop at the parameters of a file written by `sysid fit` and print the "
        "combined error, mean xy distance and yaw RMSE per run (runs: --runs, else the config's held-out runs), "
        "beside the mean xy distance of the same simulator at the config's starting values and of the kinematic "
        "baseline the fit scored beside it (its parameters are in the file's metadata), with the verdict.",
        epilog="examples:\n  sysid evaluate --config examples/fit.yaml "
        "--params models/helhest/params-pallet-sample.yaml "
        "-o out/eval.json\n  sysid evaluate -c examples/helhest-real.yaml -p reports/helhest-real/params.yaml "
        "--runs ../shared/data/helhest-real/left_circle.json   # after sysid fit -c examples/helhest-real.yaml",
    )
    common.add_json_output(ev, "METRICS.JSON", "the metrics")
    return ev


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid evaluate``: print the per-run table (and write it as JSON with -o)."""
    from sysid.app.evaluate import run_evaluate

    res = common.replay(args, run_evaluate)
    has_b = "mean_baseline" in res
    print(f"{'run':<44}{'combined [m]':>13}{'mean xy [m]':>13}{'yaw RMSE [rad]':>16}"
          f"{'mean xy, start [m]':>20}" + (f"{'mean xy, kinematic [m]':>24}" if has_b else ""))

    def extra(start: Mapping[str, Any], base: Mapping[str, Any] | None) -> str:
        out = f"{fmt(start['mean_xy'], '.4f'):>20}"
        return out + (f"{fmt((base or {}).get('mean_xy'), '.4f'):>24}" if has_b else "")

    for r in res["runs"]:
        print(
            f"{r['name']:<44}{fmt(r['combined'], '.4f'):>13}{fmt(r['mean_xy'], '.4f'):>13}"
            f"{fmt(r['yaw_rmse'], '.4f'):>16}{extra(r['start'], r.get('baseline'))}"
            f"{common.solver_note(r.get('solver'))}"
        )
    findings = res.get("odometry_findings")
    for w in res.get("warnings") or []:  # what ingest and the replays found (the findings: one table below)
        if not findings or w != odometry_summary(findings):
            print(f"warning: {w}", file=sys.stderr)
    if findings:
        print(odometry_terminal_text(findings), file=sys.stderr)
    m = res["mean"]
    print(
        f"{'mean':<44}{fmt(m['combined'], '.4f'):>13}{fmt(m['mean_xy'], '.4f'):>13}{fmt(m['yaw_rmse'], '.4f'):>16}"
        f"{extra(res['mean_start'], res.get('mean_baseline'))}"
    )
    block = res["per_run"]
    if block["n_pieces"] != block["n_runs"]:  # pieces: the mean over each run's pieces, each run once
        mr = block["mean_over_runs"]
        label = f"mean over {block['n_runs']} runs"
        print(f"{label:<44}{fmt(mr['model']['combined'], '.4f'):>13}{fmt(mr['model']['mean_xy'], '.4f'):>13}"
              f"{'':>16}{extra(mr['start'], mr.get('baseline'))}")
    if res.get("baseline_skipped"):
        print(f"kinematic baseline: {res['baseline_skipped']}")
    if res.get("verdict"):
        print(res["verdict"])
    common.write_json(args.output, res)
    return 0
