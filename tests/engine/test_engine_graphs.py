"""Recorded replays (sysid.engine.graphs): a rollout whose steps replay recordings, and a backward whose
Jacobian assembly does, give exactly what the same steps give as individual launches.

The recording holds the launches with their arguments; the step index lives on the device. So the
replayed rollout must equal the launched one bit for bit: states, per-step residuals, every gradient.
Any difference means a recording baked in something that changes between steps (a host value, an
argument of the wrong element type, a stale array descriptor): it is a bug, not rounding.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import warp as wp

from sysid.engine import Simulation, SolverOptions, SolverOstrich
from sysid.engine.graphs import GraphCache, worker_threads
from tests.helpers.engine import box_model, varied_robot_batch

T = 12  # steps: step 0 runs as launches, 1-2 as launches (first use), 3.. record and replay


def _robot_case(graphs: bool, **opts: object):
    """Three robot worlds (different kp, speed, turn) with a slip-speed schedule as a step array."""
    sc, sim, q0, qd0, tq = varied_robot_batch(3, T, 0.1, SolverOptions(**{"newton_iters": 12, "pcr_iters": 12,
                                                                             **opts}))
    sim = Simulation(sim.solver, 0.1, graphs=graphs)
    sim.register_parameter("kp", "joint_kd", [j for hd in sc.handles for j in hd.wheel_joints], per_world=True)
    ns_ = sim.solver.shape_slip.shape[0]
    sched = np.zeros((T, ns_), np.float32)
    for hd in sc.handles:
        sched[:, hd.wheel_shapes] = np.linspace(0.05, 0.2, T)[:, None]
    return sc, sim, q0, qd0, tq, {"shape_slip": sched}


def _run(sim: Simulation, q0, qd0, tq, steps, reps: int = 3):
    """``reps`` forward + backward passes (the third replays what the second recorded); the last's results."""
    out = None
    for _ in range(reps):
        Q, QD = sim.forward(q0, qd0, T, tq, step_arrays=steps)
        gQ = np.zeros_like(Q)
        gQ[-1, :, 0] = 1.0
        gQD = np.zeros_like(QD)
        gQD[-1, :, 5] = 0.5
        g = sim.backward(gQ, gQD)
        out = (Q, QD, sim.step_residuals.copy(), g)
    return out


def _assert_same_gradients(a, b) -> None:
    """Every gradient of two backwards bit for bit: state, targets, parameter arrays, step arrays, kp."""
    for name in ("body_q0", "body_qd0", "targets_qd"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in b.arrays:
        assert np.array_equal(a.arrays[name], b.arrays[name]), name
    assert np.array_equal(a.step_arrays["shape_slip"], b.step_arrays["shape_slip"])
    assert np.array_equal(a.params["kp"], b.params["kp"])


def test_replayed_rollout_and_adjoint_equal_launched() -> None:
    """Robot, 3 worlds, 12 steps with servo targets and a per-step slip schedule: trajectories, per-step
    residuals and every gradient (initial state, targets, step arrays, parameter arrays, registered kp)
    identical with recorded replays and with individual launches; and replays did run."""
    _, sim_g, q0, qd0, tq, steps = _robot_case(True)
    _, sim_l, *_ = _robot_case(False)
    Qg, QDg, rg, gg = _run(sim_g, q0, qd0, tq, steps)
    Ql, QDl, rl, gl = _run(sim_l, q0, qd0, tq, steps)
    print(f"\nrecordings {sim_g._graphs.recorded}, replays {sim_g._graphs.replayed}; launched: "
          f"{sim_l._graphs.recorded} / {sim_l._graphs.replayed}")
    assert sim_g._graphs.recorded >= 3 and sim_g._graphs.replayed > 2 * T  # steps and assemblies replayed
    assert sim_l._graphs.recorded == 0 and sim_l._graphs.replayed == 0
    assert np.array_equal(Qg, Ql) and np.array_equal(QDg, QDl) and np.array_equal(rg, rl)
    _assert_same_gradients(gg, gl)
    assert np.abs(gg.targets_qd).max() > 0 and np.abs(gg.step_arrays["shape_slip"]).max() > 0


def test_changed_options_and_inputs_record_anew() -> None:
    """A recording holds the solver options and the buffers' layout: after newton_iters changes, or the
    rollout's length or inputs change, the replayed rollout equals a launched one under the new setting."""
    _, sim_g, q0, qd0, tq, steps = _robot_case(True)
    _, sim_l, *_ = _robot_case(False)
    _run(sim_g, q0, qd0, tq, steps, reps=2)
    for sim in (sim_g, sim_l):
        sim.solver.options.newton_iters = 6
        sim.solver.options.k_min = 2
    a = _run(sim_g, q0, qd0, tq, steps)
    b = _run(sim_l, q0, qd0, tq, steps)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[2], b[2])
    assert np.array_equal(a[3].targets_qd, b[3].targets_qd)
    # shorter rollout without the step arrays: other buffers, other recordings
    Qg, _ = sim_g.forward(q0, qd0, T - 4, tq[: T - 4])
    Qg, _ = sim_g.forward(q0, qd0, T - 4, tq[: T - 4])
    Ql, _ = sim_l.forward(q0, qd0, T - 4, tq[: T - 4])
    assert np.array_equal(Qg, Ql)


