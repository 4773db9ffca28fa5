"""The Adam optimiser (torch, imported only when it runs): projected Adam on the least-squares loss
in normalised coordinates z in [0, 1], with the gradient ``2 J^T r`` or one adjoint sweep when the
simulator has ``rollout_with_vjp``; the step size decays to ``lr / 20`` over the budget and the
best iterate wins. Adam has no convergence test: it runs its ``max_iter`` steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sysid.errors import optional_import
from sysid.fit.residuals import Residuals
from sysid.fit.trace import Record


@dataclass
class AdamRun:
    """Outcome of ``run_adam``: the best iterate ``z``, the result message, the steps taken and the
    Jacobian evaluations they used."""

    z: np.ndarray
    message: str
    steps: int
    jacobians: int


def run_adam(res: Residuals, z_init: np.ndarray, max_iter: int, lr: float, record: Record,
             trace: Sequence[Mapping[str, Any]]) -> AdamRun:
    """``max_iter`` Adam steps of learning rate ``lr`` (normalised units) from ``z_init``; each
    iterate whose loss differs from the last ``trace`` entry is recorded, and so is the best one at
    the end. Stops early, at the best iterate, where the simulation diverges."""
    torch = optional_import("torch", "adam", "fit.optimizer: adam")  # here: the LM path does not need it

    n_iter, n_jac = 0, 0
    zt = torch.tensor(z_init, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([zt], lr=lr)
    # decay the step to lr/20 over the run: Adam at a constant rate circles the optimum
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.05 ** (1.0 / max(max_iter, 1)))
    best_a = (res.loss(res.evaluate(z_init)[0]), z_init.copy())
    use_vjp = (callable(getattr(res.sim, "rollout_with_vjp", None)) and not res.nuisance and res.loss_kind == "linear"
               and res.horizon is None)  # what loss_and_grad_vjp covers
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
    z = best_a[1]
    r_final, _ = res.evaluate(z)
    record(z, r_final)
    return AdamRun(z, message, n_iter, n_jac)
