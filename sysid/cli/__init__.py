"""The ``sysid`` command line: fit / evaluate / sweep-dt / report / cv / plan / robot / ingest / synth.

One module per subcommand (`sysid.cli.fit`, `evaluate`, `sweep_dt`, `report`, `cv`, `plan`, `robot`,
`ingest_program`, `synth`), each with ``add_parser(subparsers)`` and ``run(args)``; what they share (the
common flags, the merge of ``--config`` under the flags, output checks) is `sysid.cli.common`. Every
subcommand with a config takes ``--config fit.yaml``; flags (kebab-case) are merged over the file and win.

Building the parser imports only the standard library and these modules: a subcommand imports what
its work needs (numpy, Warp, newton, Ray, ...) inside its ``run``, so ``--help`` and argument errors
answer at once (tests/app/test_cli_fast.py).

One error boundary (`main`): every user error is a ``sysid.errors.SysidError`` (ingest's errors are
translated into one by ``sysid.ingest_errors.from_ingest``) and prints ``error: <message>`` on one line with
exit status 2, before any computation where possible; Ctrl-C exits with 130 and leaves no
half-written output (every file is written to a temp file and renamed); anything else is a bug:
one ``error: internal error`` line, exit status 1 (``ingest.clikit.run_guarded``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from sysid import __version__

__all__ = ["build_parser", "main"]

EPILOG = """examples (from the project's folder):
  sysid fit --config examples/fit.yaml                # the bundled sample, the engine: writes reports/pallet-sample/
  sysid evaluate --config examples/fit.yaml -p models/helhest/params-pallet-sample.yaml
  sysid sweep-dt --config examples/fit.yaml -p models/helhest/params-pallet-sample.yaml --dts 0.01,0.05,0.1
  sysid report reports/pallet-sample/report.json -o report.html   # the first example's report, re-rendered
  sysid cv --config examples/fit.yaml --folds 2 --workers 2 --max-iter 8 -o reports/cv-sample
  sysid plan -p models/helhest/params-pallet-sample.yaml --goal 3,0.3,0 --scene pallet -o plans/over-pallet
  sysid robot check husky
  sysid ingest inspect datasets/pallet-sample/run_10

conventions: -c/--config FIT.YAML is the fit config, -p/--params PARAMS.YAML a parameter file it wrote and
-o/--output where the command writes (a file, or a folder for fit / cv / plan / synth; fit's single files:
--params-out, --report-out, --results-out), in sysid and in ingest; --force replaces what exists; -q/--quiet
hides progress. The engine (--simulator ostrich) is the default simulator, at its timestep 0.1 s. Relative
paths on the command line are taken from the current folder; in a config, inputs from the config's folder
and outputs from the current folder.
errors: one line `error: ...`, exit 2, before any work.   docs: docs/fit.md"""

# The subcommands' modules in `sysid --help` order; synth is added last (it imports MuJoCo only when it
# runs). This package imports them (and everything else but the standard library) only when the parser
# is built: importing it is all a console script does before `main` is in charge of Ctrl-C.
COMMAND_MODULES = ("fit", "evaluate", "sweep_dt", "report", "cv", "plan", "robot", "ingest_program")


def commands() -> tuple[ModuleType, ...]:
    """The subcommands' modules (``sysid.cli.fit``, ...) in `sysid --help` order, synth left out."""
    return tuple(importlib.import_module(f"sysid.cli.{name}") for name in COMMAND_MODULES)


def build_parser(with_synth: bool = False) -> argparse.ArgumentParser:
    """The ``sysid`` parser; ``with_synth`` loads the synthetic-data generator's own parser (MuJoCo)."""
    from ingest.clikit import Parser
    from sysid.cli import synth

    parser = Parser(
        prog="sysid",
        description="System identification of a robot on a differentiable simulator: fit physical parameters "
        "(servo gain, wheel friction, command scale, mass) to logged runs by gradients, evaluate them on "
        "held-out runs, and write an HTML report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sysid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands():
        command.add_parser(sub)
    synth.add_parser(sub, load=with_synth)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``sysid`` entry point; returns the exit status (0 ok, 2 user error, 130 Ctrl-C, 1 bug)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_synth = next((a for a in argv if not a.startswith("-")), None) == "synth"
    try:
        from sysid.cli.common import run_entry
    except KeyboardInterrupt:
        return interrupted_at_start()
    return run_entry(lambda: build_parser(with_synth=wants_synth).parse_args(argv))


def interrupted_at_start() -> int:
    """Ctrl-C while an entry point loads the command line's boundary (`sysid.cli.common.run_entry`,
    which catches every later one): the same one line as an interruption inside it, exit 130."""
    print("interrupted: no output was written (the command had not started)", file=sys.stderr)
    return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
