"""Benchmark: gradient-based planning through the engine, the paper's two experiments (section IV-B
and IV-D) on this robot with identified parameters, and newton's SolverSemiImplicit + wp.Tape on
the box task under the same protocol.

(1) Box traversal (control synthesis). 25 trials from one seeded RNG: start perturbed by U(-0.1,
0.1) m in x and y and U(-0.1, 0.1) rad in yaw; a 1.2 x 0.8 x 0.144 m box (the pallet) at x = 1.5 m;
goal x = 3 m, y ~ U(-0.3, 0.3) m, yaw ~ U(-0.3, 0.3) rad, to be reached and stopped at. 6 s
horizon at h = 0.1 s (60 steps), K = 10 knots per wheel side (30 numbers), loss of
`sysid.plan.control` (final position, heading, terminal speed, straight-line tracking, effort,
smoothness; default weights), first guess the constant straight-line command plus N(0, 0.5 rad/s)
per knot (one per trial), 50 Adam iterations at lr 0.3 rad/s with the planner's defaults (per-trial
backtracking, step decayed along a cosine to 0.3 lr, steps along drive axes, restarts of stalled trials,
truncated pull-back: `sysid.plan.control`),
all trials as parallel worlds of one model. Success: final position error < 0.2 m and terminal
speed < 0.3 m/s (the paper's criterion), counted within 50 and within 30 iterations (evaluations).
The reported draw is seed 0 (`--box-seed`); the planner's defaults were chosen on seeds 100-2400, its
restarts on seeds 0-4; seeds 5-8 were drawn after and never tuned on. `--box-verbose`: one line per trial
(start, goal, first success, the kept plan's errors, restarts).

(2) Terrain traversal. Per seed: a 24 x 24 m sum-of-sinusoids mesh (80 x 80 cells, 12,800
faces), a random target spline (K = 10, base speed U(0.5, 1.2) m/s per knot, left/right
correlated: base +- N(0, 0.4 rad/s), rear at base), its simulated trajectory as the reference, a
first guess = target + N(0, 1.5 rad/s); 10 s at h = 0.08 s (125 steps); loss: per-step position
tracking (weight 1), final position 0.1, final heading 0.1, effort 1e-4, smoothness 1e-3; the
planner's per-world L-BFGS (`--terrain-optimizer`, default; first step 0.3 rad/s RMS) or Adam (lr
0.3, the planner's defaults), 100 forward + backward evaluations; figure: each seed's best tracking
RMSE over the iterations; full vs truncated pull-back. The reported draw is 0 (`--terrain-draw`); the
optimiser and pull-back were chosen on draws 1 and 2 (8 seeds each, docs/plan.md), never on draw 0.

Peers. SolverSemiImplicit (penalty contact of bench_engine.py) at its largest stable step for
gradients (0.5 ms, 12,000 steps per 6 s; the paper's setting) on the box task: the same knots,
loss and Adam (plain: constant lr, no backtracking), its gradient from wp.Tape over every step
(contacts from collision outside the tape, one buffer per step); and on terrain seeds
(`--semi-terrain-seeds`, 20,000 taped steps per 10 s iteration), with its own simulated target
trajectory as the reference and the same per-world L-BFGS. More than one box trial (`--semi-trials`)
or terrain seed runs as worlds of one SemiImplicit model, differentiated with gradient checkpointing
(`--semi-segment` steps per taped segment: one tape over 12,000 steps x 64 worlds would hold ~250 GB;
the checkpointed gradient equals the one-tape one, tests/app); so does the wall time per iteration at
more worlds (`--semi-timing-worlds 64`). MJX (`--mjx-trials`, the `mjx` extra: mujoco-mjx 3.17.0 and jax
0.10.2 from the package index, on the CPU): the same trials, knots, loss and plain Adam through a jit-compiled
`jax.vmap(jax.value_and_grad(...))` of a `lax.scan` rollout at its largest stable step, with the settings that
make MJX differentiable (benchmarks/mjx_peer.py); and on terrain seeds (`--mjx-terrain-seeds`): each seed's
terrain as a height field of the same grid, vmapped elevation data, sphere wheels and the chassis out of
collision (MJX's tyre-vs-height-field collision costs ~2,000x on CPU: mjx_peer's docstring), at its largest
stable terrain step (`--mjx-terrain-find-dt`: 3 ms), its own simulated target trajectory as each reference and
the same per-world L-BFGS. The peers' terrain lines come after this engine's terrain runs and give the time
ratio to them when the seeds match.

SemiImplicit's terrain run at the paper's size keeps a journal of its evaluations and replays it on the
next start (`--semi-terrain-journal FILE`), as MJX's box run resumes from its state (`--mjx-state FILE`), so
both can span sessions; `--semi-terrain-workers N` splits its worlds across N processes (one core each).
Latest figures: benchmarks/README.md; every measurement with its command, date and commit: docs/results.md.

    python benchmarks/bench_control.py                       # the defaults below (CPU: ~10 min)
    python benchmarks/bench_control.py --box-trials 25 --box-iterations 50 --terrain-seeds 50 \
        --terrain-iterations 100                              # the paper's protocol (hours on CPU)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import nullcontext as _nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import SEMI_ATTACH, SEMI_CONTACT  # noqa: E402
from mjx_peer import (  # noqa: E402
    MJX_DT,
    MJX_SETTINGS,
    MJX_TERRAIN_DT,
    adam_box,
    find_stable_dt,
    find_terrain_dt,
    gradient_quality,
    lbfgs_terrain,
    mjx_missing,
    references,
    run_mjx,
    run_mjx_terrain,
    terrain_tasks,
    timing_mjx,
)

from ingest.transforms import quat_yaw  # noqa: E402
from sysid.fit.params import load_params  # noqa: E402
from sysid.plan.control import ControlTask, LossWeights, Planner  # noqa: E402
from sysid.robot import load_robot  # noqa: E402
from sysid.robot.scenes import WorldSpec, build_robot_scene, sinusoid_terrain, terrain_height  # noqa: E402

wp.config.quiet = True
PARAMS = Path(__file__).resolve().parents[1] / "models" / "helhest" / "params-pallet-sample.yaml"
PALLET = (1.5, 0.0, 0.0)
TERRAIN_WEIGHTS = LossWeights(position=0.1, yaw=0.1, speed=0.0, track=1.0, effort=1e-4, smooth=1e-3)


def box_tasks(n: int, seed: int = 0) -> tuple[list[ControlTask], np.random.Generator]:
    """``n`` box trials drawn from ``default_rng(seed)`` and the generator, positioned for the first
    guesses' noise (run_box draws it next: the protocol's order)."""
    rng = np.random.default_rng(seed)
    tasks = []
    for _ in range(n):
        start = (rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1))
        goal = (3.0, rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3))
        tasks.append(ControlTask(goal=goal, start=start, pallet=PALLET))
    return tasks, rng


MJX_DT_TRIALS, MJX_DT_SEED = 25, 100  # the first guesses MJX's step search runs (a tuning draw, never seed 0)
PLANNER: dict = {}  # --adjoint-solver: further Planner keywords of every Ostrich run


def run_box(theta: dict, trials: int, iterations: int, lr: float = 0.3, seed: int = 0, **optimize_kw) -> dict:
    desc = load_robot()
    tasks, rng = box_tasks(trials, seed)
    pl = Planner(desc, theta, tasks, duration=6.0, dt=0.1, knots=10, **PLANNER)
    U0 = pl.straight_guess() + rng.normal(0.0, 0.5, (trials, 10, len(pl.channels)))
    t0 = time.perf_counter()
    res = pl.optimize(U0, iterations=iterations, lr=lr, **optimize_kw)
    wall = time.perf_counter() - t0
    its = res.iterations_to_success
    return {
        "trials": trials,
        "iterations": iterations,
        "successes": int(res.success.sum()),
        "within_30": int(((its >= 0) & (its < 30)).sum()),
        "median_iterations_to_success": float(np.median(np.where(its >= 0, its, np.inf))),
        "max_iterations_to_success": int(its.max()) if (its >= 0).all() else None,
        "iterations_to_success": its,
        "median_position_error": float(np.median(res.position_error)),
        "median_terminal_speed": float(np.median(res.terminal_speed)),
        "median_loss": float(np.median(res.loss)),
        "iteration_s": float(np.median(res.iteration_s[1:])),
        "wall_s": wall,
        "U0": U0,
        "tasks": tasks,
        "median_best_history": np.median(res.best_history, axis=1),
        "result": res,
    }


def box_trial_lines(b: dict) -> list[str]:
    """One line per box trial of `run_box`'s result: its start and goal, the first iterate that met the goal,
    the kept plan's final errors and how it got there (the iterate of its lowest loss, backtracks)."""
    res = b["result"]
    lines = []
    for w, task in enumerate(b["tasks"]):
        it = int(res.iterations_to_success[w])
        H = res.history[:, w]
        th = res.term_history
        low = int(np.argmin(H))
        lines.append(
            f"[box] trial {w:2d}: start ({task.start[0]:+.3f}, {task.start[1]:+.3f}, {task.start[2]:+.3f}), goal "
            f"(3, {task.goal[1]:+.3f}, {task.goal[2]:+.3f}); "
            + (f"success at iteration {it}" if it >= 0 else "no success")
            + f"; kept plan: position error {res.position_error[w]:.3f} m, terminal speed "
            f"{res.terminal_speed[w]:.3f} m/s, yaw error {res.yaw_error[w]:.3f} rad, loss {res.loss[w]:.4g}; "
            f"lowest loss at iteration {low}; first loss {H[0]:.4g}; restarts "
            f"{0 if res.restarts is None else int(res.restarts[w])}; iterates within 0.2 m of the goal "
            f"{int((th['position_error'][:, w] < 0.2).sum())}, below 0.3 m/s "
            f"{int((th['terminal_speed'][:, w] < 0.3).sum())}"
        )
    return lines


