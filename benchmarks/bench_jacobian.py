"""Benchmark: time per trajectory Jacobian, tangent (`Simulation.jvp`) vs central differences in extra
worlds, side by side in one process; and the adjoint's linear solve, per-world LU vs the former host
GMRES over all worlds.

Jacobian case (robot-replay-like): ``--runs`` runs as worlds, the robot rolling at 1 m/s with a
sinusoidal turn command (different phase per run), ``--steps`` steps at h = 0.1 s, 16 Newton
iterations, regularised wheels (slip speed 0.05 m/s), the replay's six per-world parameters (kp,
mu, mu_lateral, cmd_scale, chassis_mass, slip_speed). Output: the chassis pose (x, y, z, quaternion)
of every step and run, i.e. J = d(body_q of the chassis per step)/d theta, (runs, steps, 7, 6).
Tangent: one `jvp` of the runs with p = 6 directions. FD: one `forward` of runs x (1 + 2 p) worlds
with every parameter moved by +-1 % (what OstrichReplay.rollout_with_jacobian does). Both warmed up
once, then timed (best of ``--repeat``); printed: seconds per Jacobian, FD/tangent ratio, and the
largest difference between the two Jacobians relative to each parameter's largest entry.

Adjoint-solve case: the robot in 1 / 64 / 256 worlds (per-world kp, turn and speed differ; world 0
the same), 3 steps, L = sum over worlds of the final chassis x: backward time, per-world relative residual,
GMRES iterations, and world 0's gradient against the 1-world gradient.

    .venv/bin/python benchmarks/bench_jacobian.py
    .venv/bin/python benchmarks/bench_jacobian.py --runs 8 --steps 40 --adjoint-worlds 1 256

No assertion on timings anywhere; read the ratios (a shared 2-core CPU varies by up to 2x).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sysid.engine import SolverOptions  # noqa: E402
from sysid.robot import load_robot  # noqa: E402
from sysid.robot.scenes import build_robot_scene  # noqa: E402
from sysid.simulators.ostrich import engine_for_scene  # noqa: E402
from tests.helpers.engine import rolling_inputs, varied_robot_batch  # noqa: E402

wp.config.quiet = True
H = 0.1  # [s]
NAMES = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass", "slip_speed")
FD_REL = 1e-2


def build(worlds: int, steps: int, phases: np.ndarray, iters: int = 16):
    """Robot per world rolling at 1 m/s along +x, turn command 0.3 sin(2 pi t / 2 s + phase); the
    replay's engine set-up (its parameters registered per world) with regularised wheels."""
    sc = build_robot_scene(worlds, load_robot(), device="cpu")
    solver, sim = engine_for_scene(sc, SolverOptions(newton_iters=iters), dt=H)
    solver.set_slip_speed([s for h in sc.handles for s in h.wheel_shapes], 0.05)
    t = np.arange(steps) * H
    turn = 0.3 * np.sin(2 * np.pi * t[None, :] / 2.0 + np.asarray(phases)[:, None])
    return (sc, sim, *rolling_inputs(sc, steps, 1.0, turn))


