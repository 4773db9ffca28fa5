"""Command line: ``ingest inspect BAG``, ``ingest load BAG -o run.npz``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .errors import IngestError


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import format_report, inspect_bag

    stats, info = inspect_bag(args.bag if len(args.bag) > 1 else args.bag[0], progress=not args.quiet)
    if args.json:
        print(json.dumps({"info": info, "topics": [s.__dict__ for s in stats]}, indent=2, default=str))
    else:
        print(format_report(stats, info))
    return 0


def _load(args: argparse.Namespace) -> int:
    from .load import load_run

    run = load_run(
        args.bag if len(args.bag) > 1 else args.bag[0],
        config=args.config,
        dt=args.dt,
        resample=args.resample,
        normalize_start=not args.no_normalize,
        fit_pallet=True if args.pallet else "auto",
        progress=not args.quiet,
        cache=args.cache if args.cache else False,
    )
    print(f"run {run.name!r}: {run.duration:.3f} s, {len(run.odom)} odom rows, {len(run.wheel_cmd)} command rows")
    for k, (a, b) in run.segments.items():
        print(f"  segment {k}: {a:.3f} - {b:.3f} s")
    if run.pallet is not None:
        p = run.pallet
        print(f"  pallet: x={p.x:.3f} m y={p.y:.3f} m yaw={p.yaw:.4f} rad (fit RMS {p.quality:.4f} m)")
        chk = run.meta.get("pallet_check")
        if chk:
            print(f"  climb-onset check: {chk}")
    elif "pallet_error" in run.meta:
        print(f"  pallet: not fitted ({run.meta['pallet_error']})")
    from .errors import DataError
    from .quality import MAX_ACCEL, odometry_jumps, odometry_lag

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
        path = run.save(args.output)
        print(f"saved {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ingest", description="Robot logs (ROS bags) into sysid runs.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect", help="topics, types, rates, durations, gaps and clock offsets of a bag")
    p.add_argument("bag", nargs="+", help="bag file(s) / ROS 2 bag directory")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("load", help="build a run from a bag and optionally save it")
    p.add_argument("bag", nargs="+")
    p.add_argument("-c", "--config", help="topic map YAML")
    p.add_argument("--dt", type=float, default=0.01, help="simulation step [s] (default 0.01)")
    p.add_argument("--resample", choices=("zoh", "average"), default="zoh")
    p.add_argument("--no-normalize", action="store_true", help="keep the odometry frame's origin")
    p.add_argument("--pallet", action="store_true", help="fail if the pallet cannot be fitted")
    p.add_argument("--cache", help="cache directory (parse each bag once)")
    p.add_argument("-o", "--output", help="write the run to this .npz / .parquet file")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=_load)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except IngestError as err:
        print(f"ingest: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
