"""Named array layouts, units, codes and the solver options of the Ostrich engine: the one place that
declares what the kernels exchange.

Layout (mujoco_warp style): every per-world quantity lives in a flat array indexed
``world * capacity + local``; per-body quantities use newton's global body index (``nb`` bodies over
all worlds, ``nbody`` per world), joints likewise (``nj``, ``njoint``). Rows: ``nw * max_rows`` with
``max_rows = jrows + 3 max_contacts``: a world's joint rows first, then three per contact slot (normal,
longitudinal friction, lateral friction). Contact slots: ``nw * max_contacts``.

The kernels take their arrays in the `wp.struct` groups below, built once on the host (`SolverOstrich`), so an
array is declared once, as a named field, and a kernel's argument list cannot be reordered by mistake
(docs/architecture.md, "Kernel convention"):
    `ModelArrays`    model and physical parameters (differentiable ones are `SolverOstrich` arrays); its joints
                     in `JointModel`
    `StepConstants`  step size, per-world capacities and the row constants of `SolverOptions`
    `StepData`       set once per step at q- by the set-up kernels
    `Contacts`       the step's contact slots (`ContactRecord`: a rollout's record of them)
    `Poses`          bodies' poses in centre-of-mass form
    `Iterate`        an iterate (poses at q+, twists, multipliers): what the rows are built at
    `Rows`           the constraint rows of the current iterate and the inverse masses they couple through
    `SchurScratch`   the Schur solves' right-hand side, solution and work vectors
    `NewtonIterate`  the Newton iterate's best copy, status and the safeguards' memory
    `NewtonOptions`  the Newton iteration's options
    `NewtonStep`     the Newton iteration's groups in one

Joint servo parameters (per joint, `SolverOstrich` arrays, registered by name in `Simulation`):
    joint_ke         position gain [N m/rad] (newton's target_ke), used with a position target
    joint_kd         velocity gain [N m s/rad] (newton's target_kd): in velocity-target mode the
                     servo is tau = joint_kd (s * qd_target - qd+), solved implicitly (eq. 8,
                     compliance 1 / (h joint_kd)). sysid's replay parameter ``kp`` (and the
                     paper's "kp" of the wheel servos) is this array: a velocity-servo gain,
                     not a position gain.
    joint_cmd_scale  s, the command scale applied to the servo's targets (sysid's cmd_scale): tau =
                     joint_ke (s q_target - q+) + joint_kd (s qd_target - qd+), the angle error
                     modulo 2 pi; q_target the integral of qd_target makes a PI velocity servo
                     of integral gain joint_ke (sysid's ``ki``)
    joint_effort_limit  servo torque limit [N m] (0: none), saturating smoothly (`rows.joint_row_law`)
Revolute joints only carry servos; no speed saturation is modelled.
"""

import itertools
import math
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from types import SimpleNamespace
from typing import Any, ClassVar, TypeVar

import numpy as np
import warp as wp

from .errors import OptionsError

# The enums below are the only declaration of these codes: warp kernels read their members as compile-time
# constants (``RowKind.FRICTION`` in a kernel is the literal 3), the host code compares with the same members.


class RowKind(IntEnum):
    """Kind of a constraint row (``row_kind``), written by `rows.build_rows`."""

    JOINT = 0
    SERVO = 1
    NORMAL = 2
    FRICTION = 3
    SERVO_LIMITED = 4  # a servo row with a torque limit (joint_effort_limit > 0)


class JointRow(IntEnum):
    """Kind of a joint row (``jrow_kind``, per joint row, fixed at model set-up), see `constraints.joint_row_at`."""

    POS_X = 0
    POS_Y = 1
    POS_Z = 2
    HINGE_1 = 3  # revolute: child axis orthogonal to parent basis vector 1
    HINGE_2 = 4
    ROT_X = 5  # fixed joint: relative rotation vector components
    ROT_Y = 6
    ROT_Z = 7
    SERVO = 8  # revolute servo: relative angular velocity about the axis


class StepCode(IntEnum):
    """Per-world outcome of a step (``status_code``), written by `step.newton_iteration`."""

    CONVERGED = 0  # residual below SolverOptions.tol
    MAX_ITER = 1  # budget used up; best iterate returned
    DIVERGED = 2  # non-finite iterate met; best admissible iterate returned
    STALLED = 3  # best residual below SolverOptions.stall_tol and no longer falling (the float32 floor)


class FrictionSafeguard(IntEnum):
    """`SolverOptions.friction_safeguard` as the kernels see it (`SafeguardMode` says what each does)."""

    CLAMP = 0
    PROJECTED = 1
    ACTIVE = 2
    NEWTON = 3

    @classmethod
    def of(cls, name: str) -> "FrictionSafeguard":
        """The member of an option value ("clamp", "projected", "active", "newton")."""
        return cls[name.upper()]