def best_of(fn, repeat: int) -> tuple[float, object]:
    fn()  # warm-up: kernel loads, recorded launches
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def jacobian_case(runs: int, steps: int, repeat: int) -> None:
    phases = np.linspace(0.0, np.pi, runs)
    p = len(NAMES)
    sc, sim, q0, qd0, tq = build(runs, steps, phases)
    theta = sim.get_parameters()
    chassis = [h.chassis for h in sc.handles]
    tan_names = list(NAMES)

    def tangent():
        res = sim.jvp(q0, qd0, steps, sim.parameter_tangents(tan_names), targets_qd=tq)
        return res.dq[:, 1:, chassis].transpose(2, 1, 3, 0), res  # (runs, steps, 7, p)

    t_tan, (J_tan, res) = best_of(tangent, repeat)
    # central FD: runs x (1 + 2p) worlds in one forward
    k = 1 + 2 * p
    sc2, sim2, q02, qd02, tq2 = build(runs * k, steps, np.repeat(phases, k))
    vals = {n: np.repeat(np.asarray(theta[n], np.float64), k) for n in NAMES}
    for j, n in enumerate(NAMES):
        for r in range(runs):
            base = float(theta[n][r])
            vals[n][r * k + 2 * j + 1] = base * (1 + FD_REL)
            vals[n][r * k + 2 * j + 2] = base * (1 - FD_REL)
    sim2.set_parameters({n: v.astype(np.float32) for n, v in vals.items()})
    ch2 = [h.chassis for h in sc2.handles]

    def fd():
        Q, _ = sim2.forward(q02, qd02, steps, tq2)
        C = Q[1:, ch2].reshape(steps, runs, k, 7)
        J = np.empty((runs, steps, 7, p))
        for j, n in enumerate(NAMES):
            e = FD_REL * np.abs(theta[n]).astype(np.float64)  # (runs,)
            J[..., j] = ((C[:, :, 2 * j + 1] - C[:, :, 2 * j + 2]) / (2 * e[None, :, None])).transpose(1, 0, 2)
        return J

    t_fd, J_fd = best_of(fd, repeat)
    print(f"\nJacobian d(chassis body_q per step)/d theta: {runs} runs x {steps} steps x 7 x {p} parameters "
          f"({', '.join(NAMES)})")
    print(f"  tangent (jvp, {runs} worlds, p = {p}):          {t_tan:8.3f} s per Jacobian  "
          f"(solve residual max {res.solve_residual.max():.1e}, Newton residual max {res.step_residuals.max():.1e})")
    print(f"  central FD ({runs * k} worlds, one forward):     {t_fd:8.3f} s per Jacobian")
    print(f"  ratio FD / tangent: {t_fd / t_tan:.2f}")
    print("  |J_FD - J_tangent| / max|J_tangent| per parameter (the pose's position rows):")
    for j, n in enumerate(NAMES):
        scale = np.abs(J_tan[:, :, :3, j]).max()
        d = np.abs(J_fd[:, :, :3, j] - J_tan[:, :, :3, j]).max() / max(scale, 1e-30)
        print(f"    {n:<14s} max|J| {scale:.3e}  rel. difference {d:.2e}")


def adjoint_batch(worlds: int, solver: str, steps: int = 3):
    sc, sim, q0, qd0, tq = varied_robot_batch(worlds, steps, H, SolverOptions(newton_iters=16, adjoint_solver=solver))
    Q, _ = sim.forward(q0, qd0, steps, tq)
    gQ = np.zeros_like(Q)
    gQ[-1, [h.chassis for h in sc.handles], 0] = 1.0  # every world's adjoint non-zero (a batched fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.backward(gQ, None)  # warm-up
        sim.forward(q0, qd0, steps, tq)
        t0 = time.perf_counter()
        g = sim.backward(gQ, None)
        dt = time.perf_counter() - t0
    start = sc.model.joint_qd_start.numpy()
    cols = [int(start[j]) for j in sc.handles[0].wheel_joints]
    vec = np.concatenate([[float(g.params["kp"][0])], g.targets_qd[:, cols].ravel()])
    return vec, g, sim, dt


def adjoint_case(worlds_list: list[int]) -> None:
    print("\nAdjoint solve, robot, 3 steps, L = sum of every world's final chassis x (worlds differ); world 0's "
          "d x_0/d(kp_0, its commands) against 1 world:")
    print("| worlds | solver | backward [s] | GMRES iterations per step | max rel. residual | "
          "world 0 vs 1 world (max rel.) |")
    print("|---|---|---|---|---|---|")
    ref = {}
    for solver in ("lu", "gmres"):
        for worlds in worlds_list:
            vec, g, sim, dt = adjoint_batch(worlds, solver)
            if worlds == 1:
                ref[solver] = vec
            base = ref.get(solver, vec)
            scale = np.abs(base).max()
            diff = float(np.abs(vec - base).max() / scale)
            its = "-" if solver == "lu" else str([s[0] for s in sim.adjoint_stats])
            print(f"| {worlds} | {solver} | {dt:.3f} | {its} | {np.nanmax(g.adjoint_residual):.1e} | {diff:.1e} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--adjoint-worlds", type=int, nargs="*", default=[1, 64, 256])
    a = ap.parse_args(argv)
    jacobian_case(a.runs, a.steps, a.repeat)
    if a.adjoint_worlds:
        adjoint_case(sorted(set(a.adjoint_worlds) | {1}))


if __name__ == "__main__":
    main()
