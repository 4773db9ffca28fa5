"""``sysid synth``: the synthetic-dataset generator (`sysid.synth.cli`) as a ``sysid`` subcommand.

The generator needs MuJoCo, so it is imported only when ``synth`` is the command; otherwise (or when
it cannot be imported) a placeholder parser stands in, whose run says why.
"""

from __future__ import annotations

import argparse

from sysid.cli.common import Subparsers
from sysid.errors import SysidError

EPILOG = "example:\n  sysid synth --preset sample --out data/pallet-sample"


def add_parser(subparsers: Subparsers, load: bool = False) -> argparse.ArgumentParser:
    """Add ``synth`` to the ``sysid`` command's subparsers: the generator's own parser when ``load``
    (the command is ``synth``) and it imports, else a placeholder."""
    if load:
        try:
            from sysid.synth import cli as synth_cli
        except ImportError as exc:
            return _placeholder(subparsers, f"the synthetic-data generator is not available ({exc})")
        p = synth_cli.add_parser(subparsers)
        p.set_defaults(func=synth_cli.run)
        return p
    return _placeholder(subparsers, None)


def _placeholder(subparsers: Subparsers, reason: str | None) -> argparse.ArgumentParser:
    sp = subparsers.add_parser("synth", help="generate synthetic pallet bags with MuJoCo (sysid.synth)",
                               add_help=False, epilog=EPILOG)

    def run(_args: argparse.Namespace) -> int:
        raise SysidError(reason or "the synthetic-data generator (sysid.synth.cli) is not installed yet")

    sp.set_defaults(func=run)
    return sp
