"""Exact Coulomb friction converges at stick/slip (issue 21.1): the cases of
benchmarks/bench_convergence.py beyond the ones tests/engine/test_engine_forward.py and
test_engine_adjoint.py already assert (the sliding stop, the incline, the landing into sticking, the
pallet traversal).

The mechanism, measured (benchmarks/README.md "bench_convergence.py"): a sliding contact on the
"newton" rows has its friction pinned to the cone, l~_par = lam_n, and the pinned value used to lag
lam_n by one iteration. Where the load of the sliding contacts moves with their friction (a box
spinning on an edge or a face, a wheel whose servo torque shifts the robot's weight) the lag
re-creates the stick/slip cycles: the iterate lands inside the cone, the next iteration classifies the
contact as sticking, its step leaves the cone, and so on. `SolverOptions.pin_coupled` (default) solves
the pinned magnitudes with the step (the Schur solution is affine in them: npin + 1 solves and a small
dense solve), so a sliding step lands on the cone. The robot's wheels take these rows only with
`pin_wheels_from` > 0 (4 recommended; off by default, see benchmarks/README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sysid.engine import SolverOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_convergence as bc  # noqa: E402


@pytest.mark.parametrize("case", ["landing-spin", "slide-spin"])
def test_spinning_box_converges_every_step(case: str) -> None:
    """A cube landing on an edge while spinning (mu 0.8, 16 Newton iterations) and a box sliding and
    spinning to a stop (mu 0.5, h = 0.02 s): every step below 1e-5 m/s with the default options
    (measured worst 3.1e-6 / 8.7e-7); with the lagged pins (pin_coupled=False) one landing step ends
    at 1.0e-2 and 17 % of the slide's steps above 1e-5 (worst 2.2e-4)."""
    new = bc.CASES[case](SolverOptions())
    old = bc.CASES[case](SolverOptions(pin_coupled=False))
    print(f"{case}: default worst {new.max():.1e} ({np.mean(new < 1e-5):.0%} below 1e-5), "
          f"pin_coupled=False worst {old.max():.1e} ({np.mean(old < 1e-5):.0%})")
    assert new.max() < 1e-5
    assert old.max() > 1e-4


@pytest.mark.parametrize("case", ["pallet-aniso", "pallet-soft"])
def test_robot_pallet_variants_converge(case: str) -> None:
    """The pallet traversal with anisotropic wheel friction and from a soft start (exact Coulomb,
    16 Newton iterations) with the wheels on the semismooth rows from iteration 4 (pin_wheels_from=4,
    not the default, benchmarks/README.md): every step below 1e-4 m/s (measured worst 1.3e-5 / 1.5e-5;
    the default options 0.83 / 0.42), at least 85 % below 1e-5 (measured 95 % / 90 %; the rest end at
    the float32 floor of the wheels' angular residual, 1-3e-5 m/s)."""
    r = bc.CASES[case](SolverOptions(pin_wheels_from=4))
    print(f"{case}: worst {r.max():.1e}, {np.mean(r < 1e-5):.0%} below 1e-5, {np.mean(r < 1e-6):.0%} below 1e-6")
    assert r.max() < 1e-4
    assert np.mean(r < 1e-5) >= 0.85
