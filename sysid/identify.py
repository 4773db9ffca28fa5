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

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats

from .errors import ConfigError, SimulatorError
from .metrics import LEVER_ARM, quat_yaw, run_metrics, wrap_angle
from .params import ParameterSet
from .simulator import Simulator

Window = tuple[float, float] | None
Progress = Callable[[dict[str, Any]], None]


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
    costs as much as ``prior_scale`` metres of combined error.
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
    ):
        self.sim, self.data, self.params, self.dt = sim, data, params, float(dt)
        self.names = tuple(params.free_names if names is None else names)
        self.lever_arm = float(lever_arm)
        self.prior_scale = float(prior_scale)
        self.log = np.array([params[n].log_scale for n in self.names], dtype=bool)
        lo = np.array([params[n].lower for n in self.names], dtype=float)
        hi = np.array([params[n].upper for n in self.names], dtype=float)
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

    def theta_dict(self, z: np.ndarray) -> dict[str, float]:
        theta = self.params.values()
        for n, v in zip(self.names, self.to_theta(z), strict=True):
            theta[n] = float(v)
        return theta

    # simulation
    def _simulate(self, theta: Mapping[str, float], jac: bool):
        t0 = time.perf_counter()
        if jac:
            poses, jacs = self.sim.rollout_with_jacobian(self.data.runs, theta, self.dt, self.names)
        else:
            poses, jacs = self.sim.rollout(self.data.runs, theta, self.dt), None
        self.sim_time += time.perf_counter() - t0
        self.n_calls += 1
        if len(poses) != len(self.data.runs):
            raise SimulatorError(f"simulator returned {len(poses)} trajectories for {len(self.data.runs)} runs")
        return poses, jacs

    def _assemble(self, poses, jacs) -> tuple[np.ndarray, np.ndarray | None]:
        rs, js = [], []
        n = len(self.names)
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
            rs.append(c * np.column_stack([dp, self.lever_arm * dyaw]).ravel())
            if jacs is not None:
                jfull = np.asarray(jacs[i], float)
                jp = jfull[mask].copy()  # (T, 7, n)
                jp[:, 0:3] -= jfull[0, 0:3]  # the start alignment subtracts the first position
                jy = _yaw_jacobian(pose[:, 4:8], jp[:, 3:7])
                block = np.concatenate([jp[:, 0:3], self.lever_arm * jy[:, None, :]], axis=1)  # (T, 4, n)
                if self.data.anchor:
                    block = block - block[0]
                js.append(c * block.reshape(-1, n))
        r = np.concatenate(rs)
        j = np.concatenate(js) if jacs is not None else None
        return r, j

    def _prior(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, jrows = [], []
        theta = self.to_theta(z)
        for k, name in enumerate(self.names):
            pr = self.params[name].prior
            if pr is None:
                continue
            rows.append(self.prior_scale * (theta[k] - pr.mean) / pr.sigma)
            jr = np.zeros(len(self.names))
            jr[k] = self.prior_scale * self.dtheta_dz(z)[k] / pr.sigma
            jrows.append(jr)
        return np.array(rows), (np.array(jrows) if jrows else np.zeros((0, len(self.names))))

    def evaluate(self, z: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Residuals (and Jacobian d r / d z) at normalised parameters ``z``; cached per ``z``."""
        key = np.asarray(z, float).tobytes()
        if self._cache is not None and self._cache[0] == key and (not jac or self._cache[2] is not None):
            return self._cache[1], self._cache[2]
        poses, jacs = self._simulate(self.theta_dict(z), jac)
        r, j = self._assemble(poses, jacs)
        if j is not None:
            j = j * self.dtheta_dz(z)  # chain rule to z
        pr, pj = self._prior(z)
        r = np.concatenate([r, pr])
        if j is not None:
            j = np.vstack([j, pj])
        self._cache = (key, r, j)
        return r, j

    def loss_and_grad_vjp(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Residuals and d loss / d z through the simulator's adjoint (``rollout_with_vjp``):
        the pose cotangent of ``loss = |r|^2`` is assembled here, the engine pulls it back."""
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
    """Outcome of ``optimize``: identified values, trace, covariance and diagnostics."""

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

    def summary(self) -> dict[str, Any]:
        """JSON-friendly dictionary of everything but the parameter objects."""
        return {
            "names": list(self.names),
            "optimizer": self.optimizer,
            "success": self.success,
            "message": self.message,
            "iterations": self.iterations,
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
        }


def covariance(
    r: np.ndarray, j_theta: np.ndarray, n_data: int, alpha: float = 0.05, rel_eig_tol: float = 1e-12
) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Newton covariance s^2 (J^T J)^+ and t-based half-widths of (1 - alpha) intervals.

    ``s^2 = |r|^2 / (n - p)`` assumes independent residuals of equal variance; odometry errors are
    correlated in time, so treat the intervals as a lower bound on the real uncertainty. Directions
    with eigenvalues below ``rel_eig_tol * max`` are unidentifiable and give infinite variance.
    """
    p = j_theta.shape[1]
    dof = max(n_data - p, 1)
    s2 = float(np.dot(r, r)) / dof
    h = j_theta.T @ j_theta
    lam, v = np.linalg.eigh(h)
    lam_max = max(float(lam.max()), 1e-300)
    inv = np.zeros_like(lam)
    good = lam > rel_eig_tol * lam_max
    inv[good] = 1.0 / lam[good]
    cov = s2 * (v * inv) @ v.T
    bad = ~good
    if bad.any():  # a parameter touched by a null direction has unbounded variance
        touched = (np.abs(v[:, bad]) > 1e-6).any(axis=1)
        cov[touched, :] = np.where(np.eye(p, dtype=bool)[touched], np.inf, cov[touched, :])
    half = np.sqrt(np.clip(np.diag(cov), 0, None)) * scipy.stats.t.ppf(1 - alpha / 2, dof)
    return cov, half


def _diagnostics(res: Residuals, z: np.ndarray, result: FitResult, cond_warn: float, corr_warn: float) -> None:
    """Fill covariance, intervals, conditioning and bound warnings into ``result``."""
    r, jz = res.evaluate(z, jac=True)
    assert jz is not None
    names = res.names
    if not names:
        return
    j_theta = jz / res.dtheta_dz(z)
    cov, half = covariance(r, j_theta, res.n_data)
    theta = res.to_theta(z)
    result.covariance = cov
    result.std = {
        n: float(math.sqrt(cov[k, k])) if np.isfinite(cov[k, k]) else float("inf") for k, n in enumerate(names)
    }
    result.intervals = {n: (float(theta[k] - half[k]), float(theta[k] + half[k])) for k, n in enumerate(names)}
    d = np.sqrt(np.abs(np.diag(cov)))
    with np.errstate(invalid="ignore", divide="ignore"):
        result.correlation = cov / np.outer(d, d)
    # conditioning on the column-normalised Jacobian: independent of units and scaling
    norms = np.linalg.norm(jz, axis=0)
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
        combo = " ".join(f"{'+' if c >= 0 else '-'}{abs(c):.2f}*{n}" for c, n in zip(weak, names) if abs(c) > 0.2)
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
    tol: float = 1e-8,
    cond_warn: float = 1e8,
    corr_warn: float = 0.98,
    progress: Progress | None = None,
) -> FitResult:
    """Fit the free parameters of ``params`` to the runs; returns a ``FitResult``.

    ``optimizer``: ``"lm"`` — bounded trust-region Gauss-Newton / Levenberg-Marquardt
    (scipy ``least_squares(method="trf")``) with the exact residual Jacobian; ``"adam"`` — torch
    Adam on the same loss with gradient ``2 J^T r`` (or one adjoint sweep when the simulator has
    ``rollout_with_vjp``), projected onto the bounds, ``max_iter`` steps of learning rate ``lr``
    in normalised units, decayed to ``lr / 20``. ``dt`` [s] is the simulator timestep.
    ``params`` is not modified; the result carries a copy with the identified values.
    """
    if optimizer not in ("lm", "adam"):
        raise ConfigError(f"unknown optimizer {optimizer!r}; use 'lm' or 'adam'")
    data = runs if isinstance(runs, RunSet) else RunSet.build(runs, windows, weights)
    unknown = [n for n in params.names if n not in sim.parameter_names]
    if unknown:
        raise ConfigError(
            f"parameter(s) {unknown} are not accepted by the simulator; it knows {list(sim.parameter_names)}"
        )
    res = Residuals(sim, data, params, dt, lever_arm=lever_arm, prior_scale=prior_scale)
    z0 = res.to_z(params.free_vector())
    t_start = time.perf_counter()
    trace: list[dict[str, Any]] = []

    def record(z: np.ndarray, r: np.ndarray) -> None:
        entry = {
            "iter": len(trace),
            "loss": res.loss(r),
            "time": time.perf_counter() - t_start,
            "theta": {n: float(v) for n, v in zip(res.names, res.to_theta(z), strict=True)},
        }
        trace.append(entry)
        if progress is not None:
            progress(entry)

    r0, _ = res.evaluate(z0)
    if not np.all(np.isfinite(r0)):
        raise SimulatorError("the simulation diverges at the initial parameters; check nominals and the timestep")
    loss0 = res.loss(r0)
    record(z0, r0)
    success, message, n_iter, z = True, "no free parameters", 0, z0
    if res.names and optimizer == "lm":
        last_key: list[bytes] = []

        def fun(z: np.ndarray) -> np.ndarray:
            r, _ = res.evaluate(z)
            return np.where(np.isfinite(r), r, 1e6)  # trf shrinks its radius on a huge residual

        def jac(z: np.ndarray) -> np.ndarray:
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
            z0,
            jac=jac,
            bounds=(np.zeros_like(z0), np.ones_like(z0)),
            method="trf",
            x_scale="jac",
            ftol=tol,
            xtol=tol,
            gtol=tol,
            max_nfev=max_iter,
            verbose=0,
        )
        z = np.clip(sol.x, 0, 1)
        success, message, n_iter = bool(sol.success), str(sol.message), int(sol.nfev)
        r_final, _ = res.evaluate(z)
        if not trace or trace[-1]["loss"] != res.loss(r_final):
            record(z, r_final)
    elif res.names:
        import torch  # imported here: the LM path does not need it

        zt = torch.tensor(z0, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([zt], lr=lr)
        # decay the step to lr/20 over the run: Adam at a constant rate circles the optimum
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.05 ** (1.0 / max(max_iter, 1)))
        best = (loss0, z0.copy())
        use_vjp = callable(getattr(sim, "rollout_with_vjp", None))
        for _ in range(max_iter):
            z_np = zt.detach().numpy().copy()
            if use_vjp:  # one adjoint sweep per step
                r, grad = res.loss_and_grad_vjp(z_np)
            else:
                r, j = res.evaluate(z_np, jac=True)
                assert j is not None
                grad = 2.0 * j.T @ r
            if not np.all(np.isfinite(r)):
                message = "simulation diverged during Adam; stopped at the best iterate"
                break
            loss = res.loss(r)
            if loss < best[0]:
                best = (loss, z_np.copy())
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
            message = f"completed {max_iter} Adam steps (lr={lr})"
        z = best[1]
        r_final, _ = res.evaluate(z)
        record(z, r_final)
    theta_final = res.to_theta(z)
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
    )
    if res.names:
        _diagnostics(res, z, result, cond_warn, corr_warn)
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
) -> Sweep:
    """Evaluate the runs at each timestep in ``dts`` [s]; a diverging or failing step counts as
    infinite error. The plateau is the largest h whose error stays within ``factor`` x minimum."""
    if not dts:
        raise ConfigError("the timestep sweep needs at least one timestep")
    errors, per_run, walls = [], [], []
    for h in sorted(float(d) for d in dts):
        t0 = time.perf_counter()
        try:
            metrics, _ = evaluate(sim, runs, theta, h, lever_arm=lever_arm, windows=windows)
            errs = [m["combined"] for m in metrics]
        except (SimulatorError, FloatingPointError, ArithmeticError):
            errs = [float("inf")] * len(runs)
        walls.append(time.perf_counter() - t0)
        per_run.append(errs)
        errors.append(float(np.mean(errs)))
        if progress is not None:
            progress(h)
    hs = sorted(float(d) for d in dts)
    plateau = find_plateau(hs, errors, factor)
    return Sweep(hs, errors, per_run, walls, plateau, plateau[1] if plateau else None, factor)
