"""Leave-one-run-out identification on the real Helhest runs (../shared/data/helhest-real): a thin
call of ``sysid.app.cv.cross_validate``.

For each of the four flat-ground runs: fit on the other three, evaluate on it, both with the engine
(`ostrich`, h = 0.1 s, regularised wheel friction whose slip speed grows with the wheel's rolling
speed: slip_speed + slip_ratio r |w|) and with the kinematic baseline (h = 0.02 s, fitted inside
the same fold on the same training pieces), on 10 s pieces (`data.split`), each replayed
open-loop from its own odometry start. Prints per held-out run the mean over its pieces of the
mean xy distance and the combined error, side by side, and the identified parameters of each
fold. Published figures for two other runs of this robot, fitted and evaluated on the same runs:
0.30 m (the paper's code) and 0.28 m (MuJoCo) mean xy distance on a 10 s right turn. Every
piece's odometry is checked for jumps (data.odometry_jumps, reported, not dropped: training keeps
them); the table also gives the mean over the held-out pieces whose odometry never jumps and that
drive at least 1 m ("clean").

    .venv/bin/python benchmarks/bench_real_runs.py [--max-iter 30] [--split 10] [--simulators ostrich]
        [--odometry-jumps drop]   # train and score only the pieces without odometry jumps
        [--no-slip-ratio]         # the engine without slip_ratio (a slip speed independent of rolling)
        [--nuisance v0,w0,clock_offset]  # per-piece nuisance in the engine's training fits
        [--odom-delay]            # fit the odometry's translation delay (engine and baseline)
        [--nominal mu=0.5,odom_delay=0.8]  # the engine's start point (every fold the same)
        [--initial-speed wheels] [--odom-history odometry]  # a piece's start (simulator options, both models)
        [--workers 2]             # folds in parallel as Ray tasks (default 1: serial)
        [-o DIR]                  # also write DIR/cv.json and DIR/cv.html (the CV report)

About 15 minutes on two CPU cores serially (the engine folds dominate). The same folds from the
command line: ``sysid cv --config examples/helhest-real.yaml``.
"""

from __future__ import annotations

import argparse
import sys
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
# the odometry's translation delay (sysid.simulators.observation): a property of the odometry source, fitted
# shared by every run, for the engine and for the baseline alike (--odom-delay)
DELAY_PARAMS = {"odom_delay": {"nominal": 0.5, "bounds": [0.0, 2.0]}}
CLEAN_PATH = 1.0  # [m] a 'clean' piece drives at least this far (a standing piece scores ~0 whatever the model)


def config(sims: list[str], max_iter: int, split: float, jumps: str = "report", slip_ratio: bool = True,
           law: str = "single", nuisance: tuple[str, ...] = (), data: Path = DATA, odom_delay: bool = False,
           nominal: dict[str, float] | None = None, starts: int = 1, options: dict[str, str] | None = None):
    """The fit config every fold shares: the engine with the kinematic baseline beside it (both
    simulators), the engine alone, or the kinematic simulator alone; all four runs as training runs
    (the folds choose the held-out one)."""
    from sysid.app.config import FitConfig, ParamSpec
    from sysid.fit import FitOptions

    engine = "ostrich" in sims
    cfg = FitConfig(robot="helhest", base_dir=ROOT).replaced({
        "simulator.name": "ostrich" if engine else "kinematic",
        "data.train": [str(data / f"{r}.json") for r in RUNS],
        "data.held_out": [],
        "data.split": split,
        "fit.dt": 0.1 if engine else 0.02,
        "fit.max_iter": max_iter,
        "sweep.enabled": False,
        "data.jump_action": jumps,
        # the kinematic folds are the baseline inside each engine fold
        "fit.baseline.enabled": engine and "kinematic" in sims,
        "fit.baseline.max_iter": max_iter,
    })
    cfg.simulator.options = dict(options or {})  # --initial-speed / --odom-history: the baseline shares them
    if engine and (nuisance or starts > 1):  # the baseline takes no nuisance (no initial state)
        cfg.fit.options = FitOptions(nuisance=nuisance, starts=starts)
    specs = ENGINE_PARAMS if engine else KINEMATIC_PARAMS
    if engine and law == "combined":
        specs = {**specs, **COMBINED_PARAMS}
    if not slip_ratio:
        specs = {k: v for k, v in specs.items() if k not in ("slip_ratio", "slip_ratio_lat")}
    base = KINEMATIC_PARAMS
    if odom_delay:
        specs, base = {**specs, **DELAY_PARAMS}, {**base, **DELAY_PARAMS}
    for k, v in (nominal or {}).items():  # --nominal: the engine's start point, the same for every fold
        if k not in specs:
            raise SystemExit(f"--nominal {k}: not a parameter of this fit ({sorted(specs)})")
        specs = {**specs, k: {**specs[k], "nominal": v}}
    cfg.parameters = {k: ParamSpec.from_mapping(k, v) for k, v in specs.items()}
    cfg.fit.baseline.parameters = {k: ParamSpec.from_mapping(k, v) for k, v in base.items()}
    return cfg


