"""The real Helhest runs' distance budget and the odometry's timing: what the launches lose, and where.

Per run of the config's training and held-out runs (whole runs, not pieces):

- the distance budget: the odometry's distance along its heading at the run's end against the wheels'
  (r times the mean of the left and right wheels' logged speeds, integrated), and the engine's robot
  replayed open-loop at the config's starting values with ``odom_delay`` 0 (the robot's own path) at
  each ``--mu``: whether wheel spin under Coulomb friction accounts for what the odometry lacks;
- the cruises: stretches of at least ``--cruise`` seconds where the wheels' rim speed, averaged over
  1 s, stays above 0.2 m/s and changes by less than 0.3 m/s²; per cruise the odometry's distance
  behind the wheels' and the delay that deficit implies at the cruise's speed (deficit / speed);
- the starts from rest: for each time the wheels start after standing 1 s, how long the odometry takes
  to move 0.2 m and how far the wheels have gone by then, and the odometry's highest 0.1 s speed in the
  next 3 s against the wheels' highest rim speed there (an odometry faster than the wheels is catching
  up, not following the robot).

    .venv/bin/python benchmarks/helhest_odometry_timing.py [-c examples/helhest-real.yaml]
        [--mu 0.8,0.5,0.3] [--dt 0.1] [--cruise 2.0]

About a minute on two CPU cores (the engine's kernels cached).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
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
from sysid.simulators.kinematic import robot_geometry  # noqa: E402

MOVING = 0.2  # [m/s] a rim or odometry speed above this moves
STANDING = 0.05  # [m/s] the wheels stand below this
BUDGE = 0.2  # [m] the odometry has moved from a standing start
STEADY = 0.3  # [m/s^2] a cruise's speed changes by less than this


def along(t: np.ndarray, x: np.ndarray, y: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """Signed distance [m] travelled along the heading since ``t[0]`` (a reversing robot subtracts)."""
    mid = 0.5 * (yaw[1:] + yaw[:-1])
    return np.concatenate([[0.0], np.cumsum(np.diff(x) * np.cos(mid) + np.diff(y) * np.sin(mid))])


def rim(run: Run, radius: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The wheels' rim speed r (w_left + w_right) / 2 [m/s] and its integral [m], at times ``t``."""
    w = run.wheel_cmd
    tw = w["t"].to_numpy(float)
    v = radius * 0.5 * (w["left"].to_numpy(float) + w["right"].to_numpy(float))
    s = np.concatenate([[0.0], np.cumsum(np.diff(tw) * 0.5 * (v[1:] + v[:-1]))])
    return np.interp(t, tw, v), np.interp(t, tw, s)


def smooth(t: np.ndarray, v: np.ndarray, span: float) -> np.ndarray:
    """``v`` averaged over ``span`` [s] (centred; the grid's mean step)."""
    k = max(1, int(round(span / float(np.mean(np.diff(t))))))
    return np.convolve(v, np.ones(k) / k, mode="same")


def cruises(t: np.ndarray, v_rim: np.ndarray, s_rim: np.ndarray, s_odo: np.ndarray, least: float
            ) -> list[tuple[float, float, float, float]]:
    """Per cruise (t0, t1, speed [m/s], deficit [m]): the median over the cruise of the wheels' distance
    minus the odometry's, the distance each has covered since the run's start."""
    vs = smooth(t, v_rim, 1.0)
    ok = (vs > MOVING) & (np.abs(np.gradient(vs, t)) < STEADY)
    out = []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(int), [0]])))
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        if t[b - 1] - t[a] >= least:
            out.append((float(t[a]), float(t[b - 1]), float(np.median(vs[a:b])),
                        float(np.median(s_rim[a:b] - s_odo[a:b]))))
    return out


