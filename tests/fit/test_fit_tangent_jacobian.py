"""The engine replay's Gauss-Newton Jacobian from forward sensitivities (``jacobian="tangent"``,
`Simulation.jvp`: the implicit function theorem at every converged step) against central
differences in extra worlds (``jacobian="fd"``), column by column, for every parameter the replay
accepts and every nuisance parameter, on a turn and a slalom (regularised wheels, slip_ratio 0.5,
h = 0.1 s)."""

from __future__ import annotations

import numpy as np
import pytest

from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import ENGINE_THETA, stub_run  # noqa: E402

DT = 0.1  # [s]
NAMES = ["kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass", "slip_speed", "slip_ratio", "cmd_trim", "cmd_delay",
         "v0", "w0", "clock_offset"]


def test_tangent_jacobian_matches_central_differences():
    """d pose / d theta at every odometry sample: tangent = central FD (1 % steps; 1e-2 for the
    nuisance) to 0.5 % of each column's largest entry, the poses identical. The delays (0.135 s
    + per-run offsets 0.05 / -0.07 s) sit between the kinks of the step-averaged 100 Hz log, where
    the targets are linear in the delay."""
    runs = [stub_run("turn", 4.0), stub_run("slalom", 4.0, seed=1)]
    theta = {**ENGINE_THETA, "slip_ratio": 0.5, "cmd_trim": 0.02, "cmd_delay": 0.135}
    nu = [{"v0": 0.1, "w0": 0.02, "clock_offset": 0.05}, {"v0": -0.05, "w0": -0.03, "clock_offset": -0.07}]
    pt, jt = OstrichReplay().rollout_with_jacobian(runs, theta, DT, NAMES, nuisance=nu)
    pf, jf = OstrichReplay(jacobian="fd").rollout_with_jacobian(runs, theta, DT, NAMES, nuisance=nu)
    for i in range(len(runs)):
        assert np.abs(pt[i] - pf[i]).max() < 1e-6
        assert jt[i].shape == jf[i].shape == (len(pt[i]), 7, len(NAMES))
        for j, n in enumerate(NAMES):
            scale = np.abs(jf[i][:, :, j]).max()
            rel = np.abs(jt[i][:, :, j] - jf[i][:, :, j]).max() / scale
            print(f"run {i} d/d{n}: largest entry {scale:.3g}, tangent vs FD {rel:.2e}")
            assert scale > 0 and rel < 5e-3, (n, rel)


def test_jacobian_option():
    """jacobian must be tangent or fd; fit.jacobian sets it for the engine and is refused for
    other simulators."""
    with pytest.raises(ValueError, match="jacobian"):
        OstrichReplay(jacobian="exact")
    assert FitConfig.from_mapping({"simulator": "ostrich", "fit": {"jacobian": "fd"}}).fit.jacobian == "fd"
    with pytest.raises(ConfigError, match="engine"):
        FitConfig.from_mapping({"simulator": "kinematic", "fit": {"jacobian": "fd"}})
    with pytest.raises(ConfigError, match="tangent"):
        FitConfig.from_mapping({"simulator": "ostrich", "fit": {"jacobian": "adjoint"}})


