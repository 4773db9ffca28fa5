"""The results document of a fit, typed: assembled from the fit's phases (`sysid.app.pipeline.run_fit`,
`sysid.app.document.results_document`), written as the results JSON (``report.json``), read back by
the report renderer (`sysid.app.report.render_report`) and printed by the command line
(`sysid.cli.fit.print_fit`).

`FitResults` is the document's top level; its sections are the JSON's objects, typed as
``TypedDict`` (plain dicts at run time, so the JSON is exactly what they hold). ``to_dict`` gives
the JSON form with the keys in the written order; ``from_dict`` reads it back, also from results
files of earlier versions that lack sections (those read as empty). A `FitResults` also reads as
that mapping (``results["runs"]`` is ``results.runs``), so code written against the JSON form keeps
working on a fresh fit.

The generalisation section (`generalisation`: per split, `aggregate_split` of its run entries and the
`verdict`) is computed here from the run entries, so the pipeline, ``sysid evaluate``, ``sysid cv`` and
the report derive it the same way.

Units: lengths [m], angles [rad], times [s], losses [m^2] (the combined error's square).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

from ingest.fileio import json_safe
from sysid import __version__
from sysid.errors import ConfigError, ResultsError

if TYPE_CHECKING:
    from sysid.app.config import FitConfig

RESULTS_FORMAT = "sysid-results"
RESULTS_VERSION = 1

Split = Literal["train", "held_out"]
MetricName = Literal["combined", "mean_xy", "final_xy", "yaw_rmse", "z_rmse"]
# what the generalisation section compares: the identified model, the same simulator at its starting
# values, the kinematic baseline fitted on the same training runs
Compared = Literal["model", "start", "baseline"]


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


class Trajectory(TypedDict):
    """A path sampled at the run entry's ``t``: position [m] and unwrapped yaw [rad] (None where not finite)."""

    x: list[float]
    y: list[float]
    z: list[float]
    yaw: list[float]


class Pallet(TypedDict):
    """The pallet a run climbs: centre x, y [m], yaw [rad], size (length, width, height) [m]."""

    x: float
    y: float
    yaw: float
    size: list[float]


class WindowScores(TypedDict, total=False):
    """A run's error over one window (`sysid.app.segment_scores`): its bounds [s, on the run's clock],
    how many samples it holds, and per compared replay (``model``, ``start``, ``baseline``) the mean xy
    distance and combined error [m] (None: the replay diverged there)."""

    t: list[float]
    samples: int
    model: dict[str, float]
    start: dict[str, float]
    baseline: dict[str, float]


class RunEntry(TypedDict, total=False):
    """One replayed run (or piece of a run) of the fit: its trajectories (measured, replayed at the
    initial and the identified parameters; downsampled), metrics and metadata
    (`sysid.app.document.run_entries`)."""

    name: str
    run: str  # the logged run a piece comes from (its own name when it is not cut)
    split: Split
    t: list[float]
    measured: Trajectory
    sim_initial: Trajectory
    sim_identified: Trajectory
    sim_baseline: Trajectory  # the kinematic baseline's replay, where it was fitted
    metrics_initial: Metrics
    metrics_identified: Metrics
    metrics_baseline: Metrics
    segments: dict[str, list[float]]
    pallet: Pallet | None
    meta: dict[str, Any]
    turns: dict[str, list[float]] | None  # `sysid.fit.metrics.turn_efficiency`
    # per window ("cruise", "climb", "after", "whole run") the replays' errors, `sysid.app.segment_scores`
    segment_scores: dict[str, WindowScores]
    solver: SolverHealth


class Calibration(TypedDict):
    """The calibration of one parameter on its segment before the fit (`sysid.fit.calibration.calibrate`):
    the value, the runs it used and skipped, its std and 95 % interval, losses [m^2], and how the fit
    carries it (``carry``: "freeze" or "prior")."""

    carry: str
    parameter: str
    segment: str
    value: float
    runs: list[str]
    skipped: list[str]
    std: float | None
    interval: list[float]
    loss_initial: float
    loss_final: float
    warnings: list[str]


