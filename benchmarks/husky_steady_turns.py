"""The Husky sweep's steady turns against the engine's: forward speed and yaw rate per band of turn.

Each run of ../shared/data/husky-drive holds one constant pair of side speeds, so its steady part
(from ``--from`` seconds after its start) gives the robot's forward speed and yaw rate against the
wheels': the forward ratio (the ICP's speed along its heading over r times the mean of the two sides'
measured speeds) and the yaw ratio (its yaw rate over the wheels' r (w_right - w_left) / track). The
runs are grouped in bands of the signed ratio of the slower side's speed to the faster's (1: straight,
0: the slower side stands, < 0: the sides turn opposite ways); each band's median of both ratios is
printed for the data and, replaying every run open-loop in the config's simulator (its options,
h = ``--dt``) at each parameter set given, for the model, with the rms over the bands of the model's
departure from the data. Parameter sets: ``start`` (the config's starting values, what the fit starts
from) and any ``--theta name=value,...`` (the config's starting values with those replaced, e.g. a
fold's identified values from `sysid cv`).

    .venv/bin/python benchmarks/husky_steady_turns.py [-c examples/husky-drive.yaml] [--from 1.0]
        [--dt 0.1] [--theta mu=0.4,mu_lateral=0.7,slip_ratio=1.0,slip_ratio_lat=1.5,cmd_scale=0.95] ...
        [--by-block 3]   # the data's bands per block of consecutive steps as well (sysid cv's blocks), and
                         # the runs that barely follow their wheels (forward and yaw ratio both below 0.3)

About a minute on two CPU cores once the bags are in the ingest cache (the first read of the 161 bags
takes minutes). The data's figures need no simulation (``--no-model``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ingest.run import Run  # noqa: E402
from sysid.app.config import FitConfig, build_parameters  # noqa: E402
from sysid.app.fitting import accepted_parameters  # noqa: E402
from sysid.app.runs import load_runs  # noqa: E402
from sysid.app.sources import expand_sources  # noqa: E402
from sysid.fit.metrics import quat_yaw  # noqa: E402
from sysid.simulators.kinematic import robot_geometry, wheel_log_columns  # noqa: E402

# bands of the slower side's speed over the faster's (signed: < 0 the sides turn opposite ways)
BANDS = ((0.9, 1.01, "straight (0.9-1)"), (0.4, 0.9, "gentle (0.4-0.9)"), (0.15, 0.4, "tight (0.15-0.4)"),
         (-0.15, 0.15, "one side stands (-0.15-0.15)"), (-1.01, -0.15, "sides opposite (-1--0.15)"))
MIN_SPEED = 0.05  # [m/s] the least wheel speed whose forward ratio counts
MIN_YAW = 0.05  # [rad/s] the least wheel yaw rate whose yaw ratio counts
STUCK = 0.3  # a run "barely follows its wheels" below this forward ratio and this yaw ratio


def side_speeds(run: Run, logs: Sequence[tuple[str, ...]], sides: Sequence[str], t0: float) -> tuple[float, float]:
    """Mean measured speed [rad/s] of the left and the right wheels from ``t0`` [s] on."""
    cols = wheel_log_columns(run, logs, 0)
    w = run.wheel_cmd
    keep = w["t"].to_numpy(float) >= t0
    left = [c for c, s in zip(cols, sides, strict=True) if s == "left"]
    right = [c for c, s in zip(cols, sides, strict=True) if s == "right"]
    return float(w.loc[keep, left].to_numpy(float).mean()), float(w.loc[keep, right].to_numpy(float).mean())


def planar_rates(t: np.ndarray, x: np.ndarray, y: np.ndarray, yaw: np.ndarray, t0: float) -> tuple[float, float]:
    """Forward speed along the heading [m/s] and yaw rate [rad/s] of a path from ``t0`` [s] on."""
    k = t >= t0
    t, x, y, yaw = t[k], x[k], y[k], np.unwrap(yaw[k])
    span = t[-1] - t[0]
    mid = 0.5 * (yaw[1:] + yaw[:-1])
    along = np.diff(x) * np.cos(mid) + np.diff(y) * np.sin(mid)
    return float(along.sum() / span), float((yaw[-1] - yaw[0]) / span)


def stats(runs: Sequence[Run], paths: Sequence[np.ndarray] | None, geo: Mapping, start: float) -> np.ndarray:
    """Per run: slow/fast ratio, forward ratio, yaw ratio (NaN where the wheels' speed or yaw rate is too
    small to divide by); ``paths``: simulated poses (t, x, y, z, qx, qy, qz, qw) per run, else the odometry."""
    radius, track = float(geo["radius"]), float(geo["track"])
    out = []
    for i, run in enumerate(runs):
        t0 = float(run.odom["t"].iloc[0]) + start
        left, right = side_speeds(run, geo["wheel_logs"], geo["sides"], t0)
        fast, slow = (left, right) if abs(left) >= abs(right) else (right, left)
        ratio = slow / fast if abs(fast) > 1e-6 else np.nan
        v_w, yaw_w = radius * (left + right) / 2, radius * (right - left) / track
        if paths is None:
            o = run.odom
            v, wz = planar_rates(o["t"].to_numpy(float), o["x"].to_numpy(float), o["y"].to_numpy(float),
                                 o["yaw"].to_numpy(float), t0)
        else:
            p = paths[i]
            v, wz = planar_rates(p[:, 0], p[:, 1], p[:, 2], quat_yaw(p[:, 4:8]), t0)
        out.append((ratio, v / v_w if abs(v_w) > MIN_SPEED else np.nan, wz / yaw_w if abs(yaw_w) > MIN_YAW else np.nan))
    return np.array(out, float)


def bands(s: np.ndarray) -> list[tuple[str, int, float, float]]:
    rows = []
    for lo, hi, name in BANDS:
        m = (s[:, 0] >= lo) & (s[:, 0] < hi)
        fwd, yaw = s[m, 1], s[m, 2]
        rows.append((name, int(m.sum()), float(np.nanmedian(fwd)) if np.any(np.isfinite(fwd)) else np.nan,
                     float(np.nanmedian(yaw)) if np.any(np.isfinite(yaw)) else np.nan))
    return rows


def parse_theta(text: str) -> dict[str, float]:
    try:
        return {k.strip(): float(v) for k, v in (kv.split("=") for kv in text.split(",") if kv.strip())}
    except ValueError as exc:
        raise SystemExit(f"--theta {text!r}: give name=value pairs separated by commas ({exc})") from exc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default=str(ROOT / "examples" / "husky-drive.yaml"))
    ap.add_argument("--from", dest="start", type=float, default=1.0,
                    help="[s] the steady part starts this long after a run's start")
    ap.add_argument("--dt", type=float, default=0.1, help="[s] the simulator's timestep")
    ap.add_argument("--theta", action="append", default=[],
                    help="name=value,... replacing starting values (repeatable)")
    ap.add_argument("--by-block", type=int, default=0, help="also the data's bands per block of consecutive steps")
    ap.add_argument("--no-model", action="store_true", help="the data's figures only")
    args = ap.parse_args(argv)
    import sysid

    sysid.quiet_warp()  # as sysid's commands start Warp: no banner in the tables

    cfg = FitConfig.from_file(args.config)
    robot = cfg.load_robot()
    patterns = [str(p) for p in [*cfg.data.train, *cfg.data.held_out]]
    runs = sorted(load_runs(cfg, expand_sources(cfg, patterns, "runs"), "runs"), key=lambda r: r.name)
    geo = robot_geometry(robot)
    data = stats(runs, None, geo, args.start)
    print(f"{len(runs)} runs, steady part from {args.start:g} s; medians per band of the slower side's speed "
          "over the faster's")
    columns = [("data (ICP)", bands(data))]
    if not args.no_model:
        sim, accepted = accepted_parameters(cfg, robot)
        start = build_parameters(cfg, robot, accepted).values()
        sets = [("start", start)] + [(t, {**start, **parse_theta(t)}) for t in args.theta]
        for label, theta in sets:
            theta = {k: v for k, v in theta.items() if k != "odom_delay"}  # the robot's own path
            paths = sim.rollout(runs, theta, args.dt)
            columns.append((label, bands(stats(runs, paths, geo, args.start))))
    ref = columns[0][1]
    models = ["start"] + [f"theta {i}" for i in range(1, len(columns) - 1)]
    labels = ["data (ICP)"] + (models if len(columns) > 1 else [])
    print(f"{'':30s} {'':>4s}  " + "  ".join(f"{lab:>13s}" for lab in labels))
    print(f"{'band':30s} {'runs':>4s}  " + "  ".join(f"{'fwd':>6s} {'yaw':>6s}" for _ in columns))
    for i, (name, n, _, _) in enumerate(ref):
        print(f"{name:30s} {n:4d}  " + "  ".join(f"{c[i][2]:6.3f} {c[i][3]:6.3f}" for _, c in columns))
    for lab, (text, col) in zip(labels[1:], columns[1:], strict=True):
        err = [(c[2] - r[2], c[3] - r[3]) for c, r in zip(col, ref, strict=True)]
        rms = float(np.sqrt(np.nanmean(np.square(err))))
        print(f"  {lab}{'' if text == 'start' else ' (' + text + ')'}: rms departure from the data over the bands "
              f"{rms:.3f}")
    if args.by_block:
        order = np.array_split(np.arange(len(runs)), args.by_block)
        for b, idx in enumerate(order, 1):
            slow = [runs[i].name for i in idx if data[i, 1] < STUCK and data[i, 2] < STUCK]
            print(f"block {b}: {runs[idx[0]].name}-{runs[idx[-1]].name}; {len(slow)} runs below {STUCK:g} of the "
                  f"wheels' speed and yaw rate both{': ' + ', '.join(slow) if slow else ''}")
            for name, n, fwd, yaw in bands(data[idx]):
                print(f"  {name:30s} {n:4d}  fwd {fwd:6.3f} yaw {yaw:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
