"""Kernels of the per-world linear solve of a converged step (`linsolve.StepSystem`, which says why the
step Jacobian is assembled and solved by a dense LU): seeding and gathering the VJP sweeps, the
tangent's right-hand sides, the equilibrated LU factor and solve, the residual check, and the Krylov adjoint's
per-world GMRES (`linsolve.Krylov`). Warp kernel
code only (pyproject's mypy section says why these modules are not type-checked by mypy).

Groups of their own (docs/architecture.md, "Kernel convention"): a vector over the step's unknowns as the
residual's arrays hold it (`StateVector`), a world's LU factor (`LUFactor`, `linsolve.StepSystem`'s) and the
Krylov adjoint's GMRES work (`KrylovBasis`, `linsolve.Krylov`'s); the step's groups (types.py) are not theirs."""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})


@wp.struct
class StateVector:
    """A vector over each world's step unknowns s = (u+, lam+), n = nu + rows entries, in the residual's arrays:
    world w's entry i < nu is component i % 6 of body w nbw + i / 6 in u, entry nu + r its row w max_rows + r in
    lam. A VJP sweep's seed dL/dr (r_dyn, r_con) and its result, the s-adjoint (u+, lam+ gradients); the
    preconditioner's input and output."""

    nbw: int  # bodies per world
    nu: int  # 6 nbw
    max_rows: int  # row slots per world
    u: wp.array[wp.spatial_vector]  # (nb,)
    lam: wp.array[float]  # (nw * max_rows,)


@wp.struct
class LUFactor:
    """Each world's equilibrated LU of its n x n step Jacobian (`lu_factor`; `linsolve.StepSystem`'s arrays),
    world-major: P (D A S) Q = L U."""

    n: int
    A: wp.array[wp.float64]  # (W, n, n) the matrix, factored in place: L (unit, below) and U
    piv: wp.array[int]  # (W, n) P's row swaps, in order
    qiv: wp.array[int]  # (W, n) Q's column swaps
    rank: wp.array[int]  # (W,) the numerical rank
    fixed: wp.array[int]  # (W, n) 1: a zero row, replaced by e_i
    rscale: wp.array[wp.float64]  # (W, n) D
    cscale: wp.array[wp.float64]  # (W, n) S
    pivot_ratio: wp.array[wp.float64]  # (W,) min / max |pivot|


@wp.struct
class KrylovBasis:
    """Each world's restarted GMRES of the Krylov adjoint (`linsolve.Krylov`'s arrays), float64, world-major, for
    systems of n entries: V (W, n, m+1) the Arnoldi basis, Z (W, n, m) the preconditioned directions (a column is
    a `write_seed_from` seed with p = m), H (W, m+1, m) the Hessenberg matrix rotated to upper triangular, cs / sn
    (W, m) its Givens rotations, g (W, m+1) the rotated right-hand side (|g[k]| is the residual norm after k
    iterations)."""

    m: int  # iterations per cycle
    V: wp.array[wp.float64]
    Z: wp.array[wp.float64]
    H: wp.array[wp.float64]
    cs: wp.array[wp.float64]
    sn: wp.array[wp.float64]
    g: wp.array[wp.float64]
    done: wp.array[int]  # (W,) 1: the world's cycle is finished
    k: wp.array[int]  # (W,) its iterations so far
    bnorm: wp.array[wp.float64]  # (W,) |b|


@wp.struct
class BodyGrad:
    """A sweep's gradient with respect to the bodies' poses and twists (a state's, or q- and u+)."""

    q: wp.array[wp.transform]  # (nb,)
    u: wp.array[wp.spatial_vector]  # (nb,)


@wp.struct
class BodyTangent:
    """p directions' tangent of the bodies' poses and twists (a state's, or q- and u+), direction c's body b at
    q[(c nb + b) 7 + m] (a transform's component m) and u[(c nb + b) 6 + m]."""

    nb: int  # bodies
    q: wp.array[float]  # (p, nb, 7)
    u: wp.array[float]  # (p, nb, 6)


