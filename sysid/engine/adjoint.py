"""Adjoint backward pass through a converged step (paper §III-D, eq. 14-19).

For each step: solve the adjoint system with the forward Schur operator at the returned iterate
(`adjoint_system` below), then obtain dL/dxi = w^T dr/dxi for xi in {q-, u-, controls,
parameters} as one vector-Jacobian product of a single recorded residual evaluation (Warp's
autodiff on the residual kernels below; the Newton and PCR iterations are never taped).

The residual kernels are written a thread per body / joint row / contact with atomic
accumulation so that Warp's reverse mode is exact for them.
"""

# No `from __future__ import annotations`: the preconditioner's kernels are closures per lane width
# (`precond_kernels`), and Warp reads their annotations as objects
import warp as wp

from .constraints import joint_angle, joint_frames, row_dot
from .contact import contact_geometry
from .kinematics import (
    body_vel,
    gyroscopic_impulse,
    integrate_com,
    integrate_quat,
    inv_mass_apply,
    mass_apply,
    origin_from_com,
    sv_ang,
)
from .rows import build_rows, contact_eval, joint_row_eval_at
from .schur import apply_JT, dense_factor, schur_solve
from .schur_lanes import lane_code
from .types import (
    LANE_WIDTHS,
    LANES,
    Contacts,
    Iterate,
    JointModel,
    ModelArrays,
    Poses,
    Rows,
    SchurScratch,
    StepConstants,
    StepData,
    lane_module,
)


@wp.struct
class AdjointVectors:
    """The transposed step system's right-hand side (y_u, y_lam) and twist solution w_u, per body and row
    (eq. 18-19), with the elimination's work vector ydyn (M~^-1 y_u per body); its row solution w_lam is the Schur
    solve's (`SchurScratch.x`, from `SchurScratch.rhs`)."""

    y_u: wp.array[wp.spatial_vector]  # (nb,)
    y_lam: wp.array[float]  # (nw * max_rows,)
    w_u: wp.array[wp.spatial_vector]  # (nb,)
    ydyn: wp.array[wp.spatial_vector]  # (nb,)


