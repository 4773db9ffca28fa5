"""Scene builders and rollout helpers for the engine forward tests (Z up, SI units)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import newton
import numpy as np
import warp as wp

from ingest.transforms import quat_yaw as yaw_of  # yaw [rad] of (..., 4) quaternions (x, y, z, w)
from sysid.engine import Simulation, SolverOptions, SolverOstrich
from sysid.robot import load_robot
from sysid.robot.scenes import Scene, WorldSpec, build_robot_scene

G = 9.81  # [m/s^2], newton's default gravity magnitude
GAP = 0.15  # [m] speculative contact gap per shape: covers one 0.1 s step at 1.5 m/s

wp.config.quiet = True


def box_model(
    *,
    half: tuple[float, float, float] = (0.2, 0.2, 0.1),
    mass: float = 10.0,
    z: float | None = None,
    mu: float = 0.5,
    ground: bool = True,
    gap: float = GAP,
) -> newton.Model:
    """One box body (inertia of a solid box) above a ground plane; resting on it when ``z`` is None."""
    b = newton.ModelBuilder()
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=gap)
    if ground:
        b.add_ground_plane(cfg=cfg)
    hx, hy, hz = half
    I = mass / 3.0 * np.diag([hy * hy + hz * hz, hx * hx + hz * hz, hx * hx + hy * hy])
    body = b.add_body(xform=wp.transform((0.0, 0.0, hz if z is None else z), wp.quat_identity()), mass=mass,
                      inertia=wp.mat33(*I.flatten()))
    b.add_shape_box(body, hx=hx, hy=hy, hz=hz, cfg=cfg)
    return b.finalize(device="cpu")


def set_gravity(model: newton.Model, g: tuple[float, float, float]) -> None:
    model.gravity.assign(np.asarray([g], dtype=np.float32))


@dataclass
class Rollout:
    """Recorded body states after each step: q (steps, bodies, 7), qd (steps, bodies, 6), per-step status."""

    q: np.ndarray
    qd: np.ndarray
    residual: np.ndarray  # (steps, worlds)
    best_iteration: np.ndarray  # (steps, worlds)
    diverged: np.ndarray  # (steps, worlds)
    seconds: float = 0.0


def rollout(
    model: newton.Model,
    solver: SolverOstrich,
    steps: int,
    h: float,
    *,
    state: newton.State | None = None,
    control: newton.Control | None = None,
    record_every: int = 1,
) -> Rollout:
    """Step ``steps`` times from ``state`` (default: the model's initial state) and record."""
    import time

    s0 = state if state is not None else model.state()
    s1 = model.state()
    qs, qds, res, bk, dv = [], [], [], [], []
    t0 = time.perf_counter()
    for k in range(steps):
        solver.step(s0, s1, control, None, h)
        s0, s1 = s1, s0
        if (k + 1) % record_every == 0:
            qs.append(s0.body_q.numpy().copy())
            qds.append(s0.body_qd.numpy().copy())
            st = solver.status()
            res.append(st.residual)
            bk.append(st.best_iteration)
            dv.append(st.diverged)
    return Rollout(np.asarray(qs), np.asarray(qds), np.asarray(res), np.asarray(bk), np.asarray(dv),
                   time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------- robot


def robot_scene(worlds: int | list[WorldSpec] = 1, terrain=None) -> Scene:
    return build_robot_scene(worlds, load_robot(), terrain=terrain, device="cpu")


def initial_state(scene: Scene) -> newton.State:
    s = scene.model.state()
    newton.eval_fk(scene.model, scene.model.joint_q, scene.model.joint_qd, s)
    return s


Targets = list[tuple[float, float, float]] | tuple[float, float, float]


def wheel_control(scene: Scene, targets: Targets) -> newton.Control:
    """Control with velocity targets [rad/s] (left, right, rear) per world (one tuple: every world)."""
    m = scene.model
    c = m.control()
    per_world = [targets] * len(scene.handles) if isinstance(targets, tuple) else list(targets)
    qd = c.joint_target_qd.numpy()
    start = m.joint_qd_start.numpy()
    for hnd, t in zip(scene.handles, per_world):
        for j, v in zip(hnd.wheel_joints, t):
            qd[start[j]] = v
    c.joint_target_qd.assign(qd)
    return c


def drive(
    scene: Scene,
    targets,
    h: float,
    duration: float,
    options: SolverOptions | None = None,
    record_every: int = 1,
) -> tuple[Rollout, SolverOstrich]:
    """Drive every world with constant wheel targets for ``duration`` [s] at step ``h`` [s]."""
    solver = SolverOstrich(scene.model, options)
    steps = int(round(duration / h))
    r = rollout(scene.model, solver, steps, h, state=initial_state(scene), control=wheel_control(scene, targets),
                record_every=record_every)
    return r, solver


def chassis_track(scene: Scene, r: Rollout, world: int = 0) -> np.ndarray:
    """(steps, 4) chassis base-frame x, y, z [m] and yaw [rad] of one world."""
    q = r.q[:, scene.handles[world].chassis]
    return np.column_stack([q[:, :3], yaw_of(q[:, 3:7])])


def wheel_rates(scene: Scene, r: Rollout, world: int = 0) -> np.ndarray:
    """(steps, wheels) wheel speeds relative to the chassis about the axle [rad/s]."""
    hnd = scene.handles[world]
    qc = r.q[:, hnd.chassis, 3:7]
    wc = r.qd[:, hnd.chassis, 3:6]
    out = []
    for wb in hnd.wheels:
        axle = np.array([_rotate(q, (0.0, 1.0, 0.0)) for q in qc])
        out.append(np.einsum("ij,ij->i", r.qd[:, wb, 3:6] - wc, axle))
    return np.column_stack(out)


def _rotate(q: np.ndarray, v: tuple[float, float, float]) -> np.ndarray:
    x, y, z, w = q
    u = np.array([x, y, z])
    v = np.asarray(v)
    return v + 2.0 * np.cross(u, np.cross(u, v) + w * v)


def yaw_quat(yaw: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))


def rolling_state(scene: Scene, v: float, wheel_rate: float) -> newton.State:
    """Initial state already rolling along +x at v [m/s] (wheels spinning at wheel_rate [rad/s] about y)."""
    s = initial_state(scene)
    qd = s.body_qd.numpy()
    for hnd in scene.handles:
        qd[hnd.chassis] = (v, 0.0, 0.0, 0.0, 0.0, 0.0)
        for b in hnd.wheels:
            qd[b] = (v, 0.0, 0.0, 0.0, wheel_rate, 0.0)
    s.body_qd.assign(qd)
    return s


def rolling_inputs(scene: Scene, steps: int, speed: float | np.ndarray, turn: float | np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`Simulation` inputs of a robot scene already rolling along +x: the initial body_q (forward
    kinematics), body_qd0 with every world's chassis and wheels at its ``speed`` [m/s] and the
    wheels spinning speed / r about their axles (world y at yaw 0), and (steps, dofs) wheel targets
    (1 - turn, 1 + turn, 1) speed / r [rad/s] for (left, right, rear). ``speed``: one value or one
    per world; ``turn``: one value, one per world, or (worlds, steps), one per world and step."""
    m, desc = scene.model, scene.robot
    worlds = len(scene.handles)
    speeds = np.broadcast_to(np.asarray(speed, np.float64), (worlds,))
    turns = np.asarray(turn, np.float64)
    if turns.ndim == 0:
        turns = np.full(worlds, float(turns))
    s = initial_state(scene)
    qd0 = np.zeros((m.body_count, 6), np.float32)
    start = m.joint_qd_start.numpy()
    tq = np.zeros((steps, m.joint_dof_count), np.float32)
    for w, hd in enumerate(scene.handles):
        for b in [hd.chassis, *hd.wheels]:
            qd0[b, 0] = speeds[w]
        for b in hd.wheels:
            qd0[b, 4] = speeds[w] / desc.wheel_radius
        for j, k in zip(hd.wheel_joints, (1 - turns[w], 1 + turns[w], 1.0)):
            tq[:, start[j]] = speeds[w] / desc.wheel_radius * k
    return s.body_q.numpy(), qd0, tq


def varied_robot_batch(worlds: int, steps: int, h: float, options: SolverOptions, seed: int = 0
                       ) -> tuple[Scene, Simulation, np.ndarray, np.ndarray, np.ndarray]:
    """The robot rolling in ``worlds`` worlds, kp registered per world; world 0 always the same (the
    description's kp, 1 m/s, turn 0.1: a gentle left turn), the others with kp x U(0.5, 2), turn
    U(-0.4, 0.4) and speed U(0.5, 1.5) m/s. Returns (scene, sim, body_q0, body_qd0, targets)."""
    sc = build_robot_scene(worlds, load_robot(), device="cpu")
    sim = Simulation(SolverOstrich(sc.model, options), h)
    sim.register_parameter("kp", "joint_kd", [j for hd in sc.handles for j in hd.wheel_joints], per_world=True)
    rng = np.random.default_rng(seed)
    kp = sc.robot.kp * np.concatenate([[1.0], rng.uniform(0.5, 2.0, worlds - 1)])
    turn = np.concatenate([[0.1], rng.uniform(-0.4, 0.4, worlds - 1)])
    speed = np.concatenate([[1.0], rng.uniform(0.5, 1.5, worlds - 1)])
    sim.set_parameters({"kp": kp})
    return (sc, sim, *rolling_inputs(sc, steps, speed, turn))
