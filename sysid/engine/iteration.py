"""One world's Newton iteration of the step (eq. 9-13) in the stages that `step.newton_iteration` runs around
its Schur solve: `newton_pre` (the iterate's rows, residual, convergence test and the friction safeguards' rows),
`newton_rhs` (the coupled pins' solves and the Schur system's right-hand side) and `newton_post` (the pinned
rows, the cone projections, the back-substitution and the new iterate). Functions only: Warp compiles them into
the step's module, with its options (`step.MAX_UNROLL`)."""

import warp as wp

from .contact import shares_pair
from .friction import cone_mu, cone_projection, contact_slip, project_cone, slide_weight
from .kinematics import eff_inv_mass, integrate_com, integrate_quat, inv_mass_apply, mass_apply
from .pins import coupled_pins
from .rows import build_rows
from .schur import apply_A, apply_JT, schur_rhs, schur_solve
from .types import FrictionSafeguard, NewtonStep, RowKind, StepCode


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
    st: NewtonStep,
):
    """World w's Newton iteration up to its Schur solve: the iterate's rows, residual and convergence test,
    then the safeguards' rows (eq. 9-11). Returns (go: 1 when the world solves the Schur system next,
    direct (the world's dense factor is wanted), the PCR's iteration cap and tolerance, npin, backtrack,
    pin_wheels), what `newton_rhs`, the solve and `newton_post` read."""
    if st.it.done[w] != 0:
        return 0, 0, 0, 0.0, 0, 0, 0
    bbase = w * st.sc.nbody
    rbase = w * st.sc.max_rows
    # -- kinematics: q+ = q- + h G(q-) u  (eq. 1, 9)
    for i in range(st.sc.nbody):
        b = bbase + i
        st.at.x[b] = integrate_com(st.data.x_prev[b], st.at.u[b], st.sc.h)
        st.at.q[b] = integrate_quat(st.data.q_prev[b], st.at.u[b], st.sc.h)
    # -- constraint rows at q+ (eq. 3, 4, 7, 8)
    nrows = build_rows(w, st.sc, st.model, st.data, st.ct, st.at, st.rows)
    st.it.n_rows[w] = nrows
    # -- dynamics residual (eq. 10), measured as a velocity: y = M~^-1 r_dyn
    apply_JT(w, nrows, st.sc, st.rows, st.at.lam, st.scr.tmp)
    rdn = float(0.0)
    for i in range(st.sc.nbody):
        b = bbase + i
        y = wp.spatial_vector()
        if st.data.inv_m[b] > 0.0:
            rd = (mass_apply(st.model.body_mass[b], st.data.I_w[b], st.at.u[b] - st.data.u_prev[b]) - st.data.f_imp[b]
                  - st.scr.tmp[b])
            y = inv_mass_apply(st.data.inv_m[b], st.data.inv_I[b], rd)
        st.it.ydyn[b] = y
        rdn += dynamics_residual_sq(y, st.model.body_mass[b], st.data.I_w[b], st.data.inv_m[b], st.opt.energy_norm)
    # friction rows are weighted by d / (d + W): a free (W -> inf) row measures its impulse, a
    # sticking one (W -> 0) its slip, so separated contacts do not dominate the norm
    rcn = float(0.0)
    for i in range(nrows):
        r = rbase + i
        wt = float(1.0)
        if st.rows.kind[r] == RowKind.FRICTION or st.rows.kind[r] == RowKind.SERVO_LIMITED:
            # a saturated servo's row is its impulse error times its large slope: measure it as a velocity
            wt = 1.0 - st.rows.C[r] * st.rows.pinv[r]
        rcn += wt * wt * st.rows.res[r] * st.rows.res[r]
    norm = wp.sqrt(rdn + rcn)
    if not (norm < 1.0e30):
        # non-finite or exploding iterate: stop here, keep the best admissible one
        st.it.status[w] = StepCode.DIVERGED
        st.it.done[w] = 1
        return 0, 0, 0, 0.0, 0, 0, 0
    st.it.iters[w] = k
    st.it.res_trace[w * st.opt.trace_stride + k] = norm
    if k >= st.opt.k_min and norm < st.it.best_norm[w]:
        st.it.best_norm[w] = norm
        st.it.best_k[w] = k
        st.it.res_dyn[w] = wp.sqrt(rdn)
        st.it.res_con[w] = wp.sqrt(rcn)
        for i in range(st.sc.nbody):
            st.it.u_best[bbase + i] = st.at.u[bbase + i]
        for i in range(nrows):
            st.it.lam_best[rbase + i] = st.at.lam[rbase + i]
    if k >= st.opt.k_min and norm < st.opt.tol:
        st.it.status[w] = StepCode.CONVERGED
        st.it.done[w] = 1
        return 0, 0, 0, 0.0, 0, 0, 0
    if k >= st.opt.k_min and k >= st.opt.stall_iters and st.it.best_norm[w] < st.opt.stall_tol:
        # at the residual's float32 floor: the last stall_iters iterates did not halve the smallest
        # residual before them, so more iterations only move the iterate within that floor
        before = float(1.0e30)
        for j in range(k - st.opt.stall_iters + 1):
            before = wp.min(before, st.it.res_trace[w * st.opt.trace_stride + j])
        if st.it.best_norm[w] > 0.5 * before:
            st.it.status[w] = StepCode.STALLED
            st.it.done[w] = 1
            return 0, 0, 0, 0.0, 0, 0, 0
    if do_step == 0:
        st.it.status[w] = StepCode.MAX_ITER
        return 0, 0, 0, 0.0, 0, 0, 0
    # worlds with a redundant contact set (friction_safeguard="newton") take the semismooth rows, PCR to a
    # tolerance and, from iteration ls_from on, backtracking
    nsemi = int(0)
    if st.opt.safeguard == FrictionSafeguard.NEWTON:
        for ci in range(st.ct.count[w]):
            nsemi += shares_pair(w, ci, st.sc.max_contacts, st.ct.count, st.ct.shape0, st.ct.shape1, st.ct.n)
    # pin_wheels_from: from that iteration on single exact-Coulomb contacts (wheels) may take the pinned
    # sliding rows too; their worlds then solve the Schur system to pcr_tol (no backtracking) and project
    # the update of those contacts onto the cone widened by cone_slack, as for redundant sets
    pin_wheels = int(0)
    if st.opt.safeguard == FrictionSafeguard.NEWTON and st.opt.pin_from > 0 and k >= st.opt.pin_from:
        for ci in range(st.ct.count[w]):
            vs_c, vs_lat_c = contact_slip(w * st.sc.max_contacts + ci, st.model, st.ct)
            if vs_c <= 0.0:
                pin_wheels = 1
    backtrack = nsemi > 0 and k >= st.opt.ls_from
    if backtrack:
        # backtracking on the residual norm: an iterate that does not lower the last accepted one's
        # norm is replaced by the point halfway back along the last step (down to ls_min of it)
        a = st.it.ls_alpha[w]
        if k > st.opt.ls_from and not (norm < st.it.ls_ref[w]) and 0.5 * a >= st.opt.ls_min:
            a = 0.5 * a
            st.it.ls_alpha[w] = a
            for i in range(st.sc.nbody):
                st.at.u[bbase + i] = st.it.u_ls[bbase + i] + a * st.it.du_ls[bbase + i]
            for i in range(nrows):
                st.at.lam[rbase + i] = st.it.lam_ls[rbase + i] + a * st.it.dl_ls[rbase + i]
            return 0, 0, 0, 0.0, 0, 0, 0
        st.it.ls_ref[w] = norm
        st.it.ls_alpha[w] = 1.0
        for i in range(st.sc.nbody):
            st.it.u_ls[bbase + i] = st.at.u[bbase + i]
        for i in range(nrows):
            st.it.lam_ls[rbase + i] = st.at.lam[rbase + i]
    # friction_safeguard="newton": contacts that share their shape pair with another contact (a box's
    # corners: a redundant set whose friction split the FB weight leaves to 2-cycles) take the
    # semismooth Alart-Curnier rows below; single contacts (wheels) keep the active-set weight
    mode = st.opt.safeguard
    if mode == FrictionSafeguard.ACTIVE or mode == FrictionSafeguard.NEWTON:
        # active-set W: a contact whose z~ = l~ - rho v~ leaves the cone slides, and gets the sliding
        # weight W~ = |v~| / lam_n (b = 0) whatever its impulse; redundant contacts sharing a
        # Jacobian then split the friction in proportion to lam_n instead of trading it back and
        # forth (the FB weight is tiny on a contact inside the cone). Sticking contacts keep eq. 7's W.
        for ci in range(st.ct.count[w]):
            kk = w * st.sc.max_contacts + ci
            rn = rbase + st.sc.jrows + 3 * ci
            d1 = 1.0 / st.rows.pinv[rn + 1] - st.rows.C[rn + 1]
            d2 = 1.0 / st.rows.pinv[rn + 2] - st.rows.C[rn + 2]
            ln = st.at.lam[rn]
            # regularised contacts (slip speed > 0) already carry their smooth weight
            vs_k, vs_lat_k = contact_slip(kk, st.model, st.ct)
            semi = int(0)
            if mode == FrictionSafeguard.NEWTON:
                semi = shares_pair(w, ci, st.sc.max_contacts, st.ct.count, st.ct.shape0, st.ct.shape1, st.ct.n)
            if ln > 0.0 and d1 > 1.0e-9 and vs_k <= 0.0 and semi == 0:
                v1 = st.rows.res[rn + 1] - st.rows.C[rn + 1] * st.at.lam[rn + 1]
                v2 = st.rows.res[rn + 2] - st.rows.C[rn + 2] * st.at.lam[rn + 2]
                sl, W1, W2 = slide_weight(kk, ln, st.at.lam[rn + 1], st.at.lam[rn + 2], v1, v2, d1, d2, st.model, st.ct,
                                          st.at.q)
                if sl != 0:
                    st.rows.C[rn + 1] = W1
                    st.rows.C[rn + 2] = W2
                    st.rows.res[rn + 1] = v1 + W1 * st.at.lam[rn + 1]
                    st.rows.res[rn + 2] = v2 + W2 * st.at.lam[rn + 2]
                    st.rows.pinv[rn + 1] = 1.0 / wp.max(d1 + W1, 1.0e-12)
                    st.rows.pinv[rn + 2] = 1.0 / wp.max(d2 + W2, 1.0e-12)
    if mode >= FrictionSafeguard.NEWTON:
        for ci in range(st.ct.count[w]):
            kk = w * st.sc.max_contacts + ci
            rn = rbase + st.sc.jrows + 3 * ci
            st.it.fdir[kk] = wp.vec4(0.0)
            pin_prev = st.it.pin[kk]
            st.it.pin[kk] = wp.vec2(0.0)
            d1 = 1.0 / st.rows.pinv[rn + 1] - st.rows.C[rn + 1]
            d2 = 1.0 / st.rows.pinv[rn + 2] - st.rows.C[rn + 2]
            ln = st.at.lam[rn]
            vs_k, vs_lat_k = contact_slip(kk, st.model, st.ct)
            semi = shares_pair(w, ci, st.sc.max_contacts, st.ct.count, st.ct.shape0, st.ct.shape1, st.ct.n)
            if st.opt.pin_from > 0 and semi == 0 and k >= st.opt.pin_from:
                semi = 2  # a single contact (a wheel): the semismooth rows too, from pin_wheels_from
            loaded = ln > 0.0 and d1 > 1.0e-9 and d2 > 1.0e-9 and ln * 0.5 * (d1 + d2) > 1.0e-7
            if semi != 0 and loaded and vs_k <= 0.0:
                v1 = st.rows.res[rn + 1] - st.rows.C[rn + 1] * st.at.lam[rn + 1]
                v2 = st.rows.res[rn + 2] - st.rows.C[rn + 2] * st.at.lam[rn + 2]
                m1, m2 = cone_mu(kk, st.model, st.ct, st.at.q)
                rho = 2.0 / wp.max(m1 * m1 * d1 + m2 * m2 * d2, 1.0e-12)
                lt1 = st.at.lam[rn + 1] / m1
                lt2 = st.at.lam[rn + 2] / m2
                z1 = lt1 - rho * m1 * v1
                z2 = lt2 - rho * m2 * v2
                zn = wp.sqrt(z1 * z1 + z2 * z2)
                if zn <= ln:
                    # sticking (Alart-Curnier: l~ - z = rho v~ = 0): the row is the slip v = 0. The split
                    # of a sticking set's friction is indeterminate (the Schur block is singular: a box's
                    # corners; the lateral friction of two wheels on one axle, an internal force through
                    # the chassis), so the step gets a proximal term eps d dl (eps = stick_prox) in the
                    # matrix only: the residual stays v, the fixed point exact
                    eps = st.opt.stick_prox
                    if semi == 2 and k > st.opt.prox_decay_from:
                        # a single contact (a wheel): the proximal term fades once the active set has settled,
                        # so the split converges superlinearly instead of at prox / (prox + compliance) per step
                        eps = eps * wp.pow(st.opt.prox_decay, float(k - st.opt.prox_decay_from))
                    st.rows.C[rn + 1] = eps * d1
                    st.rows.C[rn + 2] = eps * d2
                    st.rows.res[rn + 1] = v1
                    st.rows.res[rn + 2] = v2
                    st.rows.pinv[rn + 1] = 1.0 / (d1 * (1.0 + eps))
                    st.rows.pinv[rn + 2] = 1.0 / (d2 * (1.0 + eps))
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
                            lpin = (1.0 - st.opt.pin_relax) * ln + st.opt.pin_relax * pin_prev[0]
                            dpin = lpin - pin_prev[0]
                    st.it.pin[kk] = wp.vec2(lpin, dpin)
                    st.it.fdir[kk] = wp.vec4(e1, e2, 1.0, lpin - (e1 * lt1 + e2 * lt2))
                    Pa = m1 * e1 * st.rows.Ja[rn + 1] + m2 * e2 * st.rows.Ja[rn + 2]
                    Pb = m1 * e1 * st.rows.Jb[rn + 1] + m2 * e2 * st.rows.Jb[rn + 2]
                    Qa = -m1 * e2 * st.rows.Ja[rn + 1] + m2 * e1 * st.rows.Ja[rn + 2]
                    Qb = -m1 * e2 * st.rows.Jb[rn + 1] + m2 * e1 * st.rows.Jb[rn + 2]
                    dQ = eff_inv_mass(st.data.inv_m, st.data.inv_I, st.rows.a[rn + 1], Qa, st.rows.b[rn + 1], Qb)
                    lq = -e2 * lt1 + e1 * lt2
                    Cq = (zn - ln) / (ln * rho)
                    st.rows.Ja[rn + 1] = Pa
                    st.rows.Jb[rn + 1] = Pb
                    st.rows.C[rn + 1] = 0.0
                    st.rows.res[rn + 1] = 0.0
                    st.rows.pinv[rn + 1] = 0.0  # pinned: dl~_par = ln - l~_par, masked out of the PCR
                    st.rows.Ja[rn + 2] = Qa
                    st.rows.Jb[rn + 2] = Qb
                    st.rows.C[rn + 2] = Cq
                    st.rows.res[rn + 2] = zn / (ln * rho) * lq
                    st.rows.pinv[rn + 2] = 1.0 / wp.max(dQ + Cq, 1.0e-12)
    # -- Schur system (eq. 12): (J M~^-1 J^T + C) dlam = J M~^-1 r_dyn - r_con
    npin = int(0)
    if mode >= FrictionSafeguard.NEWTON:
        for ci in range(st.ct.count[w]):
            if st.it.fdir[w * st.sc.max_contacts + ci][2] != 0.0:
                npin += 1
    # worlds with semismooth rows solve the Schur system to pcr_tol (their redundant contacts make
    # it nearly singular: the load split rests on the contact compliance alone)
    n_pcr = st.opt.pcr_iters
    t_pcr = float(0.0)
    if nsemi > 0 or pin_wheels != 0:
        n_pcr = st.opt.pcr_iters_newton
        t_pcr = st.opt.pcr_tol
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
    if st.scr.dm > 0:
        for ci in range(st.ct.count[w]):
            cm = w * st.sc.max_contacts + ci
            s0 = st.ct.shape0[cm]
            s1 = st.ct.shape1[cm]
            if s0 >= 0:
                if st.model.shape_mesh[s0] != wp.uint64(0):
                    on_mesh = 1
            if s1 >= 0:
                if st.model.shape_mesh[s1] != wp.uint64(0):
                    on_mesh = 1
    if st.scr.dm > 0 and nrows <= st.scr.dm and pin_wheels != 0 and nsemi == 0 and on_mesh == 0:
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
    st: NewtonStep,
):
    """World w's right-hand side of the Schur system (eq. 12) after `newton_pre` (and the dense factor when
    direct): the coupled pins' solves (unless pins_done: `lane_coupled_pins` ran them), then scr.rhs with the
    pinned rows moved to it."""
    rbase = w * st.sc.max_rows
    nrows = st.it.n_rows[w]
    if npin > 0 and npin <= 4 and st.opt.pin_coupled != 0 and pins_done == 0:
        coupled_pins(w, nrows, n_pcr, t_pcr, direct, npin, st)
    schur_rhs(w, nrows, st.sc, st.rows, st.it.ydyn, st.scr)
    if npin > 0:
        # pinned rows: dl~_par = delta is known; move A[:, par] delta to the right-hand side and mask
        # the rows out of the PCR (row_pinv = 0)
        for i in range(nrows):
            st.scr.z[rbase + i] = 0.0
        for ci in range(st.ct.count[w]):
            fd = st.it.fdir[w * st.sc.max_contacts + ci]
            if fd[2] != 0.0:
                st.scr.z[rbase + st.sc.jrows + 3 * ci + 1] = fd[3]
        apply_A(w, nrows, st.sc, st.rows, st.scr)
        for i in range(nrows):
            st.scr.rhs[rbase + i] = st.scr.rhs[rbase + i] - st.scr.Az[rbase + i]
    return 0


