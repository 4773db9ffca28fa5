"""Row stage: every scalar constraint row of a world at the iterate (joints, servos, contact normals and
friction), with its bodies, Jacobian blocks, compliance and residual; shared by the Newton iteration
(`step.py`), the adjoint's Schur kernel and the differentiable residual kernels (`adjoint.py`).
"""

from __future__ import annotations

import warp as wp

from .constraints import contact_frame, joint_frames, joint_row_at, point_jacobian, row_dot
from .contact import contact_geometry
from .friction import contact_slip, friction_params, friction_weight
from .kinematics import body_vel, eff_inv_mass
from .types import Contacts, Iterate, JointRow, ModelArrays, RowKind, Rows, StepConstants, StepData

wp.set_module_options({"enable_backward": False})

SERVO_GAIN_MAX = wp.constant(2.0)  # Newton gain cap of the torque-limited servo (joint_row_law)
TWO_PI = wp.constant(6.283185307179586)
SERVO_SAT_MAX = wp.constant(1.0e4)  # |n| cap of the torque-limited servo (joint_row_law): float32 range


@wp.func
def joint_row_eval_at(
    i: int,
    j: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    at: Iterate,
    lam_r: float,
    Xwp: wp.transform,
    Xwc: wp.transform,
):
    """Joint row i (kind jrow_kind[i]) of joint j at the iterate from the joint's world frames (`joint_frames`,
    evaluated once per joint for all its rows: build_rows, adjoint.residual_joint_frames): bodies,
    Jacobians, compliance C and velocity-level residual r (eq. 3 divided by h, or the servo eq. 8)."""
    kind = model.jrow_kind[i]
    a = model.joints.parent[j]
    b = model.joints.child[j]
    xa = wp.vec3(0.0)
    if a >= 0:
        xa = at.x[a]
    c, Ja, Jb = joint_row_at(kind, xa, at.x[b], Xwp, Xwc, model.joints.axis[j])
    C, r = joint_row_law(kind, j, a, b, c, Ja, Jb, sc, model, data, at.u, lam_r)
    return a, b, Ja, Jb, C, r


@wp.func
def joint_row_law(
    kind: int,
    j: int,
    a: int,
    b: int,
    c: float,
    Ja: wp.spatial_vector,
    Jb: wp.spatial_vector,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    u: wp.array[wp.spatial_vector],
    lam_r: float,
):
    """Compliance C and velocity-level residual r of a joint row with position error c and Jacobian
    blocks (Ja, Jb): eq. 3 divided by h, or the servo eq. 8."""
    C = float(0.0)
    r = float(0.0)
    if kind == JointRow.SERVO:
        # implicit PD servo (eq. 8): tau = ke (s qbar - q+) + kd (s ubar - omega+), q+ = q- + h omega+;
        # with qbar the integral of ubar this is a PI velocity servo of integral gain ke. The angle error
        # is taken modulo 2 pi (q- is an angle of the bodies' poses; an integrated target grows without end)
        vel = row_dot(Ja, body_vel(u, a), Jb, body_vel(u, b))
        ke = model.j_ke[j]
        kd = model.j_kd[j]
        den = kd + sc.h * ke
        C = 1.0 / (sc.h * den)
        s = model.j_scale[j]
        dq = s * data.jt_q[j] - data.j_qprev[j]
        dq = dq - TWO_PI * wp.round(dq / TWO_PI)
        target = (ke * dq + kd * s * data.jt_qd[j]) / den
        r = vel + C * lam_r - target
        tau = model.j_tau[j]
        if tau > 0.0:
            # torque limit tau [N m]: the impulse saturates smoothly at L = h tau,
            #   lam = L n / sqrt(1 + n^2),  n = (target - vel) / (C L)   (n -> 0: the servo above),
            # as the friction rows do it: g (vel - target + W lam) = 0 with the secant weight
            # W = C sqrt(1 + n^2) frozen at the iterate and a Newton gain g = min(1 + n^2, SLIP_GAIN_MAX)
            # (1 + n^2 makes the row's slope in vel the law's; the cap keeps a deeply saturated servo
            # from cycling between +L and -L across iterates). The fixed point does not depend on g.
            L = sc.h * tau
            n = wp.clamp((target - vel) / (C * L), -SERVO_SAT_MAX, SERVO_SAT_MAX)
            s2 = 1.0 + n * n
            W = C * wp.sqrt(s2)
            g = wp.min(s2, SERVO_GAIN_MAX)
            r = g * (vel + W * lam_r - target)
            C = g * W
    else:
        C = sc.joint_compliance / sc.h
        r = c / sc.h + C * lam_r
    return C, r


