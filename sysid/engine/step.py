"""Non-smooth Newton step (eq. 9-13): one fused kernel launch for all of a step's Newton iterations, a thread
per world (or per group of worlds in vector lanes on a CPU).

Per iteration a world's thread: integrates q+ from the current u (G frozen at q-), builds every
constraint row at q+ (joints, servos, Fischer-Burmeister normals, friction with the compliance
weight W frozen for this iteration), evaluates the residual and tracks the best iterate, solves
the Schur system (J M~^-1 J^T + C) dlam = J M~^-1 r_dyn - r_con matrix-free by PCR with a Jacobi
preconditioner, back-substitutes du = M~^-1 (J^T dlam - r_dyn) and applies the friction
safeguards. Launch overhead, not arithmetic, dominates small scenes on the CPU, hence the fusion; a
world's (or a group's) thread runs the iterations back to back, so its rows, factor and iterate stay in
the cache from one iteration to the next (a launch per iteration would sweep every world's data through
the cache in between).

Set-up kernels once per step (prepare_bodies, prepare_joints, warm_start; the contacts' are in
`contact.py`), then newton_iteration (iterations 0..newton_iters) and write_output at the end. A world's
iteration is in stages (`iteration.py`: newton_pre, newton_rhs, newton_post) around its Schur solve, with the
coupled pins' solves (`pins.py`).
"""

# No `from __future__ import annotations`: the iteration kernel is a closure per lane width (`iteration_kernel`),
# and Warp reads its annotations as objects
import warp as wp

from .iteration import newton_post, newton_pre, newton_rhs
from .kinematics import (
    gyroscopic_impulse,
    integrate_com,
    integrate_quat,
    inv_mass_apply,
    sv_ang,
)
from .pins import pins_finish, pins_load, pins_rhs, pins_take
from .schur import dense_factor, schur_solve
from .schur_lanes import lane_code
from .types import (
    LANE_WIDTHS,
    LANES,
    Contacts,
    ModelArrays,
    NewtonIterate,
    NewtonStep,
    StepConstants,
    StepData,
    lane_module,
)

# Fixed-count loops of more than MAX_UNROLL iterations (those over a group's lanes, 8 or 16) stay loops in the
# generated C++ rather than being unrolled by Warp: the module's source is half the size and compiles faster, with
# the same operations in the same order (the C++ compiler still unrolls and vectorises them where it pays)
MAX_UNROLL = 4
wp.set_module_options({"enable_backward": False, "max_unroll": MAX_UNROLL})


@wp.kernel
def prepare_bodies(
    # Model:
    model: ModelArrays,
    body_inertia_unit: wp.array[wp.mat33],
    gravity: wp.vec3,
    h: float,
    gyroscopic: int,
    # Data in:
    body_q_in: wp.array[wp.transform],
    body_qd_in: wp.array[wp.spatial_vector],
    # Data out (the q- part of data; the targets are prepare_joints'):
    data: StepData,
    u_out: wp.array[wp.spatial_vector],
):
    b = wp.tid()
    T = body_q_in[b]
    q = wp.transform_get_rotation(T)
    x = wp.transform_point(T, model.body_com[b])
    u = body_qd_in[b]
    m = model.body_mass[b]
    R = wp.quat_to_matrix(q)
    I = R * (m * body_inertia_unit[b]) * wp.transpose(R)
    inv_m = float(0.0)
    inv_I = wp.mat33(0.0)
    if m > 0.0:
        inv_m = 1.0 / m
        inv_I = wp.inverse(I)
    w = sv_ang(u)
    tau = wp.vec3(0.0)
    if gyroscopic != 0:
        tau = gyroscopic_impulse(w, I, h) / h
    f = wp.spatial_vector(h * m * gravity, h * tau)
    data.x_prev[b] = x
    data.q_prev[b] = q
    data.u_prev[b] = u
    data.inv_m[b] = inv_m
    data.I_w[b] = I
    data.inv_I[b] = inv_I
    data.f_imp[b] = f
    u_out[b] = u + inv_mass_apply(inv_m, inv_I, f)


@wp.kernel
def prepare_joints(
    # Model:
    joint_qd_start: wp.array[int],
    joint_target_q_start: wp.array[int],
    # Data in:
    joint_target_q: wp.array[float],
    joint_target_qd: wp.array[float],
    has_target_q: int,
    has_target_qd: int,
    # Data out:
    jt_q_out: wp.array[float],
    jt_qd_out: wp.array[float],
):
    j = wp.tid()
    d = joint_qd_start[j]
    if has_target_qd != 0:
        jt_qd_out[j] = joint_target_qd[d]
    if has_target_q != 0:
        jt_q_out[j] = joint_target_q[joint_target_q_start[j]]


