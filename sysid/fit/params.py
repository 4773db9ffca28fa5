"""Identifiable physical parameters (mujoco.sysid style) and the identified-parameter file.

A ``Parameter`` has a nominal (initial) value, box bounds, a frozen flag and an optional Gaussian
prior; a ``ParameterSet`` is an ordered collection of them that packs the free ones into a vector
for the optimisers. ``save_params`` / ``load_params`` write and read
``models/<robot>/params-<date>.yaml``; writes are atomic (temp file + rename).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ingest.fileio import atomic_write_text  # noqa: F401  (re-exported: callers import it from here)
from ingest.fileio import json_safe as _plain
from sysid.errors import ConfigError, ResultsError
from sysid.robot.description import NOMINALS

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Prior:
    """Gaussian prior N(mean, sigma^2) on a parameter, in the parameter's own unit (config:
    ``prior: {mean, std}``). ``sysid.fit.residuals`` adds it as the residual row
    ``prior_scale (theta - mean) / sigma`` and counts its information in the covariance."""

    mean: float
    sigma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ConfigError(f"prior needs a finite mean and a sigma > 0, got mean={self.mean} sigma={self.sigma}")


@dataclass
class Parameter:
    """One scalar physical parameter.

    ``nominal`` is the initial guess, ``lower``/``upper`` the box bounds (``lower < upper``),
    ``value`` the current value (starts at nominal). ``frozen`` parameters keep their value and
    are not optimised. ``unit`` and ``description`` are for humans and the report.
    """

    name: str
    nominal: float
    lower: float
    upper: float
    frozen: bool = False
    prior: Prior | None = None
    unit: str = ""
    description: str = ""
    value: float = field(default=float("nan"))
    scale: str = "auto"  # optimiser coordinates: "linear", "log" or "auto" (log when bounds span >= 20x)

    def __post_init__(self) -> None:
        for key in ("nominal", "lower", "upper"):
            v = getattr(self, key)
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"parameter {self.name!r}: {key} must be a finite number, got {v!r}")
        if not self.lower < self.upper:
            raise ConfigError(
                f"parameter {self.name!r}: bounds are reversed or empty (lower={self.lower} >= "
                f"upper={self.upper}); write them as [lower, upper] with lower < upper"
            )
        if not self.lower <= self.nominal <= self.upper:
            raise ConfigError(
                f"parameter {self.name!r}: nominal {self.nominal} lies outside its bounds [{self.lower}, {self.upper}]"
            )
        check_domain(self.name, self.lower, self.upper)
        if isinstance(self.value, float) and math.isnan(self.value):
            self.value = float(self.nominal)
        self.nominal, self.lower, self.upper = float(self.nominal), float(self.lower), float(self.upper)
        self.value = float(self.value)
        if self.scale not in ("auto", "linear", "log"):
            raise ConfigError(f"parameter {self.name!r}: scale must be 'auto', 'linear' or 'log', got {self.scale!r}")
        if self.scale == "log" and self.lower <= 0:
            raise ConfigError(f"parameter {self.name!r}: a log scale needs lower > 0, got {self.lower}")

    @property
    def log_scale(self) -> bool:
        """Whether the optimisers move this parameter in log coordinates (for gains spanning decades)."""
        if self.scale == "auto":
            return self.lower > 0 and self.upper / self.lower >= 20
        return self.scale == "log"

    @property
    def span(self) -> float:
        return self.upper - self.lower

    def at_bound(self, rel_tol: float = 1e-3) -> str | None:
        """'lower' or 'upper' when the value sits within ``rel_tol`` of the span of a bound
        (measured in log coordinates for log-scaled parameters)."""
        if self.log_scale:
            lo, hi, v = math.log(self.lower), math.log(self.upper), math.log(max(self.value, self.lower))
        else:
            lo, hi, v = self.lower, self.upper, self.value
        if v - lo <= rel_tol * (hi - lo):
            return "lower"
        if hi - v <= rel_tol * (hi - lo):
            return "upper"
        return None


# Defaults for the Helhest robot (nominals: sysid.robot.NOMINALS); nominal values are read from robot.yaml
# where it has them.
DEFAULT_SPECS: dict[str, dict[str, Any]] = {
    "kp": dict(nominal=NOMINALS["kp"], lower=10.0, upper=5000.0,
               unit="N m s/rad", description="wheel velocity-servo gain"),
    "mu": dict(nominal=NOMINALS["mu"], lower=0.05, upper=2.0,
               unit="1", description="longitudinal wheel-ground friction"),
    "mu_lateral": dict(nominal=NOMINALS["mu_lateral"], lower=0.05, upper=3.0,
                       unit="1", description="lateral wheel-ground friction"),
    "cmd_scale": dict(nominal=NOMINALS["cmd_scale"], lower=0.5, upper=1.5,
                      unit="1", description="wheel-command scale (motor tracking)"),
    "chassis_mass": dict(
        nominal=NOMINALS["chassis_mass"],
        lower=40.0,
        upper=200.0,
        frozen=True,
        unit="kg",
        description="chassis body mass (frozen by default: trades off against kp)",
    ),
}

# Units (and descriptions) of the parameters a simulator accepts without a default: they are fitted only
# when the config gives their nominal and bounds, so they are not in DEFAULT_SPECS (every entry there
# is a default parameter); ``unit_of`` serves both tables ("1": dimensionless).
EXTRA_UNITS: dict[str, dict[str, str]] = {
    "slip_speed": dict(unit="m/s", description="wheel friction slip speed (regularised Coulomb; 0 = exact)"),
    "slip_ratio": dict(unit="1", description="slip speed per rolling speed: v_s = slip_speed + slip_ratio r |w|"),
    "slip_speed_lat": dict(unit="m/s", description="lateral slip speed (combined-slip law)"),
    "slip_ratio_lat": dict(unit="1", description="lateral slip speed per rolling speed (combined-slip law)"),
    "cmd_trim": dict(unit="1", description="left/right command trim: left x (1 + trim), right x (1 - trim)"),
    "cmd_delay": dict(unit="s", description="delay of the wheel commands"),
    "torque_limit": dict(unit="N m", description="wheel servo torque limit (0 = none; smooth saturation)"),
    "ki": dict(unit="N m/rad", description="wheel servo integral gain (0 = a velocity servo; > 0: PI)"),
    "odom_delay": dict(unit="s", description="odometry translation delay (sysid.simulators.observation)"),
    "mu_ground": dict(unit="1", description="the ground's friction (simulator.options.friction_combine)"),
    "mu_pallet": dict(unit="1", description="the pallet's friction (simulator.options.friction_combine)"),
    "turn_speed": dict(unit="m/s", description="kinematic baseline: speed at which turning efficiency halves"),
}


# The physical domain of each parameter the package knows: (lowest, highest, whether the lowest is
# allowed, whether the highest is, what the parameter is). A parameter's bounds must lie inside it, so
# no fit or parameter file can reach a value the models cannot take; cmd_delay has none (a log's
# commands may lead or trail), nor has a parameter of another package's simulator. A simulator may
# need more (the engine: kp, mu, mu_lateral, chassis_mass > 0; its ``positive_parameters``).
INF = math.inf
DOMAINS: dict[str, tuple[float, float, bool, bool, str]] = {
    "kp": (0.0, INF, False, False, "a servo gain"),
    "mu": (0.0, INF, True, False, "a friction coefficient"),
    "mu_lateral": (0.0, INF, True, False, "a friction coefficient (the kinematic baseline's 0: turns fully)"),
    "cmd_scale": (0.0, INF, False, False, "a command scale (a negative one would reverse the wheels)"),
    "chassis_mass": (0.0, INF, False, False, "a mass"),
    "slip_speed": (0.0, INF, True, False, "a slip speed (0: exact Coulomb friction)"),
    "slip_speed_lat": (0.0, INF, True, False, "a slip speed"),
    "slip_ratio": (0.0, INF, True, False, "a slip ratio"),
    "slip_ratio_lat": (0.0, INF, True, False, "a slip ratio"),
    "cmd_trim": (-1.0, 1.0, False, False, "a left/right trim (each wheel's command keeps its sign)"),
    "torque_limit": (0.0, INF, True, False, "a torque limit (0: none)"),
    "ki": (0.0, INF, True, False, "an integral gain (0: a velocity servo)"),
    "odom_delay": (0.0, INF, True, False, "a delay"),
    "mu_ground": (0.0, INF, True, False, "a friction coefficient (0 under the max rule: the wheel's decides)"),
    "mu_pallet": (0.0, INF, True, False, "a friction coefficient (0 under the max rule: the wheel's decides)"),
    "turn_speed": (0.0, INF, False, False, "a speed"),
}


def domain_text(name: str) -> str:
    """The physical domain of a known parameter in words (``'> 0'``, ``'in (-1, 1)'``; '' when it has none)."""
    if name not in DOMAINS:
        return ""
    lo, hi, lo_in, hi_in, _what = DOMAINS[name]
    if math.isinf(hi):
        return f"{'>=' if lo_in else '>'} {lo:g}"
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def check_domain(name: str, lower: float, upper: float, where: str | None = None) -> None:
    """ConfigError when the bounds [lower, upper] of the parameter ``name`` reach outside its
    physical domain (`DOMAINS`): negative friction, a zero gain, a trim beyond +-1. ``where`` starts
    the message (default ``parameter '<name>'``)."""
    if name not in DOMAINS:
        return
    lo, hi, lo_in, hi_in, what = DOMAINS[name]
    inside_lo = lower >= lo if lo_in else lower > lo
    inside_hi = upper <= hi if hi_in else upper < hi
    if not (inside_lo and inside_hi):
        raise ConfigError(
            f"{where or f'parameter {name!r}'}: bounds [{lower:g}, {upper:g}] reach outside its physical domain: "
            f"{what} is "
            f"{domain_text(name)}; give bounds inside it"
        )


def unit_of(name: str) -> str:
    """The unit of a parameter known to the package ('' when unknown)."""
    return (DEFAULT_SPECS.get(name) or EXTRA_UNITS.get(name) or {}).get("unit", "")


def robot_nominals(robot: Mapping[str, Any] | None) -> dict[str, float]:
    """Nominal parameter values taken from a robot description (``models/<robot>/robot.yaml``)."""
    out: dict[str, float] = {}
    if not robot:
        return out
    try:
        if "servo" in robot and "kp" in robot["servo"]:
            out["kp"] = float(robot["servo"]["kp"])
        fr = robot.get("friction", {})
        if "mu" in fr:
            out["mu"] = float(fr["mu"])
        if "mu_lateral" in fr:
            out["mu_lateral"] = float(fr["mu_lateral"])
        if "chassis" in robot and "mass" in robot["chassis"]:
            out["chassis_mass"] = float(robot["chassis"]["mass"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"robot description has a malformed value: {exc}") from exc
    return out


class ParameterSet:
    """Ordered parameters; the free (non-frozen) ones form the optimisation vector."""

    def __init__(self, params: Iterable[Parameter]):
        self._p: dict[str, Parameter] = {}
        for p in params:
            if p.name in self._p:
                raise ConfigError(f"parameter {p.name!r} is defined twice")
            self._p[p.name] = p

    # container protocol
    def __getitem__(self, name: str) -> Parameter:
        return self._p[name]

    def __contains__(self, name: object) -> bool:
        return name in self._p

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._p.values())

    def __len__(self) -> int:
        return len(self._p)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._p)

    @property
    def free_names(self) -> tuple[str, ...]:
        return tuple(n for n, p in self._p.items() if not p.frozen)

    def copy(self) -> ParameterSet:
        return ParameterSet(dataclasses.replace(p) for p in self._p.values())

    def values(self) -> dict[str, float]:
        """Current values of all parameters (the ``theta`` passed to a simulator)."""
        return {n: p.value for n, p in self._p.items()}

    def nominals(self) -> dict[str, float]:
        return {n: p.nominal for n, p in self._p.items()}

    def free_vector(self) -> np.ndarray:
        return np.array([self._p[n].value for n in self.free_names], dtype=float)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) of the free parameters."""
        free = [self._p[n] for n in self.free_names]
        return np.array([p.lower for p in free]), np.array([p.upper for p in free])

    def with_free_vector(self, x: np.ndarray) -> dict[str, float]:
        """``theta`` with the free parameters replaced by ``x`` (does not modify the set)."""
        theta = self.values()
        for n, v in zip(self.free_names, np.asarray(x, dtype=float), strict=True):
            theta[n] = float(v)
        return theta

    def set_values(self, values: Mapping[str, float]) -> None:
        for n, v in values.items():
            self._p[n].value = float(v)

    def freeze(self, names: Iterable[str], frozen: bool = True) -> None:
        for n in names:
            self._p[n].frozen = frozen

    def table(self) -> str:
        """Plain-text table for the terminal."""
        rows = [f"{'name':<14}{'value':>12}{'nominal':>12}  {'bounds':<22}{'frozen':>7}"]
        for p in self:
            rows.append(
                f"{p.name:<14}{p.value:>12.5g}{p.nominal:>12.5g}  [{p.lower:.4g}, {p.upper:.4g}]"
                f"{'':<{max(0, 20 - len(f'[{p.lower:.4g}, {p.upper:.4g}]'))}}{'yes' if p.frozen else 'no':>7}"
            )
        return "\n".join(rows)