def fold_rows(doc: dict, sims: list[str]) -> list[tuple[str, dict]]:
    """Per fold (held-out run) and simulator: held-out means over pieces, the 'clean' pieces' means,
    the fitted parameters and the fold's wall time, from the CV document."""
    who = {s: ("model" if s == doc["simulator"]["name"] else "baseline") for s in sims}
    rows = []
    for f in doc["folds"]:
        held = ", ".join(f["held_out_runs"])
        res = {}
        for sim, w in who.items():
            if f["status"] != "ok":
                res[sim] = {"error": f["error"], "pieces": 0, "clean": 0}
                continue
            pieces = [p for p in f["pieces"] if p.get(w)]
            clean = [p for p in pieces if not p["odometry_jumps"] and p["path_m"] >= CLEAN_PATH]

            def mean(ps: list, key: str, w: str = w) -> float:
                vals = [np.inf if p[w][key] is None else p[w][key] for p in ps]
                return float(np.mean(vals)) if vals else float("nan")

            res[sim] = {
                "mean_xy": mean(pieces, "mean_xy"), "combined": mean(pieces, "combined"),
                "clean_mean_xy": mean(clean, "mean_xy"), "clean_combined": mean(clean, "combined"),
                "clean": len(clean), "pieces": len(pieces),
                "params": {p["name"]: p["value"] for p in (f["parameters"].get(w) or [])},
                "seconds": f["execution"].get("wall_time") or float("nan"),
            }
        rows.append((held, res))
    return rows


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
    ap.add_argument("--odom-delay", action="store_true",
                    help="fit the odometry's translation delay odom_delay [s] (sysid.simulators.observation), "
                         "engine and baseline")
    ap.add_argument("--nominal", default="", metavar="NAME=VALUE,...",
                    help="the engine's start values (every fold the same), e.g. mu=0.5,odom_delay=0.8")
    ap.add_argument("--starts", type=int, default=1, help="the engine fits' multi-start (fit.starts)")
    ap.add_argument("--initial-speed", choices=("odometry", "wheels"),
                    help="where a piece's initial speed comes from (simulator option initial_speed; both models)")
    ap.add_argument("--odom-history", choices=("simulated", "odometry"),
                    help="what the delayed odometry integrates before a piece's start (simulator option "
                         "odom_history; both models)")
    ap.add_argument("--workers", type=int, default=1,
                    help="folds in parallel as Ray tasks on a local cluster of N CPUs (default 1: serial)")
    ap.add_argument("--ray-address", help="run the folds on this Ray cluster")
    ap.add_argument("--output", "-o", "--out", dest="out", metavar="DIR",
                    help="also write the CV report: DIR/cv.json and DIR/cv.html (--out: the earlier spelling)")
    ap.add_argument("--data", default=str(DATA), help=argparse.SUPPRESS)  # the runs' folder (tests)
    args = ap.parse_args(argv)
    data = Path(args.data)
    if not data.is_dir():
        print(f"skipped: {data} is absent", file=sys.stderr)
        return 0
    sims = [s for s in args.simulators.split(",") if s]
    unknown = sorted(set(sims) - {"ostrich", "kinematic"})
    if unknown or not sims:
        ap.error(f"--simulators takes ostrich and/or kinematic, got {args.simulators!r}")
    from sysid.app.cv import cross_validate, fold_line, write_cv

    nuisance = tuple(n for n in args.nuisance.split(",") if n)
    cfg = config(sims, args.max_iter, args.split, args.odometry_jumps, not args.no_slip_ratio, args.law, nuisance,
                 data, args.odom_delay,
                 {k: float(v) for k, v in (kv.split("=", 1) for kv in args.nominal.split(",") if kv)}, args.starts,
                 {k: v for k, v in (("initial_speed", args.initial_speed), ("odom_history", args.odom_history)) if v})
    doc = cross_validate(cfg, "loo", workers=args.workers, ray_address=args.ray_address,
                         only=[h for h in args.held.split(",") if h],
                         on_fold=lambda rec: print(fold_line(rec), file=sys.stderr, flush=True))
    if args.out:
        for p in write_cv(doc, args.out):
            print(f"wrote {p}", file=sys.stderr)
    rows = fold_rows(doc, sims)
    for held, res in rows:
        for sim, r in res.items():
            if "error" in r:
                print(f"held out {held}, {sim}: FAILED: {r['error']}", flush=True)
                continue
            ps = ", ".join(f"{k} {v:.4g}" for k, v in r["params"].items() if k != "chassis_mass")
            print(f"held out {held} ({r['pieces']} pieces, {r['clean']} without odometry jumps), {sim}: mean xy "
                  f"{r['mean_xy']:.3f} m, combined {r['combined']:.3f} m; clean pieces {r['clean_mean_xy']:.3f} / "
                  f"{r['clean_combined']:.3f} m  [{ps}]  (fold {r['seconds']:.0f} s)", flush=True)
    print(f"\nheld-out mean over pieces, mean xy / combined [m] ({args.split:g} s pieces; 'clean': the pieces "
          "whose odometry never jumps and that drive >= 1 m)")
    print("| held-out run | " + " | ".join(f"{s} all | {s} clean" for s in sims) + " |")
    print("|---|" + "---|---|" * len(sims))
    for held, res in rows:
        cells = []
        for s in sims:
            r = res[s]
            if "error" in r:
                cells += ["failed", "-"]
                continue
            cells.append(f"{r['mean_xy']:.3f} / {r['combined']:.3f}")
            cells.append(f"{r['clean_mean_xy']:.3f} / {r['clean_combined']:.3f} ({r['clean']} of {r['pieces']})"
                         if r["clean"] else "- (0)")
        print(f"| {held} | " + " | ".join(cells) + " |")
    for s in sims:
        ok = [r[s] for _, r in rows if "error" not in r[s]]
        clean = [r["clean_mean_xy"] for r in ok if r["clean"]]
        print(f"mean over held-out runs, {s}: mean xy {np.nanmean([r['mean_xy'] for r in ok]):.3f} m, "
              f"combined {np.nanmean([r['combined'] for r in ok]):.3f} m; over runs with clean pieces "
              f"{np.mean(clean) if clean else float('nan'):.3f} m mean xy")
    ex = doc["execution"]
    print(f"{ex['backend']}, {ex['workers']} worker(s): {ex['wall_time']:.0f} s")
    return 0 if doc["summary"]["n_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
