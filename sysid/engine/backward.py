"""The adjoint of a rollout: its steps in reverse (paper §III-D), each converged step's adjoint system
(dr/ds)^T w = -dL/ds solved per world (eq. 16) and w^T dr/dxi carried to the step's inputs (eq. 17).

On the device (SolverOptions.adjoint_solver "lu" or "krylov"): every step's load, solve, sweep, carry and
accumulation run at a device step index, recorded per system size and replayed (graphs.py); the host reads the
contact counts once per segment and the gradients once at the end. "lu": the step system assembled from batched
VJP sweeps and factored per world (linsolve.StepSystem); "krylov": the device GMRES (krylov.DeviceKrylov), the LU
again when a world's step missed adjoint_tol. On the host ("gmres"): a reference GMRES per step (krylov.gmres),
preconditioned by the forward's Schur solve.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from . import adjoint as adj
from . import linsolve as ls
from . import linsolve_kernels as lk
from .errors import EngineError
from .graph_kernels import retreat
from .krylov import gmres
from .linsolve_kernels import write_seed_from
from .record import PARAM_ARRAYS, SimulationPart, StepRecord
from .tape import RolloutBuffers, Tape
from .types import StepData, host_array, make, repacked

if TYPE_CHECKING:
    from .simulation import Simulation


@dataclass
class Gradients:
    """dL/d(inputs) of a rollout. body_q0 (nb, 7), body_qd0 (nb, 6), targets_qd (T, dofs),
    targets_q (T, coords), params {name: value gradient}, arrays {PARAM_ARRAYS name: (n,)} (summed
    over the steps), step_arrays {name: (T, n)} for the arrays the forward pass set per step."""

    body_q0: np.ndarray
    body_qd0: np.ndarray
    targets_qd: np.ndarray | None
    targets_q: np.ndarray | None
    params: dict[str, np.ndarray] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    step_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # per-world health of the adjoint solves: (T, worlds) relative residual |A^T w - b| / |b| of each
    # step's solve checked against the matrix-free VJP operator, and per world whether every step
    # stayed below SolverOptions.adjoint_tol (a RuntimeWarning names the worlds that did not)
    adjoint_residual: np.ndarray | None = None
    converged: np.ndarray | None = None


@dataclass(eq=False)
class BackwardBuffers:
    """Device buffers of a backward over T steps (nb bodies): kept while ``layout`` stays (recordings point into
    them)."""

    layout: tuple[Any, ...]  # (T, step array names)
    step: wp.array[Any]  # (1,) int: the device step index, T-1 down to 0
    gQ: wp.array[Any]  # (T+1, nb) transform: dL/d body_q per step
    gQD: wp.array[Any]  # (T+1, nb) spatial_vector: dL/d body_qd per step
    gq: wp.array[Any]  # (nb,) transform: the carried dL/dq-
    gq_direct: wp.array[Any]  # (nb,) transform: its direct part (the kinematic map's)
    gu: wp.array[Any]  # (nb,) spatial_vector: the carried dL/du-
    res: wp.array[Any]  # (T, worlds) float64: each step's relative adjoint residual
    g_tqd: wp.array[Any]  # (T, dofs) float: dL/d targets_qd
    g_tq: wp.array[Any]  # (T, coords) float: dL/d targets_q
    qd_start: wp.array[Any]  # (joints,) int: each joint's first dof
    q_start: wp.array[Any]  # (joints,) int: each joint's first target coordinate
    acc: dict[str, wp.array[Any]]  # {PARAM_ARRAYS name: (n,) float64}: dL/d array, summed over the steps
    per_step: dict[str, wp.array[Any]]  # {step array name: (T, n) float64}: each step's part of it


class Adjoint(SimulationPart):
    """`Simulation.backward`'s sweep of a tape (its inputs and parameter arrays already in place)."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.residual = sim._residual
        self.rollout = sim._rollout
        self.krylov = sim._krylov
        self.current: BackwardBuffers | None = None  # the device backward's buffers (`buffers`)
        self._schur_cmd: tuple[Any, Any] | None = None  # ((h, options), recorded adjoint_system launch)
        self._adj_res: list[np.ndarray] = []  # the host sweep's per-step residuals, last step first

    def run(self, tape: Tape, grad_body_q: np.ndarray | None, grad_body_qd: np.ndarray | None) -> Gradients:
        sim, m = self.sim, self.model
        nb, T = m.body_count, tape.steps
        gQ = np.zeros((T + 1, nb, 7), np.float32) if grad_body_q is None else np.asarray(grad_body_q, np.float32)
        gQD = np.zeros((T + 1, nb, 6), np.float32) if grad_body_qd is None else np.asarray(grad_body_qd, np.float32)
        if gQ.shape != (T + 1, nb, 7) or gQD.shape != (T + 1, nb, 6):
            raise EngineError(f"gradients must have shapes ({T + 1}, {nb}, 7) and ({T + 1}, {nb}, 6)")
        if self.solver.options.adjoint_solver in ("lu", "krylov"):
            if self.solver.options.adjoint_solver == "krylov":
                g = self.on_device(tape, gQ, gQD, "krylov")
                if g is not None:
                    return g
                sim.adjoint_fallbacks += 1  # a world's step missed adjoint_tol: the exact LU instead
            g = self.on_device(tape, gQ, gQD, "lu")
            assert g is not None
            return g
        rollout, inputs = self.rollout, self.rollout.inputs
        gq = gQ[T].copy()
        gu = gQD[T].copy()
        sim.adjoint_stats = []
        self._adj_res = []
        g_tqd = np.zeros((T, m.joint_dof_count), np.float32) if inputs.targets_qd is not None else None
        g_tq = np.zeros((T, m.joint_coord_count), np.float32) if inputs.targets_q is not None else None
        g_arrays = {name: np.zeros(getattr(self.solver, name).shape[0], np.float64) for name in PARAM_ARRAYS}
        g_steps = {name: np.zeros(vals.shape, np.float64) for name, vals in inputs.step_arrays.items()}
        qd_start = host_array(m.joint_qd_start)[: m.joint_count]
        q_start = host_array(m.joint_target_q_start)[: m.joint_count] if m.joint_count else np.zeros(0, int)
        # the host GMRES (adjoint_solver="gmres") over step records: the tape's, or a checkpointed tape's
        # segments recomputed on the device one at a time
        K = tape.checkpoint_every
        segments: list[tuple[int, list[StepRecord] | None]]  # None: recomputed from its checkpoint
        if K is None:
            B = rollout.buffers(T)
            rollout.hold(tape, B)
            segments = [(0, B.views(0, T))]
        else:
            segments = [(s * K, None) for s in range(math.ceil(T / K))]
            B = rollout.buffers(T, K)
            rollout.write_inputs(B)
        for seg_index in reversed(range(len(segments))):
            t0, recs = segments[seg_index]
            if recs is None:
                recs = rollout.recompute_segment(tape, seg_index, B)
            for i in reversed(range(len(recs))):
                t = t0 + i
                rollout.set_step_arrays(t)  # the step's residual is linearised at its own parameters
                before = {name: g_arrays[name].copy() for name in inputs.step_arrays}
                gq, gu, gjqd, gjq = self.host_step(recs[i], gq, gu, g_arrays)
                for name in inputs.step_arrays:
                    g_steps[name][t] = g_arrays[name] - before[name]
                if g_tqd is not None and m.joint_count:
                    np.add.at(g_tqd[t], qd_start, gjqd[: m.joint_count])
                if g_tq is not None and m.joint_count:
                    np.add.at(g_tq[t], q_start, gjq[: m.joint_count])
                gq = gq + gQ[t]
                gu = gu + gQD[t]
        res = np.asarray(self._adj_res[::-1]).reshape(T, self.solver.world_count)  # swept last step first
        sim.adjoint_stats.reverse()
        return self.gradients(gq, gu, g_tqd, g_tq, g_arrays, g_steps, res, stacklevel=4)

    def gradients(self, gq: np.ndarray, gu: np.ndarray, g_tqd: np.ndarray | None, g_tq: np.ndarray | None,
                  g_arrays: dict[str, np.ndarray], g_steps: dict[str, np.ndarray], res: np.ndarray,
                  stacklevel: int) -> Gradients:
        """A backward's `Gradients`: registered parameters summed from the (float64) parameter-array
        gradients, and a warning naming the worlds whose adjoint solve missed adjoint_tol."""
        params = {}
        for name, spec in self.sim.params.items():
            gvals = g_arrays[spec.array][spec.indices]
            if spec.worlds is not None:
                params[name] = np.bincount(spec.worlds, weights=gvals, minlength=self.solver.world_count)
            elif spec.per_world:
                params[name] = gvals.reshape(self.solver.world_count, -1).sum(axis=1)
            else:
                params[name] = np.asarray(gvals.sum())
        converged: np.ndarray = np.asarray(~(res > self.solver.options.adjoint_tol).any(axis=0))
        if not converged.all():
            bad = np.flatnonzero(~converged)
            tol = self.solver.options.adjoint_tol
            warnings.warn(f"Simulation.backward: the adjoint solve of worlds {bad[:8].tolist()} "
                          f"{'...' if bad.size > 8 else ''}did not reach adjoint_tol={tol:g} "
                          f"(worst relative residual {float(np.nanmax(res[:, bad])):.1e}); their gradients are "
                          "inexact (Gradients.adjoint_residual per step and world)", RuntimeWarning,
                          stacklevel=stacklevel)
        return Gradients(body_q0=gq, body_qd0=gu, targets_qd=g_tqd, targets_q=g_tq, params=params,
                         arrays={k: v.astype(np.float32) for k, v in g_arrays.items()}, step_arrays=g_steps,
                         adjoint_residual=res, converged=converged)

    # ---------------------------------------------------------------- on the device
    def on_device(self, tape: Tape, gQ: np.ndarray, gQD: np.ndarray, kind: str) -> Gradients | None:
        """The backward on the device: every step's adjoint (load, solve, sweep, carry, accumulate) runs at a
        device step index, recorded per system size and replayed (graphs.py), from the tape's records copied
        into the rollout buffers, or, for a checkpointed tape, from each segment recomputed there (last
        segment first); the host reads the contact counts once per segment (the system sizes) and the
        gradients once at the end. ``kind`` "lu": the assembled LU (float32 carries, float64 sums); "krylov":
        the device GMRES (`krylov.DeviceKrylov`), None when a world's step missed adjoint_tol (the caller runs
        the LU)."""
        rollout, residual, inputs = self.rollout, self.residual, self.rollout.inputs
        T, K = tape.steps, tape.checkpoint_every
        # the tape's records in the forward's buffers (the same layout): recordings keep pointing at
        # fixed arrays whichever tape is differentiated
        kept = rollout.buffers(T, K)
        if tape.buffers is not None:
            rollout.hold(tape, kept)
        rollout.write_inputs(kept)  # the tape's (backward put them in place): each step linearised at its own
        G = self.buffers(T)
        G.gQ.assign(gQ.reshape(T + 1, -1, 7))
        G.gQD.assign(gQD.reshape(T + 1, -1, 6))
        wp.copy(G.gq, G.gQ[T])
        wp.copy(G.gu, G.gQD[T])
        for a in (G.res, G.g_tqd, G.g_tq, *G.acc.values(), *G.per_step.values()):
            a.zero_()
        G.step.fill_(T - 1)
        if kind == "krylov":
            self.krylov.work()  # allocated before any recording
        key = (id(G), residual.recorded(self.sim.dt).serial, kind, self.krylov.serial, *rollout.step_key(kept))
        sizes: list[int] = []
        seg_len = T if K is None else K
        try:
            for seg in reversed(range(math.ceil(T / seg_len))):
                t0, t1 = seg * seg_len, min(seg * seg_len + seg_len, T)
                if tape.buffers is None:
                    rollout.recompute_segment(tape, seg, kept)
                # the segment's one read (a kept tape's forward read its counts)
                system, seg_sizes = residual.system_sizes(kept.contacts["ct_count"], 1, t1 - t0, tape.contact_counts)
                for t in reversed(range(t0, t1)):
                    self.device_step(kept, G, system, seg_sizes[t - t0], key, kind)
                sizes[:0] = seg_sizes
        finally:
            residual.contact_span(None)  # the host GMRES loop covers every slot
        # the one read after
        res = G.res.numpy().copy()
        if kind == "krylov" and bool((res > self.solver.options.adjoint_tol).any()):
            return None
        self.sim.adjoint_stats = [(n, float(r.max())) for n, r in zip(sizes, res)]
        g_tqd = G.g_tqd.numpy().copy() if inputs.targets_qd is not None else None
        g_tq = G.g_tq.numpy().copy() if inputs.targets_q is not None else None
        arrays = {k: a.numpy().copy() for k, a in G.acc.items()}
        g_steps = {k: a.numpy().copy() for k, a in G.per_step.items()}
        return self.gradients(G.gq.numpy().copy(), G.gu.numpy().copy(), g_tqd, g_tq, arrays, g_steps, res,
                              stacklevel=5)

    def buffers(self, T: int) -> BackwardBuffers:
        """Device buffers of a backward over T steps with the current inputs' layout (`BackwardBuffers`), the
        last ones while the layout stays."""
        m, sv, d = self.model, self.solver, self.model.device
        step_arrays = self.rollout.inputs.step_arrays
        layout = (T, tuple(sorted(step_arrays)))
        if self.current is not None and self.current.layout == layout:
            return self.current
        self.current = None
        self.sim._graphs.clear()  # recordings point into the old buffers
        nb, W = m.body_count, sv.world_count

        def z(shape: int | tuple[int, int], dtype: Any) -> wp.array[Any]:
            return wp.zeros(shape, dtype=dtype, device=d)

        self.current = BackwardBuffers(
            layout=layout, step=z(1, int),
            gQ=z((T + 1, nb), wp.transform),
            gQD=z((T + 1, nb), wp.spatial_vector),
            gq=z(nb, wp.transform), gq_direct=z(nb, wp.transform),
            gu=z(nb, wp.spatial_vector),
            res=z((T, W), wp.float64),
            g_tqd=z((T, max(m.joint_dof_count, 1)), float),
            g_tq=z((T, max(m.joint_coord_count, 1)), float),
            qd_start=wp.array(host_array(m.joint_qd_start)[: m.joint_count].astype(np.int32), dtype=int, device=d),
            q_start=wp.array((host_array(m.joint_target_q_start)[: m.joint_count] if m.joint_count
                              else np.zeros(0)).astype(np.int32), dtype=int, device=d),
            acc={name: z(getattr(sv, name).shape[0], wp.float64) for name in PARAM_ARRAYS},
            per_step={name: z((T, getattr(sv, name).shape[0]), wp.float64) for name in sorted(step_arrays)},
        )
        return self.current

    def device_step(self, kept: RolloutBuffers, G: BackwardBuffers, system: ls.StepSystem, n: int,
                    key: tuple[Any, ...], kind: str) -> None:
        """One step of `on_device`: its launches replayed (recorded per system size n)."""

        def body() -> None:
            self.device_step_launches(kept, G, system, n, kind)

        self.sim._graphs.run(("backward", n, system.generation, key), body)

    def device_step_launches(self, kept: RolloutBuffers, G: BackwardBuffers, system: ls.StepSystem, n: int,
                             kind: str) -> None:
        """One step of `on_device` at the device step index (then index - 1): launches only."""
        m, sv, residual, L = self.model, self.solver, self.residual, self.launches
        ws, inputs = residual.workspace, self.rollout.inputs
        step, W = G.step, sv.world_count
        residual.contact_span(n)
        self.rollout.load_record(kept, step)
        bwd = residual.recorded(self.sim.dt).bwd
        # pass 1: the kinematic substitution transposed, h G^T dL/dq+ (and the direct q- path)
        residual.zero_grads()
        wp.copy(ws.body_q_plus.grad, G.gq)
        bwd[0].launch()
        wp.copy(G.gq_direct, ws.body_q.grad)
        # adjoint (eq. 16): (dr/ds)^T w = -dL/ds, dL/du+ including h G^T dL/dq+ (eq. 18), taken before the
        # solve's sweeps overwrite the adjoints; solved per world by the assembled LU (linsolve) or the Krylov
        system.select(n)  # the views at this step's size (reserved by Residual.system_sizes)
        s_grad, seed = system.vector(ws.u_plus.grad, ws.lam.grad), system.vector(ws.r_dyn.grad, ws.r_con.grad)
        L.launch(lk.adjoint_rhs, (W, n), [n, G.gu, s_grad], [system.rhs_v])
        if kind == "krylov":
            wp.copy(system.rhs0_v, system.rhs_v)
            self.krylov.solve(system, n)  # ends with the sweep of its solution w
            fixed = self.krylov.work().no_fixed
        else:
            system.assemble(n, 1, residual.sweep, s_grad, seed)
            system.solve(transpose=True)
            fixed = system.fixed
            residual.sweep(lambda: L.launch(write_seed_from, W, [n, 1, 0, system.rhs_v, ws.no_skip], [seed]))
        L.launch(lk.adjoint_check, W, [step, n, s_grad, fixed, system.rhs0_v], [G.res])
        # dL/dxi = w^T dr/dxi (eq. 17), from that sweep
        L.launch(lk.adjoint_carry, m.body_count,
                 [step, G.gq_direct, make(lk.BodyGrad, q=ws.body_q.grad, u=ws.body_qd.grad), G.gQ, G.gQD],
                 [make(lk.BodyGrad, q=G.gq, u=G.gu)])
        if m.joint_count:
            if inputs.targets_qd is not None:
                L.launch(lk.scatter_joint_grad, m.joint_count, [step, G.qd_start, ws.jt_qd.grad], [G.g_tqd])
            if inputs.targets_q is not None:
                L.launch(lk.scatter_joint_grad, m.joint_count, [step, G.q_start, ws.jt_q.grad], [G.g_tq])
        for name in PARAM_ARRAYS:
            g = getattr(sv, name).grad
            if g is None:
                continue
            if name in G.per_step:
                L.launch(lk.accumulate64_step, g.shape[0], [step, g], [G.acc[name], G.per_step[name]])
            else:
                L.launch(lk.accumulate64, g.shape[0], [g], [G.acc[name]])
        residual.zero_grads()
        L.launch(retreat, 1, [], [step])

    # ---------------------------------------------------------------- on the host
    def host_step(self, rec: StepRecord, gq: np.ndarray, gu: np.ndarray,
                  g_arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One step of the host sweep (adjoint_solver="gmres"): (dL/dq-, dL/du-, dL/d jt_qd, dL/d jt_q) from the
        carried (dL/dq+, dL/du+), the parameter arrays' gradients added to ``g_arrays``."""
        m, sv, o, residual = self.model, self.solver, self.solver.options, self.residual
        ws = residual.workspace
        h = self.sim.dt
        residual.load(rec)
        bwd = residual.recorded(h).bwd
        zero_grads = residual.zero_grads
        # pass 1: the kinematic substitution transposed, h G^T dL/dq+ (and the direct q- path)
        zero_grads()
        ws.body_q_plus.grad.assign(gq)
        bwd[0].launch()
        gq_direct = ws.body_q.grad.numpy().copy()
        g_u_total = gu + ws.u_plus.grad.numpy()
        nb6 = m.body_count * 6
        W = sv.world_count

        def vjp(x: np.ndarray) -> None:
            zero_grads()
            ws.r_dyn.grad.assign(x[:nb6].reshape(-1, 6).astype(np.float32))
            ws.r_con.grad.assign(x[nb6:].astype(np.float32))
            for c in reversed(bwd):
                c.launch()

        def apply_At(x: np.ndarray) -> np.ndarray:
            """(dr/ds)^T x, exact: the VJP of the recorded residual with respect to (u+, lam+)."""
            vjp(x)
            return np.concatenate([ws.u_plus.grad.numpy().ravel(), ws.lam.grad.numpy()]).astype(np.float64)

        def apply_P(y: np.ndarray) -> np.ndarray:
            """Schur solve with the forward (lagged-W) operator, eq. 18-19 generalised: the
            paper's single adjoint solve, here only the GMRES preconditioner (exact under sticking
            contact, biased under sliding; SolverOptions.adjoint says why it is not a mode)."""
            skey = (h, o.version)
            if self._schur_cmd is None or self._schur_cmd[0] != skey:
                self._schur_cmd = (skey, self._record_schur(h))
            schur_cmd = self._schur_cmd[1]
            ws.y_u.assign(y[:nb6].reshape(-1, 6).astype(np.float32))
            ws.y_lam.assign(y[nb6:].astype(np.float32))
            schur_cmd.launch()
            return np.concatenate([ws.p_u.numpy().ravel(), ws.p_lam.numpy()]).astype(np.float64)

        # adjoint (eq. 16): (dr/ds)^T w = -dL/ds, with dL/du+ including h G^T dL/dq+ (eq. 18)
        b = np.concatenate([-g_u_total.ravel(), np.zeros(sv.world_count * sv.max_rows)]).astype(np.float64)
        wvec, its, rel = gmres(apply_At, apply_P, b, o.adjoint_tol, o.adjoint_max_iters)
        self.sim.adjoint_stats.append((its, rel))
        self._adj_res.append(np.full(W, rel))
        vjp(wvec)
        # dL/dxi = w^T dr/dxi (eq. 17), from the last VJP sweep
        gq_prev = gq_direct + ws.body_q.grad.numpy()
        gu_prev = ws.body_qd.grad.numpy().copy()
        gjqd = ws.jt_qd.grad.numpy().copy()
        gjq = ws.jt_q.grad.numpy().copy()
        for name in PARAM_ARRAYS:
            arr = getattr(sv, name)
            if arr.grad is not None:
                g_arrays[name] += arr.grad.numpy()
        zero_grads()
        return gq_prev, gu_prev, gjqd, gjq

    def _record_schur(self, h: float) -> Any:
        sv, o, d = self.solver, self.solver.options, self.model.device
        ws = self.residual.workspace
        # the converged step's q-, targets and joint angles are the workspace's; M~ at q- the solver's
        data = make(StepData, x_prev=ws.x_prev, q_prev=ws.q_prev, u_prev=sv.u_prev, inv_m=sv.inv_m, I_w=sv.I_w,
                    inv_I=sv.inv_I, f_imp=sv.f_imp, jt_q=ws.jt_q, jt_qd=ws.jt_qd, j_qprev=ws.j_qprev)
        return wp.launch(
            adj.adjoint_system, sv.world_count,
            inputs=[sv._step_constants(h), o.adjoint_pcr_iters, sv.model_arrays, data, sv.contact_slots,
                    self.residual.at_converged()],
            outputs=[self.residual.adjoint_vectors(), sv.rows, repacked(sv.schur_scratch, x=ws.p_lam, dm=0)],
            device=d, record_cmd=True,
        )
