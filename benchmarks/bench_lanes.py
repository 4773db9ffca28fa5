"""Benchmark: worlds in vector lanes on Warp's CPU backend.

The engine runs one thread per world, and each thread's Newton step is scalar code: at 1024 worlds its
cost per world-step is the same as at 64 (compute-bound). This script measures what carrying
L worlds per thread, one per lane of a Warp vector (``wp.types.vector(L)``), gives on the two kinds
of work the Newton step is made of, at the robot's size (36 constraint rows, 4 bodies):

1. the dense solver's float64 Cholesky factor of the 36 x 36 Schur matrix (the engine factors only
   its envelope; the full factor is timed here), and
2. the PCR's matrix-free Schur operator A v = J M~^-1 J^T v + C v in float32 (a scatter of J^T v to
   the bodies, their inverse mass, a gather J y per row), applied 16 times as in one PCR solve.

Every lane runs the same operations in the same order as the one-world thread, so the results must
be equal bit for bit for every L (checked and printed). The worlds' row structure (which body each
row acts on) is shared across lanes, as it is for one robot's worlds with the same contacts.

    python benchmarks/bench_lanes.py                 # 1024 worlds, L = 1, 2, 4, 8, 16
    python benchmarks/bench_lanes.py --worlds 256 --lanes 1 4

Timings are wall clock (the fastest of --repeat launches); nothing is asserted.
"""

# no `from __future__ import annotations`: the kernels' annotations name the lane type V of their closure
import argparse
import time

import numpy as np
import warp as wp

N_ROWS = 36  # the Helhest's Schur rows: 3 wheel joints x 5-6 rows + 3 wheel contacts x 3
N_BODY = 4  # chassis + 3 wheels
APPLIES = 16  # SolverOptions.pcr_iters: operator applications per PCR solve


def cholesky_kernel(lanes: int):
    """The left-looking Cholesky of one n x n float64 matrix per lane, in place (lower triangle)."""
    V = wp.types.vector(length=lanes, dtype=wp.float64)

    def chol(S: wp.array(dtype=V), n: int):
        g = wp.tid()
        b = g * n * n
        for p in range(n):
            for q in range(p):
                s = S[b + p * n + q]
                for k in range(q):
                    s -= wp.cw_mul(S[b + p * n + k], S[b + q * n + k])
                S[b + p * n + q] = wp.cw_div(s, S[b + q * n + q])
            d = S[b + p * n + p]
            for k in range(p):
                lk = S[b + p * n + k]
                d -= wp.cw_mul(lk, lk)
            for j in range(lanes):
                d[j] = wp.sqrt(d[j])
            S[b + p * n + p] = d

    return wp.kernel(chol, module="unique"), V


def operator_kernel(lanes: int):
    """APPLIES applications of A v = J M~^-1 J^T v + C v per lane (v <- 0.05 A v between them)."""
    V = wp.types.vector(length=lanes, dtype=wp.float32)

    def apply(
        J: wp.array(dtype=V),  # (groups, rows, 2 sides, 6) flattened
        a: wp.array(dtype=int),  # (rows, 2): each side's body, shared by the lanes
        inv_m: wp.array(dtype=V),  # (groups, bodies)
        inv_I: wp.array(dtype=V),  # (groups, bodies, 9)
        C: wp.array(dtype=V),  # (groups, rows)
        v: wp.array(dtype=V),  # (groups, rows), in/out
        tmp: wp.array(dtype=V),  # (groups, bodies, 6) scratch
        n: int,
        nb: int,
        applies: int,
    ):
        g = wp.tid()
        rb = g * n
        bb = g * nb
        for _it in range(applies):
            for i in range(nb * 6):
                tmp[bb * 6 + i] = V()
            for r in range(n):  # J^T v, scattered to the bodies
                vr = v[rb + r]
                for side in range(2):
                    body = a[r * 2 + side]
                    for c in range(6):
                        t = (bb + body) * 6 + c
                        tmp[t] = tmp[t] + wp.cw_mul(vr, J[((rb + r) * 2 + side) * 6 + c])
            for i in range(nb):  # M~^-1: linear part by 1 / m, angular by I^-1
                t = (bb + i) * 6
                m = inv_m[bb + i]
                for c in range(3):
                    tmp[t + c] = wp.cw_mul(m, tmp[t + c])
                w0 = tmp[t + 3]
                w1 = tmp[t + 4]
                w2 = tmp[t + 5]
                ib = (bb + i) * 9
                for c in range(3):
                    tmp[t + 3 + c] = (wp.cw_mul(inv_I[ib + 3 * c], w0) + wp.cw_mul(inv_I[ib + 3 * c + 1], w1)
                                      + wp.cw_mul(inv_I[ib + 3 * c + 2], w2))
            for r in range(n):  # J y + C v, gathered per row
                s = wp.cw_mul(C[rb + r], v[rb + r])
                for side in range(2):
                    body = a[r * 2 + side]
                    for c in range(6):
                        s = s + wp.cw_mul(J[((rb + r) * 2 + side) * 6 + c], tmp[(bb + body) * 6 + c])
                v[rb + r] = 0.05 * s

    return wp.kernel(apply, module="unique"), V


