"""The odometry observation model (sysid.simulators.observation): a translation that trails the motion by
``odom_delay`` d [s] along the current heading.

Closed form on a straight run (rest, constant speed v, stop): the delayed odometry is the path
d seconds earlier, x'(t) = x(t - d): a constant deficit v d while it moves, none once it has stood
for d; the heading is never changed. The derivatives (every simulator parameter through the model,
and d itself) are checked against central differences on the kinematic baseline and the engine.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
from sysid.errors import SimulatorError  # noqa: E402
from sysid.fit import optimize  # noqa: E402
from sysid.fit.params import Parameter, ParameterSet  # noqa: E402
from sysid.simulators.observation import DELAY, OdometryDelay, delayed_odometry  # noqa: E402
from sysid.simulators.protocol import get_simulator, unwrap  # noqa: E402
from tests.helpers.fit_doubles import odom_from_pose, stub_run  # noqa: E402

ROBOT = str(ROOT / "models" / "helhest" / "robot.yaml")


def straight(v: float = 0.5, dt: float = 0.05, start: float = 1.0, stop: float = 5.0, end: float = 8.0):
    t = np.arange(0.0, end + 1e-9, dt)
    x = v * np.clip(t - start, 0.0, stop - start)
    yaw = 0.3  # heading along the path
    p = np.zeros((len(t), 8))
    p[:, 0], p[:, 1], p[:, 2], p[:, 3] = t, x * np.cos(yaw), x * np.sin(yaw), 0.36
    p[:, 6], p[:, 7] = np.sin(yaw / 2), np.cos(yaw / 2)
    return p, x


def test_zero_delay_is_the_path_itself():
    p, _ = straight()
    out, _ = delayed_odometry(p, 0.0)
    assert np.array_equal(out, p)


def test_straight_run_closed_form_deficit_v_d_then_recovered():
    v, d = 0.5, 0.6
    p, x = straight(v=v)
    out, _ = delayed_odometry(p, d)
    t = p[:, 0]
    s = np.hypot(out[:, 1], out[:, 2])
    x_late = v * np.clip(t - d - 1.0, 0.0, 4.0)  # x(t - d)
    assert np.max(np.abs(s - x_late)) < 1e-12
    moving = (t > 1.0 + d) & (t < 5.0)
    assert np.allclose(x[moving] - s[moving], v * d, atol=1e-12)  # the deficit v d
    assert abs(s[-1] - x[-1]) < 1e-12  # recovered after the stop
    assert np.array_equal(out[:, 3:], p[:, 3:])  # z and the heading untouched
    # the odometry stays on the path's line (heading-aligned), not beside it
    assert np.max(np.abs(out[:, 2] * np.cos(0.3) - out[:, 1] * np.sin(0.3))) < 1e-12


def test_bad_delay_and_shapes_are_named():
    p, _ = straight()
    with pytest.raises(SimulatorError, match="odom_delay"):
        delayed_odometry(p, -0.1)
    with pytest.raises(SimulatorError, match="expected"):
        delayed_odometry(p, 0.2, np.zeros((3, 7, 1)))
    sim = get_simulator("kinematic", robot=None)
    with pytest.raises(ValueError, match="odom_delay"):
        sim.rollout([stub_run("turn")], {DELAY: float("nan")}, 0.02)


def kinematic():
    import yaml

    return get_simulator("kinematic", robot=yaml.safe_load(Path(ROBOT).read_text()))


def test_every_simulator_is_observed_and_unchanged_without_the_delay():
    sim = kinematic()
    assert isinstance(sim, OdometryDelay) and DELAY in sim.parameter_names
    runs = [stub_run("slalom", 6.0)]
    inner = unwrap(sim)
    a = sim.rollout(runs, {"cmd_scale": 1.0}, 0.02)[0]
    b = inner.rollout(runs, {"cmd_scale": 1.0}, 0.02)[0]
    assert np.array_equal(a, b)
    c = sim.rollout(runs, {"cmd_scale": 1.0, DELAY: 0.5}, 0.02)[0]
    assert np.max(np.abs(c[:, 1:3] - a[:, 1:3])) > 0.1  # the delay moves the positions
    assert np.array_equal(c[:, 3:], a[:, 3:])


def central(sim, runs, theta, name, h, dt):
    plus = sim.rollout(runs, {**theta, name: theta[name] + h}, dt)[0]
    minus = sim.rollout(runs, {**theta, name: theta[name] - h}, dt)[0]
    return (plus[:, 1:] - minus[:, 1:]) / (2 * h)


@pytest.mark.parametrize("delay", [0.0, 0.43])  # 0.43: off the 0.05 s odometry grid, where the
# interpolation in d has its kinks (there the derivative is the one for a growing delay)
def test_jacobian_through_the_model_matches_central_differences_kinematic(delay):
    sim = kinematic()
    runs = [stub_run("slalom", 7.0)]
    theta = {"cmd_scale": 1.05, "mu_lateral": 0.4, DELAY: delay}
    names = [DELAY, "cmd_scale", "mu_lateral"]  # the delay first: columns come back in this order
    dt = 0.02
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    J = jacs[0]
    for k, n in enumerate(names):
        if n == DELAY and delay == 0.0:  # one-sided at the bound: d grows
            fd = (sim.rollout(runs, {**theta, n: 1e-6}, dt)[0][:, 1:] - sim.rollout(runs, theta, dt)[0][:, 1:]) / 1e-6
        else:
            fd = central(sim, runs, theta, n, 1e-6 * max(1.0, theta[n]), dt)
        rel = np.max(np.abs(J[:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"d = {delay}: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 5e-3, (n, rel)


def test_vjp_is_the_jacobian_contracted():
    sim = kinematic()
    runs = [stub_run("turn", 6.0)]
    theta = {"cmd_scale": 1.0, DELAY: 0.3}
    names = ["cmd_scale", DELAY]
    poses, jacs = sim.rollout_with_jacobian(runs, theta, 0.02, names)
    g = [np.random.default_rng(0).normal(size=(len(poses[0]), 7))]
    _, vjp = sim.rollout_with_vjp(runs, theta, 0.02, names)
    assert np.allclose(vjp(g), np.einsum("tk,tkn->n", g[0], jacs[0]))


def test_fit_recovers_the_delay_and_the_command_scale():
    """Odometry made by the baseline at cmd_scale 0.9 seen through a 0.6 s delay; LM from 1.0 / 0.2 s."""
    sim = kinematic()
    truth = {"cmd_scale": 0.9, DELAY: 0.6}
    runs = []
    for kind in ("turn", "slalom"):
        r = stub_run(kind, 8.0)
        pose = sim.rollout([r], truth, 0.02)[0]
        runs.append(type(r)(r.name, odom_from_pose(r.odom, pose), r.wheel_cmd))
    ps = ParameterSet([Parameter("cmd_scale", 1.0, 0.5, 1.5), Parameter(DELAY, 0.2, 0.0, 2.0)])
    res = optimize(sim, runs, ps, 0.02, max_iter=40)
    got = {n: res.params[n].value for n in truth}
    print("recovered", got)
    assert abs(got["cmd_scale"] - 0.9) < 2e-3
    assert abs(got[DELAY] - 0.6) < 1e-2


def test_engine_jacobian_through_the_model_matches_central_differences():
    """The engine's tangent Jacobian of the delayed odometry against central FD (regularised turn, 5 s):
    within 0.5 % of the largest entry. FD steps: 1e-4 s for the delay, 3e-3 x mu_lateral for the
    friction; a smaller friction step reaches the solver tolerance (1e-6 m/s per step): measured
    2026-12-04 7.6e-3 / 5.8e-4 / 3.7e-4 at 1e-3 / 3e-3 / 1e-2 x mu_lateral (with tol 1e-7: 2.0e-3 at
    1e-3)."""
    import yaml

    sim = get_simulator("ostrich", robot=yaml.safe_load(Path(ROBOT).read_text()))
    runs = [stub_run("turn", 5.0)]
    theta = {"kp": 400.0, "mu": 0.6, "mu_lateral": 0.35, "cmd_scale": 1.0, "slip_speed": 0.1, DELAY: 0.43}
    names = ["mu_lateral", DELAY]
    dt = 0.1
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    for k, n in enumerate(names):
        fd = central(sim, runs, theta, n, 1e-4 if n == DELAY else 3e-3 * theta[n], dt)
        rel = np.max(np.abs(jacs[0][:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"engine: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 5e-3, (n, rel)


# ---------------------------------------------------------------- a piece cut from a moving run
# The odometry at a piece's start t0 reports the robot's velocity d seconds earlier; with
# ``history`` the delayed odometry integrates that velocity (the sensor's own report, data) for the
# first d seconds instead of the simulation's first velocity. Closed form on a straight run at
# speed v whose odometry reported v_h at t0: x'(t) = v_h (t - t0) for t - t0 <= d (up to the half
# interval where the interpolation blends v_h into v), then v_h d + v (t - t0 - d).


def test_history_closed_form_straight_piece():
    v, vh, d, dt = 1.2, 0.4, 0.6, 0.05
    t = np.arange(0.0, 4.0 + 1e-9, dt)
    p = np.zeros((len(t), 8))
    p[:, 0], p[:, 1], p[:, 3], p[:, 7] = t, v * t, 0.36, 1.0
    out, _ = delayed_odometry(p, d, history=(vh, 0.0))
    late = t > d + dt
    expect = vh * d + v * (t - d)
    # the blend between the node at t0 and the first midpoint (dt / 2) costs at most (v - vh) dt / 4
    assert np.max(np.abs(out[late, 1] - expect[late])) <= (v - vh) * dt / 4 + 1e-12
    early = t <= d
    assert np.max(np.abs(out[early, 1] - vh * t[early])) <= (v - vh) * dt / 4 + 1e-12
    assert np.max(np.abs(out[:, 2])) < 1e-12  # straight: nothing sideways
    # without history the first velocity is held: the odometry is the path d seconds late
    plain, _ = delayed_odometry(p, d)
    assert np.max(np.abs(plain[:, 1] - v * t)) < 1e-12


@pytest.mark.parametrize("delay", [0.0, 0.43])
def test_history_jacobian_matches_central_differences(delay):
    sim = OdometryDelay(unwrap(kinematic()), history="odometry")
    r = stub_run("slalom", 7.0)
    # an odometry that reports motion at the start (0.5 m/s forward, 0.1 m/s left over 0.1 s)
    odom = r.odom.copy()
    odom.loc[odom["t"] > 0, "x"] = 0.05
    odom.loc[odom["t"] > 0, "y"] = 0.01
    runs = [type(r)(r.name, odom, r.wheel_cmd)]
    theta = {"cmd_scale": 1.05, "mu_lateral": 0.4, DELAY: delay}
    names = ["cmd_scale", DELAY]
    dt = 0.02
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    for k, n in enumerate(names):
        if n == DELAY and delay == 0.0:
            fd = (sim.rollout(runs, {**theta, n: 1e-6}, dt)[0][:, 1:] - sim.rollout(runs, theta, dt)[0][:, 1:]) / 1e-6
        else:
            fd = central(sim, runs, theta, n, 1e-6 * max(1.0, theta[n]), dt)
        rel = np.max(np.abs(jacs[0][:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"history, d = {delay}: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 5e-3, (n, rel)
    # the history changes what is observed (the first d seconds integrate the reported 0.5 m/s)
    if delay > 0:
        a = sim.rollout(runs, theta, dt)[0]
        b = OdometryDelay(unwrap(kinematic())).rollout(runs, theta, dt)[0]
        assert np.max(np.abs(a[:, 1:3] - b[:, 1:3])) > 0.1


def test_odom_history_option_reaches_the_wrapper_and_is_checked():
    import yaml

    robot = yaml.safe_load(Path(ROBOT).read_text())
    assert get_simulator("kinematic", robot=robot, odom_history="odometry").history == "odometry"
    assert get_simulator("kinematic", robot=robot).history == "simulated"
    with pytest.raises(SimulatorError, match="odom_history"):
        get_simulator("kinematic", robot=robot, odom_history="past")


# ---------------------------------------------------------------- the wheels' history before a piece
# ``odom_history: wheels``: before a piece's start the delayed odometry integrates the forward speed
# the logged wheels gave over the d seconds before it (r times their mean; lateral 0), from the
# parent's wheel log the piece keeps (sysid.app.runs.split_runs), so it follows what the robot did
# there, not what the odometry reports right after the start.


def test_series_history_of_constant_speed_is_the_constant_history():
    p, _ = straight(v=0.7, start=0.0, stop=4.0, end=5.0)
    p[:, 1] += 0.1 * p[:, 0] ** 2  # a curved, accelerating path
    jac = np.random.default_rng(1).normal(size=(len(p), 7, 2))
    ht = np.arange(-200, 1) * 0.01
    series = (ht, np.full_like(ht, 0.8), np.full_like(ht, -0.1))
    for d in (0.43, 1.3, 2.6):  # inside the series, and beyond its first time (held there)
        a, ja = delayed_odometry(p, d, jac, with_delay_column=True, history=(0.8, -0.1))
        b, jb = delayed_odometry(p, d, jac, with_delay_column=True, history=series)
        assert np.max(np.abs(a - b)) < 1e-12 and np.max(np.abs(ja - jb)) < 1e-12, d
    with pytest.raises(SimulatorError, match="first sample"):
        delayed_odometry(p, 0.4, history=(ht + 0.5, series[1], series[2]))  # nodes after the start


def braking_run(jump: float = 0.3):
    """8 s at 20 Hz odometry, wheels at 100 Hz: 1.5 m/s until 3.2 s, braking linearly to rest at 4.0 s,
    then standing; the odometry follows the wheels but jumps by ``jump`` [m] between 4.00 and 4.05 s
    (as the Helhest's lidar odometry does at a piece's start)."""
    import yaml

    from ingest.run import Run
    from sysid.simulators.kinematic import robot_geometry
    from tests.helpers.fit_doubles import odom_stub

    r = robot_geometry(yaml.safe_load(Path(ROBOT).read_text()))["radius"]
    tw = np.round(np.arange(801) * 0.01, 10)
    v = 1.5 * np.clip((4.0 - tw) / 0.8, 0.0, 1.0)
    cmd = pd.DataFrame({"t": tw, "left": v / r, "right": v / r, "rear": v / r})
    to = np.round(np.arange(161) * 0.05, 10)
    x = np.interp(to, tw, np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * 0.01)]))
    x = x + np.where(to >= 4.05 - 1e-9, jump, 0.0)
    return Run("braking", odom_stub(to).assign(x=x), cmd)


def brake_integral(a: float, b: float) -> float:
    """int_a^b of the braking run's speed [m]."""
    u = np.linspace(a, b, 200001)
    v = 1.5 * np.clip((4.0 - u) / 0.8, 0.0, 1.0)
    return float(np.sum(0.5 * (v[1:] + v[:-1]) * np.diff(u)))


