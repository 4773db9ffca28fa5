"""Recorded replay of fixed launch sequences: a rollout's step and the backward's Jacobian assembly.

A step of `Simulation.forward` is a fixed sequence of launches (collision, the Newton iterations,
the output writes) on fixed arrays; only the step index changes, and it lives on the device
(`graph_kernels`: inputs are taken from, outputs put into, row ``step`` of rollout-long buffers).
Such a sequence is recorded once and replayed per step with one call: on CUDA a CUDA graph
(``wp.capture_begin``/``wp.capture_end``), on CPU warp's API capture, which replays the recorded
launches in C++ (warp >= 1.19). Either way no Python runs inside a step and nothing is read back
to the host until the rollout ends.

The replay is bit-identical to the launches it recorded (tests/engine/test_engine_graphs.py). Launches made
one at a time go through `LaunchCache`, which records each once and replays it while its arguments are the same.

What a recording depends on is its key: a change of any of it (solver options, step size,
buffer sizes, the set of per-step inputs) records anew. Arrays must not be reallocated while a
recording that uses them is alive; the solver and `Simulation` keep theirs for their lifetime.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import warp as wp

from .graph_kernels import PUT_ROW, TAKE_ROW

# warp's CPU capture is process-wide (any thread's Python-side launches on the CPU go into an open
# recording), so on the CPU a recording is made only on the main thread and never while engine work runs on
# worker threads (`worker_threads`); there, existing recordings are replayed and the rest launched.
_workers = 0
_workers_lock = threading.Lock()
# inside worker_threads, replay recordings made before on the worker threads (launching every step from
# Python there costs more than the split gains; sysid.simulators.ostrich records each part on the main thread first)
REPLAY_ON_WORKERS = True

# Launches that must not run on two threads at once on the CPU: newton's collision. Warp's CPU tile kernels
# (newton's narrow phase uses them) keep the pointer to their block-shared arena in one static variable per
# compiled module, not per thread (warp/native/tile.h, x86-64), so two threads inside one such module
# allocate from each other's arenas: "exceeds the 256 KiB arena", then a crash. Held around every CPU
# collision, launched or replayed (SolverOstrich.collide, Simulation's rollout).
COLLISION_LOCK = threading.RLock()


@contextmanager
def worker_threads() -> Iterator[None]:
    """Declare engine work on worker threads for the duration (e.g. worlds split across CPU cores):
    CPU recordings are neither made nor replayed meanwhile."""
    global _workers
    with _workers_lock:
        _workers += 1
    try:
        yield
    finally:
        with _workers_lock:
            _workers -= 1


class GraphCache:
    """Replays of launch sequences by key. ``run(key, body)``: the first time a key is seen the
    body runs eagerly (modules load, lazily built arrays and recorded launches come to exist), the
    second time it is recorded and replayed, later only replayed. If recording fails (a warp
    without capture on this device, an operation that cannot be recorded) the cache warns once and
    runs every body eagerly from then on: slower, the same results. On the CPU nothing is recorded on
    threads other than the main one or while `worker_threads` is active; inside `worker_threads` the
    recordings that exist are replayed, elsewhere off the main thread bodies run as launches."""

    def __init__(self, device: wp.Device | str, capacity: int = 128, enabled: bool = True) -> None:
        self.device = wp.get_device(device)
        self.capacity = int(capacity)
        self.enabled = bool(enabled)
        self._graphs: OrderedDict[Hashable, Any] = OrderedDict()
        self._seen: set[Hashable] = set()
        self.recorded = 0  # recordings made (a test and the benchmarks read it)
        self.replayed = 0

    def clear(self) -> None:
        self._graphs.clear()
        self._seen.clear()

    def run(self, key: Hashable, body: Callable[[], None], lock: AbstractContextManager[Any] | None = None) -> None:
        """Run ``body`` or its recording for ``key`` (see the class), holding ``lock`` throughout where given."""
        if lock is None:
            self._run(key, body)
        else:
            with lock:
                self._run(key, body)

    def _run(self, key: Hashable, body: Callable[[], None]) -> None:
        if not self.enabled:
            body()
            return
        if self.device.is_cpu and (_workers > 0 or threading.current_thread() is not threading.main_thread()):
            # never record here; inside worker_threads (where no cache records) replay what exists: a replay is
            # one C++ call on this thread's own launches
            g = self._graphs.get(key) if REPLAY_ON_WORKERS and _workers > 0 else None
            if g is None:
                body()
            else:
                wp.capture_launch(g)
                self.replayed += 1
            return
        g = self._graphs.get(key)
        if g is None:
            if key not in self._seen:
                if len(self._seen) > 16 * self.capacity:
                    self._seen.clear()
                self._seen.add(key)
                body()
                return
            g = self._record(body)
            if g is None:
                body()
                return
            self._graphs[key] = g
            while len(self._graphs) > self.capacity:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        wp.capture_launch(g)
        self.replayed += 1

    def _record(self, body: Callable[[], None]) -> Any:
        try:
            wp.capture_begin(device=self.device)
            try:
                body()
            finally:
                g = wp.capture_end(device=self.device)
        except Exception as e:  # noqa: BLE001 - any failure to record means: run without recordings
            self.enabled = False
            self.clear()
            warnings.warn(f"graph capture on {self.device} failed ({type(e).__name__}: {e}); steps run as "
                          "individual launches from now on (same results, slower)", RuntimeWarning, stacklevel=4)
            return None
        self.recorded += 1
        return g


class LaunchCache:
    """wp.launch through recorded launches cached by the arguments' identities, at most ``limit`` of them (the
    eager steps repeat them exactly; warp's argument packing would dominate a small scene). `SolverOstrich`'s
    per-step launches and every part of a `Simulation` launch through one."""

    def __init__(self, device: Any, limit: int = 512) -> None:
        self.device = device
        self.limit = limit
        self._cmds: dict[tuple[Any, ...], wp.Launch] = {}

    def launch(self, kernel: wp.Kernel, dim: int | tuple[int, int], inputs: Sequence[Any],
               outputs: Sequence[Any]) -> None:
        key = (kernel.key, dim, *[id(a) if isinstance(a, wp.array) else (tuple(a) if hasattr(a, "__len__") else a)
                                  for a in (*inputs, *outputs)])
        cmd = self._cmds.get(key)
        if cmd is None:
            if len(self._cmds) > self.limit:
                self._cmds.clear()
            cmd = wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=self.device, record_cmd=True)
            self._cmds[key] = cmd
        cmd.launch()

    def clear(self) -> None:
        """Forget every recorded launch (their packed arguments are stale)."""
        self._cmds.clear()

    def take_row(self, step: wp.array[Any], src: wp.array[Any], dst: wp.array[Any]) -> None:
        """dst = row (device step index) of src."""
        self.launch(TAKE_ROW[dst.dtype], dst.shape[0], [step, src], [dst])

    def put_row(self, step: wp.array[Any], offset: int, src: wp.array[Any], dst: wp.array[Any]) -> None:
        """Row (device step index + offset) of dst = src."""
        self.launch(PUT_ROW[src.dtype], src.shape[0], [step, offset, src], [dst])
