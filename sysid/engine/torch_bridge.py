"""torch.autograd bridge: a rollout as a differentiable torch function, so losses and optimizers
(Adam, LBFGS) are plain torch code. Gradients come from the engine's adjoint (`Simulation.backward`)
of each call's own rollout (its `Tape`): several rollouts of one Simulation in one graph, or a
parameter change between a rollout and ``loss.backward()``, differentiate each rollout as it ran.

    sim = Simulation(solver, dt=0.1); sim.register_parameter("mu", "shape_mu", wheel_shapes)
    theta = torch.tensor([0.8], requires_grad=True)
    Q, QD = rollout(sim, q0, qd0, targets, theta, names=["mu"])
    loss = ((Q[-1, chassis, :2] - goal) ** 2).sum(); loss.backward()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sysid.errors import optional_import

optional_import("torch", "adam", "sysid.engine.torch_bridge")  # a clear error when the extra is missing
import torch  # noqa: E402

from .errors import ParameterError  # noqa: E402
from .simulation import Simulation  # noqa: E402


def _theta_layout(sim: Simulation, names: Sequence[str]) -> list[tuple[str, int]]:
    return [(n, sim.solver.world_count if sim._spec(n).per_world else 1) for n in names]


class RolloutFunction(torch.autograd.Function):
    """forward(sim, names, body_q0, body_qd0, targets_qd, theta) -> (body_q (T+1, nb, 7), body_qd (T+1, nb, 6))."""

    @staticmethod
    def forward(ctx: Any, sim: Simulation, names: tuple[str, ...], body_q0: torch.Tensor, body_qd0: torch.Tensor,
                targets_qd: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layout = _theta_layout(sim, names)
        values = theta.detach().cpu().double().numpy()
        if values.size != sum(k for _, k in layout):
            raise ParameterError(f"theta has {values.size} entries; parameters {list(names)} need "
                                 f"{sum(k for _, k in layout)} (per-world parameters take one per world)")
        off = 0
        setv = {}
        for n, k in layout:
            setv[n] = values[off: off + k] if k > 1 else float(values[off])
            off += k
        sim.set_parameters(setv)
        tq = targets_qd.detach().cpu().numpy()
        res = sim.forward(body_q0.detach().cpu().numpy(), body_qd0.detach().cpu().numpy(), tq.shape[0], tq)
        Q, QD = res
        ctx.sim = sim
        ctx.tape = res.tape  # this call's rollout: later rollouts on the same sim do not change its gradient
        ctx.layout = layout
        ctx.dtype = theta.dtype
        return torch.from_numpy(Q), torch.from_numpy(QD)

    @staticmethod
    def backward(ctx: Any, gQ: torch.Tensor | None, gQD: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        sim: Simulation = ctx.sim
        g = sim.backward(None if gQ is None else gQ.detach().cpu().numpy(),
                         None if gQD is None else gQD.detach().cpu().numpy(), tape=ctx.tape)
        ctx.tape = None  # torch calls backward once per graph (retain_graph aside); free the records
        theta_grad = np.concatenate([np.atleast_1d(g.params[n]).astype(np.float64) for n, _ in ctx.layout]) \
            if ctx.layout else np.zeros(0)
        tqd = g.targets_qd if g.targets_qd is not None else None
        return (None, None, torch.from_numpy(g.body_q0), torch.from_numpy(g.body_qd0),
                None if tqd is None else torch.from_numpy(tqd), torch.from_numpy(theta_grad).to(ctx.dtype))


def rollout(sim: Simulation, body_q0: np.ndarray | torch.Tensor, body_qd0: np.ndarray | torch.Tensor,
            targets_qd: np.ndarray | torch.Tensor, theta: torch.Tensor | None = None,
            names: Sequence[str] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable open-loop rollout of ``targets_qd.shape[0]`` steps.

    body_q0 (nb, 7), body_qd0 (nb, 6), targets_qd (T, joint_dof_count) [rad/s], theta: 1-D tensor
    of the named parameters' values in ``names`` order (one per world for per-world ones).
    """

    def as_t(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, np.float32))

    theta = torch.zeros(0, dtype=torch.float64) if theta is None else theta
    out: tuple[torch.Tensor, torch.Tensor] = RolloutFunction.apply(
        sim, tuple(names), as_t(body_q0).float(), as_t(body_qd0).float(), as_t(targets_qd).float(), theta)
    return out
