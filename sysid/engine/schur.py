"""Linear algebra of the Newton step: the matrix-free Schur operator A = J M~^-1 J^T + C of one world
(eq. 12) and its Jacobi-preconditioned conjugate residual solve (PCR). The adjoint's dense per-world LU is
`linsolve.py`.
"""

from __future__ import annotations

import warp as wp

from .constraints import row_dot
from .kinematics import body_vel, inv_mass_apply
from .types import Rows, SchurScratch

wp.set_module_options({"enable_backward": False})


@wp.func
def apply_JT(
    nrows: int,
    rbase: int,
    bbase: int,
    nbody: int,
    rows: Rows,
    v: wp.array(dtype=float),
    out: wp.array(dtype=wp.spatial_vector),
):
    """out[body] = sum_rows J^T v over one world's rows."""
    for i in range(nbody):
        out[bbase + i] = wp.spatial_vector()
    for i in range(nrows):
        r = rbase + i
        vi = v[r]
        a = rows.a[r]
        if a >= 0:
            out[a] = out[a] + vi * rows.Ja[r]
        b = rows.b[r]
        if b >= 0:
            out[b] = out[b] + vi * rows.Jb[r]
    return 0


@wp.func
def apply_A(
    nrows: int,
    rbase: int,
    bbase: int,
    nbody: int,
    rows: Rows,
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    v: wp.array(dtype=float),
    tmp: wp.array(dtype=wp.spatial_vector),
    out: wp.array(dtype=float),
):
    """out = (J M~^-1 J^T + C) v, matrix-free, for one world."""
    apply_JT(nrows, rbase, bbase, nbody, rows, v, tmp)
    for i in range(nbody):
        bi = bbase + i
        tmp[bi] = inv_mass_apply(inv_m[bi], inv_I[bi], tmp[bi])
    for i in range(nrows):
        r = rbase + i
        out[r] = row_dot(rows.Ja[r], body_vel(tmp, rows.a[r]), rows.Jb[r], body_vel(tmp, rows.b[r])) + rows.C[r] * v[r]
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
    rows: Rows,
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    rhs: wp.array(dtype=float),
    x: wp.array(dtype=float),
    scr: SchurScratch,
    tol: float,
):
    """Preconditioned conjugate residual for A x = rhs (A symmetric), Jacobi preconditioner, x0 = 0."""
    for i in range(nrows):
        k = rbase + i
        x[k] = 0.0
        scr.r[k] = rhs[k]
        scr.z[k] = rows.pinv[k] * rhs[k]
        scr.p[k] = scr.z[k]
    apply_A(nrows, rbase, bbase, nbody, rows, inv_m, inv_I, scr.z, scr.tmp, scr.Az)
    for i in range(nrows):
        scr.Ap[rbase + i] = scr.Az[rbase + i]
    zAz = wdot(nrows, rbase, scr.z, scr.Az)
    r0 = wdot(nrows, rbase, scr.r, scr.z)
    for _it in range(iters):
        if tol > 0.0 and wdot(nrows, rbase, scr.r, scr.z) <= tol * tol * r0:
            break
        ApPAp = float(0.0)
        for i in range(nrows):
            k = rbase + i
            ApPAp += scr.Ap[k] * rows.pinv[k] * scr.Ap[k]
        if ApPAp <= 1.0e-30 or zAz == 0.0:
            break
        alpha = zAz / ApPAp
        for i in range(nrows):
            k = rbase + i
            x[k] = x[k] + alpha * scr.p[k]
            scr.r[k] = scr.r[k] - alpha * scr.Ap[k]
            scr.z[k] = scr.z[k] - alpha * rows.pinv[k] * scr.Ap[k]
        apply_A(nrows, rbase, bbase, nbody, rows, inv_m, inv_I, scr.z, scr.tmp, scr.Az)
        zAz_new = wdot(nrows, rbase, scr.z, scr.Az)
        beta = zAz_new / zAz
        zAz = zAz_new
        for i in range(nrows):
            k = rbase + i
            scr.p[k] = scr.z[k] + beta * scr.p[k]
            scr.Ap[k] = scr.Az[k] + beta * scr.Ap[k]
    return 0