def box_guesses(theta: dict, trials: int, seed: int = 0) -> tuple[list[ControlTask], np.ndarray]:
    """run_box's trials and first guesses (the straight-line command + N(0, 0.5 rad/s) per knot, drawn in the
    protocol's order) without running the planner: for the peers when --box-trials is 0."""
    tasks, rng = box_tasks(trials, seed)
    pl = Planner(load_robot(), theta, tasks, duration=6.0, dt=0.1, knots=10, **PLANNER)
    return tasks, pl.straight_guess() + rng.normal(0.0, 0.5, (trials, 10, len(pl.channels)))


def run_box_guesses(theta: dict, trials: int, iterations: int, guesses: int, lr: float = 0.3) -> dict:
    """The box protocol with ``guesses`` first guesses per trial as extra worlds (guess 0 the
    protocol's own, the others the straight-line command + another N(0, 0.5 rad/s) draw); a trial
    succeeds when any of its worlds does, at the first iteration one does."""
    desc = load_robot()
    tasks, rng = box_tasks(trials)
    pl = Planner(desc, theta, [t for t in tasks for _ in range(guesses)], duration=6.0, dt=0.1, knots=10, **PLANNER)
    straight = pl.straight_guess()
    U_first = rng.normal(0.0, 0.5, (trials, 10, len(pl.channels)))  # run_box's draw, in its order
    extra = np.random.default_rng(7).normal(0.0, 0.5, (trials, guesses - 1, 10, len(pl.channels)))
    noise = np.concatenate([U_first[:, None], extra], axis=1).reshape(trials * guesses, 10, -1)
    res = pl.optimize(straight + noise, iterations=iterations, lr=lr)
    its = res.iterations_to_success.reshape(trials, guesses)
    ok = (its >= 0).any(axis=1)
    first = np.where(ok, np.where(its >= 0, its, 10**9).min(axis=1), -1)
    return {
        "trials": trials,
        "guesses": guesses,
        "iterations": iterations,
        "successes": int(ok.sum()),
        "median_iterations_to_success": float(np.median(np.where(first >= 0, first, np.inf))),
        "within_30": int(((first >= 0) & (first < 30)).sum()),
        "iteration_s": float(np.median(res.iteration_s[1:])),
        "worlds": trials * guesses,
    }


def timing_box(theta: dict, worlds: int, iterations: int = 5, warmup: int = 3) -> float:
    """Median warm wall time of one forward + backward iteration on ``worlds`` box trials [s], over
    ``iterations`` after ``warmup`` (the first uses run eagerly, then each step-system size is recorded
    once: `sysid.engine.graphs`)."""
    desc = load_robot()
    tasks, rng = box_tasks(worlds, seed=1)
    pl = Planner(desc, theta, tasks, duration=6.0, dt=0.1, knots=10, **PLANNER)
    res = pl.optimize(
        pl.straight_guess() + rng.normal(0, 0.5, (worlds, 10, len(pl.channels))), iterations=iterations + warmup
    )
    return float(np.median(res.iteration_s[warmup:]))


def timing_semi(theta: dict, worlds: int, dt: float = 5e-4, segment: int = 100, iterations: int = 1) -> float:
    """Wall time of one SemiImplicit + wp.Tape forward + backward of ``worlds`` box trials in one model [s]
    (median of ``iterations``), with gradient checkpointing every ``segment`` steps: the one-tape rollout of
    64 worlds would hold ~250 GB (SemiBox's docstring). The 1-world figure of `run_semi` uses one tape."""
    tasks, rng = box_tasks(worlds, seed=1)
    sb = SemiBox(theta, tasks, dt=dt, segment=segment)
    U = np.tile(Planner(load_robot(), theta, tasks[:1], duration=6.0, dt=0.1, knots=10).straight_guess(),
                (worlds, 1, 1)) + rng.normal(0, 0.5, (worlds, 10, sb.C))
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        sb.loss_and_grad(U)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def terrain_draw(seeds: int, draw: int = 0, knots: int = 10) -> tuple[np.ndarray, np.ndarray, list]:
    """Per seed of draw ``draw``: the target knots (seeds, knots, 3) [rad/s], the first guess (target +
    N(0, 1.5 rad/s)) and the terrain mesh (run_terrain's protocol)."""
    rng = np.random.default_rng(123 + draw)
    r = load_robot().wheel_radius
    target = np.zeros((seeds, knots, 3))
    for s in range(seeds):
        base = rng.uniform(0.5, 1.2, knots) / r
        diff = rng.normal(0.0, 0.4, knots)
        target[s] = np.stack([base + diff, base - diff, base], axis=1)
    guess = target + rng.normal(0.0, 1.5, target.shape)
    return target, guess, [sinusoid_terrain(seed=1000 + 100 * draw + s) for s in range(seeds)]


