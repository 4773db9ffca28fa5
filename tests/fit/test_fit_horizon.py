"""Relative-pose residuals (``fit.horizon`` h [s], evo's RPE): the displacement since the sample h
seconds earlier in its own heading frame, and the heading change. Their Jacobian against central
differences, an odometry jump that weighs only on the next h seconds, and a fit whose odometry jumps
and stays off (as the real joystick runs' lidar odometry does) recovering the clean fit's values
where the absolute residuals are pulled off. The kinematic test double (exact Jacobian) throughout."""

from __future__ import annotations

import numpy as np
import pytest

from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.fit import FitOptions, Residuals, RunSet, optimize
from sysid.fit.residuals import reference_indices
from tests.fit.test_fit_robust import params
from tests.helpers.fit_doubles import TRUTH, KinematicDouble, make_runs, residual_jacobian_error

DT = 0.02  # [s]


def test_reference_indices():
    t = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.6])
    assert reference_indices(t, 1.0).tolist() == [0, 0, 0, 1, 2, 3]
    assert reference_indices(t, 10.0).tolist() == [0] * 6


@pytest.mark.parametrize("kind", ["linear", "soft_l1"])
def test_relative_residual_jacobian(kind):
    """d r / d z of the relative-pose residuals = central differences of them (step 1e-6) to 1e-5."""
    runs = make_runs(("turn", "slalom"), duration=4.0, noise=0.05, seed=3)
    res = Residuals(KinematicDouble(), RunSet.build(runs), params(), DT, loss=kind, loss_scale=0.03, horizon=0.7)
    rel = residual_jacobian_error(res)
    print(f"{kind}: relative-pose residual Jacobian vs central FD {rel:.1e}")
    assert rel < 1e-5


def _jumped_odometry(runs, t_jump=2.5, dx=0.4, dy=-0.3):
    """Odometry that jumps by (dx, dy) [m] at ``t_jump`` and stays there (a lidar relocalisation)."""
    out = []
    for r in runs:
        o = r.odom.copy()
        later = o["t"].to_numpy() >= t_jump
        o.loc[later, "x"] += dx
        o.loc[later, "y"] += dy
        out.append(type(r)(r.name, o, r.wheel_cmd, segments=r.segments, meta=r.meta))
    return out


def test_a_jump_weighs_only_on_the_horizon_after_it():
    """At the truth with noiseless odometry the residuals vanish but for the jump's: absolute ones on
    every sample after it, relative ones only within h after it."""
    clean = make_runs(("turn",), duration=6.0, noise=0.0, seed=1)
    runs = _jumped_odometry(clean)
    ps = params(free=("mu",))
    for n, v in TRUTH.items():
        ps[n].value = v
    t = runs[0].odom["t"].to_numpy()
    for horizon, window in ((None, (2.5, 6.1)), (1.0, (2.5, 3.5 - 1e-6))):
        res = Residuals(KinematicDouble(), RunSet.build(runs), ps, DT, horizon=horizon)
        e = np.abs(res.evaluate(res.z_start())[0][: 4 * len(t)].reshape(len(t), 4)).max(axis=1)
        inside = (t >= window[0]) & (t < window[1])
        assert e[inside].min() > 30 * e[~inside].max(), (horizon, e[inside].min(), e[~inside].max())


def test_relative_residuals_resist_a_persistent_jump():
    """mu / mu_lateral (only their ratio is identified here: the runs never reach the traction limit)
    from runs whose odometry jumps 0.5 m at 2.5 s and stays off: least squares on the absolute poses
    ends > 15 % off the clean fit's ratio, on relative poses over 1 s within 2 %."""
    clean = make_runs(("turn", "slalom", "random"), duration=6.0, noise=0.01, seed=4)
    ref = optimize(KinematicDouble(), clean, params(), DT, max_iter=40).params
    runs = _jumped_odometry(clean)
    err = {}
    for horizon in (None, 1.0):
        f = optimize(KinematicDouble(), runs, params(), DT, max_iter=40, options=FitOptions(horizon=horizon))
        err[horizon] = abs(f.params["mu"].value / f.params["mu_lateral"].value
                           / (ref["mu"].value / ref["mu_lateral"].value) - 1)
    print("relative departure of mu / mu_lateral from the clean fit's:", {k: f"{v:.1%}" for k, v in err.items()})
    assert err[None] > 0.15 and err[1.0] < 0.02


def test_horizon_options():
    with pytest.raises(ConfigError, match="fit.horizon"):
        FitOptions(horizon=-1.0)
    with pytest.raises(ConfigError, match="fit.horizon"):
        FitConfig.from_mapping({"fit": {"horizon": 0}})
    assert FitConfig.from_mapping({"fit": {"horizon": 2.5}}).fit.options.horizon == 2.5
    runs = make_runs(("turn",), duration=4.0, noise=0.0, seed=1)
    with pytest.raises(ConfigError, match="horizon"):
        Residuals(KinematicDouble(), RunSet.build(runs, anchor=True), params(), DT, horizon=1.0)
    res = Residuals(KinematicDouble(), RunSet.build(runs), params(), DT, horizon=1.0)
    with pytest.raises(ConfigError, match="horizon"):
        res.loss_and_grad_vjp(res.z_start())
