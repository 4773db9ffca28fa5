"""Validated configuration of ``sysid fit`` / ``evaluate`` / ``sweep-dt``.

A config is a YAML mapping (see ``docs/fit.md`` and ``examples/fit.yaml``), read into
``FitConfig``: one dataclass per section (``SimulatorSection``, ``DataSection``, ``FitSection``
with its ``CalibrationSection`` and ``BaselineSection``, ``SweepSection``, ``OutputSection``),
each field commented with its YAML key, unit and default. Command-line flags are merged over it
(``FitConfig.merged``, flags win). ``FitConfig.from_mapping`` checks types and unknown keys;
``validate_static`` checks everything that can be known before computation (files, globs,
parameter names against the simulator, bounds, topics in the bags, a non-empty training set; the
run sources, the manifest and the bags' topics through `sysid.app.sources`);
``validate_runs`` checks the segments once runs are loaded, before any simulation.
Relative input paths are resolved against the config file's folder; outputs against the
current directory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ingest.fileio import read_yaml
from ingest.inputs import check_input_file, resolved
from sysid.app.sources import check_topics, expand_sources, read_manifest
from sysid.errors import ConfigError, DataError
from sysid.fit.options import FitOptions
from sysid.fit.params import DEFAULT_SPECS, Parameter, ParameterSet, Prior, check_domain, default_parameters

DEFAULT_DTS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
BASELINE = "kinematic"  # the simulator every accuracy figure is compared with (sysid.simulators.kinematic)
BASELINE_DT = 0.02  # [s] its timestep (a cheap explicit rollout: small steps cost little)
BASELINE_MAX_ITER = 50  # its LM evaluations (exact forward sensitivities: one rollout each)
ENGINE = "ostrich"  # the default simulator: the engine (sysid.simulators.ostrich)
ENGINE_DT = 0.1  # [s] its default timestep: on the held-out error's plateau (docs/fit.md, "Timestep sweep")
# fit.dt when a config does not set it: the simulator's own default timestep
DEFAULT_DT_OF = {ENGINE: ENGINE_DT, BASELINE: BASELINE_DT}
# parameters with the same physical meaning in the model and in the baseline: the baseline starts
# from the config's settings of these (nominal, bounds, frozen, prior); slip_speed is not among them
# (the engine's tyre slip speed, the baseline's traction time constant slip_speed / (mu g))
# odom_delay: the odometry observation model (sysid.simulators.observation), the same sensor for both models
BASELINE_SHARED = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass", "odom_delay")


def _check_keys(where: str, data: Mapping[str, Any], known: Sequence[str]) -> Mapping[str, Any]:
    """``data`` once checked to be a mapping of ``known`` keys only."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    return data


