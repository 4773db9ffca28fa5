"""`sysid plan`: optimise wheel commands through the identified model (`sysid.plan.control`).

Registered by `sysid/cli/__init__.py` through `add_parser(subparsers)`; the work is `plan(...)`, a library
call that returns the plan document, and `write_plan`, which commits the command file and the HTML
page together (both or neither).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.fit.params import load_params
from sysid.simulators.ostrich import PARAMETERS

SCENES = ("flat", "pallet", "terrain")
HELP = "optimise wheel commands to reach a goal pose through the identified model (gradient-based planning)"
EXAMPLES = """examples:
  sysid plan --params models/helhest/params-pallet-sample.yaml --goal 3,0.3,0 --scene pallet -o plans/over-pallet
  sysid plan --params models/helhest/params-pallet-sample.yaml --goal 2,1,1.57 --optimizer lbfgs --iterations 40
  sysid plan --params P.yaml --goal 4,0,0 --scene terrain --terrain-seed 3 --pullback truncated --duration 8

outputs: DIR/plan.yaml (the command sequence per wheel at every step, the knots, the final errors) and
DIR/plan.html (trajectories, loss, commands); docs: docs/plan.md"""


def _triple(text: str) -> tuple[float, float, float]:
    try:
        v = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not three numbers X,Y,YAW (m, m, rad)") from None
    if len(v) != 3 or not all(math.isfinite(x) for x in v):
        raise argparse.ArgumentTypeError(f"{text!r} is not three finite numbers X,Y,YAW (m, m, rad)")
    return v  # type: ignore[return-value]


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


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help=HELP, description=HELP, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--params", required=True, metavar="PARAMS.YAML", help="identified parameter file (sysid fit)")
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
    p.add_argument("--robot", metavar="PATH", help="robot description (default: the parameter file's robot)")
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
    p.add_argument("--optimizer", choices=("adam", "lbfgs"), default="adam", help="optimiser (default adam)")
    p.add_argument(
        "--iterations", type=_positive(int), default=50, metavar="N", help="forward + backward evaluations (default 50)"
    )
    p.add_argument("--lr", type=_positive(float), default=0.3, metavar="RAD_S", help="Adam step [rad/s] (default 0.3)")
    p.add_argument(
        "--pullback",
        choices=("full", "truncated"),
        default=None,
        help="gradient pull-back (default: full; truncated on terrain, as the paper)",
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


def _robot(params_doc: dict[str, Any], params_path: Path, robot: str | None):
    from sysid.robot import robot_from_dict

    name = robot or params_doc.get("robot") or "helhest"
    cfg = FitConfig(robot=str(name), base_dir=params_path.parent if robot is None else Path.cwd())
    return robot_from_dict(cfg.load_robot(), source=str(cfg.robot_path()), base=cfg.robot_path().parent)


def plan(
    params: str | os.PathLike[str],
    goal: Sequence[float],
    *,
    start: Sequence[float] = (0.0, 0.0, 0.0),
    scene: str = "flat",
    pallet: Sequence[float] | None = None,
    terrain_seed: int = 0,
    robot: str | None = None,
    duration: float = 6.0,
    dt: float = 0.1,
    knots: int = 10,
    channels: str = "sides",
    optimizer: str = "adam",
    iterations: int = 50,
    lr: float = 0.3,
    pullback: str | None = None,
    trials: int = 1,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Plan wheel commands from ``start`` to ``goal`` with the parameters of a `sysid fit` parameter
    file and return the plan document (what `write_plan` writes)."""
    from tqdm.auto import tqdm

    from sysid.engine.scenes import sinusoid_terrain
    from sysid.plan.control import ControlTask, Planner

    if scene not in SCENES:
        raise ConfigError(f"scene must be one of {SCENES}, got {scene!r}")
    params_path = Path(params)
    ps, pdoc = load_params(params_path)
    if (pdoc.get("metadata") or {}).get("simulator", "ostrich") != "ostrich":
        raise ConfigError(
            f"parameter file {str(params_path)!r} was fitted with simulator "
            f"{pdoc['metadata']['simulator']!r}; planning runs the engine: give an ostrich fit's file"
        )
    theta = {k: v for k, v in ps.values().items() if k in PARAMETERS}
    desc = _robot(pdoc, params_path, robot)
    terrain, resolution = None, None
    if scene == "pallet" and pallet is None:
        pallet = (
            (start[0] + goal[0]) / 2,
            (start[1] + goal[1]) / 2,
            math.atan2(goal[1] - start[1], goal[0] - start[0]),
        )
    if scene == "terrain":
        resolution = 80
        terrain = sinusoid_terrain(resolution=resolution, seed=terrain_seed)
    tasks = [
        ControlTask(
            goal=tuple(goal),
            start=tuple(start),
            pallet=tuple(pallet) if scene == "pallet" else None,
            terrain=terrain,
            terrain_resolution=resolution,
        )
        for _ in range(trials)
    ]
    pullback = pullback or ("truncated" if scene == "terrain" else "full")
    planner = Planner(desc, theta, tasks, duration=duration, dt=dt, knots=knots, channels=channels, pullback=pullback)
    U0 = planner.straight_guess()
    if trials > 1:
        U0 = U0 + np.random.default_rng(seed).normal(0.0, 0.5, U0.shape) * (np.arange(trials) > 0)[:, None, None]
    initial = planner.rollout(U0)[0][:, planner._chassis, :2]
    with tqdm(total=iterations, desc="plan", unit="it", disable=not progress, leave=False) as bar:
        res = planner.optimize(
            U0,
            optimizer=optimizer,
            iterations=iterations,
            lr=lr,
            progress=lambda i, L: (bar.update(1), bar.set_postfix(loss=f"{float(np.min(L)):.3g}")),
        )
    best = int(np.argmin(res.loss))
    trial_docs = []
    for w in range(trials):
        trial_docs.append(
            {
                "start": [float(v) for v in start],
                "goal": [float(v) for v in goal],
                "pallet": [float(v) for v in pallet] if scene == "pallet" else None,
                "knots": res.knots[w].tolist(),
                "targets": res.targets[w].tolist(),
                "commands": res.commands[w].tolist(),
                "chassis_xy": res.chassis[w, :, :2].tolist(),
                "initial_xy": initial[:, w].tolist(),
                "chassis_z": res.chassis[w, :, 2].tolist(),
                "position_error": float(res.position_error[w]),
                "yaw_error": float(res.yaw_error[w]),
                "terminal_speed": float(res.terminal_speed[w]),
                "success": bool(res.success[w]),
                "iterations_to_success": int(res.iterations_to_success[w]),
                "loss": float(res.loss[w]),
                "residual_max": float(res.residual_max[w]),
            }
        )
    return {
        "format": "sysid-plan",
        "version": 1,
        "robot": desc.name,
        "params": str(params_path),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "parameters": theta,
        "channels": list(res.channels),
        "wheels": list(res.wheel_names),
        "pallet_size": list(desc.pallet_size),
        "times": [round(float(t), 9) for t in res.times],
        "options": {
            "scene": scene,
            "terrain_seed": terrain_seed if scene == "terrain" else None,
            "duration": duration,
            "dt": dt,
            "steps": planner.steps,
            "knots": knots,
            "optimizer": optimizer,
            "iterations": iterations,
            "lr": lr,
            "pullback": pullback,
            "trials": trials,
            "seed": seed,
            "position_tol": 0.2,
            "speed_tol": 0.3,
            "weights": vars(planner.weights),
        },
        "trials": trial_docs,
        "best_history": res.best_history.tolist(),
        "summary": {
            "successes": int(res.success.sum()),
            "best_trial": best,
            "best_position_error": float(res.position_error[best]),
            "best_yaw_error": float(res.yaw_error[best]),
            "iteration_s_median": float(np.median(res.iteration_s)),
        },
    }


