"""`SolverOptions(linear_solver="direct")` (the default; "pcr" the paper's solve): in the worlds whose single
exact-Coulomb contacts (wheels) are pinned and solve the Schur system to a tolerance, each world's
A = J M~^-1 J^T + C is assembled in float64 and Cholesky-factored once per Newton iteration
(`sysid.engine.schur.dense_factor`, each row's envelope only) instead of iterated by the matrix-free
PCR; every other world (the early iterations, redundant contact sets such as a box's corners) keeps
the PCR. The physics must not change: the closed forms still hold with the option on, the robot's
answers equal the PCR's, every step converges, worlds above the dense bound and worlds on a triangle
mesh take the PCR bit for bit, and the envelope factor solves the Schur system as a full one would.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import warp as wp

from benchmarks import bench_convergence as bc
from sysid.engine import SolverOptions, SolverOstrich
from sysid.engine.rows import build_rows
from sysid.engine.schur import dense_factor, dense_solve
from sysid.engine.types import NewtonStep, repacked
from sysid.robot.scenes import WorldSpec
from tests.helpers.engine import G, box_model, initial_state, robot_scene, rollout, set_gravity, wheel_control

DIRECT = SolverOptions(linear_solver="direct")


def test_direct_sliding_box_matches_the_closed_form() -> None:
    """Backward Euler with impulse-level Coulomb friction: a box sliding at v0 = 2 m/s (mu 0.5,
    h = 0.1 s) has v_n = v0 - mu g h n until it sticks (v_4 = 0.038 m/s), then 0, every step below
    1e-5 m/s, with the option on (the box's four corners are a redundant set: they keep the PCR, whose
    implicit regularisation their singular friction split needs)."""
    model = box_model(mu=0.5)
    s = model.state()
    s.body_qd.assign(np.array([[2.0, 0, 0, 0, 0, 0]], dtype=np.float32))
    h = 0.1
    r = rollout(model, SolverOstrich(model, DIRECT), 6, h, state=s)
    vx = r.qd[:, 0, 0]
    closed = np.maximum(2.0 - 0.5 * G * h * np.arange(1, 7), 0.0)
    print(f"direct slide: |v - closed form| max {np.abs(vx - closed).max():.2e} m/s, "
          f"residual max {r.residual.max():.2e}")
    assert r.residual.max() < 1e-5
    np.testing.assert_allclose(vx, closed, atol=2e-4)


@pytest.mark.parametrize("tan_theta", [0.4, 0.7])
def test_direct_incline_sticks_below_mu_and_slides_above(tan_theta: float) -> None:
    """mu = 0.5 on an incline (gravity tilted by theta): tan 0.4 sticks (displacement < 1 mm in 2 s),
    tan 0.7 slides at a = g (sin(theta) - mu cos(theta)) = 1.607 m/s^2 (1 %)."""
    th = math.atan(tan_theta)
    model = box_model(mu=0.5)
    set_gravity(model, (G * math.sin(th), 0.0, -G * math.cos(th)))
    h = 0.05
    r = rollout(model, SolverOstrich(model, DIRECT), 40, h)
    x, vx = r.q[:, 0, 0], r.qd[:, 0, 0]
    if tan_theta < 0.5:
        print(f"direct incline stick: displacement {abs(x[-1]) * 1e3:.4f} mm, residual max {r.residual.max():.1e}")
        assert np.max(np.abs(x)) < 1e-3 and r.residual.max() < 1e-5
    else:
        t = h * np.arange(1, len(vx) + 1)
        a = np.polyfit(t[1:], vx[1:], 1)[0]
        a_star = G * (math.sin(th) - 0.5 * math.cos(th))
        print(f"direct incline slide: a {a:.4f} m/s^2 (closed form {a_star:.4f})")
        assert a == pytest.approx(a_star, rel=1e-2)


PCR = SolverOptions(linear_solver="pcr")


def test_direct_pallet_traversal_matches_pcr() -> None:
    """The robot driving over the pallet at 1 m/s with exact Coulomb wheels (bench_convergence's
    `pallet`, 60 steps at h = 0.1 s): every step of the direct solve below 1e-5 m/s (measured 2026-12-05:
    worst 7.2e-6; the PCR's 5.0e-6) and the chassis path equal to the PCR's within 1 mm (measured
    0.001 mm)."""
    pcr_res, pcr_q = bc.pallet(PCR, return_states=True)
    dir_res, dir_q = bc.pallet(DIRECT, return_states=True)
    diff = float(np.abs(dir_q[..., :3] - pcr_q[..., :3]).max())
    print(f"pallet: direct worst {dir_res.max():.1e} ({np.mean(dir_res < 1e-5):.0%} below 1e-5), "
          f"pcr worst {pcr_res.max():.1e}; chassis |direct - pcr| max {diff * 1e3:.3f} mm")
    assert dir_res.max() < 1e-5
    assert diff < 1e-3


def test_direct_turning_in_place_converges_and_exact_early_steps_do_not() -> None:
    """Turning in place (exact Coulomb, 50 steps at h = 0.1 s): with the dense solve in the worlds that
    solve to tolerance every step ends below 1e-5 m/s (measured 8.7e-6; the PCR default before: 98 %,
    1.2e-5). Solving the early, fixed-budget iterations exactly as well (here: the PCR with pcr_iters=64,
    near-exact on these systems) stalls every other step near 1e-4 m/s (measured 50 % below 1e-5, worst
    6.1e-4): why "direct" applies to the tolerance worlds only. The first figures with the whole budget
    (stall_tol=0); with the stall exit (the default: worlds stop at the float32 floor below 1e-5) the path
    differs from step 17 on and two steps of 50 end above 1e-5 (worst 1.5e-5, a jump at its 10th iteration)."""
    r = bc.turn(SolverOptions(linear_solver="direct", stall_tol=0.0))
    r_stall = bc.turn(DIRECT)
    exact_early = bc.turn(SolverOptions(linear_solver="pcr", pcr_iters=64, stall_tol=0.0))
    print(f"turn: direct worst {r.max():.1e} ({np.mean(r < 1e-5):.0%} below 1e-5), with the stall exit "
          f"{r_stall.max():.1e} ({np.mean(r_stall < 1e-5):.0%}); exact early iterations "
          f"worst {exact_early.max():.1e} ({np.mean(exact_early < 1e-5):.0%})")
    assert r.max() < 1e-5
    assert r_stall.max() < 3e-5 and np.mean(r_stall < 1e-5) >= 0.95
    assert exact_early.max() > 1e-4 and np.mean(exact_early < 1e-5) < 0.8


def test_direct_falls_back_to_pcr_above_the_bound() -> None:
    """direct_max_rows below a world's active rows (the robot: 18 joint rows + 3 per contact): that world
    takes the PCR, bit for bit; within the bound the path differs (the dense solve ran)."""
    res_small, q_small = bc.pallet(SolverOptions(linear_solver="direct", direct_max_rows=8), return_states=True)
    res_pcr, q_pcr = bc.pallet(PCR, return_states=True)
    res_dir, q_dir = bc.pallet(DIRECT, return_states=True)
    np.testing.assert_array_equal(q_small, q_pcr)
    np.testing.assert_array_equal(res_small, res_pcr)
    assert not np.array_equal(res_dir, res_pcr)


def test_direct_keeps_the_pcr_on_a_mesh() -> None:
    """The robot climbing a step given in one mesh with the ground (tests/engine/test_engine_mesh_gradients.py):
    solved exactly, one step ended at 1.7 m/s (the wheel's closest mesh point switches between the ground and
    the step's side from one iterate to the next, and the exact steps jumped across the switch; the PCR:
    5.9e-6). Worlds with a contact on a mesh keep the PCR, so the path is the PCR's bit for bit and every
    step converges."""
    from sysid.robot.scenes import WorldSpec
    from tests.engine.test_engine_mesh_gradients import pallet_traversal, step_mesh

    Qd, rd = pallet_traversal(WorldSpec(terrain=step_mesh()), options=DIRECT)
    Qp, rp = pallet_traversal(WorldSpec(terrain=step_mesh()), options=PCR)
    print(f"step in one mesh, direct: worst residual {rd:.1e} m/s, final x {Qd[-1, 0]:.3f} m")
    np.testing.assert_array_equal(Qd, Qp)
    assert rd == rp and rd < 1e-4


@pytest.mark.parametrize("kw", [{"linear_solver": "cholesky"}, {"direct_max_rows": 0}])
def test_direct_options_are_checked(kw: dict) -> None:
    with pytest.raises(ValueError, match="linear_solver|direct_max_rows"):
        SolverOstrich(box_model(), SolverOptions(**kw))


@wp.kernel(enable_backward=False)
def _factor_and_solve(masked: wp.array(dtype=int), st: NewtonStep):
    """Per world: the rows at the iterate, the rows listed in ``masked`` pinned (pinv = 0), the dense factor
    and one solve A x = rhs (scr.x, scr.rhs: the Newton step's sequence)."""
    w = wp.tid()
    rbase = w * st.sc.max_rows
    n = build_rows(w, st.sc, st.model, st.data, st.ct, st.at, st.rows)
    for i in range(masked.shape[0]):
        st.rows.pinv[rbase + masked[i]] = 0.0
    dense_factor(w, n, st.sc, st.rows, st.scr)
    dense_solve(w, n, st.sc, st.rows, st.scr)


def _schur_matrix(rows: dict, inv_m: np.ndarray, inv_I: np.ndarray) -> np.ndarray:
    """A = J M~^-1 J^T + C of one world's rows in float64 from the rows' bodies and Jacobian blocks (inverse
    inertia symmetrised, as the kernel's); masked rows (pinv = 0) are identity rows."""
    n = len(rows["a"])
    nb = inv_m.shape[0]
    J = np.zeros((n, 6 * nb))
    for i in range(n):
        for body, blk in ((rows["a"][i], rows["Ja"][i]), (rows["b"][i], rows["Jb"][i])):
            if body >= 0:
                J[i, 6 * body:6 * body + 6] += blk
    Minv = np.zeros((6 * nb, 6 * nb))
    for b in range(nb):
        Minv[6 * b:6 * b + 3, 6 * b:6 * b + 3] = inv_m[b] * np.eye(3)
        Minv[6 * b + 3:6 * b + 6, 6 * b + 3:6 * b + 6] = 0.5 * (inv_I[b] + inv_I[b].T)
    A = J @ Minv @ J.T + np.diag(rows["C"])
    mask = rows["pinv"] == 0.0
    A[mask, :] = 0.0
    A[:, mask] = 0.0
    A[mask, mask] = 1.0
    return A


def test_envelope_factor_solves_the_schur_system() -> None:
    """The dense factor forms and factors each row's envelope only, its rows ordered body by body (a
    wheel's contact rows before its joint rows): with L L^T = P A P^T on the envelope, the solve must be
    the full system's. The robot on the pallet run 25 steps at h = 0.1 s (wheels on the ground and the
    pallet's edge: 36 rows), two rows pinned (identity rows, their unknowns 0): the float64 solution's
    relative residual |A x - b| / |b| below 1e-8 (measured 3.8e-11 at cond(A) 3.1e11: the joints'
    compliance is 1e-7) and its distance to numpy's solve below 1e-14 cond(A) (measured 1.6e-10), every
    entry of P A P^T left of a row's envelope exactly 0, the envelope's multiply-adds below a third of the
    full factor's (2,051 here, 7,776 full), and the float32 solution the float64 one rounded."""
    sc = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
    m = sc.model
    solver = SolverOstrich(m, SolverOptions())
    s0, s1 = initial_state(sc), m.state()
    c = wheel_control(sc, (1 / 0.36, 1 / 0.36, 1 / 0.36))
    for _ in range(25):
        solver.step(s0, s1, c, None, 0.1)
        s0, s1 = s1, s0
    st = solver._iteration_args(0.1)[2]
    stc, data, it, rows, scr = st.sc, st.data, st.it, st.rows, st.scr
    dm = solver._direct_max()
    R = stc.max_rows
    rng = np.random.default_rng(0)
    b = rng.normal(size=R).astype(np.float32)
    x = wp.zeros(R, dtype=float)
    masked = np.array([2, 20], np.int32)
    assert scr.dm == dm
    wp.launch(_factor_and_solve, 1, inputs=[wp.array(masked, dtype=int),
                                              repacked(st, scr=repacked(scr, rhs=wp.array(b, dtype=float), x=x))])
    n = int(it.n_rows.numpy()[0])
    host = {k: getattr(rows, k).numpy()[:n].astype(np.float64) if k not in ("a", "b") else getattr(rows, k).numpy()[:n]
            for k in ("a", "b", "Ja", "Jb", "C", "pinv")}
    A = _schur_matrix(host, data.inv_m.numpy().astype(np.float64), data.inv_I.numpy().astype(np.float64))
    perm = scr.perm.numpy()[:n]
    env = scr.env.numpy()[:n]
    assert sorted(perm.tolist()) == list(range(n))
    x64 = np.zeros(n)
    for p in range(n):  # the float64 solution in the rows' order (dense_solve leaves it in y64, permuted)
        x64[perm[p]] = scr.y64.numpy()[p]
    bb = b[:n].astype(np.float64)
    bb[masked] = 0.0  # a pinned row's unknown is 0 whatever its right-hand side
    rel_res = np.linalg.norm(A @ x64 - bb) / np.linalg.norm(bb)
    xn = np.linalg.solve(A, bb)
    rel_np = np.linalg.norm(x64 - xn) / np.linalg.norm(xn)
    cond = np.linalg.cond(A)
    PA = A[np.ix_(perm, perm)]
    outside = max((np.abs(PA[p, :env[p]]).max() if env[p] > 0 else 0.0) for p in range(n))
    macs = sum(q - max(env[p], env[q]) for p in range(n) for q in range(env[p], p)) + sum(p - env[p] for p in range(n))
    print(f"envelope factor: {n} rows (cond {cond:.1e}), |A x - b| / |b| {rel_res:.1e}, |x - numpy's| / |x| "
          f"{rel_np:.1e}, |P A P^T| left of the envelope {outside:.0e}, {macs} multiply-adds (full: {n ** 3 // 6})")
    assert n == 36
    assert rel_res < 1e-8
    assert rel_np < 1e-14 * cond
    assert outside == 0.0
    assert macs < n ** 3 // 18
    assert np.all(x64[masked] == 0.0)
    assert np.allclose(x.numpy()[:n], x64, rtol=1e-6, atol=1e-6 * np.abs(x64).max())
