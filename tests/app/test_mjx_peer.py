"""bench_control's MJX peer (benchmarks/mjx_peer.py): the model carries the identified parameters and the
settings that make MJX differentiable, a short rollout of the straight-line command drives forward at about
the commanded speed, and MJX's gradient of the planning loss is the derivative of that loss (central
differences); bench_control says so, without a traceback, when jax / mujoco-mjx are missing."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.helpers.benchmarks import load_benchmark


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_benchmark(name, monkeypatch)  # the scripts import their siblings


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
    """With jax unimportable, mjx_missing names what to install, and bench_control --mjx-trials and
    --mjx-terrain-seeds print it and go on (no traceback)."""
    bench = _load("bench_control", monkeypatch)
    peer = sys.modules["mjx_peer"]
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    msg = peer.mjx_missing()
    assert msg is not None and "mujoco-mjx" in msg and "jax" in msg
    monkeypatch.setattr(bench, "mjx_missing", peer.mjx_missing)
    out = bench.main(["--box-trials", "0", "--timing-worlds", "--terrain-seeds", "0", "--mjx-trials", "1",
                      "--mjx-timing-worlds", "1", "--mjx-terrain-seeds", "1"])
    text = capsys.readouterr().out
    assert text.count(f"[mjx] {msg}") == 1 and out["mjx_missing"] == msg and "mjx" not in out
    assert "mjx_terrain" not in out


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


def test_mjx_terrain_hfield_heights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The terrain model's height field is the engine's terrain: MuJoCo's own ray cast onto it gives
    sinusoid_terrain's grid heights at the grid's vertices (to 1e-6 m: the elevation data is float32) and, between
    them, terrain_height (bilinear in each cell) to within that cell's bilinear-vs-planar gap (hfield and mesh split
    a cell into the same two triangles; the gap is |z00 - z10 - z01 + z11| / 4 at most, under 1 mm here), at
    random points of two seeds sharing one height range (the per-world data of a vmapped run). The wheels are
    spheres of the wheel radius and the chassis boxes collide with nothing (mjx_peer's docstring: why)."""
    import mujoco

    from sysid.robot.scenes import sinusoid_terrain, terrain_height

    peer = _load("mjx_peer", monkeypatch)
    res = 80
    terrains = [sinusoid_terrain(resolution=res, seed=s) for s in (1000, 1001)]
    z_range = peer.terrain_z_range(terrains)
    m = peer.terrain_model(_theta(), terrains[0][0], res, 2.5e-3, z_range)
    ground = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "ground")
    assert m.geom_type[ground] == mujoco.mjtGeom.mjGEOM_HFIELD and m.hfield_nrow[0] == m.hfield_ncol[0] == res + 1
    for name in ("wheel_left", "wheel_right", "wheel_rear"):
        g = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, name)
        assert m.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE and m.geom_size[g, 0] == pytest.approx(0.36)
    assert m.opt.iterations == 1 and m.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    rng = np.random.default_rng(0)
    for v, _ in terrains:
        m.hfield_data[:] = peer.hfield_data(v, res, z_range)
        d = mujoco.MjData(m)
        mujoco.mj_forward(m, d)

        def ray(x: float, y: float, d: mujoco.MjData = d) -> float:  # onto the hfield alone, not the robot
            return 5.0 - mujoco.mj_rayHfield(m, d, ground, np.array([x, y, 5.0]), np.array([0.0, 0.0, -1.0]))

        Z = v[:, 2].reshape(res + 1, res + 1)
        xs = v[:: res + 1, 0]
        corners = [(i, j) for i in range(1, res, 7) for j in range(1, res, 9)]  # a ray on the rim misses the top
        err = max(abs(ray(xs[i] + 1e-9, xs[j] + 1e-9) - Z[i, j]) for i, j in corners)
        assert err < 1e-6, f"hfield vs grid heights at {len(corners)} vertices: max error {err:.2e} m"
        gaps = []
        for x, y in rng.uniform(-11.9, 11.9, (200, 2)):
            i, j = int((x - xs[0]) / (xs[1] - xs[0])), int((y - xs[0]) / (xs[1] - xs[0]))
            gap = abs(Z[i, j] - Z[i + 1, j] - Z[i, j + 1] + Z[i + 1, j + 1]) / 4
            e = abs(ray(x, y) - terrain_height(v, res, x, y))
            assert e <= gap + 1e-6, f"hfield vs terrain_height at ({x:.3f}, {y:.3f}): {e:.2e} m > cell gap {gap:.2e} m"
            gaps.append(e)
        assert max(gaps) < 1e-3, f"hfield vs terrain_height: max {max(gaps):.2e} m"


