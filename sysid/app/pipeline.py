"""The ``sysid fit`` pipeline: load runs, calibrate, fit, fit the kinematic baseline on the same
training runs (``fit.baseline``), evaluate both on the held-out runs (per piece and per run),
sweep the timestep, and write parameters, results (JSON) and the HTML report — each written
atomically.

`run_fit` checks everything that needs no data first, then runs the named phases of
``FIT_PHASES`` (load, fit, baseline, evaluate, sweep, write) in order on one `FitRun`, which
holds what they share; the write phase assembles the results document
(`sysid.app.results.FitResults`). Every phase shows a tqdm progress bar (on stderr) when
``progress`` is true.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from ingest.errors import RunFormatError
from ingest.fileio import json_safe as _finite
from ingest.run import side_speeds
from sysid.app.config import (
    BASELINE,
    CACHE_SUFFIXES,
    FitConfig,
    build_baseline_parameters,
    check_steps,
    expand_sources,
    read_manifest,
    validate_runs,
    validate_static,
)
from sysid.app.findings import summary as odometry_summary
from sysid.app.findings import terminal_text as odometry_terminal_text
from sysid.app.outputs import commit_outputs, output_lock
from sysid.app.progress import EvaluationBar
from sysid.app.results import RESULTS_FORMAT, FitResults, config_settings, document_header
from sysid.app.warm import warm_kernels
from sysid.errors import ConfigError, DataError, SimulatorError, from_ingest
from sysid.fit.calibration import SETTLE, SPEED_WINDOW, calibrate, compared_runs
from sysid.fit.evaluation import evaluate
from sysid.fit.fanout import Fanout, check_workers, cluster, wants_ray
from sysid.fit.metrics import quat_yaw, turn_efficiency
from sysid.fit.optimizer import optimize
from sysid.fit.options import FitOptions
from sysid.fit.params import (
    EXTRA_UNITS,
    ParameterSet,
    Prior,
    atomic_write_text,
    default_params_path,
    load_params,
    save_params,
    unit_of,
)
from sysid.fit.residuals import NUISANCE_SPECS, align_start
from sysid.fit.sweep import Sweep, sweep_dt
from sysid.simulators.protocol import UNCONVERGED, Simulator, get_simulator, replay_health, resolve_factory, unwrap

if TYPE_CHECKING:
    from ingest.run import Run

MAX_POINTS = 800  # trajectory samples kept per series in results / report


REPLAY_WARN = 0.1  # [m/s] warn when a replay's worst step ends above this Newton residual
UNCONVERGED_WARN = 0.05  # or when more than this share of its steps ends above UNCONVERGED
LAG_WARN = 0.3  # [s] warn when a run's odometry speed trails its heading by more (ingest.quality.odometry_lag)


def make_simulator(cfg: FitConfig, robot: Mapping[str, Any]) -> Simulator:
    """The simulator ``cfg`` names, with its options (the engine with ``fit.jacobian`` as well)."""
    options = dict(cfg.simulator.options)
    if cfg.fit.jacobian is not None and cfg.simulator.name == "ostrich":  # fit.jacobian: the engine's option
        options["jacobian"] = cfg.fit.jacobian
    return get_simulator(cfg.simulator.name, robot=robot, **options)


# simulator options that describe the data, not the model: what a run starts from and how the odometry
# observes the motion; the kinematic baseline gets the config's settings of these too (same data,
# same sensor: sysid.simulators.observation, sysid.simulators.kinematic.INITIAL_SPEED)
SHARED_OPTIONS = ("initial_speed", "odom_history")


def baseline_simulator(cfg: FitConfig, robot: Mapping[str, Any]) -> Simulator:
    """The kinematic baseline with the config's `SHARED_OPTIONS`."""
    return get_simulator(BASELINE, robot=dict(robot), **baseline_options(cfg))


def baseline_options(cfg: FitConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.simulator.options.items() if k in SHARED_OPTIONS}


def fanout_of(cfg: FitConfig, robot: Mapping[str, Any], simulator: str | None = None) -> Fanout | None:
    """The fan-out of ``cfg.fit.workers`` / ``cfg.fit.ray_address`` (None when serial): each task builds its
    own simulator (``cfg``'s, or the registered ``simulator``, e.g. the kinematic baseline)."""
    if not wants_ray(cfg.fit.workers, cfg.fit.ray_address):
        return None
    make = (functools.partial(make_simulator, cfg, dict(robot)) if simulator is None
            else functools.partial(get_simulator, simulator, robot=dict(robot),
                                   **(baseline_options(cfg) if simulator == BASELINE else {})))
    return Fanout(workers=cfg.fit.workers, address=cfg.fit.ray_address, make_sim=make)


def accepted_parameters(cfg: FitConfig, robot: Mapping[str, Any]) -> tuple[Simulator, tuple[str, ...]]:
    """Build the simulator (cheap for every registered one) and return its parameter names."""
    resolve_factory(cfg.simulator.name)  # import errors surface as SimulatorError naming the simulator
    sim = make_simulator(cfg, robot)
    for name in getattr(sim, "positive_parameters", ()):  # what this simulator cannot take, before any work
        spec = cfg.parameters.get(name)
        if spec is not None and spec.bounds is not None and spec.bounds[0] <= 0:
            raise ConfigError(f"parameters.{name}: bounds [{spec.bounds[0]:g}, {spec.bounds[1]:g}] reach "
                              f"{spec.bounds[0]:g}, but simulator {cfg.simulator.name!r} needs {name} > 0; give a "
                              "lower bound above 0")
    return sim, tuple(sim.parameter_names)


CALIBRATION_MAX_ITER = 30  # residual evaluations of the command-scale calibration (LM)


