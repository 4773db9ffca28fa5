"""Named array layouts, units, codes and the solver options of the Ostrich engine: the one place that
declares what the kernels exchange.

Layout (mujoco_warp style): every per-world quantity lives in a flat array indexed
``world * capacity + local``; per-body quantities use newton's global body index (``nb`` bodies over
all worlds, ``nbody`` per world), joints likewise (``nj``, ``njoint``). Rows: ``nw * max_rows`` with
``max_rows = jrows + 3 max_contacts``: a world's joint rows first, then three per contact slot (normal,
longitudinal friction, lateral friction). Contact slots: ``nw * max_contacts``.

The kernels take their arrays in the `wp.struct` groups below, built once on the host
(`SolverOstrich`), so an array is declared once, as a named field, and a kernel's argument list cannot
be reordered by mistake:
    `ModelArrays`    model and physical parameters (differentiable ones are `SolverOstrich` arrays)
    `StepConstants`  step size, per-world capacities and the row constants of `SolverOptions`
    `StepData`       set once per step at q- by the set-up kernels
    `Contacts`       the step's contact slots
    `Rows`           the constraint rows of the current iterate
    `SchurScratch`   work vectors of the Schur solves
    `NewtonIterate`  the Newton iterate, its best copy, status and the safeguards' memory
    `NewtonOptions`  the Newton iteration's options

Joint servo parameters (per joint, `SolverOstrich` arrays, registered by name in `Simulation`):
    joint_ke         position gain [N m/rad] (newton's target_ke), used with a position target
    joint_kd         velocity gain [N m s/rad] (newton's target_kd): in velocity-target mode the
                     servo is tau = joint_kd (s * qd_target - qd+), solved implicitly (eq. 8,
                     compliance 1 / (h joint_kd)). sysid's replay parameter ``kp`` (and the
                     paper's "kp" of the wheel servos) is this array: a velocity-servo gain,
                     not a position gain.
    joint_cmd_scale  s, the command scale applied to the velocity target (sysid's cmd_scale)
    joint_effort_limit  servo torque limit [N m] (0: none), saturating smoothly (`rows.joint_row_law`)
Revolute joints only carry servos; no speed saturation is modelled.
"""

import itertools
import math
from dataclasses import dataclass, field
from enum import IntEnum
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np
import warp as wp

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
    """`SolverOptions.friction_safeguard` as the kernels see it (the option's docstring says what each does)."""

    CLAMP = 0
    PROJECTED = 1
    ACTIVE = 2
    NEWTON = 3

    @classmethod
    def of(cls, name: str) -> "FrictionSafeguard":
        """The member of an option value ("clamp", "projected", "active", "newton")."""
        return cls[name.upper()]


_OPTIONS_VERSIONS = itertools.count(1)  # SolverOptions.version


