"""A forward rollout compiles only the kernel modules it launches, and the step's, compiled on a background thread
(sysid/engine/preload.py), leave nothing behind when the process exits before they are done.

Warp compiles a module, every kernel in it at once, on the first launch of any of its kernels: a kernel of the
forward step placed in a module of backward-pass kernels makes every forward run on an empty kernel cache compile
those too (the adjoint's residual kernels took as long to compile as the whole Newton step). Each case runs in a
subprocess, so that no other test's launches count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# the Warp modules of sysid.engine a forward rollout of the robot on the pallet may load
FORWARD_MODULES = {"sysid.engine.step", "sysid.engine.contact", "sysid.engine.graph_kernels",
                   "sysid.engine.adjoint.angles"}

_SCRIPT = """
import importlib, json, pkgutil
import newton
import numpy as np
import warp as wp
import sysid.engine
from sysid.engine import Simulation, SolverOptions, SolverOstrich
from sysid.robot import load_robot
from sysid.robot.scenes import WorldSpec, build_robot_scene

sc = build_robot_scene([WorldSpec(start=(0.6, 0.0, 0.0), pallet=(2.0, 0.0, 0.0))], load_robot(), device="cpu")
m = sc.model
sim = Simulation(SolverOstrich(m, SolverOptions()), 0.1)
s = m.state()
newton.eval_fk(m, m.joint_q, m.joint_qd, s)
sim.forward(s.body_q.numpy(), s.body_qd.numpy(), 3, np.full((3, m.joint_dof_count), 2.0, np.float32))
modules = {}
for info in pkgutil.iter_modules(sysid.engine.__path__, "sysid.engine."):
    for v in vars(importlib.import_module(info.name)).values():
        if isinstance(v, wp.Kernel):
            modules[v.module.name] = v.module
print(json.dumps(sorted(name for name, mod in modules.items() if mod.execs)))
"""


def test_forward_rollout_loads_only_forward_modules() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "sysid.engine.step" in loaded, loaded  # the rollout ran
    assert loaded <= FORWARD_MODULES, f"a forward rollout compiled {sorted(loaded - FORWARD_MODULES)}"


_EXIT_DURING_COMPILE = """
import sys, time
from sysid.engine import SolverOptions, SolverOstrich
from sysid.robot import load_robot
from sysid.robot.scenes import WorldSpec, build_robot_scene

sc = build_robot_scene([WorldSpec(start=(0.6, 0.0, 0.0), pallet=(2.0, 0.0, 0.0))], load_robot(), device="cpu")
SolverOstrich(sc.model, SolverOptions())  # the step's modules start compiling on a background thread
time.sleep(1.5)
print("error: stopped", file=sys.stderr)
sys.exit(2)
"""


def test_exit_during_background_compile_adds_nothing(tmp_path: Path) -> None:
    """A command that stops (an error, Ctrl-C) while the step's modules compile in the background ends on its own
    last line with its own status: without preload's exit hook the abandoned compiler reported the temporary files
    removed under it ("unable to rename temporary ... .pch", "PCH generation failed") after that line."""
    env = {**os.environ, "WARP_CACHE_PATH": str(tmp_path)}  # an empty kernel cache: the compile is under way
    out = subprocess.run([sys.executable, "-c", _EXIT_DURING_COMPILE], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 2, out.stderr[-3000:]
    assert [ln for ln in out.stderr.splitlines() if "Warp CUDA warning" not in ln] == ["error: stopped"], out.stderr


_PIPELINES = """
import gc, weakref
import newton
import numpy as np
from sysid.engine import Simulation, SolverOptions, SolverOstrich
from sysid.robot import load_robot
from sysid.robot.scenes import WorldSpec, build_robot_scene

gc.disable()  # the solvers' own collections only
sc = build_robot_scene([WorldSpec(start=(0.6, 0.0, 0.0), pallet=(2.0, 0.0, 0.0))], load_robot(), device="cpu")
m = sc.model
s = m.state()
newton.eval_fk(m, m.joint_q, m.joint_qd, s)
pipelines = []
for _ in range(20):
    sim = Simulation(SolverOstrich(m, SolverOptions()), 0.1)  # a Simulation and its tape hold each other
    sim.forward(s.body_q.numpy(), s.body_qd.numpy(), 1, np.full((1, m.joint_dof_count), 2.0, np.float32))
    pipelines.append(weakref.ref(sim.solver._pipeline))
print(sum(p() is not None for p in pipelines))
"""


def test_dropped_collision_pipelines_are_collected() -> None:
    """Simulations made one after another and dropped leave a bounded number of newton collision pipelines alive,
    even where Python's own collections are rare (here: off): a Simulation and its tape hold each other, so its
    solver and the solver's pipeline wait for a full collection, and each pipeline holds its own copies of newton's
    narrow-phase kernels, all of which Warp re-hashes when a new pipeline appears (on the old code all 20 stayed)."""
    out = subprocess.run([sys.executable, "-c", _PIPELINES], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    alive = int(out.stdout.strip().splitlines()[-1])
    assert alive <= 16, f"{alive} of 20 pipelines alive"