@wp.struct
class EntrySeeds:
    """The p directions of one input array's seeded entries (`tangent.TangentEntry`'s arrays)."""

    count: int  # entries
    grad: wp.array[float]  # the input array's gradient after a sweep (indexed by entry)
    entry: wp.array[int]  # (count,) the entries
    world: wp.array[int]  # (count,) each entry's world
    seed: wp.array[float]  # (p, count) the directions


@wp.func
def s_adjoint(w: int, i: int, v: StateVector):
    """Entry i of world w's vector (after a VJP sweep, the s-adjoint's: (A^T seed)_i)."""
    e = float(0.0)
    if i < v.nu:
        e = v.u[w * v.nbw + i / 6][i % 6]
    else:
        e = v.lam[w * v.max_rows + i - v.nu]
    return e


@wp.kernel
def seed_unit_row(
    i: int,
    # Data out:
    seed: StateVector,
):
    """Seed dL/dr = e_i (local unknown index i) in every world."""
    w = wp.tid()
    if i < seed.nu:
        v = wp.spatial_vector()
        v[i % 6] = 1.0
        seed.u[w * seed.nbw + i / 6] = v
    else:
        seed.lam[w * seed.max_rows + i - seed.nu] = 1.0


@wp.kernel
def gather(
    n: int,
    world_stride: int,
    entry_stride: int,
    offset: int,
    v: StateVector,
    # Data out:
    out: wp.array[wp.float64],
):
    """Each world's vector v (its n entries) into out[w world_stride + i entry_stride + offset], dim (W, n):
    row i of the assembled dr/ds from the sweep seeded with e_i (world_stride n^2, entry_stride 1, offset i n),
    or column j of the Krylov's Z from the preconditioner's output (n m, m, j)."""
    w, i = wp.tid()
    out[w * world_stride + i * entry_stride + offset] = wp.float64(s_adjoint(w, i, v))


@wp.kernel
def rhs_state_row(
    i: int,
    n: int,
    p: int,
    nbw: int,
    g: BodyGrad,
    d: BodyTangent,
    # Data out:
    rhs: wp.array[wp.float64],
):
    """rhs[w, i, c] = (dr_i/d body_q) dq_c + (dr_i/d body_qd) dqd_c over world w's bodies (overwrites): row i's
    gradient g with respect to the state, the state's tangent d."""
    w, c = wp.tid()
    nb = d.nb
    s = wp.float64(0.0)
    for k in range(nbw):
        b = w * nbw + k
        t = g.q[b]
        for m in range(7):
            s += wp.float64(t[m]) * wp.float64(d.q[(c * nb + b) * 7 + m])
        v = g.u[b]
        for m in range(6):
            s += wp.float64(v[m]) * wp.float64(d.u[(c * nb + b) * 6 + m])
    rhs[(w * n + i) * p + c] = s


@wp.kernel
def rhs_entries_row(
    i: int,
    n: int,
    p: int,
    e: EntrySeeds,
    # Data out:
    rhs: wp.array[wp.float64],
):
    """rhs[w, i, c] += (dr_i/d x_e) dx_e,c for the seeded entries e of one input array x."""
    k, c = wp.tid()
    g = e.grad[e.entry[k]]
    sd = e.seed[c * e.count + k]
    if g != 0.0 and sd != 0.0:
        wp.atomic_add(rhs, (e.world[k] * n + i) * p + c, wp.float64(g) * wp.float64(sd))


RANK_TOL = wp.constant(wp.float64(1.0e-7))  # see lu_factor


