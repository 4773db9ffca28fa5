"""Multi-step rollouts with adjoint gradients and tangents: O(1) stored data per step, optional segment
checkpointing, named physical parameters (and a torch.autograd bridge, torch_bridge.py).

A rollout stores per step only what the adjoint needs at the converged step: q-, u-, the
returned u+ and multipliers, the contact set and the servo targets. The backward sweep runs
the steps in reverse (paper §III-D); with ``checkpoint_every=K`` only every K-th state (and the
warm start it began with) is kept and each segment is recomputed on the device during the backward
pass, into K-row record buffers, and differentiated there (bit-identical: the forward is
deterministic; the host reads a segment's contact counts, nothing per step).

Forward mode: `Simulation.jvp` returns d body_q / d theta and d body_qd / d theta per step for p
directions (registered parameters, raw parameter arrays, step_arrays, servo targets, initial
state), solving each converged step's linearisation with the same per-world solve as the adjoint
(`sysid.engine.linsolve`: the step Jacobian assembled from batched VJP sweeps, equilibrated LU
per world). Both report per-world solve health and warn about worlds above adjoint_tol.

`Simulation` is the facade; its parts: record.py (a step's record and its recorded residual), tape.py (the
rollout on the device and its `Tape`), backward.py (the adjoint), krylov.py (the adjoint's Krylov solves),
tangent.py (the tangents).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import warp as wp

from .backward import Adjoint, Gradients
from .errors import EngineError
from .graphs import GraphCache, LaunchCache
from .krylov import DeviceKrylov
from .record import PARAM_ARRAYS, Residual
from .solver_ostrich import SolverOstrich
from .tangent import TangentResult, Tangents, TangentSolver
from .tape import ForwardResult, Rollout, RolloutInputs, Tape, set_bodies

# solver arrays a rollout depends on besides its inputs: snapshotted by `forward` into its tape and
# put back for that tape's backward (so a parameter change after the forward cannot leak into it)
_TAPE_ARRAYS = (*PARAM_ARRAYS, "shape_aniso")
# options that change the residual the adjoint linearises (a backward refuses a tape recorded under others)
_TAPE_OPTIONS = ("contact_compliance", "fb_eps", "inactive_friction_weight", "joint_compliance", "gyroscopic",
                 "friction_safeguard", "max_contacts_per_world")


@dataclass
class ParamSpec:
    """A named physical parameter: a value written into ``array`` (one of PARAM_ARRAYS) at
    ``indices``; with ``per_world`` one value per world: entry k belongs to world ``worlds[k]`` (None: the
    indices split evenly, world order). A world may own no entry (e.g. a pallet's friction in a world
    without a pallet): its value reads as NaN and its gradient is 0."""

    name: str
    array: str
    indices: np.ndarray
    per_world: bool = False
    worlds: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.array not in PARAM_ARRAYS:
            raise EngineError(f"parameter {self.name!r}: unknown array {self.array!r}; use one of {PARAM_ARRAYS}")
        self.indices = np.asarray(self.indices, dtype=np.int64).ravel()
        if self.indices.size == 0:
            raise EngineError(f"parameter {self.name!r} selects no entries")
        if self.worlds is not None:
            self.worlds = np.asarray(self.worlds, dtype=np.int64).ravel()
            if not self.per_world or self.worlds.shape != self.indices.shape:
                raise EngineError(f"parameter {self.name!r}: worlds needs per_world and one world per index")


class Simulation:
    """Open-loop rollouts of a `SolverOstrich` model, their adjoint (`backward`) and their
    tangents (`jvp`).

    Args:
        solver: the solver (its model, options and parameter arrays).
        dt: step [s].
        pullback: "full" (contact points and normals follow the rigid transform in the
            derivative with respect to the previous pose) or "truncated" (paper §IV-D, for long
            chaotic horizons): the contact geometry (normals, points, lever arms, friction frames)
            held at each step's converged pose, the gap still moving to first order with the
            bodies (adjoint.residual_frozen_gap), so normal impulses keep their dependence on u+
            and q-; only dJ/dq is dropped (equal to "full" where the geometry has no pose
            dependence, e.g. a box sliding on flat ground).
        checkpoint_every: keep one state per this many steps and recompute segments backward.
        graphs: replay recorded steps (a CUDA graph on a GPU, warp's API capture on CPU) instead of
            launching each kernel from Python: bit-identical, faster (graphs.py; False: launches).

    After a call: ``last_tape`` (the last forward's `Tape`), ``step_residuals`` (steps, worlds) the Newton
    residual each step of the last rollout returned [m/s], ``peak_record_bytes`` the last forward's tape's
    records, ``adjoint_stats`` per backward step (in step order) (assembled system size, or GMRES iterations with
    adjoint_solver="gmres"; largest per-world relative residual), ``adjoint_fallbacks`` the Krylov adjoints that
    needed the LU.
    """

    def __init__(self, solver: SolverOstrich, dt: float, *, pullback: str = "full",
                 checkpoint_every: int | None = None, graphs: bool = True):
        if pullback not in ("full", "truncated"):
            raise EngineError(f"pullback must be 'full' or 'truncated', got {pullback!r}")
        if checkpoint_every is not None and not (isinstance(checkpoint_every, (int, np.integer))
                                                 and not isinstance(checkpoint_every, bool) and checkpoint_every >= 1):
            raise EngineError(f"checkpoint_every must be None or a positive whole number of steps, got "
                              f"{checkpoint_every!r}")
        self.solver = solver
        self.model = solver.model
        self.dt = float(dt)
        self.pullback = pullback
        self.checkpoint_every = None if checkpoint_every is None else int(checkpoint_every)
        self.params: dict[str, ParamSpec] = {}
        self.last_tape: Tape | None = None  # the last forward's tape: what backward(gQ, gQD) differentiates
        self._serial = 0
        self.adjoint_fallbacks = 0
        self.peak_record_bytes = 0
        self.step_residuals = np.zeros((0, solver.world_count), dtype=np.float32)
        self.adjoint_stats: list[tuple[int, float]] = []
        # recorded replays (graphs.py): of a forward step, of the backward's Jacobian assembly; recorded launches
        self._graphs = GraphCache(self.model.device, enabled=graphs)
        self._launches = LaunchCache(self.model.device)
        # the parts, each holding its own buffers and recordings
        self._residual = Residual(self)
        self._rollout = Rollout(self)
        self._krylov = DeviceKrylov(self)
        self._adjoint = Adjoint(self)
        self._tangent = TangentSolver(self)
        solver.enable_parameter_gradients(PARAM_ARRAYS)

    # ---------------------------------------------------------------- parameters
    def register_parameter(self, name: str, array: str, indices: npt.ArrayLike, per_world: bool = False,
                           worlds: npt.ArrayLike | None = None) -> ParamSpec:
        """Name entries ``indices`` of parameter array ``array`` (`PARAM_ARRAYS`) as one parameter; with
        ``per_world`` one value per world, the entries split evenly in world order or, given ``worlds``,
        entry k belonging to world ``worlds[k]`` (see `ParamSpec`)."""
        spec = ParamSpec(name, array, cast(np.ndarray, indices), per_world,
                         None if worlds is None else cast(np.ndarray, worlds))  # ParamSpec makes int arrays
        n = getattr(self.solver, array).shape[0]
        W = self.solver.world_count
        if spec.indices.min() < 0 or spec.indices.max() >= n:
            raise EngineError(f"parameter {name!r}: indices out of range for {array} (size {n})")
        if spec.worlds is not None and (spec.worlds.min() < 0 or spec.worlds.max() >= W):
            raise EngineError(f"parameter {name!r}: worlds out of range [0, {W})")
        if per_world and spec.worlds is None and spec.indices.size % W:
            raise EngineError(f"parameter {name!r}: {spec.indices.size} entries do not split over {W} worlds")
        self.params[name] = spec
        return spec

    def set_parameters(self, values: Mapping[str, float | Sequence[float] | np.ndarray]) -> None:
        for name, v in values.items():
            spec = self._spec(name)
            arr = getattr(self.solver, spec.array)
            data = arr.numpy()
            v = np.asarray(v, dtype=np.float32)
            if spec.worlds is not None:
                v = np.broadcast_to(v, (self.solver.world_count,))[spec.worlds]
            elif spec.per_world:
                v = np.repeat(np.broadcast_to(v, (self.solver.world_count,)),
                              spec.indices.size // self.solver.world_count)
            data[spec.indices] = v
            arr.assign(data)

    def get_parameters(self) -> dict[str, np.ndarray | np.float32]:
        out: dict[str, np.ndarray | np.float32] = {}
        for name, spec in self.params.items():
            data = getattr(self.solver, spec.array).numpy()[spec.indices]
            if spec.worlds is not None:
                per = np.full(self.solver.world_count, np.nan, np.float32)
                per[spec.worlds[::-1]] = data[::-1]  # each world's first entry
                out[name] = per
            else:
                out[name] = (data.reshape(self.solver.world_count, -1)[:, 0] if spec.per_world
                             else np.float32(data[0]))
        return out

    def _spec(self, name: str) -> ParamSpec:
        if name not in self.params:
            raise EngineError(f"unknown parameter {name!r}; registered: {sorted(self.params)}")
        return self.params[name]

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        body_q0: np.ndarray,
        body_qd0: np.ndarray,
        steps: int,
        targets_qd: np.ndarray | None = None,
        targets_q: np.ndarray | None = None,
        progress: Callable[[int], None] | None = None,
        step_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> ForwardResult:
        """Simulate ``steps`` steps from (body_q0, body_qd0); servo targets per step
        ``targets_qd`` (steps, joint_dof_count) [rad/s] and ``targets_q`` (steps, coord count).
        ``step_arrays`` {PARAM_ARRAYS name: (steps, n)} sets a parameter array anew before every
        step (e.g. a slip speed that follows the commanded wheel speed); `backward` then also
        returns each step's gradient with respect to it.

        Returns body_q (steps+1, nb, 7) and body_qd (steps+1, nb, 6) (a `ForwardResult`: unpacks
        as the pair); every step is recorded on the result's ``.tape`` (also ``last_tape``), which
        binds a backward to this rollout: ``tape.backward(gQ, gQD)`` or ``sim.backward(gQ, gQD,
        tape=tape)`` linearises these steps at the parameters this forward ran with, whatever
        forwards or `set_parameters` calls came after; ``sim.backward(gQ, gQD)`` is the last
        forward's. ``step_residuals`` (steps, worlds) then holds each step's returned Newton
        residual [m/s], to tell converged replays from ones that ran out of iterations.
        """
        m, rollout = self.model, self._rollout
        rollout.set_inputs(steps, targets_qd, targets_q, step_arrays)
        self._serial += 1
        i = rollout.inputs
        tape = Tape(sim=self, serial=self._serial, steps=steps,
                    inputs=RolloutInputs(i.targets_qd, i.targets_q, dict(i.step_arrays)),
                    arrays={k: wp.clone(getattr(self.solver, k), requires_grad=False) for k in _TAPE_ARRAYS},
                    options=self._options_key(), checkpoint_every=self.checkpoint_every)
        self.last_tape = None  # a forward that fails half-way leaves no tape to differentiate
        nb = m.body_count
        Q = np.empty((steps + 1, nb, 7), dtype=np.float32)
        QD = np.empty((steps + 1, nb, 6), dtype=np.float32)
        Q[0] = np.asarray(body_q0, dtype=np.float32).reshape(nb, 7)
        QD[0] = np.asarray(body_qd0, dtype=np.float32).reshape(nb, 6)
        set_bodies(rollout.state_a, Q[0], QD[0])
        self.solver.reset_warm_start()  # a rollout is a function of its inputs alone
        # every step on the device, recorded once and replayed (graphs.py); one read at the end
        rollout.record(steps, tape, Q, QD, progress)
        self.peak_record_bytes = tape.peak_record_bytes
        self.last_tape = tape
        return ForwardResult(Q, QD, tape)

    def _options_key(self) -> tuple[Any, ...]:
        o = self.solver.options
        return (self.dt, self.pullback, *(getattr(o, k) for k in _TAPE_OPTIONS))

    # ---------------------------------------------------------------- backward
    def backward(self, grad_body_q: np.ndarray | None = None, grad_body_qd: np.ndarray | None = None, *,
                 tape: Tape | None = None) -> Gradients:
        """Reverse sweep for a loss L(body_q, body_qd) of one `forward` rollout: ``tape`` (the
        ``.tape`` of that forward's result), by default the last forward's (``last_tape``).

        grad_body_q (steps+1, nb, 7) and grad_body_qd (steps+1, nb, 6) are dL/d(trajectory).
        The steps are linearised at the tape's own inputs and at the parameter arrays as they
        were when its forward ran (put back for the sweep, the current ones restored after), so
        a later forward or `set_parameters` does not change the result. EngineError when there
        is no tape, when the tape is another Simulation's, or when a solver option that shapes
        the residual (contact_compliance, fb_eps, ...) or the step size / pull-back changed since.
        """
        self.solver.options.validate()  # options may have been edited since the solver was built
        tape = self.last_tape if tape is None else tape
        if tape is None:
            raise EngineError("backward() needs a forward() rollout first (Simulation.jvp records nothing)")
        if not isinstance(tape, Tape) or tape.sim is not self:
            raise EngineError("backward(tape=...): the tape was recorded by another Simulation")
        key = self._options_key()
        if tape.options != key:
            names = ("dt", "pullback", *_TAPE_OPTIONS)
            diff = [f"{n}: {a!r} -> {b!r}" for n, a, b in zip(names, tape.options, key) if a != b]
            raise EngineError("backward(): the solver changed since this tape's forward (" + ", ".join(diff)
                              + "); run forward again")
        sv, rollout = self.solver, self._rollout
        saved = {k: wp.clone(getattr(sv, k), requires_grad=False) for k in _TAPE_ARRAYS}
        inputs = rollout.inputs
        for k, a in tape.arrays.items():
            wp.copy(getattr(sv, k), a)
        rollout.inputs = tape.inputs
        try:
            return self._adjoint.run(tape, grad_body_q, grad_body_qd)
        finally:
            for k, a in saved.items():
                wp.copy(getattr(sv, k), a)
            rollout.inputs = inputs

    # ---------------------------------------------------------------- tangents (forward mode)
    def parameter_tangents(self, names: Sequence[str]) -> Tangents:
        """Unit directions of registered parameters, one per name (p = len(names)): a per-world
        parameter's direction moves every world's own value, so world w's tangent is
        d(world w) / d(its value)."""
        p = len(names)
        out = {}
        for c, name in enumerate(names):
            spec = self._spec(name)
            v = np.zeros((p, self.solver.world_count) if spec.per_world else (p,), np.float32)
            v[c] = 1.0
            out[name] = v
        return Tangents(params=out)

    def jvp(
        self,
        body_q0: np.ndarray,
        body_qd0: np.ndarray,
        steps: int,
        tangents: Tangents,
        targets_qd: np.ndarray | None = None,
        targets_q: np.ndarray | None = None,
        step_arrays: Mapping[str, np.ndarray] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> TangentResult:
        """A rollout (the arguments of `forward`) with its forward-mode sensitivities to the p
        directions of ``tangents``, batched over worlds and directions.

        At every step, once the Newton step has converged, the step's Jacobian A = dr/ds is
        assembled and factored per world (linsolve.StepSystem, the same solve as the adjoint) and
        the tangent of the returned state follows from the implicit function theorem (eq. 14):
        A ds = -(dr/dxi) dxi for all p directions, dxi = (dq-, du-, d targets, d theta), then
        dq+ = dq+/dq- dq- + dq+/du+ du+ (eq. 1), du+ the velocity part of ds. Device memory:
        the tangent state (p x bodies x 13) and one step's per-world system, independent of the
        Newton iterations and of the horizon; nothing is recorded (``last_tape`` stays the last
        `forward`'s, and `backward` differentiates that one). The derivative is the one `backward`
        returns (the same linearisation), row for row: sum_t <grad_body_q[t], dq[c, t]> +
        <grad_body_qd[t], dqd[c, t]> equals the adjoint's dL/d(direction c).

        Example (d body_q per step / d a registered parameter, a step array, the targets)::

            sim.register_parameter("kp", "joint_kd", wheel_joints, per_world=True)
            tan = sim.parameter_tangents(["kp"])             # p = 1: d/d kp (each world its own)
            res = sim.jvp(q0, qd0, T, tan, targets_qd=tq)
            dQ_dkp = res.dq[0]                                # (T+1, nb, 7)
            # d/d a slip schedule's entry s at step t, and d/d every wheel target (chained by the caller):
            seeds = np.zeros((2, T, n_shapes), np.float32); seeds[0, t, s] = 1.0
            dT = np.zeros((2, T, dofs), np.float32); dT[1, :, col] = 1.0   # a constant target offset
            res = sim.jvp(q0, qd0, T, Tangents(step_arrays={"shape_slip": seeds}, targets_qd=dT),
                          targets_qd=tq, step_arrays={"shape_slip": vs})
            # res.dq[0]: d body_q / d vs[t, s]; res.dq[1]: d body_q / d (tq[:, col] + eps)

        A quantity derived from the targets (e.g. targets = f(phi)) is chained by the caller:
        direction c = df/dphi_c as ``targets_qd`` (p, T, dofs). Per-world directions must touch
        only entries that belong to one world (a static shape shared by all worlds, such as the
        ground, cannot carry a per-world direction when there is more than one world).

        Returns a `TangentResult`; worlds whose solve exceeded adjoint_tol are named in a
        RuntimeWarning.
        """
        return self._tangent.run(body_q0, body_qd0, steps, tangents, targets_qd, targets_q, step_arrays, progress)

    def memory_bytes(self, tape: Tape | None = None) -> int:
        """Bytes a tape (default: the last forward's) holds for the backward pass: stored step
        records (peak over segments when checkpointed), checkpoints and the parameter snapshot
        (`Tape.nbytes`; the tests check it against the arrays actually alive). Independent of the
        Newton/PCR iteration counts."""
        tape = self.last_tape if tape is None else tape
        return 0 if tape is None else tape.nbytes()
