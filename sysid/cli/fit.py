"""``sysid fit``: identify parameters on training runs, evaluate held-out runs, write parameters + report.

The work is `sysid.app.pipeline.run_fit`; this module parses the flags, checks the outputs before
any work and prints the summary of the results document.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from ingest.clikit import deprecated_alias, folder_problem, positive_float, positive_int, show_progress
from sysid.app.findings import terminal_text as odometry_terminal_text
from sysid.app.results import FitResults, as_results
from sysid.cli import common
from sysid.cli.common import fmt
from sysid.errors import ConfigError


def add_parser(subparsers: common.Subparsers) -> argparse.ArgumentParser:
    """Add ``fit`` to the ``sysid`` command's subparsers; returns its parser."""
    fit = subparsers.add_parser(
        "fit",
        help="identify parameters on training runs, evaluate held-out runs, write parameters + report",
        description="Ingest the runs, calibrate the wheel-command scale on the flat cruise segment, fit the free "
        "parameters (bounded Gauss-Newton/LM or Adam) on the training runs, evaluate the held-out runs, sweep "
        "the timestep, then write models/<robot>/params-<date>.yaml, the results JSON and the HTML report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  sysid fit --config examples/fit.yaml\n"
        "  sysid fit --config examples/helhest-real.yaml        # four real runs: writes reports/helhest-real/\n"
        "  sysid fit --config examples/helhest-real.yaml --simulator kinematic -o reports/real-kinematic\n"
        "  sysid fit --train datasets/pallet-sample/run_13 --train datasets/pallet-sample/run_07 "
        "--held-out datasets/pallet-sample/run_10 --simulator kinematic -o out/kinematic -q",
    )
    common.add_common(fit)
    d = fit.add_argument_group("data")
    d.add_argument(
        "--train",
        action="append",
        metavar="PATH",
        help="training run: bag, run cache, JSON run file (the helhest-real format), folder or glob "
             "(repeatable; replaces the config's list)",
    )
    d.add_argument("--held-out", action="append", metavar="PATH", help="held-out run (repeatable)")
    d.add_argument("--manifest", metavar="MANIFEST", help="dataset manifest with train/held_out split")
    o = fit.add_argument_group("optimisation")
    o.add_argument("--optimizer", choices=("lm", "adam"), help="lm: bounded Gauss-Newton/LM (default); adam")
    o.add_argument("--max-iter", type=positive_int, metavar="N",
                   help="LM: max residual evaluations; Adam: steps; >= 1 (default 50)")
    o.add_argument("--lr", type=positive_float, metavar="RATE",
                   help="Adam learning rate in normalised parameter units, > 0 (default 0.03)")
    o.add_argument("--starts", type=positive_int, metavar="N",
                   help="start points evaluated in one batch before the fit "
                   "(fit.starts; default 1: the nominals)")
    common.add_workers(o, "start batches and refinement fits as Ray tasks when the starts exceed one batch "
                "(fit.starts > fit.starts.per_batch + 1) and the sweep's timesteps (fit.workers; default 1: "
                "serial)")
    o.add_argument("--free", action="append", metavar="NAME", help="unfreeze a parameter (repeatable)")
    o.add_argument("--freeze", action="append", metavar="NAME", help="freeze a parameter at its nominal")
    o.add_argument("--set", action="append", type=common.assignment, metavar="NAME=VALUE", help="set a nominal value")
    o.add_argument("--no-calibration", action="store_true", help="skip the cruise command-scale calibration")
    o.add_argument("--no-sweep", action="store_true", help="skip the timestep sweep")
    o.add_argument("--no-baseline", action="store_true",
                   help="do not fit the kinematic baseline on the training runs (fit.baseline: false); by default "
                   "it is fitted and scored beside the model on the same runs")
    o.add_argument("--sweep-dts", type=common.dts, metavar="H1,H2,...", help="timesteps [s] of the sweep")
    w = fit.add_argument_group("outputs (relative paths: to the current folder)")
    w.add_argument("--output", "-o", metavar="DIR",
                   help="write all three outputs into DIR: DIR/params.yaml, DIR/report.html, DIR/report.json "
                   "(each --*-out below wins for its file)")
    w.add_argument(
        "--params-out",
        metavar="PATH",
        help="identified parameters (default models/<robot>/params-<date>.yaml)",
    )
    w.add_argument("--force", action="store_true",
                   help="replace today's models/<robot>/params-<date>.yaml; without it a second fit on the same "
                   "day writes params-<date>-2.yaml (then -3, ...)")
    w.add_argument("--report-out", dest="report", metavar="PATH",
                   help="HTML report (default reports/fit-<robot>-<date>.html)")
    w.add_argument("--results-out", dest="results", metavar="PATH",
                   help="results JSON for `sysid report` (default: the report with .json)")
    deprecated_alias(w, "--report", dest="report", metavar="PATH")  # before the one output convention
    deprecated_alias(w, "--results", dest="results", metavar="PATH")
    fit.set_defaults(func=run)
    return fit


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid fit``: check the outputs, run the pipeline, print the summary."""
    from sysid.app.pipeline import run_fit

    if args.output is not None:
        problem = folder_problem(args.output, "-o/--output")
        if problem:
            raise ConfigError(problem)
    common.check_outputs(("--params-out", args.params_out), ("--report-out", args.report),
                         ("--results-out", args.results))
    cfg = common.merged_config(args)
    if cfg.output.params is None:  # the dated default never silently replaces an earlier fit of the same day
        from sysid.fit.params import default_params_path

        cfg.output.params = str(common.unused_path(default_params_path(cfg.robot_name()), force=args.force))
        common.check_outputs(("the parameter file", cfg.output.params))
    common.quiet_warp()
    doc = run_fit(cfg, progress=show_progress(args.quiet))
    print_fit(doc)
    return 0


def fit_warnings(doc: FitResults | Mapping[str, Any]) -> list[str]:
    """Every warning of a fit's results, as the report lists them: the fit's, the kinematic
    baseline's, and the report's missed-climb check (a replay that does not climb what the
    odometry climbs)."""
    from sysid.app.run_figure import climb_warnings

    res = as_results(doc)
    return res.warnings() + climb_warnings(res.runs)


def sweep_line(sweep: Mapping[str, Any]) -> str:
    """The timestep sweep's plateau in one line; a plateau that runs to the sweep's largest timestep
    is said to be the sweep's edge, not a largest usable h."""
    lo, hi = sweep["plateau"]
    dts = [float(d) for d in sweep.get("dts") or []]
    if dts and hi >= max(dts):
        return (f"timestep plateau: {lo:g} s .. {hi:g} s, the sweep's largest timestep: the largest usable h "
                f"is {hi:g} s or more (add larger sweep.dts to find it)")
    return f"timestep plateau: {lo:g} s .. {hi:g} s (largest usable h = {hi:g} s)"


