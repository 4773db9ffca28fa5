"""Identification on the test double with known truth: recovery, covariance, warnings, sweep."""


import numpy as np
import pytest

from sysid.errors import ConfigError, SimulatorError
from sysid.fit import RunSet, calibrate, find_plateau, optimize, sweep_dt
from sysid.fit.params import Parameter, ParameterSet, Prior, default_parameters
from sysid.simulators.kinematic import KinematicSkidSteer
from sysid.simulators.protocol import Simulator, get_simulator, unwrap
from tests.helpers.fit_doubles import TRUTH, KinematicDouble, make_runs  # noqa: E402

DT = 0.05


@pytest.fixture(scope="module")
def clean_runs():
    return make_runs(("turn", "accel", "slalom"), noise=0.0, truth_dt=DT, duration=6.0)


def test_double_and_baseline_implement_the_protocol_and_agree(clean_runs):
    base, double = KinematicSkidSteer(), KinematicDouble()
    assert isinstance(base, Simulator) and isinstance(double, Simulator)
    theta = dict(TRUTH)
    names = ["kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass"]
    p1, j1 = base.rollout_with_jacobian(clean_runs, theta, DT, names)
    p2, j2 = double.rollout_with_jacobian(clean_runs, theta, DT, names)
    for a, b, ja, jb in zip(p1, p2, j1, j2):
        assert a.shape == b.shape == (len(clean_runs[0].odom), 8)
        assert np.allclose(a, b, atol=1e-9)
        # exact forward sensitivities vs central finite differences
        scale = np.abs(jb).max(axis=(0, 1)) + 1e-12
        assert np.all(np.abs(ja - jb).max(axis=(0, 1)) / scale < 1e-4)


def test_lm_recovers_true_parameters_after_cruise_calibration(clean_runs):
    sim = KinematicDouble()
    ps = default_parameters()
    cal = calibrate(sim, clean_runs, ps, DT)
    assert cal.value == pytest.approx(TRUTH["cmd_scale"], rel=1e-3)
    ps["cmd_scale"].value, ps["cmd_scale"].frozen = cal.value, True
    res = optimize(sim, clean_runs, ps, DT, optimizer="lm", max_iter=30)
    assert res.success and res.loss_final < 1e-6 * res.loss_initial
    for n in ("kp", "mu", "mu_lateral"):
        assert res.params[n].value == pytest.approx(TRUTH[n], rel=5e-3), n
    assert ps["kp"].value == 250.0  # the input set is not modified
    assert res.trace[0]["loss"] == pytest.approx(res.loss_initial) and res.trace[-1]["loss"] <= res.trace[0]["loss"]


def test_adam_descends_quickly(clean_runs):
    res = optimize(KinematicSkidSteer(), clean_runs, default_parameters(), DT, optimizer="adam", max_iter=40)
    assert res.loss_final < 0.1 * res.loss_initial
    assert res.trace[-1]["loss"] == pytest.approx(res.loss_final)


@pytest.mark.slow
def test_adam_recovers_true_parameters(clean_runs):
    ps = default_parameters()
    res = optimize(KinematicSkidSteer(), clean_runs, ps, DT, optimizer="adam", max_iter=300, lr=0.03)
    assert res.loss_final < 1e-4 * res.loss_initial
    for n in ("kp", "mu", "mu_lateral", "cmd_scale"):
        assert res.params[n].value == pytest.approx(TRUTH[n], rel=0.04), n


def test_all_runs_simulated_together(clean_runs):
    class Spy(KinematicSkidSteer):
        batches: list[int] = []

        def rollout_with_jacobian(self, runs, theta, dt, names):
            self.batches.append(len(runs))
            return super().rollout_with_jacobian(runs, theta, dt, names)

    spy = Spy()
    optimize(spy, clean_runs, default_parameters(), DT, max_iter=5)
    assert spy.batches and set(spy.batches) == {len(clean_runs)}


