"""`sysid.plan.control.lbfgs_worlds`: L-BFGS run on every world on its own, in lockstep.

Closed forms: a convex quadratic's minimiser x* = A^-1 b, the Rosenbrock function's minimum (1, 1);
independence: a world's iterates do not depend on the worlds beside it (the reason it replaced
scipy's L-BFGS-B on the summed loss, whose shared line search coupled the trials)."""

from __future__ import annotations

import numpy as np

from sysid.plan.control import lbfgs_worlds


def rosenbrock(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f = (1 - x)^2 + 100 (y - x^2)^2 per world; X (W, 1, 2)."""
    x, y = X[:, 0, 0], X[:, 0, 1]
    f = (1 - x) ** 2 + 100 * (y - x**2) ** 2
    g = np.stack([-2 * (1 - x) - 400 * x * (y - x**2), 200 * (y - x**2)], axis=-1)[:, None, :]
    return f, g


def recorder(fun, log: list):
    def evaluate(U: np.ndarray):
        log.append(U.copy())
        return fun(U)

    return evaluate


def test_quadratics_reach_their_minimisers() -> None:
    """Three worlds, each f_w(x) = 1/2 x.A_w x - b_w.x in 6 dimensions with condition numbers 1, 1e2, 1e4:
    within 40 evaluations every world is within 1e-6 (relative) of A_w^-1 b_w."""
    rng = np.random.default_rng(0)
    A, b = [], []
    for cond in (1.0, 1e2, 1e4):
        Q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
        A.append(Q @ np.diag(np.geomspace(1.0, cond, 6)) @ Q.T)
        b.append(rng.normal(size=6))
    A, b = np.array(A), np.array(b)

    def fun(U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = U.reshape(3, 6)
        Ax = np.einsum("wij,wj->wi", A, x)
        return 0.5 * np.einsum("wi,wi->w", x, Ax) - np.einsum("wi,wi->w", b, x), (Ax - b).reshape(U.shape)

    log: list = []
    lbfgs_worlds(recorder(fun, log), np.zeros((3, 2, 3)), 40, -1e9, 1e9, first_step=1.0)
    x_star = np.linalg.solve(A, b[..., None])[..., 0]
    f_star = fun(x_star.reshape(3, 2, 3))[0]
    best = np.array([min(range(len(log)), key=lambda i: fun(log[i])[0][w]) for w in range(3)])
    err = [np.linalg.norm(log[best[w]][w].ravel() - x_star[w]) / np.linalg.norm(x_star[w]) for w in range(3)]
    print(f"\nquadratics, cond 1 / 1e2 / 1e4: relative error {np.array2string(np.array(err), precision=1)} "
          f"after {len(log)} evaluations, f - f* {[float(fun(log[best[w]])[0][w] - f_star[w]) for w in range(3)]}")
    assert len(log) == 40
    assert max(err) <= 1e-6, err


def test_rosenbrock_and_world_independence() -> None:
    """Rosenbrock from (-1.2, 1) reaches (1, 1) within 1e-4 in 100 evaluations; and world 0's iterates
    are the same whether it runs alone or beside two other worlds (other starts), bit for bit."""
    starts = np.array([[-1.2, 1.0], [0.5, -0.5], [2.0, 2.5]])[:, None, :]
    together: list = []
    lbfgs_worlds(recorder(rosenbrock, together), starts.copy(), 100, -5.0, 5.0, first_step=0.3)
    alone: list = []
    lbfgs_worlds(recorder(rosenbrock, alone), starts[:1].copy(), 100, -5.0, 5.0, first_step=0.3)
    best = [min(together, key=lambda U: rosenbrock(U)[0][w])[w, 0] for w in range(3)]
    print(f"\nRosenbrock: best points {np.array2string(np.array(best), precision=6)}")
    for p in best:
        assert np.abs(p - 1.0).max() <= 1e-4, p
    assert all(np.array_equal(a[0], t[0]) for a, t in zip(alone, together))


def test_bounds_hold() -> None:
    """A minimiser outside the box [-1, 1]: every evaluated point stays inside, and the best is the
    projection of the minimiser (f = |x - (3, -0.5)|^2: x* = (1, -0.5))."""

    def fun(U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = U - np.array([3.0, -0.5])
        return np.sum(d**2, axis=(1, 2)), 2 * d

    log: list = []
    lbfgs_worlds(recorder(fun, log), np.zeros((1, 1, 2)), 30, -1.0, 1.0, first_step=0.5)
    assert all(np.abs(U).max() <= 1.0 for U in log)
    best = min(log, key=lambda U: fun(U)[0][0])
    assert np.allclose(best[0, 0], [1.0, -0.5], atol=1e-6), best
