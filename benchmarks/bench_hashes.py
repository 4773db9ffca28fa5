"""Fingerprints of the engine's results: sha256 of rollouts and of a gradient, to show a refactor changed nothing.

The robot driving towards the pallet (one robot and pallet per world), each world a little different: its start
pose, its wheel targets [rad/s] and its wheels' friction coefficient (a per-world registered parameter). Printed,
one line each, the sha256 of the float32 bytes of

- ``forward W``: `Simulation.forward`'s body_q and body_qd at W = 256 and 1024 worlds, h = 0.1 s;
- ``step 256``: the same 256-world rollout stepped from Python (`SolverOstrich.step`), its body_q and body_qd;
- ``gradient 64``: `Simulation.backward` of L = sum over worlds of the final chassis x + y / 2 at 64 worlds, its
  gradient with respect to the initial state, the wheel targets and the friction parameter (``inputs``), and
  with respect to each parameter array (one line each).

Run it with the code to compare first on the import path (nothing is added to ``sys.path``), e.g. the old code in
a worktree against the current one; stdout must be equal line for line (the same device; times go to stderr):

    cd /path/to/old && PYTHONPATH=$PWD python /path/to/new/benchmarks/bench_hashes.py
    python benchmarks/bench_hashes.py            # 30 steps (3 s: the front wheels reach the pallet)
    python benchmarks/bench_hashes.py --quick    # 8 steps
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
import time
from typing import Any

import newton
import numpy as np
import warp as wp

import sysid
from sysid.engine import SolverOptions, SolverOstrich
from sysid.robot import load_robot


def _find(name: str, *modules: str) -> Any:
    """``name`` from the first of ``modules`` that has it: the script also runs on older code, where the engine
    kept it elsewhere."""
    for mod in modules:
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {modules} has {name}")


Simulation = _find("Simulation", "sysid.engine", "sysid.engine.rollout")
WorldSpec = _find("WorldSpec", "sysid.robot", "sysid.robot.scenes", "sysid.engine.scenes")
build_robot_scene = _find("build_robot_scene", "sysid.robot", "sysid.robot.scenes", "sysid.engine.scenes")

H = 0.1  # [s]
W_DRIVE = 1.0 / 0.36  # [rad/s]: 1 m/s with 0.36 m wheels
PALLET = (2.0, 0.0, 0.0)  # x [m], y [m], yaw [rad]
START_X = 0.6  # [m]: the robot reaches the pallet (its near edge at x = 1.4 m) within the first second


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
    return h.hexdigest()


def world_specs(worlds: int) -> list[Any]:
    return [WorldSpec(start=(START_X + 0.01 * (i % 5), 0.02 * ((i % 7) - 3), 0.03 * np.sin(0.7 * i)), pallet=PALLET)
            for i in range(worlds)]


def setup(worlds: int, steps: int, device: str) -> tuple[Any, Any, np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The scene, a Simulation with the per-world wheel friction "mu" set, the start state, the wheel targets
    (steps, dofs) and the chassis bodies."""
    sc = build_robot_scene(world_specs(worlds), load_robot(), device=device)
    m = sc.model
    solver = SolverOstrich(m, SolverOptions())
    wheels = [s for hnd in sc.handles for s in hnd.wheel_shapes]
    solver.set_anisotropic_friction(wheels, sc.robot.mu, sc.robot.mu_lateral)
    sim = Simulation(solver, H)
    sim.register_parameter("mu", "shape_mu", wheels, per_world=True)
    sim.set_parameters({"mu": sc.robot.mu * (1.0 + 0.1 * np.cos(0.3 * np.arange(worlds)))})
    s = m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s)
    tq = np.zeros((steps, m.joint_dof_count), np.float32)
    start = m.joint_qd_start.numpy()
    for i, hnd in enumerate(sc.handles):
        for k, j in enumerate(hnd.wheel_joints):
            tq[:, start[j]] = W_DRIVE * (1.0 + 0.05 * np.sin(0.37 * i + 1.3 * k))
    return sc, sim, s.body_q.numpy(), s.body_qd.numpy(), tq, [hnd.chassis for hnd in sc.handles]


Lines = list[tuple[str, str, str]]  # (what, sha256, a readable figure)


def forward_hash(worlds: int, steps: int, device: str) -> Lines:
    sc, sim, q0, qd0, tq, ch = setup(worlds, steps, device)
    Q, QD = sim.forward(q0, qd0, steps, tq)
    return [(f"forward {worlds}", digest(Q, QD),
             f"chassis x mean {Q[-1, ch, 0].mean():.4f} m, z max {Q[:, ch, 2].max():.4f} m")]


def step_hash(worlds: int, steps: int, device: str) -> Lines:
    sc, sim, q0, qd0, tq, ch = setup(worlds, steps, device)
    m, solver = sc.model, sim.solver
    s0, s1, c = m.state(), m.state(), m.control()
    s0.body_q.assign(q0)
    s0.body_qd.assign(qd0)
    qs, qds = [q0], [qd0]
    for k in range(steps):
        c.joint_target_qd.assign(tq[k])
        solver.step(s0, s1, c, None, H)
        s0, s1 = s1, s0
        qs.append(s0.body_q.numpy())
        qds.append(s0.body_qd.numpy())
    Q = np.asarray(qs)
    return [(f"step {worlds}", digest(Q, np.asarray(qds)), f"chassis x mean {Q[-1, ch, 0].mean():.4f} m")]


def gradient_hash(worlds: int, steps: int, device: str) -> Lines:
    """One line for the gradient with respect to the rollout's inputs (initial state, targets, the registered
    friction), one per parameter array: a change shows where it is."""
    sc, sim, q0, qd0, tq, ch = setup(worlds, steps, device)
    Q, _ = sim.forward(q0, qd0, steps, tq)
    gQ = np.zeros_like(Q)
    gQ[-1, ch, 0] = 1.0
    gQ[-1, ch, 1] = 0.5
    g = sim.backward(gQ, None)
    out = [(f"gradient {worlds} inputs", digest(g.body_q0, g.body_qd0, g.targets_qd, g.params["mu"]),
            f"dL/dmu sum {float(np.sum(g.params['mu'])):.6g}")]
    out += [(f"gradient {worlds} {k}", digest(v), f"sum {float(np.sum(v)):.6g}") for k, v in sorted(g.arrays.items())]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 steps instead of 30")
    ap.add_argument("--steps", type=int, default=None, help="steps per rollout (default 30, --quick 8)")
    ap.add_argument("--device", default="cpu", help="warp device (hashes compare only on the same device)")
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else 8 if args.quick else 30
    if steps < 1:
        ap.error("--steps must be at least 1")
    wp.config.quiet = True  # type: ignore[attr-defined]  # warp's module-load lines off stdout
    if hasattr(wp.config, "log_level"):
        wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)
    print(f"# sysid from {sysid.__file__}, device {args.device}, {steps} steps at h = {H} s")
    for fn, worlds in ((forward_hash, 256), (forward_hash, 1024), (step_hash, 256), (gradient_hash, 64)):
        t0 = time.perf_counter()
        for what, h, note in fn(worlds, steps, args.device):
            print(f"{what:32s} {h}  # {note}", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
