"""Worlds in vector lanes (SolverOptions.lanes): the lanes' PCR must be the one-world PCR bit for bit.

`schur_lanes.lane_pcr` runs `schur.schur_solve`'s PCR float32 operations for LANES worlds per thread, one per lane
of Warp vectors. Nothing may change but the speed: the same solution to the last bit for every world,
whatever its neighbours in the group (row counts, the bodies its rows act on, iteration caps and
tolerances, idle lanes), and the same rollouts through the whole engine."""

import numpy as np
import pytest
import warp as wp

from sysid.engine import Simulation, SolverOptions, SolverOstrich, solver_ostrich
from sysid.engine.schur import dense_factor, dense_solve, schur_solve
from sysid.engine.schur_lanes import lane_code
from sysid.engine.types import (
    LANE_WIDTHS,
    LANES,
    LANES_WIDE_FROM,
    LaneScratch,
    Rows,
    SchurScratch,
    StepConstants,
    laned,
    lanef,
    lanei,
    make,
    repacked,
)
from sysid.robot.scenes import WorldSpec
from tests.helpers.engine import initial_state, robot_scene, rolling_inputs, wheel_control

# the lane functions of the default width (`schur_lanes.lane_code`)
_lanes = lane_code(LANES)
lane_dense_factor = _lanes.lane_dense_factor
lane_dense_solve = _lanes.lane_dense_solve
lane_pack = _lanes.lane_pack
lane_pcr = _lanes.lane_pcr
lane_unpack = _lanes.lane_unpack

NB = 4  # bodies per world
MAX_ROWS = 24


@wp.struct
class Systems:
    """The worlds' Schur systems (rows, inverse masses; right-hand side and solution in scr), as both kernels below
    read them."""

    go: wp.array(dtype=int)
    n_rows: wp.array(dtype=int)
    iters: wp.array(dtype=int)
    tol: wp.array(dtype=float)
    sc: StepConstants
    rows: Rows
    scr: SchurScratch


@wp.kernel
def one_world_pcr(s: Systems):
    w = wp.tid()
    if s.go[w] != 0:
        schur_solve(0, w, s.n_rows[w], s.sc, s.rows, s.scr, s.iters[w], s.tol[w])


@wp.kernel
def lanes_pcr(s: Systems, ln: LaneScratch):
    g = wp.tid()
    gv = lanei()
    iv = lanei()
    tv = lanef()
    for j in range(LANES):
        w = g * LANES + j
        if w < s.go.shape[0]:
            gv[j] = s.go[w]
            iv[j] = s.iters[w]
            tv[j] = s.tol[w]
    n = lane_pack(g, gv, s.sc, s.rows, s.n_rows, s.scr, ln)
    lane_pcr(g, n, s.sc, gv, iv, tv, ln)
    lane_unpack(g, gv, s.sc, s.n_rows, ln, s.scr)


def _systems(nw: int, seed: int = 0) -> dict:
    """nw random Schur systems of NB bodies: group 0's worlds share their rows' bodies (the uniform
    lanes), the others' differ (a static side, another wheel), row counts 6..MAX_ROWS, some rows masked
    (pinv = 0), one world idle and one with a zero right-hand side."""
    rng = np.random.default_rng(seed)
    R = nw * MAX_ROWS
    shared = rng.integers(-1, NB, size=(MAX_ROWS, 2))
    shared[:, 0] = np.maximum(shared[:, 0], 0)
    a = np.full(R, -1, np.int32)
    b = np.full(R, -1, np.int32)
    for w in range(nw):
        loc = shared if w < LANES else np.column_stack(
            [rng.integers(0, NB, MAX_ROWS), rng.integers(-1, NB, MAX_ROWS)])
        for i in range(MAX_ROWS):
            a[w * MAX_ROWS + i] = w * NB + loc[i, 0]
            b[w * MAX_ROWS + i] = w * NB + loc[i, 1] if loc[i, 1] >= 0 and loc[i, 1] != loc[i, 0] else -1
    Ja = rng.normal(size=(R, 6)).astype(np.float32)
    Jb = rng.normal(size=(R, 6)).astype(np.float32)
    C = rng.uniform(1e-5, 1e-2, R).astype(np.float32)
    pinv = rng.uniform(0.05, 1.0, R).astype(np.float32)
    pinv[rng.random(R) < 0.1] = 0.0
    M = rng.normal(size=(nw * NB, 3, 3))
    inv_I = (0.2 * M @ M.transpose(0, 2, 1) + 0.05 * np.eye(3)).astype(np.float32)
    inv_m = rng.uniform(0.01, 1.0, nw * NB).astype(np.float32)
    rhs = rng.normal(size=R).astype(np.float32)
    n_rows = rng.integers(6, MAX_ROWS + 1, nw).astype(np.int32)
    n_rows[0] = MAX_ROWS
    go = np.ones(nw, np.int32)
    go[3] = 0  # an idle world (converged, or on the dense solve)
    rhs[5 * MAX_ROWS:6 * MAX_ROWS] = 0.0  # A z = 0 at once: x = 0
    iters = rng.choice([16, 64], nw).astype(np.int32)
    tol = rng.choice([0.0, 1e-6, 1e-3], nw).astype(np.float32)
    return dict(a=a, b=b, Ja=Ja, Jb=Jb, C=C, pinv=pinv, inv_m=inv_m, inv_I=inv_I, rhs=rhs, n_rows=n_rows,
                go=go, iters=iters, tol=tol)


