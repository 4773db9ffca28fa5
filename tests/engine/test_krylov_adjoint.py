"""The Krylov adjoint (`SolverOptions(adjoint_solver="krylov")`, issue 18): per world a right-preconditioned
GMRES on the device, one VJP sweep of the residual per iteration instead of the LU's n assembly sweeps, the
preconditioner the forward's Schur elimination at the converged iterate (eq. 18-19, its Schur matrix
Cholesky-factored once per step), restart cycles from the true residual decided on the device, and the LU
again for a backward in which a world's step missed adjoint_tol.

Checked here: the sliding block's closed forms dx_T/dmu = -g h^2 T (T+1) / 2 and dx_T/dv0 = T h of backward
Euler and central FD; the robot (turning with sliding wheels; driving onto the pallet) against the LU's
gradients; a world's gradient in a batch bit-identical to the same world alone; the LU fallback; bad options.
"""

from __future__ import annotations

import numpy as np
import pytest

from sysid.engine import Simulation, SolverOptions
from tests.engine.test_engine_adjoint import SLIDE, TOL, G, report, robot_case, slide_fd, slide_sim
from tests.helpers.engine import varied_robot_batch

KRYLOV = {"adjoint_solver": "krylov"}
MATCH_LU = 1e-5  # of the Jacobian's largest entry: the normwise residual's resolution (adjoint_krylov_tol 2e-7)


def _use(sim: Simulation, **options: object) -> None:
    for k, v in options.items():
        setattr(sim.solver.options, k, v)


def test_krylov_sliding_block_closed_form_and_fd() -> None:
    """The adjoint tests' sliding block (1 kg cube, v0 = 2 m/s, mu = 0.4, h = 0.05 s, 8 steps, still sliding)
    with the Krylov adjoint: d(final x)/d(mu, v0) against the closed forms of backward Euler, v_k = v0 - k mu g
    h, x_T = x0 + h sum_k v_k => dx_T/dmu = -g h^2 T (T+1) / 2, dx_T/dv0 = T h, and central FD, <= 0.5 %;
    no LU fallback."""
    c = SLIDE
    sim, q0, qd0 = slide_sim()
    _use(sim, **KRYLOV)
    Q, QD = sim.forward(q0, qd0, c["T"])
    assert QD[-1, 0, 0] > 0.2, "the block must still slide at the end"
    gQ = np.zeros((c["T"] + 1, 1, 7), np.float32)
    gQ[-1, 0, 0] = 1.0
    g = sim.backward(gQ, None)
    assert sim.adjoint_fallbacks == 0 and g.converged.all()
    fd_mu, fd_v0 = slide_fd(sim, q0, qd0)
    closed_mu = -G * c["h"] ** 2 * c["T"] * (c["T"] + 1) / 2
    a_mu, a_v0 = float(g.params["mu"]), float(g.body_qd0[0, 0])
    errs = report("sliding block, Krylov adjoint, L = final x", [
        ("dx/dmu vs FD", a_mu, fd_mu), ("dx/dmu vs closed form", a_mu, closed_mu),
        ("dx/dv0 vs FD", a_v0, fd_v0), ("dx/dv0 vs closed form T h", a_v0, c["T"] * c["h"])])
    assert max(errs.values()) <= TOL, errs


def _robot_gradients(rc, solver: str) -> list[np.ndarray]:
    """[d(final chassis x, y, z)/d(wheel targets per step, kp, mu_lat, initial twists)] by the given solve."""
    _use(rc.sim, adjoint_solver=solver)
    T = rc.targets.shape[0]
    ch = rc.scene.handles[0].chassis
    out = []
    for comp in range(3):
        Q, _ = rc.sim.forward(rc.q0, rc.qd0, T, rc.targets)
        gQ = np.zeros_like(Q)
        gQ[-1, ch, comp] = 1.0
        g = rc.sim.backward(gQ, None)
        assert g.converged.all()
        out.append(np.concatenate([g.targets_qd[:, rc.cols].ravel(), [float(g.params["kp"]),
                                   float(g.params["mu_lat"])], g.body_qd0.ravel()]))
    return out


