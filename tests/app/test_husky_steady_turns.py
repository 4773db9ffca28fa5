"""benchmarks/husky_steady_turns.py's ratios in closed form: a run whose wheels hold one pair of side
speeds and whose odometry drives an arc at known fractions of the wheels' forward speed and yaw rate
gives back those fractions, in the band of its slow-to-fast side ratio; a replayed path (pose rows)
is read the same way."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest.run import Run
from sysid.simulators.kinematic import robot_geometry
from tests.helpers.benchmarks import load_benchmark

GEO = {"radius": 0.165, "track": 0.555, "sides": ["left", "left", "right", "right"],
       "wheel_logs": [("front_left_wheel",), ("rear_left_wheel",), ("front_right_wheel",), ("rear_right_wheel",)]}


@pytest.fixture(scope="module")
def script():
    return load_benchmark("husky_steady_turns")


def arc_run(left: float, right: float, fwd: float, yaw: float, stall: float = 1.0) -> Run:
    """Side speeds ``left``, ``right`` [rad/s] from t = 0; the odometry drives at ``fwd`` times the
    wheels' forward speed and ``yaw`` times their yaw rate after a ``stall`` [s] standing start."""
    t = np.arange(0.0, 6.0, 0.05)
    w = pd.DataFrame({"t": t, "front_left_wheel": left, "rear_left_wheel": left, "front_right_wheel": right,
                      "rear_right_wheel": right})
    v = fwd * GEO["radius"] * (left + right) / 2
    wz = yaw * GEO["radius"] * (right - left) / GEO["track"]
    s = np.clip(t - stall, 0.0, None)
    heading = 0.4 + wz * s
    x = 1.0 + v / wz * (np.sin(heading) - np.sin(0.4))
    y = -2.0 - v / wz * (np.cos(heading) - np.cos(0.4))
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": x, "y": y, "z": z, "qx": z, "qy": z, "qz": np.sin(heading / 2),
                         "qw": np.cos(heading / 2), "yaw": heading, "pitch": z, "roll": z})
    return Run("arc", odom, w)


def test_an_arc_gives_back_its_fractions(script):
    runs = [arc_run(1.0, 4.0, 0.8, 0.4), arc_run(-1.0, 4.0, 0.5, 0.45), arc_run(4.0, 3.9, 0.93, 0.3)]
    s = script.stats(runs, None, GEO, 1.0)
    assert s[0] == pytest.approx([0.25, 0.8, 0.4], rel=1e-3)
    assert s[1] == pytest.approx([-0.25, 0.5, 0.45], rel=1e-3)
    assert s[2, :2] == pytest.approx([0.975, 0.93], rel=1e-3) and np.isnan(s[2, 2])  # too little yaw to divide
    rows = {name: (n, fwd, yaw) for name, n, fwd, yaw in script.bands(s)}
    assert rows["tight (0.15-0.4)"] == pytest.approx((1, 0.8, 0.4), rel=1e-3)
    assert rows["sides opposite (-1--0.15)"][0] == 1 and rows["straight (0.9-1)"][0] == 1
    # the stall before 1 s is outside the steady part; counted from 0 s the ratios fall
    assert script.stats(runs[:1], None, GEO, 0.0)[0, 1] < 0.7


def test_a_replayed_path_is_read_like_the_odometry(script):
    run = arc_run(2.0, 3.0, 0.9, 0.5)
    o = run.odom
    pose = o[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]].to_numpy(float)
    assert script.stats([run], [pose], GEO, 1.0)[0] == pytest.approx(script.stats([run], None, GEO, 1.0)[0], rel=1e-9)


def test_the_husky_geometry_the_script_reads():
    from sysid.app.config import FitConfig

    cfg = FitConfig.from_file(Path(__file__).resolve().parents[2] / "examples" / "husky-drive.yaml")
    geo = robot_geometry(cfg.load_robot())
    assert geo["radius"] == pytest.approx(0.1651) and geo["track"] == pytest.approx(0.555)
    assert geo["sides"] == GEO["sides"] and [n[0] for n in geo["wheel_logs"]] == [n[0] for n in GEO["wheel_logs"]]


def test_bad_theta_is_one_line(script):
    with pytest.raises(SystemExit, match="name=value"):
        script.parse_theta("mu:0.4")


HUSKY = Path(__file__).resolve().parents[3] / "shared" / "data" / "husky-drive"


@pytest.mark.slow
@pytest.mark.skipif(not HUSKY.is_dir(), reason="../shared/data/husky-drive is absent")
def test_the_sweeps_figures_the_docs_quote(script, capsys):
    """docs/fit.md, "The Husky example": 161 runs; the straight band's forward ratio 0.94; block 1 holds the 8
    runs that follow their wheels at under 0.3 of both ratios, block 2 none (the bags are ingested once, then
    cached)."""
    assert script.main(["--no-model", "--by-block", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("161 runs")
    assert re.search(r"^straight \(0\.9-1\) +5 +0\.937 +0\.454", out, re.M), out
    assert "block 1: step_000-step_053; 8 runs below 0.3" in out and "step_019" in out
    assert "block 2: step_054-step_147; 0 runs below 0.3" in out
