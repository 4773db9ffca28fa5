"""Adjoint gradients of `Simulation.backward` (paper §III-D) against central finite differences.

Every check: central differences with a step of 1e-2 x |value| (float32 rollouts), the adjoint of the
same rollout, and the relative error |adjoint - FD| / |FD| per component, printed (run with -s) and
asserted <= 0.5 %. Components that are zero by the physics (a box resting on the ground, a pendulum's
mass independence) are compared in absolute terms, with the bound stated. Scenarios are built at
converged Newton states (the residual per step is printed); where the engine does not converge the
test is an xfail(strict=True) whose reason holds the measured figures.
"""

from __future__ import annotations

import gc
import math
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import newton
import numpy as np
import pytest
import torch
import warp as wp

from ingest.transforms import yaw_of
from sysid.engine import Gradients, Simulation, SolverOptions, SolverOstrich
from sysid.engine.torch_bridge import rollout as torch_rollout
from sysid.robot import load_robot
from sysid.robot.scenes import Scene, WorldSpec, build_robot_scene
from tests.helpers.engine import rolling_inputs

wp.config.quiet = True
G = 9.81  # [m/s^2]
TOL = 5e-3  # relative error bound of the "Must show" list
FD_REL = 1e-2  # finite-difference step relative to the perturbed value
F32 = 2.0**-23  # float32 relative resolution: an FD quotient is resolved to about F32 |L| / (2 step)


# ------------------------------------------------------------------------------------------ helpers
def rel_err(adj: float, fd: float) -> float:
    return abs(adj - fd) / max(abs(fd), 1e-30)


def report(title: str, rows: list[tuple[str, float, float]]) -> dict[str, float]:
    """Print adjoint, FD and relative error per component; returns {label: rel. error}."""
    print(f"\n{title}")
    out = {}
    for label, a, f in rows:
        out[label] = rel_err(a, f)
        print(f"  {label:<28s} adjoint {a:+.6e}  FD {f:+.6e}  rel.err {out[label]:.2e}")
    return out


def central(fn: Callable[[float], np.ndarray], x: float, step: float | None = None) -> np.ndarray:
    e = FD_REL * abs(x) if step is None else step
    return (fn(x + e) - fn(x - e)) / (2 * e)


def residual_trace(sim: Simulation, *args, **kw) -> np.ndarray:
    """Forward with the Newton residual [m/s] of every step recorded (printed by callers)."""
    res: list[float] = []
    sim.forward(*args, **kw, progress=lambda t: res.append(float(sim.solver.status().residual.max())))
    return np.asarray(res)


def final_coordinate_grad(sim: Simulation, q0: np.ndarray, qd0: np.ndarray, steps: int, comp: int, **forward_kw):
    """Adjoint gradients of L = coordinate ``comp`` of body 0's final pose (a one-body scene)."""
    sim.forward(q0, qd0, steps, **forward_kw)
    gQ = np.zeros((steps + 1, 1, 7), np.float32)
    gQ[-1, 0, comp] = 1.0
    return sim.backward(gQ, None)


def gmres_summary(sim: Simulation) -> str:
    its = [s[0] for s in sim.adjoint_stats]
    what = "GMRES iterations" if sim.solver.options.adjoint_solver == "gmres" else "LU system size"
    return f"adjoint solve per step ({what}) {its}, max rel. residual {max(s[1] for s in sim.adjoint_stats):.1e}"


def yaw(q: np.ndarray) -> float:
    return yaw_of(q[3:7])


def yaw_grad(q: np.ndarray) -> np.ndarray:
    """d yaw / d body_q (7,), analytic in the quaternion (x, y, z, w)."""
    x, y, z, w = (float(v) for v in q[3:7])
    a, b = 2 * (w * z + x * y), 1 - 2 * (y * y + z * z)
    da = np.array([2 * y, 2 * x, 2 * w, 2 * z])
    db = np.array([0.0, -4 * y, -4 * z, 0.0])
    g = np.zeros(7)
    g[3:7] = (b * da - a * db) / (a * a + b * b)
    return g


def box_model(mu: float, z: float, mass: float = 2.0, half: float = 0.1, inertia: float | None = None,
              gap: float = 0.15) -> newton.Model:
    b = newton.ModelBuilder()
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=gap)
    b.add_ground_plane(cfg=cfg)
    i = mass / 3.0 * 2 * half * half if inertia is None else inertia  # solid cube
    body = b.add_body(xform=wp.transform((0.0, 0.0, z), wp.quat_identity()), mass=mass,
                      inertia=wp.mat33(i, 0, 0, 0, i, 0, 0, 0, i))
    b.add_shape_box(body, hx=half, hy=half, hz=half, cfg=cfg)
    return b.finalize(device="cpu")


# ------------------------------------------------------------------ 1. a box hitting the ground
BOX_HIT = dict(mu=0.3, z0=0.2, vx0=2.0, vz0=-1.0, h=0.05, T=10)


def box_hit_sim(**kw) -> tuple[Simulation, np.ndarray, np.ndarray]:
    c = BOX_HIT
    m = box_model(c["mu"], c["z0"])
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32)), c["h"], **kw)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0], qd0[0, 2] = c["vx0"], c["vz0"]
    return sim, m.body_q.numpy(), qd0


