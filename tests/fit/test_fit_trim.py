"""The engine replay's command parameters ``cmd_trim`` (left x (1 + trim), right x (1 - trim)) and
``cmd_delay`` (the wheels follow the logged command d seconds late): sign, mirror symmetry and
time shift, their adjoint gradients against central finite differences, and recovery by LM.

Regularised wheel friction (slip_speed 0.1 m/s) throughout, h = 0.1 s, flat ground.
"""

from __future__ import annotations

import numpy as np
import pytest

from ingest.run import Run
from sysid.fit import optimize
from sysid.fit.metrics import quat_yaw
from sysid.fit.params import Parameter, ParameterSet
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import ENGINE_THETA, odom_from_pose, stub_run  # noqa: E402

DT = 0.1  # [s]
THETA = ENGINE_THETA


def test_trim_sign_and_mirror_symmetry():
    """Equal commands with trim +0.05 drive the left wheel faster: the robot curves right (yaw < 0,
    y < 0); the turn replayed with trim t equals the mirror image (y -> -y, yaw -> -yaw) of the
    mirrored commands replayed with -t, to 1 mm over the 2.9 m run (the Newton solve stops at
    residuals ~1e-5 m/s, in float32)."""
    sim = OstrichReplay()
    straight = stub_run("accel", 4.0)
    straight.wheel_cmd.loc[:, ["left", "right", "rear"]] = 2.5
    p = sim.rollout([straight], {**THETA, "cmd_trim": 0.05}, DT)[0]
    assert quat_yaw(p[-1:, 4:8])[0] < -0.05 and p[-1, 2] < -0.02
    a = sim.rollout([stub_run("turn")], {**THETA, "cmd_trim": 0.04}, DT)[0]
    b = sim.rollout([stub_run("turn", mirror=True)], {**THETA, "cmd_trim": -0.04}, DT)[0]
    assert np.abs(a[:, 1] - b[:, 1]).max() < 1e-3 and np.abs(a[:, 2] + b[:, 2]).max() < 1e-3
    assert np.abs(quat_yaw(a[:, 4:8]) + quat_yaw(b[:, 4:8])).max() < 1e-3


def test_delay_shifts_the_replay():
    """A run whose commands start at 1 s, replayed with cmd_delay 0.5 s, equals the same run with
    its command log shifted 0.5 s later and no delay (to float32 round-off): the delay is a pure
    time shift of the targets, step-averaged like the log."""
    sim = OstrichReplay()
    run = stub_run("turn", 5.0)
    cmd = run.wheel_cmd.copy()
    cmd.loc[:, ["left", "right", "rear"]] = cmd[["left", "right", "rear"]].to_numpy() * (cmd[["t"]].to_numpy() >= 1.0)
    a = sim.rollout([Run("a", run.odom, cmd)], {**THETA, "cmd_delay": 0.5}, DT)[0]
    b = sim.rollout([Run("b", run.odom, cmd.assign(t=cmd["t"] + 0.5))], THETA, DT)[0]
    assert np.abs(a[:, 1:] - b[:, 1:]).max() < 1e-5
    c = sim.rollout([Run("c", run.odom, cmd)], THETA, DT)[0]
    assert np.abs(a[:, 1] - c[:, 1]).max() > 0.2  # half a second at ~0.9 m/s


def test_command_parameters_adjoint_matches_finite_differences():
    """d(sum_i c_i . pose_i)/d(cmd_trim, cmd_delay) through the adjoint (chain rule through the
    wheel targets) against central differences of the same scalar (steps 1e-3 and 4 ms), on a turn
    and a slalom at trim 0.03, delay 0.235 s; mu_lateral and slip_speed in the same sweep. The
    targets are piecewise linear in the delay, with kinks where a step edge minus the delay
    crosses a 100 Hz log sample: 0.235 +- 0.004 s stays between two (at a kink the adjoint is one
    side's slope)."""
    sim = OstrichReplay()
    runs = [stub_run("turn", 5.0), stub_run("slalom", 5.0, seed=1)]
    theta = {**THETA, "cmd_trim": 0.03, "cmd_delay": 0.235}
    names = ["cmd_trim", "cmd_delay", "mu_lateral", "slip_speed"]
    rng = np.random.default_rng(0)
    poses, vjp = sim.rollout_with_vjp(runs, theta, DT, names)
    cts = [rng.normal(size=(p.shape[0], 7)) for p in poses]
    grad = vjp(cts)

    def scalar(th):
        return sum(float(np.sum(c * p[:, 1:])) for c, p in zip(cts, sim.rollout(runs, th, DT), strict=True))

    for n, g in zip(names, grad, strict=True):
        h = {"cmd_trim": 1e-3, "cmd_delay": 4e-3}.get(n, 1e-2 * theta[n])
        fd = (scalar({**theta, n: theta[n] + h}) - scalar({**theta, n: theta[n] - h})) / (2 * h)
        rel = abs(g - fd) / abs(fd)
        print(f"d/d{n}: adjoint {g:.6g}, central FD {fd:.6g}, relative error {rel:.2e}")
        assert rel < 2e-2, (n, g, fd)


def test_lm_recovers_trim_and_delay():
    """Odometry from the engine at trim 0.04, delay 0.3 s (a turn and a slalom, both directions): LM
    from trim 0, delay 0, mu_lateral 0.5 (truth 0.35) recovers all three (trim within 1e-3, delay
    within 10 ms, mu_lateral within 3 %)."""
    sim = OstrichReplay()
    truth = {**THETA, "cmd_trim": 0.04, "cmd_delay": 0.3}
    runs = []
    for i, kind in enumerate(("turn", "slalom")):
        stub = stub_run(kind, 6.0, seed=i)
        pose = sim.rollout([stub], truth, DT)[0]
        runs.append(Run(kind, odom_from_pose(stub.odom, pose), stub.wheel_cmd))
    ps = ParameterSet([
        Parameter(name="mu_lateral", nominal=0.5, lower=0.05, upper=3.0),
        Parameter(name="cmd_trim", nominal=0.0, lower=-0.2, upper=0.2),
        Parameter(name="cmd_delay", nominal=0.0, lower=-0.5, upper=1.5),
        *(Parameter(name=n, nominal=THETA[n], lower=THETA[n] / 10, upper=THETA[n] * 10, frozen=True)
          for n in ("kp", "mu", "slip_speed")),
    ])
    res = optimize(sim, runs, ps, DT, optimizer="lm", max_iter=15)
    print(f"trim recovery: cmd_trim {res.params['cmd_trim'].value:.5f} (truth 0.04), cmd_delay "
          f"{res.params['cmd_delay'].value:.4f} s (truth 0.3), mu_lateral "
          f"{res.params['mu_lateral'].value:.4f} (truth 0.35); loss {res.loss_initial:.3e} -> {res.loss_final:.3e}")
    assert res.params["cmd_trim"].value == pytest.approx(0.04, abs=1e-3)
    assert res.params["cmd_delay"].value == pytest.approx(0.3, abs=0.01)
    assert res.params["mu_lateral"].value == pytest.approx(0.35, rel=0.03)
