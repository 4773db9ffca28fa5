"""``sysid sweep-dt``: the held-out error over a timestep grid and its usable plateau
(`sysid.app.sweep.run_sweep`)."""

from __future__ import annotations

import argparse

from sysid.cli import common
from sysid.cli.common import fmt


def add_parser(subparsers: common.Subparsers) -> argparse.ArgumentParser:
    """Add ``sweep-dt`` to the ``sysid`` command's subparsers; returns its parser."""
    sw = common.add_replay_parser(
        subparsers,
        "sweep-dt",
        run,
        params="parameter file (default: nominal values)",
        runs="runs (repeatable; default held-out runs)",
        help="held-out error over a timestep grid; find the usable plateau",
        description="Evaluate runs at each timestep and report the plateau: the largest h whose mean combined "
        "error stays within 2x the sweep minimum (paper Fig. 3).",
        epilog="examples:\n  sysid sweep-dt --config examples/fit.yaml "
        "--params models/helhest/params-pallet-sample.yaml "
        "--dts 0.01,0.05,0.1\n  sysid sweep-dt -c examples/fit.yaml -o out/sweep.json -q",
    )
    sw.add_argument("--dts", type=common.dts, metavar="H1,H2,...", help="timesteps [s] (default 0.005,...,0.2)")
    common.add_workers(sw, "each timestep one Ray task on a local cluster of N CPUs (fit.workers; default 1: serial)")
    common.add_json_output(sw, "SWEEP.JSON", "the sweep")
    return sw


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid sweep-dt``: print the error per timestep [s] and the plateau."""
    from sysid.app.sweep import run_sweep

    sw = common.replay(args, run_sweep)
    print(f"{'dt [s]':>10}{'mean combined [m]':>20}{'wall [s]':>10}")
    for h, e, w in zip(sw.dts, sw.errors, sw.wall_times, strict=True):
        mark = " <- plateau edge" if sw.plateau and h == sw.plateau[1] else ""
        print(f"{h:>10g}{fmt(e, '.4f'):>20}{fmt(w, '.2f'):>10}{mark}")
    if sw.plateau:
        print(f"plateau: {sw.plateau[0]:g} .. {sw.plateau[1]:g} s (error within {sw.factor:g}x the minimum)")
    else:
        print("plateau: none (every timestep diverged)")
    common.write_json(args.output, sw.summary())
    return 0