def box_hit_fd(sim: Simulation, q0: np.ndarray, qd0: np.ndarray) -> dict[str, np.ndarray]:
    """Central FD of the landing box's final (x, y, z) in z0, vx0, vz0."""
    c = BOX_HIT

    def final(q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        return sim.forward(q, qd, c["T"])[0][-1, 0, :3].astype(np.float64)

    def dz0(v: float) -> np.ndarray:
        q = q0.copy()
        q[0, 2] = v
        return final(q, qd0)

    def dv(j: int) -> Callable[[float], np.ndarray]:
        def f(v: float) -> np.ndarray:
            qd = qd0.copy()
            qd[0, j] = v
            return final(q0, qd)
        return f

    return {"z0": central(dz0, c["z0"]), "vx0": central(dv(0), c["vx0"]), "vz0": central(dv(2), c["vz0"])}


def test_box_hitting_ground() -> None:
    """A 2 kg, 0.2 m cube (mu 0.3) falls from z0 = 0.2 m (its base 0.1 m up, inside the 0.3 m
    speculative contact distance from the start, so no contact enters mid-rollout) with
    v0 = (2, 0, -1) m/s; h = 0.05 s, 10 steps: it lands in step 2 and slides. L = final x, z.
    Reference: central FD of the rollout in z0, vx0, vz0. Final z (resting on the ground) does not
    depend on them: |dz/d.| < 1e-4 for adjoint and FD alike."""
    c = BOX_HIT
    sim, q0, qd0 = box_hit_sim()
    res = residual_trace(sim, q0, qd0, c["T"])
    print("\nbox hitting the ground: Newton residual per step", np.array2string(res, precision=1))
    Q, _ = sim.forward(q0, qd0, c["T"])
    assert Q[2, 0, 2] < 0.101 and Q[-1, 0, 0] > Q[2, 0, 0] + 0.1, "box must land and slide"
    fd = box_hit_fd(sim, q0, qd0)
    for comp, name in ((0, "x"), (2, "z")):
        g = final_coordinate_grad(sim, q0, qd0, c["T"], comp)
        print(f"  L = final {name}: {gmres_summary(sim)}")
        adj = {"z0": g.body_q0[0, 2], "vx0": g.body_qd0[0, 0], "vz0": g.body_qd0[0, 2]}
        rows = [(f"d{name}/d{k}", float(adj[k]), float(fd[k][comp])) for k in adj]
        errs = report(f"box hitting the ground, L = final {name}", rows)
        if name == "x":
            assert max(errs.values()) <= TOL, errs
        else:
            assert all(abs(a) < 1e-4 and abs(f) < 1e-4 for _, a, f in rows), rows


# ------------------------------------------------------------------ 2. a block sliding with friction
SLIDE = dict(mu=0.4, v0=2.0, h=0.05, T=8)


def slide_sim(mu: float = SLIDE["mu"], v0: float = SLIDE["v0"], **kw) -> tuple[Simulation, np.ndarray, np.ndarray]:
    m = box_model(mu, 0.1, mass=1.0, inertia=0.01, gap=0.1)
    sim = Simulation(SolverOstrich(m), SLIDE["h"], **kw)
    sim.register_parameter("mu", "shape_mu", [0, 1])  # ground and box: the contact's coefficient
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = v0
    return sim, m.body_q.numpy(), qd0


def slide_fd(sim: Simulation, q0: np.ndarray, qd0: np.ndarray) -> tuple[float, float]:
    """Central FD of the sliding block's final x in (mu, v0), mu left at its SLIDE value."""
    c = SLIDE

    def x_of_mu(mu: float) -> np.ndarray:
        sim.set_parameters({"mu": mu})
        return np.array([float(sim.forward(q0, qd0, c["T"])[0][-1, 0, 0])])

    def x_of_v0(v: float) -> np.ndarray:
        qd = qd0.copy()
        qd[0, 0] = v
        return np.array([float(sim.forward(q0, qd, c["T"])[0][-1, 0, 0])])

    fd_mu = float(central(x_of_mu, c["mu"])[0])
    sim.set_parameters({"mu": c["mu"]})
    return fd_mu, float(central(x_of_v0, c["v0"])[0])


def test_block_sliding_friction() -> None:
    """A 1 kg cube on the ground, v0 = 2 m/s, mu = 0.4, h = 0.05 s, 8 steps (still sliding at the end).
    Backward Euler gives v_k = v0 - k mu g h, x_T = x0 + h sum_k v_k, hence the closed forms
    dx_T/dmu = -g h^2 T (T+1) / 2 and dx_T/dv0 = T h; both and central FD are compared."""
    c = SLIDE
    sim, q0, qd0 = slide_sim()
    res = residual_trace(sim, q0, qd0, c["T"])
    print("\nsliding block: Newton residual per step", np.array2string(res, precision=1))
    Q, QD = sim.forward(q0, qd0, c["T"])
    assert QD[-1, 0, 0] > 0.2, "the block must still slide at the end"
    gQ = np.zeros((c["T"] + 1, 1, 7), np.float32)
    gQ[-1, 0, 0] = 1.0
    g = sim.backward(gQ, None)
    print("  " + gmres_summary(sim))

    fd_mu, fd_v0 = slide_fd(sim, q0, qd0)
    closed_mu = -G * c["h"] ** 2 * c["T"] * (c["T"] + 1) / 2
    closed_v0 = c["T"] * c["h"]
    a_mu, a_v0 = float(g.params["mu"]), float(g.body_qd0[0, 0])
    errs = report("sliding block, L = final x", [
        ("dx/dmu vs FD", a_mu, fd_mu), ("dx/dmu vs closed form", a_mu, closed_mu),
        ("FD dx/dmu vs closed form", fd_mu, closed_mu),
        ("dx/dv0 vs FD", a_v0, fd_v0), ("dx/dv0 vs closed form T h", a_v0, closed_v0),
    ])
    assert max(errs.values()) <= TOL, errs


# ------------------------------------------------------------------ robot helpers
@dataclass
class RobotCase:
    scene: Scene
    sim: Simulation
    q0: np.ndarray
    qd0: np.ndarray
    targets: np.ndarray  # (T, dofs)
    cols: list[int]  # wheel dof columns (left, right, rear)


def robot_case(T: int, v: float, turn: float, mu_lat: float, iters: int, pallet: tuple | None = None,
               checkpoint_every: int | None = None, pullback: str = "full", **options) -> RobotCase:
    """The robot already rolling at v [m/s] along +x (chassis and wheels at v, wheels spinning v/r
    about their axles), wheel targets (1 - turn, 1 + turn, 1) v/r for (left, right, rear);
    ``options``: further `SolverOptions` fields."""
    sc = build_robot_scene([WorldSpec(pallet=pallet)], load_robot(), device="cpu")
    m, hd, desc = sc.model, sc.handles[0], sc.robot
    solver = SolverOstrich(m, SolverOptions(newton_iters=iters, **options))
    solver.set_anisotropic_friction(hd.wheel_shapes, desc.mu, mu_lat)
    sim = Simulation(solver, 0.1, checkpoint_every=checkpoint_every, pullback=pullback)
    sim.register_parameter("kp", "joint_kd", hd.wheel_joints)
    sim.register_parameter("mu_lat", "shape_mu_lat", hd.wheel_shapes)
    q0, qd0, tq = rolling_inputs(sc, T, v, turn)
    start = m.joint_qd_start.numpy()
    cols = [int(start[j]) for j in hd.wheel_joints]
    return RobotCase(sc, sim, q0, qd0, tq, cols)


def robot_pose(rc: RobotCase, Q: np.ndarray) -> np.ndarray:
    q = Q[-1, rc.scene.handles[0].chassis]
    return np.array([q[0], q[1], yaw(q)], np.float64)


def robot_pose_grads(rc: RobotCase, comps: tuple[int, ...]) -> list[Gradients]:
    """Adjoint gradients of final chassis x, y, yaw (components ``comps``)."""
    T = rc.targets.shape[0]
    Q, _ = rc.sim.forward(rc.q0, rc.qd0, T, rc.targets)
    ch = rc.scene.handles[0].chassis
    out = []
    for comp in comps:
        gQ = np.zeros_like(Q)
        if comp < 2:
            gQ[-1, ch, comp] = 1.0
        else:
            gQ[-1, ch] = yaw_grad(Q[-1, ch])
        rc.sim.forward(rc.q0, rc.qd0, T, rc.targets)
        out.append(rc.sim.backward(gQ, None))
        print(f"  L = {('x', 'y', 'yaw')[comp]}: {gmres_summary(rc.sim)}")
    return out


def robot_fd(rc: RobotCase, params: dict[str, float]) -> dict[str, np.ndarray]:
    """Central FD of (x, y, yaw) per wheel's constant target offset and per named parameter."""
    T = rc.targets.shape[0]

    def pose(tq: np.ndarray) -> np.ndarray:
        return robot_pose(rc, rc.sim.forward(rc.q0, rc.qd0, T, tq)[0])

    out = {}
    base = pose(rc.targets)
    for k, col in enumerate(rc.cols):
        e = FD_REL * abs(float(rc.targets[0, col]))
        out[f"floor:target[{('left', 'right', 'rear')[k]}]"] = F32 * np.abs(base) / (2 * e)
        p, mm = rc.targets.copy(), rc.targets.copy()
        p[:, col] += e
        mm[:, col] -= e
        out[f"target[{('left', 'right', 'rear')[k]}]"] = (pose(p) - pose(mm)) / (2 * e)
    for name, val in params.items():
        rc.sim.set_parameters({name: val + FD_REL * val})
        fp = pose(rc.targets)
        rc.sim.set_parameters({name: val - FD_REL * val})
        fm = pose(rc.targets)
        rc.sim.set_parameters({name: val})
        out[name] = (fp - fm) / (2 * FD_REL * val)
        out[f"floor:{name}"] = F32 * np.abs(base) / (2 * FD_REL * val)
    return out


def robot_adj_rows(rc: RobotCase, g: Gradients, names: list[str]) -> dict[str, float]:
    out = {f"target[{('left', 'right', 'rear')[k]}]": float(g.targets_qd[:, c].sum()) for k, c in enumerate(rc.cols)}
    out.update({n: float(g.params[n]) for n in names})
    return out


# ------------------------------------------------------------------ 3. the robot under sticking contact
STICK = dict(T=5, v=1.0, turn=0.1, mu_lat=0.5, iters=64)


@pytest.fixture(scope="module")
def sticking() -> dict:
    """Robot at 1 m/s, wheel targets (0.9, 1.1, 1.0) x 1/r: a gentle left turn, 5 steps at h = 0.1 s,
    mu = 0.8, mu_lat = 0.5, kp = 250 N m s/rad, 64 Newton iterations. The two front wheels roll
    without slip (sticking); the rear wheel, off the front axle, must scrub sideways on its lateral
    friction cone in a turn, which is what makes d/dmu_lat non-zero."""
    c = STICK
    rc = robot_case(c["T"], c["v"], c["turn"], c["mu_lat"], c["iters"])
    res = residual_trace(rc.sim, rc.q0, rc.qd0, c["T"], rc.targets)
    print("\nrobot, gentle turn: Newton residual per step", np.array2string(res, precision=1))
    grads = robot_pose_grads(rc, (0, 1, 2))
    fd = robot_fd(rc, {"kp": rc.scene.robot.kp, "mu_lat": c["mu_lat"]})
    adj = [robot_adj_rows(rc, g, ["kp", "mu_lat"]) for g in grads]
    errs = [report(f"robot gentle turn, L = final {('x', 'y', 'yaw')[i]}",
                   [(f"d{('x', 'y', 'yaw')[i]}/d{k}", adj[i][k], float(fd[k][i])) for k in adj[i]]) for i in range(3)]
    # components whose FD quotient float32 cannot resolve to TOL / 5 (the last bits of L over the step)
    limited = {f"d{('x', 'y', 'yaw')[i]}/d{k}": float(fd["floor:" + k][i] / abs(fd[k][i]))
               for i in range(3) for k in adj[i] if fd["floor:" + k][i] > TOL / 5 * abs(fd[k][i])}
    print("  FD-resolution-limited components (float32 floor / |FD|):", limited)
    return dict(rc=rc, res=res, adj=adj, fd=fd, errs=errs, grads=grads, limited=limited)


def test_robot_sticking_contact(sticking: dict) -> None:
    """d(final x, y, yaw)/d(left, right wheel targets, kp, mu_lat) and d(x, yaw)/d rear target <= 0.5 %.
    Not asserted: components float32 FD cannot resolve to 0.1 % (dx/dkp: kp x dx/dkp is 0.7 mm, its
    FD quotient carries ~0.3-1 % rounding; printed with its floor) and the rear target's y
    component (xfail below)."""
    assert sticking["res"].max() < 1e-3, "scenario must be converged"
    checked = {k: v for e in sticking["errs"] for k, v in e.items()
               if k not in sticking["limited"] and k != "dy/dtarget[rear]"}
    assert "dyaw/dtarget[rear]" in checked
    assert len(checked) >= 11, checked
    assert max(checked.values()) <= TOL, checked


@pytest.mark.xfail(strict=True, reason="rear-wheel target -> y: adjoint 8.59e-5 vs central FD 8.86e-5 (3.2 %) "
                   "at the 1 % step; the map has a kink there (one-sided quotients of opposite sign: +3.6e-4 / "
                   "-1.9e-4 at 0.3 %, +1.0e-3 / -8.3e-4 at 1 %: the rear wheel sits at the longitudinal stick/slip "
                   "boundary), central quotients 8.71e-5 / 8.86e-5 / 1.11e-4 at 0.3 / 1 / 3 %; the component is "
                   "0.15 % of dy/dtarget[left]. With friction_safeguard='active' (2026-12-02) dyaw/dtarget[rear] "
                   "agrees to 0.16 % (was 33 %)")
def test_robot_sticking_rear_target_lateral(sticking: dict) -> None:
    assert sticking["errs"][1]["dy/dtarget[rear]"] <= TOL


# ------------------------------------------------------------------ 4. the robot climbing the pallet
CLIMB = dict(T=20, v=1.0, pallet=(1.6, 0.0, 0.0), iters=64)


@pytest.fixture(scope="module")
def climbing() -> dict:
    c = CLIMB
    rc = robot_case(c["T"], c["v"], 0.0, 0.5, c["iters"], pallet=c["pallet"])
    res = residual_trace(rc.sim, rc.q0, rc.qd0, c["T"], rc.targets)
    print("\nrobot climbing the pallet: Newton residual per step", np.array2string(res, precision=1))
    Q, _ = rc.sim.forward(rc.q0, rc.qd0, c["T"], rc.targets)
    grads = robot_pose_grads(rc, (0, 1))
    return dict(rc=rc, res=res, Q=Q, grads=grads)


def test_robot_climb_pallet_runs(climbing: dict) -> None:
    """The climb happens (chassis ends on the pallet) and the adjoint is finite with GMRES converged."""
    rc, Q = climbing["rc"], climbing["Q"]
    z = Q[:, rc.scene.handles[0].chassis, 2]
    assert z.max() > 0.36 + 0.1 and Q[-1, rc.scene.handles[0].chassis, 0] > 1.6
    for g in climbing["grads"]:
        assert np.isfinite(g.targets_qd).all()


# -- the exact-Coulomb climb: FD across stick/slip kinks and unconverged steps (issue 21, must-show 2;
# benchmarks/bench_climb_kinks.py prints the full tables, benchmarks/README.md "bench_climb_kinks.py")
CLIMB_EPS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)  # FD steps relative to the wheel target
DY_TOL = 0.02  # d(final y) of the climb: 0.3-3 % of dx, resolved by FD to about a percent (see below)
CONE_TOL = 1e-3  # a contact whose friction is within this fraction of its cone counts as sliding
LAM_OFF = 1e-4  # [N s] normal impulse below which a contact counts as off
UNCONVERGED = 1e-4  # [m/s] returned Newton residual above which a step counts as unconverged
H_ROBOT = 0.1  # [s] robot_case's step
WHEEL_NAMES = ("left", "right", "rear")


