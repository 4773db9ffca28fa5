"""What the ``sysid`` subcommands share: the common flags, argparse value types, the merge of
``--config`` under the flags, the output checks before any work, and the number formats of the
printed tables."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ingest.clikit import (
    Parser,
    deprecated_alias,
    nonnegative_float,
    output_problem,
    positive_float,
    positive_int,
    run_guarded,
    show_progress,
)
from sysid.errors import ConfigError, SysidError
from sysid.ingest_errors import from_ingest

if TYPE_CHECKING:
    from sysid.app.config import FitConfig

# The ``sysid`` command's subparsers (each subcommand module's ``add_parser`` takes them).
Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"
T = TypeVar("T")


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command (``args.func``) with ingest's errors translated (`sysid.ingest_errors.from_ingest`:
    an ingest error that reaches this far is a user error too); called inside `run_entry`'s boundary."""
    with from_ingest():
        return int(args.func(args) or 0)


def run_entry(parse: Callable[[], argparse.Namespace]) -> int:
    """The one error boundary of both programs (``sysid`` and ``ingest``): an entry point's whole life,
    building the parser and parsing the arguments (``parse``) as well as the command, so that Ctrl-C at
    any moment, even while the command's modules are still being imported, is the one ``interrupted``
    line and exit 130 (SIGTERM the same, exit 143: `sysid.app.signals.handled_signals`); a `SysidError`
    prints as one ``error:`` line with exit status 2 (``ingest.clikit.run_guarded``: a bug 1)."""

    def entry() -> int:  # the guard is outermost: a signal while the handlers are installed is caught too
        from sysid.app.signals import handled_signals

        with handled_signals():
            return run_command(parse())

    return run_guarded(entry, (SysidError,))


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
    g.add_argument("--robot", metavar="NAME|PATH",
                   help="robot: a bundled name (helhest, husky), robot.yaml or URDF (default helhest)")
    g.add_argument(
        "--simulator",
        metavar="NAME",
        help="simulator: 'ostrich' (the engine, default), 'kinematic' (baseline; on an engine config it reads "
        "what fit.baseline reads) or 'package.module:factory' (with --allow-simulator)",
    )
    add_allow_simulator(g)
    g.add_argument("--dt", type=positive_float, metavar="SECONDS",
                   help="simulator timestep [s] (default: the config's fit.dt, else the simulator's: engine 0.1, "
                   "kinematic 0.02)")
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


def add_allow_simulator(group: Any) -> None:
    """``--allow-simulator MODULE:FACTORY`` (repeatable): a simulator a config may name by its path."""
    group.add_argument("--allow-simulator", action="append", metavar="MODULE:FACTORY",
                       help="let the config (or --simulator) name this simulator factory of another package "
                            "(repeatable; a package can register it instead: docs/fit.md, 'Simulators')")


def check_simulator(args: argparse.Namespace, cfg: FitConfig) -> None:
    """The config's simulator is known (built in, a package's entry point, or given by
    ``--allow-simulator``): checked before its module is imported."""
    from sysid.simulators.protocol import allow_simulator, check_simulator_name

    for path in getattr(args, "allow_simulator", None) or []:
        allow_simulator(path)
    check_simulator_name(cfg.simulator.name)


def add_workers(group: Any, what: str) -> None:
    """``--workers N`` and ``--ray-address ADDR`` (sysid.fit.fanout)."""
    group.add_argument("--workers", type=positive_int, metavar="N", help=what)
    group.add_argument("--ray-address", metavar="ADDR",
                       help="join this Ray cluster (its head's HOST:PORT, or auto; docs/cluster.md) instead of "
                            "starting a local one")


def add_json_output(p: argparse.ArgumentParser, metavar: str, what: str) -> None:
    """``-o/--output FILE.JSON`` (and its earlier spelling ``--json``): also write ``what`` as JSON."""
    p.add_argument("--output", "-o", metavar=metavar, help=f"also write {what} as JSON")
    deprecated_alias(p, "--json", dest="output", metavar="PATH")


def add_params_and_runs(p: argparse.ArgumentParser, params: str, runs: str, required: bool = False) -> None:
    """``--params/-p PARAMS.YAML`` (help ``params``) and the repeatable ``--runs PATH`` (help ``runs``)."""
    p.add_argument("--params", "-p", required=required, metavar="PARAMS.YAML", help=params)
    p.add_argument("--runs", action="append", metavar="PATH", help=runs)


def add_replay_parser(subparsers: Subparsers, name: str, func: Callable[[argparse.Namespace], int], params: str,
                      runs: str, required: bool = False, **parser_kw: Any) -> argparse.ArgumentParser:
    """Add a command that replays runs at a parameter file (evaluate, sweep-dt; its work: `replay`): the
    parser (``parser_kw``: help, description, epilog), the configuration flags and ``add_params_and_runs``;
    ``func`` runs it. The caller adds its own flags and ``add_json_output``."""
    p = subparsers.add_parser(name, **parser_kw)
    add_common(p)
    add_params_and_runs(p, params, runs, required=required)
    p.set_defaults(func=func)
    return p


def replay(args: argparse.Namespace, app: Callable[..., T]) -> T:
    """A replay command's work: ``app`` (`sysid.app.evaluate.run_evaluate`, `sysid.app.sweep.run_sweep`) on
    the merged config and ``--params``, with progress bars unless -q; ``-o`` is checked before any work."""
    return app(command_config(args), args.params, progress=show_progress(args.quiet), outputs=json_output(args))


