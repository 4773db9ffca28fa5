"""The results document of a fit, typed: produced by the pipeline (`sysid.app.pipeline.run_fit`),
written as the results JSON (``report.json``), read back by the report renderer
(`sysid.app.report.render_report`) and printed by the command line (`sysid.cli.fit.print_fit`).

`FitResults` is the document's top level; its sections are the JSON's objects, typed as
``TypedDict`` (plain dicts at run time, so the JSON is exactly what they hold). ``to_dict`` gives
the JSON form with the keys in the written order; ``from_dict`` reads it back, also from results
files of earlier versions that lack sections (those read as empty). A `FitResults` also reads as
that mapping (``results["runs"]`` is ``results.runs``), so code written against the JSON form keeps
working on a fresh fit.

Units: lengths [m], angles [rad], times [s], losses [m^2] (the combined error's square).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from sysid import __version__
from sysid.errors import ConfigError, ResultsError

if TYPE_CHECKING:
    from sysid.app.config import FitConfig

RESULTS_FORMAT = "sysid-results"
RESULTS_VERSION = 1


class Metrics(TypedDict, total=False):
    """Open-loop replay error of one run [m, rad]: the combined error (mean xy + lever arm x yaw RMSE),
    mean and final xy distance, yaw and z RMSE."""

    combined: float | None
    mean_xy: float | None
    final_xy: float | None
    yaw_rmse: float | None
    z_rmse: float | None


class SolverHealth(TypedDict):
    """How the engine's Newton solve fared in a replay: the fraction of steps left unconverged and
    the worst step's residual [m/s]."""

    residual_max: float
    unconverged_steps: float


class RunEntry(TypedDict, total=False):
    """One replayed run (or piece of a run) of the fit: its trajectories (measured, replayed at the
    initial and the identified parameters; downsampled), metrics and metadata."""

    name: str
    run: str
    split: str  # "train" or "held_out"
    t: list[float]
    measured: dict[str, list[float]]
    sim_initial: dict[str, list[float]]
    sim_identified: dict[str, list[float]]
    sim_baseline: dict[str, list[float]]  # the kinematic baseline's replay, where it was fitted
    metrics_initial: Metrics
    metrics_identified: Metrics
    metrics_baseline: Metrics
    segments: dict[str, list[float]]
    pallet: dict[str, Any] | None
    meta: dict[str, Any]
    turns: dict[str, list[float]] | None
    solver: SolverHealth


class ParameterRow(TypedDict):
    """One parameter of the fit: initial and identified value, bounds, std, 95 % interval, truth."""

    name: str
    unit: str
    description: str
    initial: float
    value: float
    lower: float
    upper: float
    frozen: bool
    calibrated: bool
    std: float | None
    ci95: list[float] | None
    truth: float | None
    at_bound: str | None
    # whether these runs determine it (sysid.fit.identifiability; None for a frozen or calibrated one)
    determined: NotRequired[str | None]
    determined_why: NotRequired[str | None]
    interval: NotRequired[list[float | None] | None]  # the interval as the data give it: unclipped
    reaches: NotRequired[str | None]  # the bounds it reaches: 'lower', 'upper', 'both' or None
    prior: NotRequired[dict[str, float] | None]  # {mean, std}


class FitSummary(TypedDict, total=False):
    """The optimiser's record (`FitResult.summary`): convergence, losses [m^2], the trace, covariance,
    std and intervals per free parameter, warnings, wall and simulation time [s]."""

    names: list[str]
    optimizer: str
    success: bool
    converged: bool
    convergence: str
    message: str
    iterations: int
    jacobian_evaluations: int
    loss_initial: float
    loss_final: float
    train_errors_initial: dict[str, float]
    train_errors_final: dict[str, float]
    trace: list[dict[str, Any]]
    covariance: list[list[float]] | None
    std: dict[str, float | None]
    intervals: dict[str, list[float]]
    correlation: list[list[float]] | None
    condition_number: float | None
    warnings: list[str]
    wall_time: float
    sim_time: float
    n_sim_calls: int
    starts: list[dict[str, Any]]
    tau: dict[str, float]
    n_eff: float | None
    options: dict[str, Any]
    nuisance_names: list[str]
    nuisance: dict[str, dict[str, float]]
    nuisance_intervals: dict[str, dict[str, list[float]]]
    identifiability: dict[str, dict[str, Any]]
    weakest: dict[str, Any] | None


