"""Linear algebra of the Newton step: the matrix-free Schur operator A = J M~^-1 J^T + C of one world
(eq. 12), its Jacobi-preconditioned conjugate residual solve (PCR), and the dense solve of the pinned-wheel
worlds (`SolverOptions.linear_solver="direct"`, the default): A assembled per world in float64 and
Cholesky-factored once per Newton iteration, every solve of that iteration (the coupled pins' npin + 1 and
the step's) a pair of triangular solves. The same solves for LANES worlds per thread are `schur_lanes.py`; the
adjoint's dense per-world LU is `linsolve.py`.
"""

import warp as wp

from .constraints import row_dot
from .kinematics import body_vel, inv_mass_apply
from .types import RowKind, Rows, SchurScratch, StepConstants

wp.set_module_options({"enable_backward": False})


@wp.func
def apply_JT(w: int, nrows: int, sc: StepConstants, rows: Rows, v: wp.array[float], out: wp.array[wp.spatial_vector]):
    """out[body] = sum_rows J^T v over world w's nrows rows."""
    rbase = w * sc.max_rows
    bbase = w * sc.nbody
    for i in range(sc.nbody):
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
def apply_A(w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch):
    """scr.Az = (J M~^-1 J^T + C) scr.z, matrix-free, for world w's rows (J^T z per body in scr.tmp); returns
    z . Az."""
    rbase = w * sc.max_rows
    bbase = w * sc.nbody
    apply_JT(w, nrows, sc, rows, scr.z, scr.tmp)
    for i in range(sc.nbody):
        bi = bbase + i
        scr.tmp[bi] = inv_mass_apply(rows.inv_m[bi], rows.inv_I[bi], scr.tmp[bi])
    vAv = float(0.0)
    for i in range(nrows):
        r = rbase + i
        Av = (row_dot(rows.Ja[r], body_vel(scr.tmp, rows.a[r]), rows.Jb[r], body_vel(scr.tmp, rows.b[r]))
              + rows.C[r] * scr.z[r])
        scr.Az[r] = Av
        vAv += scr.z[r] * Av
    return vAv


@wp.func
def schur_rhs(w: int, nrows: int, sc: StepConstants, rows: Rows, ydyn: wp.array[wp.spatial_vector],
              scr: SchurScratch):
    """scr.rhs = J M~^-1 r_dyn - r_con, the Newton step's Schur right-hand side of world w's rows (eq. 12), ydyn =
    M~^-1 r_dyn per body."""
    rbase = w * sc.max_rows
    for i in range(nrows):
        r = rbase + i
        Jy = row_dot(rows.Ja[r], body_vel(ydyn, rows.a[r]), rows.Jb[r], body_vel(ydyn, rows.b[r]))
        scr.rhs[r] = Jy - rows.res[r]
    return 0


vec6d = wp.types.vector(length=6, dtype=wp.float64)


@wp.func
def minv_jt(inv_m: wp.array[float], inv_I: wp.array[wp.mat33], body: int, J: wp.spatial_vector):
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
def shares_body(a0: int, b0: int, a1: int, b1: int):
    """Whether two rows act on a common dynamic body (their entry of J M~^-1 J^T is structurally nonzero)."""
    if a0 >= 0 and (a0 == a1 or a0 == b1):
        return True
    if b0 >= 0 and (b0 == a1 or b0 == b1):
        return True
    return False


@wp.func
def dense_key(r: int, bbase: int, rows: Rows):
    """Row r's place in the dense factor's order (`dense_factor`): 2 x (the higher-numbered body it acts on, within
    the world) + 1 for a joint row (0 for a contact row)."""
    is_joint = int(1)
    if rows.kind[r] == RowKind.NORMAL or rows.kind[r] == RowKind.FRICTION:
        is_joint = 0
    return 2 * (wp.max(rows.a[r], rows.b[r]) - bbase) + is_joint


@wp.func
def dense_keys(w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch):
    """Each of world w's rows' `dense_key` to scr.env (the factor's envelope array, written after), one read of
    each row."""
    rbase = w * sc.max_rows
    for i in range(nrows):
        scr.env[rbase + i] = dense_key(rbase + i, w * sc.nbody, rows)
    return 0


