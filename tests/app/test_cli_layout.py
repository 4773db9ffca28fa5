"""The command line's layout: one module per subcommand with ``add_parser(subparsers)`` and
``run(args)``; the fit pipeline as named phases."""

from __future__ import annotations

import argparse
import importlib

import pytest

from sysid.cli import build_parser, commands

SUBCOMMANDS = {"fit": "fit", "evaluate": "evaluate", "sweep-dt": "sweep_dt", "report": "report", "cv": "cv",
               "plan": "plan", "robot": "robot", "ingest": "ingest_program", "synth": "synth"}
# commands with subcommands of their own: each of those runs a function of the command's module
NESTED = {"robot": ("check",), "ingest": ("inspect", "load")}


@pytest.mark.parametrize(("command", "module"), SUBCOMMANDS.items())
def test_every_subcommand_is_a_module_with_add_parser_and_run(command: str, module: str) -> None:
    mod = importlib.import_module(f"sysid.cli.{module}")
    assert callable(mod.add_parser)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if command in NESTED:
        inner = next(a for a in sub.choices[command]._actions if isinstance(a, argparse._SubParsersAction))
        assert list(inner.choices) == list(NESTED[command])
        for name in NESTED[command]:
            func = inner.choices[name].get_default("func")
            assert callable(func) and func.__module__ == mod.__name__
    elif module != "synth":  # synth's run is the generator's own (sysid.synth.cli.run), set by add_parser
        assert callable(mod.run)
        assert sub.choices[command].get_default("func") is mod.run


def test_the_parser_lists_the_subcommands_in_order() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(SUBCOMMANDS)
    assert [m.__name__.rsplit(".", 1)[1] for m in commands()] == list(SUBCOMMANDS.values())[:-1]


def test_the_fit_pipeline_is_a_loop_over_named_phases() -> None:
    from sysid.app.pipeline import FIT_PHASES

    assert [name for name, _phase in FIT_PHASES] == ["load", "fit", "baseline", "evaluate", "sweep", "write"]


def test_no_application_module_runs_past_800_lines() -> None:
    """The application layer is split by responsibility (docs/architecture.md): a module past 800 lines
    is a sign that two jobs share it."""
    from pathlib import Path

    import sysid.app

    sizes = {p.name: len(p.read_text().splitlines()) for p in Path(sysid.app.__file__).parent.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 800} == {}
