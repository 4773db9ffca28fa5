"""Planning through the identified model: gradient-based optimisation of wheel commands.

A plan is a sequence of wheel-servo targets found by descending a loss through the engine's
rollout (`Simulation.forward`) and its adjoint (`Simulation.backward`, the implicit function
theorem at every converged step). The robot runs with identified parameters (a ``sysid fit``
parameter file) in the same model the fit used: the replay's parameters, friction law and command
trim / delay (`sysid.simulators.ostrich_model.engine_parameters`).

Parameterisation. The commands are piecewise-linear splines with K knots evenly spaced over the
horizon [0, duration], one spline per command channel: ``channels="sides"`` (the default) gives
every wheel side its own spline (left, right and, on the Helhest, the driven rear wheel: 3 x K
numbers; a 4-wheel skid steer: 2 x K), ``channels="wheels"`` one per driven wheel. Each step's
wheel target is the spline at the step's midpoint, delayed by the model's ``cmd_delay`` (zero
before the plan starts: the robot stands still), and scaled by the trim of the wheel's side.
Knot values are wheel speeds [rad/s], bounded by ``u_max``.

Loss of one world (one trial), with p_T, yaw_T, v_T the chassis position, yaw and planar velocity
after the last step, g the goal and r_t a reference path (`LossWeights`):

    L = w_pos |p_T - g_xy|^2 + w_yaw 2 (1 - cos(yaw_T - g_yaw)) + w_speed |v_T|^2
        + w_track mean_t |p_t - r_t|^2 + w_effort mean(U^2) + w_smooth mean(diff_k(U)^2)

The reference defaults to the straight line from the start to the goal at constant speed (the
paper's dense tracking term; a task may give its own, e.g. a demonstration's trajectory).

Trials run as parallel worlds of one model (each its own start, goal, obstacles or terrain); the
worlds never touch, so one backward sweep of the summed loss gives every world's own gradient.
Optimisers: Adam and L-BFGS (`lbfgs_worlds`), both per world (each world its own moments, or its own
curvature pairs and line search; a trial's result does not depend on the trials beside it),
projected onto the bounds, best iterate kept (the lowest loss among the iterates that reach the goal,
else the lowest loss: `PlanResult`).

Adam backtracks per world (``backtrack``, default on): contact makes the loss jump between
neighbouring plans (the robot catches the pallet's edge, slips off it, runs past the goal), and
plain Adam's momentum carries on from the jump. A world whose iterate's loss exceeds ``backtrack``
(2) x its best so far returns to its best knots, restarts Adam there from that iterate's gradient
(moments cleared) with its step multiplied by ``backtrack_shrink`` (0.5); each new best multiplies
the step by ``backtrack_grow`` (1.5), up to lr. No evaluation is added: the best iterate's gradient
is kept, so the iteration count is still forward + backward evaluations. The step lr also decays
along a cosine to ``lr_final`` (0.3) x lr at the last iteration. These defaults (and the truncated
pull-back below) were chosen on tuning draws of the box task, not on its reported draw (docs/plan.md).

Adam restarts a stalled world (``restart_after``, default 4): a world that has not reached its goal, whose
descent's best loss fell by less than ``restart_progress`` (5 %) over its last 4 evaluations and still ends
outside the position tolerance starts a new descent, the first from the straight-line command itself, later
ones from it plus N(0, ``restart_noise``). A noisy first guess can send the robot into a basin the gradient
does not lead out of (on the box task: riding off the pallet's side and ending turned across the goal, 0.3 m
from it, the loss flat for tens of iterations); the straight-line command rarely leads there. Chosen
on the box task's seeds 0-4 and scored on seeds 5-8, never tuned on (docs/plan.md).

Adam steps along drive axes (``adam_axes="drive"``, the default; `drive_axes`): its per-coordinate
moments and steps live in the coordinates forward speed (every channel together), turn (left and right
apart, at ``turn_step`` = 0.5 of the step) and the further channels' offsets (the rear wheel's), mapped
back to the channels' knots for the rollout; the loss, the bounds and the gradient are the channels'. Adam's
early steps are near sign steps, so on the channels' own axes (``"channels"``) every knot of every side
moves by about lr and the knots with small, noisy gradients turn the robot as much as those that matter;
along the drive axes a forward step moves the wheels together and turning takes half steps. On the box
task's tuning draws (24 seeds, 600 trials) the median iterations to success fell on 20 seeds of 24 (rose
on 2; 6.5 against 8.5, the median over the seeds), and 591 of the 600 trials succeeded within 30
iterations against 585 (docs/plan.md).

Pull-back. The default, ``"truncated"``, differentiates with the contact geometry held at each
step's converged pose (paper section IV-D): on mesh terrain the full pull-back's sensitivity
grows step after step, and on the box task (benchmarks/bench_control.py, tuning draws) Adam with
backtracking reaches more goals within 30 iterations with it. ``"full"`` also differentiates the
contact geometry's motion with the bodies: the exact gradient of the loss as simulated (the one
checked against central differences).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import newton
import numpy as np

from ingest.transforms import quat_yaw
from sysid.engine import (
    EngineError,
    Simulation,
    SolverOptions,
    SolverOstrich,
    resolve_threads,
    run_threads,
    split_ranges,
)
from sysid.plan.lbfgs import lbfgs_worlds
from sysid.plan.task import ControlTask, LossWeights, PlanError, PlanResult, check_tolerances, spline_basis
from sysid.robot.scenes import RobotDescription, WorldSpec, build_robot_scene, terrain_height
from sysid.simulators.ostrich_model import (
    SLIP_ARRAYS,
    TRIM_SIGN,
    engine_for_scene,
    engine_parameters,
    model_parameters,
    pi_position_targets,
    pi_target_cotangent,
)

__all__ = ["ADAM_AXES", "CHANNELS", "OPTIMIZERS", "ControlTask", "LossWeights", "PlanError", "PlanResult", "Planner",
           "check_tolerances", "lbfgs_worlds", "spline_basis"]  # the task's types and L-BFGS: sysid.plan.task, .lbfgs

CHANNELS = ("sides", "wheels")
OPTIMIZERS = ("adam", "lbfgs")
ADAM_AXES = ("drive", "channels")


def _dyaw_dq(q: np.ndarray) -> np.ndarray:
    """d yaw / d (qx, qy, qz, qw) of quaternions (..., 4), yaw = atan2(2 (w z + x y), 1 - 2 (y^2 + z^2))."""
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    a = 2 * (w * z + x * y)
    b = 1 - 2 * (y * y + z * z)
    den = a * a + b * b
    da = np.stack([2 * y, 2 * x, 2 * w, 2 * z], axis=-1)
    db = np.stack([np.zeros_like(x), -4 * y, -4 * z, np.zeros_like(x)], axis=-1)
    dyaw: np.ndarray = (b[..., None] * da - a[..., None] * db) / den[..., None]
    return dyaw


class Planner:
    """Wheel-command optimisation for a batch of trials (one world each) with identified
    parameters ``params`` (any subset of `sysid.simulators.ostrich.PARAMETERS`; the rest at the robot's
    nominals).

    duration [s], dt [s]: horizon and engine step (steps = round(duration / dt)); knots: K;
    u_max [rad/s]: bound on every knot's magnitude (default: 3 m/s of wheel rim speed); pullback:
    "truncated" (the default) or "full" (`sysid.engine.Simulation`'s ``pullback``);
    newton_iters, pcr_iters: the solver's iterations per step (the fit's defaults); adjoint_solver: the
    backward's solve (`SolverOptions.adjoint_solver`): "krylov" (default here: the per-world device GMRES,
    faster than "lu" at the same box success; docs/results.md); threads: on the CPU the
    trials are split into that many parts, each its own Simulation, evaluated on worker threads
    (`sysid.engine.run_threads`; None: `sysid.engine.resolve_threads`' default, 2 where the CPU has 2
    cores, ``SYSID_THREADS``); every trial's loss and gradient are the one-thread batch's bit for bit (the
    worlds never touch)."""

    def __init__(
        self,
        robot: RobotDescription,
        params: Mapping[str, float],
        tasks: Sequence[ControlTask],
        *,
        duration: float = 6.0,
        dt: float = 0.1,
        knots: int = 10,
        channels: str = "sides",
        weights: LossWeights | None = None,
        u_max: float | None = None,
        pullback: str = "truncated",
        newton_iters: int = 16,
        pcr_iters: int = 16,
        adjoint_solver: str = "krylov",
        device: str | None = None,
        threads: int | None = None,
        friction_combine: str = "wheel",
    ):
        if not tasks:
            raise PlanError("no tasks to plan: give at least one ControlTask")
        if not (math.isfinite(duration) and duration > 0 and math.isfinite(dt) and 0 < dt <= duration):
            raise PlanError(f"duration ({duration} s) and dt ({dt} s) must be positive, with dt <= duration")
        if channels not in CHANNELS:
            raise PlanError(f"channels must be one of {CHANNELS}, got {channels!r}")
        if pullback not in ("full", "truncated"):
            raise PlanError(f"pullback must be 'full' or 'truncated', got {pullback!r}")
        self.desc = robot
        try:
            self.theta = engine_parameters(robot, params)
        except (KeyError, ValueError) as exc:
            raise PlanError(f"parameters: {exc}") from None
        self.tasks = list(tasks)
        self.duration, self.dt, self.knots = float(duration), float(dt), int(knots)
        self.steps = max(1, int(round(self.duration / self.dt)))
        self.weights = weights or LossWeights()
        self.u_max = float(u_max) if u_max is not None else 3.0 / robot.wheel_radius
        if not (math.isfinite(self.u_max) and self.u_max > 0):
            raise PlanError(f"u_max must be a positive wheel speed [rad/s], got {u_max}")
        self.pullback = pullback
        sides = list(dict.fromkeys(robot.wheel_sides))
        if channels == "sides":
            self.channels = tuple(sides)
            self._chan = np.array([sides.index(s) for s in robot.wheel_sides])
        else:
            self.channels = tuple(robot.wheel_names)
            self._chan = np.arange(len(robot.wheel_names))
        # world specs: starts on terrain rest on its surface
        specs = []
        for t in self.tasks:
            z = None
            if t.terrain is not None:
                assert t.terrain_resolution is not None  # ControlTask requires it with a terrain
                z = terrain_height(t.terrain[0], int(t.terrain_resolution), t.start[0], t.start[1]) + robot.base_height
            start = (float(t.start[0]), float(t.start[1]), float(t.start[2]))
            specs.append(WorldSpec(start=start, pallet=t.pallet, start_z=z, terrain=t.terrain))
        # the identified surfaces' friction (mu_ground, mu_pallet) under the fit's rule (OstrichReplay's option)
        self.friction_combine = friction_combine
        self.scene = build_robot_scene(specs, robot, device=device, ground_per_world=friction_combine != "wheel")
        self._options = SolverOptions(newton_iters=int(newton_iters), pcr_iters=int(pcr_iters),
                                      adjoint_solver=adjoint_solver)
        try:
            self._options.validate()
        except ValueError as exc:
            raise PlanError(f"solver options: {exc}") from None
        self._engine: tuple[SolverOstrich, Simulation] | None = None  # built on first use (`sim`)
        m = self.scene.model
        s = m.state()
        # newton types a model's arrays as optional (a finalized model has them all)
        assert m.joint_q is not None and m.joint_qd is not None and m.joint_qd_start is not None
        # newton annotates joint_q as wp.array[wp.float32] and eval_fk's argument as wp.array[float], one dtype
        newton.eval_fk(m, m.joint_q, m.joint_qd, s)  # type: ignore[arg-type]
        assert s.body_q is not None
        self.q0 = s.body_q.numpy()
        self.qd0 = np.zeros((m.body_count, 6), np.float32)
        self.B = spline_basis(self.knots, self.duration, self.dt, self.steps, self.theta["cmd_delay"])
        dof = m.joint_qd_start.numpy()
        self._dofs = np.array([[dof[j] for j in h.wheel_joints] for h in self.scene.handles])  # (W, wheels)
        assert m.joint_q_start is not None
        coord = m.joint_q_start.numpy()
        self._coords = np.array([[coord[j] for j in h.wheel_joints] for h in self.scene.handles])  # (W, wheels)
        self._trim = np.array([1.0 + TRIM_SIGN[s] * self.theta["cmd_trim"] for s in robot.wheel_sides])
        self._chassis = np.array([h.chassis for h in self.scene.handles])
        self._ref = np.stack([self._reference(t) for t in self.tasks])  # (W, steps + 1, 2)
        self.evaluations = 0
        try:
            self.threads = resolve_threads(threads, m.device)
        except EngineError as exc:
            raise PlanError(str(exc)) from None
        # the trials split into parts of their own, evaluated on worker threads (loss_and_grad, rollout); this
        # Planner's own Simulation of all trials (`sim`) is then never built
        self._ranges = split_ranges(len(self.tasks), self.threads) if self.threads > 1 else []
        self._parts: list[Planner] = []
        self._part_calls: list[int] = []
        if len(self._ranges) > 1:
            self._parts = [
                Planner(robot, params, [self.tasks[i] for i in r], duration=duration, dt=dt, knots=knots,
                        channels=channels, weights=self.weights, u_max=self.u_max, pullback=pullback,
                        newton_iters=newton_iters, pcr_iters=pcr_iters, adjoint_solver=adjoint_solver, device=device,
                        threads=1, friction_combine=friction_combine)
                for r in self._ranges
            ]
            self._part_calls = [0] * len(self._parts)
            # the parts' bodies, concatenated in order, must be this scene's (loss_and_grad's info["Q"])
            offsets = np.cumsum([0] + [pt.scene.model.body_count for pt in self._parts])
            ours = np.concatenate([pt._chassis + o for pt, o in zip(self._parts, offsets, strict=False)])
            if offsets[-1] != m.body_count or not np.array_equal(ours, self._chassis):
                self._parts, self._ranges, self._part_calls = [], [], []

    # ------------------------------------------------------------------ set-up
    @property
    def worlds(self) -> int:
        return len(self.tasks)

    @property
    def solver(self) -> SolverOstrich:
        """The solver of all trials in one model (built with `sim` on first use)."""
        return self._built()[0]

    @property
    def sim(self) -> Simulation:
        """The `Simulation` of all trials in one model, built on first use: a Planner whose trials are split
        across threads evaluates them in its parts' Simulations and never builds this one."""
        return self._built()[1]

    def _built(self) -> tuple[SolverOstrich, Simulation]:
        if self._engine is None:
            solver, sim = engine_for_scene(self.scene, self._options, pullback=self.pullback, dt=self.dt,
                                           friction_combine=self.friction_combine)
            sim.set_parameters({k: self.theta[k] for k in model_parameters(sim)})
            self._engine = (solver, sim)
        return self._engine

    def _reference(self, task: ControlTask) -> np.ndarray:
        if task.reference is not None:
            ref = np.asarray(task.reference, float)
            if ref.shape != (self.steps + 1, 2):
                raise PlanError(
                    f"a task's reference path has shape {ref.shape}; it needs ({self.steps + 1}, 2): "
                    "x, y [m] at every step of the horizon, the start included"
                )
            return ref
        a = np.linspace(0.0, 1.0, self.steps + 1)[:, None]
        line: np.ndarray = (1 - a) * np.asarray(task.start[:2], float) + a * np.asarray(task.goal[:2], float)
        return line

    def straight_guess(self) -> np.ndarray:
        """(W, K, C) knots [rad/s] of the constant command that covers each trial's straight-line
        distance to its goal in the horizon (every wheel at the same speed): a neutral first guess."""
        U = np.zeros((self.worlds, self.knots, len(self.channels)))
        for w, t in enumerate(self.tasks):
            d = math.hypot(t.goal[0] - t.start[0], t.goal[1] - t.start[1])
            U[w] = min(d / self.duration / self.desc.wheel_radius, self.u_max)
        return U

    def drive_axes(self, turn_step: float = 0.5) -> np.ndarray:
        """(C, C) matrix M whose rows are the directions Adam steps along with ``adam_axes="drive"``
        (`optimize`): a knot's channel values are u = z M for drive coordinates z. Row 0 drives forward
        (every channel together), row 1 turns (the left channels by -turn_step, the right ones by
        +turn_step), and every channel but the first left and the first right has a row of its own (the
        rear wheel's offset from the forward speed; a second wheel's offset from its side's first). Every
        robot has driven wheels on both sides (`RobotDescription`), so M is invertible."""
        side = [self.desc.wheel_sides[list(self._chan).index(c)] for c in range(len(self.channels))]
        C = len(self.channels)
        first = (side.index("left"), side.index("right"))
        turn = [-turn_step if s == "left" else turn_step if s == "right" else 0.0 for s in side]
        return np.array([np.ones(C), turn] + [np.eye(C)[c] for c in range(C) if c not in first])

    def wheel_targets(self, U: np.ndarray) -> np.ndarray:
        """(W, steps, wheels) wheel-servo targets [rad/s] of knots U (W, K, C)."""
        U = self._check_knots(U)
        per_channel = np.einsum("tk,wkc->wtc", self.B, U)
        targets: np.ndarray = per_channel[:, :, self._chan] * self._trim
        return targets

    def commands(self, U: np.ndarray) -> np.ndarray:
        """(W, steps, wheels) wheel commands [rad/s] to send at each step's start: the splines at the
        send time (no delay; the model's cmd_delay is then the wheels' lag behind them), trimmed."""
        U = self._check_knots(U)
        B0 = spline_basis(self.knots, self.duration, self.dt, self.steps, 0.0)
        commands: np.ndarray = np.einsum("tk,wkc->wtc", B0, U)[:, :, self._chan] * self._trim
        return commands

    def _check_knots(self, U: np.ndarray) -> np.ndarray:
        U = np.asarray(U, float)
        want = (self.worlds, self.knots, len(self.channels))
        if U.shape != want:
            raise PlanError(
                f"knots have shape {U.shape}; the planner needs {want} (worlds, knots, channels {list(self.channels)})"
            )
        if not np.isfinite(U).all():
            raise PlanError("knots are not finite")
        return U

    # ------------------------------------------------------------------ loss
    def rollout(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward rollout of knots U: body_q (steps+1, nb, 7) and body_qd (steps+1, nb, 6), nb this planner's
        bodies (a threaded planner's parts, concatenated in order)."""
        U = self._check_knots(U)
        if not self._parts:
            return self._rollout(U)[:2]
        outs = [pt.rollout(U[r.start:r.stop]) for pt, r in zip(self._parts, self._ranges, strict=True)]
        self.evaluations += 1
        return np.concatenate([o[0] for o in outs], axis=1), np.concatenate([o[1] for o in outs], axis=1)

    def _rollout(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """`rollout` in this planner's own Simulation, with the per-step slip schedules it ran with."""
        wt = self.wheel_targets(U)
        m = self.scene.model
        tq = np.zeros((self.steps, m.joint_dof_count), np.float32)
        for w in range(self.worlds):
            tq[:, self._dofs[w]] = wt[w]
        step_arrays = {}
        for ratio, (array, base) in SLIP_ARRAYS.items():
            if self.theta[ratio] > 0:
                # the wheels' slip speed follows their commanded rolling speed r |w| (the replay's law)
                sched = np.repeat(getattr(self.solver, array).numpy()[None].astype(np.float64), self.steps, axis=0)
                for w, h in enumerate(self.scene.handles):
                    for i, s in enumerate(h.wheel_shapes):
                        sched[:, s] = self.theta[base] + self.theta[ratio] * self.desc.wheel_radius * np.abs(
                            wt[w, :, i] / self._trim[i]
                        )
                step_arrays[array] = sched
        tqp = None
        if self.theta["ki"] > 0:  # PI servos: their position targets, the integrated wheel targets
            tqp = np.zeros((self.steps, m.joint_coord_count), np.float32)
            for w in range(self.worlds):
                tqp[:, self._coords[w]] = pi_position_targets(wt[w], self.dt, self.theta["cmd_scale"])
        Q, QD = self.sim.forward(self.q0, self.qd0, self.steps, tq, tqp, step_arrays=step_arrays or None)
        self.evaluations += 1
        return Q, QD, step_arrays

    def terms(self, U: np.ndarray, Q: np.ndarray, QD: np.ndarray) -> dict[str, np.ndarray]:
        """Per-world loss terms (unweighted) and the final errors of a rollout."""
        ch = self._chassis
        goal = np.array([t.goal for t in self.tasks], float)
        p = Q[:, ch, :2].astype(float)  # (steps+1, W, 2)
        dp = p[-1] - goal[:, :2]
        yaw = quat_yaw(Q[-1, ch, 3:7].astype(float))
        dyaw = np.angle(np.exp(1j * (yaw - goal[:, 2])))
        v = QD[-1, ch, :2].astype(float)
        track = np.mean(np.sum((p[1:] - self._ref.transpose(1, 0, 2)[1:]) ** 2, axis=-1), axis=0)
        return {
            "position": np.sum(dp**2, axis=1),
            "yaw": 2 * (1 - np.cos(dyaw)),
            "speed": np.sum(v**2, axis=1),
            "track": track,
            "effort": np.mean(U**2, axis=(1, 2)),
            "smooth": np.mean(np.diff(U, axis=1) ** 2, axis=(1, 2)),
            "position_error": np.sqrt(np.sum(dp**2, axis=1)),
            "yaw_error": np.abs(dyaw),
            "terminal_speed": np.sqrt(np.sum(v**2, axis=1)),
        }

    def loss(self, terms: Mapping[str, np.ndarray]) -> np.ndarray:
        w = self.weights
        return (
            w.position * terms["position"]
            + w.yaw * terms["yaw"]
            + w.speed * terms["speed"]
            + w.track * terms["track"]
            + w.effort * terms["effort"]
            + w.smooth * terms["smooth"]
        )

    def loss_and_grad(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Per-world loss (W,), its gradient in the knots (W, K, C) and the rollout's details."""
        U = self._check_knots(U)
        if self._parts:
            return self._loss_and_grad_threads(U)
        Q, QD, step_arrays = self._rollout(U)
        terms = self.terms(U, Q, QD)
        L = self.loss(terms)
        w = self.weights
        ch = self._chassis
        T = self.steps
        goal = np.array([t.goal for t in self.tasks], float)
        gQ = np.zeros(Q.shape, np.float64)
        gQD = np.zeros(QD.shape, np.float64)
        p = Q[:, ch, :2].astype(float)
        gQ[T, ch, :2] += 2 * w.position * (p[-1] - goal[:, :2])
        q = Q[T, ch, 3:7].astype(float)
        dyaw = quat_yaw(q) - goal[:, 2]
        gQ[T, ch, 3:7] += (w.yaw * 2 * np.sin(dyaw))[:, None] * _dyaw_dq(q)
        gQD[T, ch, :2] += 2 * w.speed * QD[T, ch, :2]
        gQ[1:, ch, :2] += 2 * w.track / T * (p[1:] - self._ref.transpose(1, 0, 2)[1:])
        g = self.sim.backward(gQ.astype(np.float32), gQD.astype(np.float32))
        # d L / d wheel target -> d L / d knots: targets = B U[:, chan] trim (and the slip schedules)
        assert g.targets_qd is not None  # the forward had wheel targets
        gt = np.stack([g.targets_qd[:, self._dofs[wi]] for wi in range(self.worlds)]).astype(float)  # (W, T, wheels)
        wt = self.wheel_targets(U)
        if self.theta["ki"] > 0:
            assert g.targets_q is not None  # the forward had position targets
            sc = self.theta["cmd_scale"]
            for wi in range(self.worlds):
                gt[wi] += pi_target_cotangent(g.targets_q[:, self._coords[wi]], wt[wi], self.dt, sc)
        for ratio, (array, _base) in SLIP_ARRAYS.items():
            if array in step_arrays:
                gs = g.step_arrays[array]
                for wi, h in enumerate(self.scene.handles):
                    for i, s in enumerate(h.wheel_shapes):
                        # slip = base + ratio r |target / trim|
                        gt[wi, :, i] += (
                            gs[:, s]
                            * self.theta[ratio]
                            * self.desc.wheel_radius
                            * np.sign(wt[wi, :, i])
                            / self._trim[i]
                        )
        gt *= self._trim
        gU = np.zeros_like(U)
        for i, c in enumerate(self._chan):
            gU[:, :, c] += np.einsum("tk,wt->wk", self.B, gt[:, :, i])
        K, C = self.knots, len(self.channels)
        gU += w.effort * 2 * U / (K * C)
        dU = np.diff(U, axis=1)
        gs = w.smooth * 2 * dU / ((K - 1) * C)
        gU[:, 1:] += gs
        gU[:, :-1] -= gs
        info = {
            "Q": Q,
            "QD": QD,
            "terms": terms,
            "residual_max": self.sim.step_residuals.max(axis=0),
            "adjoint_converged": g.converged,
        }
        return L, gU, info

    def _loss_and_grad_threads(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """loss_and_grad with the trials split across the parts, one worker thread each; a part's first two
        calls run alone on the calling thread (kernel loads, then the step and adjoint recordings its later
        calls replay on a worker thread)."""
        parts, ranges = self._parts, self._ranges

        def job(k: int) -> Callable[[], tuple[np.ndarray, np.ndarray, dict[str, Any]]]:
            return lambda: parts[k].loss_and_grad(U[ranges[k].start:ranges[k].stop])

        alone = [c < 2 for c in self._part_calls]
        outs = run_threads([job(k) for k in range(len(parts))], ("plan", id(self)), alone)
        self._part_calls = [c + 1 for c in self._part_calls]
        self.evaluations += 1
        infos = [o[2] for o in outs]
        info = {
            "Q": np.concatenate([i["Q"] for i in infos], axis=1),
            "QD": np.concatenate([i["QD"] for i in infos], axis=1),
            "terms": {k: np.concatenate([i["terms"][k] for i in infos]) for k in infos[0]["terms"]},
            "residual_max": np.concatenate([i["residual_max"] for i in infos]),
            "adjoint_converged": np.concatenate([i["adjoint_converged"] for i in infos]),
        }
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs]), info

    # ------------------------------------------------------------------ optimisation
    def success(self, terms: Mapping[str, np.ndarray], position_tol: float = 0.2, speed_tol: float = 0.3,
                yaw_tol: float | None = None) -> np.ndarray:
        """Per world: final position error below ``position_tol`` [m] and terminal speed below
        ``speed_tol`` [m/s] (the paper's box-traversal criterion), and, when ``yaw_tol`` [rad] is given, the
        final heading within it of the goal's."""
        ok = (terms["position_error"] < position_tol) & (terms["terminal_speed"] < speed_tol)
        if yaw_tol is not None:
            ok &= terms["yaw_error"] < yaw_tol
        return np.asarray(ok)

    def optimize(
        self,
        U0: np.ndarray | None = None,
        *,
        optimizer: str = "adam",
        iterations: int = 50,
        lr: float = 0.3,
        lr_final: float = 0.3,
        position_tol: float = 0.2,
        speed_tol: float = 0.3,
        yaw_tol: float | None = None,
        progress: Callable[[int, np.ndarray], None] | None = None,
        backtrack: float | None = 2.0,
        backtrack_shrink: float = 0.5,
        backtrack_grow: float = 1.5,
        restart_after: int | None = 4,
        restart_progress: float = 0.05,
        restart_noise: float = 0.5,
        restart_distance: float | None = None,
        restart_seed: int = 0,
        adam_axes: str = "drive",
        turn_step: float = 0.5,
    ) -> PlanResult:
        """Optimise the knots from U0 (default `straight_guess`) for ``iterations`` forward +
        backward evaluations and return the best iterate per world.

        lr [rad/s]: Adam's step size, decayed along a cosine to ``lr_final`` x lr at the last
        iteration (1: constant); with L-BFGS the RMS knot change of a steepest-descent step (the
        first, and after a restart: `lbfgs_worlds`); backtrack (a loss ratio >= 1, or None: plain Adam),
        backtrack_shrink, backtrack_grow: Adam's per-world backtracking (the defaults: module
        docstring); restart_after (evaluations, or None: off), restart_progress (share of the loss),
        restart_noise [rad/s], restart_distance [m] (default position_tol), restart_seed: Adam's per-world
        restarts (module docstring; the count per world: `PlanResult.restarts`);
        position_tol [m], speed_tol [m/s], yaw_tol [rad] (None: any heading): the success criterion (`success`);
        adam_axes: the directions Adam's per-coordinate steps follow: "drive" (default) forward speed, turning
        at ``turn_step`` x the step, and the other channels' offsets (`drive_axes`; the module docstring
        says why), or "channels" (each channel's knots on their own);
        ``progress(i, loss)`` after every evaluation."""
        if optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if not (isinstance(iterations, int) and iterations >= 1):
            raise PlanError(f"iterations must be a positive whole number, got {iterations!r}")
        if not (math.isfinite(lr) and lr > 0):
            raise PlanError(f"lr must be a positive step size [rad/s], got {lr}")
        check_tolerances(position_tol, speed_tol, yaw_tol)
        if not (math.isfinite(lr_final) and 0 < lr_final <= 1):
            raise PlanError(f"lr_final must be in (0, 1] (the last step's share of lr), got {lr_final}")
        if backtrack is not None and not (math.isfinite(backtrack) and backtrack >= 1):
            raise PlanError(f"backtrack must be None or a loss ratio >= 1, got {backtrack}")
        if not (0 < backtrack_shrink <= 1 and 1 <= backtrack_grow < math.inf):
            raise PlanError(
                f"backtrack_shrink must be in (0, 1] and backtrack_grow >= 1; got {backtrack_shrink}, {backtrack_grow}"
            )
        if restart_after is not None and not (isinstance(restart_after, int) and restart_after >= 1):
            raise PlanError(
                f"restart_after must be None (off) or a positive number of evaluations, got {restart_after!r}")
        if not (math.isfinite(restart_noise) and restart_noise >= 0):
            raise PlanError(f"restart_noise must be a non-negative knot noise [rad/s], got {restart_noise}")
        if not (math.isfinite(restart_progress) and 0 <= restart_progress < 1):
            raise PlanError(f"restart_progress must be in [0, 1) (a share of the loss), got {restart_progress}")
        if restart_distance is not None and not (math.isfinite(restart_distance) and restart_distance >= 0):
            raise PlanError(f"restart_distance must be None or a non-negative distance [m], got {restart_distance}")
        if adam_axes not in ADAM_AXES:
            raise PlanError(f"adam_axes must be one of {ADAM_AXES}, got {adam_axes!r}")
        if not (math.isfinite(turn_step) and turn_step > 0):
            raise PlanError(f"turn_step must be a positive share of Adam's step, got {turn_step}")
        U = np.clip(self._check_knots(self.straight_guess() if U0 is None else U0), -self.u_max, self.u_max)
        W = self.worlds
        best = {
            "loss": np.full(W, np.inf),
            "U": U.copy(),
            "g": np.zeros_like(U),
            "Q": None,
            "terms": None,
            "res": np.zeros(W),
            "ok": np.zeros(W, bool),
        }
        history: list[np.ndarray] = []
        term_hist: list[dict[str, np.ndarray]] = []
        first_success = np.full(W, -1)
        times: list[float] = []

        def evaluate(Ux: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            t0 = time.perf_counter()
            L, gU, info = self.loss_and_grad(Ux)
            times.append(time.perf_counter() - t0)
            i = len(history)
            history.append(L.copy())
            term_hist.append({k: np.asarray(v, float).copy() for k, v in info["terms"].items()})
            ok = self.success(info["terms"], position_tol, speed_tol, yaw_tol)
            first_success[(first_success < 0) & ok] = i
            # the kept iterate: the lowest loss among those that reach the goal, else the lowest loss (the
            # loss weighs heading and tracking too, so a lower loss may end outside the tolerances)
            better = np.where(best["ok"], ok & (L < best["loss"]), ok | (L < best["loss"]))
            best["ok"][better] = ok[better]
            best["g"][better] = gU[better]
            if best["Q"] is None:
                best["Q"] = info["Q"][:, self._chassis].copy()
                best["terms"] = {k: v.copy() for k, v in info["terms"].items()}
            best["loss"][better] = L[better]
            best["U"][better] = Ux[better]
            best["Q"][:, better] = info["Q"][:, self._chassis[better]]
            best["res"][better] = info["residual_max"][better]
            for k, v in info["terms"].items():
                best["terms"][k][better] = v[better]
            if progress is not None:
                progress(i, L)
            return L, gU

        restarts_done = np.zeros(W, int)
        if optimizer == "adam":
            # Adam's moments live in the drive coordinates z (u = z M): its gradient is g M^T, its step dz M
            # (None: the channels' own axes, the knots untransformed)
            M = self.drive_axes(turn_step) if adam_axes == "drive" else None
            m1 = np.zeros_like(U)
            m2 = np.zeros_like(U)
            b1, b2, eps = 0.9, 0.999, 1e-8
            t = np.zeros(W)  # per-world Adam step count (a backtrack restarts it)
            scale = np.ones(W)  # per-world share of lr
            # the current descent's best (a restart begins a new descent; `best` keeps the overall one)
            run = {"loss": np.full(W, np.inf), "U": U.copy(), "g": np.zeros_like(U), "start": np.zeros(W, int),
                   "dist": np.full(W, np.inf)}
            run_best = np.full((iterations, W), np.inf)  # each evaluation's running best of its world's descent
            far = position_tol if restart_distance is None else restart_distance
            straight = self.straight_guess()
            # a world's first restart goes to the straight-line command unless it started there; later ones add noise
            from_straight = np.isclose(U, np.clip(straight, -self.u_max, self.u_max)).all(axis=(1, 2))

            def reset_adam(mask: np.ndarray) -> None:
                m1[mask] = 0.0
                m2[mask] = 0.0
                t[mask] = 0

            for k in range(1, iterations + 1):
                L, gU = evaluate(U)
                if k == iterations:
                    break
                i = k - 1  # this evaluation's index
                low = L < run["loss"]
                run["g"][low] = gU[low]
                run["U"][low] = U[low]
                run["loss"][low] = L[low]
                run["dist"][low] = term_hist[-1]["position_error"][low]
                run_best[i] = run["loss"]
                if restart_after is not None:
                    # a world that has not met the goal, whose descent's best loss fell by less than
                    # restart_progress over its last restart_after evaluations and still ends farther than
                    # `far` from the goal starts a new descent: the stalls seen on the box task are other
                    # basins (the robot riding off the pallet's side, ending turned across the goal),
                    # entered from a noisy first guess; the straight-line command rarely leads there
                    ago = np.maximum(i - restart_after, 0)
                    restarted = ((i - run["start"] >= restart_after) & (first_success < 0) & (run["dist"] > far)
                                 & (run_best[i] > (1.0 - restart_progress) * run_best[ago, np.arange(W)]))
                else:
                    restarted = np.zeros(W, bool)
                if backtrack is not None:
                    # a world whose loss rose above backtrack x its descent's best restarts from that
                    # iterate (and its gradient) with a shorter step; a new best lengthens it
                    back = (L > backtrack * run["loss"]) & ~restarted
                    if back.any():
                        U[back] = run["U"][back]
                        gU = np.where(back[:, None, None], run["g"], gU)
                        reset_adam(back)
                        scale[back] *= backtrack_shrink
                    improved = (L <= run["loss"]) & ~restarted
                    scale[improved] = np.minimum(1.0, scale[improved] * backtrack_grow)
                t += 1
                gz = gU if M is None else gU @ M.T
                m1 = b1 * m1 + (1 - b1) * gz
                m2 = b2 * m2 + (1 - b2) * gz**2
                rate = lr * (
                    lr_final + (1 - lr_final) * 0.5 * (1 + math.cos(math.pi * (k - 1) / max(1, iterations - 2)))
                )
                c1 = (1 - b1**t)[:, None, None]
                c2 = (1 - b2**t)[:, None, None]
                step = (rate * scale)[:, None, None] * (m1 / c1) / (np.sqrt(m2 / c2) + eps)
                U = np.clip(U - (step if M is None else step @ M), -self.u_max, self.u_max)
                if restarted.any():
                    for w in np.flatnonzero(restarted):
                        # the noise of a world's n-th restart is its own draw (independent of the other worlds)
                        n = int(restarts_done[w])
                        noise = np.random.default_rng((restart_seed, int(w), n)).normal(
                            0.0, restart_noise, U[w].shape) if n or from_straight[w] else 0.0
                        U[w] = np.clip(straight[w] + noise, -self.u_max, self.u_max)
                    restarts_done[restarted] += 1
                    reset_adam(restarted)
                    scale[restarted] = 1.0
                    run["loss"][restarted] = np.inf
                    run["start"][restarted] = k  # the new descent's first evaluation
                    run["dist"][restarted] = np.inf
        else:
            lbfgs_worlds(evaluate, U, iterations, -self.u_max, self.u_max, lr)
        H = np.asarray(history)
        terms = best["terms"]
        return PlanResult(
            knots=best["U"],
            targets=self.wheel_targets(best["U"]),
            commands=self.commands(best["U"]),
            times=np.arange(self.steps) * self.dt,
            chassis=best["Q"].transpose(1, 0, 2),
            loss=best["loss"],
            history=H,
            best_history=np.minimum.accumulate(H, axis=0),
            position_error=terms["position_error"],
            yaw_error=terms["yaw_error"],
            terminal_speed=terms["terminal_speed"],
            success=self.success(terms, position_tol, speed_tol, yaw_tol),
            iterations_to_success=first_success,
            term_history={k: np.asarray([h[k] for h in term_hist]) for k in term_hist[0]},
            iteration_s=times,
            residual_max=best["res"],
            restarts=restarts_done,
            channels=self.channels,
            wheel_names=tuple(self.desc.wheel_names),
            optimizer=optimizer,
            pullback=self.pullback,
        )
