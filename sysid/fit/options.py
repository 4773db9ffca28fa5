"""``FitOptions``: the tolerances, budgets, start points, interval method, nuisance parameters and
loss of one identification (config ``fit.tolerances``, ``fit.starts``, ``fit.intervals``,
``fit.nuisance``, ``fit.loss``), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sysid.errors import ConfigError
from sysid.fit.residuals import NUISANCE_SPECS, ROBUST_LOSSES

MAX_STARTS = 10_000  # start points of a multi-start fit: beyond this the starts alone take days
INTERVALS = ("ess", "iid", "runs")  # fit.intervals: the methods of sysid.fit.uncertainty.covariance


@dataclass(frozen=True)
class FitOptions:
    """Every tolerance and budget of ``optimize`` besides ``max_iter`` (config: ``fit.tolerances``,
    ``fit.starts``; docs/fit.md, "Convergence, starts and intervals").

    Convergence (LM, scipy ``least_squares(method="trf")`` in normalised coordinates z in [0, 1]):
    the fit has converged when an accepted step lowers the loss by less than ``ftol`` times the
    loss, or when the step falls below ``xtol * (xtol + |z|)``, or when the scaled gradient falls
    below ``gtol``. ``max_iter`` (the evaluation budget, trial steps included) is not meant to be
    the stopping reason; when it is, the result says "not converged". The defaults suit the engine,
    whose loss is rough at the 1e-4..1e-3 relative level (contact events shift by a step as a
    parameter moves; docs/results.md, "Roughness of the engine's loss"), so tighter tolerances end
    in a collapsing trust region or the budget.

    Multi-start: ``starts`` start points — the current values plus ``starts - 1`` Latin-hypercube
    points within ``start_spread`` of them in normalised coordinates (clipped to the bounds;
    seeded by ``start_seed``) — are evaluated together in one batched rollout
    (``sysid.simulators.protocol.rollout_many``); LM then runs from the ``refine`` best of them and the
    lowest final loss wins. ``starts_per_batch``: the most start points one batched rollout takes
    (the parallel worlds of one process); more are evaluated in consecutive batches of that size,
    which ``optimize(fanout=...)`` runs as Ray tasks together with the refinement fits (``sysid.fit.fanout.Fanout``).

    Intervals: ``intervals="ess"`` (default) scales each run's residual variance by its integrated
    autocorrelation time (odometry errors and model errors are smooth in time: ~tau consecutive
    samples carry the information of one) in a sandwich covariance that includes the priors;
    ``"iid"`` treats every residual as independent (the textbook s^2 (J^T J)^-1, too narrow on
    real odometry); ``"runs"`` takes the covariance from the runs' jackknife (the spread of the estimates
    that leaving out one run at a time gives, linearised: `sysid.fit.uncertainty.run_shifts`), which also
    holds what the runs disagree about beyond their noise; at least 5 runs (pieces of one run count as
    one), no nuisance. ``alpha``: 1 - confidence of the reported intervals. ``profile``: check each
    free parameter's identifiability by the loss at the ends of its interval along its profile path
    (one batched rollout of 2 points per parameter; ``sysid.fit.identifiability``).

    Nuisance: names from ``NUISANCE_SPECS`` fitted per training run besides the shared physical
    parameters (the Jacobian is block-diagonal in them); the physical intervals account for them.

    Loss: ``"linear"`` (least squares of the combined error) or a robust loss (``"soft_l1"``,
    ``"huber"``, ``"cauchy"``, scipy's rho) of each residual component's error e [m] at scale
    ``loss_scale`` [m]: sum c^2 delta^2 rho((e / delta)^2), so samples far off by more than delta
    (odometry jumps and freezes) weigh less than their square; the fit stays Gauss-Newton on the
    transformed residuals (exact Jacobian of the transform).

    Horizon: None (default) compares every sample's pose with the odometry's since the run's start.
    A ``horizon`` h [s] compares relative poses instead (evo's RPE): the displacement since the sample h
    seconds earlier, each in its own heading frame there, and the heading change since then (the
    window's first sample where the run is younger than h). An odometry jump or a heading error then
    weighs on the next h seconds, not on the rest of the run. The scores stay the absolute errors.
    """

    ftol: float = 1e-3
    xtol: float = 1e-3
    gtol: float = 1e-8
    starts: int = 1
    start_spread: float = 0.15
    start_seed: int = 0
    refine: int = 1
    starts_per_batch: int = 16
    intervals: str = "ess"
    alpha: float = 0.05
    nuisance: tuple[str, ...] = ()
    loss: str = "linear"
    loss_scale: float = 0.1
    horizon: float | None = None
    profile: bool = True  # check each parameter's identifiability by the loss along its profile path

    def __post_init__(self) -> None:
        if self.loss not in ROBUST_LOSSES:
            raise ConfigError(f"fit.loss must be one of {list(ROBUST_LOSSES)}, got {self.loss!r}")
        if not (isinstance(self.loss_scale, int | float) and math.isfinite(self.loss_scale) and self.loss_scale > 0):
            raise ConfigError(f"fit.loss_scale must be a positive length [m], got {self.loss_scale!r}")
        if self.horizon is not None and not (isinstance(self.horizon, int | float) and math.isfinite(self.horizon)
                                             and self.horizon > 0):
            raise ConfigError(f"fit.horizon must be a positive time [s] (the relative-pose error's span), "
                              f"got {self.horizon!r}")
        object.__setattr__(self, "nuisance", tuple(self.nuisance))
        bad = [n for n in self.nuisance if n not in NUISANCE_SPECS]
        if bad:
            raise ConfigError(f"unknown nuisance parameter(s) {bad}; accepted: {list(NUISANCE_SPECS)}")
        if len(set(self.nuisance)) != len(self.nuisance):
            raise ConfigError(f"fit.nuisance names a parameter twice: {list(self.nuisance)}")
        for key in ("ftol", "xtol", "gtol"):
            v = getattr(self, key)
            if not (isinstance(v, int | float) and math.isfinite(v) and 0 < v < 1):
                raise ConfigError(f"fit tolerance {key} must be a number in (0, 1), got {v!r}")
        if not (isinstance(self.starts, int) and self.starts >= 1):
            raise ConfigError(f"fit.starts must be an integer >= 1, got {self.starts!r}")
        if not (isinstance(self.refine, int) and 1 <= self.refine):
            raise ConfigError(f"fit.starts.refine must be an integer >= 1, got {self.refine!r}")
        if not (isinstance(self.starts_per_batch, int) and self.starts_per_batch >= 1):
            raise ConfigError(f"fit.starts.per_batch must be an integer >= 1, got {self.starts_per_batch!r}")
        if self.starts > MAX_STARTS:
            raise ConfigError(f"fit.starts {self.starts:,} is more than {MAX_STARTS:,}: every start is a replay of "
                              f"every training run ({-(-self.starts // self.starts_per_batch):,} batched rollouts); "
                              f"give at most {MAX_STARTS:,}")
        if not (0 < self.start_spread <= 1):
            raise ConfigError(f"fit.starts.spread must be in (0, 1] (normalised units), got {self.start_spread!r}")
        if self.intervals not in INTERVALS:
            raise ConfigError(f"fit interval method {self.intervals!r}; use one of {list(INTERVALS)}")
        if self.intervals == "runs" and self.nuisance:
            raise ConfigError("fit.intervals: runs (the runs' jackknife) cannot leave a run out together with its own "
                              f"nuisance parameters {list(self.nuisance)}; use fit.intervals: ess, or no fit.nuisance")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha!r}")