def default_parameters(robot: Mapping[str, Any] | None = None, names: Iterable[str] | None = None) -> ParameterSet:
    """The default identifiable parameters, with nominals from the robot description. The default
    bounds are the Helhest's; they widen (never narrow) to keep the same ratios to a robot's own
    nominal (a 40 kg Husky chassis, a 10 N m s/rad servo), so any robot's nominal lies inside."""
    nominal = robot_nominals(robot)
    out = []
    for n in names if names is not None else DEFAULT_SPECS:
        spec = dict(DEFAULT_SPECS[n])
        if n in nominal:
            ref = float(spec["nominal"])
            spec["nominal"] = nominal[n]
            if ref > 0 and nominal[n] > 0:
                spec["lower"] = min(float(spec["lower"]), nominal[n] * float(spec["lower"]) / ref)
                spec["upper"] = max(float(spec["upper"]), nominal[n] * float(spec["upper"]) / ref)
        out.append(Parameter(name=n, **spec))
    return ParameterSet(out)


# ---------------------------------------------------------------------------------------------
# Atomic writes and the identified-parameter file


def default_params_path(robot: str, root: str | os.PathLike[str] = ".", date: _dt.date | None = None) -> Path:
    """``models/<robot>/params-<YYYY-MM-DD>.yaml`` under ``root``."""
    date = date or _dt.datetime.now(_dt.UTC).date()
    return Path(root) / "models" / robot / f"params-{date.isoformat()}.yaml"


