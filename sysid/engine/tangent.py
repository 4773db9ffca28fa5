"""Forward-mode sensitivities of a rollout (`Simulation.jvp`): d body_q / d theta and d body_qd / d theta per
step for p directions (registered parameters, raw parameter arrays, step arrays, servo targets, initial state).

Each converged step's linearisation is solved with the adjoint's per-world solve (linsolve.StepSystem: the step
Jacobian assembled from batched VJP sweeps, equilibrated LU per world), for all p directions at once (implicit
function theorem, paper eq. 14), then carried through the kinematic map (eq. 1).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from . import linsolve as ls
from . import linsolve_kernels as lk
from .errors import EngineError
from .graph_kernels import PUT_ROW, advance
from .record import PARAM_ARRAYS, SimulationPart
from .tape import RolloutBuffers, set_bodies
from .types import host_array, make

if TYPE_CHECKING:
    from .simulation import Simulation


@dataclass
class Tangents:
    """p tangent directions of a rollout's inputs for `Simulation.jvp` (every array has the
    direction index first; omitted inputs have zero tangent).

    params {registered name: (p,) or, for a per-world parameter, (p, worlds)}: directions of the
    registered parameters' values. arrays {PARAM_ARRAYS name: (p, n)}: directions of raw
    parameter-array entries, constant over the steps. step_arrays {name: (p, steps, n)}: directions
    of the per-step arrays given to the rollout's ``step_arrays``. targets_qd (p, steps, dofs) and
    targets_q (p, steps, coords): directions of the servo targets [rad/s, rad]. body_q0 (p, nb, 7)
    and body_qd0 (p, nb, 6): directions of the initial state.
    """

    params: dict[str, np.ndarray] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    step_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    targets_qd: np.ndarray | None = None
    targets_q: np.ndarray | None = None
    body_q0: np.ndarray | None = None
    body_qd0: np.ndarray | None = None

    def count(self) -> int:
        sizes = {int(np.shape(v)[0]) for v in [*self.params.values(), *self.arrays.values(),
                                                 *self.step_arrays.values()]}
        sizes |= {int(np.shape(v)[0]) for v in (self.targets_qd, self.targets_q, self.body_q0, self.body_qd0)
                  if v is not None}
        if len(sizes) != 1:
            raise EngineError(f"Tangents: every direction array needs the same leading size p; got {sorted(sizes)}"
                              if sizes else "Tangents: no directions given")
        return sizes.pop()


@dataclass
class TangentResult:
    """A rollout and its forward sensitivities (`Simulation.jvp`).

    q (steps+1, nb, 7), qd (steps+1, nb, 6): the rollout (as `forward` returns it).
    dq (p, steps+1, nb, 7), dqd (p, steps+1, nb, 6): d body_q / d direction and d body_qd / d
    direction per step (dq[:, 0] is the initial-state direction).
    step_residuals (steps, worlds): each step's Newton residual [m/s]; solve_residual (steps,
    worlds): relative residual of each step's tangent solve (assembled operator); pivot_ratio
    (steps, worlds): min/max pivot of the equilibrated factor (near 0: a singular step Jacobian);
    converged (worlds,): every step's solve below SolverOptions.adjoint_tol.
    """

    q: np.ndarray
    qd: np.ndarray
    dq: np.ndarray
    dqd: np.ndarray
    step_residuals: np.ndarray
    solve_residual: np.ndarray
    pivot_ratio: np.ndarray
    converged: np.ndarray


@dataclass(eq=False)
class TangentEntry:
    """The directions of one input array's entries on the device: the entries any direction touches, their
    worlds, and their (p, count) seed, per step where it varies."""

    count: int  # entries touched
    grad: wp.array[Any]  # the array's adjoint, where a sweep leaves dr/d entry
    entry: wp.array[Any]  # (count,) int: the entries
    world: wp.array[Any]  # (count,) int: each entry's world
    seed: wp.array[Any]  # (p x count,) float: the directions of the entries (this step's, when per step)
    steps: np.ndarray | None  # (steps, p x count): the seed per step (a step array, the targets), else None
    seed_rows: wp.array[Any] | None = None  # `steps` on the device (adopted by `TangentSolver.buffers`)


@dataclass(eq=False)
class JvpBuffers:
    """Device buffers of a jvp of T steps and p directions (nb bodies): kept while ``layout`` stays (recordings
    point into them)."""

    layout: tuple[Any, ...]  # (T, p, each entry's array, count, entries, worlds and whether per step)
    step: wp.array[Any]  # (1,) int: the device step index
    dq: wp.array[Any]  # (p x nb x 7,) float: the tangent of the poses
    dq_next: wp.array[Any]  # (p x nb x 7,) float: of the next poses
    dqd: wp.array[Any]  # (p x nb x 6,) float: of the twists
    du: wp.array[Any]  # (p x nb x 6,) float: of u+
    dq_rows: wp.array[Any]  # (T+1, p x nb x 7) float: dq per step
    dqd_rows: wp.array[Any]  # (T+1, p x nb x 6) float: dqd per step
    solve_res: wp.array[Any]  # (T, worlds) float64: each step's relative solve residual
    pivots: wp.array[Any]  # (T, worlds) float64: each step's smallest / largest pivot
    entries: list[TangentEntry]


class TangentSolver(SimulationPart):
    """`Simulation.jvp`'s rollout and tangents."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.residual = sim._residual
        self.rollout = sim._rollout
        self.current: JvpBuffers | None = None  # the jvp's buffers (`buffers`)

    def run(self, body_q0: np.ndarray, body_qd0: np.ndarray, steps: int, tangents: Tangents,
            targets_qd: np.ndarray | None, targets_q: np.ndarray | None,
            step_arrays: Mapping[str, np.ndarray] | None, progress: Callable[[int], None] | None) -> TangentResult:
        """`Simulation.jvp` (its arguments)."""
        m, sv, o = self.model, self.solver, self.solver.options
        rollout, residual = self.rollout, self.residual
        if o.adjoint != "exact" or o.adjoint_solver == "gmres":
            raise EngineError("jvp needs SolverOptions(adjoint_solver='lu' or 'krylov') (its solve is the LU either "
                              "way; the host 'gmres' is backward only)")
        p = tangents.count()
        nb = m.body_count
        rollout.set_inputs(steps, targets_qd, targets_q, step_arrays)
        entries = self.entries(tangents, p, steps)
        # nothing recorded: last_tape (if any) stays the last forward's, which backward differentiates
        Q = np.empty((steps + 1, nb, 7), np.float32)
        QD = np.empty((steps + 1, nb, 6), np.float32)
        Q[0] = np.asarray(body_q0, np.float32).reshape(nb, 7)
        QD[0] = np.asarray(body_qd0, np.float32).reshape(nb, 6)
        dQ = np.zeros((p, steps + 1, nb, 7), np.float32)
        dQD = np.zeros((p, steps + 1, nb, 6), np.float32)
        for arr, seed, shape in ((dQ, tangents.body_q0, (nb, 7)), (dQD, tangents.body_qd0, (nb, 6))):
            if seed is not None:
                arr[:, 0] = np.asarray(seed, np.float32).reshape(p, *shape)
        # the steps on the forward's buffers (its recordings), the tangent on the jvp's (`buffers`)
        B = rollout.buffers(steps)
        J = self.buffers(steps, p, entries)
        J.dq.assign(dQ[:, 0].ravel())
        J.dqd.assign(dQD[:, 0].ravel())
        for rows in (J.dq_rows, J.dqd_rows):
            rows.zero_()
        J.step.zero_()
        set_bodies(rollout.state_a, Q[0], QD[0])
        sv.reset_warm_start()
        # pass 1: the rollout, recorded on the forward's buffers (as forward does)
        rollout.write_inputs(B)
        for _ in rollout.run(B):
            pass
        # pass 2: each step's tangent from its record, in step order; every size read at once
        system, sizes = residual.system_sizes(B.contacts["ct_count"], p)
        jkey = (id(J), residual.recorded(self.sim.dt).serial, *rollout.step_key(B))
        try:
            for t in range(steps):
                n = sizes[t]

                def tangent(n: int = n) -> None:
                    self.step_launches(J, B, system, n, p)

                self.sim._graphs.run(("jvp", n, system.generation, jkey), tangent)
                if progress is not None:
                    progress(t)
        finally:
            residual.contact_span(None)
        rollout.read(B, Q, QD, stacklevel=4)  # the warning names jvp's caller
        dQ[:, 1:] = J.dq_rows.numpy()[1:].reshape(steps, p, nb, 7).transpose(1, 0, 2, 3)
        dQD[:, 1:] = J.dqd_rows.numpy()[1:].reshape(steps, p, nb, 6).transpose(1, 0, 2, 3)
        solve_res = J.solve_res.numpy().copy()
        pivots = J.pivots.numpy().copy()
        converged: np.ndarray = np.asarray(~(solve_res > o.adjoint_tol).any(axis=0))
        if not converged.all():
            bad = np.flatnonzero(~converged)
            warnings.warn(f"Simulation.jvp: the tangent solve of worlds {bad[:8].tolist()} exceeded adjoint_tol="
                          f"{o.adjoint_tol:g} (worst {float(solve_res[:, bad].max()):.1e}, smallest pivot ratio "
                          f"{float(pivots[:, bad].min()):.1e}); their tangents are inexact", RuntimeWarning,
                          stacklevel=3)
        return TangentResult(q=Q, qd=QD, dq=dQ, dqd=dQD, step_residuals=self.sim.step_residuals.copy(),
                             solve_residual=solve_res, pivot_ratio=pivots, converged=converged)

    def buffers(self, steps: int, p: int, entries: list[TangentEntry]) -> JvpBuffers:
        """Device buffers of a jvp of ``steps`` steps and p directions (`JvpBuffers`), with the input directions'
        seeds (``entries``, whose arrays are adopted or, when their layout is the previous call's, refilled:
        recordings point into them)."""
        d, W = self.model.device, self.solver.world_count
        layout = (steps, p, tuple((e.grad.ptr, e.count, e.entry.numpy().tobytes(), e.world.numpy().tobytes(),
                                   e.steps is not None) for e in entries))
        J = self.current
        if J is None or J.layout != layout:
            self.sim._graphs.clear()  # recordings point into the old buffers
            nb = self.model.body_count
            J = JvpBuffers(layout=layout, step=wp.zeros(1, dtype=int, device=d),
                           dq=wp.zeros(p * nb * 7, dtype=float, device=d),
                           dq_next=wp.zeros(p * nb * 7, dtype=float, device=d),
                           dqd=wp.zeros(p * nb * 6, dtype=float, device=d),
                           du=wp.zeros(p * nb * 6, dtype=float, device=d),
                           dq_rows=wp.zeros((steps + 1, p * nb * 7), dtype=float, device=d),
                           dqd_rows=wp.zeros((steps + 1, p * nb * 6), dtype=float, device=d),
                           solve_res=wp.zeros((steps, W), dtype=wp.float64, device=d),
                           pivots=wp.zeros((steps, W), dtype=wp.float64, device=d),
                           entries=entries)
            for e in entries:
                e.seed_rows = None if e.steps is None else wp.array(e.steps, dtype=float, device=d)
            self.current = J
        else:
            for kept, new in zip(J.entries, entries):
                kept.seed.assign(new.seed)
                if new.steps is not None:
                    assert kept.seed_rows is not None  # the same layout: per step alike
                    kept.seed_rows.assign(new.steps)
        return J

    def step_launches(self, J: JvpBuffers, B: RolloutBuffers, system: ls.StepSystem, n: int, p: int) -> None:
        """The tangent of step (the jvp's device step index) from its record in the rollout buffers ``B``
        (then index + 1): linearise, assemble and factor A with the directions' right-hand sides, solve,
        carry dq, dqd."""
        m, sv, residual, L = self.model, self.solver, self.residual, self.launches
        ws = residual.workspace
        nb, W, nbw, step = m.body_count, sv.world_count, sv.bodies_per_world, J.step
        residual.contact_span(n)
        self.rollout.load_record(B, step)
        for e in J.entries:
            if e.seed_rows is not None:
                L.take_row(step, e.seed_rows, e.seed)
        dq, dqd, du = J.dq, J.dqd, J.du
        # the tangents of the step's start state (q-, u-) and of the kinematic map's inputs (q-, u+), and the
        # residual's gradients with respect to each
        state_t, step_t = make(lk.BodyTangent, nb=nb, q=dq, u=dqd), make(lk.BodyTangent, nb=nb, q=dq, u=du)
        state_g = make(lk.BodyGrad, q=ws.body_q.grad, u=ws.body_qd.grad)
        step_g = make(lk.BodyGrad, q=ws.body_q.grad, u=ws.u_plus.grad)

        seeds = [(e.count, make(lk.EntrySeeds, count=e.count, grad=e.grad, entry=e.entry, world=e.world, seed=e.seed))
                 for e in J.entries]

        def rhs_row(i: int) -> None:
            L.launch(lk.rhs_state_row, (W, p), [i, system.n, p, nbw, state_g, state_t], [system.rhs_v])
            for count, seed in seeds:
                L.launch(lk.rhs_entries_row, (count, p), [i, system.n, p, seed], [system.rhs_v])

        system.assemble(n, p, residual.sweep, system.vector(ws.u_plus.grad, ws.lam.grad),
                        system.vector(ws.r_dyn.grad, ws.r_con.grad), rhs_row)
        system.solve(transpose=False)  # A y = (dr/dxi) dxi; ds = -y
        system.residual_launch()
        L.launch(PUT_ROW[wp.float64], W, [step, 0, system.res], [J.solve_res])
        L.launch(PUT_ROW[wp.float64], W, [step, 0, system.pivot_ratio], [J.pivots])
        L.launch(lk.scatter_du, (nb, p), [system.n, p, nbw, -1.0, system.rhs_v], [step_t])
        # dq+ through the kinematic map (eq. 1), one reverse sweep of it per pose component
        bwd0 = residual.recorded(self.sim.dt).bwd[0]
        for comp in range(7):
            residual.zero_grads()
            L.launch(lk.seed_pose_component, nb, [comp, nb], [ws.body_q_plus.grad])
            bwd0.launch()
            L.launch(lk.pose_tangent_component, (nb, p), [comp, step_g, step_t], [J.dq_next])
        wp.copy(dq, J.dq_next)
        wp.copy(dqd, du)
        residual.zero_grads()
        L.launch(PUT_ROW[wp.float32], dq.shape[0], [step, 1, dq], [J.dq_rows])
        L.launch(PUT_ROW[wp.float32], dqd.shape[0], [step, 1, dqd], [J.dqd_rows])
        L.launch(advance, 1, [], [step])

    def entry_worlds(self, name: str, idx: np.ndarray) -> np.ndarray:
        """World of each entry of an input array (-1: shared by all worlds, a static shape)."""
        sv, m = self.solver, self.model
        W = sv.world_count
        if W == 1:
            return np.zeros(idx.size, np.int32)
        if name == "body_mass":
            return (idx // sv.bodies_per_world).astype(np.int32)
        if name.startswith("joint") or name in ("jt_q", "jt_qd"):
            return (idx // max(sv.joints_per_world, 1)).astype(np.int32)
        body = host_array(m.shape_body)[idx]
        # a static shape of one world (its own ground, a pallet) is that world's; the shared ones are -1
        own = host_array(m.shape_world)[idx]
        out: np.ndarray = np.where(body >= 0, body // sv.bodies_per_world, own).astype(np.int32)
        return out

    def entries(self, tan: Tangents, p: int, steps: int) -> list[TangentEntry]:
        """Device seeds of the input-array directions: per array the entries any direction
        touches, their worlds, and the (p, entries) seed (per step where it varies)."""
        m, sv, d = self.model, self.solver, self.model.device
        W = sv.world_count
        inputs = self.rollout.inputs
        const: dict[str, np.ndarray] = {}
        per_step: dict[str, np.ndarray] = {}

        def n_of(name: str) -> int:
            return max(m.joint_count, 1) if name in ("jt_q", "jt_qd") else getattr(sv, name).shape[0]

        def add(name: str, v: np.ndarray) -> None:
            const.setdefault(name, np.zeros((p, n_of(name)), np.float32))
            const[name] += v

        for name, v in tan.params.items():
            spec = self.sim._spec(name)
            v = np.asarray(v, np.float32)
            full = np.zeros((p, n_of(spec.array)), np.float32)
            if spec.worlds is not None:
                full[:, spec.indices] = np.broadcast_to(v.reshape(p, -1), (p, W))[:, spec.worlds]
            elif spec.per_world:
                v = np.broadcast_to(v.reshape(p, -1), (p, W))
                full[:, spec.indices] = np.repeat(v, spec.indices.size // W, axis=1)
            else:
                full[:, spec.indices] = v.reshape(p, 1)
            add(spec.array, full)
        for name, v in tan.arrays.items():
            if name not in PARAM_ARRAYS:
                raise EngineError(f"Tangents.arrays: {name!r} is not one of {PARAM_ARRAYS}")
            add(name, np.asarray(v, np.float32).reshape(p, n_of(name)))
        for name, v in tan.step_arrays.items():
            if name not in inputs.step_arrays:
                raise EngineError(f"Tangents.step_arrays: {name!r} is not among the rollout's step_arrays")
            per_step[name] = np.asarray(v, np.float32).reshape(p, steps, n_of(name)).transpose(1, 0, 2).copy()
        if m.joint_count:
            for name, tv, start, given, dim in (
                ("jt_qd", tan.targets_qd, m.joint_qd_start, inputs.targets_qd, m.joint_dof_count),
                ("jt_q", tan.targets_q, m.joint_target_q_start, inputs.targets_q, m.joint_coord_count),
            ):
                if tv is None:
                    continue
                if given is None:
                    raise EngineError(f"Tangents.{'targets_qd' if name == 'jt_qd' else 'targets_q'} needs the "
                                      "rollout's targets too")
                tv = np.asarray(tv, np.float32).reshape(p, steps, dim)
                per_step[name] = tv[:, :, host_array(start)[: m.joint_count]].transpose(1, 0, 2).copy()
        out = []
        for name in sorted(set(const) | set(per_step)):
            n = n_of(name)
            c = const.get(name, np.zeros((p, n), np.float32))
            s = per_step.get(name)
            touched = (c != 0).any(axis=0) | ((s != 0).any(axis=(0, 1)) if s is not None else False)
            idx = np.flatnonzero(touched)
            if idx.size == 0:
                continue
            worlds = self.entry_worlds(name, idx)
            if (worlds < 0).any():
                raise EngineError(f"tangent direction on {name} entries {idx[worlds < 0].tolist()}: shared by all "
                                  f"{W} worlds (a static shape); give per-world entries a direction instead")
            grad = (getattr(self.residual.workspace, name).grad if name in ("jt_q", "jt_qd")
                    else getattr(sv, name).grad)
            steps_seed = None if s is None else (c[None, :, idx] + s[:, :, idx]).reshape(steps, -1)
            out.append(TangentEntry(count=int(idx.size), grad=grad,
                                    entry=wp.array(idx.astype(np.int32), dtype=int, device=d),
                                    world=wp.array(worlds, dtype=int, device=d),
                                    seed=wp.array(c[:, idx].ravel(), dtype=float, device=d), steps=steps_seed))
        return out