def print_fit(doc: FitResults | Mapping[str, Any]) -> None:
    """The summary of a fit on stdout (warnings and odometry findings on stderr)."""
    res = as_results(doc)
    out = sys.stdout
    print(f"simulator: {res.simulator.name} ({res.simulator.label}), dt = {res.config['dt']} s", file=out)
    width = max(14, *(len(p["name"]) + 2 for p in res.parameters)) if res.parameters else 14
    print(f"{'parameter':<{width}}{'initial':>11}{'identified':>12}{'95% CI':>34}{'bounds':>18}  "
          "determined by these runs / note", file=out)
    for p in res.parameters:
        print(
            f"{p['name']:<{width}}{fmt(p['initial']):>11}{fmt(p['value']):>12}{interval_cell(p):>34}"
            f"{'[' + fmt(p['lower']) + ', ' + fmt(p['upper']) + ']':>18}  {parameter_note(p, out.isatty())}",
            file=out,
        )
    weakest = res.fit.get("weakest")
    if weakest and len(weakest.get("direction") or {}) > 1:
        from sysid.fit.identifiability import combination_text

        half = weakest.get("half_width")
        print(f"least-determined combination: [{combination_text(weakest)}], 95 % interval "
              + ("unbounded" if half is None else f"+/-{half:.2g}") + " along it (each bound range = 1)", file=out)
    fit = res.fit
    print(
        f"loss {fmt(fit['loss_initial'])} -> {fmt(fit['loss_final'])} m^2 in {fit['iterations']} evaluations "
        f"({fit['optimizer']}, {fmt(fit['wall_time'], '.1f')} s): {fit['message']}",
        file=out,
    )
    for w in fit_warnings(res):
        print(f"warning: {w}", file=sys.stderr)
    if res.odometry_findings:  # the odometry's lag and jumps: one table, not a warning per run
        print(odometry_terminal_text(res.odometry_findings), file=sys.stderr)
    for r in res.runs:
        m0, m1, mb = r["metrics_initial"], r["metrics_identified"], r.get("metrics_baseline")
        print(
            f"  {r['split']:<9}{r['name']:<40} combined {fmt(m0['combined'], '.3f')} (start) -> "
            f"{fmt(m1['combined'], '.3f')} m"
            + (f" (kinematic {fmt(mb['combined'], '.3f')})" if mb else "")
            + f"   mean xy {fmt(m1['mean_xy'], '.3f')} m{common.solver_note(r.get('solver'))}",
            file=out,
        )
    for split, s in res.summary.items():
        print(
            f"mean {split}: combined {fmt(s['combined']['identified'], '.3f')} m (start "
            f"{fmt(s['combined']['initial'], '.3f')}), mean xy {fmt(s['mean_xy']['identified'], '.3f')} m (start "
            f"{fmt(s['mean_xy']['initial'], '.3f')})",
            file=out,
        )
    print_generalisation(res, out)
    if res.sweep and res.sweep.get("plateau"):
        print(sweep_line(res.sweep), file=out)
    print(f"wrote {res.outputs.params}\nwrote {res.outputs.report}", file=out)