def load_runs(cfg: FitConfig, sources: Sequence[Path], what: str, progress: bool = True) -> list[Run]:
    """Ingest each source (bag, run cache or JSON run file) into a ``Run``."""
    try:
        import ingest
        from ingest.run import Run
    except ImportError as exc:  # pragma: no cover - ingest is part of the repository
        raise DataError(f"the ingest package is not importable: {exc}") from exc
    from sysid.robot import load_robot  # the robot reader ingest is given (ingest.topicmap.RobotReader)

    runs = []
    # the fit robot's wheels: a bag's wheel columns are named by them, a run file's or a cached run's must
    # drive them (ingest.decode.WheelLayout)
    wheels = None
    for src in tqdm(list(sources), desc=f"load {what}", unit="run", disable=not progress, leave=False):
        with from_ingest(f"cannot ingest {str(src)!r}: ", DataError):
            if wheels is None:
                from ingest.topicmap import layout_from_robot
                from sysid._quiet import init_warp_quietly

                init_warp_quietly()  # sysid's robot reader may load newton (a URDF): without Warp's banner
                wheels = layout_from_robot(cfg.robot_path(), reader=load_robot)
            if src.suffix in CACHE_SUFFIXES:
                run = Run.load(src)
                wheels.run_columns(run.wheel_cmd.columns, run.name)
            elif src.suffix == ".json":
                loader = getattr(ingest, "load_helhest_json", None)
                if loader is None:
                    from ingest.load import load_helhest_json as loader
                run = loader(src, dt=cfg.data.ingest_dt, robot=wheels)
            else:
                loader = getattr(ingest, "load_run", None)
                if loader is None:
                    from ingest.load import load_run as loader
                topics = cfg.data.topics
                if isinstance(topics, str):
                    topics = cfg.resolve(topics)
                run = loader(src, config=topics, dt=cfg.data.ingest_dt, cache=cfg.data.ingest_cache, progress=False,
                             robot=wheels, robot_reader=load_robot)
        run.meta.setdefault("source", [str(src)])
        run.meta = {**run.meta, "odometry_lag": _odometry_lag(run)}  # whole run: pieces inherit it
        runs.append(run)
    runs = split_runs(runs, cfg.data.split) if cfg.data.split else runs
    if cfg.data.jump_accel is not None:
        from ingest.quality import odometry_jumps

        for run in runs:  # per piece: a jump in one piece says nothing about the others
            with from_ingest(f"run {run.name}: "):
                jumps = odometry_jumps(run.odom, cfg.data.jump_accel)
            run.meta = {**run.meta, "odometry_jumps": [j.as_dict() for j in jumps]}
    return runs


def replay_warnings(runs: Sequence[Run], metrics: Sequence[Mapping[str, float]],
                    health: Sequence[Mapping[str, float] | None] | None, when: str = "",
                    only_diverged: bool = False) -> list[str]:
    """A warning per replay whose errors are not finite (diverged: its figures and the means over them
    are written as n/a), per engine replay whose Newton solve diverged in some step, and, unless
    ``only_diverged``, per engine replay whose solve was poor: the worst step's Newton residual above
    ``REPLAY_WARN`` or more than ``UNCONVERGED_WARN`` of its steps above ``UNCONVERGED`` [m/s] (a fit
    reported converged on such replays fits solver error as well)."""
    out = []
    for run, m, h in zip(runs, metrics, health or [None] * len(runs), strict=True):
        bad = [k for k, v in m.items() if v is None or not math.isfinite(v)]
        if bad:
            out.append(f"{run.name}{when}: {', '.join(bad)} not finite: the replay diverged (or the odometry is out "
                       "of range); its errors and the means over them are written as n/a (narrow the parameters' "
                       "bounds, try a smaller fit.dt, or check the run)")
        elif h is not None and not math.isfinite(h["residual_max"]):
            out.append(f"engine replay of {run.name}{when}: the Newton solve diverged in some steps (a non-finite "
                       f"residual; {h['unconverged_steps']:.0%} of steps above {UNCONVERGED:g} m/s): its errors "
                       "include solver failure (try simulator.options.extra_iters: 48, a smaller fit.dt or narrower "
                       "bounds)")
        elif h is not None and not only_diverged and (h["residual_max"] > REPLAY_WARN
                                                      or h["unconverged_steps"] > UNCONVERGED_WARN):
            out.append(f"engine replay of {run.name}{when}: {h['unconverged_steps']:.0%} of steps above "
                       f"{UNCONVERGED:g} m/s, worst Newton residual {h['residual_max']:.2g} m/s (errors there include "
                       "solver error; try simulator.options.extra_iters: 48)")
    return out


def load_warnings(runs: Sequence[Run]) -> list[str]:
    """What ingest warned about while loading the runs (``meta["warnings"]``: a wheel log overlapping
    the odometry only in part, a robot it could not check), once per whole run."""
    out: list[str] = []
    for run in runs:
        out += [str(w) for w in run.meta.get("warnings") or [] if str(w) not in out]
    return out


def _odometry_lag(run: Run) -> dict[str, float] | None:
    """``ingest.quality.odometry_lag`` of a whole run as a dict; None when it cannot be measured
    (a run too short or standing still) or its correlations are too weak to mean anything."""
    from ingest.errors import DataError as IngestDataError
    from ingest.quality import MIN_CORRELATION, odometry_lag

    try:
        lag = odometry_lag(run)
    except IngestDataError:
        return None
    return lag.as_dict() if min(lag.r_translation, lag.r_yaw) >= MIN_CORRELATION else None