@pytest.mark.parametrize("case", ["turning", "pallet"])
def test_krylov_equals_lu_on_the_robot(case: str) -> None:
    """The robot turning hard (targets (0.6, 1.4, 1) v/r: the wheels slide sideways; 6 steps) or driving
    straight onto the pallet (2 m/s, the pallet 0.9 m ahead, 12 steps at h = 0.1 s): the Jacobian d(final
    chassis x, y, z)/d(wheel targets per step, kp, mu_lat, initial twists), Krylov against the LU: max
    |difference| <= 1e-5 of the Jacobian's largest entry; every step below adjoint_tol, no fallback. The
    solve's residual is normwise, so a row far smaller than the terms it sums (the final height, which the
    ground holds: its entries ~1e-3 of x's) is resolved to the Jacobian's scale, not its own (printed)."""
    if case == "turning":
        rc = robot_case(6, 1.0, 0.4, 0.5, 16)
    else:
        rc = robot_case(12, 2.0, 0.0, 0.5, 16, pallet=(0.9, 0.0, 0.0))
    lu = _robot_gradients(rc, "lu")
    kr = _robot_gradients(rc, "krylov")
    assert rc.sim.adjoint_fallbacks == 0
    scale = max(float(np.abs(a).max()) for a in lu)
    worst = 0.0
    for name, a, b in zip("xyz", lu, kr):
        diff = float(np.abs(a - b).max())
        worst = max(worst, diff / scale)
        print(f"{case}: d(final {name}): Krylov vs LU max |diff| = {diff:.1e}: {diff / scale:.1e} of the Jacobian's "
              f"largest entry, {diff / np.abs(a).max():.1e} of the row's ({a.size} entries)")
    assert worst <= MATCH_LU


def test_krylov_world_gradient_independent_of_batch() -> None:
    """World 0 of a 64-world batch (the others with other gains, commands and speeds) and the same world
    alone: d(sum of final chassis x)/d(world 0's kp, targets, initial twists) bit-identical: a world restarts
    only on its own residual, and a world that passed keeps its solution whatever the others do."""
    out = []
    for worlds in (1, 64):
        sc, sim, q0, qd0, tq = varied_robot_batch(worlds, 3, 0.1, SolverOptions(newton_iters=16, **KRYLOV))
        Q, _ = sim.forward(q0, qd0, 3, tq)
        gQ = np.zeros_like(Q)
        gQ[-1, [h.chassis for h in sc.handles], 0] = 1.0
        g = sim.backward(gQ, None)
        assert sim.adjoint_fallbacks == 0 and g.converged.all()
        hd = sc.handles[0]
        start = sc.model.joint_qd_start.numpy()
        cols = [int(start[j]) for j in hd.wheel_joints]
        out.append(np.concatenate([[float(g.params["kp"][0])], g.targets_qd[:, cols].ravel(),
                                   g.body_qd0[[hd.chassis, *hd.wheels]].ravel()]))
        print(f"{worlds} world(s): adjoint residual max {g.adjoint_residual.max():.1e}")
    assert np.array_equal(out[0], out[1])


