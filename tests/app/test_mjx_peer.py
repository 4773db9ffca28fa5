"""bench_control's MJX peer (benchmarks/mjx_peer.py): the model carries the identified parameters and the
settings that make MJX differentiable, a short rollout of the straight-line command drives forward at about
the commanded speed, and MJX's gradient of the planning loss is the derivative of that loss (central
differences); bench_control says so, without a traceback, when jax / mujoco-mjx are missing."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH_DIR))  # the scripts import their siblings
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _theta() -> dict:
    from sysid.fit.params import load_params

    path = Path(__file__).resolve().parents[2] / "models" / "helhest" / "params-pallet-sample.yaml"
    return load_params(str(path))[0].values()


def test_mjx_box_model_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MuJoCo model of the box task: one solver iteration of Newton, pyramidal cone, Euler with eulerdamp
    disabled (mjx_peer's docstring: why), the servo gain kp, every wheel's and the ground's friction mu, the
    pallet centred at (1.5, 0) on the ground; a trial's start goes into qpos (x, y, yaw)."""
    import mujoco

    peer = _load("mjx_peer", monkeypatch)
    assert peer.mjx_missing() is None  # the mjx extra is part of dev: CI has it
    theta = _theta()
    m = peer.box_model(theta, (1.5, 0.0, 0.0), 4e-3)
    assert m.opt.timestep == 4e-3 and m.opt.iterations == 1 and m.opt.ls_iterations == 4
    assert m.opt.solver == mujoco.mjtSolver.mjSOL_NEWTON and m.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
    assert m.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER
    assert m.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    np.testing.assert_allclose(m.actuator_gainprm[:, 0], theta["kp"])
    for name in ("wheel_left", "wheel_right", "wheel_rear", "ground", "pallet"):
        g = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, name)
        assert m.geom_friction[g, 0] == pytest.approx(theta["mu"]) and m.geom_condim[g] == 3, name
    p = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "pallet")
    np.testing.assert_allclose(m.geom_pos[p], (1.5, 0.0, 0.072))
    np.testing.assert_allclose(2 * m.geom_size[p], (1.2, 0.8, 0.144))
    q = peer.start_qpos(m, (0.05, -0.02, 0.1))
    np.testing.assert_allclose(q[:7], (0.05, -0.02, 0.36, math.cos(0.05), 0.0, 0.0, math.sin(0.05)))


def test_bench_control_without_mjx_says_so(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With jax unimportable, mjx_missing names what to install, and bench_control --mjx-trials prints it and
    goes on (no traceback)."""
    bench = _load("bench_control", monkeypatch)
    peer = sys.modules["mjx_peer"]
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    msg = peer.mjx_missing()
    assert msg is not None and "mujoco-mjx" in msg and "jax" in msg
    monkeypatch.setattr(bench, "mjx_missing", peer.mjx_missing)
    out = bench.main(["--box-trials", "0", "--timing-worlds", "--terrain-seeds", "0", "--mjx-trials", "1",
                      "--mjx-timing-worlds", "1"])
    text = capsys.readouterr().out
    assert f"[mjx] {msg}" in text and out["mjx_missing"] == msg and "mjx" not in out


@pytest.mark.slow
def test_mjx_rollout_and_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """MjxBox at the benchmark's step (3 ms) on flat ground (no pallet: it would only lengthen the jit; the
    0.5 s horizon does not reach it), in float64:
    - 0.5 s of the straight-line command (0.5 m/s x cmd_scale from rest) moves the chassis forward 70-105 %
      of speed x time (it spins up from rest), straight (|y| < 2 cm) and level (z within 1 cm of 0.36 m);
    - the gradient of the loss in two knot entries matches central differences of the loss at h = 1e-6
      rad/s to a relative 1e-4 (measured 2026-12-05 at 2 ms: 2e-7 and 2e-8). The step is that small because
      MJX's loss at one solver iteration has small jumps: at h = 1e-2 the differences are off by ~100 %
      (bench_control's gradient-quality figures), at 1e-6 they see the smooth piece the gradient is of.
    ~40 s, most of it jit compile (marked slow)."""
    import jax

    peer = _load("mjx_peer", monkeypatch)
    from sysid.plan.control import ControlTask

    theta = _theta()
    speed, T = 0.5, 0.5
    with jax.enable_x64(True):
        mb = peer.MjxBox(theta, [ControlTask(goal=(1.0, 0.2, 0.3))], dt=peer.MJX_DT, duration=T)
        U = np.full((1, 10, 3), speed / 0.36)
        L, g = mb.loss_and_grad(U)
        q, qd = mb.final
        v = speed * theta["cmd_scale"]
        print(f"0.5 s: x {q[0, 0]:.4f} m (v t = {v * T:.4f}), y {q[0, 1]:.4f}, z {q[0, 2]:.4f}, loss {L[0]:.5f}")
        assert 0.7 * v * T < q[0, 0] < 1.05 * v * T
        assert abs(q[0, 1]) < 0.02 and abs(q[0, 2] - 0.36) < 0.01
        assert np.isfinite(g).all() and np.abs(g).max() > 0
        checks = peer.fd_check(mb, U, [(3, 0), (6, 1)], h=1e-6)
    for c in checks:
        print(f"knot {c['knot']} channel {c['channel']}: AD {c['grad']:.8g}, FD {c['fd']:.8g}, rel. error "
              f"{c['rel_error']:.2e}")
        assert abs(c["grad"]) > 1e-4 and c["rel_error"] < 1e-4, c
