"""Identification: residuals, optimisers (bounded Gauss-Newton/LM and Adam), covariance,
command-scale calibration, evaluation and the timestep sweep.

The objective is the paper's (Ostrich §IV-A) combined error, summed over the training runs:

    loss(theta) = sum_i w_i * E_i(theta)^2,   E_i^2 = mean_t |dp|^2 + (L * RMSE(dyaw))^2,

written as a least-squares residual vector ``r`` with, per run and odometry sample,
``sqrt(w_i / T_i) * (dx, dy, dz, L * dyaw)`` [m], so that ``sum r^2 = loss``. Its Jacobian
``dr/dtheta`` comes from the simulator's pose sensitivities (chain rule through yaw(q)). All
training runs go to the simulator in one call (parallel worlds). Optimisation runs in normalised
coordinates ``z = (theta - lower) / (upper - lower)`` in [0, 1] so one step size fits all units.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats

from sysid.errors import ConfigError, SimulatorError
from sysid.fit.fanout import run_tasks, wants_ray
from sysid.fit.metrics import LEVER_ARM, quat_yaw, run_metrics, wrap_angle
from sysid.fit.params import ParameterSet, Prior
from sysid.simulators.protocol import Simulator, rollout_many

Window = tuple[float, float] | None
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class NuisanceSpec:
    """A per-run nuisance parameter: fitted for every training run on its own, kept out of the
    parameter file (config ``fit.nuisance``; docs/fit.md, "Nuisance parameters"). It starts at 0,
    is bounded to [lower, upper] and carries the Gaussian prior N(0, sigma^2) (a value the data do
    not constrain stays at 0)."""

    name: str
    lower: float
    upper: float
    sigma: float
    unit: str
    description: str


# what a simulator with ``nuisance_names`` may accept (the engine: sysid.simulators.ostrich.NUISANCE)
NUISANCE_SPECS: dict[str, NuisanceSpec] = {
    s.name: s
    for s in (
        NuisanceSpec("v0", -1.0, 1.0, 0.2, "m/s", "initial forward-velocity error of the run"),
        NuisanceSpec("w0", -1.0, 1.0, 0.2, "rad/s", "initial yaw-rate error of the run"),
        NuisanceSpec("clock_offset", -1.0, 1.0, 0.3, "s", "clock offset of the run's wheel log (delay)"),
    )
}


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
    parameter moves: the loss changes by ~1e-4 for 1e-5 relative parameter changes, with every
    step converged), so tighter tolerances end in a collapsing trust region or the budget.

    Multi-start: ``starts`` start points — the current values plus ``starts - 1`` Latin-hypercube
    points within ``start_spread`` of them in normalised coordinates (clipped to the bounds;
    seeded by ``start_seed``) — are evaluated together in one batched rollout
    (``sysid.simulators.protocol.rollout_many``); LM then runs from the ``refine`` best of them and the
    lowest final loss wins. ``starts_per_batch``: the most start points one batched rollout takes
    (the parallel worlds of one process); more are evaluated in consecutive batches of that size,
    which ``optimize(fanout=...)`` runs as Ray tasks together with the refinement fits (``Fanout``).

    Intervals: ``intervals="ess"`` (default) scales each run's residual variance by its integrated
    autocorrelation time (odometry errors and model errors are smooth in time: ~tau consecutive
    samples carry the information of one) in a sandwich covariance that includes the priors;
    ``"iid"`` treats every residual as independent (the textbook s^2 (J^T J)^-1, too narrow on
    real odometry). ``alpha``: 1 - confidence of the reported intervals.

    Nuisance: names from ``NUISANCE_SPECS`` fitted per training run besides the shared physical
    parameters (the Jacobian is block-diagonal in them); the physical intervals account for them.

    Loss: ``"linear"`` (least squares of the combined error) or a robust loss (``"soft_l1"``,
    ``"huber"``, ``"cauchy"``, scipy's rho) of each residual component's error e [m] at scale
    ``loss_scale`` [m]: sum c^2 delta^2 rho((e / delta)^2), so samples far off by more than delta
    (odometry jumps and freezes) weigh less than their square; the fit stays Gauss-Newton on the
    transformed residuals (exact Jacobian of the transform).
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

    def __post_init__(self) -> None:
        if self.loss not in ROBUST_LOSSES:
            raise ConfigError(f"fit.loss must be one of {list(ROBUST_LOSSES)}, got {self.loss!r}")
        if not (isinstance(self.loss_scale, int | float) and math.isfinite(self.loss_scale) and self.loss_scale > 0):
            raise ConfigError(f"fit.loss_scale must be a positive length [m], got {self.loss_scale!r}")
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
        if not (0 < self.start_spread <= 1):
            raise ConfigError(f"fit.starts.spread must be in (0, 1] (normalised units), got {self.start_spread!r}")
        if self.intervals not in ("ess", "iid"):
            raise ConfigError(f"fit interval method {self.intervals!r}; use 'ess' or 'iid'")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha!r}")


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


def measured_poses(run: Any) -> np.ndarray:
    """Odometry of a run as (T, 8) pose rows: t, x, y, z, qx, qy, qz, qw."""
    return run.odom[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]].to_numpy(float)


def align_start(pose: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Translate a simulated trajectory so its first position equals the run's first odometry
    position ``origin`` (x, y, z) [m]. The replay starts there in x, y anyway; in z the two frames
    may disagree by a constant (ingest's ``normalize_start`` puts the first pose at z = 0, an
    engine's ground is at z = 0 with the base 0.36 m above it), which is not a model error."""
    out = np.array(pose, dtype=float, copy=True)
    out[:, 1:4] += np.asarray(origin, float) - out[0, 1:4]
    return out