@wp.kernel
def warm_start(
    sc: StepConstants,
    use_warm: int,
    # Data in (previous step):
    prev_count: wp.array[int],
    prev_shape0: wp.array[int],
    prev_shape1: wp.array[int],
    prev_normal: wp.array[wp.vec3],
    prev_lam: wp.array[float],
    # Data in (this step):
    ct: Contacts,
    ct_normal_world: wp.array[wp.vec3],
    # Data out:
    lam_out: wp.array[float],
):
    """Initial multipliers from the previous step: joint rows one to one, contacts matched by
    shape pair and normal. In steady driving this starts Newton next to the solution, so the
    friction weights W are right from the first iteration."""
    w = wp.tid()
    rbase = w * sc.max_rows
    for i in range(sc.max_rows):
        lam_out[rbase + i] = 0.0
    if use_warm == 0:
        return
    for i in range(sc.jrows):
        lam_out[rbase + i] = prev_lam[rbase + i]
    cbase = w * sc.max_contacts
    for ci in range(ct.count[w]):
        k = cbase + ci
        for pj in range(prev_count[w]):
            p = cbase + pj
            if prev_shape0[p] == ct.shape0[k] and prev_shape1[p] == ct.shape1[k]:
                if wp.dot(prev_normal[p], ct_normal_world[k]) > 0.9:
                    rn = rbase + sc.jrows + 3 * ci
                    rp = rbase + sc.jrows + 3 * pj
                    lam_out[rn] = prev_lam[rp]
                    lam_out[rn + 1] = prev_lam[rp + 1]
                    lam_out[rn + 2] = prev_lam[rp + 2]
                    break


