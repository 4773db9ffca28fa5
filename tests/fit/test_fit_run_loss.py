"""The run-level loss (``fit.run_loss_scale`` delta [m]): each run's squared combined error E^2 enters as
delta^2 soft_l1(E^2 / delta^2), ~2 delta E beyond delta. Its residuals' sum of squares, their Jacobian
against central differences, and a fit in which one run the model cannot describe (its odometry 30 %
longer than its wheels drive) pulls the command scale less than under least squares. The kinematic
test double (exact Jacobian) throughout."""

from __future__ import annotations

import numpy as np
import pytest

from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.fit import FitOptions, Residuals, RunSet, optimize
from sysid.fit.params import Parameter, ParameterSet
from tests.fit.test_fit_robust import params
from tests.helpers.fit_doubles import TRUTH, KinematicDouble, make_runs

DT = 0.02  # [s]


def test_sum_of_squares_is_the_run_level_soft_l1():
    runs = make_runs(("turn", "slalom"), duration=4.0, noise=0.05, seed=3)
    plain = Residuals(KinematicDouble(), RunSet.build(runs), params(), DT)
    delta = 0.02
    robust = Residuals(KinematicDouble(), RunSet.build(runs), params(), DT, run_scale=delta)
    z = plain.z_start()
    e = plain.run_errors(plain.evaluate(z)[0])  # each run's combined error [m]
    r = robust.evaluate(z)[0]
    expect = sum(2 * delta**2 * (np.sqrt(1 + (x / delta) ** 2) - 1) for x in e)
    assert np.dot(r, r) == pytest.approx(expect, rel=1e-12)
    assert e.min() > 3 * delta  # the regime where it weighs like 2 delta E


@pytest.mark.parametrize("kind", ["linear", "soft_l1"])
def test_run_loss_jacobian(kind):
    runs = make_runs(("turn", "slalom"), duration=4.0, noise=0.05, seed=3)
    res = Residuals(KinematicDouble(), RunSet.build(runs), params(), DT, loss=kind, loss_scale=0.03, run_scale=0.05)
    z = res.z_start()
    _, j = res.evaluate(z, jac=True)
    fd = np.column_stack([(res.evaluate(z + h)[0] - res.evaluate(z - h)[0]) / 2e-6 for h in np.eye(len(z)) * 1e-6])
    rel = np.abs(j - fd).max() / np.abs(fd).max()
    print(f"{kind}: run-level loss Jacobian vs central FD {rel:.1e}")
    assert rel < 1e-5


def _stretched(run, factor=1.3):
    """The run with its odometry's path stretched by ``factor`` about its start."""
    o = run.odom.copy()
    for c in ("x", "y"):
        o[c] = o[c].iloc[0] + factor * (o[c] - o[c].iloc[0])
    return type(run)(run.name + "-stretched", o, run.wheel_cmd, segments=run.segments, meta=run.meta)


def test_a_run_the_model_cannot_describe_pulls_less():
    """cmd_scale from four runs, one of them stretched 30 %: least squares moves > 10 % off the truth,
    the run-level loss at 5 cm less than half as far."""
    runs = make_runs(("turn", "slalom", "random", "turn"), duration=6.0, noise=0.01, seed=4)
    runs[3] = _stretched(runs[3])
    ps = ParameterSet([Parameter(name=n, nominal=TRUTH[n] if n != "cmd_scale" else 1.0,
                                 lower={"cmd_scale": 0.5}.get(n, 0.01), upper={"cmd_scale": 1.5}.get(n, 1000.0),
                                 frozen=n != "cmd_scale") for n in TRUTH])
    off = {}
    for scale in (None, 0.05):
        f = optimize(KinematicDouble(), runs, ps, DT, max_iter=40, options=FitOptions(run_loss_scale=scale))
        off[scale] = abs(f.params["cmd_scale"].value / TRUTH["cmd_scale"] - 1)
    print("cmd_scale off the truth:", {k: f"{v:.1%}" for k, v in off.items()})
    assert off[None] > 0.05 and off[0.05] < 0.5 * off[None]


def test_run_loss_options():
    with pytest.raises(ConfigError, match="run_loss_scale"):
        FitOptions(run_loss_scale=0.0)
    assert FitConfig.from_mapping({"fit": {"run_loss_scale": 0.2}}).fit.options.run_loss_scale == 0.2
    res = Residuals(KinematicDouble(), RunSet.build(make_runs(("turn",), duration=4.0, noise=0.0, seed=1)), params(),
                    DT, run_scale=0.1)
    with pytest.raises(ConfigError, match="run-level"):
        res.loss_and_grad_vjp(res.z_start())