def interval_cell(p: Mapping[str, Any]) -> str:
    """A parameter row's 95 % interval as the data give it, an end that reaches a bound marked
    ``(bound)`` (``sysid.fit.identifiability.interval_text``); '-' for a frozen parameter."""
    from sysid.fit.identifiability import interval_text

    iv, ci95 = p.get("interval"), p.get("ci95")
    if iv is not None:
        return interval_text(iv[0], iv[1], p["lower"], p["upper"])
    if ci95:  # a calibrated parameter, or results written before the identifiability record
        return interval_text(ci95[0], ci95[1], p["lower"], p["upper"])
    return "-"


def parameter_note(p: Mapping[str, Any], color: bool = False) -> str:
    """A parameter row's status: whether the runs determine it, its prior, calibrated or frozen, its
    truth; ``color``: "not determined" without a prior in red (ANSI; a terminal)."""
    note = "calibrated" if p["calibrated"] else ("frozen" if p["frozen"] else (p.get("determined") or ""))
    prior = p.get("prior")
    if prior and not p["frozen"]:
        note += f", prior N({fmt(prior['mean'])}, {fmt(prior['std'])}^2)"
    if color and p.get("determined") == "not determined" and not prior:
        note = f"\033[31m{note}\033[0m"  # the warning on stderr names the remedies
    if p.get("truth") is not None:
        note += f" truth {fmt(p['truth'])}"
    return note


def print_generalisation(res: FitResults, out: TextIO) -> None:
    """Per held-out (and training) run, mean over its pieces: the model beside its starting values
    and the kinematic baseline."""
    gen: Mapping[str, Any] = res.generalisation or {}
    base: Mapping[str, Any] = res.baseline or {}
    if base.get("status") == "fitted":
        vals = ", ".join(f"{p['name']} {fmt(p['value'])}" for p in base.get("parameters") or [] if not p["frozen"]
                         or p.get("calibrated"))
        print(f"kinematic baseline fitted on the same training runs (dt = {base['dt']:g} s): {vals}", file=out)
    elif base.get("reason"):
        print(f"kinematic baseline {base['reason']}", file=out)
    for split, what in (("held_out", "held-out"), ("train", "training")):
        block = gen.get(split)
        if not block:
            continue
        who = [w for w in ("model", "start", "baseline") if w in block["mean_over_runs"]]
        heads = {"model": "identified", "start": "starting values", "baseline": "kinematic baseline"}
        print(f"{what} runs{' (in-sample)' if split == 'train' else ''}, mean over each run's pieces: "
              "mean xy / combined [m]"
              + (f" ({' | '.join(heads[w] for w in who)})" if len(who) > 1 else ""), file=out)
        rows = [(f"{r['run']} ({len(r['pieces'])} piece{'s' if len(r['pieces']) != 1 else ''})", r)
                for r in block["runs"]]
        rows += [(f"mean over {block['n_runs']} run{'s' if block['n_runs'] != 1 else ''}", block["mean_over_runs"]),
                 (f"mean over {block['n_pieces']} piece{'s' if block['n_pieces'] != 1 else ''}",
                  block["mean_over_pieces"])]
        for label, r in rows:
            cells = [f"{fmt(r[w]['mean_xy'], '.3f')} / {fmt(r[w]['combined'], '.3f')}" for w in who]
            print(f"  {label:<48}" + "  |  ".join(cells), file=out)
        if block.get("verdict"):
            print(f"  {block['verdict']}", file=out)