@wp.func
def contact_eval(
    k: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    ct: Contacts,
    at: Iterate,
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
    n, P0, P1, x0, x1, gap = contact_geometry(k, model, ct, at.x, at.q, data.x_prev, data.q_prev)
    b0 = model.shape_body[ct.shape0[k]]
    b1 = model.shape_body[ct.shape1[k]]
    mu1, mu2, lat, has_lat = friction_params(k, model, ct, at.q)
    t1, t2 = contact_frame(n, lat, has_lat)
    Jna = point_jacobian(n, P0, x0, -1.0)
    Jnb = point_jacobian(n, P1, x1, 1.0)
    dn = eff_inv_mass(data.inv_m, data.inv_I, b0, Jna, b1, Jnb)
    # a tiny relative compliance makes coplanar contact sets (a box's four corners) determinate
    fa = gap + sc.h * sc.contact_compliance * dn * ln
    fb = sc.h * dn * ln
    s = wp.sqrt(fa * fa + fb * fb + sc.fb_eps * sc.fb_eps)
    phi = fa + fb - s
    da = wp.max(1.0 - fa / s, 1.0e-6)
    db = 1.0 - fb / s
    Cn = sc.contact_compliance * dn + dn * db / da
    rn = phi / (sc.h * da)
    J1a = point_jacobian(t1, P0, x0, -1.0)
    J1b = point_jacobian(t1, P1, x1, 1.0)
    J2a = point_jacobian(t2, P0, x0, -1.0)
    J2b = point_jacobian(t2, P1, x1, 1.0)
    d1 = eff_inv_mass(data.inv_m, data.inv_I, b0, J1a, b1, J1b)
    d2 = eff_inv_mass(data.inv_m, data.inv_I, b0, J2a, b1, J2b)
    v1 = row_dot(J1a, body_vel(at.u, b0), J1b, body_vel(at.u, b1))
    v2 = row_dot(J2a, body_vel(at.u, b0), J2b, body_vel(at.u, b1))
    vs, vs_lat = contact_slip(k, model, ct)
    W1, W2, g1, g2 = friction_weight(v1, v2, l1, l2, ln, mu1, mu2, d1, d2, sc.inactive_w, sc.fb_eps, vs, vs_lat)
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
    rows: Rows,
):
    rows.a[r] = a
    rows.b[r] = b
    rows.Ja[r] = Ja
    rows.Jb[r] = Jb
    rows.C[r] = C
    rows.res[r] = res
    rows.pinv[r] = 1.0 / wp.max(d + C, 1.0e-12)
    rows.kind[r] = kind
    return 0


@wp.func
def build_rows(
    w: int,
    sc: StepConstants,
    model: ModelArrays,
    data: StepData,
    ct: Contacts,
    at: Iterate,
    # Data out:
    rows: Rows,
):
    """All rows of world w at the current iterate (W frozen); returns the row count."""
    rbase = w * sc.max_rows
    # a joint's rows are consecutive: its world frames are evaluated once, at its first row
    prev = int(-1)
    Xwp = wp.transform_identity()
    Xwc = wp.transform_identity()
    for i in range(sc.jrows):
        j = w * sc.njoint + model.jrow_joint[i]
        r = rbase + i
        if j != prev:
            Xwp, Xwc = joint_frames(j, model.joints, model.body_com, at.x, at.q)
            prev = j
        a, b, Ja, Jb, C, res = joint_row_eval_at(i, j, sc, model, data, at, at.lam[r], Xwp, Xwc)
        kind = RowKind.JOINT
        if model.jrow_kind[i] == JointRow.SERVO:
            kind = RowKind.SERVO
            if model.j_tau[j] > 0.0:
                kind = RowKind.SERVO_LIMITED
        d = eff_inv_mass(data.inv_m, data.inv_I, a, Ja, b, Jb)
        set_row(r, a, b, Ja, Jb, C, res, d, kind, rows)
    nc = ct.count[w]
    for ci in range(nc):
        k = w * sc.max_contacts + ci
        rn = rbase + sc.jrows + 3 * ci
        b0, b1, Jna, Jnb, J1a, J1b, J2a, J2b, Cn, C1, C2, r0, r1, r2, dn, d1, d2 = contact_eval(
            k, sc, model, data, ct, at, at.lam[rn], at.lam[rn + 1], at.lam[rn + 2]
        )
        set_row(rn, b0, b1, Jna, Jnb, Cn, r0, dn, RowKind.NORMAL, rows)
        set_row(rn + 1, b0, b1, J1a, J1b, C1, r1, d1, RowKind.FRICTION, rows)
        set_row(rn + 2, b0, b1, J2a, J2b, C2, r2, d2, RowKind.FRICTION, rows)
    return sc.jrows + 3 * nc
