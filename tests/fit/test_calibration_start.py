"""The command-scale calibration: its value does not depend on where it starts (a scan over the
bounds and a converged 1-D solve, not LM from the start value, which stopped on its relative-loss
tolerance short of the minimum when the model cannot fit the segment exactly), and it calibrates a
speed: a model that turns too little at its start values does not pull the scale off."""

from __future__ import annotations

import pytest

from sysid.fit.calibration import calibrate
from sysid.fit.params import default_parameters
from sysid.fit.residuals import RunSet
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


def calibrated(runs, start: float, **theta: float) -> float:
    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    ps["cmd_scale"].value = start
    for k, v in theta.items():
        ps[k].value = v
    return calibrate(sim, runs, ps, DT).value


def test_calibration_independent_of_the_start(mismatched_runs) -> None:
    values = [calibrated(mismatched_runs, s) for s in (0.6, 1.0, 1.4)]
    assert max(values) - min(values) < 1e-3, values


def test_calibration_is_the_minimum_of_its_loss(mismatched_runs) -> None:
    """The calibrated value is the 1-D minimiser: the loss is higher 1e-3 to either side."""
    from sysid.fit.calibration import SpeedResiduals

    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    speeds = SpeedResiduals(sim, RunSet.build(mismatched_runs, [r.segments["cruise"] for r in mismatched_runs]),
                            ps, "cmd_scale", DT)
    value = calibrated(mismatched_runs, 1.0)
    assert speeds.loss(value) < speeds.loss(value - 1e-3) and speeds.loss(value) < speeds.loss(value + 1e-3)


def test_a_turn_the_model_misjudges_does_not_move_the_scale() -> None:
    """Steady circles driven at cmd_scale 0.92: calibrated with the turn efficiency far off (mu_lateral
    0.1 or 3 against the truth's 0.9), the scale comes back within 1 %."""
    runs = make_runs(("turn", "turn"), duration=8.0, truth_dt=DT, seed=5)
    for r in runs:
        r.segments["cruise"] = (4.0, 8.0)  # the steady turn after the manoeuvre's start
    for mu_lateral in (0.1, 3.0):
        assert calibrated(runs, 1.0, mu=TRUTH["mu"], kp=TRUTH["kp"], mu_lateral=mu_lateral) == pytest.approx(
            TRUTH["cmd_scale"], rel=0.01)
