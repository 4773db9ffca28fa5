"""The ``ingest`` command line: ``ingest inspect BAG``, ``ingest load BAG -o run.npz``.

A program of the product, not of the `ingest` library (which imports no sysid): it reads a sysid fit
config (``-c``) and reads robots with sysid's robot reader (`read_robot`), so a wheel map or URDF
works as ``--robot`` or a topic map's ``robot:``. Conventions shared with ``sysid``: `ingest.clikit`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.errors import ConfigError

# ingest.clikit and sysid.cli.common are imported where they are used: importing this module is all the
# ``ingest`` console script does before `main` is in charge of Ctrl-C.
if TYPE_CHECKING:
    from ingest.clikit import Parser
    from sysid.cli.common import Subparsers
    from sysid.robot.scenes import RobotDescription


def read_robot(path: Path) -> RobotDescription:
    """sysid's robot reader (`sysid.robot.load_robot`, the `ingest.topicmap.RobotReader` this program
    passes), with Warp initialised first without its banner: a URDF's importer loads newton (Warp)."""
    from sysid._quiet import init_warp_quietly

    init_warp_quietly()
    from sysid.robot import load_robot

    return load_robot(path)


def _inspect(args: argparse.Namespace) -> int:
    from ingest.clikit import show_progress
    from ingest.inspect import format_report, inspect_bag

    fit = fit_config_settings(args.config) if args.config else {}
    topics = args.topics if args.topics is not None else fit.get("topics", fit.get("topic_map"))
    if args.topics is not None:
        _check_topic_map(args.topics)
    stats, info = inspect_bag(args.bag if len(args.bag) > 1 else args.bag[0], progress=show_progress(args.quiet),
                              topic_map=topics, robot_reader=read_robot)
    if args.json:
        print(json.dumps({"info": info, "topics": [s.__dict__ for s in stats]}, indent=2, default=str))
    else:
        print(format_report(stats, info))
    return 0


def _check_topic_map(path: str | Path) -> None:
    """The topic map given is a readable file (not missing, a folder, a named pipe, too large)."""
    from ingest.inputs import check_input_file

    check_input_file(path, "topic map", ConfigError, "yaml",
                     missing=f"topic map {str(path)!r} does not exist; give a topic-map YAML (docs/ingest.md)")


