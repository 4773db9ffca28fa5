"""The Schur solves of `schur.py` for LANES worlds per thread (`SolverOptions.lanes`, a CPU's vector lanes):
the PCR, the dense factor and its triangular solves, made per lane width by `lane_code(width)`.

Each lane runs the one-world code's operations in its order (`schur_solve`'s PCR, its float32 operations: J^T v row by
row, M~^-1 as `inv_mass_apply`, each row's dot products as `row_dot`; `dense_factor`'s and `dense_solve`'s
float64 ones), so a lane's solution equals the one-world solve's bit for bit; one thread's arithmetic then
covers LANES worlds (benchmarks/bench_lanes.py). Rows past a world's count and idle lanes are zero rows
(J = 0, rhs = 0, pinv = 0): they add exact zeros to a live lane's sums. A separate source from the one-world
code rather than one template: a lane's vector operations, masks and the shared envelope of a lanes' factor
have no counterpart in a world's own solve, which a GPU runs a world per thread.
"""

# No `from __future__ import annotations`: the lane functions are closures (`lane_code`), and Warp reads
# their annotations as objects (a string would be looked up in the module, not the closure)
from types import SimpleNamespace
from typing import Any

import warp as wp

from .schur import dense_factor_ordered, dense_keys, dense_solve, dense_take, minv_jt, shares_body
from .types import Rows, SchurScratch, StepConstants, lane_types

wp.set_module_options({"enable_backward": False})


@wp.func
def local_body(body: int, w: int, nbody: int):
    """A global body index within world w (-1: static)."""
    if body < 0:
        return -1
    return body - w * nbody


