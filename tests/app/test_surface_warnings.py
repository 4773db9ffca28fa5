"""A surface friction that a `friction_combine: max` fit leaves at or below the wheels' has no effect on any
contact (the larger of the two decides): the fit says so, with what to do, instead of a bare zero-column note."""

from __future__ import annotations

from pathlib import Path

from sysid.app.config import FitConfig
from sysid.app.fitting import surface_warnings, with_surface_warnings
from sysid.fit.optimizer import undetermined_prefixes
from sysid.fit.params import Parameter, ParameterSet

ROOT = Path(__file__).resolve().parents[2]


def _config(combine: str) -> FitConfig:
    return FitConfig.from_mapping({"robot": str(ROOT / "models/helhest/robot.yaml"),
                                   "simulator": {"name": "ostrich", "options": {"friction_combine": combine}}})


def _params(mu_pallet: float, frozen: bool = False) -> ParameterSet:
    return ParameterSet([Parameter(name="mu", nominal=0.7, lower=0.05, upper=2.0),
                         Parameter(name="mu_lateral", nominal=0.5, lower=0.05, upper=5.0),
                         Parameter(name="mu_pallet", nominal=mu_pallet, lower=0.05, upper=3.0, frozen=frozen)])


def test_a_pallet_friction_below_the_wheels_under_max_is_named() -> None:
    out = list(surface_warnings(_config("max"), _params(0.45)).values())
    assert len(out) == 1
    assert out[0].startswith("mu_pallet ended at 0.45, not above the wheels' friction (mu 0.7, mu_lateral 0.5)")
    assert "parameters.mu_pallet.nominal" in out[0]


def test_no_warning_where_the_surface_decides_or_the_rule_is_another() -> None:
    assert surface_warnings(_config("max"), _params(1.6)) == {}  # above both wheel directions
    assert surface_warnings(_config("max"), _params(0.6)) == {}  # above mu_lateral: decides sideways
    assert surface_warnings(_config("max"), _params(0.45, frozen=True)) == {}  # the user's value, not the fit's
    assert surface_warnings(_config("product"), _params(0.45)) == {}  # a product always depends on both


def test_the_surface_warning_replaces_the_optimizers_generic_one() -> None:
    """The optimizer names a zero Jacobian column without its cause; under max the surface warning says why and
    what to do, once: the generic warning for the same parameter goes, the others stay."""
    zero, loose = undetermined_prefixes("mu_pallet")
    other = undetermined_prefixes("kp")[1] + ": 95 % interval ..."
    fit_warnings = [zero + " (zero Jacobian column): ...", loose + ": ...", other]
    out = with_surface_warnings(_config("max"), _params(0.45), fit_warnings)
    assert out[0] == other and len(out) == 2 and out[1].startswith("mu_pallet ended at 0.45")
    assert with_surface_warnings(_config("max"), _params(1.6), fit_warnings) == fit_warnings