@dataclass
class SolverOptions:
    """Every tolerance and budget of the non-smooth Newton step, in one place.

    The figures behind these choices (what each option measured before and after) are in
    benchmarks/README.md, "Engine: figures formerly in code comments" and "bench_convergence.py".

    Attributes:
        newton_iters: Newton iterations per step (fixed budget; a world stops early below tol). With
            16 every step of benchmarks/bench_convergence.py's cases of issue 21 (the pallet traversal
            and its variants, landing, incline, sliding stops) ends below 1e-5 m/s, turning in place
            98 % (worst 1.2e-5); 20 brings that last one below too, at +16-37 % solver time (with the
            whole budget, stall_tol=0 and the PCR; today's defaults: 96 %, worst 1.5e-5).
        extra_iters: when > 0 and a world ends the budget with its best residual above extra_tol
            [m/s], up to this many more iterations for the worlds not yet converged (costs one
            host read per step). Transients such as a traction-limited wheel-speed step converge
            linearly and need them.
        extra_tol: residual [m/s] above which a world gets the extra iterations.
        pcr_iters: preconditioned conjugate residual iterations per Newton iteration.
        k_min: first Newton iterate eligible as the returned best iterate (blocks early
            acceptance of under-converged states).
        tol: residual norm [m/s] below which a world stops iterating early.
        stall_tol, stall_iters: a world whose best residual (from k_min on) is below stall_tol [m/s] and
            whose last stall_iters iterates have not halved the smallest residual before them stops
            early too (StepCode.STALLED): the residual's float32 floor is ~1-5e-6 m/s on the robot, so a
            world at tol = 1e-6 spends the rest of the budget at that floor. On the 6 s pallet traversal
            half the steps used all 16 iterations for that; with the defaults it takes 6.6 iterations per
            step instead of 11.7, every step still below 1e-5 m/s (worst 9.3e-6; benchmarks/README.md,
            "Stopping at the float32 floor"). stall_tol = 0 turns it off.
        residual_norm: the norm of the Newton residual (the convergence test, the best iterate, the
            reported residual): "energy" (default) measures the dynamics part y = M~^-1 r_dyn of each
            body in its kinetic-energy metric per unit mass, sqrt(|y_v|^2 + y_w . (I / m) y_w), so
            every term is a velocity [m/s] (an angular error counts at the body's radius of gyration);
            "velocity" (before issue 21's last change) adds |y_w|^2 in (rad/s)^2 as if it were (m/s)^2.
            A wheel's angular residual has a float32 floor of ~6e-6 rad/s (its contact lever arm is
            recomputed at every iterate), ~1e-6 m/s at its 0.18 m radius of gyration: with "velocity"
            that floor alone kept 3-10 % of the robot's steps above 1e-5.
        joint_compliance: bilateral joint compliance E [m/(N s)] (eq. 3), >= 0.
        fb_eps: smoothing of the Fischer-Burmeister square root [m].
        contact_compliance: normal-contact compliance relative to the row's inverse effective
            mass (dimensionless): the gap admits h * c * d * lam_n. Tiny, it makes coplanar
            contact sets (a box's four corners) determinate, so the adjoint is well posed;
            resting penetration is about c * g * h^2 (2e-4: about 0.1 mm for the robot at h = 0.1 s).
        inactive_friction_weight: friction weight W, in units of the row's inverse
            effective mass, for contacts carrying no normal impulse (lets them slip freely).
        max_contacts_per_world: contact slots per world after merging (a wheel's contacts on a face,
            a box or a mesh become one); newton's contacts before the merge get 4x as many
            (contact.RAW_CONTACTS_PER_SLOT); extra contacts at either stage are reported.
        friction_safeguard: how each Newton step keeps friction admissible and decides stick
            or slip; every choice has the exact Coulomb fixed points of eq. 7 (no softening).
            "newton" (default, issue 21.1): contacts in a redundant set (several contacts of one shape
            pair with one normal: a box's corners on a face, whose friction split is indeterminate
            when they stick) take semismooth Alart-Curnier rows, one contact at a time in
            cone-scaled variables (l~ = l / mu, v~ = mu v, rho = 2 / (mu_1^2 d_1 + mu_2^2 d_2)):
            z~ = l~ - rho v~; |z~| <= lam_n sticks (rows v = 0, see stick_prox); otherwise it slides
            with l~ = lam_n z~/|z~|: the rows are rotated to z^ and its normal, the z^ component is
            pinned to lam_n (dl~ known, moved to the right-hand side and masked out of the PCR) and
            the other gets the compliance (|z~| - lam_n) / (lam_n rho) of the exact linearisation
            (the pinned magnitude solved with the step: pin_coupled). A stick classification that
            overshoots its cone is reclassified at the next iteration instead of clamped: the update
            is projected onto the cone widened by cone_slack, which bounds the impulse of a barely
            loaded contact. Other contacts (a wheel's single contact, a wheel on a mesh, whose
            contacts have distinct normals) keep the "active" rows up to iteration pin_wheels_from.
            "active" (the former default, reproduces the figures before issue 21.1): eq. 7's W,
            except that a contact whose trial impulse z~ = l~ - rho v~ lies outside the cone takes
            the sliding weight W~ = |v~| / lam_n, then the paper's clamp. The FB weight of a sliding
            contact inside the cone is nearly zero, so contacts sharing a friction Jacobian (a
            box's corners) traded impulse in 2-cycles; the active weight splits sliding friction by
            lam_n but not sticking friction, where a clamped corner's u still carries the unclamped
            impulse (a cube landing flat into sticking does not converge). "clamp" (the paper's:
            project the multipliers onto the cone after each Newton step) or "projected" (pin
            contacts that leave the cone to their projection and re-solve the Schur system for the
            rest; cycles when every wheel slides).
        pin_relax: "newton": when a pinned contact's lam_n reverses the change of the previous
            iteration (a 2-cycle of the lagged load split between symmetric corners), the pin moves
            to pin_relax x the previous pin + (1 - pin_relax) x lam_n (only where the lag is used:
            pin_coupled off, or more than four pinned contacts). 0 keeps the plain lag.
        cone_slack: "newton": the update of a semismooth contact is projected onto its cone widened
            by this factor (>= 1; 1 is the plain clamp, which re-creates the active-set stall).
            Without any bound a sticking row of a barely loaded contact can take an unbounded
            impulse in one step.
        pcr_tol: "newton": worlds with semismooth contacts run PCR until the preconditioned residual
            falls by this factor (cap pcr_iters_newton); their redundant contact sets make the
            Schur system nearly singular (the load split rests on the contact compliance alone), so
            a fixed iteration count leaves steps unconverged. Other worlds keep the fixed pcr_iters
            (more PCR iterations made the robot's unconverged steps worse).
        pcr_iters_newton: PCR iteration cap of those worlds.
        line_search_from: "newton": from this Newton iteration on, worlds with semismooth contacts
            backtrack on the residual norm: an iterate whose norm is not below the last accepted
            one's is replaced by the point halfway back along the last step, down to
            line_search_min of it (then accepted). The admissible set is convex, so the halfway
            points stay inside the (widened) cones. Starting later than iteration 4 slowed ordinary
            steps; worlds without semismooth contacts never backtrack (it did not help the robot).
        line_search_min: smallest step fraction of the backtracking.
        pin_wheels_from: "newton" (0: off; 4, the default since issue 21's last change): from
            this Newton iteration on, single exact-Coulomb contacts (wheels) take the semismooth
            Alart-Curnier rows of the redundant sets too (sticking: the slip v = 0 with stick_prox;
            sliding: pinned to the cone), their cone projection is widened by cone_slack (a sticking
            wheel whose step overshoots its cone is reclassified as sliding at the next iteration
            instead of clamped: the clamp left u carrying the unclamped impulse), and their worlds
            solve the Schur system to pcr_tol (no backtracking: on the wheels it stalled). With 0 a
            wheel keeps the active rows: sliding friction with the weight W~ = |v~| / lam_n lagged one
            iteration plus the clamp, a linear fixed point on the pallet edge and at the launch;
            sticking with eq. 7's W, whose v = 0 leaves the lateral friction of the two wheels on one
            axle (an internal force through the chassis) free to jump between iterations when turning
            in place (the stick_prox term fixes its split). Earlier starts cycled between active sets,
            later ones left the launch unconverged. The default since the energy residual norm
            (residual_norm): cross-validated on the bundled sample it lowers the held-out error
            (leave-one-run-out mean xy 0.695 -> 0.628 m) and leaves the real runs' figures unchanged
            (their wheels slip on the regularised law, which these rows do not touch).
        pin_coupled: "newton": the pinned magnitude of every sliding contact is solved with the step,
            l~_par + dl~_par = lam_n + dlam_n, instead of lagging lam_n one iteration (pin_relax). The
            Schur solution is affine in the pinned steps, so npin + 1 solves give dlam_n at the pinned
            contacts per unit pinned step and a dense solve (npin <= 4; more: the lag) gives the
            steps; a sliding contact's update then lands on its cone. The lag re-created stick/slip
            cycles wherever the load of sliding contacts moves with their friction (a box landing or
            sliding while spinning). Costs npin + 1 extra PCR solves in iterations with pinned
            contacts.
        stick_prox: "newton": a sticking row's step gets the proximal term stick_prox d dl in the
            Schur matrix only (the residual stays the slip, the fixed point exact): a sticking set's
            friction split is indeterminate and the PCR to tolerance otherwise followed the null
            space.
        stick_prox_decay, stick_prox_decay_from: "newton": on single contacts (wheels, pin_wheels_from)
            the proximal term is multiplied by stick_prox_decay per iteration after iteration
            stick_prox_decay_from (1: constant). A sticking wheel pair's lateral friction (two wheels on
            one axle: an internal force through the chassis) otherwise settles linearly, by prox / (prox
            + c) ~ 0.93 per iteration (c ~ 1.3e-6 m/(N s), the joints' compliance seen at the contacts):
            the pallet traversal's edge step ended at 1.2e-5 m/s after 16 iterations, 4.3e-6 with the
            decay. The redundant sets (a box's corners) keep the constant term: their split has no
            compliance to settle it. A small constant term from the start lets turning in place jump
            (stick_prox 5e-6: worst 2.2e-5 m/s; 1e-6: 1.8e-4).
        check_contacts: warn after a step that dropped contacts beyond the slots (a host sync).
        warm_start: start each step's multipliers from the previous step's (contacts matched
            by shape pair and normal); a rollout (`Simulation.forward`) resets it at its start.
        gyroscopic: include the gyroscopic term -omega x I omega (linearly implicit impulse).
        adjoint_pcr_iters: PCR iterations of the Schur solve of the adjoint (eq. 18).
        linear_solver: the Newton step's Schur solve (eq. 12) in the worlds whose single exact-Coulomb
            contacts (wheels) are pinned (pin_wheels_from; they solve to pcr_tol: up to pcr_iters_newton
            PCR iterations, npin + 1 solves per iteration with the coupled pins): "direct" (the default)
            assembles the world's Schur matrix in float64 and Cholesky-factors it once per iteration
            (`schur.dense_factor`: each row's envelope only, the rows ordered wheel by wheel), exact to
            rounding, every solve of the iteration two triangular solves;
            "pcr" keeps the paper's matrix-free Jacobi-preconditioned conjugate residual there too. Every
            other world takes the PCR either way: solved exactly, the early active-set iterations settle on
            wrong sets (turning in place stalled on every other step near 1e-4 m/s) and redundant contact
            sets (a box's corners, a wheel's raw contacts in a mesh's concave corner) lose the PCR's implicit
            regularisation (a box landing at 3 km/s stalled). Worlds with more active rows than
            direct_max_rows keep the PCR. Memory: direct_max_rows^2 float64 per world (32 KiB at 64).
            Worlds with a contact on a triangle mesh keep the PCR too (a wheel's closest mesh point can
            switch faces between iterates, and the exact steps jumped across the switch: the robot
            climbing a step given in one mesh with the ground ended a step at 1.7 m/s). Measured
            (benchmarks/README.md): every bench_convergence case converges as with the PCR, turning in
            place on more steps, the robot's forward 1.9x faster (64 worlds, with the stall exit). The
            default since the stall exit: cross-validation cannot tell the two apart (the real runs'
            fits are identical, 0.283 m; on the bundled sample one fold's LM fit lands on either of two
            optima under any numerically equivalent setting, held-out run_07 0.82-1.65 m over six of
            them), so the speed decides; `simulator: {options: {linear_solver: pcr}}` in a fit config
            for the paper's solve.
        lanes: worlds per thread of the Newton iteration. With LANES (8) one thread carries 8 worlds and
            runs their PCR solves in the lanes of Warp vectors: each lane does the one-world solve's float32
            operations in its order, so results are the same bit for bit, and on a CPU the vector units do
            8 worlds' arithmetic at once (benchmarks/bench_lanes.py). 16: 16 worlds per thread (the lane code
            exists per width: `schur.lane_code`). 1: a thread per world (what a GPU wants). None (default), on
            a CPU: 16 for models of at least LANES_WIDE_FROM (32) worlds (the pallet traversal's forward,
            us per world-step with 8 -> 16 lanes, one thread: 16 worlds 47.7 -> 49.7, 24 45.8 -> 48.1, 32
            43.9 -> 42.9, 48 44.0 -> 41.3, 256 41-43 -> 38.5; a model of 8-15 worlds would leave a 16-wide
            group half idle), LANES (8) from 8 worlds, else 1. The
            dense factor runs in lanes when the group's worlds' rows act on the same bodies in the same order
            (one robot in the same contact state), world by world otherwise; the Krylov adjoint's
            preconditioner factor likewise. The 6 s pallet traversal's forward, 1024 worlds on one CPU
            thread: 114 -> 68 us per world-step (benchmarks/README.md, "Worlds in vector lanes"). Memory:
            the lanes' copies of one group's rows and dense factor (~0.5 MiB for the robot with 8 lanes,
            twice that with 16: a CPU launch
            runs its threads in turn, so one copy serves every group; a GPU would hold one per group).
        direct_max_rows: the dense factor's size bound (rows per world) for linear_solver="direct".
        adjoint: "exact" (the only mode): the adjoint solves the transposed step Jacobian
            (dr/ds)^T w = -dL/ds exactly, with adjoint_solver. The former "schur" mode (the paper's
            single PCR solve of eq. 18 with the forward operator, W frozen at its converged value)
            was removed (issue 21): the lagged operator drops W's dependence on the slip and on
            lam_n, so it is exact only under sticking contact and wrong under sliding (2x-130x off
            central FD); a symmetric PCR cannot carry the non-symmetric sliding-friction Jacobian,
            so it cannot be made exact in that form. It survives as the preconditioner of
            adjoint_solver="gmres". SolverOptions(adjoint="schur") raises.
        adjoint_solver: the linear solve of "exact" (shared with the tangent path, `Simulation.jvp`):
            "lu": every world's step Jacobian assembled from batched VJP sweeps and solved
            by a per-world equilibrated LU in float64 on the device (sysid.engine.linsolve says why);
            the tangent path's solve whatever this option says;
            "krylov" (the backward's default since 2026-12-05: 3-4x less backward time than the LU's on
            the traversal at 64-1024 worlds, benchmarks/README.md): per world a right-preconditioned
            GMRES on the device, adjoint_krylov_iters iterations of one VJP sweep each instead of the
            LU's n assembly sweeps (n = 6 bodies + active rows), preconditioned by the forward's Schur
            elimination at the converged iterate (eq. 18-19, W frozen; its Schur matrix Cholesky-factored
            once per step in worlds with at most direct_max_rows rows, else PCR), checked against the
            matrix-free operator like the LU's; a backward in which any world's step misses adjoint_tol
            is run again with the LU (`Simulation.adjoint_fallbacks` counts those; a checkpointed
            rollout's, `Simulation(checkpoint_every=K)`, too, its segments recomputed again), so the
            gradients are the LU's to adjoint_tol either way;
            "gmres": the former host GMRES over all worlds at once (couples the worlds and stops
            at adjoint_max_iters; kept for comparison measurements, backward only).
        adjoint_tol: relative residual |A^T w - b| / |b| per world and step above which a world's
            adjoint (or tangent) solve counts as not converged and a RuntimeWarning names it; the
            GMRES's stopping tolerance.
        adjoint_max_iters: GMRES iterations (adjoint_solver="gmres").
        adjoint_krylov_iters: iterations per cycle of the device GMRES (adjoint_solver="krylov"), one VJP
            sweep and one preconditioner solve each, run by every world (a converged world skips its share).
        adjoint_krylov_cycles: the most restart cycles: after each, the sweep of the solution gives every
            world's true residual; a world above adjoint_krylov_tol restarts from it (the float32 sweeps let
            GMRES's own estimate drift below the truth where the preconditioned directions nearly cancel),
            the others keep their solution, so a world's result does not depend on the batch. The next
            cycle runs only if a world needs it, decided on the device (`wp.capture_if`: a conditional node
            of the recorded step).
        adjoint_krylov_tol: the relative residual a world's Krylov solve aims at, below adjoint_tol (the
            float32 sweeps' floor is ~1e-7); None (default): 0.2 x adjoint_tol, 2e-7 at the default. A
            normwise residual: a gradient entry far below the largest of its loss's gradient is resolved
            less finely than by the LU (tests/engine/test_krylov_adjoint.py; the robot's tiny y / yaw rows
            ~3e-3 relative where the LU matches the tangent to 1e-4): adjoint_solver="lu" where those
            entries matter.
    """

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
    friction_safeguard: str = "newton"
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
    residual_norm: str = "energy"
    cone_slack: float = 2.0
    check_contacts: bool = True
    gyroscopic: bool = True
    warm_start: bool = True
    adjoint_pcr_iters: int = 64
    linear_solver: str = "direct"
    direct_max_rows: int = 64
    lanes: int | None = None
    adjoint: str = "exact"
    adjoint_solver: str = "krylov"
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
        if self.newton_iters < 1 or self.pcr_iters < 1 or self.adjoint_pcr_iters < 1:
            raise ValueError("newton_iters, pcr_iters and adjoint_pcr_iters must be >= 1")
        if self.extra_iters < 0 or self.extra_tol < 0:
            raise ValueError("extra_iters and extra_tol must be >= 0")
        if not (math.isfinite(self.stall_tol) and self.stall_tol >= 0) or not (
                isinstance(self.stall_iters, int) and self.stall_iters >= 1):
            raise ValueError(f"stall_tol must be finite and >= 0 [m/s] (0: off) and stall_iters a whole number >= 1; "
                             f"got {self.stall_tol}, {self.stall_iters!r}")
        if not 0 <= self.k_min < self.newton_iters + 1:
            raise ValueError(f"k_min must lie in [0, newton_iters]; got {self.k_min}")
        if self.joint_compliance < 0 or self.tol < 0 or self.fb_eps <= 0:
            raise ValueError("joint_compliance and tol must be >= 0, fb_eps > 0")
        if self.friction_safeguard not in ("clamp", "projected", "active", "newton"):
            raise ValueError(
                "friction_safeguard must be 'newton', 'active', 'clamp' or 'projected', "
                f"got {self.friction_safeguard!r}"
            )
        if not (0.0 <= self.pin_relax < 1.0) or self.cone_slack < 1.0 or self.pcr_tol < 0.0 \
                or self.pcr_iters_newton < 1 or not (0.0 < self.line_search_min <= 1.0) or self.stick_prox < 0.0:
            raise ValueError("pin_relax must lie in [0, 1), cone_slack >= 1, pcr_tol >= 0, pcr_iters_newton >= 1, "
                             "line_search_min in (0, 1], stick_prox >= 0")
        if not (0.0 < self.stick_prox_decay <= 1.0) or self.stick_prox_decay_from < 0:
            raise ValueError("stick_prox_decay must lie in (0, 1] (1: no decay) and stick_prox_decay_from be >= 0")
        if self.residual_norm not in ("energy", "velocity"):
            raise ValueError(f"residual_norm must be 'energy' or 'velocity', got {self.residual_norm!r}")
        if self.pin_wheels_from < 0:
            raise ValueError("pin_wheels_from must be >= 0 (0: off)")
        if self.adjoint == "schur":
            raise ValueError("adjoint='schur' was removed: the paper's single Schur solve with the lagged "
                             "friction weight gives wrong gradients under sliding contact (a sliding block's "
                             "dx/dv0 0.223 instead of 0.400); use adjoint='exact' (the default; "
                             "adjoint_solver='lu' or 'gmres')")
        if self.adjoint != "exact":
            raise ValueError(f"adjoint must be 'exact', got {self.adjoint!r}")
        if self.linear_solver not in ("pcr", "direct"):
            raise ValueError(f"linear_solver must be 'pcr' or 'direct', got {self.linear_solver!r}")
        if not (isinstance(self.direct_max_rows, int) and self.direct_max_rows >= 1):
            raise ValueError(f"direct_max_rows must be a positive whole number of rows, got {self.direct_max_rows!r}")
        if self.lanes is not None and (type(self.lanes) is not int or self.lanes not in (1, *LANE_WIDTHS)):
            raise ValueError(f"lanes must be None (automatic on a CPU: {LANE_WIDTHS[-1]} from {LANES_WIDE_FROM} "
                             f"worlds, {LANES} from {LANES}, else 1), 1 or one of {LANE_WIDTHS}, got {self.lanes!r}")
        if self.adjoint_solver not in ("lu", "krylov", "gmres"):
            raise ValueError(f"adjoint_solver must be 'lu', 'krylov' or 'gmres', got {self.adjoint_solver!r}")
        if not (isinstance(self.adjoint_krylov_iters, int) and 1 <= self.adjoint_krylov_iters <= 64):
            raise ValueError("adjoint_krylov_iters must be a whole number of iterations in 1..64, got "
                             f"{self.adjoint_krylov_iters!r}")
        kt = self.adjoint_krylov_tol
        if kt is not None and (not (math.isfinite(kt) and kt > 0) or (
                self.adjoint_solver == "krylov" and kt >= self.adjoint_tol)):
            raise ValueError("adjoint_krylov_tol must be positive and below adjoint_tol (the check a world must "
                             f"pass), or None (0.2 x adjoint_tol), got {kt!r}")
        if not (isinstance(self.adjoint_krylov_cycles, int) and 1 <= self.adjoint_krylov_cycles <= 16):
            raise ValueError("adjoint_krylov_cycles must be a whole number of restart cycles in 1..16, got "
                             f"{self.adjoint_krylov_cycles!r}")
        if self.max_contacts_per_world < 1:
            raise ValueError("max_contacts_per_world must be >= 1")


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
class ModelArrays:
    """Model and physical parameters, constant over a step (``Model:`` in the kernels)."""

    body_com: wp.array(dtype=wp.vec3)  # (nb,) centre of mass in the body frame [m]
    body_mass: wp.array(dtype=float)  # (nb,) mass [kg] (parameter; 0: static)
    joint_parent: wp.array(dtype=int)  # (nj,) parent body (-1: the world)
    joint_child: wp.array(dtype=int)  # (nj,) child body
    joint_X_p: wp.array(dtype=wp.transform)  # (nj,) joint frame in the parent's frame [m]
    joint_X_c: wp.array(dtype=wp.transform)  # (nj,) joint frame in the child's frame [m]
    joint_axis_j: wp.array(dtype=wp.vec3)  # (nj,) revolute axis in the joint frame (unit)
    jrow_joint: wp.array(dtype=int)  # (jrows,) joint (index within a world) of each joint row
    jrow_kind: wp.array(dtype=int)  # (jrows,) JointRow of each joint row
    j_ke: wp.array(dtype=float)  # (nj,) servo position gain [N m/rad]
    j_kd: wp.array(dtype=float)  # (nj,) servo velocity gain [N m s/rad]
    j_scale: wp.array(dtype=float)  # (nj,) command scale of the velocity target
    j_tau: wp.array(dtype=float)  # (nj,) servo torque limit [N m] (0: none)
    shape_body: wp.array(dtype=int)  # (ns,) body of each shape (-1: static)
    shape_type: wp.array(dtype=int)  # (ns,) newton.GeoType
    shape_transform: wp.array(dtype=wp.transform)  # (ns,) shape frame in its body's frame [m]
    shape_scale: wp.array(dtype=wp.vec3)  # (ns,) newton's shape scale (half extents, radius) [m]
    shape_mu: wp.array(dtype=float)  # (ns,) Coulomb coefficient (longitudinal on wheels)
    shape_mu_lat: wp.array(dtype=float)  # (ns,) lateral Coulomb coefficient (anisotropic shapes)
    shape_slip: wp.array(dtype=float)  # (ns,) friction slip speed [m/s] (0: exact Coulomb)
    shape_slip_lat: wp.array(dtype=float)  # (ns,) lateral slip speed [m/s] (combined-slip law; 0: off)
    shape_mesh: wp.array(dtype=wp.uint64)  # (ns,) warp mesh id of a mesh shape (0: not a mesh)
    shape_face_start: wp.array(dtype=int)  # (ns,) a mesh shape's first face in mesh_cn / mesh_sharp (-1: none)
    mesh_cn: wp.array(dtype=wp.vec3)  # (3 x all meshes' faces,) unit corner normals, mesh frame (corner_normals)
    mesh_sharp: wp.array(dtype=int)  # (all meshes' faces,) bitmask of a face's sharp edges (bit e: corners e, e+1)


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

    x_prev: wp.array(dtype=wp.vec3)  # (nb,) centre of mass at q- in world [m]
    q_prev: wp.array(dtype=wp.quat)  # (nb,) orientation at q- (x, y, z, w), world from body
    u_prev: wp.array(dtype=wp.spatial_vector)  # (nb,) twist u- (v_com [m/s], omega [rad/s]) in world
    inv_m: wp.array(dtype=float)  # (nb,) inverse mass [1/kg]
    I_w: wp.array(dtype=wp.mat33)  # (nb,) world inertia at q- [kg m^2]
    inv_I: wp.array(dtype=wp.mat33)  # (nb,) inverse world inertia at q- [1/(kg m^2)]
    f_imp: wp.array(dtype=wp.spatial_vector)  # (nb,) external impulse over the step [N s, N m s]
    jt_q: wp.array(dtype=float)  # (nj,) servo position target [rad]
    jt_qd: wp.array(dtype=float)  # (nj,) servo velocity target [rad/s]
    j_qprev: wp.array(dtype=float)  # (nj,) joint angle at q- [rad]


