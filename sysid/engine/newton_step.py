"""Non-smooth Newton step (eq. 9-13): one fused kernel launch per Newton iteration, a thread per world.

Per iteration a world's thread: integrates q+ from the current u (G frozen at q-), builds every
constraint row at q+ (joints, servos, Fischer-Burmeister normals, friction with the compliance
weight W frozen for this iteration), evaluates the residual and tracks the best iterate, solves
the Schur system (J M~^-1 J^T + C) dlam = J M~^-1 r_dyn - r_con matrix-free by PCR with a Jacobi
preconditioner, back-substitutes du = M~^-1 (J^T dlam - r_dyn) and applies the friction
safeguards. Launch overhead, not arithmetic, dominates small scenes on the CPU, hence the fusion.
"""

from __future__ import annotations

import warp as wp

from .constraints import (
    JROW_SERVO,
    contact_frame,
    contact_point,
    joint_row,
    point_jacobian,
    row_dot,
)
from .kinematics import (
    body_state,
    gyroscopic_impulse,
    integrate_com,
    integrate_quat,
    inv_mass_apply,
    mass_apply,
    origin_from_com,
    sv_ang,
)
from .types import ROW_FRICTION, ROW_JOINT, ROW_NORMAL, ROW_SERVO, ROW_SERVO_LIMITED

wp.set_module_options({"enable_backward": False})

_ROUND = 6  # newton.GeoType.CYLINDER
_BOX = 7  # newton.GeoType.BOX
# wheel-on-static-box contacts: one per pair, normal and box point from the wheel centre at the
# step's midpoint (wheel_box_contact), smooth in q- and q+; 0 keeps newton's points and normals
EDGE_GEOMETRY = wp.constant(1)
# pose of the wheel-box geometry between q- (0) and the iterate q+ (1). Measured 2026-12-02, h = 0.1 s
# pallet traversal against h = 5 ms (rolling start / 0.5 s soft start / step start): 0: 4.2 / 7.2 /
# 6.6 cm, 1: 6.9 / 6.9 / 11.9 cm (a step cuts the corner round the far edge), 0.5: 2.9 / 1.5 / 9.2 cm.
WB_BLEND = wp.constant(0.5)


@wp.func
def wheel_on_static_box(s_box: int, s_wheel: int, shape_body: wp.array(dtype=int), shape_type: wp.array(dtype=int)):
    """Whether shape s_box is a static box and s_wheel a cylinder (a wheel on the pallet): such a
    pair has one contact, computed by wheel_box_contact from the wheel centre."""
    return EDGE_GEOMETRY != 0 and shape_body[s_box] < 0 and shape_type[s_box] == _BOX and shape_type[s_wheel] == _ROUND


# ---------------------------------------------------------------------------------------------
# Set-up kernels (once per step)
# ---------------------------------------------------------------------------------------------


@wp.kernel
def prepare_bodies(
    # Model:
    body_com: wp.array(dtype=wp.vec3),
    body_mass: wp.array(dtype=float),
    body_inertia_unit: wp.array(dtype=wp.mat33),
    gravity: wp.vec3,
    h: float,
    gyroscopic: int,
    # Data in:
    body_q_in: wp.array(dtype=wp.transform),
    body_qd_in: wp.array(dtype=wp.spatial_vector),
    # Data out:
    x_prev_out: wp.array(dtype=wp.vec3),
    q_prev_out: wp.array(dtype=wp.quat),
    u_prev_out: wp.array(dtype=wp.spatial_vector),
    inv_m_out: wp.array(dtype=float),
    I_out: wp.array(dtype=wp.mat33),
    inv_I_out: wp.array(dtype=wp.mat33),
    f_imp_out: wp.array(dtype=wp.spatial_vector),
    u_out: wp.array(dtype=wp.spatial_vector),
):
    b = wp.tid()
    T = body_q_in[b]
    q = wp.transform_get_rotation(T)
    x = wp.transform_point(T, body_com[b])
    u = body_qd_in[b]
    m = body_mass[b]
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
    x_prev_out[b] = x
    q_prev_out[b] = q
    u_prev_out[b] = u
    inv_m_out[b] = inv_m
    I_out[b] = I
    inv_I_out[b] = inv_I
    f_imp_out[b] = f
    u_out[b] = u + inv_mass_apply(inv_m, inv_I, f)


@wp.kernel
def gather_contacts(
    # Model:
    shape_body: wp.array(dtype=int),
    body_world: wp.array(dtype=int),
    max_contacts: int,
    # Data in:
    rigid_contact_count: wp.array(dtype=int),
    rigid_contact_shape0: wp.array(dtype=int),
    rigid_contact_shape1: wp.array(dtype=int),
    # Data out:
    ct_count_out: wp.array(dtype=int),
    ct_overflow_out: wp.array(dtype=int),
    ct_src_out: wp.array(dtype=int),
):
    i = wp.tid()
    if i >= rigid_contact_count[0]:
        return
    s0 = rigid_contact_shape0[i]
    s1 = rigid_contact_shape1[i]
    if s0 < 0 or s1 < 0:
        return
    b0 = shape_body[s0]
    b1 = shape_body[s1]
    w = -1
    if b0 >= 0:
        w = body_world[b0]
    elif b1 >= 0:
        w = body_world[b1]
    if w < 0:
        return
    slot = wp.atomic_add(ct_count_out, w, 1)
    if slot >= max_contacts:
        wp.atomic_add(ct_overflow_out, w, 1)
        return
    ct_src_out[w * max_contacts + slot] = i


@wp.kernel
def prepare_contacts(
    # Model:
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_aniso: wp.array(dtype=int),
    max_contacts: int,
    shape_key_stride: int,
    # Data in:
    q_prev: wp.array(dtype=wp.quat),
    rigid_contact_shape0: wp.array(dtype=int),
    rigid_contact_shape1: wp.array(dtype=int),
    rigid_contact_point0: wp.array(dtype=wp.vec3),
    rigid_contact_point1: wp.array(dtype=wp.vec3),
    rigid_contact_normal: wp.array(dtype=wp.vec3),
    rigid_contact_margin0: wp.array(dtype=float),
    rigid_contact_margin1: wp.array(dtype=float),
    # Data in/out:
    ct_count: wp.array(dtype=int),
    ct_src: wp.array(dtype=int),
    # Data out:
    ct_shape0_out: wp.array(dtype=int),
    ct_shape1_out: wp.array(dtype=int),
    ct_p0_out: wp.array(dtype=wp.vec3),
    ct_p1_out: wp.array(dtype=wp.vec3),
    ct_n_out: wp.array(dtype=wp.vec3),
    ct_nbody_out: wp.array(dtype=int),
    ct_thick_out: wp.array(dtype=float),
    ct_axial0_out: wp.array(dtype=float),
    ct_axial1_out: wp.array(dtype=float),
    ct_fric_shape_out: wp.array(dtype=int),
    ct_nw_out: wp.array(dtype=wp.vec3),
):
    """Sort a world's contacts by (shape pair, newton index) so the row order, and hence the
    floating-point result, does not depend on the other worlds; then store them in the frames
    they move with."""
    w = wp.tid()
    n = wp.min(ct_count[w], max_contacts)
    ct_count[w] = n
    base = w * max_contacts
    # insertion sort by key
    for i in range(1, n):
        v = ct_src[base + i]
        kv = rigid_contact_shape0[v] * shape_key_stride + rigid_contact_shape1[v]
        j = i - 1
        while j >= 0:
            u = ct_src[base + j]
            ku = rigid_contact_shape0[u] * shape_key_stride + rigid_contact_shape1[u]
            if ku > kv or (ku == kv and u > v):
                ct_src[base + j + 1] = u
                j = j - 1
            else:
                break
        ct_src[base + j + 1] = v
    # A cylinder (wheel) touching a face gets two rim points from newton; they share one normal
    # and their load split is a stiff, nearly indeterminate mode, so merge them into one contact
    # at the tread centre (camber is held by the wheel's joint). Contacts with distinct normals
    # (a pallet edge and its top face) stay separate.
    m = int(0)
    for i in range(n):
        src = ct_src[base + i]
        s0 = rigid_contact_shape0[src]
        s1 = rigid_contact_shape1[src]
        merged = int(0)
        if m > 0 and (shape_type[s0] == _ROUND or shape_type[s1] == _ROUND):
            prev = ct_src[base + m - 1]
            if rigid_contact_shape0[prev] == s0 and rigid_contact_shape1[prev] == s1:
                if wp.dot(rigid_contact_normal[prev], rigid_contact_normal[src]) > 0.98:
                    merged = 1
                # a wheel and a static box touch at one point (contact_geometry computes it from
                # the wheel centre), so every contact newton reports for the pair shares one slot
                if wheel_on_static_box(s0, s1, shape_body, shape_type) or wheel_on_static_box(
                    s1, s0, shape_body, shape_type
                ):
                    merged = 1
        if merged == 0:
            ct_src[base + m] = src
            m += 1
    n = m
    ct_count[w] = n
    for i in range(n):
        k = base + i
        src = ct_src[k]
        s0 = rigid_contact_shape0[src]
        s1 = rigid_contact_shape1[src]
        b0 = shape_body[s0]
        b1 = shape_body[s1]
        n_w = rigid_contact_normal[src]
        # The normal moves with the static side if any, else with the non-round shape.
        nb = -1
        if b0 >= 0 and b1 >= 0:
            nb = b0
            if shape_type[s0] == _ROUND:
                nb = b1
        n_l = n_w
        if nb >= 0:
            n_l = wp.quat_rotate_inv(q_prev[nb], n_w)
        p0 = rigid_contact_point0[src]
        p1 = rigid_contact_point1[src]
        ax0 = float(0.0)
        ax1 = float(0.0)
        # a wheel's contact sits at the tread centre (axial offset 0) after the merge above
        if b0 >= 0 and shape_type[s0] == _ROUND:
            ax0 = float(0.0)
        if b1 >= 0 and shape_type[s1] == _ROUND:
            ax1 = float(0.0)
        fs = -1
        if shape_aniso[s0] != 0:
            fs = s0
        if shape_aniso[s1] != 0:
            fs = s1
        ct_shape0_out[k] = s0
        ct_shape1_out[k] = s1
        ct_p0_out[k] = p0
        ct_p1_out[k] = p1
        ct_n_out[k] = n_l
        ct_nw_out[k] = n_w
        ct_nbody_out[k] = nb
        ct_thick_out[k] = rigid_contact_margin0[src] + rigid_contact_margin1[src]
        ct_axial0_out[k] = ax0
        ct_axial1_out[k] = ax1
        ct_fric_shape_out[k] = fs


