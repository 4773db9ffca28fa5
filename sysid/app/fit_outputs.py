"""The files of a fit: where they go (`output_paths`), the checks before any work that no output
overwrites an input or another output (`input_files`, `check_inputs_kept`, `check_output_paths`), and
their commit as one set (`write_outputs`: the parameter file, the results JSON and the report, through
`sysid.app.outputs.commit_outputs`).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ingest.fileio import atomic_write_text
from sysid.app.config import FitConfig
from sysid.app.findings import summary as odometry_summary
from sysid.app.outputs import commit_outputs
from sysid.app.results import FitResults
from sysid.app.sources import expand_sources, read_manifest
from sysid.errors import ConfigError
from sysid.fit.params import ParameterSet, default_params_path, save_params


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
    meta = parameter_file_metadata(doc, results_path, report_path)
    fit = doc.fit
    targets = [("parameter file", Path(params_path)), ("results", Path(results_path)), ("report", Path(report_path))]
    writers: dict[str, Callable[[Path], Any]] = {
        "parameter file": lambda tmp: save_params(
            tmp, params, robot=robot, intervals={k: (v[0], v[1]) for k, v in fit["intervals"].items()},
            std={k: v for k, v in fit["std"].items() if v is not None}, metadata=meta,
            notes={p["name"]: {"determined": p["determined"], "ci95_reaches": p.get("reaches")}
                   for p in doc.parameters if p.get("determined")}),
        "results": lambda tmp: atomic_write_text(tmp, json.dumps(doc.to_dict(), indent=1)),
        "report": lambda tmp: atomic_write_text(tmp, html),
    }
    commit_outputs(targets, writers)


def parameter_file_metadata(doc: FitResults, results_path: Path, report_path: Path) -> dict[str, Any]:
    """What the parameter file records of its fit (``metadata``): the simulator, timestep [s] and
    optimiser, the runs, the held-out scores beside the starting values' and the kinematic baseline's,
    the calibration, the warnings, the other two files; what ``sysid evaluate`` replays the kinematic
    baseline at; the timestep plateau and the friction rule ``sysid plan`` builds its scene with."""
    held = doc.runs_of("held_out")
    cal = doc.calibration
    meta: dict[str, Any] = {
        "simulator": doc.simulator.name,
        "dt": doc.config["dt"],
        "optimizer": doc.config["optimizer"],
        "train_runs": [r["name"] for r in doc.runs_of("train")],
        "held_out_runs": [r["name"] for r in held],
        "held_out_combined": {r["name"]: r["metrics_identified"]["combined"] for r in held},
        "held_out_mean_xy": {r["name"]: r["metrics_identified"]["mean_xy"] for r in held},
        "calibration": cal and {"parameter": cal["parameter"], "segment": cal["segment"], "value": cal["value"]},
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
    return meta
