"""The engine's host side as a maintainer finds it: `Simulation` a facade of few public methods whose parts
(simulation, tape, record, backward, krylov, tangent) pass typed buffers rather than string-keyed bags, each
module short, and `SolverOstrich`'s public methods those of a solver (its lanes, thread groups and stages are
its own)."""

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


def test_rollout_modules_are_short() -> None:
    sizes = {name: len((ENGINE / f"{name}.py").read_text().splitlines()) for name in ROLLOUT}
    assert max(sizes.values()) <= 800, sizes