def test_unconverged_replay_falls_back_to_central_differences():
    """Exact Coulomb wheels (slip_speed 0) on traction-limited accelerations with the wheels on the
    former active-set rows (pin_wheels_from=0, 16 iterations: the defaults before issue 21's last
    change, which converge this replay, worst step 8.5e-6 m/s) leave a replay step unconverged; the
    implicit function theorem then linearises a point the replay does not return, so that call uses
    central differences and says so (last_status["jacobian"]); the Jacobian equals the fd option's. A
    regularised replay keeps the tangent."""
    from ingest.run import Run
    from tests.helpers.fit_doubles import command_profile, odom_stub

    run = Run("accel", odom_stub(np.arange(0.0, 6.0 - 1e-9, 0.05)), command_profile("accel", 6.0, seed=1))
    theta = {"kp": 400.0, "mu": 0.6, "mu_lateral": 0.35, "cmd_scale": 0.95}
    def former(sim: OstrichReplay) -> OstrichReplay:
        sim.options.pin_wheels_from, sim.options.newton_iters = 0, 16
        return sim

    sim = former(OstrichReplay())
    _, jt = sim.rollout_with_jacobian([run], theta, DT, ["mu"])
    status = sim.last_status
    print(f"exact Coulomb: worst step {status['residual_max']:.3g} m/s, jacobian: {status['jacobian']}")
    assert status["residual_max"] > 1e-3 and status["jacobian"].startswith("fd (tangent refused")
    _, jf = former(OstrichReplay(jacobian="fd")).rollout_with_jacobian([run], theta, DT, ["mu"])
    assert np.array_equal(jt[0], jf[0])
    sim.rollout_with_jacobian([run], {**theta, "slip_speed": 0.1}, DT, ["mu"])
    assert sim.last_status["jacobian"] == "tangent"


def test_vjp_is_bound_to_its_rollout():
    """rollout_with_vjp's pull-back belongs to its own rollout: a replay at other parameters on the
    same model between the two calls leaves the gradient unchanged (bit for bit)."""
    sim = OstrichReplay()
    runs = [stub_run("turn", 3.0)]
    theta = {**ENGINE_THETA, "slip_ratio": 0.5}
    poses, vjp = sim.rollout_with_vjp(runs, theta, DT, ["mu", "slip_ratio"])
    ct = [np.random.default_rng(0).normal(size=(len(poses[0]), 7))]
    g = vjp(ct)
    poses2, vjp2 = sim.rollout_with_vjp(runs, theta, DT, ["mu", "slip_ratio"])
    sim.rollout(runs, {**theta, "mu": 0.3}, DT)
    assert np.array_equal(vjp2(ct), g)


def test_surface_friction_jacobian_under_the_max_rule():
    """friction_combine="max" with the ground's coefficient (0.9) above the wheels' (0.6 longitudinal,
    0.35 lateral): the ground decides both, so the replay is the "wheel" rule's with mu = mu_lateral =
    0.9, d pose / d mu_ground is its d / d mu + d / d mu_lateral, and mu's column is zero; tangent =
    central FD (0.5 % of each column's largest); under the "wheel" rule mu_ground's column is zero."""
    runs = [stub_run("turn", 4.0), stub_run("slalom", 4.0, seed=1)]
    theta = {**ENGINE_THETA, "mu": 0.6, "mu_ground": 0.9}
    names = ["mu_ground", "mu", "kp"]
    pt, jt = OstrichReplay(friction_combine="max").rollout_with_jacobian(runs, theta, DT, names)
    pf, jf = OstrichReplay(friction_combine="max", jacobian="fd").rollout_with_jacobian(runs, theta, DT, names)
    pw, jw = OstrichReplay().rollout_with_jacobian(runs, {**theta, "mu": 0.9, "mu_lateral": 0.9}, DT,
                                                  ["mu", "mu_lateral", "mu_ground"])
    for i in range(len(runs)):
        assert np.abs(pt[i] - pf[i]).max() < 1e-6
        assert np.abs(pt[i] - pw[i]).max() < 1e-5
        for j, n in enumerate(names):
            scale = np.abs(jf[i][:, :, j]).max()
            if n == "mu":
                assert np.abs(jt[i][:, :, j]).max() == 0.0 and scale == 0.0
                continue
            rel = np.abs(jt[i][:, :, j] - jf[i][:, :, j]).max() / scale
            print(f"run {i} d/d{n} (max rule): largest entry {scale:.3g}, tangent vs FD {rel:.2e}")
            assert scale > 0 and rel < 5e-3, (n, rel)
        ground = jt[i][:, :, 0]
        assert np.abs(ground - jw[i][:, :, 0] - jw[i][:, :, 1]).max() <= 5e-3 * np.abs(ground).max()
        assert np.abs(jw[i][:, :, 2]).max() == 0.0  # the wheel rule: the ground's coefficient has no effect