@wp.kernel
def lu_factor(
    # Data in/out (lu.A in: the matrices, out: the factors):
    lu: LUFactor,
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
    n = lu.n
    base = w * n * n
    zero = wp.float64(0.0)
    one = wp.float64(1.0)
    for r in range(n):
        mx = zero
        for c in range(n):
            mx = wp.max(mx, wp.abs(lu.A[base + r * n + c]))
        lu.fixed[w * n + r] = 0
        if mx == zero:
            lu.A[base + r * n + r] = one
            mx = one
            lu.fixed[w * n + r] = 1
        lu.rscale[w * n + r] = one / mx
        for c in range(n):
            lu.A[base + r * n + c] = lu.A[base + r * n + c] / mx
    for c in range(n):
        mx = zero
        for r in range(n):
            mx = wp.max(mx, wp.abs(lu.A[base + r * n + c]))
        if mx == zero:
            mx = one
        lu.cscale[w * n + c] = one / mx
        for r in range(n):
            lu.A[base + r * n + c] = lu.A[base + r * n + c] / mx
    first = zero
    pmin = wp.float64(1.0e300)
    rk = n
    for k in range(n):
        pr = k
        pc = k
        mx = zero
        for r in range(k, n):
            for c in range(k, n):
                a = wp.abs(lu.A[base + r * n + c])
                if a > mx:
                    mx = a
                    pr = r
                    pc = c
        if k == 0:
            first = mx
        lu.piv[w * n + k] = pr
        lu.qiv[w * n + k] = pc
        if mx <= RANK_TOL * first or mx == zero:
            rk = k
            for kk in range(k, n):
                lu.piv[w * n + kk] = kk
                lu.qiv[w * n + kk] = kk
            break
        if pr != k:
            for c in range(n):
                t = lu.A[base + k * n + c]
                lu.A[base + k * n + c] = lu.A[base + pr * n + c]
                lu.A[base + pr * n + c] = t
        if pc != k:
            for r in range(n):
                t = lu.A[base + r * n + k]
                lu.A[base + r * n + k] = lu.A[base + r * n + pc]
                lu.A[base + r * n + pc] = t
        d = lu.A[base + k * n + k]
        pmin = wp.min(pmin, wp.abs(d))
        for r in range(k + 1, n):
            f = lu.A[base + r * n + k] / d
            lu.A[base + r * n + k] = f
            if f != zero:
                for c in range(k + 1, n):
                    lu.A[base + r * n + c] = lu.A[base + r * n + c] - f * lu.A[base + k * n + c]
    lu.rank[w] = rk
    lu.pivot_ratio[w] = pmin / wp.max(first, wp.float64(1.0e-300))


@wp.func
def scale_entries(x: wp.array[wp.float64], o: int, n: int, p: int, c: int, scale: wp.array[wp.float64]):
    """x[o + r, c] *= scale[o + r] for r < n (x of p columns)."""
    for r in range(n):
        x[(o + r) * p + c] = x[(o + r) * p + c] * scale[o + r]
    return 0


@wp.func
def swap_entries(x: wp.array[wp.float64], o: int, n: int, p: int, c: int, swaps: wp.array[int], backward: int):
    """The row swaps k <-> swaps[o + k] of x's column c (x of p columns), k = 0..n-1, or from n-1 down
    (``backward``: the inverse permutation)."""
    for kk in range(n):
        k = kk
        if backward != 0:
            k = n - 1 - kk
        i = (o + k) * p + c
        j = (o + swaps[o + k]) * p + c
        if i != j:
            t = x[i]
            x[i] = x[j]
            x[j] = t
    return 0


@wp.kernel
def lu_solve(
    p: int,
    transpose: int,
    lu: LUFactor,
    # Data in/out (b in, the solution out):
    x: wp.array[wp.float64],
):
    """Solve A x = b (transpose 0) or A^T x = b (1) in place for column c of x (W, n, p), with
    the factor of lu_factor; unknowns beyond the numerical rank are set to zero."""
    w, c = wp.tid()
    n = lu.n
    base = w * n * n
    o = w * n
    rk = lu.rank[w]
    zero = wp.float64(0.0)
    if transpose == 0:
        # L U v = P D b, y = Q v, x = S y
        scale_entries(x, o, n, p, c, lu.rscale)
        swap_entries(x, o, n, p, c, lu.piv, 0)
        for r in range(n):
            s = x[(o + r) * p + c]
            for k in range(wp.min(r, rk)):
                s -= lu.A[base + r * n + k] * x[(o + k) * p + c]
            x[(o + r) * p + c] = s
        for rr in range(n):
            r = n - 1 - rr
            s = zero
            if r < rk:
                s = x[(o + r) * p + c]
                for k in range(r + 1, rk):
                    s -= lu.A[base + r * n + k] * x[(o + k) * p + c]
                s = s / lu.A[base + r * n + r]
            x[(o + r) * p + c] = s
        swap_entries(x, o, n, p, c, lu.qiv, 1)
        scale_entries(x, o, n, p, c, lu.cscale)
    else:
        # (DAS)^T = Q U^T L^T P: U^T t = Q^T S b, L^T g = t, y = P^T g, x = D y
        scale_entries(x, o, n, p, c, lu.cscale)
        swap_entries(x, o, n, p, c, lu.qiv, 0)
        for r in range(n):
            s = zero
            if r < rk:
                s = x[(o + r) * p + c]
                for k in range(r):
                    s -= lu.A[base + k * n + r] * x[(o + k) * p + c]
                s = s / lu.A[base + r * n + r]
            x[(o + r) * p + c] = s
        for rr in range(n):
            r = n - 1 - rr
            s = x[(o + r) * p + c]
            for k in range(r + 1, rk):
                s -= lu.A[base + k * n + r] * x[(o + k) * p + c]
            x[(o + r) * p + c] = s
        swap_entries(x, o, n, p, c, lu.piv, 1)
        scale_entries(x, o, n, p, c, lu.rscale)


@wp.kernel
def residual_norms(
    p: int,
    lu: LUFactor,
    A0: wp.array[wp.float64],
    x: wp.array[wp.float64],
    b: wp.array[wp.float64],
    # Data out:
    out: wp.array[wp.float64],
):
    """out[w] = max over columns of |A0 x - b| / |b| (the rows lu_factor did not fix), in the assembled matrix."""
    w = wp.tid()
    n = lu.n
    fixed = lu.fixed
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
    x: wp.array[wp.float64],
    skip: wp.array[int],
    # Data out:
    seed: StateVector,
):
    """seed = column c of x (W, n, p): the adjoint w as the seed dL/dr of the final VJP sweep; worlds with
    skip[w] != 0 left as they are (the Krylov adjoint's worlds already solved). Only the system's n - nu
    constraint rows are written: every world's rows in use are among them, and a sweep's row adjoints past
    them are zero (`Simulation._sweep` zeroes them first); the preconditioner's y_lam, also written here, is
    read on a world's own rows only."""
    w = wp.tid()
    if skip[w] != 0:
        return
    for k in range(seed.nbw):
        v = wp.spatial_vector()
        for m in range(6):
            v[m] = float(x[(w * n + k * 6 + m) * p + c])
        seed.u[w * seed.nbw + k] = v
    for r in range(wp.min(seed.max_rows, n - seed.nu)):
        seed.lam[w * seed.max_rows + r] = float(x[(w * n + seed.nu + r) * p + c])