@wp.func
def newton_post(
    w: int,
    npin: int,
    bt: int,
    pin_wheels: int,
    st: NewtonStep,
):
    """World w's Newton iteration after its Schur solve (scr.x): the pinned rows, the safeguards, the
    back-substitution (eq. 13) and the new iterate."""
    bbase = w * st.sc.nbody
    rbase = w * st.sc.max_rows
    nrows = st.it.n_rows[w]
    mode = st.opt.safeguard
    backtrack = bt != 0
    if npin > 0:
        for ci in range(st.ct.count[w]):
            fd = st.it.fdir[w * st.sc.max_contacts + ci]
            if fd[2] != 0.0:
                st.scr.x[rbase + st.sc.jrows + 3 * ci + 1] = fd[3]
    # -- safeguards (lam_n >= 0, friction inside the elliptic cone). "clamp" (the paper's): project
    # the multipliers after the step. "projected": contacts whose step leaves the admissible set
    # get their multipliers pinned to the projection and the Schur system is solved again for the
    # rest, so u stays consistent with the clamped impulses (after a plain clamp u keeps the
    # sticking-like solution and W = 0 there can stall a stick/slip transition).
    nc = st.ct.count[w]
    nfix = int(0)
    nscan = nc
    if mode != FrictionSafeguard.PROJECTED:
        nscan = 0
    for ci in range(nscan):
        kk = w * st.sc.max_contacts + ci
        rn = rbase + st.sc.jrows + 3 * ci
        ln, l1, l2, fixed = cone_projection(
            kk, st.at.lam[rn] + st.scr.x[rn], st.at.lam[rn + 1] + st.scr.x[rn + 1],
            st.at.lam[rn + 2] + st.scr.x[rn + 2], st.model, st.ct, st.at.q, 1.0,
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
                pen = 1.0e4 / st.rows.pinv[r]
                st.rows.C[r] = st.rows.C[r] + pen
                st.scr.rhs[r] = pen * (target - st.at.lam[r])
                st.rows.pinv[r] = 1.0 / (1.0 / st.rows.pinv[r] + pen)
    if nfix > 0:  # "projected" safeguard only, so never a direct world (pinned wheels are "newton"'s)
        schur_solve(0, w, nrows, st.sc, st.rows, st.scr, st.opt.pcr_iters, 0.0)
    # -- back-substitution (eq. 13): du = M~^-1 (J^T dlam - r_dyn)
    apply_JT(w, nrows, st.sc, st.rows, st.scr.x, st.scr.tmp)
    for i in range(st.sc.nbody):
        b = bbase + i
        if st.data.inv_m[b] > 0.0:
            st.at.u[b] = st.at.u[b] + inv_mass_apply(st.data.inv_m[b], st.data.inv_I[b], st.scr.tmp[b]) - st.it.ydyn[b]
    if mode >= FrictionSafeguard.NEWTON:
        # rotated sliding rows: (dl~_par, dl~_perp) back to the contact frame, l = mu l~
        for ci in range(st.ct.count[w]):
            fd = st.it.fdir[w * st.sc.max_contacts + ci]
            if fd[2] != 0.0:
                rn = rbase + st.sc.jrows + 3 * ci
                m1, m2 = cone_mu(w * st.sc.max_contacts + ci, st.model, st.ct, st.at.q)
                a = st.scr.x[rn + 1]
                c = st.scr.x[rn + 2]
                st.scr.x[rn + 1] = m1 * (fd[0] * a - fd[1] * c)
                st.scr.x[rn + 2] = m2 * (fd[1] * a + fd[0] * c)
    for i in range(nrows):
        st.at.lam[rbase + i] = st.at.lam[rbase + i] + st.scr.x[rbase + i]
    if nfix > 0 or mode != FrictionSafeguard.PROJECTED:
        slack = float(1.0)
        if mode == FrictionSafeguard.NEWTON:
            slack = st.opt.cone_slack
        # clamp mode: the paper's safeguard after the step; projected mode: the penalty pinned the
        # projected rows to within 1e-4 of their share, finish them exactly
        project_cone(w, st.sc, st.model, st.ct, st.at.q, st.at.lam, slack, pin_wheels)
    if backtrack:
        for i in range(st.sc.nbody):
            st.it.du_ls[bbase + i] = st.at.u[bbase + i] - st.it.u_ls[bbase + i]
        for i in range(nrows):
            st.it.dl_ls[rbase + i] = st.at.lam[rbase + i] - st.it.lam_ls[rbase + i]