@wp.struct
class Contacts:
    """The step's contact slots (``nw * max_contacts``), in the frames they move with (`contact.py`)."""

    count: wp.array(dtype=int)  # (nw,) contacts per world
    shape0: wp.array(dtype=int)  # shapes of the pair
    shape1: wp.array(dtype=int)
    p0: wp.array(dtype=wp.vec3)  # contact points in their shapes' body frames [m]
    p1: wp.array(dtype=wp.vec3)
    n: wp.array(dtype=wp.vec3)  # normal (0 -> 1) in the frame of body nbody (world if -1)
    nbody: wp.array(dtype=int)  # body the normal moves with
    thick: wp.array(dtype=float)  # summed margins [m]
    axial0: wp.array(dtype=float)  # axial offsets on round shapes [m]
    axial1: wp.array(dtype=float)
    fric_shape: wp.array(dtype=int)  # anisotropic (wheel) shape of the pair (-1: none)
    single: wp.array(dtype=int)  # 1: a wheel's one contact on a static box or mesh, from its centre


@wp.struct
class Rows:
    """One scalar constraint row per slot (``nw * max_rows``) at the current iterate (`rows.build_rows`)."""

    a: wp.array(dtype=int)  # global body indices (-1: the static world)
    b: wp.array(dtype=int)
    Ja: wp.array(dtype=wp.spatial_vector)  # Jacobian blocks, J u = Ja . u_a + Jb . u_b [m/s or rad/s]
    Jb: wp.array(dtype=wp.spatial_vector)
    C: wp.array(dtype=float)  # compliance block of the Schur system
    res: wp.array(dtype=float)  # velocity-level residual [m/s or rad/s]
    pinv: wp.array(dtype=float)  # Jacobi preconditioner 1 / (d + C) (0: row pinned, masked out)
    kind: wp.array(dtype=int)  # RowKind