def test_lane_pcr_is_the_one_world_pcr_bit_for_bit() -> None:
    """13 worlds (a full group of LANES and a partial one): every world's solution from the lanes equals
    `schur_solve`'s PCR in every bit, with uniform rows (group 0) and rows whose bodies differ across lanes,
    row counts from 6 to 24, masked rows, iteration caps 16 and 64, tolerances 0 / 1e-6 / 1e-3, an idle
    world (its x untouched) and a zero right-hand side (x = 0); the same with one scratch slot for both
    groups (the CPU's layout) as with one per group (a GPU's)."""
    nw = 13
    d = _systems(nw)
    R = nw * MAX_ROWS

    def arr(x, dtype=float):
        return wp.array(x, dtype=dtype, device="cpu")

    rows = make(Rows, a=arr(d["a"], int), b=arr(d["b"], int), Ja=arr(d["Ja"], wp.spatial_vector),
                Jb=arr(d["Jb"], wp.spatial_vector), C=arr(d["C"]), res=arr(np.zeros(R, np.float32)),
                pinv=arr(d["pinv"]), kind=arr(np.zeros(R, np.int32), int), inv_m=arr(d["inv_m"]),
                inv_I=arr(d["inv_I"], wp.mat33))
    sentinel = np.full(R, 7.0, np.float32)
    x1, x8 = arr(sentinel), arr(sentinel)

    def z(n, dtype=float):
        return wp.zeros(n, dtype=dtype, device="cpu")

    sc = StepConstants()
    sc.nbody, sc.max_rows = NB, MAX_ROWS
    scr = make(SchurScratch, rhs=arr(d["rhs"]), x=x1, r=z(R), z=z(R), p=z(R), Az=z(R), Ap=z(R),
               tmp=z(nw * NB, wp.spatial_vector), dm=0, S=z(1, wp.float64), y64=z(R, wp.float64), perm=z(R, int),
               env=z(R, int))
    given = make(Systems, go=arr(d["go"], int), n_rows=arr(d["n_rows"], int), iters=arr(d["iters"], int),
                 tol=arr(d["tol"]), sc=sc, rows=rows, scr=scr)

    def systems(x: wp.array) -> Systems:
        return repacked(given, scr=repacked(scr, x=x))
    groups = -(-nw // LANES)
    G = groups * MAX_ROWS
    ln = make(LaneScratch, slots=groups, J=z(12 * G, lanef), la=z(G, lanei), lb=z(G, lanei), uni=z(G, int),
              C=z(G, lanef), pinv=z(G, lanef), rhs=z(G, lanef), x=z(G, lanef), r=z(G, lanef), z=z(G, lanef),
              p=z(G, lanef), Az=z(G, lanef), Ap=z(G, lanef), tmp=z(6 * groups * NB, lanef), inv_m=z(groups * NB, lanef),
              inv_I=z(9 * groups * NB, lanef), S=z(1, laned), Jd=z(1, laned), Y=z(1, laned), yd=z(1, laned),
              pin=z(1, float))
    wp.launch(one_world_pcr, nw, inputs=[systems(x1)], device="cpu")
    # one scratch slot for every group (the CPU's layout: a launch's threads run in turn), then one per group
    x8_one_slot = arr(sentinel)
    ln.slots = 1
    wp.launch(lanes_pcr, groups, inputs=[systems(x8_one_slot), ln], device="cpu")
    ln.slots = groups
    wp.launch(lanes_pcr, groups, inputs=[systems(x8), ln], device="cpu")
    assert np.array_equal(x8_one_slot.numpy().view(np.uint32), x8.numpy().view(np.uint32))
    a1, a8 = x1.numpy(), x8.numpy()
    uni = ln.uni.numpy().reshape(groups, MAX_ROWS)
    assert uni[0].all(), "group 0's worlds share their rows' bodies: every row uniform"
    assert not uni[1, :d["n_rows"][8:].max()].all(), "group 1's rows differ across lanes: per-lane updates"
    assert np.all(a1[3 * MAX_ROWS:4 * MAX_ROWS] == 7.0) and np.all(a8[3 * MAX_ROWS:4 * MAX_ROWS] == 7.0)
    assert np.all(a8[5 * MAX_ROWS:5 * MAX_ROWS + d["n_rows"][5]] == 0.0)
    assert np.isfinite(a8).all() and np.abs(a8).max() > 1e-3
    same = a1.view(np.uint32) == a8.view(np.uint32)
    worst = np.abs(a1 - a8).max()
    print(f"\n[lanes] {nw} worlds: {same.sum()} of {same.size} solution entries equal in every bit "
          f"(largest difference {worst:.1e})")
    assert same.all(), f"rows {np.flatnonzero(~same)[:10]} differ (largest {worst:.1e})"


@pytest.mark.parametrize("lanes", [1, *LANE_WIDTHS])
def test_bad_lanes_are_named(lanes: int) -> None:
    SolverOptions(lanes=lanes).validate()
    for bad in (0, 2, 4, 32, 8.0):
        with pytest.raises(ValueError, match="lanes must be None"):
            SolverOptions(lanes=bad).validate()


def _roll_over_pallets(nw: int, steps: int, lanes: int) -> tuple:
    """The robot in nw worlds, three of them (1, 4, 9) driving over a pallet, speeds 0.5-1.5 m/s and turns:
    `Simulation.forward` at h = 0.1 s with the given lanes, then the backward of the chassis' final x + y.
    Returns (body_q, body_qd, step residuals, gradients)."""
    rng = np.random.default_rng(3)
    specs = [WorldSpec(pallet=(1.2, 0.0, 0.0)) if w in (1, 4, 9) else WorldSpec() for w in range(nw)]
    speed = rng.uniform(0.5, 1.5, nw)
    turn = rng.uniform(-0.4, 0.4, nw)
    sc = robot_scene(specs)
    sim = Simulation(SolverOstrich(sc.model, SolverOptions(lanes=lanes)), 0.1)
    q0, qd0, tq = rolling_inputs(sc, steps, speed, turn)
    r = sim.forward(q0, qd0, steps, tq)
    q, qd = r
    gq = np.zeros_like(q)
    gq[-1, [hd.chassis for hd in sc.handles], :2] = 1.0  # L = sum of the chassis' final x + y
    grads = r.tape.backward(gq, None)
    return q, qd, np.asarray(sim.step_residuals).copy(), grads


def test_rollouts_in_lanes_equal_a_thread_per_world() -> None:
    """The robot in 11 worlds (a group of 8 and a partial one; a partial group of 16), three of them driving
    over a pallet placed where their wheels climb it (contact sets that differ across the lanes), speeds
    0.5-1.5 m/s and turns: 25 steps at h = 0.1 s through `Simulation.forward` with lanes = 8, 16 (each lane
    width's code, `schur_lanes.lane_code`) and 1 give the same body poses and twists in every bit and the same
    Newton residuals per step; the backward of the chassis' final position, the same gradients and adjoint
    residuals."""
    nw, steps = 11, 25
    out = {lanes: _roll_over_pallets(nw, steps, lanes) for lanes in (1, *LANE_WIDTHS)}
    q1, qd1, res1, g1 = out[1]
    for width in LANE_WIDTHS:
        q8, qd8, res8, g8 = out[width]
        climbed = q8[-1, :, 2].max()
        print(f"\n[lanes] {nw} worlds x {steps} steps, lanes {width}: poses equal {np.array_equal(q1, q8)}, twists "
              f"equal {np.array_equal(qd1, qd8)}, largest |dq| {np.abs(q1 - q8).max():.1e}; highest body z "
              f"{climbed:.3f} m")
        assert climbed > 0.3, "the pallet worlds climbed (wheels on the pallet, other contact sets than flat ground)"
        assert np.array_equal(q1, q8) and np.array_equal(qd1, qd8)
        assert np.array_equal(res1, res8)
        # the backward (its preconditioner's factor in lanes, `adjoint.precond_factor`): the same gradients
        assert np.abs(g1.targets_qd).max() > 0 and np.abs(g1.body_qd0).max() > 0
        for name in ("body_q0", "body_qd0", "targets_qd"):
            assert np.array_equal(getattr(g1, name), getattr(g8, name)), name
        assert np.array_equal(g1.adjoint_residual, g8.adjoint_residual)


def test_groups_per_launch_thread_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU launch thread of the Newton iteration and the preconditioner takes THREAD_GROUPS groups of worlds
    in turn (`SolverOstrich._thread_groups`); with one group per thread (a GPU's layout) the 11-world rollout
    over pallets gives the same poses, twists, residuals and gradients in every bit, with lanes 8 (2 groups:
    one thread) and 1 (11 groups: two threads, the second partial)."""
    assert solver_ostrich.THREAD_GROUPS == 8
    for lanes in (LANES, 1):
        out = {}
        for tg in (1, 8):
            monkeypatch.setattr(solver_ostrich, "THREAD_GROUPS", tg)
            out[tg] = _roll_over_pallets(11, 12, lanes)
        (q1, qd1, r1, g1), (q8, qd8, r8, g8) = out[1], out[8]
        print(f"\n[lanes] lanes {lanes}: 1 vs 8 groups per thread, poses equal {np.array_equal(q1, q8)}, "
              f"gradients equal {np.array_equal(g1.targets_qd, g8.targets_qd)}")
        assert np.array_equal(q1, q8) and np.array_equal(qd1, qd8) and np.array_equal(r1, r8)
        assert np.abs(g1.targets_qd).max() > 0
        for name in ("body_q0", "body_qd0", "targets_qd", "adjoint_residual"):
            assert np.array_equal(getattr(g1, name), getattr(g8, name)), name


@wp.kernel
def factor_then_solve_each(want: wp.array(dtype=int), n_rows: wp.array(dtype=int), sc: StepConstants, rows: Rows,
                           scr: SchurScratch):
    # one world per thread: its dense factor, then the solve with it (the scalar path the lanes are compared with)
    w = wp.tid()
    if want[w] != 0:
        dense_factor(w, n_rows[w], sc, rows, scr)
        dense_solve(w, n_rows[w], sc, rows, scr)


@wp.kernel
def factor_solve_kept(want: wp.array(dtype=int), n_rows: wp.array(dtype=int), sc: StepConstants, rows: Rows,
                      scr: SchurScratch, ln: LaneScratch, S_lanes: wp.array(dtype=laned), kept: wp.array(dtype=int)):
    # as adjoint.precond_factor then precond_apply: the lanes' factor kept in lanes and solved there
    g = wp.tid()
    wv = lanei()
    for j in range(LANES):
        wv[j] = want[g * LANES + j]
    k = lane_dense_factor(g, wv, sc, rows, n_rows, scr, ln, S_lanes, g * scr.dm * scr.dm)
    kept[g] = k
    if k != 0:
        lane_dense_solve(g, wv, n_rows[g * LANES], sc, rows, scr, S_lanes, g * scr.dm * scr.dm, ln)
    else:
        for j in range(LANES):
            w = g * LANES + j
            if wv[j] != 0:
                dense_solve(w, n_rows[w], sc, rows, scr)


def test_lane_dense_factor_is_dense_factor_bit_for_bit() -> None:
    """The float64 factor of the lanes equals `dense_factor`'s in every bit of every world's envelope,
    with the same row order and envelopes: 16 robots after 15 steps at h = 0.1 s, worlds 0-7 on flat
    ground at different wheel speeds (rows on the same bodies: the lanes' factor), worlds 8-15 half of
    them driving onto pallets (contact sets that differ: world by world), a masked row (pinv = 0) in every world and
    one lane with two identical compliance-free rows (a fixed pivot in that lane only)."""
    rng = np.random.default_rng(5)
    nw = 16
    specs = [WorldSpec(pallet=(rng.uniform(0.5, 1.0), 0.0, 0.0)) if w >= LANES and w % 2 == 0 else WorldSpec()
             for w in range(nw)]
    sc = robot_scene(specs)
    solver = SolverOstrich(sc.model, SolverOptions(lanes=LANES))
    s0, s1 = initial_state(sc), sc.model.state()
    c = wheel_control(sc, [tuple([float(v)] * 3) for v in rng.uniform(1.5, 4.0, nw)])
    for _ in range(15):
        solver.step(s0, s1, c, None, 0.1)
        s0, s1 = s1, s0
    st, ln = solver._iteration_args(0.1)[2:]
    stc, it, rows, scr = st.sc, st.it, st.rows, st.scr
    dm, R, nb = solver._direct_max(), stc.max_rows, stc.nbody
    n = it.n_rows.numpy()
    jr = stc.jrows
    pinv, C, Ja, Jb = rows.pinv.numpy(), rows.C.numpy(), rows.Ja.numpy(), rows.Jb.numpy()
    a_, b_ = rows.a.numpy(), rows.b.numpy()
    for w in range(nw):
        pinv[w * R + jr + 1] = 0.0  # the first contact's first friction row, masked
    w2 = 2  # lane 2: row jr + 5 (a friction row of the second contact, same bodies) copies row jr + 4, no compliance
    for k in (jr + 4, jr + 5):
        C[w2 * R + k] = 0.0
    Ja[w2 * R + jr + 5], Jb[w2 * R + jr + 5] = Ja[w2 * R + jr + 4], Jb[w2 * R + jr + 4]
    assert a_[w2 * R + jr + 5] == a_[w2 * R + jr + 4] and b_[w2 * R + jr + 5] == b_[w2 * R + jr + 4]
    rows.pinv.assign(pinv)
    rows.C.assign(C)
    rows.Ja.assign(Ja)
    rows.Jb.assign(Jb)
    want = wp.array((n <= dm).astype(np.int32), dtype=int, device="cpu")
    assert want.numpy().all() and n.min() > jr + 5

    rhs = wp.array(rng.normal(size=nw * R).astype(np.float32), dtype=float, device="cpu")
    x1, x8 = (wp.array(np.full(nw * R, 7.0, np.float32), dtype=float, device="cpu") for _ in range(2))

    def scratch(x):
        def z(k, dtype=float):
            return wp.zeros(k, dtype=dtype, device="cpu")
        return repacked(scr, rhs=rhs, x=x, S=z(nw * dm * dm, wp.float64), perm=z(nw * R, int), env=z(nw * R, int))

    # world by world (`dense_factor`, `dense_solve`) and in lanes as the Krylov adjoint's preconditioner runs
    # them (`lane_dense_factor` keeping a group's factor in lanes in the group's region of S, seen as LANES-wide
    # vectors, or each world's own there; then `lane_dense_solve` or `dense_solve`)
    s_one, s_lanes = scratch(x1), scratch(x8)
    assert s_one.dm == dm
    S_lanes = wp.array(ptr=s_lanes.S.ptr, dtype=laned, shape=(nw // LANES * dm * dm,), device="cpu")
    kept = wp.zeros(nw // LANES, dtype=int, device="cpu")
    wp.launch(factor_then_solve_each, nw, inputs=[want, it.n_rows, stc, rows, s_one], device="cpu")
    wp.launch(factor_solve_kept, nw // LANES, inputs=[want, it.n_rows, stc, rows, s_lanes, ln, S_lanes, kept],
              device="cpu")
    assert kept.numpy().tolist() == [1, 0], "group 0 factored and solved in lanes, group 1 world by world"
    S1 = s_one.S.numpy().reshape(nw, dm, dm)
    S8 = s_lanes.S.numpy().reshape(nw, dm, dm).copy()  # each world's own factor (group 1)
    S8[:LANES] = np.moveaxis(s_lanes.S.numpy()[:LANES * dm * dm].reshape(dm, dm, LANES), 2, 0)  # group 0's lanes
    env1, env8 = s_one.env.numpy().reshape(nw, R), s_lanes.env.numpy().reshape(nw, R)
    assert np.array_equal(s_one.perm.numpy(), s_lanes.perm.numpy()) and np.array_equal(env1, env8)
    entries = same = 0
    fixed = []
    for w in range(nw):
        for p in range(n[w]):
            q = np.arange(env1[w, p], p + 1)
            entries += q.size
            same += int(np.sum(S1[w, p, q].view(np.uint64) == S8[w, p, q].view(np.uint64)))
            if S1[w, p, p] == -1.0:
                fixed.append(w)
    perm = s_one.perm.numpy().reshape(nw, R)

    def structure(w):  # each factor row's bodies within its world and whether it is masked
        r = w * R + perm[w, :n[w]]
        return [tuple(x) for x in np.column_stack([np.where(a_[r] >= 0, a_[r] - w * nb, -1),
                                                   np.where(b_[r] >= 0, b_[r] - w * nb, -1), pinv[r] == 0])]
    shared = [all(structure(w) == structure(g * LANES) for w in range(g * LANES, (g + 1) * LANES))
              for g in range(nw // LANES)]
    assert shared == [True, False], "group 0 takes the lanes' factor, group 1 the world-by-world one"
    rows_of = [n[w] for w in range(nw)]
    print(f"\n[lanes] dense factor of {nw} worlds ({min(rows_of)}-{max(rows_of)} rows): {same} of {entries} "
          f"envelope entries equal in every bit; fixed pivots in worlds {sorted(set(fixed))}")
    assert set(fixed) == {w2}, "only lane 2's duplicated rows leave a pivot fixed at 0"
    assert same == entries
    # the solves (`lane_dense_solve` by the kept factor) against each world's `dense_solve`: x = A^-1 rhs equal
    # in every bit, masked rows and the fixed pivot's unknown 0 as there
    live = np.concatenate([np.arange(w * R, w * R + n[w]) for w in range(nw)])
    X1, X8 = x1.numpy()[live], x8.numpy()[live]
    solved_same = int(np.sum(X1.view(np.uint32) == X8.view(np.uint32)))
    zeros = int(np.sum(X1 == 0.0))
    print(f"[lanes] dense solves: {solved_same} of {live.size} unknowns equal in every bit ({zeros} zero: masked "
          "rows, the fixed pivot)")
    assert np.all(np.isfinite(X1)) and zeros >= nw + 1
    assert solved_same == live.size
    # and the float64 solutions before their rounding to float32 (group 0's: world w's in scr.y64, lane w's
    # in the lanes' work vector, both in factor order)
    y1, y8 = s_one.y64.numpy(), ln.yd.numpy()
    f64_same = sum(int(np.sum(y1[w * R:w * R + n[w]].view(np.uint64) == y8[:n[w], w].view(np.uint64)))
                   for w in range(LANES))
    print(f"[lanes] their float64 solutions: {f64_same} of {int(n[:LANES].sum())} equal in every bit")
    assert f64_same == int(n[:LANES].sum())


def test_lanes_by_default_from_eight_worlds_on_a_cpu() -> None:
    """SolverOptions.lanes = None: LANES worlds per thread on a CPU when the model has at least LANES
    worlds (a single world would leave 7 lanes idle: 1 there), 16 from LANES_WIDE_FROM (32) worlds, whatever
    was asked otherwise."""
    one, eight = robot_scene(1), robot_scene(LANES)
    assert SolverOstrich(one.model, SolverOptions())._lanes() == 1
    assert SolverOstrich(eight.model, SolverOptions())._lanes() == LANES
    below, wide = robot_scene(LANES_WIDE_FROM - 1), robot_scene(LANES_WIDE_FROM)
    assert SolverOstrich(below.model, SolverOptions())._lanes() == LANES
    assert SolverOstrich(wide.model, SolverOptions())._lanes() == LANE_WIDTHS[-1] == 16
    assert SolverOstrich(wide.model, SolverOptions(lanes=LANES))._lanes() == LANES
    assert SolverOstrich(eight.model, SolverOptions(lanes=1))._lanes() == 1
    assert SolverOstrich(one.model, SolverOptions(lanes=LANES))._lanes() == LANES
