"""Linear algebra of the Newton step: the matrix-free Schur operator A = J M~^-1 J^T + C of one world
(eq. 12), its Jacobi-preconditioned conjugate residual solve (PCR), and the dense solve of the pinned-wheel
worlds (`SolverOptions.linear_solver="direct"`, the default): A assembled per world in float64 and
Cholesky-factored once per Newton iteration, every solve of that iteration (the coupled pins' npin + 1 and
the step's) a pair of triangular solves. The adjoint's dense per-world LU is `linsolve.py`.
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


vec6d = wp.types.vector(length=6, dtype=wp.float64)


@wp.func
def minv_jt(inv_m: wp.array(dtype=float), inv_I: wp.array(dtype=wp.mat33), body: int, J: wp.spatial_vector):
    """M~^-1 J^T of one row's block on one body, in float64 (inv_I symmetrised: the float32 inverse of a
    symmetric inertia is symmetric only to rounding, and the dense Schur matrix must be exactly symmetric)."""
    y = vec6d()
    if body < 0:
        return y
    m = wp.float64(inv_m[body])
    Ii = inv_I[body]
    for k in range(3):
        y[k] = m * wp.float64(J[k])
        s = wp.float64(0.0)
        for c in range(3):
            s += wp.float64(0.5) * (wp.float64(Ii[k, c]) + wp.float64(Ii[c, k])) * wp.float64(J[3 + c])
        y[3 + k] = s
    return y


@wp.func
def dot6d(J: wp.spatial_vector, y: vec6d):
    s = wp.float64(0.0)
    for k in range(6):
        s += wp.float64(J[k]) * y[k]
    return s


@wp.func
def dense_factor(
    nrows: int,
    rbase: int,
    rows: Rows,
    inv_m: wp.array(dtype=float),
    inv_I: wp.array(dtype=wp.mat33),
    S: wp.array(dtype=wp.float64),
    sbase: int,
    dm: int,
):
    """Assemble one world's Schur matrix A = J M~^-1 J^T + C (nrows x nrows, row stride dm) in float64 and
    factor it in place, A = L L^T (lower triangle). Rows the PCR masks out (pinv = 0: pinned) are
    identity rows, so their unknowns stay 0 as in the PCR. A pivot that falls below 1e-13 of its
    diagonal (a direction that only a zero compliance leaves singular: dependent rows with C = 0) is
    fixed at 0 (L's column zeroed, unit pivot marked by -1), the PCR's minimum-norm choice there."""
    for i in range(nrows):
        ri = rbase + i
        ai = rows.a[ri]
        bi = rows.b[ri]
        ya = minv_jt(inv_m, inv_I, ai, rows.Ja[ri])
        yb = minv_jt(inv_m, inv_I, bi, rows.Jb[ri])
        for j in range(i + 1):
            rj = rbase + j
            v = wp.float64(0.0)
            if rows.pinv[ri] == 0.0 or rows.pinv[rj] == 0.0:
                if i == j:
                    v = wp.float64(1.0)
            else:
                aj = rows.a[rj]
                bj = rows.b[rj]
                if aj >= 0:
                    if aj == ai:
                        v += dot6d(rows.Ja[rj], ya)
                    if aj == bi:
                        v += dot6d(rows.Ja[rj], yb)
                if bj >= 0:
                    if bj == ai:
                        v += dot6d(rows.Jb[rj], ya)
                    if bj == bi:
                        v += dot6d(rows.Jb[rj], yb)
                if i == j:
                    v += wp.float64(rows.C[ri])
            S[sbase + i * dm + j] = v
    # Cholesky, column by column (left-looking)
    for j in range(nrows):
        d0 = S[sbase + j * dm + j]
        d = d0
        for k in range(j):
            l = S[sbase + j * dm + k]
            d -= l * l
        if d <= wp.float64(1.0e-13) * wp.abs(d0) or d <= wp.float64(0.0):
            # fixed at zero: zero L's column below, mark the pivot
            S[sbase + j * dm + j] = wp.float64(-1.0)
            for i in range(j + 1, nrows):
                S[sbase + i * dm + j] = wp.float64(0.0)
        else:
            p = wp.sqrt(d)
            S[sbase + j * dm + j] = p
            for i in range(j + 1, nrows):
                s = S[sbase + i * dm + j]
                for k in range(j):
                    s -= S[sbase + i * dm + k] * S[sbase + j * dm + k]
                S[sbase + i * dm + j] = s / p
    return 0


@wp.func
def dense_solve(
    nrows: int,
    rbase: int,
    rows: Rows,
    rhs: wp.array(dtype=float),
    x: wp.array(dtype=float),
    S: wp.array(dtype=wp.float64),
    sbase: int,
    dm: int,
    y: wp.array(dtype=wp.float64),
):
    """x = A^-1 rhs with `dense_factor`'s L (masked rows and fixed pivots: x = 0); y is float64 scratch
    (nrows at rbase)."""
    for i in range(nrows):
        s = wp.float64(0.0)
        p = S[sbase + i * dm + i]
        if p > wp.float64(0.0) and rows.pinv[rbase + i] != 0.0:
            s = wp.float64(rhs[rbase + i])
            for k in range(i):
                s -= S[sbase + i * dm + k] * y[rbase + k]
            s = s / p
        y[rbase + i] = s
    for ii in range(nrows):
        i = nrows - 1 - ii
        s = wp.float64(0.0)
        p = S[sbase + i * dm + i]
        if p > wp.float64(0.0) and rows.pinv[rbase + i] != 0.0:
            s = y[rbase + i]
            for k in range(i + 1, nrows):
                s -= S[sbase + k * dm + i] * y[rbase + k]
            s = s / p
        y[rbase + i] = s
        x[rbase + i] = float(s)
    return 0


@wp.func
def schur_solve(
    direct: int,
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
    sbase: int,
    dm: int,
):
    """A x = rhs: by the world's dense factor when ``direct`` (`dense_factor` ran on these rows), else PCR."""
    if direct != 0:
        dense_solve(nrows, rbase, rows, rhs, x, scr.S, sbase, dm, scr.y64)
    else:
        pcr_solve(nrows, rbase, bbase, nbody, iters, rows, inv_m, inv_I, rhs, x, scr, tol)
    return 0