def contact_states(rc: RobotCase, tape) -> dict[tuple, str]:
    """{(step, shape0, shape1, ordinal): 'off' | 'stick' | 'slide'} of a recorded rollout, read from
    each step's returned impulses: off if lam_n <= LAM_OFF, sliding if |(l_1/mu_1, l_2/mu_2)| >=
    (1 - CONE_TOL) lam_n (on the elliptic cone), else sticking."""
    sv = rc.sim.solver
    mu, mu_lat = sv.shape_mu.numpy(), sv.shape_mu_lat.numpy()
    out = {}
    for t, rec in enumerate(tape.records):
        lam = rec.lam.numpy()
        n = min(int(rec.contacts["ct_count"].numpy()[0]), sv.max_contacts)
        s0, s1 = rec.contacts["ct_shape0"].numpy(), rec.contacts["ct_shape1"].numpy()
        fs = rec.contacts["ct_fric_shape"].numpy()
        seen: dict[tuple, int] = {}
        for ci in range(n):
            pair = (int(s0[ci]), int(s1[ci]))
            seen[pair] = seen.get(pair, -1) + 1
            rn = sv.joint_rows + 3 * ci
            ln, l1, l2 = (float(x) for x in lam[rn:rn + 3])
            m1, m2 = (mu[fs[ci]], mu_lat[fs[ci]]) if fs[ci] >= 0 else (0.5 * (mu[pair[0]] + mu[pair[1]]),) * 2
            cone = math.hypot(l1 / m1, l2 / m2)
            state = "slide" if cone >= (1 - CONE_TOL) * ln else "stick"
            out[(t, *pair, seen[pair])] = "off" if ln <= LAM_OFF else state
    return out


def climb_run(rc: RobotCase, wheel: int | None = None, e: float = 0.0) -> dict:
    """One climb rollout with wheel ``wheel``'s target offset by e [rad/s]: final chassis (x, y),
    per-step contact states and returned Newton residuals."""
    tq = rc.targets.copy()
    if wheel is not None:
        tq[:, rc.cols[wheel]] += e
    out = rc.sim.forward(rc.q0, rc.qd0, tq.shape[0], tq)
    return dict(f=np.array(out[0][-1, rc.scene.handles[0].chassis, :2], np.float64),
                states=contact_states(rc, out.tape), res=rc.sim.step_residuals[:, 0].copy())


def state_flips(a: dict, b: dict) -> int:
    """(step, contact) states that differ between two rollouts (a contact missing in one counts as off)."""
    return sum(a["states"].get(k, "off") != b["states"].get(k, "off") for k in a["states"].keys() | b["states"].keys())


def climb_adjoint(rc: RobotCase) -> np.ndarray:
    """(2, 3): d(final x, y)/d(constant target offset of the left, right, rear wheel), adjoint."""
    g = np.zeros((2, 3))
    ch = rc.scene.handles[0].chassis
    for i in range(2):
        Q, _ = rc.sim.forward(rc.q0, rc.qd0, rc.targets.shape[0], rc.targets)
        gQ = np.zeros_like(Q)
        gQ[-1, ch, i] = 1.0
        gr = rc.sim.backward(gQ, None)
        g[i] = [float(gr.targets_qd[:, col].sum()) for col in rc.cols]
    return g


def climb_ladder(rc: RobotCase, eps: tuple[float, ...] = CLIMB_EPS) -> dict:
    """The base rollout, the adjoint, and per (wheel, eps) the central quotient with its +/- rollouts'
    state flips against the base and against each other and their unconverged step count."""
    base = climb_run(rc)
    adj = climb_adjoint(rc)
    rows = []
    for k in range(3):
        for r in eps:
            e = r * abs(float(rc.targets[0, rc.cols[k]]))
            p, m = climb_run(rc, k, e), climb_run(rc, k, -e)
            rows.append(dict(wheel=k, eps=r, e=e, central=(p["f"] - m["f"]) / (2 * e), flips_p=state_flips(p, base),
                             flips_m=state_flips(m, base), flips_pm=state_flips(p, m),
                             unconv=int((p["res"] > UNCONVERGED).sum() + (m["res"] > UNCONVERGED).sum()),
                             floor=H_ROBOT * float(p["res"].sum() + m["res"].sum()) / (2 * e)))
    return dict(base=base, adj=adj, rows=rows)


def print_ladder(title: str, lad: dict) -> None:
    print(f"\n{title}: worst step residual {lad['base']['res'].max():.1e} m/s (step "
          f"{int(lad['base']['res'].argmax()) + 1}); adjoint dx {np.array2string(lad['adj'][0], precision=5)}, "
          f"dy {np.array2string(lad['adj'][1], precision=5)}")
    print("  wheel  eps     central dx   err      central dy   err      flips +/0 0/- +/-  unconv")
    for r in lad["rows"]:
        a = lad["adj"][:, r["wheel"]]
        print(f"  {WHEEL_NAMES[r['wheel']]:6s} {r['eps']:5.0e}  {r['central'][0]:+.5e} "
              f"{rel_err(a[0], r['central'][0]):7.1e}  {r['central'][1]:+.5e} {rel_err(a[1], r['central'][1]):7.1e}  "
              f"{r['flips_p']:8d} {r['flips_m']:3d} "
              f"{r['flips_pm']:3d}  {r['unconv']:6d}")



PIECE_EPS_MAX = 3e-3  # largest FD step (relative) taken for the smooth-piece check, see below


def smooth_pieces(lad: dict) -> list[dict | None]:
    """Per wheel the largest step <= PIECE_EPS_MAX of the ladder whose +/- rollouts stay on the base
    rollout's smooth piece (no contact state flips, every step converged); None: none does."""
    return [next((r for r in lad["rows"] if r["wheel"] == k and r["eps"] <= PIECE_EPS_MAX * 1.0001
                  and r["flips_p"] == 0 and r["flips_m"] == 0 and r["unconv"] == 0), None) for k in range(3)]


@pytest.fixture(scope="module")
def climb_kinks() -> dict:
    """The climb with exact Coulomb wheels twice: with the wheels on the semismooth rows from Newton
    iteration 4 (pin_wheels_from=4, the default since issue 21's last change; every step of the base
    rollout converges) and with the former default pin_wheels_from=0 (the former strict xfail's: step
    16, where the rear wheel meets the pallet edge, ends at ~1 m/s)."""
    c = CLIMB
    conv = climb_ladder(robot_case(c["T"], c["v"], 0.0, 0.5, c["iters"], pallet=c["pallet"], pin_wheels_from=4),
                        CLIMB_EPS[1:8])
    print_ladder("exact-Coulomb climb, pin_wheels_from=4", conv)
    conv["piece"] = smooth_pieces(conv)
    dflt = climb_ladder(robot_case(c["T"], c["v"], 0.0, 0.5, c["iters"], pallet=c["pallet"], pin_wheels_from=0))
    print_ladder("exact-Coulomb climb, pin_wheels_from=0 (the former default)", dflt)
    return dict(conv=conv, dflt=dflt)


def check_smooth_piece(lad: dict) -> None:
    """The base rollout converges at every step and, per wheel, the adjoint's dx (dy) is within TOL
    (DY_TOL) of the central quotient on the smooth piece (`smooth_pieces`)."""
    assert lad["base"]["res"].max() < UNCONVERGED, "every step of the base rollout must converge"
    adj = lad["adj"]
    for k, r in enumerate(lad["piece"]):
        assert r is not None, f"no step of the ladder stays on the base rollout's piece for the {WHEEL_NAMES[k]} wheel"
        fd = r["central"]
        print(f"  {WHEEL_NAMES[k]}: smooth piece at eps {r['eps']:.0e}: dx adjoint {adj[0, k]:+.6e} FD {fd[0]:+.6e} "
              f"({rel_err(adj[0, k], fd[0]):.1e}), dy adjoint {adj[1, k]:+.6e} FD {fd[1]:+.6e} "
              f"({rel_err(adj[1, k], fd[1]):.1e}, floor {r['floor'] / abs(fd[1]):.1e})")
        assert rel_err(adj[0, k], fd[0]) <= TOL, (k, adj[0, k], fd[0])
        assert rel_err(adj[1, k], fd[1]) <= DY_TOL, (k, adj[1, k], fd[1], r["floor"])


def test_robot_climb_pallet_gradients(climb_kinks: dict) -> None:
    """Exact-Coulomb pallet climb (20 steps at h = 0.1 s, wheels mu 0.8 / mu_lat 0.5, slip speed 0,
    64 Newton iterations with pin_wheels_from=4 so that every step converges, measured worst 1.2e-5
    m/s): d(final x, y)/d(constant offset of each wheel's target) by the adjoint against central FD
    taken inside one smooth piece.

    Coulomb friction makes the rollout piecewise smooth: on each piece the active set (every step's
    contacts on/off, sticking |l~| < lam_n or sliding |l~| = lam_n) is fixed and the map is smooth;
    between pieces it has kinks. The adjoint differentiates the piece of the returned rollout. A
    central quotient (f(+e) - f(-e)) / 2e is its derivative only if f(+e), f(0), f(-e) lie on that
    piece; so for each wheel the largest step of the ladder 3e-3 ... 3e-5 (relative) is taken at which
    both +/- rollouts keep every contact state of the base rollout (contact_states) and converge
    (every step below 1e-4 m/s). Larger steps are not used for dy even on the piece: at 1e-2 its
    quotient carries its O(e^2) truncation error (measured left wheel: 6.4 % / 0.6 % at 1e-2 / 3e-3,
    ratio 11 = (10/3)^2: curvature, not a kink). Asserted: such a step exists for every wheel; dx
    within 0.5 % (measured 2026-12-04: 1.5e-4 / 1.9e-4 / 2.8e-5 at 3e-3). dy is asserted to DY_TOL =
    2 % (measured 0.8 / 1.0 / 0.4 %): its components are 0.3-3 % of dx (-4.7e-3, 3.0e-3, -5.5e-4), so y
    moves by only 5e-6 ... 4e-5 m from the base to each of the +/- rollouts, while their steps return
    residuals of 1e-6 ... 1e-5 m/s (printed: the floor h sum_t (res+_t + res-_t) / 2e bounds what that
    can do to the quotient; the measured scatter is far below it)."""
    check_smooth_piece(climb_kinks["conv"])