def _load(args: argparse.Namespace) -> int:
    from ingest.clikit import folder_problem, input_clash, output_problem, show_progress
    from ingest.load import load_run

    fit = fit_config_settings(args.config) if args.config else {}
    if "topic_map" in fit and args.topics:
        raise ConfigError("give the topic map once: --topics (-c TOPICS.YAML is its deprecated spelling; -c names "
                          "a sysid fit config)")
    topics = args.topics or fit.get("topic_map") or fit.get("topics")
    if isinstance(topics, (str, Path)):
        _check_topic_map(topics)
    if args.output:
        problem = output_problem(args.output, "-o/--output", suffixes=(".npz", ".parquet"))
        if problem:
            raise ConfigError(problem)
        import glob

        inputs = [("the input", p) for b in args.bag for p in (glob.glob(b) or [b])]
        inputs += [(what, p) for what, p in (("the topic map", topics), ("the config", args.config),
                                              ("the robot description", args.robot))
                   if isinstance(p, (str, Path)) and Path(p).exists()]
        problem = input_clash([("-o/--output", args.output)], inputs)
        if problem:
            raise ConfigError(f"{problem}; nothing was read or written (give the run another path with -o)")
    if args.cache:
        problem = folder_problem(args.cache, "--cache")
        if problem:
            raise ConfigError(problem)
    if topics is not None:  # read once here: a map whose run could identify nothing stops before any work
        from ingest.build import as_topicmap

        where = f"topic map {str(topics)!r}" if isinstance(topics, (str, Path)) else "the fit config's topic map"
        topics = as_topicmap(topics, read_robot)
        if topics.wheel_cmd.source == "odom_twist":
            raise ConfigError(f"{where} {ODOM_TWIST_REFUSED}")
    run = load_run(
        args.bag if len(args.bag) > 1 else args.bag[0],
        config=topics,
        dt=args.dt if args.dt is not None else fit.get("dt", DEFAULT_DT),
        resample=args.resample,
        normalize_start=not args.no_normalize,
        fit_pallet=True if args.pallet else "auto",
        progress=show_progress(args.quiet),
        cache=args.cache if args.cache else False,
        robot=args.robot if args.robot is not None else fit.get("robot"),
        robot_reader=read_robot,
    )
    for w in run.meta.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    print(f"run {run.name!r}: {run.duration:.3f} s, {len(run.odom)} odom rows, {len(run.wheel_cmd)} command rows, "
          f"wheels {run.wheel_names}")
    for k, (a, b) in run.segments.items():
        print(f"  segment {k}: {a:.3f} - {b:.3f} s")
    if run.pallet is not None:
        p = run.pallet
        print(f"  pallet: x={p.x:.3f} m y={p.y:.3f} m yaw={p.yaw:.4f} rad (fit RMS {p.quality:.4f} m)")
        chk = run.meta.get("pallet_check")
        if chk:
            print(f"  {climb_check_line(chk)}")
    elif "pallet_error" in run.meta:
        print(f"  pallet: not fitted ({run.meta['pallet_error']})")
    from ingest.errors import DataError
    from ingest.quality import MAX_ACCEL, odometry_jumps, odometry_lag

    jumps = odometry_jumps(run.odom)
    t0 = float(run.odom["t"].iloc[0])
    print(f"  odometry jumps (implied acceleration > {MAX_ACCEL:g} m/s^2): {len(jumps)}"
          + "".join(f"\n    at {j.t - t0:.2f} s: {j.accel:.0f} m/s^2, step {j.step:.3f} m" for j in jumps[:20])
          + ("\n    ..." if len(jumps) > 20 else ""))
    try:
        lag = odometry_lag(run)
        print(f"  odometry lag behind the wheels: speed {lag.translation:.2f} s (r {lag.r_translation:.2f}), "
              f"heading {lag.yaw:.2f} s (r {lag.r_yaw:.2f})")
    except DataError as exc:
        print(f"  odometry lag: not measured ({exc})")
    offs = run.meta.get("clock_offsets_s", {})
    for t, o in offs.items():
        if o is not None:
            print(f"  clock offset {t}: record - header = {o:.6f} s")
    if args.output:
        try:
            path = run.save(args.output)
        except OSError as exc:
            raise ConfigError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
        print(f"saved {path}")
    return 0


def climb_check_line(chk: dict[str, Any]) -> str:
    """The lidar pallet against the odometry's climb onset (`ingest.pallet.onset_cross_check`), in words."""
    t, expected, edge = chk["onset_t"], chk["edge_distance_expected_m"], chk["edge_distance_lidar_m"]
    head = f"climb-onset check: at the onset of the climb ({t:.2f} s)"
    if edge is None:
        return f"{head} neither front wheel heads for the lidar's pallet: not checked"
    verdict = "consistent" if chk["consistent"] else "NOT consistent: check the lidar extrinsic or the odometry"
    return (f"{head} the lidar's pallet edge is {edge:.3f} m ahead of the nearer front wheel, {expected:.3f} m "
            f"expected from the wheel radius and pallet height ({edge - expected:+.3f} m): {verdict}")


DEFAULT_DT = 0.01  # [s] ingest load's resampling step without --dt or a fit config
ODOM_TWIST_REFUSED = (
    "derives the wheel commands from the odometry's twist (`wheel_cmd: {source: odom_twist}`): "
    "a run driven by the robot's own measured motion and scored against it identifies nothing (docs/robots.md); "
    "the bag needs a wheel command or wheel speed topic (e.g. /cmd_vel, /joint_states), named in the topic map")
