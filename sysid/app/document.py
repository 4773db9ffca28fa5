"""The results document of a fit, assembled from what its phases computed (`sysid.app.results` says
what the document holds): the run entries (trajectories downsampled to `MAX_POINTS`, metrics, metadata,
turn efficiency), the parameter and nuisance tables, and the document itself (`results_document`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ingest.errors import RunFormatError
from ingest.fileio import json_safe as _finite
from ingest.run import side_speeds
from sysid.app.config import FitConfig
from sysid.app.results import (
    RESULTS_FORMAT,
    Baseline,
    Calibration,
    Compared,
    DroppedRun,
    FitResults,
    Metrics,
    NuisanceRow,
    OdometryFinding,
    Pallet,
    ParameterRow,
    RunEntry,
    Split,
    Trajectory,
    config_settings,
    document_header,
    generalisation,
)
from sysid.app.runs import parent_run
from sysid.app.segment_scores import pose_segment_scores
from sysid.fit.metrics import LEVER_ARM, quat_yaw, turn_efficiency
from sysid.fit.params import EXTRA_UNITS, ParameterSet, unit_of
from sysid.fit.residuals import NUISANCE_SPECS, align_start
from sysid.fit.sweep import Sweep
from sysid.simulators.protocol import Simulator, unwrap

if TYPE_CHECKING:
    from ingest.run import Run
    from sysid.fit.optimizer import FitResult

MAX_POINTS = 800  # trajectory samples kept per series in results / report


def _downsample(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(int))


def _series(pose: np.ndarray, idx: np.ndarray, origin: np.ndarray | None = None) -> Trajectory:
    p = np.asarray(pose, float)
    if origin is not None:  # plotted as scored: simulated start translated onto the first odometry sample
        p = align_start(p, origin)
    p = p[idx]
    yaw = np.unwrap(quat_yaw(p[:, 4:8]))
    return {"x": p[:, 1].tolist(), "y": p[:, 2].tolist(), "z": p[:, 3].tolist(), "yaw": yaw.tolist()}


def _run_meta(run: Run) -> dict[str, Any]:
    meta = run.meta or {}
    keep: dict[str, Any] = {
        k: meta[k]
        for k in (
            "source",
            "bag_name",
            "topics",
            "format",
            "rates_hz",
            "frame",
            "kind",
            "wheel_cmd_source",
            "cmd_vel",
            "odometry_jumps",
            "odometry_lag",
        )
        if k in meta
    }
    if "topics" not in keep and isinstance(meta.get("rates_hz"), Mapping):
        keep["topics"] = {str(k): f"{v:g} Hz" if isinstance(v, int | float) else v for k, v in meta["rates_hz"].items()}
    if "bag_name" not in keep and keep.get("source"):
        src = keep["source"]
        keep["bag_name"] = Path(src[0] if isinstance(src, list) else src).name
    keep["duration_s"] = run.duration
    keep["odom_samples"] = len(run.odom)
    keep["wheel_cmd_samples"] = len(run.wheel_cmd)
    out: dict[str, Any] = _finite(keep)
    return out


def skid_steer_geometry(robot: Mapping[str, Any]) -> tuple[float, float] | None:
    """(wheel radius, track width) [m] of a robot description, None when it does not give both."""
    try:
        return float(robot["wheels"]["radius"]), float(robot["skid_steer"]["track_width"])
    except (KeyError, TypeError, ValueError):
        return None


def run_entries(
    runs: Sequence[Run],
    split: Split,
    poses_initial: Sequence[np.ndarray],
    poses_final: Sequence[np.ndarray],
    metrics_initial: Sequence[Metrics | Mapping[str, float]],
    metrics_final: Sequence[Metrics | Mapping[str, float]],
    geometry: tuple[float, float] | None = None,
    poses_baseline: Sequence[np.ndarray] | None = None,
    lever_arm: float = LEVER_ARM,
) -> list[RunEntry]:
    """Per-run records for the results file and the report (trajectories downsampled). With the
    robot's ``geometry`` (wheel radius, track width [m]) each record holds ``turns``: the heading
    turned per heading the wheels command, by turn tightness (``metrics.turn_efficiency``); with
    ``poses_baseline`` (the kinematic baseline's replays) ``sim_baseline``. ``segment_scores``: each
    replay's errors over the cruise and climb segments, after the climb and over the whole run
    (`sysid.app.segment_scores`, at the odometry's full rate, combined error with ``lever_arm`` [m])."""
    out: list[RunEntry] = []
    for i, run in enumerate(runs):
        meas = run.odom[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]].to_numpy(float)
        n = min(len(meas), len(poses_initial[i]), len(poses_final[i]))  # a window may end early
        meas = meas[:n]
        idx = _downsample(len(meas))
        turns = None
        if geometry is not None:
            cmd = run.wheel_cmd
            yaws = {"measured": quat_yaw(meas[:, 4:8]), "sim_initial": quat_yaw(poses_initial[i][:n, 4:8]),
                    "sim_identified": quat_yaw(poses_final[i][:n, 4:8])}
            sides: tuple[np.ndarray, np.ndarray] | None
            try:  # the sides' mean wheel speeds (any wheel set whose columns name their side)
                sides = side_speeds(cmd, (getattr(run, "meta", None) or {}).get("wheel_sides"))
            except RunFormatError:
                sides = None
            if sides is not None:
                left, right = sides
                turns = turn_efficiency(meas[:, 0], np.interp(meas[:, 0], cmd["t"], left),
                                        np.interp(meas[:, 0], cmd["t"], right), yaws, *geometry)
        base = poses_baseline[i][:n] if poses_baseline is not None and len(poses_baseline[i]) >= n else None
        replays: dict[Compared, np.ndarray] = {"model": poses_final[i][:n], "start": poses_initial[i][:n]}
        if base is not None:
            replays["baseline"] = base
        pallet: Pallet | None = None
        if run.pallet is not None:
            pallet = {
                "x": run.pallet.x,
                "y": run.pallet.y,
                "yaw": run.pallet.yaw,
                "size": list(run.pallet.size),
            }
        out.append(
            _finite(
                {
                    "name": run.name,
                    "run": parent_run(run),
                    "split": split,
                    "t": meas[idx, 0].tolist(),
                    "measured": _series(meas, idx),
                    "sim_initial": _series(poses_initial[i], idx, meas[0, 1:4]),
                    "sim_identified": _series(poses_final[i], idx, meas[0, 1:4]),
                    **({"sim_baseline": _series(base, idx, meas[0, 1:4])} if base is not None else {}),
                    "metrics_initial": dict(metrics_initial[i]),
                    "metrics_identified": dict(metrics_final[i]),
                    "segments": {k: list(v) for k, v in run.segments.items()},
                    "segment_scores": pose_segment_scores(meas, replays, run.segments, lever_arm),
                    "pallet": pallet,
                    "meta": _run_meta(run),
                    "turns": turns,
                }
            )
        )
    return out


def parameter_rows(cfg: FitConfig, initial: ParameterSet, fit: FitResult, calibration: Calibration | None,
                   truth: bool = True) -> list[ParameterRow]:
    """The results' parameter table: initial and identified values, bounds, std, interval (clipped to
    the bounds), truth; for a free parameter also whether these runs determine it (``determined``:
    'determined', 'weakly determined' or 'not determined', ``sysid.fit.identifiability``), the
    interval as the data give it (``interval``: unclipped, None for an infinite end), the bounds it
    reaches (``reaches``) and its prior (``prior``: {mean, std} or None)."""
    rows = []
    idents = getattr(fit, "identifiability", None) or {}
    for p in fit.params:
        ident = idents.get(p.name) or {}
        rows.append(
            {
                "name": p.name,
                "unit": p.unit or unit_of(p.name),
                "description": p.description or (EXTRA_UNITS.get(p.name) or {}).get("description", ""),
                "initial": initial[p.name].value,
                "value": p.value,
                "lower": p.lower,
                "upper": p.upper,
                "frozen": p.name not in fit.names,
                "calibrated": bool(calibration and calibration["parameter"] == p.name),
                "std": fit.std.get(
                    p.name, calibration["std"] if calibration and calibration["parameter"] == p.name else None
                ),
                "ci95": list(fit.intervals[p.name])
                if p.name in fit.intervals
                else (calibration["interval"] if calibration and calibration["parameter"] == p.name else None),
                "truth": cfg.truth.get(p.name) if truth else None,
                "at_bound": p.at_bound() if p.name in fit.names else None,
                "determined": ident.get("status"),
                "determined_why": ident.get("reason"),
                "interval": ident.get("interval"),
                "reaches": ident.get("reaches"),
                "prior": {"mean": p.prior.mean, "std": p.prior.sigma} if p.prior is not None else None,
            }
        )
    out: list[ParameterRow] = _finite(rows)
    return out


def nuisance_rows(fit: FitResult) -> list[NuisanceRow]:
    """The results' nuisance table: per training run and nuisance parameter its fitted value and
    interval (not physics: never in the parameter file, 0 when any run is predicted)."""
    rows: list[NuisanceRow] = []
    for run, values in getattr(fit, "nuisance", {}).items():
        for name, value in values.items():
            spec = NUISANCE_SPECS[name]
            iv = fit.nuisance_intervals.get(run, {}).get(name)
            rows.append({"run": run, "name": name, "value": value, "unit": spec.unit,
                         "description": spec.description, "bounds": [spec.lower, spec.upper],
                         "interval": list(iv) if iv is not None else None})
    return rows


def results_document(
    cfg: FitConfig,
    sim: Simulator,
    initial: ParameterSet,
    fit: FitResult,
    calibration: Calibration | None,
    runs: list[RunEntry],
    summary: dict[str, dict[str, dict[str, float]]],
    sweep: Sweep | None,
    timing: dict[str, float],
    params_path: str,
    report_path: str,
    dropped: Sequence[DroppedRun] = (),
    baseline: Baseline | None = None,
    findings: Sequence[OdometryFinding] = (),
) -> FitResults:
    """The results document of a fit (written as the results JSON, which ``sysid report`` renders);
    ``findings`` are the odometry's lag and jumps (``screen_odometry``), kept as ``odometry_findings``."""
    rows = parameter_rows(cfg, initial, fit, calibration)
    return FitResults.from_dict(_finite(
        {
            **document_header(RESULTS_FORMAT, cfg.robot_name()),
            "simulator": {
                "name": cfg.simulator.name,
                "label": getattr(sim, "label", type(unwrap(sim)).__name__),
                "options": cfg.simulator.options,
            },
            "config": {
                **config_settings(cfg),
                "lr": cfg.fit.lr,
                "odometry_jumps": {"max_accel": cfg.data.jump_accel, "action": cfg.data.jump_action},
                "baseline": cfg.fit.baseline.enabled,
                "nuisance": list(cfg.fit.options.nuisance),
            },
            "generalisation": generalisation(runs, cfg.simulator.name, baseline),
            "baseline": dict(baseline) if baseline is not None else None,
            "dropped_runs": list(dropped),
            "odometry_findings": [dict(f) for f in findings],
            "parameters": rows,
            "nuisance": nuisance_rows(fit),
            "calibration": calibration,
            "fit": fit.summary(),
            "summary": summary,
            "runs": runs,
            "sweep": sweep.summary() if sweep else None,
            "timing": timing,
            "outputs": {"params": params_path, "report": report_path},
        }
    ))