@wp.kernel
def prepare_joints(
    # Model:
    joint_qd_start: wp.array(dtype=int),
    joint_target_q_start: wp.array(dtype=int),
    # Data in:
    joint_target_q: wp.array(dtype=float),
    joint_target_qd: wp.array(dtype=float),
    has_target_q: int,
    has_target_qd: int,
    # Data out:
    jt_q_out: wp.array(dtype=float),
    jt_qd_out: wp.array(dtype=float),
):
    j = wp.tid()
    d = joint_qd_start[j]
    if has_target_qd != 0:
        jt_qd_out[j] = joint_target_qd[d]
    if has_target_q != 0:
        jt_q_out[j] = joint_target_q[joint_target_q_start[j]]


# ---------------------------------------------------------------------------------------------
# Row construction shared by the Newton iteration and the adjoint
# ---------------------------------------------------------------------------------------------


@wp.func
def wheel_box_contact(
    X_box: wp.transform,
    half: wp.vec3,
    x_c: wp.vec3,
    q_c: wp.quat,
    com_c: wp.vec3,
    X_cyl: wp.transform,
):
    """Contact of a cylinder (wheel) with a static box from the wheel centre C at the wheel pose
    (x_c, q_c): the box point P closest to C (C clamped to the box) and the unit normal from P
    toward C. On a face that is the face's normal, over an edge the edge point with the normal
    toward C, continuous from the front face over the edge onto the top face, whatever point
    newton reported. ok = 0 when C lies inside the box (the stored geometry is kept).
    contact_geometry evaluates it at the wheel pose halfway between the step's start (q-) and the
    iterate (q+) (WB_BLEND): at q+ alone a 0.1 s step cuts the corner round the pallet's far edge,
    at q- alone the wheel rides the top face's plane past the edge for a step; the adjoint
    differentiates it through both."""
    Xs = wp.transform_multiply(origin_from_com(x_c, q_c, com_c), X_cyl)
    C = wp.transform_get_translation(Xs)
    Cb = wp.transform_point(wp.transform_inverse(X_box), C)
    Pb = wp.vec3(wp.clamp(Cb[0], -half[0], half[0]), wp.clamp(Cb[1], -half[1], half[1]),
                 wp.clamp(Cb[2], -half[2], half[2]))
    d = Cb - Pb
    L = wp.length(d)
    if L < 1.0e-6:
        return int(0), wp.vec3(), wp.vec3()
    n = wp.quat_rotate(wp.transform_get_rotation(X_box), d / L)
    return int(1), n, wp.transform_point(X_box, Pb)


@wp.func
def wheel_box_midstep(
    b: int,
    x: wp.array(dtype=wp.vec3),
    q: wp.array(dtype=wp.quat),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    body_com: wp.array(dtype=wp.vec3),
    X_box: wp.transform,
    half: wp.vec3,
    X_cyl: wp.transform,
):
    """wheel_box_contact for wheel body b at the pose WB_BLEND of the way from q- to the iterate."""
    xb = WB_BLEND * x[b] + (1.0 - WB_BLEND) * x_prev[b]
    qb = wp.normalize(WB_BLEND * q[b] + (1.0 - WB_BLEND) * q_prev[b])
    return wheel_box_contact(X_box, half, xb, qb, body_com[b], X_cyl)


@wp.func
def contact_geometry(
    k: int,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_p0: wp.array(dtype=wp.vec3),
    ct_p1: wp.array(dtype=wp.vec3),
    ct_n: wp.array(dtype=wp.vec3),
    ct_nbody: wp.array(dtype=int),
    ct_thick: wp.array(dtype=float),
    ct_axial0: wp.array(dtype=float),
    ct_axial1: wp.array(dtype=float),
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    body_com: wp.array(dtype=wp.vec3),
    x: wp.array(dtype=wp.vec3),
    q: wp.array(dtype=wp.quat),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
):
    """Normal n, points P0/P1 [m] and gap [m] of contact slot k at body poses (x, q); a wheel on a
    static box takes its normal and box point from the wheel halfway between q- (x_prev, q_prev)
    and (x, q) (wheel_box_midstep)."""
    s0 = ct_shape0[k]
    s1 = ct_shape1[k]
    b0 = shape_body[s0]
    b1 = shape_body[s1]
    nb = ct_nbody[k]
    n = ct_n[k]
    if nb >= 0:
        n = wp.quat_rotate(q[nb], n)
    x0, q0, c0 = body_state(b0, x, q, body_com)
    x1, q1, c1 = body_state(b1, x, q, body_com)
    cyl0 = 0
    if shape_type[s0] == _ROUND:
        cyl0 = 1
    cyl1 = 0
    if shape_type[s1] == _ROUND:
        cyl1 = 1
    p0 = ct_p0[k]
    p1 = ct_p1[k]
    # a wheel on a static box (the pallet): normal and box point from the wheel centre at the
    # step's midpoint (closest box point), smooth over faces and edges and independent of which
    # points newton reported, so the step map, the adjoint and finite differences agree
    if wheel_on_static_box(s0, s1, shape_body, shape_type):
        ok, nn, pe = wheel_box_midstep(b1, x, q, x_prev, q_prev, body_com, shape_transform[s0], shape_scale[s0],
                                       shape_transform[s1])
        if ok != 0:
            n = nn
            p0 = pe
    if wheel_on_static_box(s1, s0, shape_body, shape_type):
        ok, nn, pe = wheel_box_midstep(b0, x, q, x_prev, q_prev, body_com, shape_transform[s1], shape_scale[s1],
                                       shape_transform[s0])
        if ok != 0:
            n = -nn
            p1 = pe
    P0 = contact_point(b0, x0, q0, c0, p0, cyl0, shape_transform[s0], shape_scale[s0][0], ct_axial0[k], n)
    P1 = contact_point(b1, x1, q1, c1, p1, cyl1, shape_transform[s1], shape_scale[s1][0], ct_axial1[k], -n)
    gap = wp.dot(n, P1 - P0) - ct_thick[k]
    return n, P0, P1, x0, x1, gap


@wp.func
def friction_params(
    k: int,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    q: wp.array(dtype=wp.quat),
):
    """(mu_long, mu_lat, lateral axis in world, has_lateral) of contact slot k.

    A contact with an anisotropic shape (a wheel) takes that shape's pair and its axle as the
    lateral direction; otherwise the two shapes' coefficients are averaged, isotropically.
    """
    fs = ct_fric_shape[k]
    lat = wp.vec3(0.0, 0.0, 1.0)
    if fs >= 0:
        b = shape_body[fs]
        ql = wp.transform_get_rotation(shape_transform[fs])
        if b >= 0:
            ql = q[b] * ql
        lat = wp.quat_rotate(ql, wp.vec3(0.0, 0.0, 1.0))
        return shape_mu[fs], shape_mu_lat[fs], lat, 1
    mu = 0.5 * (shape_mu[ct_shape0[k]] + shape_mu[ct_shape1[k]])
    return mu, mu, lat, 0


SLIP_GAIN_MAX = wp.constant(2.0)  # see friction_weight
SERVO_GAIN_MAX = wp.constant(2.0)  # Newton gain cap of the torque-limited servo (joint_row_eval)
SERVO_SAT_MAX = wp.constant(1.0e4)  # |n| cap of the torque-limited servo (joint_row_eval): float32 range


@wp.func
def contact_slip(
    k: int,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_slip: wp.array(dtype=float),
    shape_slip_lat: wp.array(dtype=float),
):
    """Slip speeds (v_s, v_s,lat) [m/s] of contact slot k's regularised friction: the wheel's own
    where the contact has an anisotropic shape, else the larger of the two shapes'. v_s = 0: exact
    Coulomb; v_s,lat = 0: one slip speed for the cone-scaled slip (see friction_weight); > 0:
    separate longitudinal / lateral slip speeds (the combined-slip law), on anisotropic shapes only
    (an isotropic contact's tangent frame is arbitrary, so it has no lateral direction)."""
    fs = ct_fric_shape[k]
    if fs >= 0:
        return shape_slip[fs], shape_slip_lat[fs]
    return wp.max(shape_slip[ct_shape0[k]], shape_slip[ct_shape1[k]]), 0.0


