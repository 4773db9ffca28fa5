"""Leave-one-run-out identification on the real Helhest runs (../shared/data/helhest-real).

For each of the four flat-ground runs: fit on the other three, evaluate on it, both with the engine
(`ostrich`, regularised wheel friction, h = 0.1 s) and with the kinematic baseline (h = 0.02 s), on
10 s pieces (`data.split`), each replayed open-loop from its own odometry start. Prints per held-out
run the mean over its pieces of the mean xy distance and the combined error, side by side, and the
identified parameters of each fold. Published figures for two other runs of this robot, fitted and
evaluated on the same runs: 0.30 m (the paper's code) and 0.28 m (MuJoCo) mean xy distance on a
10 s right turn.

    .venv/bin/python benchmarks/bench_real_runs.py [--max-iter 30] [--split 10]

About 15 minutes on two CPU cores (the engine folds dominate).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "helhest-real"
RUNS = ("right_turn_a", "left_circle", "helhest_2026_04_13-09_55_01", "helhest_2026_04_13-09_57_51")
ENGINE_PARAMS = {
    "kp": {"bounds": [1, 5000]},
    "mu": {"nominal": 0.15, "bounds": [0.05, 2.0]},  # braking at ~1-1.5 m/s^2 with stopped wheels
    "mu_lateral": {"nominal": 0.1, "bounds": [0.005, 5.0]},
    "slip_speed": {"nominal": 0.1, "bounds": [0.005, 1.0]},
    "cmd_scale": {"bounds": [0.5, 1.5]},
    "chassis_mass": {"frozen": True},
}
KINEMATIC_PARAMS = {k: v for k, v in ENGINE_PARAMS.items() if k != "slip_speed"} | {
    "mu": {"bounds": [0.05, 2.0]},
    "mu_lateral": {"bounds": [0.005, 5.0]},
}


def fold(simulator: str, held: str, max_iter: int, split: float) -> dict:
    from sysid.config import FitConfig, ParamSpec
    from sysid.pipeline import run_fit

    engine = simulator == "ostrich"
    cfg = FitConfig(
        robot="helhest",
        simulator=simulator,
        train=[str(DATA / f"{r}.json") for r in RUNS if r != held],
        held_out=[str(DATA / f"{held}.json")],
        split=split,
        dt=0.1 if engine else 0.02,
        max_iter=max_iter,
        sweep=False,
        base_dir=ROOT,
    )
    specs = ENGINE_PARAMS if engine else KINEMATIC_PARAMS
    cfg.parameters = {k: ParamSpec.from_mapping(k, v) for k, v in specs.items()}
    t0 = time.perf_counter()
    doc = run_fit(cfg, progress=False, write=False)
    pieces = [r for r in doc["runs"] if r["split"] == "held_out"]
    return {
        "mean_xy": float(np.mean([r["metrics_identified"]["mean_xy"] for r in pieces])),
        "combined": float(np.mean([r["metrics_identified"]["combined"] for r in pieces])),
        "pieces": len(pieces),
        "params": {p["name"]: p["value"] for p in doc["parameters"]},
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iter", type=int, default=30)
    ap.add_argument("--split", type=float, default=10.0)
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"skipped: {DATA} is absent", file=sys.stderr)
        return 0
    rows = []
    for held in RUNS:
        res = {sim: fold(sim, held, args.max_iter, args.split) for sim in ("ostrich", "kinematic")}
        rows.append((held, res))
        for sim, r in res.items():
            ps = ", ".join(f"{k} {v:.4g}" for k, v in r["params"].items() if k != "chassis_mass")
            print(f"held out {held} ({r['pieces']} pieces), {sim}: mean xy {r['mean_xy']:.3f} m, combined "
                  f"{r['combined']:.3f} m  [{ps}]  ({r['seconds']:.0f} s)", flush=True)
    print(f"\n| held-out run | engine mean xy [m] | engine combined [m] | kinematic mean xy [m] | "
          f"kinematic combined [m] |   ({args.split:g} s pieces)")
    print("|---|---|---|---|---|")
    for held, res in rows:
        e, k = res["ostrich"], res["kinematic"]
        print(f"| {held} | {e['mean_xy']:.3f} | {e['combined']:.3f} | {k['mean_xy']:.3f} | {k['combined']:.3f} |")
    for sim in ("ostrich", "kinematic"):
        print(f"mean over held-out runs, {sim}: mean xy {np.mean([r[sim]['mean_xy'] for _, r in rows]):.3f} m, "
              f"combined {np.mean([r[sim]['combined'] for _, r in rows]):.3f} m")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
