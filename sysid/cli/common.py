"""What the ``sysid`` subcommands share: the common flags, argparse value types, the merge of
``--config`` under the flags, the output checks before any work, and the number formats of the
printed tables."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ingest.clikit import (
    Parser,
    deprecated_alias,
    nonnegative_float,
    output_problem,
    positive_float,
    positive_int,
    run_guarded,
)
from sysid.errors import ConfigError, SysidError, from_ingest

if TYPE_CHECKING:
    from sysid.app.config import FitConfig

# The ``sysid`` command's subparsers (each subcommand module's ``add_parser`` takes them).
Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"


def run_command(args: argparse.Namespace) -> int:
    """The one error boundary of both programs (``sysid`` and ``ingest``): run the parsed command
    (``args.func``) with ingest's errors translated (`sysid.errors.from_ingest`); a `SysidError` prints
    as one ``error:`` line with exit status 2 (``ingest.clikit.run_guarded``: Ctrl-C 130, a bug 1)."""

    def command() -> int:
        with from_ingest():  # an ingest error that reaches this far is a user error too
            return int(args.func(args) or 0)

    return run_guarded(command, (SysidError,))

def dts(text: str) -> list[float]:
    """``--dts`` / ``--sweep-dts``: comma-separated timesteps [s], each finite and > 0."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated timesteps in seconds, got {text!r}") from exc
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"timesteps must be finite and > 0, got {text!r}")
    return vals


def assignment(text: str) -> tuple[str, float]:
    """``--set NAME=VALUE`` with a finite VALUE."""
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.strip() or not math.isfinite(float(value)):
            raise ValueError
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with a finite VALUE (e.g. kp=300), got {text!r}"
        ) from exc


def add_common(p: argparse.ArgumentParser) -> None:
    """The configuration flags of fit / evaluate / sweep-dt (each overrides its config key)."""
    g = p.add_argument_group("configuration")
    g.add_argument("--config", "-c", metavar="FIT.YAML", help="YAML config (see docs/fit.md); flags override it")
    g.add_argument("--robot", metavar="NAME|PATH", help="robot name under models/ or a robot.yaml (default helhest)")
    g.add_argument(
        "--simulator",
        metavar="NAME",
        help="simulator: 'ostrich' (the engine), 'kinematic' (baseline) or 'package.module:factory'",
    )
    g.add_argument("--dt", type=positive_float, metavar="SECONDS", help="simulator timestep [s] (default 0.02)")
    g.add_argument("--segment", metavar="NAME", help="score only this segment of each run (e.g. climb)")
    g.add_argument("--split", type=positive_float, metavar="SECONDS",
                   help="cut every run into pieces of about this length, each replayed from its own start")
    g.add_argument("--odometry-jumps", choices=("report", "drop"), dest="odometry_jumps",
                   help="runs (pieces) whose odometry jumps (implied acceleration > data.odometry_jumps.max_accel, "
                   "default 30 m/s^2): report them (default) or drop them from training and scoring")
    g.add_argument("--topics", metavar="TOPICS.YAML", help="ingest topic map for bags (default: auto-detect)")
    g.add_argument("--lever-arm", type=nonnegative_float, metavar="METRES",
                   help="L of the combined error [m], >= 0 (default 0.5)")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bars (bars are drawn only on a terminal)")


