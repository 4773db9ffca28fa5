"""A backward is bound to its forward (issue 21, item 4).

`Simulation.forward` returns a `ForwardResult` (it unpacks as (body_q, body_qd)) whose ``.tape``
holds what that rollout's backward needs: its step records (or checkpoints), its inputs and the
solver's parameter arrays as they were when it ran. ``tape.backward(gQ, gQD)`` /
``sim.backward(gQ, gQD, tape=tape)`` differentiates that rollout whatever forwards or
`set_parameters` calls came after; ``sim.backward(gQ, gQD)`` is the last forward's. Formerly a
backward used the last forward's records with the *current* parameters, so a parameter change
between forward and backward, or two torch rollouts in one graph, gave wrong gradients silently.

Scenario: the regularised sliding block of test_engine_adjoint (1 kg cube, v0 = 1 m/s, friction
mu N v / sqrt(v^2 + v_s^2), v_s = 0.3 m/s, 16 steps at h = 0.05 s: it decelerates through the Coulomb
part into the viscous part, so L = final x depends on mu non-linearly and dx/dmu differs between
mu = 0.4 and 0.25). Reference: central FD of L in mu at each rollout's own mu; relative error
printed and asserted <= 0.5 %.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sysid.engine import EngineError, ForwardResult, Simulation, SolverOstrich
from sysid.engine.torch_bridge import rollout as torch_rollout
from tests.engine.test_engine_adjoint import REG_SLIDE, TOL, _trajectory_bytes, box_model, central, report

MU_A, MU_B, MU_NOW = 0.4, 0.25, 0.1


def reg_block(checkpoint_every: int | None = None) -> tuple[Simulation, np.ndarray, np.ndarray]:
    c = REG_SLIDE
    m = box_model(c["mu"], 0.1, mass=1.0, inertia=0.01, gap=0.1)
    solver = SolverOstrich(m)
    solver.set_slip_speed([0, 1], c["vs"])
    sim = Simulation(solver, c["h"], checkpoint_every=checkpoint_every)
    sim.register_parameter("mu", "shape_mu", [0, 1])
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = c["v0"]
    return sim, m.body_q.numpy(), qd0


def final_x_seed(T: int) -> np.ndarray:
    gQ = np.zeros((T + 1, 1, 7), np.float32)
    gQ[-1, 0, 0] = 1.0
    return gQ


def fd_dx_dmu(mu: float) -> float:
    sim, q0, qd0 = reg_block()
    T = REG_SLIDE["T"]

    def x_of(v: float) -> np.ndarray:
        sim.set_parameters({"mu": v})
        return np.array([float(sim.forward(q0, qd0, T)[0][-1, 0, 0])])

    return float(central(x_of, mu)[0])


@pytest.fixture(scope="module")
def fd() -> dict[float, float]:
    return {mu: fd_dx_dmu(mu) for mu in (MU_A, MU_B)}


@pytest.mark.parametrize("checkpoint_every", [None, 4], ids=["records", "checkpointed"])
def test_backward_binds_to_its_forward(fd: dict[float, float], checkpoint_every: int | None) -> None:
    """Forward A at mu = 0.4, forward B at mu = 0.25, then mu set to 0.1; then A's tape, B's tape and
    the plain sim.backward (= B, the last forward) are differentiated: each equals FD at its own mu
    (<= 0.5 %) and the fresh forward-then-backward gradient at that mu (to 1e-6); the current mu
    (0.1) is left in place. With checkpointing the segments are recomputed at the tape's mu."""
    T = REG_SLIDE["T"]
    sim, q0, qd0 = reg_block(checkpoint_every)
    sim.set_parameters({"mu": MU_A})
    res_a = sim.forward(q0, qd0, T)
    assert isinstance(res_a, ForwardResult) and res_a.tape is sim.last_tape
    Qa, QDa = res_a  # still unpacks as the pair
    assert Qa.shape == (T + 1, 1, 7) and QDa.shape == (T + 1, 1, 6)
    sim.set_parameters({"mu": MU_B})
    res_b = sim.forward(q0, qd0, T)
    sim.set_parameters({"mu": MU_NOW})
    g_a = float(res_a.tape.backward(final_x_seed(T)).params["mu"])
    g_last = float(sim.backward(final_x_seed(T), None).params["mu"])
    g_b = float(sim.backward(final_x_seed(T), None, tape=res_b.tape).params["mu"])
    assert float(sim.get_parameters()["mu"]) == pytest.approx(MU_NOW)  # the current value restored

    fresh = {}
    for mu in (MU_A, MU_B):
        s2, _, _ = reg_block(checkpoint_every)
        s2.set_parameters({"mu": mu})
        s2.forward(q0, qd0, T)
        fresh[mu] = float(s2.backward(final_x_seed(T), None).params["mu"])
    errs = report(f"tapes ({'records' if checkpoint_every is None else 'checkpoint_every=4'}), L = final x", [
        ("tape A dx/dmu at 0.4 vs FD", g_a, fd[MU_A]), ("tape B dx/dmu at 0.25 vs FD", g_b, fd[MU_B]),
        ("last forward (B) vs FD", g_last, fd[MU_B])])
    assert max(errs.values()) <= TOL, errs
    assert abs(g_a - fresh[MU_A]) <= 1e-6 * abs(fresh[MU_A]) and abs(g_b - fresh[MU_B]) <= 1e-6 * abs(fresh[MU_B])
    assert g_last == g_b
    assert abs(g_a - g_b) > 0.05 * abs(g_b), (g_a, g_b)  # the two rollouts' gradients really differ