def screen_odometry(cfg: FitConfig, runs: Sequence[Run], split: str, required: bool = True
                    ) -> tuple[list[Run], list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs (or pieces) whose odometry jumps (``load_runs`` found them): with ``data.odometry_jumps.action:
    drop`` they leave the set (returned as records for the results); with ``report`` they stay. A run
    whose odometry speed trails its heading by more than ``LAG_WARN`` [s] (``meta['odometry_lag']``) is
    named once, however many pieces it is cut into. Returns (kept runs, dropped records, findings): one
    finding per lagging run and per run or piece with jumps (``sysid.app.findings``: printed and reported
    as one table). A ``required`` set that loses every run stops with a DataError."""
    kept, dropped, findings = [], [], []
    lagging = {}
    for run in runs:
        lag = run.meta.get("odometry_lag")
        if lag and lag["delay"] > LAG_WARN:
            lagging.setdefault(run.meta.get("split_of", run.name), lag)
    modelled = "odom_delay" in cfg.parameters  # the observation model of sysid.simulators.observation
    for name, lag in lagging.items():
        how = ("modelled by the fitted odom_delay (sysid.simulators.observation)" if modelled else
               "not modelled: replays score that lag; fit odom_delay to model it, docs/fit.md")
        findings.append({
            "split": split, "run": name, "piece": None, "kind": "lag", "action": "modelled" if modelled else "scored",
            "speed_lag_s": float(lag["translation"]), "heading_lag_s": float(lag["yaw"]),
            "text": f"{split} run {name!r}: its odometry speed trails the wheels by {lag['translation']:.2f} s but "
                    f"its heading by {lag['yaw']:.2f} s (lidar odometry reporting the path late); {how}",
        })
    for run in runs:
        jumps = run.meta.get("odometry_jumps") or []
        if not jumps:
            kept.append(run)
            continue
        t0 = float(run.odom["t"].iloc[0]) - float(run.meta.get("split_start_s", 0.0))  # times from the run's start
        times = [round(float(j["t"]) - t0, 3) for j in jumps]
        where = ", ".join(f"{t:.2f} s" for t in times[:6]) + (" ..." if len(jumps) > 6 else "")
        step, accel = max(float(j["step"]) for j in jumps), max(float(j["accel"]) for j in jumps)
        what = (f"{split} run {run.name!r}: {len(jumps)} odometry jump(s) at {where} (implied acceleration up to "
                f"{accel:.0f} m/s^2, step up to {step:.2f} m; above {cfg.data.jump_accel:g} m/s^2 is not motion "
                "but the odometry relocalising)")
        whole = run.meta.get("split_of")
        finding = {"split": split, "run": whole or run.name, "piece": run.name if whole else None, "kind": "jumps",
                   "times_s": times, "max_step_m": step, "max_accel": accel}
        if cfg.data.jump_action == "drop":
            dropped.append({"name": run.name, "split": split, "reason": "odometry jumps", "jumps": jumps,
                            "duration_s": run.duration})
            findings.append({**finding, "action": "dropped",
                             "text": what + ": dropped (data.odometry_jumps.action: drop)"})
        else:
            kept.append(run)
            findings.append({**finding, "action": "scored", "text": what + ": its score includes them "
                             "(data.odometry_jumps.action: drop leaves such runs out)"})
    if required and runs and not kept:
        raise DataError(f"no {split} run is left: all {len(dropped)} have odometry jumps and "
                        "data.odometry_jumps.action is drop (use data.split to keep their clean pieces, or "
                        "action: report)")
    return kept, dropped, findings


def split_runs(runs: Sequence[Run], seconds: float) -> list[Run]:
    """Cut each run into consecutive pieces of about ``seconds`` [s] (``round(duration / seconds)``
    equal pieces, at least one), each replayed from its own first odometry sample: open-loop
    replays of a long run measure mostly how heading errors compound, pieces measure the model
    over a fixed horizon (the paper's 10 s runs). A piece is named ``run[a-b s]`` (times from the
    run's start) and keeps its parent's name in ``meta['split_of']`` (for ``fit.weights``)."""
    out = []
    for run in runs:
        t = run.odom["t"].to_numpy(float)
        dur = float(t[-1] - t[0])
        n = max(1, int(round(dur / seconds)))
        if n == 1:
            out.append(run)
            continue
        edges = t[0] + dur * np.arange(n + 1) / n
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            piece = run.slice(float(a), float(b), name=f"{run.name}[{a - t[0]:.1f}-{b - t[0]:.1f} s]")
            if len(piece.odom) < 2:
                raise DataError(f"run {run.name!r}: the piece {a - t[0]:.1f}-{b - t[0]:.1f} s holds fewer than 2 "
                                "odometry samples; use a longer data.split")
            piece.meta = {**run.meta, "split_of": run.name, "split_start_s": float(a - t[0])}
            out.append(piece)
    return out


def _downsample(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(int))


def _series(pose: np.ndarray, idx: np.ndarray, origin: np.ndarray | None = None) -> dict[str, list[float]]:
    p = np.asarray(pose, float)
    if origin is not None:  # plotted as scored: simulated start translated onto the first odometry sample
        p = align_start(p, origin)
    p = p[idx]
    yaw = np.unwrap(quat_yaw(p[:, 4:8]))
    return {"x": p[:, 1].tolist(), "y": p[:, 2].tolist(), "z": p[:, 3].tolist(), "yaw": yaw.tolist()}


def _run_meta(run: Any) -> dict[str, Any]:
    meta = run.meta or {}
    keep = {
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
    return _finite(keep)


def skid_steer_geometry(robot: Mapping[str, Any]) -> tuple[float, float] | None:
    """(wheel radius, track width) [m] of a robot description, None when it does not give both."""
    try:
        return float(robot["wheels"]["radius"]), float(robot["skid_steer"]["track_width"])
    except (KeyError, TypeError, ValueError):
        return None


def run_entries(
    runs: Sequence[Run],
    split: str,
    poses_initial: Sequence[np.ndarray],
    poses_final: Sequence[np.ndarray],
    metrics_initial: Sequence[Mapping[str, float]],
    metrics_final: Sequence[Mapping[str, float]],
    geometry: tuple[float, float] | None = None,
    poses_baseline: Sequence[np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """Per-run records for the results file and the report (trajectories downsampled). With the
    robot's ``geometry`` (wheel radius, track width [m]) each record holds ``turns``: the heading
    turned per heading the wheels command, by turn tightness (``metrics.turn_efficiency``); with
    ``poses_baseline`` (the kinematic baseline's replays) ``sim_baseline``."""
    out = []
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
            try:  # the sides' mean wheel speeds (any wheel set whose columns name their side)
                left, right = side_speeds(cmd, (getattr(run, "meta", None) or {}).get("wheel_sides"))
            except RunFormatError:
                left = right = None
            if left is not None:
                turns = turn_efficiency(meas[:, 0], np.interp(meas[:, 0], cmd["t"], left),
                                        np.interp(meas[:, 0], cmd["t"], right), yaws, *geometry)
        pallet = None
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
                    **({"sim_baseline": _series(poses_baseline[i][:n], idx, meas[0, 1:4])}
                       if poses_baseline is not None and len(poses_baseline[i]) >= n else {}),
                    "metrics_initial": dict(metrics_initial[i]),
                    "metrics_identified": dict(metrics_final[i]),
                    "segments": {k: list(v) for k, v in run.segments.items()},
                    "pallet": pallet,
                    "meta": _run_meta(run),
                    "turns": turns,
                }
            )
        )
    return out


def parent_run(run: Run) -> str:
    """The name of the logged run a run or piece (``data.split``) comes from."""
    return str((run.meta or {}).get("split_of", run.name))


GENERALISATION_KEYS = ("mean_xy", "combined")  # [m] the figures the report's first section compares


def _mean(values: Any) -> float:
    """Mean of metric values; None (a non-finite value in the results) counts as infinite."""
    vals = [math.inf if v is None else float(v) for v in values]
    return float(np.mean(vals)) if vals else math.nan