def save_params(
    path: str | os.PathLike[str],
    params: ParameterSet,
    *,
    robot: str,
    intervals: Mapping[str, tuple[float, float]] | None = None,
    std: Mapping[str, float] | None = None,
    metadata: Mapping[str, Any] | None = None,
    notes: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Write identified parameters with their bounds, confidence intervals and fit metadata;
    ``notes``: per parameter more keys of its entry (the fit's ``determined`` and ``ci95_reaches``:
    whether the runs determine it and which bounds its interval reaches)."""
    doc: dict[str, Any] = {
        "format": "sysid-params",
        "version": FORMAT_VERSION,
        "robot": robot,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "parameters": {},
    }
    for p in params:
        entry: dict[str, Any] = {
            "value": p.value,
            "nominal": p.nominal,
            "bounds": [p.lower, p.upper],
            "frozen": p.frozen,
        }
        unit = p.unit or unit_of(p.name)
        if unit:
            entry["unit"] = unit
        if p.prior is not None:
            entry["prior"] = {"mean": p.prior.mean, "sigma": p.prior.sigma}
        if std and p.name in std:
            entry["std"] = std[p.name]
        if intervals and p.name in intervals:
            entry["ci95"] = list(intervals[p.name])
        entry.update((notes or {}).get(p.name) or {})
        doc["parameters"][p.name] = entry
    if metadata:
        doc["metadata"] = dict(metadata)
    return atomic_write_text(path, yaml.safe_dump(_plain(doc), sort_keys=False))


def load_params(path: str | os.PathLike[str], accepted: Sequence[str] | None = None
                ) -> tuple[ParameterSet, dict[str, Any]]:
    """Read a parameter file written by ``save_params``; returns (parameters, whole document).

    Every entry is checked before it is used: a mapping with a finite ``value`` inside its
    ``bounds`` (the default bounds of a known parameter when it has none), bounds inside the
    parameter's physical domain (`check_domain`). ``accepted``: the names the simulator takes (a name
    outside them is refused, naming them); None: any name with bounds, or a known one without."""
    from ingest.inputs import check_input_file, read_yaml_file

    path = check_input_file(path, "parameter file", ConfigError, "yaml")  # missing, a folder, a pipe, a loop
    where = f"parameter file {str(path)!r}"
    doc = read_yaml_file(path, ResultsError, "parameter file")
    if not isinstance(doc, dict) or not isinstance(doc.get("parameters"), dict):
        raise ResultsError(f"{where} has no 'parameters' mapping (not written by sysid fit?)")
    known = list(accepted) if accepted is not None else [*DEFAULT_SPECS, *EXTRA_UNITS]
    out = []
    for name, e in doc["parameters"].items():
        if not isinstance(name, str) or (accepted is not None and name not in accepted):
            raise ConfigError(f"{where}: unknown parameter {name!r}; the simulator knows {', '.join(known)}")
        if not isinstance(e, dict):
            raise ResultsError(f"{where}: entry {name!r} must be a mapping such as {{value: 250, bounds: [20, 5000]}}, "
                               f"got {e!r}")
        if "bounds" not in e and name not in DEFAULT_SPECS:
            if name not in known:
                raise ConfigError(f"{where}: unknown parameter {name!r}; known: {', '.join(known)} (a parameter of "
                                  "another simulator needs its bounds: [lower, upper])")
            raise ResultsError(f"{where}: entry {name!r} has no bounds; give bounds: [lower, upper]")
        try:
            pr = e.get("prior")
            prior = Prior(float(pr["mean"]), float(pr["sigma"] if "sigma" in pr else pr["std"])) if pr else None
            spec = DEFAULT_SPECS.get(name, {})
            lo, hi = e.get("bounds", [spec.get("lower"), spec.get("upper")])
            value = _entry_number(where, name, "value", e["value"])
            lower, upper = (_entry_number(where, name, "bounds", v) for v in (lo, hi))
            nominal = _entry_number(where, name, "nominal", e.get("nominal", value))
            if not lower <= value <= upper:
                raise ConfigError(f"{where}: {name} value {value:g} lies outside its bounds [{lower:g}, {upper:g}]; "
                                  "fix the value or the bounds")
            p = Parameter(name=name, nominal=nominal, lower=lower, upper=upper, frozen=bool(e.get("frozen", False)),
                          prior=prior, unit=str(e.get("unit", "")), value=value)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"{where}: entry {name!r} is malformed ({exc})") from exc
        except ConfigError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from exc
        out.append(p)
    return ParameterSet(out), doc


def _entry_number(where: str, name: str, key: str, v: Any) -> float:
    """A number of a parameter file's entry: finite (``.nan`` / ``.inf`` are refused), not a bool."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(f"{where}: {name} {key} must be a finite number, got {v!r}")
    return float(v)
