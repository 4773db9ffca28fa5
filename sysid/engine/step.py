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
`contact.py`), then newton_iteration (iterations 0..newton_iters) and write_output at the end.
"""

# No `from __future__ import annotations`: the iteration kernel is a closure per lane width (`iteration_kernel`),
# and Warp reads its annotations as objects
import warp as wp

from .constraints import row_dot
from .contact import shares_pair
from .friction import cone_mu, cone_projection, contact_slip, project_cone, slide_weight
from .kinematics import (
    body_vel,
    eff_inv_mass,
    gyroscopic_impulse,
    integrate_com,
    integrate_quat,
    inv_mass_apply,
    mass_apply,
    sv_ang,
)
from .rows import build_rows
from .schur import (
    apply_A,
    apply_JT,
    dense_factor,
    dense_solve,
    pcr_solve,
    schur_solve,
)
from .schur_lanes import lane_code
from .types import (
    LANE_WIDTHS,
    LANES,
    Contacts,
    FrictionSafeguard,
    ModelArrays,
    NewtonIterate,
    NewtonOptions,
    RowKind,
    Rows,
    SchurScratch,
    StepCode,
    StepConstants,
    StepData,
    lane_module,
    lane_types,
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


@wp.func
def nth_pinned(w: int, j: int, sc: StepConstants, ct: Contacts, fdir: wp.array[wp.vec4]):
    """Slot (within world w) of the j-th contact whose sliding rows are pinned."""
    n = int(0)
    for ci in range(ct.count[w]):
        if fdir[w * sc.max_contacts + ci][2] != 0.0:
            if n == j:
                return ci
            n += 1
    return -1


@wp.func
def pins_rhs(
    s: int,
    nrows: int,
    rbase: int,
    bbase: int,
    w: int,
    sc: StepConstants,
    data: StepData,
    ct: Contacts,
    it: NewtonIterate,
    rows: Rows,
    scr: SchurScratch,
):
    """`coupled_pins`' right-hand side of its solve s into it.rhs: s = 0 the base (every pinned step 0),
    s >= 1 the unit response of the (s-1)-th pinned contact, -A e."""
    if s == 0:
        for i in range(nrows):
            r = rbase + i
            Jy = row_dot(rows.Ja[r], body_vel(it.ydyn, rows.a[r]), rows.Jb[r], body_vel(it.ydyn, rows.b[r]))
            it.rhs[r] = Jy - rows.res[r]
        return 0
    cj = nth_pinned(w, s - 1, sc, ct, it.fdir)
    for i in range(nrows):
        scr.z[rbase + i] = 0.0
    scr.z[rbase + sc.jrows + 3 * cj + 1] = 1.0
    apply_A(nrows, rbase, bbase, sc.nbody, rows, data.inv_m, data.inv_I, scr.z, scr.tmp, scr.Az)
    for i in range(nrows):
        it.rhs[rbase + i] = -scr.Az[rbase + i]
    return 0


@wp.func
def pins_take(
    s: int,
    rbase: int,
    w: int,
    npin: int,
    b: wp.vec4,
    M: wp.mat44,
    sc: StepConstants,
    model: ModelArrays,
    ct: Contacts,
    it: NewtonIterate,
):
    """`coupled_pins`' use of its solve s (in it.dl): s = 0 the pinned contacts' landing errors b, s >= 1
    column s - 1 of M = I - Z. Returns (b, M)."""
    if s == 0:
        for i in range(npin):
            ci = nth_pinned(w, i, sc, ct, it.fdir)
            kk = w * sc.max_contacts + ci
            rn = rbase + sc.jrows + 3 * ci
            fd = it.fdir[kk]
            m1, m2 = cone_mu(kk, model, ct, it.q)
            lpar = fd[0] * it.lam[rn + 1] / m1 + fd[1] * it.lam[rn + 2] / m2
            b[i] = it.lam[rn] + it.dl[rn] - lpar
        return b, M
    for i in range(npin):
        ci = nth_pinned(w, i, sc, ct, it.fdir)
        M[i, s - 1] = M[i, s - 1] - it.dl[rbase + sc.jrows + 3 * ci]
    return b, M


@wp.func
def pins_finish(w: int, npin: int, b: wp.vec4, M: wp.mat44, sc: StepConstants, ct: Contacts, it: NewtonIterate):
    """`coupled_pins`' 4x4 solve M delta = b, the pinned steps delta to fdir[.][3] (kept as they were when M
    is near singular)."""
    det = wp.determinant(M)
    if wp.abs(det) < 1.0e-6:
        return 0
    delta = wp.inverse(M) * b
    for i in range(npin):
        ci = nth_pinned(w, i, sc, ct, it.fdir)
        kk = w * sc.max_contacts + ci
        fd = it.fdir[kk]
        it.fdir[kk] = wp.vec4(fd[0], fd[1], 1.0, delta[i])
    return 0


@wp.func
def coupled_pins(
    nrows: int,
    rbase: int,
    bbase: int,
    w: int,
    n_pcr: int,
    t_pcr: float,
    direct: int,
    sbase: int,
    dm: int,
    npin: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    ct: Contacts,
    it: NewtonIterate,
    rows: Rows,
    scr: SchurScratch,
):
    """pin_coupled: the pinned magnitudes of up to four sliding contacts that make the step land on the cone,
    l~_par + dl~_par = lam_n + dlam_n, instead of lam_n lagged one iteration. The Schur solution is affine
    in the pinned steps delta (dlam = dlam_0 + Z delta), so npin + 1 solves give dlam_n at the pinned
    contacts as a function of delta and a 4x4 solve gives delta; written to fdir[.][3] for the final solve.
    One world's solves in turn; `lane_coupled_pins` runs the same for LANES worlds, solve by solve."""
    b = wp.vec4(0.0)
    M = wp.identity(n=4, dtype=float)
    for s in range(npin + 1):
        pins_rhs(s, nrows, rbase, bbase, w, sc, data, ct, it, rows, scr)
        schur_solve(direct, nrows, rbase, bbase, sc.nbody, n_pcr, rows, data.inv_m, data.inv_I, it.rhs, it.dl, scr,
                    t_pcr, sbase, dm)
        b, M = pins_take(s, rbase, w, npin, b, M, sc, model, ct, it)
    pins_finish(w, npin, b, M, sc, ct, it)
    return 0


