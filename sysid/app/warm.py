"""Warm-up of the engine's kernels. ``warm_kernels`` compiles (or loads from Warp's on-disk kernel
cache) the engine's modules once in the driver before a local fan-out, so that N workers starting
together do not each compile the same missing kernels; each worker then loads the cached binaries,
and Ray reuses a worker process for its next task, so a worker pays the load once.
``start_warm_up`` runs it on a background thread while a fit reads its runs: on an empty kernel
cache the compile and the ingest then share the machine's cores instead of following each other.
It needs the application's config and simulator factory, hence it lives here and not in
``sysid.fit.fanout``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ingest.run import Run

if TYPE_CHECKING:
    from sysid.app.config import FitConfig


def _stub_run(duration: float = 0.4) -> Run:
    """A run standing at the origin with a small wheel command (enough to load every module a replay
    and its Jacobian use)."""
    import pandas as pd

    t = np.arange(0.0, duration, 0.05)
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": z, "y": z, "z": z + 0.36, "qx": z, "qy": z, "qz": z, "qw": z + 1,
                         "yaw": z, "pitch": z, "roll": z})
    tc = np.arange(0.0, duration, 0.01)
    cmd = pd.DataFrame({"t": tc, "left": 0 * tc + 1.0, "right": 0 * tc + 1.5, "rear": 0 * tc + 1.25})
    return Run("warm-up", odom, cmd)


def warm_kernels(cfg: FitConfig, robot: Mapping[str, Any]) -> float | None:
    """Compile (or load from the disk cache) the Warp modules of the engine's replay and Jacobian
    in this process: one 0.4 s replay of a stub run at the nominal parameters. Returns its wall time
    [s], None when the simulator is not the engine (nothing to compile) or the warm-up fails (each
    task then compiles what it needs, as without it)."""
    if cfg.simulator.name != "ostrich":
        return None
    t0 = time.perf_counter()
    try:
        from sysid.app.config import validate_static
        from sysid.app.fitting import accepted_parameters

        sim, accepted = accepted_parameters(cfg, robot)
        params, _train, _held = validate_static(cfg.replaced({"truth": dict(cfg.truth)}), accepted, robot)
        theta = params.values()
        names = list(params.free_names)[:1] or list(theta)[:1]
        sim.rollout_with_jacobian([_stub_run()], theta, cfg.fit.dt, names)
    except Exception:  # noqa: BLE001 - an optimisation only
        return None
    return time.perf_counter() - t0


_warmed: set[tuple[str, str, str]] = set()  # (simulator, options, jacobian) warmed up in this process


def start_warm_up(cfg: FitConfig, robot: Mapping[str, Any]) -> Callable[[], None]:
    """Start ``warm_kernels`` on a background thread (once per simulator set-up and process: later fits find the
    modules loaded) and return the function that joins it; call that before this thread launches any Warp kernel
    of its own (the two would load the same modules at once). Work that launches none (reading bags, JSON and
    caches) runs meanwhile."""
    key = (cfg.simulator.name, repr(sorted(cfg.simulator.options.items())), str(cfg.fit.jacobian))
    if cfg.simulator.name != "ostrich" or key in _warmed:
        return lambda: None
    _warmed.add(key)
    from sysid._quiet import init_warp_quietly
    from sysid.engine import warm_up_in_background

    init_warp_quietly()  # on this thread: Warp's runtime is initialised once, before any other thread uses it
    thread = warm_up_in_background(lambda: warm_kernels(cfg, robot))
    return thread.join
