"""Planning as an application job: a plan document from an identified parameter file (`plan`), the command
file a robot plays (`command_file`) and the writing of DIR/plan.yaml + DIR/plan.html together (`write_plan`).
The optimisation itself is the library `sysid.plan.control`; the command line is `sysid.cli.plan`."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from sysid.app.choices import SCENES
from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.fit.params import load_params
from sysid.simulators.ostrich import PARAMETERS

if TYPE_CHECKING:
    from sysid.robot.scenes import RobotDescription


def _pose(what: str, v: Sequence[float]) -> tuple[float, float, float]:
    """``v`` as a task's (x [m], y [m], yaw [rad]); another length is refused as `ControlTask` refuses it."""
    from sysid.plan.control import PlanError

    if len(v) != 3:
        raise PlanError(f"{what} must be three finite numbers x [m], y [m], yaw [rad]; got {tuple(v)!r}")
    return v[0], v[1], v[2]


def _robot(params_doc: dict[str, Any], params_path: Path, robot: str | None) -> RobotDescription:
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
    optimizer: str | None = None,
    iterations: int = 50,
    lr: float = 0.3,
    pullback: str | None = None,
    trials: int = 1,
    seed: int = 0,
    weights: Mapping[str, float] | None = None,
    position_tol: float = 0.2,
    speed_tol: float = 0.3,
    yaw_tol: float | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Plan wheel commands from ``start`` to ``goal`` with the parameters of a `sysid fit` parameter
    file and return the plan document (what `write_plan` writes). ``weights``: loss weights to change
    (`sysid.plan.control.LossWeights` field -> value; the rest at their defaults); position_tol [m],
    speed_tol [m/s], yaw_tol [rad] (None: any final heading): what counts as reaching the goal."""
    from tqdm.auto import tqdm

    from sysid.plan.control import ControlTask, LossWeights, PlanError, Planner, check_tolerances
    from sysid.robot.scenes import sinusoid_terrain

    if scene not in SCENES:
        raise ConfigError(f"scene must be one of {SCENES}, got {scene!r}")
    names = [f.name for f in dataclasses.fields(LossWeights)]
    unknown = sorted(set(weights or {}) - set(names))
    if unknown:
        raise ConfigError(f"unknown loss weight(s) {unknown}: the weights are {names} (docs/plan.md)")
    try:
        loss_weights = LossWeights(**{k: float(v) for k, v in (weights or {}).items()})
    except PlanError as exc:
        raise ConfigError(str(exc)) from None
    check_tolerances(position_tol, speed_tol, yaw_tol)  # before any work (optimize checks them again)
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
    goal3, start3 = _pose("goal", goal), _pose("start", start)
    pallet3 = _pose("pallet", pallet) if scene == "pallet" and pallet is not None else None
    tasks = [
        ControlTask(
            goal=goal3,
            start=start3,
            pallet=pallet3,
            terrain=terrain,
            terrain_resolution=resolution,
        )
        for _ in range(trials)
    ]
    # defaults chosen on tuning draws (docs/plan.md): on terrain per-world L-BFGS with the exact gradient
    # (smooth wheel-mesh contact), elsewhere backtracking Adam with the truncated pull-back
    optimizer = optimizer or ("lbfgs" if scene == "terrain" else "adam")
    pullback = pullback or ("full" if scene == "terrain" else "truncated")
    planner = Planner(desc, theta, tasks, duration=duration, dt=dt, knots=knots, channels=channels, pullback=pullback,
                      weights=loss_weights,
                      friction_combine=str((pdoc.get("metadata") or {}).get("friction_combine", "wheel")))
    U0 = planner.straight_guess()
    if trials > 1:
        U0 = U0 + np.random.default_rng(seed).normal(0.0, 0.5, U0.shape) * (np.arange(trials) > 0)[:, None, None]
    initial = planner.rollout(U0)[0][:, planner._chassis, :2]
    with tqdm(total=iterations, desc="plan", unit="it", disable=not progress, leave=False) as bar:

        def step(_i: int, L: np.ndarray) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(np.min(L)):.3g}")

        res = planner.optimize(
            U0,
            optimizer=optimizer,
            iterations=iterations,
            lr=lr,
            position_tol=position_tol,
            speed_tol=speed_tol,
            yaw_tol=yaw_tol,
            progress=step,
        )
    # the best trial: the lowest loss among those that reach the goal, else the lowest loss
    best = int(np.argmin(np.where(res.success, res.loss, np.inf))) if res.success.any() else int(np.argmin(res.loss))
    residual_max = res.residual_max
    if residual_max is None:  # Planner.optimize records it for every world
        raise RuntimeError("the planner's result has no Newton residuals")
    trial_docs = []
    for w in range(trials):
        trial_docs.append(
            {
                "start": [float(v) for v in start],
                "goal": [float(v) for v in goal],
                "pallet": [float(v) for v in pallet3] if pallet3 is not None else None,
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
                "restarts": int(res.restarts[w]) if res.restarts is not None else 0,
                "loss": float(res.loss[w]),
                "residual_max": float(residual_max[w]),
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
            "position_tol": position_tol,
            "speed_tol": speed_tol,
            "yaw_tol": yaw_tol,
            "weights": vars(planner.weights),
        },
        "trials": trial_docs,
        "best_history": res.best_history.tolist(),
        "terrain": None if terrain is None else terrain_grid(terrain[0], resolution),
        "summary": {
            "successes": int(res.success.sum()),
            "best_trial": best,
            "best_position_error": float(res.position_error[best]),
            "best_yaw_error": float(res.yaw_error[best]),
            "iteration_s_median": float(np.median(res.iteration_s)),
        },
    }


def terrain_grid(vertices: np.ndarray, resolution: int | None) -> dict[str, Any]:
    """A `sysid.robot.scenes.sinusoid_terrain` heightmap for the plan page: its side [m], cells per
    side and the heights [m] on the (resolution + 1)^2 grid (first index along x), to the millimetre."""
    n = int(resolution or 0) + 1
    z = np.asarray(vertices, float)[:, 2].reshape(n, n)
    return {"size": float(vertices[-1][0] - vertices[0][0]), "resolution": n - 1, "heights": np.round(z, 3).tolist()}


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
    """Write DIR/plan.yaml and DIR/plan.html together (`sysid.app.outputs.commit_outputs`: both are
    rendered and written to temporary files first, then renamed into place; a failure or a signal
    leaves what was there, both or neither, or the new pair)."""
    from ingest.fileio import atomic_write_text
    from sysid.app.outputs import commit_outputs
    from sysid.app.plan_report import render_plan_report

    html = render_plan_report(doc, base=out)
    text = yaml.safe_dump(command_file(doc), sort_keys=False)
    commands, page = out / "plan.yaml", out / "plan.html"
    commit_outputs([("plan commands", commands), ("plan page", page)],
                   {"plan commands": lambda tmp: atomic_write_text(tmp, text),
                    "plan page": lambda tmp: atomic_write_text(tmp, html)})
    return commands, page
