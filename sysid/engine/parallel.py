"""Independent engine work on worker threads: a batch of worlds split across CPU cores.

Warp's CPU kernel launches run in C through ctypes, which releases the GIL, so two `Simulation`s
stepped in two Python threads run on two cores at once, with results bit-identical to one Simulation
(speed-ups: docs/results.md, "Worlds split across two threads"). Worker threads replay the recordings
made on the main thread (graphs.REPLAY_ON_WORKERS) and launch what has none from Python, so a part should
run alone on the calling thread first (``run_threads``' ``alone``); launching every step from Python on
worker threads costs more than a split gains.

`run_threads` runs callables on worker threads inside `graphs.worker_threads` (warp's CPU capture is
process-wide: while it is active no `graphs.GraphCache` records, so no thread's launches land in
another's recording; existing recordings are replayed) and returns their results in order. CPU only:
on a GPU the guard does not apply (CUDA graph captures of two threads would share the device's
stream), so callers run a GPU batch as one part (`resolve_threads`).

`split_counts` / `split_ranges` cut a batch of worlds into contiguous parts; `resolve_threads` picks the
number of threads: an explicit value, else the environment variable ``SYSID_THREADS``, else 2 on a
CPU with at least 2 cores and 1 otherwise.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar, cast

import warp as wp

from .errors import EngineError
from .graphs import worker_threads

T = TypeVar("T")

ENV_THREADS = "SYSID_THREADS"  # the default number of threads a CPU batch is split across

# run_threads' warm keys: work whose kernels have launched once in this process (see there)
_warm: set[Hashable] = set()
_warm_lock = threading.Lock()


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_threads(threads: int | None, device: wp.Device | str | None = None) -> int:
    """The number of threads to split a batch of worlds across on ``device`` (None: warp's default).

    ``threads`` given: that many (an integer >= 1; on a GPU only 1). None: on the CPU the value of
    ``SYSID_THREADS`` if set, else 2 where the CPU has at least 2 cores, else 1; on a GPU 1 (one
    kernel launch already spans the worlds, and a GPU's recordings are not guarded against threads).
    EngineError for a value that is not an integer >= 1, or more than 1 on a GPU."""
    cpu = wp.get_device(device).is_cpu
    if threads is None:
        if not cpu:
            return 1
        env = os.environ.get(ENV_THREADS, "").strip()
        if not env:
            return 2 if cpu_cores() >= 2 else 1
        try:
            threads = int(env)
        except ValueError:
            raise EngineError(f"{ENV_THREADS}={env!r}: expected an integer number of threads >= 1") from None
        if threads < 1:
            raise EngineError(f"{ENV_THREADS}={env!r}: expected an integer number of threads >= 1")
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise EngineError(f"threads must be an integer >= 1, got {threads!r}")
    if threads > 1 and not cpu:
        raise EngineError(f"threads={threads} on {wp.get_device(device)}: worlds are split across threads on "
                          "the CPU only (a GPU runs every world in one launch); use threads=1")
    return threads


def split_counts(n: int, parts: int) -> list[int]:
    """``n`` items cut into ``min(parts, n)`` contiguous parts of near-equal size (the first ones one
    larger where it does not divide); ``[]`` for n = 0."""
    if n < 0 or parts < 1:
        raise EngineError(f"split_counts: need n >= 0 and parts >= 1, got n={n}, parts={parts}")
    parts = min(parts, n)
    if parts == 0:
        return []
    base, extra = divmod(n, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def split_ranges(n: int, parts: int, min_size: int = 1) -> list[range]:
    """Contiguous index ranges covering ``range(n)`` in order: as many parts as ``parts`` allows with
    at least ``min_size`` items in each (one part when n < 2 min_size); ``[]`` for n = 0."""
    if min_size < 1:
        raise EngineError(f"split_ranges: min_size must be >= 1, got {min_size}")
    out, start = [], 0
    for c in split_counts(n, max(1, min(parts, n // min_size))):
        out.append(range(start, start + c))
        start += c
    return out


def run_threads(fns: Sequence[Callable[[], T]], warm_key: Hashable | None = None,
                alone: Sequence[bool] | None = None) -> list[T]:
    """Run every callable, each on its own worker thread inside `graphs.worker_threads`, and return
    their results in the order of ``fns``. Every thread is joined before this returns or raises; if
    any raised, the exception of the first (in ``fns`` order) is re-raised here, on the calling
    thread, with its type and traceback. A lone callable runs on the calling thread, outside
    `graphs.worker_threads` (its recordings stay on); so do those ``alone`` marks, first and one at a
    time (e.g. a part whose steps are to be recorded, for replays on worker threads later).

    Warm-up: warp loads a kernel's module and creates a generic kernel's overload at its first
    launch, the latter without a lock (warp 1.19: a second thread can launch the half-made overload
    and fail). So unless ``warm_key`` was seen before in this process, the first callable runs alone
    on the calling thread first, launching every kernel the work needs, and the others then on worker
    threads; ``warm_key`` names work that launches the same kernels with the same argument types
    (e.g. the solver options and the kind of sweep); None: warm up every time.

    The callables must not share engine objects (a `Simulation`, its solver or model): each part of
    a batch has its own."""
    if len(fns) == 0:
        return []
    if len(fns) == 1:
        return [fns[0]()]
    results: list[T | None] = [None] * len(fns)
    errors: list[BaseException | None] = [None] * len(fns)

    def work(k: int) -> None:
        try:
            results[k] = fns[k]()
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            errors[k] = e

    with _warm_lock:
        warm = warm_key is not None and warm_key in _warm
    first = {k for k, a in enumerate(alone or ()) if a and k < len(fns)}
    if not warm:
        first.add(0)
    for k in sorted(first):
        results[k] = fns[k]()  # on the calling thread, alone (see above); an exception propagates as is
    rest = [k for k in range(len(fns)) if k not in first]
    if len(rest) == 1:
        results[rest[0]] = fns[rest[0]]()
        rest = []
    threads = [threading.Thread(target=work, args=(k,), name=f"sysid-engine-{k}", daemon=True) for k in rest]
    with worker_threads():
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:  # e.g. KeyboardInterrupt: the guard must outlive the workers
            for t in threads:
                t.join()
            raise
    for e in errors:
        if e is not None:
            raise e
    if warm_key is not None:
        with _warm_lock:
            _warm.add(warm_key)
    return cast(list[T], results)  # every slot is set: no callable raised
