"""`SolverOptions(linear_solver="direct")`: each world's Schur matrix A = J M~^-1 J^T + C assembled in
float64 and Cholesky-factored once per Newton iteration (`sysid.engine.schur.dense_factor`) instead of
the matrix-free PCR. The physics must not change: the closed forms the PCR passes, the same answers on
the robot, and worlds too large for the dense bound falling back to PCR."""

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
    h = 0.1 s) has v_n = v0 - mu g h n until it sticks (v_4 = 0.038 m/s), then 0. Its four corner
    contacts make the Schur matrix singular in the friction split (only the compliance and the
    proximal term hold it): the dense factor must handle it as the PCR does. Every step below 1e-5 m/s."""
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


def test_direct_pallet_traversal_matches_pcr() -> None:
    """The robot driving over the pallet at 1 m/s with exact Coulomb wheels (bench_convergence's
    `pallet`, 60 steps at h = 0.1 s): the direct solve converges (98 % of steps below 1e-5 m/s, every
    step below 1e-4; measured 2026-12-05: 52 % below 1e-6, worst 8.2e-5 where the PCR's worst is 5.0e-6)
    and the chassis path equals the PCR's within 1 mm."""
    pcr_res, pcr_q = bc.pallet(SolverOptions(), return_states=True)
    dir_res, dir_q = bc.pallet(DIRECT, return_states=True)
    diff = float(np.abs(dir_q[..., :3] - pcr_q[..., :3]).max())
    print(f"pallet: direct worst {dir_res.max():.1e} ({np.mean(dir_res < 1e-5):.0%} below 1e-5), "
          f"pcr worst {pcr_res.max():.1e}; chassis |direct - pcr| max {diff * 1e3:.3f} mm")
    assert dir_res.max() < 1e-4 and np.mean(dir_res < 1e-5) >= 0.95
    assert diff < 1e-3


def test_direct_falls_back_to_pcr_above_the_bound() -> None:
    """direct_max_rows below a world's active rows: that world takes the PCR, bit for bit."""
    small = SolverOptions(linear_solver="direct", direct_max_rows=4)  # a box on the ground: 4 x 3 rows
    model = box_model(mu=0.5)
    s0 = model.state()
    s0.body_qd.assign(np.array([[2.0, 0, 0, 0, 0, 0]], dtype=np.float32))
    a = rollout(model, SolverOstrich(model, small), 5, 0.1, state=s0)
    s1 = model.state()
    s1.body_qd.assign(np.array([[2.0, 0, 0, 0, 0, 0]], dtype=np.float32))
    b = rollout(model, SolverOstrich(model, SolverOptions()), 5, 0.1, state=s1)
    np.testing.assert_array_equal(a.qd, b.qd)


@pytest.mark.parametrize("kw", [{"linear_solver": "cholesky"}, {"direct_max_rows": 0}])
def test_direct_options_are_checked(kw: dict) -> None:
    with pytest.raises(ValueError, match="linear_solver|direct_max_rows"):
        SolverOstrich(box_model(), SolverOptions(**kw))