def test_dropped_contacts_reported_once_per_rollout() -> None:
    """A box resting on the ground has 4 corner contacts; with 2 slots per world the replayed rollout
    still warns (the count is reduced on the device and read once at the end), naming world 0."""
    m = box_model()
    sim = Simulation(SolverOstrich(m, SolverOptions(max_contacts_per_world=2)), 0.05)
    q0 = m.body_q.numpy()
    qd0 = np.zeros((1, 6), np.float32)
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match=r"dropped in worlds \[0\]") as rec:
            sim.forward(q0, qd0, 8)
        assert sum("dropped" in str(w.message) for w in rec) == 1
    assert sim._graphs.replayed > 0


def test_checkpointed_backward_reports_no_dropped_contacts_again() -> None:
    """The backward of a checkpointed tape recomputes its segments, dropping the same contacts: the forward
    reported them, so neither the backward nor the next forward (here one without contact, the box 1 m up)
    warns again."""
    m = box_model()
    sim = Simulation(SolverOstrich(m, SolverOptions(max_contacts_per_world=2)), 0.05, checkpoint_every=3)
    q0 = m.body_q.numpy()
    qd0 = np.zeros((1, 6), np.float32)
    with pytest.warns(RuntimeWarning, match=r"dropped in worlds \[0\]"):
        Q, _ = sim.forward(q0, qd0, 8)
    gQ = np.zeros_like(Q)
    gQ[-1, 0, 2] = 1.0
    up = q0.copy()
    up[0, 2] += 1.0
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dropped.*")
        sim.backward(gQ, None)
        sim.forward(up, qd0, 2)


def test_extra_iterations_run_as_launches() -> None:
    """extra_iters decides at the host whether a world gets more iterations: such a rollout is not replayed
    and equals the launched one."""
    _, sim_g, q0, qd0, tq, steps = _robot_case(True, extra_iters=4, extra_tol=1e-5)
    _, sim_l, *_ = _robot_case(False, extra_iters=4, extra_tol=1e-5)
    for _ in range(3):
        Qg, _ = sim_g.forward(q0, qd0, T, tq, step_arrays=steps)
    Ql, _ = sim_l.forward(q0, qd0, T, tq, step_arrays=steps)
    assert np.array_equal(Qg, Ql)