@wp.func
def pins_load(pin: wp.array[float], k: int):
    """A world's coupled-pin state (b, M) as `lane_coupled_pins` keeps it at pin[k:k + 20]."""
    b = wp.vec4(0.0)
    M = wp.mat44(0.0)
    for i in range(4):
        b[i] = pin[k + i]
        for c in range(4):
            M[i, c] = pin[k + 4 + 4 * i + c]
    return b, M


@wp.func
def dynamics_residual_sq(y: wp.spatial_vector, m: float, I: wp.mat33, inv_m: float, energy: int):
    """Squared norm of one body's dynamics residual y = M~^-1 r_dyn (SolverOptions.residual_norm):
    energy != 0: the kinetic-energy metric per unit mass |y_v|^2 + y_w . (I / m) y_w [(m/s)^2], an
    angular error counted at the body's radius of gyration; else |y_v|^2 + |y_w|^2 (rad/s as m/s)."""
    if energy != 0 and inv_m > 0.0:
        return wp.dot(y, mass_apply(m, I, y)) * inv_m
    return wp.dot(y, y)


@wp.func(inline=True)  # one call site per world and iteration: a call would copy every argument group (KiBs)
def newton_pre(
    k: int,
    do_step: int,
    w: int,
    sc: StepConstants,
    opt: NewtonOptions,
    # Model:
    model: ModelArrays,
    # Data in:
    data: StepData,
    ct: Contacts,
    # Data in/out:
    it: NewtonIterate,
    # Scratch:
    rows: Rows,
    scr: SchurScratch,
):
    """World w's Newton iteration up to its Schur solve: the iterate's rows, residual and convergence test,
    then the safeguards' rows (eq. 9-11). Returns (go: 1 when the world solves the Schur system next,
    direct (the world's dense factor is wanted), the PCR's iteration cap and tolerance, npin, backtrack,
    pin_wheels), what `newton_rhs`, the solve and `newton_post` read."""
    if it.done[w] != 0:
        return 0, 0, 0, 0.0, 0, 0, 0
    bbase = w * sc.nbody
    rbase = w * sc.max_rows
    # -- kinematics: q+ = q- + h G(q-) u  (eq. 1, 9)
    for i in range(sc.nbody):
        b = bbase + i
        it.x[b] = integrate_com(data.x_prev[b], it.u[b], sc.h)
        it.q[b] = integrate_quat(data.q_prev[b], it.u[b], sc.h)
    # -- constraint rows at q+ (eq. 3, 4, 7, 8)
    nrows = build_rows(w, sc, model, data, ct, it.x, it.q, it.u, it.lam, rows)
    it.n_rows[w] = nrows
    # -- dynamics residual (eq. 10), measured as a velocity: y = M~^-1 r_dyn
    apply_JT(nrows, rbase, bbase, sc.nbody, rows, it.lam, scr.tmp)
    rdn = float(0.0)
    for i in range(sc.nbody):
        b = bbase + i
        y = wp.spatial_vector()
        if data.inv_m[b] > 0.0:
            rd = mass_apply(model.body_mass[b], data.I_w[b], it.u[b] - data.u_prev[b]) - data.f_imp[b] - scr.tmp[b]
            y = inv_mass_apply(data.inv_m[b], data.inv_I[b], rd)
        it.ydyn[b] = y
        rdn += dynamics_residual_sq(y, model.body_mass[b], data.I_w[b], data.inv_m[b], opt.energy_norm)
    # friction rows are weighted by d / (d + W): a free (W -> inf) row measures its impulse, a
    # sticking one (W -> 0) its slip, so separated contacts do not dominate the norm
    rcn = float(0.0)
    for i in range(nrows):
        r = rbase + i
        wt = float(1.0)
        if rows.kind[r] == RowKind.FRICTION or rows.kind[r] == RowKind.SERVO_LIMITED:
            # a saturated servo's row is its impulse error times its large slope: measure it as a velocity
            wt = 1.0 - rows.C[r] * rows.pinv[r]
        rcn += wt * wt * rows.res[r] * rows.res[r]
    norm = wp.sqrt(rdn + rcn)
    if not (norm < 1.0e30):
        # non-finite or exploding iterate: stop here, keep the best admissible one
        it.status[w] = StepCode.DIVERGED
        it.done[w] = 1
        return 0, 0, 0, 0.0, 0, 0, 0
    it.iters[w] = k
    it.res_trace[w * opt.trace_stride + k] = norm
    if k >= opt.k_min and norm < it.best_norm[w]:
        it.best_norm[w] = norm
        it.best_k[w] = k
        it.res_dyn[w] = wp.sqrt(rdn)
        it.res_con[w] = wp.sqrt(rcn)
        for i in range(sc.nbody):
            it.u_best[bbase + i] = it.u[bbase + i]
        for i in range(nrows):
            it.lam_best[rbase + i] = it.lam[rbase + i]
    if k >= opt.k_min and norm < opt.tol:
        it.status[w] = StepCode.CONVERGED
        it.done[w] = 1
        return 0, 0, 0, 0.0, 0, 0, 0
    if k >= opt.k_min and k >= opt.stall_iters and it.best_norm[w] < opt.stall_tol:
        # at the residual's float32 floor: the last stall_iters iterates did not halve the smallest
        # residual before them, so more iterations only move the iterate within that floor
        before = float(1.0e30)
        for j in range(k - opt.stall_iters + 1):
            before = wp.min(before, it.res_trace[w * opt.trace_stride + j])
        if it.best_norm[w] > 0.5 * before:
            it.status[w] = StepCode.STALLED
            it.done[w] = 1
            return 0, 0, 0, 0.0, 0, 0, 0
    if do_step == 0:
        it.status[w] = StepCode.MAX_ITER
        return 0, 0, 0, 0.0, 0, 0, 0
    # worlds with a redundant contact set (friction_safeguard="newton") take the semismooth rows, PCR to a
    # tolerance and, from iteration ls_from on, backtracking
    nsemi = int(0)
    if opt.safeguard == FrictionSafeguard.NEWTON:
        for ci in range(ct.count[w]):
            nsemi += shares_pair(w, ci, sc.max_contacts, ct.count, ct.shape0, ct.shape1, ct.n)
    # pin_wheels_from: from that iteration on single exact-Coulomb contacts (wheels) may take the pinned
    # sliding rows too; their worlds then solve the Schur system to pcr_tol (no backtracking) and project
    # the update of those contacts onto the cone widened by cone_slack, as for redundant sets
    pin_wheels = int(0)
    if opt.safeguard == FrictionSafeguard.NEWTON and opt.pin_from > 0 and k >= opt.pin_from:
        for ci in range(ct.count[w]):
            vs_c, vs_lat_c = contact_slip(w * sc.max_contacts + ci, model, ct)
            if vs_c <= 0.0:
                pin_wheels = 1
    backtrack = nsemi > 0 and k >= opt.ls_from
    if backtrack:
        # backtracking on the residual norm: an iterate that does not lower the last accepted one's
        # norm is replaced by the point halfway back along the last step (down to ls_min of it)
        a = it.ls_alpha[w]
        if k > opt.ls_from and not (norm < it.ls_ref[w]) and 0.5 * a >= opt.ls_min:
            a = 0.5 * a
            it.ls_alpha[w] = a
            for i in range(sc.nbody):
                it.u[bbase + i] = it.u_ls[bbase + i] + a * it.du_ls[bbase + i]
            for i in range(nrows):
                it.lam[rbase + i] = it.lam_ls[rbase + i] + a * it.dl_ls[rbase + i]
            return 0, 0, 0, 0.0, 0, 0, 0
        it.ls_ref[w] = norm
        it.ls_alpha[w] = 1.0
        for i in range(sc.nbody):
            it.u_ls[bbase + i] = it.u[bbase + i]
        for i in range(nrows):
            it.lam_ls[rbase + i] = it.lam[rbase + i]
    # friction_safeguard="newton": contacts that share their shape pair with another contact (a box's
    # corners: a redundant set whose friction split the FB weight leaves to 2-cycles) take the
    # semismooth Alart-Curnier rows below; single contacts (wheels) keep the active-set weight
    mode = opt.safeguard
    if mode == FrictionSafeguard.ACTIVE or mode == FrictionSafeguard.NEWTON:
        # active-set W: a contact whose z~ = l~ - rho v~ leaves the cone slides, and gets the sliding
        # weight W~ = |v~| / lam_n (b = 0) whatever its impulse; redundant contacts sharing a
        # Jacobian then split the friction in proportion to lam_n instead of trading it back and
        # forth (the FB weight is tiny on a contact inside the cone). Sticking contacts keep eq. 7's W.
        for ci in range(ct.count[w]):
            kk = w * sc.max_contacts + ci
            rn = rbase + sc.jrows + 3 * ci
            d1 = 1.0 / rows.pinv[rn + 1] - rows.C[rn + 1]
            d2 = 1.0 / rows.pinv[rn + 2] - rows.C[rn + 2]
            ln = it.lam[rn]
            # regularised contacts (slip speed > 0) already carry their smooth weight
            vs_k, vs_lat_k = contact_slip(kk, model, ct)
            semi = int(0)
            if mode == FrictionSafeguard.NEWTON:
                semi = shares_pair(w, ci, sc.max_contacts, ct.count, ct.shape0, ct.shape1, ct.n)
            if ln > 0.0 and d1 > 1.0e-9 and vs_k <= 0.0 and semi == 0:
                v1 = rows.res[rn + 1] - rows.C[rn + 1] * it.lam[rn + 1]
                v2 = rows.res[rn + 2] - rows.C[rn + 2] * it.lam[rn + 2]
                sl, W1, W2 = slide_weight(kk, ln, it.lam[rn + 1], it.lam[rn + 2], v1, v2, d1, d2, model, ct, it.q)
                if sl != 0:
                    rows.C[rn + 1] = W1
                    rows.C[rn + 2] = W2
                    rows.res[rn + 1] = v1 + W1 * it.lam[rn + 1]
                    rows.res[rn + 2] = v2 + W2 * it.lam[rn + 2]
                    rows.pinv[rn + 1] = 1.0 / wp.max(d1 + W1, 1.0e-12)
                    rows.pinv[rn + 2] = 1.0 / wp.max(d2 + W2, 1.0e-12)
    if mode >= FrictionSafeguard.NEWTON:
        for ci in range(ct.count[w]):
            kk = w * sc.max_contacts + ci
            rn = rbase + sc.jrows + 3 * ci
            it.fdir[kk] = wp.vec4(0.0)
            pin_prev = it.pin[kk]
            it.pin[kk] = wp.vec2(0.0)
            d1 = 1.0 / rows.pinv[rn + 1] - rows.C[rn + 1]
            d2 = 1.0 / rows.pinv[rn + 2] - rows.C[rn + 2]
            ln = it.lam[rn]
            vs_k, vs_lat_k = contact_slip(kk, model, ct)
            semi = shares_pair(w, ci, sc.max_contacts, ct.count, ct.shape0, ct.shape1, ct.n)
            if opt.pin_from > 0 and semi == 0 and k >= opt.pin_from:
                semi = 2  # a single contact (a wheel): the semismooth rows too, from pin_wheels_from
            loaded = ln > 0.0 and d1 > 1.0e-9 and d2 > 1.0e-9 and ln * 0.5 * (d1 + d2) > 1.0e-7
            if semi != 0 and loaded and vs_k <= 0.0:
                v1 = rows.res[rn + 1] - rows.C[rn + 1] * it.lam[rn + 1]
                v2 = rows.res[rn + 2] - rows.C[rn + 2] * it.lam[rn + 2]
                m1, m2 = cone_mu(kk, model, ct, it.q)
                rho = 2.0 / wp.max(m1 * m1 * d1 + m2 * m2 * d2, 1.0e-12)
                lt1 = it.lam[rn + 1] / m1
                lt2 = it.lam[rn + 2] / m2
                z1 = lt1 - rho * m1 * v1
                z2 = lt2 - rho * m2 * v2
                zn = wp.sqrt(z1 * z1 + z2 * z2)
                if zn <= ln:
                    # sticking (Alart-Curnier: l~ - z = rho v~ = 0): the row is the slip v = 0. The split
                    # of a sticking set's friction is indeterminate (the Schur block is singular: a box's
                    # corners; the lateral friction of two wheels on one axle, an internal force through
                    # the chassis), so the step gets a proximal term eps d dl (eps = stick_prox) in the
                    # matrix only: the residual stays v, the fixed point exact
                    eps = opt.stick_prox
                    if semi == 2 and k > opt.prox_decay_from:
                        # a single contact (a wheel): the proximal term fades once the active set has settled,
                        # so the split converges superlinearly instead of at prox / (prox + compliance) per step
                        eps = eps * wp.pow(opt.prox_decay, float(k - opt.prox_decay_from))
                    rows.C[rn + 1] = eps * d1
                    rows.C[rn + 2] = eps * d2
                    rows.res[rn + 1] = v1
                    rows.res[rn + 2] = v2
                    rows.pinv[rn + 1] = 1.0 / (d1 * (1.0 + eps))
                    rows.pinv[rn + 2] = 1.0 / (d2 * (1.0 + eps))
                else:
                    # sliding: l~ = ln z^ (ln lagged); rows rotated to (z^, z^perp) in cone-scaled variables
                    e1 = z1 / zn
                    e2 = z2 / zn
                    # the pinned magnitude lags lam_n by one iteration; averaging it with the
                    # previous pin (pin_relax) damps the 2-cycle of nearly indeterminate load splits
                    lpin = ln
                    dpin = float(0.0)
                    if k > 0 and pin_prev[0] > 0.0:
                        dpin = ln - pin_prev[0]
                        if dpin * pin_prev[1] < 0.0:
                            lpin = (1.0 - opt.pin_relax) * ln + opt.pin_relax * pin_prev[0]
                            dpin = lpin - pin_prev[0]
                    it.pin[kk] = wp.vec2(lpin, dpin)
                    it.fdir[kk] = wp.vec4(e1, e2, 1.0, lpin - (e1 * lt1 + e2 * lt2))
                    Pa = m1 * e1 * rows.Ja[rn + 1] + m2 * e2 * rows.Ja[rn + 2]
                    Pb = m1 * e1 * rows.Jb[rn + 1] + m2 * e2 * rows.Jb[rn + 2]
                    Qa = -m1 * e2 * rows.Ja[rn + 1] + m2 * e1 * rows.Ja[rn + 2]
                    Qb = -m1 * e2 * rows.Jb[rn + 1] + m2 * e1 * rows.Jb[rn + 2]
                    dQ = eff_inv_mass(data.inv_m, data.inv_I, rows.a[rn + 1], Qa, rows.b[rn + 1], Qb)
                    lq = -e2 * lt1 + e1 * lt2
                    Cq = (zn - ln) / (ln * rho)
                    rows.Ja[rn + 1] = Pa
                    rows.Jb[rn + 1] = Pb
                    rows.C[rn + 1] = 0.0
                    rows.res[rn + 1] = 0.0
                    rows.pinv[rn + 1] = 0.0  # pinned: dl~_par = ln - l~_par, masked out of the PCR
                    rows.Ja[rn + 2] = Qa
                    rows.Jb[rn + 2] = Qb
                    rows.C[rn + 2] = Cq
                    rows.res[rn + 2] = zn / (ln * rho) * lq
                    rows.pinv[rn + 2] = 1.0 / wp.max(dQ + Cq, 1.0e-12)
    # -- Schur system (eq. 12): (J M~^-1 J^T + C) dlam = J M~^-1 r_dyn - r_con
    npin = int(0)
    if mode >= FrictionSafeguard.NEWTON:
        for ci in range(ct.count[w]):
            if it.fdir[w * sc.max_contacts + ci][2] != 0.0:
                npin += 1
    # worlds with semismooth rows solve the Schur system to pcr_tol (their redundant contacts make
    # it nearly singular: the load split rests on the contact compliance alone)
    n_pcr = opt.pcr_iters
    t_pcr = float(0.0)
    if nsemi > 0 or pin_wheels != 0:
        n_pcr = opt.pcr_iters_newton
        t_pcr = opt.pcr_tol
    # linear_solver="direct": the world's Schur matrix factored once for every solve of this iteration, in
    # the worlds of single contacts whose wheels are pinned (they solve to pcr_tol: up to pcr_iters_newton
    # PCR iterations, npin + 1 solves). Elsewhere the PCR's inexact steps matter: in the early active-set
    # iterations (solved exactly, turning in place stalled on every other step) and on redundant contact
    # sets, whose Schur matrix only the proximal term and the compliance keep regular (solved exactly, a
    # wheel in a mesh's concave corner and a box landing at 3 km/s stalled at 1.7 m/s)
    direct = int(0)
    # ... and not on a triangle mesh: a wheel's closest mesh point can switch between faces (the ground and
    # an obstacle's side in one mesh) from one iterate to the next, and the exact steps jump across that
    # switch where the PCR's shorter ones settle (the robot climbing a step given in one mesh: 1.7 m/s)
    on_mesh = int(0)
    if opt.direct_max > 0:
        for ci in range(ct.count[w]):
            cm = w * sc.max_contacts + ci
            s0 = ct.shape0[cm]
            s1 = ct.shape1[cm]
            if s0 >= 0:
                if model.shape_mesh[s0] != wp.uint64(0):
                    on_mesh = 1
            if s1 >= 0:
                if model.shape_mesh[s1] != wp.uint64(0):
                    on_mesh = 1
    if opt.direct_max > 0 and nrows <= opt.direct_max and pin_wheels != 0 and nsemi == 0 and on_mesh == 0:
        direct = 1  # the caller factors (dense_factor, or lane_dense_factor for LANES worlds at once)
    bt = int(0)
    if backtrack:
        bt = 1
    return 1, direct, n_pcr, t_pcr, npin, bt, pin_wheels


