"""The calibration notebooks run top to bottom (code cells executed in order, in one namespace,
from the notebooks/ folder, as Jupyter would; no Jupyter needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch) -> None:
    matplotlib.use("Agg")
    monkeypatch.chdir(path.parent)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells, f"{path.name} has no code cells"
    namespace: dict = {"__name__": "__main__"}
    last = None
    for i, cell in enumerate(cells):
        tree = ast.parse("".join(cell["source"]), filename=f"{path.name}[{i}]")
        tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, f"{path.name}[{i}]", "exec"), namespace)
        if tail is not None:
            last = eval(compile(ast.Expression(tail.value), f"{path.name}[{i}]", "eval"), namespace)
    # the notebook ends by identifying parameters: every free one has a finite value
    assert isinstance(last, list) and last, last
    assert all(p["value"] == p["value"] for p in last)
