"""Worlds split across worker threads (`sysid.engine.parallel`): the utility (results in order, the
first worker exception re-raised on the calling thread with its type, every thread joined first,
`graphs.worker_threads` active while workers run, a first run of unseen work alone on the calling
thread), the world split and the thread count (``SYSID_THREADS``), and the engine claim it rests on:
a batch of worlds as two `Simulation`s stepped on two threads gives every world's trajectory and
adjoint gradient bit for bit as one `Simulation` of all the worlds does."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import warp as wp

from sysid.engine import (
    ENV_THREADS,
    EngineError,
    Simulation,
    SolverOptions,
    SolverOstrich,
    graphs,
    resolve_threads,
    run_threads,
    split_counts,
    split_ranges,
)
from sysid.errors import SysidError
from sysid.robot import load_robot
from sysid.robot.scenes import build_robot_scene
from tests.helpers.engine import rolling_inputs

STEPS = 4
H = 0.1  # [s]


# ------------------------------------------------------------------ split
def test_split_counts_and_ranges() -> None:
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(2, 4) == [1, 1]
    assert split_counts(0, 2) == []
    assert split_ranges(5, 2, min_size=2) == [range(0, 3), range(3, 5)]
    assert split_ranges(3, 2, min_size=2) == [range(0, 3)]  # fewer than 2 x 2 worlds: one part
    assert split_ranges(9, 4, min_size=2) == [range(0, 3), range(3, 5), range(5, 7), range(7, 9)]
    assert split_ranges(1, 2) == [range(0, 1)]
    assert split_ranges(0, 2) == []
    for bad in ((-1, 2), (3, 0)):
        with pytest.raises(EngineError):
            split_counts(*bad)
    with pytest.raises(EngineError):
        split_ranges(4, 2, min_size=0)


# ------------------------------------------------------------------ thread count
def test_resolve_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit value, else SYSID_THREADS, else 2 on a CPU of >= 2 cores; bad values are EngineErrors
    (SysidErrors: the command line reports them)."""
    monkeypatch.delenv(ENV_THREADS, raising=False)
    assert resolve_threads(3, "cpu") == 3
    monkeypatch.setattr("sysid.engine.parallel.cpu_cores", lambda: 16)
    assert resolve_threads(None, "cpu") == 2
    monkeypatch.setattr("sysid.engine.parallel.cpu_cores", lambda: 1)
    assert resolve_threads(None, "cpu") == 1
    monkeypatch.setenv(ENV_THREADS, "3")
    assert resolve_threads(None, "cpu") == 3
    assert resolve_threads(1, "cpu") == 1  # an explicit value wins over the variable
    for env in ("0", "two", "-1"):
        monkeypatch.setenv(ENV_THREADS, env)
        with pytest.raises(EngineError, match=ENV_THREADS):
            resolve_threads(None, "cpu")
    for bad in (0, -2, True, 2.0):
        with pytest.raises(SysidError, match="threads"):
            resolve_threads(bad, "cpu")  # type: ignore[arg-type]


