"""`SolverOptions(linear_solver="direct")` (an option; the default is the PCR): in the worlds whose single
exact-Coulomb contacts (wheels) are pinned and solve the Schur system to a tolerance, each world's
A = J M~^-1 J^T + C is assembled in float64 and Cholesky-factored once per Newton iteration
(`sysid.engine.schur.dense_factor`) instead of iterated by the matrix-free PCR; every other world (the
early iterations, redundant contact sets such as a box's corners) keeps the PCR. The physics must not
change: the closed forms still hold with the option on, the robot's answers equal the PCR's, every
step converges, worlds above the dense bound and worlds on a triangle mesh take the PCR bit for bit.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from sysid.engine import SolverOptions, SolverOstrich
from tests.helpers.engine import G, box_model, rollout, set_gravity

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_convergence as bc  # noqa: E402

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
    from sysid.engine.scenes import WorldSpec
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