def test_robot_climb_pallet_fd_has_no_limit(climb_kinks: dict) -> None:
    """Why central FD of the climb with the former default options (pin_wheels_from=0; the former
    strict xfail: dx 1.4-2.3 % off, dy 63-126 %) says nothing about the adjoint, measured on the
    ladder eps = 1e-1 ... 1e-5.

    (1) The base rollout is not a solution: step 16 (the rear wheel meets the pallet edge) returns its
    best iterate at a residual above 0.1 m/s (measured 1.1), so the adjoint linearises a non-root; its
    dx is > 0.5 % from the converged climb's adjoint (measured 1.8 / 1.3 / 1.0 %). (2) The returned map
    f(theta) jumps (best iterates of unconverged steps change with theta) and kinks (contacts change
    stick/slip), so (f(+e) - f(-e)) / 2e has no limit as e -> 0: across the ladder the central dx
    quotients spread over at least 100 x the smooth-piece mismatch of test_robot_climb_pallet_gradients
    (measured spread 6.4 / 1.65 / 0.94 x dx for left / right / rear, against <= 1.9e-4), and every
    wheel has a step in the ladder whose +/- rollouts flip contact states or end unconverged. The
    wheels' semismooth rows (pin_wheels_from=4, now the default) converge step 16, and
    test_robot_climb_pallet_gradients asserts the smooth-piece check on that climb."""
    lad, conv = climb_kinks["dflt"], climb_kinks["conv"]
    assert lad["base"]["res"].max() > 0.1
    off = [rel_err(lad["adj"][0, k], conv["adj"][0, k]) for k in range(3)]
    print(f"  default-options adjoint dx vs the converged climb's: {np.array2string(np.array(off), precision=4)}")
    assert min(off) > TOL, off
    assert all(r is not None for r in conv["piece"])
    smooth = max(rel_err(conv["adj"][0, r["wheel"]], r["central"][0]) for r in conv["piece"])
    for k in range(3):
        rows = [r for r in lad["rows"] if r["wheel"] == k]
        assert any(r["flips_pm"] > 0 or r["unconv"] > 0 for r in rows), k
        c = np.array([r["central"][0] for r in rows])
        spread = (c.max() - c.min()) / abs(conv["adj"][0, k])
        print(f"  {WHEEL_NAMES[k]}: central dx over eps {np.array2string(c, precision=4)}, spread {spread:.2f} "
              f"x dx (smooth-piece mismatch {smooth:.1e})")
        assert spread >= 100 * smooth, (k, spread, smooth)


def test_robot_climb_pallet_gradients_regularised() -> None:
    """The issue's 20-step pallet climb (1 m/s, h = 0.1 s, pallet near edge 1.0 m ahead; the chassis
    ends on the pallet) with regularised wheel friction (slip speed 0.05 m/s), 32 Newton iterations:
    d(final x, y, yaw)/d(each wheel's command offset) against central FD, every component printed.
    Components of at least 1 % of their row's largest are asserted to 0.5 % (measured 2026-12-02:
    at most 4.4e-3); the rear command's y and yaw components are 0.15 % of the others (6e-4 against
    0.42), below what FD resolves at the solver tolerance (measured 0.5-10 % apart): for those the
    absolute error is asserted below 0.5 % of the row's largest component."""
    c = CLIMB
    rc = robot_case(c["T"], c["v"], 0.0, 0.5, 32, pallet=c["pallet"])
    rc.sim.solver.set_slip_speed(rc.scene.handles[0].wheel_shapes, 0.05)
    res = residual_trace(rc.sim, rc.q0, rc.qd0, c["T"], rc.targets)
    print("\nregularised pallet climb: Newton residual per step", np.array2string(res, precision=1))
    assert res.max() < 1e-4
    Q, _ = rc.sim.forward(rc.q0, rc.qd0, c["T"], rc.targets)
    ch = rc.scene.handles[0].chassis
    assert Q[:, ch, 2].max() > 0.36 + 0.14 and Q[-1, ch, 0] > 1.6  # it climbed
    grads = robot_pose_grads(rc, (0, 1, 2))
    fd = robot_fd(rc, {})
    adj = [robot_adj_rows(rc, g, []) for g in grads]
    for i in range(3):
        coord = ("x", "y", "yaw")[i]
        errs = report(f"regularised pallet climb, L = final {coord}",
                      [(f"d{coord}/d{k}", adj[i][k], float(fd[k][i])) for k in adj[i]])
        scale = max(abs(v) for v in adj[i].values())
        for k, v in adj[i].items():
            if abs(v) >= 0.01 * scale:
                assert errs[f"d{coord}/d{k}"] <= TOL, (k, errs)
            else:
                assert abs(v - float(fd[k][i])) <= TOL * scale, (k, v, fd[k][i], scale)


# ------------------------------------------------------------------ 4b. regularised friction (slip speed)
REG_SLIDE = dict(mu=0.4, vs=0.3, v0=1.0, h=0.05, T=16)


def test_block_sliding_regularised_friction() -> None:
    """A 1 kg cube at v0 = 1 m/s on the ground with friction mu N v / sqrt(v^2 + v_s^2)
    (`set_slip_speed`, mu = 0.4, v_s = 0.3 m/s), 16 steps at h = 0.05 s: it decelerates through
    the Coulomb part into the viscous part and nearly stops. d(final x)/d(mu, v_s) against FD."""
    c = REG_SLIDE
    m = box_model(c["mu"], 0.1, mass=1.0, inertia=0.01, gap=0.1)
    solver = SolverOstrich(m)
    solver.set_slip_speed([0, 1], c["vs"])
    sim = Simulation(solver, c["h"])
    sim.register_parameter("mu", "shape_mu", [0, 1])
    sim.register_parameter("vs", "shape_slip", [0, 1])
    q0 = m.body_q.numpy()
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = c["v0"]
    res = residual_trace(sim, q0, qd0, c["T"])
    print("\nregularised sliding block: max Newton residual", f"{res.max():.1e}")
    assert res.max() < 1e-4
    g = final_coordinate_grad(sim, q0, qd0, c["T"], 0)

    def final_x(name: str) -> Callable[[float], np.ndarray]:
        def f(v: float) -> np.ndarray:
            sim.set_parameters({name: v})
            return np.array([float(sim.forward(q0, qd0, c["T"])[0][-1, 0, 0])])
        return f

    fd = {}
    for name in ("mu", "vs"):
        fd[name] = float(central(final_x(name), c[name])[0])
        sim.set_parameters({name: c[name]})
    errs = report("regularised sliding block, L = final x",
                  [(f"dx/d{n}", float(g.params[n]), fd[n]) for n in ("mu", "vs")])
    assert max(errs.values()) <= TOL, errs


@pytest.mark.parametrize("turn", [0.1, 0.4], ids=["gentle", "tight"])
def test_robot_turn_regularised_friction(turn: float) -> None:
    """The robot rolling at 1 m/s into a turn (wheel targets (1 -+ turn, 1) v/r), 10 steps at
    h = 0.1 s, 16 Newton iterations, wheels with slip speed v_s = 0.05 m/s: every wheel slips a
    little, the tight turn scrubs the rear wheel sideways. d(final x, y, yaw)/d(each wheel target,
    kp, mu_lat, v_s) against central FD, every component (measured 2e-8 ... 2.3e-3)."""
    rc = robot_case(10, 1.0, turn, 0.5, 16)
    hd = rc.scene.handles[0]
    rc.sim.solver.set_slip_speed(hd.wheel_shapes, 0.05)
    rc.sim.register_parameter("vs", "shape_slip", hd.wheel_shapes)
    res = residual_trace(rc.sim, rc.q0, rc.qd0, 10, rc.targets)
    print(f"\nrobot turn {turn}, regularised wheels: max Newton residual {res.max():.1e}")
    assert res.max() < 1e-4
    grads = robot_pose_grads(rc, (0, 1, 2))
    fd = robot_fd(rc, {"kp": rc.scene.robot.kp, "mu_lat": 0.5, "vs": 0.05})
    adj = [robot_adj_rows(rc, g, ["kp", "mu_lat", "vs"]) for g in grads]
    errs = {}
    for i in range(3):
        errs.update(report(f"robot turn {turn}, regularised, L = final {('x', 'y', 'yaw')[i]}",
                           [(f"d{('x', 'y', 'yaw')[i]}/d{k}", adj[i][k], float(fd[k][i])) for k in adj[i]]))
    assert len(errs) == 18
    assert max(errs.values()) <= TOL, errs


# ------------------------------------------------------------------ 5. pendulum, 50 steps
PEND = dict(length=0.5, theta0=0.8, omega0=1.0, h=0.02, T=50, ke=20.0, kd=1.0, target=0.3)


def pendulum(servo: bool) -> tuple[newton.Model, Simulation]:
    """A 1 kg body (origin at its centre of mass) hanging 0.5 m below a revolute joint to the world
    about y at height 1 m; with ``servo`` a position servo ke = 20 N m/rad, kd = 1 N m s/rad."""
    c = PEND
    b = newton.ModelBuilder()
    body = b.add_link(xform=wp.transform((0.0, 0.0, 1.0 - c["length"]), wp.quat_identity()), mass=1.0,
                      inertia=wp.mat33(0.01, 0, 0, 0, 0.01, 0, 0, 0, 0.01))
    kw = dict(target_ke=c["ke"], target_kd=c["kd"], actuator_mode=newton.JointTargetMode.POSITION) if servo else {}
    j = b.add_joint_revolute(-1, body, parent_xform=wp.transform((0.0, 0.0, 1.0), wp.quat_identity()),
                             child_xform=wp.transform((0.0, 0.0, c["length"]), wp.quat_identity()), axis=(0, 1, 0),
                             **kw)
    b.add_articulation([j])
    m = b.finalize(device="cpu")
    sim = Simulation(SolverOstrich(m), c["h"])
    sim.register_parameter("mass", "body_mass", [0])
    if servo:
        sim.register_parameter("ke", "joint_ke", [0])
    return m, sim


