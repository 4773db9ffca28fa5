"""Fan-out of independent pieces of work as Ray tasks: the folds of ``sysid cv``, the timesteps of
``sysid sweep-dt`` (and of ``sysid fit``'s sweep) and the start batches and refinement fits of a
multi-start ``sysid fit`` (docs/fit.md, "Cross-validation" and "Convergence, starts and intervals").

One helper, ``run_tasks``, does what every fan-out needs:

- a local in-process cluster with ``workers`` CPUs (``ray.init(num_cpus=N)``), started and shut
  down around the work, unless Ray is initialised already (then that session is used as it is) or
  ``address`` is given (``ray.init(address=...)``; "auto" finds a local cluster);
- one task per item (``num_cpus=1``, no retries), at most ``workers`` in flight; results in item
  order whatever order they finish in;
- the driver's ``sys.path`` handed to every task (a worker imports a simulator factory such as
  ``tests.helpers.fit_doubles:make_double`` as the driver does);
- a task that raises (or whose worker dies) is handed to ``on_error`` (its index and the error
  text) and the others still finish; without ``on_error`` the first failure is raised as
  ``FanoutError`` once every task is done;
- Ctrl-C (or any exception in the driver) cancels the outstanding tasks (``ray.cancel(force=True)``)
  and re-raises.

``Fanout`` says where a fit's or a sweep's tasks may go. Warming the engine's kernel cache before a
local fan-out is the application's business (``sysid.app.warm``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sysid.errors import ConfigError, SysidError

if TYPE_CHECKING:
    from sysid.simulators.protocol import Simulator


class FanoutError(SysidError):
    """A Ray task failed (its error text is the message)."""


@dataclass(frozen=True)
class Fanout:
    """Where a multi-start fit's batches and refinement fits may go (``optimize(fanout=...)``):
    ``workers`` Ray workers (a local cluster of that many CPUs unless ``address`` joins one);
    ``make_sim``: a picklable zero-argument factory of the fit's simulator, called in each task
    (e.g. ``functools.partial(sysid.app.pipeline.make_simulator, cfg, robot)``); None sends the
    simulator object itself (it must then pickle)."""

    workers: int | None = None
    address: str | None = None
    make_sim: Callable[[], Simulator] | None = None


def ray_module() -> Any:
    """``import ray``, or the user error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'sysid[cv]' (or 'ray>=2.9'), or run serially with "
                          "--workers 1") from None
    return ray


def check_workers(workers: int | None, address: str | None, what: str = "the work") -> None:
    """The user errors of ``--workers`` / ``--ray-address`` (before any work)."""
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if address and workers == 1:
        raise ConfigError(f"workers 1 runs {what} serially in this process; drop the Ray address or give more "
                          "workers")


def wants_ray(workers: int | None, address: str | None) -> bool:
    """Whether a fan-out goes to Ray: an address, or more than one worker."""
    return bool(address) or (workers is not None and workers > 1)


def _init(ray: Any, workers: int | None, address: str | None) -> bool:
    """Initialise Ray unless it is; returns whether this call started it."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(num_cpus=workers or os.cpu_count() or 1, **kw)
    return True


@contextlib.contextmanager
def cluster(workers: int | None, address: str | None) -> Iterator[bool]:
    """One Ray session around several fan-outs (a fit's start batches, its refinement fits, the
    baseline's, the sweep): started here (and shut down on exit) when the work goes to Ray and Ray
    is not initialised; otherwise nothing. Yields whether it started one."""
    if not wants_ray(workers, address):
        yield False
        return
    ray = ray_module()
    started = _init(ray, workers, address)
    try:
        yield started
    finally:
        if started:
            ray.shutdown()


def _call(fn: Callable[..., Any], sys_path: Sequence[str], *args: Any) -> Any:
    """A task's body: the driver's import path, then ``fn(*args)``."""
    for p in sys_path:
        if p not in sys.path:
            sys.path.append(p)
    return fn(*args)


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError wraps the task's exception
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    last = (str(exc).strip().splitlines() or [""])[-1]
    return f"{type(exc).__name__}: {last}"


def run_tasks(
    fn: Callable[..., Any],
    items: Sequence[Sequence[Any]],
    workers: int | None = None,
    address: str | None = None,
    *,
    shared: Sequence[Any] = (),
    on_done: Callable[[int, Any], None] | None = None,
    on_error: Callable[[int, str], Any] | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """``[fn(*shared, *item) for item in items]`` as Ray tasks; returns (results in item order,
    execution info). ``shared`` arguments are put in Ray's object store once (large inputs such as
    the runs) and passed to every task. ``on_done(index, result)`` as each finishes (completion
    order); ``on_error(index, text)`` returns the result recorded for a failed task (see the module
    docstring)."""
    ray = ray_module()
    started = _init(ray, workers, address)
    info: dict[str, Any] = {"backend": "ray", "ray_version": ray.__version__, "address": address,
                            "cluster_cpus": float(ray.cluster_resources().get("CPU", 0.0)), "started_cluster": started}
    task = ray.remote(num_cpus=1, max_retries=0)(_call)
    sys_path = [p for p in sys.path if p]
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    pending: dict[Any, int] = {}
    queue = list(enumerate(items))
    limit = workers or len(items) or 1  # tasks in flight (a cluster may have more CPUs than workers)
    try:
        refs = [ray.put(s) for s in shared]
        while queue or pending:
            while queue and len(pending) < limit:
                i, item = queue.pop(0)
                pending[task.remote(fn, sys_path, *refs, *item)] = i
            done, _rest = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task raised, or its worker died
                    text = _error_text(exc)
                    if on_error is None:
                        errors[i] = text
                        continue
                    out = on_error(i, text)
                results[i] = out
                if on_done:
                    on_done(i, out)
    except BaseException:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001, S110 - best effort: the task may have finished meanwhile
                pass
        raise
    finally:
        if started:
            ray.shutdown()
    if errors:
        i = min(errors)
        raise FanoutError(f"task {i + 1} of {len(items)} failed on Ray: {errors[i]}")
    return [results[i] for i in range(len(items))], info
