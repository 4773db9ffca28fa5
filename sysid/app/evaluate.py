"""``sysid evaluate``: the held-out error of a parameter file (`run_evaluate`), beside the same simulator
at the config's starting values and the kinematic baseline the file's fit scored (`evaluate_baseline_of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ingest.fileio import json_safe as _finite
from sysid.app.config import FitConfig, build_baseline_parameters, check_steps, validate_static
from sysid.app.findings import summary as odometry_summary
from sysid.app.fit_outputs import check_inputs_kept, input_files
from sysid.app.fitting import accepted_parameters, baseline_simulator, baseline_status
from sysid.app.results import RunEntry, aggregate_split, metric_mean, model_label, verdict
from sysid.app.runs import load_runs, load_warnings, parent_run, replay_warnings, score_windows, screen_odometry
from sysid.errors import ConfigError
from sysid.fit.evaluation import evaluate
from sysid.fit.params import load_params
from sysid.simulators.protocol import Simulator, replay_health


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
        metrics, _ = evaluate(sim, runs, theta, cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                              windows=score_windows(cfg, runs))
        health: Sequence[Mapping[str, float] | None] = replay_health(sim, runs) or [None] * len(runs)
        bar.update(1)
        start, _ = evaluate(sim, runs, _p.values(), cfg.fit.dt, lever_arm=cfg.fit.lever_arm,
                            windows=score_windows(cfg, runs))
        bar.update(1)
        base_metrics = None
        if baseline:
            bsim, btheta, bdt = baseline
            check_steps(runs, [("the kinematic baseline's dt", bdt)])
            base_metrics, _ = evaluate(bsim, runs, btheta, bdt, lever_arm=cfg.fit.lever_arm,
                                       windows=score_windows(cfg, runs))
            bar.update(1)
    entries: list[RunEntry] = _finite([
        {"name": r.name, "run": parent_run(r), "metrics_identified": m, "metrics_initial": m0,
         **({"metrics_baseline": base_metrics[i]} if base_metrics else {})}
        for i, (r, m, m0) in enumerate(zip(runs, metrics, start, strict=True))])
    block = aggregate_split(entries)
    block["verdict"] = verdict(block, "evaluated", model_label(cfg.simulator.name))

    def mean(ms: Sequence[Mapping[str, float]]) -> dict[str, float]:
        return {k: metric_mean(m[k] for m in ms) for k in ms[0]}

    out: dict[str, Any] = _finite(
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
    return out


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
