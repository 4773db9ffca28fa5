"""Uncertainty of an identified estimate: residual autocorrelation times and the sandwich covariance
with its (1 - alpha) confidence intervals (``FitOptions.intervals``; docs/fit.md, "Convergence,
starts and intervals")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.stats  # type: ignore[import-untyped, unused-ignore]


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
    cov, half, _taus, _n_eff = covariance_details(r, j_theta, n_data, alpha, rel_eig_tol, blocks, method, prior_scale)
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
) -> tuple[np.ndarray, np.ndarray, list[float], float]:
    """``covariance`` with its by-products: (covariance, half-widths, each block's autocorrelation
    time [samples], n_eff)."""
    r = np.asarray(r, float)
    j_theta = np.asarray(j_theta, float)
    p = j_theta.shape[1]
    spans = list(blocks) if blocks else [slice(0, n_data)]
    jd, rd = j_theta[:n_data], r[:n_data]
    jp = j_theta[n_data:]
    spans = [b for b in spans if b.stop > b.start]
    taus = [run_tau(rd[b]) if method == "ess" else 1.0 for b in spans]
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
    cov = 0.5 * (cov + cov.T)
    bad = ~good
    if bad.any():  # a parameter touched by a null direction has unbounded variance
        touched = (np.abs(vec[:, bad]) > 1e-6).any(axis=1)
        cov[touched, :] = np.where(np.eye(p, dtype=bool)[touched], np.inf, cov[touched, :])
    dof = max(n_eff - p, 1.0)
    half = np.sqrt(np.clip(np.diag(cov), 0, None)) * scipy.stats.t.ppf(1 - alpha / 2, dof)
    return cov, half, taus, n_eff
