"""Friction per surface: a contact's coefficients combined from its two shapes' by
`SolverOstrich.set_friction_combine` (`FrictionCombine`: wheel, max, product, geometric_mean).

Closed forms on each rule: a block sliding on the ground decelerates at mu_c g with mu_c the rule's
combination of the block's and the ground's coefficients (backward Euler: x_T = v0 h T - mu_c g h^2
T (T+1) / 2 while it slides); a block on an incline sticks below tan(theta) = mu_c and slides above it.
Gradients: d(final pose)/d(the pallet's coefficient) on a regularised pallet climb under the max rule,
by the adjoint and the tangent against central finite differences (0.5 %)."""

from __future__ import annotations

import math

import newton
import numpy as np
import pytest
import warp as wp

from sysid.engine import EngineError, FrictionCombine, Simulation, SolverOptions, SolverOstrich, Tangents
from tests.engine.test_engine_adjoint import TOL, rel_err, robot_case, robot_pose, yaw_grad

G = 9.81  # [m/s^2]
H, T, V0 = 0.05, 8, 3.0  # step [s], steps, initial speed [m/s]
MU_BLOCK, MU_GROUND = 0.2, 0.5
RULES = {"wheel": 0.5 * (MU_BLOCK + MU_GROUND), "max": MU_GROUND, "product": MU_BLOCK * MU_GROUND,
         "geometric_mean": math.sqrt(MU_BLOCK * MU_GROUND)}  # mu_c of an isotropic block-ground contact


def block(mu_block: float, mu_ground: float, tilt: float = 0.0) -> tuple[Simulation, np.ndarray]:
    """A 1 kg cube resting on the ground (each with its own coefficient); gravity tilted by ``tilt``
    [rad] about y (an incline along +x)."""
    b = newton.ModelBuilder()
    b.add_ground_plane(cfg=newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu_ground, gap=0.1))
    body = b.add_body(xform=wp.transform((0.0, 0.0, 0.1), wp.quat_identity()), mass=1.0,
                      inertia=wp.mat33(0.01, 0, 0, 0, 0.01, 0, 0, 0, 0.01))
    b.add_shape_box(body, hx=0.1, hy=0.1, hz=0.1, cfg=newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu_block,
                                                                                       gap=0.1))
    m = b.finalize(device="cpu")
    m.gravity.assign(np.array([[G * math.sin(tilt), 0.0, -G * math.cos(tilt)]], np.float32))
    return Simulation(SolverOstrich(m, SolverOptions(newton_iters=32)), H), m.body_q.numpy()


@pytest.mark.parametrize("rule", list(RULES))
def test_sliding_block_decelerates_at_the_combined_mu(rule: str) -> None:
    sim, q0 = block(MU_BLOCK, MU_GROUND)
    sim.solver.set_friction_combine(rule)
    assert sim.solver.friction_combine_of(1) == FrictionCombine.of(rule)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = V0
    x = float(sim.forward(q0, qd0, T)[0][-1, 0, 0])
    mu = RULES[rule]
    assert V0 - T * mu * G * H > 0.1  # still sliding at the end: the closed form holds
    closed = V0 * H * T - mu * G * H * H * T * (T + 1) / 2
    print(f"{rule}: x_T {x:.6f} m, closed form {closed:.6f} m (mu_c {mu:.4f})")
    assert abs(x - closed) < 2e-4, (rule, x, closed)


@pytest.mark.parametrize("rule", ["max", "product"])
def test_block_on_incline_sticks_below_the_combined_mu(rule: str) -> None:
    """tan(theta) = 0.35: below the max rule's 0.5 (sticks), above the product's 0.1 (slides down at
    g (sin - mu_c cos))."""
    theta = math.atan(0.35)
    sim, q0 = block(MU_BLOCK, MU_GROUND, tilt=theta)
    sim.solver.set_friction_combine(rule)
    x = float(sim.forward(q0, np.zeros((1, 6), np.float32), T)[0][-1, 0, 0])
    mu = RULES[rule]
    if math.tan(theta) < mu:
        assert abs(x) < 1e-4, (rule, x)
    else:
        a = G * (math.sin(theta) - mu * math.cos(theta))
        closed = a * H * H * T * (T + 1) / 2
        assert abs(x - closed) < 0.02 * closed, (rule, x, closed)


def test_unknown_rule_is_an_engine_error() -> None:
    sim, _ = block(MU_BLOCK, MU_GROUND)
    with pytest.raises(EngineError, match="use one of wheel, max, product, geometric_mean"):
        sim.solver.set_friction_combine("min")


