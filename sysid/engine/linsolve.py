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
  gets wrong under sliding (SolverOptions(adjoint="schur") raises for that reason).
* So A is assembled row by row: a VJP sweep seeded with e_i in *every world at once* gives row i
  of every world's A (the worlds' residuals share no unknowns), so n sweeps (n = 6 bodies +
  active rows of the fullest world, 18-60 in the CI scenes) cost the same at 1 or 8192 worlds.
  The same sweeps give row i of dr/dxi, contracted on the device with the p tangent directions.
* With A assembled, a per-world direct solve (partial-pivoting LU in float64 after row and column
  equilibration, a thread per world) is exact to rounding in one pass, serves the adjoint
  (transposed) and the tangent (p right-hand sides, one factorisation) alike, and needs no
  iteration cap. Unlike a GMRES over all worlds at once (adjoint_solver="gmres"), a world's gradient
  does not depend on the other worlds of the batch.

Per-world health is reported: the relative residual of the solve checked against the
matrix-free VJP operator (adjoint), or against the assembled matrix (tangent), and the pivot
ratio (min/max |pivot| of the equilibrated factor; ~0 means a singular step Jacobian).
Rows that are identically zero (inactive contact slots, massless bodies) are replaced by
identity rows, i.e. their unknowns do not change, as in the forward step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import warp as wp

from . import linsolve_kernels as lk
from .types import LANES, lane_types, make


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
        self.generation = 0

    def reserve(self, n: int, p: int) -> None:
        """Arrays for size n and p right-hand sides, allocated now (not inside a recording)."""
        self._alloc(n, max(p, 1))

    def _alloc(self, n: int, p: int) -> None:
        d, W = self.device, self.W
        if n > self._cap or p > self._pcap:
            self.generation += 1  # arrays reallocated: recordings of the old ones are stale
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
        self.lu = make(lk.LUFactor, n=n, A=self.A_v, piv=self.piv, qiv=self.qiv, rank=self.rank, fixed=self.fixed,
                       rscale=self.rscale, cscale=self.cscale, pivot_ratio=self.pivot_ratio)

    def vector(self, u: wp.array[Any], lam: wp.array[Any]) -> Any:
        """The `StateVector` of per-body twists ``u`` and per-row values ``lam`` (a sweep's seed or its result)."""
        return make(lk.StateVector, nbw=self.nbw, nu=self.nu, max_rows=self.max_rows, u=u, lam=lam)

    def select(self, n: int, p: int = 1) -> None:
        """Point the views (``A_v``, ``rhs_v``, ...) at size n and p right-hand sides (`reserve` them first:
        inside a recording nothing may be allocated)."""
        self._alloc(n, max(p, 1))

    def size_for(self, active_rows: int) -> int:
        return self.nu + min(int(active_rows), self.max_rows)

    def assemble(self, n: int, p: int, sweep: Callable[[Callable[[], None]], None], s_grad: Any, seed: Any,
                 rhs_row: Callable[[int], None] | None = None) -> None:
        """n VJP sweeps: ``sweep()`` zeroes the adjoints and runs the residual's reverse launches
        after the seed is written (`StateVector`s: the sweep's result ``s_grad``, its ``seed``); ``rhs_row(i)``
        (optional) contracts row i of dr/dxi with the tangent directions into ``rhs`` (W, n, p)."""
        self._alloc(n, max(p, 1))
        d = self.device
        for i in range(n):

            def seed_row(i: int = i) -> None:
                wp.launch(lk.seed_unit_row, self.W, inputs=[i], outputs=[seed], device=d)

            sweep(seed_row)
            wp.launch(lk.gather, (self.W, n), inputs=[n, n * n, 1, i * n, s_grad], outputs=[self.A_v], device=d)
            if rhs_row is not None:
                rhs_row(i)
        wp.copy(self.A0_v, self.A_v)
        wp.launch(lk.lu_factor, self.W, inputs=[self.lu], device=d)

    def solve(self, transpose: bool) -> None:
        """Solve in place on ``rhs_v`` (W, n, p); keeps the right-hand side in ``rhs0_v``."""
        wp.copy(self.rhs0_v, self.rhs_v)
        wp.launch(lk.lu_solve, (self.W, self.p), inputs=[self.p, int(transpose), self.lu], outputs=[self.rhs_v],
                  device=self.device)

    def residual_launch(self) -> None:
        """Per-world relative residual max_c |A x - b| / |b| of the last non-transposed solve into ``res``
        (W,), on the device."""
        wp.launch(lk.residual_norms, self.W, inputs=[self.p, self.lu, self.A0_v, self.rhs_v, self.rhs0_v],
                  outputs=[self.res], device=self.device)

    def residual(self) -> np.ndarray:
        """`residual_launch`, read back."""
        self.residual_launch()
        out: np.ndarray = self.res.numpy().copy()
        return out