class FrictionCombine(IntEnum):
    """How a contact's friction coefficients follow from its two shapes' (`SolverOstrich.set_friction_combine`).

    WHEEL: a contact with a wheel (an anisotropic shape) takes the wheel's own coefficients whatever it
    touches; other contacts the mean of the two shapes'. MAX: the larger of the two (MuJoCo's rule).
    PRODUCT: their product. GEOMETRIC_MEAN: sqrt of the product. Under MAX, PRODUCT and GEOMETRIC_MEAN a
    wheel's longitudinal and lateral coefficients are each combined with the surface's one coefficient
    (``shape_mu`` of the ground, a pallet, a terrain mesh)."""

    WHEEL = 0
    MAX = 1
    PRODUCT = 2
    GEOMETRIC_MEAN = 3

    @classmethod
    def of(cls, name: "str | FrictionCombine") -> "FrictionCombine":
        """The member of a rule name ("wheel", "max", "product", "geometric_mean") or the member itself."""
        if isinstance(name, FrictionCombine):
            return name
        try:
            return cls[str(name).upper()]
        except KeyError:
            raise OptionsError(f"friction combine rule {name!r}: use one of "
                               f"{', '.join(m.name.lower() for m in cls)}") from None


# The closed sets of SolverOptions. A field takes a member or its string ("newton"), stores the member, and the
# member compares equal to the string. Members marked experimental are kept only to compare with the default
# (SolverOptions.EXPERIMENTAL names the benchmark of each).


class SafeguardMode(StrEnum):
    """`SolverOptions.friction_safeguard`: how a Newton step keeps friction in its cone and decides stick or slip,
    each with eq. 7's exact Coulomb fixed points (the kernels' code: `FrictionSafeguard`)."""

    NEWTON = "newton"  # semismooth Alart-Curnier rows for redundant contact sets, and wheels from pin_wheels_from
    ACTIVE = "active"  # experimental: a contact whose trial impulse leaves the cone gets the sliding weight
    CLAMP = "clamp"  # experimental: the paper's clamp of the impulses to the cone after the step
    PROJECTED = "projected"  # experimental: clamped contacts pinned to the projection, the rest solved again


class ResidualNorm(StrEnum):
    """`SolverOptions.residual_norm`: how a body's dynamics residual M~^-1 r_dyn is measured."""

    ENERGY = "energy"  # kinetic-energy metric per unit mass: rotation counts at the radius of gyration, all m/s
    VELOCITY = "velocity"  # experimental: linear [m/s] and angular [rad/s] parts summed as they are


class LinearSolver(StrEnum):
    """`SolverOptions.linear_solver`: the Schur solve (eq. 12) in worlds whose wheels are pinned; other worlds,
    and worlds touching a triangle mesh, take the PCR whatever the choice."""

    DIRECT = "direct"  # the Schur matrix Cholesky-factored in float64 once per iteration, each row's envelope only
    PCR = "pcr"  # experimental: the paper's matrix-free PCR


class AdjointMode(StrEnum):
    """`SolverOptions.adjoint`: the adjoint solves the transposed step Jacobian exactly, the one mode ("schur",
    the paper's single Schur solve with the lagged friction weight, is refused: wrong under sliding contact)."""

    EXACT = "exact"


class AdjointSolver(StrEnum):
    """`SolverOptions.adjoint_solver`: the linear solve of the adjoint (and of the tangents: always the LU)."""

    KRYLOV = "krylov"  # per-world GMRES on the device, Schur-preconditioned; the LU for a world that misses adjoint_tol
    LU = "lu"  # per-world dense LU in float64: where gradient entries far below their row's largest matter
    GMRES = "gmres"  # experimental: GMRES on the host over all worlds at once


_OPTIONS_VERSIONS = itertools.count(1)  # SolverOptions.version


