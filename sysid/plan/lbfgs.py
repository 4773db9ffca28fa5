"""L-BFGS for the planner (`sysid.plan.control.Planner`, ``optimizer="lbfgs"``): every world (trial) on its own,
in lockstep, so that one batched rollout serves every world's evaluation."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def lbfgs_worlds(
    evaluate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    U0: np.ndarray,
    evaluations: int,
    lo: float,
    hi: float,
    first_step: float,
    memory: int = 10,
    armijo: float = 1e-4,
) -> np.ndarray:
    """L-BFGS on every world on its own, in lockstep: one batched evaluation per iteration.

    evaluate(U) -> (loss (W,), gradient like U) for knots U (W, ...); ``evaluations`` is the budget
    (the first evaluation included). Each world keeps its own ``memory`` curvature pairs and its own
    backtracking line search (Armijo condition, coefficient ``armijo``, on the step projected onto
    [lo, hi]): a world whose trial point fails it stays where it is and tries a shorter step at the
    next evaluation (quadratic interpolation, within 0.1-0.5 of the step), one that passes moves
    there, stores the pair if its curvature s . y is positive, and takes the unit step along its new
    quasi-Newton direction next. Without pairs (the start, or after a direction that does not
    descend or a step below 1e-6 of the first) the direction is steepest descent scaled so the knots
    change by ``first_step`` RMS [rad/s]. Worlds never share a line search or curvature pairs, so a
    trial's result does not depend on which other trials run beside it. Returns the last accepted
    knots (the caller's `evaluate` keeps the best)."""
    shape = U0.shape
    W = shape[0]
    x = U0.reshape(W, -1).astype(float)
    n = x.shape[1]
    f, g = evaluate(x.reshape(shape))
    g = np.asarray(g, float).reshape(W, n)
    S = np.zeros((W, memory, n))
    Y = np.zeros((W, memory, n))
    count = np.zeros(W, int)  # pairs stored (the newest at index count - 1, up to memory)
    alpha = np.ones(W)
    d = np.zeros((W, n))

    def direction(w: int) -> np.ndarray:
        k = int(count[w])
        if k == 0:
            gn = float(np.linalg.norm(g[w]))
            return -g[w] * (first_step * math.sqrt(n) / gn) if gn > 0 else np.zeros(n)
        q: np.ndarray = g[w].copy()
        a = np.zeros(k)
        rho = 1.0 / np.einsum("ij,ij->i", S[w, :k], Y[w, :k])
        for i in range(k - 1, -1, -1):
            a[i] = rho[i] * float(S[w, i] @ q)
            q -= a[i] * Y[w, i]
        q *= float(S[w, k - 1] @ Y[w, k - 1]) / float(Y[w, k - 1] @ Y[w, k - 1])
        for i in range(k):
            b = rho[i] * float(Y[w, i] @ q)
            q += (a[i] - b) * S[w, i]
        return -q

    def restart(w: int) -> None:
        """Forget the curvature pairs: the next step is steepest descent."""
        count[w] = 0
        alpha[w] = 1.0
        d[w] = direction(w)

    for w in range(W):
        d[w] = direction(w)
    for _ in range(evaluations - 1):
        xt = np.clip(x + alpha[:, None] * d, lo, hi)
        ft, gt = evaluate(xt.reshape(shape))
        gt = np.asarray(gt, float).reshape(W, n)
        for w in range(W):
            dec = float(g[w] @ (xt[w] - x[w]))  # directional change of the projected step
            if dec >= 0.0 or not np.any(xt[w] != x[w]):
                restart(w)  # not a descent direction
                continue
            if math.isfinite(float(ft[w])) and ft[w] <= f[w] + armijo * dec:
                s_, y_ = xt[w] - x[w], gt[w] - g[w]
                if float(s_ @ y_) > 1e-12 * float(np.linalg.norm(s_) * np.linalg.norm(y_)):
                    if count[w] == memory:
                        S[w, :-1], Y[w, :-1] = S[w, 1:].copy(), Y[w, 1:].copy()
                        count[w] -= 1
                    S[w, count[w]], Y[w, count[w]] = s_, y_
                    count[w] += 1
                x[w], f[w], g[w] = xt[w], ft[w], gt[w]
                alpha[w] = 1.0
                d[w] = direction(w)
            else:
                # shorter step: the minimiser of the quadratic through f, the slope and the trial value
                curv = float(ft[w]) - float(f[w]) - dec if math.isfinite(float(ft[w])) else math.inf
                shrink = -dec / (2.0 * curv) if curv > 0 else 0.1
                alpha[w] *= min(0.5, max(0.1, shrink))
                if alpha[w] < 1e-6:
                    restart(w)
    return x.reshape(shape)
