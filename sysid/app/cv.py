"""Cross-validated identification (``sysid cv``): every fold fits the model and the kinematic
baseline on the same training runs with the config's settings and scores both on its held-out runs.

Folds are formed over a config's runs, training and held-out lists together (the manifest's too):

- ``"loo"`` (leave-one-run-out): one fold per logged run;
- an integer K >= 2: K folds of consecutive runs in the config's order (``numpy.array_split``;
  ``shuffle_seed`` permutes the runs first, seeded);
- ``"blocks"``: the runs in name order (numbers compared as numbers: step_9 before step_10) cut into
  ``cv.blocks`` contiguous blocks, one held out per fold and the runs of the other blocks trained on,
  less ``cv.gap`` runs on each side of the held-out block (neighbouring runs of a logged sequence,
  e.g. the consecutive steps of a command sweep, share command regions: a fold must not train on
  the neighbours of what it scores);
- a list of folds (config ``cv.folds``): each the run names it holds out (trained on every other
  run) or ``{held_out: [...], train: [...]}``; the held-out sets must be disjoint.

``cv.train_per_fold`` / ``cv.held_out_per_fold`` keep at most that many of a fold's training /
held-out runs, evenly spread over them in their order (first and last kept): a reduced-scale CV
whose folds still cover their blocks.

Folds are formed over *logged runs* (sources), never over pieces: with ``data.split`` every fit
cuts its runs into pieces after the fold is chosen, so a run's pieces are held out together and
its held-out figure is the mean over its pieces (``sysid.app.results.aggregate_split``). Each fold is
one ``sysid.app.pipeline.run_fit`` on a copy of the config (``data.train`` = the other runs,
``data.held_out`` = the fold's, the sweep and the outputs off), so a fold is exactly what
``sysid fit`` would do on that split; with ``fit.baseline`` (the default) the baseline is fitted
inside the same call on the same pieces.

Execution (``workers``):

- ``1``: serially in this process.
- ``N > 1`` or ``ray_address``: each fold is one Ray task (``num_cpus=1``, no retries). Without an
  address a local cluster of N CPUs, this process's own, is started and shut down afterwards
  (``sysid.fit.fanout``: 127.0.0.1 only, token authentication, no files left); an already
  initialised Ray session is used as it is; ``ray_address`` joins an existing cluster
  (``ray.init(address=...)``; "auto" finds a local one; docs/cluster.md). The fold function is the same on
  both paths and every setting that could make a fit random is seeded in the config
  (``fit.starts.seed``), so Ray's results equal the serial ones (tests/fit/test_cv.py compares the
  printed tables).

Warp kernels are compiled once per machine, not once per task: Warp keeps every compiled module
in its kernel cache on disk (``wp.config.kernel_cache_dir``: ``$WARP_CACHE_PATH`` or
``~/.cache/warp/<version>``), keyed by the kernels' source hash, and every process of the same
user reads the same cache, Ray's workers included (they inherit the driver's environment). Before
fanning out engine folds to a local cluster the driver runs one tiny replay (``warm_kernels``),
which compiles whatever the cache lacks, so that N workers starting together do not each compile
the same missing kernels; a worker then only loads the cached binaries. Ray reuses a worker
process for its next task (tasks' default ``max_calls=0``), so the modules a worker has loaded stay
loaded for its later folds: a fold in a fresh process with an empty kernel cache pays the
compilation, with a warm one it does not (docs/results.md, "Kernel cache and a fold").

Ctrl-C cancels the outstanding tasks (``ray.cancel(force=True)``) and re-raises; nothing is written
before every fold has finished (``write_cv`` writes the JSON and the HTML atomically). A fold that
raises is recorded with its error (``status: "failed"``, ``error``, ``traceback``) and the others
finish; the means are over the folds that finished, and the document says how many failed.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sysid.app.choices import BLOCKS, LOO, parse_folds
from sysid.app.config import BASELINE, CVSection, FitConfig, build_baseline_parameters, validate_static
from sysid.app.findings import summary as odometry_summary
from sysid.app.warm import warm_kernels
from sysid.errors import ConfigError
from sysid.fit.fanout import check_workers, ray_module, run_tasks

CV_FORMAT = "sysid-cv"
KEYS = ("mean_xy", "combined")  # [m] the held-out figures compared (sysid.app.results.GENERALISATION_KEYS)
WHO = ("model", "baseline")


# -- folds ----------------------------------------------------------------------------------------


def fold_indices(n_runs: int, folds: str | int, shuffle_seed: int | None = None) -> list[list[int]]:
    """Held-out run indices of each fold (every run held out exactly once) for ``"loo"`` or K folds
    (blocks and lists of folds need the runs' names: ``fold_plan``)."""
    spec = parse_folds(folds)
    if spec != LOO and not isinstance(spec, int):
        raise ConfigError(f"fold_indices forms 'loo' or K folds, not {spec!r}: use fold_plan with the runs' names")
    if n_runs < 2:
        raise ConfigError(f"cross-validation needs at least 2 runs (training + held-out together), got {n_runs}")
    order = np.arange(n_runs)
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(n_runs)
    if not isinstance(spec, int):  # LOO
        return [[int(i)] for i in order]
    if spec > n_runs:
        raise ConfigError(f"{spec} folds but only {n_runs} runs: give at most {n_runs} folds or 'loo'")
    return [sorted(int(i) for i in part) for part in np.array_split(order, spec)]


def natural_key(name: str) -> list[Any]:
    """Sort key of a run name with its numbers compared as numbers (step_9 before step_10)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def spread(items: Sequence[int], at_most: int | None) -> list[int]:
    """At most ``at_most`` of ``items``, evenly spread over them (the first and the last kept)."""
    if at_most is None or at_most >= len(items):
        return list(items)
    if at_most == 1:
        return [items[len(items) // 2]]
    return [items[int(k)] for k in np.round(np.linspace(0, len(items) - 1, at_most)).astype(int)]


def fold_plan(names: Sequence[str], folds: Any, cv: CVSection | None = None, shuffle_seed: int | None = None
              ) -> list[tuple[list[int], list[int]]]:
    """Per fold (held-out run indices, training run indices) into ``names`` (the runs' names, training
    then held-out runs of the config) for ``folds`` (``parse_folds``) and the settings of ``cv``
    (blocks, gap, at most so many runs per fold; see the module docstring). Raises ConfigError for
    folds that cannot be formed (more blocks than runs, unknown or repeated names, a fold left with
    no training run)."""
    cv = cv or CVSection()
    folds = parse_folds(folds)
    n = len(names)
    if folds == BLOCKS:
        if not 2 <= cv.blocks <= n:
            raise ConfigError(f"cv.blocks must be between 2 and the number of runs ({n}), got {cv.blocks}")
        order = sorted(range(n), key=lambda i: natural_key(names[i]))
        plans = []
        for part in np.array_split(np.arange(n), cv.blocks):
            lo, hi = int(part[0]), int(part[-1])  # positions in name order
            plans.append(([order[k] for k in range(lo, hi + 1)],
                          [order[k] for k in range(n) if k < lo - cv.gap or k > hi + cv.gap]))
    elif isinstance(folds, list):
        index: dict[str, int] = {}
        for i, name in enumerate(names):
            index.setdefault(name, i)
        dup = sorted({m for m in names if names.count(m) > 1})

        def look_up(which: list[str], where: str) -> list[int]:
            unknown = [m for m in which if m not in index]
            if unknown:
                raise ConfigError(f"{where}: no run named {unknown}; the runs are {sorted(names, key=natural_key)}")
            if any(m in dup for m in which):
                raise ConfigError(f"{where}: the run names {sorted(set(which) & set(dup))} are not unique among "
                                  "the runs")
            return [index[m] for m in which]

        plans, seen = [], set()
        for k, f in enumerate(folds):
            held = look_up(f["held_out"], f"cv.folds[{k}] held out")
            again = [names[i] for i in held if i in seen]
            if again:
                raise ConfigError(f"cv.folds[{k}] holds out {again} again: folds hold out disjoint runs")
            seen.update(held)
            train = (look_up(f["train"], f"cv.folds[{k}] train") if f["train"] is not None
                     else [i for i in range(n) if i not in held])
            both = [names[i] for i in train if i in held]
            if both:
                raise ConfigError(f"cv.folds[{k}] trains on runs it holds out: {both}")
            plans.append((held, train))
    else:
        plans = [(h, [i for i in range(n) if i not in h]) for h in fold_indices(n, folds, shuffle_seed)]
    out = []
    for k, (held, train) in enumerate(plans):
        if not train:
            raise ConfigError(f"fold {k + 1} (holding out {[names[i] for i in held][:3]}...) has no training run left"
                              + (f" after the gap of {cv.gap} runs" if folds == BLOCKS and cv.gap else ""))
        out.append((spread(held, cv.held_out_per_fold), spread(train, cv.train_per_fold)))
    return out


def prepare(cfg: FitConfig) -> tuple[FitConfig, list[Path], dict[str, Any]]:
    """Every check ``sysid fit`` makes before computing (on a copy of ``cfg``): simulator,
    parameters, files, topics, the baseline's parameters. Returns (the checked copy, with the
    manifest's topic map and truth filled in; every run source, training then held-out; the robot)."""
    from sysid.app.fitting import accepted_parameters, baseline_status

    base = cfg.replaced({"truth": dict(cfg.truth), "parameters": dict(cfg.parameters)})
    robot = base.load_robot()
    sim, accepted = accepted_parameters(base, robot)
    _params, train, held = validate_static(base, accepted, robot)
    if baseline_status(base, sim) is None:
        from sysid.simulators.protocol import get_simulator

        bparams = build_baseline_parameters(base, robot, get_simulator(BASELINE, robot=robot).parameter_names)
        if not bparams.free_names and not (base.fit.calibration.enabled and base.fit.calibration.parameter in bparams):
            raise ConfigError("fit.baseline: every parameter of the kinematic baseline is frozen and nothing is "
                              "calibrated: free one in fit.baseline.parameters or set fit.baseline: false")
    sources = [p.resolve() for p in list(train) + list(held)]
    return base, sources, robot


def fold_configs(base: FitConfig, sources: Sequence[Path], folds: Any, shuffle_seed: int | None = None,
                 only: Sequence[str] | None = None) -> list[FitConfig]:
    """One config per fold: the same settings, ``train`` = the fold's training runs (``fold_plan``:
    every other run, or as ``base.cv`` says), ``held_out`` = the fold's runs, no manifest (its lists
    were expanded), no sweep, no outputs. ``only``: run just the folds that hold out one of these
    runs (file stems, e.g. ``left_circle``)."""
    out = []
    stems = [p.stem for p in sources]
    parts = fold_plan(stems, folds, base.cv, shuffle_seed)
    if only is not None:
        unknown = [n for n in only if n not in stems]
        if unknown:
            raise ConfigError(f"no run named {unknown} to hold out; the runs are {stems}")
        parts = [(h, t) for h, t in parts if any(stems[i] in only for i in h)]
    for held, train in parts:
        out.append(base.replaced({
            "data.train": [str(sources[i]) for i in train],
            "data.held_out": [str(sources[i]) for i in held],
            "data.manifest": None,
            "sweep.enabled": False,
            "output.params": None,
            "output.report": None,
            "output.results": None,
            "truth": dict(base.truth),
            "parameters": dict(base.parameters),
            "fit.workers": 1,  # a fold's fit runs in its task: no Ray inside Ray
            "fit.ray_address": None,
        }))
    return out


# -- one fold -------------------------------------------------------------------------------------


def _path_length(run: Mapping[str, Any]) -> float:
    m = run.get("measured") or {}
    x, y = np.asarray(m.get("x") or [0.0], float), np.asarray(m.get("y") or [0.0], float)
    return float(np.sum(np.hypot(np.diff(x), np.diff(y))))


def _param_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    keep = ("name", "unit", "initial", "value", "lower", "upper", "frozen", "calibrated", "std", "ci95", "at_bound",
            "determined", "interval", "reaches", "prior")
    return [{k: r.get(k) for k in keep} for r in rows]


def summarise_fold(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a fold's results document (``run_fit``) the CV document keeps."""
    gen = doc.get("generalisation") or {}
    held = gen.get("held_out") or {"n_runs": 0, "n_pieces": 0, "runs": [], "mean_over_runs": {}, "mean_over_pieces": {}}
    train = gen.get("train") or {}
    base = doc.get("baseline") or {}
    fitted = base.get("status") == "fitted"
    pieces = []
    for r in doc.get("runs") or []:
        if r["split"] != "held_out":
            continue
        mb, m0 = r.get("metrics_baseline"), r.get("metrics_initial")
        pieces.append({
            "name": r["name"],
            "run": r.get("run") or r["name"],
            "model": {k: r["metrics_identified"].get(k) for k in (*KEYS, "yaw_rmse", "final_xy")},
            "start": {k: m0.get(k) for k in (*KEYS, "yaw_rmse", "final_xy")} if m0 else None,
            "baseline": {k: mb.get(k) for k in (*KEYS, "yaw_rmse", "final_xy")} if mb else None,
            "odometry_jumps": len((r.get("meta") or {}).get("odometry_jumps") or []),
            "path_m": _path_length(r),
            "duration_s": (r.get("meta") or {}).get("duration_s"),
        })
    fit = doc.get("fit") or {}

    def fit_summary(f: Mapping[str, Any]) -> dict[str, Any]:
        return {k: f.get(k) for k in ("optimizer", "converged", "convergence", "iterations", "loss_initial",
                                      "loss_final", "n_eff")}

    return {
        "train_runs": [r["run"] for r in train.get("runs") or []],
        "held_out": held,
        "train_in_sample": {"mean_over_runs": train.get("mean_over_runs")} if train else None,
        "pieces": pieces,
        "parameters": {"model": _param_rows(doc.get("parameters") or []),
                       "baseline": _param_rows(base.get("parameters") or []) if fitted else None},
        "fit": {"model": fit_summary(fit), "baseline": fit_summary(base.get("fit") or {}) if fitted else None},
        "run_shifts": fit.get("run_shifts") or None,  # what each training run decides (5+ runs)
        "baseline_status": base.get("status"),
        "baseline_reason": base.get("reason"),
        "nuisance": doc.get("nuisance") or [],
        "dropped_runs": [{k: d.get(k) for k in ("name", "split", "reason")} for d in doc.get("dropped_runs") or []],
        "warnings": list(fit.get("warnings") or [])  # the odometry's lag and jumps in one line (sysid.app.findings)
        + ([odometry_summary(doc["odometry_findings"])] if doc.get("odometry_findings") else []),
    }


def run_fold(cfg: FitConfig, index: int, sys_path: Sequence[str] = ()) -> dict[str, Any]:
    """Fit and score one fold (``run_fit`` without outputs); never raises for a failing fit: the
    record then has ``status: "failed"`` and the error. ``sys_path``: the driver's import path,
    appended where this process lacks it (a Ray worker imports a simulator factory such as
    ``tests.helpers.fit_doubles:make_double`` as the driver does)."""
    for p in sys_path:
        if p not in sys.path:
            sys.path.append(p)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {
        "index": index,
        "held_out_sources": list(cfg.data.held_out),
        "train_sources": list(cfg.data.train),
        "held_out_runs": [Path(s).stem for s in cfg.data.held_out],
        "status": "ok",
        "error": None,
    }
    try:
        from sysid.app.pipeline import run_fit

        doc = run_fit(cfg, progress=False, write=False)
        rec.update(summarise_fold(doc))
        rec["held_out_runs"] = [r["run"] for r in rec["held_out"]["runs"]] or rec["held_out_runs"]
    except Exception as exc:  # noqa: BLE001 - a failing fold is reported; KeyboardInterrupt propagates
        rec.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc(limit=12))
    rec["execution"] = {"pid": os.getpid(), "host": socket.gethostname(), "wall_time": time.perf_counter() - t0}
    return rec


# -- execution ------------------------------------------------------------------------------------


def _ray() -> Any:
    return ray_module()


def _failed(index: int, cfg: FitConfig, error: str) -> dict[str, Any]:
    return {"index": index, "held_out_sources": list(cfg.data.held_out), "train_sources": list(cfg.data.train),
            "held_out_runs": [Path(s).stem for s in cfg.data.held_out], "status": "failed", "error": error,
            "execution": {}}


def run_serial(configs: Sequence[FitConfig], on_fold: Callable[[dict[str, Any]], None] | None = None
               ) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(configs):
        rec = run_fold(c, i)
        out.append(rec)
        if on_fold:
            on_fold(rec)
    return out


def run_ray(configs: Sequence[FitConfig], workers: int | None = None, address: str | None = None,
            on_fold: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every fold a Ray task (``sysid.fit.fanout.run_tasks``); returns (records in fold order, execution
    info). Starts (and shuts down) a local cluster of ``workers`` CPUs unless Ray is initialised
    already or ``address`` is given. On KeyboardInterrupt (or any exception) the outstanding tasks
    are cancelled; a task that could not run is recorded as a failed fold."""
    return run_tasks(run_fold, [(c, i) for i, c in enumerate(configs)], workers, address,
                     on_done=(lambda _i, rec: on_fold(rec)) if on_fold else None,
                     on_error=lambda i, text: _failed(i, configs[i], text))


# -- the CV document ------------------------------------------------------------------------------


def _mean(values: Sequence[Any]) -> float | None:
    vals = [math.inf if v is None else float(v) for v in values]
    if not vals:
        return None
    m = float(np.mean(vals))
    return m if math.isfinite(m) else None


def summarise(folds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per held-out run (each run once: the mean over its pieces, from its fold), the means over runs,
    over folds and over pieces, model beside baseline, and the verdict."""
    ok = [f for f in folds if f["status"] == "ok" and f["held_out"]["runs"]]
    has_b = bool(ok) and all(f.get("baseline_status") == "fitted" for f in ok)
    has_s = bool(ok) and all("start" in (f["held_out"].get("mean_over_runs") or {}) for f in ok)
    who = [w for w, on in (("model", True), ("start", has_s), ("baseline", has_b)) if on]
    per_run = [{"run": r["run"], "fold": f["index"], "pieces": r["pieces"],
                **{w: r.get(w) for w in who}} for f in ok for r in f["held_out"]["runs"]]
    pieces = [p for f in ok for p in f["pieces"]]
    out: dict[str, Any] = {
        "n_folds": len(folds),
        "n_ok": len(ok),
        "n_failed": sum(f["status"] == "failed" for f in folds),
        "failed": [{"fold": f["index"], "held_out": f["held_out_runs"], "error": f["error"]}
                   for f in folds if f["status"] == "failed"],
        "has_baseline": has_b,
        "has_start": has_s,
        "runs": per_run,
        "n_runs": len(per_run),
        "n_pieces": len(pieces),
    }
    for w in who:
        out[w] = {
            "mean_over_runs": {k: _mean([r[w][k] for r in per_run]) for k in KEYS},
            "mean_over_folds": {k: _mean([f["held_out"]["mean_over_runs"][w][k] for f in ok]) for k in KEYS},
            "mean_over_pieces": {k: _mean([p[w][k] for p in pieces]) for k in KEYS},
        }
    if len(who) > 1 and per_run:
        from sysid.app.results import verdict

        def v(x: Any) -> float:
            return math.inf if x is None else float(x)

        for w, key in (("baseline", "wins"), ("start", "wins_start")):
            if w in who:
                out[key] = sum(v(r["model"]["mean_xy"]) < v(r[w]["mean_xy"]) for r in per_run)
        block = {"runs": per_run, "mean_over_runs": {w: out[w]["mean_over_runs"] for w in who}}
        out["verdict"] = (f"cross-validated over {len(ok)} fold{'s' if len(ok) != 1 else ''}, "
                          + (verdict(block, "held-out", "the model") or ""))
    else:
        out["verdict"] = None
    return out


def row_bounds(ci95: Sequence[float], row: Mapping[str, Any]) -> bool:
    """Whether a (clipped) interval is its parameter's whole bound range."""
    lo, hi = row.get("lower"), row.get("upper")
    if lo is None or hi is None:
        return False
    tol = 1e-9 * (hi - lo)
    return bool(ci95[0] <= lo + tol and ci95[1] >= hi - tol)


def parameter_spread(folds: Sequence[Mapping[str, Any]], who: str = "model") -> list[dict[str, Any]]:
    """Per parameter: its value and interval in every fold (None for a failed fold), and across
    the folds that finished the mean, standard deviation (ddof 1), min, max, the relative spread
    std/|mean|, how many folds' intervals contain the across-fold mean, and the spread against the
    intervals (std over the median interval half-width: above 1 the estimate moves between folds
    more than any one fold's interval says, i.e. it does not transfer). A fold whose runs do not
    determine the parameter (its interval spans the bounds: ``determined`` "not determined", or
    reaching both bounds in documents without that field) counts in ``folds_not_determined``, not
    among the intervals (an interval that is the bounds holds any mean)."""
    ok = [f for f in folds if f["status"] == "ok" and (f.get("parameters") or {}).get(who)]
    if not ok:
        return []
    names = [p["name"] for p in ok[0]["parameters"][who]]
    rows = []
    for name in names:
        per_fold: list[dict[str, Any] | None] = []
        for f in folds:
            row = next((p for p in ((f.get("parameters") or {}).get(who) or []) if p["name"] == name), None)
            per_fold.append(None if row is None or f["status"] != "ok" else
                            {"fold": f["index"], "value": row["value"], "ci95": row.get("ci95"),
                             "std": row.get("std"), "at_bound": row.get("at_bound"),
                             "determined": row.get("determined"), "reaches": row.get("reaches"),
                             "interval": row.get("interval")})
        got = [p for p in per_fold if p is not None and p["value"] is not None]
        first = next(p for p in ok[0]["parameters"][who] if p["name"] == name)
        loose = [p for p in got if p.get("determined") == "not determined" or (
            p.get("determined") is None and p["ci95"] and None not in p["ci95"] and row_bounds(p["ci95"], first))]
        counted = [p for p in got if p not in loose]
        vals = np.array([p["value"] for p in got], float)
        free = not all(next(p for p in f["parameters"][who] if p["name"] == name)["frozen"]
                       and not next(p for p in f["parameters"][who] if p["name"] == name)["calibrated"] for f in ok)
        mean = float(vals.mean()) if len(vals) else None
        std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0 if len(vals) else None
        half = [0.5 * (p["ci95"][1] - p["ci95"][0]) for p in counted
                if p["ci95"] and None not in p["ci95"] and p["ci95"][1] > p["ci95"][0]]
        within = sum(1 for p in counted if p["ci95"] and None not in p["ci95"] and mean is not None
                     and p["ci95"][0] <= mean <= p["ci95"][1])
        rows.append({
            "name": name,
            "unit": first.get("unit"),
            "lower": first.get("lower"),
            "upper": first.get("upper"),
            "free": free,
            "folds": per_fold,
            "mean": mean,
            "std": std,
            "min": float(vals.min()) if len(vals) else None,
            "max": float(vals.max()) if len(vals) else None,
            "relative_spread": (std / abs(mean)) if mean and std is not None else None,
            "folds_ci_contain_mean": within,
            "folds_with_ci": sum(1 for p in counted if p["ci95"] and None not in p["ci95"]),
            "folds_not_determined": len(loose),
            "spread_over_ci": (std / float(np.median(half))) if half and std is not None and np.median(half) > 0
            else None,
        })
    return rows


def cross_validate(
    cfg: FitConfig,
    folds: Any = None,
    *,
    workers: int | None = 1,
    ray_address: str | None = None,
    shuffle_seed: int | None = None,
    progress: bool = False,
    on_fold: Callable[[dict[str, Any]], None] | None = None,
    warm: bool = True,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Cross-validate ``cfg`` (see the module docstring); returns the CV document (nothing written:
    ``write_cv``). ``folds``: ``"loo"``, K, ``"blocks"`` or a list of folds (``fold_plan``); None takes
    the config's ``cv.folds`` (its ``cv`` section also holds the blocks' settings). ``workers``: 1
    serial, N > 1 Ray with N CPUs, None as many as this machine's CPUs (serial when Ray is not
    installed; with ``ray_address``, every fold at once); ``ray_address`` joins a cluster.
    ``on_fold(record)`` is called as each fold finishes (in completion order); ``only`` runs just the folds holding out
    one of the named runs (``fold_configs``); ``warm``: the kernel warm-up before a local Ray
    fan-out (``warm_kernels``). User errors (config, folds, Ray
    missing) raise ``ConfigError`` before any fold runs."""
    t_all = time.perf_counter()
    folds = parse_folds(cfg.cv.folds if folds is None else folds)
    check_workers(workers, ray_address, "the folds")
    base, sources, robot = prepare(cfg)
    configs = fold_configs(base, sources, folds, shuffle_seed, only)
    use_ray = bool(ray_address) or workers is None or workers > 1
    if use_ray and workers is None and not ray_address:
        try:
            import ray  # noqa: F401
        except ImportError:
            use_ray = False
    if workers is None:  # a cluster runs every fold at once if it has the CPUs; this machine, one per CPU
        workers = len(configs) if ray_address else min(len(configs), os.cpu_count() or 1)
        use_ray = use_ray and (workers > 1 or bool(ray_address))
    if use_ray:
        _ray()  # a missing Ray is a user error before any work
    from tqdm import tqdm

    bar = tqdm(total=len(configs), desc="cv folds", unit="fold", disable=not progress, leave=False)

    def done(rec: dict[str, Any]) -> None:
        bar.update(1)
        if progress:
            bar.write(fold_line(rec), file=sys.stderr)
        if on_fold:
            on_fold(rec)

    warm_s = None
    try:
        if use_ray:
            if warm and not ray_address:  # a local cluster shares this machine's kernel cache
                warm_s = warm_kernels(base, robot)
            records, info = run_ray(configs, workers, ray_address, done)
        else:
            records, info = run_serial(configs, done), {"backend": "serial"}
    finally:
        bar.close()
    info.update(workers=workers, warm_up_s=warm_s)
    return cv_document(base, folds, sources, records, info, time.perf_counter() - t_all, shuffle_seed)


def cv_document(cfg: FitConfig, folds: Any, sources: Sequence[Path], records: Sequence[Mapping[str, Any]],
                execution: Mapping[str, Any], wall: float, shuffle_seed: int | None = None) -> dict[str, Any]:
    from ingest.fileio import json_safe as _finite
    from sysid.app.results import config_settings, document_header, model_label

    summary = summarise(records)
    doc: dict[str, Any] = _finite({
        **document_header(CV_FORMAT, cfg.robot_name()),
        "simulator": {"name": cfg.simulator.name, "options": cfg.simulator.options,
                      "label": model_label(cfg.simulator.name)},
        "baseline": BASELINE if summary["has_baseline"] else None,
        "folds_spec": folds,
        "fold_settings": fold_settings(cfg, folds),
        "shuffle_seed": shuffle_seed,
        "config": {
            **config_settings(cfg),
            "odometry_jumps": {"max_accel": cfg.data.jump_accel, "action": cfg.data.jump_action},
            "baseline": cfg.fit.baseline.enabled,
            "baseline_dt": cfg.fit.baseline.dt,
            "nuisance": list(cfg.fit.options.nuisance),
            "starts": cfg.fit.options.starts,
            "start_seed": cfg.fit.options.start_seed,
        },
        "runs": [str(p) for p in sources],
        "summary": summary,
        "parameters": {w: parameter_spread(records, w) for w in WHO},
        "folds": list(records),
        "execution": {**execution, "wall_time": wall,
                      "fold_wall_times": [(r.get("execution") or {}).get("wall_time") for r in records]},
    })
    return doc


def fold_settings(cfg: FitConfig, folds: Any) -> dict[str, Any]:
    """The ``cv`` settings that shaped the folds (``fold_plan``), for the CV document."""
    out: dict[str, Any] = {"train_per_fold": cfg.cv.train_per_fold, "held_out_per_fold": cfg.cv.held_out_per_fold}
    if folds == BLOCKS:
        out.update(blocks=cfg.cv.blocks, gap=cfg.cv.gap)
    return out


def folds_label(doc: Mapping[str, Any]) -> str:
    """The folds in words: "leave-one-run-out", "3-fold", "3 blocks (gap 1)", "2 given folds"; with
    the per-fold limits when set."""
    spec, st = doc["folds_spec"], doc.get("fold_settings") or {}
    if spec == LOO:
        text = LOO
    elif spec == BLOCKS:
        text = f"{st.get('blocks')} blocks in name order" + (f", gap {st['gap']}" if st.get("gap") else "")
    elif isinstance(spec, list):
        text = f"{len(spec)} given folds"
    else:
        text = f"{spec}-fold"
    limits = [f"at most {st[k]} {w} runs per fold" for k, w in (("train_per_fold", "training"),
                                                              ("held_out_per_fold", "held-out")) if st.get(k)]
    return text + (f"; {', '.join(limits)}" if limits else "")


def load_cv(path: str | Path) -> dict[str, Any]:
    """The CV document of a ``cv.json`` written by ``sysid cv`` (ResultsError when it is not one)."""
    from sysid.app.results import read_document

    return read_document(path, CV_FORMAT, "CV results file", "written by `sysid cv`")


def write_cv(doc: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Render the HTML first, then write ``cv.json`` and ``cv.html`` in ``out_dir`` together
    (`sysid.app.outputs.commit_outputs`: the earlier pair or the new one, never one of each)."""
    from ingest.fileio import atomic_write_text
    from sysid.app.cv_report import render_cv_report
    from sysid.app.outputs import commit_outputs

    out = Path(out_dir)
    html = render_cv_report(doc, base=out)
    text = json.dumps(doc, indent=1)
    jp, hp = out / "cv.json", out / "cv.html"
    commit_outputs([("CV results", jp), ("CV report", hp)],
                   {"CV results": lambda tmp: atomic_write_text(tmp, text),
                    "CV report": lambda tmp: atomic_write_text(tmp, html)})
    return jp, hp


# -- text output ----------------------------------------------------------------------------------


def _f(v: Any, spec: str = ".3f") -> str:
    """A figure of the CV table; ``n/a`` for a missing or non-finite one (a replay that diverged)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def fold_line(rec: Mapping[str, Any]) -> str:
    """One line per finished fold (progress)."""
    held = ", ".join(rec.get("held_out_runs") or [])
    wall = (rec.get("execution") or {}).get("wall_time")
    t = f" ({wall:.0f} s)" if wall is not None else ""
    if rec["status"] != "ok":
        return f"fold {rec['index'] + 1} (held out {held}): FAILED: {rec['error']}{t}"
    m = rec["held_out"]["mean_over_runs"]
    line = (f"fold {rec['index'] + 1} (held out {held}): model {_f(m['model']['mean_xy'])} / "
            f"{_f(m['model']['combined'])}")
    if "start" in m:
        line += f", starting values {_f(m['start']['mean_xy'])} / {_f(m['start']['combined'])}"
    if "baseline" in m:
        line += f", baseline {_f(m['baseline']['mean_xy'])} / {_f(m['baseline']['combined'])}"
    return line + f" m mean xy / combined{t}"


def fold_interval(pf: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """A fold's interval of a parameter as the data give it (an end at a bound marked ``(bound)``),
    with ``not determined`` where that fold's runs do not determine it; '' without an interval."""
    from sysid.fit.identifiability import interval_text

    iv = pf.get("interval") or pf.get("ci95")
    if not iv:
        return ""
    if row.get("lower") is None or row.get("upper") is None:
        text = f" [{_f(iv[0], '.3g')}, {_f(iv[1], '.3g')}]"
    else:
        text = " " + interval_text(iv[0], iv[1], row["lower"], row["upper"], ".3g")
    return text + (" not determined" if pf.get("determined") == "not determined" else "")


def format_table(doc: Mapping[str, Any]) -> str:
    """The CV table as text (what ``sysid cv`` prints): per held-out run the model beside the
    baseline, the means, failed folds, and the parameters per fold with their spread. Contains no
    wall times, so the serial and Ray paths print the same text."""
    s = doc["summary"]
    has_b = s["has_baseline"]
    lines = [f"cross-validation ({folds_label(doc)}: {s['n_folds']} folds, {s['n_ok']} finished, "
             f"{s['n_failed']} failed): "
             f"{doc['simulator']['name']}"
             + (" vs kinematic baseline" if has_b else "")
             + (f", {doc['config']['split']:g} s pieces" if doc["config"].get("split") else "")]
    whos = [w for w in ("model", "start", "baseline") if isinstance(s.get(w), dict)]
    heads = {"model": "identified", "start": "starting values", "baseline": "kinematic baseline"}
    lines.append("held-out error per run, mean over its pieces: mean xy / combined [m]"
                 + (f"  ({' | '.join(heads[w] for w in whos)})" if len(whos) > 1 else ""))
    rows = [(f"{r['run']} (fold {r['fold'] + 1}, {len(r['pieces'])} piece{'s' if len(r['pieces']) != 1 else ''})", r)
            for r in s["runs"]]
    if s["runs"]:
        for label, key in ((f"mean over {s['n_runs']} runs", "mean_over_runs"),
                           (f"mean over {s['n_ok']} folds", "mean_over_folds"),
                           (f"mean over {s['n_pieces']} pieces", "mean_over_pieces")):
            rows.append((label, {w: s[w][key] for w in whos}))
    for label, r in rows:
        lines.append(f"  {label:<58}" + "  |  ".join(f"{_f(r[w]['mean_xy'])} / {_f(r[w]['combined'])}" for w in whos))
    if s.get("verdict"):
        lines.append(f"  {s['verdict']}")
    for f in s["failed"]:
        lines.append(f"  fold {f['fold'] + 1} (held out {', '.join(f['held_out'])}) FAILED: {f['error']}")
    for who in WHO:
        rows_p = [p for p in (doc.get("parameters") or {}).get(who) or [] if p["free"]]
        if not rows_p:
            continue
        lines.append(f"{who} parameters per fold (value [95 % interval]) and spread across folds:")
        width = max(14, *(len(p["name"]) + 2 for p in rows_p))  # a long name keeps a gap before its values
        for p in rows_p:
            cells = ["-" if pf is None else _f(pf["value"], ".4g") + fold_interval(pf, p) for pf in p["folds"]]
            lines.append(f"  {p['name']:<{width}}" + "; ".join(cells)
                         + f"  | mean {_f(p['mean'], '.4g')}, std {_f(p['std'], '.3g')}"
                         + (f" ({100 * p['relative_spread']:.0f} %)" if p.get("relative_spread") is not None else "")
                         + f", intervals holding the mean {p['folds_ci_contain_mean']} of {p['folds_with_ci']}"
                         + (f", not determined in {p['folds_not_determined']}" if p.get("folds_not_determined")
                            else ""))
    return "\n".join(lines)