def aggregate_split(entries: Sequence[Mapping[str, Any]], keys: Sequence[str] = GENERALISATION_KEYS
                    ) -> dict[str, Any]:
    """Per logged run, the mean over its pieces of each metric in ``keys``, for the model
    (``metrics_identified``) and, where every entry has them, the same simulator at the config's
    starting values (``start``: ``metrics_initial``) and the kinematic baseline
    (``metrics_baseline``); plus the mean over runs (each run counts once, however many pieces it
    was cut into) and over pieces. ``entries`` are run records of one split (``run_entries``);
    pieces are grouped by their ``run`` (the parent run's name; the entry's own name without it),
    in order of first appearance. A diverged piece (non-finite metric) makes its run's mean infinite."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries:
        groups.setdefault(str(e.get("run") or e["name"]), []).append(e)
    fields = {"model": "metrics_identified"}
    if entries and all(e.get("metrics_initial") for e in entries):
        fields["start"] = "metrics_initial"
    if entries and all(e.get("metrics_baseline") for e in entries):
        fields["baseline"] = "metrics_baseline"
    runs = [
        {"run": name, "pieces": [str(e["name"]) for e in es],
         **{who: {k: _mean(e[f][k] for e in es) for k in keys} for who, f in fields.items()}}
        for name, es in groups.items()
    ]
    return {
        "n_runs": len(runs),
        "n_pieces": len(entries),
        "runs": runs,
        "mean_over_runs": {who: {k: _mean(r[who][k] for r in runs) for k in keys} for who in fields},
        "mean_over_pieces": {who: {k: _mean(e[f][k] for e in entries) for k in keys} for who, f in fields.items()},
    }


def model_label(simulator: str) -> str:
    return "the engine" if simulator == "ostrich" else f"the {simulator} simulator"


# what the identified model is compared with, in the order every table shows them
REFERENCES = {"start": "its starting values", "baseline": "the kinematic baseline"}
REFERENCE_COLUMNS = {"model": "identified", "start": "starting values", "baseline": "kinematic baseline"}


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
    who = ["model", *refs]
    return (f"{model} {head} on the {what} runs: mean xy distance over {n} run{'s' if n != 1 else ''}: "
            + ", ".join(f"{REFERENCE_COLUMNS[w]} {f(means[w]['mean_xy'])}" + (" m" if f(means[w]["mean_xy"])[0]
                                                                               != "d" else "") for w in who)
            + f" (lower {wins}); combined error "
            + " / ".join(f(means[w]["combined"]) for w in who) + " m")


def generalisation(runs: Sequence[Mapping[str, Any]], simulator: str, baseline: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The report's first section: per split, ``aggregate_split`` of its run records and the verdict."""
    out: dict[str, Any] = {
        "model": simulator,
        "baseline": BASELINE if baseline and baseline.get("status") == "fitted" else None,
        "baseline_skipped": (baseline or {}).get("reason") if (baseline or {}).get("status") != "fitted" else None,
        "keys": list(GENERALISATION_KEYS),
    }
    for split, what in (("held_out", "held-out"), ("train", "training")):
        entries = [r for r in runs if r["split"] == split]
        if entries:
            block = aggregate_split(entries)
            block["verdict"] = verdict(block, what, model_label(simulator))
            block["in_sample"] = split == "train"
            out[split] = block
    return _finite(out)


def _windows(cfg: FitConfig, runs: Sequence[Run]) -> list[tuple[float, float] | None] | None:
    if cfg.fit.segment is None:
        return None
    return [tuple(r.segments[cfg.fit.segment]) for r in runs]


