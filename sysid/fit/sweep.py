"""The timestep sweep (paper Fig. 3): held-out error over a grid of simulator timesteps and the
plateau of usable ones; each timestep a Ray task when a ``Fanout`` asks for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sysid.errors import ConfigError, SimulatorError
from sysid.fit.evaluation import evaluate
from sysid.fit.fanout import Fanout, run_tasks, wants_ray
from sysid.fit.metrics import LEVER_ARM
from sysid.fit.residuals import Window
from sysid.simulators.protocol import Simulator

if TYPE_CHECKING:
    from ingest.run import Run


@dataclass
class Sweep:
    """Held-out error over a timestep grid and the usable plateau (paper Fig. 3)."""

    dts: list[float]
    errors: list[float]  # mean combined error over runs [m]; inf where a run diverged
    per_run: list[list[float]]
    wall_times: list[float]  # [s] per rollout of all runs
    plateau: tuple[float, float] | None
    best_dt: float | None
    factor: float = 2.0

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "plateau": list(self.plateau) if self.plateau else None}


def find_plateau(dts: Sequence[float], errors: Sequence[float], factor: float = 2.0) -> tuple[float, float] | None:
    """The contiguous range of timesteps around the sweep minimum whose error stays within
    ``factor`` times that minimum; its upper end is the largest usable timestep."""
    order = np.argsort(dts)
    h = np.asarray(dts, float)[order]
    e = np.asarray(errors, float)[order]
    finite = np.isfinite(e)
    if not finite.any():
        return None
    k = int(np.nanargmin(np.where(finite, e, np.nan)))
    limit = factor * e[k]
    lo = hi = k
    while hi + 1 < len(h) and np.isfinite(e[hi + 1]) and e[hi + 1] <= limit:
        hi += 1
    while lo - 1 >= 0 and np.isfinite(e[lo - 1]) and e[lo - 1] <= limit:
        lo -= 1
    return float(h[lo]), float(h[hi])


def _sweep_point(sim: Simulator, runs: Sequence[Run], theta: Mapping[str, float], h: float, lever_arm: float,
                 windows: Sequence[Window] | None) -> tuple[list[float], float]:
    """One timestep of the sweep: the runs' combined errors (inf where the replay fails) and the
    wall time [s] of their rollout."""
    t0 = time.perf_counter()
    try:
        metrics, _ = evaluate(sim, runs, theta, h, lever_arm=lever_arm, windows=windows)
        errs = [m["combined"] for m in metrics]
    except (SimulatorError, FloatingPointError, ArithmeticError):
        errs = [float("inf")] * len(runs)
    return errs, time.perf_counter() - t0


def _sweep_task(spec: Mapping[str, Any], h: float) -> tuple[list[float], float]:
    """A Ray task: one timestep of the sweep (``_sweep_point``) with the simulator built here."""
    sim = spec["make_sim"]() if spec["make_sim"] is not None else spec["sim"]
    return _sweep_point(sim, spec["runs"], spec["theta"], h, spec["lever_arm"], spec["windows"])


def sweep_dt(
    sim: Simulator,
    runs: Sequence[Run],
    theta: Mapping[str, float],
    dts: Sequence[float],
    *,
    lever_arm: float = LEVER_ARM,
    windows: Sequence[Window] | None = None,
    factor: float = 2.0,
    progress: Callable[[float], None] | None = None,
    fanout: Fanout | None = None,
) -> Sweep:
    """Evaluate the runs at each timestep in ``dts`` [s]; a diverging or failing step counts as
    infinite error. The plateau is the largest h whose error stays within ``factor`` x minimum.
    ``fanout`` (more than one worker or a Ray address): every timestep one Ray task, the same
    function as the serial loop's, so the errors are the serial ones (the wall times are each
    task's own rollout)."""
    if not dts:
        raise ConfigError("the timestep sweep needs at least one timestep")
    hs = sorted(float(d) for d in dts)
    if fanout is not None and wants_ray(fanout.workers, fanout.address) and len(hs) > 1:
        spec = {"make_sim": fanout.make_sim, "sim": None if fanout.make_sim is not None else sim, "runs": list(runs),
                "theta": dict(theta), "lever_arm": lever_arm, "windows": windows}
        points, _info = run_tasks(_sweep_task, [(h,) for h in hs], fanout.workers, fanout.address, shared=(spec,),
                                  on_done=(lambda i, _out: progress(hs[i])) if progress is not None else None)
    else:
        points = []
        for h in hs:
            points.append(_sweep_point(sim, runs, theta, h, lever_arm, windows))
            if progress is not None:
                progress(h)
    per_run = [errs for errs, _wall in points]
    walls = [wall for _errs, wall in points]
    errors = [float(np.mean(errs)) for errs in per_run]
    plateau = find_plateau(hs, errors, factor)
    return Sweep(hs, errors, per_run, walls, plateau, plateau[1] if plateau else None, factor)
