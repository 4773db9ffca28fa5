"""PI wheel servos (`ki` [N m/rad], the engine's ``joint_ke`` with integrated position targets).

tau = kp (s u - w) + ki (integral of s u - w) is the engine's implicit servo (eq. 8) with the position
target the integral of the scaled command (sysid/engine/rows.py, joint_row_law; the angle error taken
modulo 2 pi). Closed form: from rest on flat ground under a constant command u, a velocity servo's wheel
follows w = s u (1 - exp(-t / tau)) with tau = J / kp, J = (m r^2 + n_w I) / n_w the inertia one wheel
drives (m = 106 kg, r = 0.36 m, I = 0.389 kg m^2, n_w = 3), so the robot ends r s u tau behind the
integrated command; the integral term makes up that deficit (zero steady-state position error), the
robot ends where r s u t says. Gradients with the integral term against central differences.
"""

import numpy as np
import pytest

from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import step_run
from tests.helpers.servo import I_SPIN, NW, ROBOT, H, M, R, servo_theta

THETA = servo_theta(0.95)


def test_integral_term_makes_up_the_velocity_servos_lag_at_the_commanded_speed():
    sim = OstrichReplay(ROBOT)
    u, T = 3.0, 4.0
    run = step_run(u, T)
    J = (M * R * R + NW * I_SPIN) / NW
    end, speed = {}, {}
    for ki in (0.0, 1250.0):
        p = sim.rollout([run], {**THETA, "ki": ki}, H)[0]
        end[ki] = p[-1, 1]
        speed[ki] = (p[-1, 1] - p[-11, 1]) / (p[-1, 0] - p[-11, 0])
        assert abs(p[-1, 2]) < 1e-3  # straight
    v = R * THETA["cmd_scale"] * u
    lag = v * J / THETA["kp"]
    print(f"\nspeed after {T} s: velocity servo {speed[0.0]:.5f} m/s, PI {speed[1250.0]:.5f} m/s "
          f"(r s u = {v:.5f}); the PI servo ends {(end[1250.0] - end[0.0]) * 1e3:.2f} mm ahead "
          f"(closed form r s u J / kp = {lag * 1e3:.2f} mm)")
    # the integral term compares wheel angles: it runs at s u exactly only because its targets advance as
    # the bodies turn in a step (2 atan(h w / 2)); with h s u per step it ran 0.7 % fast
    assert speed[1250.0] == pytest.approx(v, rel=5e-4)
    assert speed[0.0] == pytest.approx(v, rel=5e-4)
    assert end[1250.0] - end[0.0] == pytest.approx(lag, rel=0.25)


def test_zero_integral_gain_is_the_velocity_servo_exactly():
    sim = OstrichReplay(ROBOT)
    run = step_run(3.0, 1.5, right=1.5)
    a = sim.rollout([run], THETA, H)[0]
    # the position targets given (differentiating in ki) but ki = 0: the same numbers
    b, _ = sim.rollout_with_jacobian([run], {**THETA, "ki": 0.0}, H, ["kp"])
    assert np.array_equal(a, b[0])
    with pytest.raises(ValueError, match="ki"):
        sim.rollout([run], {**THETA, "ki": -1.0}, H)


def test_wheel_angles_past_half_a_turn_do_not_upset_the_servo():
    # 6 rad/s for 4 s: each wheel turns ~4 times; a target compared without the 2 pi wrap would
    # drive the wheels backwards after half a turn
    sim = OstrichReplay(ROBOT)
    p = sim.rollout([step_run(6.0, 4.0)], {**THETA, "ki": 1250.0}, H)[0]
    speed = np.diff(p[:, 1]) / np.diff(p[:, 0])
    assert speed[-20:].min() > 0.9 * R * THETA["cmd_scale"] * 6.0


def _tangent_vs_fd(sim, runs, theta, names):
    poses, jacs = sim.rollout_with_jacobian(runs, theta, H, names)
    assert sim.last_status["jacobian"] == "tangent"
    errors = {}
    for c, n in enumerate(names):
        e = 1e-2 * max(abs(theta[n]), 1e-1)
        plus = sim.rollout(runs, {**theta, n: theta[n] + e}, H)[0]
        minus = sim.rollout(runs, {**theta, n: theta[n] - e}, H)[0]
        fd = (plus[:, 1:] - minus[:, 1:]) / (2 * e)
        errors[n] = float(np.max(np.abs(jacs[0][:, :, c] - fd)) / np.max(np.abs(fd)))
        print(f"d pose / d {n}: tangent vs central FD relative error {errors[n]:.2e} "
              f"(|FD| max {np.max(np.abs(fd)):.3g})")
    return poses, jacs[0], errors


def test_pi_gradients_match_central_differences():
    sim = OstrichReplay(ROBOT, extra_iters=16)
    runs = [step_run(4.0, 2.0, right=2.0)]  # a turn: the pose depends on every name in x, y and yaw
    theta = {**THETA, "ki": 800.0, "cmd_trim": 0.02}
    names = ["ki", "kp", "cmd_trim"]
    poses, J, errors = _tangent_vs_fd(sim, runs, theta, names)
    assert max(errors.values()) < 2e-2, errors
    g = [np.zeros((len(poses[0]), 7))]
    g[0][-1, 0], g[0][-1, 1], g[0][-1, 6] = 1.0, 0.5, 0.3
    _, vjp = sim.rollout_with_vjp(runs, theta, H, names)
    adj = vjp(g)
    tang = np.einsum("tk,tkn->n", g[0], J)
    print(f"adjoint {adj}, tangent {tang}")
    np.testing.assert_allclose(adj, tang, rtol=5e-3, atol=1e-7)


def test_pi_gradient_in_the_command_scale():
    sim = OstrichReplay(ROBOT, extra_iters=16)
    # s scales the position targets in the engine and sets their per-step increments on the host
    # (2 atan(h s u / 2) / s): the second part is the host's, 2 % of the whole here
    runs, theta = [step_run(4.0, 1.0, right=2.0)], {**THETA, "ki": 800.0}
    poses, J, errors = _tangent_vs_fd(sim, runs, theta, ["cmd_scale"])
    assert errors["cmd_scale"] < 2e-3, errors
    g = [np.zeros((len(poses[0]), 7))]
    g[0][-1, 0], g[0][-1, 1] = 1.0, 0.5
    _, vjp = sim.rollout_with_vjp(runs, theta, H, ["cmd_scale"])
    np.testing.assert_allclose(vjp(g), np.einsum("tk,tkn->n", g[0], J), rtol=5e-3)
