"""Residuals of the identification: the runs prepared for simulation (``RunSet``) and the residual
vector with its Jacobian (``Residuals``), plus the per-run nuisance parameters they may carry.

The objective is the paper's (Ostrich §IV-A) combined error, summed over the training runs:

    loss(theta) = sum_i w_i * E_i(theta)^2,   E_i^2 = mean_t |dp|^2 + (L * RMSE(dyaw))^2,

written as a least-squares residual vector ``r`` with, per run and odometry sample,
``sqrt(w_i / T_i) * (dx, dy, dz, L * dyaw)`` [m], so that ``sum r^2 = loss``. Its Jacobian
``dr/dtheta`` comes from the simulator's pose sensitivities (chain rule through yaw(q)). All
training runs go to the simulator in one call (parallel worlds). Optimisation runs in normalised
coordinates ``z = (theta - lower) / (upper - lower)`` in [0, 1] (or in log(theta) for log-scaled
parameters) so one step size fits all units.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ingest.transforms import quat_yaw
from sysid.errors import ConfigError, SimulatorError
from sysid.fit.metrics import LEVER_ARM, wrap_angle
from sysid.fit.params import ParameterSet, Prior
from sysid.simulators.protocol import Simulator, rollout_many

if TYPE_CHECKING:
    from ingest.run import Run

# a run's scoring window (t0, t1) [s] in the run's clock; None scores the whole run
Window = tuple[float, float] | None


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



def measured_poses(run: Run) -> np.ndarray:
    """Odometry of a run as (T, 8) pose rows: t, x, y, z, qx, qy, qz, qw."""
    # np.asarray, not DataFrame.to_numpy: the latter is typed Any in some pandas releases.
    return np.asarray(run.odom[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]], dtype=float)


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


def reference_indices(t: np.ndarray, horizon: float) -> np.ndarray:
    """Per sample at times ``t`` [s] (ascending), the index of its reference for a relative-pose
    error over ``horizon`` [s]: the latest sample at or before t - horizon, the first where none is."""
    j = np.searchsorted(t, t - horizon + 1e-9, side="right") - 1
    return np.maximum(j, 0)


def _planar_frame(p: np.ndarray, yaw: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Displacements p - p[ref] (T, 3) with x, y in the frame of the reference's heading."""
    d = p - p[ref]
    c, s = np.cos(yaw[ref]), np.sin(yaw[ref])
    return np.column_stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1], d[:, 2]])


def _relative_error(pose: np.ndarray, meas: np.ndarray, dyaw: np.ndarray, ref: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The relative-pose error over each sample's reference (``reference_indices``): the simulated
    displacement since the reference in the simulated reference's heading frame minus the odometry's in
    its own, and the heading change's error. Also returns (the simulated local displacement, the
    reference's heading's cos/sin stacked) for ``_relative_jacobian``."""
    ys, ym = quat_yaw(pose[:, 4:8]), quat_yaw(meas[:, 4:8])
    ls = _planar_frame(pose[:, 1:4], ys, ref)
    lm = _planar_frame(meas[:, 1:4], ym, ref)
    cs = np.column_stack([np.cos(ys[ref]), np.sin(ys[ref])])
    return ls - lm, wrap_angle(dyaw - dyaw[ref]), (ls, cs)


def _relative_jacobian(jpos: np.ndarray, jyaw: np.ndarray, ref: np.ndarray, turn: tuple[np.ndarray, np.ndarray]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """d (relative error) / d theta from the absolute d(x, y, z) / d theta (T, 3, n) and d yaw / d theta
    (T, n): the displacement's derivative rotated into the reference's frame plus the frame's own turn
    with the reference's yaw."""
    ls, cs = turn
    d = jpos - jpos[ref]
    c, s = cs[:, 0:1], cs[:, 1:2]
    dyaw_ref = jyaw[ref]
    out = d.copy()
    out[:, 0] = c * d[:, 0] + s * d[:, 1] + ls[:, 1:2] * dyaw_ref
    out[:, 1] = -s * d[:, 0] + c * d[:, 1] - ls[:, 0:1] * dyaw_ref
    return out, jyaw - dyaw_ref