def command_file(doc: dict[str, Any]) -> dict[str, Any]:
    """The written command sequence: the best trial's wheel targets per step (what a robot plays)."""
    b = doc["summary"]["best_trial"]
    t = doc["trials"][b]
    return {
        "format": "sysid-plan-commands",
        "version": 1,
        "robot": doc["robot"],
        "params": doc["params"],
        "created": doc["created"],
        "dt": doc["options"]["dt"],
        "note": "wheel velocity commands [rad/s] to send from each step's start time t [s] for dt seconds, as "
        "the logs the parameters were fitted on (the identified cmd_trim is in them; the identified "
        "cmd_scale and cmd_delay are the robot's own response to them)",
        "wheels": doc["wheels"],
        "t": doc["times"],
        "commands": {name: [round(row[k], 6) for row in t["commands"]] for k, name in enumerate(doc["wheels"])},
        "knots": {"channels": doc["channels"], "values": t["knots"]},
        "goal": t["goal"],
        "start": t["start"],
        "result": {k: t[k] for k in ("position_error", "yaw_error", "terminal_speed", "success", "loss")},
        "options": doc["options"],
    }


def write_plan(doc: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write DIR/plan.yaml and DIR/plan.html together (`sysid.app.pipeline.commit_outputs`: both are
    rendered and written to temporary files first, then renamed into place; a failure puts back
    what was there, both or neither)."""
    from sysid.app.pipeline import commit_outputs
    from sysid.app.plan_report import render_plan_report
    from sysid.fit.params import atomic_write_text

    html = render_plan_report(doc)
    text = yaml.safe_dump(command_file(doc), sort_keys=False)
    commands, page = out / "plan.yaml", out / "plan.html"
    commit_outputs([("plan commands", commands), ("plan page", page)],
                   {"plan commands": lambda tmp: atomic_write_text(tmp, text),
                    "plan page": lambda tmp: atomic_write_text(tmp, html)})
    return commands, page


def run(args: argparse.Namespace) -> int:
    from ingest.clikit import output_problem, show_progress

    for name in ("plan.yaml", "plan.html"):
        problem = output_problem(args.out / name, "the plan output")
        if problem:
            raise ConfigError(f"{problem}; nothing was computed or written (give another folder with -o)")
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
