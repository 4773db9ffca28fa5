"""The runs a command works on: ingested (`load_runs`), cut into pieces (`split_runs`), screened for
odometry lag and jumps (`screen_odometry`), and what loading and replaying them warns about
(`load_warnings`, `replay_warnings`). Shared by ``sysid fit``, ``evaluate``, ``sweep-dt`` and ``cv``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from sysid.app.config import FitConfig
from sysid.app.results import DroppedRun, OdometryFinding, SolverHealth
from sysid.app.sources import CACHE_SUFFIXES
from sysid.errors import DataError
from sysid.ingest_errors import from_ingest
from sysid.simulators.observation import DELAY, PRE_START_WINDOW, WHEELS_BEFORE
from sysid.simulators.protocol import UNCONVERGED

if TYPE_CHECKING:
    from ingest.run import Run

REPLAY_WARN = 0.1  # [m/s] warn when a replay's worst step ends above this Newton residual
UNCONVERGED_WARN = 0.05  # or when more than this share of its steps ends above UNCONVERGED
LAG_WARN = 0.3  # [s] warn when a run's odometry speed trails its heading by more (ingest.quality.odometry_lag)


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
                wheels.run_columns(list(run.wheel_cmd.columns), run.name)
            elif src.suffix == ".json":
                run = ingest.load_helhest_json(src, dt=cfg.data.ingest_dt, robot=wheels)
            else:
                topics = cfg.data.topics
                if isinstance(topics, str):
                    topics = cfg.resolve(topics)
                run = ingest.load_run(src, config=topics, dt=cfg.data.ingest_dt, cache=cfg.data.ingest_cache,
                                      progress=False, robot=wheels, robot_reader=load_robot)
        run.meta.setdefault("source", [str(src)])
        run.meta = {**run.meta, "odometry_lag": _odometry_lag(run)}  # whole run: pieces inherit it
        runs.append(run)
    runs = split_runs(runs, cfg.data.split, before=history_window(cfg)) if cfg.data.split else runs
    if cfg.data.jump_accel is not None:
        from ingest.quality import odometry_jumps

        for run in runs:  # per piece: a jump in one piece says nothing about the others
            with from_ingest(f"run {run.name}: "):
                jumps = odometry_jumps(run.odom, cfg.data.jump_accel)
            run.meta = {**run.meta, "odometry_jumps": [j.as_dict() for j in jumps]}
    return runs


def replay_warnings(runs: Sequence[Run], metrics: Sequence[Mapping[str, float | None]],
                    health: Sequence[SolverHealth | Mapping[str, float] | None] | None, when: str = "",
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
                    ) -> tuple[list[Run], list[DroppedRun], list[OdometryFinding]]:
    """Runs (or pieces) whose odometry jumps (``load_runs`` found them): with ``data.odometry_jumps.action:
    drop`` they leave the set (returned as records for the results); with ``report`` they stay. A run
    whose odometry speed trails its heading by more than ``LAG_WARN`` [s] (``meta['odometry_lag']``) is
    named once, however many pieces it is cut into. Returns (kept runs, dropped records, findings): one
    finding per lagging run and per run or piece with jumps (``sysid.app.findings``: printed and reported
    as one table). A ``required`` set that loses every run stops with a DataError."""
    kept: list[Run] = []
    dropped: list[DroppedRun] = []
    findings: list[OdometryFinding] = []
    lagging: dict[str, Mapping[str, float]] = {}
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
        finding: OdometryFinding = {"split": split, "run": whole or run.name, "piece": run.name if whole else None,
                                    "kind": "jumps", "times_s": times, "max_step_m": step, "max_accel": accel}
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


def history_window(cfg: FitConfig) -> float:
    """[s] How much of its parent's wheel log a piece keeps from before its start (``odom_history:
    wheels``): `PRE_START_WINDOW`, or the largest finite ``odom_delay`` (bound or nominal) the config's
    engine or baseline parameters allow when that is longer."""
    specs = [cfg.parameters.get(DELAY), cfg.fit.baseline.parameters.get(DELAY)]
    values = [v for s in specs if s is not None for v in (*(s.bounds or ()), s.nominal) if v is not None]
    return max([PRE_START_WINDOW] + [float(v) for v in values if math.isfinite(v)])


def split_runs(runs: Sequence[Run], seconds: float, before: float = PRE_START_WINDOW) -> list[Run]:
    """Cut each run into consecutive pieces of about ``seconds`` [s] (``round(duration / seconds)``
    equal pieces, at least one), each replayed from its own first odometry sample: open-loop
    replays of a long run measure mostly how heading errors compound, pieces measure the model
    over a fixed horizon (the paper's 10 s runs). A piece is named ``run[a-b s]`` (times from the
    run's start) and keeps its parent's name in ``meta['split_of']`` (for ``fit.weights``) and the
    parent's wheel log rows of the ``before`` [s] before its start in ``meta[WHEELS_BEFORE]``
    (``odom_history: wheels``; its own commands are its own rows only)."""
    out = []
    for run in runs:
        t = run.odom["t"].to_numpy(float)
        tw = run.wheel_cmd["t"].to_numpy(float)
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
            rows = (tw >= a - before) & (tw < a)
            kept = {str(c): [float(v) for v in run.wheel_cmd[c].to_numpy(float)[rows]] for c in run.wheel_cmd.columns}
            piece.meta = {**run.meta, "split_of": run.name, "split_start_s": float(a - t[0]), WHEELS_BEFORE: kept}
            out.append(piece)
    return out


def parent_run(run: Run) -> str:
    """The name of the logged run a run or piece (``data.split``) comes from."""
    return str((run.meta or {}).get("split_of", run.name))


def score_windows(cfg: FitConfig, runs: Sequence[Run]) -> list[tuple[float, float] | None] | None:
    """Per run, the (start, end) [s] of the segment ``fit.segment`` scores; None when whole runs are scored."""
    if cfg.fit.segment is None:
        return None
    return [(a, b) for a, b in (r.segments[cfg.fit.segment] for r in runs)]