def test_wheels_history_follows_the_braking_before_a_piece_where_the_odometry_jump_overshoots():
    import json

    import yaml

    from sysid.app.runs import split_runs
    from sysid.simulators.kinematic import robot_geometry
    from sysid.simulators.observation import WHEELS_BEFORE, wheel_history

    robot = yaml.safe_load(Path(ROBOT).read_text())
    run = braking_run()
    first, piece = split_runs([run], 4.0)  # pieces 0-4 s and 4-8 s: the second starts at rest after braking
    kept = piece.meta[WHEELS_BEFORE]
    assert np.isclose(min(kept["t"]), 1.0) and max(kept["t"]) < 4.0  # the 3 s before the start, rows only
    assert len(piece.wheel_cmd) == 401 and piece.wheel_cmd["t"].iloc[0] == 4.0  # its commands: its own rows
    json.dumps(piece.meta)  # a run's meta is written as JSON
    d = 1.0
    theta = {DELAY: d}
    t0 = float(piece.odom["t"].iloc[0])
    t = piece.odom["t"].to_numpy() - t0
    early = t <= d + 1e-9
    wheels = get_simulator("kinematic", robot=robot, initial_speed="wheels", odom_history="wheels")
    got = wheels.rollout([piece], theta, 0.02)[0]
    expect = np.array([brake_integral(t0 - d, t0 + s - d) for s in t])
    err = np.max(np.abs(got[:, 1] - got[0, 1] - expect)[early])
    print(f"wheels history: largest error over the first {d} s {err:.1e} m; travelled {expect[early][-1]:.3f} m")
    assert err < 1e-6
    assert np.max(np.abs(got[:, 2])) < 1e-12
    # the odometry's own report over its first 0.1 s holds the jump (3 m/s): the prediction overshoots
    odo = get_simulator("kinematic", robot=robot, initial_speed="wheels", odom_history="odometry")
    over = odo.rollout([piece], theta, 0.02)[0]
    miss = float(over[early, 1][-1] - over[0, 1] - expect[early][-1])
    print(f"odometry history: overshoot after {d} s {miss:.2f} m")
    assert miss > 1.0
    # a run with no earlier rows (the whole run, the first piece) holds its first wheel speed
    r = robot_geometry(robot)["radius"]
    for whole in (run, first):
        ht, hx, hy = wheel_history(whole, r, ["left", "right", "rear"])
        assert list(ht) == [0.0] and np.isclose(hx[0], 1.5) and hy[0] == 0.0


