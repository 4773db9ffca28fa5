"""Benchmark: adjoint vs FD for the robot on the sum-of-sinusoids mesh terrain.

The scenario of tests/engine/test_engine_mesh_gradients.py: the robot at 1 m/s, gentle left turn (wheel
targets (0.9, 1.1, 1.0) v/r), on the 12 m sum-of-sinusoids mesh (60 x 60 cells, amplitude 0.15 m),
10 steps at h = 0.08 s, wheels mu 0.8 / mu_lat 0.5. Outputs: final chassis x, y, yaw; inputs: a
constant offset e of one wheel's velocity target (relative step eps of the target).

Per configuration and (wheel, eps) it prints the central quotient, and for the +/- rollouts: how
many (step, contact) states differ from the base rollout (off / stick / slide, as in
tests/engine/test_engine_adjoint.py::contact_states), how many steps report a different contact set on the
mesh (a shape pair's number of loaded contacts differs), and how many steps end above 1e-4 m/s
(unconverged). Each wheel has one contact on the mesh (contact.wheel_mesh_contact).

    python benchmarks/bench_mesh_kinks.py                 # all configurations (~1 min)
    python benchmarks/bench_mesh_kinks.py --configs reg32 reg64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.engine.test_engine_adjoint import RobotCase, contact_states, rel_err, state_flips, yaw, yaw_grad  # noqa: E402
from tests.engine.test_engine_mesh_gradients import robot_on_mesh  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convergence import FORMER_DEFAULTS  # noqa: E402

wp.config.quiet = True

T, H, V, TURN = 10, 0.08, 1.0, 0.1
WHEELS = ("left", "right", "rear")
EPS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)
UNCONVERGED = 1e-4  # [m/s]
LAM_OFF = 1e-4  # [N s] as contact_states
NORMAL_TOL = 1e-4  # a contact normal differing by more than this: another triangle

# the wheels' active rows (bench_convergence.FORMER_DEFAULTS), compared with the defaults
FORMER = FORMER_DEFAULTS
CONFIGS = {  # name: (slip speed [m/s], SolverOptions fields)
    "reg16": (0.05, {}),  # the defaults
    "coul16": (0.0, {}),
    "coul32": (0.0, dict(newton_iters=32)),
    "reg32": (0.05, dict(newton_iters=32, **FORMER)),  # the former xfail's
    "reg64": (0.05, dict(newton_iters=64, **FORMER)),
    "reg32x": (0.05, dict(newton_iters=32, extra_iters=96, extra_tol=1e-6, **FORMER)),
    "reg02x": (0.2, dict(newton_iters=32, extra_iters=96, extra_tol=1e-6, **FORMER)),
    "coul64": (0.0, dict(newton_iters=64, **FORMER)),
    "coul64pin": (0.0, dict(newton_iters=64, **{**FORMER, "pin_wheels_from": 12})),
}


def mesh_case(slip: float, **options) -> RobotCase:
    """The test's robot on the mesh (tests/engine/test_engine_mesh_gradients.robot_on_mesh) at slip speed ``slip``."""
    return robot_on_mesh(slip, **options)


def contact_geometry_sig(rc: RobotCase, tape) -> list[dict]:
    """Per step: {shape pair: number of loaded contacts}. (The stored normals are newton's; a wheel on the
    mesh has one contact whose normal the residual computes from the wheel pose, so only the loaded set
    is compared.)"""
    out = []
    sv = rc.sim.solver
    for rec in tape.records:
        c = rec.contacts
        lam = rec.lam.numpy()
        n = min(int(c["ct_count"].numpy()[0]), sv.max_contacts)
        s0, s1 = c["ct_shape0"].numpy(), c["ct_shape1"].numpy()
        d: dict[tuple, int] = {}
        for i in range(n):
            if lam[sv.joint_rows + 3 * i] > LAM_OFF:
                d[(int(s0[i]), int(s1[i]))] = d.get((int(s0[i]), int(s1[i])), 0) + 1
        out.append(d)
    return out


def geometry_changes(a: list[dict], b: list[dict]) -> tuple[int, float]:
    """(steps whose loaded contact set differs, 0.0)."""
    return sum(da != db for da, db in zip(a, b)), 0.0


