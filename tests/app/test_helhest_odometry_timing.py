"""benchmarks/helhest_odometry_timing.py's readings in closed form: wheels that start from rest and hold a
speed, an odometry that reports their path d seconds late; the cruise's deficit gives back d, the start's
budge time d plus the time the wheels need for the budge distance; and on the real data the figures
docs/results.md quotes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest.run import Run
from tests.helpers.benchmarks import load_benchmark

R = 0.36  # [m]


@pytest.fixture(scope="module")
def script():
    return load_benchmark("helhest_odometry_timing")


def delayed_run(delay: float, w: float = 2.0, t_on: float = 2.0, heading: float = 0.7) -> Run:
    """Wheels at rest until ``t_on``, then at ``w`` [rad/s] (rim speed R w); the odometry drives their
    path ``delay`` [s] late along a fixed ``heading``."""
    t = np.arange(0.0, 12.0, 0.01)
    wheels = np.where(t >= t_on, w, 0.0)
    s = R * w * np.clip(t - t_on - delay, 0.0, None)
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": s * np.cos(heading), "y": s * np.sin(heading), "z": z, "qx": z, "qy": z,
                         "qz": np.full_like(t, np.sin(heading / 2)), "qw": np.full_like(t, np.cos(heading / 2)),
                         "yaw": np.full_like(t, heading), "pitch": z, "roll": z})
    return Run("delayed", odom, pd.DataFrame({"t": t, "left": wheels, "right": wheels, "rear": wheels}))


def test_a_delayed_odometry_gives_back_its_delay(script):
    lines = script.report(delayed_run(0.8), R, 2.0, [])
    assert "ratio 0.92" in lines[0]  # 10 s of wheels, 9.2 s of odometry
    cruise = next(ln for ln in lines if "cruise" in ln)
    assert re.search(r"at 0\.72 m/s: odometry \+0\.58 m behind the wheels = 0\.80 s", cruise), cruise
    start = next(ln for ln in lines if "start from rest" in ln)
    # 0.8 s late, then 0.2 m at 0.72 m/s (0.28 s): 1.08 s (+ one 0.01 s sample)
    assert re.search(r"at +2\.0 s: the odometry has moved 0\.2 m 1\.0[89] s later, the wheels 0\.7[78] m", start), start


def test_no_delay_no_deficit(script):
    lines = script.report(delayed_run(0.0), R, 2.0, [])
    assert "+0.00 m behind the wheels = 0.00 s" in next(ln for ln in lines if "cruise" in ln)


HELHEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "helhest-real"


@pytest.mark.slow
@pytest.mark.skipif(not HELHEST.is_dir(), reason="../shared/data/helhest-real is absent")
def test_the_launch_figures_the_docs_quote(script, capsys):
    """docs/results.md, "Real robot: what the logs show": the straight accelerations' odometry covers 0.82 of
    the wheels' distance and the engine at mu 0.5 lands within 0.2 m of it; the odometry stalls 1.5 s while
    the wheels cover 3.4 m, then outruns them."""
    assert script.main(["--mu", "0.5"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("helhest_2026_04_13-09_57_51"))
    assert "ratio 0.82" in line
    odo, engine = (float(x) for x in re.search(r"odometry ([\d.]+) m.*engine mu 0\.5 ([\d.]+) m", line).groups())
    assert abs(engine - odo) < 0.2
    assert "at   9.3 s: the odometry has moved 0.2 m 1.50 s later, the wheels 3.37 m" in out
