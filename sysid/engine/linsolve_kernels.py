"""Kernels of the per-world linear solve of a converged step (`linsolve.StepSystem`, which says why the
step Jacobian is assembled and solved by a dense LU): seeding and gathering the VJP sweeps, the
tangent's right-hand sides, the equilibrated LU factor and solve, the residual check, and the Krylov adjoint's
per-world GMRES (`linsolve.Krylov`). Warp kernel
code only (pyproject's mypy section says why these modules are not type-checked by mypy).

Flat arrays, no struct groups (docs/architecture.md, "Kernel convention"): the dense systems, pivots, scalings and
Krylov bases belong to `linsolve.StepSystem` and `linsolve.Krylov`, not to the step's state the groups hold."""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})


@wp.func
def s_adjoint(w: int, i: int, nbw: int, nu: int, max_rows: int, u_grad: wp.array[wp.spatial_vector],
              lam_grad: wp.array[float]):
    """Entry i of world w's s-adjoint (u+ then lam+) after a VJP sweep: (A^T seed)_i."""
    v = float(0.0)
    if i < nu:
        v = u_grad[w * nbw + i / 6][i % 6]
    else:
        v = lam_grad[w * max_rows + i - nu]
    return v


@wp.kernel
def seed_unit_row(
    i: int,
    nbw: int,
    nu: int,
    max_rows: int,
    r_dyn_grad: wp.array[wp.spatial_vector],
    r_con_grad: wp.array[float],
):
    """Seed dL/dr = e_i (local unknown index i) in every world."""
    w = wp.tid()
    if i < nu:
        v = wp.spatial_vector()
        v[i % 6] = 1.0
        r_dyn_grad[w * nbw + i / 6] = v
    else:
        r_con_grad[w * max_rows + i - nu] = 1.0


@wp.kernel
def gather(
    n: int,
    world_stride: int,
    entry_stride: int,
    offset: int,
    nbw: int,
    nu: int,
    max_rows: int,
    u_grad: wp.array[wp.spatial_vector],
    lam_grad: wp.array[float],
    out: wp.array[wp.float64],
):
    """Each world's s-adjoint (its n entries) into out[w world_stride + i entry_stride + offset], dim (W, n):
    row i of the assembled dr/ds from the sweep seeded with e_i (world_stride n^2, entry_stride 1, offset i n),
    or column j of the Krylov's Z from the preconditioner's output (n m, m, j)."""
    w, i = wp.tid()
    out[w * world_stride + i * entry_stride + offset] = wp.float64(s_adjoint(w, i, nbw, nu, max_rows, u_grad,
                                                                              lam_grad))


@wp.kernel
def rhs_state_row(
    i: int,
    n: int,
    p: int,
    nbw: int,
    nb: int,
    gq: wp.array[wp.transform],
    gqd: wp.array[wp.spatial_vector],
    dq: wp.array[float],
    dqd: wp.array[float],
    rhs: wp.array[wp.float64],
):
    """rhs[w, i, c] = (dr_i/d body_q) dq_c + (dr_i/d body_qd) dqd_c over world w's bodies (overwrites)."""
    w, c = wp.tid()
    s = wp.float64(0.0)
    for k in range(nbw):
        b = w * nbw + k
        t = gq[b]
        for m in range(7):
            s += wp.float64(t[m]) * wp.float64(dq[(c * nb + b) * 7 + m])
        v = gqd[b]
        for m in range(6):
            s += wp.float64(v[m]) * wp.float64(dqd[(c * nb + b) * 6 + m])
    rhs[(w * n + i) * p + c] = s


@wp.kernel
def rhs_entries_row(
    i: int,
    n: int,
    p: int,
    ne: int,
    grad: wp.array[float],
    entry: wp.array[int],
    world: wp.array[int],
    seed: wp.array[float],
    rhs: wp.array[wp.float64],
):
    """rhs[w, i, c] += (dr_i/d x_e) dx_e,c for the seeded entries e of one input array x."""
    k, c = wp.tid()
    g = grad[entry[k]]
    sd = seed[c * ne + k]
    if g != 0.0 and sd != 0.0:
        wp.atomic_add(rhs, (world[k] * n + i) * p + c, wp.float64(g) * wp.float64(sd))


RANK_TOL = wp.constant(wp.float64(1.0e-7))  # see lu_factor


