"""The calibration notebook runs top to bottom in a clean Jupyter kernel (nbclient, the ``dev`` extra),
from a working folder outside the checkout, and its outputs say what it claims: no error, every figure
cell shows a figure, the calibrated command scale is near the generator's, the fit has finite intervals
around its values, held-out errors are in range for both the engine and the kinematic baseline, the
parameter file it saves reads back, and its progress bars end at the evaluations the fit reports.

The notebook is a template a user copies: its first code cell is the configuration, and it uses the
public API only (no private module, no ``sysid.app.pipeline``, no file-descriptor tricks). The committed
notebook carries its outputs (a reader sees the figures and tables without running it), and they are
those of a fresh run: the key figures it prints last are compared."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CALIBRATION = NOTEBOOKS / "calibrate_pallet_sample.ipynb"


def _figures(cell) -> list[bytes]:
    return [o["data"]["image/png"] for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]


def _errors(nb) -> list[str]:
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _check_outputs(nb) -> None:
    assert not _errors(nb), _errors(nb)
    figure_cells = [c for c in nb.cells if "figure" in c.get("metadata", {}).get("tags", [])]
    assert len(figure_cells) >= 2
    for c in figure_cells:
        figs = _figures(c)
        assert figs and all(len(f) > 10_000 for f in figs), c.source[:80]  # base64 PNG of a drawn figure
    tables = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "execute_result" and "text/html" in o.get("data", {})]
    assert len(tables) >= 4  # overview, lags and jumps, parameters, error table
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Traceback" not in text and "Warp CUDA warning" not in text


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    from nbclient import NotebookClient

    work = tmp_path_factory.mktemp("elsewhere")  # not the notebook's folder, not the checkout
    nb = nbformat.read(CALIBRATION, as_version=4)
    for c in nb.cells:  # a clean run: nothing from the committed outputs
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    return nb, work


def test_notebook_runs_clean_from_another_folder(executed):
    nb, _work = executed
    _check_outputs(nb)


def test_notebook_numbers_in_range(executed):
    _nb, work = executed
    summary = json.loads((work / "calibration-output" / "summary.json").read_text())
    assert abs(summary["cmd_scale"] - 0.96) < 0.02  # the generator's command scale (manifest truth)
    assert 0 < summary["evaluations"] <= 40
    assert 2 < summary["n_eff"] < 1e4  # intervals from an effective sample size, not every sample
    free = {n: p for n, p in summary["parameters"].items() if p["ci95"] is not None}
    assert {"kp", "mu", "mu_lateral", "slip_speed"} <= set(free)
    for name, p in summary["parameters"].items():
        assert p["unit"], name
        if p["ci95"] is not None:
            lo, hi = p["ci95"]
            assert math.isfinite(lo) and math.isfinite(hi) and lo <= p["value"] <= hi, (name, p)
    held = summary["held_out"]
    engine, nominal, base = held["engine, identified"]["run_10"], held["engine, nominal"]["run_10"], \
        held["kinematic baseline"]["run_10"]
    assert 0.0 < engine["combined"] < 0.6 and 0.0 < engine["mean_xy"] < 0.5
    assert engine["combined"] < nominal["combined"]  # the fit helps on the held-out run (0.16 vs 0.32 m)
    assert engine["combined"] < base["combined"]  # and the engine beats the baseline there (0.47 m)
    assert 0.0 < base["combined"] < 2.0
    from sysid.fit import load_params

    params, doc = load_params(work / summary["params_file"])
    assert params["cmd_scale"].value == pytest.approx(summary["cmd_scale"])
    assert doc["parameters"]["slip_speed"]["unit"] == "m/s"
    assert not (NOTEBOOKS / "calibration-output").exists()  # outputs went to the working folder


def test_committed_notebook_has_its_outputs():
    nb = nbformat.read(CALIBRATION, as_version=4)
    nbformat.validate(nb)
    _check_outputs(nb)
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")


def test_notebook_is_a_template_on_the_public_api():
    nb = nbformat.read(CALIBRATION, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    first = cells[0]
    assert "parameters" in first.metadata.get("tags", [])  # the configuration cell comes first
    assigned = {t.id for node in ast.parse(first.source).body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    assert {"DATA", "TOPICS", "TRAIN", "HELD_OUT", "CONFIG", "OUT"} <= assigned
    for i, cell in enumerate(cells):
        for node in ast.walk(ast.parse(cell.source)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for m in modules:
                assert not any(part.startswith("_") for part in m.split(".")), f"cell {i}: private module {m}"
                assert not m.startswith("sysid.app.") and not m.startswith("sysid.simulators"), \
                    f"cell {i}: {m} (use the public names of sysid.app, sysid.fit)"
            assert not any(n.startswith("_") for n in names), f"cell {i}: private name {names}"
        assert "dup2" not in cell.source and not re.search(r"sysid\._(?!_)", cell.source), f"cell {i}"


def _key_figures(nb) -> dict:
    cell = next(c for c in nb.cells if "key-figures" in c.get("metadata", {}).get("tags", []))
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    m = re.search(r"^key figures: (\{.*\})$", text, re.M)
    assert m, text[-500:]
    return json.loads(m.group(1))


def test_committed_outputs_are_a_fresh_runs(executed):
    """The committed notebook's key figures are those the notebook gives when run now."""
    fresh, committed = _key_figures(executed[0]), _key_figures(nbformat.read(CALIBRATION, as_version=4))
    assert committed.keys() == fresh.keys()
    for k, v in fresh.items():
        if isinstance(v, int):
            assert committed[k] == v, (k, committed[k], v)
        else:
            assert committed[k] == pytest.approx(v, rel=1e-3, abs=1e-4), (k, committed[k], v)


def test_progress_bars_end_at_the_evaluations_reported(executed):
    nb, _work = executed
    for cell in nb.cells:
        if "EvaluationBar(" not in cell.source:
            continue
        err = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream"
                      and o.get("name") == "stderr")
        out = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream"
                      and o.get("name") == "stdout")
        finals = [s for s in re.split(r"[\r\n]", err) if "eval" in s and "100%" in s]
        assert finals, err[-300:]
        spent = [int(n) for n in re.findall(r"in (\d+) evaluations", out)]
        counts = [int(m.group(1)) for s in finals for m in [re.search(r"(\d+)/(\d+) ", s)] if m
                  and m.group(1) == m.group(2)]
        assert counts and all(n > 0 for n in counts)
        if spent:
            assert spent[-1] == counts[-1], (spent, finals)
