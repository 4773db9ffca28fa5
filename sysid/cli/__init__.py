"""The ``sysid`` command line: fit / evaluate / sweep-dt / report / synth.

Every subcommand takes ``--config fit.yaml``; flags (kebab-case) are merged over the file and win.
User errors (bad config, missing files, unknown parameters, ...) print ``error: <message>`` and
exit with status 2 before any computation; Ctrl-C exits with 130 and leaves no half-written
output (every file is written to a temp file and renamed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ingest.clikit import (
    Parser,
    deprecated_alias,
    folder_problem,
    nonnegative_float,
    output_problem,
    positive_float,
    positive_int,
    run_guarded,
    show_progress,
)
from sysid import __version__
from sysid.app.findings import terminal_text as odometry_terminal_text
from sysid.errors import ConfigError, SysidError

EPILOG = """examples:
  sysid fit --config examples/fit.yaml
  sysid fit --config examples/fit.yaml --optimizer adam --max-iter 200 -o out/adam
  sysid evaluate --config examples/fit.yaml --params models/helhest/params-2026-12-02.yaml
  sysid sweep-dt --config examples/fit.yaml --params models/helhest/params-2026-12-02.yaml --dts 0.01,0.05,0.1
  sysid report reports/fit-helhest-2026-12-02.json -o report.html
  sysid cv --config examples/helhest-real.yaml -o reports/cv-real