@wp.kernel
def lu_factor(
    n: int,
    A: wp.array[wp.float64],
    piv: wp.array[int],
    qiv: wp.array[int],
    rank: wp.array[int],
    fixed: wp.array[int],
    rscale: wp.array[wp.float64],
    cscale: wp.array[wp.float64],
    pivot_ratio: wp.array[wp.float64],
):
    """In-place equilibrated LU with complete pivoting of one world's n x n matrix (a thread per
    world): P (D A S) Q = L U, D and S the row and column max-abs scalings, P and Q sequential row
    and column swaps. Zero rows become e_i (``fixed``). Elimination stops when the largest
    remaining entry falls below RANK_TOL times the first pivot: the step Jacobian is singular when
    contacts share a friction Jacobian and stick (a box's four corners: W ~ fb_eps^2, the split of
    their friction impulse is indeterminate, 1e-16 relative); the solves then return the basic
    solution of the consistent system (the undetermined impulse split set to zero), which the
    per-world residual check confirms. 1e-7 sits above float32 assembly noise of a rank-deficient
    block and below the smallest physical pivot of the CI scenes (contact compliance, 2e-4)."""
    w = wp.tid()
    base = w * n * n
    zero = wp.float64(0.0)
    one = wp.float64(1.0)
    for r in range(n):
        mx = zero
        for c in range(n):
            mx = wp.max(mx, wp.abs(A[base + r * n + c]))
        fixed[w * n + r] = 0
        if mx == zero:
            A[base + r * n + r] = one
            mx = one
            fixed[w * n + r] = 1
        rscale[w * n + r] = one / mx
        for c in range(n):
            A[base + r * n + c] = A[base + r * n + c] / mx
    for c in range(n):
        mx = zero
        for r in range(n):
            mx = wp.max(mx, wp.abs(A[base + r * n + c]))
        if mx == zero:
            mx = one
        cscale[w * n + c] = one / mx
        for r in range(n):
            A[base + r * n + c] = A[base + r * n + c] / mx
    first = zero
    pmin = wp.float64(1.0e300)
    rk = n
    for k in range(n):
        pr = k
        pc = k
        mx = zero
        for r in range(k, n):
            for c in range(k, n):
                a = wp.abs(A[base + r * n + c])
                if a > mx:
                    mx = a
                    pr = r
                    pc = c
        if k == 0:
            first = mx
        piv[w * n + k] = pr
        qiv[w * n + k] = pc
        if mx <= RANK_TOL * first or mx == zero:
            rk = k
            for kk in range(k, n):
                piv[w * n + kk] = kk
                qiv[w * n + kk] = kk
            break
        if pr != k:
            for c in range(n):
                t = A[base + k * n + c]
                A[base + k * n + c] = A[base + pr * n + c]
                A[base + pr * n + c] = t
        if pc != k:
            for r in range(n):
                t = A[base + r * n + k]
                A[base + r * n + k] = A[base + r * n + pc]
                A[base + r * n + pc] = t
        d = A[base + k * n + k]
        pmin = wp.min(pmin, wp.abs(d))
        for r in range(k + 1, n):
            f = A[base + r * n + k] / d
            A[base + r * n + k] = f
            if f != zero:
                for c in range(k + 1, n):
                    A[base + r * n + c] = A[base + r * n + c] - f * A[base + k * n + c]
    rank[w] = rk
    pivot_ratio[w] = pmin / wp.max(first, wp.float64(1.0e-300))


@wp.func
def swap_entries(x: wp.array[wp.float64], i: int, j: int):
    if i != j:
        t = x[i]
        x[i] = x[j]
        x[j] = t
    return 0


