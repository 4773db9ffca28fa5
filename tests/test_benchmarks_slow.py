"""Slow wrapper: the engine benchmark script runs end to end at small sizes (timings are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_engine.py"


@pytest.mark.slow
def test_bench_engine_small(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_engine"] = bench  # dataclasses resolve their module by name
    spec.loader.exec_module(bench)
    bench.main(["--worlds", "1", "2", "--duration", "0.5", "--semi-dt", "1e-3", "--semi-max-steps", "100"])
    out = capsys.readouterr().out
    print(out)
    assert "| 1 |" in out and "| 2 |" in out
    assert "Ostrich:" in out and "SemiImplicit dt=0.001" in out
    assert "nan" not in out.lower()


BENCH_ADJOINT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_adjoint.py"


@pytest.mark.slow
def test_bench_adjoint_small(capsys: pytest.CaptureFixture[str]) -> None:
    """The adjoint benchmark runs end to end (1 world, 50 SemiImplicit steps timed); timings printed only."""
    sys.path.insert(0, str(BENCH_ADJOINT.parent))
    spec = importlib.util.spec_from_file_location("bench_adjoint", BENCH_ADJOINT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_adjoint"] = bench
    spec.loader.exec_module(bench)
    rows = bench.main(["--worlds", "1", "--semi-steps", "50"])
    out = capsys.readouterr().out
    print(out)
    assert "| 1 |" in out and "ratio" in out
    o, s = rows[0]["ostrich"], rows[0]["semi"]
    assert s is not None
    assert o["grad_finite"] and s["grad_finite"] and o["x_final_min"] > 3.0