class Baseline(TypedDict, total=False):
    """The kinematic baseline fitted on the same training runs (``status`` "fitted"), or why not
    (``status`` "skipped", ``reason``)."""

    simulator: str
    label: str
    status: str
    reason: str | None
    dt: float
    optimizer: str
    max_iter: int
    parameters: list[ParameterRow]
    calibration: dict[str, Any] | None
    fit: FitSummary
    wall_time: float


class SplitBlock(TypedDict, total=False):
    """Per split: per logged run the mean over its pieces, the means over runs and over pieces, the verdict."""

    n_runs: int
    n_pieces: int
    runs: list[dict[str, Any]]
    mean_over_runs: dict[str, dict[str, float]]
    mean_over_pieces: dict[str, dict[str, float]]
    verdict: str | None
    in_sample: bool


class Generalisation(TypedDict, total=False):
    """The report's first section: the model beside its starting values and the kinematic baseline, per split."""

    model: str
    baseline: str | None
    baseline_skipped: str | None
    keys: list[str]
    held_out: SplitBlock
    train: SplitBlock


class SweepSummary(TypedDict):
    """The timestep sweep (`Sweep.summary`): mean combined error [m] per timestep [s], its plateau."""

    dts: list[float]
    errors: list[float]
    per_run: list[list[float]]
    wall_times: list[float]
    plateau: list[float] | None
    best_dt: float | None
    factor: float


@dataclass
class SimulatorInfo:
    """The simulator of the fit: its registry name, its label (class) and its options."""

    name: str = ""
    label: str = ""
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outputs:
    """Where the fit wrote its files (the parameter file, the HTML report, the results JSON)."""

    params: str = ""
    report: str = ""
    results: str | None = None  # absent in the JSON until the pipeline has chosen it

    def to_dict(self) -> dict[str, str]:
        out = {"params": self.params, "report": self.report}
        if self.results is not None:
            out["results"] = self.results
        return out


# The JSON's top-level keys in the order they are written (and `FitResults`'s fields are declared).
KEYS = ("format", "version", "sysid_version", "created", "robot", "simulator", "config", "generalisation",
        "baseline", "dropped_runs", "odometry_findings", "parameters", "nuisance", "calibration", "fit",
        "summary", "runs", "sweep", "timing", "outputs")


@dataclass(eq=False)
class FitResults(Mapping[str, Any]):
    """The results of one ``sysid fit`` (see the module docstring); field order = JSON key order."""

    format: str = RESULTS_FORMAT
    version: int = RESULTS_VERSION
    sysid_version: str = ""
    created: str = ""  # ISO 8601, UTC, seconds
    robot: str = ""
    simulator: SimulatorInfo = field(default_factory=SimulatorInfo)
    config: dict[str, Any] = field(default_factory=dict)  # the settings the figures depend on
    generalisation: Generalisation | None = None
    baseline: Baseline | None = None
    dropped_runs: list[dict[str, Any]] = field(default_factory=list)
    odometry_findings: list[dict[str, Any]] = field(default_factory=list)
    parameters: list[ParameterRow] = field(default_factory=list)
    nuisance: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    fit: FitSummary = field(default_factory=lambda: FitSummary())
    summary: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # split -> metric -> when
    runs: list[RunEntry] = field(default_factory=list)
    sweep: SweepSummary | None = None
    timing: dict[str, float] = field(default_factory=dict)  # wall time [s] per phase
    outputs: Outputs = field(default_factory=Outputs)

    # -- the JSON form ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The results JSON's object, keys in the written order."""
        return {key: self[key] for key in KEYS}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FitResults:
        """Read a results JSON's object back; sections an earlier version did not write read as empty."""
        if isinstance(doc, FitResults):
            return doc
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in doc.items() if k in names and v is not None}
        sim = doc.get("simulator") or {}
        kw["simulator"] = SimulatorInfo(name=sim.get("name", ""), label=sim.get("label", ""),
                                        options=sim.get("options") or {})
        out = doc.get("outputs") or {}
        kw["outputs"] = Outputs(params=out.get("params", ""), report=out.get("report", ""),
                                results=out.get("results"))
        return cls(**kw)

    # -- read access as the JSON's mapping ------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        if key not in KEYS:
            raise KeyError(key)
        if key == "simulator":
            return dataclasses.asdict(self.simulator)
        if key == "outputs":
            return self.outputs.to_dict()
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __len__(self) -> int:
        return len(KEYS)

    # -- what the report and the command line ask of it ---------------------------------------------

    def runs_of(self, split: str) -> list[RunEntry]:
        """The run entries of one split ("train" or "held_out"), in order."""
        return [r for r in self.runs if r.get("split") == split]

    def warnings(self) -> list[str]:
        """The fit's and the kinematic baseline's warnings (the report adds its missed-climb check)."""
        out = list(self.fit.get("warnings") or [])
        return out + [f"kinematic baseline: {w}" for w in ((self.baseline or {}).get("fit") or {}).get("warnings")
                      or []]