def pendulum_state(m: newton.Model, theta: float, omega: float) -> tuple[np.ndarray, np.ndarray]:
    m.joint_q.assign(np.array([theta], np.float32))
    m.joint_qd.assign(np.array([omega], np.float32))
    s = m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s)
    return s.body_q.numpy(), s.body_qd.numpy()


def test_pendulum_50_steps() -> None:
    """Pendulum from theta0 = 0.8 rad, omega0 = 1 rad/s, 50 steps at h = 0.02 s; L = final centre of
    mass x, z. d/d omega0 (the body twist of omega0 via forward kinematics, which is linear in omega0)
    <= 0.5 %; with inertia scaling with mass and gravity only, the motion is mass independent:
    |dL/dmass| < 1e-5 m/kg for the adjoint and FD alike."""
    c = PEND
    m, sim = pendulum(servo=False)
    q0, qd0 = pendulum_state(m, c["theta0"], c["omega0"])
    direction = qd0 - pendulum_state(m, c["theta0"], 0.0)[1]
    res = residual_trace(sim, q0, qd0, c["T"])
    print("\npendulum: max Newton residual over the steps", f"{res.max():.1e}")

    def final(qd: np.ndarray) -> np.ndarray:
        return sim.forward(q0, qd, c["T"])[0][-1, 0, :3].astype(np.float64)

    fd_w = central(lambda w: final(pendulum_state(m, c["theta0"], w)[1]), c["omega0"])

    def final_mass(mass: float) -> np.ndarray:
        sim.set_parameters({"mass": mass})
        return final(qd0)

    fd_m = central(final_mass, 1.0)
    sim.set_parameters({"mass": 1.0})
    for comp, name in ((0, "x"), (2, "z")):
        g = final_coordinate_grad(sim, q0, qd0, c["T"], comp)
        print(f"  L = final {name}: {gmres_summary(sim)}")
        a_w = float((g.body_qd0 * direction).sum())
        errs = report(f"pendulum, L = final {name}", [(f"d{name}/domega0", a_w, float(fd_w[comp]))])
        assert max(errs.values()) <= TOL, errs
        a_m = float(g.params["mass"])
        print(f"  d{name}/dmass adjoint {a_m:+.2e} FD {fd_m[comp]:+.2e} (both ~0: mass independence)")
        assert abs(a_m) < 1e-5 and abs(fd_m[comp]) < 1e-4


def test_pendulum_servo_50_steps() -> None:
    """The same pendulum with a position servo towards theta = 0.3 rad (ke 20, kd 1): L = final centre
    of mass x, z; d/dmass, d/dke and d/d(constant offset of the position target) <= 0.5 %."""
    c = PEND
    m, sim = pendulum(servo=True)
    q0, qd0 = pendulum_state(m, c["theta0"], c["omega0"])
    tq = np.full((c["T"], m.joint_coord_count), c["target"], np.float32)
    res = residual_trace(sim, q0, qd0, c["T"], targets_q=tq)
    print("\nservo pendulum: max Newton residual over the steps", f"{res.max():.1e}")

    def final(t: np.ndarray) -> np.ndarray:
        return sim.forward(q0, qd0, c["T"], targets_q=t)[0][-1, 0, :3].astype(np.float64)

    fd = {"target": central(lambda v: final(np.full_like(tq, v)), c["target"])}
    for name, val in (("mass", 1.0), ("ke", c["ke"])):
        def f(x: float, name: str = name) -> np.ndarray:
            sim.set_parameters({name: x})
            return final(tq)
        fd[name] = central(f, val)
        sim.set_parameters({name: val})
    for comp, lname in ((0, "x"), (2, "z")):
        g = final_coordinate_grad(sim, q0, qd0, c["T"], comp, targets_q=tq)
        print(f"  L = final {lname}: {gmres_summary(sim)}")
        adj = {"target": float(g.targets_q.sum()), "mass": float(g.params["mass"]), "ke": float(g.params["ke"])}
        errs = report(f"servo pendulum, L = final {lname}",
                      [(f"d{lname}/d{k}", adj[k], float(fd[k][comp])) for k in adj])
        assert max(errs.values()) <= TOL, errs


# ------------------------------------------------------------------ pullback, checkpointing, torch bridge
# the adjoint modes that remain (SolverOptions.adjoint_solver x Simulation pullback); "lu"/"full" is the
# default checked by every test above
MODES = [("gmres", "full"), ("lu", "truncated"), ("gmres", "truncated")]
MODE_IDS = [f"{a}-{b}" for a, b in MODES]


@pytest.mark.parametrize(("solver", "pullback"), MODES, ids=MODE_IDS)
def test_every_mode_box_hit(solver: str, pullback: str) -> None:
    """The landing box (test_box_hitting_ground: lands in step 2, then slides), L = final x, in every
    remaining mode: d x_T / d(z0, vx0, vz0) against central FD <= 0.5 %. The truncated pull-back
    holds the contact geometry (normal, points, lever arms) at each step's converged pose but keeps
    the gap's first-order motion, gap = gap* + n . (dP1 - dP0), so the landing impulse still depends
    on the pre-impact height and speed (it used to freeze the gap, giving dx/dz0 = dx/dvz0 = 0 against
    FD 0.300 / 0.150); on flat ground with a box that does not rotate the geometry has no pose
    dependence to drop, so it equals the full pull-back (asserted to 1e-5 relative)."""
    c = BOX_HIT
    fd = box_hit_fd(*box_hit_sim())
    sim, q0, qd0 = box_hit_sim(pullback=pullback)
    sim.solver.options.adjoint_solver = solver
    g = final_coordinate_grad(sim, q0, qd0, c["T"], 0)
    print(f"\n  mode {solver}/{pullback}: {gmres_summary(sim)}")
    adj = {"z0": g.body_q0[0, 2], "vx0": g.body_qd0[0, 0], "vz0": g.body_qd0[0, 2]}
    errs = report(f"box hitting the ground, {solver}/{pullback}, L = final x",
                  [(f"dx/d{k}", float(adj[k]), float(fd[k][0])) for k in adj])
    assert max(errs.values()) <= TOL, errs
    assert bool(g.converged.all())
    if pullback == "truncated":
        sim_f, _, _ = box_hit_sim()
        gf = final_coordinate_grad(sim_f, q0, qd0, c["T"], 0)
        ref = {"z0": gf.body_q0[0, 2], "vx0": gf.body_qd0[0, 0], "vz0": gf.body_qd0[0, 2]}
        diff = {k: rel_err(float(adj[k]), float(ref[k])) for k in adj}
        print("  truncated vs full, relative:", {k: f"{v:.1e}" for k, v in diff.items()})
        assert max(diff.values()) <= 1e-5, diff


@pytest.mark.parametrize(("solver", "pullback"), MODES, ids=MODE_IDS)
def test_every_mode_sliding_block(solver: str, pullback: str) -> None:
    """The sliding block (test_block_sliding_friction) in every remaining mode: dx_T/dmu and
    dx_T/dv0 against the closed forms -g h^2 T (T+1) / 2 and T h (and central FD) <= 0.5 %."""
    c = SLIDE
    sim, q0, qd0 = slide_sim(pullback=pullback)
    sim.solver.options.adjoint_solver = solver
    g = final_coordinate_grad(sim, q0, qd0, c["T"], 0)
    print(f"\n  mode {solver}/{pullback}: {gmres_summary(sim)}")

    def x_of_mu(mu: float) -> np.ndarray:
        sim.set_parameters({"mu": mu})
        return np.array([float(sim.forward(q0, qd0, c["T"])[0][-1, 0, 0])])

    fd_mu = float(central(x_of_mu, c["mu"])[0])
    closed_mu = -G * c["h"] ** 2 * c["T"] * (c["T"] + 1) / 2
    errs = report(f"sliding block, {solver}/{pullback}, L = final x", [
        ("dx/dmu vs closed form", float(g.params["mu"]), closed_mu), ("dx/dmu vs FD", float(g.params["mu"]), fd_mu),
        ("dx/dv0 vs closed form T h", float(g.body_qd0[0, 0]), c["T"] * c["h"])])
    assert max(errs.values()) <= TOL, errs


TRUNC_ROW_TOL = 0.02  # truncated pull-back on the turn: |adjoint - FD| / (row's largest |FD|)


@pytest.mark.parametrize(("solver", "pullback"), MODES, ids=MODE_IDS)
def test_every_mode_robot_turn(sticking: dict, solver: str, pullback: str) -> None:
    """The sticking robot's gentle turn (test_robot_sticking_contact's scenario and FD) in every
    remaining mode, d(final x, y, yaw)/d(wheel targets, kp, mu_lat).

    Full pull-back (GMRES on the exact operator): the same components as the default are asserted
    <= 0.5 % relative. Truncated pull-back: the wheels' contact geometry is held at each step's
    converged pose, so the derivative drops how the robot's yaw turns the wheels' friction frames
    and lever arms within a step (its purpose: long chaotic horizons, paper §IV-D). What it
    guarantees here, measured 2026-12-03: the y and yaw rows agree with FD to <= 0.09 % of their
    largest component, the x row to 1.3 % (dx/dtarget[left, right]; dx/dmu_lat 1.7e-3 vs FD
    1.27e-3, 0.7 % of the row); asserted: every component within 2 % of its row's largest |FD|."""
    rc0 = sticking["rc"]
    c = STICK
    rc = robot_case(c["T"], c["v"], c["turn"], c["mu_lat"], c["iters"], pullback=pullback)
    rc.sim.solver.options.adjoint_solver = solver
    grads = robot_pose_grads(rc, (0, 1, 2))
    fd = sticking["fd"]
    worst = 0.0
    for i, g in enumerate(grads):
        coord = ("x", "y", "yaw")[i]
        adj = robot_adj_rows(rc0, g, ["kp", "mu_lat"])
        errs = report(f"robot gentle turn, {solver}/{pullback}, L = final {coord}",
                      [(f"d{coord}/d{k}", adj[k], float(fd[k][i])) for k in adj])
        assert np.isfinite(list(adj.values())).all()
        if pullback == "full":
            checked = {k: v for k, v in errs.items() if k not in sticking["limited"] and k != "dy/dtarget[rear]"}
            assert max(checked.values()) <= TOL, checked
        else:
            scale = max(abs(float(fd[k][i])) for k in adj)
            row = {k: abs(adj[k] - float(fd[k][i])) / scale for k in adj}
            worst = max(worst, *row.values())
            print(f"  {coord} row, |truncated - FD| / row scale: " + ", ".join(f"{k} {v:.1e}" for k, v in row.items()))
            assert max(row.values()) <= TRUNC_ROW_TOL, row
    if pullback == "truncated":
        print(f"  truncated pull-back, worst |adjoint - FD| / row scale: {worst:.2e} (bound {TRUNC_ROW_TOL})")