def iteration_kernel(width: int):
    """`newton_iteration` (and its `lane_coupled_pins`) for one lane width (one of LANE_WIDTHS), made once per
    width as Warp closures over the width's lane code (`schur_lanes.lane_code`); every width is made when this
    module loads (a Warp module whose kernels changed after a launch would be rebuilt under recorded launches),
    the widths other than LANES each in a module of their own."""
    if width in _ITERATION:
        return _ITERATION[width]
    LANES = width
    lc = lane_code(width)  # the width's lane types and functions
    mod = lane_module(__name__, width)  # a width other than LANES: its kernel and function in a module of their own
    if mod is not None:
        wp.set_module_options({"max_unroll": MAX_UNROLL}, module=mod)

    @wp.func(name=f"lane_coupled_pins_{width}", module=mod)
    def lane_coupled_pins(
        g: int,
        cp: lc.lanei,
        maxp: int,
        dirv: lc.lanei,
        lf: int,
        itv: lc.lanei,
        tolv: lc.lanef,
        npv: lc.lanei,
        st: NewtonStep,
        ln: lc.LaneScratch,
    ):
        """`coupled_pins` of group g's worlds in the lanes where cp != 0 (npv[j] pinned contacts, at most maxp),
        solve by solve: each solve s of every world that has one, all of them at once (`lane_solves`: the PCR
        worlds' in float32 lanes, the direct worlds' by the lanes' factor when lf = 1, else their own); each
        world's b and M in ln.pin. Every world gets `coupled_pins`' operations in its order, the same result bit
        for bit."""
        pb = (g % ln.slots) * LANES * 20
        for s in range(maxp + 1):
            act = lc.lanei()
            pcr = lc.lanei()
            dv = lc.lanei()
            for j in range(LANES):
                if cp[j] != 0 and s <= npv[j]:
                    w = g * LANES + j
                    act[j] = 1
                    pins_rhs(s, w, st.it.n_rows[w], st)
                    if dirv[j] != 0:
                        dv[j] = 1
                    else:
                        pcr[j] = 1
            lc.lane_solves(g, pcr, dv, lf, itv, tolv, st.sc, st.rows, st.it.n_rows, st.scr, ln)
            for j in range(LANES):
                if act[j] != 0:
                    w = g * LANES + j
                    k = pb + j * 20
                    b = wp.vec4(0.0)
                    M = wp.identity(n=4, dtype=float)
                    if s > 0:
                        b, M = pins_load(ln.pin, k)
                    b, M = pins_take(s, w * st.sc.max_rows, w, npv[j], b, M, st.sc, st.model, st.ct, st.at, st.it,
                                     st.scr.x)
                    for i in range(4):
                        ln.pin[k + i] = b[i]
                        for c in range(4):
                            ln.pin[k + 4 + 4 * i + c] = M[i, c]
        for j in range(LANES):
            if cp[j] != 0:
                w = g * LANES + j
                b, M = pins_load(ln.pin, pb + j * 20)
                pins_finish(w, npv[j], b, M, st.sc, st.ct, st.it)
        return 0


    @wp.kernel(module=mod)
    def newton_iteration(
        k_first: int,
        k_last: int,
        st: NewtonStep,
        ln: lc.LaneScratch,
    ):
        """Newton iterations k_first..k_last of every world (eq. 9-13), each but the last stepping the iterate, the last
        only evaluating it; a group's worlds run all of them one after another (their rows, factors and iterate stay
        in the cache from one iteration to the next) and stop once every one is done. With
        opt.lanes = 1 a group per world; with LANES, a group per LANES worlds whose dense factors and PCR
        solves run in vector lanes (`schur_lanes`' `lane_dense_factor`, `lane_pcr`: each lane's result is the
        one-world code's bit for bit); opt.thread_groups groups per thread. Per world: newton_pre, the factor,
        newton_rhs, the solve, newton_post."""
        # opt.thread_groups groups of opt.lanes worlds per thread, one after another: on a CPU a launch's threads run
        # in turn and each first copies the argument groups (KiBs), so fewer threads cost less
        for gi in range(st.opt.thread_groups):  # a runtime bound: not unrolled
            g = wp.tid() * st.opt.thread_groups + gi
            if g * st.opt.lanes >= st.it.done.shape[0]:
                break
            nw = st.it.done.shape[0]
            for k in range(k_first, k_last + 1):  # a runtime bound: not unrolled
                do_step = int(0)
                if k < k_last:
                    do_step = 1
                # a group whose worlds are all done (converged, stalled, diverged) is finished for this step
                live = int(0)
                for j in range(st.opt.lanes):
                    w = g * st.opt.lanes + j
                    if w < nw and st.it.done[w] == 0:
                        live = 1
                if live == 0:
                    break
                dm = st.scr.dm
                per = st.opt.lanes  # worlds of this group: 1, or LANES in vector lanes; each stage below appears once
                gov = lc.lanei()
                pcrv = lc.lanei()
                dirv = lc.lanei()
                itv = lc.lanei()
                tolv = lc.lanef()
                npv = lc.lanei()
                btv = lc.lanei()
                pwv = lc.lanei()
                npcr = int(0)
                ndir = int(0)
                for j in range(per):  # a runtime bound: not unrolled
                    w = g * per + j
                    # a finished world's newton_pre returns at once: not called (a call copies its argument
                    # groups, KiBs)
                    if w < nw and st.it.done[w] == 0:
                        go, direct, n_pcr, t_pcr, npin, bt, pw = newton_pre(k, do_step, w, st)
                        gov[j] = go
                        dirv[j] = direct
                        itv[j] = n_pcr
                        tolv[j] = t_pcr
                        npv[j] = npin
                        btv[j] = bt
                        pwv[j] = pw
                        if go != 0 and direct == 0:
                            pcrv[j] = 1
                            npcr += 1
                        ndir += direct
                # a lanes' factor stays in the lanes' slot (lf = 1) and its worlds are solved there
                # (`lane_solves`), their coupled pins' solves too
                lf = int(0)
                pins = int(0)
                if per > 1:
                    if ndir > 0:
                        lf = lc.lane_dense_factor(g, dirv, st.sc, st.rows, st.it.n_rows, st.scr, ln, ln.S,
                                               (g % ln.slots) * dm * dm)
                    # the coupled pins' solves (pin_coupled), solve by solve for the group's worlds in lanes
                    cpv = lc.lanei()
                    maxp = int(0)
                    for j in range(per):
                        if gov[j] != 0 and npv[j] > 0 and npv[j] <= 4 and st.opt.pin_coupled != 0:
                            cpv[j] = 1
                            maxp = wp.max(maxp, npv[j])
                    if maxp > 0:
                        lane_coupled_pins(g, cpv, maxp, dirv, lf, itv, tolv, npv, st, ln)
                    pins = 1
                elif dirv[0] != 0:
                    dense_factor(g, st.it.n_rows[g], st.sc, st.rows, st.scr)
                for j in range(per):
                    if gov[j] != 0:
                        newton_rhs(g * per + j, dirv[j], itv[j], tolv[j], npv[j], pins, st)
                if per > 1:
                    lc.lane_solves(g, pcrv, dirv, lf, itv, tolv, st.sc, st.rows, st.it.n_rows, st.scr, ln)
                elif npcr > 0 or dirv[0] != 0:
                    schur_solve(dirv[0], g, st.it.n_rows[g], st.sc, st.rows, st.scr, itv[0], tolv[0])
                for j in range(per):
                    if gov[j] != 0:
                        newton_post(g * per + j, npv[j], btv[j], pwv[j], st)

    _ITERATION[width] = newton_iteration
    return newton_iteration


_ITERATION: dict[int, wp.Kernel] = {}
for _w in LANE_WIDTHS:
    iteration_kernel(_w)
newton_iteration = iteration_kernel(LANES)


@wp.kernel
def write_output(
    h: float,
    nbody: int,
    # Model:
    model: ModelArrays,
    # Data in:
    data: StepData,
    it: NewtonIterate,
    # Data out:
    u_sol_out: wp.array[wp.spatial_vector],
    body_q_out: wp.array[wp.transform],
    body_qd_out: wp.array[wp.spatial_vector],
):
    b = wp.tid()
    w = b / nbody
    uu = data.u_prev[b]
    if it.best_k[w] >= 0:
        uu = it.u_best[b]
    x = integrate_com(data.x_prev[b], uu, h)
    q = integrate_quat(data.q_prev[b], uu, h)
    u_sol_out[b] = uu
    body_q_out[b] = wp.transform(x - wp.quat_rotate(q, model.body_com[b]), q)
    body_qd_out[b] = uu