@wp.kernel
def lu_solve(
    n: int,
    p: int,
    transpose: int,
    A: wp.array[wp.float64],
    piv: wp.array[int],
    qiv: wp.array[int],
    rank: wp.array[int],
    rscale: wp.array[wp.float64],
    cscale: wp.array[wp.float64],
    x: wp.array[wp.float64],
):
    """Solve A x = b (transpose 0) or A^T x = b (1) in place for column c of x (W, n, p), with
    the factor of lu_factor; unknowns beyond the numerical rank are set to zero."""
    w, c = wp.tid()
    base = w * n * n
    o = w * n
    rk = rank[w]
    zero = wp.float64(0.0)
    if transpose == 0:
        # L U v = P D b, y = Q v, x = S y
        for r in range(n):
            x[(o + r) * p + c] = x[(o + r) * p + c] * rscale[o + r]
        for k in range(n):
            swap_entries(x, (o + k) * p + c, (o + piv[o + k]) * p + c)
        for r in range(n):
            s = x[(o + r) * p + c]
            for k in range(wp.min(r, rk)):
                s -= A[base + r * n + k] * x[(o + k) * p + c]
            x[(o + r) * p + c] = s
        for rr in range(n):
            r = n - 1 - rr
            s = zero
            if r < rk:
                s = x[(o + r) * p + c]
                for k in range(r + 1, rk):
                    s -= A[base + r * n + k] * x[(o + k) * p + c]
                s = s / A[base + r * n + r]
            x[(o + r) * p + c] = s
        for kk in range(n):
            k = n - 1 - kk
            swap_entries(x, (o + k) * p + c, (o + qiv[o + k]) * p + c)
        for r in range(n):
            x[(o + r) * p + c] = x[(o + r) * p + c] * cscale[o + r]
    else:
        # (DAS)^T = Q U^T L^T P: U^T t = Q^T S b, L^T g = t, y = P^T g, x = D y
        for r in range(n):
            x[(o + r) * p + c] = x[(o + r) * p + c] * cscale[o + r]
        for k in range(n):
            swap_entries(x, (o + k) * p + c, (o + qiv[o + k]) * p + c)
        for r in range(n):
            s = zero
            if r < rk:
                s = x[(o + r) * p + c]
                for k in range(r):
                    s -= A[base + k * n + r] * x[(o + k) * p + c]
                s = s / A[base + r * n + r]
            x[(o + r) * p + c] = s
        for rr in range(n):
            r = n - 1 - rr
            s = x[(o + r) * p + c]
            for k in range(r + 1, rk):
                s -= A[base + k * n + r] * x[(o + k) * p + c]
            x[(o + r) * p + c] = s
        for kk in range(n):
            k = n - 1 - kk
            swap_entries(x, (o + k) * p + c, (o + piv[o + k]) * p + c)
        for r in range(n):
            x[(o + r) * p + c] = x[(o + r) * p + c] * rscale[o + r]


@wp.kernel
def residual_norms(
    n: int,
    p: int,
    A0: wp.array[wp.float64],
    fixed: wp.array[int],
    x: wp.array[wp.float64],
    b: wp.array[wp.float64],
    out: wp.array[wp.float64],
):
    """out[w] = max over columns of |A0 x - b| / |b| (non-fixed rows), in the assembled matrix."""
    w = wp.tid()
    worst = wp.float64(0.0)
    for c in range(p):
        rr = wp.float64(0.0)
        bb = wp.float64(0.0)
        for r in range(n):
            if fixed[w * n + r] != 0:
                continue
            s = -b[(w * n + r) * p + c]
            for k in range(n):
                s += A0[(w * n + r) * n + k] * x[(w * n + k) * p + c]
            rr += s * s
            bb += b[(w * n + r) * p + c] * b[(w * n + r) * p + c]
        if bb > wp.float64(0.0):
            worst = wp.max(worst, wp.sqrt(rr / bb))
        elif rr > wp.float64(0.0):
            worst = wp.max(worst, wp.sqrt(rr))
    out[w] = worst


@wp.kernel
def write_seed_from(
    n: int,
    p: int,
    c: int,
    nbw: int,
    nu: int,
    max_rows: int,
    x: wp.array[wp.float64],
    skip: wp.array[int],
    r_dyn_grad: wp.array[wp.spatial_vector],
    r_con_grad: wp.array[float],
):
    """dL/dr = column c of x (W, n, p): the adjoint w as the seed of the final VJP sweep; worlds with
    skip[w] != 0 left as they are (the Krylov adjoint's worlds already solved). Only the system's n - nu
    constraint rows are written: every world's rows in use are among them, and a sweep's row adjoints past
    them are zero (`Simulation._sweep` zeroes them first); the preconditioner's y_lam, also written here, is
    read on a world's own rows only."""
    w = wp.tid()
    if skip[w] != 0:
        return
    for k in range(nbw):
        v = wp.spatial_vector()
        for m in range(6):
            v[m] = float(x[(w * n + k * 6 + m) * p + c])
        r_dyn_grad[w * nbw + k] = v
    for r in range(wp.min(max_rows, n - nu)):
        r_con_grad[w * max_rows + r] = float(x[(w * n + nu + r) * p + c])


@wp.kernel
def scatter_du(
    n: int,
    p: int,
    nbw: int,
    nb: int,
    sign: float,
    x: wp.array[wp.float64],
    du: wp.array[float],
):
    """du[c, b, :] = the u+ part of the tangent solution (W, n, p)."""
    b, c = wp.tid()
    w = b / nbw
    k = b - w * nbw
    for m in range(6):
        du[(c * nb + b) * 6 + m] = sign * float(x[(w * n + k * 6 + m) * p + c])