conventions: -c/--config FIT.YAML is the fit config and -o/--output where the command writes (a file, or
a folder for fit / cv / synth; fit's single files: --params-out, --report-out, --results-out), in sysid
and in ingest; -q/--quiet hides progress. Relative paths on the command line are taken from the current
folder; in a config, inputs from the config's folder and outputs from the current folder.
errors: one line `error: ...`, exit 2, before any work.   docs: docs/fit.md"""


def _dts(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated timesteps in seconds, got {text!r}") from exc
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"timesteps must be finite and > 0, got {text!r}")
    return vals


def _assignment(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.strip() or not math.isfinite(float(value)):
            raise ValueError
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with a finite VALUE (e.g. kp=300), got {text!r}"
        ) from exc


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("configuration")
    g.add_argument("--config", "-c", metavar="FIT.YAML", help="YAML config (see docs/fit.md); flags override it")
    g.add_argument("--robot", metavar="NAME|PATH", help="robot name under models/ or a robot.yaml (default helhest)")
    g.add_argument(
        "--simulator",
        metavar="NAME",
        help="simulator: 'ostrich' (the engine), 'kinematic' (baseline) or 'package.module:factory'",
    )
    g.add_argument("--dt", type=positive_float, metavar="SECONDS", help="simulator timestep [s] (default 0.02)")
    g.add_argument("--segment", metavar="NAME", help="score only this segment of each run (e.g. climb)")
    g.add_argument("--split", type=positive_float, metavar="SECONDS",
                   help="cut every run into pieces of about this length, each replayed from its own start")
    g.add_argument("--odometry-jumps", choices=("report", "drop"), dest="odometry_jumps",
                   help="runs (pieces) whose odometry jumps (implied acceleration > data.odometry_jumps.max_accel, "
                   "default 30 m/s^2): report them (default) or drop them from training and scoring")
    g.add_argument("--topics", metavar="TOPICS.YAML", help="ingest topic map for bags (default: auto-detect)")
    g.add_argument("--lever-arm", type=nonnegative_float, metavar="METRES",
                   help="L of the combined error [m], >= 0 (default 0.5)")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bars (bars are drawn only on a terminal)")


def build_parser(with_synth: bool = False) -> argparse.ArgumentParser:
    parser = Parser(
        prog="sysid",
        description="System identification of a robot on a differentiable simulator: fit physical parameters "
        "(servo gain, wheel friction, command scale, mass) to logged runs by gradients, evaluate them on "
        "held-out runs, and write an HTML report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sysid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    fit = sub.add_parser(
        "fit",
        help="identify parameters on training runs, evaluate held-out runs, write parameters + report",
        description="Ingest the runs, calibrate the wheel-command scale on the flat cruise segment, fit the free "
        "parameters (bounded Gauss-Newton/LM or Adam) on the training runs, evaluate the held-out runs, sweep "
        "the timestep, then write models/<robot>/params-<date>.yaml, the results JSON and the HTML report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  sysid fit --config examples/fit.yaml\n"
        "  sysid fit -c examples/helhest-real.yaml -o reports/real-today --max-iter 10\n"
        "  sysid fit --train runs/a.npz --train runs/b.npz --held-out runs/c.npz --simulator kinematic -q",
    )
    _add_common(fit)
    d = fit.add_argument_group("data")
    d.add_argument(
        "--train",
        action="append",
        metavar="PATH",
        help="training run: bag, run cache, helhest JSON, folder or glob (repeatable; replaces the config's list)",
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
    _add_workers(o, "start batches and refinement fits as Ray tasks when the starts exceed one batch "
                 "(fit.starts > fit.starts.per_batch + 1) and the sweep's timesteps (fit.workers; default 1: "
                 "serial)")
    o.add_argument("--free", action="append", metavar="NAME", help="unfreeze a parameter (repeatable)")
    o.add_argument("--freeze", action="append", metavar="NAME", help="freeze a parameter at its nominal")
    o.add_argument("--set", action="append", type=_assignment, metavar="NAME=VALUE", help="set a nominal value")
    o.add_argument("--no-calibration", action="store_true", help="skip the cruise command-scale calibration")
    o.add_argument("--no-sweep", action="store_true", help="skip the timestep sweep")
    o.add_argument("--no-baseline", action="store_true",
                   help="do not fit the kinematic baseline on the training runs (fit.baseline: false); by default "
                   "it is fitted and scored beside the model on the same runs")
    o.add_argument("--sweep-dts", type=_dts, metavar="H1,H2,...", help="timesteps [s] of the sweep")
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
    fit.set_defaults(func=cmd_fit)

    ev = sub.add_parser(
        "evaluate",
        help="held-out error of a parameter file on runs",
        description="Replay runs open-loop at the parameters of a file written by `sysid fit` and print the "
        "combined error, mean xy distance and yaw RMSE per run (runs: --runs, else the config's held-out runs).",
        epilog="examples:\n  sysid evaluate --config examples/fit.yaml --params models/helhest/params-2026-12-02.yaml "
        "-o out/eval.json\n  sysid evaluate -c examples/helhest-real.yaml -p reports/helhest-real/params.yaml "
        "--runs ../shared/data/helhest-real/left_circle.json",
    )
    _add_common(ev)
    ev.add_argument("--params", "-p", required=True, metavar="PARAMS.YAML", help="parameter file from `sysid fit`")
    ev.add_argument("--runs", action="append", metavar="PATH", help="runs to evaluate (repeatable)")
    ev.add_argument("--output", "-o", metavar="METRICS.JSON", help="also write the metrics as JSON")
    deprecated_alias(ev, "--json", dest="output", metavar="PATH")
    ev.set_defaults(func=cmd_evaluate)

    sw = sub.add_parser(
        "sweep-dt",
        help="held-out error over a timestep grid; find the usable plateau",
        description="Evaluate runs at each timestep and report the plateau: the largest h whose mean combined "
        "error stays within 2x the sweep minimum (paper Fig. 3).",
        epilog="examples:\n  sysid sweep-dt --config examples/fit.yaml --params models/helhest/params-2026-12-02.yaml "
        "--dts 0.01,0.05,0.1\n  sysid sweep-dt -c examples/fit.yaml -o out/sweep.json -q",
    )
    _add_common(sw)
    sw.add_argument("--params", "-p", metavar="PARAMS.YAML", help="parameter file (default: nominal values)")
    sw.add_argument("--runs", action="append", metavar="PATH", help="runs (repeatable; default held-out runs)")
    sw.add_argument("--dts", type=_dts, metavar="H1,H2,...", help="timesteps [s] (default 0.005,...,0.2)")
    _add_workers(sw, "each timestep one Ray task on a local cluster of N CPUs (fit.workers; default 1: serial)")
    sw.add_argument("--output", "-o", metavar="SWEEP.JSON", help="also write the sweep as JSON")
    deprecated_alias(sw, "--json", dest="output", metavar="PATH")
    sw.set_defaults(func=cmd_sweep)

    rp = sub.add_parser(
        "report",
        help="re-render the HTML report from a saved results JSON",
        description="Render the self-contained HTML report from the results JSON that `sysid fit` writes.",
        epilog="examples:\n  sysid report reports/fit-helhest-2026-12-02.json -o report.html\n"
        "  sysid report reports/pallet-sample/report.json   (writes reports/pallet-sample/report.html)",
    )
    rp.add_argument("results", metavar="RESULTS.JSON", help="results file written by `sysid fit`")
    rp.add_argument("--output", "-o", metavar="REPORT.HTML", help="HTML output (default: RESULTS with .html)")
    rp.set_defaults(func=cmd_report)

    from sysid.app.cv import add_cv_parser  # sysid cv: cross-validation (sysid/app/cv.py)

    add_cv_parser(sub)

    from sysid.cli.plan import (
        add_parser as add_plan_parser,  # sysid plan: planning through the model (sysid/plan/control.py)
    )

    add_plan_parser(sub)

    if with_synth:
        try:
            from sysid.synth import cli as synth_cli
        except ImportError as exc:
            _synth_placeholder(sub, f"the synthetic-data generator is not available ({exc})")
        else:
            synth_cli.add_parser(sub)
            if "synth" in sub.choices:
                sub.choices["synth"].set_defaults(func=synth_cli.run)
    else:
        _synth_placeholder(sub, None)
    return parser


def _synth_placeholder(sub: Any, reason: str | None) -> None:
    sp = sub.add_parser("synth", help="generate synthetic pallet bags with MuJoCo (sysid.synth)", add_help=False,
                        epilog="example:\n  sysid synth --preset sample --out data/pallet-sample")
    sp.set_defaults(func=lambda _a: _no_synth(reason))


def _no_synth(reason: str | None) -> int:
    raise SysidError(reason or "the synthetic-data generator (sysid.synth.cli) is not installed yet")


# -- config assembly --------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Any:
    from sysid.app.config import FitConfig, ParamSpec

    cfg = FitConfig.from_file(args.config) if getattr(args, "config", None) else FitConfig()
    over: dict[str, Any] = {
        "robot": args.robot,
        "simulator": args.simulator,
        "dt": args.dt,
        "segment": args.segment,
        "split": args.split,
        "lever_arm": args.lever_arm,
        "jump_action": getattr(args, "odometry_jumps", None),
    }
    if args.topics is not None:
        over["topics"] = str(Path(args.topics).resolve())
    out_dir = getattr(args, "output", None) if getattr(args, "command", None) == "fit" else None
    if out_dir is not None:  # fit -o DIR: the three outputs in DIR unless a --*-out names one
        for key, name in (("params_out", "params.yaml"), ("report", "report.html"), ("results", "report.json")):
            if getattr(args, key, None) is None:
                over[key] = str(Path(out_dir) / name)
    for key in ("optimizer", "max_iter", "lr", "params_out", "report", "results", "manifest"):
        if getattr(args, key, None) is not None:
            over[key] = getattr(args, key)
    if getattr(args, "manifest", None):
        over["manifest"] = str(Path(args.manifest).resolve())
    for key, attr in (("train", "train"), ("held_out", "held_out"), ("runs", "held_out")):
        vals = getattr(args, key, None)
        if vals:
            over[attr] = [str(Path(v).resolve()) for v in vals]
            if key == "runs":
                over["train"] = []
                over["manifest"] = None
    if getattr(args, "no_calibration", False):
        over["calibration"] = False
    if getattr(args, "no_sweep", False):
        over["sweep"] = False
    if getattr(args, "no_baseline", False):
        over["baseline"] = False
    if getattr(args, "sweep_dts", None):
        over["sweep_dts"] = args.sweep_dts
    if getattr(args, "dts", None):
        over["sweep_dts"] = args.dts
    for key in ("workers", "ray_address"):
        if getattr(args, key, None) is not None:
            over[key] = getattr(args, key)
    if getattr(args, "starts", None) is not None:
        import dataclasses

        over["fit_options"] = dataclasses.replace(cfg.fit_options, starts=args.starts)
    cfg = cfg.merged(**over)
    if getattr(args, "ray_address", None) and getattr(args, "workers", None) is None:
        cfg.workers = None  # as many tasks in flight as the cluster has CPUs
    if "manifest" in over and over["manifest"] is None:
        cfg.manifest = None
    both = sorted(set(getattr(args, "free", None) or []) & set(getattr(args, "freeze", None) or []))
    if both:
        raise ConfigError(f"--free and --freeze both name {', '.join(both)}; give each parameter one of them")
    specs = dict(cfg.parameters)
    for name in getattr(args, "free", None) or []:
        specs[name] = _replace_spec(specs.get(name, ParamSpec()), frozen=False)
    for name in getattr(args, "freeze", None) or []:
        specs[name] = _replace_spec(specs.get(name, ParamSpec()), frozen=True)
    for name, value in getattr(args, "set", None) or []:
        specs[name] = _replace_spec(specs.get(name, ParamSpec()), nominal=value)
    cfg.parameters = specs
    return cfg


def _replace_spec(spec: Any, **kw: Any) -> Any:
    import dataclasses

    return dataclasses.replace(spec, **kw)


# -- commands ---------------------------------------------------------------------------------


def _check_outputs(*flags: tuple[str, Any]) -> None:
    """Every output path given on the command line can be written (checked before any work)."""
    for flag, path in flags:
        if path is not None:
            problem = output_problem(path, flag)
            if problem:
                raise ConfigError(problem)


def unused_path(path: Path, force: bool = False) -> Path:
    """``path`` when it does not exist (or ``force``), else the first free ``<stem>-2<suffix>``, ``-3``, ..."""
    path = Path(path)
    if force or not path.exists():
        return path
    k = 2
    while (cand := path.with_name(f"{path.stem}-{k}{path.suffix}")).exists():
        k += 1
    return cand


def _quiet_warp() -> None:
    from sysid._quiet import init_warp_quietly

    init_warp_quietly()


def _add_workers(group: Any, what: str) -> None:
    """``--workers N`` and ``--ray-address ADDR`` (sysid.fit.fanout)."""
    group.add_argument("--workers", type=positive_int, metavar="N", help=what)
    group.add_argument("--ray-address", metavar="ADDR",
                       help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a local one")


def cmd_fit(args: argparse.Namespace) -> int:
    from sysid.app.pipeline import run_fit

    if args.output is not None:
        problem = folder_problem(args.output, "-o/--output")
        if problem:
            raise ConfigError(problem)
    _check_outputs(("--params-out", args.params_out), ("--report-out", args.report), ("--results-out", args.results))
    cfg = _config(args)
    if cfg.params_out is None:  # the dated default never silently replaces an earlier fit of the same day
        from sysid.fit.params import default_params_path

        cfg.params_out = str(unused_path(default_params_path(cfg.robot_name()), force=args.force))
        _check_outputs(("the parameter file", cfg.params_out))
    _quiet_warp()
    doc = run_fit(cfg, progress=show_progress(args.quiet))
    _print_fit(doc)
    return 0


def _fmt(v: Any, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def fit_warnings(doc: dict[str, Any]) -> list[str]:
    """Every warning of a fit's results, as the report lists them: the fit's, the kinematic
    baseline's, and the report's missed-climb check (a replay that does not climb what the
    odometry climbs)."""
    from sysid.app.report import climb_warnings

    out = list(doc["fit"].get("warnings") or [])
    out += [f"kinematic baseline: {w}" for w in ((doc.get("baseline") or {}).get("fit") or {}).get("warnings") or []]
    return out + climb_warnings(doc.get("runs") or [])


def sweep_line(sweep: dict[str, Any]) -> str:
    """The timestep sweep's plateau in one line; a plateau that runs to the sweep's largest timestep
    is said to be the sweep's edge, not a largest usable h."""
    lo, hi = sweep["plateau"]
    dts = [float(d) for d in sweep.get("dts") or []]
    if dts and hi >= max(dts):
        return (f"timestep plateau: {lo:g} s .. {hi:g} s, the sweep's largest timestep: the largest usable h "
                f"is {hi:g} s or more (add larger sweep.dts to find it)")
    return f"timestep plateau: {lo:g} s .. {hi:g} s (largest usable h = {hi:g} s)"


def _print_fit(doc: dict[str, Any]) -> None:
    out = sys.stdout
    print(
        f"simulator: {doc['simulator']['name']} ({doc['simulator']['label']}), dt = {doc['config']['dt']} s",
        file=out,
    )
    print(f"{'parameter':<14}{'initial':>11}{'identified':>12}{'95% CI':>26}{'bounds':>22}  note", file=out)
    for p in doc["parameters"]:
        ci = f"[{_fmt(p['ci95'][0])}, {_fmt(p['ci95'][1])}]" if p.get("ci95") else "-"
        note = "calibrated" if p["calibrated"] else ("frozen" if p["frozen"] else "")
        if p.get("truth") is not None:
            note += f" truth {p['truth']:.4g}"
        print(
            f"{p['name']:<14}{_fmt(p['initial']):>11}{_fmt(p['value']):>12}{ci:>26}"
            f"{'[' + _fmt(p['lower']) + ', ' + _fmt(p['upper']) + ']':>22}  {note}",
            file=out,
        )
    fit = doc["fit"]
    print(
        f"loss {_fmt(fit['loss_initial'])} -> {_fmt(fit['loss_final'])} m^2 in {fit['iterations']} evaluations "
        f"({fit['optimizer']}, {fit['wall_time']:.1f} s): {fit['message']}",
        file=out,
    )
    for w in fit_warnings(doc):
        print(f"warning: {w}", file=sys.stderr)
    if doc.get("odometry_findings"):  # the odometry's lag and jumps: one table, not a warning per run
        print(odometry_terminal_text(doc["odometry_findings"]), file=sys.stderr)
    for r in doc["runs"]:
        m0, m1 = r["metrics_initial"], r["metrics_identified"]
        print(
            f"  {r['split']:<9}{r['name']:<40} combined {_fmt(m0['combined'], '.3f')} -> "
            f"{_fmt(m1['combined'], '.3f')} m   mean xy {_fmt(m1['mean_xy'], '.3f')} m{_solver_note(r.get('solver'))}",
            file=out,
        )
    for split, s in doc["summary"].items():
        print(
            f"mean {split}: combined {s['combined']['identified']:.3f} m, mean xy {s['mean_xy']['identified']:.3f} m",
            file=out,
        )
    _print_generalisation(doc, out)
    if doc.get("sweep") and doc["sweep"].get("plateau"):
        print(sweep_line(doc["sweep"]), file=out)
    print(f"wrote {doc['outputs']['params']}\nwrote {doc['outputs']['report']}", file=out)


def _print_generalisation(doc: dict[str, Any], out: Any) -> None:
    """Per held-out (and training) run, mean over its pieces: the model beside the kinematic baseline."""
    gen = doc.get("generalisation") or {}
    base = doc.get("baseline") or {}
    if base.get("status") == "fitted":
        vals = ", ".join(f"{p['name']} {_fmt(p['value'])}" for p in base.get("parameters") or [] if not p["frozen"]
                         or p.get("calibrated"))
        print(f"kinematic baseline fitted on the same training runs (dt = {base['dt']:g} s): {vals}", file=out)
    elif base.get("reason"):
        print(f"kinematic baseline {base['reason']}", file=out)
    for split, what in (("held_out", "held-out"), ("train", "training")):
        block = gen.get(split)
        if not block:
            continue
        has_b = "baseline" in block["mean_over_runs"]
        print(f"{what} runs{' (in-sample)' if split == 'train' else ''}, mean over each run's pieces: "
              "mean xy / combined [m]"
              + (" (model | kinematic baseline)" if has_b else ""), file=out)
        rows = [(f"{r['run']} ({len(r['pieces'])} piece{'s' if len(r['pieces']) != 1 else ''})", r)
                for r in block["runs"]]
        rows += [(f"mean over {block['n_runs']} run{'s' if block['n_runs'] != 1 else ''}", block["mean_over_runs"]),
                 (f"mean over {block['n_pieces']} piece{'s' if block['n_pieces'] != 1 else ''}",
                  block["mean_over_pieces"])]
        for label, r in rows:
            line = f"  {label:<48}{_fmt(r['model']['mean_xy'], '.3f')} / {_fmt(r['model']['combined'], '.3f')}"
            if has_b:
                line += f"  |  {_fmt(r['baseline']['mean_xy'], '.3f')} / {_fmt(r['baseline']['combined'], '.3f')}"
            print(line, file=out)
        if block.get("verdict"):
            print(f"  {block['verdict']}", file=out)


def _solver_note(h: dict | None) -> str:
    """How the engine's Newton solve fared in a run's replay (empty for other simulators)."""
    if not h:
        return ""
    return f"   solver: {h['unconverged_steps']:.0%} steps unconverged, worst {h['residual_max']:.2g} m/s"


def cmd_evaluate(args: argparse.Namespace) -> int:
    from sysid.app.pipeline import run_evaluate
    from sysid.fit.params import atomic_write_text

    _check_outputs(("-o/--output", args.output))
    cfg = _config(args)
    _quiet_warp()
    res = run_evaluate(cfg, args.params, progress=show_progress(args.quiet))
    print(f"{'run':<44}{'combined [m]':>13}{'mean xy [m]':>13}{'yaw RMSE [rad]':>16}")
    for r in res["runs"]:
        print(
            f"{r['name']:<44}{_fmt(r['combined'], '.4f'):>13}{_fmt(r['mean_xy'], '.4f'):>13}"
            f"{_fmt(r['yaw_rmse'], '.4f'):>16}{_solver_note(r.get('solver'))}"
        )
    if res.get("odometry_findings"):
        print(odometry_terminal_text(res["odometry_findings"]), file=sys.stderr)
    m = res["mean"]
    print(
        f"{'mean':<44}{_fmt(m['combined'], '.4f'):>13}{_fmt(m['mean_xy'], '.4f'):>13}{_fmt(m['yaw_rmse'], '.4f'):>16}"
    )
    if args.output:
        atomic_write_text(args.output, json.dumps(res, indent=1))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sysid.app.pipeline import run_sweep
    from sysid.fit.params import atomic_write_text

    _check_outputs(("-o/--output", args.output))
    cfg = _config(args)
    _quiet_warp()
    sw = run_sweep(cfg, args.params, progress=show_progress(args.quiet))
    print(f"{'dt [s]':>10}{'mean combined [m]':>20}{'wall [s]':>10}")
    for h, e, w in zip(sw.dts, sw.errors, sw.wall_times, strict=True):
        mark = " <- plateau edge" if sw.plateau and h == sw.plateau[1] else ""
        print(f"{h:>10g}{e:>20.4f}{w:>10.2f}{mark}")
    if sw.plateau:
        print(f"plateau: {sw.plateau[0]:g} .. {sw.plateau[1]:g} s (error within {sw.factor:g}x the minimum)")
    else:
        print("plateau: none (every timestep diverged)")
    if args.output:
        atomic_write_text(args.output, json.dumps(sw.summary(), indent=1))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sysid.app.pipeline import load_results
    from sysid.app.report import render_report
    from sysid.fit.params import atomic_write_text

    out = Path(args.output) if args.output else Path(args.results).with_suffix(".html")
    if out.resolve() == Path(args.results).resolve():
        raise ConfigError("the report would overwrite the results file; give --output")
    _check_outputs(("-o/--output", str(out)))
    doc = load_results(args.results)
    atomic_write_text(out, render_report(doc))
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_synth = next((a for a in argv if not a.startswith("-")), None) == "synth"
    parser = build_parser(with_synth=wants_synth)
    args = parser.parse_args(argv)
    try:
        from ingest.errors import IngestError
    except ImportError:  # pragma: no cover
        user_errors: tuple[type[BaseException], ...] = (SysidError,)
    else:
        user_errors = (SysidError, IngestError)  # ingest errors are user errors too
    try:
        from sysid.synth.errors import SynthError
    except ImportError:  # pragma: no cover
        pass
    else:
        user_errors += (SynthError,)
    return run_guarded(lambda: args.func(args), user_errors)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