@wp.func
def dense_take(w: int, nrows: int, sc: StepConstants, scr: SchurScratch):
    """The factor's row order into scr.perm from the rows' keys in scr.env (`dense_keys`): key by key, each key's
    rows in their own order."""
    rbase = w * sc.max_rows
    n = int(0)
    for kk in range(2 * sc.nbody):
        for i in range(nrows):
            if scr.env[rbase + i] == kk:
                scr.perm[rbase + n] = i
                n += 1
    if n != nrows:  # a row outside the world's bodies (not built by build_rows): keep the rows' own order
        for i in range(nrows):
            scr.perm[rbase + i] = i
    return 0


@wp.func
def dense_factor(w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch):
    """Assemble world w's Schur matrix A = J M~^-1 J^T + C (nrows x nrows, row stride scr.dm) in float64, its
    rows in the factor's order (scr.perm), and factor it in place, A = L L^T (lower triangle). Only each row's
    envelope is formed and factored (from its first structurally nonzero column, scr.env; L keeps A's
    envelope): the same factor as the full one, without its products of zeros. Rows the PCR masks out
    (pinv = 0: pinned) are identity rows, so their unknowns stay 0 as in the PCR. A pivot that falls below
    1e-13 of its diagonal (a direction that only a zero compliance leaves singular: dependent rows with
    C = 0) is fixed at 0 (L's column zeroed, unit pivot marked by -1), the PCR's minimum-norm choice there.

    The row order (`dense_keys`, then `dense_take`): rows grouped by the higher-numbered body they act on (a
    wheel before the next), each group's contact rows before its joint rows. A contact row then couples only to
    its own group and a joint row only to its own group and the joint rows of earlier groups (through the
    shared parent), so the factor's envelope stays narrow: the robot's 36 rows take ~2,200 multiply-adds
    instead of the dense 7,800."""
    dense_keys(w, nrows, sc, rows, scr)
    dense_take(w, nrows, sc, scr)
    dense_factor_ordered(w, nrows, sc, rows, scr)
    return 0


@wp.func
def dense_factor_ordered(w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch):
    """`dense_factor` once its row order is in scr.perm (world w's factor at w dm^2 in scr.S, dm = scr.dm)."""
    rbase = w * sc.max_rows
    dm = scr.dm
    sbase = w * dm * dm
    for p in range(nrows):
        ri = rbase + scr.perm[rbase + p]
        ai = rows.a[ri]
        bi = rows.b[ri]
        masked_i = rows.pinv[ri] == 0.0
        ya = minv_jt(rows.inv_m, rows.inv_I, ai, rows.Ja[ri])
        yb = minv_jt(rows.inv_m, rows.inv_I, bi, rows.Jb[ri])
        first = p
        if not masked_i:
            for q in range(p):
                rj = rbase + scr.perm[rbase + q]
                if rows.pinv[rj] != 0.0 and shares_body(ai, bi, rows.a[rj], rows.b[rj]):
                    first = q
                    break
        scr.env[rbase + p] = first
        for q in range(first, p + 1):
            rj = rbase + scr.perm[rbase + q]
            v = wp.float64(0.0)
            if masked_i or rows.pinv[rj] == 0.0:
                if q == p:
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
                if q == p:
                    v += wp.float64(rows.C[ri])
            scr.S[sbase + p * dm + q] = v
    # Cholesky, row by row within the envelope: L[p, q] = (A[p, q] - sum_k L[p, k] L[q, k]) / L[q, q]
    for p in range(nrows):
        fp = scr.env[rbase + p]
        for q in range(fp, p):
            lq = scr.S[sbase + q * dm + q]
            s = wp.float64(0.0)
            if lq > wp.float64(0.0):  # a fixed pivot's column stays 0
                s = scr.S[sbase + p * dm + q]
                for k in range(wp.max(fp, scr.env[rbase + q]), q):
                    s -= scr.S[sbase + p * dm + k] * scr.S[sbase + q * dm + k]
                s = s / lq
            scr.S[sbase + p * dm + q] = s
        d0 = scr.S[sbase + p * dm + p]
        d = d0
        for k in range(fp, p):
            l = scr.S[sbase + p * dm + k]
            d -= l * l
        if d <= wp.float64(1.0e-13) * wp.abs(d0) or d <= wp.float64(0.0):
            scr.S[sbase + p * dm + p] = wp.float64(-1.0)  # fixed at zero: later rows zero their entry in column p
        else:
            scr.S[sbase + p * dm + p] = wp.sqrt(d)
    return 0


