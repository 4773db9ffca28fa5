"""Multi-start: Latin-hypercube start points around the current values, evaluated together in
batched rollouts (``sysid.simulators.protocol.rollout_many``), the best of them refined by LM; the
batches and the refinement fits go to Ray as tasks when a ``Fanout`` asks for it (docs/fit.md,
"Convergence, starts and intervals")."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sysid.fit.fanout import Fanout, run_tasks, wants_ray
from sysid.fit.lm import run_lm
from sysid.fit.options import FitOptions
from sysid.fit.residuals import Residuals
from sysid.fit.trace import trace_entry


def start_points(z0: np.ndarray, n: int, spread: float, seed: int = 0) -> np.ndarray:
    """(n, p) start points in normalised coordinates: ``z0`` first, then ``n - 1`` Latin-hypercube
    points in the box ``z0 +/- spread`` clipped to [0, 1] (the box is shifted inside the bounds
    where ``z0`` is near one, so every start differs from ``z0``)."""
    z0 = np.asarray(z0, float)
    out = [z0]
    if n > 1:
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 13]))
        m, p = n - 1, len(z0)
        lo = np.clip(z0 - spread, 0.0, max(0.0, 1.0 - 2 * spread))
        hi = np.minimum(lo + 2 * spread, 1.0)
        u = (np.stack([rng.permutation(m) for _ in range(p)], axis=1) + rng.random((m, p))) / m
        out += list(lo + u * (hi - lo))
    return np.array(out)



def start_batches(n: int, per_batch: int) -> list[slice]:
    """The batches of start points ``1 .. n - 1`` (start 0, the nominal, is evaluated on its own):
    consecutive slices of at most ``per_batch`` points."""
    return [slice(a, min(a + per_batch, n)) for a in range(1, n, per_batch)]



def _remote_spec(res: Residuals, fanout: Fanout) -> dict[str, Any]:
    """What a Ray task needs to rebuild ``res`` (the simulator as its factory where there is one)."""
    return {"make_sim": fanout.make_sim, "sim": None if fanout.make_sim is not None else res.sim, "data": res.data,
            "params": res.params, "dt": res.dt, "names": res.names, "lever_arm": res.lever_arm,
            "prior_scale": res.prior_scale, "nuisance": res.nuisance, "loss": res.loss_kind,
            "loss_scale": res.loss_scale, "horizon": res.horizon}


def _remote_residuals(spec: Mapping[str, Any]) -> Residuals:
    """The residuals of ``_remote_spec``, rebuilt in a Ray task."""
    sim = spec["make_sim"]() if spec["make_sim"] is not None else spec["sim"]
    return Residuals(sim, spec["data"], spec["params"], spec["dt"], names=spec["names"], lever_arm=spec["lever_arm"],
                     prior_scale=spec["prior_scale"], nuisance=spec["nuisance"], loss=spec["loss"],
                     loss_scale=spec["loss_scale"], horizon=spec["horizon"])


def _start_batch_task(spec: Mapping[str, Any], zs: np.ndarray) -> tuple[list[float], float, int]:
    """A Ray task: the losses of one batch of start points (and the simulation time and calls)."""
    res = _remote_residuals(spec)
    return [res.loss(r) for r in res.evaluate_many(zs)], res.sim_time, res.n_calls


def _refine_task(spec: Mapping[str, Any], z_start: np.ndarray, k: int, options: FitOptions,
                 max_iter: int, r_start: np.ndarray | None = None) -> dict[str, Any]:
    """A Ray task: one LM refinement fit from start ``k`` (what the serial loop of ``optimize``
    does for it): the run, its trace entries (times from the task's start), simulation time, calls.
    ``r_start``: the residuals at ``z_start`` where the serial loop has them cached."""
    res = _remote_residuals(spec)
    if r_start is not None:
        res.seed_cache(z_start, r_start)
    t0 = time.perf_counter()
    entries: list[dict[str, Any]] = []

    def record(z: np.ndarray, r: np.ndarray, evaluations: int | None = None) -> None:
        entry = trace_entry(res, z, r, time.perf_counter() - t0)
        if evaluations is not None:  # this run's count; the driver adds what the fit spent before it
            entry["evaluations"] = evaluations
        entries.append(entry)

    if k != 0:
        record(z_start, res.evaluate(z_start)[0])
    run = run_lm(res, z_start, options, max_iter, record)
    return {"run": run, "entries": entries, "sim_time": res.sim_time, "n_calls": res.n_calls}


@dataclass
class Starts:
    """The start points of a fit and what their evaluation chose.

    ``zs``: (n, len(z)) start points in normalised coordinates, row 0 the current values;
    ``entries``: the result's ``starts`` (one per point; empty for a single start);
    ``candidates``: the indices of the points LM refines, lowest loss first;
    ``spec``: what a Ray task needs to rebuild the residuals when the fit fans out (None: in process).
    """

    zs: np.ndarray
    entries: list[dict[str, Any]] = field(default_factory=list)
    candidates: list[int] = field(default_factory=lambda: [0])
    spec: dict[str, Any] | None = None


def evaluate_starts(res: Residuals, z0: np.ndarray, loss0: float, options: FitOptions,
                    fanout: Fanout | None) -> Starts:
    """Every start point in batched rollouts (start 0, ``z0`` with loss ``loss0``, is evaluated
    already); the ``options.refine`` best with a finite loss go on. A single start (or no free
    parameter) is ``z0`` alone."""
    if not (res.names and options.starts > 1):
        return Starts(z0[None])
    starts: list[dict[str, Any]] = []
    spec = None
    p = res.n_free  # starts spread the physical parameters; the nuisance starts at 0 in each
    zs = start_points(z0[:p], options.starts, options.start_spread, options.start_seed)
    zs = np.hstack([zs, np.repeat(z0[None, p:], len(zs), axis=0)])
    batches = start_batches(len(zs), options.starts_per_batch)
    fan = fanout is not None and len(batches) > 1 and wants_ray(fanout.workers, fanout.address)
    if fan:
        assert fanout is not None
        spec = _remote_spec(res, fanout)
        out, _info = run_tasks(_start_batch_task, [(zs[b],) for b in batches], fanout.workers, fanout.address,
                               shared=(spec,))
        losses = [loss0]
        for batch_losses, sim_time, n_calls in out:
            losses += batch_losses
            res.sim_time += sim_time
            res.n_calls += n_calls
    else:
        losses = [loss0] + [res.loss(r) for b in batches for r in res.evaluate_many(zs[b])]
    for k, (z, loss) in enumerate(zip(zs, losses, strict=True)):
        starts.append(
            {"index": k, "theta": dict(zip(res.names, res.theta_free(z).tolist(), strict=True)), "loss": loss}
        )
    order = sorted(range(len(zs)), key=lambda k: (not math.isfinite(losses[k]), losses[k]))
    candidates = [k for k in order if math.isfinite(losses[k])][: options.refine] or [0]
    return Starts(zs, starts, candidates, spec)


def refine_remote(starts: Starts, options: FitOptions, max_iter: int, r0: np.ndarray,
                  fanout: Fanout) -> dict[int, dict[str, Any]]:
    """The LM refinement fits of ``starts.candidates`` as Ray tasks (``_refine_task``), by start
    index. ``r0``: the residuals at start 0, which the driver's cache holds (serially that first fit
    costs no rollout)."""
    candidates = starts.candidates
    got, _info = run_tasks(_refine_task, [(starts.zs[k], k, options, max_iter, r0 if k == 0 == candidates[0] else None)
                                          for k in candidates],
                           fanout.workers, fanout.address, shared=(starts.spec,))
    return dict(zip(candidates, got, strict=True))