def as_results(doc: FitResults | Mapping[str, Any]) -> FitResults:
    """``doc`` as `FitResults` (a results JSON's object is read with ``FitResults.from_dict``)."""
    return doc if isinstance(doc, FitResults) else FitResults.from_dict(doc)


def read_document(path: str | Path, fmt: str, what: str, origin: str) -> dict[str, Any]:
    """The JSON object of a document `sysid` wrote (``"format": fmt``): ConfigError when the file is
    missing, ResultsError when it is not JSON or not such a document. ``what`` names the file in the
    messages ("results file"), ``origin`` says what writes it ("written by `sysid cv`")."""
    from ingest.inputs import check_input_file, read_json_file

    p = check_input_file(path, what, ConfigError, "json")  # missing, a folder, a pipe, a link loop, too large
    doc = read_json_file(p, ResultsError, what, expected=f"give the {what} {origin}")
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ResultsError(f"{str(p)!r} is not a sysid {what} ({origin})")
    return doc


# What every results document holds, by section: a file lacking one was cut short or edited.
REQUIRED = {
    "config": ("dt", "optimizer", "lever_arm"),
    "fit": ("optimizer", "message", "iterations", "loss_initial", "loss_final", "wall_time"),
}
RUN_REQUIRED = ("name", "split", "t", "measured", "sim_initial", "sim_identified", "metrics_initial",
                "metrics_identified")


def load_results(path: str | Path) -> FitResults:
    """The results document of a results JSON written by ``sysid fit`` (ResultsError when it is not
    one, or lacks a field every results document has: `REQUIRED`, `RUN_REQUIRED` per run)."""
    doc = read_document(path, RESULTS_FORMAT, "results file", "written next to the report by `sysid fit`")
    redo = "it was cut short or edited; run sysid fit again to write a complete one"
    for section, keys in REQUIRED.items():
        sec = doc.get(section)
        missing = list(keys) if not isinstance(sec, dict) else [k for k in keys if k not in sec]
        if missing:
            raise ResultsError(f"results file {str(path)!r} lacks {section}.{missing[0]}: {redo}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ResultsError(f"results file {str(path)!r} has no list of runs: {redo}")
    for i, r in enumerate(runs):
        missing = [k for k in RUN_REQUIRED if k not in r]
        if missing:
            raise ResultsError(f"results file {str(path)!r} lacks runs[{i}].{missing[0]}: {redo}")
    return FitResults.from_dict(doc)


def document_header(fmt: str, robot: str) -> dict[str, Any]:
    """The keys every document `sysid` writes starts with: format, version, the sysid version, the
    creation time (ISO 8601, UTC, seconds) and the robot."""
    return {
        "format": fmt,
        "version": RESULTS_VERSION,
        "sysid_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "robot": robot,
    }


def config_settings(cfg: FitConfig) -> dict[str, Any]:
    """The settings of a fit config every document records first (its ``config`` section): the
    config file, the optimiser, timestep [s], iterations, lever arm [m], score window, piece length [s]."""
    return {
        "source": cfg.source,
        "optimizer": cfg.fit.optimizer,
        "dt": cfg.fit.dt,
        "max_iter": cfg.fit.max_iter,
        "lever_arm": cfg.fit.lever_arm,
        "segment": cfg.fit.segment,
        "split": cfg.data.split,
    }