@wp.func
def body_vel(u: wp.array(dtype=wp.spatial_vector), b: int):
    if b < 0:
        return wp.spatial_vector()
    return u[b]


@wp.func
def body_inv_apply(
    inv_m: wp.array(dtype=float), inv_I: wp.array(dtype=wp.mat33), b: int, f: wp.spatial_vector
):
    if b < 0:
        return wp.spatial_vector()
    return inv_mass_apply(inv_m[b], inv_I[b], f)


@wp.func
def eff_inv_mass(
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    a: int,
    Ja: wp.spatial_vector,
    b: int,
    Jb: wp.spatial_vector,
):
    """d = J M~^-1 J^T of one row [1/kg or 1/(kg m^2)]."""
    return wp.dot(Ja, body_inv_apply(inv_m, inv_I, a, Ja)) + wp.dot(Jb, body_inv_apply(inv_m, inv_I, b, Jb))


# ---------------------------------------------------------------------------------------------
# The fused Newton iteration
# ---------------------------------------------------------------------------------------------


@wp.func
def apply_JT(
    nrows: int,
    rbase: int,
    bbase: int,
    nbody: int,
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    v: wp.array(dtype=float),
    out: wp.array(dtype=wp.spatial_vector),
):
    """out[body] = sum_rows J^T v over one world's rows."""
    for i in range(nbody):
        out[bbase + i] = wp.spatial_vector()
    for i in range(nrows):
        r = rbase + i
        vi = v[r]
        a = row_a[r]
        if a >= 0:
            out[a] = out[a] + vi * row_Ja[r]
        b = row_b[r]
        if b >= 0:
            out[b] = out[b] + vi * row_Jb[r]
    return 0


@wp.func
def apply_A(
    nrows: int,
    rbase: int,
    bbase: int,
    nbody: int,
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    v: wp.array(dtype=float),
    tmp: wp.array(dtype=wp.spatial_vector),
    out: wp.array(dtype=float),
):
    """out = (J M~^-1 J^T + C) v, matrix-free, for one world."""
    apply_JT(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, v, tmp)
    for i in range(nbody):
        bi = bbase + i
        tmp[bi] = inv_mass_apply(inv_m[bi], inv_I[bi], tmp[bi])
    for i in range(nrows):
        r = rbase + i
        out[r] = row_dot(row_Ja[r], body_vel(tmp, row_a[r]), row_Jb[r], body_vel(tmp, row_b[r])) + row_C[r] * v[r]
    return 0


@wp.func
def wdot(nrows: int, rbase: int, x: wp.array(dtype=float), y: wp.array(dtype=float)):
    s = float(0.0)
    for i in range(nrows):
        s += x[rbase + i] * y[rbase + i]
    return s


@wp.func
def pcr_solve(
    nrows: int,
    rbase: int,
    bbase: int,
    nbody: int,
    iters: int,
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    row_pinv: wp.array(dtype=float),
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    rhs: wp.array(dtype=float),
    x: wp.array(dtype=float),
    r: wp.array(dtype=float),
    z: wp.array(dtype=float),
    p: wp.array(dtype=float),
    Az: wp.array(dtype=float),
    Ap: wp.array(dtype=float),
    tmp: wp.array(dtype=wp.spatial_vector),
    tol: float,
):
    """Preconditioned conjugate residual for A x = rhs (A symmetric), Jacobi preconditioner, x0 = 0."""
    for i in range(nrows):
        k = rbase + i
        x[k] = 0.0
        r[k] = rhs[k]
        z[k] = row_pinv[k] * rhs[k]
        p[k] = z[k]
    apply_A(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, row_C, inv_m, inv_I, z, tmp, Az)
    for i in range(nrows):
        Ap[rbase + i] = Az[rbase + i]
    zAz = wdot(nrows, rbase, z, Az)
    r0 = wdot(nrows, rbase, r, z)
    for _it in range(iters):
        if tol > 0.0 and wdot(nrows, rbase, r, z) <= tol * tol * r0:
            break
        ApPAp = float(0.0)
        for i in range(nrows):
            k = rbase + i
            ApPAp += Ap[k] * row_pinv[k] * Ap[k]
        if ApPAp <= 1.0e-30 or zAz == 0.0:
            break
        alpha = zAz / ApPAp
        for i in range(nrows):
            k = rbase + i
            x[k] = x[k] + alpha * p[k]
            r[k] = r[k] - alpha * Ap[k]
            z[k] = z[k] - alpha * row_pinv[k] * Ap[k]
        apply_A(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, row_C, inv_m, inv_I, z, tmp, Az)
        zAz_new = wdot(nrows, rbase, z, Az)
        beta = zAz_new / zAz
        zAz = zAz_new
        for i in range(nrows):
            k = rbase + i
            p[k] = z[k] + beta * p[k]
            Ap[k] = Az[k] + beta * Ap[k]
    return 0


@wp.func
def friction_weight(
    v1: float,
    v2: float,
    l1: float,
    l2: float,
    ln: float,
    mu1: float,
    mu2: float,
    d1: float,
    d2: float,
    inactive_w: float,
    eps: float,
    vs: float,
    vs_lat: float,
):
    """Compliance weights (W1, W2) >= 0 of the elliptic Coulomb cone |(l1/mu1, l2/mu2)| <= ln,
    and the Newton gains (g1, g2) of the rows (1 for Coulomb friction; see below).

    In cone-scaled variables (v~ = mu v, l~ = l / mu) the isotropic weight is
    W~ = (sqrt(|v~|^2 + b^2) - b) / ln with b = d (ln - |l~|): zero when sticking (v = 0,
    inside the cone), |v~|/ln when sliding on the cone; W_k = W~ / mu_k^2.
    With a slip speed vs > 0 (regularised Coulomb) W~ = sqrt(|v~|^2 + (mu_g vs)^2) / ln,
    mu_g = sqrt(mu1 mu2): the fixed point is |l~| = ln |v~| / sqrt(|v~|^2 + (mu_g vs)^2), viscous
    below vs and Coulomb above it, smooth and strictly inside the cone. Its rows are Newton
    linearisations of that law, not the lagged weight (which converges only linearly, with rate
    |v~|^2 / s^2, s^2 = |v~|^2 + (mu_g vs)^2): row k is g_k (v_k + W_k l_k) = 0 with compliance
    g_k W_k, g_k = s^2 / (s^2 - v~_k^2), so that d(row)/dv_k = 1 at the fixed point (the
    cross-coupling of the two rows is left out), with g_k capped at SLIP_GAIN_MAX: the full
    Newton slope overshoots from deep in the Coulomb part of a steep law (v_s = 1 mm/s on an
    incline at h = 0.1 s diverged; cap 2 converges there and at every case of the tests, 4 and 10
    do not). The fixed point does not depend on g.

    With a lateral slip speed vs_lat > 0 as well (the combined-slip law, docs/traction.md) each
    direction has its own slip speed s_k (s_1 = vs, s_2 = vs_lat): with normalised slip
    n_k = v_k / s_k and S = sqrt(n_1^2 + n_2^2 + 1) the friction is l_k = -mu_k ln n_k / S, i.e.
    W_k = s_k S / (mu_k ln): linear stiffness mu_k ln / s_k per m/s in each direction, saturation
    on the friction ellipse |(l_1/mu_1, l_2/mu_2)| -> ln. The single-slip law above is this law
    with s_k = vs sqrt(mu_1 mu_2) / mu_k. Gains g_k = S^2 / (S^2 - n_k^2) as above.
    """
    m1 = wp.max(mu1, 1.0e-6)
    m2 = wp.max(mu2, 1.0e-6)
    dm = 0.5 * (d1 + d2)
    if ln * dm <= 1.0e-7:
        return inactive_w * d1, inactive_w * d2, 1.0, 1.0
    # the tiny floors keep the adjoint finite at zero slip / zero friction (d sqrt(x)/dx at 0)
    if vs > 0.0 and vs_lat > 0.0:
        n1 = v1 / vs
        n2 = v2 / vs_lat
        S2 = n1 * n1 + n2 * n2 + 1.0
        S = wp.sqrt(S2)
        g1 = wp.min(S2 / (S2 - n1 * n1), SLIP_GAIN_MAX)
        g2 = wp.min(S2 / (S2 - n2 * n2), SLIP_GAIN_MAX)
        return vs * S / (m1 * ln), vs_lat * S / (m2 * ln), g1, g2
    va = wp.sqrt(m1 * m1 * v1 * v1 + m2 * m2 * v2 * v2 + 1.0e-24)
    if vs > 0.0:
        vr = vs * wp.sqrt(m1 * m2)
        s2 = va * va + vr * vr
        Wr = wp.sqrt(s2) / ln
        g1 = wp.min(s2 / (s2 - m1 * m1 * v1 * v1), SLIP_GAIN_MAX)
        g2 = wp.min(s2 / (s2 - m2 * m2 * v2 * v2), SLIP_GAIN_MAX)
        return Wr / (m1 * m1), Wr / (m2 * m2), g1, g2
    lt = wp.sqrt(l1 * l1 / (m1 * m1) + l2 * l2 / (m2 * m2) + 1.0e-24)
    b = dm * (ln - lt)
    Wt = (wp.sqrt(va * va + b * b + eps * eps) - b) / ln
    return wp.max(Wt / (m1 * m1), 0.0), wp.max(Wt / (m2 * m2), 0.0), 1.0, 1.0


