"""Which parameters the runs determine (sysid.fit.identifiability): provably undetermined parameters
reported as such, intervals that reach a bound said to, priors that hold an undetermined parameter,
the profile check and the least-determined combination. Fast: the kinematic model and tiny doubles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ingest.run import Run
from sysid.fit import optimize
from sysid.fit.identifiability import DETERMINED, NOT_DETERMINED, WEAK, interval_text, reaches
from sysid.fit.params import Parameter, ParameterSet, Prior, default_parameters
from sysid.simulators.kinematic import KinematicSkidSteer
from tests.helpers.fit_doubles import command_profile, make_runs, odom_stub

DT = 0.05
REMEDIES = ("prior", "frozen", "runs that excite it")


def _fit(kinds, noise=0.05, seed=3, params=None, **kw):
    runs = make_runs(kinds, noise=noise, seed=seed, truth_dt=DT, duration=6.0)
    return optimize(KinematicSkidSteer(), runs, params or default_parameters(), DT, max_iter=30, **kw)


def test_mu_is_not_determined_when_no_wheel_slides():
    """Gentle turns only: the traction limit never binds, so mu enters only through the turn
    efficiency mu / (mu + k mu_lateral); mu and mu_lateral are not determined, each is named in a
    warning with the three remedies, and their ratio is the least-determined combination. Add
    traction-limited accelerations and both are determined."""
    res = _fit(("turn", "slalom"))
    for n in ("mu", "mu_lateral"):
        ident = res.identifiability[n]
        assert ident["status"] == NOT_DETERMINED and ident["reaches"] == "both", (n, ident)
        warning = next(w for w in res.warnings if f"parameter {n!r} is not determined" in w)
        assert all(r in warning for r in REMEDIES), warning
        lo, hi = res.params[n].lower, res.params[n].upper
        assert f"[{lo:.4g} (bound), {hi:.4g} (bound)]" in warning
    assert res.identifiability["cmd_scale"]["status"] == DETERMINED
    assert set(res.weakest["dominant"]) == {"mu", "mu_lateral"}
    # the old rule (cond(J^T J) > 1e8) stayed silent on this fit; the warning is relative to the bounds
    assert res.condition_number < 1e8
    assert any(w.startswith("ill-conditioned") and "mu_lateral" in w for w in res.warnings), res.warnings

    sliding = _fit(("turn", "accel", "slalom"))
    assert {n: sliding.identifiability[n]["status"] for n in ("mu", "mu_lateral")} == {
        "mu": DETERMINED, "mu_lateral": DETERMINED}
    assert not [w for w in sliding.warnings if "not determined" in w or "ill-conditioned" in w], sliding.warnings


def test_a_parameter_without_effect_is_not_determined():
    res = _fit(("accel",), noise=0.02)
    ident = res.identifiability["mu_lateral"]
    assert ident["status"] == NOT_DETERMINED and ident["reaches"] == "both"
    assert ident["interval"] == [-math.inf, math.inf] and "no effect" in ident["reason"]
    assert [n for n, i in res.identifiability.items() if i["status"] != DETERMINED] == ["mu_lateral"]
    assert res.weakest["dominant"] == ["mu_lateral"]


def test_an_interval_that_reaches_a_bound_says_so():
    """mu_lateral's lower bound just under its estimate: the interval the data give passes the bound;
    the clipped interval ends at the bound, the record says which bound it reaches, the text marks
    it, and the parameter counts as weakly determined."""
    near = Parameter("mu_lateral", nominal=1.0, lower=0.88, upper=1.5, scale="linear")
    ps = ParameterSet(near if p.name == "mu_lateral" else p for p in default_parameters())
    res = _fit(("turn", "accel", "slalom"), noise=0.05, params=ps)
    ident = res.identifiability["mu_lateral"]
    lo, hi = ident["interval"]
    assert lo < 0.88 < res.params["mu_lateral"].value < hi < 1.5, ident
    assert ident["reaches"] == "lower" and ident["status"] == WEAK and "reaches the lower bound" in ident["reason"]
    assert res.intervals["mu_lateral"] == (0.88, pytest.approx(hi))
    assert interval_text(lo, hi, 0.88, 1.5) == f"[0.88 (bound), {hi:.4g}]"


def test_interval_text_and_reaches():
    assert reaches(0.1, 0.5, 0.05, 2.0) is None
    assert reaches(0.05, 0.5, 0.05, 2.0) == "lower" and reaches(-1.0, 3.0, 0.05, 2.0) == "both"
    assert interval_text(-0.3, 1.3, 0.05, 2.0) == "[0.05 (bound), 1.3]"
    assert interval_text(None, None, 0.05, 2.0) == "[0.05 (bound), 2 (bound)]"
    assert interval_text(0.2, 2.5, 0.05, 2.0, ".2f") == "[0.20, 2.00 (bound)]"


def test_a_prior_holds_an_undetermined_parameter_at_its_mean():
    """Straight runs say nothing about mu_lateral: without a prior it stays where it started (and
    is reported); with N(1.7, 0.3^2) the MAP estimate is the prior's mean, its interval the prior's,
    and it is reported as held by its prior, without the warning."""
    free = _fit(("accel",), noise=0.02)
    assert free.params["mu_lateral"].value == pytest.approx(0.5)
    ps = default_parameters()
    ps["mu_lateral"].prior = Prior(1.7, 0.3)
    res = _fit(("accel",), noise=0.02, params=ps)
    assert res.params["mu_lateral"].value == pytest.approx(1.7, abs=1e-3)
    lo, hi = res.intervals["mu_lateral"]
    assert lo < 1.7 < hi and (hi - lo) / 2 == pytest.approx(1.96 * 0.3, rel=0.35)
    ident = res.identifiability["mu_lateral"]
    assert ident["status"] == NOT_DETERMINED and ident["prior"] and "held by its prior" in ident["reason"]
    assert not [w for w in res.warnings if "mu_lateral" in w and "not determined" in w], res.warnings
    assert any("parameter 'mu_lateral' has no effect" in w for w in free.warnings), free.warnings


def test_a_combination_held_by_priors_says_so():
    """Gentle turns leave mu and mu_lateral undetermined (above); with a prior on each, the warning on
    their combination says the priors hold it instead of asking for a prior they already have."""
    ps = default_parameters()
    ps["mu"].prior, ps["mu_lateral"].prior = Prior(0.8, 0.5), Prior(0.5, 1.0)
    res = _fit(("turn", "slalom"), params=ps)
    assert set(res.weakest["dominant"]) == {"mu", "mu_lateral"}
    warning = next(w for w in res.warnings if w.startswith("ill-conditioned"))
    assert "the priors on" in warning and "hold it" in warning and "give one a prior" not in warning, warning
    assert not [w for w in res.warnings if "is not determined by these runs" in w], res.warnings


class Saturating:
    """x(t) = t f(a) with f(a) = a below 0.4 and 0.4 above (a smooth kink): the loss is flat beyond
    0.4, which the Fisher information at an estimate below the kink cannot see."""

    parameter_names = ("a",)

    @staticmethod
    def f(a: float) -> tuple[float, float]:
        k = 60.0
        u = k * (0.4 - a)
        soft = (math.log1p(math.exp(u)) if u < 30 else u) / k
        return 0.4 - soft, 1.0 / (1.0 + math.exp(-u))  # value and derivative

    def _pose(self, run: Run, a: float, der: bool) -> np.ndarray:
        t = run.odom["t"].to_numpy()
        v, dv = self.f(a)
        pose = np.zeros((len(t), 8))
        pose[:, 0], pose[:, 7] = t, 1.0
        pose[:, 1] = t * (dv if der else v)
        return pose

    def rollout(self, runs, theta, dt):
        return [self._pose(r, theta["a"], False) for r in runs]

    def rollout_with_jacobian(self, runs, theta, dt, names):
        poses = self.rollout(runs, theta, dt)
        jacs = [np.zeros((len(p), 7, len(names))) for p in poses]
        for j, pose in zip(jacs, (self._pose(r, theta["a"], True) for r in runs), strict=True):
            j[:, 0, 0] = pose[:, 1]
        return poses, jacs


def test_the_profile_widens_an_interval_the_information_understates():
    """Truth a = 0.3 with alternating noise: the Fisher interval (about +/-0.2 of the bound range 1)
    calls a determined, but above the kink at 0.4 the loss stops rising; the profile sees the flat
    side and a is only weakly determined. Without the profile the same fit reads determined."""
    t = np.arange(0.0, 5.0, 0.05)
    odom = odom_stub(t).assign(x=0.3 * t + 6.0 * (-1.0) ** np.arange(len(t)), z=0.0)
    odom.loc[0, "x"] = 0.0
    run = Run("line", odom, command_profile("turn", 5.0))
    ps = ParameterSet([Parameter("a", nominal=0.25, lower=0.0, upper=1.0, scale="linear")])
    from sysid.fit.options import FitOptions

    res = optimize(Saturating(), [run], ps, DT, max_iter=30, options=FitOptions(intervals="iid"))
    ident = res.identifiability["a"]
    assert 0.25 < res.params["a"].value < 0.35
    plain = optimize(Saturating(), [run], ps, DT, max_iter=30, options=FitOptions(intervals="iid", profile=False))
    assert plain.identifiability["a"]["status"] == DETERMINED and plain.identifiability["a"]["profile"] is None
    assert ident["profile"]["upper"]["ratio"] < 0.5 < ident["profile"]["lower"]["ratio"], ident["profile"]
    assert ident["status"] == WEAK and "profile" in ident["reason"], ident
