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

``warm_kernels`` compiles (or loads from Warp's on-disk kernel cache) the engine's modules once in
the driver before a local fan-out, so that N workers starting together do not each compile the
same missing kernels; each worker then loads the cached binaries, and Ray reuses a worker process
for its next task, so a worker pays the load once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from sysid.errors import ConfigError, SysidError


class FanoutError(SysidError):
    """A Ray task failed (its error text is the message)."""


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


# -- the engine's kernels, once per machine -------------------------------------------------------


def _stub_run(duration: float = 0.4) -> Any:
    """A run standing at the origin with a small wheel command (enough to load every module a replay
    and its Jacobian use)."""
    import pandas as pd

    from ingest.run import Run

    t = np.arange(0.0, duration, 0.05)
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": z, "y": z, "z": z + 0.36, "qx": z, "qy": z, "qz": z, "qw": z + 1,
                         "yaw": z, "pitch": z, "roll": z})
    tc = np.arange(0.0, duration, 0.01)
    cmd = pd.DataFrame({"t": tc, "left": 0 * tc + 1.0, "right": 0 * tc + 1.5, "rear": 0 * tc + 1.25})
    return Run("warm-up", odom, cmd)


def warm_kernels(cfg: Any, robot: Mapping[str, Any]) -> float | None:
    """Compile (or load from the disk cache) the Warp modules of the engine's replay and Jacobian
    in this process: one 0.4 s replay of a stub run at the nominal parameters. Returns its wall time
    [s], None when the simulator is not the engine (nothing to compile) or the warm-up fails (each
    task then compiles what it needs, as without it). ``cfg``: a ``sysid.app.config.FitConfig``."""
    if cfg.simulator != "ostrich":
        return None
    t0 = time.perf_counter()
    try:
        from sysid.app.config import validate_static
        from sysid.app.pipeline import accepted_parameters

        sim, accepted = accepted_parameters(cfg, robot)
        params, _train, _held = validate_static(dataclasses.replace(cfg, truth=dict(cfg.truth)), accepted, robot)
        theta = params.values()
        names = list(params.free_names)[:1] or list(theta)[:1]
        sim.rollout_with_jacobian([_stub_run()], theta, cfg.dt, names)
    except Exception:  # noqa: BLE001 - an optimisation only
        return None
    return time.perf_counter() - t0