@wp.func
def joint_row_eval(
    i: int,
    j: int,
    h: float,
    joint_compliance: float,
    body_com: wp.array(dtype=wp.vec3),
    joint_parent: wp.array(dtype=int),
    joint_child: wp.array(dtype=int),
    joint_X_p: wp.array(dtype=wp.transform),
    joint_X_c: wp.array(dtype=wp.transform),
    joint_axis_j: wp.array(dtype=wp.vec3),
    jrow_kind: wp.array(dtype=int),
    j_ke: wp.array(dtype=float),
    j_kd: wp.array(dtype=float),
    j_scale: wp.array(dtype=float),
    j_tau: wp.array(dtype=float),
    x_it: wp.array(dtype=wp.vec3),
    q_it: wp.array(dtype=wp.quat),
    u: wp.array(dtype=wp.spatial_vector),
    lam_r: float,
    jt_q: wp.array(dtype=float),
    jt_qd: wp.array(dtype=float),
    j_qprev: wp.array(dtype=float),
):
    """Joint row i (kind jrow_kind[i]) of joint j at the iterate: bodies, Jacobians, compliance
    C and velocity-level residual r (eq. 3 divided by h, or the servo eq. 8)."""
    kind = jrow_kind[i]
    a = joint_parent[j]
    b = joint_child[j]
    xa, qa, ca = body_state(a, x_it, q_it, body_com)
    c, Ja, Jb = joint_row(
        kind, a, xa, qa, ca, x_it[b], q_it[b], body_com[b], joint_X_p[j], joint_X_c[j], joint_axis_j[j]
    )
    C = float(0.0)
    r = float(0.0)
    if kind == JROW_SERVO:
        # implicit PD servo (eq. 8): tau = ke (qbar - q+) + kd (s ubar - omega+), q+ = q- + h omega+
        vel = row_dot(Ja, body_vel(u, a), Jb, body_vel(u, b))
        ke = j_ke[j]
        kd = j_kd[j]
        den = kd + h * ke
        C = 1.0 / (h * den)
        target = (ke * (jt_q[j] - j_qprev[j]) + kd * j_scale[j] * jt_qd[j]) / den
        r = vel + C * lam_r - target
        tau = j_tau[j]
        if tau > 0.0:
            # torque limit tau [N m]: the impulse saturates smoothly at L = h tau,
            #   lam = L n / sqrt(1 + n^2),  n = (target - vel) / (C L)   (n -> 0: the servo above),
            # as the friction rows do it: g (vel - target + W lam) = 0 with the secant weight
            # W = C sqrt(1 + n^2) frozen at the iterate and a Newton gain g = min(1 + n^2, SLIP_GAIN_MAX)
            # (1 + n^2 makes the row's slope in vel the law's; the cap keeps a deeply saturated servo
            # from cycling between +L and -L across iterates). The fixed point does not depend on g.
            L = h * tau
            n = wp.clamp((target - vel) / (C * L), -SERVO_SAT_MAX, SERVO_SAT_MAX)
            s2 = 1.0 + n * n
            W = C * wp.sqrt(s2)
            g = wp.min(s2, SERVO_GAIN_MAX)
            r = g * (vel + W * lam_r - target)
            C = g * W
    else:
        C = joint_compliance / h
        r = c / h + C * lam_r
    return a, b, Ja, Jb, C, r


@wp.func
def contact_eval(
    k: int,
    h: float,
    fb_eps: float,
    inactive_w: float,
    contact_compliance: float,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_p0: wp.array(dtype=wp.vec3),
    ct_p1: wp.array(dtype=wp.vec3),
    ct_n: wp.array(dtype=wp.vec3),
    ct_nbody: wp.array(dtype=int),
    ct_thick: wp.array(dtype=float),
    ct_axial0: wp.array(dtype=float),
    ct_axial1: wp.array(dtype=float),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    shape_slip: wp.array(dtype=float),
    shape_slip_lat: wp.array(dtype=float),
    body_com: wp.array(dtype=wp.vec3),
    x_it: wp.array(dtype=wp.vec3),
    q_it: wp.array(dtype=wp.quat),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    u: wp.array(dtype=wp.spatial_vector),
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    ln: float,
    l1: float,
    l2: float,
):
    """The three rows of contact slot k at the iterate.

    Normal: phi(gap, h d lam_n) = 0 (eq. 4), divided by h dphi/da so its Jacobian is the J of
    the dynamics (symmetric Schur system). Friction: J_f u + W lam_f = 0 (eq. 7) with W frozen.
    Returns bodies, Jacobian blocks (Jn = (Ja, Jb) etc.), compliances (Cn, C1, C2), residuals
    (rn, r1, r2) and effective inverse masses (dn, d1, d2).
    """
    n, P0, P1, x0, x1, gap = contact_geometry(
        k, ct_shape0, ct_shape1, ct_p0, ct_p1, ct_n, ct_nbody, ct_thick, ct_axial0, ct_axial1,
        shape_body, shape_type, shape_transform, shape_scale, body_com, x_it, q_it, x_prev, q_prev,
    )
    b0 = shape_body[ct_shape0[k]]
    b1 = shape_body[ct_shape1[k]]
    mu1, mu2, lat, has_lat = friction_params(
        k, ct_shape0, ct_shape1, ct_fric_shape, shape_body, shape_transform, shape_mu, shape_mu_lat, q_it
    )
    t1, t2 = contact_frame(n, lat, has_lat)
    Jna = point_jacobian(n, P0, x0, -1.0)
    Jnb = point_jacobian(n, P1, x1, 1.0)
    dn = eff_inv_mass(inv_m, inv_I, b0, Jna, b1, Jnb)
    # a tiny relative compliance makes coplanar contact sets (a box's four corners) determinate
    fa = gap + h * contact_compliance * dn * ln
    fb = h * dn * ln
    s = wp.sqrt(fa * fa + fb * fb + fb_eps * fb_eps)
    phi = fa + fb - s
    da = wp.max(1.0 - fa / s, 1.0e-6)
    db = 1.0 - fb / s
    Cn = contact_compliance * dn + dn * db / da
    rn = phi / (h * da)
    J1a = point_jacobian(t1, P0, x0, -1.0)
    J1b = point_jacobian(t1, P1, x1, 1.0)
    J2a = point_jacobian(t2, P0, x0, -1.0)
    J2b = point_jacobian(t2, P1, x1, 1.0)
    d1 = eff_inv_mass(inv_m, inv_I, b0, J1a, b1, J1b)
    d2 = eff_inv_mass(inv_m, inv_I, b0, J2a, b1, J2b)
    v1 = row_dot(J1a, body_vel(u, b0), J1b, body_vel(u, b1))
    v2 = row_dot(J2a, body_vel(u, b0), J2b, body_vel(u, b1))
    vs, vs_lat = contact_slip(k, ct_shape0, ct_shape1, ct_fric_shape, shape_slip, shape_slip_lat)
    W1, W2, g1, g2 = friction_weight(v1, v2, l1, l2, ln, mu1, mu2, d1, d2, inactive_w, fb_eps, vs, vs_lat)
    if ln * 0.5 * (d1 + d2) <= 1.0e-7:
        # no normal impulse: the friction rows are lam_f = 0, decoupled from u (a row that still
        # carried J would exert a small drag on speculative contacts in free flight)
        z = wp.spatial_vector()
        J1a = z
        J1b = z
        J2a = z
        J2b = z
        W1 = d1
        W2 = d2
        v1 = 0.0
        v2 = 0.0
        d1 = 0.0
        d2 = 0.0
    r1 = g1 * (v1 + W1 * l1)
    r2 = g2 * (v2 + W2 * l2)
    W1 = g1 * W1
    W2 = g2 * W2
    return b0, b1, Jna, Jnb, J1a, J1b, J2a, J2b, Cn, W1, W2, rn, r1, r2, dn, d1, d2


@wp.func
def set_row(
    r: int,
    a: int,
    b: int,
    Ja: wp.spatial_vector,
    Jb: wp.spatial_vector,
    C: float,
    res: float,
    d: float,
    kind: int,
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    row_r: wp.array(dtype=float),
    row_pinv: wp.array(dtype=float),
    row_kind: wp.array(dtype=int),
):
    row_a[r] = a
    row_b[r] = b
    row_Ja[r] = Ja
    row_Jb[r] = Jb
    row_C[r] = C
    row_r[r] = res
    row_pinv[r] = 1.0 / wp.max(d + C, 1.0e-12)
    row_kind[r] = kind
    return 0


