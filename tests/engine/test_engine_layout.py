"""The engine's host side as a maintainer finds it: `Simulation` a facade of few public methods whose parts
(simulation, tape, record, backward, krylov, tangent) pass typed buffers rather than string-keyed bags, every
module of sysid/ and ingest/ short, and `SolverOstrich`'s public methods those of a solver (its lanes, thread
groups and stages are its own)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from sysid.engine import Simulation, SolverOstrich

ENGINE = Path(__file__).resolve().parents[2] / "sysid" / "engine"
# the rollout's modules (`Simulation` and its parts)
ROLLOUT = ("simulation", "tape", "record", "backward", "krylov", "tangent")


def _public_methods(cls: type) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v))


def test_simulation_has_few_public_methods() -> None:
    methods = _public_methods(Simulation)
    assert len(methods) <= 12, methods
    assert {"forward", "backward", "jvp", "register_parameter", "set_parameters"} <= set(methods)


def test_solver_keeps_its_lanes_threads_and_stages_private() -> None:
    internal = {"lanes", "lane_width", "lane_threads", "thread_groups", "group_threads", "lane_scratch", "prepare",
                "solve", "finalize", "step_constants"}
    assert not internal & set(_public_methods(SolverOstrich))
    assert "step" in _public_methods(SolverOstrich)


def _any_dicts(path: Path) -> list[str]:
    """Annotations ``dict[str, Any]`` / ``Mapping[str, Any]`` in ``path``, as ``file:line``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in ("dict", "Mapping") and isinstance(node.slice, ast.Tuple)):
            continue
        key, value = (ast.unparse(a) for a in node.slice.elts)
        if (key, value) == ("str", "Any"):
            out.append(f"{path.name}:{node.lineno}")
    return out


def test_rollout_buffers_are_typed() -> None:
    """The rollout's buffers (rollout, backward, jvp, workspace, recorded launches) are dataclasses: no
    ``dict[str, Any]`` bag in its modules."""
    found = [hit for name in ROLLOUT for hit in _any_dicts(ENGINE / f"{name}.py")]
    assert not found, found


# modules allowed over MAX_LINES, each with its reason (none today)
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 800


def long_modules(root: Path, allowed: dict[str, str], max_lines: int = MAX_LINES) -> list[str]:
    """The modules of sysid/ and ingest/ below ``root`` over ``max_lines`` lines and not in ``allowed``
    (paths relative to ``root``), as ``path: lines``."""
    found = []
    for package in ("sysid", "ingest"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            n = len(path.read_text().splitlines())
            if n > max_lines and rel not in allowed:
                found.append(f"{rel}: {n}")
    return found


def test_modules_are_short() -> None:
    """No module of sysid/ or ingest/ over MAX_LINES lines unless LONG_MODULES states why."""
    assert not long_modules(ENGINE.parents[1], LONG_MODULES), "split by responsibility, or list with a reason"


def test_long_module_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "sysid").mkdir()
    (tmp_path / "ingest").mkdir()
    (tmp_path / "sysid" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "ingest" / "small.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules(tmp_path, {}) == [f"sysid/big.py: {MAX_LINES + 1}"]
    assert long_modules(tmp_path, {"sysid/big.py": "one table"}) == []