def to_lanes(x: np.ndarray, lanes: int) -> np.ndarray:
    """(worlds, *shape) -> (worlds / lanes * prod(shape), lanes): world w in lane w % lanes."""
    w = x.shape[0]
    y = x.reshape(w // lanes, lanes, -1).transpose(0, 2, 1)
    return np.ascontiguousarray(y.reshape(-1, lanes))


def from_lanes(y: np.ndarray, worlds: int, lanes: int) -> np.ndarray:
    return y.reshape(worlds // lanes, -1, lanes).transpose(0, 2, 1).reshape(worlds, -1)


def timed(kernel, dim: int, inputs: list, fresh: int, repeat: int) -> tuple[float, np.ndarray]:
    """Fastest of ``repeat`` launches, input ``fresh`` restored before each; returns (s, its output)."""
    best = np.inf
    out = None
    for _ in range(repeat):
        args = list(inputs)
        args[fresh] = wp.clone(inputs[fresh])
        wp.synchronize()
        t0 = time.perf_counter()
        wp.launch(kernel, dim=dim, inputs=args, device="cpu")
        wp.synchronize()
        best = min(best, time.perf_counter() - t0)
        out = args[fresh].numpy()
    return best, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, default=1024)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    if any(L < 1 or args.worlds % L for L in args.lanes):
        raise SystemExit(f"every --lanes must be >= 1 and divide --worlds ({args.worlds})")
    wp.init()
    rng = np.random.default_rng(0)
    W, n, nb = args.worlds, N_ROWS, N_BODY
    M = rng.standard_normal((W, n, n))
    A = M @ M.transpose(0, 2, 1) + n * np.eye(n)
    # the robot's row structure: each wheel's 5 joint rows (chassis, wheel) and 3 contact rows (wheel, ground)
    sides = []
    for wheel in range(1, nb):
        sides += [(0, wheel)] * 5 + [(wheel, -1)] * 3
    sides += [(0, 1)] * (n - len(sides))
    a_rows = np.array([[s0, s1 if s1 >= 0 else s0] for s0, s1 in sides], dtype=np.int32)
    J = rng.uniform(-1.0, 1.0, (W, n, 2, 6)).astype(np.float32)
    J[:, [i for i, (_, s1) in enumerate(sides) if s1 < 0], 1, :] = 0.0  # ground side: no body
    inv_m = rng.uniform(0.01, 1.0, (W, nb)).astype(np.float32)
    R = rng.standard_normal((W, nb, 3, 3))
    inv_I = (0.1 * (R @ R.transpose(0, 1, 3, 2)) + 0.05 * np.eye(3)).astype(np.float32)
    C = rng.uniform(0.0, 1e-3, (W, n)).astype(np.float32)
    v0 = rng.standard_normal((W, n)).astype(np.float32)

    table = []  # printed at the end: kernel loads print between the measurements
    ref_L = ref_v = None
    base = None
    for L in args.lanes:
        ck, CV = cholesky_kernel(L)
        S = wp.array(to_lanes(A, L), dtype=CV, device="cpu")
        t_c, out_c = timed(ck, W // L, [S, n], 0, args.repeat)
        Lf = np.tril(from_lanes(out_c, W, L).reshape(W, n, n))
        ok_k, OV = operator_kernel(L)
        ins = [wp.array(to_lanes(J, L), dtype=OV, device="cpu"), wp.array(a_rows.reshape(-1), dtype=int, device="cpu"),
               wp.array(to_lanes(inv_m, L), dtype=OV, device="cpu"),
               wp.array(to_lanes(inv_I, L), dtype=OV, device="cpu"),
               wp.array(to_lanes(C, L), dtype=OV, device="cpu"), wp.array(to_lanes(v0, L), dtype=OV, device="cpu"),
               wp.zeros(W // L * nb * 6, dtype=OV, device="cpu"), n, nb, APPLIES]
        t_o, out_o = timed(ok_k, W // L, ins, 5, args.repeat)
        vf = from_lanes(out_o, W, L)
        if ref_L is None:
            ref_L, ref_v, base = Lf, vf, (t_c, t_o)
            err = np.abs(Lf[0] - np.linalg.cholesky(A[0])).max()
            if not err < 1e-10:
                raise SystemExit(f"the one-lane factor is not numpy's Cholesky (max difference {err:.1e})")
        same_c = "yes" if np.array_equal(Lf, ref_L) else f"no ({np.abs(Lf - ref_L).max():.1e})"
        same_o = "yes" if np.array_equal(vf, ref_v) else f"no ({np.abs(vf - ref_v).max():.1e})"
        table.append(f"| {L} | {1e6 * t_c / W:.2f} | {base[0] / t_c:.1f}x | {same_c} | {1e6 * t_o / W:.2f} | "
                     f"{base[1] / t_o:.1f}x | {same_o} |")
    print(f"\n{W} worlds, {n} rows, {nb} bodies; one CPU thread; us per world (fastest of {args.repeat})")
    print("| lanes | Cholesky 36x36 f64 | speed-up | same as 1 lane | Schur operator x16 f32 | speed-up "
          "| same as 1 lane |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