def _yaw_jacobian(q: np.ndarray, dq: np.ndarray) -> np.ndarray:
    """d yaw / d theta from quaternions (T, 4) and their sensitivities (T, 4, n)."""
    qx, qy, qz, qw = (q[:, i : i + 1] for i in range(4))
    a = 2 * (qw * qz + qx * qy)
    b = 1 - 2 * (qy * qy + qz * qz)
    da = 2 * (qz * dq[:, 3] + qw * dq[:, 2] + qy * dq[:, 0] + qx * dq[:, 1])
    db = -4 * (qy * dq[:, 1] + qz * dq[:, 2])
    dyaw: np.ndarray = (b * da - a * db) / (a * a + b * b)
    return dyaw



@dataclass
class RunSet:
    """Runs prepared for simulation: each cut to end at its scoring window, with a sample mask.

    The simulated run always starts at the run's first odometry sample (open loop from rest);
    only samples with ``t0 <= t <= t1`` of its window are scored. ``weights`` multiply each run's
    squared combined error in the loss. With ``anchor`` the residual compares displacements since
    each window's first sample (position and yaw), which removes the offset that the transient
    before the window leaves: used to calibrate a speed scale on a steady cruise.
    """

    runs: list[Run]
    masks: list[np.ndarray]
    measured: list[np.ndarray]
    weights: np.ndarray
    names: list[str]
    anchor: bool = False
    origins: list[np.ndarray] | None = None  # first odometry position (x, y, z) of each run [m]

    @classmethod
    def build(
        cls,
        runs: Sequence[Run],
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
        horizon: float | None = None,
    ):
        self.sim, self.data, self.params, self.dt = sim, data, params, float(dt)
        self.loss_kind, self.loss_scale = loss, float(loss_scale)
        if horizon is not None and data.anchor:
            raise ConfigError("a relative-pose horizon and anchored windows exclude each other; give one")
        self.horizon = None if horizon is None else float(horizon)
        # per run, each scored sample's reference: the sample `horizon` seconds before it
        self._ref = None if horizon is None else [reference_indices(m[:, 0], float(horizon)) for m in data.measured]
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
    def _simulate(self, z: np.ndarray, jac: bool) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
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

    def _assemble(self, poses: Sequence[np.ndarray], jacs: Sequence[np.ndarray] | None
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        rs, js = [], []
        p, m = self.n_free, len(self.nuisance)
        n = p + m
        turn: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 3)), np.zeros((0, 2)))
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
            if self._ref is not None:
                dp, dyaw, turn = _relative_error(pose, meas, dyaw, self._ref[i])
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
                jpos = jp[:, 0:3]
                if self._ref is not None:
                    jpos, jy = _relative_jacobian(jpos, jy, self._ref[i], turn)
                block = np.concatenate([jpos, self.lever_arm * jy[:, None, :]], axis=1)  # (T, 4, n)
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

    def seed_cache(self, z: np.ndarray, r: np.ndarray) -> None:
        """Take ``r`` as the residuals at ``z`` (computed elsewhere, e.g. by the driver of a Ray task),
        so that ``evaluate(z)`` costs no rollout."""
        self._cache = (np.asarray(z, float).tobytes(), r, None)

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

    def run_clusters(self) -> dict[str, list[int]]:
        """The runs' blocks (`run_slices`) grouped by the logged run they come from, by its name: the
        pieces of one run (``data.split``, ``meta['split_of']``) form one group, in order of first
        appearance."""
        groups: dict[str, list[int]] = {}
        for i, run in enumerate(self.data.runs):
            groups.setdefault(str((run.meta or {}).get("split_of", run.name)), []).append(i)
        return groups

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
        if self.horizon is not None:
            raise ConfigError("the adjoint gradient does not cover a relative-pose horizon; use the Jacobian path")
        t0 = time.perf_counter()
        # an optional capability beyond the Simulator protocol (the engine's adjoint)
        poses, vjp = cast(Any, self.sim).rollout_with_vjp(self.data.runs, self.theta_dict(z), self.dt, self.names)
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

