"""`sysid plan`: optimise wheel commands through the identified model (`sysid.plan.control`).

Registered by `sysid/cli/__init__.py` through `add_parser(subparsers)`; the work is `sysid.app.plan.plan(...)`,
which returns the plan document, and `sysid.app.plan.write_plan`, which commits the command file and the HTML
page together (both or neither).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from sysid.app.choices import SCENES
from sysid.cli.common import Subparsers, quiet_warp
from sysid.errors import ConfigError

HELP = "optimise wheel commands to reach a goal pose through the identified model (gradient-based planning)"
EXAMPLES = """examples:
  sysid plan -p models/helhest/params-pallet-sample.yaml --goal 3,0.3,0 --scene pallet -o plans/over-pallet
  sysid plan -p models/helhest/params-pallet-sample.yaml --goal 2,1,1.57 --optimizer lbfgs --iterations 40
  sysid plan -p models/helhest/params-pallet-sample.yaml --goal 4,0,0 --scene terrain --terrain-seed 3 \\
    --duration 8 -o plans/terrain        # L-BFGS, full pull-back
  sysid plan -p models/helhest/params-pallet-sample.yaml --goal 2,0.5,0.5 --weight yaw=1 --yaw-tol 0.1 \\
    -o plans/heading                     # the heading too, within 0.1 rad