def starts(t: np.ndarray, v_rim: np.ndarray, s_rim: np.ndarray, s_odo: np.ndarray, v_odo: np.ndarray
           ) -> list[tuple[float, float, float, float, float]]:
    """Per start from rest (the wheels above 0.05 m/s after standing 1 s, or since the run's start): (t, the
    time [s] until the odometry has moved ``BUDGE`` from where it stood, the wheels' distance by then [m], the
    odometry's highest speed and the wheels' highest rim speed in the next 3 s [m/s])."""
    out = []
    dt = float(np.mean(np.diff(t)))
    stood = 1.0 if abs(v_rim[0]) < STANDING else 0.0  # a run that begins standing starts from rest
    for i in range(1, len(t)):
        if stood >= 1.0 and abs(v_rim[i]) >= STANDING:
            nxt = (t >= t[i]) & (t <= t[i] + 3.0)
            moved = np.flatnonzero(nxt & (np.abs(s_odo - s_odo[i]) > BUDGE))
            k = moved[0] if len(moved) else None
            out.append((float(t[i]), float(t[k] - t[i]) if k is not None else float("nan"),
                        float(s_rim[k] - s_rim[i]) if k is not None else float("nan"),
                        float(np.abs(v_odo[nxt]).max()), float(np.abs(v_rim[nxt]).max())))
        stood = stood + dt if abs(v_rim[i]) < STANDING else 0.0
    return out


def odometry_speed(t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The odometry's speed along its heading [m/s], over 0.1 s."""
    return smooth(t, np.gradient(s, t), 0.1)


def report(run: Run, radius: float, least: float, sims: Sequence[tuple[float, np.ndarray]]) -> list[str]:
    o = run.odom
    t = o["t"].to_numpy(float)
    yaw = np.unwrap(quat_yaw(o[["qx", "qy", "qz", "qw"]].to_numpy(float)))
    s_odo = along(t, o["x"].to_numpy(float), o["y"].to_numpy(float), yaw)
    v_rim, s_rim = rim(run, radius, t)
    engine = [(mu, along(p[:, 0], p[:, 1], p[:, 2], np.unwrap(quat_yaw(p[:, 4:8])))[-1]) for mu, p in sims]
    lines = [f"{run.name}: {t[-1] - t[0]:.1f} s; distance along the heading: odometry {s_odo[-1]:.2f} m, wheels "
             f"{s_rim[-1]:.2f} m (ratio {s_odo[-1] / s_rim[-1]:.2f})"
             + "".join(f", engine mu {mu:g} {s:.2f} m" for mu, s in engine)]
    for t0, t1, v, dft in cruises(t, v_rim, s_rim, s_odo, least):
        lines.append(f"  cruise {t0:5.1f}-{t1:5.1f} s at {v:.2f} m/s: odometry {dft:+.2f} m behind the wheels "
                     f"= {dft / v:.2f} s of travel")
    for ts, lag, ahead, vo, vr in starts(t, v_rim, s_rim, s_odo, odometry_speed(t, s_odo)):
        moved = (f"the odometry has moved {BUDGE:g} m {lag:.2f} s later, the wheels {ahead:.2f} m" if np.isfinite(lag)
                 else f"the odometry moves less than {BUDGE:g} m in 3 s")
        lines.append(f"  start from rest at {ts:5.1f} s: {moved}; top speed in 3 s: odometry {vo:.2f} m/s, wheels "
                     f"{vr:.2f} m/s")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default=str(ROOT / "examples" / "helhest-real.yaml"))
    ap.add_argument("--mu", default="0.8,0.5,0.3", help="engine frictions to replay at (comma-separated; '' none)")
    ap.add_argument("--dt", type=float, default=0.1, help="[s] the engine's timestep")
    ap.add_argument("--cruise", type=float, default=2.0, help="[s] the shortest cruise reported")
    args = ap.parse_args(argv)
    import sysid

    sysid.quiet_warp()
    cfg = FitConfig.from_file(args.config)
    cfg.data.split = None  # whole runs
    robot = cfg.load_robot()
    patterns = [str(p) for p in [*cfg.data.train, *cfg.data.held_out]]
    runs = load_runs(cfg, expand_sources(cfg, patterns, "runs"), "runs", progress=False)
    radius = float(robot_geometry(robot)["radius"])
    mus = [float(m) for m in args.mu.split(",") if m.strip()]
    paths: list[list[np.ndarray]] = []
    if mus:
        sim, accepted = accepted_parameters(cfg, robot)
        start = build_parameters(cfg, robot, accepted).values()
        start["odom_delay"] = 0.0  # the robot's own path
        paths = [sim.rollout(runs, {**start, "mu": mu}, args.dt) for mu in mus]
    for i, run in enumerate(runs):
        print("\n".join(report(run, radius, args.cruise, [(mu, p[i]) for mu, p in zip(mus, paths, strict=True)])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
