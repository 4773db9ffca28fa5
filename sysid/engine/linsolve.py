"""The per-world linear solve of a converged step, shared by the adjoint (`Simulation.backward`)
and the tangent (`Simulation.jvp`) paths.

At a converged step the residual r(s; xi) = 0 (s = (u+, lam+), xi = (q-, u-, targets, theta);
paper eq. 14-17) defines s(xi). The adjoint solves (dr/ds)^T w = -dL/ds; the tangent solves
(dr/ds) ds = -(dr/dxi) dxi for p directions. Both need the same operator A = dr/ds of one world.

Why the operator is assembled, and why the solve is a dense LU (measured, see
benchmarks/bench_jacobian.py and the engine tests):

* Warp differentiates kernels in reverse mode only. A^T v is one recorded VJP sweep of the
  residual kernels (what the exact adjoint's GMRES used), but A v (the tangent's operator) has no
  matrix-free form short of hand-linearising every residual (FB normals, the friction weight W
  and its slip dependence, geometry at q+), which is exactly what the paper's lagged Schur operator
  gets wrong under sliding (2x-130x, issue 21; the former adjoint="schur", removed).
* So A is assembled row by row: a VJP sweep seeded with e_i in *every world at once* gives row i
  of every world's A (the worlds' residuals share no unknowns), so n sweeps (n = 6 bodies +
  active rows of the fullest world, 18-60 in the CI scenes) cost the same at 1 or 8192 worlds.
  The same sweeps give row i of dr/dxi, contracted on the device with the p tangent directions.
* With A assembled, a per-world direct solve (partial-pivoting LU in float64 after row and column
  equilibration, a thread per world) is exact to rounding in one pass, serves the adjoint
  (transposed) and the tangent (p right-hand sides, one factorisation) alike, and needs no
  iteration cap. Measured against the host GMRES it replaces (all worlds in one Krylov space,
  40-iteration cap): equal gradients to float32 rounding on the 1-world tests, and at 256
  worlds world 0's gradient no longer depends on the other worlds (the GMRES hit its cap at
  relative residuals 4-7e-2 there).

Per-world health is reported: the relative residual of the solve checked against the
matrix-free VJP operator (adjoint), or against the assembled matrix (tangent), and the pivot
ratio (min/max |pivot| of the equilibrated factor; ~0 means a singular step Jacobian).
Rows that are identically zero (inactive contact slots, massless bodies) are replaced by
identity rows, i.e. their unknowns do not change, as in the forward step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import warp as wp

wp.set_module_options({"enable_backward": False})


@wp.kernel
def seed_unit_row(
    i: int,
    nbw: int,
    nu: int,
    max_rows: int,
    r_dyn_grad: wp.array(dtype=wp.spatial_vector),
    r_con_grad: wp.array(dtype=float),
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
def gather_row(
    i: int,
    n: int,
    nbw: int,
    nu: int,
    max_rows: int,
    u_grad: wp.array(dtype=wp.spatial_vector),
    lam_grad: wp.array(dtype=float),
    A: wp.array(dtype=wp.float64),
):
    """Row i of each world's dr/ds from the VJP sweep seeded with e_i."""
    w, j = wp.tid()
    v = float(0.0)
    if j < nu:
        v = u_grad[w * nbw + j / 6][j % 6]
    else:
        v = lam_grad[w * max_rows + j - nu]
    A[(w * n + i) * n + j] = wp.float64(v)


@wp.kernel
def rhs_state_row(
    i: int,
    n: int,
    p: int,
    nbw: int,
    nb: int,
    gq: wp.array(dtype=wp.transform),
    gqd: wp.array(dtype=wp.spatial_vector),
    dq: wp.array(dtype=float),
    dqd: wp.array(dtype=float),
    rhs: wp.array(dtype=wp.float64),
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
    grad: wp.array(dtype=float),
    entry: wp.array(dtype=int),
    world: wp.array(dtype=int),
    seed: wp.array(dtype=float),
    rhs: wp.array(dtype=wp.float64),
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
    A: wp.array(dtype=wp.float64),
    piv: wp.array(dtype=int),
    qiv: wp.array(dtype=int),
    rank: wp.array(dtype=int),
    fixed: wp.array(dtype=int),
    rscale: wp.array(dtype=wp.float64),
    cscale: wp.array(dtype=wp.float64),
    pivot_ratio: wp.array(dtype=wp.float64),
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
def swap_entries(x: wp.array(dtype=wp.float64), i: int, j: int):
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
    A: wp.array(dtype=wp.float64),
    piv: wp.array(dtype=int),
    qiv: wp.array(dtype=int),
    rank: wp.array(dtype=int),
    rscale: wp.array(dtype=wp.float64),
    cscale: wp.array(dtype=wp.float64),
    x: wp.array(dtype=wp.float64),
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
    A0: wp.array(dtype=wp.float64),
    fixed: wp.array(dtype=int),
    x: wp.array(dtype=wp.float64),
    b: wp.array(dtype=wp.float64),
    out: wp.array(dtype=wp.float64),
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
    x: wp.array(dtype=wp.float64),
    r_dyn_grad: wp.array(dtype=wp.spatial_vector),
    r_con_grad: wp.array(dtype=float),
):
    """dL/dr = column c of x (W, n, p): the adjoint w as the seed of the final VJP sweep."""
    w = wp.tid()
    for k in range(nbw):
        v = wp.spatial_vector()
        for m in range(6):
            v[m] = float(x[(w * n + k * 6 + m) * p + c])
        r_dyn_grad[w * nbw + k] = v
    for r in range(max_rows):
        val = float(0.0)
        if nu + r < n:
            val = float(x[(w * n + nu + r) * p + c])
        r_con_grad[w * max_rows + r] = val