CONFIG_HELP = ("a sysid fit config (as `sysid -c`): read the bag as `sysid fit` does, with its topic map "
               "(data.topics or the manifest's), data.ingest.dt and robot; flags win")


def fit_config_settings(path: str) -> dict[str, Any]:
    """What ``ingest`` takes from a ``sysid`` fit config (``-c/--config`` means the fit config in both
    programs): ``topics`` (its topic map: a path resolved against the config's folder, or a mapping;
    absent when it names none), ``dt`` (``data.ingest.dt``) and ``robot`` (the robot description's
    path). A file that is a topic map rather than a fit config (the earlier meaning of ``ingest load
    -c``) comes back as ``{"topic_map": path}``."""
    from ingest.fileio import read_yaml

    p = Path(path)
    data = read_yaml(p, ConfigError, "config file",
                     missing=f"config file {str(p)!r} does not exist; give a sysid fit config (docs/fit.md)")
    if isinstance(data, dict) and not set(data) & FIT_ONLY_KEYS and set(data) & TOPIC_MAP_KEYS:
        return {"topic_map": str(p)}  # the deprecated spelling -c TOPICS.YAML of ingest load
    from sysid.app.config import FitConfig
    from sysid.app.sources import read_manifest
    from sysid.errors import SysidError

    try:
        cfg = FitConfig.from_file(p)
        if cfg.data.manifest is not None and cfg.data.topics is None:
            read_manifest(cfg)  # its ingest_topic_map
        out: dict[str, Any] = {"dt": cfg.data.ingest_dt, "robot": str(cfg.robot_path())}
    except SysidError as exc:
        raise ConfigError(str(exc)) from None
    if isinstance(cfg.data.topics, str):
        out["topics"] = str(cfg.resolve(cfg.data.topics))
    elif cfg.data.topics is not None:
        out["topics"] = cfg.data.topics
    return out


FIT_ONLY_KEYS = {"data", "parameters", "fit", "sweep", "output", "truth", "simulator"}
TOPIC_MAP_KEYS = {"topics", "time", "max_gap_s", "disorder", "lidar_extrinsic", "pallet", "custom_types"}


INSPECT_EXAMPLES = """examples:
  ingest inspect datasets/pallet-sample/run_10
  ingest inspect datasets/pallet-sample/run_10/run_10.mcap --json
  ingest inspect ../shared/data/bags/robot_localization_test1_husky.bag -q   # wheel odometry only: what is missing
  ingest inspect datasets/pallet-sample/run_10 -c examples/fit.yaml"""

LOAD_EXAMPLES = """examples:
  ingest load datasets/pallet-sample/run_10 -c examples/fit.yaml -o runs/run_10.npz
  ingest load datasets/pallet-sample/run_10 --topics datasets/pallet-sample/topics.yaml --dt 0.02
  ingest load ../shared/data/helhest-real/left_circle.json --cache ~/.cache/ingest
  ingest load ../shared/data/husky-drive/bags/step_010 --robot husky --topics ../shared/data/husky-drive/topics.yaml \\
    -o runs/husky.npz"""


QUIET_HELP = "no progress bar (bars are drawn only on a terminal)"


def _command(sub: Any, name: str, about: str, description: str, epilog: str, bag: str, topics: str) -> Any:
    """A subcommand's parser with the arguments both take, in their help order: the bag(s), ``--topics``
    and ``-c/--config`` (its own arguments and ``-q/--quiet`` follow)."""
    p = sub.add_parser(name, help=about, description=description, epilog=epilog)
    p.add_argument("bag", nargs="+", help=bag)
    p.add_argument("--topics", metavar="TOPICS.YAML", help=topics)
    p.add_argument("-c", "--config", metavar="FIT.YAML", help=CONFIG_HELP)
    return p