def run(rc: RobotCase, wheel: int | None = None, e: float = 0.0) -> dict:
    tq = rc.targets.copy()
    if wheel is not None:
        tq[:, rc.cols[wheel]] += e
    out = rc.sim.forward(rc.q0, rc.qd0, T, tq)
    q = out[0][-1, rc.scene.handles[0].chassis]
    return dict(f=np.array([q[0], q[1], yaw(q)], np.float64), states=contact_states(rc, out.tape),
                geo=contact_geometry_sig(rc, out.tape), res=rc.sim.step_residuals[:, 0].copy())


def adjoint(rc: RobotCase) -> np.ndarray:
    """(3, 3): d(final x, y, yaw)/d(constant target offset of left, right, rear), adjoint."""
    g = np.zeros((3, 3))
    ch = rc.scene.handles[0].chassis
    for i in range(3):
        Q, _ = rc.sim.forward(rc.q0, rc.qd0, T, rc.targets)
        gQ = np.zeros_like(Q)
        if i < 2:
            gQ[-1, ch, i] = 1.0
        else:
            gQ[-1, ch] = yaw_grad(Q[-1, ch])
        gr = rc.sim.backward(gQ, None)
        g[i] = [float(gr.targets_qd[:, c].sum()) for c in rc.cols]
    return g


def ladder(rc: RobotCase, eps=EPS, wheels=(0, 1, 2)) -> dict:
    base = run(rc)
    adj = adjoint(rc)
    rows = []
    for k in wheels:
        for r in eps:
            e = r * abs(float(rc.targets[0, rc.cols[k]]))
            p, m = run(rc, k, e), run(rc, k, -e)
            gp, gp_small = geometry_changes(p["geo"], base["geo"])
            gm, gm_small = geometry_changes(m["geo"], base["geo"])
            rows.append(dict(wheel=k, eps=r, e=e, central=(p["f"] - m["f"]) / (2 * e),
                             fwd=(p["f"] - base["f"]) / e, bwd=(base["f"] - m["f"]) / e,
                             flips_p=state_flips(p, base), flips_m=state_flips(m, base), geo_p=gp, geo_m=gm,
                             dn=max(gp_small, gm_small),
                             unconv=int((p["res"] > UNCONVERGED).sum() + (m["res"] > UNCONVERGED).sum()),
                             maxres=float(max(p["res"].max(), m["res"].max()))))
    return dict(base=base, adj=adj, rows=rows)


def smooth(r: dict) -> bool:
    return r["flips_p"] == 0 and r["flips_m"] == 0 and r["geo_p"] == 0 and r["geo_m"] == 0 and r["unconv"] == 0


def print_ladder(name: str, lad: dict) -> None:
    res = lad["base"]["res"]
    print(f"\n{name}: base residual per step {np.array2string(res, precision=1)} (worst {res.max():.1e}, "
          f"{int((res > UNCONVERGED).sum())} above 1e-4)")
    print(f"  adjoint x {np.array2string(lad['adj'][0], precision=5)} y {np.array2string(lad['adj'][1], precision=5)}"
          f" yaw {np.array2string(lad['adj'][2], precision=5)}")
    print("  wheel  eps    central x   err     central y   err     central yaw err     flips+/-  geo+/-  unconv "
          "maxres   |dn|")
    for r in lad["rows"]:
        a = lad["adj"][:, r["wheel"]]
        c = r["central"]
        tag = "S" if smooth(r) else ("u" if r["unconv"] else ("g" if r["geo_p"] or r["geo_m"] else "k"))
        print(f"  {WHEELS[r['wheel']]:6s} {r['eps']:5.0e} {c[0]:+.5e} {rel_err(a[0], c[0]):7.1e} {c[1]:+.5e} "
              f"{rel_err(a[1], c[1]):7.1e} {c[2]:+.5e} {rel_err(a[2], c[2]):7.1e}  {r['flips_p']:3d} {r['flips_m']:3d}"
              f"  {r['geo_p']:3d} {r['geo_m']:3d}  {r['unconv']:5d}  {r['maxres']:.1e} {r['dn']:.1e} {tag}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    a = ap.parse_args()
    for name in a.configs:
        slip, opts = CONFIGS[name]
        print_ladder(f"{name} (slip speed {slip}, {opts})", ladder(mesh_case(slip, **opts)))


if __name__ == "__main__":
    main()
