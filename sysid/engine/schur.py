"""Linear algebra of the Newton step: the matrix-free Schur operator A = J M~^-1 J^T + C of one world
(eq. 12) and its Jacobi-preconditioned conjugate residual solve (PCR). The adjoint's dense per-world LU is
`linsolve.py`.
"""

from __future__ import annotations

import warp as wp

from .constraints import row_dot
from .kinematics import body_vel, inv_mass_apply

wp.set_module_options({"enable_backward": False})


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