def calibrate_and_fit(
    cfg: FitConfig,
    sim: Simulator,
    train: Sequence[Run],
    params: ParameterSet,
    dt: float,
    *,
    optimizer: str,
    max_iter: int,
    progress: bool = True,
    timing: dict[str, float] | None = None,
    label: str = "",
    options: FitOptions | None = None,
    fanout: Fanout | None = None,
) -> tuple[Any, dict[str, Any] | None]:
    """Calibrate ``cfg.fit.calibration.parameter`` on its segment (when enabled and ``params`` has it),
    then fit the free parameters on ``train``: the same procedure for the model and the baseline.
    ``params`` receives the calibrated value; returns (FitResult, calibration record or None).
    ``timing`` (when given) receives ``calibrate`` / ``fit`` wall times [s] (prefixed by ``label``);
    ``options`` replaces ``cfg.fit.options``; ``fanout``: where a multi-start's batches and
    refinement fits may run (``sysid.fit.optimizer.optimize``)."""
    timing = {} if timing is None else timing
    initial_frozen = {p.name: p.frozen for p in params}
    calibration = None
    skipped = None
    if (cfg.fit.calibration.enabled and cfg.fit.calibration.parameter in params
            and not compared_runs(train, cfg.fit.calibration.segment)):
        # the segment exists (checked with the config) but every piece is too short: the parameter
        # joins the fit rather than the whole fit failing on a default the user did not choose
        skipped = (f"calibration of {cfg.fit.calibration.parameter!r} skipped: no training run's "
                   f"{cfg.fit.calibration.segment!r} segment lasts past the replay's first {SETTLE:g} s plus "
                   f"{SPEED_WINDOW:g} s (pieces of data.split too short?); it is fitted with the other parameters")
    elif cfg.fit.calibration.enabled and cfg.fit.calibration.parameter in params:
        t0 = time.perf_counter()
        with EvaluationBar(f"{label}calibrate {cfg.fit.calibration.parameter} (LM)", CALIBRATION_MAX_ITER,
                           enabled=progress) as bar:
            cal = calibrate(
                sim,
                train,
                params,
                dt,
                parameter=cfg.fit.calibration.parameter,
                segment=cfg.fit.calibration.segment,
                lever_arm=cfg.fit.lever_arm,
                max_iter=CALIBRATION_MAX_ITER,
                progress=bar,
            )
            bar.done(cal.fit)
        target = params[cfg.fit.calibration.parameter]
        target.value = cal.value
        std = cal.fit.std.get(cal.parameter, math.inf)
        carry = cfg.fit.calibration.carry
        if carry == "prior" and not (math.isfinite(std) and std > 0):
            carry = "freeze"  # an unbounded (or zero) std is no prior: keep the calibrated value
            cal.fit.warnings.append(f"calibration of {cal.parameter!r} has no finite std; frozen, not a prior")
        if carry == "prior" and not initial_frozen[cfg.fit.calibration.parameter]:
            target.prior = Prior(cal.value, std)  # free, but its calibration's information enters the fit
        else:
            target.frozen = True
        calibration = {
            "carry": carry if not target.frozen else "freeze",
            "parameter": cal.parameter,
            "segment": cal.segment,
            "value": cal.value,
            "runs": cal.runs,
            "skipped": cal.skipped,
            "std": cal.fit.std.get(cal.parameter),
            "interval": list(cal.fit.intervals.get(cal.parameter, (math.nan, math.nan))),
            "loss_initial": cal.fit.loss_initial,
            "loss_final": cal.fit.loss_final,
            "warnings": cal.fit.warnings,
        }
        timing[f"{label}calibrate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    weights = [cfg.fit.weights.get(r.name, cfg.fit.weights.get(r.meta.get("split_of", ""), 1.0)) for r in train]
    bar = EvaluationBar(f"{label}fit ({optimizer})", max_iter, enabled=progress)
    with bar:
        fit = optimize(
            sim,
            train,
            params,
            dt,
            optimizer=optimizer,
            max_iter=max_iter,
            lever_arm=cfg.fit.lever_arm,
            windows=_windows(cfg, train),
            weights=weights,
            prior_scale=cfg.fit.prior_scale,
            lr=cfg.fit.lr,
            progress=bar,
            options=cfg.fit.options if options is None else options,
            fanout=fanout,
        )
        bar.done(fit)
    timing[f"{label}fit"] = time.perf_counter() - t0
    if skipped is not None:
        fit.warnings.append(skipped)
    if calibration is not None and calibration["carry"] == "freeze":
        fit.params[cfg.fit.calibration.parameter].frozen = initial_frozen[cfg.fit.calibration.parameter]
    return fit, calibration


def baseline_status(cfg: FitConfig, sim: Simulator) -> str | None:
    """Why the kinematic baseline is not fitted (None: it is)."""
    from sysid.simulators.kinematic import KinematicSkidSteer

    if not cfg.fit.baseline.enabled:
        return "not fitted (fit.baseline: false or --no-baseline)"
    if cfg.simulator.name == BASELINE or isinstance(unwrap(sim), KinematicSkidSteer):
        return f"not fitted: the model is itself the {BASELINE} baseline"
    return None


def fit_baseline(
    cfg: FitConfig,
    bparams: ParameterSet,
    bsim: Simulator,
    train: Sequence[Run],
    held: Sequence[Run],
    progress: bool = True,
    timing: dict[str, float] | None = None,
    fanout: Fanout | None = None,
) -> tuple[dict[str, Any], dict[str, list[dict[str, float]]], dict[str, list[np.ndarray]]]:
    """Fit the kinematic baseline on the model's training runs (the same pieces, screening,
    segment, lever arm, weights and calibration) at ``cfg.fit.baseline.dt`` with LM, and score it on
    the same runs. Returns (the results' ``baseline`` record, per split the per-run metrics, per split
    the per-run replayed poses)."""
    t_all = time.perf_counter()
    initial = bparams.copy()
    # the same nuisance as the model where the baseline has it (the kinematic model has no initial
    # state to correct): either way the nuisance is fitted on the training runs only
    accepted = getattr(bsim, "nuisance_names", ())
    options = dataclasses.replace(cfg.fit.options, nuisance=tuple(n for n in cfg.fit.options.nuisance
                                                                  if n in accepted))
    fit, calibration = calibrate_and_fit(cfg, bsim, train, bparams, cfg.fit.baseline.dt, optimizer="lm",
                                         max_iter=cfg.fit.baseline.max_iter, progress=progress, label="baseline ",
                                         options=options, fanout=fanout)
    # the baseline is a reference, not what the user tunes: its undetermined parameters in one line
    loose = [n for n, i in fit.identifiability.items() if i["status"] == "not determined"]
    if loose:
        fit.warnings = [w for w in fit.warnings if not (" is not determined by these runs" in w
                                                        or w.startswith("ill-conditioned fit"))]
        fit.warnings.append(f"not determined by these runs: {', '.join(loose)} (the baseline's own fit; a reference "
                            "for the model, nothing to act on)")
    metrics: dict[str, list[dict[str, float]]] = {}
    poses: dict[str, list[np.ndarray]] = {}
    for split, runs in (("train", train), ("held_out", held)):
        if runs:
            metrics[split], poses[split] = evaluate(bsim, runs, fit.params.values(), cfg.fit.baseline.dt,
                                         lever_arm=cfg.fit.lever_arm, windows=_windows(cfg, runs))
    record = {
        "simulator": BASELINE,
        "label": getattr(bsim, "label", type(bsim).__name__),
        "status": "fitted",
        "reason": None,
        "dt": cfg.fit.baseline.dt,
        "optimizer": "lm",
        "max_iter": cfg.fit.baseline.max_iter,
        "parameters": parameter_rows(cfg, initial, fit, calibration, truth=False),
        "calibration": calibration,
        "fit": fit.summary(),
        "wall_time": time.perf_counter() - t_all,
    }
    if timing is not None:
        timing["baseline"] = record["wall_time"]
    return record, metrics, poses


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
    dropped: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    initial: ParameterSet | None = None  # the parameters before calibration and fit
    # fit
    fit: Any = None  # sysid.fit FitResult
    calibration: dict[str, Any] | None = None
    # baseline
    baseline: dict[str, Any] = dataclasses.field(default_factory=dict)
    bmetrics: dict[str, list[dict[str, float]]] = dataclasses.field(default_factory=dict)
    bposes: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    # evaluate
    runs_out: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    # sweep
    sweep: Sweep | None = None
    # write
    results: FitResults | None = None


def _phase_load(st: FitRun) -> None:
    """Ingest the training and held-out runs, screen their odometry, check they hold what the fit needs."""
    cfg = st.cfg
    t0 = time.perf_counter()
    train = load_runs(cfg, st.train_src, "train", st.progress)
    held = load_runs(cfg, st.held_src, "held-out", st.progress)
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
    if st.bparams is not None:
        st.baseline, st.bmetrics, st.bposes = fit_baseline(st.cfg, st.bparams, st.bsim, st.train, st.held,
                                                           st.progress, st.timing,
                                                           fanout=fanout_of(st.cfg, st.robot, BASELINE))
    else:
        st.baseline, st.bmetrics = {"simulator": BASELINE, "status": "skipped", "reason": st.skip_baseline}, {}


def _phase_evaluate(st: FitRun) -> None:
    """Replay every run at the initial and the identified parameters: per-run entries and per-split means."""
    cfg, sim, fit = st.cfg, st.sim, st.fit
    assert st.initial is not None
    t0 = time.perf_counter()
    for split, runs in (("train", st.train), ("held_out", st.held)):
        if not runs:
            continue
        with tqdm(total=2, desc=f"evaluate {split}", disable=not st.progress, leave=False) as ebar:
            m0, p0 = evaluate(sim, runs, st.initial.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                              windows=_windows(cfg, runs))
            ebar.update(1)
            m1, p1 = evaluate(
                sim, runs, fit.params.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm, windows=_windows(cfg, runs)
            )
            health = replay_health(sim, runs)
            ebar.update(1)
        entries = run_entries(runs, split, p0, p1, m0, m1, skid_steer_geometry(st.robot), st.bposes.get(split))
        for entry, mb in zip(entries, st.bmetrics.get(split) or [], strict=False):
            entry["metrics_baseline"] = _finite(dict(mb))
        for entry, h in zip(entries, health or [], strict=False):
            entry["solver"] = h
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


def moved_most(initial: ParameterSet, identified: ParameterSet, names: Sequence[str], n: int = 3
               ) -> list[tuple[str, float]]:
    """The ``n`` parameters of ``names`` that moved most from ``initial`` to ``identified``, with the
    move as a share of the bound range (on a log scale for log-scaled parameters), largest first."""
    moves = []
    for name in names:
        p, a, b = identified[name], initial[name].value, identified[name].value
        if p.log_scale and a > 0 and b > 0:
            share = abs(math.log(b / a)) / math.log(p.upper / p.lower)
        else:
            share = abs(b - a) / p.span
        moves.append((name, share))
    return sorted(moves, key=lambda m: -m[1])[:n]


def start_warning(block: Mapping[str, Any], initial: ParameterSet, identified: ParameterSet,
                  calibration: Mapping[str, Any] | None = None) -> str | None:
    """A warning when the identified parameters predict the held-out runs of ``block``
    (``aggregate_split``) worse than the starting values (mean over runs of the mean xy distance),
    naming the parameters that moved most and what to do; None otherwise."""
    means = block.get("mean_over_runs") or {}
    if "start" not in means:
        return None
    m, s0 = means["model"]["mean_xy"], means["start"]["mean_xy"]
    m = math.inf if m is None else float(m)
    if s0 is None or not m > float(s0):
        return None
    cal = (calibration or {}).get("parameter")
    names = [p.name for p in identified if not p.frozen or p.name == cal]
    moved = ", ".join(
        f"{name} {initial[name].value:.4g} -> {identified[name].value:.4g}"
        + (f" {unit_of(name)}" if unit_of(name) not in ("", "1") else "")
        + f" ({share:.0%} of its range{', calibrated' if name == cal else ''})"
        for name, share in moved_most(initial, identified, names) if share > 0)
    n = block["n_runs"]
    return (f"the identified parameters predict the held-out runs worse than the starting values: mean xy distance "
            f"{'diverged' if not math.isfinite(m) else f'{m:.3f}'} vs {float(s0):.3f} m over {n} "
            f"run{'s' if n != 1 else ''}; what the fit gained on the training runs does not carry to new runs. "
            + (f"The parameters that moved most: {moved}. " if moved else "")
            + "Freeze them at values from another source or give them priors (parameters.<name>.prior: "
            "{mean, std}, the strength chosen by sysid cv, never by a held-out run), free first the parameters "
            "these runs determine (the parameter table's 'determined'), and compare the choices with sysid cv")


def _phase_sweep(st: FitRun) -> None:
    """The held-out error over the timestep grid at the identified parameters (``sweep.enabled``)."""
    cfg = st.cfg
    if cfg.sweep.enabled:
        t0 = time.perf_counter()
        held, train = st.held, st.train
        sweep_runs = {"held_out": held or train, "train": train, "all": list(train) + list(held)}[cfg.sweep.runs]
        with tqdm(total=len(cfg.sweep.dts), desc="sweep dt", unit="dt", disable=not st.progress,
                  leave=False) as sbar:
            st.sweep = sweep_dt(
                st.sim,
                sweep_runs,
                st.fit.params.values(),
                cfg.sweep.dts,
                lever_arm=cfg.fit.lever_arm,
                windows=_windows(cfg, sweep_runs),
                fanout=fanout_of(cfg, st.robot),
                progress=lambda _h: sbar.update(1),
            )
        st.timing["sweep"] = time.perf_counter() - t0


def _phase_write(st: FitRun) -> None:
    """Assemble the results document; with ``write``, commit the parameter file, results JSON and report."""
    assert st.initial is not None
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


def output_paths(cfg: FitConfig) -> tuple[Path, Path, Path]:
    """(parameter file, results JSON, HTML report) of a fit: the config's (or command line's) paths,
    else the defaults ``models/<robot>/params-<date>.yaml``, ``reports/fit-<robot>-<date>.html`` and
    the report path with ``.json``."""
    params_path = Path(cfg.output.params) if cfg.output.params else default_params_path(cfg.robot_name())
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    report_path = (Path(cfg.output.report) if cfg.output.report
                   else Path("reports") / f"fit-{cfg.robot_name()}-{date}.html")
    results_path = Path(cfg.output.results) if cfg.output.results else report_path.with_suffix(".json")
    return params_path, results_path, report_path


def input_files(cfg: FitConfig, train: Sequence[Path] | None = None, held: Sequence[Path] | None = None
                ) -> list[tuple[str, Path]]:
    """Every input file of a config, (what, path) for messages: the config file, the robot
    description, the manifest, the topic map and the runs (``train`` and ``held``, else the config's
    lists expanded; a list that cannot be expanded is left to the check that reports it)."""
    found: list[tuple[str, Path]] = []
    if cfg.source not in ("<defaults>", "<mapping>"):
        found.append(("the config", Path(cfg.source)))
    try:
        found.append(("the robot description", cfg.robot_path()))
    except ConfigError:
        pass
    if cfg.data.manifest:
        found.append(("the manifest", cfg.resolve(str(cfg.data.manifest))))
    if isinstance(cfg.data.topics, str):
        found.append(("the topic map", cfg.resolve(cfg.data.topics)))
    if train is None or held is None:
        try:
            train_pats, held_pats = list(cfg.data.train), list(cfg.data.held_out)
            if cfg.data.manifest:
                mt, mh, _truth = read_manifest(cfg)
                train_pats, held_pats = train_pats or mt, held_pats or mh
            train = expand_sources(cfg, train_pats, "data.train")
            held = expand_sources(cfg, held_pats, "data.held_out")
        except ConfigError:
            train, held = train or [], held or []
    found += [("the training run", p) for p in train] + [("the held-out run", p) for p in held]
    return found


def check_inputs_kept(outputs: Sequence[tuple[str, str | Path]], inputs: Sequence[tuple[str, str | Path]],
                      hint: str) -> None:
    """ConfigError (before any work) when an output would overwrite an input (the same file, through
    any relative path, symlink or hard link); ``hint`` says which flags give the output another path."""
    from ingest.clikit import input_clash

    problem = input_clash(outputs, inputs)
    if problem:
        raise ConfigError(f"{problem}; nothing was computed or written (give the output another path: {hint})")


def check_output_paths(cfg: FitConfig, params_path: Path, results_path: Path, report_path: Path,
                       inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """ConfigError (before any work) when an output cannot be written where it would go, two outputs
    would be the same file, or an output would overwrite one of ``inputs`` (`input_files`); creates
    nothing."""
    from ingest.clikit import output_problem

    named = (
        (f"the parameter file{'' if cfg.output.params else ' (default)'}", params_path),
        (f"the report{'' if cfg.output.report else ' (default)'}", report_path),
        (f"the results file{'' if cfg.output.results else ' (default: the report with .json)'}", results_path),
    )
    seen: dict[Path, str] = {}
    for what, path in named:
        problem = output_problem(path, what)
        if problem:
            raise ConfigError(f"{problem}; nothing was computed or written (give another path: -o DIR, "
                              "--params-out, --results-out, --report-out or output.* in the config)")
        key = path.resolve()
        if key in seen:
            raise ConfigError(f"{what} and {seen[key]} are the same file {str(path)!r}: give them different paths "
                              "(--params-out, --results-out, --report-out)")
        seen[key] = what
    check_inputs_kept(named, inputs, "-o DIR, --params-out, --results-out, --report-out or output.* in the config")


def results_document(
    cfg: FitConfig,
    sim: Simulator,
    initial: ParameterSet,
    fit: Any,
    calibration: Any,
    runs: list[dict[str, Any]],
    summary: dict[str, Any],
    sweep: Sweep | None,
    timing: dict[str, float],
    params_path: str,
    report_path: str,
    dropped: Sequence[Mapping[str, Any]] = (),
    baseline: Mapping[str, Any] | None = None,
    findings: Sequence[Mapping[str, Any]] = (),
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


def nuisance_rows(fit: Any) -> list[dict[str, Any]]:
    """The results' nuisance table: per training run and nuisance parameter its fitted value and
    interval (not physics: never in the parameter file, 0 when any run is predicted)."""
    rows = []
    for run, values in getattr(fit, "nuisance", {}).items():
        for name, value in values.items():
            spec = NUISANCE_SPECS[name]
            iv = fit.nuisance_intervals.get(run, {}).get(name)
            rows.append({"run": run, "name": name, "value": value, "unit": spec.unit,
                         "description": spec.description, "bounds": [spec.lower, spec.upper],
                         "interval": list(iv) if iv is not None else None})
    return rows


def parameter_rows(cfg: FitConfig, initial: ParameterSet, fit: Any, calibration: Any, truth: bool = True
                   ) -> list[dict[str, Any]]:
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
    return _finite(rows)


def write_outputs(
    doc: FitResults,
    params: ParameterSet,
    robot: str,
    params_path: Path,
    results_path: Path,
    report_path: Path,
    progress: bool = False,
) -> None:
    """Render first (the slow, failure-prone part), then commit the three files together: every one is
    written to a temporary file beside its target, then all are renamed into place; a failure or an
    interruption (Ctrl-C) during the renames puts back what was renamed (the earlier files, or none), so
    either the whole set is written or none of it is (``OutputError`` says which file failed and that
    nothing was written)."""
    from sysid.app.report import render_report

    with tqdm(total=1, desc="render report", unit="report", disable=not progress, leave=False) as bar:
        html = render_report(doc, base=report_path.parent)
        bar.update(1)
    held = doc.runs_of("held_out")
    meta = {
        "simulator": doc.simulator.name,
        "dt": doc.config["dt"],
        "optimizer": doc.config["optimizer"],
        "train_runs": [r["name"] for r in doc.runs_of("train")],
        "held_out_runs": [r["name"] for r in held],
        "held_out_combined": {r["name"]: r["metrics_identified"]["combined"] for r in held},
        "held_out_mean_xy": {r["name"]: r["metrics_identified"]["mean_xy"] for r in held},
        "calibration": doc.calibration and {k: doc.calibration[k] for k in ("parameter", "segment", "value")},
        "report": str(report_path),
        "results": str(results_path),
        "warnings": list(doc.fit["warnings"])
        + ([odometry_summary(doc.odometry_findings)] if doc.odometry_findings else []),
    }
    gen = (doc.generalisation or {}).get("held_out")
    if gen:  # per held-out run (mean over its pieces), beside the starting values' and kinematic baseline's
        meta["held_out_per_run"] = {r["run"]: r["model"] for r in gen["runs"]}
        if "start" in gen["mean_over_runs"]:
            meta["start_held_out_per_run"] = {r["run"]: r["start"] for r in gen["runs"]}
        if "baseline" in gen["mean_over_runs"]:
            meta["baseline_held_out_per_run"] = {r["run"]: r["baseline"] for r in gen["runs"]}
        if gen.get("verdict"):
            meta["generalisation"] = gen["verdict"]
    base = doc.baseline or {}
    if base.get("status") == "fitted":  # what sysid evaluate replays the kinematic baseline at
        meta["baseline_parameters"] = {p["name"]: p["value"] for p in base.get("parameters") or []}
        meta["baseline_dt"] = base.get("dt")
    if doc.sweep and doc.sweep.get("plateau"):
        meta["dt_plateau"] = doc.sweep["plateau"]
    combine = (doc.simulator.options or {}).get("friction_combine")
    if combine:  # how mu_ground / mu_pallet combine with the wheels' (sysid plan builds its scene with it)
        meta["friction_combine"] = combine
    fit = doc.fit
    targets = [("parameter file", Path(params_path)), ("results", Path(results_path)), ("report", Path(report_path))]
    writers: dict[str, Callable[[Path], Any]] = {
        "parameter file": lambda tmp: save_params(
            tmp, params, robot=robot, intervals={k: tuple(v) for k, v in fit["intervals"].items()},
            std={k: v for k, v in fit["std"].items() if v is not None}, metadata=meta,
            notes={p["name"]: {"determined": p["determined"], "ci95_reaches": p.get("reaches")}
                   for p in doc.parameters if p.get("determined")}),
        "results": lambda tmp: atomic_write_text(tmp, json.dumps(doc.to_dict(), indent=1)),
        "report": lambda tmp: atomic_write_text(tmp, html),
    }
    commit_outputs(targets, writers)


def run_evaluate(cfg: FitConfig, params_file: str | Path, progress: bool = True,
                 outputs: Sequence[tuple[str, str | Path]] = ()) -> dict[str, Any]:
    """Held-out error of a parameter file on the configured held-out runs (or train runs if none),
    beside the same simulator at the config's starting values (``start``) and the kinematic baseline
    at the parameters its fit wrote into the file's metadata (``baseline``; absent when the file has
    none, ``baseline_skipped`` says why), per run and mean, with the verdict; ``outputs`` (what,
    path), the files the caller writes afterwards, must not be inputs."""
    check_inputs_kept(outputs, [("the parameter file", Path(params_file)), *input_files(cfg)], "-o/--output")
    robot = cfg.load_robot()
    sim, accepted = accepted_parameters(cfg, robot)
    ps, _doc = load_params(params_file, accepted=accepted)
    for name in getattr(sim, "positive_parameters", ()):
        if name in ps and ps[name].value <= 0:
            raise ConfigError(f"parameter file {str(params_file)!r}: {name} = {ps[name].value:g}, but simulator "
                              f"{cfg.simulator.name!r} needs {name} > 0")
    _p, train_src, held_src = validate_static(cfg, accepted, robot, need_train=False)
    sources = held_src or train_src
    if not sources:
        raise ConfigError("no runs to evaluate: give --runs, data.held_out or a manifest")
    runs, dropped, findings = screen_odometry(cfg, load_runs(cfg, sources, "runs", progress), "evaluated")
    check_steps(runs, [("fit.dt", cfg.fit.dt)])
    theta = {**_p.values(), **ps.values()}
    baseline, skipped = evaluate_baseline_of(cfg, robot, sim, (_doc or {}).get("metadata") or {}, params_file)
    with tqdm(total=3 if baseline else 2, desc="evaluate", disable=not progress, leave=False) as bar:
        metrics, _ = evaluate(sim, runs, theta, cfg.fit.dt, lever_arm=cfg.fit.lever_arm, windows=_windows(cfg, runs))
        health = replay_health(sim, runs) or [None] * len(runs)
        bar.update(1)
        start, _ = evaluate(sim, runs, _p.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                            windows=_windows(cfg, runs))
        bar.update(1)
        base_metrics = None
        if baseline:
            bsim, btheta, bdt = baseline
            check_steps(runs, [("the kinematic baseline's dt", bdt)])
            base_metrics, _ = evaluate(bsim, runs, btheta, bdt, lever_arm=cfg.fit.lever_arm,
                                       windows=_windows(cfg, runs))
            bar.update(1)
    entries = [{"name": r.name, "run": parent_run(r), "metrics_identified": m, "metrics_initial": m0,
                **({"metrics_baseline": base_metrics[i]} if base_metrics else {})}
               for i, (r, m, m0) in enumerate(zip(runs, metrics, start, strict=True))]
    block = aggregate_split(_finite(entries))
    block["verdict"] = verdict(block, "evaluated", model_label(cfg.simulator.name))

    def mean(ms: Sequence[Mapping[str, float]]) -> dict[str, float]:
        return {k: _mean(m[k] for m in ms) for k in ms[0]}

    return _finite(
        {
            "params": str(params_file),
            "dt": cfg.fit.dt,
            "simulator": cfg.simulator.name,
            "runs": [
                {"name": r.name, **m, "start": m0, **({"baseline": base_metrics[i]} if base_metrics else {}),
                 **({"solver": h} if h else {})}
                for i, (r, m, m0, h) in enumerate(zip(runs, metrics, start, health, strict=True))
            ],
            "mean": mean(metrics),
            "mean_start": mean(start),
            **({"mean_baseline": mean(base_metrics)} if base_metrics else {}),
            "baseline_skipped": skipped,
            "per_run": block,
            "verdict": block["verdict"],
            "dropped_runs": dropped,
            "odometry_findings": findings,
            "warnings": [*load_warnings(runs), *([odometry_summary(findings)] if findings else []),
                         *replay_warnings(runs, metrics, health)],
        }
    )


def evaluate_baseline_of(cfg: FitConfig, robot: Mapping[str, Any], sim: Simulator, meta: Mapping[str, Any],
                         params_file: str | Path
                         ) -> tuple[tuple[Simulator, dict[str, float], float] | None, str | None]:
    """The kinematic baseline a parameter file's fit scored beside the model: (simulator, its
    parameters, its timestep [s]) from the file's metadata (``baseline_parameters``, ``baseline_dt``),
    or None and why not."""
    status = baseline_status(cfg, sim)
    if status is not None:
        return None, status
    values = meta.get("baseline_parameters")
    if not isinstance(values, Mapping):
        return None, ("not in the parameter file (its fit ran without the baseline, or was written by an earlier "
                      "version): run sysid fit again to compare with it")
    bsim = baseline_simulator(cfg, robot)
    theta = build_baseline_parameters(cfg, robot, bsim.parameter_names).values()
    for name, v in values.items():
        if name in theta:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"parameter file {str(params_file)!r}: metadata.baseline_parameters.{name} must be "
                                  f"a finite number, got {v!r}")
            theta[name] = float(v)
    dt = meta.get("baseline_dt")
    dt = float(dt) if isinstance(dt, int | float) and not isinstance(dt, bool) and dt > 0 else cfg.fit.baseline.dt
    return (bsim, theta, dt), None


def run_sweep(cfg: FitConfig, params_file: str | Path | None, progress: bool = True,
              outputs: Sequence[tuple[str, str | Path]] = ()) -> Sweep:
    """The error over ``cfg.sweep.dts`` at a parameter file's values (else the nominals); ``outputs``
    as `run_evaluate`'s."""
    given = [("the parameter file", Path(params_file))] if params_file is not None else []
    check_inputs_kept(outputs, [*given, *input_files(cfg)], "-o/--output")
    robot = cfg.load_robot()
    sim, accepted = accepted_parameters(cfg, robot)
    base, train_src, held_src = validate_static(cfg, accepted, robot, need_train=False)
    theta = base.values()
    if params_file is not None:
        ps, _ = load_params(params_file, accepted=accepted)
        theta.update({k: v for k, v in ps.values().items() if k in accepted})
    sources = held_src or train_src
    if not sources:
        raise ConfigError("no runs for the sweep: give --runs, data.held_out or a manifest")
    if not cfg.sweep.dts:
        raise ConfigError("no timesteps to sweep: give --dts")
    runs, _dropped, findings = screen_odometry(cfg, load_runs(cfg, sources, "runs", progress), "swept")
    check_steps(runs, [("--dts", min(cfg.sweep.dts))])
    for w in load_warnings(runs):
        tqdm.write(f"warning: {w}", file=sys.stderr)
    if findings:
        tqdm.write(odometry_terminal_text(findings), file=sys.stderr)
    check_workers(cfg.fit.workers, cfg.fit.ray_address, "the timesteps")
    try:
        with cluster(cfg.fit.workers, cfg.fit.ray_address) as started:
            if started:  # a local cluster shares this machine's kernel cache: compile once, here
                warm_kernels(cfg, robot)
            with tqdm(total=len(cfg.sweep.dts), desc="sweep dt", unit="dt", disable=not progress,
                      leave=False) as bar:
                return sweep_dt(
                    sim,
                    runs,
                    theta,
                    cfg.sweep.dts,
                    lever_arm=cfg.fit.lever_arm,
                    windows=_windows(cfg, runs),
                    progress=lambda _h: bar.update(1),
                    fanout=fanout_of(cfg, robot),
                )
    except SimulatorError:
        raise
