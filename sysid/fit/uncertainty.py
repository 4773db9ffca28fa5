"""Uncertainty of an identified estimate: residual autocorrelation times and the sandwich covariance
with its (1 - alpha) confidence intervals (``FitOptions.intervals``; docs/fit.md, "Convergence,
starts and intervals"), and the runs' jackknife: how far leaving out each run moves the estimate
(``run_shifts``; ``intervals="runs"`` takes the covariance from their spread)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.stats  # type: ignore[import-untyped, unused-ignore]

from sysid.errors import ConfigError

# the fewest training runs (pieces of one run count as one) for the runs' jackknife: with fewer, leaving
# one out changes the fit too much for one Gauss-Newton step to say where it goes (on the 3 real Helhest
# runs the one-step estimates without a run score that run 2-10x worse than the refits; on 12 Husky runs
# the step and the refit agree on the parameter that moves most), and the t quantile (n - 1 degrees of
# freedom) makes the intervals wide
JACKKNIFE_RUNS = 5


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


def run_shifts(r: np.ndarray, j_theta: np.ndarray, n_data: int, clusters: Sequence[Sequence[slice]],
               rel_eig_tol: float = 1e-12) -> np.ndarray:
    """(n, p) how far the estimate moves [theta units] when cluster i (a run: its residual rows
    ``clusters[i]``) is left out, by one Gauss-Newton step from the estimate: at the minimum of
    ``|r|^2`` the runs' gradients ``J_i^T r_i`` and the priors' sum to zero, so without run i the
    minimum moves by ``(A - J_i^T J_i)^-1 J_i^T r_i``, ``A = J^T J`` (priors included). Directions
    the remaining rows do not determine (eigenvalues below ``rel_eig_tol`` of the largest) do not move."""
    r = np.asarray(r, float)
    j_theta = np.asarray(j_theta, float)
    h = j_theta.T @ j_theta
    out = np.zeros((len(clusters), j_theta.shape[1]))
    for i, spans in enumerate(clusters):
        rows = np.concatenate([np.arange(b.start, b.stop) for b in spans]) if spans else np.empty(0, int)
        rows = rows[rows < n_data]
        ji, ri = j_theta[rows], r[rows]
        lam, vec = np.linalg.eigh(h - ji.T @ ji)
        good = lam > rel_eig_tol * max(float(lam.max()), 1e-300)
        out[i] = (vec[:, good] / lam[good]) @ (vec[:, good].T @ (ji.T @ ri))
    return out


def jackknife_covariance(shifts: np.ndarray) -> np.ndarray:
    """The jackknife covariance (n - 1) / n sum_i (d_i - mean)(d_i - mean)^T of the estimate from its
    ``shifts`` (`run_shifts`, one row per run left out)."""
    n = len(shifts)
    d = np.asarray(shifts, float) - np.mean(shifts, axis=0)
    cov: np.ndarray = (n - 1) / n * (d.T @ d)
    return cov


def beyond_interval(shift: float, value: float, lower: float, upper: float) -> bool:
    """Whether moving ``value`` by ``shift`` leaves its interval [``lower``, ``upper``] (a run's shift,
    `run_shifts`, past the parameter's reported interval)."""
    return shift > upper - value if shift > 0 else -shift > value - lower


def interval_dof(method: str, n_eff: float, p: int, clusters: int) -> float:
    """Degrees of freedom of the intervals' t quantile: ``n_eff - p`` (``ess``, ``iid``); ``clusters - 1``
    for the runs' jackknife (``runs``)."""
    return float(max(clusters - 1, 1)) if method == "runs" else max(n_eff - p, 1.0)


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
    clusters: Sequence[Sequence[int]] | None = None,
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

    ``method="runs"``: the runs' jackknife instead (`run_shifts`, `jackknife_covariance`): the spread
    of the estimates that leaving out one run at a time gives, which holds what the runs disagree
    about beyond their noise (a model class that fits some runs better than others) where the
    sandwich sees only the noise about one model; ``clusters`` groups the blocks into runs (indices
    into ``blocks``; default one run per block: pieces of one run belong together). t quantile with
    runs - 1 degrees of freedom. Needs at least `JACKKNIFE_RUNS` runs.
    """
    cov, half, _taus, _n_eff = covariance_details(r, j_theta, n_data, alpha, rel_eig_tol, blocks, method, prior_scale,
                                                  clusters)
    return cov, half


def covariance_details(
    r: np.ndarray,
    j_theta: np.ndarray,
    n_data: int,
    alpha: float,
    rel_eig_tol: float,
    blocks: Sequence[slice] | None,
    method: str,
    prior_scale: float,
    clusters: Sequence[Sequence[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[float], float]:
    """``covariance`` with its by-products: (covariance, half-widths, each block's autocorrelation
    time [samples], n_eff)."""
    r = np.asarray(r, float)
    j_theta = np.asarray(j_theta, float)
    p = j_theta.shape[1]
    spans = list(blocks) if blocks else [slice(0, n_data)]
    jd, rd = j_theta[:n_data], r[:n_data]
    jp = j_theta[n_data:]
    if method == "runs":
        groups = [[spans[k] for k in c] for c in clusters] if clusters is not None else [[b] for b in spans]
        groups = [g for g in groups if any(b.stop > b.start for b in g)]
        if len(groups) < JACKKNIFE_RUNS:
            raise ConfigError(f"the runs' jackknife (fit.intervals: runs) needs at least {JACKKNIFE_RUNS} training "
                              f"runs, got {len(groups)}; use fit.intervals: ess")
    spans = [b for b in spans if b.stop > b.start]
    taus = [run_tau(rd[b]) if method in ("ess", "runs") else 1.0 for b in spans]
    n_eff = float(sum((b.stop - b.start) / t for b, t in zip(spans, taus, strict=True)))
    # the fit absorbs p of the n_eff independent residuals: their mean square is low by (n_eff - p) / n_eff
    dof_corr = n_eff / max(n_eff - p, 1.0)
    pooled = float(np.dot(rd, rd)) / max(n_data - p, 1)
    meat = np.zeros((p, p))
    for b, tau in zip(spans, taus, strict=True):
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
    if method == "runs":
        cov = jackknife_covariance(run_shifts(r, j_theta, n_data, groups, rel_eig_tol))
    cov = 0.5 * (cov + cov.T)
    bad = ~good
    if bad.any():  # a parameter touched by a null direction has unbounded variance
        touched = (np.abs(vec[:, bad]) > 1e-6).any(axis=1)
        cov[touched, :] = np.where(np.eye(p, dtype=bool)[touched], np.inf, cov[touched, :])
    dof = interval_dof(method, n_eff, p, len(groups) if method == "runs" else 0)
    half = np.sqrt(np.clip(np.diag(cov), 0, None)) * scipy.stats.t.ppf(1 - alpha / 2, dof)
    return cov, half, taus, n_eff