def run_terrain(theta: dict, seeds: int, iterations: int, pullback: str, lr: float = 0.3, draw: int = 0,
                **optimize_kw) -> dict:
    """The terrain experiment on draw ``draw`` (0: the reported one, targets from RNG 123 and terrains
    1000 + s; others for tuning: RNG 123 + draw, terrains 1000 + 100 draw + s); ``optimize_kw``: more
    `Planner.optimize` arguments (default: the planner's)."""
    desc = load_robot()
    K, dur, dt = 10, 10.0, 0.08
    target, guess, terrains = terrain_draw(seeds, draw)
    # the target's simulated trajectory is the reference (the same model, the same pull-back)
    probe = Planner(
        desc,
        theta,
        [ControlTask(goal=(1.0, 0.0, 0.0), terrain=t, terrain_resolution=80) for t in terrains],
        duration=dur,
        dt=dt,
        knots=K,
        pullback=pullback,
    )
    Q, _ = probe.rollout(target)
    ref = Q[:, probe._chassis, :2].transpose(1, 0, 2).astype(float)
    yaw_end = quat_yaw(Q[-1, probe._chassis, 3:7].astype(float))
    tasks = [
        ControlTask(
            goal=(ref[s, -1, 0], ref[s, -1, 1], float(yaw_end[s])),
            terrain=terrains[s],
            terrain_resolution=80,
            reference=ref[s],
        )
        for s in range(seeds)
    ]
    pl = Planner(desc, theta, tasks, duration=dur, dt=dt, knots=K, weights=TERRAIN_WEIGHTS, pullback=pullback,
                 **PLANNER)
    t0 = time.perf_counter()
    res = pl.optimize(guess, iterations=iterations, lr=lr, **optimize_kw)
    wall = time.perf_counter() - t0
    rmse = np.sqrt(res.term_history["track"])  # (iterations, seeds)
    best = rmse.min(axis=0)
    running = np.minimum.accumulate(rmse, axis=0)
    return {
        "seeds": seeds,
        "iterations": iterations,
        "pullback": pullback,
        "best_rmse": best,
        "initial_rmse": rmse[0],
        "median_best_rmse": float(np.median(best)),
        "median_running_best": np.median(running, axis=1),
        "below_0.5": int((best < 0.5).sum()),
        "below_0.2": int((best < 0.2).sum()),
        "iteration_s": float(np.median(res.iteration_s[1:])),
        "wall_s": wall,
    }


# ---------------------------------------------------------------------------------- SemiImplicit peer
@wp.kernel
def _semi_targets(
    u: wp.array(dtype=float),
    lo: int,
    w_lo: float,
    w_hi: float,
    knots: int,
    channels: int,
    dof: wp.array(dtype=int),
    chan: wp.array(dtype=int),
    world: wp.array(dtype=int),
    trim: wp.array(dtype=float),
    out: wp.array(dtype=float),
):
    i = wp.tid()
    c = chan[i]
    base = world[i] * knots * channels
    out[dof[i]] = (w_lo * u[base + lo * channels + c] + w_hi * u[base + (lo + 1) * channels + c]) * trim[i]


@wp.kernel
def _semi_loss(
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    ch: wp.array(dtype=int),
    goal: wp.array(dtype=wp.vec3),
    w_pos: float,
    w_yaw: float,
    w_speed: float,
    loss: wp.array(dtype=float),
):
    """Per world w (a thread): the planner's terminal terms of its chassis ch[w] against goal[w] = (x, y, yaw)."""
    w = wp.tid()
    b = ch[w]
    g = goal[w]
    p = wp.transform_get_translation(body_q[b])
    q = wp.transform_get_rotation(body_q[b])
    yaw = wp.atan2(2.0 * (q[3] * q[2] + q[0] * q[1]), 1.0 - 2.0 * (q[1] * q[1] + q[2] * q[2]))
    v = wp.spatial_top(body_qd[b])
    dx = p[0] - g[0]
    dy = p[1] - g[1]
    wp.atomic_add(
        loss,
        w,
        w_pos * (dx * dx + dy * dy) + w_yaw * 2.0 * (1.0 - wp.cos(yaw - g[2])) + w_speed * (v[0] * v[0] + v[1] * v[1]),
    )


@wp.kernel
def _semi_track(
    body_q: wp.array(dtype=wp.transform),
    ch: wp.array(dtype=int),
    ref: wp.array(dtype=wp.vec2),
    j: int,
    samples: int,
    w: float,
    loss: wp.array(dtype=float),
):
    """Per world wi: the tracking term w |p - ref[wi, j]|^2 of its chassis at sample j."""
    wi = wp.tid()
    p = wp.transform_get_translation(body_q[ch[wi]])
    r = ref[wi * samples + j]
    wp.atomic_add(loss, wi, w * ((p[0] - r[0]) * (p[0] - r[0]) + (p[1] - r[1]) * (p[1] - r[1])))


@wp.kernel
def _semi_copy_state(
    q_in: wp.array(dtype=wp.transform),
    qd_in: wp.array(dtype=wp.spatial_vector),
    q_out: wp.array(dtype=wp.transform),
    qd_out: wp.array(dtype=wp.spatial_vector),
):
    """A differentiable copy of one state into another (a checkpoint restored onto a taped segment)."""
    b = wp.tid()
    q_out[b] = q_in[b]
    qd_out[b] = qd_in[b]