def test_torch_two_rollouts_in_one_graph(fd: dict[float, float]) -> None:
    """Two torch rollouts of one Simulation (mu = 0.4 and 0.25) in one graph, L = x_A + 2 x_B:
    each autograd backward differentiates its own rollout (formerly both used the last forward and
    the current mu): dL/dmu_A = FD at 0.4, dL/dmu_B = 2 FD at 0.25, <= 0.5 %."""
    T = REG_SLIDE["T"]
    sim, q0, qd0 = reg_block()
    tq = np.zeros((T, sim.model.joint_dof_count), np.float32)  # a free joint: no servo reads them
    th_a = torch.tensor([MU_A], dtype=torch.float64, requires_grad=True)
    th_b = torch.tensor([MU_B], dtype=torch.float64, requires_grad=True)
    Qa, _ = torch_rollout(sim, q0, qd0, tq, th_a, names=["mu"])
    Qb, _ = torch_rollout(sim, q0, qd0, tq, th_b, names=["mu"])
    loss = Qa[-1, 0, 0] + 2.0 * Qb[-1, 0, 0]
    loss.backward()
    errs = report("torch, two rollouts in one graph, L = x_A + 2 x_B", [
        ("dL/dmu_A vs FD(0.4)", float(th_a.grad[0]), fd[MU_A]), ("dL/dmu_B vs 2 FD(0.25)", float(th_b.grad[0]),
                                                                  2 * fd[MU_B])])
    assert max(errs.values()) <= TOL, errs


def test_tape_misuse_raises() -> None:
    """No forward yet, another Simulation's tape, or a residual-shaping solver option changed since
    the forward: EngineError naming the cause (never a silently wrong gradient)."""
    T = 4
    sim, q0, qd0 = reg_block()
    with pytest.raises(EngineError, match="forward"):
        sim.backward(final_x_seed(T), None)
    other, _, _ = reg_block()
    tape = other.forward(q0, qd0, T).tape
    with pytest.raises(EngineError, match="another Simulation"):
        sim.backward(final_x_seed(T), None, tape=tape)
    sim.forward(q0, qd0, T)
    sim.solver.options.contact_compliance *= 2
    with pytest.raises(EngineError, match="contact_compliance"):
        sim.backward(final_x_seed(T), None)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_checkpoint_every_is_named(bad: object) -> None:
    """checkpoint_every must be None or a positive whole number of steps (a segment's record rows)."""
    with pytest.raises(EngineError, match="checkpoint_every"):
        reg_block(bad)  # type: ignore[arg-type]


def test_tape_keeps_records_cut_to_its_contacts() -> None:
    """A kept tape holds each world's first C contact slots and jrows + 3 C constraint rows, C the most contacts
    of any world at any step (the block: 4 corners of 48 slots): its expanded `records` equal the forward's own
    buffers in every slot and row a step uses, the slots past a step's count zero, and it holds less than the
    trajectory's records in the solver's layout. After another rollout on the same buffers its backward expands
    them back: the same gradients bit for bit."""
    sim, q0, qd0 = reg_block()
    sv, T = sim.solver, REG_SLIDE["T"]
    tape = sim.forward(q0, qd0, T).tape
    B = sim._rollout.current
    assert B is not None and B.holds == tape.serial and tape.buffers is not None
    C, R = tape.extent
    counts = B.contacts["ct_count"].numpy()
    assert C == counts.max() and 0 < C < sv.max_contacts and R == sv.joint_rows + 3 * C
    assert np.array_equal(tape.contact_counts, counts.max(axis=1))
    for t, rec in enumerate(tape.records):
        for w in range(sv.world_count):
            n = int(counts[t, w])
            for k in ("ct_shape0", "ct_p0", "ct_n", "ct_thick"):
                full = rec.contacts[k].numpy().reshape(sv.world_count, sv.max_contacts, -1)[w]
                mine = B.contacts[k].numpy()[t].reshape(sv.world_count, sv.max_contacts, -1)[w]
                assert np.array_equal(full[:n], mine[:n]), (t, w, k)
                assert not full[C:].any(), (t, w, k)
            rows = sv.joint_rows + 3 * n
            lam = rec.lam.numpy().reshape(sv.world_count, sv.max_rows)[w]
            assert np.array_equal(lam[:rows], B.lam.numpy()[t].reshape(sv.world_count, sv.max_rows)[w, :rows])
    assert tape.peak_record_bytes < _trajectory_bytes(tape) / 4
    gQ = final_x_seed(T)
    ref = tape.backward(gQ, None)
    sim.forward(q0, qd0 * 0.5, T)  # another rollout on the buffers: the tape's records are expanded back
    assert B.holds != tape.serial
    g = tape.backward(gQ, None)
    assert B.holds == tape.serial
    assert np.array_equal(g.params["mu"], ref.params["mu"]) and np.array_equal(g.body_qd0, ref.body_qd0)