@wp.func
def newton_rhs(
    w: int,
    direct: int,
    n_pcr: int,
    t_pcr: float,
    npin: int,
    pins_done: int,
    sc: StepConstants,
    opt: NewtonOptions,
    # Model:
    model: ModelArrays,
    # Data in:
    data: StepData,
    ct: Contacts,
    # Data in/out:
    it: NewtonIterate,
    # Scratch:
    rows: Rows,
    scr: SchurScratch,
):
    """World w's right-hand side of the Schur system (eq. 12) after `newton_pre` (and the dense factor when
    direct): the coupled pins' solves (unless pins_done: `lane_coupled_pins` ran them), then it.rhs with the
    pinned rows moved to it."""
    bbase = w * sc.nbody
    rbase = w * sc.max_rows
    nrows = it.n_rows[w]
    sbase = w * opt.direct_max * opt.direct_max
    if npin > 0 and npin <= 4 and opt.pin_coupled != 0 and pins_done == 0:
        coupled_pins(nrows, rbase, bbase, w, n_pcr, t_pcr, direct, sbase, opt.direct_max, npin, sc, model, data, ct,
                     it, rows, scr)
    for i in range(nrows):
        r = rbase + i
        Jy = row_dot(rows.Ja[r], body_vel(it.ydyn, rows.a[r]), rows.Jb[r], body_vel(it.ydyn, rows.b[r]))
        it.rhs[r] = Jy - rows.res[r]
    if npin > 0:
        # pinned rows: dl~_par = delta is known; move A[:, par] delta to the right-hand side and mask
        # the rows out of the PCR (row_pinv = 0)
        for i in range(nrows):
            scr.z[rbase + i] = 0.0
        for ci in range(ct.count[w]):
            fd = it.fdir[w * sc.max_contacts + ci]
            if fd[2] != 0.0:
                scr.z[rbase + sc.jrows + 3 * ci + 1] = fd[3]
        apply_A(nrows, rbase, bbase, sc.nbody, rows, data.inv_m, data.inv_I, scr.z, scr.tmp, scr.Az)
        for i in range(nrows):
            it.rhs[rbase + i] = it.rhs[rbase + i] - scr.Az[rbase + i]
    return 0