def test_resolve_threads_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU one part: the default and SYSID_THREADS give 1, an explicit 2 is refused. (This machine has
    no GPU: warp's device lookup answers a GPU-like device, so the rule runs here too.)"""
    class FakeGpu:
        is_cpu, is_cuda = False, True

        def __str__(self) -> str:
            return "cuda:0"

    real = wp.get_device
    monkeypatch.setattr(wp, "get_device", lambda d=None: FakeGpu() if str(d).startswith("cuda") else real(d))
    monkeypatch.setenv(ENV_THREADS, "4")
    assert resolve_threads(None, "cuda:0") == 1
    assert resolve_threads(None, "cpu") == 4
    with pytest.raises(EngineError, match="CPU only"):
        resolve_threads(2, "cuda:0")


# ------------------------------------------------------------------ run_threads
def test_run_threads_results_in_order_on_workers() -> None:
    """Results in the order of the callables; a seen warm key runs every callable on a worker thread
    with graphs.worker_threads active; an unseen one runs the first alone on the calling thread."""
    def job(k: int):
        def f() -> tuple[int, str, int]:
            time.sleep(0.02 * (3 - k))  # finish in reverse order
            return k, threading.current_thread().name, graphs._workers
        return f

    assert run_threads([]) == []
    assert run_threads([job(0)]) == [(0, threading.current_thread().name, 0)]  # one: on the calling thread
    key = ("test_run_threads_results_in_order", object())
    first = run_threads([job(k) for k in range(3)], key)
    assert [r[0] for r in first] == [0, 1, 2]
    assert first[0][1] == threading.current_thread().name and first[0][2] == 0  # the warm-up, alone
    assert all(name.startswith("sysid-engine-") and workers > 0 for _, name, workers in first[1:])
    again = run_threads([job(k) for k in range(3)], key)
    assert [r[0] for r in again] == [0, 1, 2]
    assert all(name.startswith("sysid-engine-") and workers > 0 for _, name, workers in again)
    assert len({name for _, name, _ in again}) == 3
    assert graphs._workers == 0  # the guard ends with the call


def test_worker_exception_surfaces_on_the_calling_thread() -> None:
    """The first failing callable's exception (in list order), with its type, after every thread
    finished; the same for the warm-up run on the calling thread."""
    done: list[int] = []

    def slow() -> int:
        time.sleep(0.2)
        done.append(0)
        return 0

    def fail(exc: Exception):
        def f() -> int:
            raise exc
        return f

    key = ("test_worker_exception", object())
    run_threads([lambda: 0, lambda: 0], key)  # seen: from now on every callable on a worker
    with pytest.raises(KeyError, match="first"):
        run_threads([slow, fail(KeyError("first")), fail(ValueError("second"))], key)
    assert done == [0]  # joined before the error was raised
    assert graphs._workers == 0
    with pytest.raises(ZeroDivisionError):
        run_threads([lambda: 1 // 0, lambda: 1])  # no key: the first runs alone, on this thread


# ------------------------------------------------------------------ the engine on two threads
def robot(kp_scale: list[float], speed: list[float], turn: list[float]
          ) -> tuple[Simulation, np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The robot rolling in one world per entry (kp x kp_scale, speed [m/s], turn); returns the
    simulation, its inputs and every world's chassis."""
    sc = build_robot_scene(len(speed), load_robot(), device="cpu")
    sim = Simulation(SolverOstrich(sc.model, SolverOptions(newton_iters=16)), H)
    sim.register_parameter("kp", "joint_kd", [j for hd in sc.handles for j in hd.wheel_joints], per_world=True)
    sim.set_parameters({"kp": sc.robot.kp * np.asarray(kp_scale)})
    q0, qd0, tq = rolling_inputs(sc, STEPS, np.asarray(speed), np.asarray(turn))
    return sim, q0, qd0, tq, [hd.chassis for hd in sc.handles]


def test_two_simulations_on_two_threads_equal_one() -> None:
    """Four robots as one 4-world Simulation and as two 2-world ones stepped on two threads: every
    world's trajectory, its kp gradient and its wheel-target gradients are identical bit for bit
    (the worlds share no unknowns: every Newton solve, factorisation and adjoint solve is per world)."""
    kp, speed, turn = [1.0, 1.4, 0.7, 1.9], [1.0, 0.6, 1.3, 0.9], [0.1, -0.3, 0.25, 0.0]
    full = robot(kp, speed, turn)
    parts = [robot(kp[:2], speed[:2], turn[:2]), robot(kp[2:], speed[2:], turn[2:])]

    def sweep(x: tuple[Simulation, np.ndarray, np.ndarray, np.ndarray, list[int]]):
        sim, q0, qd0, tq, chassis = x

        def f() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            Q, _ = sim.forward(q0, qd0, STEPS, tq)
            gQ = np.zeros_like(Q)
            gQ[-1, chassis, 0] = 1.0  # L = sum of the final chassis x
            gQ[-1, chassis, 1] = 0.5
            g = sim.backward(gQ, None)
            assert g.targets_qd is not None
            return Q, g.params["kp"], g.targets_qd
        return f

    Q, g_kp, g_tq = sweep(full)()
    key = ("test_two_simulations", object())
    for _ in range(2):  # the first call warms up (part 0 alone), the second has both on workers
        (Qa, ka, ta), (Qb, kb, tb) = run_threads([sweep(p) for p in parts], key)
        assert np.array_equal(Q, np.concatenate([Qa, Qb], axis=1))  # bodies: world-major, none shared
        assert np.array_equal(g_kp, np.concatenate([ka, kb]))
        assert np.array_equal(g_tq, np.concatenate([ta, tb], axis=1))
    assert np.abs(g_kp).max() > 0 and np.abs(g_tq).max() > 0
