"""Gauss-Newton through the engine with the tangent Jacobian (forward sensitivities of the converged
steps, `Simulation.jvp`) against central differences in extra worlds (`fit.jacobian: fd`), side by
side in one process on the same configs:

- time per Jacobian (d pose / d free parameters of every training run): every call the fit makes
  is timed, median after the first (which builds the model and compiles kernels);
- the LM outcome both ways: evaluations, Jacobian evaluations, final training loss, held-out error
  (mean over held-out runs or pieces of the combined error and the mean xy distance), fit time.

Configs: the bundled main job (examples/fit.yaml, pallet sample) and, where ../shared/data is
present, the real-run example (examples/helhest-real.yaml). No sweep, no baseline, no outputs.

    .venv/bin/python benchmarks/bench_fit_jacobian.py [--configs fit,helhest-real]

About 6 minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(config: Path) -> list[str]:
    """The config's fit both ways; every rollout_with_jacobian call of the fit is timed."""
    from sysid.app.config import FitConfig
    from sysid.app.pipeline import run_fit
    from sysid.simulators.ostrich import OstrichReplay

    original = OstrichReplay.rollout_with_jacobian
    calls: list[tuple[float, str]] = []

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = original(self, *args, **kwargs)
        calls.append((time.perf_counter() - t0, str(self.last_status.get("jacobian"))))
        return out

    out = {}
    OstrichReplay.rollout_with_jacobian = timed
    try:
        for how in ("tangent", "fd"):
            calls.clear()
            cfg = FitConfig.from_file(config).replaced({"fit.jacobian": how, "sweep.enabled": False,
                                                         "fit.baseline.enabled": False})
            t0 = time.perf_counter()
            doc = run_fit(cfg, progress=False, write=False)
            wall = time.perf_counter() - t0
            fit = doc["fit"]
            held = [r for r in doc["runs"] if r["split"] == "held_out"]
            out[how] = {
                "per jacobian [s]": statistics.median(c[0] for c in calls[1:] or calls) if calls else float("nan"),
                "jacobian calls": len(calls),
                "of them fd": sum(c[1].startswith("fd") for c in calls),
                "evaluations": fit["iterations"],
                "convergence": fit["convergence"],
                "final loss [m^2]": fit["loss_final"],
                "held-out combined [m]": float(np.mean([r["metrics_identified"]["combined"] for r in held])),
                "held-out mean xy [m]": float(np.mean([r["metrics_identified"]["mean_xy"] for r in held])),
                "fit wall [s]": wall,
                "parameters": ", ".join(f"{p['name']} {p['value']:.4g}" for p in doc["parameters"]
                                        if not p["frozen"] or p["calibrated"]),
            }
    finally:
        OstrichReplay.rollout_with_jacobian = original
    t, f = out["tangent"], out["fd"]
    lines = [f"\n{config.name}: LM with the tangent Jacobian vs central differences in extra worlds "
             f"(per-Jacobian time: median over the fit's calls after the first; fd / tangent "
             f"{f['per jacobian [s]'] / t['per jacobian [s]']:.2f})", "| | tangent | fd |", "|---|---|---|"]
    for key, v in t.items():
        fmt = (lambda x: f"{x:.4g}") if isinstance(v, float) else str
        lines.append(f"| {key} | {fmt(v)} | {fmt(f[key])} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="fit,helhest-real")
    args = ap.parse_args(argv)
    for name in [c for c in args.configs.split(",") if c]:
        config = ROOT / "examples" / f"{name}.yaml"
        if name == "helhest-real" and not (ROOT.parent / "shared" / "data" / "helhest-real").is_dir():
            print(f"skipped {name}: ../shared/data/helhest-real is absent")
            continue
        for line in measure(config):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
