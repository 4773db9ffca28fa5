"""`SolverOstrich`: a drop-in newton solver (``step(state_in, state_out, control, contacts, dt)``)
running the non-smooth Newton step of the Ostrich paper with hard contact at large timesteps.

The step, in named phases (Dojo-style):
    collide   newton's collision at q- (unless contacts are given)
    prepare   q-, u-, M~ at q-, external impulses, contact slots per world, servo targets
    newton    `newton_iters` fused iterations in one launch (rows at q+, residual, best iterate, PCR, update)
    finalize  evaluate the last iterate, return the best one from k_min onward, write state_out
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import newton
import numpy as np
import warp as wp
from newton.solvers import SolverBase

from . import adjoint as adj
from . import preload
from .contact import RAW_CONTACTS_PER_SLOT, gather_contacts, mesh_contact_arrays, prepare_contacts
from .errors import EngineError, UnsupportedModelError
from .graph_kernels import keep_max
from .graphs import COLLISION_LOCK, LaunchCache
from .layout import world_layout
from .step import iteration_kernel, prepare_bodies, prepare_joints, warm_start, write_output
from .types import (
    LANE_WIDTHS,
    LANES,
    LANES_WIDE_FROM,
    Contacts,
    FrictionCombine,
    FrictionSafeguard,
    Iterate,
    JointModel,
    JointRow,
    ModelArrays,
    NewtonIterate,
    NewtonOptions,
    NewtonStep,
    Poses,
    Rows,
    SchurScratch,
    SolverOptions,
    StepCode,
    StepConstants,
    StepData,
    host_array,
    lane_types,
    lane_width,
    make,
    zeros_group,
)

__all__ = ["EngineError", "SolverOstrich", "StepStatus", "UnsupportedModelError"]  # errors re-exported

# Collision pipelines not yet collected (every solver makes its own), and their number that starts a full collection
# (`_collect_pipelines`)
_PIPELINES: weakref.WeakSet[newton.CollisionPipeline] = weakref.WeakSet()
PIPELINES_COLLECT_AT = 8
_collect_at = PIPELINES_COLLECT_AT


def _collect_pipelines(device: wp.Device | str) -> None:
    """A full garbage collection once `_collect_at` of the solvers' collision pipelines are not yet collected (the
    bound then twice those still alive, at least PIPELINES_COLLECT_AT). Every pipeline makes its own copies of
    newton's narrow-phase kernels, and Warp re-hashes all live copies whenever a new one appears, at a cost that
    grows with their number; a dropped pipeline lives on until Python's full collection (it sits in reference
    cycles, as a `Simulation` and its tape do), which a process holding many long-lived objects, such as one that
    has just compiled kernels, gets seldom. Not during a graph capture."""
    global _collect_at
    if len(_PIPELINES) < _collect_at or wp.get_device(device).is_capturing:
        return
    gc.collect()
    _collect_at = max(PIPELINES_COLLECT_AT, 2 * len(_PIPELINES))


# Groups of worlds per launch thread of the Newton iteration on a CPU (SolverOstrich._thread_groups): 8 measured
# best (docs/results.md, "Groups per launch thread")
THREAD_GROUPS = 8

@dataclass
class StepStatus:
    """Per-world convergence report of the last step (numpy arrays of shape (world_count,)).

    residual: best residual norm [m/s]; dynamics / constraints: its two parts [m/s];
    best_iteration: index of the returned iterate (-1: none admissible, u- kept);
    iterations: last iteration evaluated; converged / stalled / diverged: flags (below tol; stopped at
    the float32 floor below stall_tol: SolverOptions; non-finite iterate met); contacts: contact
    count; contacts_dropped: contacts beyond max_contacts_per_world.
    """

    residual: np.ndarray
    dynamics: np.ndarray
    constraints: np.ndarray
    best_iteration: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray
    stalled: np.ndarray
    diverged: np.ndarray
    contacts: np.ndarray
    contacts_dropped: np.ndarray
    trace: np.ndarray  # (world_count, newton_iters + extra_iters + 1) residual per iteration [m/s]


class SolverOstrich(SolverBase):
    """Backward-Euler maximal-coordinate rigid bodies with hard NCP contact, friction, joints and servos.

    Args:
        model: a finalized ``newton.Model``; every world must hold the same bodies and joints
            (as ``ModelBuilder.replicate`` produces). Joints: free, revolute (with an optional
            servo from ``joint_target_ke/kd``), fixed, ball.
        options: tolerances and budgets (``SolverOptions``).
        rigid_contact_max: capacity of the solver's own collision pipeline (used when ``step``
            gets ``contacts=None``).

    Physical parameters live in warp arrays on the solver so they can be changed (and
    differentiated) without rebuilding: ``body_mass`` [kg] (inertia scales with it),
    ``shape_mu`` / ``shape_mu_lat`` (longitudinal / lateral Coulomb coefficients),
    ``shape_slip`` [m/s] (friction slip speed, 0 = exact Coulomb; ``set_slip_speed``),
    ``shape_slip_lat`` [m/s] (lateral slip speed of the combined-slip law, 0 = one slip speed),
    ``joint_ke`` [N m/rad], ``joint_kd`` [N m s/rad] servo gains, ``joint_cmd_scale``
    (multiplies velocity targets). ``set_anisotropic_friction`` marks wheel shapes.
    """

    def __init__(self, model: newton.Model, options: SolverOptions | None = None, rigid_contact_max: int | None = None):
        super().__init__(model)
        self.options = options or SolverOptions()
        self.options.validate()
        self._rigid_contact_max = rigid_contact_max
        self._g_host: np.ndarray | None = None  # gravity [m/s^2], read once (_gravity)
        self._pipeline: newton.CollisionPipeline | None = None
        self._own_contacts: newton.Contacts | None = None
        self._layout(model)
        self._allocate(model)
        # the modules of the step's kernels compile on a background thread from here, beside newton's collision
        # modules (compiled on the first collide); _prepare waits for them (preload.py)
        self._compiling: list[Any] | None = self._step_modules()
        preload.start(self._compiling, self.device)
        self._launch_cache: dict[tuple[Any, ...], Any] = {}  # (h, options) -> recorded newton_iteration launch
        self._cmds = LaunchCache(self.device, limit=256)  # _launch's recorded launches

    # ------------------------------------------------------------------ set-up
    def _layout(self, model: newton.Model) -> None:
        lay = world_layout(model)
        self.world_count = lay.world_count
        self.bodies_per_world = lay.bodies_per_world
        self.joints_per_world = lay.joints_per_world
        jrow_joint, jrow_kind = lay.jrow_joint, lay.jrow_kind
        joint_axis, joint_ke, joint_kd = lay.joint_axis, lay.joint_ke, lay.joint_kd
        self.joint_rows = len(jrow_joint)
        self.max_contacts = self.options.max_contacts_per_world
        self.max_rows = self.joint_rows + 3 * self.max_contacts
        # newton's contacts per world before the merge (prepare_contacts): a wheel on a mesh reports ~10
        self.max_raw = RAW_CONTACTS_PER_SLOT * self.max_contacts
        self._jrow_joint = np.asarray(jrow_joint or [0], dtype=np.int32)
        self._jrow_kind = np.asarray(jrow_kind or [0], dtype=np.int32)
        self._joint_axis = joint_axis
        self._joint_ke = joint_ke
        self._joint_kd = joint_kd
        self._has_servo = np.zeros(model.joint_count, dtype=bool)
        for jl, kind in zip(jrow_joint, jrow_kind):
            if kind == JointRow.SERVO:
                self._has_servo[jl :: max(self.joints_per_world, 1)] = True

    def _allocate(self, model: newton.Model) -> None:
        d = self.device
        nb, nw = model.body_count, self.world_count
        nj = max(model.joint_count, 1)
        R = nw * self.max_rows
        C = nw * self.max_contacts
        mass = host_array(model.body_mass).astype(np.float32)
        inertia = host_array(model.body_inertia).astype(np.float32)
        unit = np.where(mass[:, None, None] > 0, inertia / np.maximum(mass, 1e-30)[:, None, None], 0.0)
        ns_ = model.shape_count

        def z(n: int, dt: Any = float) -> wp.array[Any]:
            return wp.zeros(max(n, 1), dtype=dt, device=d)

        # parameters (differentiable inputs of the residual)
        self.body_mass: wp.array[Any] = wp.array(mass, dtype=float, device=d)
        self.body_inertia_unit: wp.array[Any] = wp.array(unit.astype(np.float32), dtype=wp.mat33, device=d)
        mu = host_array(model.shape_material_mu).astype(np.float32) if ns_ else np.zeros(1, np.float32)
        self.shape_mu: wp.array[Any] = wp.array(mu, dtype=float, device=d)
        self.shape_mu_lat: wp.array[Any] = wp.array(mu.copy(), dtype=float, device=d)
        self.shape_slip = wp.zeros(max(ns_, 1), dtype=float, device=d)
        self.shape_slip_lat = wp.zeros(max(ns_, 1), dtype=float, device=d)
        self.shape_aniso = wp.zeros(max(ns_, 1), dtype=int, device=d)
        self.friction_combine = wp.zeros(max(ns_, 1), dtype=int, device=d)  # per shape (set_friction_combine)
        self.shape_mesh, self.shape_face_start, self.mesh_cn, self.mesh_sharp = mesh_contact_arrays(model, d)
        one = np.zeros(1, np.float32)
        self.joint_ke: wp.array[Any] = wp.array(self._joint_ke if model.joint_count else one, dtype=float, device=d)
        self.joint_kd: wp.array[Any] = wp.array(self._joint_kd if model.joint_count else one, dtype=float, device=d)
        self.joint_cmd_scale: wp.array[Any] = wp.array(np.ones(nj, np.float32), dtype=float, device=d)
        # servo torque limit [N m] per joint (0: none); newton's joint_effort_limit is not read
        # (its default is a finite placeholder), a limit is set explicitly, e.g. by a registered parameter
        self.joint_effort_limit: wp.array[Any] = wp.array(np.zeros(nj, np.float32), dtype=float, device=d)
        self.joint_axis_j: wp.array[Any] = wp.array(
            self._joint_axis if model.joint_count else np.zeros((1, 3), np.float32), dtype=wp.vec3, device=d)
        self.jrow_joint: wp.array[Any] = wp.array(self._jrow_joint, dtype=int, device=d)
        self.jrow_kind: wp.array[Any] = wp.array(self._jrow_kind, dtype=int, device=d)
        # per-step data
        self.x_prev = z(nb, wp.vec3)
        self.q_prev = z(nb, wp.quat)
        self.u_prev = z(nb, wp.spatial_vector)
        self.inv_m = z(nb)
        self.I_w = z(nb, wp.mat33)
        self.inv_I = z(nb, wp.mat33)
        self.f_imp = z(nb, wp.spatial_vector)
        self.jt_q = z(nj)
        self.jt_qd = z(nj)
        self.j_qprev = z(nj)
        self.ct_count = z(nw, int)
        self.ct_overflow = z(nw, int)
        self.ct_dropped = z(nw, int)  # most contacts dropped in one step, per world, since the last report
        self.defer_contact_check = False  # set by a recorded rollout: no host read after a step
        self._zw = wp.zeros(model.body_count, dtype=int, device=d)  # world index 0 of every body (one world)
        self.ct_src = z(nw * self.max_raw, int)
        self.ct_shape0 = z(C, int)
        self.ct_shape1 = z(C, int)
        self.ct_p0 = z(C, wp.vec3)
        self.ct_p1 = z(C, wp.vec3)
        self.ct_n = z(C, wp.vec3)
        self.ct_nbody = z(C, int)
        self.ct_thick = z(C)
        self.ct_axial0 = z(C)
        self.ct_axial1 = z(C)
        self.ct_fric_shape = z(C, int)
        self.ct_single = z(C, int)
        self.ct_nw = z(C, wp.vec3)
        # previous step, for warm starting
        self.prev_count = z(nw, int)
        self.prev_shape0 = z(C, int)
        self.prev_shape1 = z(C, int)
        self.prev_normal = z(C, wp.vec3)
        self.prev_lam = z(R)
        self._has_prev = False
        # iterate, best iterate and status
        self.u = z(nb, wp.spatial_vector)
        self.lam = z(R)
        self.u_best = z(nb, wp.spatial_vector)
        self.lam_best = z(R)
        self.u_sol = z(nb, wp.spatial_vector)
        self.best_norm = z(nw)
        self.best_k = z(nw, int)
        self.done = z(nw, int)
        self.status_code = z(nw, int)
        self.iters = z(nw, int)
        self.res_dyn = z(nw)
        self.res_con = z(nw)
        self.n_rows = z(nw, int)
        self._trace_len = self.options.newton_iters + self.options.extra_iters + 1
        self.res_trace = z(nw * self._trace_len)  # residual norm per iteration [m/s]
        # scratch
        self.x_it = z(nb, wp.vec3)
        self.q_it = z(nb, wp.quat)
        self.tmp = z(nb, wp.spatial_vector)
        self.ydyn = z(nb, wp.spatial_vector)
        self.rows = zeros_group(Rows, max(R, 1), d, inv_m=self.inv_m, inv_I=self.inv_I)
        self.pcr = [z(R) for _ in range(7)]  # rhs, dl, r, z, p, Az, Ap
        self.pcr_y64 = z(R, wp.float64)
        self.pcr_perm = z(R, int)  # the dense factor's row order and envelope (`schur.dense_factor`)
        self.no_skip = z(nw, int)  # the residual kernels' per-world skip, none (adjoint.residual_joint_angles)
        self.pcr_env = z(R, int)
        self._dense_S: wp.array[Any] | None = None
        self._lanes_scratch: dict[tuple[int, int], Any] = {}  # (lanes, dm) -> LaneScratch
        # friction_safeguard="newton": per contact the sliding direction of its rotated rows and the
        # pinned share (e1, e2, sliding flag, dl~_par), and the last pinned lam_n and its change
        self.ct_fdir = z(C, wp.vec4)
        self.ct_pin = z(C, wp.vec2)
        # backtracking (line_search_from): last accepted norm, step fraction, iterate and step
        self.ls_ref = z(nw)
        self.ls_alpha = z(nw)
        self.u_ls = z(nb, wp.spatial_vector)
        self.du_ls = z(nb, wp.spatial_vector)
        self.lam_ls = z(R)
        self.dl_ls = z(R)
        self._shape_key_stride = max(ns_, 1) + 1
        self._make_groups()

    def _make_groups(self) -> None:
        """The kernels' array groups (`types.py`), built once: they reference the arrays allocated above."""
        m = self.model
        self.joints = make(JointModel, parent=m.joint_parent, child=m.joint_child, X_p=m.joint_X_p, X_c=m.joint_X_c,
                           axis=self.joint_axis_j)
        self.model_arrays = make(
            ModelArrays, body_com=m.body_com, body_mass=self.body_mass, joints=self.joints,
            jrow_joint=self.jrow_joint, jrow_kind=self.jrow_kind, j_ke=self.joint_ke, j_kd=self.joint_kd,
            j_scale=self.joint_cmd_scale, j_tau=self.joint_effort_limit, shape_body=m.shape_body,
            shape_type=m.shape_type, shape_transform=m.shape_transform, shape_scale=m.shape_scale,
            shape_mu=self.shape_mu, shape_mu_lat=self.shape_mu_lat, shape_slip=self.shape_slip,
            shape_slip_lat=self.shape_slip_lat, friction_combine=self.friction_combine, shape_mesh=self.shape_mesh,
            shape_face_start=self.shape_face_start, mesh_cn=self.mesh_cn, mesh_sharp=self.mesh_sharp,
        )
        self.step_data = make(
            StepData, x_prev=self.x_prev, q_prev=self.q_prev, u_prev=self.u_prev, inv_m=self.inv_m, I_w=self.I_w,
            inv_I=self.inv_I, f_imp=self.f_imp, jt_q=self.jt_q, jt_qd=self.jt_qd, j_qprev=self.j_qprev,
        )
        self.contact_slots = make(
            Contacts, count=self.ct_count, shape0=self.ct_shape0, shape1=self.ct_shape1, p0=self.ct_p0, p1=self.ct_p1,
            n=self.ct_n, nbody=self.ct_nbody, thick=self.ct_thick, axial0=self.ct_axial0, axial1=self.ct_axial1,
            fric_shape=self.ct_fric_shape, single=self.ct_single,
        )
        self.schur_scratch = self._schur_scratch()
        self.at = make(Iterate, x=self.x_it, q=self.q_it, u=self.u, lam=self.lam)  # the Newton iterate
        self.iterate = make(
            NewtonIterate, u_best=self.u_best, lam_best=self.lam_best, best_norm=self.best_norm, best_k=self.best_k,
            done=self.done, status=self.status_code, iters=self.iters, res_dyn=self.res_dyn, res_con=self.res_con,
            n_rows=self.n_rows, res_trace=self.res_trace, ydyn=self.ydyn, fdir=self.ct_fdir,
            pin=self.ct_pin, ls_ref=self.ls_ref, ls_alpha=self.ls_alpha, u_ls=self.u_ls, du_ls=self.du_ls,
            lam_ls=self.lam_ls, dl_ls=self.dl_ls,
        )
        # the capacities alone (warm_start), one instance so that _launch's cache, keyed by identity, hits
        self._capacities = self._step_constants(0.0)

    def enable_parameter_gradients(self, names: Sequence[str]) -> None:
        """Give the named parameter arrays gradient arrays (for the adjoint's residual sweeps) and
        rebuild the array groups, whose packed descriptors would otherwise still say "no gradient"
        (a recorded replay refuses such stale descriptors)."""
        for name in names:
            getattr(self, name).requires_grad = True
        self._make_groups()
        self._launch_cache = {}
        self._cmds.clear()

    def _step_constants(self, h: float) -> StepConstants:
        """Step size h [s], capacities and the row constants of the current options, as the kernels read them."""
        o = self.options
        return make(
            StepConstants, h=h, nbody=self.bodies_per_world, njoint=self.joints_per_world, jrows=self.joint_rows,
            max_rows=self.max_rows, max_contacts=self.max_contacts, joint_compliance=o.joint_compliance,
            fb_eps=o.fb_eps, inactive_w=o.inactive_friction_weight, contact_compliance=o.contact_compliance,
        )

    def _shape_ids(self, shapes: int | Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.atleast_1d(np.asarray(shapes, dtype=np.int64))
        if ids.size and (ids.min() < 0 or ids.max() >= self.model.shape_count):
            raise EngineError(f"shape ids {ids.tolist()} out of range [0, {self.model.shape_count})")
        return ids

    def set_anisotropic_friction(self, shapes: int | Sequence[int] | np.ndarray, mu_long: float, mu_lat: float) -> None:
        """Give shapes (wheels: cylinders) separate longitudinal/lateral friction; the lateral
        direction is the shape's local z (a newton cylinder's axis, the wheel axle)."""
        ids = self._shape_ids(shapes)
        aniso = self.shape_aniso.numpy()
        mu = self.shape_mu.numpy()
        mul = self.shape_mu_lat.numpy()
        aniso[ids] = 1
        mu[ids] = mu_long
        mul[ids] = mu_lat
        self.shape_aniso.assign(aniso)
        self.shape_mu.assign(mu)
        self.shape_mu_lat.assign(mul)

    def set_friction_combine(self, rule: str | FrictionCombine,
                             shapes: int | Sequence[int] | np.ndarray | None = None) -> None:
        """How the friction of these shapes' contacts (None: every shape's) follows from the two shapes'
        coefficients (`FrictionCombine`): "wheel" (the default: a wheel's own whatever it touches),
        "max" (MuJoCo's rule), "product", "geometric_mean". A wheel's contacts follow the wheel's rule
        (so a frictionless caster can keep "wheel" while the driven wheels combine). With a rule other
        than "wheel" the surfaces' coefficients (``shape_mu`` of the ground, a pallet, a terrain mesh)
        matter for wheel contacts and are differentiable parameters like the wheels'. Takes effect at
        the next step (the rule is data, not part of a recording)."""
        member = FrictionCombine.of(rule)  # OptionsError for an unknown rule
        codes = self.friction_combine.numpy()
        codes[slice(None) if shapes is None else self._shape_ids(shapes)] = int(member)
        self.friction_combine.assign(codes)

    def friction_combine_of(self, shape: int) -> FrictionCombine:
        """The `FrictionCombine` of a shape's contacts (`set_friction_combine`)."""
        return FrictionCombine(int(self.friction_combine.numpy()[self._shape_ids(shape)[0]]))

    def set_slip_speed(self, shapes: int | Sequence[int] | np.ndarray, slip_speed: float,
                       slip_speed_lat: float = 0.0) -> None:
        """Regularise the friction of these shapes' contacts with a slip speed v_s [m/s] (0, the
        default, is exact Coulomb friction). The friction force is mu lam_n |v| / sqrt(|v|^2 + v_s^2)
        against the slip v (cone-scaled for anisotropic wheels): viscous, mu lam_n / v_s per m/s,
        below v_s and Coulomb above it, like a tyre's linear slip region. It is a physical
        parameter (differentiable, `Simulation.register_parameter(..., "shape_slip", ...)`); it
        also makes the step smooth, so stick/slip switching no longer limits Newton convergence.

        ``slip_speed_lat`` > 0 [m/s] (with v_s > 0) gives the lateral direction its own slip speed:
        the combined-slip law l_k = -mu_k lam_n n_k / sqrt(n_1^2 + n_2^2 + 1), n_k = v_k / v_s,k
        (longitudinal v_s,1 = v_s, lateral v_s,2 = slip_speed_lat; docs/traction.md): stiffness
        mu_k lam_n / v_s,k per direction, saturation on the friction ellipse. Array ``shape_slip_lat``."""
        ids = self._shape_ids(shapes)
        for name, v in (("slip_speed", slip_speed), ("slip_speed_lat", slip_speed_lat)):
            if not (np.isfinite(v) and v >= 0):
                raise EngineError(f"{name} must be finite and >= 0 [m/s]; got {v}")
        if slip_speed_lat > 0 and slip_speed <= 0:
            raise EngineError("slip_speed_lat > 0 needs slip_speed > 0 (the combined-slip law regularises both "
                              "directions); set slip_speed too, or slip_speed_lat = 0")
        vs = self.shape_slip.numpy()
        vs[ids] = slip_speed
        self.shape_slip.assign(vs)
        vl = self.shape_slip_lat.numpy()
        vl[ids] = slip_speed_lat
        self.shape_slip_lat.assign(vl)

    def notify_model_changed(self, flags: int) -> None:
        """Re-read gravity, masses, friction and gains from the model (the solver keeps its own copies)."""
        m = self.model
        self._g_host = None
        self.body_mass.assign(host_array(m.body_mass).astype(np.float32))
        if m.shape_count:
            mu = host_array(m.shape_material_mu).astype(np.float32)
            aniso = self.shape_aniso.numpy().astype(bool)
            self.shape_mu.assign(np.where(aniso, self.shape_mu.numpy(), mu))
            self.shape_mu_lat.assign(np.where(aniso, self.shape_mu_lat.numpy(), mu))

    # ------------------------------------------------------------------ step
    def collide(self, state: newton.State) -> newton.Contacts:
        """Run the solver's own newton collision pipeline at ``state`` and return its contacts."""
        if self._pipeline is None:
            kw: dict[str, Any] = ({} if self._rigid_contact_max is None
                                  else {"rigid_contact_max": self._rigid_contact_max})
            _collect_pipelines(self.device)
            self._pipeline = newton.CollisionPipeline(self.model, **kw)
            _PIPELINES.add(self._pipeline)
            self._own_contacts = self._pipeline.contacts()
        assert self._own_contacts is not None  # created with the pipeline
        # one thread at a time inside newton's CPU tile kernels (graphs.COLLISION_LOCK); a GPU needs no lock
        with COLLISION_LOCK if wp.get_device(self.device).is_cpu else contextlib.nullcontext():
            self._pipeline.collide(state, self._own_contacts)
        return self._own_contacts

    @property
    def own_contacts(self) -> newton.Contacts | None:
        """The contacts the last `collide` wrote (None before the first)."""
        return self._own_contacts

    def step(self, state_in: newton.State, state_out: newton.State, control: newton.Control | None,
             contacts: newton.Contacts | None, dt: float, *, observables: Any = None) -> None:
        """Advance every world by one backward-Euler step of ``dt`` [s]."""
        h = float(dt)
        if not (h > 0.0 and np.isfinite(h)):
            raise EngineError(f"dt must be a positive finite time step in seconds, got {dt!r}")
        if contacts is None:
            contacts = self.collide(state_in)
        self._prepare(state_in, control, contacts, h)
        self._solve(h)
        self._finalize(state_out, h)

    def _launch(self, kernel: wp.Kernel, dim: int, inputs: list[Any], outputs: list[Any]) -> None:
        """wp.launch with the packed command cached by its arguments' identities: a rollout
        alternates two states, so the per-step set-up launches repeat exactly and warp's argument
        packing (not the arithmetic) would dominate a small scene."""
        self._cmds.launch(kernel, dim, inputs, outputs)

    def _step_modules(self) -> list[Any]:
        """The Warp modules of the kernels every step launches."""
        mods = [prepare_bodies.module, iteration_kernel(self._lane_width()).module]
        if self.model.shape_count:
            mods.append(gather_contacts.module)
        if self.model.joint_count:
            mods.append(adj.residual_joint_angles.module)
        return mods

    def _prepare(self, state_in: newton.State, control: newton.Control | None, contacts: newton.Contacts | None,
                h: float) -> None:
        if self._compiling is not None:
            preload.wait(self._compiling)
            self._compiling = None
        m, o = self.model, self.options
        nb = m.body_count
        self._launch(
            prepare_bodies,
            nb,
            inputs=[self.model_arrays, self.body_inertia_unit, wp.vec3(*self._gravity()), h, int(o.gyroscopic),
                    state_in.body_q, state_in.body_qd],
            outputs=[self.step_data, self.u],
        )
        self.ct_count.zero_()
        self.ct_overflow.zero_()
        if contacts is not None and m.shape_count:
            self._launch(
                gather_contacts,
                contacts.rigid_contact_max,
                inputs=[m.shape_body, m.body_world if m.world_count > 1 else self._zw, self.max_raw,
                        contacts.rigid_contact_count, contacts.rigid_contact_shape0, contacts.rigid_contact_shape1],
                outputs=[self.ct_count, self.ct_overflow, self.ct_src],
            )
            self._launch(
                prepare_contacts,
                self.world_count,
                inputs=[self.model_arrays, self.shape_aniso, self.max_contacts, self.max_raw, self._shape_key_stride,
                        self.q_prev, contacts.rigid_contact_shape0, contacts.rigid_contact_shape1,
                        contacts.rigid_contact_point0, contacts.rigid_contact_point1, contacts.rigid_contact_normal,
                        contacts.rigid_contact_margin0, contacts.rigid_contact_margin1, self.ct_src, self.ct_overflow],
                outputs=[self.contact_slots, self.ct_nw],
            )
        if m.joint_count:
            tq = getattr(control, "joint_target_q", None) if control is not None else None
            tqd = getattr(control, "joint_target_qd", None) if control is not None else None
            dummy = self.jt_q
            self._launch(
                prepare_joints,
                m.joint_count,
                inputs=[m.joint_qd_start, m.joint_target_q_start if tq is not None else m.joint_qd_start,
                        tq if tq is not None else dummy, tqd if tqd is not None else dummy,
                        int(tq is not None), int(tqd is not None)],
                outputs=[self.jt_q, self.jt_qd],
            )
            self._joint_angles(self.x_prev, self.q_prev, self.j_qprev)
        self._launch(
            warm_start,
            self.world_count,
            inputs=[self._capacities, int(self.options.warm_start and self._has_prev),
                    self.prev_count, self.prev_shape0, self.prev_shape1, self.prev_normal, self.prev_lam,
                    self.contact_slots, self.ct_nw],
            outputs=[self.lam],
        )
        if self.options.warm_start and self._has_prev:
            # with the previous multipliers, the previous velocity is the consistent first iterate
            wp.copy(self.u, self.u_prev)
        self.lam_best.zero_()
        self.best_norm.fill_(np.inf)
        self.best_k.fill_(-1)
        self.done.zero_()
        self.status_code.fill_(int(StepCode.MAX_ITER))
        self.iters.zero_()
        self.res_trace.fill_(np.nan)

    def _gravity(self) -> np.ndarray:
        """The model's gravity [m/s^2], read from the model once and again after notify_model_changed
        (not per step: on a GPU every read is a synchronisation)."""
        if self._g_host is None:
            g: Any = self.model.gravity  # a warp array (typed optional by newton); a plain vector is accepted too
            g = g.numpy() if hasattr(g, "numpy") else np.asarray(g)
            self._g_host = np.asarray(g, dtype=np.float32).reshape(-1, 3)[0].copy()
        return self._g_host

    def _joint_angles(self, x: wp.array[Any], q: wp.array[Any], out: wp.array[Any]) -> None:
        m = self.model
        self._launch(
            adj.residual_joint_angles,
            m.joint_count,
            inputs=[self.joints, m.body_com, make(Poses, x=x, q=q), self.joints_per_world, self.no_skip],
            outputs=[out],
        )

    def _direct_max(self) -> int:
        o = self.options
        return int(o.direct_max_rows) if o.linear_solver == "direct" else 0

    def _dense(self) -> wp.array[Any]:
        """linear_solver="direct"'s per-world dense factors (nw x dm x dm float64), allocated on first use
        and when direct_max_rows grows (one element when the solver is PCR)."""
        dm = self._direct_max()
        size = max(1, self.world_count * dm * dm)
        if self._dense_S is None or self._dense_S.shape[0] < size:
            self._dense_S = wp.zeros(size, dtype=wp.float64, device=self.device)
        return self._dense_S

    def _lanes(self) -> int:
        """Worlds per thread of the Newton iteration: SolverOptions.lanes, by default on the CPU (the PCR and
        dense factor in vector lanes) 16 from LANES_WIDE_FROM (32) worlds, LANES (8) from 8, else 1 (a thread
        per world: a GPU; fewer worlds would leave lanes idle). The results are the same either way."""
        o = self.options.lanes
        if o is None:
            if not wp.get_device(self.device).is_cpu or self.world_count < LANES:
                return 1
            return LANE_WIDTHS[-1] if self.world_count >= LANES_WIDE_FROM else LANES
        return int(o)

    def _lane_width(self) -> int:
        """The lane width of the kernels that run `lanes` worlds per thread (LANES for a thread per world)."""
        return lane_width(self._lanes())

    def _lane_threads(self, lanes: int) -> int:
        """Threads of a launch with ``lanes`` worlds per thread."""
        return -(-self.world_count // lanes)

    def _thread_groups(self) -> int:
        """Groups of worlds (of `lanes` worlds each) per launch thread of the Newton iteration and the Krylov
        adjoint's preconditioner: THREAD_GROUPS on a CPU, whose launches run their threads one after another and
        where each thread first copies the kernel's argument groups (KiBs: fewer threads, less copying),
        1 on a GPU (a thread per group). The results
        are the same either way."""
        return THREAD_GROUPS if wp.get_device(self.device).is_cpu else 1

    def _group_threads(self, lanes: int) -> int:
        """Threads of a launch with ``lanes`` worlds per group and `thread_groups` groups per thread."""
        return max(1, -(-self._lane_threads(lanes) // self._thread_groups()))

    def _lane_scratch(self, lanes: int, dm: int) -> Any:
        """The lanes' scratch (`LaneScratch`) for dense factors of up to dm rows when lanes > 1 (one element
        per array otherwise): one group's on a CPU, every group's on a GPU; one per (lanes, dm), kept."""
        key = (lanes, dm)
        if key in self._lanes_scratch:
            return self._lanes_scratch[key]
        groups = self._lane_threads(lanes) if lanes > 1 else 0
        lt = lane_types(lane_width(lanes))
        # a CPU launch runs its threads in turn: one slot serves every group; a GPU's run at once
        slots = min(groups, 1) if wp.get_device(self.device).is_cpu else groups
        R = max(1, slots * self.max_rows)
        nb = max(1, slots * self.bodies_per_world)

        def z(n: int, dtype: Any = lt.lanef) -> Any:
            return wp.zeros(n, dtype=dtype, device=self.device)

        SD = max(1, slots * dm * dm)
        RD = max(1, slots * dm)
        ln = make(lt.LaneScratch, slots=max(1, slots), J=z(12 * R), la=z(R, lt.lanei), lb=z(R, lt.lanei),
                  uni=z(R, int), C=z(R), pinv=z(R), rhs=z(R), x=z(R), r=z(R), z=z(R), p=z(R), Az=z(R), Ap=z(R),
                  tmp=z(6 * nb), inv_m=z(nb), inv_I=z(9 * nb), S=z(SD, lt.laned), Jd=z(12 * RD, lt.laned),
                  Y=z(12 * RD, lt.laned), yd=z(RD, lt.laned), pin=z(max(1, slots) * lt.width * 20, float))
        self._lanes_scratch[key] = ln
        return ln

    def _schur_scratch(self) -> Any:
        """The Newton step's Schur solves' group: right-hand side pcr[0], solution (the multipliers' step) pcr[1], the
        PCR's vectors and the dense factors of linear_solver="direct"."""
        rhs, dl, r, z, p, Az, Ap = self.pcr
        return make(SchurScratch, rhs=rhs, x=dl, r=r, z=z, p=p, Az=Az, Ap=Ap, tmp=self.tmp, dm=self._direct_max(),
                    S=self._dense(), y64=self.pcr_y64, perm=self.pcr_perm, env=self.pcr_env)

    def _iteration_args(self, h: float) -> list[Any]:
        """newton_iteration's arguments: the first and last iteration (set per launch), the groups (`NewtonStep`) and
        the lanes' scratch."""
        o = self.options
        opt = make(
            NewtonOptions, pcr_iters=o.pcr_iters, k_min=o.k_min, tol=o.tol, stall_tol=float(o.stall_tol),
            stall_iters=int(o.stall_iters),
            safeguard=int(FrictionSafeguard.of(o.friction_safeguard)), pin_relax=float(o.pin_relax),
            pcr_tol=float(o.pcr_tol), cone_slack=float(o.cone_slack), pcr_iters_newton=int(o.pcr_iters_newton),
            ls_from=int(o.line_search_from), ls_min=float(o.line_search_min), stick_prox=float(o.stick_prox),
            pin_from=int(o.pin_wheels_from), pin_coupled=int(o.pin_coupled),
            energy_norm=int(o.residual_norm == "energy"), prox_decay=float(o.stick_prox_decay),
            prox_decay_from=int(o.stick_prox_decay_from), trace_stride=self._trace_len, lanes=self._lanes(),
            thread_groups=self._thread_groups(),
        )
        scr = self.schur_scratch
        if scr.S is not self._dense() or scr.dm != self._direct_max():  # linear_solver or direct_max_rows changed
            self.schur_scratch = self._schur_scratch()
        st = make(NewtonStep, sc=self._step_constants(h), opt=opt, model=self.model_arrays, data=self.step_data,
                  ct=self.contact_slots, at=self.at, it=self.iterate, rows=self.rows, scr=self.schur_scratch)
        return [0, 1, st, self._lane_scratch(self._lanes(), self._direct_max())]

    def _solve(self, h: float) -> None:
        """The Newton loop: a fixed budget of fused iterations, then one evaluation of the last iterate."""
        K = self.options.newton_iters
        key = (h, self.options.version)  # the launch holds the options' values
        cmd = self._launch_cache.get(key)
        if cmd is None:
            cmd = wp.launch(iteration_kernel(self._lane_width()), self._group_threads(self._lanes()),
                            inputs=self._iteration_args(h),
                            device=self.device, record_cmd=True)
            self._launch_cache = {key: cmd}
        self._iterate(cmd, 0, K)
        E = self.options.extra_iters
        if E > 0 and float(np.max(self.best_norm.numpy())) > self.options.extra_tol:
            # continue from the last iterate; converged worlds are done and skip the launches
            self._iterate(cmd, K + 1, K + E)

    @staticmethod
    def _iterate(cmd: Any, first: int, last: int) -> None:
        """Newton iterations first..last in one launch: each steps the iterate except the last, which only
        evaluates it."""
        cmd.set_param_at_index(0, first)
        cmd.set_param_at_index(1, last)
        cmd.launch()

    def _finalize(self, state_out: newton.State, h: float) -> None:
        m = self.model
        self._launch(
            write_output,
            m.body_count,
            inputs=[h, self.bodies_per_world, self.model_arrays, self.step_data, self.iterate],
            outputs=[self.u_sol, state_out.body_q, state_out.body_qd],
        )
        wp.copy(self.prev_count, self.ct_count)
        wp.copy(self.prev_shape0, self.ct_shape0)
        wp.copy(self.prev_shape1, self.ct_shape1)
        wp.copy(self.prev_normal, self.ct_nw)
        wp.copy(self.prev_lam, self.lam_best)
        self._has_prev = True
        if self.options.check_contacts:
            if self.defer_contact_check:
                self._launch(keep_max, self.world_count, inputs=[self.ct_overflow], outputs=[self.ct_dropped])
            else:
                wp.copy(self.ct_dropped, self.ct_overflow)
                self.report_dropped_contacts(stacklevel=4)

    def report_dropped_contacts(self, stacklevel: int = 2) -> None:
        """Warn if a step since the last report dropped contacts beyond the slots (one host read),
        naming the worlds; then start counting anew."""
        over = self.ct_dropped.numpy()
        if over.any():
            w = np.flatnonzero(over)
            warnings.warn(
                f"SolverOstrich: up to {int(over.max())} contacts per step beyond max_contacts_per_world="
                f"{self.max_contacts} were dropped in worlds {w[:8].tolist()}; raise "
                "SolverOptions.max_contacts_per_world",
                RuntimeWarning,
                stacklevel=stacklevel + 1,
            )
            self.ct_dropped.zero_()

    def reset_warm_start(self) -> None:
        """Forget the previous step: the next step starts its multipliers from zero."""
        self._has_prev = False

    def warm_state(self) -> tuple[wp.array[Any], ...] | None:
        """A copy of the warm-start memory (for checkpointed rollouts to replay bit-identically)."""
        if not self._has_prev:
            return None
        return tuple(wp.clone(a) for a in (self.prev_count, self.prev_shape0, self.prev_shape1, self.prev_normal,
                                            self.prev_lam))

    def set_warm_state(self, state: tuple[wp.array[Any], ...] | None) -> None:
        if state is None:
            self._has_prev = False
            return
        for dst, src in zip((self.prev_count, self.prev_shape0, self.prev_shape1, self.prev_normal, self.prev_lam),
                            state):
            wp.copy(dst, src)
        self._has_prev = True

    def status(self) -> StepStatus:
        """Convergence report of the last step, per world."""
        code = self.status_code.numpy()
        bk = self.best_k.numpy()
        return StepStatus(
            residual=self.best_norm.numpy().copy(),
            dynamics=self.res_dyn.numpy().copy(),
            constraints=self.res_con.numpy().copy(),
            best_iteration=bk.copy(),
            iterations=self.iters.numpy().copy(),
            converged=code == StepCode.CONVERGED,
            stalled=code == StepCode.STALLED,
            diverged=(code == StepCode.DIVERGED) | (bk < 0),
            contacts=np.minimum(self.ct_count.numpy(), self.max_contacts),
            contacts_dropped=self.ct_overflow.numpy().copy(),
            trace=self.res_trace.numpy().reshape(self.world_count, -1).copy(),
        )
