"""A converged step's record and the residual it is linearised at.

`StepRecord` is what a rollout keeps of one converged step: q-, u-, the returned u+ and multipliers, the servo
targets and the contact set. `Residual` is that step's residual r(u+, lam+; q-, u-, targets, theta) (paper
eq. 9-11) on a fixed `Workspace`, its forward and adjoint launches recorded once per step size and contact span:
a record loaded there is linearised by VJP sweeps (`Residual.sweep`) and solved per world by
`linsolve.StepSystem`, for the adjoint (backward.py, krylov.py) and the tangents (tangent.py) alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from . import adjoint as adj
from . import linsolve as ls
from .step import prepare_bodies
from .types import Iterate, Poses, StepData, make, repacked

if TYPE_CHECKING:
    import newton

    from .simulation import Simulation
    from .solver_ostrich import SolverOstrich

# the solver's contact slots: `Contacts`' fields (and `ContactRecord`'s), each ct_ + the field's name
CONTACT_FIELDS = (
    "ct_count", "ct_shape0", "ct_shape1", "ct_p0", "ct_p1", "ct_n", "ct_nbody", "ct_thick", "ct_axial0",
    "ct_axial1", "ct_fric_shape", "ct_single",
)
# the solver's parameter arrays a rollout is differentiated in (registered parameters, step arrays, tangents)
PARAM_ARRAYS = ("body_mass", "shape_mu", "shape_mu_lat", "shape_slip", "shape_slip_lat", "joint_ke", "joint_kd",
                "joint_cmd_scale", "joint_effort_limit")


@dataclass
class StepRecord:
    """One converged step as a rollout keeps it (views of the rollout's buffers): body_q (nb,) transform and
    body_qd (nb,) spatial_vector, the state it started from; u_plus (nb,) the returned twists; lam (worlds x
    max_rows,) the multipliers; jt_q, jt_qd (joints,) the servo targets [rad, rad/s]; contacts {CONTACT_FIELDS
    name: the solver's contact slots}."""

    body_q: wp.array[Any]
    body_qd: wp.array[Any]
    u_plus: wp.array[Any]
    lam: wp.array[Any]
    jt_q: wp.array[Any]
    jt_qd: wp.array[Any]
    contacts: dict[str, wp.array[Any]]

    def nbytes(self) -> int:
        arrs = [self.body_q, self.body_qd, self.u_plus, self.lam, self.jt_q, self.jt_qd, *self.contacts.values()]
        return int(sum(a.capacity for a in arrs))


@dataclass(eq=False)
class Workspace:
    """The fixed arrays the recorded residual reads and writes: nb bodies, nj joints (at least one), R = worlds x
    max_rows constraint rows, C = worlds x max_contacts contact slots. The differentiated ones carry the adjoints
    of a sweep in ``.grad``."""

    body_q: wp.array[Any]  # (nb,) transform: q-, the state the loaded step started from
    body_qd: wp.array[Any]  # (nb,) spatial_vector: u- [m/s, rad/s]
    u_plus: wp.array[Any]  # (nb,) spatial_vector: the returned u+ [m/s, rad/s]
    x_prev: wp.array[Any]  # (nb,) vec3: centres of mass at q- [m]
    q_prev: wp.array[Any]  # (nb,) quat: orientations at q-
    x_plus: wp.array[Any]  # (nb,) vec3: centres of mass at q+ [m]
    q_plus: wp.array[Any]  # (nb,) quat: orientations at q+
    body_q_plus: wp.array[Any]  # (nb,) transform: q+
    x_geom: wp.array[Any]  # (nb,) vec3: the truncated pull-back's contact geometry, q+ [m]
    q_geom: wp.array[Any]  # (nb,) quat
    xp_geom: wp.array[Any]  # (nb,) vec3: and its q- [m]
    qp_geom: wp.array[Any]  # (nb,) quat
    thick_eff: wp.array[Any]  # (C,) float: the truncated pull-back's gap, moved to first order [m]
    jt_q: wp.array[Any]  # (nj,) float: servo position targets [rad]
    jt_qd: wp.array[Any]  # (nj,) float: servo velocity targets [rad/s]
    j_qprev: wp.array[Any]  # (nj,) float: joint angles at q- [rad]
    frame_p: wp.array[Any]  # (nj,) transform: the joints' parent frames at q+
    frame_c: wp.array[Any]  # (nj,) transform: and child frames
    r_con: wp.array[Any]  # (R,) float: the constraint rows' residual
    jt_lam: wp.array[Any]  # (nb,) spatial_vector: J^T lam
    r_dyn: wp.array[Any]  # (nb,) spatial_vector: the dynamics residual
    lam: wp.array[Any]  # (R,) float: the multipliers
    y_u: wp.array[Any]  # (nb,) spatial_vectorf: a preconditioner's input, twist part (not differentiated)
    y_lam: wp.array[Any]  # (R,) float: and row part
    p_u: wp.array[Any]  # (nb,) spatial_vectorf: its output, twist part
    p_lam: wp.array[Any]  # (R,) float: and row part
    # per world: 1 leaves it out of the residual's kernels (the Krylov adjoint's Arnoldi sweeps for worlds already
    # solved, `krylov.DeviceKrylov.solve`, which resets it with its solution's sweep); 0 everywhere else
    skip: wp.array[Any]  # (worlds,) int
    no_skip: wp.array[Any]  # (worlds,) int, all 0

    @classmethod
    def allocate(cls, model: newton.Model, solver: SolverOstrich) -> Workspace:
        m, sv, d = model, solver, model.device
        nb, R = m.body_count, sv.world_count * sv.max_rows
        nj = max(m.joint_count, 1)

        def g(n: int, dtype: Any) -> wp.array[Any]:
            return wp.zeros(max(n, 1), dtype=dtype, device=d, requires_grad=True)

        return cls(
            body_q=g(nb, wp.transform), body_qd=g(nb, wp.spatial_vector), u_plus=g(nb, wp.spatial_vector),
            x_prev=g(nb, wp.vec3), q_prev=g(nb, wp.quat), x_plus=g(nb, wp.vec3), q_plus=g(nb, wp.quat),
            body_q_plus=g(nb, wp.transform), x_geom=g(nb, wp.vec3), q_geom=g(nb, wp.quat),
            xp_geom=g(nb, wp.vec3), qp_geom=g(nb, wp.quat), thick_eff=g(sv.world_count * sv.max_contacts, float),
            jt_q=g(nj, float), jt_qd=g(nj, float), j_qprev=g(nj, float), frame_p=g(nj, wp.transform),
            frame_c=g(nj, wp.transform),
            r_con=g(R, float), jt_lam=g(nb, wp.spatial_vector), r_dyn=g(nb, wp.spatial_vector),
            lam=g(R, float), y_u=wp.zeros(nb, dtype=wp.spatial_vectorf, device=d),
            y_lam=wp.zeros(R, dtype=float, device=d), p_u=wp.zeros(nb, dtype=wp.spatial_vectorf, device=d),
            p_lam=wp.zeros(R, dtype=float, device=d),
            skip=wp.zeros(sv.world_count, dtype=int, device=d),
            no_skip=wp.zeros(sv.world_count, dtype=int, device=d),
        )


@dataclass
class RecordedResidual:
    """The residual's launches at one step size and contact span: forward and adjoint, in execution order
    (kinematics first), the gradient arrays a sweep zeroes, and the serial of the recording they belong to (a
    replay that holds launches of an older recording must not be reused)."""

    fwd: list[wp.Launch]
    bwd: list[wp.Launch]
    grads: list[wp.array[Any]]
    serial: int


class SimulationPart:
    """A part of a `Simulation` (its `Residual`, adjoint, tangents): the simulation, its solver and model, and the
    launch cache they all launch through."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.solver = sim.solver
        self.model = sim.model
        self.launches = sim._launches


class Residual(SimulationPart):
    """The residual of one converged step on the fixed `Workspace`, recorded (warp's argument packing, not
    arithmetic, dominates a tape replay of small scenes), the step system it is solved with, and the contact slots
    its launches cover (`contact_span`)."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self._ws: Workspace | None = None
        self._key: tuple[Any, ...] | None = None  # (h, options version) of the recordings in _spans
        self._spans: dict[int, RecordedResidual] = {}
        self._serial = 0  # counts the recordings' rebuilds
        self._cmax = sim.solver.max_contacts  # contact slots the launches cover (contact_span)
        self._system: ls.StepSystem | None = None

    @property
    def workspace(self) -> Workspace:
        if self._ws is None:
            self._ws = Workspace.allocate(self.model, self.solver)
        return self._ws

    @property
    def system(self) -> ls.StepSystem:
        """The per-world step system (the assembled Jacobian and its LU) of the adjoint and the tangents."""
        if self._system is None:
            sv = self.solver
            self._system = ls.StepSystem(self.model.device, sv.world_count, sv.bodies_per_world, sv.max_rows)
        return self._system

    def system_size(self, contacts: int) -> int:
        """The step system's size when the fullest world has ``contacts`` contacts (its rows, 3 each)."""
        return self.system.size_for(self.solver.joint_rows + 3 * contacts)

    def system_sizes(self, ct_count: wp.array[Any], p: int, rows: int | None = None,
                     most: np.ndarray | None = None) -> tuple[ls.StepSystem, list[int]]:
        """The step system and its size at every step of a rollout's contact counts ``ct_count`` (steps, worlds)
        (the first ``rows`` records, default all; one read, or ``most``: each step's most contacts, read before),
        every size's arrays allocated for p right-hand sides (not inside a recording)."""
        system = self.system
        if most is None:
            most = ct_count.numpy()[:rows].max(axis=1, initial=0)
        sizes = [self.system_size(int(c)) for c in most]
        for n in set(sizes):
            system.reserve(n, p)
        return system, sizes

    def contact_span(self, n: int | None) -> None:
        """The contact slots the residual's launches cover from now on: those of a step system of size n
        (its fullest world's contacts), or every slot (None)."""
        sv = self.solver
        c = sv.max_contacts if n is None else (n - self.system.nu - sv.joint_rows) // 3
        self._cmax = max(1, min(int(c), sv.max_contacts))

    def launch_list(self, h: float, cmax: int) -> list[tuple[wp.Kernel, int, list[Any], list[Any]]]:
        """(kernel, dim, inputs, outputs) of one residual evaluation r(u+, lam+; q-, u-, targets,
        theta) (eq. 9-11) on the fixed workspace arrays, in execution order; the contact kernels over the
        first ``cmax`` slots of every world (at least the fullest world's contact count)."""
        m, sv, o = self.model, self.solver, self.solver.options
        d = m.device
        ws = self.workspace
        if self.sim.pullback == "truncated":
            xg, qg, xpg, qpg = ws.x_geom, ws.q_geom, ws.xp_geom, ws.qp_geom
        else:
            xg, qg, xpg, qpg = ws.x_plus, ws.q_plus, ws.x_prev, ws.q_prev
        prev, plus = make(Poses, x=ws.x_prev, q=ws.q_prev), make(Poses, x=ws.x_plus, q=ws.q_plus)
        L: list[tuple[Any, int, list[Any], list[Any]]] = [
            (adj.residual_kinematics, m.body_count, [h, m.body_com, ws.body_q, ws.u_plus, sv.bodies_per_world,
                                                      ws.skip],
             [prev, plus, ws.body_q_plus])]
        if m.joint_count:
            L.append((adj.residual_joint_angles, m.joint_count,
                      [sv.joints, m.body_com, prev, sv.joints_per_world, ws.skip], [ws.j_qprev]))
        # groups packed now: the registered parameters' gradients exist only since Simulation was set up
        sc, model = sv._step_constants(h), repacked(sv.model_arrays)
        # the residual's own q-, targets and joint angles (differentiated); M~ at q- the solver's (not)
        data = make(StepData, x_prev=xpg, q_prev=qpg, u_prev=sv.u_prev, inv_m=sv.inv_m, I_w=sv.I_w, inv_I=sv.inv_I,
                    f_imp=sv.f_imp, jt_q=ws.jt_q, jt_qd=ws.jt_qd, j_qprev=ws.j_qprev)
        if sv.joint_rows:
            L.append((adj.residual_joint_frames, m.joint_count,
                      [sv.joints, m.body_com, plus, sv.joints_per_world, ws.skip], [ws.frame_p, ws.frame_c]))
            jc, jdim = adj.row_chunks(d, sv.world_count, sv.joint_rows)
            at = self.at_converged()
            L.append((adj.residual_joint_rows, jdim, [jc, sc, model, data, at, ws.frame_p, ws.frame_c, ws.skip],
                      [ws.r_con, ws.jt_lam]))
        if m.shape_count:
            ct = repacked(sv.contact_slots)
            if self.sim.pullback == "truncated":
                # geometry frozen at the converged poses, the gap moving to first order (adj.residual_frozen_gap)
                L.append((adj.residual_frozen_gap, sv.world_count * cmax,
                          [cmax, sv.max_contacts, model, ct, make(Poses, x=xg, q=qg), make(Poses, x=xpg, q=qpg), plus],
                          [ws.thick_eff]))
                ct = repacked(ct, thick=ws.thick_eff)
            cc, cdim = adj.row_chunks(d, sv.world_count, cmax)
            at = make(Iterate, x=xg, q=qg, u=ws.u_plus, lam=ws.lam)
            L.append((adj.residual_contact_rows, cdim, [cmax, cc, sc, model, data, ct, at, ws.skip],
                      [ws.r_con, ws.jt_lam]))
        L.append((adj.residual_dynamics, m.body_count,
                  [h, wp.vec3(*sv._gravity()), int(o.gyroscopic), sv.body_mass, sv.body_inertia_unit,
                   ws.q_prev, ws.body_qd, ws.u_plus, ws.jt_lam, sv.bodies_per_world, ws.skip],
                  [ws.r_dyn]))
        return L

    def recorded(self, h: float) -> RecordedResidual:
        """Forward and adjoint launches of the residual, recorded once per step size and contact span
        (`contact_span`)."""
        o = self.solver.options
        key = (h, o.version)  # the launches hold the options' values (step constants)
        if self._key != key:
            self._serial += 1
            self._key, self._spans = key, {}
        if self._cmax not in self._spans:
            self._spans[self._cmax] = self._record(h, self._cmax)
        return self._spans[self._cmax]

    def _record(self, h: float, cmax: int) -> RecordedResidual:
        d = self.model.device

        def adjoint_of(a: Any) -> Any:
            if wp.types.is_array(a):
                return a.grad if a.requires_grad else None
            if wp.types.is_struct(a):  # an array group (types.py): its arrays' gradients, field by field
                g = a._cls()
                for f in a._cls.vars:
                    setattr(g, f, adjoint_of(getattr(a, f)))
                return g
            return type(a)()

        def arrays_of(a: Any) -> list[Any]:
            return [getattr(a, f) for f in a._cls.vars] if wp.types.is_struct(a) else [a]

        fwd: list[wp.Launch] = []
        bwd: list[wp.Launch] = []
        grads: list[wp.array[Any]] = []
        for kernel, dim, inputs, outputs in self.launch_list(h, cmax):
            fwd.append(wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=d, record_cmd=True))
            bwd.append(wp.launch(kernel, dim, inputs=inputs, outputs=outputs,
                                 adj_inputs=[adjoint_of(a) for a in inputs],
                                 adj_outputs=[adjoint_of(a) for a in outputs],
                                 adjoint=True, device=d, record_cmd=True))
            grads += [a.grad for a in [x for b in (*inputs, *outputs) for x in arrays_of(b)]
                      if wp.types.is_array(a) and a.requires_grad]
        uniq = list({id(g): g for g in grads}.values())
        return RecordedResidual(fwd=fwd, bwd=bwd, grads=uniq, serial=self._serial)

    def load(self, rec: StepRecord) -> None:
        """Put a converged step (its q-, u-, returned u+ and multipliers, servo targets and its contact
        set, into the solver's slots) in the workspace and evaluate the recorded residual there once
        (eq. 9-11), M~ at q- recomputed."""
        sv = self.solver
        ws = self.workspace
        wp.copy(ws.body_q, rec.body_q)
        wp.copy(ws.body_qd, rec.body_qd)
        wp.copy(ws.u_plus, rec.u_plus)
        wp.copy(ws.lam, rec.lam)
        wp.copy(ws.jt_q, rec.jt_q)
        wp.copy(ws.jt_qd, rec.jt_qd)
        # the residual kernels and the Schur solve read the contact set from the solver's slots
        for k in CONTACT_FIELDS:
            wp.copy(getattr(sv, k), rec.contacts[k])
        self.evaluate_loaded()

    def at_converged(self) -> Any:
        """The loaded step's converged iterate (q+, u+, lam+) as the rows are built at (`Iterate`)."""
        ws = self.workspace
        return make(Iterate, x=ws.x_plus, q=ws.q_plus, u=ws.u_plus, lam=ws.lam)

    def adjoint_vectors(self) -> Any:
        """The Schur elimination's vectors (`adjoint.AdjointVectors`): the workspace's y (in) and p_u (out), the
        solver's ydyn as its work (p_lam, the rows' part, is the Schur solve's: `SchurScratch.x`)."""
        ws, sv = self.workspace, self.solver
        return make(adj.AdjointVectors, y_u=ws.y_u, y_lam=ws.y_lam, w_u=ws.p_u, ydyn=sv.ydyn)

    def evaluate_loaded(self) -> None:
        """The loaded step's M~ at q- and one evaluation of the recorded residual."""
        m, sv, o, ws, h = self.model, self.solver, self.solver.options, self.workspace, self.sim.dt
        # M~ at q- and friends (not differentiated: only the operator uses them)
        self.launches.launch(prepare_bodies, m.body_count,
                             [sv.model_arrays, sv.body_inertia_unit, wp.vec3(*sv._gravity()), h, int(o.gyroscopic),
                              ws.body_q, ws.body_qd], [sv.step_data, sv.u])
        fwd = self.recorded(h).fwd
        ws.jt_lam.zero_()
        fwd[0].launch()  # kinematics first: the truncated pullback copies its geometry
        if self.sim.pullback == "truncated":
            wp.copy(ws.x_geom, ws.x_plus)
            wp.copy(ws.q_geom, ws.q_plus)
            wp.copy(ws.xp_geom, ws.x_prev)
            wp.copy(ws.qp_geom, ws.q_prev)
        for c in fwd[1:]:
            c.launch()

    def zero_grads(self) -> None:
        for g in self.recorded(self.sim.dt).grads:
            g.zero_()

    def sweep(self, seed: Callable[[], None]) -> None:
        """One VJP sweep of the residual: adjoints zeroed, ``seed()`` writes dL/dr, reverse launches."""
        self.zero_grads()
        seed()
        for c in reversed(self.recorded(self.sim.dt).bwd):
            c.launch()
