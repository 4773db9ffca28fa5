"""Adjoint gradients through triangle-mesh contact (issue 21, item 6) against central FD.

1. A 1 kg, 0.2 m cube sliding on a flat triangle-mesh ground (8 x 8 cells, 128 faces; newton's
   box-mesh collision reports 6 contacts), v0 = 2 m/s, mu = 0.4, 8 steps at h = 0.05 s (sliding
   throughout): the same closed forms as on the analytic plane, dx_T/dmu = -g h^2 T (T+1) / 2 and
   dx_T/dv0 = T h, and central FD (step 1 %), for both pull-backs; relative errors printed and
   asserted <= 0.5 % (measured 2026-12-03: 2e-4 vs FD, 6e-5 vs the closed form).
2. The robot on the sum-of-sinusoids mesh terrain: strict xfail with the measured figures.
"""

from __future__ import annotations

import math

import newton
import numpy as np
import pytest
import warp as wp

from sysid.engine import SolverOptions, SolverOstrich
from sysid.engine.rollout import Simulation
from sysid.scenes import build_robot_scene, sinusoid_terrain
from tests.test_engine_adjoint import (
    TOL,
    G,
    RobotCase,
    central,
    final_coordinate_grad,
    report,
    residual_trace,
    robot_adj_rows,
    robot_fd,
    robot_pose_grads,
)

wp.config.quiet = True


def mesh_ground_box(mu: float, cells: int = 8, size: float = 8.0, half: float = 0.1) -> newton.Model:
    """A cube resting on a flat square triangle mesh (cells x cells squares, two faces each) at z = 0."""
    b = newton.ModelBuilder()
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=0.1)
    xs = np.linspace(-size / 2, size / 2, cells + 1)
    X, Y = np.meshgrid(xs, xs, indexing="ij")
    verts = np.stack([X, Y, np.zeros_like(X)], -1).reshape(-1, 3).astype(np.float32)
    n = cells + 1
    idx = []
    for i in range(cells):
        for j in range(cells):
            a, bb, c, d = i * n + j, (i + 1) * n + j, (i + 1) * n + j + 1, i * n + j + 1
            idx += [a, bb, c, a, c, d]
    b.add_shape_mesh(-1, mesh=newton.Mesh(verts, np.asarray(idx, np.int32)), cfg=cfg)
    body = b.add_body(xform=wp.transform((0.0, 0.0, half), wp.quat_identity()), mass=1.0,
                      inertia=wp.mat33(0.01, 0, 0, 0, 0.01, 0, 0, 0, 0.01))
    b.add_shape_box(body, hx=half, hy=half, hz=half, cfg=cfg)
    return b.finalize(device="cpu")


@pytest.mark.parametrize("pullback", ["full", "truncated"])
def test_box_sliding_on_mesh_ground(pullback: str) -> None:
    T, h, mu, v0 = 8, 0.05, 0.4, 2.0
    m = mesh_ground_box(mu)
    sim = Simulation(SolverOstrich(m), h, pullback=pullback)
    sim.register_parameter("mu", "shape_mu", [0, 1])
    q0 = m.body_q.numpy()
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = v0
    res = residual_trace(sim, q0, qd0, T)
    Q, QD = sim.forward(q0, qd0, T)
    n_contacts = int(sim.solver.ct_count.numpy()[0])
    print(f"\nbox on a triangle mesh ({pullback}): max Newton residual {res.max():.1e}, {n_contacts} contacts, "
          f"final vx {QD[-1, 0, 0]:.3f} m/s")
    assert res.max() < 1e-3 and n_contacts >= 4 and QD[-1, 0, 0] > 0.2  # converged, on the mesh, still sliding
    g = final_coordinate_grad(sim, q0, qd0, T, 0)

    def x_of_mu(v: float) -> np.ndarray:
        sim.set_parameters({"mu": v})
        return np.array([float(sim.forward(q0, qd0, T)[0][-1, 0, 0])])

    def x_of_v0(v: float) -> np.ndarray:
        qd = qd0.copy()
        qd[0, 0] = v
        return np.array([float(sim.forward(q0, qd, T)[0][-1, 0, 0])])

    fd_mu = float(central(x_of_mu, mu)[0])
    sim.set_parameters({"mu": mu})
    fd_v0 = float(central(x_of_v0, v0)[0])
    a_mu, a_v0 = float(g.params["mu"]), float(g.body_qd0[0, 0])
    errs = report(f"box on a triangle mesh ({pullback}), L = final x", [
        ("dx/dmu vs FD", a_mu, fd_mu), ("dx/dmu vs closed form", a_mu, -G * h * h * T * (T + 1) / 2),
        ("dx/dv0 vs FD", a_v0, fd_v0), ("dx/dv0 vs closed form T h", a_v0, T * h)])
    assert max(errs.values()) <= TOL, errs


