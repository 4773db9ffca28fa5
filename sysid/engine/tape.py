"""A rollout on the device and its tape.

`Rollout` steps a rollout on rollout-long device buffers (`RolloutBuffers`): each step takes its inputs from row
t and puts its state, residual and record into row t at a device step index, so every step after the first
replays recordings (graphs.py) and the host reads the buffers once at the end. A `Tape` keeps what the backward
of one forward rollout needs: its inputs, the solver's parameter arrays as they were, and its step records cut to
the rollout's most contacts, or, with ``checkpoint_every=K``, every K-th state and the warm start it began with
(each segment recomputed backward into K-row record buffers, bit-identical: the forward is deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import newton
import numpy as np
import warp as wp

from .errors import EngineError
from .graph_kernels import advance, put_contact_record, wrap_index
from .graphs import COLLISION_LOCK
from .record import CONTACT_FIELDS, PARAM_ARRAYS, StepRecord
from .types import ContactRecord, make

if TYPE_CHECKING:
    from .backward import Gradients
    from .simulation import Simulation

# the rollout-long buffers a tape keeps copies of (the states and every step's record)
RECORD_BUFFERS = ("q", "qd", "u_plus", "lam", "jt_q", "jt_qd", *CONTACT_FIELDS)


def bodies(state: newton.State) -> tuple[wp.array[Any], wp.array[Any]]:
    """``(body_q, body_qd)`` of a state: newton types both optional, a model with bodies allocates them."""
    assert state.body_q is not None and state.body_qd is not None
    return state.body_q, state.body_qd


def set_bodies(state: newton.State, q: np.ndarray, qd: np.ndarray) -> None:
    """Write poses (nb, 7) and twists (nb, 6) into a state."""
    body_q, body_qd = bodies(state)
    body_q.assign(q)
    body_qd.assign(qd)


@dataclass
class RolloutInputs:
    """A rollout's per-step inputs, checked copies: servo targets targets_qd (steps, dofs) [rad/s] and targets_q
    (steps, coords) [rad], and step_arrays {PARAM_ARRAYS name: (steps, n)} set anew before every step."""

    targets_qd: np.ndarray | None = None
    targets_q: np.ndarray | None = None
    step_arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def nbytes(self) -> int:
        return int(sum(x.nbytes for x in (self.targets_qd, self.targets_q, *self.step_arrays.values())
                       if x is not None))


class StepInput(NamedTuple):
    """A per-step input on the device: ``rows`` (steps, n), row t copied into ``dst`` (the control's or the
    solver's array) before step t."""

    name: str
    rows: wp.array[Any]
    dst: wp.array[Any]


class Checkpoint(NamedTuple):
    """A checkpointed tape's segment start: the state (nb, 7), (nb, 6) and the solver's warm start (None: cold)."""

    q: np.ndarray
    qd: np.ndarray
    warm: tuple[wp.array[Any], ...] | None


@dataclass(eq=False)
class RolloutBuffers:
    """Device buffers of a rollout: the states (steps+1 rows), each step's Newton residual (steps rows) and record
    (steps rows; checkpointed every K steps: K rows, a segment's, step t at row t mod K), the per-step inputs
    (steps rows), the device step index and record row. Kept while ``layout`` stays (recordings point into
    them)."""

    layout: tuple[Any, ...]  # (steps, targets_qd given, targets_q given, step array names, record rows)
    step: wp.array[Any]  # (1,) int: the device step index
    rec: wp.array[Any]  # (1,) int: the record row of a checkpointed rollout's step (step mod K)
    q: wp.array[Any]  # (steps+1, nb) transform
    qd: wp.array[Any]  # (steps+1, nb) spatial_vector [m/s, rad/s]
    res: wp.array[Any]  # (steps, worlds) float: the Newton residual each step returned [m/s]
    u_plus: wp.array[Any]  # (rows, nb) spatial_vector: the returned twists
    lam: wp.array[Any]  # (rows, worlds x max_rows) float: the multipliers
    jt_q: wp.array[Any]  # (rows, joints) float: the servo targets [rad]
    jt_qd: wp.array[Any]  # (rows, joints) float: [rad/s]
    contacts: dict[str, wp.array[Any]]  # {CONTACT_FIELDS name: (rows, the solver's slots)}
    inputs: list[StepInput]
    holds: int | None = None  # the serial of the tape whose records these are as they are (None: no tape's)

    def kept(self) -> dict[str, wp.array[Any]]:
        """The buffers a tape keeps copies of, by `RECORD_BUFFERS` name."""
        return {"q": self.q, "qd": self.qd, "u_plus": self.u_plus, "lam": self.lam, "jt_q": self.jt_q,
                "jt_qd": self.jt_qd, **self.contacts}

    def views(self, t0: int, t1: int) -> list[StepRecord]:
        """StepRecords of steps t0..t1-1 as views (the records at rows 0.., the states at t)."""
        return [StepRecord(body_q=self.q[t], body_qd=self.qd[t], u_plus=self.u_plus[t - t0], lam=self.lam[t - t0],
                           jt_q=self.jt_q[t - t0], jt_qd=self.jt_qd[t - t0],
                           contacts={k: self.contacts[k][t - t0] for k in CONTACT_FIELDS})
                for t in range(t0, t1)]

    def record_bytes(self) -> int:
        """Bytes of the record rows (a checkpointed rollout's segment, recomputed backward)."""
        kept = self.kept()
        q = sum(kept[k].capacity // kept[k].shape[0] for k in ("q", "qd"))  # a segment's states: a row per step
        rows = self.u_plus.shape[0]
        return int(rows * q + sum(kept[k].capacity for k in RECORD_BUFFERS if k not in ("q", "qd")))


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
    inputs: RolloutInputs
    arrays: dict[str, wp.array[Any]]
    options: tuple[Any, ...]
    checkpoint_every: int | None = None
    # the records as rollout-long device buffers (rows: steps; `RECORD_BUFFERS`), each world's contact slots and
    # constraint rows cut to the rollout's most contacts (`extent`: slots, rows per world); None when checkpointed
    buffers: dict[str, wp.array[Any]] | None = None
    extent: tuple[int, int] = (0, 0)
    contact_counts: np.ndarray | None = None  # each step's most contacts of any world (read by forward)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    peak_record_bytes: int = 0
    _records: list[StepRecord] | None = None

    @property
    def records(self) -> list[StepRecord]:
        """Every step's record in the solver's layout (every contact slot and row), expanded from `buffers` on
        first use and kept; [] for a checkpointed tape (its records are recomputed by the backward)."""
        if self._records is None:
            if self.buffers is None:
                return []
            rollout = self.sim._rollout
            # uninitialised: expand overwrites each array whole, zeroing the parts past the extent
            full = {k: wp.empty(rollout.record_shape(k, a), dtype=a.dtype, device=a.device)
                    for k, a in self.buffers.items()}
            rollout.expand(self, full)
            self._records = [StepRecord(body_q=full["q"][t], body_qd=full["qd"][t], u_plus=full["u_plus"][t],
                                        lam=full["lam"][t], jt_q=full["jt_q"][t], jt_qd=full["jt_qd"][t],
                                        contacts={k: full[k][t] for k in CONTACT_FIELDS})
                             for t in range(self.steps)]
        return self._records

    def backward(self, grad_body_q: np.ndarray | None = None, grad_body_qd: np.ndarray | None = None) -> Gradients:
        """`Simulation.backward` of this rollout."""
        return self.sim.backward(grad_body_q, grad_body_qd, tape=self)

    def nbytes(self) -> int:
        """Bytes this tape holds for the backward pass: step records (peak over segments when
        checkpointed), checkpoints, the parameter snapshot and the inputs (targets, step_arrays)."""
        ck = sum(a.nbytes + b.nbytes + (sum(x.capacity for x in w) if w else 0) for a, b, w in self.checkpoints)
        return int(self.peak_record_bytes + ck + sum(a.capacity for a in self.arrays.values()) + self.inputs.nbytes())


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


class Rollout:
    """A `Simulation`'s rollouts on the device: its two states and control, the inputs of the rollout being stepped
    (forward, a tape's recomputation, jvp) and the rollout buffers (`buffers`)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.solver = sim.solver
        self.model = m = sim.model
        self.launches = sim._launches
        self.residual = sim._residual
        self.state_a = m.state()
        self.state_b = m.state()
        self.control = m.control()
        self.inputs = RolloutInputs()
        self.current: RolloutBuffers | None = None  # the rollout-long device buffers (`buffers`)

    # ---------------------------------------------------------------- inputs
    def set_inputs(self, steps: int, targets_qd: np.ndarray | None, targets_q: np.ndarray | None,
                   step_arrays: Mapping[str, np.ndarray] | None) -> None:
        """Check and keep a rollout's per-step inputs (servo targets, per-step parameter arrays)."""
        m = self.model
        tqd = self._check_targets(targets_qd, steps, m.joint_dof_count, "targets_qd")
        tq = self._check_targets(targets_q, steps, m.joint_coord_count, "targets_q")
        arrays: dict[str, np.ndarray] = {}
        self.inputs = RolloutInputs(tqd, tq, arrays)
        for name, vals in (step_arrays or {}).items():
            if name not in PARAM_ARRAYS:
                raise EngineError(f"step_arrays: {name!r} is not a parameter array; one of {PARAM_ARRAYS}")
            arrays[name] = self._check_targets(vals, steps, getattr(self.solver, name).shape[0],
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

    def set_step_arrays(self, t: int) -> None:
        """The step arrays' values of step t into the solver (the host adjoint's steps)."""
        for name, vals in self.inputs.step_arrays.items():
            getattr(self.solver, name).assign(vals[t])

    def write_inputs(self, B: RolloutBuffers) -> None:
        """The current rollout's per-step inputs (servo targets, step arrays) into ``B``'s input buffers."""
        i = self.inputs
        rows = [x for x in (i.targets_qd, i.targets_q) if x is not None]
        rows += [i.step_arrays[k] for k in sorted(i.step_arrays)]
        for inp, data in zip(B.inputs, rows, strict=True):
            inp.rows.assign(data)

    # ---------------------------------------------------------------- buffers
    def buffers(self, steps: int, checkpoint_every: int | None = None) -> RolloutBuffers:
        """Device buffers of a rollout of ``steps`` steps with the current inputs' layout (`RolloutBuffers`), the
        last ones while the layout stays (recordings point into them)."""
        sv, d, c, i = self.solver, self.model.device, self.control, self.inputs
        rec_rows = steps if checkpoint_every is None else min(checkpoint_every, steps)
        layout = (steps, i.targets_qd is not None, i.targets_q is not None, tuple(sorted(i.step_arrays)), rec_rows)
        if self.current is not None and self.current.layout == layout:
            return self.current
        self.current = None
        self.sim._graphs.clear()

        def rows(n: int, like: wp.array[Any]) -> wp.array[Any]:
            return wp.zeros((n, like.shape[0]), dtype=like.dtype, device=d)

        q, qd = bodies(self.state_a)
        step, rec = wp.zeros(1, dtype=int, device=d), wp.zeros(1, dtype=int, device=d)
        Q, QD, res = rows(steps + 1, q), rows(steps + 1, qd), rows(steps, sv.best_norm)
        recs = {k: rows(rec_rows, src) for k, src in self.record_sources().items()}
        inputs: list[StepInput] = []
        if i.targets_qd is not None:
            assert c.joint_target_qd is not None  # targets were checked against the model's dofs
            inputs.append(StepInput("targets_qd", rows(steps, c.joint_target_qd), c.joint_target_qd))
        if i.targets_q is not None:
            assert c.joint_target_q is not None
            inputs.append(StepInput("targets_q", rows(steps, c.joint_target_q), c.joint_target_q))
        for name in sorted(i.step_arrays):
            inputs.append(StepInput(name, rows(steps, getattr(sv, name)), getattr(sv, name)))
        self.current = RolloutBuffers(layout=layout, step=step, rec=rec, q=Q, qd=QD, res=res, u_plus=recs["u_plus"],
                                      lam=recs["lam"], jt_q=recs["jt_q"], jt_qd=recs["jt_qd"],
                                      contacts={k: recs[k] for k in CONTACT_FIELDS}, inputs=inputs)
        return self.current

    def record_sources(self) -> dict[str, wp.array[Any]]:
        """The solver arrays a step record copies (besides the state it started from)."""
        sv = self.solver
        src = {"u_plus": sv.u_sol, "lam": sv.lam_best, "jt_q": sv.jt_q, "jt_qd": sv.jt_qd}
        src.update({k: getattr(sv, k) for k in CONTACT_FIELDS})
        return src

    # ---------------------------------------------------------------- stepping
    def record(self, steps: int, tape: Tape, Q: np.ndarray, QD: np.ndarray,
               progress: Callable[[int], None] | None) -> None:
        """The steps of `Simulation.forward` on the rollout buffers (`run`); the host reads them once at the
        end. The tape keeps copies of the records, or, checkpointed every K steps, the state and the warm start
        each segment began with (device copies taken between steps; the records were written into K-row buffers
        and are recomputed by the backward)."""
        K = tape.checkpoint_every
        B = self.buffers(steps, K)
        self.write_inputs(B)
        warm: list[tuple[wp.array[Any], ...] | None] = [None]  # segment 0 starts cold
        for t, _ in self.run(B):
            if K is not None and (t + 1) % K == 0 and t + 1 < steps:
                warm.append(self.solver.warm_state())
            if progress is not None:
                progress(t)
        self.read(B, Q, QD, stacklevel=4)  # the warning names forward's caller
        if K is not None:
            tape.checkpoints = [Checkpoint(Q[s * K].copy(), QD[s * K].copy(), w) for s, w in enumerate(warm)]
            tape.peak_record_bytes = B.record_bytes()
            return
        # the tape's copies keep each world's first C contact slots and jrows + 3 C rows, C the most contacts of any
        # world at any step (one read of the counts): the backward reads no slot or row past a step's count, and a
        # rollout with few contacts per world keeps a fraction of max_contacts_per_world's records (1,024 worlds
        # over the pallet, at most 6 of 48 slots: 261 -> 55 MB per tape, fewer page faults and copies per forward)
        tape.contact_counts = B.contacts["ct_count"].numpy().max(axis=1, initial=0)  # also the backward's sizes
        C = int(tape.contact_counts.max(initial=0))
        tape.extent = (C, self.solver.joint_rows + 3 * C)
        kept = B.kept()
        tape.buffers = {k: wp.clone(self.record_part(kept[k], k, tape.extent)) for k in RECORD_BUFFERS}
        tape.peak_record_bytes = sum(a.capacity for a in tape.buffers.values())
        B.holds = tape.serial  # until the next rollout on B, B holds this tape's records as they are

    def run(self, B: RolloutBuffers, t0: int = 0, t1: int | None = None) -> Iterator[tuple[int, newton.State]]:
        """Step a rollout on its buffers ``B`` (`buffers`): steps t0..t1-1 (default: all), from the state in
        ``state_a`` (t0 even) or ``state_b`` (odd) with the solver's warm start as it is; each step takes its
        inputs from row t and puts its state, residual and record into row t (graph_kernels, t on the device;
        the record at row t mod K in a checkpointed rollout's K-row buffers), so the steps after the first
        replay two recordings (graphs.GraphCache; step 0 has no warm start and runs as launches). Yields (t,
        the state step t started from) after each step; contacts dropped are counted on the device meanwhile.
        The caller has written the per-step inputs into ``B`` (`write_inputs`)."""
        sv, L, graphs = self.solver, self.launches, self.sim._graphs
        t1 = B.layout[0] if t1 is None else t1
        B.holds = None  # the records about to be written are no tape's until forward says so
        B.step.fill_(t0)
        s_in, s_out = (self.state_a, self.state_b) if t0 % 2 == 0 else (self.state_b, self.state_a)
        for dst, src in zip((B.q, B.qd), bodies(s_in)):
            L.put_row(B.step, 0, src, dst)
        key = self.step_key(B)
        replay = sv.options.extra_iters == 0  # extra iterations are decided at the host after the budget
        split = wp.get_device(self.model.device).is_cpu  # worker threads must not collide at once (COLLISION_LOCK)
        deferred = sv.defer_contact_check
        sv.defer_contact_check = True
        try:
            for t in range(t0, t1):
                a, b = s_in, s_out

                def body(a: newton.State = a, b: newton.State = b) -> None:
                    self._step(B, a, b)

                def collide(a: newton.State = a) -> None:
                    self._collide(a)

                def after_collide(a: newton.State = a, b: newton.State = b) -> None:
                    self._step(B, a, b, collided=True)

                if t == 0 or not replay:
                    body()
                elif split:
                    # the collision in a recording of its own, replayed under graphs.COLLISION_LOCK
                    graphs.run(("collide", t % 2, key), collide, lock=COLLISION_LOCK)
                    graphs.run(("step", t % 2, key), after_collide)
                else:
                    graphs.run(("step", t % 2, key), body)
                yield t, a
                s_in, s_out = s_out, s_in
        finally:
            sv.defer_contact_check = deferred

    def step_key(self, B: RolloutBuffers) -> tuple[Any, ...]:
        """What a step's recording holds besides arrays: the options, the step size and gravity as they were."""
        sv = self.solver
        return (id(B), self.sim.dt, sv.options.version, tuple(sv._gravity().tolist()))

    def _collide(self, s_in: newton.State) -> None:
        """The solver's own collision at ``s_in`` (the first part of a step recorded in two parts)."""
        self.solver.collide(s_in)

    def _step(self, B: RolloutBuffers, s_in: newton.State, s_out: newton.State, collided: bool = False) -> None:
        """One step on the buffers at the device's step index: inputs in, step, outputs out, index + 1.
        ``collided``: the solver's contacts at ``s_in`` are already computed (`_collide`)."""
        sv, L, step = self.solver, self.launches, B.step
        for inp in B.inputs:
            L.take_row(step, inp.rows, inp.dst)
        sv.step(s_in, s_out, self.control, sv.own_contacts if collided else None, self.sim.dt)
        q, qd = bodies(s_out)
        L.put_row(step, 1, q, B.q)
        L.put_row(step, 1, qd, B.qd)
        L.put_row(step, 0, sv.best_norm, B.res)
        rec = self.record_row(B, step)
        # the contact records and lam by put_contact_record (count slots / rows per world), every other record
        # source row by row
        kept = B.kept()
        for k, src in self.record_sources().items():
            if k not in CONTACT_FIELDS and k != "lam":
                L.put_row(rec, 0, src, kept[k])
        record = make(ContactRecord, lam=B.lam, **{k.removeprefix("ct_"): B.contacts[k] for k in CONTACT_FIELDS})
        L.launch(put_contact_record, sv.world_count,
                 [rec, sv.max_contacts, sv.max_rows, sv.joint_rows, sv.contact_slots, sv.lam_best], [record])
        L.launch(advance, 1, [], [step])

    def record_row(self, B: RolloutBuffers, step: wp.array[Any]) -> wp.array[Any]:
        """The device index of step ``step``'s record in buffers ``B``: the step itself, or in a checkpointed
        rollout's segment-long buffers ``B.rec`` = step mod K (set by a launch)."""
        rows = B.u_plus.shape[0]
        if rows == B.layout[0]:
            return step
        self.launches.launch(wrap_index, 1, [step, rows], [B.rec])
        return B.rec

    def read(self, B: RolloutBuffers, Q: np.ndarray, QD: np.ndarray, stacklevel: int) -> None:
        """The rollout's one read: states into Q, QD (rows 1..), residuals (``Simulation.step_residuals``),
        dropped contacts (a warning ``stacklevel`` frames up, the caller's caller of this method being 2)."""
        Q[1:] = B.q.numpy()[1:]
        QD[1:] = B.qd.numpy()[1:]
        self.sim.step_residuals = B.res.numpy().copy()
        if self.solver.options.check_contacts:
            self.solver.report_dropped_contacts(stacklevel=stacklevel)

    def load_record(self, B: RolloutBuffers, step: wp.array[Any]) -> None:
        """The record in row (device step index) of rollout buffers ``B`` into the residual's workspace and the
        solver's contact slots, with that row's per-step inputs put back (the step is linearised at its own
        parameters); the residual evaluated there once (`record.Residual.evaluate_loaded`)."""
        sv, L, ws = self.solver, self.launches, self.residual.workspace
        for inp in B.inputs:
            L.take_row(step, inp.rows, inp.dst)
        L.take_row(step, B.q, ws.body_q)
        L.take_row(step, B.qd, ws.body_qd)
        rec = self.record_row(B, step)
        for src, dst in ((B.u_plus, ws.u_plus), (B.lam, ws.lam), (B.jt_q, ws.jt_q), (B.jt_qd, ws.jt_qd)):
            L.take_row(rec, src, dst)
        for k in CONTACT_FIELDS:
            L.take_row(rec, B.contacts[k], getattr(sv, k))
        self.residual.evaluate_loaded()

    # ---------------------------------------------------------------- a tape's records
    def record_part(self, a: wp.array[Any], k: str, extent: tuple[int, int]) -> wp.array[Any]:
        """The part of rollout buffer ``a`` (record ``k``, rows: steps) a tape keeps: each world's first extent[0]
        contact slots, or first extent[1] constraint rows (lam); the whole of the other records."""
        sv = self.solver
        part: wp.array[Any] = a
        if k in CONTACT_FIELDS and k != "ct_count":
            part = a.reshape((a.shape[0], sv.world_count, sv.max_contacts))[:, :, : extent[0]]
        elif k == "lam":
            part = a.reshape((a.shape[0], sv.world_count, sv.max_rows))[:, :, : extent[1]]
        return part

    def record_shape(self, k: str, kept: wp.array[Any]) -> tuple[int, int]:
        """The rollout buffer's shape of a tape's record ``k`` (kept: the tape's part of it)."""
        sv = self.solver
        if k in CONTACT_FIELDS and k != "ct_count":
            return (kept.shape[0], sv.world_count * sv.max_contacts)
        if k == "lam":
            return (kept.shape[0], sv.world_count * sv.max_rows)
        return (kept.shape[0], kept.shape[1])

    def expand(self, tape: Tape, full: Mapping[str, wp.array[Any]]) -> None:
        """A tape's records into rollout-layout buffers ``full`` (by `RECORD_BUFFERS` name); the slots and rows past
        the tape's extent zeroed."""
        assert tape.buffers is not None
        for k in RECORD_BUFFERS:
            part = self.record_part(full[k], k, tape.extent)
            if part is not full[k]:
                full[k].zero_()
            wp.copy(part, tape.buffers[k])

    def hold(self, tape: Tape, B: RolloutBuffers) -> None:
        """Make rollout buffers ``B`` hold ``tape``'s records: as they are when its forward was the last rollout on
        them (the usual forward-then-backward), else expanded from the tape's copies."""
        if B.holds != tape.serial:
            self.expand(tape, B.kept())
            B.holds = tape.serial

    def recompute_segment(self, tape: Tape, seg: int, B: RolloutBuffers) -> list[StepRecord]:
        """A checkpointed tape's segment stepped again on the device into its rollout buffers ``B`` (the
        tape's inputs already written there, its parameters in place) from the segment's checkpoint; its
        records as views of ``B``. The contacts it drops were reported by the forward: not again."""
        K = tape.checkpoint_every
        assert K is not None  # only a checkpointed tape has segments to recompute
        t0 = seg * K
        t1 = min(t0 + K, tape.steps)
        q0, qd0, warm = tape.checkpoints[seg]
        sv = self.solver
        set_bodies(self.state_a if t0 % 2 == 0 else self.state_b, q0, qd0)
        sv.set_warm_state(warm)
        dropped = wp.clone(sv.ct_dropped)
        for _ in self.run(B, t0, t1):
            pass
        wp.copy(sv.ct_dropped, dropped)
        return B.views(t0, t1)