@wp.struct
class SchurScratch:
    """Work vectors of the PCR solves of the Schur system (`schur.pcr_solve`)."""

    r: wp.array(dtype=float)  # (nw * max_rows,) residual
    z: wp.array(dtype=float)  # preconditioned residual
    p: wp.array(dtype=float)  # search direction
    Az: wp.array(dtype=float)  # A z
    Ap: wp.array(dtype=float)  # A p
    tmp: wp.array(dtype=wp.spatial_vector)  # (nb,) J^T v per body
    S: wp.array(dtype=wp.float64)  # (nw * dm * dm,) dense Schur factor per world (linear_solver="direct")
    y64: wp.array(dtype=wp.float64)  # (nw * max_rows,) triangular solves' work vector
    perm: wp.array(dtype=int)  # (nw * max_rows,) the factor's row order: S's row p is the world's row perm[p]
    env: wp.array(dtype=int)  # (nw * max_rows,) first nonzero column of S's row p (its envelope)


# Worlds per thread of the Newton step's PCR in vector lanes (`SolverOptions.lanes`): one world per lane
# of these vectors, so one thread's float32 operations run on LANES worlds at once (AVX: 8 floats). The lane
# code exists for each width in LANE_WIDTHS (`lane_types`, `schur.lane_code`, `step.iteration_kernel`,
# `adjoint.precond_kernels`: Warp closures, one set per width); LANES is the default width and the one
# these module-level names carry.
LANES = wp.constant(8)
LANE_WIDTHS = (8, 16)  # the first is LANES: the step and adjoint modules' own width
LANES_WIDE_FROM = 32  # worlds from which the automatic choice takes 16 lanes (`SolverOstrich.lanes`)


