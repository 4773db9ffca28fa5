"""Multi-step rollouts with adjoint gradients: O(1) stored data per step, optional segment
checkpointing, named physical parameters, and a torch.autograd bridge.

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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

import newton
import numpy as np
import numpy.typing as npt
import warp as wp

from . import adjoint as adj
from . import linsolve as ls
from . import linsolve_kernels as lk
from .errors import EngineError
from .graph_kernels import PUT_ROW, TAKE_ROW, advance, put_contact_record, retreat, wrap_index
from .graphs import COLLISION_LOCK, GraphCache
from .linsolve_kernels import (
    pose_tangent_component,
    rhs_entries_row,
    rhs_state_row,
    scatter_du,
    seed_pose_component,
    write_seed_from,
)
from .solver_ostrich import SolverOstrich
from .step import prepare_bodies
from .types import SchurScratch, StepData, host_array, make, repacked

# in graph_kernels.put_contact_record's argument order
_CONTACT_FIELDS = (
    "ct_count", "ct_shape0", "ct_shape1", "ct_p0", "ct_p1", "ct_n", "ct_nbody", "ct_thick", "ct_axial0",
    "ct_axial1", "ct_fric_shape", "ct_single",
)
PARAM_ARRAYS = ("body_mass", "shape_mu", "shape_mu_lat", "shape_slip", "shape_slip_lat", "joint_ke", "joint_kd",
                "joint_cmd_scale", "joint_effort_limit")


def _bodies(state: newton.State) -> tuple[wp.array[Any], wp.array[Any]]:
    """``(body_q, body_qd)`` of a state: newton types both optional, a model with bodies allocates them."""
    assert state.body_q is not None and state.body_qd is not None
    return state.body_q, state.body_qd


def _set_bodies(state: newton.State, q: np.ndarray, qd: np.ndarray) -> None:
    """Write poses (nb, 7) and twists (nb, 6) into a state."""
    body_q, body_qd = _bodies(state)
    body_q.assign(q)
    body_qd.assign(qd)


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


@dataclass
class StepRecord:
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


# the rollout-long buffers a tape keeps copies of (the states and every step's record)
_RECORD_BUFFERS = ("q", "qd", "u_plus", "lam", "jt_q", "jt_qd", *_CONTACT_FIELDS)
# solver arrays a rollout depends on besides its inputs: snapshotted by `forward` into its tape and
# put back for that tape's backward (so a parameter change after the forward cannot leak into it)
_TAPE_ARRAYS = (*PARAM_ARRAYS, "shape_aniso")
# options that change the residual the adjoint linearises (a backward refuses a tape recorded under others)
_TAPE_OPTIONS = ("contact_compliance", "fb_eps", "inactive_friction_weight", "joint_compliance", "gyroscopic",
                 "friction_safeguard", "max_contacts_per_world")


@dataclass(eq=False)
class Tape:
    """Everything `Simulation.backward` needs of one `forward` rollout: its inputs (steps, servo
    targets, step_arrays), the solver's parameter arrays as they were when it ran, and its step
    records (or, with checkpointing, its checkpoints). Returned by `forward` (``.tape`` of its
    result, and ``Simulation.last_tape``); ``tape.backward(gQ, gQD)`` gives that rollout's
    gradients whatever forwards or parameter changes happened since. Holding a tape keeps its
    records alive (O(1) per step, see `Simulation.memory_bytes`)."""

    sim: Simulation
    serial: int
    steps: int
    targets_qd: np.ndarray | None
    targets_q: np.ndarray | None
    step_arrays: dict[str, np.ndarray]
    arrays: dict[str, wp.array[Any]]
    options: tuple[Any, ...]
    checkpoint_every: int | None = None
    # the records as rollout-long device buffers (rows: steps; `_RECORD_BUFFERS`), each world's contact slots and
    # constraint rows cut to the rollout's most contacts (`extent`: slots, rows per world); None when checkpointed
    buffers: dict[str, wp.array[Any]] | None = None
    extent: tuple[int, int] = (0, 0)
    contact_counts: np.ndarray | None = None  # each step's most contacts of any world (read by forward)
    checkpoints: list[tuple[np.ndarray, np.ndarray, tuple[wp.array[Any], ...] | None]] = field(default_factory=list)
    peak_record_bytes: int = 0
    _records: list[StepRecord] | None = None

    @property
    def records(self) -> list[StepRecord]:
        """Every step's record in the solver's layout (every contact slot and row), expanded from `buffers` on
        first use and kept; [] for a checkpointed tape (its records are recomputed by the backward)."""
        if self._records is None:
            if self.buffers is None:
                return []
            # uninitialised: _expand_records overwrites each array whole, zeroing the parts past the extent
            full = {k: wp.empty(self.sim._record_shape(k, a), dtype=a.dtype, device=a.device)
                    for k, a in self.buffers.items()}
            self.sim._expand_records(self, full)
            self._records = self.sim._record_views(full, 0, self.steps)
        return self._records

    def backward(self, grad_body_q: np.ndarray | None = None, grad_body_qd: np.ndarray | None = None) -> Gradients:
        """`Simulation.backward` of this rollout."""
        return self.sim.backward(grad_body_q, grad_body_qd, tape=self)

    def nbytes(self) -> int:
        """Bytes this tape holds for the backward pass: step records (peak over segments when
        checkpointed), checkpoints, the parameter snapshot and the inputs (targets, step_arrays)."""
        ck = sum(a.nbytes + b.nbytes + (sum(x.capacity for x in w) if w else 0) for a, b, w in self.checkpoints)
        inputs = sum(x.nbytes for x in (self.targets_qd, self.targets_q, *self.step_arrays.values()) if x is not None)
        return int(self.peak_record_bytes + ck + sum(a.capacity for a in self.arrays.values()) + inputs)


class ForwardResult(tuple[np.ndarray, np.ndarray]):
    """``(body_q, body_qd)`` of `Simulation.forward` (unpacks as the pair), with the rollout's
    `Tape` as ``.tape`` (``result.tape.backward(gQ, gQD)``)."""

    tape: Tape

    def __new__(cls, q: np.ndarray, qd: np.ndarray, tape: Tape) -> ForwardResult:
        obj = super().__new__(cls, (q, qd))
        obj.tape = tape
        return obj

    @property
    def q(self) -> np.ndarray:
        return self[0]

    @property
    def qd(self) -> np.ndarray:
        return self[1]


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
        m = self.model
        self._state_a = m.state()
        self._state_b = m.state()
        self._control = m.control()
        # the inputs of the rollout being stepped (forward, a tape's recomputation, jvp)
        self._targets_qd: np.ndarray | None = None
        self._targets_q: np.ndarray | None = None
        self._step_arrays: dict[str, np.ndarray] = {}
        self.last_tape: Tape | None = None  # the last forward's tape: what backward(gQ, gQD) differentiates
        self._serial = 0
        self._ws: dict[str, wp.array[Any]] | None = None
        self._schur_cmd: tuple[Any, Any] | None = None  # ((h, options), recorded adjoint_system launch)
        # adjoint_solver="krylov": its work arrays, its preconditioner's recorded launches ((h, options), (factor,
        # apply)), its arrays' serial (a recording of older arrays is stale) and the LU re-runs it needed
        self._krylov_ws: ls.Krylov | None = None
        self._krylov_serial = 0
        self._precond_cmds: tuple[Any, Any] | None = None
        self.adjoint_fallbacks = 0
        self._rec_cmds: dict[str, Any] | None = None
        self._rec_serial = 0  # counts _recorded's rebuilds (a replay of the old launches must not be reused)
        self._cmax = solver.max_contacts  # contact slots the residual's launches cover (_contact_span)
        # recorded replays (graphs.py): of a forward step, of the backward's Jacobian assembly
        self._graphs = GraphCache(self.model.device, enabled=graphs)
        self._bufs: dict[str, Any] | None = None  # rollout-long device buffers (_buffers)
        self._gbufs: dict[str, Any] | None = None  # the backward's (_backward_buffers)
        self._jbufs: dict[str, Any] | None = None  # jvp's (_jvp_buffers)
        self._cmds: dict[tuple[Any, ...], Any] = {}  # _launch_rec's recorded launches
        self.peak_record_bytes = 0
        self.step_residuals = np.zeros((0, solver.world_count), dtype=np.float32)
        # per backward step (in step order): (assembled system size, or GMRES iterations with
        # adjoint_solver="gmres"; largest per-world relative residual)
        self.adjoint_stats: list[tuple[int, float]] = []
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
        m = self.model
        self._set_inputs(steps, targets_qd, targets_q, step_arrays)
        self._serial += 1
        tape = Tape(sim=self, serial=self._serial, steps=steps, targets_qd=self._targets_qd,
                    targets_q=self._targets_q, step_arrays=dict(self._step_arrays),
                    arrays={k: wp.clone(getattr(self.solver, k), requires_grad=False) for k in _TAPE_ARRAYS},
                    options=self._options_key(), checkpoint_every=self.checkpoint_every)
        self.last_tape = None  # a forward that fails half-way leaves no tape to differentiate
        nb = m.body_count
        Q = np.empty((steps + 1, nb, 7), dtype=np.float32)
        QD = np.empty((steps + 1, nb, 6), dtype=np.float32)
        Q[0] = np.asarray(body_q0, dtype=np.float32).reshape(nb, 7)
        QD[0] = np.asarray(body_qd0, dtype=np.float32).reshape(nb, 6)
        _set_bodies(self._state_a, Q[0], QD[0])
        self.solver.reset_warm_start()  # a rollout is a function of its inputs alone
        # every step on the device, recorded once and replayed (graphs.py); one read at the end
        self._forward_buffered(steps, tape, Q, QD, progress)
        self.peak_record_bytes = tape.peak_record_bytes
        self.last_tape = tape
        return ForwardResult(Q, QD, tape)

    def _forward_buffered(self, steps: int, tape: Tape, Q: np.ndarray, QD: np.ndarray,
                          progress: Callable[[int], None] | None) -> None:
        """The steps of `forward` on the rollout buffers (`_buffered_rollout`); the host reads them once at
        the end. The tape keeps copies of the records, or, checkpointed every K steps, the state and the
        warm start each segment began with (device copies taken between steps; the records were written
        into K-row buffers and are recomputed by the backward)."""
        K = self.checkpoint_every
        B = self._buffers(steps, K)
        self._write_inputs(B)
        warm: list[tuple[wp.array[Any], ...] | None] = [None]  # segment 0 starts cold
        for t, _ in self._buffered_rollout(B):
            if K is not None and (t + 1) % K == 0 and t + 1 < steps:
                warm.append(self.solver.warm_state())
            if progress is not None:
                progress(t)
        self._read_rollout(B, Q, QD, stacklevel=4)  # the warning names forward's caller
        if K is not None:
            tape.checkpoints = [(Q[s * K].copy(), QD[s * K].copy(), w) for s, w in enumerate(warm)]
            tape.peak_record_bytes = self._record_bytes(B)
            return
        # the tape's copies keep each world's first C contact slots and jrows + 3 C rows, C the most contacts of any
        # world at any step (one read of the counts): the backward reads no slot or row past a step's count, and a
        # rollout with few contacts per world keeps a fraction of max_contacts_per_world's records (1,024 worlds
        # over the pallet, at most 6 of 48 slots: 261 -> 55 MB per tape, fewer page faults and copies per forward)
        tape.contact_counts = B["ct_count"].numpy().max(axis=1, initial=0)  # also the backward's system sizes
        C = int(tape.contact_counts.max(initial=0))
        tape.extent = (C, self.solver.joint_rows + 3 * C)
        tape.buffers = {k: wp.clone(self._record_part(B[k], k, tape.extent)) for k in _RECORD_BUFFERS}
        tape.peak_record_bytes = sum(a.capacity for a in tape.buffers.values())
        B["holds"] = tape.serial  # until the next rollout on B, B holds this tape's records as they are

    def _record_part(self, a: wp.array[Any], k: str, extent: tuple[int, int]) -> wp.array[Any]:
        """The part of rollout buffer ``a`` (record ``k``, rows: steps) a tape keeps: each world's first extent[0]
        contact slots, or first extent[1] constraint rows (lam); the whole of the other records."""
        sv = self.solver
        part: wp.array[Any] = a
        if k in _CONTACT_FIELDS and k != "ct_count":
            part = a.reshape((a.shape[0], sv.world_count, sv.max_contacts))[:, :, : extent[0]]
        elif k == "lam":
            part = a.reshape((a.shape[0], sv.world_count, sv.max_rows))[:, :, : extent[1]]
        return part

    def _record_shape(self, k: str, kept: wp.array[Any]) -> tuple[int, int]:
        """The rollout buffer's shape of a tape's record ``k`` (kept: the tape's part of it)."""
        sv = self.solver
        if k in _CONTACT_FIELDS and k != "ct_count":
            return (kept.shape[0], sv.world_count * sv.max_contacts)
        if k == "lam":
            return (kept.shape[0], sv.world_count * sv.max_rows)
        return (kept.shape[0], kept.shape[1])

    def _expand_records(self, tape: Tape, B: dict[str, Any]) -> None:
        """A tape's records into rollout buffers ``B`` (the forward's layout); the slots and rows past the tape's
        extent zeroed."""
        assert tape.buffers is not None
        for k in _RECORD_BUFFERS:
            part = self._record_part(B[k], k, tape.extent)
            if part is not B[k]:
                B[k].zero_()
            wp.copy(part, tape.buffers[k])

    def _hold(self, tape: Tape, B: dict[str, Any]) -> None:
        """Make rollout buffers ``B`` hold ``tape``'s records: as they are when its forward was the last rollout on
        them (the usual forward-then-backward), else expanded from the tape's copies."""
        if B.get("holds") != tape.serial:
            self._expand_records(tape, B)
            B["holds"] = tape.serial

    @staticmethod
    def _record_views(B: dict[str, Any], t0: int, t1: int) -> list[StepRecord]:
        """StepRecords of steps t0..t1-1 as views of buffers ``B`` (the records at rows 0.., the states at t)."""
        return [StepRecord(body_q=B["q"][t], body_qd=B["qd"][t], u_plus=B["u_plus"][t - t0], lam=B["lam"][t - t0],
                           jt_q=B["jt_q"][t - t0], jt_qd=B["jt_qd"][t - t0],
                           contacts={k: B[k][t - t0] for k in _CONTACT_FIELDS})
                for t in range(t0, t1)]

    def _record_bytes(self, B: dict[str, Any]) -> int:
        """Bytes of the record rows of buffers ``B`` (a checkpointed rollout's segment, recomputed backward)."""
        q = sum(B[k].capacity // B[k].shape[0] for k in ("q", "qd"))  # a segment's states: one row per step
        rows = B["u_plus"].shape[0]
        return int(rows * q + sum(B[k].capacity for k in _RECORD_BUFFERS if k not in ("q", "qd")))

    def _buffered_rollout(self, B: dict[str, Any], t0: int = 0, t1: int | None = None,
                          ) -> Iterator[tuple[int, newton.State]]:
        """Step a rollout on its buffers ``B`` (`_buffers`): steps t0..t1-1 (default: all), from the state in
        ``_state_a`` (t0 even) or ``_state_b`` (odd) with the solver's warm start as it is; each step takes its
        inputs from row t and puts its state, residual and record into row t (graph_kernels, t on the device;
        the record at row t mod K in a checkpointed rollout's K-row buffers), so the steps after the first
        replay two recordings (graphs.GraphCache; step 0 has no warm start and runs as launches). Yields (t,
        the state step t started from) after each step; contacts dropped are counted on the device meanwhile.
        The caller has written the per-step inputs into ``B`` (`_write_inputs`)."""
        sv = self.solver
        t1 = B["layout"][0] if t1 is None else t1
        B["holds"] = None  # the records about to be written are no tape's until forward says so
        B["step"].fill_(t0)
        s_in, s_out = (self._state_a, self._state_b) if t0 % 2 == 0 else (self._state_b, self._state_a)
        for k, src in zip(("q", "qd"), _bodies(s_in)):
            self._put_row(B, k, 0, src)
        key = self._step_key(B)
        replay = sv.options.extra_iters == 0  # extra iterations are decided at the host after the budget
        split = wp.get_device(self.model.device).is_cpu  # worker threads must not collide at once (COLLISION_LOCK)
        deferred = sv.defer_contact_check
        sv.defer_contact_check = True
        try:
            for t in range(t0, t1):
                a, b = s_in, s_out

                def body(a: newton.State = a, b: newton.State = b) -> None:
                    self._buffered_step(B, a, b)

                def collide(a: newton.State = a) -> None:
                    self._collide(a)

                def after_collide(a: newton.State = a, b: newton.State = b) -> None:
                    self._buffered_step(B, a, b, collided=True)

                if t == 0 or not replay:
                    body()
                elif split:
                    # the collision in a recording of its own, replayed under graphs.COLLISION_LOCK
                    self._graphs.run(("collide", t % 2, key), collide, lock=COLLISION_LOCK)
                    self._graphs.run(("step", t % 2, key), after_collide)
                else:
                    self._graphs.run(("step", t % 2, key), body)
                yield t, a
                s_in, s_out = s_out, s_in
        finally:
            sv.defer_contact_check = deferred

    def _step_key(self, B: dict[str, Any]) -> tuple[Any, ...]:
        """What a step's recording holds besides arrays: the options, the step size and gravity as they were."""
        sv = self.solver
        return (id(B), self.dt, sv.options.version, tuple(sv._gravity().tolist()))

    def _read_rollout(self, B: dict[str, Any], Q: np.ndarray, QD: np.ndarray, stacklevel: int) -> None:
        """The rollout's one read: states into Q, QD (rows 1..), residuals, dropped contacts (a warning
        ``stacklevel`` frames up, the caller's caller of this method being 2)."""
        Q[1:] = B["q"].numpy()[1:]
        QD[1:] = B["qd"].numpy()[1:]
        self.step_residuals = B["res"].numpy().copy()
        if self.solver.options.check_contacts:
            self.solver.report_dropped_contacts(stacklevel=stacklevel)

    def _write_inputs(self, B: dict[str, Any]) -> None:
        """The current rollout's per-step inputs (servo targets, step arrays) into ``B``'s input buffers."""
        rows = [x for x in (self._targets_qd, self._targets_q) if x is not None]
        rows += [self._step_arrays[k] for k in sorted(self._step_arrays)]
        for (_name, buf, _dst), data in zip(B["inputs"], rows, strict=True):
            buf.assign(data)

    def _buffers(self, steps: int, checkpoint_every: int | None = None) -> dict[str, Any]:
        """Device buffers of a rollout of ``steps`` steps with the current inputs' layout: the states
        (steps+1 rows), each step's residual (steps rows) and record (steps rows; checkpointed every K
        steps: K rows, a segment's, step t at row t mod K), the per-step inputs (steps rows), the step
        index and the record row. Kept while the layout stays (recordings point into them)."""
        sv, d, c = self.solver, self.model.device, self._control
        rec_rows = steps if checkpoint_every is None else min(checkpoint_every, steps)
        layout = (steps, self._targets_qd is not None, self._targets_q is not None, tuple(sorted(self._step_arrays)),
                  rec_rows)
        if self._bufs is not None and self._bufs["layout"] == layout:
            return self._bufs
        self._bufs = None
        self._graphs.clear()

        def rows(n: int, like: wp.array[Any]) -> wp.array[Any]:
            return wp.zeros((n, like.shape[0]), dtype=like.dtype, device=d)

        q, qd = _bodies(self._state_a)
        B: dict[str, Any] = {"layout": layout, "step": wp.zeros(1, dtype=int, device=d),
                             "rec": wp.zeros(1, dtype=int, device=d),
                             "q": rows(steps + 1, q), "qd": rows(steps + 1, qd), "res": rows(steps, sv.best_norm)}
        for k, src in self._record_sources().items():
            B[k] = rows(rec_rows, src)
        inputs: list[tuple[str, wp.array[Any], wp.array[Any]]] = []
        if self._targets_qd is not None:
            assert c.joint_target_qd is not None  # targets were checked against the model's dofs
            inputs.append(("targets_qd", rows(steps, c.joint_target_qd), c.joint_target_qd))
        if self._targets_q is not None:
            assert c.joint_target_q is not None
            inputs.append(("targets_q", rows(steps, c.joint_target_q), c.joint_target_q))
        for name in sorted(self._step_arrays):
            inputs.append((name, rows(steps, getattr(sv, name)), getattr(sv, name)))
        B["inputs"] = inputs
        self._bufs = B
        return B

    def _record_sources(self) -> dict[str, wp.array[Any]]:
        """The solver arrays a step record copies (besides the state it started from)."""
        sv = self.solver
        src = {"u_plus": sv.u_sol, "lam": sv.lam_best, "jt_q": sv.jt_q, "jt_qd": sv.jt_qd}
        src.update({k: getattr(sv, k) for k in _CONTACT_FIELDS})
        return src

    def _collide(self, s_in: newton.State) -> None:
        """The solver's own collision at ``s_in`` (the first part of a step recorded in two parts)."""
        self.solver.collide(s_in)

    def _buffered_step(self, B: dict[str, Any], s_in: newton.State, s_out: newton.State,
                       collided: bool = False) -> None:
        """One step on the buffers at the device's step index: inputs in, step, outputs out, index + 1.
        ``collided``: the solver's contacts at ``s_in`` are already computed (`_collide`)."""
        sv, step = self.solver, B["step"]
        for _name, buf, dst in B["inputs"]:
            self._take_row(step, buf, dst)
        sv.step(s_in, s_out, self._control, sv.own_contacts if collided else None, self.dt)
        q, qd = _bodies(s_out)
        self._put_row(B, "q", 1, q)
        self._put_row(B, "qd", 1, qd)
        self._put_row(B, "res", 0, sv.best_norm)
        rec = self._record_row(B, step)
        # the contact records and lam by put_contact_record (count slots / rows per world, _CONTACT_FIELDS in its
        # argument order), every other record source row by row
        for k, src in self._record_sources().items():
            if k not in _CONTACT_FIELDS and k != "lam":
                self._launch_rec(PUT_ROW[src.dtype], src.shape[0], [rec, 0, src], [B[k]])
        self._launch_rec(put_contact_record, sv.world_count,
                         [rec, sv.max_contacts, sv.max_rows, sv.joint_rows, *(getattr(sv, k) for k in _CONTACT_FIELDS),
                          sv.lam_best], [*(B[k] for k in _CONTACT_FIELDS), B["lam"]])
        self._launch_rec(advance, 1, [], [step])

    def _record_row(self, B: dict[str, Any], step: wp.array[Any]) -> wp.array[Any]:
        """The device index of step ``step``'s record in buffers ``B``: the step itself, or in a checkpointed
        rollout's segment-long buffers ``B["rec"]`` = step mod K (set by a launch)."""
        rows = B["u_plus"].shape[0]
        if rows == B["layout"][0]:
            return step
        rec: wp.array[Any] = B["rec"]
        self._launch_rec(wrap_index, 1, [step, rows], [rec])
        return rec

    def _put_row(self, B: dict[str, Any], name: str, offset: int, src: wp.array[Any]) -> None:
        """Row (step index + offset) of buffer ``name`` = src, on the device."""
        self._launch_rec(PUT_ROW[src.dtype], src.shape[0], [B["step"], offset, src], [B[name]])

    def _launch_rec(self, kernel: wp.Kernel, dim: int | tuple[int, int], inputs: Sequence[Any],
                    outputs: Sequence[Any]) -> None:
        """wp.launch through recorded launches cached by the arguments' identities (the eager steps
        repeat them exactly; warp's argument packing would dominate a small scene)."""
        key = (kernel.key, dim, *[id(a) if isinstance(a, wp.array) else (tuple(a) if hasattr(a, "__len__") else a)
                                  for a in (*inputs, *outputs)])
        cmd = self._cmds.get(key)
        if cmd is None:
            if len(self._cmds) > 512:
                self._cmds.clear()
            cmd = wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=self.model.device, record_cmd=True)
            self._cmds[key] = cmd
        cmd.launch()

    def _options_key(self) -> tuple[Any, ...]:
        o = self.solver.options
        return (self.dt, self.pullback, *(getattr(o, k) for k in _TAPE_OPTIONS))

    def _set_inputs(self, steps: int, targets_qd: np.ndarray | None, targets_q: np.ndarray | None,
                    step_arrays: Mapping[str, np.ndarray] | None) -> None:
        """Check and keep a rollout's per-step inputs (servo targets, per-step parameter arrays)."""
        m = self.model
        self._targets_qd = self._check_targets(targets_qd, steps, m.joint_dof_count, "targets_qd")
        self._targets_q = self._check_targets(targets_q, steps, m.joint_coord_count, "targets_q")
        self._step_arrays = {}
        for name, vals in (step_arrays or {}).items():
            if name not in PARAM_ARRAYS:
                raise EngineError(f"step_arrays: {name!r} is not a parameter array; one of {PARAM_ARRAYS}")
            self._step_arrays[name] = self._check_targets(vals, steps, getattr(self.solver, name).shape[0],
                                                          f"step_arrays[{name!r}]")

    @overload
    @staticmethod
    def _check_targets(x: np.ndarray, steps: int, n: int, what: str) -> np.ndarray: ...

    @overload
    @staticmethod
    def _check_targets(x: np.ndarray | None, steps: int, n: int, what: str) -> np.ndarray | None: ...

    @staticmethod
    def _check_targets(x: np.ndarray | None, steps: int, n: int, what: str) -> np.ndarray | None:
        if x is None:
            return None
        x = np.array(x, dtype=np.float32)  # a copy: the tape must not follow later edits of the caller's array
        if x.shape != (steps, n):
            raise EngineError(f"{what} must have shape (steps, {n}) = ({steps}, {n}), got {x.shape}")
        if not np.isfinite(x).all():
            raise EngineError(f"{what} holds non-finite values")
        return x

    def _set_step_arrays(self, t: int) -> None:
        for name, vals in self._step_arrays.items():
            getattr(self.solver, name).assign(vals[t])

    def _recompute_segment(self, tape: Tape, seg: int, B: dict[str, Any]) -> list[StepRecord]:
        """A checkpointed tape's segment stepped again on the device into its rollout buffers ``B`` (the
        tape's inputs already written there, its parameters in place) from the segment's checkpoint; its
        records as views of ``B``. The contacts it drops were reported by the forward: not again."""
        K = tape.checkpoint_every
        assert K is not None  # only a checkpointed tape has segments to recompute
        t0 = seg * K
        t1 = min(t0 + K, tape.steps)
        q0, qd0, warm = tape.checkpoints[seg]
        sv = self.solver
        _set_bodies(self._state_a if t0 % 2 == 0 else self._state_b, q0, qd0)
        sv.set_warm_state(warm)
        dropped = wp.clone(sv.ct_dropped)
        for _ in self._buffered_rollout(B, t0, t1):
            pass
        wp.copy(sv.ct_dropped, dropped)
        return self._record_views(B, t0, t1)

    # ---------------------------------------------------------------- backward
    def _workspace(self) -> dict[str, wp.array[Any]]:
        if self._ws is None:
            m, sv, d = self.model, self.solver, self.model.device
            nb, R = m.body_count, sv.world_count * sv.max_rows
            nj = max(m.joint_count, 1)

            def g(n: int, dtype: Any) -> wp.array[Any]:
                return wp.zeros(max(n, 1), dtype=dtype, device=d, requires_grad=True)

            self._ws = dict(
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
                # per world: 1 leaves it out of the residual's kernels (the Krylov adjoint's Arnoldi sweeps for worlds
                # already solved, `_krylov_launches`, which resets it with its solution's sweep); 0 everywhere else
                skip=wp.zeros(sv.world_count, dtype=int, device=d),
                no_skip=wp.zeros(sv.world_count, dtype=int, device=d),
            )
        return self._ws

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
        sv = self.solver
        saved = {k: wp.clone(getattr(sv, k), requires_grad=False) for k in _TAPE_ARRAYS}
        inputs = (self._targets_qd, self._targets_q, self._step_arrays)
        for k, a in tape.arrays.items():
            wp.copy(getattr(sv, k), a)
        self._targets_qd, self._targets_q, self._step_arrays = tape.targets_qd, tape.targets_q, tape.step_arrays
        try:
            return self._backward(tape, grad_body_q, grad_body_qd)
        finally:
            for k, a in saved.items():
                wp.copy(getattr(sv, k), a)
            self._targets_qd, self._targets_q, self._step_arrays = inputs

    def _backward(self, tape: Tape, grad_body_q: np.ndarray | None, grad_body_qd: np.ndarray | None) -> Gradients:
        m = self.model
        nb, T = m.body_count, tape.steps
        gQ = np.zeros((T + 1, nb, 7), np.float32) if grad_body_q is None else np.asarray(grad_body_q, np.float32)
        gQD = np.zeros((T + 1, nb, 6), np.float32) if grad_body_qd is None else np.asarray(grad_body_qd, np.float32)
        if gQ.shape != (T + 1, nb, 7) or gQD.shape != (T + 1, nb, 6):
            raise EngineError(f"gradients must have shapes ({T + 1}, {nb}, 7) and ({T + 1}, {nb}, 6)")
        if self.solver.options.adjoint_solver in ("lu", "krylov"):
            if self.solver.options.adjoint_solver == "krylov":
                g = self._backward_on_device(tape, gQ, gQD, "krylov")
                if g is not None:
                    return g
                self.adjoint_fallbacks += 1  # a world's step missed adjoint_tol: the exact LU instead
            g = self._backward_on_device(tape, gQ, gQD, "lu")
            assert g is not None
            return g
        gq = gQ[T].copy()
        gu = gQD[T].copy()
        self.adjoint_stats = []
        self._adj_res: list[np.ndarray] = []
        g_tqd = np.zeros((T, m.joint_dof_count), np.float32) if self._targets_qd is not None else None
        g_tq = np.zeros((T, m.joint_coord_count), np.float32) if self._targets_q is not None else None
        g_arrays = {name: np.zeros(getattr(self.solver, name).shape[0], np.float64) for name in PARAM_ARRAYS}
        g_steps = {name: np.zeros(vals.shape, np.float64) for name, vals in self._step_arrays.items()}
        qd_start = host_array(m.joint_qd_start)[: m.joint_count]
        q_start = host_array(m.joint_target_q_start)[: m.joint_count] if m.joint_count else np.zeros(0, int)
        # the host GMRES (adjoint_solver="gmres") over step records: the tape's, or a checkpointed tape's
        # segments recomputed on the device one at a time
        K = tape.checkpoint_every
        segments: list[tuple[int, list[StepRecord] | None]]  # None: recomputed from its checkpoint
        if K is None:
            B = self._buffers(T)
            self._hold(tape, B)
            segments = [(0, self._record_views(B, 0, T))]
        else:
            segments = [(s * K, None) for s in range(math.ceil(T / K))]
            B = self._buffers(T, K)
            self._write_inputs(B)
        for seg_index in reversed(range(len(segments))):
            t0, recs = segments[seg_index]
            if recs is None:
                recs = self._recompute_segment(tape, seg_index, B)
            for i in reversed(range(len(recs))):
                t = t0 + i
                self._set_step_arrays(t)  # the step's residual is linearised at its own parameters
                before = {name: g_arrays[name].copy() for name in self._step_arrays}
                gq, gu, gjqd, gjq = self._backward_step(recs[i], gq, gu, g_arrays)
                for name in self._step_arrays:
                    g_steps[name][t] = g_arrays[name] - before[name]
                if g_tqd is not None and m.joint_count:
                    np.add.at(g_tqd[t], qd_start, gjqd[: m.joint_count])
                if g_tq is not None and m.joint_count:
                    np.add.at(g_tq[t], q_start, gjq[: m.joint_count])
                gq = gq + gQ[t]
                gu = gu + gQD[t]
        res = np.asarray(self._adj_res[::-1]).reshape(T, self.solver.world_count)  # swept last step first
        self.adjoint_stats.reverse()
        return self._gradients(gq, gu, g_tqd, g_tq, g_arrays, g_steps, res, stacklevel=4)

    def _gradients(self, gq: np.ndarray, gu: np.ndarray, g_tqd: np.ndarray | None, g_tq: np.ndarray | None,
                   g_arrays: dict[str, np.ndarray], g_steps: dict[str, np.ndarray], res: np.ndarray,
                   stacklevel: int) -> Gradients:
        """A backward's `Gradients`: registered parameters summed from the (float64) parameter-array
        gradients, and a warning naming the worlds whose adjoint solve missed adjoint_tol."""
        params = {}
        for name, spec in self.params.items():
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

    def _backward_on_device(self, tape: Tape, gQ: np.ndarray, gQD: np.ndarray, kind: str) -> Gradients | None:
        """`backward` on the device: every step's adjoint (load, solve, sweep, carry, accumulate) runs at a
        device step index, recorded per system size and replayed (graphs.py), from the tape's records copied
        into the rollout buffers, or, for a checkpointed tape, from each segment recomputed there (last
        segment first); the host reads the contact counts once per segment (the system sizes) and the
        gradients once at the end. ``kind`` "lu": the assembled LU (float32 carries, float64 sums); "krylov":
        the device GMRES (`_krylov_launches`), None when a world's step missed adjoint_tol (the caller runs
        the LU)."""
        T, K = tape.steps, tape.checkpoint_every
        # the tape's records in the forward's buffers (the same layout): recordings keep pointing at
        # fixed arrays whichever tape is differentiated
        kept = self._buffers(T, K)
        if tape.buffers is not None:
            self._hold(tape, kept)
        self._write_inputs(kept)  # the tape's (backward put them in place): each step linearised at its own
        G = self._backward_buffers(T)
        G["gQ"].assign(gQ.reshape(T + 1, -1, 7))
        G["gQD"].assign(gQD.reshape(T + 1, -1, 6))
        wp.copy(G["gq"], G["gQ"][T])
        wp.copy(G["gu"], G["gQD"][T])
        for a in (G["res"], G["g_tqd"], G["g_tq"], *G["acc"].values(), *G["per_step"].values()):
            a.zero_()
        G["step"].fill_(T - 1)
        if kind == "krylov":
            self._krylov()  # allocated before any recording
        key = (id(G), self._recorded(self.dt)["serial"], kind, self._krylov_serial, *self._step_key(kept))
        sizes: list[int] = []
        seg_len = T if K is None else K
        try:
            for seg in reversed(range(math.ceil(T / seg_len))):
                t0, t1 = seg * seg_len, min(seg * seg_len + seg_len, T)
                if tape.buffers is None:
                    self._recompute_segment(tape, seg, kept)
                # the segment's one read (a kept tape's forward read its counts)
                system, seg_sizes = self._system_sizes(kept, 1, t1 - t0, tape.contact_counts)
                for t in reversed(range(t0, t1)):
                    self._backward_step_on_device(kept, G, system, seg_sizes[t - t0], key, kind)
                sizes[:0] = seg_sizes
        finally:
            self._contact_span(None)  # the host GMRES loop covers every slot
        # the one read after
        res = G["res"].numpy().copy()
        if kind == "krylov" and bool((res > self.solver.options.adjoint_tol).any()):
            return None
        self.adjoint_stats = [(n, float(r.max())) for n, r in zip(sizes, res)]
        g_tqd = G["g_tqd"].numpy().copy() if self._targets_qd is not None else None
        g_tq = G["g_tq"].numpy().copy() if self._targets_q is not None else None
        arrays = {k: a.numpy().copy() for k, a in G["acc"].items()}
        g_steps = {k: a.numpy().copy() for k, a in G["per_step"].items()}
        return self._gradients(G["gq"].numpy().copy(), G["gu"].numpy().copy(), g_tqd, g_tq, arrays, g_steps, res,
                               stacklevel=5)

    def _backward_buffers(self, T: int) -> dict[str, Any]:
        """Device buffers of a backward over T steps with the current inputs' layout (kept while it stays:
        recordings point into them)."""
        m, sv, d = self.model, self.solver, self.model.device
        layout = (T, tuple(sorted(self._step_arrays)))
        if self._gbufs is not None and self._gbufs["layout"] == layout:
            return self._gbufs
        self._gbufs = None
        self._graphs.clear()  # recordings point into the old buffers
        nb, W = m.body_count, sv.world_count

        def z(shape: int | tuple[int, int], dtype: Any) -> wp.array[Any]:
            return wp.zeros(shape, dtype=dtype, device=d)

        G: dict[str, Any] = {
            "layout": layout, "step": z(1, int),
            "gQ": z((T + 1, nb), wp.transform),
            "gQD": z((T + 1, nb), wp.spatial_vector),
            "gq": z(nb, wp.transform), "gq_direct": z(nb, wp.transform),
            "gu": z(nb, wp.spatial_vector),
            "res": z((T, W), wp.float64),
            "g_tqd": z((T, max(m.joint_dof_count, 1)), float),
            "g_tq": z((T, max(m.joint_coord_count, 1)), float),
            "qd_start": wp.array(host_array(m.joint_qd_start)[: m.joint_count].astype(np.int32), dtype=int, device=d),
            "q_start": wp.array((host_array(m.joint_target_q_start)[: m.joint_count] if m.joint_count
                                 else np.zeros(0)).astype(np.int32), dtype=int, device=d),
            "acc": {name: z(getattr(sv, name).shape[0], wp.float64) for name in PARAM_ARRAYS},
            "per_step": {name: z((T, getattr(sv, name).shape[0]), wp.float64)
                         for name in sorted(self._step_arrays)},
        }
        self._gbufs = G
        return G

    def _backward_step_on_device(self, kept: dict[str, wp.array[Any]], G: dict[str, Any], system: ls.StepSystem,
                                 n: int, key: tuple[Any, ...], kind: str) -> None:
        """One step of `_backward_on_device`: its launches replayed (recorded per system size n)."""

        def body() -> None:
            self._backward_step_launches(kept, G, system, n, kind)

        self._graphs.run(("backward", n, system.generation, key), body)

    def _krylov(self) -> ls.Krylov:
        """The Krylov adjoint's work arrays for the current options (new ones when its sizes changed)."""
        sv, o = self.solver, self.solver.options
        K = self._krylov_ws
        width = sv._lane_width()
        if K is None or (K.m, K.cycles, K.dm, K.width) != (o.adjoint_krylov_iters, o.adjoint_krylov_cycles,
                                                           o.direct_max_rows, width):
            K = ls.Krylov(self.model.device, sv.world_count, self._system().nu + sv.max_rows, o.adjoint_krylov_iters,
                          o.adjoint_krylov_cycles, sv.max_rows, o.direct_max_rows, width)
            self._krylov_ws = K
            self._krylov_serial += 1
            self._precond_cmds = None
        return K

    def _precond(self) -> tuple[Any, Any]:
        """The Krylov adjoint's preconditioner launches, recorded once per step size and options:
        (factor at the loaded step, apply to ws y_u / y_lam -> p_u / p_lam)."""
        sv, o, d, h = self.solver, self.solver.options, self.model.device, self.dt
        key = (h, o.version, self._krylov_serial)
        if self._precond_cmds is None or self._precond_cmds[0] != key:
            ws, K = self._workspace(), self._krylov()
            data = make(StepData, x_prev=ws["x_prev"], q_prev=ws["q_prev"], u_prev=sv.u_prev, inv_m=sv.inv_m,
                        I_w=sv.I_w, inv_I=sv.inv_I, f_imp=sv.f_imp, jt_q=ws["jt_q"], jt_qd=ws["jt_qd"],
                        j_qprev=ws["j_qprev"])
            _rhs, _dl, r, z, p, Az, Ap = sv.pcr
            scr = make(SchurScratch, r=r, z=z, p=p, Az=Az, Ap=Ap, tmp=sv.tmp, S=K.S, y64=K.y64,
                        perm=K.perm, env=K.env)
            sc = sv.step_constants(h)
            lanes = sv._lanes()
            ln = sv._lane_scratch(lanes, K.dm)
            tg = sv._thread_groups()
            precond_factor, precond_apply = adj.precond_kernels(K.width)  # the width of K's lanes' factors
            factor = wp.launch(precond_factor, sv._group_threads(lanes),
                               inputs=[sc, K.dm, sv.model_arrays, data, sv.contact_slots, ws["x_plus"], ws["q_plus"],
                                       ws["u_plus"], ws["lam"]],
                               outputs=[K.nrows, K.direct, sv.rows, scr, lanes, tg, ln, K.S_lanes],
                               device=d, record_cmd=True)
            apply = wp.launch(precond_apply, sv._group_threads(lanes),
                              inputs=[sc, o.adjoint_pcr_iters, K.dm, lanes, tg, data, K.nrows, K.direct, sv.rows,
                                      K.S_lanes, ws["y_u"], ws["y_lam"], K.done],
                              outputs=[ws["p_u"], ws["p_lam"], sv.ydyn, sv.pcr[0], scr, ln], device=d,
                              record_cmd=True)
            self._precond_cmds = (key, (factor, apply))
        cmds: tuple[Any, Any] = self._precond_cmds[1]
        return cmds

    def _krylov_launches(self, system: ls.StepSystem, n: int) -> None:
        """The adjoint solve A^T w = b of the loaded step by the device GMRES (SolverOptions.adjoint_solver=
        "krylov"): b in ``system.rhs0_v``, w into ``system.rhs_v`` (W, n); launches only."""
        sv, o, ws, K = self.solver, self.solver.options, self._workspace(), self._krylov()
        W, nbw, nu, R, m = sv.world_count, sv.bodies_per_world, system.nu, sv.max_rows, K.m
        factor, apply = self._precond()
        factor.launch()
        tol = 0.5 * o.krylov_tol  # GMRES's own estimate: it runs on float32 sweeps, the cycles check the truth
        m1 = m + 1

        def seed(X: wp.array[Any], stride: int, col: int, skip_done: bool = False) -> None:
            """A VJP sweep seeded with column ``col`` of X (W, n, stride): A^T x in the s-adjoints; with
            ``skip_done`` the row kernels leave out the worlds whose GMRES is done (their Arnoldi steps ignore
            the sweep), else every world."""
            self._launch_rec(lk.copy_int, W, [K.done if skip_done else ws["no_skip"]], [ws["skip"]])
            self._sweep(lambda: self._launch_rec(write_seed_from, W, [n, stride, col, nbw, nu, R, X, ws["skip"]],
                                                 [ws["r_dyn"].grad, ws["r_con"].grad]))

        def cycle(c: int) -> None:
            if c == 0:
                b = system.rhs0_v
            else:  # restart from the true residual r = b - A^T w (the last check's, in float64)
                b = K.r
            self._launch_rec(lk.krylov_init, W, [n, m, int(c > 0), b, K.ok], [K.V, K.g, K.done, K.k, K.bnorm])

            def iteration(j: int) -> None:
                # the preconditioner's input (y_u, y_lam) = v_j: the same unpacking as a sweep's seed
                self._launch_rec(write_seed_from, W, [n, m1, j, nbw, nu, R, K.V, K.done], [ws["y_u"], ws["y_lam"]])
                apply.launch()
                self._launch_rec(lk.gather, (W, n), [n, n * m, m, j, nbw, nu, R, ws["p_u"], ws["p_lam"]], [K.Z])
                seed(K.Z, m, j, skip_done=True)
                self._launch_rec(lk.krylov_arnoldi, W, [j, n, m, nbw, nu, R, tol, ws["u_plus"].grad, ws["lam"].grad],
                                 [K.V, K.H, K.cs, K.sn, K.g, K.done, K.k, K.bnorm])

            iteration(0)
            for j in range(1, m):
                # once every world's estimate is below tol the cycle's remaining iterations would only sweep
                # for worlds that ignore them (a done world's Arnoldi step returns at once; its solution reads
                # its own k columns): skipped, decided on the device like the next cycle (the pallet
                # traversal's steps reach tol in 3-4 iterations of 6 on most steps)
                self._launch_rec(lk.zero_flag, 1, [], [K.flag])
                self._launch_rec(lk.flag_active, W, [K.done], [K.flag])
                wp.capture_if(K.flag, on_true=lambda j=j: iteration(j))
            self._launch_rec(lk.krylov_solution, W, [n, m, int(c > 0), K.H, K.g, K.k, K.Z], [system.rhs_v])
            # the sweep of the solution: its true residual, and the gradient's sweep when no cycle follows
            seed(system.rhs_v, 1, 0)
            if c + 1 < K.cycles:
                self._launch_rec(lk.zero_flag, 1, [], [K.flag])
                self._launch_rec(lk.krylov_check, W, [n, nbw, nu, R, o.krylov_tol, system.rhs0_v,
                                                      ws["u_plus"].grad, ws["lam"].grad], [K.r, K.ok, K.flag])
                # on the device: the next cycle runs only if a world needs it (a conditional node in a CUDA
                # graph, a recorded branch on the CPU; eager, one read of the flag)
                def next_cycle(c: int = c + 1) -> None:
                    cycle(c)

                wp.capture_if(K.flag, on_true=next_cycle)

        cycle(0)

    def _backward_step_launches(self, kept: dict[str, wp.array[Any]], G: dict[str, Any], system: ls.StepSystem,
                                n: int, kind: str) -> None:
        """One step of `_backward_on_device` at the device step index (then index - 1): launches only."""
        m, sv, ws = self.model, self.solver, self._workspace()
        step, W, nu = G["step"], sv.world_count, 6 * sv.bodies_per_world
        self._contact_span(n)
        self._load_record(kept, step)
        bwd = self._recorded(self.dt)["bwd"]
        # pass 1: the kinematic substitution transposed, h G^T dL/dq+ (and the direct q- path)
        self._zero_grads()
        wp.copy(ws["body_q_plus"].grad, G["gq"])
        bwd[0].launch()
        wp.copy(G["gq_direct"], ws["body_q"].grad)
        # adjoint (eq. 16): (dr/ds)^T w = -dL/ds, dL/du+ including h G^T dL/dq+ (eq. 18), taken before the
        # solve's sweeps overwrite the adjoints; solved per world by the assembled LU (linsolve) or the Krylov
        system.select(n)  # the views at this step's size (reserved by _system_sizes)
        self._launch_rec(lk.adjoint_rhs, (W, n), [n, nu, sv.bodies_per_world, G["gu"], ws["u_plus"].grad],
                         [system.rhs_v])
        if kind == "krylov":
            wp.copy(system.rhs0_v, system.rhs_v)
            self._krylov_launches(system, n)  # ends with the sweep of its solution w
            fixed = self._krylov().no_fixed
        else:
            system.assemble(n, 1, self._sweep, ws["u_plus"].grad, ws["lam"].grad, ws["r_dyn"].grad,
                            ws["r_con"].grad)
            system.solve(transpose=True)
            fixed = system.fixed
            self._sweep(lambda: self._launch_rec(write_seed_from, W, [n, 1, 0, sv.bodies_per_world, nu,
                                                                      sv.max_rows, system.rhs_v, ws["no_skip"]],
                                                 [ws["r_dyn"].grad, ws["r_con"].grad]))
        self._launch_rec(lk.adjoint_check, W, [step, n, nu, sv.bodies_per_world, sv.max_rows, ws["u_plus"].grad,
                                               ws["lam"].grad, fixed, system.rhs0_v], [G["res"]])
        # dL/dxi = w^T dr/dxi (eq. 17), from that sweep
        self._launch_rec(lk.adjoint_carry, m.body_count, [step, G["gq_direct"], ws["body_q"].grad,
                                                          ws["body_qd"].grad, G["gQ"], G["gQD"]], [G["gq"], G["gu"]])
        if m.joint_count:
            if self._targets_qd is not None:
                self._launch_rec(lk.scatter_joint_grad, m.joint_count, [step, G["qd_start"], ws["jt_qd"].grad],
                                 [G["g_tqd"]])
            if self._targets_q is not None:
                self._launch_rec(lk.scatter_joint_grad, m.joint_count, [step, G["q_start"], ws["jt_q"].grad],
                                 [G["g_tq"]])
        for name in PARAM_ARRAYS:
            g = getattr(sv, name).grad
            if g is None:
                continue
            if name in G["per_step"]:
                self._launch_rec(lk.accumulate64_step, g.shape[0], [step, g], [G["acc"][name], G["per_step"][name]])
            else:
                self._launch_rec(lk.accumulate64, g.shape[0], [g], [G["acc"][name]])
        self._zero_grads()
        self._launch_rec(retreat, 1, [], [step])

    def _load_record(self, B: dict[str, Any], step: wp.array[Any]) -> None:
        """`_load_step` of the record in row (device step index) of rollout buffers ``B`` (`_RECORD_BUFFERS`),
        with that row's per-step inputs put back (the step is linearised at its own parameters)."""
        sv, ws = self.solver, self._workspace()
        for _name, buf, dst in B["inputs"]:
            self._take_row(step, buf, dst)
        self._take_row(step, B["q"], ws["body_q"])
        self._take_row(step, B["qd"], ws["body_qd"])
        rec = self._record_row(B, step)
        for k, dst in (("u_plus", ws["u_plus"]), ("lam", ws["lam"]), ("jt_q", ws["jt_q"]), ("jt_qd", ws["jt_qd"])):
            self._take_row(rec, B[k], dst)
        for k in _CONTACT_FIELDS:
            self._take_row(rec, B[k], getattr(sv, k))
        self._evaluate_loaded()

    def _take_row(self, step: wp.array[Any], src: wp.array[Any], dst: wp.array[Any]) -> None:
        """dst = row (device step index) of src."""
        self._launch_rec(TAKE_ROW[dst.dtype], dst.shape[0], [step, src], [dst])

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
        m, sv, o = self.model, self.solver, self.solver.options
        if o.adjoint != "exact" or o.adjoint_solver == "gmres":
            raise EngineError("jvp needs SolverOptions(adjoint_solver='lu' or 'krylov') (its solve is the LU either "
                              "way; the host 'gmres' is backward only)")
        p = tangents.count()
        nb = m.body_count
        self._set_inputs(steps, targets_qd, targets_q, step_arrays)
        entries = self._tangent_entries(tangents, p, steps)
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
        # the steps on the forward's buffers (its recordings), the tangent on the jvp's (_jvp_buffers)
        B = self._buffers(steps)
        J = self._jvp_buffers(steps, p, entries)
        J["dq"].assign(dQ[:, 0].ravel())
        J["dqd"].assign(dQD[:, 0].ravel())
        for k in ("dq", "dqd"):
            J[k + "_rows"].zero_()
        J["step"].zero_()
        _set_bodies(self._state_a, Q[0], QD[0])
        sv.reset_warm_start()
        # pass 1: the rollout, recorded on the forward's buffers (as forward does)
        self._write_inputs(B)
        for _ in self._buffered_rollout(B):
            pass
        # pass 2: each step's tangent from its record, in step order; every size read at once
        system, sizes = self._system_sizes(B, p)
        jkey = (id(J), self._recorded(self.dt)["serial"], *self._step_key(B))
        try:
            for t in range(steps):
                n = sizes[t]

                def tangent(n: int = n) -> None:
                    self._jvp_step_launches(J, B, system, n, p)

                self._graphs.run(("jvp", n, system.generation, jkey), tangent)
                if progress is not None:
                    progress(t)
        finally:
            self._contact_span(None)
        self._read_rollout(B, Q, QD, stacklevel=3)  # the warning names jvp's caller
        dQ[:, 1:] = J["dq_rows"].numpy()[1:].reshape(steps, p, nb, 7).transpose(1, 0, 2, 3)
        dQD[:, 1:] = J["dqd_rows"].numpy()[1:].reshape(steps, p, nb, 6).transpose(1, 0, 2, 3)
        solve_res = J["solve_res"].numpy().copy()
        pivots = J["pivots"].numpy().copy()
        converged: np.ndarray = np.asarray(~(solve_res > o.adjoint_tol).any(axis=0))
        if not converged.all():
            bad = np.flatnonzero(~converged)
            warnings.warn(f"Simulation.jvp: the tangent solve of worlds {bad[:8].tolist()} exceeded adjoint_tol="
                          f"{o.adjoint_tol:g} (worst {float(solve_res[:, bad].max()):.1e}, smallest pivot ratio "
                          f"{float(pivots[:, bad].min()):.1e}); their tangents are inexact", RuntimeWarning,
                          stacklevel=2)
        return TangentResult(q=Q, qd=QD, dq=dQ, dqd=dQD, step_residuals=self.step_residuals.copy(),
                             solve_residual=solve_res, pivot_ratio=pivots, converged=converged)

    def _jvp_buffers(self, steps: int, p: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Device buffers of a jvp of ``steps`` steps and p directions: the tangent state (dq, dqd, du and
        the next dq), its rows per step, the solves' health per step, the step index, and the input
        directions' seeds (``entries``, whose arrays are adopted or, when their layout is the previous
        call's, refilled: recordings point into them)."""
        d, W = self.model.device, self.solver.world_count
        layout = (steps, p, tuple((e["grad"].ptr, e["count"], e["entry"].numpy().tobytes(),
                                   e["world"].numpy().tobytes(), e["steps"] is not None) for e in entries))
        J = self._jbufs
        if J is None or J["layout"] != layout:
            self._graphs.clear()  # recordings point into the old buffers
            nb = self.model.body_count
            J = {"layout": layout, "step": wp.zeros(1, dtype=int, device=d),
                 "dq": wp.zeros(p * nb * 7, dtype=float, device=d), "dq_next": wp.zeros(p * nb * 7, dtype=float,
                                                                                         device=d),
                 "dqd": wp.zeros(p * nb * 6, dtype=float, device=d), "du": wp.zeros(p * nb * 6, dtype=float, device=d),
                 "dq_rows": wp.zeros((steps + 1, p * nb * 7), dtype=float, device=d),
                 "dqd_rows": wp.zeros((steps + 1, p * nb * 6), dtype=float, device=d),
                 "solve_res": wp.zeros((steps, W), dtype=wp.float64, device=d),
                 "pivots": wp.zeros((steps, W), dtype=wp.float64, device=d),
                 "entries": entries}
            for e in entries:
                e["seed_rows"] = (None if e["steps"] is None else
                                  wp.array(e["steps"], dtype=float, device=d))
            self._jbufs = J
        else:
            for kept, new in zip(J["entries"], entries):
                kept["seed"].assign(new["seed"])
                if new["steps"] is not None:
                    kept["seed_rows"].assign(new["steps"])
        return J

    def _jvp_step_launches(self, J: dict[str, Any], B: dict[str, Any], system: ls.StepSystem, n: int, p: int
                           ) -> None:
        """The tangent of step (the jvp's device step index) from its record in the rollout buffers ``B``
        (then index + 1): linearise, assemble and factor A with the directions' right-hand sides, solve,
        carry dq, dqd."""
        m, sv, ws = self.model, self.solver, self._workspace()
        nb, W, nbw, step = m.body_count, sv.world_count, sv.bodies_per_world, J["step"]
        self._contact_span(n)
        self._load_record(B, step)
        for e in J["entries"]:
            if e["seed_rows"] is not None:
                self._take_row(step, e["seed_rows"], e["seed"])
        dq, dqd, du = J["dq"], J["dqd"], J["du"]

        def rhs_row(i: int) -> None:
            self._launch_rec(rhs_state_row, (W, p), [i, system.n, p, nbw, nb, ws["body_q"].grad, ws["body_qd"].grad,
                                                     dq, dqd], [system.rhs_v])
            for e in J["entries"]:
                self._launch_rec(rhs_entries_row, (e["count"], p),
                                 [i, system.n, p, e["count"], e["grad"], e["entry"], e["world"], e["seed"]],
                                 [system.rhs_v])

        system.assemble(n, p, self._sweep, ws["u_plus"].grad, ws["lam"].grad, ws["r_dyn"].grad, ws["r_con"].grad,
                        rhs_row)
        system.solve(transpose=False)  # A y = (dr/dxi) dxi; ds = -y
        system.residual_launch()
        self._launch_rec(PUT_ROW[wp.float64], W, [step, 0, system.res], [J["solve_res"]])
        self._launch_rec(PUT_ROW[wp.float64], W, [step, 0, system.pivot_ratio], [J["pivots"]])
        self._launch_rec(scatter_du, (nb, p), [system.n, p, nbw, nb, -1.0, system.rhs_v], [du])
        # dq+ through the kinematic map (eq. 1), one reverse sweep of it per pose component
        bwd0 = self._recorded(self.dt)["bwd"][0]
        for comp in range(7):
            self._zero_grads()
            self._launch_rec(seed_pose_component, nb, [comp, nb], [ws["body_q_plus"].grad])
            bwd0.launch()
            self._launch_rec(pose_tangent_component, (nb, p), [comp, nb, ws["body_q"].grad, ws["u_plus"].grad, dq, du],
                             [J["dq_next"]])
        wp.copy(dq, J["dq_next"])
        wp.copy(dqd, du)
        self._zero_grads()
        self._launch_rec(PUT_ROW[wp.float32], dq.shape[0], [step, 1, dq], [J["dq_rows"]])
        self._launch_rec(PUT_ROW[wp.float32], dqd.shape[0], [step, 1, dqd], [J["dqd_rows"]])
        self._launch_rec(advance, 1, [], [step])

    def _entry_worlds(self, name: str, idx: np.ndarray) -> np.ndarray:
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

    def _tangent_entries(self, tan: Tangents, p: int, steps: int) -> list[dict[str, Any]]:
        """Device seeds of the input-array directions: per array the entries any direction
        touches, their worlds, and the (p, entries) seed (per step where it varies)."""
        m, sv, d = self.model, self.solver, self.model.device
        W = sv.world_count
        const: dict[str, np.ndarray] = {}
        per_step: dict[str, np.ndarray] = {}

        def n_of(name: str) -> int:
            return max(m.joint_count, 1) if name in ("jt_q", "jt_qd") else getattr(sv, name).shape[0]

        def add(name: str, v: np.ndarray) -> None:
            const.setdefault(name, np.zeros((p, n_of(name)), np.float32))
            const[name] += v

        for name, v in tan.params.items():
            spec = self._spec(name)
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
            if name not in self._step_arrays:
                raise EngineError(f"Tangents.step_arrays: {name!r} is not among the rollout's step_arrays")
            per_step[name] = np.asarray(v, np.float32).reshape(p, steps, n_of(name)).transpose(1, 0, 2).copy()
        if m.joint_count:
            for name, tv, start, given, dim in (
                ("jt_qd", tan.targets_qd, m.joint_qd_start, self._targets_qd, m.joint_dof_count),
                ("jt_q", tan.targets_q, m.joint_target_q_start, self._targets_q, m.joint_coord_count),
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
            worlds = self._entry_worlds(name, idx)
            if (worlds < 0).any():
                raise EngineError(f"tangent direction on {name} entries {idx[worlds < 0].tolist()}: shared by all "
                                  f"{W} worlds (a static shape); give per-world entries a direction instead")
            grad = self._workspace()[name].grad if name in ("jt_q", "jt_qd") else getattr(sv, name).grad
            steps_seed = None if s is None else (c[None, :, idx] + s[:, :, idx]).reshape(steps, -1)
            out.append(dict(count=int(idx.size), grad=grad, entry=wp.array(idx.astype(np.int32), dtype=int, device=d),
                            world=wp.array(worlds, dtype=int, device=d),
                            seed=wp.array(c[:, idx].ravel(), dtype=float, device=d), steps=steps_seed))
        return out

    def _residual_launches(self, h: float, cmax: int) -> list[tuple[wp.Kernel, int, list[Any], list[Any]]]:
        """(kernel, dim, inputs, outputs) of one residual evaluation r(u+, lam+; q-, u-, targets,
        theta) (eq. 9-11) on the fixed workspace arrays, in execution order; the contact kernels over the
        first ``cmax`` slots of every world (at least the fullest world's contact count)."""
        m, sv, o = self.model, self.solver, self.solver.options
        d = m.device
        ws = self._workspace()
        if self.pullback == "truncated":
            xg, qg, xpg, qpg = ws["x_geom"], ws["q_geom"], ws["xp_geom"], ws["qp_geom"]
        else:
            xg, qg, xpg, qpg = ws["x_plus"], ws["q_plus"], ws["x_prev"], ws["q_prev"]
        L: list[tuple[Any, int, list[Any], list[Any]]] = [
            (adj.residual_kinematics, m.body_count, [h, m.body_com, ws["body_q"], ws["u_plus"], sv.bodies_per_world,
                                                      ws["skip"]],
             [ws["x_prev"], ws["q_prev"], ws["x_plus"], ws["q_plus"], ws["body_q_plus"]])]
        if m.joint_count:
            L.append((adj.residual_joint_angles, m.joint_count,
                      [m.body_com, m.joint_parent, m.joint_child, m.joint_X_p, m.joint_X_c, sv.joint_axis_j,
                       ws["x_prev"], ws["q_prev"], sv.joints_per_world, ws["skip"]], [ws["j_qprev"]]))
        # groups packed now: the registered parameters' gradients exist only since Simulation was set up
        sc, model = sv.step_constants(h), repacked(sv.model_arrays)
        # the residual's own q-, targets and joint angles (differentiated); M~ at q- the solver's (not)
        data = make(StepData, x_prev=xpg, q_prev=qpg, u_prev=sv.u_prev, inv_m=sv.inv_m, I_w=sv.I_w, inv_I=sv.inv_I,
                    f_imp=sv.f_imp, jt_q=ws["jt_q"], jt_qd=ws["jt_qd"], j_qprev=ws["j_qprev"])
        if sv.joint_rows:
            L.append((adj.residual_joint_frames, m.joint_count,
                      [m.body_com, m.joint_parent, m.joint_child, m.joint_X_p, m.joint_X_c, ws["x_plus"], ws["q_plus"],
                       sv.joints_per_world, ws["skip"]], [ws["frame_p"], ws["frame_c"]]))
            jc, jdim = adj.row_chunks(d, sv.world_count, sv.joint_rows)
            L.append((adj.residual_joint_rows, jdim,
                      [jc, sc, model, data, ws["x_plus"], ws["frame_p"], ws["frame_c"], ws["u_plus"], ws["lam"],
                       ws["skip"]],
                      [ws["r_con"], ws["jt_lam"]]))
        if m.shape_count:
            ct = repacked(sv.contact_slots)
            if self.pullback == "truncated":
                # geometry frozen at the converged poses, the gap moving to first order (adj.residual_frozen_gap)
                L.append((adj.residual_frozen_gap, sv.world_count * cmax,
                          [cmax, sv.max_contacts, model, ct, xg, qg, xpg, qpg, ws["x_plus"], ws["q_plus"]],
                          [ws["thick_eff"]]))
                ct = repacked(ct, thick=ws["thick_eff"])
            cc, cdim = adj.row_chunks(d, sv.world_count, cmax)
            L.append((adj.residual_contact_rows, cdim,
                      [cmax, cc, sc, model, data, ct, xg, qg, ws["u_plus"], ws["lam"], ws["skip"]],
                      [ws["r_con"], ws["jt_lam"]]))
        L.append((adj.residual_dynamics, m.body_count,
                  [h, wp.vec3(*sv._gravity()), int(o.gyroscopic), sv.body_mass, sv.body_inertia_unit,
                   ws["q_prev"], ws["body_qd"], ws["u_plus"], ws["jt_lam"], sv.bodies_per_world, ws["skip"]],
                  [ws["r_dyn"]]))
        return L

    def _contact_span(self, n: int | None) -> None:
        """The contact slots the residual's launches cover from now on: those of a step system of size n
        (its fullest world's contacts), or every slot (None)."""
        sv = self.solver
        c = sv.max_contacts if n is None else (n - self._system().nu - sv.joint_rows) // 3
        self._cmax = max(1, min(int(c), sv.max_contacts))

    def _recorded(self, h: float) -> dict[str, Any]:
        """Forward and adjoint launches of the residual, recorded once per step size and contact span
        (`_contact_span`): warp's argument packing, not arithmetic, dominates a tape replay of small scenes."""
        o = self.solver.options
        key = (h, o.version)  # the launches hold the options' values (step constants)
        if self._rec_cmds is None or self._rec_cmds["key"] != key:
            self._rec_serial += 1
            self._rec_cmds = {"key": key, "spans": {}}
        spans = self._rec_cmds["spans"]
        if self._cmax not in spans:
            spans[self._cmax] = {**self._record_residual(h, self._cmax), "serial": self._rec_serial}
        rec: dict[str, Any] = spans[self._cmax]
        return rec

    def _record_residual(self, h: float, cmax: int) -> dict[str, Any]:
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

        fwd, bwd, grads = [], [], []
        for kernel, dim, inputs, outputs in self._residual_launches(h, cmax):
            fwd.append(wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=d, record_cmd=True))
            bwd.append(wp.launch(kernel, dim, inputs=inputs, outputs=outputs,
                                 adj_inputs=[adjoint_of(a) for a in inputs],
                                 adj_outputs=[adjoint_of(a) for a in outputs],
                                 adjoint=True, device=d, record_cmd=True))
            grads += [a.grad for a in [x for b in (*inputs, *outputs) for x in arrays_of(b)]
                      if wp.types.is_array(a) and a.requires_grad]
        uniq = list({id(g): g for g in grads}.values())
        return {"fwd": fwd, "bwd": bwd, "grads": uniq}

    # ---------------------------------------------------------------- one converged step, linearised
    def _load_step(self, body_q: wp.array[Any], body_qd: wp.array[Any], u_plus: wp.array[Any], lam: wp.array[Any],
                   jt_q: wp.array[Any], jt_qd: wp.array[Any], contacts: dict[str, wp.array[Any]]) -> None:
        """Put a converged step (its q-, u-, returned u+ and multipliers, servo targets and its contact
        set, into the solver's slots) in the workspace and evaluate the recorded residual there once
        (eq. 9-11), M~ at q- recomputed."""
        sv = self.solver
        ws = self._workspace()
        wp.copy(ws["body_q"], body_q)
        wp.copy(ws["body_qd"], body_qd)
        wp.copy(ws["u_plus"], u_plus)
        wp.copy(ws["lam"], lam)
        wp.copy(ws["jt_q"], jt_q)
        wp.copy(ws["jt_qd"], jt_qd)
        # the residual kernels and the Schur solve read the contact set from the solver's slots
        for k in _CONTACT_FIELDS:
            wp.copy(getattr(sv, k), contacts[k])
        self._evaluate_loaded()

    def _evaluate_loaded(self) -> None:
        """The loaded step's M~ at q- and one evaluation of the recorded residual."""
        m, sv, o, ws, h = self.model, self.solver, self.solver.options, self._workspace(), self.dt
        # M~ at q- and friends (not differentiated: only the operator uses them)
        self._launch_rec(prepare_bodies, m.body_count,
                         [sv.model_arrays, sv.body_inertia_unit, wp.vec3(*sv._gravity()), h, int(o.gyroscopic),
                          ws["body_q"], ws["body_qd"]], [sv.step_data, sv.u])
        fwd = self._recorded(h)["fwd"]
        ws["jt_lam"].zero_()
        fwd[0].launch()  # kinematics first: the truncated pullback copies its geometry
        if self.pullback == "truncated":
            wp.copy(ws["x_geom"], ws["x_plus"])
            wp.copy(ws["q_geom"], ws["q_plus"])
            wp.copy(ws["xp_geom"], ws["x_prev"])
            wp.copy(ws["qp_geom"], ws["q_prev"])
        for c in fwd[1:]:
            c.launch()

    def _zero_grads(self) -> None:
        for g in self._recorded(self.dt)["grads"]:
            g.zero_()

    def _sweep(self, seed: Callable[[], None]) -> None:
        """One VJP sweep of the residual: adjoints zeroed, ``seed()`` writes dL/dr, reverse launches."""
        self._zero_grads()
        seed()
        for c in reversed(self._recorded(self.dt)["bwd"]):
            c.launch()

    def _system(self) -> ls.StepSystem:
        if getattr(self, "_step_system", None) is None:
            sv = self.solver
            self._step_system = ls.StepSystem(self.model.device, sv.world_count, sv.bodies_per_world, sv.max_rows)
        return self._step_system

    def _system_size(self, contacts: int) -> int:
        """The step system's size when the fullest world has ``contacts`` contacts (its rows, 3 each)."""
        return self._system().size_for(self.solver.joint_rows + 3 * contacts)

    def _system_sizes(self, B: dict[str, Any], p: int, rows: int | None = None,
                      most: np.ndarray | None = None) -> tuple[ls.StepSystem, list[int]]:
        """The step system and its size at every step of rollout buffers ``B`` (the first ``rows`` records,
        default all; one read of the contact counts, or ``most``: each step's most contacts, read before),
        every size's arrays allocated for p right-hand sides (not inside a recording)."""
        system = self._system()
        if most is None:
            most = B["ct_count"].numpy()[:rows].max(axis=1, initial=0)
        sizes = [self._system_size(int(c)) for c in most]
        for n in set(sizes):
            system.reserve(n, p)
        return system, sizes

    def _backward_step(self, rec: StepRecord, gq: np.ndarray, gu: np.ndarray,
                       g_arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        m, sv, o = self.model, self.solver, self.solver.options
        ws = self._workspace()
        h = self.dt
        self._load_step(rec.body_q, rec.body_qd, rec.u_plus, rec.lam, rec.jt_q, rec.jt_qd, rec.contacts)
        cmds = self._recorded(h)
        bwd = cmds["bwd"]
        zero_grads = self._zero_grads
        # pass 1: the kinematic substitution transposed, h G^T dL/dq+ (and the direct q- path)
        zero_grads()
        ws["body_q_plus"].grad.assign(gq)
        bwd[0].launch()
        gq_direct = ws["body_q"].grad.numpy().copy()
        g_u_total = gu + ws["u_plus"].grad.numpy()
        nb6 = m.body_count * 6
        W = sv.world_count

        def vjp(x: np.ndarray) -> None:
            zero_grads()
            ws["r_dyn"].grad.assign(x[:nb6].reshape(-1, 6).astype(np.float32))
            ws["r_con"].grad.assign(x[nb6:].astype(np.float32))
            for c in reversed(bwd):
                c.launch()

        def apply_At(x: np.ndarray) -> np.ndarray:
            """(dr/ds)^T x, exact: the VJP of the recorded residual with respect to (u+, lam+)."""
            vjp(x)
            return np.concatenate([ws["u_plus"].grad.numpy().ravel(), ws["lam"].grad.numpy()]).astype(np.float64)

        def apply_P(y: np.ndarray) -> np.ndarray:
            """Schur solve with the forward (lagged-W) operator, eq. 18-19 generalised: the
            paper's single adjoint solve, here only the GMRES preconditioner (exact under sticking
            contact, biased under sliding; SolverOptions.adjoint says why it is not a mode)."""
            skey = (h, o.version)
            if self._schur_cmd is None or self._schur_cmd[0] != skey:
                self._schur_cmd = (skey, self._record_schur(h))
            schur_cmd = self._schur_cmd[1]
            ws["y_u"].assign(y[:nb6].reshape(-1, 6).astype(np.float32))
            ws["y_lam"].assign(y[nb6:].astype(np.float32))
            schur_cmd.launch()
            return np.concatenate([ws["p_u"].numpy().ravel(), ws["p_lam"].numpy()]).astype(np.float64)

        # adjoint (eq. 16): (dr/ds)^T w = -dL/ds, with dL/du+ including h G^T dL/dq+ (eq. 18)
        b = np.concatenate([-g_u_total.ravel(), np.zeros(sv.world_count * sv.max_rows)]).astype(np.float64)
        wvec, its, rel = gmres(apply_At, apply_P, b, o.adjoint_tol, o.adjoint_max_iters)
        self.adjoint_stats.append((its, rel))
        self._adj_res.append(np.full(W, rel))
        vjp(wvec)
        # dL/dxi = w^T dr/dxi (eq. 17), from the last VJP sweep
        gq_prev = gq_direct + ws["body_q"].grad.numpy()
        gu_prev = ws["body_qd"].grad.numpy().copy()
        gjqd = ws["jt_qd"].grad.numpy().copy()
        gjq = ws["jt_q"].grad.numpy().copy()
        for name in PARAM_ARRAYS:
            arr = getattr(sv, name)
            if arr.grad is not None:
                g_arrays[name] += arr.grad.numpy()
        zero_grads()
        return gq_prev, gu_prev, gjqd, gjq

    def _record_schur(self, h: float) -> Any:
        sv, o, d = self.solver, self.solver.options, self.model.device
        ws = self._workspace()
        # the converged step's q-, targets and joint angles are the workspace's; M~ at q- the solver's
        data = make(StepData, x_prev=ws["x_prev"], q_prev=ws["q_prev"], u_prev=sv.u_prev, inv_m=sv.inv_m, I_w=sv.I_w,
                    inv_I=sv.inv_I, f_imp=sv.f_imp, jt_q=ws["jt_q"], jt_qd=ws["jt_qd"], j_qprev=ws["j_qprev"])
        return wp.launch(
            adj.adjoint_system, sv.world_count,
            inputs=[sv.step_constants(h), o.adjoint_pcr_iters, sv.model_arrays, data, sv.contact_slots, ws["x_plus"],
                    ws["q_plus"], ws["u_plus"], ws["lam"], ws["y_u"], ws["y_lam"]],
            outputs=[ws["p_u"], ws["p_lam"], sv.ydyn, sv.pcr[0], sv.rows, sv.schur_scratch],
            device=d, record_cmd=True,
        )

    def memory_bytes(self, tape: Tape | None = None) -> int:
        """Bytes a tape (default: the last forward's) holds for the backward pass: stored step
        records (peak over segments when checkpointed), checkpoints and the parameter snapshot
        (`Tape.nbytes`; the tests check it against the arrays actually alive). Independent of the
        Newton/PCR iteration counts."""
        tape = self.last_tape if tape is None else tape
        return 0 if tape is None else tape.nbytes()


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