def test_krylov_falls_back_to_lu() -> None:
    """One GMRES iteration in one cycle cannot reach adjoint_tol on the turning robot: the backward runs
    again with the LU (adjoint_fallbacks counts it) and its gradients are the LU's, bit for bit. A
    checkpointed tape (its segments recomputed on the device) does the same: once per backward, the
    checkpointed LU's gradients bit for bit; with the default budget it runs the GMRES itself, the
    unsegmented tape's gradients bit for bit."""
    rc = robot_case(4, 1.0, 0.4, 0.5, 16)
    lu = _robot_gradients(rc, "lu")
    kr_full = _robot_gradients(rc, "krylov")
    _use(rc.sim, adjoint_krylov_iters=1, adjoint_krylov_cycles=1)
    kr = _robot_gradients(rc, "krylov")
    assert rc.sim.adjoint_fallbacks == 3  # one per backward
    for a, b in zip(lu, kr):
        assert np.array_equal(a, b)
    rc = robot_case(4, 1.0, 0.4, 0.5, 16, checkpoint_every=2)
    lu_ck = _robot_gradients(rc, "lu")
    kr_ck = _robot_gradients(rc, "krylov")
    assert rc.sim.adjoint_fallbacks == 0
    for a, b in zip(kr_full, kr_ck):
        assert np.array_equal(a, b)
    _use(rc.sim, adjoint_krylov_iters=1, adjoint_krylov_cycles=1)
    kr_ck1 = _robot_gradients(rc, "krylov")
    assert rc.sim.adjoint_fallbacks == 3  # one per backward, as unsegmented
    for a, b in zip(lu_ck, kr_ck1):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bad", [dict(adjoint_krylov_iters=0), dict(adjoint_krylov_iters=2.5),
                                 dict(adjoint_krylov_cycles=0), dict(adjoint_krylov_tol=0.0),
                                 dict(adjoint_krylov_tol=1e-6, adjoint_solver="krylov"), dict(adjoint_solver="cg")])
def test_krylov_options_rejected(bad: dict) -> None:
    """Bad Krylov settings are named when the options are made."""
    with pytest.raises(ValueError, match="adjoint_krylov_tol" if "adjoint_krylov_tol" in bad else next(iter(bad))):
        SolverOptions(**bad).validate()


def test_krylov_tolerance_follows_adjoint_tol() -> None:
    """adjoint_krylov_tol None (the default) aims at 0.2 x adjoint_tol, so a tighter adjoint_tol needs no second
    setting; an explicit value is kept and must stay below adjoint_tol."""
    o = SolverOptions()
    assert o.adjoint_solver == "krylov" and o.krylov_tol == 0.2 * o.adjoint_tol
    tight = SolverOptions(adjoint_tol=1e-8)
    tight.validate()
    assert tight.krylov_tol == pytest.approx(2e-9)
    assert SolverOptions(adjoint_krylov_tol=5e-7).krylov_tol == 5e-7
    with pytest.raises(ValueError, match="adjoint_krylov_tol"):
        SolverOptions(adjoint_tol=1e-7, adjoint_krylov_tol=2e-7).validate()


def test_krylov_replayed_equals_launched() -> None:
    """The Krylov backward recorded and replayed (its restart cycles a recorded conditional branch,
    `wp.capture_if`) against the same launches run one by one (the branch decided by reading the flag):
    bit-identical gradients and residuals on the robot over the pallet (cycles beyond the first run there)."""
    out = []
    for graphs in (True, False):
        rc = robot_case(12, 2.0, 0.1, 0.5, 16, pallet=(0.9, 0.0, 0.0))
        sim = Simulation(rc.sim.solver, 0.1, graphs=graphs)
        sim.register_parameter("kp", "joint_kd", rc.scene.handles[0].wheel_joints)
        _use(sim, **KRYLOV)
        ch = rc.scene.handles[0].chassis
        for _ in range(3):  # the first run launches, the second records, the third replays
            Q, _ = sim.forward(rc.q0, rc.qd0, 12, rc.targets)
            gQ = np.zeros_like(Q)
            gQ[-1, ch, 0] = 1.0
            g = sim.backward(gQ, None)
        assert sim.adjoint_fallbacks == 0
        out.append((g, sim._graphs.replayed))
    (a, na), (b, nb_) = out
    assert na > 0 and nb_ == 0
    assert np.array_equal(a.targets_qd, b.targets_qd) and np.array_equal(a.body_qd0, b.body_qd0)
    assert np.array_equal(a.params["kp"], b.params["kp"]) and np.array_equal(a.adjoint_residual, b.adjoint_residual)