def _num(where: str, v: Any, positive: bool = False, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(f"{where} must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise ConfigError(f"{where} must be > 0, got {v!r}")
    if integer and int(v) != v:
        raise ConfigError(f"{where} must be an integer, got {v!r}")
    return int(v) if integer else float(v)


@dataclass
class ParamSpec:
    """Config overrides of one parameter (None = keep the default)."""

    nominal: float | None = None
    bounds: tuple[float, float] | None = None
    frozen: bool | None = None
    prior: Prior | None = None
    scale: str | None = None
    unit: str | None = None

    @classmethod
    def from_mapping(cls, name: str, data: Any) -> ParamSpec:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return cls(nominal=float(data))
        if data is None:
            return cls()
        _check_keys(f"parameters.{name}", data, ("nominal", "bounds", "frozen", "prior", "scale", "unit"))
        spec = cls()
        if "nominal" in data:
            spec.nominal = _num(f"parameters.{name}.nominal", data["nominal"])
        if "bounds" in data:
            b = data["bounds"]
            if not isinstance(b, list | tuple) or len(b) != 2:
                raise ConfigError(f"parameters.{name}.bounds must be [lower, upper], got {b!r}")
            lo, hi = (_num(f"parameters.{name}.bounds", x) for x in b)
            if not lo < hi:
                raise ConfigError(
                    f"parameters.{name}.bounds are reversed or empty: [{lo}, {hi}]; write [lower, upper] "
                    "with lower < upper"
                )
            check_domain(name, lo, hi, f"parameters.{name}")
            spec.bounds = (lo, hi)
        if "frozen" in data:
            if not isinstance(data["frozen"], bool):
                raise ConfigError(f"parameters.{name}.frozen must be true or false, got {data['frozen']!r}")
            spec.frozen = data["frozen"]
        if data.get("prior") is not None:
            pr = data["prior"]
            _check_keys(f"parameters.{name}.prior", pr, ("mean", "sigma", "std"))
            if ("sigma" in pr) == ("std" in pr):
                raise ConfigError(f"parameters.{name}.prior needs its standard deviation as std (or sigma), once")
            key = "std" if "std" in pr else "sigma"
            spec.prior = Prior(
                _num(f"parameters.{name}.prior.mean", pr.get("mean")),
                _num(f"parameters.{name}.prior.{key}", pr.get(key), positive=True),
            )
        if "scale" in data:
            spec.scale = str(data["scale"])
        if "unit" in data:
            spec.unit = str(data["unit"])
        return spec


def _fit_options(fit: Mapping[str, Any]) -> FitOptions:
    """``fit.tolerances: {ftol, xtol, gtol}``, ``fit.starts: N | {n, spread, seed, refine, per_batch}``,
    ``fit.intervals: ess | iid | runs`` and ``fit.nuisance: [names]`` as ``sysid.fit.options.FitOptions``."""
    kw: dict[str, Any] = {}
    tol = fit.get("tolerances") or {}
    _check_keys("fit.tolerances", tol, ("ftol", "xtol", "gtol"))
    for key, v in tol.items():
        kw[key] = _num(f"fit.tolerances.{key}", v, positive=True)
    st = fit.get("starts")
    if st is not None:
        if isinstance(st, Mapping):
            _check_keys("fit.starts", st, ("n", "spread", "seed", "refine", "per_batch"))
            st = dict(st)
        else:
            st = {"n": st}
        for key, attr, integer in (
            ("n", "starts", True),
            ("spread", "start_spread", False),
            ("seed", "start_seed", True),
            ("refine", "refine", True),
            ("per_batch", "starts_per_batch", True),
        ):
            if key in st:
                kw[attr] = _num(f"fit.starts.{key}" if key != "n" else "fit.starts", st[key], integer=integer)
    if fit.get("intervals") is not None:
        kw["intervals"] = str(fit["intervals"])
    nu = fit.get("nuisance")
    if nu is not None:
        if isinstance(nu, str):
            nu = [x.strip() for x in nu.split(",") if x.strip()]
        if not isinstance(nu, list | tuple) or not all(isinstance(x, str) for x in nu):
            raise ConfigError(f"fit.nuisance must be a list of names (e.g. [v0, w0, clock_offset]), got {nu!r}")
        kw["nuisance"] = tuple(nu)
    if fit.get("loss") is not None:
        kw["loss"] = str(fit["loss"])
    if fit.get("loss_scale") is not None:
        kw["loss_scale"] = _num("fit.loss_scale", fit["loss_scale"], positive=True)
    if fit.get("horizon") is not None:
        kw["horizon"] = _num("fit.horizon", fit["horizon"], positive=True)
    return FitOptions(**kw)


@dataclass
class SimulatorSection:
    """``simulator: NAME`` or ``simulator: {name, options}``."""

    name: str = ENGINE  # simulator.name: the registered simulator (sysid.simulators.protocol)
    options: dict[str, Any] = field(default_factory=dict)  # simulator.options: passed to its constructor


@dataclass
class DataSection:
    """``data``: the runs, the topic map, the ingest settings, pieces and odometry-jump screening."""

    train: list[str] = field(default_factory=list)  # data.train: paths / globs of the training runs
    held_out: list[str] = field(default_factory=list)  # data.held_out: paths / globs of the held-out runs
    manifest: str | None = None  # data.manifest: a run manifest (train / held-out splits, truth)
    topics: Any = None  # data.topics: ingest topic map, a path or a mapping; None auto-detects
    # data.ingest.dt [s]: the step the commands (and odometry) are resampled to; None keeps the native stamps
    ingest_dt: float | None = 0.01
    ingest_cache: bool = True  # data.ingest.cache: reuse the ingest cache beside each bag
    split: float | None = None  # data.split [s]: cut every run into pieces of about this length; None = whole runs
    # data.odometry_jumps.max_accel [m/s^2]: odometry jumps above this implied acceleration; None = no check
    jump_accel: float | None = 30.0
    jump_action: str = "report"  # data.odometry_jumps.action: "report" runs with odometry jumps, or "drop" them


@dataclass
class CalibrationSection:
    """``fit.calibration: bool | {enabled, parameter, segment, carry, max_curvature}``: the command-scale
    calibration on one segment kind before the fit."""

    enabled: bool = True  # fit.calibration.enabled (or fit.calibration: bool)
    parameter: str = "cmd_scale"  # fit.calibration.parameter: the parameter calibrated
    segment: str = "cruise"  # fit.calibration.segment: the segment kind it is calibrated on
    # fit.calibration.carry: how the calibrated value reaches the fit: "freeze" it, or "prior" N(value, its std)
    carry: str = "freeze"
    # fit.calibration.max_curvature [rad/m]: only chords whose measured heading turns less than this per
    # metre are compared (e.g. sysid.fit.calibration.STRAIGHT); None (default) compares every chord
    max_curvature: float | None = None


@dataclass
class BaselineSection:
    """``fit.baseline: bool | {enabled, dt, max_iter, parameters}``: the kinematic baseline fitted
    on the same training runs, scored beside the model."""

    enabled: bool = True  # fit.baseline.enabled (or fit.baseline: bool)
    dt: float = BASELINE_DT  # fit.baseline.dt [s]: its timestep
    max_iter: int = BASELINE_MAX_ITER  # fit.baseline.max_iter: its LM evaluations
    # fit.baseline.parameters: name -> overrides of the baseline's parameters
    parameters: dict[str, ParamSpec] = field(default_factory=dict)


@dataclass
class FitSection:
    """``fit``: the optimiser and its settings, weights, score window, calibration and baseline."""

    optimizer: str = "lm"  # fit.optimizer: "lm" | "adam"
    dt: float = ENGINE_DT  # fit.dt [s]: the model's timestep during the fit (default: DEFAULT_DT_OF the simulator)
    max_iter: int = 50  # fit.max_iter: LM's budget of residual evaluations; Adam's steps
    lr: float = 0.03  # fit.lr: Adam's learning rate
    lever_arm: float = 0.5  # fit.lever_arm L [m]: the heading error counts as L * yaw error in the combined error
    prior_scale: float = 0.01  # fit.prior_scale [m]: one prior std costs as much as this combined error
    # fit.tolerances / starts / intervals / nuisance / loss / loss_scale, as sysid.fit.options.FitOptions
    options: FitOptions = field(default_factory=FitOptions)
    # fit.jacobian: the engine's Gauss-Newton Jacobian, tangent (forward sensitivities) | fd; None: its default
    jacobian: str | None = None
    # fit.workers: Ray workers of a multi-start fit and of the sweep (1: serial in this process)
    workers: int | None = 1
    ray_address: str | None = None  # --ray-address only (no YAML key): join that cluster instead of a local one
    weights: dict[str, float] = field(default_factory=dict)  # fit.weights: run name -> weight
    segment: str | None = None  # fit.segment: score window of the fit and of the evaluation; None = whole run
    calibration: CalibrationSection = field(default_factory=CalibrationSection)  # fit.calibration
    baseline: BaselineSection = field(default_factory=BaselineSection)  # fit.baseline


@dataclass
class SweepSection:
    """``sweep: bool | {enabled, dts, runs}``: the timestep sweep after the fit."""

    enabled: bool = True  # sweep.enabled (or sweep: bool)
    dts: list[float] = field(default_factory=lambda: list(DEFAULT_DTS))  # sweep.dts [s]: the timesteps swept
    runs: str = "held_out"  # sweep.runs: "held_out" | "train" | "all"


@dataclass
class OutputSection:
    """``output: {params, report, results}``: where the products are written (relative to the cwd)."""

    params: str | None = None  # output.params: the fitted parameter file (YAML)
    report: str | None = None  # output.report: the HTML report
    results: str | None = None  # output.results: the results document (JSON)


@dataclass
class CVSection:
    """``cv: {folds, blocks, gap, train_per_fold, held_out_per_fold}``: how ``sysid cv`` forms its folds
    (sysid.app.cv; the command line's --folds, --blocks, ... override it)."""

    # cv.folds: "loo" | K (K folds of consecutive runs in the config's order) | "blocks" | a list of folds,
    # each a list of run names held out or a mapping {held_out: [...], train: [...]}
    folds: Any = "loo"
    blocks: int = 3  # cv.blocks: with folds: blocks, the runs in name order cut into this many contiguous blocks
    gap: int = 0  # cv.gap: with folds: blocks, runs beside a held-out block kept out of its training
    train_per_fold: int | None = None  # cv.train_per_fold: at most this many training runs, evenly spread
    held_out_per_fold: int | None = None  # cv.held_out_per_fold: at most this many held-out runs, evenly spread


@dataclass
class FitConfig:
    """Everything ``sysid fit`` needs, nested like its YAML (one dataclass per section); see
    ``docs/fit.md`` for the meaning of each setting."""

    robot: str = "helhest"  # robot: a bundled robot's name or a path to robot.yaml / a URDF
    simulator: SimulatorSection = field(default_factory=SimulatorSection)
    data: DataSection = field(default_factory=DataSection)
    parameters: dict[str, ParamSpec] = field(default_factory=dict)  # parameters: name -> overrides of the model's
    fit: FitSection = field(default_factory=FitSection)
    sweep: SweepSection = field(default_factory=SweepSection)
    output: OutputSection = field(default_factory=OutputSection)
    cv: CVSection = field(default_factory=CVSection)
    truth: dict[str, float] = field(default_factory=dict)  # truth: known true values (synthetic data)
    base_dir: Path = field(default_factory=Path.cwd)  # the config file's folder: relative inputs resolve here
    source: str = "<defaults>"  # the config file (for messages)

    KNOWN = ("robot", "simulator", "data", "parameters", "fit", "sweep", "output", "cv", "truth")

    @classmethod
    def from_file(cls, path: str | Path) -> FitConfig:
        p = Path(path)
        data = read_yaml(p, ConfigError, "config file") or {}
        try:
            return cls.from_mapping(data, base_dir=p.resolve().parent, source=str(p))
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a value of the wrong kind
            raise ConfigError(f"config file {str(p)!r}: a value has the wrong type or shape ({exc}); "
                              "see docs/fit.md for the format") from exc

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], base_dir: Path | None = None, source: str = "<mapping>"
    ) -> FitConfig:
        """The config of a fit YAML's mapping: each top-level section read by its own reader
        (``SECTIONS``, in this order: a later section may depend on an earlier one, as fit.jacobian
        on the simulator)."""
        _check_keys("config", data, cls.KNOWN)
        cfg = cls(base_dir=base_dir or Path.cwd(), source=source)
        if "robot" in data:
            cfg.robot = str(data["robot"])
        for read in SECTIONS:
            read(cfg, data)
        return cfg

    def copy(self) -> FitConfig:
        """A copy with copies of the sections (editing a section of the copy leaves this config as it
        is); the values themselves (lists, dicts) are shared, as ``dataclasses.replace`` shares them."""
        fit = dataclasses.replace(
            self.fit,
            calibration=dataclasses.replace(self.fit.calibration),
            baseline=dataclasses.replace(self.fit.baseline),
        )
        return dataclasses.replace(
            self,
            simulator=dataclasses.replace(self.simulator),
            data=dataclasses.replace(self.data),
            fit=fit,
            sweep=dataclasses.replace(self.sweep),
            output=dataclasses.replace(self.output),
            cv=dataclasses.replace(self.cv),
        )

    def replaced(self, changes: Mapping[str, Any]) -> FitConfig:
        """A copy (``copy``) with the settings named by dotted path replaced, e.g.
        ``{"fit.dt": 0.01, "sweep.enabled": False, "truth": {}}``; an unknown path is a KeyError."""
        out = self.copy()
        for path, value in changes.items():
            *sections, name = path.split(".")
            owner: Any = out
            for section in sections:
                owner = getattr(owner, section)
            if not dataclasses.is_dataclass(owner) or name not in {f.name for f in dataclasses.fields(owner)}:
                raise KeyError(f"FitConfig has no setting {path!r}")
            setattr(owner, name, value)
        return out

    def merged(self, overrides: Mapping[str, Any]) -> FitConfig:
        """A copy with the given (non-None) settings replaced (dotted paths, as ``replaced``):
        command-line flags win over the file."""
        return self.replaced({k: v for k, v in overrides.items() if v is not None})

    # -- helpers -----------------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """An input path of the config: relative to the config file's folder (``base_dir``), ``~``
        expanded, ``..`` and symlinks resolved, so messages name the file once, without ``..``."""
        p = Path(path).expanduser()
        return resolved(p if p.is_absolute() else self.base_dir / p)

    def robot_path(self) -> Path:
        """``models/<robot>/robot.yaml`` (searched from the config folder up, then the cwd) or a path."""
        p = Path(self.robot)
        if p.suffix in (".yaml", ".yml", ".urdf"):
            rp = self.resolve(self.robot)
            return check_input_file(rp, "robot description", ConfigError, None if p.suffix == ".urdf" else "yaml")
        for base in [self.base_dir, *self.base_dir.parents, Path.cwd(), *bundled_model_roots()]:
            cand = base / "models" / self.robot / "robot.yaml"
            if cand.is_file():
                return cand
        bundled = sorted({p.parent.name for r in bundled_model_roots() for p in (r / "models").glob("*/robot.yaml")})
        raise ConfigError(
            f"robot {self.robot!r}: no models/{self.robot}/robot.yaml above {self.base_dir}, in the "
            f"current folder or among the bundled robots {bundled}; give robot: <path to robot.yaml>"
        )

    def load_robot(self) -> dict[str, Any]:
        """The robot.yaml mapping of the robot (`sysid.robot.robot_mapping`, the one reader; its
        RobotDescriptionError is a ConfigError)."""
        from sysid.robot import robot_mapping

        return robot_mapping(self.robot_path())

    def robot_name(self) -> str:
        return Path(self.robot).parent.name if Path(self.robot).suffix in (".yaml", ".yml", ".urdf") else self.robot


# -- the sections of a fit YAML ------------------------------------------------------------------


def _read_simulator(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``simulator: NAME`` or ``simulator: {name, options}``."""
    sim = data.get("simulator")
    if isinstance(sim, str):
        cfg.simulator.name = sim
    elif sim is not None:
        _check_keys("simulator", sim, ("name", "options"))
        cfg.simulator.name = str(sim.get("name", cfg.simulator.name))
        opts = sim.get("options") or {}
        if not isinstance(opts, Mapping):
            raise ConfigError("simulator.options must be a mapping")
        cfg.simulator.options = dict(opts)