def test_truncated_differs_from_full_where_the_geometry_turns(sticking: dict) -> None:
    """Full vs truncated pull-back on the sticking robot's gentle turn (lu solver, FD from the
    fixture). The truncated pull-back drops only dJ/dq, how the yaw turns the wheels' friction
    frames and lever arms within a step, so the two must differ in the x row, which that rotation
    feeds, and agree elsewhere. (The wheels here are anisotropic, mu 0.8 along / 0.5 across, so the
    frame's orientation matters; with isotropic wheels, as in test_adjoint_per_world's 4-world
    batch, the two agree to the 4 digits printed there.) Measured 2026-12-04: dx/dtarget[left]
    full 6.993e-2 (FD 6.990e-2) vs truncated 7.085e-2, dx/dtarget[right] 6.482e-2 vs 6.396e-2 (1.3 %
    apart each), dx/dmu_lat 1.27e-3 (= FD) vs 1.73e-3; the y and yaw rows within 7e-4 of each
    other. Asserted: the two x-row target components differ by more than 0.5 % (so "truncated" is
    not "full" under another name; on flat ground with a non-rotating box they are equal to 1e-5,
    test_every_mode_box_hit), full is the closer one to FD on each, and every y / yaw component
    agrees to 0.3 %."""
    c = STICK
    rc = robot_case(c["T"], c["v"], c["turn"], c["mu_lat"], c["iters"], pullback="truncated")
    trunc = [robot_adj_rows(rc, g, ["kp", "mu_lat"]) for g in robot_pose_grads(rc, (0, 1, 2))]
    full, fd = sticking["adj"], sticking["fd"]
    rel = [{k: abs(trunc[i][k] - full[i][k]) / abs(full[i][k]) for k in full[i]} for i in range(3)]
    for i, coord in enumerate(("x", "y", "yaw")):
        print(f"  d{coord}/d: " + ", ".join(f"{k} full {full[i][k]:+.4e} truncated {trunc[i][k]:+.4e} "
                                           f"FD {float(fd[k][i]):+.4e} |t - f|/|f| {rel[i][k]:.1e}" for k in full[i]))
    for k in ("target[left]", "target[right]"):
        assert rel[0][k] > TOL, (k, rel[0][k])
        assert abs(full[0][k] - float(fd[k][0])) < abs(trunc[0][k] - float(fd[k][0])), k
    assert max(v for r in rel[1:] for v in r.values()) <= 3e-3, rel[1:]


def test_schur_adjoint_removed() -> None:
    """adjoint="schur" (the paper's single Schur solve with the lagged friction weight) is gone: it
    was 1.4-130x off FD under sliding (gentle robot turn dyaw/dmu_lat -16.6 vs FD -0.127, sliding
    block dx/dv0 0.223 vs T h = 0.400). Asking for it names the alternative, at construction and
    when the options are edited afterwards."""
    with pytest.raises(ValueError, match="adjoint='exact'"):
        SolverOptions(adjoint="schur").validate()
    sim, q0, qd0 = slide_sim()
    sim.forward(q0, qd0, 2)
    sim.solver.options.adjoint = "schur"
    with pytest.raises(ValueError, match="removed"):
        sim.backward(None, None)


@pytest.mark.parametrize("solver", ["krylov", "lu"])
def test_checkpointing_bit_identical(solver: str) -> None:
    """checkpoint_every = 5 on the 10-step landing box: gradients bit-identical to the unsegmented tape's with
    the same adjoint solve (the segments recomputed on the device, the same backward steps). memory_bytes():
    the checkpointed tape's records peak at one segment's (5 of 10 steps) in the solver's layout, the kept
    tape's are all 10 steps' cut to the rollout's contacts (4 of 48 slots), under two segments' worth."""
    c = BOX_HIT
    res = {}
    sims = {}
    for k in (None, 5):
        sim, q0, qd0 = box_hit_sim(checkpoint_every=k)
        sim.solver.options.adjoint_solver = solver
        Q, QD = sim.forward(q0, qd0, c["T"])
        gQ = np.zeros_like(Q)
        gQ[-1, 0, 0] = 1.0
        gQ[-1, 0, 2] = 0.5
        gQD = np.zeros_like(QD)
        gQD[-1, 0, 0] = 0.3
        res[k] = (sim.backward(gQ, gQD), sim.memory_bytes(), Q, sim.adjoint_fallbacks)
        sims[k] = sim
    (g0, m0, Q0, f0), (g5, m5, Q5, f5) = res[None], res[5]
    print(f"\ncheckpointing ({solver}): memory_bytes {m0} (none) vs {m5} (every 5 steps)")
    assert np.array_equal(Q0, Q5)
    assert f0 == f5 == 0  # the Krylov solved every step itself
    assert np.array_equal(g0.body_q0, g5.body_q0) and np.array_equal(g0.body_qd0, g5.body_qd0)
    # the per-step solve residual (a health figure) is summed on the device or by numpy: equal to rounding
    np.testing.assert_allclose(g0.adjoint_residual, g5.adjoint_residual, rtol=1e-12, atol=0)
    for k in g0.arrays:
        assert np.array_equal(g0.arrays[k], g5.arrays[k]), k
    kept, ck = sims[None].last_tape, sims[5].last_tape
    segment = sims[5]._rollout.current.record_bytes()  # 5 steps' records, every slot and row
    assert ck.peak_record_bytes == segment and kept.buffers is not None
    assert kept.extent[0] < kept.sim.solver.max_contacts
    assert kept.peak_record_bytes == sum(a.capacity for a in kept.buffers.values()) < 2 * segment
    assert m0 - kept.peak_record_bytes == m5 - segment - sum(  # the rest (parameters, inputs) alike
        a.nbytes + b.nbytes + (sum(x.capacity for x in w) if w else 0) for a, b, w in ck.checkpoints)


def test_checkpointed_krylov_falls_back_to_the_lu() -> None:
    """A Krylov budget too small for some steps (one cycle of one iteration) on the checkpointed landing box:
    the backward runs again with the LU (adjoint_fallbacks counts it once), every step ends below adjoint_tol,
    and the gradients are the checkpointed LU's."""
    c = BOX_HIT
    out = {}
    for solver in ("lu", "krylov"):
        sim, q0, qd0 = box_hit_sim(checkpoint_every=5)
        sim.solver.options.adjoint_solver = solver
        sim.solver.options.adjoint_krylov_iters = 1
        sim.solver.options.adjoint_krylov_cycles = 1
        Q, QD = sim.forward(q0, qd0, c["T"])
        gQ = np.zeros_like(Q)
        gQ[-1, 0, 0] = 1.0
        gQ[-1, 0, 2] = 0.5
        out[solver] = (sim.backward(gQ, None), sim.adjoint_fallbacks)
    (gl, _), (gk, fk) = out["lu"], out["krylov"]
    err = float(np.abs(gk.body_qd0 - gl.body_qd0).max() / np.abs(gl.body_qd0).max())
    print(f"\ncheckpointed Krylov (1 iteration): {fk} fallback to the LU; vs the LU {err:.1e}")
    assert fk == 1 and gk.converged.all()
    assert err == 0.0 and np.array_equal(gk.arrays["shape_mu"], gl.arrays["shape_mu"])


def test_torch_bridge_matches_backward() -> None:
    """rollout() through torch.autograd gives Simulation.backward's gradients (robot, 4 steps)."""
    rc = robot_case(4, 1.0, 0.1, 0.5, 16)
    ch = rc.scene.handles[0].chassis
    theta = torch.tensor([rc.scene.robot.kp, 0.5], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor(rc.targets, requires_grad=True)
    Q, QD = torch_rollout(rc.sim, rc.q0, rc.qd0, targets, theta, names=["kp", "mu_lat"])
    loss = Q[-1, ch, 0] + 2.0 * Q[-1, ch, 1] + 0.5 * QD[-1, ch, 5]
    loss.backward()
    gQ = np.zeros((5, rc.scene.model.body_count, 7), np.float32)
    gQD = np.zeros((5, rc.scene.model.body_count, 6), np.float32)
    gQ[-1, ch, 0], gQ[-1, ch, 1], gQD[-1, ch, 5] = 1.0, 2.0, 0.5
    rc.sim.forward(rc.q0, rc.qd0, 4, rc.targets)
    g = rc.sim.backward(gQ, gQD)
    ref = np.array([g.params["kp"], g.params["mu_lat"]], np.float64)
    print("\ntorch bridge theta grad", theta.grad.numpy(), "backward", ref)
    assert theta.grad is not None and targets.grad is not None
    np.testing.assert_allclose(theta.grad.numpy(), ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(targets.grad.numpy(), g.targets_qd, rtol=1e-6, atol=1e-12)


# ------------------------------------------------------------------ memory
def _live_warp_bytes() -> int:
    """Bytes of memory behind every Warp array alive in the process (device or host), each byte once:
    the union of the arrays' [ptr, ptr + capacity) ranges, so a view (a tape's per-step record is a
    row of a rollout-long buffer) adds nothing beyond the allocation it points into."""
    gc.collect()
    spans = sorted((int(o.ptr), int(o.ptr) + int(o.capacity)) for o in gc.get_objects()
                   if type(o) is wp.array and o.ptr)
    total, end = 0, -1
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def measured_tape_bytes(sim: Simulation, run: Callable[[], object]) -> tuple[object, int]:
    """Memory a forward leaves held, measured: the Warp arrays alive after minus before (a scan of
    the live objects) plus numpy data allocated and still held (tracemalloc, numpy's domain), with
    the previous tape dropped first and the returned trajectories discarded by ``run``."""
    sim.last_tape = None
    gc.collect()
    dom = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    tracemalloc.start()
    try:
        w0, s0 = _live_warp_bytes(), tracemalloc.take_snapshot().filter_traces([dom])
        kept = run()
        w1, s1 = _live_warp_bytes(), tracemalloc.take_snapshot().filter_traces([dom])
    finally:
        tracemalloc.stop()
    np_bytes = sum(st.size_diff for st in s1.compare_to(s0, "filename"))
    return kept, (w1 - w0) + np_bytes


def _memory_run(steps: int, iters: int, checkpoint_every: int | None = None) -> tuple[int, int]:
    """(measured bytes a sliding-box rollout's tape holds after its forward, the tape's own count)."""
    m = box_model(0.4, 0.1, mass=1.0, inertia=0.01, gap=0.1)
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=iters, pcr_iters=iters)), 0.05,
                     checkpoint_every=checkpoint_every)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = 2.0
    q0 = m.body_q.numpy()
    Q, _ = sim.forward(q0, qd0, steps)  # warm-up: lazily built workspaces and recorded launches exist
    gQ = np.zeros_like(Q)
    gQ[-1, 0, 0] = 1.0
    sim.backward(gQ, None)
    tape, held = measured_tape_bytes(sim, lambda: sim.forward(q0, qd0, steps).tape)
    g = tape.backward(gQ, None)
    assert np.isfinite(g.body_qd0).all()
    return held, tape.nbytes() - tape.peak_record_bytes * (checkpoint_every is not None)