@wp.func
def dense_solve(w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch):
    """scr.x = A^-1 scr.rhs on world w's rows with `dense_factor`'s L, its row order and envelope (masked rows and
    fixed pivots: x = 0); scr.y64 is float64 scratch (the world's rows)."""
    rbase = w * sc.max_rows
    dm = scr.dm
    sbase = w * dm * dm
    for p in range(nrows):
        i = rbase + scr.perm[rbase + p]
        s = wp.float64(0.0)
        piv = scr.S[sbase + p * dm + p]
        if piv > wp.float64(0.0) and rows.pinv[i] != 0.0:
            s = wp.float64(scr.rhs[i])
            for k in range(scr.env[rbase + p], p):
                s -= scr.S[sbase + p * dm + k] * scr.y64[rbase + k]
            s = s / piv
        scr.y64[rbase + p] = s
    # L^T x = y, row by row from the last: each solved unknown is taken out of the rows of its envelope
    for pp in range(nrows):
        p = nrows - 1 - pp
        i = rbase + scr.perm[rbase + p]
        s = wp.float64(0.0)
        piv = scr.S[sbase + p * dm + p]
        if piv > wp.float64(0.0) and rows.pinv[i] != 0.0:
            s = scr.y64[rbase + p] / piv
            for k in range(scr.env[rbase + p], p):
                scr.y64[rbase + k] = scr.y64[rbase + k] - scr.S[sbase + p * dm + k] * s
        scr.y64[rbase + p] = s  # the float64 solution, in the factor's row order
        scr.x[i] = float(s)
    return 0


@wp.func
def schur_solve(direct: int, w: int, nrows: int, sc: StepConstants, rows: Rows, scr: SchurScratch, iters: int,
                tol: float):
    """A scr.x = scr.rhs on world w's rows: by the world's dense factor when ``direct`` (`dense_factor` ran on these
    rows), else by the Jacobi-preconditioned conjugate residual (A symmetric, x0 = 0, at most ``iters``
    iterations, to ``tol`` when > 0). The PCR's inner products are accumulated in the passes that write their
    vectors (r . z for the tolerance test only when tol > 0), one pass over the rows per update."""
    if direct != 0:
        dense_solve(w, nrows, sc, rows, scr)
        return 0
    rbase = w * sc.max_rows
    rz = float(0.0)
    for i in range(nrows):
        k = rbase + i
        scr.x[k] = 0.0
        scr.r[k] = scr.rhs[k]
        scr.z[k] = rows.pinv[k] * scr.rhs[k]
        scr.p[k] = scr.z[k]
        rz += scr.r[k] * scr.z[k]
    r0 = rz
    zAz = apply_A(w, nrows, sc, rows, scr)
    ApPAp = float(0.0)
    for i in range(nrows):
        k = rbase + i
        scr.Ap[k] = scr.Az[k]
        ApPAp += scr.Ap[k] * rows.pinv[k] * scr.Ap[k]
    for _it in range(iters):
        if tol > 0.0:
            if rz <= tol * tol * r0:
                break
        if ApPAp <= 1.0e-30 or zAz == 0.0:
            break
        alpha = zAz / ApPAp
        rz = float(0.0)
        for i in range(nrows):
            k = rbase + i
            scr.x[k] = scr.x[k] + alpha * scr.p[k]
            scr.r[k] = scr.r[k] - alpha * scr.Ap[k]
            scr.z[k] = scr.z[k] - alpha * rows.pinv[k] * scr.Ap[k]
            if tol > 0.0:
                rz += scr.r[k] * scr.z[k]
        zAz_new = apply_A(w, nrows, sc, rows, scr)
        beta = zAz_new / zAz
        zAz = zAz_new
        ApPAp = float(0.0)
        for i in range(nrows):
            k = rbase + i
            scr.p[k] = scr.z[k] + beta * scr.p[k]
            scr.Ap[k] = scr.Az[k] + beta * scr.Ap[k]
            ApPAp += scr.Ap[k] * rows.pinv[k] * scr.Ap[k]
    return 0
