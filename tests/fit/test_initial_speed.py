"""Where a run's (piece's) initial speed comes from: the odometry or the logged wheels
(`sysid.simulators.ostrich.INITIAL_SPEED`, `sysid.simulators.kinematic.INITIAL_SPEED`), and the baseline sharing the
config's choice (`sysid.app.fitting.SHARED_OPTIONS`).

A piece cut from a moving run starts mid-motion. When the odometry's translation trails the wheels
(sysid.simulators.observation), its first samples report the robot's speed of d seconds earlier; the logged
wheel speeds are the motion at t0. Closed forms, straight run, every wheel at a constant w
[rad/s] from t0, wheel radius r = 0.36 m:
- kinematic baseline started from the wheels: no transient, x(t) = r w (t - t0) exactly;
  started at rest it lags behind;
- engine started from the wheels: rolls on at r w (x(1 s) = r w within 2 %), and an odometry that
  claims 2 m/s over standing wheels no longer launches the robot.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from ingest.run import Run  # noqa: E402
from sysid.simulators.protocol import get_simulator, unwrap  # noqa: E402
from tests.helpers.fit_doubles import ENGINE_THETA, odom_stub  # noqa: E402

ROBOT = yaml.safe_load((ROOT / "models" / "helhest" / "robot.yaml").read_text())
R = 0.36  # [m] wheel radius


def rolling_run(w: float, duration: float = 2.0, odom_speed: float = 0.0) -> Run:
    """Every wheel at ``w`` [rad/s] throughout; the odometry stands at the origin, except that its
    first 0.1 s report ``odom_speed`` [m/s] forward (what a lagging odometry may say)."""
    t = np.arange(0.0, duration, 0.01)
    cmd = pd.DataFrame({"t": t, "left": w, "right": w, "rear": w})
    odom = odom_stub(np.arange(0.0, duration - 1e-9, 0.05))
    odom.loc[odom["t"] > 0, "x"] = odom_speed * 0.1
    return Run("rolling", odom, cmd)


def test_kinematic_from_the_wheels_has_no_transient():
    w = 2.5
    run = rolling_run(w)
    wheels = get_simulator("kinematic", robot=ROBOT, initial_speed="wheels")
    rest = get_simulator("kinematic", robot=ROBOT)
    pw = wheels.rollout([run], {}, 0.02)[0]
    pr = rest.rollout([run], {}, 0.02)[0]
    t = pw[:, 0]
    np.testing.assert_allclose(pw[:, 1], R * w * t, atol=1e-9)  # x = r w t exactly
    assert pr[-1, 1] < R * w * t[-1] - 0.02  # from rest: behind by the spin-up
    # the Jacobian is still exact (the initial state is data: no tangent)
    names = ["kp", "cmd_scale"]
    theta = {"kp": 30.0, "cmd_scale": 1.1}
    _, jac = wheels.rollout_with_jacobian([run], theta, 0.02, names)
    for k, n in enumerate(names):
        h = 1e-6 * theta[n]
        fd = (wheels.rollout([run], {**theta, n: theta[n] + h}, 0.02)[0][:, 1:]
              - wheels.rollout([run], {**theta, n: theta[n] - h}, 0.02)[0][:, 1:]) / (2 * h)
        assert np.max(np.abs(jac[0][:, :, k] - fd)) <= 1e-5 * max(1e-3, np.max(np.abs(fd))), n


def test_kinematic_from_the_odometry_rolls_at_its_speed():
    run = rolling_run(2.5, odom_speed=0.5)
    sim = get_simulator("kinematic", robot=ROBOT, initial_speed="odometry")
    p = sim.rollout([run], {"kp": 1e-3}, 0.02)[0]  # wheels barely respond: the base keeps ~0.5 m/s
    assert abs(p[5, 1] / p[5, 0] - 0.5) < 0.01


@pytest.mark.parametrize("bad", ["start", ""])
def test_bad_initial_speed_is_named(bad):
    with pytest.raises(ValueError, match="initial_speed"):
        unwrap(get_simulator("kinematic", robot=ROBOT, initial_speed=bad))
    with pytest.raises(ValueError, match="initial_speed"):
        unwrap(get_simulator("ostrich", robot=ROBOT, initial_speed=bad))


def test_engine_from_the_wheels():
    w = 2.5
    wheels = get_simulator("ostrich", robot=ROBOT, initial_speed="wheels")
    odo = get_simulator("ostrich", robot=ROBOT)
    run = rolling_run(w, duration=1.2)
    p = wheels.rollout([run], ENGINE_THETA, 0.1)[0]
    i = int(np.searchsorted(p[:, 0], 1.0))
    print(f"\nengine from the wheels: x(1 s) = {p[i, 1]:.4f} m, r w = {R * w:.4f} m")
    assert abs(p[i, 1] - R * w * p[i, 0]) < 0.02 * R * w  # rolls on at r w
    q = odo.rollout([run], ENGINE_THETA, 0.1)[0]
    # from the odometry (at rest): the spin-up (about 0.9 m/s at mu g ~ 6 m/s^2: ~0.07 s) costs distance
    assert q[i, 1] < p[i, 1] - 0.02
    # standing wheels under an odometry that claims 2 m/s: from the wheels the robot stays put
    still = rolling_run(0.0, duration=1.2, odom_speed=2.0)
    ps = wheels.rollout([still], ENGINE_THETA, 0.1)[0]
    po = odo.rollout([still], ENGINE_THETA, 0.1)[0]
    print(f"standing wheels, odometry 2 m/s: moved {ps[-1, 1]:.4f} m from the wheels, "
          f"{po[-1, 1]:.4f} m from the odometry")
    assert abs(ps[-1, 1]) < 0.01 and po[-1, 1] > 0.05


def test_baseline_shares_the_data_options(tmp_path):
    from sysid.app.config import FitConfig
    from sysid.app.fitting import SHARED_OPTIONS, baseline_simulator, make_simulator

    cfg = FitConfig.from_mapping({"simulator": {"name": "ostrich",
                                                "options": {"initial_speed": "wheels", "odom_history": "odometry",
                                                            "newton_iters": 12}}}, base_dir=tmp_path)
    b = baseline_simulator(cfg, ROBOT)
    assert b.history == "odometry" and unwrap(b).initial_speed == "wheels"
    m = make_simulator(cfg, ROBOT)
    assert m.history == "odometry" and unwrap(m).initial_speed == "wheels"
    assert set(SHARED_OPTIONS) == {"initial_speed", "odom_history"}  # newton_iters stays the engine's


def test_engine_linear_solver_option():
    """The replay's `linear_solver` and `stall_tol` (a fit config's `simulator: {options: {linear_solver: pcr}}`)
    reach the engine's SolverOptions; a bad value is named. Exact Coulomb (slip_speed 0: the wheels' pinned
    rows, where the dense solve applies): the robot rolling at 2.5 rad/s for 2 s follows the PCR's path to 1 mm."""
    default = unwrap(get_simulator("ostrich", robot=ROBOT))
    pcr = unwrap(get_simulator("ostrich", robot=ROBOT, linear_solver="pcr", stall_tol=0.0))
    assert default.options.linear_solver == "direct" and pcr.options.linear_solver == "pcr"
    assert default.options.stall_tol == 1e-5 and pcr.options.stall_tol == 0.0
    with pytest.raises(ValueError, match="linear_solver"):
        unwrap(get_simulator("ostrich", robot=ROBOT, linear_solver="lu"))
    with pytest.raises(ValueError, match="stall_tol"):
        unwrap(get_simulator("ostrich", robot=ROBOT, stall_tol=-1.0))
    run = rolling_run(2.5)
    theta = {**ENGINE_THETA, "slip_speed": 0.0}
    pd_ = default.rollout([run], theta, 0.1)[0]
    pp = pcr.rollout([run], theta, 0.1)[0]
    assert pp[-1, 1] > 1.0  # it rolled
    np.testing.assert_allclose(pd_[:, 1:3], pp[:, 1:3], atol=1e-3)