def row_chunks(device: wp.Device | str, worlds: int, rows: int) -> tuple[int, int]:
    """(rows per thread, threads) of the residual's row kernels over ``rows`` rows of each of ``worlds``
    worlds (`world_chunk` in the kernel): all of a world's rows per thread on a CPU, where every thread of
    an adjoint launch first copies and zeroes its argument groups (ModelArrays, StepData: a few KiB) and a
    thread per row spent more on that than on its row; one on a GPU, where threads are many and the
    copies sit in constant memory."""
    chunk = max(1, rows) if wp.get_device(device).is_cpu else 1
    return chunk, worlds * ((rows + chunk - 1) // chunk)


@wp.func
def world_chunk(tid: int, rows: int, chunk: int):
    """(world, first row) of thread ``tid`` when every world's ``rows`` rows go in chunks of ``chunk`` (row_chunks)."""
    nch = (rows + chunk - 1) / chunk
    w = tid / nch
    return w, (tid - w * nch) * chunk


@wp.kernel
def residual_kinematics(
    h: float,
    body_com: wp.array[wp.vec3],
    body_q_in: wp.array[wp.transform],
    u_plus: wp.array[wp.spatial_vector],
    nbw: int,
    skip: wp.array[int],
    # Data out:
    prev_out: Poses,
    plus_out: Poses,
    body_q_plus_out: wp.array[wp.transform],
):
    """q- in centre-of-mass form and q+ = q- + h G(q-) u+ (eq. 1), as a differentiable map (a body of a
    world with skip[w] != 0 left out: residual_joint_rows)."""
    b = wp.tid()
    if skip[b / nbw] != 0:
        return
    T = body_q_in[b]
    q = wp.transform_get_rotation(T)
    x = wp.transform_point(T, body_com[b])
    xp = integrate_com(x, u_plus[b], h)
    qp = integrate_quat(q, u_plus[b], h)
    prev_out.x[b] = x
    prev_out.q[b] = q
    plus_out.x[b] = xp
    plus_out.q[b] = qp
    body_q_plus_out[b] = origin_from_com(xp, qp, body_com[b])


# In a Warp module of its own: the forward step launches it too (SolverOstrich's joint angles at q-), and a Warp
# module compiles all its kernels on the first launch of any, so a forward-only run would otherwise compile every
# residual kernel below with its backward pass
@wp.kernel(module=f"{__name__}.angles")
def residual_joint_angles(
    joints: JointModel,
    body_com: wp.array[wp.vec3],
    at: Poses,
    njw: int,
    skip: wp.array[int],
    # Data out:
    angle_out: wp.array[float],
):
    """Every joint's angle at the poses ``at`` (q-: the servos' angle error)."""
    j = wp.tid()
    if skip[j / njw] != 0:
        return
    Xwp, Xwc = joint_frames(j, joints, body_com, at.x, at.q)
    angle_out[j] = joint_angle(Xwp, Xwc, joints.axis[j])


@wp.kernel
def residual_joint_frames(
    joints: JointModel,
    body_com: wp.array[wp.vec3],
    at: Poses,
    njw: int,
    skip: wp.array[int],
    # Data out:
    frame_p_out: wp.array[wp.transform],
    frame_c_out: wp.array[wp.transform],
):
    """Every joint's world frames on its parent and child at q+ (constraints.joint_frames), once per joint
    for all of its rows (residual_joint_rows): each row recomputing them was most of a row's cost. Joints of
    worlds with skip[w] != 0 are left out (njw joints per world)."""
    j = wp.tid()
    if skip[j / njw] != 0:
        return
    Xwp, Xwc = joint_frames(j, joints, body_com, at.x, at.q)
    frame_p_out[j] = Xwp
    frame_c_out[j] = Xwc


@wp.kernel
def residual_joint_rows(
    chunk: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    at: Iterate,
    frame_p: wp.array[wp.transform],
    frame_c: wp.array[wp.transform],
    skip: wp.array[int],
    # Data out:
    r_con_out: wp.array[float],
    jt_lam_out: wp.array[wp.spatial_vector],
):
    # a thread per (world, chunk of `chunk` rows): row_chunks; the joints' frames from residual_joint_frames.
    # skip[w] != 0: the world is left out (the Krylov adjoint's sweeps for worlds already solved)
    w, i0 = world_chunk(wp.tid(), sc.jrows, chunk)
    i1 = wp.min(i0 + chunk, sc.jrows)
    if skip[w] != 0:
        i1 = i0
    for i in range(i0, i1):
        j = w * sc.njoint + model.jrow_joint[i]
        r = w * sc.max_rows + i
        a, b, Ja, Jb, C, res = joint_row_eval_at(i, j, sc, model, data, at, at.lam[r], frame_p[j], frame_c[j])
        r_con_out[r] = res
        if a >= 0:
            wp.atomic_add(jt_lam_out, a, at.lam[r] * Ja)
        wp.atomic_add(jt_lam_out, b, at.lam[r] * Jb)


@wp.kernel
def residual_contact_rows(
    stride: int,
    chunk: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    ct: Contacts,
    at: Iterate,
    skip: wp.array[int],
    # Data out:
    r_con_out: wp.array[float],
    jt_lam_out: wp.array[wp.spatial_vector],
):
    # a thread per (world, chunk of `chunk` slots below stride): stride = the fullest world's contact count,
    # not the slot capacity (an idle slot's adjoint thread costs as much as its set-up of the argument
    # groups); chunk: row_chunks; skip[w] != 0: the world is left out (as residual_joint_rows)
    w, c0 = world_chunk(wp.tid(), stride, chunk)
    c1 = wp.min(c0 + chunk, ct.count[w])
    if skip[w] != 0:
        c1 = c0
    for ci in range(c0, c1):
        k = w * sc.max_contacts + ci
        rn = w * sc.max_rows + sc.jrows + 3 * ci
        ln = at.lam[rn]
        l1 = at.lam[rn + 1]
        l2 = at.lam[rn + 2]
        b0, b1, Jna, Jnb, J1a, J1b, J2a, J2b, Cn, C1, C2, r0, r1, r2, dn, d1, d2 = contact_eval(
            k, sc, model, data, ct, at, ln, l1, l2
        )
        r_con_out[rn] = r0
        r_con_out[rn + 1] = r1
        r_con_out[rn + 2] = r2
        if b0 >= 0:
            wp.atomic_add(jt_lam_out, b0, ln * Jna + l1 * J1a + l2 * J2a)
        if b1 >= 0:
            wp.atomic_add(jt_lam_out, b1, ln * Jnb + l1 * J1b + l2 * J2b)


@wp.func
def frozen_point_shift(b: int, P: wp.vec3, xc: wp.vec3, geom: Poses, live: Poses):
    """First-order motion of the material point P of body b from its frozen pose (geom) to the live pose
    (live): dx + dtheta x (P - x_com), dtheta = 2 vec(q_live q_geom^-1) (zero at the linearisation point; only
    its derivative matters). The static world does not move."""
    if b < 0:
        return wp.vec3(0.0)
    dq = live.q[b] * wp.quat_inverse(geom.q[b])
    s = float(2.0)
    if dq[3] < 0.0:
        s = -2.0
    dth = s * wp.vec3(dq[0], dq[1], dq[2])
    return (live.x[b] - geom.x[b]) + wp.cross(dth, P - xc)


@wp.kernel
def residual_frozen_gap(
    stride: int,
    max_contacts: int,
    model: ModelArrays,
    ct: Contacts,
    geom: Poses,
    prev_geom: Poses,
    live: Poses,
    # Data out:
    thick_out: wp.array[float],
):
    """The truncated pull-back's contact gap (Simulation(pullback="truncated"), paper §IV-D):
    contact geometry (normal, points, lever arms, friction frame) held at the step's converged
    poses, while the gap still moves with the bodies to first order,
    gap = gap(frozen) + n . (dP1 - dP0), dP the motion of the contact points as material points
    of their bodies (frozen_point_shift). Written as an effective thickness ct_thick - n . (dP1 - dP0)
    for residual_contact_rows evaluated at the frozen poses, so the normal impulse keeps its
    dependence on u+ (h J_n) and on q- (J_n through q+ = q- + h G u+); only the rigid-transform
    dependence of n and of the contact points (dJ/dq) is dropped."""
    tid = wp.tid()
    w = tid / stride  # as residual_contact_rows
    ci = tid - w * stride
    if ci >= ct.count[w]:
        return
    k = w * max_contacts + ci
    n, P0, P1, x0, x1, gap = contact_geometry(k, model, ct, geom.x, geom.q, prev_geom.x, prev_geom.q)
    d0 = frozen_point_shift(model.shape_body[ct.shape0[k]], P0, x0, geom, live)
    d1 = frozen_point_shift(model.shape_body[ct.shape1[k]], P1, x1, geom, live)
    thick_out[k] = ct.thick[k] - wp.dot(n, d1 - d0)


@wp.kernel
def residual_dynamics(
    h: float,
    gravity: wp.vec3,
    gyroscopic: int,
    body_mass: wp.array[float],
    body_inertia_unit: wp.array[wp.mat33],
    q_prev: wp.array[wp.quat],
    u_prev: wp.array[wp.spatial_vector],
    u_plus: wp.array[wp.spatial_vector],
    jt_lam: wp.array[wp.spatial_vector],
    nbw: int,
    skip: wp.array[int],
    # Data out:
    r_dyn_out: wp.array[wp.spatial_vector],
):
    """r_dyn = M~(q-) (u+ - u-) - h f_ext(q-, u-) - J^T lam (eq. 10); bodies of worlds with skip[w] != 0
    left out."""
    b = wp.tid()
    if skip[b / nbw] != 0:
        return
    m = body_mass[b]
    if m <= 0.0:
        r_dyn_out[b] = wp.spatial_vector()
        return
    R = wp.quat_to_matrix(q_prev[b])
    I = R * (m * body_inertia_unit[b]) * wp.transpose(R)
    w = sv_ang(u_prev[b])
    tau = wp.vec3(0.0)
    if gyroscopic != 0:
        tau = gyroscopic_impulse(w, I, h) / h
    f = wp.spatial_vector(h * m * gravity, h * tau)
    r_dyn_out[b] = mass_apply(m, I, u_plus[b] - u_prev[b]) - f - jt_lam[b]


@wp.func
def eliminate_rhs(w: int, nrows: int, sc: StepConstants, rows: Rows, v: AdjointVectors, rhs_out: wp.array[float]):
    """`eliminate` up to its Schur solve: the right-hand side y_lam + J M~^-1 y_u of world w's rows."""
    bbase = w * sc.nbody
    rbase = w * sc.max_rows
    for i in range(sc.nbody):
        b = bbase + i
        v.ydyn[b] = inv_mass_apply(rows.inv_m[b], rows.inv_I[b], v.y_u[b])
    for i in range(nrows):
        r = rbase + i
        rhs_out[r] = v.y_lam[r] + row_dot(rows.Ja[r], body_vel(v.ydyn, rows.a[r]), rows.Jb[r],
                                          body_vel(v.ydyn, rows.b[r]))
    return 0


@wp.func
def eliminate_back(w: int, nrows: int, sc: StepConstants, rows: Rows, v: AdjointVectors, scr: SchurScratch):
    """`eliminate` after its Schur solve: w_lam's unused rows zeroed (scr.x), w_u = M~^-1 (y_u - J^T w_lam)."""
    bbase = w * sc.nbody
    rbase = w * sc.max_rows
    for i in range(sc.max_rows - nrows):
        scr.x[rbase + nrows + i] = 0.0
    apply_JT(w, nrows, sc, rows, scr.x, scr.tmp)
    for i in range(sc.nbody):
        b = bbase + i
        v.w_u[b] = inv_mass_apply(rows.inv_m[b], rows.inv_I[b], v.y_u[b] - scr.tmp[b])
    return 0


@wp.func
def eliminate(w: int, nrows: int, direct: int, sc: StepConstants, pcr_iters: int, rows: Rows, v: AdjointVectors,
              scr: SchurScratch):
    """World w's solve of the forward operator's transposed step system by eliminating w_u (eq. 18-19, below)
    on its ``nrows`` built rows: the Schur system by the world's dense factor (``direct``, `schur.schur_solve`)
    or by PCR (pcr_iters iterations)."""
    eliminate_rhs(w, nrows, sc, rows, v, scr.rhs)
    schur_solve(direct, w, nrows, sc, rows, scr, pcr_iters, 0.0)
    eliminate_back(w, nrows, sc, rows, v, scr)
    return 0


@wp.kernel(enable_backward=False)
def adjoint_system(
    sc: StepConstants,
    pcr_iters: int,
    # Model:
    model: ModelArrays,
    # Data in (the converged step; data.x_prev, q_prev and targets from the residual's workspace):
    data: StepData,
    ct: Contacts,
    at: Iterate,
    # Data in/out (y_u, y_lam in; w_u and scr.x (w_lam) out; ydyn, scr scratch):
    v: AdjointVectors,
    rows: Rows,
    scr: SchurScratch,
):
    """Solve the transposed step system of the forward operator at the returned iterate (W at its
    converged value, lagged), a thread per world, by eliminating w_u (eq. 18-19):

        [M~  J^T] [w_u  ]   [y_u  ]      (J M~^-1 J^T + C) w_lam = y_lam + J M~^-1 y_u
        [-J  C  ] [w_lam] = [y_lam]  =>  w_u = M~^-1 (y_u - J^T w_lam)

    With y_u = -dL/du+ and y_lam = 0 this is the paper's adjoint; it also serves as the
    preconditioner of the exact adjoint solve (rollout.Simulation)."""
    w = wp.tid()
    nrows = build_rows(w, sc, model, data, ct, at, rows)
    eliminate(w, nrows, 0, sc, pcr_iters, rows, v, scr)


def precond_kernels(width: int) -> tuple[wp.Kernel, wp.Kernel]:
    """(`precond_factor`, `precond_apply`) for one lane width (one of LANE_WIDTHS), made once per width as
    Warp closures over the width's lane code (`schur_lanes.lane_code`); every width is made when this module loads."""
    if width in _PRECOND:
        return _PRECOND[width]
    lc = lane_code(width)  # the width's lane types and functions
    mod = lane_module(__name__, width)  # a width other than LANES: its kernels in a module of their own

    @wp.kernel(enable_backward=False, module=mod)
    def precond_factor(
        sc: StepConstants,
        # Model:
        model: ModelArrays,
        # Data in (the converged step, as adjoint_system):
        data: StepData,
        ct: Contacts,
        at: Iterate,
        # Data out:
        nrows_out: wp.array[int],
        direct_out: wp.array[int],
        rows: Rows,
        scr: SchurScratch,
        lanes: int,
        groups: int,
        ln: lc.LaneScratch,
        S_lanes: wp.array[lc.laned],
    ):
        """The Krylov adjoint's preconditioner, set up once per step: the rows of the forward operator at the
        converged iterate (W frozen) and, when they number at most dm = scr.dm, the dense Cholesky factor of the
        Schur matrix J M~^-1 J^T + C (`schur.dense_factor`); larger worlds keep the PCR (`precond_apply`).
        A thread per world (lanes = 1) or per LANES worlds, factored together (`schur_lanes.lane_dense_factor`, the
        same factor bit for bit) and kept in lanes (S_lanes: scr.S seen as LANES-wide vectors, group g's worlds'
        region at g * dm * dm; direct = 2) when their rows share one structure; ``groups`` groups per thread."""
        for gi in range(groups):  # groups of `lanes` worlds per thread (SolverOstrich._thread_groups)
            g = wp.tid() * groups + gi
            if g * lanes >= nrows_out.shape[0]:
                break
            dm = scr.dm
            want = lc.lanei()
            for j in range(lanes):  # a runtime bound: not unrolled
                w = g * lanes + j
                if w < nrows_out.shape[0]:
                    nrows = build_rows(w, sc, model, data, ct, at, rows)
                    nrows_out[w] = nrows
                    direct = int(0)
                    if nrows <= dm:
                        want[j] = 1
                        direct = 1
                    direct_out[w] = direct
            if lanes == 1:
                if want[0] != 0:
                    dense_factor(g, nrows_out[g], sc, rows, scr)
            # a lanes' factor stays in lanes (S_lanes: the group's worlds' region of scr.S), marked direct = 2
            elif lc.lane_dense_factor(g, want, sc, rows, nrows_out, scr, ln, S_lanes, g * dm * dm) != 0:
                for j in range(lanes):
                    if want[j] != 0:
                        direct_out[g * lanes + j] = 2


    @wp.kernel(enable_backward=False, module=mod)
    def precond_apply(
        sc: StepConstants,
        pcr_iters: int,
        lanes: int,
        groups: int,
        # Data in:
        nrows_in: wp.array[int],
        direct_in: wp.array[int],
        rows: Rows,
        S_lanes: wp.array[lc.laned],
        skip: wp.array[int],
        # Data in/out (as adjoint_system's):
        v: AdjointVectors,
        # Scratch:
        scr: SchurScratch,
        ln: lc.LaneScratch,
    ):
        """adjoint_system's elimination (eq. 18-19) with `precond_factor`'s rows and factor: the Krylov
        adjoint's preconditioner applied to (y_u, y_lam), a thread per world (lanes = 1) or per LANES worlds,
        whose factors kept in lanes (direct = 2) are solved in lanes (`schur_lanes.lane_dense_solve`, each world's
        solve bit for bit), ``groups`` groups per thread; worlds with skip[w] != 0 (their GMRES done) are left out."""
        nw = nrows_in.shape[0]
        for gi in range(groups):  # groups of `lanes` worlds per thread (SolverOstrich._thread_groups)
            g = wp.tid() * groups + gi
            if g * lanes >= nw:
                break
            go = lc.lanei()
            n = int(0)
            for j in range(lanes):  # a runtime bound: not unrolled
                w = g * lanes + j
                if w < nw:
                    if skip[w] == 0:
                        nrows = nrows_in[w]
                        eliminate_rhs(w, nrows, sc, rows, v, scr.rhs)
                        if direct_in[w] == 2:
                            go[j] = 1
                            n = nrows
                        else:
                            schur_solve(direct_in[w], w, nrows, sc, rows, scr, pcr_iters, 0.0)
            if n > 0:
                lc.lane_dense_solve(g, go, n, sc, rows, scr, S_lanes, g * scr.dm * scr.dm, ln)
            for j in range(lanes):
                w = g * lanes + j
                if w < nw:
                    if skip[w] == 0:
                        eliminate_back(w, nrows_in[w], sc, rows, v, scr)

    _PRECOND[width] = (precond_factor, precond_apply)
    return precond_factor, precond_apply


_PRECOND: dict[int, tuple[wp.Kernel, wp.Kernel]] = {}
for _w in LANE_WIDTHS:
    precond_kernels(_w)
precond_factor, precond_apply = precond_kernels(LANES)