class SemiBox:
    """Planning trials (box trials, or terrain seeds) in SolverSemiImplicit at step ``dt``, one world per
    task in one model, with the planner's knots, loss and the identified kp and mu (isotropic: the penalty
    model has no lateral coefficient). The tracking term samples each chassis every ``sample_dt`` [s] (the
    engine's step) against its task's reference (default: the straight line from start to goal); after
    each evaluation ``self.path`` holds those samples ((worlds,) samples x 2; a single task: samples x 2).

    ``segment`` (steps, default None: one tape over the whole rollout): gradient checkpointing. The
    forward runs untaped up to the last segment, keeping the state at every segment start; the backward
    re-runs one segment at a time on a tape from its checkpoint, from the last segment to the first,
    carrying the state's adjoint across segment boundaries (one segment: the one-tape rollout). Memory is
    one segment's tape (~0.33 MB per world-step measured on the box task) instead of the rollout's; time
    is one extra forward of all but the last segment. The gradient is the same as the one-tape one
    (tests/app/test_benchmarks_slow.py checks it)."""

    def __init__(self, theta: dict, task: ControlTask | list[ControlTask], dt: float = 5e-4,
                 duration: float = 6.0, knots: int = 10, weights: LossWeights | None = None,
                 sample_dt: float = 0.1, segment: int | None = None):
        import newton

        self.newton = newton
        desc = load_robot()
        self.single = isinstance(task, ControlTask)
        tasks = [task] if isinstance(task, ControlTask) else list(task)
        self.tasks, self.desc, self.dt, self.duration, self.knots = tasks, desc, dt, duration, knots
        specs = []
        for t in tasks:
            z = None
            if t.terrain is not None:
                z = terrain_height(t.terrain[0], int(t.terrain_resolution or 80), t.start[0], t.start[1])
                z += desc.base_height
            specs.append(WorldSpec(start=t.start, pallet=t.pallet, start_z=z, terrain=t.terrain))
        sc = build_robot_scene(specs, desc, device="cpu", requires_grad=True)
        m = self.model = sc.model
        m.shape_material_ke.fill_(SEMI_CONTACT["ke"])
        m.shape_material_kd.fill_(SEMI_CONTACT["kd"])
        m.shape_material_kf.fill_(SEMI_CONTACT["kf"])
        mu = m.shape_material_mu.numpy()
        for h in sc.handles:
            mu[h.wheel_shapes] = theta.get("mu", desc.mu)
        m.shape_material_mu.assign(mu)
        dof = m.joint_qd_start.numpy()
        sides = list(dict.fromkeys(desc.wheel_sides))
        self.dofs = np.array([dof[j] for h in sc.handles for j in h.wheel_joints], np.int32)
        self.chan = np.array([sides.index(s) for _ in sc.handles for s in desc.wheel_sides], np.int32)
        self.dof_world = np.array([w for w, h in enumerate(sc.handles) for _ in h.wheel_joints], np.int32)
        kd = m.joint_target_kd.numpy()
        kd[self.dofs] = theta.get("kp", desc.kp)  # the velocity servo's gain: torque kp (target - w)
        m.joint_target_kd.assign(kd)
        self.scale = theta.get("cmd_scale", 1.0)
        self.solver = newton.solvers.SolverSemiImplicit(m, **SEMI_ATTACH)
        self.pipe = newton.CollisionPipeline(m)
        self.chs = np.array([h.chassis for h in sc.handles], np.int32)
        self.ch = int(self.chs[0])
        self.steps = int(round(duration / dt))
        self.C = len(sides)
        self.weights = weights or LossWeights()
        self.sample_dt = sample_dt
        self.segment = segment
        self.path = np.zeros((0, 2))

    @property
    def task(self) -> ControlTask:
        return self.tasks[0]

    @task.setter
    def task(self, t: ControlTask) -> None:
        self.tasks = [t]

    def loss_and_grad(self, U: np.ndarray) -> tuple[float | np.ndarray, np.ndarray]:
        """Loss and its gradient in the knots: U (knots, channels) for one task -> (float, same shape);
        U (worlds, knots, channels) -> ((worlds,), same shape)."""
        newton, m, n = self.newton, self.model, self.steps
        Wn = len(self.tasks)
        U3 = np.asarray(U, float).reshape(Wn, self.knots, self.C)
        u = wp.array(U3.ravel().astype(np.float32), dtype=float, device="cpu", requires_grad=True)
        dof = wp.array(self.dofs, dtype=int, device="cpu")
        chan = wp.array(self.chan, dtype=int, device="cpu")
        world = wp.array(self.dof_world, dtype=int, device="cpu")
        ch = wp.array(self.chs, dtype=int, device="cpu")
        # target = cmd_scale * command (the engine's joint_cmd_scale)
        trim = wp.array(np.full(len(self.dofs), self.scale, np.float32), dtype=float, device="cpu")
        tau = self.duration / (self.knots - 1)
        w = self.weights
        sample = int(round(self.sample_dt / self.dt))  # the tracking term at the engine's step times
        T = n // sample
        ref = references(self.tasks, T)
        ref_wp = wp.array(ref.reshape(-1, 2).astype(np.float32), dtype=wp.vec2, device="cpu")
        goal = wp.array(np.array([t.goal for t in self.tasks], np.float32), dtype=wp.vec3, device="cpu")
        path = np.zeros((Wn, T + 1, 2))
        seg = n if self.segment is None else max(1, int(self.segment))

        def run(k0: int, k1: int, states: list, tape: wp.Tape | None, loss: wp.array | None) -> None:
            """Steps k0..k1-1 from states[0] (states[i]: the state after step k0 + i - 1), on ``tape`` with the
            tracking terms added to ``loss``, or untaped (None: no loss)."""
            for k in range(k0, k1):
                s_in, s_out = states[k - k0], states[k - k0 + 1]
                contacts = self.pipe.contacts()
                self.pipe.collide(s_in, contacts)
                s = min((k + 0.5) * self.dt, self.duration) / tau
                lo = min(int(s), self.knots - 2)
                fr = s - lo
                control = m.control()
                with tape if tape is not None else _nullcontext():
                    control.joint_target_qd.zero_()
                    wp.launch(_semi_targets, len(self.dofs),
                              inputs=[u, lo, 1.0 - fr, fr, self.knots, self.C, dof, chan, world, trim],
                              outputs=[control.joint_target_qd], device="cpu")
                    s_in.clear_forces()
                    self.solver.step(s_in, s_out, control, contacts, self.dt)
                    if (k + 1) % sample == 0:
                        j = (k + 1) // sample
                        if loss is not None:
                            wp.launch(_semi_track, Wn, inputs=[s_out.body_q, ch, ref_wp, j, T + 1, w.track / T],
                                      outputs=[loss], device="cpu")
                        path[:, j] = s_out.body_q.numpy()[self.chs, :2]

        first = m.state()
        newton.eval_fk(m, m.joint_q, m.joint_qd, first)
        path[:, 0] = first.body_q.numpy()[self.chs, :2]
        # forward, untaped, up to the last segment: a checkpoint at every segment start (one segment: none run)
        bounds = list(range(0, n, seg)) + [n]
        checkpoints = []
        cur = first
        for a, b in zip(bounds[:-2], bounds[1:-1]):
            checkpoints.append((cur.body_q.numpy().copy(), cur.body_qd.numpy().copy()))
            nxt = [cur, m.state()]
            for k in range(a, b):  # two states ping-pong: no tape holds them
                run(k, k + 1, nxt, None, None)
                nxt = [nxt[1], nxt[0]]
            cur = nxt[0]
        checkpoints.append((cur.body_q.numpy().copy(), cur.body_qd.numpy().copy()))
        # backward, segment by segment from the last, each re-run on its own tape from its checkpoint
        L_sim = np.zeros(Wn)
        carry_q = carry_qd = None
        final = first
        for si in reversed(range(len(bounds) - 1)):
            a, b = bounds[si], bounds[si + 1]
            start = m.state()
            start.body_q.assign(checkpoints[si][0])
            start.body_qd.assign(checkpoints[si][1])
            states = [m.state() for _ in range(b - a + 1)]
            seg_loss = wp.zeros(Wn, dtype=float, device="cpu", requires_grad=True)
            tape = wp.Tape()
            with tape:
                wp.launch(_semi_copy_state, m.body_count, inputs=[start.body_q, start.body_qd],
                          outputs=[states[0].body_q, states[0].body_qd], device="cpu")
            run(a, b, states, tape, seg_loss)
            if b == n:
                with tape:
                    wp.launch(_semi_loss, Wn, inputs=[states[-1].body_q, states[-1].body_qd, ch, goal,
                                                      w.position, w.yaw, w.speed], outputs=[seg_loss],
                              device="cpu")
                final = states[-1]
            if carry_q is not None:
                states[-1].body_q.grad.assign(carry_q)
                states[-1].body_qd.grad.assign(carry_qd)
            tape.backward(grads={seg_loss: wp.ones(Wn, dtype=float, device="cpu")})
            carry_q = start.body_q.grad.numpy().copy()
            carry_qd = start.body_qd.grad.numpy().copy()
            L_sim += seg_loss.numpy()
            tape.reset()
        grad = u.grad.numpy().reshape(U3.shape).astype(float)
        K, C = U3.shape[1:]
        L = L_sim + w.effort * np.mean(U3**2, axis=(1, 2)) + w.smooth * np.mean(np.diff(U3, axis=1) ** 2, axis=(1, 2))
        grad += w.effort * 2 * U3 / (K * C)
        dU = np.diff(U3, axis=1)
        grad[:, 1:] += w.smooth * 2 * dU / ((K - 1) * C)
        grad[:, :-1] -= w.smooth * 2 * dU / ((K - 1) * C)
        fq, fqd = final.body_q.numpy()[self.chs], final.body_qd.numpy()[self.chs]
        if self.single:
            self.final = (fq[0], fqd[0])
            self.path = path[0]
            return float(L[0]), grad[0]
        self.final = (fq, fqd)
        self.path = path
        return L, grad