@pytest.mark.parametrize("delay", [0.43, 1.37])  # off the odometry's and the wheel log's grids
def test_wheels_history_delay_column_matches_central_differences(delay):
    import yaml

    from sysid.app.runs import split_runs

    robot = yaml.safe_load(Path(ROBOT).read_text())
    sim = get_simulator("kinematic", robot=robot, initial_speed="wheels", odom_history="wheels")
    piece = split_runs([stub_run("accel", 12.0)], 6.0)[1]  # starts as the wheels step from 0.5 to 5.5 rad/s
    runs = [piece]
    theta = {"cmd_scale": 1.05, "mu_lateral": 0.4, DELAY: delay}
    names = [DELAY, "cmd_scale"]
    dt = 0.02
    _, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    for k, n in enumerate(names):
        fd = central(sim, runs, theta, n, 1e-6 * max(1.0, theta[n]), dt)
        rel = np.max(np.abs(jacs[0][:, :, k] - fd)) / np.max(np.abs(fd))
        print(f"wheels history, d = {delay}: d pose / d {n}: relative error {rel:.2e}")
        assert rel < 1e-4, (n, rel)
    # the series is what is integrated: it differs from holding the simulation's first velocity
    plain = get_simulator("kinematic", robot=robot, initial_speed="wheels").rollout(runs, theta, dt)[0]
    assert np.max(np.abs(sim.rollout(runs, theta, dt)[0][:, 1:3] - plain[:, 1:3])) > 0.05


def test_bad_odom_history_names_every_choice():
    with pytest.raises(SimulatorError, match=r"\['simulated', 'odometry', 'wheels'\].*'past'"):
        get_simulator("kinematic", robot=None, odom_history="past")


def test_pieces_keep_the_longest_delay_a_config_allows():
    from sysid.app.config import FitConfig, ParamSpec
    from sysid.app.runs import history_window

    cfg = FitConfig()
    assert history_window(cfg) == 3.0  # at least PRE_START_WINDOW
    cfg.parameters = {DELAY: ParamSpec(nominal=0.8, bounds=(0.0, 5.0))}
    assert history_window(cfg) == 5.0
    cfg.parameters = {DELAY: ParamSpec(nominal=4.0)}  # no bounds (unbounded above): its start value
    assert history_window(cfg) == 4.0
