"""Krylov solves of the adjoint system (dr/ds)^T w = b of a converged step.

`DeviceKrylov` is SolverOptions.adjoint_solver="krylov": a restarted GMRES per world on the device, its operator
the residual's VJP sweeps (record.Residual.sweep), preconditioned by the step's Schur solve (adjoint.precond_kernels)
and checked against the true residual after every cycle; its launches are recorded into the backward's replays
(backward.py). `gmres` is the host GMRES of adjoint_solver="gmres" (a reference: one step at a time, host reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from . import adjoint as adj
from . import linsolve as ls
from . import linsolve_kernels as lk
from .errors import EngineError
from .linsolve_kernels import write_seed_from
from .types import StepData, make, repacked

if TYPE_CHECKING:
    from .simulation import Simulation


class DeviceKrylov:
    """The Krylov adjoint's work arrays (`ls.Krylov`), its preconditioner's recorded launches and its solve's
    launches."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.solver = sim.solver
        self.model = sim.model
        self.residual = sim._residual
        self._ws: ls.Krylov | None = None
        self.serial = 0  # counts the work arrays' rebuilds (a recording of older arrays is stale)
        self._precond_cmds: tuple[Any, Any] | None = None  # ((h, options), (factor, apply))

    def work(self) -> ls.Krylov:
        """The work arrays for the current options (new ones when its sizes changed)."""
        sv, o = self.solver, self.solver.options
        K = self._ws
        width = sv._lane_width()
        if K is None or (K.m, K.cycles, K.dm, K.width) != (o.adjoint_krylov_iters, o.adjoint_krylov_cycles,
                                                           o.direct_max_rows, width):
            K = ls.Krylov(self.model.device, sv.world_count, self.residual.system.nu + sv.max_rows,
                          o.adjoint_krylov_iters, o.adjoint_krylov_cycles, sv.max_rows, o.direct_max_rows, width)
            self._ws = K
            self.serial += 1
            self._precond_cmds = None
        return K

    def precond(self) -> tuple[Any, Any]:
        """The preconditioner's launches, recorded once per step size and options: (factor at the loaded step,
        apply to the workspace's y_u / y_lam -> p_u / p_lam)."""
        sv, o, d, h = self.solver, self.solver.options, self.model.device, self.sim.dt
        key = (h, o.version, self.serial)
        if self._precond_cmds is None or self._precond_cmds[0] != key:
            ws, K = self.residual.workspace, self.work()
            data = make(StepData, x_prev=ws.x_prev, q_prev=ws.q_prev, u_prev=sv.u_prev, inv_m=sv.inv_m,
                        I_w=sv.I_w, inv_I=sv.inv_I, f_imp=sv.f_imp, jt_q=ws.jt_q, jt_qd=ws.jt_qd,
                        j_qprev=ws.j_qprev)
            # the preconditioner's Schur solves: its row part into the workspace's p_lam, K's dense factors
            scr = repacked(sv.schur_scratch, x=ws.p_lam, dm=K.dm, S=K.S, y64=K.y64, perm=K.perm, env=K.env)
            sc = sv._step_constants(h)
            lanes = sv._lanes()
            ln = sv._lane_scratch(lanes, K.dm)
            tg = sv._thread_groups()
            precond_factor, precond_apply = adj.precond_kernels(K.width)  # the width of K's lanes' factors
            factor = wp.launch(precond_factor, sv._group_threads(lanes),
                               inputs=[sc, sv.model_arrays, data, sv.contact_slots, self.residual.at_converged()],
                               outputs=[K.nrows, K.direct, sv.rows, scr, lanes, tg, ln, K.S_lanes],
                               device=d, record_cmd=True)
            apply = wp.launch(precond_apply, sv._group_threads(lanes),
                              inputs=[sc, o.adjoint_pcr_iters, lanes, tg, K.nrows, K.direct, sv.rows, K.S_lanes,
                                      K.done],
                              outputs=[self.residual.adjoint_vectors(), scr, ln], device=d, record_cmd=True)
            self._precond_cmds = (key, (factor, apply))
        cmds: tuple[Any, Any] = self._precond_cmds[1]
        return cmds

    def solve(self, system: ls.StepSystem, n: int) -> None:
        """The adjoint solve A^T w = b of the loaded step by the device GMRES: b in ``system.rhs0_v``, w into
        ``system.rhs_v`` (W, n); launches only."""
        sv, o, ws, K = self.solver, self.solver.options, self.residual.workspace, self.work()
        L, residual = self.sim._launches, self.residual
        W, m = sv.world_count, K.m
        factor, apply = self.precond()
        factor.launch()
        tol = 0.5 * o.krylov_tol  # GMRES's own estimate: it runs on float32 sweeps, the cycles check the truth
        m1 = m + 1
        # the residual's sweep (seed dL/dr, result dL/ds) and the preconditioner's input and output
        seed_v, s_grad = system.vector(ws.r_dyn.grad, ws.r_con.grad), system.vector(ws.u_plus.grad, ws.lam.grad)
        y_v, p_v = system.vector(ws.y_u, ws.y_lam), system.vector(ws.p_u, ws.p_lam)

        def seed(X: wp.array[Any], stride: int, col: int, skip_done: bool = False) -> None:
            """A VJP sweep seeded with column ``col`` of X (W, n, stride): A^T x in the s-adjoints; with
            ``skip_done`` the row kernels leave out the worlds whose GMRES is done (their Arnoldi steps ignore
            the sweep), else every world."""
            L.launch(lk.copy_int, W, [K.done if skip_done else ws.no_skip], [ws.skip])
            residual.sweep(lambda: L.launch(write_seed_from, W, [n, stride, col, X, ws.skip], [seed_v]))

        def cycle(c: int) -> None:
            if c == 0:
                b = system.rhs0_v
            else:  # restart from the true residual r = b - A^T w (the last check's, in float64)
                b = K.r
            L.launch(lk.krylov_init, W, [n, int(c > 0), b, K.ok], [K.basis])

            def iteration(j: int) -> None:
                # the preconditioner's input (y_u, y_lam) = v_j: the same unpacking as a sweep's seed
                L.launch(write_seed_from, W, [n, m1, j, K.V, K.done], [y_v])
                apply.launch()
                L.launch(lk.gather, (W, n), [n, n * m, m, j, p_v], [K.Z])
                seed(K.Z, m, j, skip_done=True)
                L.launch(lk.krylov_arnoldi, W, [j, n, tol, s_grad], [K.basis])

            iteration(0)
            for j in range(1, m):
                # once every world's estimate is below tol the cycle's remaining iterations would only sweep
                # for worlds that ignore them (a done world's Arnoldi step returns at once; its solution reads
                # its own k columns): skipped, decided on the device like the next cycle (the pallet
                # traversal's steps reach tol in 3-4 iterations of 6 on most steps)
                L.launch(lk.zero_flag, 1, [], [K.flag])
                L.launch(lk.flag_active, W, [K.done], [K.flag])
                wp.capture_if(K.flag, on_true=lambda j=j: iteration(j))
            L.launch(lk.krylov_solution, W, [n, int(c > 0), K.basis], [system.rhs_v])
            # the sweep of the solution: its true residual, and the gradient's sweep when no cycle follows
            seed(system.rhs_v, 1, 0)
            if c + 1 < K.cycles:
                L.launch(lk.zero_flag, 1, [], [K.flag])
                L.launch(lk.krylov_check, W, [n, o.krylov_tol, system.rhs0_v, s_grad], [K.r, K.ok, K.flag])
                # on the device: the next cycle runs only if a world needs it (a conditional node in a CUDA
                # graph, a recorded branch on the CPU; eager, one read of the flag)
                def next_cycle(c: int = c + 1) -> None:
                    cycle(c)

                wp.capture_if(K.flag, on_true=next_cycle)

        cycle(0)


