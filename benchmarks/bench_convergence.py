"""Benchmark: Newton convergence of exact Coulomb friction at stick/slip transitions.

For each case, the returned Newton residual of every step (`SolverOstrich.status().residual`, m/s,
the norm the solver minimises: M~^-1 r_dyn and the constraint rows, friction rows weighted by
d / (d + W)) is collected and summarised: the fraction of steps below 1e-6 and 1e-5 m/s and the
worst step, and the mean Newton iterations per step (the last one evaluated). Every case uses exact
Coulomb friction (slip_speed 0) and the default budget unless stated.

Cases:
    pallet       the robot drives at 1 m/s (wheel targets 1/0.36 rad/s) over the 14.4 cm pallet 2 m
                 ahead, 6 s at h = 0.1 s (benchmarks/bench_engine.py's scene, 1 world)
    pallet-soft  the same from standstill with the wheel targets ramped to 1 m/s over 0.5 s
                 (tests/engine/test_engine_forward.py's soft start)
    pallet-aniso the same with the wheels' anisotropic friction (mu 0.5 / mu_lat from the robot
                 description, bench_adjoint.py)
    landing      a 0.2 m cube (2 kg, mu 0.5) from z0 = 0.35 m with v0 = (1, 0, -0.5) m/s lands
                 into sticking friction, h = 0.05 s, 20 steps, 32 Newton iterations
                 (tests/engine/test_engine_adjoint.py::test_landing_into_sticking_converges)
    incline      a box (mu 0.5) under gravity tilted by atan(0.4) sticks, h = 0.05 s, 40 steps
    slide-<h>    a box (mu 0.5) sliding at 2 m/s stops at v0 / (mu g), 0.6 s at h = 0.01 / 0.05 / 0.1 s
    landing-spin the cube (mu 0.8) from v0 = (2, 0.2, -0.5) m/s rolling at 0.3 rad/s lands on an edge
                 and slides spinning, h = 0.05 s, 20 steps (not in the issue's list)
    slide-spin   the box sliding from (2, 0.6) m/s spinning at 0.5 rad/s, h = 0.02 s, 30 steps (idem)
    turn         the robot turning in place from rest (left -1/0.36, right +1/0.36, rear 0 rad/s),
                 50 steps at h = 0.1 s (idem)

    python benchmarks/bench_convergence.py                         # the default options
    python benchmarks/bench_convergence.py --set pin_wheels_from=0 pin_coupled=0   # before the wheel pins
    python benchmarks/bench_convergence.py --safeguard active      # before the semismooth rows
    python benchmarks/bench_convergence.py --cases landing incline
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import newton
import numpy as np
import warp as wp

if not __package__:  # run as a script: the repository on the import path (the tests import it as benchmarks.*)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import PALLET, W_DRIVE, option_overrides  # noqa: E402
from sysid.engine import SolverOptions, SolverOstrich  # noqa: E402
from sysid.robot import load_robot  # noqa: E402
from sysid.robot.scenes import WorldSpec, build_robot_scene, sinusoid_terrain  # noqa: E402

wp.config.quiet = True
G = 9.81
ITERATIONS: list[int] = []  # the last Newton iteration of every step _run took (main's "iterations" column)


def _box(mu: float, z: float, half=(0.2, 0.2, 0.1), mass: float = 10.0, gap: float = 0.15) -> newton.Model:
    b = newton.ModelBuilder()
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=gap)
    b.add_ground_plane(cfg=cfg)
    hx, hy, hz = half
    I = mass / 3.0 * np.diag([hy * hy + hz * hz, hx * hx + hz * hz, hx * hx + hy * hy])
    body = b.add_body(xform=wp.transform((0.0, 0.0, z), wp.quat_identity()), mass=mass,
                      inertia=wp.mat33(*I.flatten()))
    b.add_shape_box(body, hx=hx, hy=hy, hz=hz, cfg=cfg)
    return b.finalize(device="cpu")


def _run(model, solver, steps: int, h: float, state=None, control=None, states: list | None = None) -> np.ndarray:
    s0 = state if state is not None else model.state()
    s1 = model.state()
    res = []
    for _ in range(steps):
        solver.step(s0, s1, control, None, h)
        s0, s1 = s1, s0
        st = solver.status()
        res.append(float(st.residual.max()))
        ITERATIONS.append(int(st.iterations.max()))
        if states is not None:
            states.append(s0.body_q.numpy().copy())
    return np.asarray(res)


def _robot(opts: SolverOptions, targets: tuple[float, float, float], steps: int, pallet: tuple | None = None,
           aniso: bool = False, h: float = 0.1, terrain: tuple | None = None, states: list | None = None
           ) -> np.ndarray:
    """The robot from rest with constant wheel targets (left, right, rear) [rad/s], ``steps`` at h [s], on
    flat ground or the ``terrain`` mesh; every step's body poses appended to ``states`` when given."""
    sc = build_robot_scene([WorldSpec(pallet=pallet)], load_robot(), terrain=terrain, device="cpu")
    m = sc.model
    solver = SolverOstrich(m, opts)
    if aniso:
        solver.set_anisotropic_friction(sc.handles[0].wheel_shapes, sc.robot.mu, sc.robot.mu_lateral)
    s0 = m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s0)
    c = m.control()
    qd = c.joint_target_qd.numpy()
    start = m.joint_qd_start.numpy()
    for j, w in zip(sc.handles[0].wheel_joints, targets):
        qd[start[j]] = w
    c.joint_target_qd.assign(qd)
    return _run(m, solver, steps, h, s0, c, states)


