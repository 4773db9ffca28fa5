"""The runs' jackknife (`sysid.fit.uncertainty.run_shifts`, ``fit.intervals: runs``).

Closed forms on linear least squares, where one Gauss-Newton step is the exact refit: each run's
shift is the exact leave-one-run-out estimate's, and the jackknife covariance is the textbook
(n - 1) / n sum (theta_(-i) - mean)^2. On runs that disagree beyond their noise (each replayed
at its own command scale, the fit shares one), the jackknife interval is the spread of the runs'
own values over sqrt(n), which holds their mean, where the sandwich sees only the noise about one
model; a run's pieces count as one run; the settings it cannot take are one-line errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from sysid.errors import ConfigError
from sysid.fit import optimize
from sysid.fit.options import FitOptions
from sysid.fit.params import default_parameters
from sysid.fit.uncertainty import beyond_interval, covariance, jackknife_covariance, run_shifts
from sysid.simulators.kinematic import KinematicSkidSteer
from tests.helpers import fit_doubles

DT = 0.05


def linear_problem(seed: int = 0, runs: int = 6, rows: int = 40, p: int = 3):
    rng = np.random.default_rng(seed)
    J = rng.normal(size=(runs * rows, p))
    offsets = np.repeat(rng.normal(size=runs), rows)  # what each run disagrees about
    y = J @ np.array([1.0, -2.0, 0.5]) + rng.normal(scale=0.3, size=runs * rows) + offsets
    theta = np.linalg.lstsq(J, y, rcond=None)[0]
    blocks = [slice(i * rows, (i + 1) * rows) for i in range(runs)]
    return J, y, theta, blocks


def scaled_runs(scales):
    """One turning run per command scale (each replayed at its own), and parameters with only cmd_scale free."""
    runs = fit_doubles.scaled_runs(scales, dt=DT)
    params = default_parameters()
    for n in params.names:
        params[n].frozen = n != "cmd_scale"
    return runs, params


def test_shifts_are_the_exact_leave_one_run_out_refits_of_a_linear_problem():
    J, y, theta, blocks = linear_problem()
    r = J @ theta - y
    shifts = run_shifts(r, J, len(r), [[b] for b in blocks])
    for i, b in enumerate(blocks):
        keep = np.ones(len(y), bool)
        keep[b] = False
        refit = np.linalg.lstsq(J[keep], y[keep], rcond=None)[0]
        assert shifts[i] == pytest.approx(refit - theta, abs=1e-10)
    loo = theta + shifts
    n = len(blocks)
    expected = (n - 1) / n * (loo - loo.mean(0)).T @ (loo - loo.mean(0))
    assert jackknife_covariance(shifts) == pytest.approx(expected, abs=1e-12)
    cov, half = covariance(r, J, len(r), blocks=blocks, method="runs")
    assert cov == pytest.approx(expected, abs=1e-12)
    assert half == pytest.approx(np.sqrt(np.diag(expected)) * scipy.stats.t.ppf(0.975, n - 1), rel=1e-12)
    # pieces grouped into runs: two blocks per run move together
    J, y, theta, blocks = linear_problem(runs=10)
    r = J @ theta - y
    pairs = [[blocks[2 * k], blocks[2 * k + 1]] for k in range(5)]
    keep = np.ones(len(y), bool)
    keep[blocks[0]] = keep[blocks[1]] = False
    refit = np.linalg.lstsq(J[keep], y[keep], rcond=None)[0]
    assert run_shifts(r, J, len(r), pairs)[0] == pytest.approx(refit - theta, abs=1e-10)
    cov3, _ = covariance(r, J, len(r), blocks=blocks, method="runs", clusters=[[2 * k, 2 * k + 1] for k in range(5)])
    assert cov3 == pytest.approx(jackknife_covariance(run_shifts(r, J, len(r), pairs)), abs=1e-12)


def test_runs_that_disagree_get_an_interval_from_their_spread():
    scales = [0.86, 0.92, 0.98, 0.90, 0.95, 0.88]
    runs, params = scaled_runs(scales)
    fits = {m: optimize(KinematicSkidSteer(), runs, params, DT, max_iter=30, options=FitOptions(intervals=m))
            for m in ("ess", "runs")}
    assert fits["ess"].params["cmd_scale"].value == fits["runs"].params["cmd_scale"].value  # the same estimate
    lo, hi = fits["runs"].intervals["cmd_scale"]
    half = (hi - lo) / 2
    expected = scipy.stats.t.ppf(0.975, len(scales) - 1) * np.std(scales, ddof=1) / math.sqrt(len(scales))
    e_lo, e_hi = fits["ess"].intervals["cmd_scale"]
    print(f"\ncmd_scale {fits['runs'].params['cmd_scale'].value:.4f}: runs' jackknife +/-{half:.4f} (the runs' own "
          f"values' t s / sqrt(n) {expected:.4f}); sandwich +/-{(e_hi - e_lo) / 2:.4f}")
    assert 0.5 * expected < half < 2.0 * expected
    assert lo < np.mean(scales) < hi
    shifts = fits["ess"].run_shifts
    assert set(shifts) == {r.name for r in runs}
    # leaving out the slowest run raises the shared scale, the fastest lowers it
    assert shifts[runs[0].name]["cmd_scale"] > 0 > shifts[runs[2].name]["cmd_scale"]


def test_what_the_jackknife_cannot_take_is_one_line():
    with pytest.raises(ConfigError, match="nuisance"):
        FitOptions(intervals="runs", nuisance=("v0",))
    with pytest.raises(ConfigError, match="runs"):
        FitOptions(intervals="bootstrap")
    J, y, theta, blocks = linear_problem(runs=4)
    with pytest.raises(ConfigError, match="at least 5 training runs"):
        covariance(J @ theta - y, J, len(y), blocks=blocks, method="runs")


def test_a_run_the_model_describes_differently_is_named():
    scales = [0.92, 0.92, 0.92, 0.92, 0.92, 0.78]
    runs, params = scaled_runs(scales)
    fit = optimize(KinematicSkidSteer(), runs, params, DT, max_iter=30)
    shifts = {r: s["cmd_scale"] for r, s in fit.run_shifts.items()}
    print(f"\nshifts {shifts}, interval {fit.intervals['cmd_scale']}")
    assert max(shifts, key=lambda r: abs(shifts[r])) == runs[-1].name and shifts[runs[-1].name] > 0
    warning = next(w for w in fit.warnings if w.startswith("the runs disagree"))
    assert "cmd_scale by +" in warning and runs[-1].name in warning and "fit.intervals: runs" in warning
    same = optimize(KinematicSkidSteer(), runs[:5], params, DT, max_iter=30)
    assert len(same.run_shifts) == 5
    assert not [w for w in same.warnings if w.startswith("the runs disagree")], same.warnings
    # with fewer runs than a Gauss-Newton step can leave out, no shifts and no such warning
    few = optimize(KinematicSkidSteer(), runs[2:], params, DT, max_iter=30)
    assert few.run_shifts == {} and not [w for w in few.warnings if w.startswith("the runs disagree")]


def test_beyond_an_interval():
    assert beyond_interval(0.3, 1.0, 0.8, 1.2) and beyond_interval(-0.3, 1.0, 0.8, 1.2)
    assert not beyond_interval(0.1, 1.0, 0.8, 1.2) and not beyond_interval(-0.1, 1.0, 0.8, 1.2)
    assert not beyond_interval(-1e9, 1.0, -math.inf, math.inf) and not beyond_interval(1e9, 1.0, -math.inf, math.inf)