@wp.kernel
def scatter_du(
    n: int,
    p: int,
    nbw: int,
    nb: int,
    sign: float,
    x: wp.array(dtype=wp.float64),
    du: wp.array(dtype=float),
):
    """du[c, b, :] = the u+ part of the tangent solution (W, n, p)."""
    b, c = wp.tid()
    w = b / nbw
    k = b - w * nbw
    for m in range(6):
        du[(c * nb + b) * 6 + m] = sign * float(x[(w * n + k * 6 + m) * p + c])


@wp.kernel
def seed_pose_component(m: int, nb: int, q_plus_grad: wp.array(dtype=wp.transform)):
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
    gq: wp.array(dtype=wp.transform),
    gu: wp.array(dtype=wp.spatial_vector),
    dq: wp.array(dtype=float),
    du: wp.array(dtype=float),
    dq_out: wp.array(dtype=float),
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


class StepSystem:
    """Per-world dense step Jacobian A = dr/ds of the converged step, assembled from batched VJP
    sweeps of the recorded residual, its equilibrated LU, and solves with A (tangent, p columns)
    or A^T (adjoint). Device arrays only; the host supplies the sweep count (one small read of
    the contact counts per step)."""

    def __init__(self, device: wp.Device | str, world_count: int, bodies_per_world: int,
                 max_rows: int) -> None:
        self.device = device
        self.W = world_count
        self.nbw = bodies_per_world
        self.nu = 6 * bodies_per_world
        self.max_rows = max_rows
        self.n = 0
        self._cap = 0
        self._pcap = 0
        self.p = 0

    def _alloc(self, n: int, p: int) -> None:
        d, W = self.device, self.W
        if n > self._cap:
            self._cap = n
            self.A = wp.zeros(W * n * n, dtype=wp.float64, device=d)
            self.A0 = wp.zeros(W * n * n, dtype=wp.float64, device=d)
            self.piv = wp.zeros(W * n, dtype=int, device=d)
            self.qiv = wp.zeros(W * n, dtype=int, device=d)
            self.rank = wp.zeros(W, dtype=int, device=d)
            self.fixed = wp.zeros(W * n, dtype=int, device=d)
            self.rscale = wp.zeros(W * n, dtype=wp.float64, device=d)
            self.cscale = wp.zeros(W * n, dtype=wp.float64, device=d)
            self.pivot_ratio = wp.zeros(W, dtype=wp.float64, device=d)
            self.res = wp.zeros(W, dtype=wp.float64, device=d)
            self._pcap = 0
        if p > self._pcap:
            self._pcap = p
            self.rhs = wp.zeros(W * self._cap * p, dtype=wp.float64, device=d)
            self.rhs0 = wp.zeros(W * self._cap * p, dtype=wp.float64, device=d)
        self.n, self.p = n, p
        # views of the leading parts with the current strides (flat arrays: sizes only)
        self.A_v = self.A[: W * n * n]
        self.A0_v = self.A0[: W * n * n]
        self.rhs_v = self.rhs[: W * n * p]
        self.rhs0_v = self.rhs0[: W * n * p]

    def size_for(self, active_rows: int) -> int:
        return self.nu + min(int(active_rows), self.max_rows)

    def assemble(self, n: int, p: int, sweep: Callable[[Callable[[], None]], None], u_grad: wp.array,
                 lam_grad: wp.array, r_dyn_grad: wp.array, r_con_grad: wp.array,
                 rhs_row: Callable[[int], None] | None = None) -> None:
        """n VJP sweeps: ``sweep()`` zeroes the adjoints and runs the residual's reverse launches
        after the seed is written; ``rhs_row(i)`` (optional) contracts row i of dr/dxi with the
        tangent directions into ``rhs`` (W, n, p)."""
        self._alloc(n, max(p, 1))
        d = self.device
        for i in range(n):
            sweep(lambda i=i: wp.launch(seed_unit_row, self.W, inputs=[i, self.nbw, self.nu, self.max_rows],
                                        outputs=[r_dyn_grad, r_con_grad], device=d))
            wp.launch(gather_row, (self.W, n), inputs=[i, n, self.nbw, self.nu, self.max_rows, u_grad, lam_grad],
                      outputs=[self.A_v], device=d)
            if rhs_row is not None:
                rhs_row(i)
        wp.copy(self.A0_v, self.A_v)
        wp.launch(lu_factor, self.W, inputs=[n, self.A_v],
                  outputs=[self.piv, self.qiv, self.rank, self.fixed, self.rscale, self.cscale, self.pivot_ratio],
                  device=d)

    def solve(self, transpose: bool) -> None:
        """Solve in place on ``rhs_v`` (W, n, p); keeps the right-hand side in ``rhs0_v``."""
        wp.copy(self.rhs0_v, self.rhs_v)
        wp.launch(lu_solve, (self.W, self.p),
                  inputs=[self.n, self.p, int(transpose), self.A_v, self.piv, self.qiv, self.rank, self.rscale,
                          self.cscale], outputs=[self.rhs_v], device=self.device)

    def residual(self) -> np.ndarray:
        """Per-world relative residual max_c |A x - b| / |b| of the last non-transposed solve."""
        wp.launch(residual_norms, self.W, inputs=[self.n, self.p, self.A0_v, self.fixed, self.rhs_v, self.rhs0_v],
                  outputs=[self.res], device=self.device)
        return self.res.numpy().copy()