@wp.kernel
def seed_pose_component(m: int, nb: int, q_plus_grad: wp.array[wp.transform]):
    b = wp.tid()
    pos = wp.vec3(0.0)
    rot = wp.quat(0.0, 0.0, 0.0, 0.0)
    if m < 3:
        pos[m] = 1.0
    else:
        rot[m - 3] = 1.0
    q_plus_grad[b] = wp.transform(pos, rot)


@wp.kernel
def pose_tangent_component(
    m: int,
    nb: int,
    gq: wp.array[wp.transform],
    gu: wp.array[wp.spatial_vector],
    dq: wp.array[float],
    du: wp.array[float],
    dq_out: wp.array[float],
):
    """Component m of d body_q+ = (d q+_m / d body_q) dq + (d q+_m / d u+) du (the kinematic map, eq. 1)."""
    b, c = wp.tid()
    t = gq[b]
    g = gu[b]
    s = float(0.0)
    for k in range(7):
        s += t[k] * dq[(c * nb + b) * 7 + k]
    for k in range(6):
        s += g[k] * du[(c * nb + b) * 6 + k]
    dq_out[(c * nb + b) * 7 + m] = s



# ---- the adjoint's per-step bookkeeping on the device (Simulation._backward_step_on_device): what the host
# did with numpy between the solves, in the same float32 / float64 arithmetic, so gradients stay bit-identical


@wp.kernel
def adjoint_rhs(
    n: int,
    nu: int,
    nbw: int,
    gu: wp.array[wp.spatial_vector],
    u_grad: wp.array[wp.spatial_vector],
    rhs_out: wp.array[wp.float64],
):
    """b = -(dL/du+ + h G^T dL/dq+) in each world's first nu entries, 0 in its rows (eq. 16, 18); dim (W, n)."""
    w, i = wp.tid()
    val = wp.float64(0.0)
    if i < nu:
        g = gu[w * nbw + i / 6] + u_grad[w * nbw + i / 6]
        val = -wp.float64(g[i % 6])
    rhs_out[w * n + i] = val


@wp.kernel
def adjoint_check(
    step_in: wp.array[int],
    n: int,
    nu: int,
    nbw: int,
    max_rows: int,
    u_grad: wp.array[wp.spatial_vector],
    lam_grad: wp.array[float],
    fixed: wp.array[int],
    b: wp.array[wp.float64],
    res_out: wp.array2d[wp.float64],
):
    """Relative residual |A^T w - b| / |b| of a world's solve, A^T w from the final VJP sweep (the
    matrix-free operator), fixed (identity) rows left out; into row ``step`` of res_out (T, W)."""
    w = wp.tid()
    num = wp.float64(0.0)
    den = wp.float64(0.0)
    for i in range(n):
        bi = b[w * n + i]
        den += bi * bi
        if fixed[w * n + i] == 0:
            e = wp.float64(s_adjoint(w, i, nbw, nu, max_rows, u_grad, lam_grad)) - bi
            num += e * e
    if den <= wp.float64(0.0):
        den = wp.float64(1.0)
    res_out[step_in[0], w] = wp.sqrt(num) / wp.sqrt(den)


@wp.kernel
def adjoint_carry(
    step_in: wp.array[int],
    gq_direct: wp.array[wp.transform],
    q_grad: wp.array[wp.transform],
    qd_grad: wp.array[wp.spatial_vector],
    gQ: wp.array2d[wp.transform],
    gQD: wp.array2d[wp.spatial_vector],
    gq_out: wp.array[wp.transform],
    gu_out: wp.array[wp.spatial_vector],
):
    """dL/dq-, dL/du- of the step (eq. 17) plus the loss's own dL/dq, dL/du at the step's start state."""
    b = wp.tid()
    t = step_in[0]
    gq_out[b] = (gq_direct[b] + q_grad[b]) + gQ[t, b]
    gu_out[b] = qd_grad[b] + gQD[t, b]


@wp.kernel
def scatter_joint_grad(
    step_in: wp.array[int],
    start: wp.array[int],
    grad: wp.array[float],
    g_out: wp.array2d[float],
):
    """Row ``step`` of a (T, dofs) target gradient += a joint-level gradient at each joint's first dof."""
    j = wp.tid()
    wp.atomic_add(g_out, step_in[0], start[j], grad[j])


