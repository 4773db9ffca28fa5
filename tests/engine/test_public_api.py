"""The engine's public surface: ``sysid.engine.__all__`` is what the rest of sysid may import (the engine's
modules are its own), and importing the engine leaves Warp's process-wide settings alone (sysid's commands
initialise Warp quietly themselves, tests/app/test_cli_fast.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import sysid.engine

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "sysid.engine"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, root: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in ``path`` (a module under ``root``); relative imports resolved;
    names empty for ``import m``."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            out.append((node.lineno, base, [a.name for a in node.names]))
    return out


def engine_reaches(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Imports of anything in the engine but its public names, as ``file:line: what``."""
    public = set(sysid.engine.__all__)
    bad = []
    for path in paths:
        for line, module, names in _imported(path, root):
            where = f"{path.relative_to(root)}:{line}"
            if module.startswith(ENGINE + "."):
                bad.append(f"{where}: {module}")
            elif module == ENGINE and names and not set(names) <= public:
                bad.append(f"{where}: {ENGINE} {sorted(set(names) - public)}")
            elif module == "sysid" and "engine" in names:
                bad.append(f"{where}: sysid.engine as a module (import its public names)")
    return bad


def test_public_names_exist_and_are_the_whole_surface() -> None:
    for name in sysid.engine.__all__:
        assert hasattr(sysid.engine, name), name
    exported = {n for n in vars(sysid.engine) if not n.startswith("_")}
    submodules = {n for n in exported if type(getattr(sysid.engine, n)) is type(sys)}
    assert exported - submodules == set(sysid.engine.__all__)


def test_sysid_outside_the_engine_imports_only_its_public_names() -> None:
    paths = [p for p in sorted((ROOT / "sysid").rglob("*.py")) if (ROOT / "sysid" / "engine") not in p.parents]
    assert len(paths) > 50 and not engine_reaches(paths), engine_reaches(paths)


def test_the_scan_sees_a_reach_into_the_engine(tmp_path: Path) -> None:
    bad = tmp_path / "sysid" / "robot" / "probe.py"  # where a caller would be; scanned, never imported
    bad.parent.mkdir(parents=True)
    bad.write_text("from sysid.engine.rollout import Simulation\nimport sysid.engine.parallel\n"
            "from sysid.engine import SolverOstrich, graphs\nfrom ..engine import scenes\n"
            "from sysid.engine import Simulation, SolverOptions\n")
    found = engine_reaches([bad], tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "sysid.engine.rollout", "sysid.engine.parallel", "sysid.engine ['graphs']", "sysid.engine ['scenes']"]


def test_importing_the_engine_leaves_warps_settings_alone() -> None:
    code = ("import warp as wp\n"
            "before = dict(vars(wp.config))\n"
            "import sysid.engine, sysid.simulators.ostrich, sysid.plan.control\n"
            "after = dict(vars(wp.config))\n"
            "print(sorted(k for k in before.keys() | after.keys() if before.get(k, 0) != after.get(k, 0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "SYSID_WARP_VERBOSE"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