def test_graph_cache_rules() -> None:
    """GraphCache: first use runs the body, second records and replays, later replays only; on the CPU
    inside worker_threads it replays what exists and records nothing (a new key runs as launches); on
    another thread outside worker_threads it runs bodies as launches."""
    a = wp.zeros(1, dtype=float, device="cpu")
    ones = wp.ones(1, dtype=float, device="cpu")
    calls = []

    def body() -> None:
        calls.append(1)
        wp.launch(_add, 1, inputs=[ones], outputs=[a], device="cpu")

    cache = GraphCache("cpu")
    for _ in range(4):
        cache.run("k", body)
    assert float(a.numpy()[0]) == 4.0  # every use added once, replayed or not
    assert len(calls) == 2 and cache.recorded == 1 and cache.replayed == 3
    with worker_threads():
        cache.run("k", body)  # replayed
        cache.run("new", body)  # launched, not recorded
        cache.run("new", body)
    assert len(calls) == 4 and cache.replayed == 4 and cache.recorded == 1 and float(a.numpy()[0]) == 7.0
    import threading

    t = threading.Thread(target=cache.run, args=("k", body))
    t.start()
    t.join()
    assert len(calls) == 5 and cache.replayed == 4 and float(a.numpy()[0]) == 8.0


@wp.kernel
def _add(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    y[0] = y[0] + x[0]


def test_options_changed_after_a_rollout_take_effect() -> None:
    """Options edited between rollouts (newton_iters, k_min, contact_compliance) give what a solver built
    with them gives: forward states and the backward's gradients. (Before, the recorded Newton launch and
    the adjoint's residual launches kept the options of the first rollout; the replay exposed it.)"""
    edits = {"newton_iters": 6, "k_min": 2, "contact_compliance": 1e-6}
    _, sim, q0, qd0, tq, steps = _robot_case(False)
    _run(sim, q0, qd0, tq, steps, reps=1)
    for k, v in edits.items():
        setattr(sim.solver.options, k, v)
    _, fresh, *_ = _robot_case(False, **edits)
    a, b = _run(sim, q0, qd0, tq, steps, reps=1), _run(fresh, q0, qd0, tq, steps, reps=1)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[2], b[2])
    assert np.array_equal(a[3].targets_qd, b[3].targets_qd) and np.array_equal(a[3].body_qd0, b[3].body_qd0)


class _HostReads:
    """Counts the device arrays read back to the host (``wp.array.numpy``) while active."""

    def __enter__(self) -> _HostReads:
        self.count = 0
        self._orig = wp.array.numpy

        def counted(arr, *a, **k):
            self.count += 1
            return self._orig(arr, *a, **k)

        wp.array.numpy = counted
        return self

    def __exit__(self, *exc) -> None:
        wp.array.numpy = self._orig


def _reads(sim: Simulation, q0, qd0, tq, steps) -> tuple[int, int]:
    """Host reads of one (warm) forward and of its backward."""
    gQ = np.zeros((T + 1, sim.model.body_count, 7), np.float32)
    gQ[-1, :, 0] = 1.0
    with _HostReads() as fwd:
        tape = sim.forward(q0, qd0, T, tq, step_arrays=steps).tape
    with _HostReads() as bwd:
        tape.backward(gQ, None)
    return fwd.count, bwd.count