@wp.func
def build_rows(
    w: int,
    h: float,
    njoint: int,
    jrows: int,
    max_rows: int,
    max_contacts: int,
    joint_compliance: float,
    fb_eps: float,
    inactive_w: float,
    contact_compliance: float,
    # model
    body_com: wp.array(dtype=wp.vec3),
    joint_parent: wp.array(dtype=int),
    joint_child: wp.array(dtype=int),
    joint_X_p: wp.array(dtype=wp.transform),
    joint_X_c: wp.array(dtype=wp.transform),
    joint_axis_j: wp.array(dtype=wp.vec3),
    jrow_joint: wp.array(dtype=int),
    jrow_kind: wp.array(dtype=int),
    j_ke: wp.array(dtype=float),
    j_kd: wp.array(dtype=float),
    j_scale: wp.array(dtype=float),
    j_tau: wp.array(dtype=float),
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    shape_slip: wp.array(dtype=float),
    shape_slip_lat: wp.array(dtype=float),
    # step data
    x_it: wp.array(dtype=wp.vec3),
    q_it: wp.array(dtype=wp.quat),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    u: wp.array(dtype=wp.spatial_vector),
    lam: wp.array(dtype=float),
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    jt_q: wp.array(dtype=float),
    jt_qd: wp.array(dtype=float),
    j_qprev: wp.array(dtype=float),
    ct_count: wp.array(dtype=int),
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_p0: wp.array(dtype=wp.vec3),
    ct_p1: wp.array(dtype=wp.vec3),
    ct_n: wp.array(dtype=wp.vec3),
    ct_nbody: wp.array(dtype=int),
    ct_thick: wp.array(dtype=float),
    ct_axial0: wp.array(dtype=float),
    ct_axial1: wp.array(dtype=float),
    ct_fric_shape: wp.array(dtype=int),
    # out
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    row_r: wp.array(dtype=float),
    row_pinv: wp.array(dtype=float),
    row_kind: wp.array(dtype=int),
):
    """All rows of world w at the current iterate (W frozen); returns the row count."""
    rbase = w * max_rows
    for i in range(jrows):
        j = w * njoint + jrow_joint[i]
        r = rbase + i
        a, b, Ja, Jb, C, res = joint_row_eval(
            i, j, h, joint_compliance, body_com, joint_parent, joint_child, joint_X_p, joint_X_c, joint_axis_j,
            jrow_kind, j_ke, j_kd, j_scale, j_tau, x_it, q_it, u, lam[r], jt_q, jt_qd, j_qprev,
        )
        kind = ROW_JOINT
        if jrow_kind[i] == JROW_SERVO:
            kind = ROW_SERVO
            if j_tau[j] > 0.0:
                kind = ROW_SERVO_LIMITED
        d = eff_inv_mass(inv_m, inv_I, a, Ja, b, Jb)
        set_row(r, a, b, Ja, Jb, C, res, d, kind, row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind)
    nc = ct_count[w]
    for ci in range(nc):
        k = w * max_contacts + ci
        rn = rbase + jrows + 3 * ci
        b0, b1, Jna, Jnb, J1a, J1b, J2a, J2b, Cn, C1, C2, r0, r1, r2, dn, d1, d2 = contact_eval(
            k, h, fb_eps, inactive_w, contact_compliance, ct_shape0, ct_shape1, ct_p0, ct_p1, ct_n, ct_nbody,
            ct_thick, ct_axial0, ct_axial1, ct_fric_shape, shape_body, shape_type, shape_transform, shape_scale,
            shape_mu, shape_mu_lat, shape_slip, shape_slip_lat,
            body_com, x_it, q_it, x_prev, q_prev, u, inv_m, inv_I, lam[rn], lam[rn + 1], lam[rn + 2],
        )
        set_row(rn, b0, b1, Jna, Jnb, Cn, r0, dn, ROW_NORMAL,
                row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind)
        set_row(rn + 1, b0, b1, J1a, J1b, C1, r1, d1, ROW_FRICTION,
                row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind)
        set_row(rn + 2, b0, b1, J2a, J2b, C2, r2, d2, ROW_FRICTION,
                row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind)
    return jrows + 3 * nc


@wp.func
def cone_mu(
    k: int,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    q_it: wp.array(dtype=wp.quat),
):
    """Contact k's (longitudinal, lateral) friction coefficients, floored at 1e-6 so the cone-scaled
    variables l / mu stay finite."""
    mu1, mu2, lat, has_lat = friction_params(
        k, ct_shape0, ct_shape1, ct_fric_shape, shape_body, shape_transform, shape_mu, shape_mu_lat, q_it
    )
    return wp.max(mu1, 1.0e-6), wp.max(mu2, 1.0e-6)


@wp.func
def cone_projection(
    k: int,
    ln: float,
    l1: float,
    l2: float,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    q_it: wp.array(dtype=wp.quat),
    slack: float,
):
    """Friction safeguards on one contact's multipliers: lam_n >= 0 and |(l1/mu1, l2/mu2)| <= slack lam_n
    (slack 1: the cone). Returns the projection and whether it changed anything."""
    fixed = int(0)
    if ln < 0.0:
        ln = 0.0
        fixed = 1
    m1, m2 = cone_mu(k, ct_shape0, ct_shape1, ct_fric_shape, shape_body, shape_transform, shape_mu, shape_mu_lat, q_it)
    lt = wp.sqrt(l1 * l1 / (m1 * m1) + l2 * l2 / (m2 * m2))
    if lt > slack * ln:
        sc = slack * ln / lt
        l1 = sc * l1
        l2 = sc * l2
        fixed = 1
    return ln, l1, l2, fixed


@wp.func
def shares_pair(w: int, ci: int, max_contacts: int, ct_count: wp.array(dtype=int), ct_shape0: wp.array(dtype=int),
                ct_shape1: wp.array(dtype=int), ct_n: wp.array(dtype=wp.vec3)):
    """Whether contact ci of world w belongs to a redundant set: another contact of the same shape pair
    with (nearly) the same normal, so that their friction rows share the tangent plane (a box's corners
    on a face). Contacts are sorted by shape pair, so a neighbour tells; the normals of one pair are
    stored in the same frame. A wheel's contacts on a mesh have distinct normals (equal ones are merged
    in prepare_contacts) and do not count."""
    k = w * max_contacts + ci
    same = int(0)
    if ci > 0:
        if ct_shape0[k - 1] == ct_shape0[k] and ct_shape1[k - 1] == ct_shape1[k]:
            if wp.dot(ct_n[k - 1], ct_n[k]) > 0.98:
                same = 1
    if ci + 1 < ct_count[w]:
        if ct_shape0[k + 1] == ct_shape0[k] and ct_shape1[k + 1] == ct_shape1[k]:
            if wp.dot(ct_n[k + 1], ct_n[k]) > 0.98:
                same = 1
    return same


@wp.func
def project_cone(
    w: int,
    jrows: int,
    max_rows: int,
    max_contacts: int,
    ct_count: wp.array(dtype=int),
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    q_it: wp.array(dtype=wp.quat),
    lam: wp.array(dtype=float),
    slack: float,
    ct_n: wp.array(dtype=wp.vec3),
):
    """`cone_projection` applied in place to every contact of world w; the cone is widened by slack for
    contacts that share their shape pair with another (friction_safeguard="newton")."""
    rbase = w * max_rows
    for ci in range(ct_count[w]):
        rn = rbase + jrows + 3 * ci
        sl = float(1.0)
        if slack != 1.0 and shares_pair(w, ci, max_contacts, ct_count, ct_shape0, ct_shape1, ct_n) != 0:
            sl = slack
        ln, l1, l2, fixed = cone_projection(
            w * max_contacts + ci, lam[rn], lam[rn + 1], lam[rn + 2], ct_shape0, ct_shape1, ct_fric_shape,
            shape_body, shape_transform, shape_mu, shape_mu_lat, q_it, sl,
        )
        lam[rn] = ln
        lam[rn + 1] = l1
        lam[rn + 2] = l2
    return 0


@wp.func
def slide_weight(
    k: int,
    ln: float,
    l1: float,
    l2: float,
    v1: float,
    v2: float,
    d1: float,
    d2: float,
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_fric_shape: wp.array(dtype=int),
    shape_body: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    q_it: wp.array(dtype=wp.quat),
):
    """Active-set test of one contact in cone-scaled variables (l~ = l / mu, v~ = mu v, one rho
    per contact so that the sliding fixed point opposes the slip): z~ = l~ - rho v~ outside the
    cone |z~| > lam_n means sliding. Returns (slides, W1, W2) with the sliding weight
    W~ = |v~| / lam_n, W_k = W~ / mu_k^2 (eq. 7 at b = 0)."""
    m1, m2 = cone_mu(k, ct_shape0, ct_shape1, ct_fric_shape, shape_body, shape_transform, shape_mu, shape_mu_lat, q_it)
    rho = 2.0 / wp.max(m1 * m1 * d1 + m2 * m2 * d2, 1.0e-12)
    z1 = l1 / m1 - rho * m1 * v1
    z2 = l2 / m2 - rho * m2 * v2
    if z1 * z1 + z2 * z2 <= ln * ln:
        return int(0), 0.0, 0.0
    Wt = wp.sqrt(m1 * m1 * v1 * v1 + m2 * m2 * v2 * v2) / ln
    return int(1), Wt / (m1 * m1), Wt / (m2 * m2)