class DroppedRun(TypedDict):
    """A run or piece left out for its odometry jumps (``data.odometry_jumps.action: drop``)."""

    name: str
    split: str
    reason: str
    jumps: list[dict[str, float]]  # `ingest.quality.odometry_jumps`: t [s], step [m], accel [m/s^2]
    duration_s: float


class OdometryFinding(TypedDict, total=False):
    """A run whose odometry lags the wheels (``kind`` "lag") or a run or piece whose odometry jumps
    (``kind`` "jumps"), and what became of it (``action``); `sysid.app.findings` prints them."""

    split: str
    run: str
    piece: str | None
    kind: str
    action: str  # "modelled", "scored" or "dropped"
    text: str
    speed_lag_s: float
    heading_lag_s: float
    times_s: list[float]  # from the run's start
    max_step_m: float
    max_accel: float  # [m/s^2]


class NuisanceRow(TypedDict):
    """A nuisance parameter fitted on one training run: value, unit, bounds, 95 % interval."""

    run: str
    name: str
    value: float
    unit: str
    description: str
    bounds: list[float]
    interval: list[float] | None


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
    calibration: Calibration | None
    fit: FitSummary
    wall_time: float


class RunMeans(TypedDict):
    """One logged run of a split: its pieces and, per compared replay, the mean over them of each metric."""

    run: str
    pieces: list[str]
    model: dict[str, float]
    start: NotRequired[dict[str, float]]
    baseline: NotRequired[dict[str, float]]


class SplitBlock(TypedDict, total=False):
    """Per split: per logged run the mean over its pieces, the means over runs and over pieces, the verdict."""

    n_runs: int
    n_pieces: int
    runs: list[RunMeans]
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
    dropped_runs: list[DroppedRun] = field(default_factory=list)
    odometry_findings: list[OdometryFinding] = field(default_factory=list)
    parameters: list[ParameterRow] = field(default_factory=list)
    nuisance: list[NuisanceRow] = field(default_factory=list)
    calibration: Calibration | None = None
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


# -- the generalisation section ------------------------------------------------------------------

# [m] the figures the report's first section compares
GENERALISATION_KEYS: tuple[MetricName, ...] = ("mean_xy", "combined")

# what the identified model is compared with, in the order every table shows them
REFERENCES: dict[Compared, str] = {"start": "its starting values", "baseline": "the kinematic baseline"}
REFERENCE_COLUMNS: dict[Compared, str] = {"model": "identified", "start": "starting values",
                                          "baseline": "kinematic baseline"}
SPLIT_WORDS: tuple[tuple[Split, str], ...] = (("held_out", "held-out"), ("train", "training"))


def metric_mean(values: Iterable[float | None]) -> float:
    """Mean of metric values; None (a non-finite value in the results) counts as infinite."""
    import numpy as np

    vals = [math.inf if v is None else float(v) for v in values]
    return float(np.mean(vals)) if vals else math.nan


def _metrics_of(entry: RunEntry, who: Compared) -> Metrics:
    """A run entry's metrics of one compared replay."""
    if who == "start":
        return entry["metrics_initial"]
    if who == "baseline":
        return entry["metrics_baseline"]
    return entry["metrics_identified"]


def aggregate_split(entries: Sequence[RunEntry], keys: Sequence[MetricName] = GENERALISATION_KEYS) -> SplitBlock:
    """Per logged run, the mean over its pieces of each metric in ``keys``, for the model
    (``metrics_identified``) and, where every entry has them, the same simulator at the config's
    starting values (``start``: ``metrics_initial``) and the kinematic baseline
    (``metrics_baseline``); plus the mean over runs (each run counts once, however many pieces it
    was cut into) and over pieces. ``entries`` are run records of one split (``run_entries``);
    pieces are grouped by their ``run`` (the parent run's name; the entry's own name without it),
    in order of first appearance. A diverged piece (non-finite metric) makes its run's mean infinite."""
    groups: dict[str, list[RunEntry]] = {}
    for e in entries:
        groups.setdefault(str(e.get("run") or e["name"]), []).append(e)
    compared: list[Compared] = ["model"]
    if entries and all(e.get("metrics_initial") for e in entries):
        compared.append("start")
    if entries and all(e.get("metrics_baseline") for e in entries):
        compared.append("baseline")

    def means(es: Sequence[RunEntry], who: Compared) -> dict[str, float]:
        return {k: metric_mean(_metrics_of(e, who)[k] for e in es) for k in keys}

    runs: list[RunMeans] = []
    for name, es in groups.items():
        row: RunMeans = {"run": name, "pieces": [str(e["name"]) for e in es], "model": means(es, "model")}
        for who in compared[1:]:
            row[who] = means(es, who)
        runs.append(row)
    return {
        "n_runs": len(runs),
        "n_pieces": len(entries),
        "runs": runs,
        "mean_over_runs": {who: {k: metric_mean(r[who][k] for r in runs) for k in keys} for who in compared},
        "mean_over_pieces": {who: means(entries, who) for who in compared},
    }


