"""What the planner (`sysid.plan.control.Planner`) is given and returns: a trial (`ControlTask`), the loss's
weights (`LossWeights`), the result (`PlanResult`), the command spline (`spline_basis`) and its errors
(`PlanError`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sysid.errors import SysidError


class PlanError(SysidError):
    """A planning problem that cannot be set up or solved as given (what is wrong, what to do)."""


@dataclass
class LossWeights:
    """Weights of the planning loss (`sysid.plan.control`'s docstring); SI units of the terms they weigh."""

    position: float = 1.0  # [1/m^2] final position error
    yaw: float = 0.1  # [1] final heading, on 2 (1 - cos(error))
    speed: float = 1.0  # [s^2/m^2] terminal planar speed
    track: float = 0.1  # [1/m^2] per-step distance to the reference path, mean over steps
    effort: float = 1e-3  # [s^2/rad^2] mean squared knot value
    smooth: float = 1e-2  # [s^2/rad^2] mean squared change between neighbouring knots

    def __post_init__(self) -> None:
        for k, v in vars(self).items():
            if not (math.isfinite(v) and v >= 0):
                raise PlanError(f"loss weight {k} = {v}: every weight must be finite and >= 0")


@dataclass
class ControlTask:
    """One trial: where the robot starts, where it must go and what is around it.

    start, goal: (x [m], y [m], yaw [rad]) of the chassis; pallet: (x, y, yaw) of a box obstacle
    (the robot description's pallet size) or None; terrain: this trial's own ground mesh
    (vertices (N, 3) [m], indices (3M,)) from `sysid.robot.scenes.sinusoid_terrain`, with
    ``terrain_resolution`` its grid cells per side (for the start height), or None (flat ground);
    reference: (steps + 1, 2) path [m] for the tracking term, or None (straight line)."""

    goal: tuple[float, float, float]
    start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    pallet: tuple[float, float, float] | None = None
    terrain: tuple[np.ndarray, np.ndarray] | None = None
    terrain_resolution: int | None = None
    reference: np.ndarray | None = None

    def __post_init__(self) -> None:
        for what, v in (("goal", self.goal), ("start", self.start), ("pallet", self.pallet)):
            if v is None:
                continue
            if len(v) != 3 or not all(math.isfinite(float(x)) for x in v):
                raise PlanError(f"{what} must be three finite numbers x [m], y [m], yaw [rad]; got {v!r}")
        if self.terrain is not None and self.terrain_resolution is None:
            raise PlanError("a task with terrain needs terrain_resolution (its grid cells per side)")


@dataclass
class PlanResult:
    """What `Planner.optimize` found, per world (trial) w.

    The best iterate of a world is its lowest-loss iterate among those that reach the goal (`success`), or
    its lowest-loss iterate where none does.

    knots (W, K, C) [rad/s]: the best iterate's spline knots per channel; targets (W, steps,
    wheels) [rad/s]: the wheel-servo targets they give in the model (before cmd_scale, after trim
    and delay); commands (W, steps, wheels) [rad/s]: what to send at each step's start (`Planner.commands`);
    times (steps,) [s]: each step's start; chassis (W, steps + 1, 7): the best iterate's chassis
    poses (x, y, z, quaternion x, y, z, w); loss (W,): the best iterate's loss; history (iterations + 1, W):
    the loss of each iterate (the last entry: after the final update); best_history: running lowest loss;
    position_error (W,) [m], yaw_error (W,) [rad], terminal_speed (W,) [m/s] of the best iterate;
    iterations_to_success (W,): first iterate meeting `Planner.success` (-1: none); iteration_s:
    wall time of each forward + backward [s]; residual_max: worst step's Newton residual [m/s] of
    the best iterate, per world."""

    knots: np.ndarray
    targets: np.ndarray
    commands: np.ndarray
    times: np.ndarray
    chassis: np.ndarray
    loss: np.ndarray
    history: np.ndarray
    best_history: np.ndarray
    position_error: np.ndarray
    yaw_error: np.ndarray
    terminal_speed: np.ndarray
    success: np.ndarray
    iterations_to_success: np.ndarray
    iteration_s: list[float] = field(default_factory=list)
    # every evaluation's unweighted loss terms and final errors, {name: (iterations, W)}
    term_history: dict[str, np.ndarray] = field(default_factory=dict)
    residual_max: np.ndarray | None = None
    # per world: how many times Adam started a new descent from the straight-line command (``restart_after``)
    restarts: np.ndarray | None = None
    channels: tuple[str, ...] = ()
    wheel_names: tuple[str, ...] = ()
    optimizer: str = "adam"
    pullback: str = "full"


def spline_basis(knots: int, duration: float, dt: float, steps: int, delay: float = 0.0) -> np.ndarray:
    """(steps, knots) weights of a piecewise-linear spline with ``knots`` knots evenly spaced on
    [0, duration] [s], evaluated at each step's midpoint k dt + dt / 2 - delay; rows of steps whose
    delayed time is before 0 are zero (the robot stood still before the plan)."""
    if knots < 2:
        raise PlanError(f"a spline needs at least 2 knots, got {knots}")
    s = (np.arange(steps) + 0.5) * dt - delay
    B = np.zeros((steps, knots))
    x = np.clip(s, 0.0, duration) / (duration / (knots - 1))
    i = np.clip(np.floor(x).astype(int), 0, knots - 2)
    a = x - i
    rows = np.arange(steps)
    B[rows, i] = 1.0 - a
    B[rows, i + 1] = a
    B[s < 0.0] = 0.0
    return B


def check_tolerances(position_tol: float, speed_tol: float, yaw_tol: float | None) -> None:
    """PlanError unless every success tolerance (`Planner.success`) is positive and finite (yaw_tol may be None)."""
    for name, tol in (("position_tol", position_tol), ("speed_tol", speed_tol), ("yaw_tol", yaw_tol)):
        if tol is not None and not (math.isfinite(tol) and tol > 0):
            raise PlanError(f"{name} must be a positive tolerance, got {tol}")