@wp.func
def newton_post(
    w: int,
    npin: int,
    bt: int,
    pin_wheels: int,
    sc: StepConstants,
    opt: NewtonOptions,
    # Model:
    model: ModelArrays,
    # Data in:
    data: StepData,
    ct: Contacts,
    # Data in/out:
    it: NewtonIterate,
    # Scratch:
    rows: Rows,
    scr: SchurScratch,
):
    """World w's Newton iteration after its Schur solve (it.dl): the pinned rows, the safeguards, the
    back-substitution (eq. 13) and the new iterate."""
    bbase = w * sc.nbody
    rbase = w * sc.max_rows
    nrows = it.n_rows[w]
    mode = opt.safeguard
    backtrack = bt != 0
    if npin > 0:
        for ci in range(ct.count[w]):
            fd = it.fdir[w * sc.max_contacts + ci]
            if fd[2] != 0.0:
                it.dl[rbase + sc.jrows + 3 * ci + 1] = fd[3]
    # -- safeguards (lam_n >= 0, friction inside the elliptic cone). "clamp" (the paper's): project
    # the multipliers after the step. "projected": contacts whose step leaves the admissible set
    # get their multipliers pinned to the projection and the Schur system is solved again for the
    # rest, so u stays consistent with the clamped impulses (after a plain clamp u keeps the
    # sticking-like solution and W = 0 there can stall a stick/slip transition).
    nc = ct.count[w]
    nfix = int(0)
    nscan = nc
    if mode != FrictionSafeguard.PROJECTED:
        nscan = 0
    for ci in range(nscan):
        kk = w * sc.max_contacts + ci
        rn = rbase + sc.jrows + 3 * ci
        ln, l1, l2, fixed = cone_projection(
            kk, it.lam[rn] + it.dl[rn], it.lam[rn + 1] + it.dl[rn + 1], it.lam[rn + 2] + it.dl[rn + 2], model, ct,
            it.q, 1.0,
        )
        if fixed != 0:
            nfix += 1
            for q in range(3):
                r = rn + q
                target = ln
                if q == 1:
                    target = l1
                elif q == 2:
                    target = l2
                pen = 1.0e4 / rows.pinv[r]
                rows.C[r] = rows.C[r] + pen
                it.rhs[r] = pen * (target - it.lam[r])
                rows.pinv[r] = 1.0 / (1.0 / rows.pinv[r] + pen)
    if nfix > 0:  # "projected" safeguard only, so never a direct world (pinned wheels are "newton"'s)
        pcr_solve(nrows, rbase, bbase, sc.nbody, opt.pcr_iters, rows, data.inv_m, data.inv_I, it.rhs, it.dl, scr, 0.0)
    # -- back-substitution (eq. 13): du = M~^-1 (J^T dlam - r_dyn)
    apply_JT(nrows, rbase, bbase, sc.nbody, rows, it.dl, scr.tmp)
    for i in range(sc.nbody):
        b = bbase + i
        if data.inv_m[b] > 0.0:
            it.u[b] = it.u[b] + inv_mass_apply(data.inv_m[b], data.inv_I[b], scr.tmp[b]) - it.ydyn[b]
    if mode >= FrictionSafeguard.NEWTON:
        # rotated sliding rows: (dl~_par, dl~_perp) back to the contact frame, l = mu l~
        for ci in range(ct.count[w]):
            fd = it.fdir[w * sc.max_contacts + ci]
            if fd[2] != 0.0:
                rn = rbase + sc.jrows + 3 * ci
                m1, m2 = cone_mu(w * sc.max_contacts + ci, model, ct, it.q)
                a = it.dl[rn + 1]
                c = it.dl[rn + 2]
                it.dl[rn + 1] = m1 * (fd[0] * a - fd[1] * c)
                it.dl[rn + 2] = m2 * (fd[1] * a + fd[0] * c)
    for i in range(nrows):
        it.lam[rbase + i] = it.lam[rbase + i] + it.dl[rbase + i]
    if nfix > 0 or mode != FrictionSafeguard.PROJECTED:
        slack = float(1.0)
        if mode == FrictionSafeguard.NEWTON:
            slack = opt.cone_slack
        # clamp mode: the paper's safeguard after the step; projected mode: the penalty pinned the
        # projected rows to within 1e-4 of their share, finish them exactly
        project_cone(w, sc, model, ct, it.q, it.lam, slack, pin_wheels)
    if backtrack:
        for i in range(sc.nbody):
            it.du_ls[bbase + i] = it.u[bbase + i] - it.u_ls[bbase + i]
        for i in range(nrows):
            it.dl_ls[rbase + i] = it.lam[rbase + i] - it.lam_ls[rbase + i]


