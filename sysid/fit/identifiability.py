"""Which free parameters the training runs determine (docs/fit.md, "Identifiability").

Per parameter, from the Fisher information of the residuals (the data-only sandwich covariance of
``sysid.fit.uncertainty``, in the optimiser's normalised coordinates, where each parameter's bound
range is 1, on a log scale for log-scaled parameters), checked by the loss along the parameter's
profile path:

- **determined**: its 95 % interval from these runs is narrower than half its bound range and
  stays inside the bounds;
- **weakly determined**: wider than that, or the interval reaches a bound;
- **not determined**: no effect on the residuals, an interval as wide as the whole bound range, or
  one that reaches both bounds.

The profile check: along the path on which the other parameters follow the parameter as the
covariance says they would re-optimise (``z + s C e_k / C_kk``), the loss is evaluated at both ends
of the interval (or where the path leaves the bounds), all points in one batched rollout, and
compared with the rise the linearised residual predicts there. Where it rises less, the data
determine the parameter less than its information says: that side's half-width is widened by
``sqrt(predicted / actual)`` before the classification (never narrowed). The least-determined
combination is the eigenvector of the normalised covariance with the largest eigenvalue (the
smallest of the normalised Fisher matrix), its dominant parameters those with a squared weight of
at least ``DOMINANT``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sysid.fit.residuals import Residuals
from sysid.fit.uncertainty import covariance_details, interval_dof

DETERMINED, WEAK, NOT_DETERMINED = "determined", "weakly determined", "not determined"
LEVELS = (DETERMINED, WEAK, NOT_DETERMINED)
WEAK_WIDTH = 0.5  # a 95 % interval at least this share of the bound range is weakly determined
NOT_WIDTH = 1.0  # ... at least the whole range: not determined
DOMINANT = 0.01  # squared weight (|c| >= 0.1) with which a parameter dominates the least-determined direction
ROUGHNESS = 1e-3  # relative loss change below which the engine's loss is not smooth (docs/fit.md): no profile verdict


def _worse(a: str, b: str) -> str:
    return a if LEVELS.index(a) >= LEVELS.index(b) else b


def _level(width: float, low_out: bool, high_out: bool) -> str:
    if not math.isfinite(width) or width >= NOT_WIDTH or (low_out and high_out):
        return NOT_DETERMINED
    if width >= WEAK_WIDTH or low_out or high_out:
        return WEAK
    return DETERMINED


def reaches(lo: float, hi: float, lower: float, upper: float, rel_tol: float = 1e-9) -> str | None:
    """Which bounds an interval [lo, hi] reaches or passes: 'lower', 'upper', 'both' or None."""
    tol = rel_tol * (upper - lower)
    low, high = not lo > lower + tol, not hi < upper - tol
    return "both" if low and high else "lower" if low else "upper" if high else None


def interval_text(lo: float | None, hi: float | None, lower: float, upper: float, spec: str = ".4g") -> str:
    """An interval as the data give it, never clipped silently: an end at or past a bound is written
    as the bound followed by ``(bound)``, e.g. ``[0.05 (bound), 1.3]``; a missing end (infinite
    variance) is the bound too."""
    lo_f = -math.inf if lo is None else float(lo)
    hi_f = math.inf if hi is None else float(hi)
    side = reaches(lo_f, hi_f, lower, upper)
    a = f"{format(lower, spec)} (bound)" if side in ("lower", "both") else format(lo_f, spec)
    b = f"{format(upper, spec)} (bound)" if side in ("upper", "both") else format(hi_f, spec)
    return f"[{a}, {b}]"


def _physical_prior_rows(res: Residuals) -> int:
    return sum(res.params[n].prior is not None for n in res.names)


def _weakest(cov_z: np.ndarray, info_z: np.ndarray, t: float, names: tuple[str, ...]) -> dict[str, Any]:
    """The least-determined combination: the normalised covariance's top eigenvector (where it is
    finite), else the null direction of the normalised Fisher matrix."""
    if np.all(np.isfinite(cov_z)):
        lam, vec = np.linalg.eigh(0.5 * (cov_z + cov_z.T))
        v, half = vec[:, -1], t * math.sqrt(max(float(lam[-1]), 0.0))
        lam_info = np.linalg.eigvalsh(info_z)
    else:
        lam_info, vec = np.linalg.eigh(0.5 * (info_z + info_z.T))
        v, half = vec[:, 0], math.inf
    v = v if v[int(np.argmax(np.abs(v)))] >= 0 else -v
    order = np.argsort(-np.abs(v))
    dominant = [names[i] for i in order if v[i] ** 2 >= DOMINANT] or [names[int(order[0])]]
    top = float(lam_info.max()) if len(lam_info) else 0.0
    low = float(lam_info.min()) if len(lam_info) else 0.0
    return {
        "direction": {n: float(c) for n, c in zip(names, v, strict=True)},
        "dominant": dominant,
        "half_width": half,
        "condition_number": top / low if low > 0 else math.inf,
    }


def combination_text(weakest: dict[str, Any], threshold: float = 0.1) -> str:
    """The least-determined direction as ``+0.71*kp -0.70*chassis_mass`` (components above ``threshold``)."""
    d = {n: c for n, c in weakest["direction"].items() if c is not None and math.isfinite(c)}  # null: NaN in JSON
    return " ".join(f"{'+' if c >= 0 else '-'}{abs(c):.2f}*{n}" for n, c in d.items() if abs(c) > threshold)


def assess(
    res: Residuals,
    z: np.ndarray,
    r: np.ndarray,
    jz: np.ndarray,
    interval: np.ndarray,
    alpha: float,
    method: str,
    profile: bool = True,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Per free physical parameter its identifiability record, and the least-determined combination.

    ``r``, ``jz``: residuals and their Jacobian d r / d z at the estimate ``z``; ``interval``:
    (p, 2) the physical parameters' reported intervals, unclipped (priors included; infinite ends
    where the variance is). The classification uses the data alone: a parameter's own prior row is left
    out (the nuisance parameters' priors stay: they are part of the model of the data), so a
    parameter held only by its prior reads "not determined by these runs" with ``prior`` true.
    Each record: ``status``, ``reason``, ``prior``, ``interval`` (the reported one, unclipped:
    its ends may lie past the bounds, None where the variance is infinite), ``reaches`` (the
    bounds the interval reaches: 'lower', 'upper', 'both' or None), ``width`` (the data's 95 %
    interval as a share of the bound range, profile-corrected), ``profile`` (per side: the
    parameter's value at the end of the path, ``fraction`` of the interval's half-width the path
    went before it met a bound, the data loss's actual and linearly predicted rise [m^2], and
    ``ratio``: the actual rise's curvature part (the gradient's linear part taken off) over the
    Fisher information's prediction; None without a profile)."""
    p, n_data = res.n_free, res.n_data
    names = res.names[:p]
    k_prior = _physical_prior_rows(res)
    keep = np.r_[np.arange(n_data), np.arange(n_data + k_prior, len(r))]
    rk, jk = r[keep], jz[keep]
    clusters = list(res.run_clusters().values())
    cov_all, half_all, _taus, n_eff = covariance_details(rk, jk, n_data, alpha, 1e-12, res.run_slices(), method,
                                                         res.prior_scale, clusters)
    cov_z, hz = cov_all[:p, :p], half_all[:p]
    import scipy.stats  # type: ignore[import-untyped, unused-ignore]

    t = float(scipy.stats.t.ppf(1 - alpha / 2, interval_dof(method, n_eff, p, len(clusters))))
    # the physical block of the Fisher matrix, marginal over the nuisance (Schur complement)
    a = jk.T @ jk
    info_z = a[:p, :p]
    if a.shape[0] > p:
        a_nn = a[p:, p:]
        info_z = info_z - a[:p, p:] @ np.linalg.pinv(a_nn) @ a[p:, :p]
    zp = np.asarray(z[:p], float)
    norms = np.linalg.norm(jz[:n_data, :p], axis=0)
    rd = r[:n_data]
    loss_d = float(rd @ rd)

    # profile points: per parameter with a finite variance, both ends of its interval along its path
    points: list[np.ndarray] = []
    where: list[tuple[int, str, float, np.ndarray]] = []
    if profile:
        for k in range(p):
            if not (math.isfinite(hz[k]) and hz[k] > 0 and np.all(np.isfinite(cov_z[:, k])) and cov_z[k, k] > 0):
                continue
            path = hz[k] * cov_z[:, k] / cov_z[k, k]
            for side, sign in (("lower", -1.0), ("upper", 1.0)):
                step = sign * path
                with np.errstate(divide="ignore", invalid="ignore"):
                    room = np.where(step > 0, (1.0 - zp) / step, np.where(step < 0, -zp / step, np.inf))
                s = float(min(1.0, np.min(room)))
                if s <= 1e-9:
                    continue
                zq = np.array(z, float)
                zq[:p] = np.clip(zp + s * step, 0.0, 1.0)
                points.append(zq)
                where.append((k, side, s, zq))
    rises: dict[tuple[int, str], dict[str, Any]] = {}
    if points:
        got = res.evaluate_many(np.array(points))
        jd = jz[:n_data, :p]
        for (k, side, s, zq), rq in zip(where, got, strict=True):
            step_r = jd @ (zq[:p] - zp)
            actual = float(rq[:n_data] @ rq[:n_data]) - loss_d if np.all(np.isfinite(rq)) else math.inf
            slope = 2 * float(rd @ step_r)  # the gradient's part: nonzero where LM stopped short of the minimum
            predicted = float(step_r @ step_r)  # the Fisher information's: the curvature part
            rises[(k, side)] = {
                "value": float(res.to_theta(zq)[k]),
                "fraction": s,
                "rise": actual,
                "predicted": slope + predicted,
                "curvature": predicted,
                "ratio": (actual - slope) / predicted if predicted > 0 else None,
            }

    out: dict[str, dict[str, Any]] = {}
    for k, n in enumerate(names):
        par = res.params[n]
        has_prior = par.prior is not None
        lo_t, hi_t = float(interval[k, 0]), float(interval[k, 1])
        side_reached = reaches(lo_t, hi_t, par.lower, par.upper)
        prof = {side: rises[(k, side)] for side in ("lower", "upper") if (k, side) in rises} or None
        if norms[k] == 0:
            status, reason, width = NOT_DETERMINED, "no effect on the residuals (zero Jacobian column)", math.inf
        else:
            half_lo = half_hi = float(hz[k])
            widened = []
            for side in ("lower", "upper"):
                pr = (prof or {}).get(side)
                if pr is None or pr["ratio"] is None:
                    continue
                if pr["curvature"] <= ROUGHNESS * loss_d:
                    continue  # below the loss's roughness: no verdict
                ratio = pr["ratio"]
                if ratio < 1.0:
                    grow = math.inf if ratio <= 0 else 1.0 / math.sqrt(ratio)
                    if side == "lower":
                        half_lo *= grow
                    else:
                        half_hi *= grow
                    widened.append(f"{side} {max(ratio, 0.0):.0%}")
            width = half_lo + half_hi
            low_out, high_out = zp[k] - half_lo <= 1e-9, zp[k] + half_hi >= 1 - 1e-9
            status = _level(width, low_out, high_out)
            fisher = _level(2 * float(hz[k]), zp[k] - hz[k] <= 1e-9, zp[k] + hz[k] >= 1 - 1e-9)
            bits = []
            scale = " (log scale)" if par.log_scale else ""
            if not math.isfinite(width):
                bits.append("the runs' 95 % interval is unbounded")
            elif width >= 1:
                bits.append(f"the runs' 95 % interval spans {width:.3g}x its bound range{scale}")
            else:
                bits.append(f"the runs' 95 % interval spans {width:.0%} of its bound range{scale}")
            edge = {(True, True): "both bounds", (True, False): "the lower bound", (False, True): "the upper bound"}
            if low_out or high_out:
                bits.append(f"reaches {edge[(low_out, high_out)]}")
            if widened and status != fisher:
                bits.append("the loss along its profile rises less than its Fisher information predicts "
                            f"({', '.join(widened)} of the predicted rise)")
            reason = "; ".join(bits)
        if has_prior and status != DETERMINED:
            assert par.prior is not None
            reason += f"; held by its prior N({par.prior.mean:.4g}, {par.prior.sigma:.4g}^2)"
        out[n] = {
            "status": status,
            "reason": reason,
            "prior": has_prior,
            "interval": [lo_t, hi_t],
            "reaches": side_reached,
            "width": width,
            "profile": prof,
        }
    weakest = _weakest(cov_z, info_z, t, names) if p else None
    return out, weakest