DESCRIPTION = ("Robot logs (ROS 1 / ROS 2 bags, JSON run files in the helhest-real format) into sysid runs. "
               "docs: docs/ingest.md")
EPILOG = INSPECT_EXAMPLES + "\n" + LOAD_EXAMPLES.split("\n", 1)[1] + "\n\nerrors: one line `error: ...`, exit 2"


def build_parser() -> Parser:
    """The ``ingest`` program's parser."""
    from ingest.clikit import Parser, version

    parser = Parser(prog="ingest", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"ingest (sysid) {version()}")
    add_commands(parser)
    return parser


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """``sysid ingest``: the same ``inspect`` and ``load`` as the ``ingest`` program."""
    p = subparsers.add_parser("ingest", help="inspect a bag (can it be fitted?) or build a run from it",
                              description=DESCRIPTION, epilog=EPILOG.replace("  ingest ", "  sysid ingest "))
    add_commands(p)
    return p


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``inspect`` and ``load`` to ``parser`` (the ``ingest`` program's or ``sysid ingest``'s)."""
    from ingest.clikit import positive_float

    prog = parser.prog
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="inspect or load")
    p = _command(
        sub, "inspect", "topics, types, rates, durations, gaps and clock offsets of a bag; can it be fitted?",
        "Scan a bag once: per topic its type, count, rate, duration, largest gap and clock offset, "
        "and which topics would serve as odometry and wheel commands (what is missing for a fit).",
        _examples(INSPECT_EXAMPLES, prog),
        bag="bag file(s), ROS 2 bag directory, bare .db3 / .mcap, or a glob",
        topics="check this topic map's roles against the bag (default: auto-detection, as `ingest load`)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (JSON on stdout)")
    p.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    p.set_defaults(func=_inspect)
    p = _command(
        sub, "load", "build a run from a bag (odometry and wheel commands on one clock) and optionally save it",
        "Build a run from a bag: odometry and wheel commands on one clock, segments, the pallet "
        "fit, odometry jumps and lag; -o saves it as a run cache (.npz / .parquet) that sysid reads.",
        _examples(LOAD_EXAMPLES, prog),
        bag="bag file(s), ROS 2 bag directory, bare .db3 / .mcap, or a helhest .json",
        topics="topic map YAML (as `sysid --topics`; default: auto-detect)",
    )
    p.add_argument("--robot", metavar="NAME|PATH",
                   help="the robot whose wheels the run gets: a bundled name (helhest, husky), a robot.yaml, a wheel "
                   "map or a URDF (default: the topic map's robot:, else helhest)")
    p.add_argument("--dt", type=positive_float, metavar="SECONDS",
                   help=f"resampling step [s] (default: the fit config's data.ingest.dt, else {DEFAULT_DT:g})")
    p.add_argument("--resample", choices=("zoh", "average"), default="zoh",
                   help="wheel commands on the grid: zoh holds the last command (default), average the step mean")
    p.add_argument("--no-normalize", action="store_true", help="keep the odometry frame's origin and heading")
    p.add_argument("--pallet", action="store_true", help="fail if the pallet cannot be fitted from the lidar")
    p.add_argument("--cache", metavar="DIR", help="cache directory (parse each bag once)")
    p.add_argument("-o", "--output", metavar="RUN.NPZ", help="write the run to this .npz / .parquet file")
    p.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    p.set_defaults(func=_load)


def _examples(text: str, prog: str) -> str:
    """The examples as ``prog`` (``ingest`` or ``sysid ingest``) spells them."""
    return text.replace("  ingest ", f"  {prog} ")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``ingest`` entry point, behind the same boundary as ``sysid``: ingest's errors become
    `sysid.errors.SysidError`s (same message), printed as one ``error:`` line with exit status 2."""
    try:
        from sysid.cli.common import run_entry
    except KeyboardInterrupt:
        from sysid.cli import interrupted_at_start

        return interrupted_at_start()
    return run_entry(lambda: build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