def lane_code(width: int) -> SimpleNamespace:
    """The lane functions below for one lane width (one of LANE_WIDTHS: `types.lane_types`), made once per
    width as Warp closures (LANES, the lane vectors and LaneScratch are the width's), each registered under a
    name of its width (one name for every width would make the widths overloads of one function, and a module
    using one width would compile them all); with the width's lane types (lanef, lanei, laned, LaneScratch), for
    the kernels built on them (`step.iteration_kernel`, `adjoint.precond_kernels`)."""
    if width in _LANE_CODE:
        return _LANE_CODE[width]
    LANES = width
    lt = lane_types(width)
    lanef = lt.lanef
    lanei = lt.lanei
    laned = lt.laned
    LaneScratch = lt.LaneScratch
    lane_rows = wp.types.matrix(shape=(12, LANES), dtype=wp.float32)
    lane_inertia = wp.types.matrix(shape=(9, LANES), dtype=wp.float32)
    lane_rows64 = wp.types.matrix(shape=(12, LANES), dtype=wp.float64)

    def lane_func(f: Any = None, *, inline: bool | None = None) -> Any:
        """`wp.func` registered as <name>_<width>."""
        if f is None:
            return lambda f: lane_func(f, inline=inline)
        return wp.func(f, name=f"{f.__name__}_{LANES}", inline=inline)

    # inlined: a call would copy its two arrays' descriptors per product
    @lane_func(inline=True)
    def lane_dot6(J: wp.array[Any], u: wp.array[Any], kj: int, t: int, zero: Any):
        """zero + sum_c J[kj + c] * u[t + c] per lane, c ascending (`wp.dot`'s and `dot6d`'s order from a zero
        vector; float32 or float64 lanes)."""
        d = zero
        for c in range(6):
            d = d + wp.cw_mul(J[kj + c], u[t + c])
        return d


    @lane_func
    def lane_any_out(m: lanei):
        """1 when a lane has m == 0."""
        out = int(0)
        for j in range(LANES):
            if m[j] == 0:
                out = 1
        return out


    @lane_func
    def lane_select(m: lanei, a: Any, b: Any):
        """a in the lanes where m != 0, else b (float32 or float64 lanes)."""
        out = b
        for j in range(LANES):
            if m[j] != 0:
                out[j] = a[j]
        return out


    @lane_func
    def lane_pack(g: int, go: lanei, sc: StepConstants, rows: Rows, n_rows: wp.array[int], scr: SchurScratch,
                  ln: LaneScratch):
        """Copy the rows, right-hand sides (scr.rhs) and inverse masses of group g's worlds in the lanes where go != 0
        into ln; returns the largest row count."""
        nbody = sc.nbody
        max_rows = sc.max_rows
        nr = lanei()
        nmax = int(0)
        for j in range(LANES):
            if go[j] != 0:
                nr[j] = n_rows[g * LANES + j]
                nmax = wp.max(nmax, nr[j])
        gr = (g % ln.slots) * max_rows
        for i in range(nmax):
            Jm = lane_rows()
            la = lanei()
            lb = lanei()
            C = lanef()
            P = lanef()
            R = lanef()
            for j in range(LANES):
                la[j] = -2  # a zero row: acts on whatever body the other lanes' row does
                lb[j] = -2
                if i < nr[j]:
                    w = g * LANES + j
                    row = w * max_rows + i
                    Ja = rows.Ja[row]
                    Jb = rows.Jb[row]
                    for c in range(6):
                        Jm[c, j] = Ja[c]
                        Jm[6 + c, j] = Jb[c]
                    la[j] = local_body(rows.a[row], w, nbody)
                    lb[j] = local_body(rows.b[row], w, nbody)
                    C[j] = rows.C[row]
                    P[j] = rows.pinv[row]
                    R[j] = scr.rhs[row]
            ra = int(-1)
            rb = int(-1)
            for j in range(LANES):
                if la[j] != -2:
                    ra = la[j]
                    rb = lb[j]
            uni = int(1)
            for j in range(LANES):
                if la[j] == -2:
                    la[j] = ra
                    lb[j] = rb
                if la[j] != ra or lb[j] != rb:
                    uni = 0
            k = gr + i
            for c in range(12):
                ln.J[k * 12 + c] = Jm[c]
            ln.la[k] = la
            ln.lb[k] = lb
            ln.uni[k] = uni
            ln.C[k] = C
            ln.pinv[k] = P
            ln.rhs[k] = R
        for bi in range(nbody):
            m = lanef()
            Im = lane_inertia()
            for j in range(LANES):
                if go[j] != 0:
                    b = (g * LANES + j) * nbody + bi
                    m[j] = rows.inv_m[b]
                    Ii = rows.inv_I[b]
                    for c in range(3):
                        for q in range(3):
                            Im[3 * c + q, j] = Ii[c, q]
            gb = (g % ln.slots) * nbody + bi
            ln.inv_m[gb] = m
            for c in range(9):
                ln.inv_I[gb * 9 + c] = Im[c]
        return nmax


    @lane_func
    def lane_scatter_mixed(k: int, side: int, body: lanei, vi: lanef, gb: int, J: wp.array[lanef],
                           tmp: wp.array[lanef]):
        """tmp[body] += vi * J_side of row slot k lane by lane (`apply_JT`'s update; the lanes' bodies differ)."""
        for j in range(LANES):
            bj = body[j]
            if bj >= 0:
                for c in range(6):
                    t = (gb + bj) * 6 + c
                    acc = tmp[t]
                    acc[j] = acc[j] + vi[j] * J[k * 12 + 6 * side + c][j]
                    tmp[t] = acc
        return 0


    @lane_func
    def lane_dot6_mixed(k: int, side: int, body: lanei, gb: int, J: wp.array[lanef], tmp: wp.array[lanef]):
        """J_side . u[body] of row slot k per lane, summed as `wp.dot` does (a static side: u = 0; the lanes'
        bodies differ)."""
        s = lanef()
        for c in range(6):
            u = lanef()
            for j in range(LANES):
                if body[j] >= 0:
                    u[j] = tmp[(gb + body[j]) * 6 + c][j]
            s = s + wp.cw_mul(J[k * 12 + 6 * side + c], u)
        return s


    @lane_func
    def lane_apply_A(slot: int, n: int, sc: StepConstants, ln: LaneScratch):
        """ln.Az = (J M~^-1 J^T + C) ln.z per lane (`apply_A`, on lane_pack's rows in scratch slot ``slot``);
        returns z . Az."""
        gr = slot * sc.max_rows
        gb = slot * sc.nbody
        for i in range(sc.nbody * 6):
            ln.tmp[gb * 6 + i] = lanef()
        for i in range(n):
            k = gr + i
            vi = ln.z[k]
            if ln.uni[k] != 0:
                a0 = ln.la[k][0]
                b0 = ln.lb[k][0]
                if a0 >= 0:
                    t = (gb + a0) * 6
                    for c in range(6):
                        ln.tmp[t + c] = ln.tmp[t + c] + wp.cw_mul(vi, ln.J[k * 12 + c])
                if b0 >= 0:
                    t = (gb + b0) * 6
                    for c in range(6):
                        ln.tmp[t + c] = ln.tmp[t + c] + wp.cw_mul(vi, ln.J[k * 12 + 6 + c])
            else:
                lane_scatter_mixed(k, 0, ln.la[k], vi, gb, ln.J, ln.tmp)
                lane_scatter_mixed(k, 1, ln.lb[k], vi, gb, ln.J, ln.tmp)
        for bi in range(sc.nbody):
            t = (gb + bi) * 6
            m = ln.inv_m[gb + bi]
            w0 = ln.tmp[t + 3]
            w1 = ln.tmp[t + 4]
            w2 = ln.tmp[t + 5]
            for c in range(3):
                ln.tmp[t + c] = wp.cw_mul(m, ln.tmp[t + c])
            ib = (gb + bi) * 9
            for c in range(3):
                # mat33 * vec3 as warp sums it: column by column
                a = wp.cw_mul(ln.inv_I[ib + 3 * c], w0)
                a = a + wp.cw_mul(ln.inv_I[ib + 3 * c + 1], w1)
                a = a + wp.cw_mul(ln.inv_I[ib + 3 * c + 2], w2)
                ln.tmp[t + 3 + c] = a
        vAv = lanef()
        zero = lanef()
        for i in range(n):
            k = gr + i
            # (J_a . u_a + J_b . u_b) + C v, each dot as wp.dot sums it (from 0, term by term); a static side's dot
            # is J . 0 = +0, as here. Written to Az[k] in each branch: a vector local assigned under a branch
            # costs a select of all its lanes after it
            if ln.uni[k] != 0:
                a0 = ln.la[k][0]
                b0 = ln.lb[k][0]
                ta = (gb + a0) * 6
                tb = (gb + b0) * 6
                if a0 >= 0:
                    if b0 >= 0:
                        ln.Az[k] = (lane_dot6(ln.J, ln.tmp, k * 12, ta, zero)
                                    + lane_dot6(ln.J, ln.tmp, k * 12 + 6, tb, zero)) + wp.cw_mul(ln.C[k], ln.z[k])
                    else:
                        ln.Az[k] = (lane_dot6(ln.J, ln.tmp, k * 12, ta, zero) + zero) + wp.cw_mul(ln.C[k], ln.z[k])
                elif b0 >= 0:
                    ln.Az[k] = (zero + lane_dot6(ln.J, ln.tmp, k * 12 + 6, tb, zero)) + wp.cw_mul(ln.C[k], ln.z[k])
                else:
                    ln.Az[k] = (zero + zero) + wp.cw_mul(ln.C[k], ln.z[k])
            else:
                ln.Az[k] = (lane_dot6_mixed(k, 0, ln.la[k], gb, ln.J, ln.tmp)
                            + lane_dot6_mixed(k, 1, ln.lb[k], gb, ln.J, ln.tmp)) + wp.cw_mul(ln.C[k], ln.z[k])
            vAv = vAv + wp.cw_mul(ln.z[k], ln.Az[k])
        return vAv


    @lane_func
    def lane_pcr(g: int, n: int, sc: StepConstants, go: lanei, iters: lanei, tol: lanef, ln: LaneScratch):
        """`schur_solve`'s PCR (x0 = 0) in the lanes where go != 0, lane j with its own iteration cap iters[j] and
        tolerance tol[j] (0: none), on the rows lane_pack copied; the solution in ln.x."""
        slot = g % ln.slots
        gr = slot * sc.max_rows
        rz = lanef()
        for i in range(n):
            k = gr + i
            ln.x[k] = lanef()
            ln.r[k] = ln.rhs[k]
            ln.z[k] = wp.cw_mul(ln.pinv[k], ln.rhs[k])
            ln.p[k] = ln.z[k]
            rz = rz + wp.cw_mul(ln.r[k], ln.z[k])
        r0 = rz
        zAz = lane_apply_A(slot, n, sc, ln)
        ApPAp = lanef()
        for i in range(n):
            k = gr + i
            ln.Ap[k] = ln.Az[k]
            ApPAp = ApPAp + wp.cw_mul(wp.cw_mul(ln.Ap[k], ln.pinv[k]), ln.Ap[k])
        live = go
        maxit = int(0)
        for j in range(LANES):
            if go[j] != 0:
                maxit = wp.max(maxit, iters[j])
        zero = lanef()
        for it in range(maxit):
            nlive = int(0)
            for j in range(LANES):
                if live[j] != 0:
                    if it >= iters[j]:
                        live[j] = 0
                    elif tol[j] > 0.0 and rz[j] <= tol[j] * tol[j] * r0[j]:
                        live[j] = 0
                    elif ApPAp[j] <= 1.0e-30 or zAz[j] == 0.0:
                        live[j] = 0
                    else:
                        nlive += 1
            if nlive == 0:
                break
            # finished lanes step by 0 (their x is kept below): their vectors stay put instead of running off
            alpha = lane_select(live, wp.cw_div(zAz, ApPAp), zero)
            rz = lanef()
            for i in range(n):
                k = gr + i
                ln.x[k] = lane_select(live, ln.x[k] + wp.cw_mul(alpha, ln.p[k]), ln.x[k])
                ln.r[k] = ln.r[k] - wp.cw_mul(alpha, ln.Ap[k])
                ln.z[k] = ln.z[k] - wp.cw_mul(wp.cw_mul(alpha, ln.pinv[k]), ln.Ap[k])
                rz = rz + wp.cw_mul(ln.r[k], ln.z[k])
            zAz_new = lane_apply_A(slot, n, sc, ln)
            beta = lane_select(live, wp.cw_div(zAz_new, zAz), zero)
            zAz = lane_select(live, zAz_new, zAz)
            ApPAp = lanef()
            for i in range(n):
                k = gr + i
                ln.p[k] = ln.z[k] + wp.cw_mul(beta, ln.p[k])
                ln.Ap[k] = ln.Az[k] + wp.cw_mul(beta, ln.Ap[k])
                ApPAp = ApPAp + wp.cw_mul(wp.cw_mul(ln.Ap[k], ln.pinv[k]), ln.Ap[k])
        return 0


    @lane_func
    def lane_unpack(g: int, go: lanei, sc: StepConstants, n_rows: wp.array[int], ln: LaneScratch, scr: SchurScratch):
        """ln.x of group g's worlds in the lanes where go != 0 back to their row slots of scr.x."""
        max_rows = sc.max_rows
        for j in range(LANES):
            if go[j] != 0:
                w = g * LANES + j
                for i in range(n_rows[w]):
                    scr.x[w * max_rows + i] = ln.x[(g % ln.slots) * max_rows + i][j]
        return 0


    @lane_func
    def lane_dense_factor(g: int, want: lanei, sc: StepConstants, rows: Rows, n_rows: wp.array[int], scr: SchurScratch,
                          ln: LaneScratch, Sd: wp.array[laned], gs: int):
        """`dense_factor` of group g's worlds in the lanes where want != 0 (their row orders and envelopes in
        scr.perm and scr.env). When their rows act on the same bodies in the factor's order (the same robot in the
        same contact state: the common case), the Schur matrix is assembled and factored in float64 lanes, each
        lane with `dense_factor`'s operations in its order (the same factor bit for bit), and kept in lanes at
        Sd[gs + p * dm + q] (`lane_dense_solve` solves by it; dm = scr.dm); returns 1. Else each world's own factor goes
        to its scr.S, as `dense_factor`'s; returns 0 (also when no world wanted one)."""
        nbody = sc.nbody
        max_rows = sc.max_rows
        dm = scr.dm
        j0 = int(-1)
        n = int(0)
        for j in range(LANES):
            if want[j] != 0:
                w = g * LANES + j
                rb = w * max_rows
                dense_keys(w, n_rows[w], sc, rows, scr)
                # rows with lane j0's keys take its order (what `dense_take` gives them); the first lane's is taken
                like = int(0)
                if j0 < 0:
                    j0 = j
                    n = n_rows[w]
                elif n_rows[w] == n:
                    r0 = (g * LANES + j0) * max_rows
                    like = int(1)
                    for i in range(n):
                        if scr.env[rb + i] != scr.env[r0 + i]:
                            like = 0
                if like != 0:
                    for i in range(n):
                        scr.perm[rb + i] = scr.perm[(g * LANES + j0) * max_rows + i]
                else:
                    dense_take(w, n_rows[w], sc, scr)
        if j0 < 0:
            return 0
        w0 = g * LANES + j0
        r0 = w0 * max_rows
        same = int(1)
        for j in range(LANES):
            if want[j] != 0 and same != 0:
                w = g * LANES + j
                if n_rows[w] != n:
                    same = 0
                else:
                    for p in range(n):
                        ri = w * max_rows + scr.perm[w * max_rows + p]
                        rr = r0 + scr.perm[r0 + p]
                        if local_body(rows.a[ri], w, nbody) != local_body(rows.a[rr], w0, nbody) or local_body(
                                rows.b[ri], w, nbody) != local_body(rows.b[rr], w0, nbody) or (
                                rows.pinv[ri] == 0.0) != (rows.pinv[rr] == 0.0):
                            same = 0
        if same == 0:  # their orders are written above
            for j in range(LANES):
                if want[j] != 0:
                    w = g * LANES + j
                    dense_factor_ordered(w, n_rows[w], sc, rows, scr)
            return 0
        gd = (g % ln.slots) * dm  # the rows' slots in Jd and Y: at most dm rows per world factor
        ones = laned(wp.float64(1.0))
        # the rows in factor order: J in float64 and M~^-1 J^T per lane, their compliance
        for p in range(n):
            k = (gd + p) * 12
            # gathered lane by lane into locals, then stored as 12 vectors each (an element written into the
            # scratch's vectors one at a time is a load and a store of the whole vector)
            Jm = lane_rows64()
            Ym = lane_rows64()
            for j in range(LANES):
                if want[j] != 0:
                    w = g * LANES + j
                    ri = w * max_rows + scr.perm[w * max_rows + p]
                    Ja = rows.Ja[ri]
                    Jb = rows.Jb[ri]
                    ya = minv_jt(rows.inv_m, rows.inv_I, rows.a[ri], Ja)
                    yb = minv_jt(rows.inv_m, rows.inv_I, rows.b[ri], Jb)
                    for c in range(6):
                        Jm[c, j] = wp.float64(Ja[c])
                        Jm[6 + c, j] = wp.float64(Jb[c])
                        Ym[c, j] = ya[c]
                        Ym[6 + c, j] = yb[c]
            for c in range(12):
                ln.Jd[k + c] = Jm[c]
                ln.Y[k + c] = Ym[c]
        # assembly within the envelope (the structure is lane j0's, shared by every lane)
        for p in range(n):
            ri = r0 + scr.perm[r0 + p]
            ai = local_body(rows.a[ri], w0, nbody)
            bi = local_body(rows.b[ri], w0, nbody)
            masked_i = rows.pinv[ri] == 0.0
            first = p
            if not masked_i:
                for q in range(p):
                    rj = r0 + scr.perm[r0 + q]
                    if rows.pinv[rj] != 0.0 and shares_body(ai, bi, local_body(rows.a[rj], w0, nbody),
                                                           local_body(rows.b[rj], w0, nbody)):
                        first = q
                        break
            Cp = laned()
            for j in range(LANES):
                if want[j] != 0:
                    w = g * LANES + j
                    scr.env[w * max_rows + p] = first
                    Cp[j] = wp.float64(rows.C[w * max_rows + scr.perm[w * max_rows + p]])
            ki = (gd + p) * 12
            for q in range(first, p + 1):
                rj = r0 + scr.perm[r0 + q]
                # the element is summed in place in Sd (from 0, as dense_factor's): a vector local assigned under a
                # branch costs a select of all its lanes after the branch, which took more time than the products
                e = gs + p * dm + q
                Sd[e] = laned()
                if masked_i or rows.pinv[rj] == 0.0:
                    if q == p:
                        Sd[e] = ones
                else:
                    aj = local_body(rows.a[rj], w0, nbody)
                    bj = local_body(rows.b[rj], w0, nbody)
                    kj = (gd + q) * 12
                    # dense_factor's four products in its order, (a, a), (a, b), (b, a), (b, b), each `dot6d` per lane
                    # (summed from 0, k ascending)
                    for t in range(4):
                        jb = aj
                        jo = int(0)
                        if t >= 2:
                            jb = bj
                            jo = 6
                        ib = ai
                        yo = int(0)
                        if t == 1 or t == 3:
                            ib = bi
                            yo = 6
                        if jb >= 0 and jb == ib:
                            Sd[e] = Sd[e] + lane_dot6(ln.Jd, ln.Y, kj + jo, ki + yo, laned())
                    if q == p:
                        Sd[e] = Sd[e] + Cp
        # Cholesky within the envelope, as dense_factor's; a lane's fixed pivot (-1) zeroes its column
        zero = laned()
        for p in range(n):
            fp = scr.env[r0 + p]
            for q in range(fp, p):
                lq = Sd[gs + q * dm + q]
                s = Sd[gs + p * dm + q]
                for k in range(wp.max(fp, scr.env[r0 + q]), q):
                    s = s - wp.cw_mul(Sd[gs + p * dm + k], Sd[gs + q * dm + k])
                s = wp.cw_div(s, lq)
                Sd[gs + p * dm + q] = s
                # the lanes' fix, only where a pivot is fixed (a scalar test first: the per-lane assignments cost a
                # select of the whole vector each)
                fixed = int(0)
                for j in range(LANES):
                    if not (lq[j] > wp.float64(0.0)):
                        fixed = 1
                if fixed != 0:
                    for j in range(LANES):
                        if not (lq[j] > wp.float64(0.0)):
                            s[j] = zero[j]
                    Sd[gs + p * dm + q] = s
            d0 = Sd[gs + p * dm + p]
            d = d0
            for k in range(fp, p):
                lk = Sd[gs + p * dm + k]
                d = d - wp.cw_mul(lk, lk)
            for j in range(LANES):
                if d[j] <= wp.float64(1.0e-13) * wp.abs(d0[j]) or d[j] <= wp.float64(0.0):
                    d[j] = wp.float64(-1.0)
                else:
                    d[j] = wp.sqrt(d[j])
            Sd[gs + p * dm + p] = d
        return 1


    # inlined: called per factor row of every solve, and a call would copy Rows and SchurScratch
    @lane_func(inline=True)
    def lane_live(g: int, go: lanei, p: int, piv: laned, max_rows: int, rows: Rows, scr: SchurScratch):
        """The lanes where go != 0 that solve for factor row p, `dense_solve`'s test: its pivot kept (> 0) and
        its row not masked (pinv != 0)."""
        live = lanei()
        for j in range(LANES):
            if go[j] != 0:
                w = g * LANES + j
                if piv[j] > wp.float64(0.0) and rows.pinv[w * max_rows + scr.perm[w * max_rows + p]] != 0.0:
                    live[j] = 1
        return live


    @lane_func
    def lane_dense_solve(g: int, go: lanei, n: int, sc: StepConstants, rows: Rows, scr: SchurScratch,
                         Sd: wp.array[laned], gs: int, ln: LaneScratch):
        """`dense_solve` (scr.x from scr.rhs) of group g's worlds in the lanes where go != 0, by the lanes' factor that
        `lane_dense_factor` kept at Sd[gs + p * dm + q] (dm = scr.dm; their n rows in one structure: the envelope of the
        first such lane's world, each world's own row order). Each lane runs `dense_solve`'s float64
        operations in its order, so x equals each world's own solve bit for bit; lanes whose row is masked
        or whose pivot is fixed take 0 there, as `dense_solve`, and leave the other unknowns as they were."""
        max_rows = sc.max_rows
        dm = scr.dm
        j0 = int(-1)
        for j in range(LANES):
            if go[j] != 0 and j0 < 0:
                j0 = j
        if j0 < 0:
            return 0
        r0 = (g * LANES + j0) * max_rows
        yb = (g % ln.slots) * dm
        zero = laned()
        for p in range(n):
            piv = Sd[gs + p * dm + p]
            live = lane_live(g, go, p, piv, max_rows, rows, scr)
            s = laned()
            for j in range(LANES):
                if live[j] != 0:
                    w = g * LANES + j
                    s[j] = wp.float64(scr.rhs[w * max_rows + scr.perm[w * max_rows + p]])
            for k in range(scr.env[r0 + p], p):
                s = s - wp.cw_mul(Sd[gs + p * dm + k], ln.yd[yb + k])
            s = wp.cw_div(s, piv)
            # a lane that does not solve for row p takes 0 there: the lanes' vectors are fixed in memory and only
            # when a lane is out (a scalar test first; a vector assigned under a branch costs a select of all its
            # lanes)
            ln.yd[yb + p] = s
            if lane_any_out(live) != 0:
                ln.yd[yb + p] = lane_select(live, s, zero)
        # L^T x = y from the last row, as dense_solve: a lane updates its unknowns only where its row is live
        for pp in range(n):
            p = n - 1 - pp
            piv = Sd[gs + p * dm + p]
            live = lane_live(g, go, p, piv, max_rows, rows, scr)
            out = lane_any_out(live)
            ln.yd[yb + p] = wp.cw_div(ln.yd[yb + p], piv)
            if out != 0:
                ln.yd[yb + p] = lane_select(live, ln.yd[yb + p], zero)
            s = ln.yd[yb + p]
            if out == 0:
                for k in range(scr.env[r0 + p], p):
                    ln.yd[yb + k] = ln.yd[yb + k] - wp.cw_mul(Sd[gs + p * dm + k], s)
            else:
                for k in range(scr.env[r0 + p], p):
                    yk = ln.yd[yb + k]
                    ln.yd[yb + k] = lane_select(live, yk - wp.cw_mul(Sd[gs + p * dm + k], s), yk)
            for j in range(LANES):
                if go[j] != 0:
                    w = g * LANES + j
                    scr.x[w * max_rows + scr.perm[w * max_rows + p]] = float(s[j])
        return 0


    @lane_func
    def lane_solves(g: int, pcr: lanei, dv: lanei, lf: int, iters: lanei, tol: lanef, sc: StepConstants, rows: Rows,
                    n_rows: wp.array[int], scr: SchurScratch, ln: LaneScratch):
        """A scr.x = scr.rhs for group g's worlds: those in pcr by the lanes' PCR (lane j to iters[j], tol[j]), those
        in dv by their dense factor, the lanes' one in ln's slot when lf = 1 (`lane_dense_factor` kept it there),
        else each world's own in scr.S. Each world's x is its one-world solve's bit for bit."""
        npcr = int(0)
        ndir = int(0)
        nd = int(0)
        for j in range(LANES):
            if pcr[j] != 0:
                npcr += 1
            if dv[j] != 0:
                ndir += 1
                nd = n_rows[g * LANES + j]  # the same in every lane of a lanes' factor
        if npcr > 0:
            n = lane_pack(g, pcr, sc, rows, n_rows, scr, ln)
            lane_pcr(g, n, sc, pcr, iters, tol, ln)
            lane_unpack(g, pcr, sc, n_rows, ln, scr)
        if ndir > 0:
            if lf != 0:
                lane_dense_solve(g, dv, nd, sc, rows, scr, ln.S, (g % ln.slots) * scr.dm * scr.dm, ln)
            else:
                for j in range(LANES):
                    if dv[j] != 0:
                        w = g * LANES + j
                        dense_solve(w, n_rows[w], sc, rows, scr)
        return 0

    ns = SimpleNamespace(
        width=width, lanef=lanef, lanei=lanei, laned=laned, LaneScratch=LaneScratch,
        lane_rows=lane_rows, lane_inertia=lane_inertia, lane_rows64=lane_rows64, lane_select=lane_select,
        lane_pack=lane_pack, lane_scatter_mixed=lane_scatter_mixed, lane_dot6_mixed=lane_dot6_mixed,
        lane_apply_A=lane_apply_A, lane_pcr=lane_pcr, lane_unpack=lane_unpack, lane_dense_factor=lane_dense_factor,
        lane_live=lane_live, lane_dense_solve=lane_dense_solve, lane_solves=lane_solves,
    )
    _LANE_CODE[width] = ns
    return ns


_LANE_CODE: dict[int, SimpleNamespace] = {}