ROBUST_LOSSES = ("linear", "soft_l1", "huber", "cauchy")


def _robust(kind: str, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rho(z) and rho'(z) of a robust loss of the squared normalised error z (scipy's definitions:
    rho(z) ~ z for small z)."""
    if kind == "soft_l1":
        q = np.sqrt(1.0 + z)
        return 2.0 * (q - 1.0), 1.0 / q
    if kind == "huber":
        big = z > 1.0
        q = np.sqrt(np.where(big, z, 1.0))
        return np.where(big, 2.0 * q - 1.0, z), np.where(big, 1.0 / q, 1.0)
    if kind == "cauchy":
        return np.log1p(z), 1.0 / (1.0 + z)
    raise ConfigError(f"unknown loss {kind!r}; use one of {list(ROBUST_LOSSES)}")


def _yaw_jacobian(q: np.ndarray, dq: np.ndarray) -> np.ndarray:
    """d yaw / d theta from quaternions (T, 4) and their sensitivities (T, 4, n)."""
    qx, qy, qz, qw = (q[:, i : i + 1] for i in range(4))
    a = 2 * (qw * qz + qx * qy)
    b = 1 - 2 * (qy * qy + qz * qz)
    da = 2 * (qz * dq[:, 3] + qw * dq[:, 2] + qy * dq[:, 0] + qx * dq[:, 1])
    db = -4 * (qy * dq[:, 1] + qz * dq[:, 2])
    return (b * da - a * db) / (a * a + b * b)


@dataclass
class RunSet:
    """Runs prepared for simulation: each cut to end at its scoring window, with a sample mask.

    The simulated run always starts at the run's first odometry sample (open loop from rest);
    only samples with ``t0 <= t <= t1`` of its window are scored. ``weights`` multiply each run's
    squared combined error in the loss. With ``anchor`` the residual compares displacements since
    each window's first sample (position and yaw), which removes the offset that the transient
    before the window leaves: used to calibrate a speed scale on a steady cruise.
    """

    runs: list[Any]
    masks: list[np.ndarray]
    measured: list[np.ndarray]
    weights: np.ndarray
    names: list[str]
    anchor: bool = False
    origins: list[np.ndarray] | None = None  # first odometry position (x, y, z) of each run [m]

    @classmethod
    def build(
        cls,
        runs: Sequence[Any],
        windows: Sequence[Window] | None = None,
        weights: Sequence[float] | None = None,
        anchor: bool = False,
    ) -> RunSet:
        if not runs:
            raise ConfigError("no runs to simulate (empty run set)")
        windows = list(windows) if windows is not None else [None] * len(runs)
        w = np.ones(len(runs)) if weights is None else np.asarray(weights, dtype=float)
        cut, masks, meas = [], [], []
        for run, win in zip(runs, windows, strict=True):
            t = run.odom["t"].to_numpy(float)
            if win is not None:
                t_end = min(win[1], t[-1])
                if t_end < t[-1]:
                    run = run.slice(t[0], t_end, name=run.name)
                    t = run.odom["t"].to_numpy(float)
                mask = (t >= win[0]) & (t <= win[1])
            else:
                mask = np.ones(len(t), dtype=bool)
            if mask.sum() < 2:
                raise ConfigError(f"run {run.name!r}: scoring window {win} holds fewer than 2 odometry samples")
            cut.append(run)
            masks.append(mask)
            meas.append(measured_poses(run)[mask])
        origins = [measured_poses(r)[0, 1:4] for r in cut]
        return cls(cut, masks, meas, w, [r.name for r in runs], anchor, origins)


class Residuals:
    """Residual vector and Jacobian of the weighted combined error, in normalised coordinates.

    ``names`` are the free parameters (a subset of ``params``); the others keep their values.
    ``prior_scale`` [m] converts a prior's z-score into loss units: being one prior sigma away
    costs as much as ``prior_scale`` metres of combined error. ``nuisance`` (names of
    ``NUISANCE_SPECS``): per-run parameters appended to z after the physical ones, run-major
    (``z[p + i m + k]``: run i's nuisance k); the simulator must list them in ``nuisance_names``.
    """

    def __init__(
        self,
        sim: Simulator,
        data: RunSet,
        params: ParameterSet,
        dt: float,
        names: Sequence[str] | None = None,
        lever_arm: float = LEVER_ARM,
        prior_scale: float = 0.01,
        nuisance: Sequence[str] = (),
        loss: str = "linear",
        loss_scale: float = 0.1,
    ):
        self.sim, self.data, self.params, self.dt = sim, data, params, float(dt)
        self.loss_kind, self.loss_scale = loss, float(loss_scale)
        self.names = tuple(params.free_names if names is None else names)
        self.lever_arm = float(lever_arm)
        self.prior_scale = float(prior_scale)
        self.nuisance = tuple(nuisance)
        if self.nuisance:
            accepted = tuple(getattr(sim, "nuisance_names", ()))
            missing = [n for n in self.nuisance if n not in accepted]
            if missing:
                raise ConfigError(
                    f"nuisance parameter(s) {missing} are not accepted by the simulator"
                    + (f"; it knows {list(accepted)}" if accepted else " (it has no per-run parameters)")
                )
        specs = [NUISANCE_SPECS[n] for n in self.nuisance] * len(data.runs)
        # every free coordinate's label: physical names, then "name[run]" per run
        self.z_names = self.names + tuple(f"{n}[{r}]" for r in data.names for n in self.nuisance)
        self.log = np.array([params[n].log_scale for n in self.names] + [False] * len(specs), dtype=bool)
        lo = np.array([params[n].lower for n in self.names] + [sp.lower for sp in specs], dtype=float)
        hi = np.array([params[n].upper for n in self.names] + [sp.upper for sp in specs], dtype=float)
        self._lo = np.where(self.log, np.log(np.where(self.log, lo, 1.0)), lo)
        self._span = np.where(self.log, np.log(np.where(self.log, hi / np.where(self.log, lo, 1.0), 1.0)), hi - lo)
        self.n_calls = 0
        self.sim_time = 0.0
        self._cache: tuple[bytes, np.ndarray, np.ndarray | None] | None = None

    # coordinates: z in [0, 1], linear in theta or in log(theta) per parameter
    def to_z(self, theta_free: np.ndarray) -> np.ndarray:
        th = np.asarray(theta_free, float)
        u = np.where(self.log, np.log(np.where(self.log, th, 1.0)), th)
        return (u - self._lo) / self._span

    def to_theta(self, z: np.ndarray) -> np.ndarray:
        u = self._lo + np.asarray(z, float) * self._span
        return np.where(self.log, np.exp(np.where(self.log, u, 0.0)), u)

    def dtheta_dz(self, z: np.ndarray) -> np.ndarray:
        """Diagonal of d theta / d z at ``z``."""
        return np.where(self.log, self.to_theta(z) * self._span, self._span)

    def z_start(self) -> np.ndarray:
        """Normalised coordinates of the parameters' current values, every nuisance at 0."""
        return self.to_z(np.concatenate([self.params.free_vector(), np.zeros(self.n_nuisance)]))

    @property
    def n_free(self) -> int:
        """Number of free physical parameters (the first entries of z)."""
        return len(self.names)

    @property
    def n_nuisance(self) -> int:
        return len(self.nuisance) * len(self.data.runs)

    def theta_free(self, z: np.ndarray) -> np.ndarray:
        """The free physical parameters' values at ``z``."""
        return self.to_theta(z)[: self.n_free]

    def theta_dict(self, z: np.ndarray) -> dict[str, float]:
        theta = self.params.values()
        for n, v in zip(self.names, self.theta_free(z), strict=True):
            theta[n] = float(v)
        return theta

    def nuisance_values(self, z: np.ndarray) -> list[dict[str, float]] | None:
        """Per run, its nuisance values at ``z`` (None without nuisance parameters)."""
        if not self.nuisance:
            return None
        v = self.to_theta(z)[self.n_free :].reshape(len(self.data.runs), len(self.nuisance))
        return [dict(zip(self.nuisance, row.tolist(), strict=True)) for row in v]

    def _kw(self, z: np.ndarray) -> dict[str, Any]:
        nu = self.nuisance_values(z)
        return {} if nu is None else {"nuisance": nu}

    # simulation
    def _simulate(self, z: np.ndarray, jac: bool):
        t0 = time.perf_counter()
        theta, kw = self.theta_dict(z), self._kw(z)
        if jac:
            poses, jacs = self.sim.rollout_with_jacobian(self.data.runs, theta, self.dt, self.names + self.nuisance,
                                                         **kw)
        else:
            poses, jacs = self.sim.rollout(self.data.runs, theta, self.dt, **kw), None
        self.sim_time += time.perf_counter() - t0
        self.n_calls += 1
        if len(poses) != len(self.data.runs):
            raise SimulatorError(f"simulator returned {len(poses)} trajectories for {len(self.data.runs)} runs")
        return poses, jacs

    def _assemble(self, poses, jacs) -> tuple[np.ndarray, np.ndarray | None]:
        rs, js = [], []
        p, m = self.n_free, len(self.nuisance)
        n = p + m
        for i, (meas, mask) in enumerate(zip(self.data.measured, self.data.masks, strict=True)):
            pose = np.asarray(poses[i], float)
            if pose.shape != (len(mask), 8):
                raise SimulatorError(
                    f"simulator returned poses of shape {pose.shape} for run {self.data.names[i]!r}; "
                    f"expected ({len(mask)}, 8) at its odometry timestamps"
                )
            if self.data.origins is not None:
                pose = align_start(pose, self.data.origins[i])
            pose = pose[mask]
            c = math.sqrt(self.data.weights[i] / len(pose))
            dp = pose[:, 1:4] - meas[:, 1:4]
            dyaw = wrap_angle(quat_yaw(pose[:, 4:8]) - quat_yaw(meas[:, 4:8]))
            if self.data.anchor:
                dp = dp - dp[0]
                dyaw = wrap_angle(dyaw - dyaw[0])
            e = np.column_stack([dp, self.lever_arm * dyaw]).ravel()  # [m]
            scale = np.ones_like(e)
            if self.loss_kind != "linear":  # robust: r = c delta sgn(u) sqrt(rho(u^2)), u = e / delta
                u2 = (e / self.loss_scale) ** 2
                rho, drho = _robust(self.loss_kind, u2)
                root = np.sqrt(rho)
                e = self.loss_scale * np.sign(e) * root
                # d r / d(c e): rho'(u^2) |u| / sqrt(rho(u^2)), -> 1 as u -> 0
                scale = np.where(u2 > 1e-12, drho * np.sqrt(u2) / np.where(root > 0, root, 1.0), 1.0)
            rs.append(c * e)
            if jacs is not None:
                jfull = np.asarray(jacs[i], float)
                jp = jfull[mask].copy()  # (T, 7, n)
                jp[:, 0:3] -= jfull[0, 0:3]  # the start alignment subtracts the first position
                jy = _yaw_jacobian(pose[:, 4:8], jp[:, 3:7])
                block = np.concatenate([jp[:, 0:3], self.lever_arm * jy[:, None, :]], axis=1)  # (T, 4, n)
                if self.data.anchor:
                    block = block - block[0]
                block = c * scale[:, None] * block.reshape(-1, n)
                if m:  # run i's own nuisance columns; zero for the other runs'
                    full = np.zeros((block.shape[0], p + self.n_nuisance))
                    full[:, :p] = block[:, :p]
                    full[:, p + i * m : p + (i + 1) * m] = block[:, p:]
                    block = full
                js.append(block)
        r = np.concatenate(rs)
        j = np.concatenate(js) if jacs is not None else None
        return r, j

    def _prior(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, jrows = [], []
        theta = self.to_theta(z)
        dz = self.dtheta_dz(z)
        priors = [self.params[n].prior for n in self.names]
        priors += [Prior(0.0, NUISANCE_SPECS[n].sigma) for _ in self.data.runs for n in self.nuisance]
        for k, pr in enumerate(priors):
            if pr is None:
                continue
            rows.append(self.prior_scale * (theta[k] - pr.mean) / pr.sigma)
            jr = np.zeros(len(z))
            jr[k] = self.prior_scale * dz[k] / pr.sigma
            jrows.append(jr)
        return np.array(rows), (np.array(jrows) if jrows else np.zeros((0, len(z))))

    def evaluate(self, z: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Residuals (and Jacobian d r / d z) at normalised parameters ``z``; cached per ``z``."""
        key = np.asarray(z, float).tobytes()
        if self._cache is not None and self._cache[0] == key and (not jac or self._cache[2] is not None):
            return self._cache[1], self._cache[2]
        poses, jacs = self._simulate(z, jac)
        r, j = self._assemble(poses, jacs)
        if j is not None:
            j = j * self.dtheta_dz(z)  # chain rule to z
        pr, pj = self._prior(z)
        r = np.concatenate([r, pr])
        if j is not None:
            j = np.vstack([j, pj])
        self._cache = (key, r, j)
        return r, j

    def evaluate_many(self, zs: np.ndarray) -> list[np.ndarray]:
        """Residuals at several normalised parameter points, simulated as one batched rollout
        (``sysid.simulators.protocol.rollout_many``; serial for simulators without a batch)."""
        t0 = time.perf_counter()
        # the start points differ in the physical parameters; the runs' nuisance is the first's
        all_poses = rollout_many(self.sim, self.data.runs, [self.theta_dict(z) for z in zs], self.dt,
                                 **self._kw(zs[0]))
        self.sim_time += time.perf_counter() - t0
        self.n_calls += 1
        out = []
        for z, poses in zip(zs, all_poses, strict=True):
            r, _ = self._assemble(poses, None)
            out.append(np.concatenate([r, self._prior(z)[0]]))
        return out

    def run_slices(self) -> list[slice]:
        """Where each run's residuals sit in the residual vector (4 per scored sample)."""
        out, k = [], 0
        for m in self.data.masks:
            n = 4 * int(m.sum())
            out.append(slice(k, k + n))
            k += n
        return out

    def loss_and_grad_vjp(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Residuals and d loss / d z through the simulator's adjoint (``rollout_with_vjp``):
        the pose cotangent of ``loss = |r|^2`` is assembled here, the engine pulls it back."""
        if self.nuisance:
            raise ConfigError("the adjoint gradient does not cover nuisance parameters; use the Jacobian path")
        t0 = time.perf_counter()
        poses, vjp = self.sim.rollout_with_vjp(self.data.runs, self.theta_dict(z), self.dt, self.names)
        self.sim_time += time.perf_counter() - t0
        self.n_calls += 1
        r, _ = self._assemble(poses, None)
        cot, k = [], 0
        for i, mask in enumerate(self.data.masks):
            pose = np.asarray(poses[i], float)
            m = int(mask.sum())
            c = math.sqrt(self.data.weights[i] / m)
            ri = r[k : k + 4 * m].reshape(m, 4)
            k += 4 * m
            g = np.zeros((len(mask), 7))
            gp = 2 * c * ri[:, 0:3]
            gy = 2 * c * self.lever_arm * ri[:, 3]
            if self.data.anchor:  # the first sample of the window was subtracted from all others
                gp[0] -= gp.sum(axis=0)
                gy[0] -= gy.sum()
            g[mask, 0:3] = gp
            if self.data.origins is not None:  # align_start subtracts the first simulated position
                g[0, 0:3] -= gp.sum(axis=0)
            q = pose[mask, 4:8]
            eye = np.broadcast_to(np.eye(4), (m, 4, 4))
            g[mask, 3:7] = gy[:, None] * _yaw_jacobian(q, eye)  # d yaw / d q per sample
            cot.append(g)
        grad_theta = np.asarray(vjp(cot), float)
        pr, pj = self._prior(z)
        r = np.concatenate([r, pr])
        grad_z = grad_theta * self.dtheta_dz(z) + (2 * pj.T @ pr if len(pr) else 0.0)
        return r, grad_z

    @property
    def n_data(self) -> int:
        return int(sum(4 * m.sum() for m in self.data.masks))

    def loss(self, r: np.ndarray) -> float:
        return float(np.dot(r, r)) if np.all(np.isfinite(r)) else float("inf")

    def run_errors(self, r: np.ndarray) -> np.ndarray:
        """Per-run combined error E_i [m] from a residual vector."""
        out, k = [], 0
        for i, m in enumerate(self.data.masks):
            n = 4 * int(m.sum())
            out.append(math.sqrt(np.dot(r[k : k + n], r[k : k + n]) / self.data.weights[i]))
            k += n
        return np.array(out)


# ---------------------------------------------------------------------------------------------


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
    the effective number of independent residuals behind the intervals.
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
        }


def autocorrelation_time(e: np.ndarray) -> float:
    """Integrated autocorrelation time [samples] of a residual series (Geyer's initial positive
    sequence on the autocorrelation about zero, not about the mean: an offset is an error that
    every sample shares). 1 for white noise; ~(1 + a) / (1 - a) for an AR(1) of coefficient a; up to
    len(e) for a constant offset."""
    e = np.asarray(e, float)
    n = len(e)
    g0 = float(np.dot(e, e))
    if n < 3 or g0 <= 0:
        return 1.0
    f = np.fft.rfft(e, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[:n] / g0
    tau, prev = -1.0, math.inf
    for m in range(n // 2):
        pair = acf[2 * m] + acf[2 * m + 1]
        if pair <= 0:
            break
        pair = min(pair, prev)  # initial monotone sequence
        tau += 2 * pair
        prev = pair
    return float(min(max(tau, 1.0), n))


def run_tau(r_run: np.ndarray, channels: int = 4) -> float:
    """A run's residual autocorrelation time: its channels' (x, y, z, L yaw) times weighted by their
    share of the run's squared residual."""
    block = np.asarray(r_run, float).reshape(-1, channels)
    energy = (block**2).sum(axis=0)
    if energy.sum() <= 0:
        return 1.0
    taus = np.array([autocorrelation_time(block[:, c]) for c in range(channels)])
    return float(np.dot(energy, taus) / energy.sum())


def covariance(
    r: np.ndarray,
    j_theta: np.ndarray,
    n_data: int,
    alpha: float = 0.05,
    rel_eig_tol: float = 1e-12,
    *,
    blocks: Sequence[slice] | None = None,
    method: str = "iid",
    prior_scale: float = 0.01,
) -> tuple[np.ndarray, np.ndarray]:
    """Covariance of the estimate (theta units) and half-widths of its (1 - alpha) intervals.

    ``r``, ``j_theta``: residuals and their Jacobian d r / d theta; the first ``n_data`` rows are
    data (run ``i`` in ``blocks[i]``), the rest prior rows ``prior_scale (theta - mean) / sigma``.
    The estimate minimises ``|r|^2``, so its covariance is the sandwich ``A^-1 B A^-1`` with
    ``A = J^T J`` and ``B = sum_i v_i J_i^T J_i + prior_scale^2 J_p^T J_p``: each run's residual
    variance ``v_i = tau_i s_i^2 n_eff / (n_eff - p)`` is its own mean square ``s_i^2`` times its
    autocorrelation time ``tau_i`` (``method="ess"``; the last factor: the fit absorbs p of the
    n_eff independent residuals; ``"iid"``: ``tau_i = 1`` and one pooled ``s^2`` for all runs, the
    textbook ``s^2 (J^T J)^-1`` without priors), and a prior row's
    variance is ``prior_scale^2`` (its mean is one draw of N(theta, sigma^2)). The t quantile has
    ``n_eff - p`` degrees of freedom, ``n_eff = sum_i n_i / tau_i``. Directions with eigenvalues of
    ``A`` below ``rel_eig_tol * max`` are unidentifiable and give infinite variance.
    """
    return _covariance(r, j_theta, n_data, alpha, rel_eig_tol, blocks, method, prior_scale)[:2]


def _covariance(r, j_theta, n_data, alpha, rel_eig_tol, blocks, method, prior_scale):
    r = np.asarray(r, float)
    j_theta = np.asarray(j_theta, float)
    p = j_theta.shape[1]
    blocks = list(blocks) if blocks else [slice(0, n_data)]
    jd, rd = j_theta[:n_data], r[:n_data]
    jp = j_theta[n_data:]
    blocks = [b for b in blocks if b.stop > b.start]
    taus = [run_tau(rd[b]) if method == "ess" else 1.0 for b in blocks]
    n_eff = float(sum((b.stop - b.start) / t for b, t in zip(blocks, taus, strict=True)))
    # the fit absorbs p of the n_eff independent residuals: their mean square is low by (n_eff - p) / n_eff
    dof_corr = n_eff / max(n_eff - p, 1.0)
    pooled = float(np.dot(rd, rd)) / max(n_data - p, 1)
    meat = np.zeros((p, p))
    for b, tau in zip(blocks, taus, strict=True):
        rb, jb = rd[b], jd[b]
        v = tau * float(np.dot(rb, rb)) / len(rb) * dof_corr if method == "ess" else pooled
        meat += v * (jb.T @ jb)
    if len(jp):
        meat += prior_scale**2 * (jp.T @ jp)
    h = j_theta.T @ j_theta
    lam, vec = np.linalg.eigh(h)
    lam_max = max(float(lam.max()), 1e-300)
    inv = np.zeros_like(lam)
    good = lam > rel_eig_tol * lam_max
    inv[good] = 1.0 / lam[good]
    a_inv = (vec * inv) @ vec.T
    cov = a_inv @ meat @ a_inv
    cov = 0.5 * (cov + cov.T)
    bad = ~good
    if bad.any():  # a parameter touched by a null direction has unbounded variance
        touched = (np.abs(vec[:, bad]) > 1e-6).any(axis=1)
        cov[touched, :] = np.where(np.eye(p, dtype=bool)[touched], np.inf, cov[touched, :])
    dof = max(n_eff - p, 1.0)
    half = np.sqrt(np.clip(np.diag(cov), 0, None)) * scipy.stats.t.ppf(1 - alpha / 2, dof)
    return cov, half, taus, n_eff


def _diagnostics(
    res: Residuals,
    z: np.ndarray,
    result: FitResult,
    cond_warn: float,
    corr_warn: float,
    options: FitOptions | None = None,
) -> None:
    """Fill covariance, intervals (clipped to the bounds), conditioning and bound warnings into
    ``result``."""
    options = options or FitOptions()
    r, jz = res.evaluate(z, jac=True)
    assert jz is not None
    names = res.names
    if not names:
        return
    j_theta = jz / res.dtheta_dz(z)
    cov_all, half_all, taus, n_eff = _covariance(
        r, j_theta, res.n_data, options.alpha, 1e-12, res.run_slices(), options.intervals, res.prior_scale
    )
    p = res.n_free  # the physical block: marginal over the nuisance parameters
    cov, half = cov_all[:p, :p], half_all[:p]
    theta_all = res.to_theta(z)
    theta = theta_all[:p]
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
    result.intervals = {
        n: (
            float(max(theta[k] - half[k], res.params[n].lower)),
            float(min(theta[k] + half[k], res.params[n].upper)),
        )
        for k, n in enumerate(names)
    }
    d = np.sqrt(np.abs(np.diag(cov)))
    with np.errstate(invalid="ignore", divide="ignore"):
        result.correlation = cov / np.outer(d, d)
    # conditioning on the column-normalised Jacobian: independent of units and scaling
    norms = np.linalg.norm(jz, axis=0)
    labels = res.z_names
    for k, n in enumerate(names):
        if norms[k] == 0:
            result.warnings.append(
                f"parameter {n!r} has no effect on the residuals (zero Jacobian column): it is unidentifiable "
                "from these runs; freeze it"
            )
    jn = jz / np.where(norms > 0, norms, 1.0)
    sv = np.linalg.svd(jn, compute_uv=False)
    cond = float(sv[0] / sv[-1]) ** 2 if sv[-1] > 0 else float("inf")
    result.condition_number = cond
    if cond > cond_warn:
        _, _, vt = np.linalg.svd(jn, full_matrices=False)
        weak = vt[-1]
        combo = " ".join(f"{'+' if c >= 0 else '-'}{abs(c):.2f}*{n}" for c, n in zip(weak, labels) if abs(c) > 0.2)
        result.warnings.append(
            f"ill-conditioned fit: cond(J^T J) = {cond:.3g} > {cond_warn:.3g}; the data barely constrain the "
            f"direction [{combo}]; freeze one of these parameters or add a prior"
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
            p = result.params[n]
            result.warnings.append(
                f"parameter {n!r} = {p.value:.6g} is at its {side} bound "
                f"[{p.lower:.6g}, {p.upper:.6g}]: widen the bounds or the model cannot reach the data's optimum; "
                "its interval is not meaningful"
            )


def start_batches(n: int, per_batch: int) -> list[slice]:
    """The batches of start points ``1 .. n - 1`` (start 0, the nominal, is evaluated on its own):
    consecutive slices of at most ``per_batch`` points."""
    return [slice(a, min(a + per_batch, n)) for a in range(1, n, per_batch)]


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


def _remote_spec(res: Residuals, fanout: Fanout) -> dict[str, Any]:
    return {"make_sim": fanout.make_sim, "sim": None if fanout.make_sim is not None else res.sim, "data": res.data,
            "params": res.params, "dt": res.dt, "names": res.names, "lever_arm": res.lever_arm,
            "prior_scale": res.prior_scale, "nuisance": res.nuisance, "loss": res.loss_kind,
            "loss_scale": res.loss_scale}


def _remote_residuals(spec: Mapping[str, Any]) -> Residuals:
    sim = spec["make_sim"]() if spec["make_sim"] is not None else spec["sim"]
    return Residuals(sim, spec["data"], spec["params"], spec["dt"], names=spec["names"], lever_arm=spec["lever_arm"],
                     prior_scale=spec["prior_scale"], nuisance=spec["nuisance"], loss=spec["loss"],
                     loss_scale=spec["loss_scale"])


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
        res._cache = (np.asarray(z_start, float).tobytes(), r_start, None)
    t0 = time.perf_counter()
    entries: list[dict[str, Any]] = []

    def record(z: np.ndarray, r: np.ndarray) -> None:
        entries.append(_trace_entry(res, z, r, time.perf_counter() - t0))

    if k != 0:
        record(z_start, res.evaluate(z_start)[0])
    run = _lm(res, z_start, options, max_iter, record)
    return {"run": run, "entries": entries, "sim_time": res.sim_time, "n_calls": res.n_calls}


def _trace_entry(res: Residuals, z: np.ndarray, r: np.ndarray, t: float) -> dict[str, Any]:
    return {"loss": res.loss(r), "time": t,
            "theta": {n: float(v) for n, v in zip(res.names, res.theta_free(z), strict=True)}}


def _append_entry(trace: list[dict[str, Any]], entry: dict[str, Any], start: int, options: FitOptions,
                  progress: Progress | None) -> None:
    entry = {"iter": len(trace), **entry}
    if options.starts > 1:
        entry["start"] = start
    trace.append(entry)
    if progress is not None:
        progress(entry)


_CRITERIA = {1: "gtol", 2: "ftol", 3: "xtol", 4: "ftol+xtol", 0: "budget", -1: "failed"}


def _lm(res: Residuals, z_start: np.ndarray, options: FitOptions, max_iter: int, record: Callable) -> dict[str, Any]:
    """One bounded LM run from ``z_start``: final z, scipy status, criterion, evaluation counts."""
    last_key: list[bytes] = []
    counts = {"f": 0, "j": 0}

    def fun(z: np.ndarray) -> np.ndarray:
        counts["f"] += 1
        r, _ = res.evaluate(z)
        return np.where(np.isfinite(r), r, 1e6)  # trf shrinks its radius on a huge residual

    def jac(z: np.ndarray) -> np.ndarray:
        counts["j"] += 1
        r, j = res.evaluate(z, jac=True)
        key = z.tobytes()
        if not last_key or last_key[-1] != key:  # jac is evaluated once per accepted iterate
            last_key.append(key)
            if len(last_key) > 1:
                record(z, r)
        assert j is not None
        return j

    sol = scipy.optimize.least_squares(
        fun,
        z_start,
        jac=jac,
        bounds=(np.zeros_like(z_start), np.ones_like(z_start)),
        method="trf",
        x_scale="jac",
        ftol=options.ftol,
        xtol=options.xtol,
        gtol=options.gtol,
        max_nfev=max_iter,
        verbose=0,
    )
    z = np.clip(sol.x, 0, 1)
    r, _ = res.evaluate(z)
    return {
        "z": z,
        "loss": res.loss(r),
        "status": int(sol.status),
        "criterion": _CRITERIA.get(int(sol.status), str(sol.status)),
        "scipy_message": str(sol.message),
        "nfev": int(sol.nfev),
        "njev": int(sol.njev or counts["j"]),
    }


def _lm_message(run: dict[str, Any], options: FitOptions, max_iter: int) -> str:
    crit = run["criterion"]
    if crit == "budget":
        return (
            f"not converged: the budget of max_iter={max_iter} residual evaluations ran out before a "
            f"criterion was met (ftol={options.ftol:g}, xtol={options.xtol:g}, gtol={options.gtol:g}); "
            "raise fit.max_iter"
        )
    if crit == "failed":
        return f"not converged: {run['scipy_message']}"
    why = {
        "ftol": f"the last accepted step lowered the loss by less than ftol={options.ftol:g} of it",
        "xtol": f"the step fell below xtol={options.xtol:g} (normalised coordinates)",
        "ftol+xtol": f"the last step lowered the loss by less than ftol={options.ftol:g} and fell below "
        f"xtol={options.xtol:g}",
        "gtol": f"the scaled gradient fell below gtol={options.gtol:g}",
    }[crit]
    return f"converged ({crit}): {why}, after {run['nfev']} evaluations"


def optimize(
    sim: Simulator,
    runs: Sequence[Any] | RunSet,
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
                    loss=options.loss, loss_scale=options.loss_scale)
    z0 = res.z_start()
    t_start = time.perf_counter()
    trace: list[dict[str, Any]] = []
    start_index = [0]

    def record(z: np.ndarray, r: np.ndarray) -> None:
        _append_entry(trace, _trace_entry(res, z, r, time.perf_counter() - t_start), start_index[0], options,
                      progress)

    r0, _ = res.evaluate(z0)
    if not np.all(np.isfinite(r0)):
        raise SimulatorError("the simulation diverges at the initial parameters; check nominals and the timestep")
    loss0 = res.loss(r0)
    record(z0, r0)

    # multi-start: every start point in one batched rollout, the best go on
    starts: list[dict[str, Any]] = []
    candidates = [0]
    zs = z0[None]
    fan, spec = False, None
    if res.names and options.starts > 1:
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

    success, message, convergence, n_iter, n_jac, z = True, "no free parameters", "", 0, 0, z0
    if res.names and optimizer == "lm":
        best: dict[str, Any] | None = None
        remote: dict[int, dict[str, Any]] = {}
        if fan and len(candidates) > 1:  # the refinement fits as Ray tasks, merged in candidate order
            t_fan = time.perf_counter() - t_start
            # the first fit starts where the driver's residual cache holds r0 (serially it costs no rollout)
            got, _info = run_tasks(_refine_task, [(zs[k], k, options, max_iter, r0 if k == 0 == candidates[0] else None)
                                                  for k in candidates],
                                   fanout.workers, fanout.address, shared=(spec,))  # type: ignore[union-attr]
            remote = dict(zip(candidates, got, strict=True))
        for k in candidates:
            start_index[0] = k
            if k in remote:
                got_k = remote[k]
                for entry in got_k["entries"]:
                    _append_entry(trace, {**entry, "time": t_fan + entry["time"]}, k, options, progress)
                res.sim_time += got_k["sim_time"]
                res.n_calls += got_k["n_calls"]
                run = got_k["run"]
            else:
                if k != 0:
                    record(zs[k], res.evaluate(zs[k])[0])
                run = _lm(res, zs[k], options, max_iter, record)
            n_iter += run["nfev"]
            n_jac += run["njev"]
            if starts:
                starts[k].update(loss_final=run["loss"], evaluations=run["nfev"], convergence=run["criterion"])
            if best is None or run["loss"] < best["loss"]:
                best, best_k = run, k
        assert best is not None
        z = best["z"]
        success = best["status"] > 0
        convergence = best["criterion"]
        message = _lm_message(best, options, max_iter)
        if len(candidates) > 1:
            message += f" (best of {len(candidates)} LM runs, from start {best_k})"
        if starts:
            starts[best_k]["chosen"] = True
        r_final, _ = res.evaluate(z)
        if not trace or trace[-1]["loss"] != res.loss(r_final):
            record(z, r_final)
    elif res.names:
        import torch  # imported here: the LM path does not need it

        z_init = zs[candidates[0]]
        if starts:
            starts[candidates[0]]["chosen"] = True
        zt = torch.tensor(z_init, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([zt], lr=lr)
        # decay the step to lr/20 over the run: Adam at a constant rate circles the optimum
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.05 ** (1.0 / max(max_iter, 1)))
        best_a = (res.loss(res.evaluate(z_init)[0]), z_init.copy())
        use_vjp = callable(getattr(sim, "rollout_with_vjp", None)) and not res.nuisance and res.loss_kind == "linear"
        for _ in range(max_iter):
            z_np = zt.detach().numpy().copy()
            if use_vjp:  # one adjoint sweep per step
                r, grad = res.loss_and_grad_vjp(z_np)
            else:
                r, j = res.evaluate(z_np, jac=True)
                n_jac += 1
                assert j is not None
                grad = 2.0 * j.T @ r
            if not np.all(np.isfinite(r)):
                message = "simulation diverged during Adam; stopped at the best iterate"
                break
            loss = res.loss(r)
            if loss < best_a[0]:
                best_a = (loss, z_np.copy())
            if len(trace) > 0 and trace[-1]["loss"] != loss:
                record(z_np, r)
            opt.zero_grad()
            zt.grad = torch.as_tensor(np.asarray(grad, float))
            opt.step()
            sched.step()
            with torch.no_grad():
                zt.clamp_(0.0, 1.0)
            n_iter += 1
        else:
            message = f"completed {max_iter} Adam steps (lr={lr}); Adam has no convergence test"
        convergence = "budget"
        z = best_a[1]
        r_final, _ = res.evaluate(z)
        record(z, r_final)
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


# ---------------------------------------------------------------------------------------------


@dataclass
class Calibration:
    """Result of calibrating one parameter (the wheel-command scale) on a flat segment."""

    parameter: str
    segment: str
    value: float
    runs: list[str]
    skipped: list[str]
    fit: FitResult


def calibrate(
    sim: Simulator,
    runs: Sequence[Any],
    params: ParameterSet,
    dt: float,
    *,
    parameter: str = "cmd_scale",
    segment: str = "cruise",
    lever_arm: float = LEVER_ARM,
    max_iter: int = 30,
) -> Calibration:
    """Fit only ``parameter`` on the ``segment`` window of each run that has it (paper §IV-A: the
    wheel-command scale is calibrated on the flat pre-obstacle cruise, disjoint from the scored
    climb). Other parameters stay at their current values. The residual compares displacements
    within the segment (``RunSet(anchor=True)``), so the offset left by the start-up transient,
    which depends on the other, not yet identified parameters, does not bias the scale.
    Raises ConfigError when no run has the segment."""
    if parameter not in params:
        raise ConfigError(f"calibration parameter {parameter!r} is not among the parameters {list(params.names)}")
    have = [r for r in runs if segment in r.segments]
    skipped = [r.name for r in runs if segment not in r.segments]
    if not have:
        raise ConfigError(
            f"no training run has a {segment!r} segment for calibrating {parameter!r}; "
            "set fit.calibration.enabled: false or give runs with that segment"
        )
    sub = params.copy()
    sub.freeze(sub.names)
    sub.freeze([parameter], frozen=False)
    data = RunSet.build(have, [r.segments[segment] for r in have], anchor=True)
    fit = optimize(sim, data, sub, dt, optimizer="lm", max_iter=max_iter, lever_arm=lever_arm)
    return Calibration(parameter, segment, fit.params[parameter].value, [r.name for r in have], skipped, fit)


def simulate(sim: Simulator, runs: Sequence[Any], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
    """Rollout that turns a simulator exception into a SimulatorError naming the timestep."""
    try:
        return sim.rollout(list(runs), dict(theta), dt)
    except (KeyError, ValueError) as exc:
        raise SimulatorError(f"simulator rejected the replay at dt={dt}: {exc}") from exc


def evaluate(
    sim: Simulator,
    runs: Sequence[Any],
    theta: Mapping[str, float],
    dt: float,
    *,
    lever_arm: float = LEVER_ARM,
    windows: Sequence[Window] | None = None,
) -> tuple[list[dict[str, float]], list[np.ndarray]]:
    """Per-run metrics (combined error [m], mean/final xy distance [m], yaw RMSE [rad]) and the
    simulated poses (full run, at odometry timestamps)."""
    data = RunSet.build(runs, windows)
    poses = simulate(sim, data.runs, theta, dt)
    metrics = []
    for pose, mask, meas, origin in zip(poses, data.masks, data.measured, data.origins, strict=True):
        metrics.append(run_metrics(align_start(pose, origin)[mask], meas, lever_arm))
    return metrics, poses


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
        return {
            "dts": self.dts,
            "errors": self.errors,
            "per_run": self.per_run,
            "wall_times": self.wall_times,
            "plateau": list(self.plateau) if self.plateau else None,
            "best_dt": self.best_dt,
            "factor": self.factor,
        }


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


def _sweep_point(sim: Simulator, runs: Sequence[Any], theta: Mapping[str, float], h: float, lever_arm: float,
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
    runs: Sequence[Any],
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