@dataclass
class SolverOptions:
    """Every tolerance and budget of the non-smooth Newton step and its adjoint, in one place.

    Units are SI; residuals are velocities [m/s]. How to choose them: docs/engine.md, "Options"; the
    measurements behind the defaults: docs/results.md. A closed set is a `StrEnum` (`CHOICES`): give the
    member or its string. The modes in `EXPERIMENTAL` are kept only to compare with the defaults.

    Attributes:
        newton_iters: Newton iterations per step (a budget; a world stops early at tol or at the stall exit).
        extra_iters: up to this many more iterations for the worlds still above extra_tol after the budget
            (slow transients such as a traction-limited wheel-speed step); costs one host read per step. 0: off.
        extra_tol: residual [m/s] above which a world gets the extra iterations.
        pcr_iters: preconditioned conjugate residual (PCR) iterations per Newton iteration.
        k_min: first Newton iterate eligible as the returned best iterate (keeps under-converged early
            iterates out).
        tol: residual norm [m/s] below which a world stops iterating.
        stall_tol: a world whose best residual is below this [m/s] and has not halved over the last
            stall_iters iterates stops (StepCode.STALLED: the residual's float32 floor). 0: off.
        stall_iters: iterates without halving before the stall exit.
        residual_norm: how a body's dynamics residual is measured (`ResidualNorm`).
        joint_compliance: bilateral joint compliance E [m/(N s)] (eq. 3), >= 0.
        fb_eps: smoothing of the Fischer-Burmeister square root [m].
        contact_compliance: normal-contact compliance relative to the row's inverse effective mass
            (dimensionless). Makes coplanar contact sets (a box's four corners) determinate, so the adjoint
            is well posed; resting penetration about c g h^2.
        inactive_friction_weight: friction weight W, in units of the row's inverse effective mass, of
            contacts carrying no normal impulse (they slip freely).
        max_contacts_per_world: contact slots per world after merging (newton's contacts before the merge
            get contact.RAW_CONTACTS_PER_SLOT times as many); overflow at either stage is reported.
        friction_safeguard: how a Newton step keeps friction in the cone and decides stick or slip
            (`SafeguardMode`).
        pin_relax: "newton": relaxation of a pinned contact's lagged normal impulse when it reverses its
            change (only where the lag is used: pin_coupled off or more than four pins). 0: the plain lag.
        cone_slack: "newton": a semismooth contact's update is projected onto its cone widened by this
            factor (>= 1; 1 is the plain clamp).
        pcr_tol: "newton": worlds with semismooth contacts run PCR until the preconditioned residual falls
            by this factor (cap pcr_iters_newton); other worlds keep the fixed pcr_iters.
        pcr_iters_newton: PCR iteration cap of those worlds.
        line_search_from: "newton": from this Newton iteration on, worlds with redundant contact sets
            backtrack on the residual norm (halving the step down to line_search_min).
        line_search_min: smallest step fraction of the backtracking.
        pin_wheels_from: "newton": from this Newton iteration on, single exact-Coulomb contacts (wheels)
            take the semismooth rows too (sticking: v = 0 with stick_prox; sliding: pinned to the cone). 0: off.
        pin_coupled: "newton": the pinned magnitude of every sliding contact is solved with the step
            (npin + 1 solves per iteration, npin <= 4) instead of lagging one iteration.
        stick_prox: "newton": proximal term of a sticking row's step (Schur matrix only; the fixed point
            stays exact); fixes the split of an indeterminate sticking set.
        stick_prox_decay: on single contacts (wheels) the proximal term's factor per iteration after
            stick_prox_decay_from (1: constant), so a sticking wheel pair's internal lateral force settles.
        stick_prox_decay_from: the iteration after which the proximal term fades.
        check_contacts: warn after a step that dropped contacts beyond the slots (a host read).
        warm_start: start each step's multipliers from the previous step's (contacts matched by shape pair
            and normal); a rollout (`Simulation.forward`) resets it at its start.
        gyroscopic: include the gyroscopic term -omega x I omega (linearly implicit impulse).
        adjoint_pcr_iters: PCR iterations of the adjoint's Schur solves (eq. 18).
        linear_solver: the Schur solve (eq. 12) in worlds whose wheels are pinned (`LinearSolver`).
        direct_max_rows: active rows per world above which a world keeps the PCR (memory of the dense
            factor: direct_max_rows^2 float64 per world).
        lanes: worlds per thread of the Newton iteration: None (default; on a CPU 16 from LANES_WIDE_FROM
            worlds, 8 from 8, else 1), 1, 8 or 16. Results are the same bit for bit.
        adjoint: what the adjoint solves (`AdjointMode`: the exact transposed step Jacobian, the one mode).
        adjoint_solver: the linear solve of the adjoint (`AdjointSolver`).
        adjoint_tol: relative residual |A^T w - b| / |b| per world and step above which an adjoint (or
            tangent) solve counts as not converged; a RuntimeWarning names it.
        adjoint_max_iters: GMRES iterations (adjoint_solver="gmres").
        adjoint_krylov_iters: iterations per restart cycle of the Krylov adjoint (one VJP sweep each).
        adjoint_krylov_cycles: the most restart cycles; the next runs only if a world still needs it.
        adjoint_krylov_tol: the Krylov solve's target relative residual; None (default): 0.2 x adjoint_tol.
    """

    # field -> its closed set
    CHOICES: ClassVar[dict[str, type[StrEnum]]] = {
        "friction_safeguard": SafeguardMode,
        "residual_norm": ResidualNorm,
        "linear_solver": LinearSolver,
        "adjoint": AdjointMode,
        "adjoint_solver": AdjointSolver,
    }
    # the experimental modes: (field, member) -> the benchmark that compares it with the default
    EXPERIMENTAL: ClassVar[dict[tuple[str, StrEnum], str]] = {
        ("friction_safeguard", SafeguardMode.ACTIVE): "benchmarks/bench_convergence.py --safeguard active",
        ("friction_safeguard", SafeguardMode.CLAMP): "benchmarks/bench_convergence.py --safeguard clamp",
        ("friction_safeguard", SafeguardMode.PROJECTED): "benchmarks/bench_convergence.py --safeguard projected",
        ("residual_norm", ResidualNorm.VELOCITY): "benchmarks/bench_convergence.py --set residual_norm=velocity",
        ("linear_solver", LinearSolver.PCR): "benchmarks/bench_convergence.py --set linear_solver=pcr stall_tol=0",
        ("adjoint_solver", AdjointSolver.GMRES): "benchmarks/bench_jacobian.py",
    }

    newton_iters: int = 16
    extra_iters: int = 0
    extra_tol: float = 1.0e-3
    pcr_iters: int = 16
    k_min: int = 4
    tol: float = 1.0e-6
    stall_tol: float = 1.0e-5
    stall_iters: int = 2
    joint_compliance: float = 1.0e-7
    fb_eps: float = 1.0e-8
    contact_compliance: float = 2.0e-4
    inactive_friction_weight: float = 1.0e3
    max_contacts_per_world: int = 48
    friction_safeguard: SafeguardMode | str = SafeguardMode.NEWTON
    pin_relax: float = 0.5
    pcr_tol: float = 1.0e-6
    pcr_iters_newton: int = 64
    line_search_from: int = 8
    line_search_min: float = 0.0625
    stick_prox: float = 2.0e-5
    stick_prox_decay: float = 0.3
    stick_prox_decay_from: int = 8
    pin_wheels_from: int = 4
    pin_coupled: bool = True
    residual_norm: ResidualNorm | str = ResidualNorm.ENERGY
    cone_slack: float = 2.0
    check_contacts: bool = True
    gyroscopic: bool = True
    warm_start: bool = True
    adjoint_pcr_iters: int = 64
    linear_solver: LinearSolver | str = LinearSolver.DIRECT
    direct_max_rows: int = 64
    lanes: int | None = None
    adjoint: AdjointMode | str = AdjointMode.EXACT
    adjoint_solver: AdjointSolver | str = AdjointSolver.KRYLOV
    adjoint_tol: float = 1.0e-6
    adjoint_max_iters: int = 40
    adjoint_krylov_iters: int = 6
    adjoint_krylov_cycles: int = 4
    adjoint_krylov_tol: float | None = None

    # a number fresh at construction and at every assignment, unique across all SolverOptions: launches
    # recorded with older values know they are stale (a field, so that copies made through vars() or
    # dataclasses.replace construct; not part of repr or ==)
    _version: int = field(default=0, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        choices = self.CHOICES.get(name)
        if choices is not None:
            try:  # a string of the set becomes its member; anything else stays as given, for validate to name
                value = choices(value)
            except ValueError:
                pass
        object.__setattr__(self, name, value)
        if name != "_version":
            object.__setattr__(self, "_version", next(_OPTIONS_VERSIONS))

    def __post_init__(self) -> None:
        object.__setattr__(self, "_version", next(_OPTIONS_VERSIONS))

    @property
    def krylov_tol(self) -> float:
        """The Krylov adjoint's target relative residual: adjoint_krylov_tol, by default 0.2 x adjoint_tol."""
        return float(0.2 * self.adjoint_tol if self.adjoint_krylov_tol is None else self.adjoint_krylov_tol)

    @property
    def version(self) -> int:
        """A number no other assignment to any SolverOptions had (recorded launches key on it)."""
        return self._version

    def validate(self) -> None:
        """Raise an `OptionsError` naming the first field out of its range or not one of its choices."""
        if self.newton_iters < 1 or self.pcr_iters < 1 or self.adjoint_pcr_iters < 1:
            raise OptionsError("newton_iters, pcr_iters and adjoint_pcr_iters must be >= 1")
        if self.extra_iters < 0 or self.extra_tol < 0:
            raise OptionsError("extra_iters and extra_tol must be >= 0")
        if not (math.isfinite(self.stall_tol) and self.stall_tol >= 0) or not (
                isinstance(self.stall_iters, int) and self.stall_iters >= 1):
            raise OptionsError(f"stall_tol must be finite and >= 0 [m/s] (0: off) and stall_iters a whole number >= 1; "
                               f"got {self.stall_tol}, {self.stall_iters!r}")
        if not 0 <= self.k_min < self.newton_iters + 1:
            raise OptionsError(f"k_min must lie in [0, newton_iters]; got {self.k_min}")
        if self.joint_compliance < 0 or self.tol < 0 or self.fb_eps <= 0:
            raise OptionsError("joint_compliance and tol must be >= 0, fb_eps > 0")
        if not isinstance(self.friction_safeguard, SafeguardMode):
            raise OptionsError(
                "friction_safeguard must be 'newton', 'active', 'clamp' or 'projected', "
                f"got {self.friction_safeguard!r}"
            )
        if not (0.0 <= self.pin_relax < 1.0) or self.cone_slack < 1.0 or self.pcr_tol < 0.0 \
                or self.pcr_iters_newton < 1 or not (0.0 < self.line_search_min <= 1.0) or self.stick_prox < 0.0:
            raise OptionsError("pin_relax must lie in [0, 1), cone_slack >= 1, pcr_tol >= 0, pcr_iters_newton >= 1, "
                               "line_search_min in (0, 1], stick_prox >= 0")
        if not (0.0 < self.stick_prox_decay <= 1.0) or self.stick_prox_decay_from < 0:
            raise OptionsError("stick_prox_decay must lie in (0, 1] (1: no decay) and stick_prox_decay_from be >= 0")
        if not isinstance(self.residual_norm, ResidualNorm):
            raise OptionsError(f"residual_norm must be 'energy' or 'velocity', got {self.residual_norm!r}")
        if self.pin_wheels_from < 0:
            raise OptionsError("pin_wheels_from must be >= 0 (0: off)")
        if self.adjoint == "schur":
            raise OptionsError("adjoint='schur' was removed: the paper's single Schur solve with the lagged "
                               "friction weight gives wrong gradients under sliding contact (a sliding block's "
                               "dx/dv0 0.223 instead of 0.400); use adjoint='exact' (the default; "
                               "adjoint_solver='lu' or 'gmres')")
        if not isinstance(self.adjoint, AdjointMode):
            raise OptionsError(f"adjoint must be 'exact', got {self.adjoint!r}")
        if not isinstance(self.linear_solver, LinearSolver):
            raise OptionsError(f"linear_solver must be 'pcr' or 'direct', got {self.linear_solver!r}")
        if not (isinstance(self.direct_max_rows, int) and self.direct_max_rows >= 1):
            raise OptionsError(f"direct_max_rows must be a positive whole number of rows, got {self.direct_max_rows!r}")
        if self.lanes is not None and (type(self.lanes) is not int or self.lanes not in (1, *LANE_WIDTHS)):
            raise OptionsError(f"lanes must be None (automatic on a CPU: {LANE_WIDTHS[-1]} from {LANES_WIDE_FROM} "
                               f"worlds, {LANES} from {LANES}, else 1), 1 or one of {LANE_WIDTHS}, got {self.lanes!r}")
        if not isinstance(self.adjoint_solver, AdjointSolver):
            raise OptionsError(f"adjoint_solver must be 'lu', 'krylov' or 'gmres', got {self.adjoint_solver!r}")
        if not (isinstance(self.adjoint_krylov_iters, int) and 1 <= self.adjoint_krylov_iters <= 64):
            raise OptionsError("adjoint_krylov_iters must be a whole number of iterations in 1..64, got "
                               f"{self.adjoint_krylov_iters!r}")
        kt = self.adjoint_krylov_tol
        if kt is not None and (not (math.isfinite(kt) and kt > 0) or (
                self.adjoint_solver == "krylov" and kt >= self.adjoint_tol)):
            raise OptionsError("adjoint_krylov_tol must be positive and below adjoint_tol (the check a world must "
                               f"pass), or None (0.2 x adjoint_tol), got {kt!r}")
        if not (isinstance(self.adjoint_krylov_cycles, int) and 1 <= self.adjoint_krylov_cycles <= 16):
            raise OptionsError("adjoint_krylov_cycles must be a whole number of restart cycles in 1..16, got "
                               f"{self.adjoint_krylov_cycles!r}")
        if self.max_contacts_per_world < 1:
            raise OptionsError("max_contacts_per_world must be >= 1")


# ---------------------------------------------------------------------------------------------
# Array groups of the kernels. No `from __future__ import annotations` in this module: warp reads the
# field annotations as types.
# ---------------------------------------------------------------------------------------------


_Group = TypeVar("_Group")


def make(group: type[_Group], **fields: Any) -> _Group:
    """An instance of the array group ``group`` with every field given by name (a field left out or
    misspelt raises, so a field added to a group is filled everywhere the group is built)."""
    struct: Any = group  # at run time a warp Struct (what @wp.struct returns), to mypy the class it decorates
    names = set(struct.vars)
    if set(fields) != names:
        raise TypeError(f"{struct.key}: missing {sorted(names - set(fields))}, unknown {sorted(set(fields) - names)}")
    instance: _Group = struct()
    for name, value in fields.items():
        setattr(instance, name, value)
    return instance


def zeros_group(group: type[_Group], n: int, device: Any, **given: Any) -> _Group:
    """An array group whose fields not in ``given`` are zeroed arrays of n entries each (of the field's dtype), the
    rest as given."""
    struct: Any = group  # a warp Struct at run time (see `make`)
    zeros = {f: wp.zeros(n, dtype=v.type.dtype, device=device) for f, v in struct.vars.items() if f not in given}
    return make(group, **zeros, **given)


def repacked(instance: _Group, **changes: Any) -> _Group:
    """A copy of an array group with every field set anew, the fields named in ``changes`` replaced. A
    struct packs each array's gradient pointer when the field is set, so a group built before an array's
    ``requires_grad`` was switched on (a registered parameter) would carry no gradient into the
    reverse-mode kernels."""
    inst: Any = instance  # a warp StructInstance: its Struct (``_cls``) is unknown to mypy
    copy: _Group = make(inst._cls, **{**{name: getattr(inst, name) for name in field_names(inst._cls)}, **changes})
    return copy


def field_names(group: type[Any]) -> list[str]:
    """The field names of an array group, in declaration order."""
    struct: Any = group  # a warp Struct at run time (see `make`)
    return list(struct.vars)


def host_array(a: "wp.array[Any] | None") -> np.ndarray:
    """``a.numpy()`` of a model array that newton types as optional (a finalized model sets it)."""
    assert a is not None, "model array not allocated (finalize the newton model first)"
    out: np.ndarray = a.numpy()
    return out


@wp.struct
class JointModel:
    """The joints of the model (`ModelArrays.joints`): what a joint's world frames and angle are computed from
    (`constraints.joint_frames`, `constraints.joint_angle`)."""

    parent: wp.array[int]  # (nj,) parent body (-1: the world)
    child: wp.array[int]  # (nj,) child body
    X_p: wp.array[wp.transform]  # (nj,) joint frame in the parent's frame [m]
    X_c: wp.array[wp.transform]  # (nj,) joint frame in the child's frame [m]
    axis: wp.array[wp.vec3]  # (nj,) revolute axis in the joint frame (unit)


@wp.struct
class ModelArrays:
    """Model and physical parameters, constant over a step (``Model:`` in the kernels)."""

    body_com: wp.array[wp.vec3]  # (nb,) centre of mass in the body frame [m]
    body_mass: wp.array[float]  # (nb,) mass [kg] (parameter; 0: static)
    joints: JointModel  # the joints' parents, children, frames and axes
    jrow_joint: wp.array[int]  # (jrows,) joint (index within a world) of each joint row
    jrow_kind: wp.array[int]  # (jrows,) JointRow of each joint row
    j_ke: wp.array[float]  # (nj,) servo position gain [N m/rad]
    j_kd: wp.array[float]  # (nj,) servo velocity gain [N m s/rad]
    j_scale: wp.array[float]  # (nj,) command scale of the velocity target
    j_tau: wp.array[float]  # (nj,) servo torque limit [N m] (0: none)
    shape_body: wp.array[int]  # (ns,) body of each shape (-1: static)
    shape_type: wp.array[int]  # (ns,) newton.GeoType
    shape_transform: wp.array[wp.transform]  # (ns,) shape frame in its body's frame [m]
    shape_scale: wp.array[wp.vec3]  # (ns,) newton's shape scale (half extents, radius) [m]
    shape_mu: wp.array[float]  # (ns,) Coulomb coefficient (longitudinal on wheels)
    shape_mu_lat: wp.array[float]  # (ns,) lateral Coulomb coefficient (anisotropic shapes)
    shape_slip: wp.array[float]  # (ns,) friction slip speed [m/s] (0: exact Coulomb)
    shape_slip_lat: wp.array[float]  # (ns,) lateral slip speed [m/s] (combined-slip law; 0: off)
    friction_combine: wp.array[int]  # (ns,) FrictionCombine of a shape's contacts (a wheel's: its own)
    shape_mesh: wp.array[wp.uint64]  # (ns,) warp mesh id of a mesh shape (0: not a mesh)
    shape_face_start: wp.array[int]  # (ns,) a mesh shape's first face in mesh_cn / mesh_sharp (-1: none)
    mesh_cn: wp.array[wp.vec3]  # (3 x all meshes' faces,) unit corner normals, mesh frame (corner_normals)
    mesh_sharp: wp.array[int]  # (all meshes' faces,) bitmask of a face's sharp edges (bit e: corners e, e+1)


@wp.struct
class StepConstants:
    """Step size, per-world capacities and the row constants of `SolverOptions`."""

    h: float  # step [s]
    nbody: int  # bodies per world
    njoint: int  # joints per world
    jrows: int  # joint rows per world
    max_rows: int  # row slots per world (jrows + 3 max_contacts)
    max_contacts: int  # contact slots per world
    joint_compliance: float  # SolverOptions.joint_compliance [m/(N s)]
    fb_eps: float  # SolverOptions.fb_eps [m]
    inactive_w: float  # SolverOptions.inactive_friction_weight
    contact_compliance: float  # SolverOptions.contact_compliance


@wp.struct
class StepData:
    """Per-step data at q-, written by the set-up kernels (``Data in:`` of the iteration)."""

    x_prev: wp.array[wp.vec3]  # (nb,) centre of mass at q- in world [m]
    q_prev: wp.array[wp.quat]  # (nb,) orientation at q- (x, y, z, w), world from body
    u_prev: wp.array[wp.spatial_vector]  # (nb,) twist u- (v_com [m/s], omega [rad/s]) in world
    inv_m: wp.array[float]  # (nb,) inverse mass [1/kg]
    I_w: wp.array[wp.mat33]  # (nb,) world inertia at q- [kg m^2]
    inv_I: wp.array[wp.mat33]  # (nb,) inverse world inertia at q- [1/(kg m^2)]
    f_imp: wp.array[wp.spatial_vector]  # (nb,) external impulse over the step [N s, N m s]
    jt_q: wp.array[float]  # (nj,) servo position target [rad]
    jt_qd: wp.array[float]  # (nj,) servo velocity target [rad/s]
    j_qprev: wp.array[float]  # (nj,) joint angle at q- [rad]


@wp.struct
class Contacts:
    """The step's contact slots (``nw * max_contacts``), in the frames they move with (`contact.py`)."""

    count: wp.array[int]  # (nw,) contacts per world
    shape0: wp.array[int]  # shapes of the pair
    shape1: wp.array[int]
    p0: wp.array[wp.vec3]  # contact points in their shapes' body frames [m]
    p1: wp.array[wp.vec3]
    n: wp.array[wp.vec3]  # normal (0 -> 1) in the frame of body nbody (world if -1)
    nbody: wp.array[int]  # body the normal moves with
    thick: wp.array[float]  # summed margins [m]
    axial0: wp.array[float]  # axial offsets on round shapes [m]
    axial1: wp.array[float]
    fric_shape: wp.array[int]  # anisotropic (wheel) shape of the pair (-1: none)
    single: wp.array[int]  # 1: a wheel's one contact on a static box or mesh, from its centre


def record_group(group: Any, name: str, doc: str, **more: Any) -> Any:
    """A `wp.struct` of a group's fields one dimension up, (rows, the field's length) each, a row per step, and
    the fields in ``more``: the record of a group over a rollout."""
    struct: Any = group  # a warp Struct at run time (see `make`)
    array2d: Any = wp.array2d  # subscripted with a run-time dtype (to mypy a type expression)
    fields = {f: array2d[v.type.dtype] for f, v in struct.vars.items()} | more
    cls = type(name, (), {"__annotations__": fields, "__doc__": doc, "__module__": __name__, "__qualname__": name})
    return wp.struct(cls)


ContactRecord = record_group(
    Contacts, "ContactRecord",
    "A rollout's record of the contact slots (`Contacts`' fields, (rows, nw * max_contacts); count (rows, nw)) and the "
    "multipliers lam (rows, nw * max_rows), a row per step (`graph_kernels.put_contact_record`).",
    lam=wp.array2d[float])


@wp.struct
class Poses:
    """Bodies' poses in centre-of-mass form."""

    x: wp.array[wp.vec3]  # (nb,) centres of mass in world [m]
    q: wp.array[wp.quat]  # (nb,) orientations (x, y, z, w), world from body


@wp.struct
class Iterate:
    """An iterate of the step's unknowns with its poses: what the rows are built at (`rows.build_rows`)."""

    x: wp.array[wp.vec3]  # (nb,) centre of mass at q+ [m]
    q: wp.array[wp.quat]  # (nb,) orientation at q+
    u: wp.array[wp.spatial_vector]  # (nb,) twist u+ [m/s, rad/s]
    lam: wp.array[float]  # (nw * max_rows,) multipliers [N s or N m s]


@wp.struct
class Rows:
    """One scalar constraint row per slot (``nw * max_rows``) at the current iterate (`rows.build_rows`)."""

    a: wp.array[int]  # global body indices (-1: the static world)
    b: wp.array[int]
    Ja: wp.array[wp.spatial_vector]  # Jacobian blocks, J u = Ja . u_a + Jb . u_b [m/s or rad/s]
    Jb: wp.array[wp.spatial_vector]
    C: wp.array[float]  # compliance block of the Schur system
    res: wp.array[float]  # velocity-level residual [m/s or rad/s]
    pinv: wp.array[float]  # Jacobi preconditioner 1 / (d + C) (0: row pinned, masked out)
    kind: wp.array[int]  # RowKind
    # the Schur operator J M~^-1 J^T + C of the rows couples them through the bodies' inverse masses (StepData's)
    inv_m: wp.array[float]  # (nb,) inverse mass [1/kg]
    inv_I: wp.array[wp.mat33]  # (nb,) inverse world inertia at q- [1/(kg m^2)]


@wp.struct
class SchurScratch:
    """The Schur system's right-hand side and solution, and the work vectors of its solves (`schur.schur_solve`)."""

    rhs: wp.array[float]  # (nw * max_rows,) right-hand side
    x: wp.array[float]  # (nw * max_rows,) solution (the Newton step: the multipliers' step)
    r: wp.array[float]  # (nw * max_rows,) PCR's residual
    z: wp.array[float]  # preconditioned residual
    p: wp.array[float]  # search direction
    Az: wp.array[float]  # A z
    Ap: wp.array[float]  # A p
    tmp: wp.array[wp.spatial_vector]  # (nb,) J^T v per body
    dm: int  # the dense factors' stride: the most rows a world's factor holds (linear_solver="direct"; 0: none)
    S: wp.array[wp.float64]  # (nw * dm * dm,) dense Schur factor per world
    y64: wp.array[wp.float64]  # (nw * max_rows,) triangular solves' work vector
    perm: wp.array[int]  # (nw * max_rows,) the factor's row order: S's row p is the world's row perm[p]
    env: wp.array[int]  # (nw * max_rows,) first nonzero column of S's row p (its envelope)


# Worlds per thread of the Newton step's PCR in vector lanes (`SolverOptions.lanes`): one world per lane
# of these vectors, so one thread's float32 operations run on LANES worlds at once (AVX: 8 floats). The lane
# code exists for each width in LANE_WIDTHS (`lane_types`, `schur_lanes.lane_code`, `step.iteration_kernel`,
# `adjoint.precond_kernels`: Warp closures, one set per width); LANES is the default width and the one
# these module-level names carry.
LANES = wp.constant(8)
LANE_WIDTHS = (8, 16)  # the first is LANES: the step and adjoint modules' own width
LANES_WIDE_FROM = 32  # worlds from which the automatic choice takes 16 lanes (`SolverOstrich._lanes`)


def lane_types(width: int) -> SimpleNamespace:
    """The lane vectors (lanef, lanei, laned: `width` float32 / int32 / float64) and the `LaneScratch` struct
    of one lane width (one of LANE_WIDTHS), made once per width."""
    if width not in LANE_WIDTHS:
        raise OptionsError(f"lane width must be one of {LANE_WIDTHS}, got {width!r}")
    if width in _LANE_TYPES:
        return _LANE_TYPES[width]
    lanef = wp.types.vector(length=width, dtype=wp.float32)
    lanei = wp.types.vector(length=width, dtype=wp.int32)
    laned = wp.types.vector(length=width, dtype=wp.float64)

    @wp.struct
    class LaneScratch:
        """The Newton step's PCR and dense factor with LANES worlds per thread (`schur_lanes.lane_pcr`,
        `schur_lanes.lane_dense_factor`): group g holds worlds g * LANES + j in lane j, in scratch slot s = g % slots,
        its row r at s * max_rows + r, its body i at s * nbody + i. slots = 1 on a CPU, whose launches run
        their threads one after the other (the slot stays in cache); one per group on a GPU."""

        slots: int

        J: wp.array[lanef]  # (groups * max_rows * 12,) Ja (6 entries) then Jb (6) of each row
        la: wp.array[lanei]  # (groups * max_rows,) body of side a within the world (-1: static)
        lb: wp.array[lanei]  # side b's
        uni: wp.array[int]  # (groups * max_rows,) 1: every lane's row acts on the same bodies
        C: wp.array[lanef]  # (groups * max_rows,) compliance
        pinv: wp.array[lanef]  # Jacobi preconditioner (0: masked row)
        rhs: wp.array[lanef]  # right-hand side
        x: wp.array[lanef]  # solution
        r: wp.array[lanef]  # PCR work vectors, as SchurScratch's
        z: wp.array[lanef]
        p: wp.array[lanef]
        Az: wp.array[lanef]
        Ap: wp.array[lanef]
        tmp: wp.array[lanef]  # (groups * nbody * 6,) J^T v per body
        inv_m: wp.array[lanef]  # (groups * nbody,) inverse mass [1/kg]
        inv_I: wp.array[lanef]  # (groups * nbody * 9,) inverse world inertia, row-major [1/(kg m^2)]
        # the dense factor of LANES worlds whose rows act on the same bodies (`schur_lanes.lane_dense_factor`)
        S: wp.array[laned]  # (groups * dm * dm,) float64 Schur matrix, then its factor, in factor order
        Jd: wp.array[laned]  # (groups * dm * 12,) the rows' Ja, Jb in float64, in factor order
        Y: wp.array[laned]  # (groups * dm * 12,) M~^-1 Ja^T, M~^-1 Jb^T of each row (`minv_jt`)
        yd: wp.array[laned]  # (groups * dm,) the triangular solves' work vector (`schur_lanes.lane_dense_solve`)
        # (groups * LANES * 20,) coupled pins' b (4), M (4 x 4) per lane (`lane_coupled_pins`)
        pin: wp.array[float]

    ns = SimpleNamespace(width=width, lanef=lanef, lanei=lanei, laned=laned, LaneScratch=LaneScratch)
    _LANE_TYPES[width] = ns
    return ns


_LANE_TYPES: dict[int, SimpleNamespace] = {}


def lane_width(lanes: int) -> int:
    """The lane width of the kernels that run ``lanes`` worlds per thread (LANES for a thread per world)."""
    return lanes if lanes > 1 else LANES


def lane_module(name: str, width: int) -> str | None:
    """The Warp module in which Python module ``name`` registers its kernels of one lane width (and the functions
    only they call): None, its own, for LANES; else ``name.lanes<width>``, a module of their own without backward
    passes, compiled only when one of its kernels is launched (a Warp module compiles all its kernels and
    functions at once, and a fresh kernel cache would otherwise pay for every width)."""
    if width == LANES:
        return None
    mod = f"{name}.lanes{width}"
    wp.set_module_options({"enable_backward": False}, module=mod)
    return mod
_lt = lane_types(LANES)
lanef = _lt.lanef
lanei = _lt.lanei
laned = _lt.laned
LaneScratch = _lt.LaneScratch


@wp.struct
class NewtonIterate:
    """The bookkeeping of `step.newton_iteration`'s iterate (the iterate itself: `NewtonStep.at`): its best copy,
    status and the safeguards' memory."""

    u_best: wp.array[wp.spatial_vector]  # best iterate from k_min on
    lam_best: wp.array[float]
    best_norm: wp.array[float]  # (nw,) its residual norm [m/s]
    best_k: wp.array[int]  # (nw,) its iteration (-1: none)
    done: wp.array[int]  # (nw,) world finished (converged or diverged)
    status: wp.array[int]  # (nw,) StepCode
    iters: wp.array[int]  # (nw,) last iteration evaluated
    res_dyn: wp.array[float]  # (nw,) dynamics part of the best norm [m/s]
    res_con: wp.array[float]  # (nw,) constraint part of the best norm [m/s]
    n_rows: wp.array[int]  # (nw,) rows in use
    res_trace: wp.array[float]  # (nw * trace_stride,) residual norm per iteration [m/s]
    ydyn: wp.array[wp.spatial_vector]  # (nb,) M~^-1 r_dyn [m/s, rad/s]
    fdir: wp.array[wp.vec4]  # (nw * max_contacts,) rotated sliding rows: (e1, e2, pinned flag, dl~_par)
    pin: wp.array[wp.vec2]  # (nw * max_contacts,) last pinned lam_n and its change
    ls_ref: wp.array[float]  # (nw,) backtracking: last accepted norm [m/s]
    ls_alpha: wp.array[float]  # (nw,) backtracking step fraction
    u_ls: wp.array[wp.spatial_vector]  # last accepted iterate and step
    du_ls: wp.array[wp.spatial_vector]
    lam_ls: wp.array[float]
    dl_ls: wp.array[float]


@wp.struct
class NewtonOptions:
    """The Newton iteration's options (`SolverOptions`, which documents them) as the kernel reads them."""

    pcr_iters: int
    k_min: int
    tol: float  # [m/s]
    stall_tol: float  # [m/s]
    stall_iters: int
    safeguard: int  # FrictionSafeguard
    pin_relax: float
    pcr_tol: float
    cone_slack: float
    pcr_iters_newton: int
    ls_from: int  # line_search_from
    ls_min: float  # line_search_min
    stick_prox: float
    pin_from: int  # pin_wheels_from
    pin_coupled: int
    energy_norm: int  # residual_norm == "energy"
    prox_decay: float  # stick_prox_decay
    prox_decay_from: int  # stick_prox_decay_from
    trace_stride: int  # newton_iters + extra_iters + 1
    lanes: int  # 1: a group per world; LANES: LANES worlds per group, the PCR in vector lanes
    thread_groups: int  # groups per launch thread (SolverOstrich._thread_groups)


@wp.struct
class NewtonStep:
    """The groups of a step's Newton iteration (`step.newton_iteration`), passed whole to its stages
    (`iteration.py`) and the coupled pins' solves (`pins.py`)."""

    sc: StepConstants
    opt: NewtonOptions
    model: ModelArrays  # Model
    data: StepData  # Data in
    ct: Contacts  # Data in
    at: Iterate  # Data in/out: the iterate
    it: NewtonIterate  # Data in/out
    rows: Rows  # scratch
    scr: SchurScratch  # scratch
