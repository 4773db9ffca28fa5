"""``sysid cv``: cross-validated identification (the library is `sysid.app.cv`): every fold fits the
model and the kinematic baseline on the same training runs and scores its held-out runs; writes
DIR/cv.json and DIR/cv.html."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import textwrap
from pathlib import Path

from ingest.clikit import deprecated_alias, folder_problem, nonnegative_int
from sysid.app.choices import parse_folds
from sysid.cli.common import Subparsers, add_allow_simulator, check_simulator, quiet_warp, switched_simulator
from sysid.errors import ConfigError


def _folds_arg(text: str) -> str | int:
    try:
        folds: str | int = parse_folds(text)  # a name or a count, from text
        return folds
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``cv`` to the ``sysid`` command's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "cv",
        help="cross-validated identification: every fold fits the model and the kinematic baseline, scores "
             "held-out runs",
        description=textwrap.fill(
            "Cross-validate a fit config: folds over its runs (training and held-out lists together; "
            "leave-one-run-out, K folds, contiguous blocks of the runs in name order or the config's cv.folds; "
            "a run's pieces stay in one fold), each fold fitted with the config's "
            "settings (model and kinematic baseline on the same training runs) and scored on its held-out runs. "
            "Writes DIR/cv.json and DIR/cv.html (per-fold and mean held-out error, per-fold parameters with "
            "intervals, their spread across folds). Folds run as Ray tasks (a local cluster by default, or "
            "--ray-address); --workers 1 runs them serially. Docs: docs/fit.md, 'Cross-validation'.", 100),
        epilog="examples:\n  sysid cv --config examples/helhest-real.yaml\n"
               "  sysid cv --config examples/fit.yaml --folds 2 --workers 2 --max-iter 8 -o reports/cv-sample",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", "-c", required=True, metavar="FIT.YAML", help="fit config (docs/fit.md)")
    p.add_argument("--folds", type=_folds_arg, metavar="loo|K|blocks",
                   help="'loo' (leave-one-run-out), K >= 2 folds of consecutive runs, or 'blocks' (--blocks "
                        "contiguous blocks of the runs in name order); default: the config's cv.folds, else loo")
    p.add_argument("--blocks", type=_workers_arg, metavar="N", help="with --folds blocks: this many blocks "
                   "(cv.blocks, default 3)")
    p.add_argument("--gap", type=nonnegative_int, metavar="N", help="with --folds blocks: leave N runs beside the "
                   "held-out block out of its training (cv.gap, default 0)")
    p.add_argument("--train-per-fold", type=_workers_arg, metavar="N", help="train each fold on at most N of its "
                   "training runs, evenly spread (cv.train_per_fold)")
    p.add_argument("--held-out-per-fold", type=_workers_arg, metavar="N", help="score each fold on at most N of its "
                   "held-out runs, evenly spread (cv.held_out_per_fold)")
    p.add_argument("--workers", type=_workers_arg, metavar="N",
                   help="folds in parallel as Ray tasks on a local cluster of N CPUs (default: this machine's "
                        "CPUs); 1 runs them serially in this process")
    p.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (its head's HOST:PORT, or auto; "
                   "docs/cluster.md) instead of starting a local one")
    p.add_argument("--output", "-o", dest="out", metavar="DIR", help="output folder for cv.json and cv.html "
                   "(default reports/cv-<robot>-<date>)")
    deprecated_alias(p, "--out", dest="out", metavar="DIR")  # the spelling before the one output convention
    o = p.add_argument_group("overrides of the config (every fold)")
    o.add_argument("--simulator", metavar="NAME",
                   help="simulator ('ostrich', 'kinematic', 'package.module:factory'; as `sysid fit --simulator`)")
    add_allow_simulator(o)
    o.add_argument("--max-iter", type=_workers_arg, metavar="N", help="LM evaluations / Adam steps per fit")
    o.add_argument("--split", type=float, metavar="SECONDS", help="cut every run into pieces of about this length")
    o.add_argument("--odometry-jumps", choices=("report", "drop"), dest="odometry_jumps",
                   help="pieces whose odometry jumps: report them or drop them from training and scoring")
    o.add_argument("--no-baseline", action="store_true", help="do not fit the kinematic baseline in each fold")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress (fold lines and bar on stderr)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid cv``: run, print the table, write DIR/cv.json and DIR/cv.html; exit status 1 when
    no fold finished."""
    from sysid.app.config import FitConfig
    from sysid.app.cv import cross_validate, format_table, write_cv

    cfg = FitConfig.from_file(args.config)
    if args.simulator is not None and args.simulator != cfg.simulator.name:
        cfg = switched_simulator(cfg, args.simulator)
    if args.split is not None and not (math.isfinite(args.split) and args.split > 0):
        raise ConfigError(f"--split must be a positive number of seconds, got {args.split}")
    over = {"fit.max_iter": args.max_iter, "data.split": args.split,
            "data.jump_action": args.odometry_jumps, "cv.blocks": args.blocks, "cv.gap": args.gap,
            "cv.train_per_fold": args.train_per_fold, "cv.held_out_per_fold": args.held_out_per_fold}
    if args.no_baseline:
        over["fit.baseline.enabled"] = False
    cfg = cfg.merged(over)
    check_simulator(args, cfg)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    out = Path(args.out) if args.out else Path("reports") / f"cv-{cfg.robot_name()}-{date}"
    problem = folder_problem(out, "-o/--output")  # a file there, no permission, a full disk
    if problem:
        raise ConfigError(problem)
    from sysid.app.fit_outputs import check_inputs_kept, input_files

    check_inputs_kept([("-o/--output", out / "cv.json"), ("-o/--output", out / "cv.html")], input_files(cfg),
                      "-o/--output DIR")
    quiet_warp()
    doc = cross_validate(cfg, args.folds, workers=args.workers, ray_address=args.ray_address,
                         progress=not args.quiet)
    print(format_table(doc))
    ex = doc["execution"]
    print(f"{ex['backend']}, {ex.get('workers')} worker(s): {ex['wall_time']:.1f} s")
    jp, hp = write_cv(doc, out)
    print(f"wrote {jp}\nwrote {hp}")
    return 1 if doc["summary"]["n_ok"] == 0 else 0
