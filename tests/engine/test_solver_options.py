"""`SolverOptions`' closed sets are `StrEnum`s that take their strings as well; bad values are named `OptionsError`s
(engine errors that are ValueErrors too); every experimental mode names the benchmark that compares it; the engine
raises its own named errors, never a bare ValueError."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import pickle
import re
from enum import StrEnum
from pathlib import Path

import pytest

from sysid.engine import (
    AdjointSolver,
    EngineError,
    LinearSolver,
    OptionsError,
    ParameterError,
    SafeguardMode,
    SolverOptions,
)
from sysid.errors import SysidError

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = SolverOptions()


@pytest.mark.parametrize("name", sorted(SolverOptions.CHOICES))
def test_a_closed_set_takes_its_members_and_their_strings(name: str) -> None:
    """Each member, given as itself or as its string, is stored as the member, compares equal to the string
    and validates; options made either way are equal, with the same repr, and survive a pickle (Ray workers)."""
    enum = SolverOptions.CHOICES[name]
    assert issubclass(enum, StrEnum) and isinstance(getattr(DEFAULTS, name), enum)
    for member in enum:
        from_string = SolverOptions(**{name: member.value})
        from_member = SolverOptions(**{name: member})
        value = getattr(from_string, name)
        assert type(value) is enum and value is member and value == member.value
        assert from_string == from_member and repr(from_string) == repr(from_member)
        from_string.validate()
        assert pickle.loads(pickle.dumps(from_string)) == from_string
        assert SolverOptions(**vars(from_string)) == from_string == dataclasses.replace(from_string)
        edited = SolverOptions()
        setattr(edited, name, member.value)  # assignment after construction converts as well
        assert getattr(edited, name) is member


@pytest.mark.parametrize(("name", "value", "message"), [
    ("linear_solver", "lu", "linear_solver must be 'pcr' or 'direct', got 'lu'"),
    ("friction_safeguard", "Newton", "friction_safeguard must be 'newton', 'active', 'clamp' or 'projected', "
                                     "got 'Newton'"),
    ("residual_norm", None, "residual_norm must be 'energy' or 'velocity', got None"),
    ("adjoint_solver", "cg", "adjoint_solver must be 'lu', 'krylov' or 'gmres', got 'cg'"),
    ("adjoint", "schur", "adjoint='schur' was removed"),
    ("adjoint", "implicit", "adjoint must be 'exact', got 'implicit'"),
    ("newton_iters", 0, "newton_iters, pcr_iters and adjoint_pcr_iters must be >= 1"),
    ("lanes", 4, "lanes must be None"),
])
def test_a_bad_value_is_an_options_error_naming_it(name: str, value: object, message: str) -> None:
    """A value outside its set is kept as given until `validate`, which raises an `OptionsError`: an engine
    error (one line at the command line) that is a ValueError too, with the message it always had."""
    options = SolverOptions(**{name: value})
    assert getattr(options, name) == value
    with pytest.raises(OptionsError) as info:
        options.validate()
    assert str(info.value).startswith(message)
    assert isinstance(info.value, EngineError) and isinstance(info.value, SysidError)
    assert isinstance(info.value, ValueError)


def test_every_experimental_mode_names_its_benchmark() -> None:
    """`SolverOptions.EXPERIMENTAL`: each entry a member of its field's set other than the default, with a
    benchmark command whose script exists and takes the mode the way the command gives it; docs/engine.md
    marks the same modes experimental."""
    experimental = SolverOptions.EXPERIMENTAL
    assert {m for _, m in experimental} >= {SafeguardMode.CLAMP, LinearSolver.PCR, AdjointSolver.GMRES}
    docs = (ROOT / "docs" / "engine.md").read_text()
    for (name, member), command in experimental.items():
        assert isinstance(member, SolverOptions.CHOICES[name]) and member != getattr(DEFAULTS, name), (name, member)
        script, *args = command.split()
        source = (ROOT / script).read_text()
        if args:
            flag = args[0]
            assert flag in ("--safeguard", "--set") and re.search(rf'"{flag}"', source), command
            assert (args[1] == member.value) if flag == "--safeguard" else f"{name}={member.value}" in args
        else:
            assert f'"{member.value}"' in source, command  # the script compares this mode itself
        row = next(line for line in docs.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`\"{member.value}\"` (experimental" in row, row


def test_the_engine_raises_its_own_errors() -> None:
    """No engine module raises a bare built-in error for bad input: each is an `EngineError` subclass
    (`OptionsError`, `ParameterError`, `UnsupportedModelError`, ...). TypeError stays for a programming error
    (an array group built with a missing or unknown field)."""
    allowed = {"TypeError", "NotImplementedError", "AssertionError"}
    found = []
    for path in sorted((ROOT / "sysid" / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                name = exc.id if isinstance(exc, ast.Name) else ""
                builtin = getattr(builtins, name, None)
                if isinstance(builtin, type) and issubclass(builtin, BaseException) and name not in allowed:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found, found
    assert issubclass(ParameterError, EngineError) and issubclass(ParameterError, ValueError)