def test_memory_backward_pass() -> None:
    """Measured memory a 60-step rollout (sliding box, h = 0.05 s) holds for its backward pass (live
    Warp arrays + numpy data, not the code's own count): the same for newton_iters = pcr_iters = 4,
    16, 64 (to 1 %), linear in the steps (15, 30, 60: per-step bytes within 2 %, the intercept below
    one step), cut with checkpoint_every = 5 (the kept tape's records are cut to the rollout's contacts, the
    checkpoints keep the solver's warm start whole); and Tape.nbytes (memory_bytes) agrees with the
    measurement to 2 %."""
    by_iters = {k: _memory_run(60, k) for k in (4, 16, 64)}
    by_steps = {**{n: _memory_run(n, 16) for n in (15, 30)}, 60: by_iters[16]}
    ck = _memory_run(60, 16, checkpoint_every=5)
    print("\nmeasured bytes held after the forward (tape.nbytes in brackets)")
    print("  60 steps, by iterations:", {k: f"{a} ({b})" for k, (a, b) in by_iters.items()})
    print("  16 iterations, by steps:", {k: f"{a} ({b})" for k, (a, b) in by_steps.items()})
    print(f"  60 steps, checkpoint_every=5: {ck[0]} ({ck[1]})")
    vals = [a for a, _ in by_iters.values()]
    assert max(vals) - min(vals) <= 0.01 * max(vals), by_iters
    per_step = (by_steps[60][0] - by_steps[15][0]) / 45
    for n, (a, _) in by_steps.items():
        assert abs(a - (by_steps[15][0] + per_step * (n - 15))) <= 0.02 * a, by_steps
    assert by_steps[15][0] - 15 * per_step < per_step, by_steps
    assert ck[0] < by_steps[60][0]
    for a, b in [*by_iters.values(), *by_steps.values(), ck]:
        assert abs(a - b) <= 0.02 * a, (a, b)


def test_memory_robot_60_steps() -> None:
    """The same measurement on the robot (4 bodies, 3 servo joints, 48 contact slots) driving over
    flat ground at 1 m/s for 60 steps of 0.1 s: held bytes equal for newton_iters = pcr_iters = 4,
    16, 64, cut with checkpoint_every = 5 (as for the box above), and Tape.nbytes within 2 % of the
    measurement."""
    def run(iters: int, ck: int | None = None) -> tuple[int, int]:
        rc = robot_case(60, 1.0, 0.0, 0.5, iters, checkpoint_every=ck)
        Q, _ = rc.sim.forward(rc.q0, rc.qd0, 60, rc.targets)
        gQ = np.zeros_like(Q)
        gQ[-1, rc.scene.handles[0].chassis, 0] = 1.0
        rc.sim.backward(gQ, None)
        tape, held = measured_tape_bytes(rc.sim, lambda: rc.sim.forward(rc.q0, rc.qd0, 60, rc.targets).tape)
        assert np.isfinite(tape.backward(gQ, None).targets_qd).all()
        return held, tape.nbytes() - tape.peak_record_bytes * (ck is not None)

    by_iters = {k: run(k) for k in (4, 16, 64)}
    ck = run(16, 5)
    print(f"\nrobot, 60 steps, measured bytes held (tape.nbytes): "
          f"{ {k: f'{a} ({b})' for k, (a, b) in by_iters.items()} }; checkpoint_every=5: {ck[0]} ({ck[1]})")
    vals = [a for a, _ in by_iters.values()]
    assert max(vals) - min(vals) <= 0.01 * max(vals), by_iters
    assert ck[0] < by_iters[16][0]
    for a, b in [*by_iters.values(), ck]:
        assert abs(a - b) <= 0.02 * a, (a, b)


class _WarpAllocations:
    """Counts the bytes the CPU device's Warp allocator hands out and takes back while installed
    (every wp.array Warp allocates itself goes through it): ``live`` and its high-water ``peak``."""

    def __init__(self) -> None:
        self.alloc = wp.get_device("cpu").default_allocator
        self.sizes: dict[int, int] = {}
        self.live = self.peak = 0

    def _allocate(self, size: int) -> int:
        ptr = self._orig[0](size)
        self.sizes[ptr] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        return ptr

    def _deallocate(self, ptr: int, size: int) -> None:
        self.live -= self.sizes.pop(ptr, 0)
        self._orig[1](ptr, size)

    def __enter__(self) -> _WarpAllocations:
        self._orig = (self.alloc.allocate, self.alloc.deallocate)
        self.alloc.allocate, self.alloc.deallocate = self._allocate, self._deallocate
        return self

    def __exit__(self, *exc) -> None:
        del self.alloc.allocate, self.alloc.deallocate  # back to the class's methods


def measured_backward_bytes(sim: Simulation, gQ: np.ndarray) -> tuple[int, int]:
    """Working memory of one warm backward of ``sim.last_tape``, measured: (numpy data the backward
    allocates beyond what existed before it, the largest value over the snapshots taken after
    every step's adjoint and at the end, tracemalloc's numpy domain; the high-water mark of the
    Warp arrays it allocates, counted at the allocator). Python's own objects are left out: their
    free lists hold about 15 kB per step of launch bookkeeping, released by the next full gc."""
    dom = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    samples: list[int] = []

    def np_bytes() -> int:
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([dom]).traces)

    # the per-step function of the path this tape takes (device buffers: the replayed one)
    hook = "host_step" if sim.solver.options.adjoint_solver == "gmres" else "device_step"
    step = getattr(sim._adjoint, hook)

    def sampled(*a, **k):
        out = step(*a, **k)
        samples.append(np_bytes())
        return out

    gc.collect()
    setattr(sim._adjoint, hook, sampled)
    tracemalloc.start()
    try:
        before = np_bytes()
        with _WarpAllocations() as wa:
            g = sim.backward(gQ, None)
        samples.append(np_bytes())
    finally:
        tracemalloc.stop()
        delattr(sim._adjoint, hook)
    assert np.isfinite(g.body_qd0).all() and len(samples) == sim.last_tape.steps + 1
    return max(samples) - before, wa.peak


def _trajectory_bytes(tape) -> int:
    """Bytes of a trajectory's step records in the solver's layout (every contact slot and constraint row of
    every step): a kept tape holds them cut to the rollout's contacts, a fraction of this."""
    return sum(int(np.prod(tape.sim._rollout.record_shape(k, a))) * wp.types.type_size_in_bytes(a.dtype)
               for k, a in tape.buffers.items())


def _backward_memory_box(steps: int, iters: int) -> tuple[int, int, int]:
    """(numpy, Warp) working bytes of the sliding box's backward (as in _memory_run) and the bytes of
    its trajectory's step records in the solver's layout (`_trajectory_bytes`)."""
    m = box_model(0.4, 0.1, mass=1.0, inertia=0.01, gap=0.1)
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=iters, pcr_iters=iters)), 0.05)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = 2.0
    q0 = m.body_q.numpy()
    gQ = np.zeros((steps + 1, 1, 7), np.float32)
    gQ[-1, 0, 0] = 1.0
    sim.forward(q0, qd0, steps)
    sim.backward(gQ, None)  # warm-up: the adjoint's workspaces and recorded launches exist
    held = _trajectory_bytes(sim.forward(q0, qd0, steps).tape)
    return (*measured_backward_bytes(sim, gQ), held)


def test_memory_backward_working_set() -> None:
    """What the backward pass itself allocates (not the tape it reads), measured: numpy data above
    its start (sampled after every step's adjoint) and the Warp allocator's high-water mark, for the
    sliding box (h = 0.05 s). Asserted: equal for newton_iters = pcr_iters = 4, 16, 64 at 60 steps
    (to 1 %: the adjoint linearises the converged step, whatever the iterations that found it),
    below 5 % of a trajectory's step records in the solver's layout (the reverse sweep keeps one
    step's adjoint, not a trajectory of step systems), and at most linear in the steps (15, 30, 60: the
    per-step gradient outputs; per-step growth below 1 kB). Measured 2026-12-04: 2160 B numpy + 56 B Warp
    at 60 steps for every iteration count (tape 224 kB), 720 / 1200 / 2160 B at 15 / 30 / 60 steps."""
    by_iters = {k: _backward_memory_box(60, k) for k in (4, 16, 64)}
    by_steps = {15: _backward_memory_box(15, 16), 30: _backward_memory_box(30, 16), 60: by_iters[16]}
    print("\nbackward working set (numpy B, Warp peak B; the trajectory's records in the solver's layout B)")
    print("  60 steps, by iterations:", by_iters)
    print("  16 iterations, by steps:", by_steps)
    tot = [a + b for a, b, _ in by_iters.values()]
    assert max(tot) - min(tot) <= 0.01 * max(tot), by_iters
    for a, b, held in [*by_iters.values(), *by_steps.values()]:
        assert a + b <= 0.05 * held, (a, b, held)
    per_step = (sum(by_steps[60][:2]) - sum(by_steps[15][:2])) / 45
    assert 0 <= per_step < 1024, by_steps
    assert sum(by_steps[30][:2]) <= sum(by_steps[15][:2]) + 15 * per_step * 1.5 + 64, by_steps