@pytest.mark.slow
def test_mjx_terrain_rollout_and_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """MjxBox on terrain at MJX_TERRAIN_DT (3 ms), 0.5 s, float64, one compiled vmapped call of six worlds:
    - worlds 0 and 1 on two different seeds' terrain, starting off the origin where their heights differ: each
      stays finite, drives forward and keeps its chassis 0.36 +- 0.008 m above its own terrain at every sample
      (resting: the wheel radius; measured 2026-12-05: 0.3594-0.3622 m), a bound its path over the other
      terrain breaks (0.305-0.347 m): each world collides with its own elevation data;
    - worlds 2-5: world 0's task at knots moved +-h = 1e-6 rad/s in two entries, the central differences of the
      loss against world 0's gradient: relative error < 1e-4 (the flat test's bound; the assertion reports it).
    ~75 s on one core, nearly all jit compile (marked slow)."""
    import jax

    peer = _load("mjx_peer", monkeypatch)
    from sysid.plan.control import ControlTask, LossWeights
    from sysid.robot.scenes import sinusoid_terrain, terrain_height

    theta = _theta()
    res, h = 80, 1e-6
    terrains = [sinusoid_terrain(resolution=res, seed=s) for s in (1100, 1101)]
    starts = [(2.0, 1.0, 0.0), (-3.0, 2.0, 0.5)]
    tasks = [ControlTask(goal=(3.0, 1.2, 0.1), start=starts[0], terrain=terrains[0], terrain_resolution=res),
             ControlTask(goal=(-1.0, 2.5, 0.5), start=starts[1], terrain=terrains[1], terrain_resolution=res)]
    tasks += [tasks[0]] * 4
    entries = [(3, 0), (6, 1)]
    U = np.tile(np.linspace(2.0, 3.0, 10)[:, None] * (1.0, 0.9, 0.95), (6, 1, 1))
    for n, (k, c) in enumerate(entries):
        U[2 + 2 * n, k, c] += h
        U[3 + 2 * n, k, c] -= h
    weights = LossWeights(position=0.1, yaw=0.1, speed=0.0, track=1.0, effort=1e-4, smooth=1e-3)
    with jax.enable_x64(True):
        mb = peer.MjxBox(theta, tasks, dt=peer.MJX_TERRAIN_DT, duration=0.5, weights=weights, sample_dt=0.08,
                         nearest_samples=True)
        L, g = mb.loss_and_grad(U)
    clear = mb.clearance()
    for w in (0, 1):
        other = [mb.height[w, j] - terrain_height(terrains[1 - w][0], res, x, y) for j, (x, y) in enumerate(mb.path[w])]
        print(f"world {w}: from {starts[w][:2]} to {mb.path[w, -1]}, clearance {clear[w].min():.4f}-"
              f"{clear[w].max():.4f} m (over the other terrain {min(other):.4f}-{max(other):.4f} m)")
        assert np.isfinite(L[w]) and np.isfinite(mb.path[w]).all() and np.isfinite(clear[w]).all()
        fwd = np.hypot(*(mb.path[w, -1] - starts[w][:2]))
        assert fwd > 0.3, f"world {w} moved {fwd:.3f} m in 0.5 s"
        assert np.abs(clear[w] - 0.36).max() < 0.008, f"world {w}: clearance {clear[w]} m, not 0.36 +- 0.008"
        assert np.abs(np.asarray(other) - 0.36).max() > 0.01  # the bound tells the two terrains apart
    assert np.isfinite(g[0]).all() and np.abs(g[0]).max() > 0
    for n, (k, c) in enumerate(entries):
        fd = (L[2 + 2 * n] - L[3 + 2 * n]) / (2 * h)
        rel = abs(g[0, k, c] - fd) / max(abs(fd), 1e-12)
        print(f"knot {k} channel {c}: AD {g[0, k, c]:.8g}, FD {fd:.8g}, rel. error {rel:.2e}")
        assert abs(fd) > 1e-4 and rel < 1e-4, (f"terrain gradient, knot {k} channel {c}: AD {g[0, k, c]:.6g} vs "
                                              f"central differences {fd:.6g}: relative error {rel:.2e}")


