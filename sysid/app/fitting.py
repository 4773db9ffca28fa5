"""The fit itself, for the model and the kinematic baseline alike: the simulators a config names
(`make_simulator`, `baseline_simulator`, their fan-out over Ray workers), the parameters a simulator
accepts, the calibration followed by the fit (`calibrate_and_fit`), the baseline's fit on the model's
training runs (`fit_baseline`), the warning for a surface friction the fit left without effect
(`surface_warnings`), and the warning when the identified parameters predict the held-out
runs worse than the starting values (`start_warning`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sysid.app.config import BASELINE, FitConfig
from sysid.app.document import parameter_rows
from sysid.app.progress import EvaluationBar
from sysid.app.results import Baseline, Calibration, FitSummary, SplitBlock
from sysid.app.runs import score_windows
from sysid.errors import ConfigError
from sysid.fit.calibration import SETTLE, SPEED_WINDOW, calibrate, compared_runs
from sysid.fit.evaluation import evaluate
from sysid.fit.fanout import Fanout, wants_ray
from sysid.fit.optimizer import FitResult, optimize
from sysid.fit.options import FitOptions
from sysid.fit.params import ParameterSet, Prior, unit_of
from sysid.simulators.protocol import Simulator, get_simulator, resolve_factory, unwrap

if TYPE_CHECKING:
    from ingest.run import Run


def make_simulator(cfg: FitConfig, robot: Mapping[str, Any]) -> Simulator:
    """The simulator ``cfg`` names, with its options (the engine with ``fit.jacobian`` as well)."""
    options = dict(cfg.simulator.options)
    if cfg.fit.jacobian is not None and cfg.simulator.name == "ostrich":  # fit.jacobian: the engine's option
        options["jacobian"] = cfg.fit.jacobian
    return get_simulator(cfg.simulator.name, robot=robot, **options)


# simulator options that describe the data, not the model: what a run starts from and how the odometry
# observes the motion; the kinematic baseline gets the config's settings of these too (same data,
# same sensor: sysid.simulators.observation, sysid.simulators.kinematic.INITIAL_SPEED)
SHARED_OPTIONS = ("initial_speed", "odom_history")


def baseline_simulator(cfg: FitConfig, robot: Mapping[str, Any]) -> Simulator:
    """The kinematic baseline with the config's `SHARED_OPTIONS`."""
    return get_simulator(BASELINE, robot=dict(robot), **baseline_options(cfg))


def baseline_options(cfg: FitConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.simulator.options.items() if k in SHARED_OPTIONS}


def fanout_of(cfg: FitConfig, robot: Mapping[str, Any], simulator: str | None = None) -> Fanout | None:
    """The fan-out of ``cfg.fit.workers`` / ``cfg.fit.ray_address`` (None when serial): each task builds its
    own simulator (``cfg``'s, or the registered ``simulator``, e.g. the kinematic baseline)."""
    if not wants_ray(cfg.fit.workers, cfg.fit.ray_address):
        return None
    make = (functools.partial(make_simulator, cfg, dict(robot)) if simulator is None
            else functools.partial(get_simulator, simulator, robot=dict(robot),
                                   **(baseline_options(cfg) if simulator == BASELINE else {})))
    return Fanout(workers=cfg.fit.workers, address=cfg.fit.ray_address, make_sim=make)


def accepted_parameters(cfg: FitConfig, robot: Mapping[str, Any]) -> tuple[Simulator, tuple[str, ...]]:
    """Build the simulator (cheap for every registered one) and return its parameter names."""
    resolve_factory(cfg.simulator.name)  # import errors surface as SimulatorError naming the simulator
    sim = make_simulator(cfg, robot)
    for name in getattr(sim, "positive_parameters", ()):  # what this simulator cannot take, before any work
        spec = cfg.parameters.get(name)
        if spec is not None and spec.bounds is not None and spec.bounds[0] <= 0:
            raise ConfigError(f"parameters.{name}: bounds [{spec.bounds[0]:g}, {spec.bounds[1]:g}] reach "
                              f"{spec.bounds[0]:g}, but simulator {cfg.simulator.name!r} needs {name} > 0; give a "
                              "lower bound above 0")
    return sim, tuple(sim.parameter_names)


CALIBRATION_MAX_ITER = 30  # residual evaluations of the command-scale calibration (LM)


