"""The odometry delay's extra length at a start from rest (``odom_delay_start`` S [s], time constant
``odom_delay_decay`` T [s]; sysid.simulators.observation): the delay is d + S g(t), g relaxing toward 1
while the wheels stand and toward 0 while they move, and the odometry reports the path at the delayed
time sigma = t - d - S g.

Closed form on a straight run (stand, constant speed v from t_on, stop): x'(t) = v clip(sigma(t) - t_on, 0,
t_stop - t_on) with g = exp(-(t - t_on) / T) while moving: the odometry stands d + S after the start, then
moves faster than the robot (by the factor 1 + S g / T) until it trails by the cruise's v d. The derivatives
(every simulator parameter, d, S and T) against central differences; a fit recovers S and T."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest.run import Run
from sysid.errors import SimulatorError
from sysid.fit import optimize
from sysid.fit.params import Parameter, ParameterSet
from sysid.simulators.observation import DECAY, DELAY, START, delayed_odometry, start_profile
from tests.fit.test_observation import central, kinematic, straight
from tests.helpers.fit_doubles import odom_from_pose, odom_stub

ROOT = Path(__file__).resolve().parents[2]


def motion(t: np.ndarray, on: float = 1.0, off: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    return t, ((t >= on) & (t < off)).astype(float)


def test_no_start_extra_is_the_constant_delay():
    p, _ = straight(dt=0.01)
    mv = motion(p[:, 0])
    a, _ = delayed_odometry(p, 0.6, start=0.0, moving=mv)
    b, _ = delayed_odometry(p, 0.6)
    assert np.array_equal(a, b)


def test_straight_run_closed_form_stall_and_catch_up():
    v, d, s_extra, decay, dt = 0.5, 0.4, 0.8, 0.7, 0.01
    p, _ = straight(v=v, dt=dt)
    t = p[:, 0]
    out, _ = delayed_odometry(p, d, start=s_extra, decay=decay, moving=motion(t))
    x_odo = np.hypot(out[:, 1], out[:, 2])
    g = np.where(t < 1.0, 1.0, np.exp(-(np.clip(t, 1.0, 5.0) - 1.0) / decay))
    g = np.where(t >= 5.0, 1.0 + (g - 1.0) * np.exp(-(t - 5.0) / decay), g)  # standing again: back toward 1
    sigma = t - d - s_extra * g
    expect = v * np.clip(sigma - 1.0, 0.0, 4.0)
    err = np.max(np.abs(x_odo - expect))
    print(f"closed form: largest departure {err:.2e} m")
    assert err < 2 * v * dt
    first = t[np.argmax(x_odo > 1e-3)]
    assert 1.0 + d + s_extra * 0.3 < first < 1.0 + d + s_extra + 0.02  # it stands ~d + S g after the start
    speed = np.gradient(x_odo, t)
    assert speed.max() > 1.3 * v  # then outruns the robot
    cruise = (t > 4.0) & (t < 5.0)
    assert np.allclose(v * (t[cruise] - 1.0) - x_odo[cruise], v * (d + s_extra * g[cruise]), atol=2 * v * dt)


def test_start_profile_relaxes_and_its_decay_derivative():
    t = np.arange(0.0, 8.0, 0.05)
    mv = motion(t)
    g, dg = start_profile(t, mv, 0.7)
    assert g[0] == 1.0 and g[np.searchsorted(t, 4.9)] < 0.01 and g[-1] > 0.98
    h = 1e-6
    fd = (start_profile(t, mv, 0.7 + h)[0] - start_profile(t, mv, 0.7 - h)[0]) / (2 * h)
    assert np.max(np.abs(dg - fd)) < 1e-7


def stop_and_go(duration: float = 10.0) -> Run:
    """Wheels standing 1 s, turning 3.5 s, standing 2 s, then a slalom: two starts from rest."""
    t = np.arange(0.0, duration, 0.01)
    left = np.where((t >= 1.0) & (t < 4.5), 3.0, 0.0)
    right = np.where((t >= 1.0) & (t < 4.5), 2.0, 0.0)
    go = t >= 6.5
    wiggle = 1.0 * np.sign(np.sin(2 * np.pi * 0.4 * (t - 6.5)))
    left[go], right[go] = 2.5 + wiggle[go], 2.5 - wiggle[go]
    cmd = pd.DataFrame({"t": t, "left": left, "right": right, "rear": (left + right) / 2})
    return Run("stop-and-go", odom_stub(np.arange(0.0, duration - 1e-9, 0.05)), cmd)


@pytest.mark.parametrize("delay", [0.0, 0.43])
def test_jacobian_matches_central_differences(delay):
    sim = kinematic()
    runs = [stop_and_go()]
    theta = {"cmd_scale": 1.05, "mu_lateral": 0.4, DELAY: delay, START: 0.7, DECAY: 0.8}
    names = [START, "cmd_scale", DECAY, DELAY]  # mixed order: the columns come back in it
    dt = 0.02
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    for k, n in enumerate(names):
        if n == DELAY and delay == 0.0:  # one-sided at the bound
            fd = (sim.rollout(runs, {**theta, n: 1e-6}, dt)[0][:, 1:] - sim.rollout(runs, theta, dt)[0][:, 1:]) / 1e-6
        else:
            fd = central(sim, runs, theta, n, 1e-6 * max(1.0, theta[n]), dt)
        rel = np.max(np.abs(jacs[0][:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"d = {delay}: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 5e-3, (n, rel)


def test_fit_recovers_the_start_extra():
    """Odometry made by the baseline at cmd_scale 0.9 through delay 0.5 s, start extra 0.8 s, decay 0.6 s;
    LM from 1.0 / 0.3 / 0.2 / 1.2."""
    sim = kinematic()
    truth = {"cmd_scale": 0.9, DELAY: 0.5, START: 0.8, DECAY: 0.6}
    r = stop_and_go(12.0)
    pose = sim.rollout([r], truth, 0.02)[0]
    runs = [Run(r.name, odom_from_pose(r.odom, pose), r.wheel_cmd)]
    ps = ParameterSet([Parameter("cmd_scale", 1.0, 0.5, 1.5), Parameter(DELAY, 0.3, 0.0, 2.0),
                       Parameter(START, 0.2, 0.0, 3.0), Parameter(DECAY, 1.2, 0.05, 5.0)])
    res = optimize(sim, runs, ps, 0.02, max_iter=60)
    got = {n: res.params[n].value for n in truth}
    print("recovered", got)
    for n, v in truth.items():
        assert abs(got[n] / v - 1) < 0.02, (n, got[n])


def test_bad_values_are_named():
    p, _ = straight()
    with pytest.raises(SimulatorError, match=START):
        delayed_odometry(p, 0.2, start=-0.1, moving=motion(p[:, 0]))
    with pytest.raises(SimulatorError, match="moving"):
        delayed_odometry(p, 0.2, start=0.5)
    with pytest.raises(SimulatorError, match=DECAY):
        delayed_odometry(p, 0.2, start=0.5, decay=0.0, moving=motion(p[:, 0]))
    with pytest.raises(ValueError, match=DECAY):
        kinematic().rollout([stop_and_go()], {DECAY: -1.0, START: 0.5}, 0.02)


def test_engine_jacobian_matches_central_differences():
    """The engine's tangent Jacobian through the start extra (stop-and-go, 8 s, h = 0.1 s) against central
    differences: within 0.5 % of the largest entry."""
    import yaml

    from sysid.simulators.protocol import get_simulator

    sim = get_simulator("ostrich", robot=yaml.safe_load((ROOT / "models" / "helhest" / "robot.yaml").read_text()))
    runs = [stop_and_go(8.0)]
    theta = {"kp": 400.0, "mu": 0.6, "mu_lateral": 0.35, "cmd_scale": 1.0, "slip_speed": 0.1, DELAY: 0.43,
             START: 0.7, DECAY: 0.8}
    names = [DECAY, "mu_lateral", START]
    dt = 0.1
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    for k, n in enumerate(names):
        fd = central(sim, runs, theta, n, 3e-3 * theta[n] if n == "mu_lateral" else 1e-4, dt)
        rel = np.max(np.abs(jacs[0][:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"engine: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 5e-3, (n, rel)