def test_adam_box_resumes_from_its_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers' Adam (`adam_box`) with a state file: 3 iterations, then the same run to 6 from that file,
    equals 6 iterations in one go (iterate, first successes, best figures); a state file of another run is
    refused. The loss is a quadratic bowl per world whose final position is the first two knots, so worlds
    succeed at different iterations."""
    peer = _load("mjx_peer", monkeypatch)
    goal = np.array([[0.5, 0.0], [1.0, -0.5], [3.0, 2.0]])

    def evaluate(U: np.ndarray) -> tuple:
        q = U[:, 0, :2]
        d = q - goal
        g = np.zeros_like(U)
        g[:, 0, :2] = 2 * d
        return np.sum(d**2, axis=1), g, q, np.zeros_like(q)

    U0 = np.zeros((3, 2, 3))
    whole = peer.adam_box(evaluate, U0, goal, 6, 0.3, "bowl")
    state = tmp_path / "adam.npz"
    part = peer.adam_box(evaluate, U0, goal, 3, 0.3, "bowl", state=state)
    assert part["iterations"] == 3 and state.exists()
    resumed = peer.adam_box(evaluate, U0, goal, 6, 0.3, "bowl", state=state)
    np.testing.assert_array_equal(resumed["first_success"], whole["first_success"])
    assert resumed["per_trial"] == whole["per_trial"]
    np.testing.assert_array_equal(resumed["median_position_error"], whole["median_position_error"])
    # the near goal only, at evaluation 2 (x = 0.6 after two steps of 0.3)
    assert whole["successes"] == 1 and whole["first_success"][0] == 2
    with pytest.raises(ValueError, match="another run"):
        peer.adam_box(evaluate, U0 + 1.0, goal, 6, 0.3, "bowl", state=state)


def test_lbfgs_terrain_replays_its_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The terrain peers' L-BFGS (`lbfgs_terrain`) with a journal: 4 evaluations, then the same run to 9 from
    that journal, equals 9 evaluations in one go (best and running-best RMSEs, bit for bit), and the resumed
    run computes only evaluations 5-9; a journal of another run (other first guesses) is refused, and so is
    one whose knots the optimiser does not ask for again; a reference off by more than 1e-4 m (another CPU)
    is warned about and the journal replayed (all 9 evaluations, after the resumed run rewrote it: a replayed
    loss handed to L-BFGS uncopied came back changed, and the next replay asked for other knots). The
    "rollout" is linear: each world's path is its knots times a fixed matrix, so the RMSE falls per world at
    its own rate."""
    peer = _load("mjx_peer", monkeypatch)
    rng = np.random.default_rng(3)
    W, K, C, S = 3, 4, 2, 6
    A = rng.normal(size=(K * C, S * 2))
    ref = np.zeros((W, S + 1, 2))
    ref[:, 1:] = (rng.normal(size=(W, K * C)) @ A).reshape(W, S, 2)
    calls: list[int] = []

    def evaluate(U: np.ndarray) -> tuple:
        calls.append(1)
        path = np.zeros_like(ref)
        path[:, 1:] = (U.reshape(W, -1) @ A).reshape(W, S, 2)
        d = (path - ref)[:, 1:].reshape(W, -1)
        return np.sum(d**2, axis=1), (2 * d @ A.T).reshape(U.shape), path

    guess = rng.normal(size=(W, K, C))
    whole = peer.lbfgs_terrain(evaluate, guess, ref, 9, 0.3, "linear")
    journal = tmp_path / "terrain.npz"
    part = peer.lbfgs_terrain(evaluate, guess, ref, 4, 0.3, "linear", journal=journal)
    assert part["iterations"] == 4 and journal.exists()
    calls.clear()
    resumed = peer.lbfgs_terrain(evaluate, guess, ref, 9, 0.3, "linear", journal=journal)
    assert len(calls) == 5, f"the resumed run evaluated {len(calls)} times, not the 5 after the journal's 4"
    np.testing.assert_array_equal(resumed["best_rmse"], whole["best_rmse"])
    np.testing.assert_array_equal(resumed["median_running_best"], whole["median_running_best"])
    assert whole["best_rmse"].max() < 0.5 * whole["initial_rmse"].min()  # it descends: the test can tell runs apart
    with pytest.raises(ValueError, match="another run"):
        peer.lbfgs_terrain(evaluate, guess + 1.0, ref, 9, 0.3, "linear", journal=journal)
    with pytest.warns(UserWarning, match="differs from the journal's by up to 0.001 m"):
        moved = peer.lbfgs_terrain(evaluate, guess, ref + 1e-3, 9, 0.3, "linear", journal=journal)
    np.testing.assert_array_equal(moved["best_rmse"], whole["best_rmse"])  # all 9 replayed
    with np.load(journal) as z:
        data = {k: z[k] for k in z.files}
    data["U"][2] += 1.0
    np.savez(journal, **data)
    with pytest.raises(ValueError, match="other knots"):
        peer.lbfgs_terrain(evaluate, guess, ref, 9, 0.3, "linear", journal=journal)