def gmres(apply_A: Callable[[np.ndarray], np.ndarray], apply_P: Callable[[np.ndarray], np.ndarray],
          b: np.ndarray, tol: float, maxiter: int) -> tuple[np.ndarray, int, float]:
    """Right-preconditioned GMRES for A x = b starting from x0 = P^-1 b; returns (x, iterations,
    relative residual). Small dense Hessenberg least squares on the host."""
    nb_ = float(np.linalg.norm(b))
    if nb_ == 0.0:
        return np.zeros_like(b), 0, 0.0
    x0 = apply_P(b)
    r0 = b - apply_A(x0)
    if not (np.isfinite(x0).all() and np.isfinite(r0).all()):
        raise EngineError("adjoint GMRES: the Schur preconditioner or the residual VJP returned non-finite values")
    beta = float(np.linalg.norm(r0))
    if beta <= tol * nb_:
        return x0, 0, beta / nb_
    V = [r0 / beta]
    Z: list[np.ndarray] = []
    H = np.zeros((maxiter + 1, maxiter))
    y: np.ndarray = np.zeros(0)
    rel = beta / nb_
    k = 0
    for k in range(1, maxiter + 1):
        z = apply_P(V[-1])
        Z.append(z)
        w = apply_A(z)
        if not (np.isfinite(z).all() and np.isfinite(w).all()):
            raise EngineError("adjoint GMRES: the Schur preconditioner or the residual VJP returned non-finite values")
        for i, v in enumerate(V):
            H[i, k - 1] = float(np.dot(w, v))
            w = w - H[i, k - 1] * v
        H[k, k - 1] = float(np.linalg.norm(w))
        e1 = np.zeros(k + 1)
        e1[0] = beta
        y = np.linalg.lstsq(H[: k + 1, :k], e1, rcond=None)[0]
        rel = float(np.linalg.norm(e1 - H[: k + 1, :k] @ y)) / nb_
        if rel <= tol or H[k, k - 1] <= 1e-14 * beta:
            break
        V.append(w / H[k, k - 1])
    x = x0 + sum(yi * zi for yi, zi in zip(y, Z))
    return x, k, rel
