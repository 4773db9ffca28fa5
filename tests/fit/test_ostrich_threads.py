"""The engine replay with its worlds split across threads (``OstrichReplay(threads=N)``) returns
what one model of all the worlds returns, bit for bit: rollouts (several parameter copies), the
tangent Jacobian of every kind of name, the central-difference Jacobian and the adjoint gradient,
with ``last_status``; on runs of different lengths, one of them over a pallet (its world has more
shapes). The calls here are small, so each test lowers ``min_part_worlds`` (32 by default: below
it a split is slower) to 2 to split them. A worker's exception reaches the caller with its type;
bad thread counts are refused."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from ingest.run import PalletPose
from sysid.engine import ENV_THREADS, REPLAY_ON_WORKERS, EngineError, Simulation
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import ENGINE_THETA, stub_run

DT = 0.1  # [s]
THETA = {**ENGINE_THETA, "slip_ratio": 0.5, "cmd_trim": 0.02, "cmd_delay": 0.035}
NUISANCE = [{"v0": 0.1, "w0": 0.02, "clock_offset": 0.05}, {"v0": -0.05}, {}, {"w0": 0.01}]
TANGENT_NAMES = ["kp", "mu", "chassis_mass", "slip_speed", "slip_ratio", "cmd_trim", "cmd_delay", "v0", "w0",
                 "clock_offset"]
VJP_NAMES = ["kp", "mu", "mu_lateral", "slip_ratio", "cmd_trim", "cmd_delay"]


@pytest.fixture(scope="module")
def runs():
    """Four short runs of different lengths [s]; the second drives at a pallet 1 m ahead."""
    out = [stub_run("turn", 2.0), stub_run("slalom", 1.6, seed=1), stub_run("accel", 2.0, seed=2),
           stub_run("random", 1.4, seed=3)]
    out[1] = dataclasses.replace(out[1], pallet=PalletPose(1.0, 0.0, 0.0))
    return out


def replay(threads: int, **kw) -> OstrichReplay:
    """The replay on ``threads`` threads, splitting calls of 2 worlds per part and more."""
    sim = OstrichReplay(threads=threads, **kw)
    sim.min_part_worlds = sim.min_part_worlds_replayed = 2
    return sim


def same(a, b) -> bool:
    """Equal bit for bit (arrays), recursively through lists, tuples and dicts."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def test_rollouts_identical(runs):
    """Two parameter copies of four runs (8 worlds) in 1, 2 and 3 parts: the same poses and status."""
    thetas = [THETA, {**THETA, "kp": 300.0, "slip_ratio": 0.0}]
    out = {}
    for threads in (1, 2, 3):
        sim = replay(threads)
        out[threads] = (sim.rollout_many(runs, thetas, DT, nuisance=NUISANCE), sim.last_status)
        assert len(sim._batches) == threads and sim.last_status["worlds"] == 8
    assert same(out[1], out[2]) and same(out[1], out[3])


def test_tangent_jacobian_identical(runs):
    """The tangent Jacobian (Simulation.jvp per part) of every kind of name: model parameters, a
    scheduled slip speed and ratio, the target parameters, the nuisance parameters."""
    out = {}
    for threads in (1, 2):
        sim = replay(threads)
        poses, jac = sim.rollout_with_jacobian(runs, THETA, DT, TANGENT_NAMES, nuisance=NUISANCE)
        assert sim.last_status["jacobian"] == "tangent"
        out[threads] = (poses, jac, sim.last_status)
    assert same(out[1], out[2])
    assert all(np.abs(j).max() > 0 for j in out[2][1])


def test_fd_jacobian_identical(runs):
    """Central differences: 4 runs x 7 copies = 28 worlds in 1 and 2 parts."""
    out = {}
    for threads in (1, 2):
        sim = replay(threads, jacobian="fd")
        poses, jac = sim.rollout_with_jacobian(runs, THETA, DT, ["kp", "cmd_delay", "v0"], nuisance=NUISANCE)
        out[threads] = (poses, jac, sim.last_status)
    assert same(out[1], out[2])


def test_vjp_identical(runs):
    """The adjoint gradient: each part's backward on its own thread, the per-world and per-entry
    terms summed in the order one model of all the worlds has, so the sums are the same bit for bit."""
    out = {}
    for threads in (1, 2):
        sim = replay(threads)
        poses, vjp = sim.rollout_with_vjp(runs, THETA, DT, VJP_NAMES, nuisance=NUISANCE)
        cot = [np.random.default_rng(7 + i).standard_normal((len(p), 7)) for i, p in enumerate(poses)]
        out[threads] = (poses, vjp(cot), vjp([1.7 * c for c in cot]), sim.last_status)
    assert same(out[1][0], out[2][0]) and same(out[1][3], out[2][3])
    for a, b in ((out[1][1], out[2][1]), (out[1][2], out[2][2])):
        assert np.array_equal(a, b), (a, b)
    assert np.all(out[2][1] != 0)