def pallet(opts: SolverOptions, aniso: bool = False, return_states: bool = False
           ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Per-step residuals; with ``return_states`` also the body poses (steps, bodies, 7)."""
    states: list = []
    res = _robot(opts, (W_DRIVE, W_DRIVE, W_DRIVE), 60, pallet=PALLET, aniso=aniso, states=states)
    return (res, np.asarray(states)) if return_states else res


def pallet_soft(opts: SolverOptions, ramp: float = 0.5) -> np.ndarray:
    """The traversal from standstill with targets ramped to 1 m/s over `ramp` [s], step-averaged
    (tests/engine/test_engine_forward.py::pallet_soft_start)."""
    sc = build_robot_scene([WorldSpec(pallet=PALLET)], load_robot(), device="cpu")
    m = sc.model
    solver = SolverOstrich(m, opts)
    s0, s1 = m.state(), m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s0)
    c = m.control()
    start = m.joint_qd_start.numpy()
    h = 0.1
    res = []

    def integral(t: float) -> float:
        return t * t / (2 * ramp) if t < ramp else t - ramp / 2

    for k in range(60):
        qd = c.joint_target_qd.numpy()
        for j in sc.handles[0].wheel_joints:
            qd[start[j]] = W_DRIVE * (integral((k + 1) * h) - integral(k * h)) / h
        c.joint_target_qd.assign(qd)
        solver.step(s0, s1, c, None, h)
        s0, s1 = s1, s0
        st = solver.status()
        res.append(float(st.residual.max()))
        ITERATIONS.append(int(st.iterations.max()))
    return np.asarray(res)


def landing(opts: SolverOptions) -> np.ndarray:
    m = _box(0.5, 0.35, half=(0.1, 0.1, 0.1), mass=2.0)
    s = m.state()
    s.body_qd.assign(np.array([[1.0, 0, -0.5, 0, 0, 0]], dtype=np.float32))
    return _run(m, SolverOstrich(m, opts), 20, 0.05, s)


def incline(opts: SolverOptions, tan_theta: float = 0.4) -> np.ndarray:
    m = _box(0.5, 0.1)
    th = math.atan(tan_theta)
    m.gravity.assign(np.asarray([(G * math.sin(th), 0.0, -G * math.cos(th))], dtype=np.float32))
    return _run(m, SolverOstrich(m, opts), 40, 0.05)


def landing_spin(opts: SolverOptions) -> np.ndarray:
    """The landing cube with mu 0.8, v0 = (2, 0.2, -0.5) m/s and a roll rate of 0.3 rad/s: it lands on
    an edge, slides and spins."""
    m = _box(0.8, 0.35, half=(0.1, 0.1, 0.1), mass=2.0)
    s = m.state()
    s.body_qd.assign(np.array([[2.0, 0.2, -0.5, 0.3, 0, 0]], dtype=np.float32))
    return _run(m, SolverOstrich(m, opts), 20, 0.05, s)


def slide_spin(opts: SolverOptions) -> np.ndarray:
    """The sliding box (mu 0.5) from v0 = (2, 0.6) m/s spinning at 0.5 rad/s, h = 0.02 s, to a stop."""
    m = _box(0.5, 0.1)
    s = m.state()
    s.body_qd.assign(np.array([[2.0, 0.6, 0, 0, 0, 0.5]], dtype=np.float32))
    return _run(m, SolverOstrich(m, opts), 30, 0.02, s)


def turn(opts: SolverOptions) -> np.ndarray:
    """The robot turning in place from rest: left -w, right +w, rear 0 (w = 1/0.36 rad/s), 50 steps at
    h = 0.1 s (tests/engine/test_engine_forward.py's case)."""
    return _robot(opts, (-W_DRIVE, W_DRIVE, 0.0), 50)


def terrain(opts: SolverOptions) -> np.ndarray:
    """The robot from rest at 1 m/s across the 24 m sum-of-sinusoids mesh (12,800 faces, seed 0), 125 steps at
    h = 0.08 s (tests/engine/test_engine_forward.py::test_robot_drives_across_mesh_terrain)."""
    return _robot(opts, (W_DRIVE, W_DRIVE, W_DRIVE), 125, h=0.08, terrain=sinusoid_terrain())


def slide(opts: SolverOptions, h: float) -> np.ndarray:
    m = _box(0.5, 0.1)
    s = m.state()
    s.body_qd.assign(np.array([[2.0, 0, 0, 0, 0, 0]], dtype=np.float32))
    return _run(m, SolverOstrich(m, opts), int(round(0.6 / h)), h, s)


CASES = {
    "pallet": lambda o: pallet(o),
    "pallet-aniso": lambda o: pallet(o, aniso=True),
    "pallet-soft": lambda o: pallet_soft(o),
    "landing": lambda o: landing(o),
    "incline": lambda o: incline(o),
    "slide-0.01": lambda o: slide(o, 0.01),
    "slide-0.05": lambda o: slide(o, 0.05),
    "slide-0.1": lambda o: slide(o, 0.1),
    "landing-spin": lambda o: landing_spin(o),
    "slide-spin": lambda o: slide_spin(o),
    "turn": lambda o: turn(o),
    "terrain": lambda o: terrain(o),
}
LANDING_ITERS = 32  # the landing test's budget
# the wheels' active rows, the residual adding rad/s to m/s, a constant proximal term: what the tests and kink
# studies compare the defaults with
FORMER_DEFAULTS = dict(pin_wheels_from=0, residual_norm="velocity", stick_prox_decay=1.0)


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--safeguard", default=None, help="SolverOptions.friction_safeguard (default: the default)")
    p.add_argument("--set", nargs="*", default=[], help="more SolverOptions fields, name=value")
    a = p.parse_args(argv)
    kw: dict = {}
    if a.safeguard:
        kw["friction_safeguard"] = a.safeguard
    kw.update(option_overrides(a.set))
    print(f"options: {kw or 'defaults'}")
    print("| case | steps | < 1e-6 | < 1e-5 | worst [m/s] | iterations per step | seconds |")
    print("|---|---|---|---|---|---|---|")
    out = {}
    for c in a.cases:
        o = dict(kw)
        if c == "landing":
            o.setdefault("newton_iters", LANDING_ITERS)
        opts = SolverOptions(**o)
        ITERATIONS.clear()
        t0 = time.perf_counter()
        r = CASES[c](opts)
        dt = time.perf_counter() - t0
        out[c] = r
        print(f"| {c} | {len(r)} | {np.mean(r < 1e-6):.0%} | {np.mean(r < 1e-5):.0%} | {r.max():.2e} | "
              f"{np.mean(ITERATIONS):.1f} | {dt:.1f} |",
              flush=True)
    return out


if __name__ == "__main__":
    main()
