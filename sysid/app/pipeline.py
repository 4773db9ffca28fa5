"""The ``sysid fit`` pipeline: load runs, calibrate, fit, fit the kinematic baseline on the same
training runs (``fit.baseline``), evaluate both on the held-out runs (per piece and per run),
sweep the timestep, and write parameters, results (JSON) and the HTML report, all three committed
together.

`run_fit` checks everything that needs no data first, then runs the named phases of
``FIT_PHASES`` (load, fit, baseline, evaluate, sweep, write) in order on one `FitRun`, which
holds what they share. Every phase shows a tqdm progress bar (on stderr) when ``progress`` is true.
The phases' work lives in the modules beside this one: `sysid.app.runs` (loading and screening the
runs), `sysid.app.fitting` (calibration and fit, the kinematic baseline), `sysid.app.document` (the
results document, `sysid.app.results.FitResults`) and `sysid.app.fit_outputs` (the output paths,
their checks, the commit of the three files).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from tqdm import tqdm

from ingest.fileio import json_safe as _finite
from sysid.app.config import BASELINE, FitConfig, build_baseline_parameters, validate_runs, validate_static
from sysid.app.document import results_document, run_entries, skid_steer_geometry
from sysid.app.fit_outputs import check_output_paths, input_files, output_paths, write_outputs
from sysid.app.fitting import (
    accepted_parameters,
    baseline_simulator,
    baseline_status,
    calibrate_and_fit,
    fanout_of,
    fit_baseline,
    start_warning,
)
from sysid.app.outputs import output_lock
from sysid.app.results import (
    Baseline,
    Calibration,
    DroppedRun,
    FitResults,
    OdometryFinding,
    RunEntry,
    SolverHealth,
    Split,
    aggregate_split,
)
from sysid.app.runs import load_runs, load_warnings, replay_warnings, score_windows, screen_odometry
from sysid.app.warm import start_warm_up
from sysid.errors import ConfigError
from sysid.fit.evaluation import evaluate
from sysid.fit.fanout import check_workers, cluster
from sysid.fit.params import ParameterSet
from sysid.fit.sweep import Sweep, sweep_dt
from sysid.simulators.protocol import Simulator, replay_health

if TYPE_CHECKING:
    from ingest.run import Run
    from sysid.fit.optimizer import FitResult


def run_fit(cfg: FitConfig, progress: bool = True, write: bool = True) -> FitResults:
    """The whole ``sysid fit``; returns the results document (and writes the outputs).

    Every check that needs no data runs first (parameters, outputs, the baseline's parameters,
    workers); then the phases of ``FIT_PHASES`` run in order, inside the Ray session when it fans out."""
    t_all = time.perf_counter()
    robot = cfg.load_robot()
    sim, accepted = accepted_parameters(cfg, robot)
    params, train_src, held_src = validate_static(cfg, accepted, robot)
    params_path, results_path, report_path = output_paths(cfg)
    if write:  # every output location, the defaults included, before any computation
        check_output_paths(cfg, params_path, results_path, report_path, input_files(cfg, train_src, held_src))
    skip_baseline = baseline_status(cfg, sim)
    bsim, bparams = None, None
    if skip_baseline is None:  # its parameters are checked before any computation, like the model's
        bsim = baseline_simulator(cfg, robot)
        bparams = build_baseline_parameters(cfg, robot, bsim.parameter_names)
        if not bparams.free_names and not (cfg.fit.calibration.enabled and cfg.fit.calibration.parameter in bparams):
            raise ConfigError("fit.baseline: every parameter of the kinematic baseline is frozen and nothing is "
                              "calibrated: free one in fit.baseline.parameters or set fit.baseline: false")

    check_workers(cfg.fit.workers, cfg.fit.ray_address, "the starts and the sweep")
    state = FitRun(cfg=cfg, progress=progress, write=write, t_all=t_all, robot=robot, sim=sim, params=params,
                   train_src=train_src, held_src=held_src, bsim=bsim, bparams=bparams, skip_baseline=skip_baseline,
                   params_path=params_path, results_path=results_path, report_path=report_path)
    folders = {p.parent for p in (params_path, results_path, report_path)} if write else set()
    with output_lock(folders), cluster(cfg.fit.workers, cfg.fit.ray_address):  # a second fit into them stops here
        for _name, phase in FIT_PHASES:
            phase(state)
    assert state.results is not None  # the write phase made it
    return state.results


@dataclasses.dataclass
class FitRun:
    """What the phases of one fit share: the inputs checked before any work, and what each phase adds
    (``timing``: wall time [s] per phase, in the order the results JSON lists them)."""

    cfg: FitConfig
    progress: bool
    write: bool
    t_all: float  # perf_counter at the start of run_fit [s]
    robot: Mapping[str, Any]
    sim: Simulator
    params: ParameterSet
    train_src: Sequence[Path]
    held_src: Sequence[Path]
    bsim: Simulator | None
    bparams: ParameterSet | None
    skip_baseline: str | None
    params_path: Path
    results_path: Path
    report_path: Path
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    # load
    train: list[Run] = dataclasses.field(default_factory=list)
    held: list[Run] = dataclasses.field(default_factory=list)
    dropped: list[DroppedRun] = dataclasses.field(default_factory=list)
    findings: list[OdometryFinding] = dataclasses.field(default_factory=list)
    initial: ParameterSet | None = None  # the parameters before calibration and fit
    # fit
    fit: FitResult | None = None
    calibration: Calibration | None = None
    # baseline
    baseline: Baseline = dataclasses.field(default_factory=lambda: Baseline())
    bmetrics: dict[str, list[dict[str, float]]] = dataclasses.field(default_factory=dict)
    bposes: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    # evaluate
    runs_out: list[RunEntry] = dataclasses.field(default_factory=list)
    summary: dict[str, dict[str, dict[str, float]]] = dataclasses.field(default_factory=dict)  # split, metric
    # sweep
    sweep: Sweep | None = None
    # write
    results: FitResults | None = None


def _phase_load(st: FitRun) -> None:
    """Ingest the training and held-out runs, screen their odometry, check they hold what the fit needs."""
    cfg = st.cfg
    t0 = time.perf_counter()
    warmed = start_warm_up(cfg, st.robot)  # the engine's kernels compile while the runs are read
    try:
        train = load_runs(cfg, st.train_src, "train", st.progress)
        held = load_runs(cfg, st.held_src, "held-out", st.progress)
    except KeyboardInterrupt:
        raise  # a signal ends the process at once, the warm-up abandoned with it (its compile silenced)
    except BaseException:
        warmed()  # a caller going on after the error may launch the same modules
        raise
    warmed()
    st.train, dropped, findings = screen_odometry(cfg, train, "train")
    st.held, dropped_h, findings_h = screen_odometry(cfg, held, "held_out", required=False)
    st.dropped, st.findings = dropped + dropped_h, findings + findings_h
    validate_runs(cfg, st.train, st.held)
    st.timing["load"] = time.perf_counter() - t0
    st.initial = st.params.copy()


def _phase_fit(st: FitRun) -> None:
    """Calibrate the command scale on its segment, then fit the free parameters on the training runs."""
    cfg = st.cfg
    st.fit, st.calibration = calibrate_and_fit(cfg, st.sim, st.train, st.params, cfg.fit.dt,
                                               optimizer=cfg.fit.optimizer, max_iter=cfg.fit.max_iter,
                                               progress=st.progress, timing=st.timing,
                                               fanout=fanout_of(cfg, st.robot))
    st.fit.warnings[:0] = load_warnings([*st.train, *st.held])  # what ingest found, first


def _phase_baseline(st: FitRun) -> None:
    """Fit the kinematic baseline on the same training runs and score it (or record why not)."""
    if st.bparams is not None and st.bsim is not None:
        st.baseline, st.bmetrics, st.bposes = fit_baseline(st.cfg, st.bparams, st.bsim, st.train, st.held,
                                                           st.progress, st.timing,
                                                           fanout=fanout_of(st.cfg, st.robot, BASELINE))
    else:
        st.baseline = {"simulator": BASELINE, "status": "skipped", "reason": st.skip_baseline}
        st.bmetrics = {}


def _phase_evaluate(st: FitRun) -> None:
    """Replay every run at the initial and the identified parameters: per-run entries and per-split means."""
    cfg, sim, fit = st.cfg, st.sim, st.fit
    assert st.initial is not None and fit is not None
    t0 = time.perf_counter()
    splits: tuple[tuple[Split, list[Run]], ...] = (("train", st.train), ("held_out", st.held))
    for split, runs in splits:
        if not runs:
            continue
        with tqdm(total=2, desc=f"evaluate {split}", disable=not st.progress, leave=False) as ebar:
            m0, p0 = evaluate(sim, runs, st.initial.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                              windows=score_windows(cfg, runs))
            ebar.update(1)
            m1, p1 = evaluate(sim, runs, fit.params.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                              windows=score_windows(cfg, runs))
            health = replay_health(sim, runs)
            ebar.update(1)
        entries = run_entries(runs, split, p0, p1, m0, m1, skid_steer_geometry(st.robot), st.bposes.get(split),
                              lever_arm=cfg.fit.lever_arm)
        for entry, mb in zip(entries, st.bmetrics.get(split) or [], strict=False):
            entry["metrics_baseline"] = _finite(dict(mb))
        for entry, h in zip(entries, health or [], strict=False):
            entry["solver"] = cast(SolverHealth, h)
        fit.warnings += replay_warnings(runs, m0, None, " at the initial parameters", only_diverged=True)
        fit.warnings += replay_warnings(runs, m1, health, " at the identified parameters")
        st.runs_out += entries
        st.summary[split] = {
            key: {
                "initial": float(np.mean([m[key] for m in m0])),
                "identified": float(np.mean([m[key] for m in m1])),
            }
            for key in ("combined", "mean_xy", "yaw_rmse")
        }
    held = [e for e in st.runs_out if e["split"] == "held_out"]
    worse = start_warning(aggregate_split(held), st.initial, fit.params, st.calibration) if held else None
    if worse:
        fit.warnings.append(worse)
    st.timing["evaluate"] = time.perf_counter() - t0


def _phase_sweep(st: FitRun) -> None:
    """The held-out error over the timestep grid at the identified parameters (``sweep.enabled``)."""
    cfg = st.cfg
    if cfg.sweep.enabled:
        assert st.fit is not None
        t0 = time.perf_counter()
        held, train = st.held, st.train
        sweep_runs = {"held_out": held or train, "train": train, "all": list(train) + list(held)}[cfg.sweep.runs]
        with tqdm(total=len(cfg.sweep.dts), desc="sweep dt", unit="dt", disable=not st.progress,
                  leave=False) as sbar:

            def step(_h: float) -> None:
                sbar.update(1)

            st.sweep = sweep_dt(
                st.sim,
                sweep_runs,
                st.fit.params.values(),
                cfg.sweep.dts,
                lever_arm=cfg.fit.lever_arm,
                windows=score_windows(cfg, sweep_runs),
                fanout=fanout_of(cfg, st.robot),
                progress=step,
            )
        st.timing["sweep"] = time.perf_counter() - t0


def _phase_write(st: FitRun) -> None:
    """Assemble the results document; with ``write``, commit the parameter file, results JSON and report."""
    assert st.initial is not None and st.fit is not None
    st.timing["total"] = time.perf_counter() - st.t_all
    doc = results_document(
        st.cfg,
        st.sim,
        st.initial,
        st.fit,
        st.calibration,
        st.runs_out,
        st.summary,
        st.sweep,
        st.timing,
        params_path=str(st.params_path),
        report_path=str(st.report_path),
        dropped=st.dropped,
        baseline=st.baseline,
        findings=st.findings,
    )
    doc.outputs.results = str(st.results_path)
    if st.write:
        write_outputs(doc, st.fit.params, st.cfg.robot_name(), st.params_path, st.results_path, st.report_path,
                      progress=st.progress)
    st.results = doc


# The fit, phase by phase (``run_fit`` runs them in this order on one FitRun).
FIT_PHASES: tuple[tuple[str, Callable[[FitRun], None]], ...] = (
    ("load", _phase_load),
    ("fit", _phase_fit),
    ("baseline", _phase_baseline),
    ("evaluate", _phase_evaluate),
    ("sweep", _phase_sweep),
    ("write", _phase_write),
)