def calibrate_and_fit(
    cfg: FitConfig,
    sim: Simulator,
    train: Sequence[Run],
    params: ParameterSet,
    dt: float,
    *,
    optimizer: str,
    max_iter: int,
    progress: bool = True,
    timing: dict[str, float] | None = None,
    label: str = "",
    options: FitOptions | None = None,
    fanout: Fanout | None = None,
) -> tuple[FitResult, Calibration | None]:
    """Calibrate ``cfg.fit.calibration.parameter`` on its segment (when enabled and ``params`` has it),
    then fit the free parameters on ``train``: the same procedure for the model and the baseline.
    ``params`` receives the calibrated value; returns (FitResult, calibration record or None).
    ``timing`` (when given) receives ``calibrate`` / ``fit`` wall times [s] (prefixed by ``label``);
    ``options`` replaces ``cfg.fit.options``; ``fanout``: where a multi-start's batches and
    refinement fits may run (``sysid.fit.optimizer.optimize``)."""
    timing = {} if timing is None else timing
    initial_frozen = {p.name: p.frozen for p in params}
    calibration: Calibration | None = None
    skipped = None
    if (cfg.fit.calibration.enabled and cfg.fit.calibration.parameter in params
            and not compared_runs(train, cfg.fit.calibration.segment)):
        # the segment exists (checked with the config) but every piece is too short: the parameter
        # joins the fit rather than the whole fit failing on a default the user did not choose
        skipped = (f"calibration of {cfg.fit.calibration.parameter!r} skipped: no training run's "
                   f"{cfg.fit.calibration.segment!r} segment lasts past the replay's first {SETTLE:g} s plus "
                   f"{SPEED_WINDOW:g} s (pieces of data.split too short?); it is fitted with the other parameters")
    elif cfg.fit.calibration.enabled and cfg.fit.calibration.parameter in params:
        t0 = time.perf_counter()
        with EvaluationBar(f"{label}calibrate {cfg.fit.calibration.parameter} (LM)", CALIBRATION_MAX_ITER,
                           enabled=progress) as bar:
            cal = calibrate(
                sim,
                train,
                params,
                dt,
                parameter=cfg.fit.calibration.parameter,
                segment=cfg.fit.calibration.segment,
                lever_arm=cfg.fit.lever_arm,
                max_iter=CALIBRATION_MAX_ITER,
                progress=bar,
                max_curvature=cfg.fit.calibration.max_curvature,
            )
            bar.done(cal.fit)
        target = params[cfg.fit.calibration.parameter]
        target.value = cal.value
        std = cal.fit.std.get(cal.parameter, math.inf)
        carry = cfg.fit.calibration.carry
        if carry == "prior" and not (math.isfinite(std) and std > 0):
            carry = "freeze"  # an unbounded (or zero) std is no prior: keep the calibrated value
            cal.fit.warnings.append(f"calibration of {cal.parameter!r} has no finite std; frozen, not a prior")
        if carry == "prior" and not initial_frozen[cfg.fit.calibration.parameter]:
            target.prior = Prior(cal.value, std)  # free, but its calibration's information enters the fit
        else:
            target.frozen = True
        calibration = {
            "carry": carry if not target.frozen else "freeze",
            "parameter": cal.parameter,
            "segment": cal.segment,
            "value": cal.value,
            "runs": cal.runs,
            "skipped": cal.skipped,
            "std": cal.fit.std.get(cal.parameter),
            "interval": list(cal.fit.intervals.get(cal.parameter, (math.nan, math.nan))),
            "loss_initial": cal.fit.loss_initial,
            "loss_final": cal.fit.loss_final,
            "warnings": cal.fit.warnings,
        }
        timing[f"{label}calibrate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    weights = [cfg.fit.weights.get(r.name, cfg.fit.weights.get(r.meta.get("split_of", ""), 1.0)) for r in train]
    bar = EvaluationBar(f"{label}fit ({optimizer})", max_iter, enabled=progress)
    with bar:
        fit = optimize(
            sim,
            train,
            params,
            dt,
            optimizer=optimizer,
            max_iter=max_iter,
            lever_arm=cfg.fit.lever_arm,
            windows=score_windows(cfg, train),
            weights=weights,
            prior_scale=cfg.fit.prior_scale,
            lr=cfg.fit.lr,
            progress=bar,
            options=cfg.fit.options if options is None else options,
            fanout=fanout,
        )
        bar.done(fit)
    timing[f"{label}fit"] = time.perf_counter() - t0
    if skipped is not None:
        fit.warnings.append(skipped)
    if calibration is not None:
        fit.warnings[:0] = calibration["warnings"]  # the fit's own list: printed, reported, in every cv fold
    fit.warnings = with_surface_warnings(cfg, fit.params, fit.warnings)
    if calibration is not None and calibration["carry"] == "freeze":
        fit.params[cfg.fit.calibration.parameter].frozen = initial_frozen[cfg.fit.calibration.parameter]
    return fit, calibration


def surface_warnings(cfg: FitConfig, params: ParameterSet) -> dict[str, str]:
    """Under ``friction_combine: max`` a contact takes the larger of the wheel's and the surface's friction per
    direction, so a free surface friction (mu_ground, mu_pallet) at or below the wheels' mu and mu_lateral changes
    no contact: its Jacobian column is zero and the fit cannot bring it back. One warning per such parameter
    (parameter name -> warning); the fit puts it in place of the optimizer's zero-column warning."""
    if (cfg.simulator.options or {}).get("friction_combine") != "max":
        return {}
    from sysid.simulators.ostrich_model import SURFACE_PARAMETERS  # the engine's; only a max-rule fit loads it

    wheels = {n: params[n].value for n in ("mu", "mu_lateral") if n in params}
    if not wheels:
        return {}
    out = {}
    for name in SURFACE_PARAMETERS:
        if name in params and not params[name].frozen and params[name].value <= min(wheels.values()):
            out[name] = (f"{name} ended at {params[name].value:.4g}, not above the wheels' friction "
                         f"({', '.join(f'{n} {v:.4g}' for n, v in wheels.items())}): "
                         "under friction_combine: max the wheels' value decides every contact with that surface, "
                         f"so {name} has no effect and the fit cannot move it back; start it above the wheels' "
                         f"(parameters.{name}.nominal) or freeze it")
    return out


def with_surface_warnings(cfg: FitConfig, params: ParameterSet, warnings: list[str]) -> list[str]:
    """``warnings`` with `surface_warnings`' cause and remedy in place of the optimizer's generic "not
    determined" warnings for the same parameters (one warning per parameter, not two)."""
    from sysid.fit.optimizer import undetermined_prefixes

    surface = surface_warnings(cfg, params)
    generic = tuple(pre for name in surface for pre in undetermined_prefixes(name))
    return [w for w in warnings if not (generic and w.startswith(generic))] + list(surface.values())


def baseline_status(cfg: FitConfig, sim: Simulator) -> str | None:
    """Why the kinematic baseline is not fitted (None: it is)."""
    from sysid.simulators.kinematic import KinematicSkidSteer

    if not cfg.fit.baseline.enabled:
        return "not fitted (fit.baseline: false or --no-baseline)"
    if cfg.simulator.name == BASELINE or isinstance(unwrap(sim), KinematicSkidSteer):
        return f"not fitted: the model is itself the {BASELINE} baseline"
    return None


def fit_baseline(
    cfg: FitConfig,
    bparams: ParameterSet,
    bsim: Simulator,
    train: Sequence[Run],
    held: Sequence[Run],
    progress: bool = True,
    timing: dict[str, float] | None = None,
    fanout: Fanout | None = None,
) -> tuple[Baseline, dict[str, list[dict[str, float]]], dict[str, list[np.ndarray]]]:
    """Fit the kinematic baseline on the model's training runs (the same pieces, screening,
    segment, lever arm, weights and calibration) at ``cfg.fit.baseline.dt`` with LM, and score it on
    the same runs. Returns (the results' ``baseline`` record, per split the per-run metrics, per split
    the per-run replayed poses)."""
    t_all = time.perf_counter()
    initial = bparams.copy()
    # the same nuisance as the model where the baseline has it (the kinematic model has no initial
    # state to correct): either way the nuisance is fitted on the training runs only
    accepted = getattr(bsim, "nuisance_names", ())
    options = dataclasses.replace(cfg.fit.options, nuisance=tuple(n for n in cfg.fit.options.nuisance
                                                                  if n in accepted))
    fit, calibration = calibrate_and_fit(cfg, bsim, train, bparams, cfg.fit.baseline.dt, optimizer="lm",
                                         max_iter=cfg.fit.baseline.max_iter, progress=progress, label="baseline ",
                                         options=options, fanout=fanout)
    # the baseline is a reference, not what the user tunes: its undetermined parameters in one line
    loose = [n for n, i in fit.identifiability.items() if i["status"] == "not determined"]
    if loose:
        fit.warnings = [w for w in fit.warnings if not (" is not determined by these runs" in w
                                                        or w.startswith("ill-conditioned fit"))]
        fit.warnings.append(f"not determined by these runs: {', '.join(loose)} (the baseline's own fit; a reference "
                            "for the model, nothing to act on)")
    metrics: dict[str, list[dict[str, float]]] = {}
    poses: dict[str, list[np.ndarray]] = {}
    for split, runs in (("train", train), ("held_out", held)):
        if runs:
            metrics[split], poses[split] = evaluate(bsim, runs, fit.params.values(), cfg.fit.baseline.dt,
                                         lever_arm=cfg.fit.lever_arm, windows=score_windows(cfg, runs))
    record: Baseline = {
        "simulator": BASELINE,
        "label": getattr(bsim, "label", type(bsim).__name__),
        "status": "fitted",
        "reason": None,
        "dt": cfg.fit.baseline.dt,
        "optimizer": "lm",
        "max_iter": cfg.fit.baseline.max_iter,
        "parameters": parameter_rows(cfg, initial, fit, calibration, truth=False),
        "calibration": calibration,
        "fit": cast(FitSummary, fit.summary()),
        "wall_time": time.perf_counter() - t_all,
    }
    if timing is not None:
        timing["baseline"] = record["wall_time"]
    return record, metrics, poses


def moved_most(initial: ParameterSet, identified: ParameterSet, names: Sequence[str], n: int = 3
               ) -> list[tuple[str, float]]:
    """The ``n`` parameters of ``names`` that moved most from ``initial`` to ``identified``, with the
    move as a share of the bound range (on a log scale for log-scaled parameters), largest first."""
    moves = []
    for name in names:
        p, a, b = identified[name], initial[name].value, identified[name].value
        if p.log_scale and a > 0 and b > 0:
            share = abs(math.log(b / a)) / math.log(p.upper / p.lower)
        else:
            share = abs(b - a) / p.span
        moves.append((name, share))
    return sorted(moves, key=lambda m: -m[1])[:n]


def start_warning(block: SplitBlock, initial: ParameterSet, identified: ParameterSet,
                  calibration: Calibration | None = None) -> str | None:
    """A warning when the identified parameters predict the held-out runs of ``block``
    (``aggregate_split``) worse than the starting values (mean over runs of the mean xy distance),
    naming the parameters that moved most and what to do; None otherwise."""
    means = block.get("mean_over_runs") or {}
    if "start" not in means:
        return None
    m, s0 = means["model"]["mean_xy"], means["start"]["mean_xy"]
    m = math.inf if m is None else float(m)
    if s0 is None or not m > float(s0):
        return None
    cal = calibration["parameter"] if calibration else None
    names = [p.name for p in identified if not p.frozen or p.name == cal]
    moved = ", ".join(
        f"{name} {initial[name].value:.4g} -> {identified[name].value:.4g}"
        + (f" {unit_of(name)}" if unit_of(name) not in ("", "1") else "")
        + f" ({share:.0%} of its range{', calibrated' if name == cal else ''})"
        for name, share in moved_most(initial, identified, names) if share > 0)
    n = block["n_runs"]
    return (f"the identified parameters predict the held-out runs worse than the starting values: mean xy distance "
            f"{'diverged' if not math.isfinite(m) else f'{m:.3f}'} vs {float(s0):.3f} m over {n} "
            f"run{'s' if n != 1 else ''}; what the fit gained on the training runs does not carry to new runs. "
            + (f"The parameters that moved most: {moved}. " if moved else "")
            + "Freeze them at values from another source or give them priors (parameters.<name>.prior: "
            "{mean, std}, the strength chosen by sysid cv, never by a held-out run), free first the parameters "
            "these runs determine (the parameter table's 'determined'), and compare the choices with sysid cv")