def iteration_kernel(width: int):
    """`newton_iteration` (and its `lane_coupled_pins`) for one lane width (one of LANE_WIDTHS), made once per
    width as Warp closures over the width's lane code (`schur_lanes.lane_code`); every width is made when this
    module loads (a Warp module whose kernels changed after a launch would be rebuilt under recorded launches),
    the widths other than LANES each in a module of their own."""
    if width in _ITERATION:
        return _ITERATION[width]
    LANES = width
    lt = lane_types(width)
    lanef = lt.lanef
    lanei = lt.lanei
    LaneScratch = lt.LaneScratch
    lc = lane_code(width)
    lane_dense_factor = lc.lane_dense_factor
    lane_solves = lc.lane_solves
    mod = lane_module(__name__, width)  # a width other than LANES: its kernel and function in a module of their own
    if mod is not None:
        wp.set_module_options({"max_unroll": MAX_UNROLL}, module=mod)

    @wp.func(name=f"lane_coupled_pins_{LANES}", module=mod)
    def lane_coupled_pins(
        g: int,
        cp: lanei,
        maxp: int,
        dirv: lanei,
        lf: int,
        itv: lanei,
        tolv: lanef,
        npv: lanei,
        sc: StepConstants,
        opt: NewtonOptions,
        model: ModelArrays,
        data: StepData,
        ct: Contacts,
        it: NewtonIterate,
        rows: Rows,
        scr: SchurScratch,
        ln: LaneScratch,
    ):
        """`coupled_pins` of group g's worlds in the lanes where cp != 0 (npv[j] pinned contacts, at most maxp),
        solve by solve: each solve s of every world that has one, all of them at once (`lane_solves`: the PCR
        worlds' in float32 lanes, the direct worlds' by the lanes' factor when lf = 1, else their own); each
        world's b and M in ln.pin. Every world gets `coupled_pins`' operations in its order, the same result bit
        for bit."""
        dm = opt.direct_max
        pb = (g % ln.slots) * LANES * 20
        for s in range(maxp + 1):
            act = lanei()
            pcr = lanei()
            dv = lanei()
            for j in range(LANES):
                if cp[j] != 0 and s <= npv[j]:
                    w = g * LANES + j
                    act[j] = 1
                    pins_rhs(s, it.n_rows[w], w * sc.max_rows, w * sc.nbody, w, sc, data, ct, it, rows, scr)
                    if dirv[j] != 0:
                        dv[j] = 1
                    else:
                        pcr[j] = 1
            lane_solves(g, pcr, dv, lf, itv, tolv, sc.nbody, sc.max_rows, dm, rows, data.inv_m, data.inv_I, it.n_rows,
                        it.rhs, it.dl, scr, ln)
            for j in range(LANES):
                if act[j] != 0:
                    w = g * LANES + j
                    k = pb + j * 20
                    b = wp.vec4(0.0)
                    M = wp.identity(n=4, dtype=float)
                    if s > 0:
                        b, M = pins_load(ln.pin, k)
                    b, M = pins_take(s, w * sc.max_rows, w, npv[j], b, M, sc, model, ct, it)
                    for i in range(4):
                        ln.pin[k + i] = b[i]
                        for c in range(4):
                            ln.pin[k + 4 + 4 * i + c] = M[i, c]
        for j in range(LANES):
            if cp[j] != 0:
                w = g * LANES + j
                b, M = pins_load(ln.pin, pb + j * 20)
                pins_finish(w, npv[j], b, M, sc, ct, it)
        return 0


    @wp.kernel(module=mod)
    def newton_iteration(
        k_first: int,
        k_last: int,
        sc: StepConstants,
        opt: NewtonOptions,
        # Model:
        model: ModelArrays,
        # Data in:
        data: StepData,
        ct: Contacts,
        # Data in/out:
        it: NewtonIterate,
        # Scratch:
        rows: Rows,
        scr: SchurScratch,
        ln: LaneScratch,
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
        for gi in range(opt.thread_groups):  # a runtime bound: not unrolled
            g = wp.tid() * opt.thread_groups + gi
            if g * opt.lanes >= it.done.shape[0]:
                break
            nw = it.done.shape[0]
            for k in range(k_first, k_last + 1):  # a runtime bound: not unrolled
                do_step = int(0)
                if k < k_last:
                    do_step = 1
                # a group whose worlds are all done (converged, stalled, diverged) is finished for this step
                live = int(0)
                for j in range(opt.lanes):
                    w = g * opt.lanes + j
                    if w < nw and it.done[w] == 0:
                        live = 1
                if live == 0:
                    break
                dm = opt.direct_max
                per = opt.lanes  # worlds of this group: 1, or LANES in vector lanes; each stage below appears once
                gov = lanei()
                pcrv = lanei()
                dirv = lanei()
                itv = lanei()
                tolv = lanef()
                npv = lanei()
                btv = lanei()
                pwv = lanei()
                npcr = int(0)
                ndir = int(0)
                for j in range(per):  # a runtime bound: not unrolled
                    w = g * per + j
                    # a finished world's newton_pre returns at once: not called (a call copies its argument
                    # groups, KiBs)
                    if w < nw and it.done[w] == 0:
                        go, direct, n_pcr, t_pcr, npin, bt, pw = newton_pre(k, do_step, w, sc, opt, model, data, ct, it,
                                                                            rows, scr)
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
                        lf = lane_dense_factor(g, dirv, sc.nbody, sc.max_rows, dm, rows, data.inv_m, data.inv_I,
                                               it.n_rows, scr, ln, ln.S, (g % ln.slots) * dm * dm)
                    # the coupled pins' solves (pin_coupled), solve by solve for the group's worlds in lanes
                    cpv = lanei()
                    maxp = int(0)
                    for j in range(per):
                        if gov[j] != 0 and npv[j] > 0 and npv[j] <= 4 and opt.pin_coupled != 0:
                            cpv[j] = 1
                            maxp = wp.max(maxp, npv[j])
                    if maxp > 0:
                        lane_coupled_pins(g, cpv, maxp, dirv, lf, itv, tolv, npv, sc, opt, model, data, ct, it,
                                          rows, scr, ln)
                    pins = 1
                elif dirv[0] != 0:
                    dense_factor(it.n_rows[g], g * sc.max_rows, g * sc.nbody, sc.nbody, rows, data.inv_m,
                                 data.inv_I, scr, g * dm * dm, dm)
                for j in range(per):
                    if gov[j] != 0:
                        newton_rhs(g * per + j, dirv[j], itv[j], tolv[j], npv[j], pins, sc, opt, model, data, ct, it,
                                   rows, scr)
                if per > 1:
                    lane_solves(g, pcrv, dirv, lf, itv, tolv, sc.nbody, sc.max_rows, dm, rows, data.inv_m, data.inv_I,
                                it.n_rows, it.rhs, it.dl, scr, ln)
                elif npcr > 0:
                    pcr_solve(it.n_rows[g], g * sc.max_rows, g * sc.nbody, sc.nbody, itv[0], rows, data.inv_m,
                              data.inv_I, it.rhs, it.dl, scr, tolv[0])
                elif dirv[0] != 0:
                    dense_solve(it.n_rows[g], g * sc.max_rows, rows, it.rhs, it.dl, scr, g * dm * dm, dm)
                for j in range(per):
                    if gov[j] != 0:
                        newton_post(g * per + j, npv[j], btv[j], pwv[j], sc, opt, model, data, ct, it, rows, scr)

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