def test_small_calls_stay_whole(runs):
    """Fewer than min_part_worlds worlds per part: one model, on the calling thread."""
    sim = replay(2)
    sim.rollout(runs[:3], THETA, DT)
    assert len(sim._batches) == 1
    sim.rollout(runs, THETA, DT)
    assert len(sim._batches) == 2
    sim = OstrichReplay(threads=2)  # the default: 4 worlds per part (graphs replays on workers), else 32
    assert REPLAY_ON_WORKERS and sim.min_part_worlds_replayed == 4 and sim.min_part_worlds == 32
    assert [len(p) for p in sim._parts(7)] == [7] and [len(p) for p in sim._parts(8)] == [4, 4]
    sim.rollout_many(runs, [THETA], DT)  # 4 worlds: 2 per part, one model
    assert len(sim._batches) == 1


def test_worker_exception_surfaces(runs, monkeypatch: pytest.MonkeyPatch):
    """A part's forward that raises on a worker thread: the call raises that exception, its type kept."""
    class Boom(RuntimeError):
        pass

    forward = Simulation.forward

    def failing(self, *a, **k):
        if threading.current_thread() is not threading.main_thread():
            raise Boom("a worker's forward failed")
        return forward(self, *a, **k)

    sim = replay(2)
    for _ in range(2):  # each part runs alone on the calling thread twice (kernels loaded, steps recorded)
        sim.rollout(runs, THETA, DT)
    monkeypatch.setattr(Simulation, "forward", failing)
    with pytest.raises(Boom, match="worker"):
        sim.rollout(runs, THETA, DT)


def test_threads_option(monkeypatch: pytest.MonkeyPatch):
    """threads: an integer >= 1 (EngineError otherwise); default SYSID_THREADS, else 2 on a CPU of
    two or more cores."""
    for bad in (0, -1, 1.5):
        with pytest.raises(EngineError, match="threads"):
            OstrichReplay(threads=bad, device="cpu")
    monkeypatch.setenv(ENV_THREADS, "3")
    assert OstrichReplay(device="cpu").threads == 3
    monkeypatch.setenv(ENV_THREADS, "0")
    with pytest.raises(EngineError, match=ENV_THREADS):
        OstrichReplay(device="cpu")
    monkeypatch.delenv(ENV_THREADS)
    monkeypatch.setattr("sysid.engine.parallel.cpu_cores", lambda: 2)
    assert OstrichReplay(device="cpu").threads == 2
    assert OstrichReplay(device="cpu", threads=1).threads == 1


def test_replays_on_workers_where_graphs_allows(runs, monkeypatch: pytest.MonkeyPatch):
    """With graphs.GraphCache replaying existing recordings on worker threads (graphs.REPLAY_ON_WORKERS;
    recordings are still made on the main thread only), a split call runs each part alone on the calling
    thread twice (the second run records its steps), later calls replay every part's steps on worker
    threads; results bit for bit those of one model."""
    import warp as wp

    launched: list[tuple[int, str]] = []  # (recording, thread) of every replay
    real = wp.capture_launch

    def capture_launch(g, *a, **k):
        launched.append((id(g), threading.current_thread().name))
        return real(g, *a, **k)

    thetas = [THETA, {**THETA, "kp": 300.0}]
    ref = OstrichReplay(threads=1)
    expect = ref.rollout_many(runs, thetas, DT, nuisance=NUISANCE)
    poses, vjp = ref.rollout_with_vjp(runs, THETA, DT, VJP_NAMES)
    cot = [np.ones((len(p), 7)) for p in poses]
    grad = vjp(cot)
    assert REPLAY_ON_WORKERS
    monkeypatch.setattr(wp, "capture_launch", capture_launch)
    sim = replay(2)
    for call in range(3):
        launched.clear()
        assert same(sim.rollout_many(runs, thetas, DT, nuisance=NUISANCE), expect)
        owner = {id(g): id(b.sim._graphs) for b in sim._batches for g in b.sim._graphs._graphs.values()}
        on_workers = {owner[gid] for gid, name in launched if name.startswith("sysid-engine-")}
        assert on_workers == (set() if call < 2 else {id(b.sim._graphs) for b in sim._batches}), call
    for _ in range(3):
        poses, vjp = sim.rollout_with_vjp(runs, THETA, DT, VJP_NAMES)
        assert np.array_equal(vjp(cot), grad)


def test_threads_from_a_fit_config() -> None:
    """`simulator: {options: {threads: N}}` in a fit config reaches the replay (the README's switch)."""
    from pathlib import Path

    from sysid.app import fitting
    from sysid.app.config import FitConfig

    cfg = FitConfig.from_file(Path(__file__).resolve().parents[2] / "examples" / "fit.yaml")
    for n in (1, 3):
        c = cfg.replaced({"simulator.options": {**cfg.simulator.options, "threads": n}})
        sim = fitting.make_simulator(c, c.load_robot())
        engine = sim.inner  # the odometry observation model (sysid.simulators.observation) wraps the engine
        assert isinstance(engine, OstrichReplay) and engine.threads == n