class Krylov:
    """Device work arrays of the Krylov adjoint (SolverOptions.adjoint_solver="krylov"): per world a
    right-preconditioned GMRES of at most m iterations on A^T w = b, A^T v one VJP sweep of the recorded
    residual, the preconditioner the forward's Schur elimination at the converged iterate (eq. 18-19; its
    Schur matrix Cholesky-factored once per step, `adjoint.precond_factor`). Sized for the largest system
    (n_max = 6 bodies + max_rows per world), so a recording made at one system size stays valid at another;
    the layouts are `linsolve_kernels.KrylovBasis`'s (`basis`)."""

    def __init__(self, device: wp.Device | str, world_count: int, n_max: int, m: int, cycles: int, max_rows: int,
                 dm: int, width: int = LANES) -> None:
        W = world_count
        self.m, self.cycles, self.n_max, self.dm, self.width = m, cycles, n_max, dm, width

        def f64(size: int) -> wp.array[Any]:
            return wp.zeros(max(1, size), dtype=wp.float64, device=device)

        self.V = f64(W * n_max * (m + 1))
        self.Z = f64(W * n_max * m)
        self.H = f64(W * (m + 1) * m)
        self.cs = f64(W * m)
        self.sn = f64(W * m)
        self.g = f64(W * (m + 1))
        self.bnorm = f64(W)
        self.r = f64(W * n_max)  # a restart's right-hand side, the true residual (W, n)
        self.flag = wp.zeros(1, dtype=wp.int32, device=device)  # 1: a world needs another cycle
        self.ok = wp.zeros(W, dtype=int, device=device)  # the world's last check passed
        self.done = wp.zeros(W, dtype=int, device=device)
        self.k = wp.zeros(W, dtype=int, device=device)
        self.no_fixed = wp.zeros(W * n_max, dtype=int, device=device)  # adjoint_check: every row counts
        self.basis = make(lk.KrylovBasis, m=m, V=self.V, Z=self.Z, H=self.H, cs=self.cs, sn=self.sn, g=self.g,
                          done=self.done, k=self.k, bnorm=self.bnorm)
        # the preconditioner's per-world row count, dense flag, Cholesky factors and triangular-solve vector
        self.nrows = wp.zeros(W, dtype=int, device=device)
        self.direct = wp.zeros(W, dtype=int, device=device)
        # the factors, for whole groups of `width` worlds (the lane width of the preconditioner's kernels): a
        # group's region, seen as width-wide vectors (S_lanes, a view of S's memory that S keeps alive), holds its
        # lanes' factor when precond_factor keeps one
        groups = -(-W // width)
        self.S = f64(groups * width * dm * dm)
        self.S_lanes: wp.array[Any] = wp.array(ptr=self.S.ptr, dtype=lane_types(width).laned,
                                                 shape=(max(1, groups * dm * dm),), device=device)
        self.y64 = f64(W * max_rows)
        self.perm = wp.zeros(max(1, W * max_rows), dtype=int, device=device)
        self.env = wp.zeros(max(1, W * max_rows), dtype=int, device=device)
