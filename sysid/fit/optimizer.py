"""The optimiser entry point: ``optimize`` fits the free parameters to training runs with LM
(``sysid.fit.lm``; several starts: ``sysid.fit.multistart``) or Adam (``sysid.fit.adam``) and
returns a ``FitResult``: the identified values, the trace, covariance and confidence intervals
(``sysid.fit.uncertainty``) and warnings for ill-conditioning, strong correlations, parameters
without effect and parameters on their bounds."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sysid.errors import ConfigError, SimulatorError
from sysid.fit.adam import run_adam
from sysid.fit.fanout import Fanout
from sysid.fit.identifiability import NOT_DETERMINED, WEAK_WIDTH, assess, combination_text, interval_text
from sysid.fit.lm import lm_message, run_lm
from sysid.fit.metrics import LEVER_ARM
from sysid.fit.multistart import evaluate_starts, refine_remote
from sysid.fit.options import FitOptions
from sysid.fit.params import ParameterSet
from sysid.fit.residuals import NUISANCE_SPECS, Residuals, RunSet, Window
from sysid.fit.trace import Progress, append_entry, trace_entry
from sysid.fit.uncertainty import JACKKNIFE_RUNS, beyond_interval, covariance_details, run_shifts
from sysid.simulators.protocol import Simulator

if TYPE_CHECKING:
    from ingest.run import Run


@dataclass
class FitResult:
    """Outcome of ``optimize``: identified values, trace, covariance and diagnostics.

    ``success`` is whether the optimizer reported convergence, ``convergence`` which criterion
    ended it ("ftol", "xtol", "gtol", "ftol+xtol", or "budget" when ``max_iter`` ran out) and
    ``message`` says it in words. ``iterations`` counts residual evaluations (LM: trial steps
    included), ``jacobian_evaluations`` Jacobian evaluations. ``starts``: one entry per start point
    (``theta``, ``loss``, and for the refined ones ``loss_final``, ``evaluations``, ``convergence``),
    the chosen one marked ``chosen``. ``nuisance``: per training run, its fitted nuisance values
    (``nuisance_names``; not physics, never in the parameter file), ``nuisance_intervals`` their
    intervals. ``tau``: per run, the residuals' integrated autocorrelation
    time in samples (the factor its variance is scaled by; 1 with ``intervals="iid"``), ``n_eff``
    the effective number of independent residuals behind the intervals. ``intervals`` are clipped
    to the bounds; ``identifiability`` says per free parameter whether these runs determine it, with
    the interval unclipped and the bounds it reaches (``sysid.fit.identifiability.assess``), and
    ``weakest`` the least-determined combination of the parameters. ``run_shifts``: per training run
    (the pieces of one run together), how far each free parameter would move if that run were left
    out (one Gauss-Newton step, `sysid.fit.uncertainty.run_shifts`; with at least `JACKKNIFE_RUNS` runs).
    """

    params: ParameterSet
    names: tuple[str, ...]
    optimizer: str
    success: bool
    message: str
    iterations: int
    loss_initial: float
    loss_final: float
    train_errors_initial: dict[str, float]
    train_errors_final: dict[str, float]
    trace: list[dict[str, Any]] = field(default_factory=list)
    covariance: np.ndarray | None = None
    std: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    correlation: np.ndarray | None = None
    condition_number: float = float("nan")
    warnings: list[str] = field(default_factory=list)
    wall_time: float = 0.0
    sim_time: float = 0.0
    n_sim_calls: int = 0
    convergence: str = ""
    jacobian_evaluations: int = 0
    starts: list[dict[str, Any]] = field(default_factory=list)
    tau: dict[str, float] = field(default_factory=dict)
    n_eff: float = float("nan")
    options: dict[str, Any] = field(default_factory=dict)
    nuisance_names: tuple[str, ...] = ()
    nuisance: dict[str, dict[str, float]] = field(default_factory=dict)
    nuisance_intervals: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    identifiability: dict[str, dict[str, Any]] = field(default_factory=dict)
    weakest: dict[str, Any] | None = None
    run_shifts: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        return self.success

    def summary(self) -> dict[str, Any]:
        """JSON-friendly dictionary of everything but the parameter objects."""
        return {
            "names": list(self.names),
            "optimizer": self.optimizer,
            "success": self.success,
            "converged": self.success,
            "convergence": self.convergence,
            "message": self.message,
            "iterations": self.iterations,
            "jacobian_evaluations": self.jacobian_evaluations,
            "loss_initial": self.loss_initial,
            "loss_final": self.loss_final,
            "train_errors_initial": self.train_errors_initial,
            "train_errors_final": self.train_errors_final,
            "trace": self.trace,
            "covariance": None if self.covariance is None else self.covariance.tolist(),
            "std": self.std,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "correlation": None if self.correlation is None else self.correlation.tolist(),
            "condition_number": self.condition_number,
            "warnings": self.warnings,
            "wall_time": self.wall_time,
            "sim_time": self.sim_time,
            "n_sim_calls": self.n_sim_calls,
            "starts": self.starts,
            "tau": self.tau,
            "n_eff": self.n_eff,
            "options": self.options,
            "nuisance_names": list(self.nuisance_names),
            "nuisance": self.nuisance,
            "nuisance_intervals": {r: {k: list(v) for k, v in d.items()} for r, d in self.nuisance_intervals.items()},
            "identifiability": self.identifiability,
            "weakest": self.weakest,
            "run_shifts": self.run_shifts,
        }



def undetermined_prefixes(name: str) -> tuple[str, str]:
    """How the fit's warnings that parameter ``name`` is not determined begin (no effect on the residuals; an
    interval as wide as its bounds), so that a caller with a more specific reason can replace them."""
    return f"parameter {name!r} has no effect on the residuals", f"parameter {name!r} is not determined by these runs"


def _diagnostics(
    res: Residuals,
    z: np.ndarray,
    result: FitResult,
    cond_warn: float,
    corr_warn: float,
    options: FitOptions | None = None,
) -> None:
    """Fill covariance, intervals (clipped to the bounds), identifiability, conditioning and bound
    warnings into ``result``."""
    options = options or FitOptions()
    r, jz = res.evaluate(z, jac=True)
    assert jz is not None
    names = res.names
    if not names:
        return
    j_theta = jz / res.dtheta_dz(z)
    clusters = res.run_clusters()
    spans = res.run_slices()
    cov_all, half_all, taus, n_eff = covariance_details(
        r, j_theta, res.n_data, options.alpha, 1e-12, spans, options.intervals, res.prior_scale,
        list(clusters.values())
    )
    p = res.n_free  # the physical block: marginal over the nuisance parameters
    cov, half = cov_all[:p, :p], half_all[:p]
    if len(clusters) >= JACKKNIFE_RUNS:
        shifts = run_shifts(r, j_theta, res.n_data, [[spans[k] for k in c] for c in clusters.values()])
        result.run_shifts = {run: {n: float(shifts[i, k]) for k, n in enumerate(names[:p])}
                             for i, run in enumerate(clusters)}
    theta_all = res.to_theta(z)
    for i, run in enumerate(res.data.names):
        for k, n in enumerate(res.nuisance):
            c = p + i * len(res.nuisance) + k
            sp = NUISANCE_SPECS[n]
            result.nuisance_intervals.setdefault(run, {})[n] = (
                float(max(theta_all[c] - half_all[c], sp.lower)), float(min(theta_all[c] + half_all[c], sp.upper)))
            if min(theta_all[c] - sp.lower, sp.upper - theta_all[c]) <= 1e-3 * (sp.upper - sp.lower):
                result.warnings.append(
                    f"nuisance {n} of run {run!r} = {theta_all[c]:.4g} {sp.unit} is at its bound "
                    f"[{sp.lower:g}, {sp.upper:g}]: that run's log disagrees with the model by more than a "
                    "nuisance should absorb; look at it (ingest.quality) or leave it out"
                )
    result.covariance = cov
    result.tau = dict(zip(res.data.names, (float(t) for t in taus), strict=False))
    result.n_eff = float(n_eff)
    result.std = {
        n: float(math.sqrt(cov[k, k])) if np.isfinite(cov[k, k]) else float("inf") for k, n in enumerate(names)
    }
    # the interval in the optimiser's coordinates (log for a log-scaled parameter: a positive gain's
    # interval stays positive and its Fisher information is the one the classification reads)
    zp = np.asarray(z[:p], float)
    half_z = half / np.asarray(res.dtheta_dz(z)[:p], float)
    with np.errstate(invalid="ignore", over="ignore"):
        raw = np.column_stack([res.to_theta(np.r_[zp - half_z, z[p:]])[:p],
                               res.to_theta(np.r_[zp + half_z, z[p:]])[:p]])
    raw = np.where(np.isfinite(half_z)[:, None], raw, [-math.inf, math.inf])
    result.intervals = {
        n: (float(max(raw[k, 0], res.params[n].lower)), float(min(raw[k, 1], res.params[n].upper)))
        for k, n in enumerate(names)
    }
    if result.run_shifts and options.intervals != "runs":
        # a run that alone moves a parameter past its interval: the runs disagree beyond their noise
        moved = []
        for k, n in enumerate(names[:p]):
            run, shift = max(((rn, sh[n]) for rn, sh in result.run_shifts.items()), key=lambda x: abs(x[1]))
            if beyond_interval(shift, theta_all[k], raw[k, 0], raw[k, 1]):
                moved.append(f"{n} by {shift:+.3g} without {run}")
        if moved:
            result.warnings.append(
                f"the runs disagree beyond their noise: leaving out one run alone moves {', '.join(moved)} (one "
                "Gauss-Newton step), past the 95 % interval; the intervals understate what the runs leave "
                "undecided (fit.intervals: runs takes them from the runs' spread) and the model describes those "
                "runs differently from the others (fit.run_shifts in the results)")
    d = np.sqrt(np.abs(np.diag(cov)))
    with np.errstate(invalid="ignore", divide="ignore"):
        result.correlation = cov / np.outer(d, d)
    result.identifiability, result.weakest = assess(res, z, r, jz, raw, options.alpha, options.intervals,
                                                    options.profile)
    remedies = ("give it a prior (parameters.{n}.prior: {{mean, std}}, its strength chosen by sysid cv), "
                "freeze it at a value from another source (parameters.{n}.frozen: true, with that source), or add "
                "runs that excite it")
    # conditioning on the column-normalised Jacobian: independent of units and scaling
    norms = np.linalg.norm(jz, axis=0)
    labels = res.z_names
    for k, n in enumerate(names):
        if norms[k] == 0:
            result.warnings.append(
                f"{undetermined_prefixes(n)[0]} (zero Jacobian column): it is not determined "
                f"by these runs; {remedies.format(n=n)}"
            )
        elif result.identifiability[n]["status"] == NOT_DETERMINED and not result.identifiability[n]["prior"]:
            ident = result.identifiability[n]
            iv = ident["interval"]
            result.warnings.append(
                f"{undetermined_prefixes(n)[1]}: 95 % interval "
                f"{interval_text(iv[0], iv[1], res.params[n].lower, res.params[n].upper)} "
                f"({ident['reason']}); {remedies.format(n=n)}"
            )
    jn = jz / np.where(norms > 0, norms, 1.0)
    sv = np.linalg.svd(jn, compute_uv=False)
    cond = float(sv[0] / sv[-1]) ** 2 if sv[-1] > 0 else float("inf")
    result.condition_number = cond
    weakest = result.weakest
    # the least-determined combination, in the parameters' own scales (their bound ranges): a warning
    # when its 95 % interval spans half the range or more and it mixes parameters (a single one has
    # its own warning above)
    mixed = weakest is not None and len(weakest["dominant"]) > 1
    loose = weakest is not None and mixed and not 2 * weakest["half_width"] < WEAK_WIDTH
    if weakest is not None and (loose or (cond > cond_warn and mixed)):
        if loose:
            combo = combination_text(weakest)
            span = weakest["half_width"]
            size = ("is not bounded by them" if not math.isfinite(span)
                    else f"has a 95 % interval of +/-{span:.2g} of the bound ranges along it")
            names_text = ", ".join(weakest["dominant"])
        else:
            _, _, vt = np.linalg.svd(jn, full_matrices=False)
            combo = " ".join(f"{'+' if c >= 0 else '-'}{abs(c):.2f}*{n}" for c, n in zip(vt[-1], labels)
                             if abs(c) > 0.2)
            size = f"has cond(J^T J) = {cond:.3g} > {cond_warn:.3g}"
            names_text = "these parameters"
        dominant = weakest["dominant"]
        if loose and all(n in result.identifiability and result.identifiability[n]["prior"] for n in dominant):
            # every parameter of it has a prior already: the priors hold it, nothing more to give
            remedy = (f"the priors on {', '.join(dominant)} hold it (their strength chosen by sysid cv); runs that "
                      "separate them would determine it from the data")
        else:
            remedy = f"freeze one of {names_text} or give one a prior, or add runs that separate them"
        result.warnings.append(
            f"ill-conditioned fit: the runs barely determine the combination [{combo}] (it {size}, in the "
            f"parameters' normalised coordinates: each bound range is 1; condition number of the normalised Fisher "
            f"matrix {weakest['condition_number']:.3g}); {remedy}"
        )
    if result.correlation is not None:
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                c = result.correlation[a, b]
                if np.isfinite(c) and abs(c) > corr_warn:
                    result.warnings.append(
                        f"parameters {names[a]!r} and {names[b]!r} are strongly correlated (rho = {c:+.3f})"
                    )
    for n in names:
        side = result.params[n].at_bound()
        if side is not None:
            par = result.params[n]
            result.warnings.append(
                f"parameter {n!r} = {par.value:.6g} is at its {side} bound "
                f"[{par.lower:.6g}, {par.upper:.6g}]: widen the bounds or the model cannot reach the data's optimum; "
                "its interval is not meaningful"
            )


def optimize(
    sim: Simulator,
    runs: Sequence[Run] | RunSet,
    params: ParameterSet,
    dt: float,
    *,
    optimizer: str = "lm",
    max_iter: int = 50,
    lever_arm: float = LEVER_ARM,
    windows: Sequence[Window] | None = None,
    weights: Sequence[float] | None = None,
    prior_scale: float = 0.01,
    lr: float = 0.03,
    tol: float | None = None,
    options: FitOptions | None = None,
    cond_warn: float = 1e8,
    corr_warn: float = 0.98,
    progress: Progress | None = None,
    fanout: Fanout | None = None,
) -> FitResult:
    """Fit the free parameters of ``params`` to the runs; returns a ``FitResult``.

    ``optimizer``: ``"lm"`` — bounded trust-region Gauss-Newton / Levenberg-Marquardt
    (scipy ``least_squares(method="trf")``) with the exact residual Jacobian, stopped by the
    tolerances of ``options`` (``FitOptions``; ``tol`` sets ftol, xtol and gtol at once) within a
    budget of ``max_iter`` residual evaluations per LM run; ``"adam"`` — torch Adam on the same
    loss with gradient ``2 J^T r`` (or one adjoint sweep when the simulator has
    ``rollout_with_vjp``), projected onto the bounds, ``max_iter`` steps of learning rate ``lr``
    in normalised units, decayed to ``lr / 20``. With ``options.starts > 1`` the start points are
    evaluated first in one batched rollout and the optimizer starts from the best (LM: the
    ``options.refine`` best). ``dt`` [s] is the simulator timestep. ``params`` is not modified;
    the result carries a copy with the identified values.

    ``fanout`` (``Fanout``, with more than one worker or a Ray address): when the start points
    beyond the nominal fill more than one batch (``options.starts > options.starts_per_batch + 1``),
    every batch is one Ray task and so is every LM refinement fit (``options.refine`` of them); the
    results are merged in the serial order (the trace too, its times shifted to the driver's clock),
    so the fit is the serial one. Fewer starts stay in this process (one batch is cheaper than a
    round trip to Ray).

    ``progress`` is called with every trace entry as it is appended (`sysid.fit.trace`): LM's carry
    ``evaluations``, the residual evaluations spent so far, which ``iterations`` totals at the end.
    """
    if optimizer not in ("lm", "adam"):
        raise ConfigError(f"unknown optimizer {optimizer!r}; use 'lm' or 'adam'")
    options = options or FitOptions()
    if tol is not None:
        options = dataclasses.replace(options, ftol=tol, xtol=tol, gtol=tol)
    data = runs if isinstance(runs, RunSet) else RunSet.build(runs, windows, weights)
    unknown = [n for n in params.names if n not in sim.parameter_names]
    if unknown:
        raise ConfigError(
            f"parameter(s) {unknown} are not accepted by the simulator; it knows {list(sim.parameter_names)}"
        )
    res = Residuals(sim, data, params, dt, lever_arm=lever_arm, prior_scale=prior_scale, nuisance=options.nuisance,
                    loss=options.loss, loss_scale=options.loss_scale, horizon=options.horizon)
    z0 = res.z_start()
    t_start = time.perf_counter()
    trace: list[dict[str, Any]] = []
    start_index = [0]
    spent = [0]  # residual evaluations of the LM runs finished before the current one

    def record(z: np.ndarray, r: np.ndarray, evaluations: int | None = None) -> None:
        entry = trace_entry(res, z, r, time.perf_counter() - t_start)
        if evaluations is not None:
            entry["evaluations"] = spent[0] + evaluations
        append_entry(trace, entry, start_index[0], options, progress)

    r0, _ = res.evaluate(z0)
    if not np.all(np.isfinite(r0)):
        raise SimulatorError("the simulation diverges at the initial parameters; check nominals and the timestep")
    loss0 = res.loss(r0)
    record(z0, r0)

    # multi-start: every start point in one batched rollout, the best go on
    st = evaluate_starts(res, z0, loss0, options, fanout)
    starts, candidates, zs = st.entries, st.candidates, st.zs

    success, message, convergence, n_iter, n_jac, z = True, "no free parameters", "", 0, 0, z0
    if res.names and optimizer == "lm":
        best: dict[str, Any] | None = None
        best_k = 0
        remote: dict[int, dict[str, Any]] = {}
        t_fan = 0.0
        if st.spec is not None and len(candidates) > 1:  # the refinement fits as Ray tasks, merged in candidate order
            assert fanout is not None
            t_fan = time.perf_counter() - t_start
            remote = refine_remote(st, options, max_iter, r0, fanout)
        for k in candidates:
            start_index[0] = k
            if k in remote:
                got_k = remote[k]
                for entry in got_k["entries"]:
                    moved = {**entry, "time": t_fan + entry["time"]}
                    if "evaluations" in entry:
                        moved["evaluations"] = spent[0] + entry["evaluations"]
                    append_entry(trace, moved, k, options, progress)
                res.sim_time += got_k["sim_time"]
                res.n_calls += got_k["n_calls"]
                run = got_k["run"]
            else:
                if k != 0:
                    record(zs[k], res.evaluate(zs[k])[0])
                run = run_lm(res, zs[k], options, max_iter, record)
            n_iter += run["nfev"]
            n_jac += run["njev"]
            spent[0] = n_iter
            if starts:
                starts[k].update(loss_final=run["loss"], evaluations=run["nfev"], convergence=run["criterion"])
            if best is None or run["loss"] < best["loss"]:
                best, best_k = run, k
        assert best is not None
        z = best["z"]
        success = best["status"] > 0
        convergence = best["criterion"]
        message = lm_message(best, options, max_iter)
        if len(candidates) > 1:
            message += f" (best of {len(candidates)} LM runs, from start {best_k})"
        if starts:
            starts[best_k]["chosen"] = True
        r_final, _ = res.evaluate(z)
        if not trace or trace[-1]["loss"] != res.loss(r_final):
            record(z, r_final)
    elif res.names:
        z_init = zs[candidates[0]]
        if starts:
            starts[candidates[0]]["chosen"] = True
        adam = run_adam(res, z_init, max_iter, lr, record, trace)
        z, message, n_iter, n_jac = adam.z, adam.message, adam.steps, adam.jacobians
        convergence = "budget"
    theta_final = res.theta_free(z)
    out = params.copy()
    out.set_values(dict(zip(res.names, theta_final, strict=True)))
    r_final, _ = res.evaluate(z)
    result = FitResult(
        params=out,
        names=res.names,
        optimizer=optimizer,
        success=success,
        message=message,
        iterations=n_iter,
        loss_initial=loss0,
        loss_final=res.loss(r_final),
        train_errors_initial=dict(zip(data.names, res.run_errors(r0).tolist(), strict=True)),
        train_errors_final=dict(zip(data.names, res.run_errors(r_final).tolist(), strict=True)),
        trace=trace,
        convergence=convergence,
        jacobian_evaluations=n_jac,
        starts=starts,
        options={**dataclasses.asdict(options), "max_iter": max_iter},
        nuisance_names=res.nuisance,
        nuisance=dict(zip(data.names, res.nuisance_values(z) or [], strict=False)),
    )
    if res.names:
        _diagnostics(res, z, result, cond_warn, corr_warn, options)
    if not success:
        result.warnings.append(f"optimizer did not report convergence: {message}")
    result.wall_time = time.perf_counter() - t_start
    result.sim_time, result.n_sim_calls = res.sim_time, res.n_calls
    return result