def test_covariance_matches_monte_carlo():
    """Predicted std vs the spread of estimates over independent noise draws (white noise)."""
    sim = KinematicSkidSteer()
    estimates, predicted, covered = [], [], 0
    n_mc = 12
    for seed in range(n_mc):
        runs = make_runs(("turn", "accel"), noise=0.02, seed=100 + seed, truth_dt=DT, duration=6.0)
        ps = default_parameters()
        ps["cmd_scale"].frozen = True
        ps["cmd_scale"].value = TRUTH["cmd_scale"]
        res = optimize(sim, runs, ps, DT, max_iter=30)
        estimates.append([res.params[n].value for n in res.names])
        predicted.append([res.std[n] for n in res.names])
        lo, hi = res.intervals["mu_lateral"]
        covered += lo <= TRUTH["mu_lateral"] <= hi
    emp = np.std(estimates, axis=0, ddof=1)
    pred = np.mean(predicted, axis=0)
    ratio = emp / pred
    assert np.all((ratio > 0.45) & (ratio < 2.2)), ratio
    assert covered >= n_mc * 0.6


def test_warning_for_parameter_on_bound(clean_runs):
    ps = default_parameters()
    ps["kp"].lower, ps["kp"].nominal, ps["kp"].value = 150.0, 250.0, 250.0  # truth 60 is outside
    res = optimize(KinematicSkidSteer(), clean_runs, ps, DT, max_iter=30)
    assert res.params["kp"].value == pytest.approx(150.0)
    assert any("'kp'" in w and "lower bound" in w for w in res.warnings), res.warnings


def test_warning_for_ill_conditioning(clean_runs):
    ps = default_parameters()
    ps["chassis_mass"].frozen = False  # only kp / I_eff(mass) enters: a null direction
    res = optimize(KinematicSkidSteer(), clean_runs, ps, DT, max_iter=20)
    text = " ".join(res.warnings)
    assert "ill-conditioned" in text and "kp" in text and "chassis_mass" in text, res.warnings


def test_warning_for_parameter_without_effect():
    straight = make_runs(("accel",), truth_dt=DT, duration=6.0)  # no turning: mu_lateral is invisible
    res = optimize(KinematicSkidSteer(), straight, default_parameters(), DT, max_iter=10)
    assert any("'mu_lateral' has no effect" in w for w in res.warnings), res.warnings
    assert not np.isfinite(res.std["mu_lateral"])


def test_no_warnings_on_a_well_posed_fit(clean_runs):
    ps = default_parameters()
    res = optimize(KinematicSkidSteer(), clean_runs, ps, DT, max_iter=30)
    assert not [w for w in res.warnings if "bound" in w or "ill-conditioned" in w], res.warnings


def test_calibration_is_robust_to_wrong_other_parameters(clean_runs):
    ps = default_parameters()
    ps["kp"].value, ps["mu"].value = 1500.0, 1.5  # far from truth
    cal = calibrate(KinematicSkidSteer(), clean_runs, ps, DT)
    assert cal.value == pytest.approx(TRUTH["cmd_scale"], rel=2e-3)
    runs_no_cruise = [r.slice(3.0, 6.0) for r in clean_runs]
    for r in runs_no_cruise:
        r.segments.pop("cruise", None)
    with pytest.raises(ConfigError, match="cruise"):
        calibrate(KinematicSkidSteer(), runs_no_cruise, ps, DT)


def test_prior_pulls_towards_its_mean(clean_runs):
    ps = default_parameters()
    ps["mu_lateral"].prior = Prior(0.5, 0.001)  # very strong, wrong prior
    res = optimize(KinematicSkidSteer(), clean_runs, ps, DT, max_iter=30)
    assert abs(res.params["mu_lateral"].value - 0.5) < 0.05


def test_unknown_parameter_rejected(clean_runs):
    ps = ParameterSet(list(default_parameters()) + [Parameter("wheel_radius", 0.36, 0.3, 0.4)])
    with pytest.raises(ConfigError, match="wheel_radius"):
        optimize(KinematicSkidSteer(), clean_runs, ps, DT)