def model_label(simulator: str) -> str:
    return "the engine" if simulator == "ostrich" else f"the {simulator} simulator"


def verdict(block: Mapping[str, Any], what: str, model: str) -> str | None:
    """One line: whether the model's mean over runs of the mean xy distance is below that of its
    starting values and of the kinematic baseline (those of ``block``, ``aggregate_split``), the
    three means, on how many runs it is below each, and the combined errors; None with neither."""
    runs = block.get("runs") or []
    means = block.get("mean_over_runs") or {}
    refs = [w for w in REFERENCES if w in means]
    if not runs or not refs:
        return None

    def v(x: Any) -> float:
        return math.inf if x is None else float(x)

    def f(x: Any) -> str:
        return "diverged" if not math.isfinite(v(x)) else f"{v(x):.3f}"

    m = means["model"]
    won = [w for w in refs if v(m["mean_xy"]) < v(means[w]["mean_xy"])]
    lost = [w for w in refs if w not in won]
    if not lost:
        head = "beats " + ("both " if len(won) > 1 else "") + " and ".join(REFERENCES[w] for w in won)
    elif not won:
        head = ("beats neither " + " nor ".join(REFERENCES[w] for w in lost) if len(lost) > 1
                else f"does not beat {REFERENCES[lost[0]]}")
    else:
        head = f"beats {' and '.join(REFERENCES[w] for w in won)} but not {' or '.join(REFERENCES[w] for w in lost)}"
    n = len(runs)
    wins = ", ".join(f"than {'the start' if w == 'start' else 'the kinematic baseline'} on "
                     f"{sum(v(r['model']['mean_xy']) < v(r[w]['mean_xy']) for r in runs)}"
                     + (f" of {n} run{'s' if n != 1 else ''}" if i == 0 else f" of {n}") for i, w in enumerate(refs))
    who: list[Compared] = ["model", *refs]
    return (f"{model} {head} on the {what} runs: mean xy distance over {n} run{'s' if n != 1 else ''}: "
            + ", ".join(f"{REFERENCE_COLUMNS[w]} {f(means[w]['mean_xy'])}" + (" m" if f(means[w]["mean_xy"])[0]
                                                                               != "d" else "") for w in who)
            + f" (lower {wins}); combined error "
            + " / ".join(f(means[w]["combined"]) for w in who) + " m")


def generalisation(runs: Sequence[RunEntry], simulator: str, baseline: Baseline | None = None) -> Generalisation:
    """The report's first section: per split, ``aggregate_split`` of its run records and the verdict."""
    from sysid.app.config import BASELINE  # here: the config's readers are not needed to read a document

    out: Generalisation = {
        "model": simulator,
        "baseline": BASELINE if baseline and baseline.get("status") == "fitted" else None,
        "baseline_skipped": (baseline or {}).get("reason") if (baseline or {}).get("status") != "fitted" else None,
        "keys": list(GENERALISATION_KEYS),
    }
    for split, what in SPLIT_WORDS:
        entries = [r for r in runs if r["split"] == split]
        if entries:
            block = aggregate_split(entries)
            block["verdict"] = verdict(block, what, model_label(simulator))
            block["in_sample"] = split == "train"
            out[split] = block
    return cast(Generalisation, json_safe(out))


# -- reading documents ----------------------------------------------------------------------------


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