@wp.kernel
def scatter_du(
    n: int,
    p: int,
    nbw: int,
    sign: float,
    x: wp.array[wp.float64],
    # Data out (d.u):
    d: BodyTangent,
):
    """d.u[c, b, :] = sign x the u+ part of the tangent solution x (W, n, p)."""
    b, c = wp.tid()
    w = b / nbw
    k = b - w * nbw
    for m in range(6):
        d.u[(c * d.nb + b) * 6 + m] = sign * float(x[(w * n + k * 6 + m) * p + c])


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
    g: BodyGrad,
    d: BodyTangent,
    # Data out:
    dq_out: wp.array[float],
):
    """Component m of d body_q+ = (d q+_m / d body_q) dq + (d q+_m / d u+) du (the kinematic map, eq. 1): its
    gradient g with respect to q- and u+, their tangent d."""
    b, c = wp.tid()
    nb = d.nb
    t = g.q[b]
    gb = g.u[b]
    s = float(0.0)
    for k in range(7):
        s += t[k] * d.q[(c * nb + b) * 7 + k]
    for k in range(6):
        s += gb[k] * d.u[(c * nb + b) * 6 + k]
    dq_out[(c * nb + b) * 7 + m] = s



# ---- the adjoint's per-step bookkeeping on the device (Simulation._backward_step_on_device): what the host
# did with numpy between the solves, in the same float32 / float64 arithmetic, so gradients stay bit-identical


