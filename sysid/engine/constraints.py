"""Constraint rows: bilateral joints (eq. 3), contact geometry for normal contact (eq. 4) and
friction (eq. 5-7), and implicit servos (eq. 8).

Every function here evaluates one scalar row at given body poses, so the fused Newton kernel
and the (differentiable) residual kernels of the adjoint share the same code.
"""

from __future__ import annotations

import warp as wp

from .kinematics import origin_from_com, orthonormal_basis
from .types import JointModel, JointRow


@wp.func
def joint_frames(j: int, joints: JointModel, body_com: wp.array[wp.vec3], x: wp.array[wp.vec3], q: wp.array[wp.quat]):
    """World frames of joint j on its parent (none: X_p is in world) and on its child, the bodies at
    centres of mass x and orientations q: the one evaluation every row and the angle of a joint start from."""
    a = joints.parent[j]
    b = joints.child[j]
    Xwp = joints.X_p[j]
    if a >= 0:
        Xwp = wp.transform_multiply(origin_from_com(x[a], q[a], body_com[a]), joints.X_p[j])
    return Xwp, wp.transform_multiply(origin_from_com(x[b], q[b], body_com[b]), joints.X_c[j])


@wp.func
def joint_row_at(kind: int, xa: wp.vec3, xb: wp.vec3, Xwp: wp.transform, Xwc: wp.transform, axis: wp.vec3):
    """Position-level error c [m or rad] and Jacobian blocks (Ja, Jb) of one joint row from the joint's
    world frames on the parent and the child (joint_frames: one evaluation serves all rows of a joint);
    xa, xb the parent's and child's centres of mass (the world origin for no parent)."""
    pp = wp.transform_get_translation(Xwp)
    pc = wp.transform_get_translation(Xwc)
    rp = wp.quat_rotate(wp.transform_get_rotation(Xwp), axis)
    c = 0.0
    Ja = wp.spatial_vector()
    Jb = wp.spatial_vector()
    if kind <= JointRow.POS_Z:
        e = wp.vec3(0.0)
        e[kind] = 1.0
        d = pc - pp
        c = d[kind]
        Ja = wp.spatial_vector(-e, -wp.cross(pp - xa, e))
        Jb = wp.spatial_vector(e, wp.cross(pc - xb, e))
    elif kind <= JointRow.HINGE_2:
        ac = wp.quat_rotate(wp.transform_get_rotation(Xwc), axis)
        t1, t2 = orthonormal_basis(rp)
        t = t1
        if kind == JointRow.HINGE_2:
            t = t2
        c = wp.dot(ac, t)
        g = wp.cross(ac, t)
        Ja = wp.spatial_vector(wp.vec3(0.0), -g)
        Jb = wp.spatial_vector(wp.vec3(0.0), g)
    elif kind <= JointRow.ROT_Z:
        qe = wp.transform_get_rotation(Xwc) * wp.quat_inverse(wp.transform_get_rotation(Xwp))
        s = 2.0
        if qe[3] < 0.0:
            s = -2.0
        k = kind - JointRow.ROT_X
        c = s * qe[k]
        e = wp.vec3(0.0)
        e[k] = 1.0
        Ja = wp.spatial_vector(wp.vec3(0.0), -e)
        Jb = wp.spatial_vector(wp.vec3(0.0), e)
    else:
        Ja = wp.spatial_vector(wp.vec3(0.0), -rp)
        Jb = wp.spatial_vector(wp.vec3(0.0), rp)
    return c, Ja, Jb


@wp.func
def joint_angle(Xwp: wp.transform, Xwc: wp.transform, axis: wp.vec3):
    """Revolute joint angle [rad] from the joint's world frames (joint_frames): twist of the child frame
    about the axis, relative to the parent."""
    qr = wp.quat_inverse(wp.transform_get_rotation(Xwp)) * wp.transform_get_rotation(Xwc)
    return 2.0 * wp.atan2(qr[0] * axis[0] + qr[1] * axis[1] + qr[2] * axis[2], qr[3])


@wp.func
def contact_point(
    b: int,
    x: wp.vec3,
    q: wp.quat,
    c: wp.vec3,
    p_local: wp.vec3,
    is_cyl: int,
    shape_X: wp.transform,
    radius: float,
    axial: float,
    toward: wp.vec3,
):
    """World contact point on one side of a contact at the given body pose [m].

    Static side (b < 0): ``p_local`` is already in world. A cylinder (a wheel) uses its support
    point in the direction ``toward`` at the stored axial offset, so the point stays on the rim
    while the wheel spins (a body-fixed rim point would lift off within one large step).
    """
    if b < 0:
        return p_local
    T = origin_from_com(x, q, c)
    if is_cyl != 0:
        Xs = wp.transform_multiply(T, shape_X)
        center = wp.transform_get_translation(Xs)
        ax = wp.quat_rotate(wp.transform_get_rotation(Xs), wp.vec3(0.0, 0.0, 1.0))
        d = toward - wp.dot(toward, ax) * ax
        L = wp.length(d)
        if L > 1.0e-3:
            return center + axial * ax + (radius / L) * d
    return wp.transform_point(T, p_local)


@wp.func
def contact_frame(n: wp.vec3, lateral: wp.vec3, has_lateral: int):
    """Tangents (t_long, t_lat) at a contact with unit normal n.

    With an anisotropic (wheel) shape, t_long is the rolling direction (lateral x n) and
    t_lat lies along the wheel axle projected on the tangent plane.
    """
    t1, t2 = orthonormal_basis(n)
    if has_lateral != 0:
        tl = wp.cross(lateral, n)
        L = wp.length(tl)
        if L > 1.0e-4:
            t1 = tl / L
            t2 = wp.cross(n, t1)
    return t1, t2


@wp.func
def point_jacobian(d: wp.vec3, p: wp.vec3, x: wp.vec3, sign: float):
    """Jacobian block of the velocity of point p (on the body with centre x) along d."""
    return wp.spatial_vector(sign * d, sign * wp.cross(p - x, d))


@wp.func
def row_dot(Ja: wp.spatial_vector, ua: wp.spatial_vector, Jb: wp.spatial_vector, ub: wp.spatial_vector):
    return wp.dot(Ja, ua) + wp.dot(Jb, ub)
