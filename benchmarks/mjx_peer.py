"""MJX (MuJoCo in JAX, on CPU) as a peer of bench_control's box task: the same trials, knots, loss and plain
Adam as the SolverSemiImplicit peer (`bench_control.SemiBox` / `run_semi`), the rollout and its gradient in
JAX (`jax.lax.scan` over the steps, `jax.value_and_grad`, `jax.vmap` over the trials, one `jax.jit`).

The model is `sysid.synth.mjcf.robot_mjcf` (the synthetic-data generator's MJCF of this robot: chassis
boxes, three convex tyre meshes, velocity actuators ``left`` / ``right`` / ``rear`` with torque
kv (ctrl - qdot)) with the pallet of the box task, and the identified parameters as `SemiBox` maps them:
kv = kp, every wheel's sliding friction = mu (isotropic: MuJoCo's contact has no lateral coefficient; the
ground and the pallet get mu too, since MuJoCo takes the larger of two geoms' coefficients), chassis_mass;
ctrl = cmd_scale x the knots' linear interpolation at each step's midpoint (SemiBox's targets). Contact:
condim 3 (sliding friction only, like the other engines), MuJoCo's default solref / solimp.

Settings for differentiability (MJX_SETTINGS): reverse mode needs ``opt.iterations == 1`` (MJX's solver
runs its body once instead of a `lax.while_loop`; its line search is a fixed-length scan), with the Newton
solver (MuJoCo's default; one Newton step from the warm start, where one CG step is a gradient step),
``ls_iterations`` 4, the pyramidal friction cone (at one iteration the elliptic cone's robot stalls at the
pallet edge in MuJoCo C: x 0.74 m after 6 s at 1 ms, 0.66 m at 3 ms) and the Euler integrator with
``eulerdamp`` disabled. Why the last: MJX's Euler re-solves the acceleration with M + h diag(damping)
whenever eulerdamp is on, even at zero damping (MuJoCo C skips it then), i.e. it replaces the solver's
one-iteration qacc by the one its constraint force implies, which differs until the solver has converged:
the straight-line probe then diverges at every step tried (NaN, or the chassis metres in the air, at 1, 2,
3 and 4 ms; float64 too). MJX's forward gives MuJoCo C's qacc to print precision from the same state; with
eulerdamp disabled its Euler step is MuJoCo C's. ``implicitfast`` does the same re-solve by construction
(MuJoCo C diverges with it at one iteration too).

The step (`find_stable_dt`): the largest candidate step, from 5 ms down, at which one world driving the box
task's straight-line speed (0.5 m/s x cmd_scale) for 10 s stays finite, keeps the chassis between 0.2 and
1.0 m high, climbs the pallet and ends with every wheel past it, back at the resting height; and at which
the 25 first guesses of a tuning draw of the box task (bench_control: seed 100) all stay finite and on the
ground. Measured 2026-12-05 (`bench_control.py --mjx-find-dt`): 5 ms NaN on the probe; 4 ms passes the
probe (x 3.74 m) but 11 of the 25 first guesses diverge (9 of seed 0's: the reported draw would lose them
to the step, not to the gradient); 3 ms passes both (x 4.03 m, 25/25). MJX_DT = 3 ms: 2,000 steps per 6 s.

Gradient quality. The gradient is the exact derivative of the rollout it differentiates: on a 0.5 s
horizon on flat ground it matches central differences of the loss to ~1e-6 in float64 at h = 1e-6
(tests/app/test_mjx_peer.py). On the 6 s box task it does not describe the loss at any scale: with one
solver iteration the rollout amplifies round-off through the solver's discrete choices (the warm start or
the unconstrained acceleration as its start, contact features), so in float64 the loss of trial 0's first
guess moves by ~0.08 (of 1.14) between knots 1e-10 rad/s apart, central differences in one knot entry at
h = 1e-10 ... 1e-2 are 15 to 2.5e9 times its gradient (0.156), and the gradient itself ranges from -0.30 to
0.88 at knots 1e-10 ... 1e-2 away (bench_control --mjx-fd prints the benchmark's own check).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from sysid.plan.control import ControlTask, LossWeights
from sysid.robot import load_robot
from sysid.synth.mjcf import ContactParams, MjcfOptions, Pallet, robot_mjcf

MJX_SETTINGS: dict[str, Any] = {
    "solver": "Newton",
    "iterations": 1,
    "ls_iterations": 4,
    "cone": "pyramidal",
    "integrator": "Euler",
    "eulerdamp": False,
    "condim": 3,
}
MJX_DT_CANDIDATES = (5e-3, 4e-3, 3e-3, 2.5e-3, 2e-3, 1.5e-3, 1e-3, 5e-4)
MJX_DT = 3e-3  # find_stable_dt's choice (2026-12-05; bench_control --mjx-find-dt, its docstring has the evidence)
MISSING = ("MJX peer skipped: it needs jax and mujoco-mjx (pip install -e '.[mjx]': mujoco-mjx==3.17.0, "
           "jax==0.10.2); import failed: {err}")


def mjx_missing() -> str | None:
    """None when jax and mujoco.mjx import, else a one-line message saying what to install."""
    try:
        import jax  # noqa: F401
        from mujoco import mjx  # noqa: F401
    except ImportError as exc:  # ModuleNotFoundError, or an incompatible mujoco / jax pair
        return MISSING.format(err=exc)
    return None


def box_model(theta: dict, pallet: tuple[float, float, float] | None, dt: float,
              ls_iterations: int = MJX_SETTINGS["ls_iterations"]) -> Any:
    """The MuJoCo model (mujoco.MjModel) of the box task at step ``dt`` with MJX_SETTINGS (module docstring);
    the robot starts at the origin (each trial's start goes into its qpos)."""
    import mujoco

    desc = load_robot()
    mu = float(theta.get("mu", desc.mu))
    params = ContactParams(mu_wheel=mu, mu_rear=mu, mu_ground=mu, mu_pallet=mu, kv=float(theta.get("kp", desc.kp)),
                           condim=MJX_SETTINGS["condim"],
                           chassis_mass=float(theta.get("chassis_mass", desc.chassis_mass)))
    xml = robot_mjcf(params=params, pallet=None if pallet is None else Pallet(*pallet, size=desc.pallet_size),
                     options=MjcfOptions(timestep=dt, integrator="Euler", wheel_shape="tyre"))
    m = mujoco.MjModel.from_xml_string(xml)
    m.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    m.opt.iterations = MJX_SETTINGS["iterations"]
    m.opt.ls_iterations = ls_iterations
    m.opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    m.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    return m


def _put_model(m: Any) -> Any:
    from mujoco import mjx

    with warnings.catch_warnings():  # the tyre's flat side faces (48 vertices): MJX warns, collides them right
        warnings.filterwarnings("ignore", message=".*coplanar face.*")
        return mjx.put_model(m)


def start_qpos(m: Any, start: Sequence[float]) -> np.ndarray:
    """qpos of the model ``m`` with its chassis at start = (x, y, yaw) (resting height and wheels as built)."""
    q = np.array(m.qpos0, float)
    x, y, yaw = (float(v) for v in start)
    q[0], q[1] = x, y
    q[3:7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
    return q


class MjxBox:
    """Box trials in MJX at step ``dt``, one vmapped world per task, with the planner's knots (``knots`` per
    channel = wheel, linear interpolation at each step's midpoint, x cmd_scale) and loss (`LossWeights`:
    terminal position / heading / planar speed of the chassis, tracking of the straight line from start to
    goal sampled every ``sample_dt``, effort and smoothness of the knots), as `bench_control.SemiBox`.
    `loss_and_grad(U)` is one jit-compiled `jax.vmap(jax.value_and_grad(loss))` (compiled at the first
    call: `compile_s`); the step is rematerialised in the backward (`jax.checkpoint`), so memory is one
    carry (qpos, qvel, warm start) per step and world. After each evaluation ``self.final`` holds each
    chassis' (qpos[:7], qvel[:3]) and ``self.path`` its tracking samples (worlds, samples + 1, 2)."""

    def __init__(self, theta: dict, tasks: Sequence[ControlTask], dt: float = MJX_DT, duration: float = 6.0,
                 knots: int = 10, weights: LossWeights | None = None, sample_dt: float = 0.1,
                 ls_iterations: int = MJX_SETTINGS["ls_iterations"]):
        import jax
        import jax.numpy as jnp
        from mujoco import mjx

        desc = load_robot()
        self.tasks = list(tasks)
        pallets = {t.pallet for t in self.tasks}
        if len(pallets) != 1:
            raise ValueError(f"MjxBox: every trial needs the same pallet (one model); got {sorted(map(str, pallets))}")
        self.dt, self.duration, self.knots = dt, duration, knots
        self.weights = w = weights or LossWeights()
        self.C = len(dict.fromkeys(desc.wheel_sides))  # channels: one per wheel side (left, right, centre)
        self.mj = box_model(theta, self.tasks[0].pallet, dt, ls_iterations)
        if self.mj.nu != self.C:
            raise ValueError(f"MjxBox: the model has {self.mj.nu} actuators for {self.C} channels")
        self.mx = mx = _put_model(self.mj)
        self.steps = n = int(round(duration / dt))
        sample = int(round(sample_dt / dt))
        self.samples = T = n // sample
        tau = duration / (knots - 1)
        B = np.zeros((n, knots))  # SemiBox's interpolation: knot weights at each step's midpoint
        for k in range(n):
            s = min((k + 0.5) * dt, duration) / tau
            lo = min(int(s), knots - 2)
            B[k, lo], B[k, lo + 1] = 1.0 - (s - lo), s - lo
        scale = float(theta.get("cmd_scale", 1.0))
        self.q0 = np.stack([start_qpos(self.mj, t.start) for t in self.tasks])
        self.goal = np.array([t.goal for t in self.tasks], float)
        a = np.linspace(0.0, 1.0, T + 1)
        self.ref = np.stack([(1 - a)[:, None] * np.asarray(t.start[:2]) + a[:, None] * np.asarray(t.goal[:2])
                             for t in self.tasks])
        d0 = mjx.make_data(mx)
        self._dtype = f = d0.qpos.dtype  # float32 unless jax_enable_x64
        Bj = jnp.asarray(B, f)
        take = np.arange(sample - 1, T * sample, sample)  # the steps after which sample j = 1..T is taken

        @jax.checkpoint
        def step(carry: tuple, b: Any, U: Any) -> tuple:
            qpos, qvel, warm = carry
            d = d0.replace(qpos=qpos, qvel=qvel, qacc_warmstart=warm, ctrl=scale * (b @ U))
            d = mjx.step(mx, d)
            return (d.qpos, d.qvel, d.qacc_warmstart)

        def loss(U: Any, q0: Any, goal: Any, ref: Any) -> tuple[Any, tuple]:
            def body(carry: tuple, b: Any) -> tuple:
                carry = step(carry, b, U)
                return carry, carry[0][:2]

            init = (q0.astype(f), jnp.zeros(mx.nv, f), jnp.zeros(mx.nv, f))
            xy: Any
            (qpos, qvel, _), xy = jax.lax.scan(body, init, Bj)
            path = xy[take]
            qw, qx, qy, qz = qpos[3], qpos[4], qpos[5], qpos[6]
            yaw = jnp.arctan2(2.0 * (qw * qz + qx * qy), 1.0 - 2.0 * (qy * qy + qz * qz))
            L = (w.position * jnp.sum((qpos[:2] - goal[:2]) ** 2) + w.yaw * 2.0 * (1.0 - jnp.cos(yaw - goal[2]))
                 + w.speed * jnp.sum(qvel[:2] ** 2) + w.track / T * jnp.sum((path - ref[1:]) ** 2)
                 + w.effort * jnp.mean(U**2) + w.smooth * jnp.mean(jnp.diff(U, axis=0) ** 2))
            return L, (qpos[:7], qvel[:3], path)

        self._fn = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))
        self._loss = jax.jit(jax.vmap(loss))
        self._jnp = jnp
        self.compile_s: float | None = None
        self.final: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 7)), np.zeros((0, 3)))
        self.path = np.zeros((0, T + 1, 2))

    def _args(self, U: np.ndarray) -> tuple:
        jnp = self._jnp
        U3 = np.asarray(U, float).reshape(len(self.tasks), self.knots, self.C)
        f = self._dtype
        return jnp.asarray(U3, f), jnp.asarray(self.q0, f), jnp.asarray(self.goal, f), jnp.asarray(self.ref, f)

    def loss_and_grad(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Loss (worlds,) and its gradient (worlds, knots, channels) at knots U (worlds, knots, channels)
        [rad/s]. The first call compiles (its time, compile included, in ``compile_s``)."""
        t0 = time.perf_counter()
        (L, (q, qd, path)), g = self._fn(*self._args(U))
        L = np.asarray(L, float)  # blocks until the result is ready
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - t0
        start = np.asarray(self.q0[:, :2])[:, None]
        self.final = (np.asarray(q, float), np.asarray(qd, float))
        self.path = np.concatenate([start, np.asarray(path, float)], axis=1)
        return L, np.asarray(g, float)

    def loss(self, U: np.ndarray) -> np.ndarray:
        """The loss alone (worlds,): the forward of `loss_and_grad` (its own jit: for finite differences and the
        step search); sets ``final`` as `loss_and_grad` does."""
        L, (q, qd, _) = self._loss(*self._args(U))
        self.final = (np.asarray(q, float), np.asarray(qd, float))
        return np.asarray(L, float)


def probe(theta: dict, dt: float, duration: float = 10.0, pallet: tuple[float, float, float] = (1.5, 0.0, 0.0),
          speed: float = 0.5) -> dict:
    """One world at step ``dt`` from the origin, every wheel commanded the box task's straight-line speed (3 m
    in 6 s: ``speed`` / wheel radius x cmd_scale) for ``duration``: the chassis' height range and final pose,
    and `find_stable_dt`'s verdict: finite, the chassis between 0.2 and 1.0 m high, over the pallet (peak
    height above the resting one + 9 cm; the pallet is 14.4 cm) and past it at the end (every wheel beyond
    its far edge: chassis x > far edge + rear-wheel offset + wheel radius, back at the resting height +- 2 cm)."""
    import jax
    import jax.numpy as jnp
    from mujoco import mjx

    desc = load_robot()
    m = box_model(theta, pallet, dt)
    mx = _put_model(m)
    n = int(round(duration / dt))
    u = speed / desc.wheel_radius * float(theta.get("cmd_scale", 1.0))

    @jax.jit
    def roll(u: Any) -> Any:
        def body(d: Any, _: Any) -> tuple:
            d = mjx.step(mx, d.replace(ctrl=jnp.full(mx.nu, u)))
            return d, d.qpos[:3]

        return jax.lax.scan(body, mjx.make_data(mx), None, length=n)[1]

    t0 = time.perf_counter()
    p = np.asarray(roll(u), float)
    wall = time.perf_counter() - t0
    finite = bool(np.isfinite(p).all())
    x_end, z_end = (float(p[-1, 0]), float(p[-1, 2])) if finite else (math.nan, math.nan)
    z_lo, z_hi = (float(p[:, 2].min()), float(p[:, 2].max())) if finite else (math.nan, math.nan)
    rear = max(-float(np.asarray(pos)[0]) for pos in desc.wheel_positions)
    past = pallet[0] + desc.pallet_size[0] / 2 + rear + desc.wheel_radius
    stable = (finite and 0.2 < z_lo and z_hi < 1.0 and z_hi > desc.base_height + 0.09 and x_end > past
              and abs(z_end - desc.base_height) < 0.02)
    return {"dt": dt, "stable": stable, "finite": finite, "x_final": x_end, "z_final": z_end, "z_min": z_lo,
            "z_max": z_hi, "x_past": past, "wall_s": wall}


def find_stable_dt(theta: dict, candidates: Sequence[float] = MJX_DT_CANDIDATES,
                   trials: tuple[Sequence[ControlTask], np.ndarray] | None = None) -> tuple[float, list[dict]]:
    """Largest candidate step, from large to small, whose `probe` is stable (module docstring) and, given
    ``trials`` = (box tasks, first guesses (trials, knots, channels)), whose forward of every first guess stays
    finite with the chassis between 0.2 and 1.0 m high at the end (bench_control passes a tuning draw's)."""
    tried = []
    for dt in candidates:
        r = probe(theta, dt)
        if r["stable"] and trials is not None:
            tasks, U = trials
            mb = MjxBox(theta, tasks, dt=dt)
            L = mb.loss(U)
            z = mb.final[0][:, 2]
            ok = np.isfinite(L) & np.isfinite(z) & (z > 0.2) & (z < 1.0)
            r["guesses_ok"], r["guesses"] = int(ok.sum()), len(ok)
            r["stable"] = bool(ok.all())
        tried.append(r)
        guesses = f"; first guesses finite and grounded: {r['guesses_ok']}/{r['guesses']}" if "guesses" in r else ""
        print(f"  MJX dt={dt:g}: {'stable' if r['stable'] else 'UNSTABLE'} (x_final {r['x_final']:.3f} m of "
              f"{r['x_past']:.3f}, z {r['z_min']:.3f}..{r['z_max']:.3f} m, final z {r['z_final']:.3f} m; "
              f"{r['wall_s']:.1f} s incl. jit{guesses})", flush=True)
        if r["stable"]:
            return dt, tried
    raise RuntimeError("no stable MJX step among the candidates")


def adam_box(evaluate: Any, U0: np.ndarray, goal: np.ndarray, iterations: int, lr: float, label: str) -> dict:
    """The peers' plain Adam (bench_control.run_semi, run_mjx) over ``evaluate(U) -> (L, g, q_final,
    qd_final)`` per world (constant lr, clipping to +-3/0.36 rad/s, non-finite gradient entries zeroed),
    success = final position error < 0.2 m and terminal planar speed < 0.3 m/s at the first evaluation that
    meets it."""
    trials = len(U0)
    U = np.asarray(U0, float).copy()
    m1, m2 = np.zeros_like(U), np.zeros_like(U)
    best_loss = np.full(trials, math.inf)
    best_pos, best_spd = np.full(trials, math.inf), np.full(trials, math.inf)
    first = np.full(trials, -1)
    times: list[float] = []
    pos_history = []
    for k in range(1, iterations + 1):
        t0 = time.perf_counter()
        L, g, q, qd = evaluate(U)
        times.append(time.perf_counter() - t0)
        g = np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
        pos = np.hypot(q[:, 0] - goal[:, 0], q[:, 1] - goal[:, 1])
        spd = np.hypot(qd[:, 0], qd[:, 1])
        pos_history.append(pos)
        first = np.where((first < 0) & (pos < 0.2) & (spd < 0.3), k - 1, first)
        better = L < best_loss
        best_loss = np.where(better, L, best_loss)
        best_pos, best_spd = np.where(better, pos, best_pos), np.where(better, spd, best_spd)
        m1 = 0.9 * m1 + 0.1 * g
        m2 = 0.999 * m2 + 0.001 * g**2
        U = np.clip(U - lr * (m1 / (1 - 0.9**k)) / (np.sqrt(m2 / (1 - 0.999**k)) + 1e-8), -3 / 0.36, 3 / 0.36)
        print(f"[box] {label} iteration {k}/{iterations}: {int((first >= 0).sum())}/{trials} succeeded, "
              f"median position error {np.median(pos):.3f} m, {times[-1]:.1f} s", flush=True)
    out = [
        {"best_loss": float(best_loss[i]), "position_error": float(best_pos[i]), "terminal_speed": float(best_spd[i]),
         "success": bool(first[i] >= 0), "first_success": int(first[i])}
        for i in range(trials)
    ]
    ok = first[first >= 0]
    return {
        "trials": trials,
        "iterations": iterations,
        "per_trial": out,
        "first_success": first,
        "successes": int((first >= 0).sum()),
        "within_30": int(((first >= 0) & (first < 30)).sum()),
        "median_iterations_to_success": float(np.median(np.where(first >= 0, first, np.inf))) if trials else math.inf,
        "successful_median": float(np.median(ok)) if len(ok) else math.inf,
        "iteration_s": float(np.median(times[1:] or times)),
        "first_iteration_s": times[0] if times else math.nan,
        "median_position_error": np.median(np.asarray(pos_history), axis=1),
    }


def run_mjx(theta: dict, trials: int, iterations: int, U0: np.ndarray, tasks: Sequence[ControlTask],
            dt: float = MJX_DT, lr: float = 0.3) -> dict:
    """The box protocol in MJX: the first ``trials`` trials vmapped, plain Adam per world at constant ``lr``
    from the same first guesses as the other engines (`adam_box`). ``iteration_s``: the median warm
    iteration (the first, which compiles, is excluded; it is ``first_iteration_s``)."""
    mb = MjxBox(theta, list(tasks[:trials]), dt=dt)
    goal = np.array([t.goal[:2] for t in tasks[:trials]])

    def evaluate(U: np.ndarray) -> tuple:
        L, g = mb.loss_and_grad(U)
        return L, g, mb.final[0], mb.final[1]

    out = adam_box(evaluate, np.asarray(U0[:trials], float), goal, iterations, lr, f"MJX dt={dt:g}")
    out["dt"] = dt
    out["compile_s"] = mb.compile_s
    return out


def timing_mjx(theta: dict, tasks: Sequence[ControlTask], U: np.ndarray, dt: float = MJX_DT,
               iterations: int = 2) -> dict:
    """Warm wall time of one MJX forward + backward of the trials ``tasks`` (vmapped) at knots U [s]: the median
    of ``iterations`` calls after the first, which jit-compiles (its time is ``compile_s``, not counted)."""
    mb = MjxBox(theta, list(tasks), dt=dt)
    mb.loss_and_grad(U)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        mb.loss_and_grad(U)
        times.append(time.perf_counter() - t0)
    return {"iteration_s": float(np.median(times)), "compile_s": mb.compile_s, "worlds": len(tasks)}


def fd_check(mb: MjxBox, U: np.ndarray, entries: Sequence[tuple[int, int]], h: float = 1e-2) -> list[dict]:
    """MJX's gradient of the loss of world 0 against central differences of its own loss (step ``h`` rad/s) at
    knot entries (knot, channel): relative error |g - fd| / max(|fd|, 1e-12) per entry. MjxBox holds one
    world (U: (1, knots, channels))."""
    _, g = mb.loss_and_grad(U)
    out = []
    for k, c in entries:
        Up, Um = U.copy(), U.copy()
        Up[0, k, c] += h
        Um[0, k, c] -= h
        fd = float(mb.loss(Up)[0] - mb.loss(Um)[0]) / (2 * h)
        ad = float(g[0, k, c])
        out.append({"knot": k, "channel": c, "grad": ad, "fd": fd, "rel_error": abs(ad - fd) / max(abs(fd), 1e-12)})
    return out


FD_ENTRIES = ((1, 0), (4, 1), (7, 2))  # (knot, channel): early / middle / late knots, one per wheel


def gradient_quality(theta: dict, task: ControlTask, U: np.ndarray, dt: float = MJX_DT,
                     entries: Sequence[tuple[int, int]] = FD_ENTRIES) -> dict:
    """MJX's gradient on one box trial at knots U (knots, channels) against central differences of its own loss:
    in the benchmark's float32 at h = 1e-2 rad/s (the scale of an Adam step: does the gradient predict the loss
    change?) and in float64 at h = 1e-6 (is it the exact local derivative?). Relative errors per entry."""
    import jax

    U1 = np.asarray(U, float)[None]
    out: dict = {"entries": [tuple(e) for e in entries]}
    for key, x64, h in (("float32_h1e-2", False, 1e-2), ("float64_h1e-6", True, 1e-6)):
        with jax.enable_x64(x64):
            out[key] = fd_check(MjxBox(theta, [task], dt=dt), U1, entries, h=h)
    return out
