"""`sysid synth`: generate the synthetic pallet dataset (MuJoCo runs written as ROS bags).

Registered by `sysid/cli/synth.py` through `add_parser(subparsers)` / `run(args)`; also runs on its own as
``python -m sysid.synth ...`` (the same error boundary: ``error: <message>``, exit status 2).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

from ingest.clikit import (
    Parser,
    deprecated_alias,
    folder_problem,
    input_clash,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    run_guarded,
    show_progress,
)
from sysid.errors import SysidError
from sysid.ingest_errors import from_ingest
from sysid.synth.errors import SynthError

if TYPE_CHECKING:
    from sysid.synth.generate import SensorConfig

# The generator (numpy, MuJoCo) is imported when a command runs, not to build the parser: `--help`
# answers at once.


_P = TypeVar("_P", bound=argparse.ArgumentParser)  # the parent command's parser class


class _SampleLidar(TypedDict):
    """The `LidarConfig` fields the sample preset sets."""

    beams: int
    h_res_deg: float
    max_range: float
    window: str


# The committed sample (datasets/pallet-sample): three training runs and one held-out run, with a
# coarse 16-beam lidar that stops after the climb, to stay well under 20 MB.
SAMPLE_RUNS = ("run_13", "run_07", "run_06", "run_10")
SAMPLE_LIDAR: _SampleLidar = {"beams": 16, "h_res_deg": 1.5, "max_range": 30.0, "window": "climb"}
PRESETS = ("full", "sample")
FORMATS = ("mcap", "ros1", "sqlite3")  # the keys of sysid.synth.generate.FORMATS (a test checks they agree)

HELP = "generate the synthetic pallet dataset: MuJoCo runs of the robot written as ROS bags"
EXAMPLES = """examples:
  sysid synth --preset sample -o datasets/pallet-sample --force
  sysid synth -o data/pallet-ros1 --format ros1 --runs run_06 -q   # one run of the design, as a ROS 1 bag
  sysid synth --list
  sysid synth --robot husky -o data/husky-synth      # any robot (URDF + wheel map), in the engine