@wp.kernel
def accumulate64(g: wp.array[float], acc_out: wp.array[wp.float64]):
    """acc += g, summed over the steps in float64."""
    i = wp.tid()
    acc_out[i] = acc_out[i] + wp.float64(g[i])


@wp.kernel
def accumulate64_step(
    step_in: wp.array[int],
    g: wp.array[float],
    acc_out: wp.array[wp.float64],
    per_step_out: wp.array2d[wp.float64],
):
    """acc += g, and this step's share (acc after - acc before, as the host computed it) into row ``step``."""
    i = wp.tid()
    before = acc_out[i]
    after = before + wp.float64(g[i])
    acc_out[i] = after
    per_step_out[step_in[0], i] = after - before


# ---- the Krylov adjoint (SolverOptions.adjoint_solver="krylov", `linsolve.Krylov`): per-world right-
# preconditioned GMRES on A^T w = b, a thread per world. Layouts (float64, world-major, flat): V (W, n, m+1) the
# Arnoldi basis, Z (W, n, m) the preconditioned directions (a column is a `write_seed_from` seed with p = m),
# H (W, m+1, m) the Hessenberg matrix rotated to upper triangular, cs / sn (W, m) its Givens rotations, g
# (W, m+1) the rotated right-hand side (|g[k]| is the residual norm after k iterations).


@wp.kernel
def krylov_init(
    n: int,
    m: int,
    restart: int,
    b: wp.array[wp.float64],
    ok: wp.array[int],
    V: wp.array[wp.float64],
    g: wp.array[wp.float64],
    done: wp.array[int],
    kk: wp.array[int],
    bnorm: wp.array[wp.float64],
):
    """x0 = 0: v_0 = b / |b|, g = |b| e_0; a world with b = 0 is done (w = 0). A restart (``restart``) leaves
    the worlds the last check passed (``ok``) done: their solution stays as it is, so a world's result does
    not depend on whether other worlds needed the cycle."""
    w = wp.tid()
    m1 = m + 1
    s = wp.float64(0.0)
    for i in range(n):
        s += b[w * n + i] * b[w * n + i]
    beta = wp.sqrt(s)
    bnorm[w] = beta
    kk[w] = 0
    for j in range(m1):
        g[w * m1 + j] = wp.float64(0.0)
    g[w * m1] = beta
    inv = wp.float64(0.0)
    if beta > wp.float64(0.0) and (restart == 0 or ok[w] == 0):
        inv = wp.float64(1.0) / beta
        done[w] = 0
    else:
        done[w] = 1
    for i in range(n):
        V[(w * n + i) * m1] = b[w * n + i] * inv


@wp.kernel
def krylov_arnoldi(
    j: int,
    n: int,
    m: int,
    nbw: int,
    nu: int,
    max_rows: int,
    tol: float,
    u_grad: wp.array[wp.spatial_vector],
    lam_grad: wp.array[float],
    V: wp.array[wp.float64],
    H: wp.array[wp.float64],
    cs: wp.array[wp.float64],
    sn: wp.array[wp.float64],
    g: wp.array[wp.float64],
    done: wp.array[int],
    kk: wp.array[int],
    bnorm: wp.array[wp.float64],
):
    """Iteration j of a world's GMRES with A^T z_j from the sweep seeded with column j of Z (u_grad,
    lam_grad): modified Gram-Schmidt twice against v_0..v_j (the float32 sweep's products lose
    orthogonality fast), the Hessenberg column rotated, the residual norm |g[j+1]|; the world is done when
    it falls to tol |b| (or the basis breaks down: the solution is in the space)."""
    w = wp.tid()
    if done[w] != 0:
        return
    m1 = m + 1
    c1 = j + 1
    for i in range(n):
        V[(w * n + i) * m1 + c1] = wp.float64(s_adjoint(w, i, nbw, nu, max_rows, u_grad, lam_grad))
    for i in range(c1):
        H[(w * m1 + i) * m + j] = wp.float64(0.0)
    for _pass in range(2):
        for i in range(c1):
            h = wp.float64(0.0)
            for l in range(n):
                h += V[(w * n + l) * m1 + c1] * V[(w * n + l) * m1 + i]
            for l in range(n):
                V[(w * n + l) * m1 + c1] = V[(w * n + l) * m1 + c1] - h * V[(w * n + l) * m1 + i]
            H[(w * m1 + i) * m + j] = H[(w * m1 + i) * m + j] + h
    s = wp.float64(0.0)
    for l in range(n):
        s += V[(w * n + l) * m1 + c1] * V[(w * n + l) * m1 + c1]
    hn = wp.sqrt(s)
    if hn > wp.float64(0.0):
        for l in range(n):
            V[(w * n + l) * m1 + c1] = V[(w * n + l) * m1 + c1] / hn
    # the previous rotations on the new column, then its own
    for i in range(j):
        a = H[(w * m1 + i) * m + j]
        b = H[(w * m1 + i + 1) * m + j]
        c = cs[w * m + i]
        sg = sn[w * m + i]
        H[(w * m1 + i) * m + j] = c * a + sg * b
        H[(w * m1 + i + 1) * m + j] = -sg * a + c * b
    a = H[(w * m1 + j) * m + j]
    r = wp.sqrt(a * a + hn * hn)
    if r == wp.float64(0.0):
        done[w] = 1  # the operator maps the new direction to 0: stop with the columns before it
        return
    c = a / r
    sg = hn / r
    cs[w * m + j] = c
    sn[w * m + j] = sg
    H[(w * m1 + j) * m + j] = r
    H[(w * m1 + j + 1) * m + j] = wp.float64(0.0)
    gj = g[w * m1 + j]
    g[w * m1 + j] = c * gj
    g[w * m1 + j + 1] = -sg * gj
    kk[w] = c1
    if wp.abs(g[w * m1 + j + 1]) <= wp.float64(tol) * bnorm[w] or hn <= wp.float64(1.0e-14) * bnorm[w]:
        done[w] = 1