def json_output(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The ``-o/--output`` file of ``add_json_output`` as the app's ``outputs`` to check (none without -o)."""
    return [("-o/--output", args.output)] if args.output else []


def command_config(args: argparse.Namespace) -> FitConfig:
    """What evaluate and sweep-dt do before any work: check ``-o``, merge the config, quiet Warp."""
    check_outputs(("-o/--output", args.output))
    cfg = merged_config(args)
    quiet_warp()
    return cfg


def write_json(path: str | None, doc: Any) -> None:
    """Write ``doc`` as indented JSON to ``path`` (atomically; nothing without a path)."""
    if path:
        from ingest.fileio import atomic_write_text

        atomic_write_text(path, json.dumps(doc, indent=1))


# the output flags (--params-out, --report, --results) and the settings they replace
OUTPUT_FLAGS = {"params_out": "output.params", "report": "output.report", "results": "output.results"}


def merged_config(args: argparse.Namespace) -> FitConfig:
    """The fit config of a command: the ``--config`` file (or the defaults) with the flags merged over it."""
    from ingest.inputs import resolved
    from sysid.app.config import FitConfig, ParamSpec

    cfg = FitConfig.from_file(args.config) if getattr(args, "config", None) else FitConfig()
    if args.simulator is not None and args.simulator != cfg.simulator.name:
        cfg = switched_simulator(cfg, args.simulator, dt_given=args.dt is not None)
    over: dict[str, Any] = {
        "robot": args.robot,
        "fit.dt": args.dt,
        "fit.segment": args.segment,
        "data.split": args.split,
        "fit.lever_arm": args.lever_arm,
        "data.jump_action": getattr(args, "odometry_jumps", None),
    }
    if args.topics is not None:
        over["data.topics"] = str(resolved(args.topics))
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
        over["data.manifest"] = str(resolved(args.manifest))
    for key, path in (("train", "data.train"), ("held_out", "data.held_out"), ("runs", "data.held_out")):
        vals = getattr(args, key, None)
        if vals:
            over[path] = [str(resolved(v)) for v in vals]
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
    check_simulator(args, cfg)
    return cfg


def switched_simulator(cfg: FitConfig, name: str, dt_given: bool = False) -> FitConfig:
    """``cfg`` run by the simulator ``name`` instead of its own (``--simulator``), with a ``note:``
    line on stderr for every setting that changes with it.

    The timestep becomes the new simulator's default (``sysid.app.config.DEFAULT_DT_OF``; the
    kinematic baseline's is ``fit.baseline.dt``) unless ``dt_given`` (``--dt``). The kinematic
    simulator reads an engine config as the fit's baseline does (``fit.baseline``): the parameters
    both models share (``BASELINE_SHARED``) and ``fit.baseline.parameters``, the simulator options
    that describe the data (``SHARED_OPTIONS``); the engine's other parameters and options and
    ``fit.jacobian`` are left out. Another simulator keeps the config's parameters and options."""
    from sysid.app.config import BASELINE, BASELINE_SHARED, DEFAULT_DT_OF, ENGINE

    old = cfg.simulator.name
    out = cfg.replaced({"simulator.name": name})
    notes: list[str] = []
    if name == BASELINE:
        from sysid.app.fitting import SHARED_OPTIONS

        params = {n: s for n, s in cfg.parameters.items() if n in BASELINE_SHARED}
        params.update(cfg.fit.baseline.parameters)
        left = [n for n in cfg.parameters if n not in params]
        options = {k: v for k, v in cfg.simulator.options.items() if k in SHARED_OPTIONS}
        left_opts = [k for k in cfg.simulator.options if k not in options]
        out = out.replaced({"parameters": params, "simulator.options": options})
        what = []
        if left:
            what.append(f"parameter(s) {', '.join(left)}")
        if left_opts:
            what.append(f"simulator option(s) {', '.join(left_opts)}")
        if cfg.fit.jacobian is not None:
            what.append("fit.jacobian")
        if what:
            notes.append(f"--simulator {name} reads this {old} config as its fit.baseline does: "
                         f"{'; '.join(what)} left out")
    elif cfg.fit.jacobian is not None and name != ENGINE:
        out = out.replaced({"fit.jacobian": None})
        notes.append(f"--simulator {name}: fit.jacobian (the engine's) left out")
    default_dt = cfg.fit.baseline.dt if name == BASELINE else DEFAULT_DT_OF.get(name)
    if not dt_given and default_dt is not None and default_dt != cfg.fit.dt:
        out = out.replaced({"fit.dt": default_dt})
        notes.append(f"--simulator {name} steps at its default timestep {default_dt:g} s "
                     f"(fit.dt {cfg.fit.dt:g} s is {old}'s; --dt sets another)")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return out


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
    """Initialise Warp without its banner and missing-driver warning (before any engine work; `sysid.quiet_warp`)."""
    import sysid

    sysid.quiet_warp()


def fmt(v: Any, spec: str = ".4g") -> str:
    """A number of a printed table; ``n/a`` for a missing or non-finite one (a replay that diverged)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def solver_note(h: Mapping[str, Any] | None) -> str:
    """How the engine's Newton solve fared in a run's replay (empty for other simulators)."""
    if not h:
        return ""
    share, worst = fmt(h["unconverged_steps"], ".0%"), fmt(h["residual_max"], ".2g")
    return f"   solver: {share} steps unconverged, worst {worst} m/s"