def lane_types(width: int) -> SimpleNamespace:
    """The lane vectors (lanef, lanei, laned: `width` float32 / int32 / float64) and the `LaneScratch` struct
    of one lane width (one of LANE_WIDTHS), made once per width."""
    if width not in LANE_WIDTHS:
        raise ValueError(f"lane width must be one of {LANE_WIDTHS}, got {width!r}")
    if width in _LANE_TYPES:
        return _LANE_TYPES[width]
    lanef = wp.types.vector(length=width, dtype=wp.float32)
    lanei = wp.types.vector(length=width, dtype=wp.int32)
    laned = wp.types.vector(length=width, dtype=wp.float64)

    @wp.struct
    class LaneScratch:
        """The Newton step's PCR and dense factor with LANES worlds per thread (`schur.lane_pcr`,
        `schur.lane_dense_factor`): group g holds worlds g * LANES + j in lane j, in scratch slot s = g % slots,
        its row r at s * max_rows + r, its body i at s * nbody + i. slots = 1 on a CPU, whose launches run
        their threads one after the other (the slot stays in cache); one per group on a GPU."""

        slots: int

        J: wp.array(dtype=lanef)  # (groups * max_rows * 12,) Ja (6 entries) then Jb (6) of each row
        la: wp.array(dtype=lanei)  # (groups * max_rows,) body of side a within the world (-1: static)
        lb: wp.array(dtype=lanei)  # side b's
        uni: wp.array(dtype=int)  # (groups * max_rows,) 1: every lane's row acts on the same bodies
        C: wp.array(dtype=lanef)  # (groups * max_rows,) compliance
        pinv: wp.array(dtype=lanef)  # Jacobi preconditioner (0: masked row)
        rhs: wp.array(dtype=lanef)  # right-hand side
        x: wp.array(dtype=lanef)  # solution
        r: wp.array(dtype=lanef)  # PCR work vectors, as SchurScratch's
        z: wp.array(dtype=lanef)
        p: wp.array(dtype=lanef)
        Az: wp.array(dtype=lanef)
        Ap: wp.array(dtype=lanef)
        tmp: wp.array(dtype=lanef)  # (groups * nbody * 6,) J^T v per body
        inv_m: wp.array(dtype=lanef)  # (groups * nbody,) inverse mass [1/kg]
        inv_I: wp.array(dtype=lanef)  # (groups * nbody * 9,) inverse world inertia, row-major [1/(kg m^2)]
        # the dense factor of LANES worlds whose rows act on the same bodies (`schur.lane_dense_factor`)
        S: wp.array(dtype=laned)  # (groups * dm * dm,) float64 Schur matrix, then its factor, in factor order
        Jd: wp.array(dtype=laned)  # (groups * dm * 12,) the rows' Ja, Jb in float64, in factor order
        Y: wp.array(dtype=laned)  # (groups * dm * 12,) M~^-1 Ja^T, M~^-1 Jb^T of each row (`minv_jt`)
        yd: wp.array(dtype=laned)  # (groups * dm,) the triangular solves' work vector (`schur.lane_dense_solve`)
        # (groups * LANES * 20,) coupled pins' b (4), M (4 x 4) per lane (`lane_coupled_pins`)
        pin: wp.array(dtype=float)

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
    """The Newton iterate of `step.newton_iteration`, its best copy, status and the safeguards' memory."""

    u: wp.array(dtype=wp.spatial_vector)  # (nb,) twist u+ of the iterate
    lam: wp.array(dtype=float)  # (nw * max_rows,) multipliers = impulses over the step [N s or N m s]
    x: wp.array(dtype=wp.vec3)  # (nb,) centre of mass at q+ of the iterate [m]
    q: wp.array(dtype=wp.quat)  # (nb,) orientation at q+ of the iterate
    u_best: wp.array(dtype=wp.spatial_vector)  # best iterate from k_min on
    lam_best: wp.array(dtype=float)
    best_norm: wp.array(dtype=float)  # (nw,) its residual norm [m/s]
    best_k: wp.array(dtype=int)  # (nw,) its iteration (-1: none)
    done: wp.array(dtype=int)  # (nw,) world finished (converged or diverged)
    status: wp.array(dtype=int)  # (nw,) StepCode
    iters: wp.array(dtype=int)  # (nw,) last iteration evaluated
    res_dyn: wp.array(dtype=float)  # (nw,) dynamics part of the best norm [m/s]
    res_con: wp.array(dtype=float)  # (nw,) constraint part of the best norm [m/s]
    n_rows: wp.array(dtype=int)  # (nw,) rows in use
    res_trace: wp.array(dtype=float)  # (nw * trace_stride,) residual norm per iteration [m/s]
    ydyn: wp.array(dtype=wp.spatial_vector)  # (nb,) M~^-1 r_dyn [m/s, rad/s]
    rhs: wp.array(dtype=float)  # right-hand side of the Schur system
    dl: wp.array(dtype=float)  # its solution, the multipliers' step
    fdir: wp.array(dtype=wp.vec4)  # (nw * max_contacts,) rotated sliding rows: (e1, e2, pinned flag, dl~_par)
    pin: wp.array(dtype=wp.vec2)  # (nw * max_contacts,) last pinned lam_n and its change
    ls_ref: wp.array(dtype=float)  # (nw,) backtracking: last accepted norm [m/s]
    ls_alpha: wp.array(dtype=float)  # (nw,) backtracking step fraction
    u_ls: wp.array(dtype=wp.spatial_vector)  # last accepted iterate and step
    du_ls: wp.array(dtype=wp.spatial_vector)
    lam_ls: wp.array(dtype=float)
    dl_ls: wp.array(dtype=float)


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
    direct_max: int  # linear_solver == "direct": direct_max_rows (dense factor stride dm); 0: PCR
    lanes: int  # 1: a group per world; LANES: LANES worlds per group, the PCR in vector lanes
    thread_groups: int  # groups per launch thread (SolverOstrich.thread_groups)