def test_wheel_rule_ignores_the_surface() -> None:
    """The default rule: a wheel's own coefficients whatever it touches (the pallet's value has no effect)."""
    rc = robot_case(12, 1.0, 0.0, 0.5, 32, pallet=(1.2, 0.0, 0.0))
    pallet = pallet_shapes(rc)
    sim = rc.sim
    sim.register_parameter("mu_pallet", "shape_mu", pallet)
    poses = []
    for mu in (0.3, 1.6):
        sim.set_parameters({"mu_pallet": mu})
        poses.append(robot_pose(rc, sim.forward(rc.q0, rc.qd0, 12, rc.targets)[0]))
    assert np.array_equal(poses[0], poses[1])
    sim.solver.set_friction_combine("max")
    moved = []
    for mu in (1.0, 1.6):
        sim.set_parameters({"mu_pallet": mu})
        moved.append(robot_pose(rc, sim.forward(rc.q0, rc.qd0, 12, rc.targets)[0]))
    assert np.abs(moved[0] - moved[1]).max() > 1e-3  # under max, the pallet above the wheels' 0.8 decides
    sim.solver.set_friction_combine("wheel", rc.scene.handles[0].wheel_shapes)  # a wheel's contacts: its rule
    assert sim.solver.friction_combine_of(pallet[0]) == FrictionCombine.MAX
    sim.set_parameters({"mu_pallet": 1.0})
    assert np.array_equal(robot_pose(rc, sim.forward(rc.q0, rc.qd0, 12, rc.targets)[0]), poses[0])


def pallet_shapes(rc) -> list[int]:
    m = rc.scene.model
    body, kind = m.shape_body.numpy(), m.shape_type.numpy()
    return [int(s) for s in np.flatnonzero((body < 0) & (kind == int(newton.GeoType.BOX)))]


def test_pallet_mu_gradient_adjoint_and_tangent_vs_fd() -> None:
    """The regularised pallet climb (20 steps at h = 0.1 s from 1 m/s, pallet edge 1.0 m ahead, slip
    speed 0.05 m/s, wheels at mu 0.8, the pallet at 1.2 under the max rule): d(final x, y, yaw)/d mu_pallet
    by the adjoint and the tangent against central FD (step 1 % of the value), each within 0.5 % of the
    row's largest component (y and yaw of a straight climb are tiny)."""
    steps = 20
    rc = robot_case(steps, 1.0, 0.0, 0.5, 64, pallet=(1.6, 0.0, 0.0))
    sim = rc.sim
    sim.solver.set_slip_speed(rc.scene.handles[0].wheel_shapes, 0.05)
    sim.solver.set_friction_combine("max")
    sim.register_parameter("mu_pallet", "shape_mu", pallet_shapes(rc))
    mu0 = 1.2
    sim.set_parameters({"mu_pallet": mu0})
    ch = rc.scene.handles[0].chassis

    Q, _ = sim.forward(rc.q0, rc.qd0, steps, rc.targets)
    adj = np.zeros(3)
    for comp in range(3):
        gQ = np.zeros_like(Q)
        if comp < 2:
            gQ[-1, ch, comp] = 1.0
        else:
            gQ[-1, ch] = yaw_grad(Q[-1, ch])
        sim.forward(rc.q0, rc.qd0, steps, rc.targets)
        adj[comp] = float(sim.backward(gQ, None).params["mu_pallet"])
    res = sim.jvp(rc.q0, rc.qd0, steps, Tangents(params={"mu_pallet": np.array([1.0], np.float32)}),
                  targets_qd=rc.targets)
    dq = res.dq[0, -1, ch]
    tan = np.array([dq[0], dq[1], float(yaw_grad(res.q[-1, ch]) @ dq)])
    e = 0.01 * mu0
    poses = []
    for mu in (mu0 + e, mu0 - e):
        sim.set_parameters({"mu_pallet": mu})
        poses.append(robot_pose(rc, sim.forward(rc.q0, rc.qd0, steps, rc.targets)[0]))
    fd = (poses[0] - poses[1]) / (2 * e)
    scale = np.abs(fd).max()
    print(f"\nd(x, y, yaw)/d mu_pallet: adjoint {adj}, tangent {tan}, FD {fd}; rel. err. of x: "
          f"adjoint {rel_err(adj[0], fd[0]):.2e}, tangent {rel_err(tan[0], fd[0]):.2e}")
    assert scale > 1e-3  # the pallet's coefficient matters on this climb
    assert np.abs(adj - fd).max() <= TOL * scale, (adj, fd)
    assert np.abs(tan - fd).max() <= TOL * scale, (tan, fd)