@wp.kernel
def krylov_solution(
    n: int,
    m: int,
    add: int,
    H: wp.array[wp.float64],
    g: wp.array[wp.float64],
    kk: wp.array[int],
    Z: wp.array[wp.float64],
    x_out: wp.array[wp.float64],
):
    """w = Z y (``add``: w += Z y, a restart's correction) with R y = g (R the rotated Hessenberg's leading
    k x k triangle; y overwrites g)."""
    w = wp.tid()
    m1 = m + 1
    k = kk[w]
    for ii in range(k):
        i = k - 1 - ii
        s = g[w * m1 + i]
        for l in range(i + 1, k):
            s -= H[(w * m1 + i) * m + l] * g[w * m1 + l]
        g[w * m1 + i] = s / H[(w * m1 + i) * m + i]
    for i in range(n):
        s = wp.float64(0.0)
        for l in range(k):
            s += g[w * m1 + l] * Z[(w * n + i) * m + l]
        if add != 0:
            s += x_out[w * n + i]
        x_out[w * n + i] = s


@wp.kernel
def krylov_check(
    n: int,
    nbw: int,
    nu: int,
    max_rows: int,
    target: float,
    b: wp.array[wp.float64],
    u_grad: wp.array[wp.spatial_vector],
    lam_grad: wp.array[float],
    r_out: wp.array[wp.float64],
    ok: wp.array[int],
    flag: wp.array[wp.int32],
):
    """The true residual r = b - A^T w (A^T w from the sweep seeded with the solution w, in float64; the next
    cycle's right-hand side, a restart from the truth, which the float32 sweeps let drift from GMRES's
    estimate); ok[w] = 1 when world w's relative residual |r| / |b| is at most ``target``, else 0 and flag[0]
    = 1: another restart cycle runs (`wp.capture_if`); flag zeroed before."""
    w = wp.tid()
    num = wp.float64(0.0)
    den = wp.float64(0.0)
    for i in range(n):
        e = b[w * n + i] - wp.float64(s_adjoint(w, i, nbw, nu, max_rows, u_grad, lam_grad))
        r_out[w * n + i] = e
        num += e * e
        den += b[w * n + i] * b[w * n + i]
    if num > wp.float64(target) * wp.float64(target) * den:
        ok[w] = 0
        wp.atomic_max(flag, 0, wp.int32(1))
    else:
        ok[w] = 1


@wp.kernel
def zero_flag(flag: wp.array[wp.int32]):
    flag[0] = wp.int32(0)


@wp.kernel
def copy_int(src: wp.array[int], dst: wp.array[int]):
    i = wp.tid()
    dst[i] = src[i]


@wp.kernel
def flag_active(done: wp.array[int], flag: wp.array[wp.int32]):
    """flag[0] = 1 when a world's GMRES is still running (done[w] = 0); flag zeroed before."""
    w = wp.tid()
    if done[w] == 0:
        wp.atomic_max(flag, 0, wp.int32(1))
