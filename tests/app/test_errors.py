"""One error root per package: every user-facing error of sysid is a `SysidError`; ingest's errors (their own
root, `IngestError`: ingest never imports sysid) become sysid errors by class through
`sysid.ingest_errors.from_ingest`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ingest.errors as ie
from sysid import errors as se
from sysid import ingest_errors as sie

ROOT = Path(__file__).resolve().parents[2]


def test_every_sysid_error_class_derives_from_the_root() -> None:
    from sysid.fit.fanout import FanoutError
    from sysid.plan.control import PlanError
    from sysid.synth.errors import SynthError

    for cls in (se.ConfigError, se.DataError, se.SimulatorError, se.ResultsError, se.OutputError, se.SynthError,
                SynthError, PlanError, FanoutError):
        assert issubclass(cls, se.SysidError), cls


@pytest.mark.parametrize(("raised", "expected"), [
    (ie.ConfigError, se.ConfigError), (ie.DataError, se.DataError), (ie.BagReadError, se.DataError),
    (ie.UnknownTypeError, se.DataError), (ie.RunFormatError, se.DataError), (ie.IngestError, se.DataError),
])
def test_from_ingest_translates_with_the_same_message_chained(raised: type, expected: type) -> None:
    with pytest.raises(expected) as info, sie.from_ingest():
        raise raised("bag not found: x.bag")
    assert str(info.value) == "bag not found: x.bag"
    assert isinstance(info.value.__cause__, raised)


def test_from_ingest_prefix_forced_class_decorator_and_other_errors() -> None:
    with pytest.raises(se.DataError, match=r"^cannot ingest 'a': bad map$"), sie.from_ingest("cannot ingest 'a': ",
                                                                                             se.DataError):
        raise ie.ConfigError("bad map")

    @sie.from_ingest()
    def load() -> None:
        raise ie.TimestampError("jump")

    with pytest.raises(se.DataError, match="^jump$"):
        load()
    with pytest.raises(KeyError), sie.from_ingest():  # not an ingest error: untouched
        raise KeyError("x")


def test_ingest_errors_are_translated_by_class_not_by_module_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Translation follows the classes: with every ingest error class reporting another module (ingest's
    errors moved), an ingest ConfigError is still a ConfigError and the rest still DataErrors; an exception
    that merely names itself after ingest's errors module is not one of them."""
    for cls in vars(ie).values():
        if isinstance(cls, type) and issubclass(cls, ie.IngestError):
            monkeypatch.setattr(cls, "__module__", "ingest.moved")
    with pytest.raises(se.ConfigError, match="^bad map$"), sie.from_ingest():
        raise ie.ConfigError("bad map")
    with pytest.raises(se.DataError, match="^jump$"), sie.from_ingest():
        raise ie.TimestampError("jump")

    class Impostor(Exception):
        pass

    Impostor.__module__ = "ingest.errors"
    with pytest.raises(Impostor), sie.from_ingest():
        raise Impostor("not ingest's")
    sources = [(ROOT / "sysid" / name).read_text() for name in ("errors.py", "ingest_errors.py")]
    assert not [s for s in sources if "__module__" in s]


def test_sysid_errors_imports_nothing_of_sysid_or_ingest() -> None:
    """The engine may import sysid.errors, so it must not pull in ingest (import-layer contract)."""
    tree = ast.parse((ROOT / "sysid" / "errors.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("sysid", "ingest")], names


def test_the_command_line_catches_sysid_errors_only() -> None:
    texts = {p.name: p.read_text() for p in (ROOT / "sysid" / "cli").glob("*.py")}
    text = "".join(texts.values())
    assert "except Exception" not in text and "IngestError" not in text
    # both programs (sysid, and the ingest program that lives here) run through one boundary over SysidError
    guards = re.findall(r"run_guarded\(\w+, \(([^)]*)\)\)", text)
    assert guards == ["SysidError,"], guards
    for program in ("__init__.py", "ingest_program.py"):
        main_body = texts[program].split("\ndef main(", 1)[1].split("\n\n\n", 1)[0]
        assert "return run_entry(" in main_body, program
    # only the ingest program names ingest's errors (it raises them; its boundary translates them)
    assert [name for name, src in texts.items() if "ingest.errors" in src] == ["ingest_program.py"]


def test_a_missing_extra_is_a_user_error_naming_the_extra() -> None:
    """The main job needs no optional extra; a feature that needs one (torch for adam, MuJoCo for synth) says
    which extra installs it, as a SysidError the command line prints in one line."""
    from sysid.errors import MissingDependencyError, SysidError, optional_import

    assert optional_import("json", "none", "x").dumps([1]) == "[1]"
    with pytest.raises(MissingDependencyError, match=r"sysid synth needs .*'no_such_pkg_xyz'.*sysid\[synth\]") as e:
        optional_import("no_such_pkg_xyz", "synth", "sysid synth")
    assert isinstance(e.value, SysidError) and isinstance(e.value.__cause__, ImportError)


def test_a_value_the_engine_refuses_is_a_user_error() -> None:
    """An engine option out of its set (``simulator.options`` of a fit config) is a `SysidError`, so the command
    line prints its message as the one ``error:`` line with exit status 2 rather than an internal error."""
    from sysid.simulators.protocol import get_simulator

    with pytest.raises(se.SysidError, match=r"^linear_solver must be 'pcr' or 'direct', got 'lu'$"):
        get_simulator("ostrich", linear_solver="lu")
