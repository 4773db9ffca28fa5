"""The committed example outputs of the bundled main job (models/helhest/params-pallet-sample.yaml and
reports/pallet-sample/report.html) are what `scripts/regenerate-examples` writes: a fast check that both come from
one run of examples/fit.yaml, and a slow one that reruns the job and compares the parameter files."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sysid.fit.params import load_params

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "models" / "helhest" / "params-pallet-sample.yaml"
REPORT = ROOT / "reports" / "pallet-sample" / "report.html"
CONFIG = ROOT / "examples" / "fit.yaml"
SCRIPT = ROOT / "scripts" / "regenerate-examples"
# Written at the time of the run or naming where it wrote: differ between any two runs.
RUN_KEYS = {"created", "report", "results"}


def _report_numbers(html: str) -> list[float]:
    """The numbers of the report's visible text (figures, scripts, styles and attribute values left out)."""
    text = re.sub(r"<(script|style|svg)\b.*?</\1>", " ", html, flags=re.S | re.I)
    text = re.sub(r"<[^>]*>", " ", text)
    # whole numbers too: a value shown to 4 significant digits may have none after the point (249.013 -> 249)
    return [float(m) for m in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def _shown(value: float, numbers: list[float]) -> bool:
    """The value appears among the numbers to the report's 4 significant digits, or to its 4 decimals where
    a table shows a small value that way (0.05924 as 0.0592)."""
    return any(abs(n - value) <= max(6e-4 * abs(value), 5.001e-5) for n in numbers)


def test_committed_params_come_from_the_main_job() -> None:
    """The committed parameter file is examples/fit.yaml's fit: its robot, simulator, timestep, optimiser, the
    manifest's train / held-out split, the config's parameter bounds and frozen flags, and the config's report."""
    params, doc = load_params(PARAMS)
    cfg = yaml.safe_load(CONFIG.read_text())
    manifest = yaml.safe_load((CONFIG.parent / cfg["data"]["manifest"]).read_text())
    meta = doc["metadata"]
    assert doc["robot"] == cfg["robot"]
    assert meta["simulator"] == cfg["simulator"]["name"]
    assert meta["dt"] == cfg["fit"]["dt"] and meta["optimizer"] == cfg["fit"]["optimizer"]
    assert meta["train_runs"] == manifest["splits"]["train"]
    assert meta["held_out_runs"] == manifest["splits"]["heldout"]
    assert meta["report"] == cfg["output"]["report"] == REPORT.relative_to(ROOT).as_posix()
    by_name = {p.name: p for p in params}
    for name, spec in cfg["parameters"].items():
        p = by_name[name]
        if "bounds" in spec:
            assert [p.lower, p.upper] == spec["bounds"], name
        if "nominal" in spec:
            assert p.nominal == spec["nominal"], name
        assert p.frozen == spec.get("frozen", False), name
    scores = meta["held_out_per_run"]
    assert sorted(scores) == sorted(manifest["splits"]["heldout"])
    assert all(math.isfinite(s["combined"]) and s["combined"] > 0 for s in scores.values())


def test_committed_report_shows_the_committed_params() -> None:
    """The committed report and parameter file were written by the same run: the report shows every identified
    value and every held-out score of the parameter file."""
    params, doc = load_params(PARAMS)
    numbers = _report_numbers(REPORT.read_text(encoding="utf-8"))
    assert len(numbers) > 20, "no numbers found in the report's text"
    missing = [f"{p.name} {p.value:.6g}" for p in params if not p.frozen and not _shown(p.value, numbers)]
    for run, s in doc["metadata"]["held_out_per_run"].items():
        missing += [f"{run} {k} {s[k]:.6g}" for k in ("combined", "mean_xy") if not _shown(s[k], numbers)]
    assert not missing, f"values of {PARAMS.name} not in {REPORT.name} (run scripts/regenerate-examples): {missing}"


def test_regenerate_script_refuses_extra_arguments(tmp_path: Path) -> None:
    res = subprocess.run([str(SCRIPT), str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert not any(tmp_path.iterdir())


def _same(a: Any, b: Any, where: str = "") -> list[str]:
    """Differences between two parameter documents: numbers to a relative 1e-6 (summation order), all else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b), key=str) if k not in RUN_KEYS]
        for k in a.keys() & b.keys():
            if k not in RUN_KEYS:
                out += _same(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {a!r} != {b!r}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return [] if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) else [f"{where}: {a!r} != {b!r}"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.slow
def test_committed_params_equal_a_fresh_main_job(tmp_path: Path) -> None:
    """`scripts/regenerate-examples DIR` reruns the main job; its parameter file equals the committed one (all
    but the creation time and the output paths)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    fresh = yaml.safe_load((tmp_path / "params-pallet-sample.yaml").read_text())
    committed = yaml.safe_load(PARAMS.read_text())
    diff = _same(committed, fresh)
    assert not diff, ("the committed parameter file is not what the main job writes (run scripts/regenerate-examples):"
                      "\n" + "\n".join(diff))
    assert (tmp_path / "report.html").is_file()