@pytest.mark.parametrize("solver", ["lu", "krylov"])
def test_checkpointed_backward_on_the_device(solver: str) -> None:
    """A checkpointed tape (every 5 of 12 steps: segments of 5, 5 and 2, recomputed last first on the
    device) with every step launched against the unsegmented tape with replays: every gradient bit for
    bit, the per-step solve residuals equal (the same sums on the device). No host read inside a step:
    the forward reads the same few arrays whatever its segments (and the contact counts once when the tape
    keeps its records), the backward one more per segment (its contact counts, for the system sizes):
    checkpointed every 2 steps (6 segments) it reads 3 more than every 4 (3 segments)."""
    _, sim_d, q0, qd0, tq, steps = _robot_case(True, adjoint_solver=solver)
    sc, sim_c, *_ = _robot_case(False, adjoint_solver=solver)
    sim_c = Simulation(sim_c.solver, 0.1, graphs=False, checkpoint_every=5)
    sim_c.register_parameter("kp", "joint_kd", [j for hd in sc.handles for j in hd.wheel_joints], per_world=True)
    Qd, _, res_d, gd = _run(sim_d, q0, qd0, tq, steps)
    Qc, _, res_c, gc = _run(sim_c, q0, qd0, tq, steps, reps=1)
    assert sim_d.last_tape.buffers is not None and sim_c.last_tape.buffers is None
    assert len(sim_c.last_tape.checkpoints) == 3
    assert np.array_equal(Qd, Qc) and np.array_equal(res_d, res_c)
    _assert_same_gradients(gd, gc)
    np.testing.assert_array_equal(gd.adjoint_residual, gc.adjoint_residual)
    reads = {}
    for k in (None, 4, 2):
        sim = Simulation(sim_d.solver, 0.1, checkpoint_every=k)
        _reads(sim, q0, qd0, tq, steps)  # warm: kernels loaded, replays recorded
        reads[k] = _reads(sim, q0, qd0, tq, steps)
    print(f"\nhost reads (forward, backward) by checkpoint_every: {reads}")
    # a kept tape's forward reads the contact counts once more (the extent of the records it keeps), which its
    # backward then reads no more
    assert reads[None][0] == reads[4][0] + 1 and reads[4][0] == reads[2][0]
    assert reads[2][1] - reads[4][1] == 3
    assert reads[4][1] <= reads[None][1] + 3


def test_replayed_tangents_equal_launched() -> None:
    """Simulation.jvp with replays (the steps and each step's tangent solve recorded) against launches: the
    rollout, the tangents dq, dqd of three directions (kp per world, one slip-schedule entry, a target
    offset), the per-step residuals, solve residuals and pivot ratios, all bit-identical."""
    from sysid.engine import Tangents

    res = []
    for graphs in (True, False):
        sc, sim, q0, qd0, tq, steps = _robot_case(graphs)
        ns_ = sim.solver.shape_slip.shape[0]
        dsl = np.zeros((3, T, ns_), np.float32)
        dsl[1, 4, sc.handles[0].wheel_shapes[0]] = 1.0
        dtq = np.zeros((3, T, tq.shape[1]), np.float32)
        dtq[2] = 0.1
        kp = np.zeros((3, 3), np.float32)
        kp[0] = 1.0
        for _ in range(3):
            r = sim.jvp(q0, qd0, T, Tangents(params={"kp": kp}, step_arrays={"shape_slip": dsl}, targets_qd=dtq),
                        targets_qd=tq, step_arrays=steps)
        res.append((r, sim._graphs.replayed))
    (a, na), (b, nb_) = res
    assert na > 2 * T and nb_ == 0
    for name in ("q", "qd", "dq", "dqd", "step_residuals", "solve_residual", "pivot_ratio"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.abs(a.dq[0, -1]).max() > 0 and np.abs(a.dq[1, -1]).max() > 0 and np.abs(a.dq[2, -1]).max() > 0


def test_backward_of_an_older_tape_on_the_device() -> None:
    """A tape's backward after another forward with other inputs (slip schedule, targets) on the same
    buffers: the same gradients as right after its own forward (the device backward loads the tape's
    records and inputs, not the buffers' latest)."""
    _, sim, q0, qd0, tq, steps = _robot_case(True)
    gQ = np.zeros((T + 1, sim.model.body_count, 7), np.float32)
    gQ[-1, :, 0] = 1.0
    for _ in range(2):  # replays recorded
        first = sim.forward(q0, qd0, T, tq, step_arrays=steps).tape
        ref = first.backward(gQ, None)
    other = {"shape_slip": steps["shape_slip"] * 3.0}
    sim.forward(q0, qd0, T, tq * 0.5, step_arrays=other)
    g = first.backward(gQ, None)
    assert np.array_equal(g.targets_qd, ref.targets_qd) and np.array_equal(g.body_qd0, ref.body_qd0)
    assert np.array_equal(g.step_arrays["shape_slip"], ref.step_arrays["shape_slip"])