@wp.kernel
def adjoint_rhs(
    n: int,
    gu: wp.array[wp.spatial_vector],
    s_grad: StateVector,
    # Data out:
    rhs_out: wp.array[wp.float64],
):
    """b = -(dL/du+ + h G^T dL/dq+) in each world's first nu entries, 0 in its rows (eq. 16, 18); dim (W, n).
    dL/du+ carried from the next step (gu) and the loss's own plus h G^T dL/dq+ (the u part of s_grad)."""
    w, i = wp.tid()
    val = wp.float64(0.0)
    if i < s_grad.nu:
        b = w * s_grad.nbw + i / 6
        g = gu[b] + s_grad.u[b]
        val = -wp.float64(g[i % 6])
    rhs_out[w * n + i] = val


@wp.kernel
def adjoint_check(
    step_in: wp.array[int],
    n: int,
    s_grad: StateVector,
    fixed: wp.array[int],
    b: wp.array[wp.float64],
    # Data out:
    res_out: wp.array2d[wp.float64],
):
    """Relative residual |A^T w - b| / |b| of a world's solve, A^T w from the final VJP sweep (the
    matrix-free operator, s_grad), fixed (identity) rows left out; into row ``step`` of res_out (T, W)."""
    w = wp.tid()
    num = wp.float64(0.0)
    den = wp.float64(0.0)
    for i in range(n):
        bi = b[w * n + i]
        den += bi * bi
        if fixed[w * n + i] == 0:
            e = wp.float64(s_adjoint(w, i, s_grad)) - bi
            num += e * e
    if den <= wp.float64(0.0):
        den = wp.float64(1.0)
    res_out[step_in[0], w] = wp.sqrt(num) / wp.sqrt(den)


@wp.kernel
def adjoint_carry(
    step_in: wp.array[int],
    gq_direct: wp.array[wp.transform],
    g: BodyGrad,
    gQ: wp.array2d[wp.transform],
    gQD: wp.array2d[wp.spatial_vector],
    # Data out:
    g_out: BodyGrad,
):
    """dL/dq-, dL/du- of the step (eq. 17: the direct q- path gq_direct and the sweep's g) plus the loss's own dL/dq,
    dL/du at the step's start state (row step of gQ, gQD)."""
    b = wp.tid()
    t = step_in[0]
    g_out.q[b] = (gq_direct[b] + g.q[b]) + gQ[t, b]
    g_out.u[b] = g.u[b] + gQD[t, b]


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
# preconditioned GMRES on A^T w = b, a thread per world, its work in `KrylovBasis`


@wp.kernel
def krylov_init(
    n: int,
    restart: int,
    b: wp.array[wp.float64],
    ok: wp.array[int],
    # Data out (V, g, done, k, bnorm):
    kb: KrylovBasis,
):
    """x0 = 0: v_0 = b / |b|, g = |b| e_0; a world with b = 0 is done (w = 0). A restart (``restart``) leaves
    the worlds the last check passed (``ok``) done: their solution stays as it is, so a world's result does
    not depend on whether other worlds needed the cycle."""
    w = wp.tid()
    m1 = kb.m + 1
    s = wp.float64(0.0)
    for i in range(n):
        s += b[w * n + i] * b[w * n + i]
    beta = wp.sqrt(s)
    kb.bnorm[w] = beta
    kb.k[w] = 0
    for j in range(m1):
        kb.g[w * m1 + j] = wp.float64(0.0)
    kb.g[w * m1] = beta
    inv = wp.float64(0.0)
    if beta > wp.float64(0.0) and (restart == 0 or ok[w] == 0):
        inv = wp.float64(1.0) / beta
        kb.done[w] = 0
    else:
        kb.done[w] = 1
    for i in range(n):
        kb.V[(w * n + i) * m1] = b[w * n + i] * inv