outputs: DIR/plan.yaml (the command sequence per wheel at every step, the knots, the final errors) and
DIR/plan.html (trajectories, loss, commands); docs: docs/plan.md"""


def _triple(text: str) -> tuple[float, float, float]:
    try:
        v = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not three numbers X,Y,YAW (m, m, rad)") from None
    if len(v) != 3 or not all(math.isfinite(x) for x in v):
        raise argparse.ArgumentTypeError(f"{text!r} is not three finite numbers X,Y,YAW (m, m, rad)")
    return v


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return v

    return parse


def _weight(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not sep or not name or not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE with a finite VALUE >= 0 (e.g. yaw=1)")
    return name.strip(), v


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``plan`` to the ``sysid`` command's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "plan", help=HELP, description=HELP, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--params", "-p", required=True, metavar="PARAMS.YAML",
                   help="identified parameter file (sysid fit)")
    p.add_argument(
        "--goal", required=True, type=_triple, metavar="X,Y,YAW", help="goal pose of the chassis [m, m, rad]"
    )
    p.add_argument(
        "--start",
        type=_triple,
        default=(0.0, 0.0, 0.0),
        metavar="X,Y,YAW",
        help="start pose [m, m, rad] (default 0,0,0; the robot starts at rest)",
    )
    p.add_argument(
        "--scene",
        choices=SCENES,
        default="flat",
        help="flat ground, a pallet (box obstacle) half way to the goal, or sum-of-sinusoids mesh terrain",
    )
    p.add_argument(
        "--pallet",
        type=_triple,
        metavar="X,Y,YAW",
        help="pallet pose with --scene pallet [m, m, rad] (default: half way between start and goal)",
    )
    p.add_argument("--terrain-seed", type=int, default=0, metavar="N", help="terrain seed with --scene terrain")
    p.add_argument("--robot", metavar="NAME|PATH",
                   help="robot: a bundled name, robot.yaml or URDF (default: the parameter file's robot)")
    p.add_argument("--duration", type=_positive(float), default=6.0, metavar="S", help="horizon [s] (default 6)")
    p.add_argument("--dt", type=_positive(float), default=0.1, metavar="S", help="engine step [s] (default 0.1)")
    p.add_argument(
        "--knots", type=_positive(int), default=10, metavar="K", help="spline knots per channel (default 10)"
    )
    p.add_argument(
        "--channels",
        choices=("sides", "wheels"),
        default="sides",
        help="one command spline per wheel side (default) or per driven wheel",
    )
    p.add_argument(
        "--optimizer",
        choices=("adam", "lbfgs"),
        default=None,
        help="optimiser (default: lbfgs on terrain, adam elsewhere; chosen on tuning draws, docs/plan.md)",
    )
    p.add_argument(
        "--iterations", type=_positive(int), default=50, metavar="N", help="forward + backward evaluations (default 50)"
    )
    p.add_argument(
        "--lr", type=_positive(float), default=0.3, metavar="RAD_S",
        help="Adam step; L-BFGS: first step's RMS [rad/s] (default 0.3)",
    )
    p.add_argument(
        "--pullback",
        choices=("full", "truncated"),
        default=None,
        help="gradient pull-back (default: full, the exact gradient, on terrain; truncated elsewhere)",
    )
    p.add_argument(
        "--trials",
        type=_positive(int),
        default=1,
        metavar="N",
        help="parallel trials from first guesses perturbed by N(0, 0.5 rad/s) (seeded); the best is written",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the trials' perturbations")
    p.add_argument(
        "--weight",
        type=_weight,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a loss weight (repeatable): position, yaw, speed, track, effort, smooth (defaults 1, 0.1, 1, 0.1, "
        "1e-3, 1e-2; docs/plan.md), e.g. --weight yaw=1 to hold the goal's heading more",
    )
    p.add_argument(
        "--position-tol", type=_positive(float), default=0.2, metavar="M",
        help="reached: final position within this of the goal [m] (default 0.2, the paper's)",
    )
    p.add_argument(
        "--speed-tol", type=_positive(float), default=0.3, metavar="M_S",
        help="reached: terminal speed below this [m/s] (default 0.3, the paper's)",
    )
    p.add_argument(
        "--yaw-tol", type=_positive(float), default=None, metavar="RAD",
        help="reached: final heading within this of the goal's [rad] (default: any heading, the paper's criterion)",
    )
    p.add_argument(
        "--output",
        "-o",
        dest="out",
        type=Path,
        default=Path("plans") / "plan",
        metavar="DIR",
        help="output folder for plan.yaml and plan.html (default plans/plan)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid plan``: check the outputs, plan, write DIR/plan.yaml and DIR/plan.html."""
    from ingest.clikit import input_clash, output_problem, show_progress
    from sysid.app.plan import plan, write_plan

    for name in ("plan.yaml", "plan.html"):
        problem = output_problem(args.out / name, "the plan output")
        if problem:
            raise ConfigError(f"{problem}; nothing was computed or written (give another folder with -o)")
    inputs = [("the parameter file", args.params)] + ([("the robot description", args.robot)] if args.robot else [])
    problem = input_clash([("the plan output", args.out / name) for name in ("plan.yaml", "plan.html")], inputs)
    if problem:
        raise ConfigError(f"{problem}; nothing was computed or written (give another folder with -o)")
    quiet_warp()
    doc = plan(
        args.params,
        args.goal,
        start=args.start,
        scene=args.scene,
        pallet=args.pallet,
        terrain_seed=args.terrain_seed,
        robot=args.robot,
        duration=args.duration,
        dt=args.dt,
        knots=args.knots,
        channels=args.channels,
        optimizer=args.optimizer,
        iterations=args.iterations,
        lr=args.lr,
        pullback=args.pullback,
        trials=args.trials,
        seed=args.seed,
        weights=dict(args.weight),
        position_tol=args.position_tol,
        speed_tol=args.speed_tol,
        yaw_tol=args.yaw_tol,
        progress=show_progress(args.quiet),
    )
    cmd, page = write_plan(doc, args.out)
    s = doc["summary"]
    t = doc["trials"][s["best_trial"]]
    print(
        f"plan: {'reached' if t['success'] else 'did NOT reach'} the goal: position error {t['position_error']:.3f} m, "
        f"yaw error {math.degrees(t['yaw_error']):.1f} deg, terminal speed {t['terminal_speed']:.3f} m/s "
        f"({s['successes']} of {len(doc['trials'])} trial(s) succeeded; {s['iteration_s_median']:.2f} s per iteration)"
    )
    print(f"wrote {cmd} and {page}")
    return 0