@wp.kernel
def newton_iteration(
    k: int,
    do_step: int,
    h: float,
    nbody: int,
    njoint: int,
    jrows: int,
    max_rows: int,
    max_contacts: int,
    pcr_iters: int,
    k_min: int,
    tol: float,
    joint_compliance: float,
    fb_eps: float,
    inactive_w: float,
    contact_compliance: float,
    projected_step: int,
    # Model:
    body_com: wp.array(dtype=wp.vec3),
    body_mass: wp.array(dtype=float),
    joint_parent: wp.array(dtype=int),
    joint_child: wp.array(dtype=int),
    joint_X_p: wp.array(dtype=wp.transform),
    joint_X_c: wp.array(dtype=wp.transform),
    joint_axis_j: wp.array(dtype=wp.vec3),
    jrow_joint: wp.array(dtype=int),
    jrow_kind: wp.array(dtype=int),
    j_ke: wp.array(dtype=float),
    j_kd: wp.array(dtype=float),
    j_scale: wp.array(dtype=float),
    j_tau: wp.array(dtype=float),
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    shape_slip: wp.array(dtype=float),
    shape_slip_lat: wp.array(dtype=float),
    # Data in:
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    u_prev: wp.array(dtype=wp.spatial_vector),
    inv_m: wp.array(dtype=float),
    I_w: wp.array(dtype=wp.mat33),
    inv_I: wp.array(dtype=wp.mat33),
    f_imp: wp.array(dtype=wp.spatial_vector),
    jt_q: wp.array(dtype=float),
    jt_qd: wp.array(dtype=float),
    j_qprev: wp.array(dtype=float),
    ct_count: wp.array(dtype=int),
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_p0: wp.array(dtype=wp.vec3),
    ct_p1: wp.array(dtype=wp.vec3),
    ct_n: wp.array(dtype=wp.vec3),
    ct_nbody: wp.array(dtype=int),
    ct_thick: wp.array(dtype=float),
    ct_axial0: wp.array(dtype=float),
    ct_axial1: wp.array(dtype=float),
    ct_fric_shape: wp.array(dtype=int),
    # Data in/out:
    u: wp.array(dtype=wp.spatial_vector),
    lam: wp.array(dtype=float),
    u_best: wp.array(dtype=wp.spatial_vector),
    lam_best: wp.array(dtype=float),
    best_norm: wp.array(dtype=float),
    best_k: wp.array(dtype=int),
    done: wp.array(dtype=int),
    status: wp.array(dtype=int),
    iters: wp.array(dtype=int),
    res_dyn: wp.array(dtype=float),
    res_con: wp.array(dtype=float),
    n_rows: wp.array(dtype=int),
    res_trace: wp.array(dtype=float),
    trace_stride: int,
    # Scratch:
    x_it: wp.array(dtype=wp.vec3),
    q_it: wp.array(dtype=wp.quat),
    tmp: wp.array(dtype=wp.spatial_vector),
    ydyn: wp.array(dtype=wp.spatial_vector),
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    row_r: wp.array(dtype=float),
    row_pinv: wp.array(dtype=float),
    row_kind: wp.array(dtype=int),
    rhs: wp.array(dtype=float),
    dl: wp.array(dtype=float),
    pr: wp.array(dtype=float),
    pz: wp.array(dtype=float),
    pp: wp.array(dtype=float),
    pAz: wp.array(dtype=float),
    pAp: wp.array(dtype=float),
    ct_fdir: wp.array(dtype=wp.vec4),
    ct_pin: wp.array(dtype=wp.vec2),
    pin_relax: float,
    pcr_tol: float,
    cone_slack: float,
    pcr_iters_newton: int,
    ls_from: int,
    ls_min: float,
    ls_ref: wp.array(dtype=float),
    ls_alpha: wp.array(dtype=float),
    u_ls: wp.array(dtype=wp.spatial_vector),
    du_ls: wp.array(dtype=wp.spatial_vector),
    lam_ls: wp.array(dtype=float),
    dl_ls: wp.array(dtype=float),
    stick_prox: float,
    pin_from: int,
):
    w = wp.tid()
    if done[w] != 0:
        return
    bbase = w * nbody
    rbase = w * max_rows
    # -- kinematics: q+ = q- + h G(q-) u  (eq. 1, 9)
    for i in range(nbody):
        b = bbase + i
        x_it[b] = integrate_com(x_prev[b], u[b], h)
        q_it[b] = integrate_quat(q_prev[b], u[b], h)
    # -- constraint rows at q+ (eq. 3, 4, 7, 8)
    nrows = build_rows(
        w, h, njoint, jrows, max_rows, max_contacts, joint_compliance, fb_eps, inactive_w, contact_compliance,
        body_com, joint_parent, joint_child, joint_X_p, joint_X_c, joint_axis_j, jrow_joint, jrow_kind,
        j_ke, j_kd, j_scale, j_tau, shape_body, shape_type, shape_transform, shape_scale, shape_mu, shape_mu_lat,
        shape_slip,
        shape_slip_lat,
        x_it, q_it, x_prev, q_prev, u, lam, inv_m, inv_I, jt_q, jt_qd, j_qprev, ct_count, ct_shape0, ct_shape1,
        ct_p0, ct_p1,
        ct_n, ct_nbody, ct_thick, ct_axial0, ct_axial1, ct_fric_shape,
        row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind,
    )
    n_rows[w] = nrows
    # -- dynamics residual (eq. 10), measured as a velocity: y = M~^-1 r_dyn
    apply_JT(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, lam, tmp)
    rdn = float(0.0)
    for i in range(nbody):
        b = bbase + i
        y = wp.spatial_vector()
        if inv_m[b] > 0.0:
            rd = mass_apply(body_mass[b], I_w[b], u[b] - u_prev[b]) - f_imp[b] - tmp[b]
            y = inv_mass_apply(inv_m[b], inv_I[b], rd)
        ydyn[b] = y
        rdn += wp.dot(y, y)
    # friction rows are weighted by d / (d + W): a free (W -> inf) row measures its impulse, a
    # sticking one (W -> 0) its slip, so separated contacts do not dominate the norm
    rcn = float(0.0)
    for i in range(nrows):
        r = rbase + i
        wt = float(1.0)
        if row_kind[r] == ROW_FRICTION or row_kind[r] == ROW_SERVO_LIMITED:
            # a saturated servo's row is its impulse error times its large slope: measure it as a velocity
            wt = 1.0 - row_C[r] * row_pinv[r]
        rcn += wt * wt * row_r[r] * row_r[r]
    norm = wp.sqrt(rdn + rcn)
    if not (norm < 1.0e30):
        # non-finite or exploding iterate: stop here, keep the best admissible one
        status[w] = 2
        done[w] = 1
        return
    iters[w] = k
    res_trace[w * trace_stride + k] = norm
    if k >= k_min and norm < best_norm[w]:
        best_norm[w] = norm
        best_k[w] = k
        res_dyn[w] = wp.sqrt(rdn)
        res_con[w] = wp.sqrt(rcn)
        for i in range(nbody):
            u_best[bbase + i] = u[bbase + i]
        for i in range(nrows):
            lam_best[rbase + i] = lam[rbase + i]
    if k >= k_min and norm < tol:
        status[w] = 0
        done[w] = 1
        return
    if do_step == 0:
        status[w] = 1
        return
    # worlds with a redundant contact set (friction_safeguard="newton") take the semismooth rows, PCR to a
    # tolerance and, from iteration ls_from on, backtracking
    nsemi = int(0)
    if projected_step == 3:
        for ci in range(ct_count[w]):
            nsemi += shares_pair(w, ci, max_contacts, ct_count, ct_shape0, ct_shape1, ct_n)
    backtrack = nsemi > 0 and k >= ls_from
    if backtrack:
        # backtracking on the residual norm: an iterate that does not lower the last accepted one's
        # norm is replaced by the point halfway back along the last step (down to ls_min of it)
        a = ls_alpha[w]
        if k > ls_from and not (norm < ls_ref[w]) and 0.5 * a >= ls_min:
            a = 0.5 * a
            ls_alpha[w] = a
            for i in range(nbody):
                u[bbase + i] = u_ls[bbase + i] + a * du_ls[bbase + i]
            for i in range(nrows):
                lam[rbase + i] = lam_ls[rbase + i] + a * dl_ls[rbase + i]
            return
        ls_ref[w] = norm
        ls_alpha[w] = 1.0
        for i in range(nbody):
            u_ls[bbase + i] = u[bbase + i]
        for i in range(nrows):
            lam_ls[rbase + i] = lam[rbase + i]
    # friction_safeguard="newton": contacts that share their shape pair with another contact (a box's
    # corners: a redundant set whose friction split the FB weight leaves to 2-cycles) take the
    # semismooth Alart-Curnier rows below; single contacts (wheels) keep the active-set weight
    mode = projected_step
    if mode == 2 or mode == 3:
        # active-set W: a contact whose z~ = l~ - rho v~ leaves the cone slides, and gets the sliding
        # weight W~ = |v~| / lam_n (b = 0) whatever its impulse; redundant contacts sharing a
        # Jacobian then split the friction in proportion to lam_n instead of trading it back and
        # forth (the FB weight is tiny on a contact inside the cone). Sticking contacts keep eq. 7's W.
        for ci in range(ct_count[w]):
            kk = w * max_contacts + ci
            rn = rbase + jrows + 3 * ci
            d1 = 1.0 / row_pinv[rn + 1] - row_C[rn + 1]
            d2 = 1.0 / row_pinv[rn + 2] - row_C[rn + 2]
            ln = lam[rn]
            # regularised contacts (slip speed > 0) already carry their smooth weight
            vs_k, vs_lat_k = contact_slip(kk, ct_shape0, ct_shape1, ct_fric_shape, shape_slip, shape_slip_lat)
            semi = int(0)
            if mode == 3:
                semi = shares_pair(w, ci, max_contacts, ct_count, ct_shape0, ct_shape1, ct_n)
            if ln > 0.0 and d1 > 1.0e-9 and vs_k <= 0.0 and semi == 0:
                v1 = row_r[rn + 1] - row_C[rn + 1] * lam[rn + 1]
                v2 = row_r[rn + 2] - row_C[rn + 2] * lam[rn + 2]
                sl, W1, W2 = slide_weight(
                    kk, ln, lam[rn + 1], lam[rn + 2], v1, v2, d1, d2, ct_shape0, ct_shape1, ct_fric_shape,
                    shape_body, shape_transform, shape_mu, shape_mu_lat, q_it,
                )
                if sl != 0:
                    row_C[rn + 1] = W1
                    row_C[rn + 2] = W2
                    row_r[rn + 1] = v1 + W1 * lam[rn + 1]
                    row_r[rn + 2] = v2 + W2 * lam[rn + 2]
                    row_pinv[rn + 1] = 1.0 / wp.max(d1 + W1, 1.0e-12)
                    row_pinv[rn + 2] = 1.0 / wp.max(d2 + W2, 1.0e-12)
    if mode >= 3:
        for ci in range(ct_count[w]):
            kk = w * max_contacts + ci
            rn = rbase + jrows + 3 * ci
            ct_fdir[kk] = wp.vec4(0.0)
            pin_prev = ct_pin[kk]
            ct_pin[kk] = wp.vec2(0.0)
            d1 = 1.0 / row_pinv[rn + 1] - row_C[rn + 1]
            d2 = 1.0 / row_pinv[rn + 2] - row_C[rn + 2]
            ln = lam[rn]
            vs_k, vs_lat_k = contact_slip(kk, ct_shape0, ct_shape1, ct_fric_shape, shape_slip, shape_slip_lat)
            semi = shares_pair(w, ci, max_contacts, ct_count, ct_shape0, ct_shape1, ct_n)
            if pin_from > 0 and semi == 0 and k >= pin_from:
                semi = 2  # a single contact (a wheel), pinned when it slides (pin_wheels_from)
            loaded = ln > 0.0 and d1 > 1.0e-9 and d2 > 1.0e-9 and ln * 0.5 * (d1 + d2) > 1.0e-7
            if semi != 0 and loaded and vs_k <= 0.0:
                v1 = row_r[rn + 1] - row_C[rn + 1] * lam[rn + 1]
                v2 = row_r[rn + 2] - row_C[rn + 2] * lam[rn + 2]
                m1, m2 = cone_mu(kk, ct_shape0, ct_shape1, ct_fric_shape, shape_body, shape_transform, shape_mu,
                                 shape_mu_lat, q_it)
                rho = 2.0 / wp.max(m1 * m1 * d1 + m2 * m2 * d2, 1.0e-12)
                lt1 = lam[rn + 1] / m1
                lt2 = lam[rn + 2] / m2
                z1 = lt1 - rho * m1 * v1
                z2 = lt2 - rho * m2 * v2
                zn = wp.sqrt(z1 * z1 + z2 * z2)
                if zn <= ln and semi == 2:
                    # a sticking single contact keeps its active-set rows
                    pass
                elif zn <= ln:
                    # sticking (Alart-Curnier: l~ - z = rho v~ = 0): the row is the slip v = 0. The split
                    # of a sticking set's friction is indeterminate (the Schur block is singular), so
                    # the step gets a proximal term eps d dl (eps = stick_prox) in the matrix only:
                    # the residual stays v, the fixed point exact
                    row_C[rn + 1] = stick_prox * d1
                    row_C[rn + 2] = stick_prox * d2
                    row_r[rn + 1] = v1
                    row_r[rn + 2] = v2
                    row_pinv[rn + 1] = 1.0 / (d1 * (1.0 + stick_prox))
                    row_pinv[rn + 2] = 1.0 / (d2 * (1.0 + stick_prox))
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
                            lpin = (1.0 - pin_relax) * ln + pin_relax * pin_prev[0]
                            dpin = lpin - pin_prev[0]
                    ct_pin[kk] = wp.vec2(lpin, dpin)
                    ct_fdir[kk] = wp.vec4(e1, e2, 1.0, lpin - (e1 * lt1 + e2 * lt2))
                    Pa = m1 * e1 * row_Ja[rn + 1] + m2 * e2 * row_Ja[rn + 2]
                    Pb = m1 * e1 * row_Jb[rn + 1] + m2 * e2 * row_Jb[rn + 2]
                    Qa = -m1 * e2 * row_Ja[rn + 1] + m2 * e1 * row_Ja[rn + 2]
                    Qb = -m1 * e2 * row_Jb[rn + 1] + m2 * e1 * row_Jb[rn + 2]
                    dQ = eff_inv_mass(inv_m, inv_I, row_a[rn + 1], Qa, row_b[rn + 1], Qb)
                    lq = -e2 * lt1 + e1 * lt2
                    Cq = (zn - ln) / (ln * rho)
                    row_Ja[rn + 1] = Pa
                    row_Jb[rn + 1] = Pb
                    row_C[rn + 1] = 0.0
                    row_r[rn + 1] = 0.0
                    row_pinv[rn + 1] = 0.0  # pinned: dl~_par = ln - l~_par, masked out of the PCR
                    row_Ja[rn + 2] = Qa
                    row_Jb[rn + 2] = Qb
                    row_C[rn + 2] = Cq
                    row_r[rn + 2] = zn / (ln * rho) * lq
                    row_pinv[rn + 2] = 1.0 / wp.max(dQ + Cq, 1.0e-12)
    # -- Schur system (eq. 12): (J M~^-1 J^T + C) dlam = J M~^-1 r_dyn - r_con
    for i in range(nrows):
        r = rbase + i
        rhs[r] = row_dot(row_Ja[r], body_vel(ydyn, row_a[r]), row_Jb[r], body_vel(ydyn, row_b[r])) - row_r[r]
    npin = int(0)
    if mode >= 3:
        for ci in range(ct_count[w]):
            if ct_fdir[w * max_contacts + ci][2] != 0.0:
                npin += 1
    # worlds with semismooth rows solve the Schur system to pcr_tol (their redundant contacts make
    # it nearly singular: the load split rests on the contact compliance alone)
    n_pcr = pcr_iters
    t_pcr = float(0.0)
    if nsemi > 0:
        n_pcr = pcr_iters_newton
        t_pcr = pcr_tol
    if npin > 0:
        # pinned rows: dl~_par = delta is known; move A[:, par] delta to the right-hand side and mask
        # the rows out of the PCR (row_pinv = 0)
        for i in range(nrows):
            pz[rbase + i] = 0.0
        for ci in range(ct_count[w]):
            fd = ct_fdir[w * max_contacts + ci]
            if fd[2] != 0.0:
                pz[rbase + jrows + 3 * ci + 1] = fd[3]
        apply_A(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, row_C, inv_m, inv_I, pz, tmp, pAz)
        for i in range(nrows):
            rhs[rbase + i] = rhs[rbase + i] - pAz[rbase + i]
    pcr_solve(
        nrows, rbase, bbase, nbody, n_pcr, row_a, row_b, row_Ja, row_Jb, row_C, row_pinv, inv_m, inv_I,
        rhs, dl, pr, pz, pp, pAz, pAp, tmp, t_pcr,
    )
    if npin > 0:
        for ci in range(ct_count[w]):
            fd = ct_fdir[w * max_contacts + ci]
            if fd[2] != 0.0:
                dl[rbase + jrows + 3 * ci + 1] = fd[3]
    # -- safeguards (lam_n >= 0, friction inside the elliptic cone). "clamp" (the paper's): project
    # the multipliers after the step. "projected": contacts whose step leaves the admissible set
    # get their multipliers pinned to the projection and the Schur system is solved again for the
    # rest, so u stays consistent with the clamped impulses (after a plain clamp u keeps the
    # sticking-like solution and W = 0 there can stall a stick/slip transition).
    nc = ct_count[w]
    nfix = int(0)
    nscan = nc
    if mode != 1:
        nscan = 0
    for ci in range(nscan):
        kk = w * max_contacts + ci
        rn = rbase + jrows + 3 * ci
        ln, l1, l2, fixed = cone_projection(
            kk, lam[rn] + dl[rn], lam[rn + 1] + dl[rn + 1], lam[rn + 2] + dl[rn + 2], ct_shape0, ct_shape1,
            ct_fric_shape, shape_body, shape_transform, shape_mu, shape_mu_lat, q_it, 1.0,
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
                pen = 1.0e4 / row_pinv[r]
                row_C[r] = row_C[r] + pen
                rhs[r] = pen * (target - lam[r])
                row_pinv[r] = 1.0 / (1.0 / row_pinv[r] + pen)
    if nfix > 0:
        pcr_solve(
            nrows, rbase, bbase, nbody, pcr_iters, row_a, row_b, row_Ja, row_Jb, row_C, row_pinv, inv_m, inv_I,
            rhs, dl, pr, pz, pp, pAz, pAp, tmp, 0.0,
        )
    # -- back-substitution (eq. 13): du = M~^-1 (J^T dlam - r_dyn)
    apply_JT(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, dl, tmp)
    for i in range(nbody):
        b = bbase + i
        if inv_m[b] > 0.0:
            u[b] = u[b] + inv_mass_apply(inv_m[b], inv_I[b], tmp[b]) - ydyn[b]
    if mode >= 3:
        # rotated sliding rows: (dl~_par, dl~_perp) back to the contact frame, l = mu l~
        for ci in range(ct_count[w]):
            fd = ct_fdir[w * max_contacts + ci]
            if fd[2] != 0.0:
                rn = rbase + jrows + 3 * ci
                m1, m2 = cone_mu(w * max_contacts + ci, ct_shape0, ct_shape1, ct_fric_shape, shape_body,
                                 shape_transform, shape_mu, shape_mu_lat, q_it)
                a = dl[rn + 1]
                c = dl[rn + 2]
                dl[rn + 1] = m1 * (fd[0] * a - fd[1] * c)
                dl[rn + 2] = m2 * (fd[1] * a + fd[0] * c)
    for i in range(nrows):
        lam[rbase + i] = lam[rbase + i] + dl[rbase + i]
    if nfix > 0 or mode != 1:
        slack = float(1.0)
        if mode == 3:
            slack = cone_slack
        # clamp mode: the paper's safeguard after the step; projected mode: the penalty pinned the
        # projected rows to within 1e-4 of their share, finish them exactly
        project_cone(w, jrows, max_rows, max_contacts, ct_count, ct_shape0, ct_shape1, ct_fric_shape, shape_body,
                     shape_transform, shape_mu, shape_mu_lat, q_it, lam, slack, ct_n)
    if backtrack:
        for i in range(nbody):
            du_ls[bbase + i] = u[bbase + i] - u_ls[bbase + i]
        for i in range(nrows):
            dl_ls[rbase + i] = lam[rbase + i] - lam_ls[rbase + i]


@wp.kernel
def write_output(
    h: float,
    nbody: int,
    body_com: wp.array(dtype=wp.vec3),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    u_prev: wp.array(dtype=wp.spatial_vector),
    u_best: wp.array(dtype=wp.spatial_vector),
    best_k: wp.array(dtype=int),
    # Data out:
    u_sol_out: wp.array(dtype=wp.spatial_vector),
    body_q_out: wp.array(dtype=wp.transform),
    body_qd_out: wp.array(dtype=wp.spatial_vector),
):
    b = wp.tid()
    w = b / nbody
    uu = u_prev[b]
    if best_k[w] >= 0:
        uu = u_best[b]
    x = integrate_com(x_prev[b], uu, h)
    q = integrate_quat(q_prev[b], uu, h)
    u_sol_out[b] = uu
    body_q_out[b] = wp.transform(x - wp.quat_rotate(q, body_com[b]), q)
    body_qd_out[b] = uu


@wp.kernel
def adjoint_system(
    h: float,
    nbody: int,
    njoint: int,
    jrows: int,
    max_rows: int,
    max_contacts: int,
    pcr_iters: int,
    joint_compliance: float,
    fb_eps: float,
    inactive_w: float,
    contact_compliance: float,
    # Model:
    body_com: wp.array(dtype=wp.vec3),
    joint_parent: wp.array(dtype=int),
    joint_child: wp.array(dtype=int),
    joint_X_p: wp.array(dtype=wp.transform),
    joint_X_c: wp.array(dtype=wp.transform),
    joint_axis_j: wp.array(dtype=wp.vec3),
    jrow_joint: wp.array(dtype=int),
    jrow_kind: wp.array(dtype=int),
    j_ke: wp.array(dtype=float),
    j_kd: wp.array(dtype=float),
    j_scale: wp.array(dtype=float),
    j_tau: wp.array(dtype=float),
    shape_body: wp.array(dtype=int),
    shape_type: wp.array(dtype=int),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    shape_mu: wp.array(dtype=float),
    shape_mu_lat: wp.array(dtype=float),
    shape_slip: wp.array(dtype=float),
    shape_slip_lat: wp.array(dtype=float),
    # Data in (the converged step):
    x_plus: wp.array(dtype=wp.vec3),
    q_plus: wp.array(dtype=wp.quat),
    x_prev: wp.array(dtype=wp.vec3),
    q_prev: wp.array(dtype=wp.quat),
    u_plus: wp.array(dtype=wp.spatial_vector),
    lam_plus: wp.array(dtype=float),
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    jt_q: wp.array(dtype=float),
    jt_qd: wp.array(dtype=float),
    j_qprev: wp.array(dtype=float),
    ct_count: wp.array(dtype=int),
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_p0: wp.array(dtype=wp.vec3),
    ct_p1: wp.array(dtype=wp.vec3),
    ct_n: wp.array(dtype=wp.vec3),
    ct_nbody: wp.array(dtype=int),
    ct_thick: wp.array(dtype=float),
    ct_axial0: wp.array(dtype=float),
    ct_axial1: wp.array(dtype=float),
    ct_fric_shape: wp.array(dtype=int),
    y_u: wp.array(dtype=wp.spatial_vector),
    y_lam: wp.array(dtype=float),
    # Data out:
    w_u_out: wp.array(dtype=wp.spatial_vector),
    w_lam_out: wp.array(dtype=float),
    # Scratch:
    tmp: wp.array(dtype=wp.spatial_vector),
    ydyn: wp.array(dtype=wp.spatial_vector),
    row_a: wp.array(dtype=int),
    row_b: wp.array(dtype=int),
    row_Ja: wp.array(dtype=wp.spatial_vector),
    row_Jb: wp.array(dtype=wp.spatial_vector),
    row_C: wp.array(dtype=float),
    row_r: wp.array(dtype=float),
    row_pinv: wp.array(dtype=float),
    row_kind: wp.array(dtype=int),
    rhs: wp.array(dtype=float),
    pr: wp.array(dtype=float),
    pz: wp.array(dtype=float),
    pp: wp.array(dtype=float),
    pAz: wp.array(dtype=float),
    pAp: wp.array(dtype=float),
):
    """Solve the transposed step system of the forward operator at the returned iterate (W at its
    converged value, lagged), a thread per world, by eliminating w_u (eq. 18-19):

        [M~  J^T] [w_u  ]   [y_u  ]      (J M~^-1 J^T + C) w_lam = y_lam + J M~^-1 y_u
        [-J  C  ] [w_lam] = [y_lam]  =>  w_u = M~^-1 (y_u - J^T w_lam)

    With y_u = -dL/du+ and y_lam = 0 this is the paper's adjoint; it also serves as the
    preconditioner of the exact adjoint solve (rollout.Simulation)."""
    w = wp.tid()
    bbase = w * nbody
    rbase = w * max_rows
    nrows = build_rows(
        w, h, njoint, jrows, max_rows, max_contacts, joint_compliance, fb_eps, inactive_w, contact_compliance,
        body_com, joint_parent, joint_child, joint_X_p, joint_X_c, joint_axis_j, jrow_joint, jrow_kind,
        j_ke, j_kd, j_scale, j_tau, shape_body, shape_type, shape_transform, shape_scale, shape_mu, shape_mu_lat,
        shape_slip,
        shape_slip_lat,
        x_plus, q_plus, x_prev, q_prev, u_plus, lam_plus, inv_m, inv_I, jt_q, jt_qd, j_qprev, ct_count, ct_shape0,
        ct_shape1,
        ct_p0, ct_p1, ct_n, ct_nbody, ct_thick, ct_axial0, ct_axial1, ct_fric_shape,
        row_a, row_b, row_Ja, row_Jb, row_C, row_r, row_pinv, row_kind,
    )
    for i in range(nbody):
        b = bbase + i
        ydyn[b] = inv_mass_apply(inv_m[b], inv_I[b], y_u[b])
    for i in range(nrows):
        r = rbase + i
        rhs[r] = y_lam[r] + row_dot(row_Ja[r], body_vel(ydyn, row_a[r]), row_Jb[r], body_vel(ydyn, row_b[r]))
    pcr_solve(
        nrows, rbase, bbase, nbody, pcr_iters, row_a, row_b, row_Ja, row_Jb, row_C, row_pinv, inv_m, inv_I,
        rhs, w_lam_out, pr, pz, pp, pAz, pAp, tmp, 0.0,
    )
    for i in range(max_rows - nrows):
        w_lam_out[rbase + nrows + i] = 0.0
    apply_JT(nrows, rbase, bbase, nbody, row_a, row_b, row_Ja, row_Jb, w_lam_out, tmp)
    for i in range(nbody):
        b = bbase + i
        w_u_out[b] = inv_mass_apply(inv_m[b], inv_I[b], y_u[b] - tmp[b])


@wp.kernel
def warm_start(
    jrows: int,
    max_rows: int,
    max_contacts: int,
    use_warm: int,
    # Data in (previous step):
    prev_count: wp.array(dtype=int),
    prev_shape0: wp.array(dtype=int),
    prev_shape1: wp.array(dtype=int),
    prev_normal: wp.array(dtype=wp.vec3),
    prev_lam: wp.array(dtype=float),
    # Data in (this step):
    ct_count: wp.array(dtype=int),
    ct_shape0: wp.array(dtype=int),
    ct_shape1: wp.array(dtype=int),
    ct_normal_world: wp.array(dtype=wp.vec3),
    # Data out:
    lam_out: wp.array(dtype=float),
):
    """Initial multipliers from the previous step: joint rows one to one, contacts matched by
    shape pair and normal. In steady driving this starts Newton next to the solution, so the
    friction weights W are right from the first iteration."""
    w = wp.tid()
    rbase = w * max_rows
    for i in range(max_rows):
        lam_out[rbase + i] = 0.0
    if use_warm == 0:
        return
    for i in range(jrows):
        lam_out[rbase + i] = prev_lam[rbase + i]
    cbase = w * max_contacts
    for ci in range(ct_count[w]):
        k = cbase + ci
        for pj in range(prev_count[w]):
            p = cbase + pj
            if prev_shape0[p] == ct_shape0[k] and prev_shape1[p] == ct_shape1[k]:
                if wp.dot(prev_normal[p], ct_normal_world[k]) > 0.9:
                    rn = rbase + jrows + 3 * ci
                    rp = rbase + jrows + 3 * pj
                    lam_out[rn] = prev_lam[rp]
                    lam_out[rn + 1] = prev_lam[rp + 1]
                    lam_out[rn + 2] = prev_lam[rp + 2]
                    break
