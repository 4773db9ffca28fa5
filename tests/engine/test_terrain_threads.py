"""Worlds on triangle-mesh terrain stepped on several threads at once.

newton's narrow phase for meshes runs Warp CPU tile kernels, whose block-shared arena pointer is one
static variable per compiled module (not per thread); two threads inside that module at once allocate
from each other's arenas and the process dies ("exceeds the 256 KiB arena", then a segmentation fault
or an illegal instruction). The engine holds `graphs.COLLISION_LOCK` around every CPU collision,
launched or replayed. This test runs the workload that crashed (several parts on mesh terrain, on
worker threads, replaying their recorded steps) in a subprocess, so a crash fails the test instead of
killing the test run, and checks every part's trajectory equals its own run on the calling thread bit
for bit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import numpy as np
    import warp as wp

    wp.config.quiet = True
    from sysid.engine import SolverOptions, SolverOstrich
    from sysid.engine import run_threads
    from sysid.engine import Simulation
    from sysid.robot.scenes import WorldSpec, build_robot_scene, sinusoid_terrain
    from sysid.robot import load_robot
    from tests.helpers.engine import rolling_inputs

    STEPS, PARTS, PER_PART = 12, 4, 2
    terrain = sinusoid_terrain(size=8.0, resolution=16, amplitude=0.1, seed=3)
    speed = np.linspace(0.6, 1.4, PARTS * PER_PART)
    turn = np.linspace(-0.3, 0.3, PARTS * PER_PART)

    def part(sl):
        worlds = [WorldSpec(terrain=terrain) for _ in range(sl.stop - sl.start)]
        sc = build_robot_scene(worlds, load_robot(), device="cpu")
        sim = Simulation(SolverOstrich(sc.model, SolverOptions(newton_iters=12)), 0.1)
        q0, qd0, tq = rolling_inputs(sc, STEPS, speed[sl], turn[sl])
        return lambda: sim.forward(q0, qd0, STEPS, tq)[0]

    parts = [part(slice(k * PER_PART, (k + 1) * PER_PART)) for k in range(PARTS)]
    alone = np.concatenate([p() for p in parts], axis=1)  # each part on this thread, one after another
    key = ("terrain-threads", 0)
    for _ in range(6):  # the first call warms up (part 0 alone); then every part replays on a worker thread
        Q = np.concatenate(run_threads(parts, key), axis=1)
        assert np.array_equal(Q, alone), np.abs(Q - alone).max()
    assert np.isfinite(alone).all() and np.ptp(alone[:, :, 0]) > 0.1  # the robots moved
    print("ok")
""")


def test_worlds_on_mesh_terrain_on_four_threads() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}")