def run_semi(
    theta: dict,
    trials: int,
    iterations: int,
    U0: np.ndarray,
    tasks: list[ControlTask],
    dt: float = 5e-4,
    lr: float = 0.3,
    segment: int | None = 100,
) -> dict:
    """The box protocol in SolverSemiImplicit + wp.Tape: the first ``trials`` trials as worlds of one model
    (gradient checkpointing every ``segment`` steps: one tape over 12,000 steps x 25 worlds would not fit),
    plain Adam per world at constant ``lr`` from the same first guesses; success as the planner's (final
    position error < 0.2 m, terminal speed < 0.3 m/s), at the first evaluation that meets it. Non-finite
    gradient entries are zeroed (as the paper does)."""
    sb = SemiBox(theta, list(tasks[:trials]), dt=dt, segment=segment)
    goal = np.array([t.goal[:2] for t in tasks[:trials]])

    def evaluate(U: np.ndarray) -> tuple:
        L, g = sb.loss_and_grad(U)
        return L, g, sb.final[0], sb.final[1]

    r = adam_box(evaluate, np.asarray(U0[:trials], float), goal, iterations, lr, "SemiImplicit")
    return {
        "trials": trials,
        "iterations": iterations,
        "dt": dt,
        "per_trial": r["per_trial"],
        "successes": r["successes"],
        "within_30": r["within_30"],
        "median_iterations_to_success": r["successful_median"],
        "iteration_s": r["iteration_s"],
    }


def _semi_terrain_worlds(theta: dict, target: np.ndarray, terrains: list, dt: float, segment: int | None,
                         duration: float = 10.0) -> tuple[SemiBox, np.ndarray]:
    """Seeds of target knots ``target`` on ``terrains`` as the worlds of one SemiImplicit model, their references
    simulated from their target knots and set as their tasks (run_semi_terrain's protocol): (SemiBox, ref)."""
    sb = SemiBox(theta, terrain_tasks(terrains), dt=dt, duration=duration, knots=10, weights=TERRAIN_WEIGHTS,
                 sample_dt=0.08, segment=segment)
    sb.loss_and_grad(target)
    ref = sb.path.copy()
    yaw_end = [float(quat_yaw(np.asarray(q[3:7], float))) for q in sb.final[0]]
    sb.tasks = [ControlTask(goal=(ref[s, -1, 0], ref[s, -1, 1], yaw_end[s]), terrain=terrains[s],
                            terrain_resolution=80, reference=ref[s]) for s in range(len(terrains))]
    return sb, ref


def _semi_terrain_worker(conn: Any, theta: dict, seeds: int, draw: int, dt: float, segment: int | None, lo: int,
                         hi: int, duration: float) -> None:
    """A process of run_semi_terrain(workers > 1): seeds lo..hi-1 of draw ``draw`` (of ``seeds``) as its worlds;
    sends the reference, then answers each knot array with (loss, gradient, path) until it receives None; a
    failure is sent as its traceback."""
    import traceback

    try:
        target, _, terrains = terrain_draw(seeds, draw)
        sb, ref = _semi_terrain_worlds(theta, target[lo:hi], terrains[lo:hi], dt, segment, duration)
        conn.send(ref)
        while (U := conn.recv()) is not None:
            L, g = sb.loss_and_grad(U)
            conn.send((np.asarray(L, float), np.asarray(g, float), sb.path.copy()))
    except Exception:  # noqa: BLE001 - the parent raises it with the worker's traceback
        tb = traceback.format_exc()
        conn.send(RuntimeError(f"SemiImplicit terrain worker for seeds {lo}-{hi - 1} failed:\n{tb}"))


def _from_worker(conn: Any) -> Any:
    """The next message of a _semi_terrain_worker; its failure raised here."""
    msg = conn.recv()
    if isinstance(msg, Exception):
        raise msg
    return msg