@pytest.mark.xfail(strict=True, reason=(
    "robot on the sum-of-sinusoids mesh (12 m, 60 x 60 cells, 7,200 faces, amplitude 0.15 m), 1 m/s, gentle "
    "left turn, regularised wheels (slip speed 0.05 m/s), 10 steps at h = 0.08 s, 32 Newton iterations: the "
    "steps end at residuals up to 1.3e-3 m/s (not converged to the IFT's premise) and the adjoint is 20-100 % "
    "off central FD (dx/dtarget[left] 0.111 vs 0.082, dyaw/dtarget[right] 0.304 vs 0.422, dy/dmu_lat -0.062 vs "
    "-0.208; dyaw/dtarget[left] agrees to 0.17 %); with exact Coulomb wheels 8-370 %. Open: whether the "
    "contact set newton reports on the mesh (points jumping between faces) makes the map non-smooth at the FD "
    "step, or the unconverged steps bias the adjoint; measured 2026-12-03"))
def test_robot_on_mesh_terrain_gradients() -> None:
    T, h, v, turn = 10, 0.08, 1.0, 0.1
    verts, idx = sinusoid_terrain(size=12.0, resolution=60, amplitude=0.15, seed=0)
    sc = build_robot_scene(1, terrain=(verts, idx), device="cpu")
    m, hd, desc = sc.model, sc.handles[0], sc.robot
    solver = SolverOstrich(m, SolverOptions(newton_iters=32))
    solver.set_anisotropic_friction(hd.wheel_shapes, desc.mu, 0.5)
    solver.set_slip_speed(hd.wheel_shapes, 0.05)
    sim = Simulation(solver, h)
    sim.register_parameter("kp", "joint_kd", hd.wheel_joints)
    sim.register_parameter("mu_lat", "shape_mu_lat", hd.wheel_shapes)
    s = m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s)
    qd0 = np.zeros((m.body_count, 6), np.float32)
    for b in [hd.chassis, *hd.wheels]:
        qd0[b, 0] = v
    for b in hd.wheels:
        qd0[b, 4] = v / desc.wheel_radius
    start = m.joint_qd_start.numpy()
    cols = [int(start[j]) for j in hd.wheel_joints]
    tq = np.zeros((T, m.joint_dof_count), np.float32)
    for col, k in zip(cols, (1 - turn, 1 + turn, 1.0)):
        tq[:, col] = v / desc.wheel_radius * k
    rc = RobotCase(sc, sim, s.body_q.numpy(), qd0, tq, cols)
    res = residual_trace(sim, rc.q0, rc.qd0, T, tq)
    print(f"\nrobot on mesh terrain: max Newton residual {res.max():.1e}")
    grads = robot_pose_grads(rc, (0, 1, 2))
    fd = robot_fd(rc, {"kp": desc.kp, "mu_lat": 0.5})
    worst = 0.0
    for i, g in enumerate(grads):
        coord = ("x", "y", "yaw")[i]
        adj = robot_adj_rows(rc, g, ["kp", "mu_lat"])
        errs = report(f"robot on mesh terrain, L = final {coord}",
                      [(f"d{coord}/d{k}", adj[k], float(fd[k][i])) for k in adj])
        scale = max(abs(float(fd[k][i])) for k in adj)
        worst = max(worst, *(abs(adj[k] - float(fd[k][i])) / scale for k in adj))
        del errs
    assert worst <= TOL and math.isfinite(worst), worst
