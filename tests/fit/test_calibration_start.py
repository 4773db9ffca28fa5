"""The command-scale calibration does not depend on where it starts: a scan over the bounds and a
converged 1-D solve, not LM from the start value (which stops on its relative-loss tolerance short
of the minimum when the model cannot fit the segment exactly)."""

from __future__ import annotations

import pytest

from sysid.fit.calibration import calibrate
from sysid.fit.params import default_parameters
from sysid.fit.residuals import Residuals, RunSet
from tests.helpers.fit_doubles import TRUTH, make_double, make_runs

DT = 0.02


@pytest.fixture(scope="module")
def mismatched_runs():
    """Runs whose traction differs from the calibration's (nominal) parameters, with odometry noise:
    the calibration loss keeps a large floor, so its valley is flat (as on real logs)."""
    truth = {**TRUTH, "mu": 0.3, "mu_lateral": 2.0, "kp": 20.0}
    runs = make_runs(("turn", "slalom", "random"), truth=truth, duration=8.0, noise=0.2, truth_dt=DT, seed=3)
    for r in runs:
        r.segments["cruise"] = (3.0, 8.0)
    return runs


def calibrated(runs, start: float) -> float:
    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    ps["cmd_scale"].value = start
    return calibrate(sim, runs, ps, DT).value


def test_calibration_independent_of_the_start(mismatched_runs) -> None:
    values = [calibrated(mismatched_runs, s) for s in (0.6, 1.0, 1.4)]
    assert max(values) - min(values) < 1e-3, values


def test_calibration_is_the_minimum_of_its_loss(mismatched_runs) -> None:
    """The calibrated value is the 1-D minimiser: the loss is higher 1e-3 to either side."""
    from sysid.fit.calibration import solve_1d

    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    ps.freeze(ps.names)
    ps.freeze(["cmd_scale"], frozen=False)
    res = Residuals(sim, RunSet.build(mismatched_runs, [r.segments["cruise"] for r in mismatched_runs], anchor=True),
                    ps, DT)
    z, _ = solve_1d(res, res.z_start())
    value = float(res.theta_free([z])[0])

    def loss(v: float) -> float:
        return res.loss(res.evaluate(res.to_z([v]))[0])

    assert loss(value) < loss(value - 1e-3) and loss(value) < loss(value + 1e-3)
    assert calibrated(mismatched_runs, 1.0) == pytest.approx(value, abs=1e-4)