def test_memory_backward_working_set_robot() -> None:
    """The same on the robot (4 bodies, 3 servo joints, 60 steps of 0.1 s at 1 m/s): the backward's
    working memory equal for newton_iters = 4, 16, 64 (to 1 %) and below 5 % of a trajectory's step records
    in the solver's layout.
    Measured 2026-12-04: 9328 B numpy + 204 B Warp for every iteration count (tape 246 kB)."""
    out = {}
    for iters in (4, 16, 64):
        rc = robot_case(60, 1.0, 0.0, 0.5, iters)
        gQ = np.zeros((61, rc.scene.model.body_count, 7), np.float32)
        gQ[-1, rc.scene.handles[0].chassis, 0] = 1.0
        rc.sim.forward(rc.q0, rc.qd0, 60, rc.targets)
        rc.sim.backward(gQ, None)
        held = _trajectory_bytes(rc.sim.forward(rc.q0, rc.qd0, 60, rc.targets).tape)
        out[iters] = (*measured_backward_bytes(rc.sim, gQ), held)
    print(f"\nrobot backward working set (numpy B, Warp peak B; the trajectory's records B): {out}")
    tot = [a + b for a, b, _ in out.values()]
    assert max(tot) - min(tot) <= 0.01 * max(tot), out
    for a, b, held in out.values():
        assert a + b <= 0.05 * held, out


# ------------------------------------------------------------------ demo: recover mu by gradient steps
def test_demo_recover_friction() -> None:
    """Recover a sliding block's friction coefficient from its trajectory: truth mu = 0.3, start
    0.7, v0 = 3 m/s, 8 steps of 0.05 s (sliding throughout for mu in [0, 0.75]); loss = sum of squared
    x errors over the trajectory; the gradient from the adjoint; secant (quasi-Newton) steps on
    dL/dmu after one plain gradient step. Must reach |mu - 0.3| < 1e-3 in under 20 iterations."""
    T, truth, mu = SLIDE["T"], 0.3, 0.7
    sim, q0, qd0 = slide_sim(mu=truth, v0=3.0)
    X_true = sim.forward(q0, qd0, T)[0][:, 0, 0].astype(np.float64)

    def loss_grad(mu: float) -> tuple[float, float]:
        sim.set_parameters({"mu": mu})
        Q, _ = sim.forward(q0, qd0, T)
        r = Q[:, 0, 0].astype(np.float64) - X_true
        gQ = np.zeros_like(Q)
        gQ[:, 0, 0] = 2 * r
        return float((r * r).sum()), float(sim.backward(gQ, None).params["mu"])

    hist = []
    L, g = loss_grad(mu)
    prev = None
    for it in range(20):
        hist.append((it, mu, L))
        if abs(mu - truth) < 1e-3 and L < 1e-8:
            break
        if prev is None or g == prev[1]:
            step = -0.05 * float(np.sign(g))  # a first plain (sign) gradient step
        else:
            step = -g * (mu - prev[0]) / (g - prev[1])
        prev = (mu, g)
        mu = float(np.clip(mu + step, 0.05, 0.75))
        L, g = loss_grad(mu)
    print("\ndemo: recover mu (truth 0.3, start 0.7):")
    for it, m_, l_ in hist:
        print(f"  iter {it:2d}  mu {m_:.6f}  loss {l_:.3e}")
    assert abs(mu - truth) < 1e-3 and len(hist) < 20, hist


# ------------------------------------------------------------------ engine findings (regression, xfail)
def test_free_flight_inside_contact_distance_keeps_horizontal_speed() -> None:
    """A cube in free flight whose base is inside the speculative contact distance keeps vx
    exactly (no normal impulse: its friction rows are lam_f = 0, decoupled from u)."""
    m = box_model(0.3, 0.35)
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32)), 0.05)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0] = 2.0
    _, QD = sim.forward(m.body_q.numpy(), qd0, 3)  # falls 0.11 m: still 0.14 m above the ground
    print("\nfree flight vx per step", QD[:, 0, 0])
    assert abs(QD[-1, 0, 0] - 2.0) < 1e-5


def test_landing_into_sticking_converges() -> None:
    """Issue 21.1: a cube (2 kg, half-size 0.1 m, mu 0.5) from z0 = 0.35 m with v0 = (1, 0, -0.5) m/s,
    h = 0.05 s, 32 Newton iterations. Free fall for three steps, then the landing step from the gap
    z3 - 0.1 m: inelastic, z+ = 0.1, so vz+ = (0.1 - z3) / h, with normal impulse
    m (vz+ - vz- + g h); the cone mu m (vz+ - vz- + g h) = 1.90 N s is short of m vx- = 2 N s, so the
    landing step slides on the cone, vx+ = vx- - mu (vz+ - vz- + g h) = 0.048 m/s, and the next step
    sticks (vx = 0). Every step's Newton residual ends below 1e-5 m/s (measured max 8e-7; with the
    former active-set weight the landing step ended at 1.04 m/s)."""
    m = box_model(0.5, 0.35)
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32)), 0.05)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0], qd0[0, 2] = 1.0, -0.5
    res = residual_trace(sim, m.body_q.numpy(), qd0, 12)
    Q, QD = sim.forward(m.body_q.numpy(), qd0, 12)
    print("\nlanding into sticking: Newton residual per step", np.array2string(res, precision=1))
    h, mu = 0.05, 0.5
    z3, vz3 = float(Q[3, 0, 2]), float(QD[3, 0, 2])
    vz4 = (0.1 - z3) / h
    vx4 = 1.0 - mu * (vz4 - vz3 + G * h)
    print(f"landing step: vx {QD[4, 0, 0]:.5f} (closed form {vx4:.5f}), vz {QD[4, 0, 2]:.5f} ({vz4:.5f})")
    assert res.max() < 1e-5
    assert abs(QD[4, 0, 2] - vz4) < 1e-3 and abs(QD[4, 0, 0] - vx4) < 1e-3
    assert np.abs(QD[6:, 0, :3]).max() < 1e-3  # sticks
    before = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32, friction_safeguard="active")), 0.05)
    assert residual_trace(before, m.body_q.numpy(), qd0, 6)[3] > 0.1


def test_landing_into_sticking_gradients() -> None:
    """Issue 21.1: the adjoint through the converged slide -> stick transition of the landing cube
    (test above; 10 steps, L = final x) equals the closed form and central FD. Free fall for three
    steps (z3 = z0 + 3 h vz0 - 6 g h^2, vz3 = vz0 - 3 g h), the landing step slides on the cone,
    vx4 = vx0 - mu (vz4 - vz3 + g h) with vz4 = (0.1 - z3) / h, then the cube sticks, so
    x = x0 + 3 h vx0 + h vx4:
        dx/dvx0 = 4 h = 0.2,  dx/dvz0 = h mu (3 + 1) = 0.1,  dx/dz0 = h mu / h = mu = 0.5.
    (With the former active-set weight the unconverged landing step stuck at once, over the cone:
    adjoint and FD 0.15, 0, 0.)"""
    m = box_model(0.5, 0.35)
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32)), 0.05)
    q0 = m.body_q.numpy()
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0], qd0[0, 2] = 1.0, -0.5
    T, h, mu = 10, 0.05, 0.5
    g = final_coordinate_grad(sim, q0, qd0, T, 0)
    assert max(s[1] for s in sim.adjoint_stats) < 1e-6

    def final_x(q: np.ndarray, qd: np.ndarray) -> float:
        return float(sim.forward(q, qd, T)[0][-1, 0, 0])

    def with_qd(j: int) -> Callable[[float], float]:
        def f(v: float) -> float:
            qd = qd0.copy()
            qd[0, j] = v
            return final_x(q0, qd)
        return f

    def with_z0(v: float) -> float:
        q = q0.copy()
        q[0, 2] = v
        return final_x(q, qd0)

    rows = [("dx/dvx0", float(g.body_qd0[0, 0]), float(central(with_qd(0), 1.0))),
            ("dx/dvz0", float(g.body_qd0[0, 2]), float(central(with_qd(2), -0.5))),
            ("dx/dz0", float(g.body_q0[0, 2]), float(central(with_z0, 0.35)))]
    err = report("landing into sticking: final x", rows)
    closed = {"dx/dvx0": 4 * h, "dx/dvz0": 4 * h * mu, "dx/dz0": mu}
    for label, a, _ in rows:
        assert a == pytest.approx(closed[label], rel=1e-3)
    assert max(err.values()) < TOL


def test_forward_records_every_steps_newton_residual() -> None:
    """`Simulation.forward` keeps each step's returned residual per world (``step_residuals``), the
    same figure `SolverOstrich.status()` gives right after that step (the landing step stands out)."""
    m = box_model(0.5, 0.35)
    # the former active-set weight leaves the landing step unconverged, so it stands out
    sim = Simulation(SolverOstrich(m, SolverOptions(newton_iters=32, friction_safeguard="active")), 0.05)
    qd0 = np.zeros((1, 6), np.float32)
    qd0[0, 0], qd0[0, 2] = 1.0, -0.5
    res = residual_trace(sim, m.body_q.numpy(), qd0, 6)
    assert sim.step_residuals.shape == (6, 1)
    np.testing.assert_array_equal(sim.step_residuals[:, 0], res.astype(np.float32))
    assert sim.step_residuals[3, 0] > 1e-3 > sim.step_residuals[:3, 0].max()


def test_gmres_rejects_non_finite_operator() -> None:
    """A non-finite VJP or preconditioner output raises EngineError (not numpy's LinAlgError)."""
    from sysid.engine import EngineError
    from sysid.engine.krylov import gmres

    b = np.ones(4)
    x, its, rel = gmres(lambda x: 2.0 * x, lambda y: y.copy(), b, 1e-10, 10)
    np.testing.assert_allclose(x, 0.5 * b)
    with pytest.raises(EngineError, match="non-finite"):
        gmres(lambda x: np.full_like(x, np.nan), lambda y: y, b, 1e-10, 10)
    with pytest.raises(EngineError, match="non-finite"):
        gmres(lambda x: 2.0 * x, lambda y: np.full_like(y, np.inf), b, 1e-10, 10)