def add_workers(group: Any, what: str) -> None:
    """``--workers N`` and ``--ray-address ADDR`` (sysid.fit.fanout)."""
    group.add_argument("--workers", type=positive_int, metavar="N", help=what)
    group.add_argument("--ray-address", metavar="ADDR",
                       help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a local one")


def add_json_output(p: argparse.ArgumentParser, metavar: str, what: str) -> None:
    """``-o/--output FILE.JSON`` (and its earlier spelling ``--json``): also write ``what`` as JSON."""
    p.add_argument("--output", "-o", metavar=metavar, help=f"also write {what} as JSON")
    deprecated_alias(p, "--json", dest="output", metavar="PATH")


def command_config(args: argparse.Namespace) -> FitConfig:
    """What evaluate and sweep-dt do before any work: check ``-o``, merge the config, quiet Warp."""
    check_outputs(("-o/--output", args.output))
    cfg = merged_config(args)
    quiet_warp()
    return cfg


def write_json(path: str | None, doc: Any) -> None:
    """Write ``doc`` as indented JSON to ``path`` (atomically; nothing without a path)."""
    if path:
        from sysid.fit.params import atomic_write_text

        atomic_write_text(path, json.dumps(doc, indent=1))


# the output flags (--params-out, --report, --results) and the settings they replace
OUTPUT_FLAGS = {"params_out": "output.params", "report": "output.report", "results": "output.results"}


def merged_config(args: argparse.Namespace) -> FitConfig:
    """The fit config of a command: the ``--config`` file (or the defaults) with the flags merged over it."""
    from sysid.app.config import FitConfig, ParamSpec

    cfg = FitConfig.from_file(args.config) if getattr(args, "config", None) else FitConfig()
    over: dict[str, Any] = {
        "robot": args.robot,
        "simulator.name": args.simulator,
        "fit.dt": args.dt,
        "fit.segment": args.segment,
        "data.split": args.split,
        "fit.lever_arm": args.lever_arm,
        "data.jump_action": getattr(args, "odometry_jumps", None),
    }
    if args.topics is not None:
        over["data.topics"] = str(Path(args.topics).resolve())
    out_dir = getattr(args, "output", None) if getattr(args, "command", None) == "fit" else None
    if out_dir is not None:  # fit -o DIR: the three outputs in DIR unless a --*-out names one
        for key, name in (("params_out", "params.yaml"), ("report", "report.html"), ("results", "report.json")):
            if getattr(args, key, None) is None:
                over[OUTPUT_FLAGS[key]] = str(Path(out_dir) / name)
    for key, path in (("optimizer", "fit.optimizer"), ("max_iter", "fit.max_iter"), ("lr", "fit.lr"),
                      *OUTPUT_FLAGS.items(), ("manifest", "data.manifest")):
        if getattr(args, key, None) is not None:
            over[path] = getattr(args, key)
    if getattr(args, "manifest", None):
        over["data.manifest"] = str(Path(args.manifest).resolve())
    for key, path in (("train", "data.train"), ("held_out", "data.held_out"), ("runs", "data.held_out")):
        vals = getattr(args, key, None)
        if vals:
            over[path] = [str(Path(v).resolve()) for v in vals]
            if key == "runs":
                over["data.train"] = []
                over["data.manifest"] = None
    if getattr(args, "no_calibration", False):
        over["fit.calibration.enabled"] = False
    if getattr(args, "no_sweep", False):
        over["sweep.enabled"] = False
    if getattr(args, "no_baseline", False):
        over["fit.baseline.enabled"] = False
    if getattr(args, "sweep_dts", None):
        over["sweep.dts"] = args.sweep_dts
    if getattr(args, "dts", None):
        over["sweep.dts"] = args.dts
    for key in ("workers", "ray_address"):
        if getattr(args, key, None) is not None:
            over[f"fit.{key}"] = getattr(args, key)
    if getattr(args, "starts", None) is not None:
        over["fit.options"] = dataclasses.replace(cfg.fit.options, starts=args.starts)
    cfg = cfg.merged(over)
    if getattr(args, "ray_address", None) and getattr(args, "workers", None) is None:
        cfg.fit.workers = None  # as many tasks in flight as the cluster has CPUs
    if "data.manifest" in over and over["data.manifest"] is None:
        cfg.data.manifest = None
    both = sorted(set(getattr(args, "free", None) or []) & set(getattr(args, "freeze", None) or []))
    if both:
        raise ConfigError(f"--free and --freeze both name {', '.join(both)}; give each parameter one of them")
    specs = dict(cfg.parameters)
    for name in getattr(args, "free", None) or []:
        specs[name] = dataclasses.replace(specs.get(name, ParamSpec()), frozen=False)
    for name in getattr(args, "freeze", None) or []:
        specs[name] = dataclasses.replace(specs.get(name, ParamSpec()), frozen=True)
    for name, value in getattr(args, "set", None) or []:
        specs[name] = dataclasses.replace(specs.get(name, ParamSpec()), nominal=value)
    cfg.parameters = specs
    return cfg


def check_outputs(*flags: tuple[str, Any]) -> None:
    """Every output path given on the command line can be written (checked before any work)."""
    for flag, path in flags:
        if path is not None:
            problem = output_problem(path, flag)
            if problem:
                raise ConfigError(problem)


def unused_path(path: Path, force: bool = False) -> Path:
    """``path`` when it does not exist (or ``force``), else the first free ``<stem>-2<suffix>``, ``-3``, ..."""
    path = Path(path)
    if force or not path.exists():
        return path
    k = 2
    while (cand := path.with_name(f"{path.stem}-{k}{path.suffix}")).exists():
        k += 1
    return cand


def quiet_warp() -> None:
    """Initialise Warp without its banner and missing-driver warning (before any engine work)."""
    from sysid._quiet import init_warp_quietly

    init_warp_quietly()


def fmt(v: Any, spec: str = ".4g") -> str:
    """A number of a printed table; ``-`` for a missing one."""
    return "-" if v is None else format(v, spec)


def solver_note(h: Mapping[str, Any] | None) -> str:
    """How the engine's Newton solve fared in a run's replay (empty for other simulators)."""
    if not h:
        return ""
    return f"   solver: {h['unconverged_steps']:.0%} steps unconverged, worst {h['residual_max']:.2g} m/s"