@contextmanager
def _semi_terrain_processes(theta: dict, seeds: int, draw: int, dt: float, segment: int | None, duration: float,
                            workers: int) -> Iterator[tuple[np.ndarray, Any, int]]:
    """run_semi_terrain's worlds split into ``workers`` processes of consecutive seeds: yields (reference,
    evaluate(U) -> (L, g, path), processes); the processes are stopped on exit."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # warp's runtime is not fork-safe
    cuts = np.linspace(0, seeds, min(workers, seeds) + 1).round().astype(int)
    pipes, procs = [], []
    try:
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            mine, theirs = ctx.Pipe()
            pr = ctx.Process(target=_semi_terrain_worker, args=(theirs, theta, seeds, draw, dt, segment, int(lo),
                                                                int(hi), duration), daemon=True)
            pr.start()
            pipes.append(mine)
            procs.append(pr)
        ref = np.concatenate([_from_worker(c) for c in pipes])

        def evaluate(U: np.ndarray) -> tuple:
            for c, lo, hi in zip(pipes, cuts[:-1], cuts[1:]):
                c.send(np.asarray(U)[lo:hi])
            parts = [_from_worker(c) for c in pipes]
            return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))

        yield ref, evaluate, len(procs)
    finally:
        for c in pipes:
            try:
                c.send(None)
            except OSError:
                pass
        for pr in procs:
            pr.join(timeout=30)
            if pr.is_alive():
                pr.terminate()


def run_semi_terrain(theta: dict, seeds: int, iterations: int, draw: int = 0, dt: float = 5e-4,
                     lr: float = 0.3, segment: int | None = 100, journal: str | None = None,
                     workers: int = 1, duration: float = 10.0) -> dict:
    """The terrain protocol (run_terrain) in SolverSemiImplicit + wp.Tape at step ``dt``, the seeds as
    worlds of one model (each its own mesh; gradient checkpointing every ``segment`` steps): each seed's
    own simulated trajectory of its target knots is its reference, then the planner's per-world L-BFGS
    (`lbfgs_worlds`, first step lr RMS) from the same first guesses; figure: each seed's best tracking
    RMSE and its running best per evaluation (`mjx_peer.lbfgs_terrain`, shared with the MJX peer).
    ``journal``: a .npz file of every evaluation so far, replayed by a later run with the same seeds
    (`lbfgs_terrain`): the paper's 50 seeds x 100 iterations take ~a day here, so the run spans sessions.
    ``workers`` > 1: the worlds split into that many processes of consecutive seeds (each its own model; the
    worlds share nothing, and the per-world L-BFGS is the same), one core each. ``duration`` [s]: the paper's 10 s
    (shorter only in tests)."""
    target, guess, terrains = terrain_draw(seeds, draw)
    if workers > 1:
        split = _semi_terrain_processes(theta, seeds, draw, dt, segment, duration, workers)
    else:
        sb, ref = _semi_terrain_worlds(theta, target, terrains, dt, segment, duration)

        def evaluate(U: np.ndarray) -> tuple:
            L, g = sb.loss_and_grad(U)
            return L, g, sb.path

        split = _nullcontext((ref, evaluate, 1))
    with split as (ref, evaluate, processes):
        out = lbfgs_terrain(evaluate, guess[:seeds], ref, iterations, lr, "SemiImplicit", journal=journal)
    out["dt"] = dt
    if workers > 1:
        out["workers"] = processes
    return out


def _marks(iterations: int) -> list[int]:
    """Iteration indices at which running-best figures are printed: 10, 25, 50 and the last."""
    return sorted({i for i in (9, 24, 49) if i < iterations} | {iterations - 1})


def _mjx_section(theta: dict, args: argparse.Namespace, box: dict | None, timing: dict) -> dict:
    """The MJX peer (mjx_peer): its step search, the box protocol from the same first guesses, the gradient
    check and the timing at --mjx-timing-worlds (ratios to this engine's timing of the same run)."""
    out: dict = {}
    settings = ", ".join(f"{k} {v}" for k, v in MJX_SETTINGS.items())
    dt = args.mjx_dt
    if args.mjx_find_dt:
        print(f"[mjx] largest stable step (the straight-line command over the pallet, one world, 10 s; then the "
              f"{MJX_DT_TRIALS} first guesses of box draw {MJX_DT_SEED}, a tuning draw):", flush=True)
        dt, tried = find_stable_dt(theta, trials=box_guesses(theta, MJX_DT_TRIALS, MJX_DT_SEED))
        out["mjx_dt_search"] = tried
    print(f"[mjx] MJX on CPU at dt={dt:g} s ({settings})", flush=True)
    n = max(args.mjx_trials, 1 if args.mjx_fd else 0)
    if n:
        if box is not None and box["trials"] >= n:
            tasks, U0 = box["tasks"], box["U0"]
        else:
            tasks, U0 = box_guesses(theta, max(n, args.box_trials), args.box_seed)
    if args.mjx_fd:
        gq = gradient_quality(theta, tasks[0], U0[0], dt=dt)
        out["mjx_fd"] = gq
        for key in ("float32_h1e-2", "float64_h1e-6"):
            print(f"[mjx] gradient vs central differences of its loss, trial 0's first guess, {key}: "
                  + "; ".join(f"knot {e['knot']} channel {e['channel']}: AD {e['grad']:.4g}, FD {e['fd']:.4g}, "
                              f"rel. error {e['rel_error']:.2g}" for e in gq[key]), flush=True)
    if args.mjx_trials:
        r = run_mjx(theta, args.mjx_trials, args.mjx_iterations, U0, tasks, dt=dt, state=args.mjx_state)
        out["mjx"] = r
        ours = f"; MJX / Ostrich {r['iteration_s'] / box['iteration_s']:.1f}x" if box and box["trials"] == r["trials"] \
            else ""
        print(f"[box] MJX dt={dt:g}: {r['successes']}/{r['trials']} succeed within {r['iterations']} iterations, "
              f"{r['within_30']} within 30, median iterations to success {r['median_iterations_to_success']:g} "
              f"(of the successful {r['successful_median']:g}); {r['iteration_s']:.1f} s per warm iteration "
              f"({r['trials']} worlds; the first, with jit compile, {r['first_iteration_s']:.1f} s){ours}; per trial "
              + "; ".join(f"best loss {o['best_loss']:.3g}, pos {o['position_error']:.3f} m, "
                          f"v {o['terminal_speed']:.3f}" for o in r["per_trial"]), flush=True)
    mjx_timing = {}
    for w in args.mjx_timing_worlds:
        t_tasks, rng = box_tasks(w, seed=1)  # timing_box's draw
        U = np.tile(Planner(load_robot(), theta, t_tasks[:1], duration=6.0, dt=0.1, knots=10).straight_guess(),
                    (w, 1, 1)) + rng.normal(0, 0.5, (w, 10, 3))
        mjx_timing[w] = tm = timing_mjx(theta, t_tasks, U, dt=dt)
        ratio = f"; MJX / Ostrich {tm['iteration_s'] / timing[w]:.1f}x" if w in timing else ""
        print(f"[timing] MJX dt={dt:g}, {w} world(s): {tm['iteration_s']:.2f} s per forward + backward iteration "
              f"(warm; jit compile {tm['compile_s']:.0f} s excluded){ratio}", flush=True)
    out["mjx_timing"] = mjx_timing
    return out


MJX_TERRAIN_DT_DRAW, MJX_TERRAIN_DT_SEEDS = 1, 8  # the seeds MJX's terrain step search runs (a tuning draw)


def _peer_terrain_line(name: str, st: dict, ours: dict | None) -> None:
    """A terrain peer's summary line; with the time ratio to this engine's terrain run of the same invocation
    (``ours``) when that ran the same seeds."""
    marks = _marks(st["iterations"])
    ratio = (f"; {name.split()[0]} / Ostrich {st['iteration_s'] / ours['iteration_s']:.1f}x"
             if ours is not None and ours["seeds"] == st["seeds"] else "")
    print(f"[terrain] {name}, L-BFGS: {st['seeds']} seeds x {st['iterations']} "
          f"iterations: median best RMSE {st['median_best_rmse']:.3f} m (first guess median "
          f"{np.median(st['initial_rmse']):.3f} m), {st['below_0.5']}/{st['seeds']} below 0.5 m; median running "
          f"best at {'/'.join(str(i + 1) for i in marks)}: "
          + "/".join(f"{st['median_running_best'][i]:.3f}" for i in marks)
          + f"; {st['iteration_s']:.1f} s per iteration ({st['seeds']} world(s)){ratio}; per seed "
          + ", ".join(f"{v:.3f}" for v in st["best_rmse"]), flush=True)


def _mjx_terrain_section(theta: dict, args: argparse.Namespace, ours: dict | None) -> dict:
    """The MJX peer on terrain (mjx_peer.run_mjx_terrain): optionally its step search on a tuning draw, then
    the first --mjx-terrain-seeds seeds of --terrain-draw from the same targets and first guesses."""
    out: dict = {}
    dt = args.mjx_terrain_dt
    if args.mjx_terrain_find_dt:
        print(f"[mjx] largest stable terrain step (the straight line at 1 m/s, the targets and the first guesses of "
              f"terrain draw {MJX_TERRAIN_DT_DRAW}'s first {MJX_TERRAIN_DT_SEEDS} seeds, 10 s each):", flush=True)
        target, guess, terrains = terrain_draw(MJX_TERRAIN_DT_SEEDS, MJX_TERRAIN_DT_DRAW)
        dt, tried = find_terrain_dt(theta, target, guess, terrains, TERRAIN_WEIGHTS)
        out["mjx_terrain_dt_search"] = tried
    if args.mjx_terrain_seeds:
        settings = ", ".join(f"{k} {v}" for k, v in MJX_SETTINGS.items())
        print(f"[mjx] MJX on CPU on terrain at dt={dt:g} s ({settings}; hfield ground, sphere wheels, chassis out "
              "of collision: mjx_peer)", flush=True)
        target, guess, terrains = terrain_draw(args.mjx_terrain_seeds, args.terrain_draw)
        r = run_mjx_terrain(theta, target, guess, terrains, args.mjx_terrain_iterations, TERRAIN_WEIGHTS, dt=dt)
        out["mjx_terrain"] = r
        _peer_terrain_line(f"MJX dt={dt:g}", r, ours)
        print(f"[terrain] MJX: jit compile + the targets' reference rollout {r['compile_s']:.0f} s (not counted); "
              f"references finite for {r['reference_finite']}/{r['seeds']} seeds", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=str(PARAMS), help="identified parameter file (default: the bundled fit)")
    ap.add_argument("--box-trials", type=int, default=25)
    ap.add_argument("--box-iterations", type=int, default=50)
    ap.add_argument(
        "--box-seed", type=int, default=0, help="the box trials' draw (0: the reported one; 100, 200, ...: tuning)"
    )
    ap.add_argument(
        "--box-guesses",
        type=int,
        default=0,
        help="also run the box trials with this many first guesses each as extra worlds (0: not)",
    )
    ap.add_argument("--box-verbose", action="store_true",
                    help="one line per box trial: its start, goal, first success and the kept plan's final errors")
    ap.add_argument(
        "--terrain-seeds", type=int, default=4, help="seeds (the paper: 50; ~25 s per iteration at 4 on CPU)"
    )
    ap.add_argument("--terrain-iterations", type=int, default=15, help="Adam iterations on terrain (the paper: 100)")
    ap.add_argument("--terrain-pullbacks", nargs="*", default=["full", "truncated"])
    ap.add_argument(
        "--terrain-draw", type=int, default=0, help="the terrain seeds' draw (0: the reported one; 1, 2, ...: tuning)"
    )
    ap.add_argument(
        "--terrain-optimizer", default="lbfgs", choices=["lbfgs", "adam"],
        help="the planner's optimiser on terrain (lbfgs: chosen on tuning draws 1 and 2)",
    )
    ap.add_argument("--adjoint-solver", default=None, choices=["lu", "krylov"],
                    help="the planner's backward solve (default: the Planner's)")
    ap.add_argument("--timing-worlds", type=int, nargs="*", default=[1, 64], help="worlds for the per-iteration timing")
    ap.add_argument("--semi-trials", type=int, default=1, help="box trials run in SemiImplicit (0: none)")
    ap.add_argument("--semi-iterations", type=int, default=3, help="Adam iterations per SemiImplicit trial")
    ap.add_argument("--semi-dt", type=float, default=5e-4)
    ap.add_argument("--semi-timing-worlds", type=int, nargs="*", default=[],
                    help="worlds for a SemiImplicit per-iteration timing with gradient checkpointing (e.g. 64)")
    ap.add_argument("--semi-segment", type=int, default=100,
                    help="SemiImplicit checkpoint segment [steps] for more than one world (memory ~0.33 MB per "
                    "world-step on the box)")
    ap.add_argument("--semi-terrain-seeds", type=int, default=0, help="terrain seeds run in SemiImplicit (0: none)")
    ap.add_argument("--semi-terrain-iterations", type=int, default=3)
    ap.add_argument("--semi-terrain-journal", default=None,
                    help="a .npz file the SemiImplicit terrain run saves every evaluation to and replays on a later "
                    "run with the same seeds (50 seeds x 100 iterations take about a day on a 2-core CPU)")
    ap.add_argument("--semi-terrain-workers", type=int, default=1,
                    help="processes the SemiImplicit terrain worlds are split across (one core each; default 1)")
    ap.add_argument("--mjx-trials", type=int, default=0,
                    help="box trials run in MJX on CPU (0: none; ~90 s per iteration for 25 worlds at 4 ms on a 2-core "
                    "CPU); needs the mjx extra (jax, mujoco-mjx)")
    ap.add_argument("--mjx-iterations", type=int, default=50, help="Adam iterations per MJX trial")
    ap.add_argument("--mjx-state", default=None,
                    help="a .npz file the MJX box run saves after every iteration and resumes from (the same trials, "
                    "lr and step; ~2-5 h for 50 iterations on a 2-core CPU)")
    ap.add_argument("--mjx-dt", type=float, default=MJX_DT,
                    help=f"MJX step [s] (default {MJX_DT:g}: the largest stable one, --mjx-find-dt)")
    ap.add_argument("--mjx-find-dt", action="store_true",
                    help="search MJX's largest stable step first (mjx_peer.find_stable_dt) and use it")
    ap.add_argument("--mjx-timing-worlds", type=int, nargs="*", default=[],
                    help="worlds for an MJX per-iteration timing (warm: jit compile excluded), e.g. 1 64")
    ap.add_argument("--mjx-fd", action="store_true",
                    help="MJX's gradient vs central differences of its loss on trial 0's first guess")
    ap.add_argument("--mjx-terrain-seeds", type=int, default=0,
                    help="terrain seeds (of --terrain-draw) run in MJX on CPU (0: none); needs the mjx extra")
    ap.add_argument("--mjx-terrain-iterations", type=int, default=3, help="L-BFGS evaluations per MJX terrain seed")
    ap.add_argument("--mjx-terrain-dt", type=float, default=MJX_TERRAIN_DT,
                    help=f"MJX step on terrain [s] (default {MJX_TERRAIN_DT:g}: the largest stable one, "
                    "--mjx-terrain-find-dt)")
    ap.add_argument("--mjx-terrain-find-dt", action="store_true",
                    help="search MJX's largest stable terrain step first (mjx_peer.find_terrain_dt, on terrain "
                    f"draw {MJX_TERRAIN_DT_DRAW}'s first {MJX_TERRAIN_DT_SEEDS} seeds) and use it")
    args = ap.parse_args(argv)
    PLANNER.clear()
    if args.adjoint_solver is not None:
        PLANNER["adjoint_solver"] = args.adjoint_solver
    ps, _ = load_params(args.params)
    theta = ps.values()
    print(f"parameters {args.params}: " + ", ".join(f"{k} {v:.4g}" for k, v in theta.items()), flush=True)
    out: dict = {}
    if args.box_trials:
        b = run_box(theta, args.box_trials, args.box_iterations, seed=args.box_seed)
        out["box"] = b
        print(
            f"[box] Ostrich h=0.1 s: {b['successes']}/{b['trials']} succeed within {b['iterations']} Adam iterations, "
            f"{b['within_30']}/{b['trials']} within 30; "
            f"median iterations to success {b['median_iterations_to_success']:g} "
            f"(max {b['max_iterations_to_success']}); "
            f"median final position error {b['median_position_error']:.3f} m, terminal speed "
            f"{b['median_terminal_speed']:.3f} m/s; {b['iteration_s']:.2f} s per iteration for {b['trials']} worlds; "
            f"median running-best loss at 0/10/20/30/49: "
            + "/".join(
                f"{b['median_best_history'][i]:.3g}"
                for i in (0, 10, 20, 30, -1)
                if abs(i) < len(b["median_best_history"])
            ),
            flush=True,
        )
        if args.box_verbose:
            print("\n".join(box_trial_lines(b)), flush=True)
        if args.box_guesses > 1:
            g = run_box_guesses(theta, args.box_trials, args.box_iterations, args.box_guesses)
            out["box_guesses"] = g
            print(
                f"[box] Ostrich, {g['guesses']} first guesses per trial ({g['worlds']} worlds): {g['successes']}/"
                f"{g['trials']} succeed within {g['iterations']} iterations, {g['within_30']} within 30; median "
                f"iterations to success {g['median_iterations_to_success']:g}; {g['iteration_s']:.2f} s per "
                "iteration",
                flush=True,
            )
        if args.semi_trials:
            s = run_semi(theta, args.semi_trials, args.semi_iterations, b["U0"], b["tasks"], dt=args.semi_dt,
                         segment=args.semi_segment if args.semi_trials > 1 else None)
            out["semi"] = s
            print(
                f"[box] SemiImplicit dt={args.semi_dt:g} + wp.Tape: {s['successes']}/{s['trials']} succeed within "
                f"{s['iterations']} iterations, {s['within_30']} within 30, median iterations to success "
                f"{s['median_iterations_to_success']:g}; {s['iteration_s']:.2f} s per iteration ({s['trials']} "
                "world(s)); per trial "
                + "; ".join(
                    f"best loss {o['best_loss']:.3g}, pos {o['position_error']:.3f} m, v {o['terminal_speed']:.3f}"
                    for o in s["per_trial"]
                ),
                flush=True,
            )
    timing = {}
    for w in args.timing_worlds:
        timing[w] = timing_box(theta, w)
        print(
            f"[timing] Ostrich box task, {w} world(s): {timing[w]:.3f} s per forward + backward iteration "
            f"({timing[w] / w * 1e3:.1f} ms per world-iteration)",
            flush=True,
        )
    out["timing"] = timing
    if "semi" in out and out["semi"]["trials"] == 1 and 1 in timing:
        print(
            f"[timing] SemiImplicit / Ostrich per iteration at 1 world: {out['semi']['iteration_s'] / timing[1]:.1f}x"
        )
    semi_timing = {}
    for w in args.semi_timing_worlds:
        semi_timing[w] = timing_semi(theta, w, dt=args.semi_dt, segment=args.semi_segment)
        ratio = f"; SemiImplicit / Ostrich {semi_timing[w] / timing[w]:.1f}x" if w in timing else ""
        print(f"[timing] SemiImplicit dt={args.semi_dt:g} + wp.Tape, checkpointed every {args.semi_segment} steps, "
              f"{w} world(s): {semi_timing[w]:.1f} s per forward + backward iteration{ratio}", flush=True)
    out["semi_timing"] = semi_timing
    mjx_box = args.mjx_trials or args.mjx_timing_worlds or args.mjx_fd or args.mjx_find_dt
    mjx_terrain = args.mjx_terrain_seeds or args.mjx_terrain_find_dt
    missing = mjx_missing() if mjx_box or mjx_terrain else None
    if missing is not None:  # a message, no traceback, and the rest of the run goes on
        print(f"[mjx] {missing}", flush=True)
        out["mjx_missing"] = missing
    if mjx_box and missing is None:
        out.update(_mjx_section(theta, args, out.get("box"), timing))
    for pb in args.terrain_pullbacks if args.terrain_seeds else []:
        t = run_terrain(theta, args.terrain_seeds, args.terrain_iterations, pb, draw=args.terrain_draw,
                        optimizer=args.terrain_optimizer)
        out[f"terrain_{pb}"] = t
        print(
            f"[terrain] {args.terrain_optimizer}, pull-back {pb}: {t['seeds']} seeds x {t['iterations']} iterations: "
            f"median best RMSE "
            f"{t['median_best_rmse']:.3f} m (first guess median {np.median(t['initial_rmse']):.3f} m); "
            f"{t['below_0.5']}/{t['seeds']} below 0.5 m, {t['below_0.2']}/{t['seeds']} below 0.2 m; "
            f"median running best at {'/'.join(str(i + 1) for i in _marks(t['iterations']))}: "
            + "/".join(f"{t['median_running_best'][i]:.3f}" for i in _marks(t["iterations"]))
            + f"; {t['iteration_s']:.1f} s per iteration; per seed " + ", ".join(f"{v:.3f}" for v in t["best_rmse"]),
            flush=True,
        )
    # the peers after this engine's terrain runs: their lines give the time ratio to it
    ours = next((out[f"terrain_{pb}"] for pb in ("full", "truncated") if f"terrain_{pb}" in out), None)
    if args.semi_terrain_seeds:
        st = run_semi_terrain(theta, args.semi_terrain_seeds, args.semi_terrain_iterations, args.terrain_draw,
                              dt=args.semi_dt, segment=args.semi_segment if args.semi_terrain_seeds > 1 else None,
                              journal=args.semi_terrain_journal, workers=args.semi_terrain_workers)
        out["semi_terrain"] = st
        _peer_terrain_line(f"SemiImplicit dt={args.semi_dt:g} + wp.Tape", st, ours)
    if mjx_terrain and missing is None:
        out.update(_mjx_terrain_section(theta, args, ours))
    return out


if __name__ == "__main__":
    main()