def test_scoring_window_masks_samples(clean_runs):
    data = RunSet.build(clean_runs, [(3.0, 4.0)] * 3)
    assert all(m.sum() == 21 for m in data.masks)  # 20 Hz odometry, both ends included
    assert all(r.odom["t"].iloc[-1] <= 4.0 + 1e-9 for r in data.runs)  # simulated only up to the window end


def test_find_plateau():
    dts = [0.001, 0.01, 0.05, 0.1, 0.2, 0.4]
    errs = [0.21, 0.20, 0.22, 0.35, 0.5, float("inf")]
    assert find_plateau(dts, errs) == (0.001, 0.1)
    assert find_plateau(dts, [float("inf")] * 6) is None
    assert find_plateau([0.1, 0.01], [0.1, 1.0]) == (0.1, 0.1)


def test_sweep_marks_diverged_timesteps_and_plateau(clean_runs):
    class Fragile(KinematicSkidSteer):
        def rollout(self, runs, theta, dt):
            out = super().rollout(runs, theta, dt)
            if dt > 0.15:  # an explicit engine past its stability limit
                out = [np.full_like(p, np.nan) for p in out]
            return out

    sw = sweep_dt(Fragile(), clean_runs, dict(TRUTH), [0.01, 0.05, 0.1, 0.2])
    assert sw.errors[-1] == float("inf")
    assert sw.plateau is not None and sw.plateau[1] <= 0.1
    best = min(sw.errors)
    assert all(e <= 2 * best for h, e in zip(sw.dts, sw.errors) if sw.plateau[0] <= h <= sw.plateau[1])


def test_simulator_registry():
    # every simulator comes observed through the odometry model (sysid.simulators.observation), itself inside
    assert isinstance(unwrap(get_simulator("kinematic")), KinematicSkidSteer)
    assert isinstance(unwrap(get_simulator("tests.helpers.fit_doubles:make_double")), KinematicDouble)
    with pytest.raises(SimulatorError, match="unknown simulator"):
        get_simulator("nope")
    with pytest.raises(SimulatorError):
        get_simulator("tests.helpers.fit_doubles:missing_factory")


class AdjointBaseline(KinematicSkidSteer):
    """Baseline with the optional adjoint extension (VJP built from its exact Jacobian)."""

    vjp_calls = 0

    def rollout_with_vjp(self, runs, theta, dt, names):
        poses, jacs = self.rollout_with_jacobian(runs, theta, dt, names)

        def vjp(cotangents):
            AdjointBaseline.vjp_calls += 1
            return sum(np.einsum("tk,tkn->n", c, j) for c, j in zip(cotangents, jacs))

        return poses, vjp


@pytest.mark.parametrize("anchor", [False, True])
def test_adjoint_gradient_matches_jacobian_gradient(clean_runs, anchor):
    from sysid.fit import Residuals

    ps = default_parameters()
    ps["mu_lateral"].prior = Prior(0.6, 0.1)
    data = RunSet.build(clean_runs, [(1.5, 5.0)] * 3, anchor=anchor)
    res = Residuals(AdjointBaseline(), data, ps, DT)
    z = res.to_z(ps.free_vector()) + 0.05
    r1, g1 = res.loss_and_grad_vjp(z)
    r2, j = res.evaluate(z, jac=True)
    assert np.allclose(r1, r2)
    assert np.allclose(g1, 2 * j.T @ r2, rtol=1e-8, atol=1e-12)


def test_adam_uses_the_adjoint_when_available(clean_runs):
    before = AdjointBaseline.vjp_calls
    a = optimize(AdjointBaseline(), clean_runs, default_parameters(), DT, optimizer="adam", max_iter=15)
    b = optimize(KinematicSkidSteer(), clean_runs, default_parameters(), DT, optimizer="adam", max_iter=15)
    assert AdjointBaseline.vjp_calls - before == 15
    assert a.loss_final == pytest.approx(b.loss_final, rel=1e-9)