def _read_data(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``data``: the runs (train, held_out, manifest), topic map, ingest settings, pieces, jump screening."""
    d = data.get("data") or {}
    _check_keys("data", d, ("train", "held_out", "manifest", "topics", "ingest", "split", "odometry_jumps"))
    if d.get("split") is not None:
        cfg.data.split = _num("data.split", d["split"], positive=True)
    jumps = d.get("odometry_jumps") or {}
    if not isinstance(jumps, Mapping):
        raise ConfigError("data.odometry_jumps must be a mapping {max_accel: m/s^2 or null, action: report|drop}")
    _check_keys("data.odometry_jumps", jumps, ("max_accel", "action"))
    if "max_accel" in jumps:
        ma = jumps["max_accel"]
        cfg.data.jump_accel = None if ma is None else _num("data.odometry_jumps.max_accel", ma, positive=True)
    if "action" in jumps:
        cfg.data.jump_action = str(jumps["action"])
    for key in ("train", "held_out"):
        v = d.get(key) or []
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"data.{key} must be a list of paths or glob patterns")
        setattr(cfg.data, key, list(v))
    cfg.data.manifest = d.get("manifest")
    cfg.data.topics = d.get("topics")
    ing = d.get("ingest") or {}
    _check_keys("data.ingest", ing, ("dt", "cache"))
    if "dt" in ing:
        cfg.data.ingest_dt = None if ing["dt"] is None else _num("data.ingest.dt", ing["dt"], positive=True)
    if "cache" in ing:
        cfg.data.ingest_cache = bool(ing["cache"])


def _read_parameters(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``parameters``: name -> {nominal, bounds, frozen, prior} of the model."""
    params = data.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ConfigError("parameters must be a mapping name -> {nominal, bounds, frozen, prior}")
    cfg.parameters = {str(k): ParamSpec.from_mapping(str(k), v) for k, v in params.items()}


def _read_fit(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``fit``: optimiser, timestep [s], iterations, tolerances, starts, weights, score window, ...;
    then its ``calibration`` and ``baseline`` subsections."""
    fit = data.get("fit") or {}
    _check_keys(
        "fit",
        fit,
        (
            "optimizer",
            "dt",
            "max_iter",
            "lr",
            "lever_arm",
            "prior_scale",
            "weights",
            "segment",
            "calibration",
            "baseline",
            "tolerances",
            "starts",
            "intervals",
            "nuisance",
            "jacobian",
            "loss",
            "loss_scale",
            "horizon",
            "workers",
        ),
    )
    cfg.fit.options = _fit_options(fit)
    if fit.get("jacobian") is not None:
        cfg.fit.jacobian = str(fit["jacobian"])
        if cfg.fit.jacobian not in ("tangent", "fd"):
            raise ConfigError(f"fit.jacobian must be 'tangent' (the engine's forward sensitivities) or 'fd' "
                              f"(central differences), got {cfg.fit.jacobian!r}")
        if cfg.simulator.name != "ostrich":
            raise ConfigError(f"fit.jacobian applies to the engine (simulator: ostrich), not to {cfg.simulator.name!r}")
    if "optimizer" in fit:
        cfg.fit.optimizer = str(fit["optimizer"])
    if "dt" not in fit:  # a simulator of another package: the baseline's small step
        cfg.fit.dt = DEFAULT_DT_OF.get(cfg.simulator.name, BASELINE_DT)
    for key, pos, integer in (
        ("dt", True, False),
        ("max_iter", True, True),
        ("lr", True, False),
        ("lever_arm", False, False),
        ("prior_scale", True, False),
        ("workers", True, True),
    ):
        if key in fit:
            setattr(cfg.fit, key, _num(f"fit.{key}", fit[key], positive=pos, integer=integer))
    if cfg.fit.lever_arm < 0:
        raise ConfigError(f"fit.lever_arm must be a length >= 0 [m] (the heading error's weight), "
                          f"got {cfg.fit.lever_arm:g}")
    w = fit.get("weights") or {}
    if not isinstance(w, Mapping):
        raise ConfigError("fit.weights must be a mapping run name -> weight")
    cfg.fit.weights = {str(k): _num(f"fit.weights.{k}", v, positive=True) for k, v in w.items()}
    cfg.fit.segment = fit.get("segment")
    _read_calibration(cfg, fit)
    _read_baseline(cfg, fit)


def _switchable(where: str, value: Any, section: CalibrationSection | BaselineSection | SweepSection,
                keys: Sequence[str]) -> Mapping[str, Any] | None:
    """A section written ``true`` / ``false`` (sets its ``enabled``; None returned) or as a mapping of
    ``keys`` (returned once its keys are checked); None when absent."""
    if isinstance(value, bool):
        section.enabled = value
        return None
    if value is None:
        return None
    return _check_keys(where, value, keys)


def _read_calibration(cfg: FitConfig, fit: Mapping[str, Any]) -> None:
    """``fit.calibration: bool | {enabled, parameter, segment, carry, max_curvature}``."""
    sec = cfg.fit.calibration
    cal = _switchable("fit.calibration", fit.get("calibration"), sec,
                      ("enabled", "parameter", "segment", "carry", "max_curvature"))
    if cal is not None:
        sec.enabled = bool(cal.get("enabled", True))
        sec.parameter = str(cal.get("parameter", sec.parameter))
        sec.segment = str(cal.get("segment", sec.segment))
        sec.carry = str(cal.get("carry", sec.carry))
        if sec.carry not in ("freeze", "prior"):
            raise ConfigError(f"fit.calibration.carry must be 'freeze' or 'prior', got {sec.carry!r}")
        if "max_curvature" in cal:
            v = cal["max_curvature"]
            sec.max_curvature = None if v is None else _num("fit.calibration.max_curvature", v, positive=True)


def _read_baseline(cfg: FitConfig, fit: Mapping[str, Any]) -> None:
    """``fit.baseline: bool | {enabled, dt, max_iter, parameters}`` (the kinematic baseline)."""
    sec = cfg.fit.baseline
    base = _switchable("fit.baseline", fit.get("baseline"), sec, ("enabled", "dt", "max_iter", "parameters"))
    if base is not None:
        en = base.get("enabled", True)
        if not isinstance(en, bool):
            raise ConfigError(f"fit.baseline.enabled must be true or false, got {en!r}")
        sec.enabled = en
        if "dt" in base:
            sec.dt = _num("fit.baseline.dt", base["dt"], positive=True)
        if "max_iter" in base:
            sec.max_iter = int(_num("fit.baseline.max_iter", base["max_iter"], positive=True, integer=True))
        bp = base.get("parameters") or {}
        if not isinstance(bp, Mapping):
            raise ConfigError("fit.baseline.parameters must be a mapping name -> {nominal, bounds, frozen, prior}")
        try:
            sec.parameters = {str(k): ParamSpec.from_mapping(str(k), v) for k, v in bp.items()}
        except ConfigError as exc:
            raise ConfigError(f"fit.baseline.{exc}") from exc


def _read_sweep(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``sweep: bool | {enabled, dts [s], runs}``."""
    sec = cfg.sweep
    sw = _switchable("sweep", data.get("sweep"), sec, ("enabled", "dts", "runs"))
    if sw is not None:
        sec.enabled = bool(sw.get("enabled", True))
        if "dts" in sw:
            sec.dts = [_num("sweep.dts", x, positive=True) for x in (sw["dts"] or [])]
        sec.runs = str(sw.get("runs", sec.runs))


def _read_output(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``output: {params, report, results}`` paths."""
    out = data.get("output") or {}
    _check_keys("output", out, ("params", "report", "results"))
    cfg.output.params, cfg.output.report, cfg.output.results = out.get("params"), out.get("report"), out.get("results")


def _read_cv(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``cv: {folds, blocks, gap, train_per_fold, held_out_per_fold}`` (``sysid cv``'s folds)."""
    cv = data.get("cv") or {}
    if not isinstance(cv, Mapping):
        raise ConfigError(f"cv must be a mapping {{folds, blocks, gap, train_per_fold, held_out_per_fold}}, got {cv!r}")
    _check_keys("cv", cv, ("folds", "blocks", "gap", "train_per_fold", "held_out_per_fold"))
    sec = cfg.cv
    if "folds" in cv:
        from sysid.app.choices import parse_folds

        sec.folds = parse_folds(cv["folds"])
    if "blocks" in cv:
        sec.blocks = int(_num("cv.blocks", cv["blocks"], positive=True, integer=True))
    if "gap" in cv:
        sec.gap = int(_num("cv.gap", cv["gap"], integer=True))
        if sec.gap < 0:
            raise ConfigError(f"cv.gap must be >= 0 runs, got {sec.gap}")
    for key in ("train_per_fold", "held_out_per_fold"):
        if cv.get(key) is not None:
            setattr(sec, key, int(_num(f"cv.{key}", cv[key], positive=True, integer=True)))


def _read_truth(cfg: FitConfig, data: Mapping[str, Any]) -> None:
    """``truth``: known true parameter values (synthetic data)."""
    truth = data.get("truth") or {}
    cfg.truth = {str(k): _num(f"truth.{k}", v) for k, v in truth.items()}


# The readers of a fit YAML's sections, in the order FitConfig.from_mapping applies them.
SECTIONS: tuple[Callable[[FitConfig, Mapping[str, Any]], None], ...] = (
    _read_simulator, _read_data, _read_parameters, _read_fit, _read_sweep, _read_output, _read_cv, _read_truth,
)


def bundled_model_roots() -> list[Path]:
    """Folders holding the bundled ``models/<robot>/robot.yaml``, found from the package wherever the
    command runs: an installed wheel's ``sysid/models`` (pyproject: package ``sysid.models``), else the
    source checkout's ``models/`` beside the package (an editable install or a bare checkout)."""
    from ingest.bundled import models_dir

    models = models_dir()
    return [models.parent] if models.is_dir() else []


class _ParameterFields(TypedDict):
    """`Parameter`'s fields as `build_parameters` gathers them (its defaults where absent)."""

    nominal: float
    lower: float
    upper: float
    frozen: NotRequired[bool]
    prior: NotRequired[Prior | None]
    unit: NotRequired[str]
    description: NotRequired[str]
    scale: NotRequired[str]


def build_parameters(cfg: FitConfig, robot: Mapping[str, Any], accepted: Sequence[str]) -> ParameterSet:
    """Default parameters (those the simulator accepts) with the config's overrides applied.

    Raises ConfigError for a parameter unknown to the simulator or a nominal outside its bounds.
    """
    unknown = [n for n in cfg.parameters if n not in accepted]
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown}: simulator {cfg.simulator.name!r} accepts {list(accepted)}")
    names = [n for n in DEFAULT_SPECS if n in accepted] + [n for n in cfg.parameters if n not in DEFAULT_SPECS]
    base = default_parameters(robot, [n for n in names if n in DEFAULT_SPECS])
    out = []
    for n in names:
        spec = cfg.parameters.get(n, ParamSpec())
        kw: _ParameterFields
        if n in base:
            p = base[n]
            kw = _ParameterFields(
                nominal=p.nominal,
                lower=p.lower,
                upper=p.upper,
                frozen=p.frozen,
                prior=p.prior,
                unit=p.unit,
                description=p.description,
                scale=p.scale,
            )
        else:
            if spec.nominal is None or spec.bounds is None:
                raise ConfigError(f"parameter {n!r} has no default: give its nominal and bounds in the config")
            kw = _ParameterFields(nominal=spec.nominal, lower=spec.bounds[0], upper=spec.bounds[1])
        if spec.nominal is not None:
            kw["nominal"] = spec.nominal
        if spec.bounds is not None:
            kw["lower"], kw["upper"] = spec.bounds
        if spec.frozen is not None:
            kw["frozen"] = spec.frozen
        if spec.prior is not None:
            kw["prior"] = spec.prior
        if spec.scale is not None:
            kw["scale"] = spec.scale
        if spec.unit is not None:
            kw["unit"] = spec.unit
        out.append(Parameter(name=n, **kw))
    return ParameterSet(out)


def build_baseline_parameters(cfg: FitConfig, robot: Mapping[str, Any], accepted: Sequence[str]) -> ParameterSet:
    """The kinematic baseline's parameters: its defaults (kp, mu, mu_lateral, cmd_scale free,
    chassis_mass frozen), the config's settings of the parameters it shares with the model
    (``BASELINE_SHARED``), then ``fit.baseline.parameters`` (any name the baseline accepts, e.g.
    ``turn_speed`` or its own ``slip_speed``, with nominal and bounds). Raises ConfigError."""
    unknown = [n for n in cfg.fit.baseline.parameters if n not in accepted]
    if unknown:
        raise ConfigError(f"fit.baseline.parameters: unknown parameter(s) {unknown}; the {BASELINE} baseline "
                          f"accepts {list(accepted)}")
    specs = {n: s for n, s in cfg.parameters.items() if n in BASELINE_SHARED and n in accepted}
    specs.update(cfg.fit.baseline.parameters)
    sub = cfg.replaced({"parameters": specs, "simulator.name": BASELINE})
    try:
        return build_parameters(sub, robot, accepted)
    except ConfigError as exc:
        raise ConfigError(f"fit.baseline: {exc}") from exc


def validate_static(
    cfg: FitConfig, accepted: Sequence[str], robot: Mapping[str, Any], need_train: bool = True
) -> tuple[ParameterSet, list[Path], list[Path]]:
    """All checks possible before loading data; returns (parameters, train sources, held-out sources)."""
    if cfg.fit.optimizer not in ("lm", "adam"):
        raise ConfigError(f"fit.optimizer must be 'lm' or 'adam', got {cfg.fit.optimizer!r}")
    if cfg.sweep.runs not in ("held_out", "train", "all"):
        raise ConfigError(f"sweep.runs must be 'held_out', 'train' or 'all', got {cfg.sweep.runs!r}")
    if cfg.sweep.enabled and not cfg.sweep.dts:
        raise ConfigError("sweep.dts is empty; give timesteps [s] or disable the sweep")
    if cfg.data.split is not None and not (math.isfinite(cfg.data.split) and cfg.data.split > 0):
        raise ConfigError(f"data.split must be a positive number of seconds, got {cfg.data.split}")
    if cfg.data.jump_action not in ("report", "drop"):
        raise ConfigError(f"data.odometry_jumps.action must be 'report' or 'drop', got {cfg.data.jump_action!r}")
    if cfg.data.jump_accel is not None and not (math.isfinite(cfg.data.jump_accel) and cfg.data.jump_accel > 0):
        raise ConfigError(f"data.odometry_jumps.max_accel must be a positive acceleration [m/s^2] or null, "
                          f"got {cfg.data.jump_accel}")
    if cfg.data.jump_action == "drop" and cfg.data.jump_accel is None:
        raise ConfigError("data.odometry_jumps.action: drop needs max_accel (the check is off with null)")
    params = build_parameters(cfg, robot, accepted)
    if cfg.fit.calibration.enabled and cfg.fit.calibration.parameter not in params:
        raise ConfigError(
            f"fit.calibration.parameter {cfg.fit.calibration.parameter!r} is not a parameter of this fit "
            f"({list(params.names)})"
        )
    unknown_truth = [n for n in cfg.truth if n not in accepted]
    if unknown_truth:
        raise ConfigError(f"truth: unknown parameter(s) {unknown_truth}")
    train_pats, held_pats = list(cfg.data.train), list(cfg.data.held_out)
    if cfg.data.manifest:
        mt, mh, truth = read_manifest(cfg)
        train_pats = train_pats or mt
        held_pats = held_pats or mh
        for k, v in truth.items():
            if k in accepted:
                cfg.truth.setdefault(k, v)
    if need_train and not train_pats:
        raise ConfigError("the training set is empty: give data.train (or --train) or a manifest with a train split")
    train = expand_sources(cfg, train_pats, "data.train")
    held = expand_sources(cfg, held_pats, "data.held_out")
    if need_train and not train:
        raise ConfigError("the training set is empty after expanding data.train")
    both = {p.resolve() for p in train} & {p.resolve() for p in held}
    if both:
        raise ConfigError(f"run(s) {[str(p) for p in sorted(both)]} are in both the training and held-out sets")
    if need_train and params.free_names == () and not cfg.fit.calibration.enabled:
        raise ConfigError("every parameter is frozen and calibration is off: there is nothing to fit")
    check_topics(cfg, train + held)
    return params, train, held


MAX_STEPS = 2_000_000  # simulator steps of one replay: each step's state is kept for the gradients


def check_steps(runs: Sequence[Any], dts: Sequence[tuple[str, float]]) -> None:
    """ConfigError when a timestep would replay the longest run in more than `MAX_STEPS` steps (the
    memory of a replay grows with its steps): said before any simulation, with the figures."""
    if not runs:
        return
    longest = max(runs, key=lambda r: float(r.duration))
    for what, dt in dts:
        steps = float(longest.duration) / dt
        if steps > MAX_STEPS:
            raise ConfigError(
                f"{what} = {dt:g} s would replay run {longest.name!r} ({float(longest.duration):.1f} s) in {steps:.3g} "
                f"steps, more than {MAX_STEPS:,} (each step's state is kept); give a timestep of at least "
                f"{float(longest.duration) / MAX_STEPS:.2g} s (the engine's default is {ENGINE_DT:g} s) or cut the "
                "runs into pieces with data.split")


def validate_runs(cfg: FitConfig, train: Sequence[Any], held: Sequence[Any]) -> None:
    """Checks that need the loaded runs (segments, weights, the steps of a replay), still before any simulation."""
    dts = [("fit.dt", cfg.fit.dt)]
    if cfg.fit.baseline.enabled:
        dts.append(("fit.baseline.dt", cfg.fit.baseline.dt))
    if cfg.sweep.enabled and cfg.sweep.dts:
        dts.append(("sweep.dts", min(cfg.sweep.dts)))
    check_steps(list(train) + list(held), dts)
    names = [r.name for r in list(train) + list(held)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DataError(f"run names must be unique; duplicated: {dup} (rename the files or runs)")
    names += [r.meta["split_of"] for r in list(train) + list(held) if "split_of" in r.meta]
    unknown_w = [n for n in cfg.fit.weights if n not in names]
    if unknown_w:
        raise ConfigError(f"fit.weights names unknown run(s) {unknown_w}; runs are {names}")
    if cfg.fit.segment is not None:
        lacking = [r.name for r in list(train) + list(held) if cfg.fit.segment not in r.segments]
        if lacking:
            raise DataError(
                f"fit.segment {cfg.fit.segment!r} is missing in run(s) {lacking}; set fit.segment: null to score "
                "whole runs"
            )
    if cfg.fit.calibration.enabled and not any(cfg.fit.calibration.segment in r.segments for r in train):
        raise DataError(
            f"no training run has a {cfg.fit.calibration.segment!r} segment to calibrate "
            f"{cfg.fit.calibration.parameter!r} on; disable it with --no-calibration (fit.calibration.enabled: false)"
        )