@wp.kernel
def krylov_arnoldi(
    j: int,
    n: int,
    tol: float,
    az: StateVector,
    # Data in/out (V, H, cs, sn, g, done, k; bnorm in):
    kb: KrylovBasis,
):
    """Iteration j of a world's GMRES with az = A^T z_j from the sweep seeded with column j of Z (the sweep's
    s-adjoint): modified Gram-Schmidt twice against v_0..v_j (the float32 sweep's products lose
    orthogonality fast), the Hessenberg column rotated, the residual norm |g[j+1]|; the world is done when
    it falls to tol |b| (or the basis breaks down: the solution is in the space)."""
    w = wp.tid()
    if kb.done[w] != 0:
        return
    m = kb.m
    m1 = m + 1
    c1 = j + 1
    V = kb.V
    H = kb.H
    for i in range(n):
        V[(w * n + i) * m1 + c1] = wp.float64(s_adjoint(w, i, az))
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
        c = kb.cs[w * m + i]
        sg = kb.sn[w * m + i]
        H[(w * m1 + i) * m + j] = c * a + sg * b
        H[(w * m1 + i + 1) * m + j] = -sg * a + c * b
    a = H[(w * m1 + j) * m + j]
    r = wp.sqrt(a * a + hn * hn)
    if r == wp.float64(0.0):
        kb.done[w] = 1  # the operator maps the new direction to 0: stop with the columns before it
        return
    c = a / r
    sg = hn / r
    kb.cs[w * m + j] = c
    kb.sn[w * m + j] = sg
    H[(w * m1 + j) * m + j] = r
    H[(w * m1 + j + 1) * m + j] = wp.float64(0.0)
    gj = kb.g[w * m1 + j]
    kb.g[w * m1 + j] = c * gj
    kb.g[w * m1 + j + 1] = -sg * gj
    kb.k[w] = c1
    if wp.abs(kb.g[w * m1 + j + 1]) <= wp.float64(tol) * kb.bnorm[w] or hn <= wp.float64(1.0e-14) * kb.bnorm[w]:
        kb.done[w] = 1


@wp.kernel
def krylov_solution(
    n: int,
    add: int,
    # Data in (H, k, Z; g in/out: overwritten by y):
    kb: KrylovBasis,
    # Data out:
    x_out: wp.array[wp.float64],
):
    """w = Z y (``add``: w += Z y, a restart's correction) with R y = g (R the rotated Hessenberg's leading
    k x k triangle; y overwrites g)."""
    w = wp.tid()
    m = kb.m
    m1 = m + 1
    k = kb.k[w]
    g = kb.g
    for ii in range(k):
        i = k - 1 - ii
        s = g[w * m1 + i]
        for l in range(i + 1, k):
            s -= kb.H[(w * m1 + i) * m + l] * g[w * m1 + l]
        g[w * m1 + i] = s / kb.H[(w * m1 + i) * m + i]
    for i in range(n):
        s = wp.float64(0.0)
        for l in range(k):
            s += g[w * m1 + l] * kb.Z[(w * n + i) * m + l]
        if add != 0:
            s += x_out[w * n + i]
        x_out[w * n + i] = s


@wp.kernel
def krylov_check(
    n: int,
    target: float,
    b: wp.array[wp.float64],
    aw: StateVector,
    # Data out:
    r_out: wp.array[wp.float64],
    ok_out: wp.array[int],
    flag_out: wp.array[wp.int32],
):
    """The true residual r = b - A^T w (aw = A^T w from the sweep seeded with the solution w, in float64; the next
    cycle's right-hand side, a restart from the truth, which the float32 sweeps let drift from GMRES's
    estimate); ok[w] = 1 when world w's relative residual |r| / |b| is at most ``target``, else 0 and flag[0]
    = 1: another restart cycle runs (`wp.capture_if`); flag zeroed before."""
    w = wp.tid()
    num = wp.float64(0.0)
    den = wp.float64(0.0)
    for i in range(n):
        e = b[w * n + i] - wp.float64(s_adjoint(w, i, aw))
        r_out[w * n + i] = e
        num += e * e
        den += b[w * n + i] * b[w * n + i]
    if num > wp.float64(target) * wp.float64(target) * den:
        ok_out[w] = 0
        wp.atomic_max(flag_out, 0, wp.int32(1))
    else:
        ok_out[w] = 1


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