docs: docs/synth.md"""


def add_parser(subparsers: argparse._SubParsersAction[_P]) -> _P:
    """Add the ``synth`` subcommand to a parent command's subparsers; returns its parser."""
    p = subparsers.add_parser("synth", help=HELP, description=HELP, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(p)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", dest="out", type=Path, metavar="DIR",
                   help="output directory (created; holds the bags and manifest.yaml)")
    deprecated_alias(p, "--out", dest="out", type=Path, metavar="DIR")  # the spelling before -o/--output
    p.add_argument(
        "--preset",
        choices=PRESETS,
        default="full",
        help="full: all 14 runs, full lidar (default); sample: the 4-run committed sample's settings",
    )
    p.add_argument("--runs", help="comma-separated run names or indices (default: the preset's runs)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="dataset seed: same seed, same bytes (default 0)")
    p.add_argument("--noise-seed", type=nonnegative_int, default=0, metavar="N",
                   help="seed of the sensor noise alone: another N draws new noise over the same runs, commands "
                   "and trajectories (default 0: from --seed)")
    p.add_argument("--format", choices=FORMATS, default="mcap", help="bag format (default mcap)")
    p.add_argument("--beams", type=int, choices=(16, 64, 128), help="lidar beams (default 16)")
    p.add_argument("--h-res", type=positive_float, metavar="DEG",
                   help="lidar azimuth step [deg] (full 0.4, sample 1.5)")
    p.add_argument("--max-range", type=positive_float, metavar="M", help="lidar max range [m] (full 60, sample 30)")
    p.add_argument("--lidar-noise", type=nonnegative_float, metavar="M",
                   help="lidar range noise std [m] (default 0.01)")
    p.add_argument(
        "--lidar-window", choices=("full", "climb"), help="publish lidar for the whole run or until the climb ends"
    )
    p.add_argument("--odom-noise", type=nonnegative_float, default=1.0, metavar="SCALE",
                   help="scale of the odometry jitter (default 1)")
    p.add_argument("--odom-drift", type=nonnegative_float, default=1.0, metavar="SCALE",
                   help="scale of the odometry drift (default 1)")
    p.add_argument("--timestep", type=positive_float, default=1e-3, metavar="SECONDS",
                   help="MuJoCo timestep [s], dividing the 10 ms control period (default 0.001)")
    p.add_argument("--n-runs", type=positive_int, default=14, metavar="N",
                   help="runs in the design (default 14, as the paper)")
    p.add_argument(
        "--constant-friction",
        type=positive_float,
        metavar="MU",
        help="one wheel friction MU for every run and all three wheels (default: drawn per run); "
        "the manifest's truth then holds mu and mu_lateral",
    )
    p.add_argument(
        "--torsional",
        type=nonnegative_float,
        metavar="M",
        help="torsional wheel friction [m] of every run with --constant-friction (default 0)",
    )
    p.add_argument("--no-compression", action="store_true", help="write uncompressed bags")
    p.add_argument("--force", action="store_true", help="replace bags that exist in the output directory")
    deprecated_alias(p, "--overwrite", dest="force", action="store_true")  # the spelling before --force
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (bars are drawn only on a terminal)")
    p.add_argument("--no-progress", dest="quiet", action="store_true", help="deprecated alias of --quiet")
    p.add_argument("--list", action="store_true", help="print the run design and exit (simulates nothing)")
    p.add_argument("--robot", metavar="NAME|PATH",
                   help="generate the small flat-ground dataset of this robot instead (a bundled name such as husky, "
                   "a robot.yaml, a wheel map or a URDF): 5 runs of 10 s replayed in the engine at known parameters, "
                   "bags with its joint names, manifest.yaml, topics.yaml and fit.yaml (sysid/synth/robot_runs.py); "
                   "--runs picks among arc, slalom, pivot, accel, mixed; --seed, --odom-noise, --force apply")


def _sensors(args: argparse.Namespace) -> SensorConfig:
    from sysid.synth.generate import LidarConfig, OdomNoise, SensorConfig

    lidar = LidarConfig(**SAMPLE_LIDAR) if args.preset == "sample" else LidarConfig()
    changes = {
        "beams": args.beams,
        "h_res_deg": args.h_res,
        "max_range": args.max_range,
        "noise_std": args.lidar_noise,
        "window": args.lidar_window,
    }
    lidar = replace(lidar, **{k: v for k, v in changes.items() if v is not None})
    if args.odom_noise < 0 or args.odom_drift < 0:
        raise SynthError("--odom-noise and --odom-drift are scales and must be >= 0")
    o = OdomNoise()
    odom = replace(
        o,
        pos_std=o.pos_std * args.odom_noise,
        z_std=o.z_std * args.odom_noise,
        yaw_std=o.yaw_std * args.odom_noise,
        tilt_std=o.tilt_std * args.odom_noise,
        drift_xy=o.drift_xy * args.odom_drift,
        drift_z=o.drift_z * args.odom_drift,
        drift_yaw=o.drift_yaw * args.odom_drift,
    )
    return SensorConfig(odom=odom, lidar=lidar, noise_seed=args.noise_seed)


def _runs(args: argparse.Namespace) -> list[str] | None:
    if args.runs:
        return [r.strip() for r in args.runs.split(",") if r.strip()]
    return list(SAMPLE_RUNS) if args.preset == "sample" else None


def _robot_dataset(args: argparse.Namespace) -> int:
    """``sysid synth --robot``: the engine-generated dataset of any robot (`robot_runs`)."""
    from sysid.synth.robot_runs import generate_robot_dataset

    problem = folder_problem(args.out, "-o/--output")
    if problem:
        raise SynthError(problem)
    if Path(args.robot).is_file():  # the files written beside the bags must not replace the robot read
        problem = input_clash([("-o/--output", Path(args.out) / name) for name in ("manifest.yaml", "topics.yaml",
                                                                                   "fit.yaml")],
                              [("--robot", args.robot)])
        if problem:
            raise SynthError(f"{problem}; nothing was written (give another folder with -o/--output)")
    quiet = not show_progress(args.quiet)
    with from_ingest():  # the bags are written by ingest.bagio
        manifest = generate_robot_dataset(args.out, args.robot, seed=args.seed, runs=_runs(args),
                                          odom_noise=args.odom_noise, overwrite=args.force,
                                          progress=None if quiet else lambda m: print(m, file=sys.stderr))
    total = sum(r["bytes"] for r in manifest["runs"])
    print(f"wrote {len(manifest['runs'])} runs of robot {manifest['robot']['name']} ({total / 1e6:.1f} MB), "
          f"manifest.yaml, topics.yaml and fit.yaml in {args.out}; train {manifest['splits']['train']}, held out "
          f"{manifest['splits']['heldout']}; fit: sysid fit --config {Path(args.out) / 'fit.yaml'}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid synth``; returns the exit status (0 ok). Bad input raises `SynthError` (a
    `SysidError`: the command line's boundary prints it); ingest's errors while writing the bags
    become sysid errors (`from_ingest`)."""
    from sysid.synth.generate import generate_dataset
    from sysid.synth.scenario import DesignOptions, design_runs
    from sysid.synth.simulate import check_timestep

    if args.torsional is not None and args.constant_friction is None:
        raise SynthError("--torsional sets the torsional friction of --constant-friction; give both")
    design = DesignOptions(
        n_runs=args.n_runs,
        constant_friction=args.constant_friction,
        constant_torsional=0.0 if args.torsional is None else args.torsional,
    )
    design.check()
    if args.list:
        for s in design_runs(args.seed, design):
            hc = math.degrees(s.heading_change) + 0.0  # + 0.0 turns -0.0 into 0.0
            print(
                f"{s.name}  {s.split:7s} {s.role or '-':10s} v={s.speed:5.3f} m/s  "
                f"heading change {hc if abs(hc) >= 0.05 else 0.0:7.1f} deg  "
                f"pallet ({s.pallet.x:6.2f}, {s.pallet.y:6.2f}) yaw {math.degrees(s.pallet.yaw):6.1f} deg  "
                f"mu {s.contact.mu_wheel:.2f}/{s.contact.mu_rear:.2f}"
            )
        return 0
    if args.out is None:
        raise SynthError("-o/--output DIR is required (where the bags and manifest.yaml go)")
    if args.robot is not None:
        if args.noise_seed:
            raise SynthError("--noise-seed applies to the pallet dataset; with --robot, --seed draws the noise")
        return _robot_dataset(args)
    check_timestep(args.timestep)
    problem = folder_problem(args.out, "-o/--output")
    if problem:
        raise SynthError(problem)
    sensors = _sensors(args)
    sensors.check()
    with from_ingest():  # the bags are written by ingest.bagio, the lidar simulated by ingest.simlidar
        manifest = generate_dataset(
            args.out,
            seed=args.seed,
            fmt=args.format,
            runs=_runs(args),
            design=design,
            sensors=sensors,
            timestep=args.timestep,
            compression=None if args.no_compression else "default",
            overwrite=args.force,
            progress=show_progress(args.quiet),
        )
    total = sum(r["bytes"] for r in manifest["runs"])
    print(
        f"wrote {len(manifest['runs'])} runs ({total / 1e6:.1f} MB) and {args.out / 'manifest.yaml'}; "
        f"train {manifest['splits']['train']}, held out {manifest['splits']['heldout']}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m sysid.synth", description=HELP, epilog=EXAMPLES)
    configure_parser(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (one `error:` line printed) or --help: the exit status
        return int(exc.code or 0)
    return run_guarded(lambda: run(args), (SysidError,))
