"""The combined-slip wheel friction law (docs/traction.md): separate longitudinal and lateral slip
speeds s_1, s_2 [m/s], normalised slip n_k = v_k / s_k, friction l_k = -mu_k N n_k / S with
S = sqrt(n_1^2 + n_2^2 + 1): stiffness mu_k N / s_k per direction, saturation on the friction
ellipse. Closed-form creep on an incline, the single-slip law as its special case, and the
adjoint against central differences (engine replay parameters slip_speed_lat, slip_ratio_lat)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sysid.engine import SolverOstrich
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.engine import G, initial_state, robot_scene, rollout, set_gravity, wheel_control  # noqa: E402
from tests.helpers.fit_doubles import ENGINE_THETA, assert_adjoint_matches_fd, stub_run  # noqa: E402

DT = 0.1  # [s]


def test_single_slip_law_is_the_combined_law_with_cone_scaled_slip_speeds():
    """The single-slip law (slip_speed v_s alone) is the combined law with s_1 = v_s sqrt(mu_2 / mu_1)
    and s_2 = v_s sqrt(mu_1 / mu_2): the replays agree to float32 round-off; other slip speeds differ."""
    sim = OstrichReplay()
    runs = [stub_run("turn", 5.0), stub_run("slalom", 5.0, seed=1)]
    th = dict(ENGINE_THETA)
    mu, ml, vs = th["mu"], th["mu_lateral"], th["slip_speed"]
    single = sim.rollout(runs, th, DT)
    cone_scaled = {"slip_speed": vs * math.sqrt(ml / mu), "slip_speed_lat": vs * math.sqrt(mu / ml)}
    combined = sim.rollout(runs, {**th, **cone_scaled}, DT)
    other = sim.rollout(runs, {**th, "slip_speed": 0.05, "slip_speed_lat": 0.3}, DT)
    for a, b, c in zip(single, combined, other, strict=True):
        assert np.abs(a[:, 1:] - b[:, 1:]).max() < 5e-6
        assert np.abs(a[:, 1:] - c[:, 1:]).max() > 5e-3


@pytest.mark.parametrize("direction_deg", [0.0, 45.0, 90.0])
def test_combined_slip_creeps_down_an_incline_at_the_closed_form_velocity(direction_deg: float):
    """The robot, wheels held by stiff servos (kd = 1e5 N m s/rad: wheel spin below 1e-3 rad/s), on a
    slope of tan(theta) = 0.2 falling along direction e in its frame. Every wheel slips at the same
    velocity v and the total friction mu_k (m g cos theta) n_k / S balances m g sin theta e_k, whatever
    the normal-load split: with a_k = tan(theta) e_k / mu_k, S = 1 / sqrt(1 - |a|^2), n_k = a_k S and
    v_k = s_k n_k. At mu = (0.5, 0.3), s = (0.05, 0.2) m/s: along x 0.0218 m/s, along y 0.1789 m/s,
    at 45 deg (0.0169, 0.1129) m/s, 36 deg off the fall line (the ellipse couples the directions)."""
    mu1, mu2, s1, s2, tan_t = 0.5, 0.3, 0.05, 0.2, 0.2
    e = np.array([math.cos(math.radians(direction_deg)), math.sin(math.radians(direction_deg))])
    a = tan_t * e / np.array([mu1, mu2])
    S = 1.0 / math.sqrt(1.0 - float(a @ a))
    v_star = np.array([s1, s2]) * a * S
    scene = robot_scene()
    th = math.atan(tan_t)
    set_gravity(scene.model, (G * math.sin(th) * e[0], G * math.sin(th) * e[1], -G * math.cos(th)))
    solver = SolverOstrich(scene.model)
    hd = scene.handles[0]
    solver.set_anisotropic_friction(hd.wheel_shapes, mu1, mu2)
    solver.set_slip_speed(hd.wheel_shapes, s1, s2)
    kd = solver.joint_kd.numpy()
    kd[hd.wheel_joints] = 1e5
    solver.joint_kd.assign(kd)
    h = 0.05
    r = rollout(scene.model, solver, int(round(4.0 / h)), h, state=initial_state(scene),
                control=wheel_control(scene, (0.0, 0.0, 0.0)))
    v = r.qd[-10:, hd.chassis, :2].mean(axis=0)
    yaw_rate = np.abs(r.qd[-10:, hd.chassis, 5]).max()
    spin = np.abs(r.qd[-10:, hd.wheels, 4] - r.qd[-10:, hd.chassis, 4][:, None]).max()
    print(f"incline along {direction_deg} deg: v = {v} m/s, closed form {v_star}, yaw rate {yaw_rate:.1e} rad/s, "
          f"wheel spin {spin:.1e} rad/s, max residual {r.residual.max():.1e}")
    assert spin < 1e-3 and yaw_rate < 1e-3
    assert r.residual[-10:].max() < 1e-4
    np.testing.assert_allclose(v, v_star, rtol=1e-2, atol=2e-4)


def test_combined_slip_adjoint_matches_central_differences():
    """d(sum_i c_i . pose_i)/d(slip_speed_lat, slip_ratio_lat, slip_speed, slip_ratio, mu, mu_lateral)
    through the adjoint against central differences on a turn and a slalom under the combined-slip
    law; every one within 0.5 %. Steps of 4 %: at 1 % and below the float32 rollouts' round-off
    moves the difference quotient by up to 0.6 % (2 % and 4 % steps agree with the adjoint to 0.1 %)."""
    sim = OstrichReplay()
    runs = [stub_run(k, 5.0, seed=i) for i, k in enumerate(("turn", "slalom"))]
    theta = {**ENGINE_THETA, "slip_speed": 0.05, "slip_ratio": 0.3, "slip_speed_lat": 0.1, "slip_ratio_lat": 1.5}
    names = ["slip_speed_lat", "slip_ratio_lat", "slip_speed", "slip_ratio", "mu", "mu_lateral"]
    assert_adjoint_matches_fd(sim, runs, theta, DT, names, rel_step=4e-2, rtol=5e-3)


def test_combined_slip_parameters_are_checked():
    sim = OstrichReplay()
    run = stub_run("turn", 1.0)
    with pytest.raises(ValueError, match="needs slip_speed > 0"):
        sim.rollout([run], {**ENGINE_THETA, "slip_speed": 0.0, "slip_speed_lat": 0.1}, DT)
    with pytest.raises(ValueError, match="set slip_speed_lat > 0 too"):
        sim.rollout([run], {**ENGINE_THETA, "slip_ratio_lat": 0.5}, DT)
    with pytest.raises(ValueError, match="slip_speed_lat = -0.1 is not a valid value"):
        sim.rollout([run], {**ENGINE_THETA, "slip_speed_lat": -0.1}, DT)
    scene = robot_scene()
    solver = SolverOstrich(scene.model)
    from sysid.engine import EngineError

    with pytest.raises(EngineError, match="needs slip_speed > 0"):
        solver.set_slip_speed(scene.handles[0].wheel_shapes, 0.0, 0.1)
