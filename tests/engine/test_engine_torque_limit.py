"""The wheel servos' torque limit (`torque_limit` [N m], the engine's ``joint_effort_limit``).

The implicit velocity servo's impulse saturates smoothly at h tau_max: tau = tau_max n / sqrt(1 + n^2),
n = (unlimited servo torque) / tau_max (sysid/engine/rows.py, joint_row_law).

Closed form: the robot from rest on flat ground, every wheel commanded far above what it can reach
(n >> 1: each servo at tau_max), the wheels rolling: n_w tau = (m r + n_w I / r) a, so
a = n_w tau / (m r + n_w I / r) with m = 106 kg (chassis 88 + three 6 kg wheels), r = 0.36 m,
I = 0.389 kg m^2 (spin inertia), n_w = 3. Backward Euler from rest at constant a: v_k = a h k and
x_k = a h^2 k (k + 1) / 2. Gradients of the final pose in torque_limit (tangent and adjoint) against
central differences.
"""

import numpy as np
import pytest

from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import step_run
from tests.helpers.servo import I_SPIN, NW, ROBOT, H, M, R, servo_theta

THETA = servo_theta(1.0)


def test_torque_limited_start_accelerates_at_the_closed_form_rate():
    # a 10 rad/s step from rest saturates every servo deeply in the first step (n ~ 125): the
    # capped Newton gain converges linearly there (0.22 m/s after 16 iterations), so allow more
    sim = OstrichReplay(ROBOT, extra_iters=32)
    tau = 20.0
    p = sim.rollout([step_run(10.0, 1.5)], {**THETA, "torque_limit": tau}, H)[0]
    a_exact = NW * tau / (M * R + NW * I_SPIN / R)
    t = p[:, 0]
    k = int(round(1.0 / H))
    i = int(np.argmin(np.abs(t - k * H)))
    a_fit = 2 * p[i, 1] / (H * H * k * (k + 1))
    print(f"\ntorque-limited start: a = {a_fit:.4f} m/s^2, closed form {a_exact:.4f} ({a_fit / a_exact - 1:+.2%})")
    assert a_fit == pytest.approx(a_exact, rel=0.01)
    assert sim.last_status["residual_max"] < 1e-4
    # without the limit the same command accelerates at the traction limit, far harder
    q = sim.rollout([step_run(10.0, 1.5)], THETA, H)[0]
    assert q[i, 1] > 2.5 * p[i, 1]


def test_zero_limit_is_the_unlimited_servo_exactly():
    sim = OstrichReplay(ROBOT)
    run = step_run(3.0, 1.5, right=1.5)
    a = sim.rollout([run], THETA, H)[0]
    b = sim.rollout([run], {**THETA, "torque_limit": 0.0}, H)[0]
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="torque_limit"):
        sim.rollout([run], {**THETA, "torque_limit": -1.0}, H)


@pytest.mark.parametrize("tau", [15.0, 60.0])  # deep saturation, and a servo that saturates only at the start
def test_torque_limit_gradient_matches_central_differences(tau):
    sim = OstrichReplay(ROBOT, extra_iters=32)  # the tangent needs converged steps (deep saturation at the start)
    runs = [step_run(6.0, duration=2.0, right=3.0)]  # a turn: the pose depends on tau in x, y and yaw
    theta = {**THETA, "torque_limit": tau}
    names = ["torque_limit", "kp", "mu"]
    poses, jacs = sim.rollout_with_jacobian(runs, theta, H, names)
    assert sim.last_status["jacobian"] == "tangent"
    J = jacs[0]
    for c, n in enumerate(names):
        e = 1e-2 * theta[n]  # kp's effect is small (mm): a larger step keeps FD above the solver's noise
        plus = sim.rollout(runs, {**theta, n: theta[n] + e}, H)[0]
        minus = sim.rollout(runs, {**theta, n: theta[n] - e}, H)[0]
        fd = (plus[:, 1:] - minus[:, 1:]) / (2 * e)
        rel = np.max(np.abs(J[:, :, c] - fd)) / np.max(np.abs(fd))
        print(f"tau {tau}: d pose / d {n}: tangent vs central FD relative error {rel:.2e} "
              f"(|FD| max {np.max(np.abs(fd)):.3g})")
        assert rel < 5e-3, (n, rel)
    # the adjoint (one backward sweep) gives the same gradient of a scalar loss
    g = [np.zeros((len(poses[0]), 7))]
    g[0][-1, 0], g[0][-1, 1] = 1.0, 0.5  # L = x_end + 0.5 y_end
    _, vjp = sim.rollout_with_vjp(runs, theta, H, names)
    adj = vjp(g)
    tang = np.einsum("tk,tkn->n", g[0], J)
    print(f"tau {tau}: adjoint {adj}, tangent {tang}")
    np.testing.assert_allclose(adj, tang, rtol=5e-3, atol=1e-7)
