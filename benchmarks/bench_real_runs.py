"""Leave-one-run-out identification on the real Helhest runs (../shared/data/helhest-real).

For each of the four flat-ground runs: fit on the other three, evaluate on it, both with the engine
(`ostrich`, h = 0.1 s, regularised wheel friction whose slip speed grows with the wheel's rolling
speed: slip_speed + slip_ratio r |w|) and with the kinematic baseline (h = 0.02 s), on 10 s pieces
(`data.split`), each replayed open-loop from its own odometry start. Prints per held-out
run the mean over its pieces of the mean xy distance and the combined error, side by side, and the
identified parameters of each fold. Published figures for two other runs of this robot, fitted and
evaluated on the same runs: 0.30 m (the paper's code) and 0.28 m (MuJoCo) mean xy distance on a
10 s right turn. Every piece's odometry is checked for jumps (data.odometry_jumps, reported, not
dropped: training keeps them); the table also gives the mean over the held-out pieces whose
odometry never jumps and that drive at least 1 m ("clean").

    .venv/bin/python benchmarks/bench_real_runs.py [--max-iter 30] [--split 10] [--simulators ostrich]
        [--odometry-jumps drop]   # train and score only the pieces without odometry jumps
        [--no-slip-ratio]         # the engine without slip_ratio (a slip speed independent of rolling)
        [--nuisance v0,w0,clock_offset]  # per-piece nuisance in the engine's training fits

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
    "slip_ratio": {"nominal": 1.0, "bounds": [0.0, 5.0]},  # slip speed grows with rolling speed
    "cmd_scale": {"bounds": [0.5, 1.5]},
    "chassis_mass": {"frozen": True},
}
# the combined-slip law (docs/traction.md): the lateral direction its own slip speed and slip ratio
COMBINED_PARAMS = {
    "slip_speed_lat": {"nominal": 0.1, "bounds": [0.005, 1.0]},
    "slip_ratio_lat": {"nominal": 1.0, "bounds": [0.0, 5.0]},
}
KINEMATIC_PARAMS = {k: v for k, v in ENGINE_PARAMS.items() if k not in ("slip_speed", "slip_ratio")} | {
    "mu": {"bounds": [0.05, 2.0]},
    "mu_lateral": {"bounds": [0.005, 5.0]},
}


def fold(simulator: str, held: str, max_iter: int, split: float, jumps: str = "report",
         slip_ratio: bool = True, law: str = "single", nuisance: tuple[str, ...] = ()) -> dict:
    from sysid.config import FitConfig, ParamSpec
    from sysid.identify import FitOptions
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
        jump_action=jumps,
        baseline=False,  # the kinematic folds below are the baseline
    )
    if engine and nuisance:
        cfg.fit_options = FitOptions(nuisance=nuisance)
    specs = ENGINE_PARAMS if engine else KINEMATIC_PARAMS
    if engine and law == "combined":
        specs = {**specs, **COMBINED_PARAMS}
    if not slip_ratio:
        specs = {k: v for k, v in specs.items() if k not in ("slip_ratio", "slip_ratio_lat")}
    cfg.parameters = {k: ParamSpec.from_mapping(k, v) for k, v in specs.items()}
    t0 = time.perf_counter()
    doc = run_fit(cfg, progress=False, write=False)
    pieces = [r for r in doc["runs"] if r["split"] == "held_out"]
    def path(r: dict) -> float:
        return float(np.sum(np.hypot(np.diff(r["measured"]["x"]), np.diff(r["measured"]["y"]))))

    # pieces whose odometry never jumps and that drive (>= 1 m): a standing piece scores ~0 whatever the model
    clean = [r for r in pieces if not r["meta"]["odometry_jumps"] and path(r) >= 1.0]

    def mean(rs: list, key: str) -> float:
        return float(np.mean([r["metrics_identified"][key] for r in rs])) if rs else float("nan")

    return {
        "mean_xy": mean(pieces, "mean_xy"),
        "combined": mean(pieces, "combined"),
        "clean_mean_xy": mean(clean, "mean_xy"),
        "clean_combined": mean(clean, "combined"),
        "clean": len(clean),
        "pieces": len(pieces),
        "params": {p["name"]: p["value"] for p in doc["parameters"]},
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iter", type=int, default=30)
    ap.add_argument("--split", type=float, default=10.0)
    ap.add_argument("--simulators", default="ostrich,kinematic", help="comma-separated (default both)")
    ap.add_argument("--odometry-jumps", choices=("report", "drop"), default="report",
                    help="drop: train and score only the pieces whose odometry never jumps")
    ap.add_argument("--no-slip-ratio", action="store_true",
                    help="the engine without slip_ratio (its slip speed then does not grow with rolling speed)")
    ap.add_argument("--law", choices=("single", "combined"), default="single",
                    help="engine wheel friction: one slip speed (single) or the combined-slip law (separate "
                         "longitudinal and lateral slip speeds and slip ratios)")
    ap.add_argument("--held", default=",".join(RUNS), help="comma-separated held-out runs (default: all four)")
    ap.add_argument("--nuisance", default="",
                    help="comma-separated per-run nuisance parameters for the engine fit (v0, w0, clock_offset): "
                         "fitted per training piece, 0 on the held-out pieces")
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"skipped: {DATA} is absent", file=sys.stderr)
        return 0
    sims = [s for s in args.simulators.split(",") if s]
    rows = []
    for held in [h for h in args.held.split(",") if h]:
        nuisance = tuple(n for n in args.nuisance.split(",") if n)
        res = {sim: fold(sim, held, args.max_iter, args.split, args.odometry_jumps, not args.no_slip_ratio, args.law,
                         nuisance) for sim in sims}
        rows.append((held, res))
        for sim, r in res.items():
            ps = ", ".join(f"{k} {v:.4g}" for k, v in r["params"].items() if k != "chassis_mass")
            print(f"held out {held} ({r['pieces']} pieces, {r['clean']} without odometry jumps), {sim}: mean xy "
                  f"{r['mean_xy']:.3f} m, combined {r['combined']:.3f} m; clean pieces {r['clean_mean_xy']:.3f} / "
                  f"{r['clean_combined']:.3f} m  [{ps}]  ({r['seconds']:.0f} s)", flush=True)
    print(f"\nheld-out mean over pieces, mean xy / combined [m] ({args.split:g} s pieces; 'clean': the pieces "
          "whose odometry never jumps and that drive >= 1 m)")
    print("| held-out run | " + " | ".join(f"{s} all | {s} clean" for s in sims) + " |")
    print("|---|" + "---|---|" * len(sims))
    for held, res in rows:
        cells = []
        for s in sims:
            r = res[s]
            cells.append(f"{r['mean_xy']:.3f} / {r['combined']:.3f}")
            cells.append(f"{r['clean_mean_xy']:.3f} / {r['clean_combined']:.3f} ({r['clean']} of {r['pieces']})"
                         if r["clean"] else "- (0)")
        print(f"| {held} | " + " | ".join(cells) + " |")
    for s in sims:
        clean = [r[s]["clean_mean_xy"] for _, r in rows if r[s]["clean"]]
        print(f"mean over held-out runs, {s}: mean xy {np.nanmean([r[s]['mean_xy'] for _, r in rows]):.3f} m, "
              f"combined {np.nanmean([r[s]['combined'] for _, r in rows]):.3f} m; over runs with clean pieces "
              f"{np.mean(clean):.3f} m mean xy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
