"""MJX (MuJoCo in JAX, on CPU) as a peer of bench_control's box and terrain tasks: the same trials (seeds),
knots, loss and optimiser as the SolverSemiImplicit peer (`bench_control.SemiBox`: plain Adam on the box,
`run_semi`; per-world L-BFGS on terrain, `run_semi_terrain`; both loops shared from here: `adam_box`,
`lbfgs_terrain`), the rollout and its gradient in JAX (`jax.lax.scan` over the steps, `jax.value_and_grad`,
`jax.vmap` over the trials, one `jax.jit`).

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
ground. Measured with `bench_control.py --mjx-find-dt`: 5 ms NaN on the probe; 4 ms passes the
probe (x 3.74 m) but 11 of the 25 first guesses diverge (9 of seed 0's: the reported draw would lose them
to the step, not to the gradient); 3 ms passes both (x 4.03 m, 25/25). MJX_DT = 3 ms: 2,000 steps per 6 s.

Terrain (`terrain_model`, `run_mjx_terrain`). Each seed's `sinusoid_terrain` (24 x 24 m, 80 x 80 cells) is a
MuJoCo height field of the same 81 x 81 grid: MuJoCo splits each cell along the same diagonal as the mesh's
two triangles, so the surfaces are the same (tests/app/test_mjx_peer.py casts rays: the grid heights to 1e-6
m, `terrain_height`, bilinear, to within each cell's bilinear-vs-planar gap, < 1 mm). One model, one hfield
size and height range for all seeds (`terrain_z_range`); `jax.vmap` maps only the elevation data
(``hfield_data``), one row per world. Two departures from the box model, both for cost on CPU, measured
on one core (jit-compiled `lax.scan`, one world): (1) the wheels are spheres of the wheel radius,
not the tyre meshes: MJX collides a mesh with a height field as its convex hull against every prism under it
(`hfield_convex`: 5 x 5 cells, 50 prisms per tyre), 142 ms per step for the three tyres against 0.074 ms for
spheres (10 s at 3 ms: ~8 min per forward of one world); and MuJoCo C diverges with the tyres on the height
field at 3 ms (the generator's default kv and mu 0.8 at 1 m/s: NaN after 1.5 s at one solver iteration,
through the ground at 100; stable at 2 ms); (2) the chassis boxes are out of collision: with them (7 boxes
against the prisms) a step costs 2.4 ms instead of 0.09 ms, and in MuJoCo C with them in collision no chassis
box touches the terrain on draw 0's first 8 seeds (their targets, first guesses and the straight line at 1 m/s,
10 s at 3 and at 1 ms; the chassis frame at least 0.356 m above the terrain under it, the boxes reaching 0.095
m below that frame). The step (`find_terrain_dt`, on tuning draw 1's first 8 seeds: the straight line at 1
m/s, the targets and the first guesses, each finite and 0.2-1.0 m above the terrain at every sample for 10 s):
5 ms 0/8 straight lines, 4 ms 3/8 (0/8 first guesses), 3 ms 8/8 of all three: MJX_TERRAIN_DT = 3 ms (the
box's MJX_DT too), 3,333 steps per 10 s, the tracking sampled at the steps nearest to the engine's 125 sample
times (`MjxBox`'s ``nearest_samples``). The gradient on terrain matches central differences of the loss at
h = 1e-6 in float64 on a 0.5 s horizon (relative 2e-7 and 2e-8, the test). Measured (bench_control's
docstring): the first 8 seeds of draw 0 x 30 iterations, median best RMSE 0.673 m, 2/8 below 0.5 m, 4.3 s
per iteration for 8 worlds on one core.

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
from pathlib import Path
from typing import Any

import numpy as np

from sysid.plan.control import ControlTask, LossWeights, lbfgs_worlds
from sysid.robot import load_robot
from sysid.robot.scenes import terrain_height
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
MJX_DT = 3e-3  # find_stable_dt's choice (bench_control --mjx-find-dt; the evidence is in this module's docstring)
MJX_TERRAIN_DT = 3e-3  # find_terrain_dt's choice (bench_control --mjx-terrain-find-dt; docstring)
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


def _configure(m: Any, ls_iterations: int) -> Any:
    """Apply MJX_SETTINGS (module docstring) to the compiled MuJoCo model ``m``; returns it."""
    import mujoco

    m.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    m.opt.iterations = MJX_SETTINGS["iterations"]
    m.opt.ls_iterations = ls_iterations
    m.opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    m.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    return m


def _contact_params(theta: dict) -> ContactParams:
    desc = load_robot()
    mu = float(theta.get("mu", desc.mu))
    return ContactParams(mu_wheel=mu, mu_rear=mu, mu_ground=mu, mu_pallet=mu, kv=float(theta.get("kp", desc.kp)),
                         condim=MJX_SETTINGS["condim"],
                         chassis_mass=float(theta.get("chassis_mass", desc.chassis_mass)))


def box_model(theta: dict, pallet: tuple[float, float, float] | None, dt: float,
              ls_iterations: int = MJX_SETTINGS["ls_iterations"]) -> Any:
    """The MuJoCo model (mujoco.MjModel) of the box task at step ``dt`` with MJX_SETTINGS (module docstring);
    the robot starts at the origin (each trial's start goes into its qpos)."""
    import mujoco

    desc = load_robot()
    xml = robot_mjcf(params=_contact_params(theta),
                     pallet=None if pallet is None else Pallet(*pallet, size=desc.pallet_size),
                     options=MjcfOptions(timestep=dt, integrator="Euler", wheel_shape="tyre"))
    return _configure(mujoco.MjModel.from_xml_string(xml), ls_iterations)


def terrain_z_range(terrains: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """Lowest and highest vertex of the terrains [m]: the height range one hfield spans for all of them (MJX
    vmaps only the elevation data; the hfield's size, scale and position are the model's, shared)."""
    z = np.concatenate([np.asarray(v, float)[:, 2] for v, _ in terrains])
    lo, hi = float(z.min()), float(z.max())
    return lo, max(hi, lo + 1e-3)  # a flat terrain still needs a positive elevation scale


def hfield_data(vertices: np.ndarray, resolution: int, z_range: tuple[float, float]) -> np.ndarray:
    """The elevation data (nrow x ncol, row-major) of a `sinusoid_terrain` grid as MuJoCo's hfield holds it: row
    = y index, column = x index, height = z_range[0] + data x (z_range[1] - z_range[0]). MuJoCo splits each cell
    along the diagonal from (x_i, y_j) to (x_i+1, y_j+1), as sinusoid_terrain's triangles do, so the surfaces
    are the same."""
    n = resolution + 1
    Z = np.asarray(vertices, float)[:, 2].reshape(n, n)  # Z[i, j]: x index i, y index j
    lo, hi = z_range
    return ((Z.T - lo) / (hi - lo)).ravel()


def terrain_model(theta: dict, vertices: np.ndarray, resolution: int, dt: float, z_range: tuple[float, float],
                  ls_iterations: int = MJX_SETTINGS["ls_iterations"]) -> Any:
    """The MuJoCo model of the terrain task at step ``dt`` with MJX_SETTINGS: box_model's robot with the ground
    plane replaced by a height field over the grid of ``vertices`` (a `sinusoid_terrain` of ``resolution``
    cells per side; heights spanning ``z_range``: `terrain_z_range`), the wheels spheres of the wheel radius
    and the chassis boxes out of collision (the module docstring says why: MJX's cost on CPU)."""
    import mujoco

    desc = load_robot()
    xml = robot_mjcf(params=_contact_params(theta),
                     options=MjcfOptions(timestep=dt, integrator="Euler", wheel_shape="ellipsoid"))
    spec = mujoco.MjSpec.from_string(xml)
    v = np.asarray(vertices, float)
    x0, x1, y0, y1 = v[0, 0], v[-1, 0], v[0, 1], v[-1, 1]
    lo, hi = z_range
    n = resolution + 1
    data = hfield_data(v, resolution, z_range)
    # the compiler rescales userdata to [0, 1]: the true data goes in after compiling (below)
    spec.add_hfield(name="terrain", nrow=n, ncol=n, size=[(x1 - x0) / 2, (y1 - y0) / 2, hi - lo, 1.0],
                    userdata=list(data))
    ground = spec.geom("ground")
    ground.type = mujoco.mjtGeom.mjGEOM_HFIELD
    ground.hfieldname = "terrain"
    ground.pos = [(x0 + x1) / 2, (y0 + y1) / 2, lo]
    for g in spec.geoms:
        if g.name.startswith("wheel_"):
            g.type = mujoco.mjtGeom.mjGEOM_SPHERE
            g.size = [desc.wheel_radius, 0.0, 0.0]
        elif g.name != "ground":  # a chassis box
            g.contype = g.conaffinity = 0
    m = spec.compile()
    m.hfield_data[:] = data
    return _configure(m, ls_iterations)


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


def references(tasks: Sequence[ControlTask], T: int) -> np.ndarray:
    """Each task's tracking reference at its T + 1 samples (worlds, T + 1, 2) [m]: its own ``reference`` or the
    straight line from start to goal (the peers' SemiBox and MjxBox)."""
    refs = []
    for t in tasks:
        if t.reference is not None:
            refs.append(np.asarray(t.reference, float)[: T + 1, :2])
        else:
            a = np.linspace(0.0, 1.0, T + 1)
            refs.append((1 - a)[:, None] * np.asarray(t.start[:2]) + a[:, None] * np.asarray(t.goal[:2]))
    return np.stack(refs)


class MjxBox:
    """Planning trials in MJX at step ``dt``, one vmapped world per task: box trials (one pallet for all) or
    terrain seeds (each task's ``terrain``: one hfield model, each world its own elevation data,
    `terrain_model`), with the planner's knots (``knots`` per channel = wheel, linear interpolation at each
    step's midpoint, x cmd_scale) and loss (`LossWeights`: terminal position / heading / planar speed of the
    chassis, tracking of each task's reference (default: the straight line from start to goal) sampled every
    ``sample_dt``, effort and smoothness of the knots), as `bench_control.SemiBox`. `loss_and_grad(U)` is one
    jit-compiled `jax.vmap(jax.value_and_grad(loss))` (compiled at the first call: `compile_s`); the step is
    rematerialised in the backward (`jax.checkpoint`), so memory is one carry (qpos, qvel, warm start) per step
    and world. After each evaluation ``self.final`` holds each chassis' (qpos[:7], qvel[:3]), ``self.path`` its
    tracking samples (worlds, samples + 1, 2) and ``self.height`` the chassis' z there (worlds, samples + 1).
    ``goal`` and ``ref`` are arguments of the compiled function: reassigning them (run_mjx_terrain) does not
    recompile. Samples: every round(sample_dt / dt)-th step, n // that of them (the box runs' rule, which their
    reported figures used; at 3 ms and 0.1 s: every 99 ms); ``nearest_samples``: round(duration / sample_dt) of
    them, at the steps ending nearest to j sample_dt (the terrain runs: the engine's 125 sample times per 10 s,
    each to within dt / 2)."""

    def __init__(self, theta: dict, tasks: Sequence[ControlTask], dt: float = MJX_DT, duration: float = 6.0,
                 knots: int = 10, weights: LossWeights | None = None, sample_dt: float = 0.1,
                 ls_iterations: int = MJX_SETTINGS["ls_iterations"], nearest_samples: bool = False):
        import jax
        import jax.numpy as jnp
        from mujoco import mjx

        desc = load_robot()
        self.tasks = list(tasks)
        pallets = {t.pallet for t in self.tasks}
        if len(pallets) != 1:
            raise ValueError(f"MjxBox: every trial needs the same pallet (one model); got {sorted(map(str, pallets))}")
        terrains = [t.terrain for t in self.tasks]
        self.terrain = terrains[0] is not None
        if self.terrain != all(t is not None for t in terrains) or (self.terrain and pallets != {None}):
            raise ValueError("MjxBox: either every task has its terrain (and no pallet) or none has")
        self.dt, self.duration, self.knots = dt, duration, knots
        self.weights = w = weights or LossWeights()
        self.C = len(dict.fromkeys(desc.wheel_sides))  # channels: one per wheel side (left, right, centre)
        if self.terrain:
            res = {int(t.terrain_resolution or 0) for t in self.tasks}
            if len(res) != 1:
                raise ValueError(f"MjxBox: every terrain needs the same resolution (one hfield); got {sorted(res)}")
            self.resolution = res.pop()
            z_range = terrain_z_range(terrains)
            self.mj = terrain_model(theta, terrains[0][0], self.resolution, dt, z_range, ls_iterations)
            self.hdata = np.stack([hfield_data(v, self.resolution, z_range) for v, _ in terrains])
        else:
            self.mj = box_model(theta, self.tasks[0].pallet, dt, ls_iterations)
            self.hdata = np.zeros((len(self.tasks), 0))
        if self.mj.nu != self.C:
            raise ValueError(f"MjxBox: the model has {self.mj.nu} actuators for {self.C} channels")
        self.mx = mx = _put_model(self.mj)
        self.steps = n = int(round(duration / dt))
        if nearest_samples:  # the steps ending nearest to the engine's sample times j sample_dt
            self.samples = T = int(round(duration / sample_dt))
            take = np.round(np.arange(1, T + 1) * sample_dt / dt).astype(int) - 1
        else:
            sample = int(round(sample_dt / dt))
            self.samples = T = n // sample
            take = np.arange(sample - 1, T * sample, sample)  # the steps after which sample j = 1..T is taken
        tau = duration / (knots - 1)
        B = np.zeros((n, knots))  # SemiBox's interpolation: knot weights at each step's midpoint
        for k in range(n):
            s = min((k + 0.5) * dt, duration) / tau
            lo = min(int(s), knots - 2)
            B[k, lo], B[k, lo + 1] = 1.0 - (s - lo), s - lo
        scale = float(theta.get("cmd_scale", 1.0))
        self.q0 = np.stack([start_qpos(self.mj, t.start) for t in self.tasks])
        if self.terrain:  # a start on terrain rests on its surface (SemiBox, the Planner)
            self.q0[:, 2] += [terrain_height(t.terrain[0], self.resolution, t.start[0], t.start[1])
                              for t in self.tasks]
        self.goal = np.array([t.goal for t in self.tasks], float)
        self.ref = references(self.tasks, T)
        d0 = mjx.make_data(mx)
        self._dtype = f = d0.qpos.dtype  # float32 unless jax_enable_x64
        Bj = jnp.asarray(B, f)
        terrain = self.terrain

        @jax.checkpoint
        def step(carry: tuple, b: Any, U: Any, h: Any) -> tuple:
            qpos, qvel, warm = carry
            d = d0.replace(qpos=qpos, qvel=qvel, qacc_warmstart=warm, ctrl=scale * (b @ U))
            d = mjx.step(mx.replace(hfield_data=h) if terrain else mx, d)
            return (d.qpos, d.qvel, d.qacc_warmstart)

        def loss(U: Any, q0: Any, goal: Any, ref: Any, h: Any) -> tuple[Any, tuple]:
            def body(carry: tuple, b: Any) -> tuple:
                carry = step(carry, b, U, h)
                return carry, carry[0][:3]

            init = (q0.astype(f), jnp.zeros(mx.nv, f), jnp.zeros(mx.nv, f))
            xyz: Any
            (qpos, qvel, _), xyz = jax.lax.scan(body, init, Bj)
            samples = xyz[take]
            path = samples[:, :2]
            qw, qx, qy, qz = qpos[3], qpos[4], qpos[5], qpos[6]
            yaw = jnp.arctan2(2.0 * (qw * qz + qx * qy), 1.0 - 2.0 * (qy * qy + qz * qz))
            L = (w.position * jnp.sum((qpos[:2] - goal[:2]) ** 2) + w.yaw * 2.0 * (1.0 - jnp.cos(yaw - goal[2]))
                 + w.speed * jnp.sum(qvel[:2] ** 2) + w.track / T * jnp.sum((path - ref[1:]) ** 2)
                 + w.effort * jnp.mean(U**2) + w.smooth * jnp.mean(jnp.diff(U, axis=0) ** 2))
            return L, (qpos[:7], qvel[:3], samples)

        self._fn = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))
        self._loss = jax.jit(jax.vmap(loss))
        self._jnp = jnp
        self.compile_s: float | None = None
        self.final: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 7)), np.zeros((0, 3)))
        self.path = np.zeros((0, T + 1, 2))
        self.height = np.zeros((0, T + 1))

    def _args(self, U: np.ndarray) -> tuple:
        jnp = self._jnp
        U3 = np.asarray(U, float).reshape(len(self.tasks), self.knots, self.C)
        f = self._dtype
        return (jnp.asarray(U3, f), jnp.asarray(self.q0, f), jnp.asarray(self.goal, f), jnp.asarray(self.ref, f),
                jnp.asarray(self.hdata, f))

    def _keep(self, q: Any, qd: Any, samples: Any) -> None:
        """Store an evaluation's final state and samples (the start prepended to the samples)."""
        self.final = (np.asarray(q, float), np.asarray(qd, float))
        xyz = np.concatenate([self.q0[:, None, :3], np.asarray(samples, float)], axis=1)
        self.path, self.height = xyz[..., :2], xyz[..., 2]

    def loss_and_grad(self, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Loss (worlds,) and its gradient (worlds, knots, channels) at knots U (worlds, knots, channels)
        [rad/s]. The first call compiles (its time, compile included, in ``compile_s``)."""
        t0 = time.perf_counter()
        (L, (q, qd, samples)), g = self._fn(*self._args(U))
        L = np.asarray(L, float)  # blocks until the result is ready
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - t0
        self._keep(q, qd, samples)
        return L, np.asarray(g, float)

    def loss(self, U: np.ndarray) -> np.ndarray:
        """The loss alone (worlds,): the forward of `loss_and_grad` (its own jit: for finite differences and the
        step search); sets ``final``, ``path`` and ``height`` as `loss_and_grad` does."""
        L, (q, qd, samples) = self._loss(*self._args(U))
        self._keep(q, qd, samples)
        return np.asarray(L, float)

    def clearance(self) -> np.ndarray:
        """The chassis' height above the ground under it at the last evaluation's samples (worlds, samples + 1)
        [m]: ``height`` less the terrain's `terrain_height` (flat ground: 0); NaN where the rollout is."""
        if not self.terrain:
            return self.height.copy()
        return np.array([[h - terrain_height(t.terrain[0], self.resolution, x, y) if np.isfinite((x, y, h)).all()
                          else math.nan for (x, y), h in zip(p, hh)]
                         for t, p, hh in zip(self.tasks, self.path, self.height)])


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


def _save_whole(path: str | Path, **arrays: Any) -> None:
    """np.savez to ``path`` whole or not at all (written beside it, then renamed over it): a run stopped
    mid-write leaves the previous state or journal (`adam_box`, `lbfgs_terrain`)."""
    tmp = Path(f"{path}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def adam_box(evaluate: Any, U0: np.ndarray, goal: np.ndarray, iterations: int, lr: float, label: str,
             state: str | Path | None = None) -> dict:
    """The peers' plain Adam (bench_control.run_semi, run_mjx) over ``evaluate(U) -> (L, g, q_final,
    qd_final)`` per world (constant lr, clipping to +-3/0.36 rad/s, non-finite gradient entries zeroed),
    success = final position error < 0.2 m and terminal planar speed < 0.3 m/s at the first evaluation that
    meets it. ``state``: a .npz file written after every iteration (Adam's moments, the iterate, the figures so
    far); a run given the file of an earlier run with the same first guesses, goals, lr and label continues
    from its last iteration (MJX's box run takes hours on a CPU: it can span sessions)."""
    trials = len(U0)
    U = np.asarray(U0, float).copy()
    m1, m2 = np.zeros_like(U), np.zeros_like(U)
    best_loss = np.full(trials, math.inf)
    best_pos, best_spd = np.full(trials, math.inf), np.full(trials, math.inf)
    first = np.full(trials, -1)
    times: list[float] = []
    pos_history: list[np.ndarray] = []
    start = 1
    ident = np.concatenate([np.asarray(U0, float).ravel(), np.asarray(goal, float).ravel(), [lr]])
    if state is not None and Path(state).exists():
        with np.load(state) as z:
            if str(z["label"]) != label or not np.array_equal(z["ident"], ident):
                raise ValueError(f"{state}: the state of another run (label {str(z['label'])!r}, or other first "
                                 "guesses, goals or lr); give a new file")
            U, m1, m2 = z["U"].copy(), z["m1"].copy(), z["m2"].copy()
            best_loss, best_pos, best_spd, first = (z[k].copy() for k in ("best_loss", "best_pos", "best_spd", "first"))
            times, pos_history = list(z["times"]), list(z["pos_history"])
            start = int(z["k"]) + 1
        print(f"[box] {label}: resuming from {state} after iteration {start - 1}", flush=True)
    for k in range(start, iterations + 1):
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
        if state is not None:
            _save_whole(state, label=label, ident=ident, k=k, U=U, m1=m1, m2=m2, best_loss=best_loss,
                        best_pos=best_pos, best_spd=best_spd, first=first, times=np.asarray(times),
                        pos_history=np.asarray(pos_history))
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
            dt: float = MJX_DT, lr: float = 0.3, state: str | Path | None = None) -> dict:
    """The box protocol in MJX: the first ``trials`` trials vmapped, plain Adam per world at constant ``lr``
    from the same first guesses as the other engines (`adam_box`). ``iteration_s``: the median warm
    iteration (the first, which compiles, is excluded; it is ``first_iteration_s``)."""
    mb = MjxBox(theta, list(tasks[:trials]), dt=dt)
    goal = np.array([t.goal[:2] for t in tasks[:trials]])

    def evaluate(U: np.ndarray) -> tuple:
        L, g = mb.loss_and_grad(U)
        return L, g, mb.final[0], mb.final[1]

    out = adam_box(evaluate, np.asarray(U0[:trials], float), goal, iterations, lr, f"MJX dt={dt:g}", state=state)
    out["dt"] = dt
    out["compile_s"] = mb.compile_s
    return out


def lbfgs_terrain(evaluate: Any, guess: np.ndarray, ref: np.ndarray, iterations: int, lr: float,
                  label: str, journal: str | Path | None = None) -> dict:
    """The terrain peers' optimiser (bench_control.run_semi_terrain, run_mjx_terrain): the planner's per-world
    L-BFGS (`lbfgs_worlds`, first step ``lr`` rad/s RMS, knots within +-3/0.36 rad/s; non-finite gradient
    entries zeroed, as the paper does) from ``guess`` over ``evaluate(U) -> (L, g, path)`` (path: each world's
    tracking samples, start included: (worlds, samples + 1, 2) [m]), ``iterations`` evaluations in all. Figure:
    each world's tracking RMSE against ``ref`` (same shape as path) per evaluation, its best and running best;
    ``iteration_s``: the median evaluation's wall time.

    ``journal``: a .npz file holding every evaluation so far (its knots, loss, gradient, RMSEs and wall time),
    rewritten whole after each. A run given the journal of an earlier run with the same label, first guesses,
    lr and seeds replays its evaluations instead of computing them (L-BFGS is deterministic in them, so it
    asks for the same knots: checked to 1e-9, else refused) and continues from there: SemiImplicit's 50-seed
    terrain run takes hours per 10 iterations on a CPU, so it spans sessions. A reference that differs from
    the journal's by more than 1e-4 m (another CPU, or another split of the worlds across processes, rounding
    the reference rollout differently) is warned about, not refused: the new evaluations then run on this
    run's."""
    rmse: list[np.ndarray] = []
    times: list[float] = []
    log: dict[str, list] = {"U": [], "L": [], "g": [], "rmse": []}
    ident = np.concatenate([np.asarray(guess, float).ravel(), [lr]])
    if journal is not None and Path(journal).exists():
        with np.load(journal) as z:
            if (str(z["label"]) != label or not np.array_equal(z["ident"], ident)
                    or z["ref"].shape != ref.shape):
                raise ValueError(f"{journal}: the journal of another run (label {str(z['label'])!r}, or other first "
                                 "guesses, lr or seeds); give a new file")
            if not np.allclose(z["ref"], ref, rtol=0.0, atol=1e-4, equal_nan=True):
                gap = float(np.nanmax(np.abs(z["ref"] - ref))) if np.isfinite(ref).any() else math.inf
                warnings.warn(f"{journal}: this run's reference rollout differs from the journal's by up to "
                              f"{gap:.3g} m (another CPU, or the worlds split otherwise, rounds the 10 s rollout "
                              "differently); the journal's evaluations are replayed, the new ones use this run's",
                              stacklevel=2)
            log = {k: list(z[k]) for k in log}
            times = list(z["times"])
        print(f"[terrain] {label}: replaying {len(log['U'])} evaluations from {journal}", flush=True)

    def tracked(U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = len(rmse)
        if i < len(log["U"]):
            if not np.allclose(U, log["U"][i], rtol=1e-9, atol=1e-12):
                raise ValueError(f"{journal}: evaluation {i + 1} asks for other knots than the journal's (max "
                                 f"difference {np.abs(U - log['U'][i]).max():.3g} rad/s); give a new file")
            L, g, r = log["L"][i], log["g"][i], log["rmse"][i]
        else:
            t0 = time.perf_counter()
            L, g, path = evaluate(U)
            times.append(time.perf_counter() - t0)
            r = np.sqrt(np.mean(np.sum((path[:, 1:] - ref[:, 1:]) ** 2, axis=2), axis=1))
            for k, v in (("U", U), ("L", L), ("g", g), ("rmse", r)):
                log[k].append(np.array(v, float))
            if journal is not None:
                _save_whole(journal, label=label, ident=ident, ref=ref, times=np.asarray(times),
                            **{k: np.asarray(v) for k, v in log.items()})
        rmse.append(r)
        print(f"[terrain] {label} evaluation {len(rmse)}/{iterations}: median RMSE {np.median(rmse[-1]):.3f} m, "
              f"median running best {np.median(np.min(rmse, axis=0)):.3f} m, {times[i]:.1f} s", flush=True)
        # copies: lbfgs_worlds updates the loss it is given in place, and a replayed one is the journal's
        return np.array(L, float), np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)

    lbfgs_worlds(tracked, np.asarray(guess, float).copy(), iterations, -3 / 0.36, 3 / 0.36, lr)
    R = np.asarray(rmse)
    best = R.min(axis=0)
    return {"seeds": len(best), "iterations": iterations, "initial_rmse": R[0], "best_rmse": best,
            "median_running_best": np.median(np.minimum.accumulate(R, axis=0), axis=1),
            "median_best_rmse": float(np.median(best)), "below_0.5": int((best < 0.5).sum()),
            "iteration_s": float(np.median(times))}


def terrain_tasks(terrains: Sequence[tuple[np.ndarray, np.ndarray]], resolution: int = 80) -> list[ControlTask]:
    """One task per terrain, from the origin (goal and reference set later: run_mjx_terrain)."""
    return [ControlTask(goal=(1.0, 0.0, 0.0), terrain=t, terrain_resolution=resolution) for t in terrains]


def run_mjx_terrain(theta: dict, target: np.ndarray, guess: np.ndarray, terrains: Sequence, iterations: int,
                    weights: LossWeights, dt: float = MJX_TERRAIN_DT, lr: float = 0.3) -> dict:
    """The terrain protocol (bench_control.run_terrain / run_semi_terrain) in MJX at step ``dt``: the seeds
    (``terrains``, the target knots ``target`` and first guesses ``guess`` of `bench_control.terrain_draw`)
    as vmapped worlds, 10 s, 10 knots, tracking sampled every 0.08 s, loss ``weights``; each seed's own
    simulated trajectory of its target knots is its reference (its end the goal), then `lbfgs_terrain`."""
    mb = MjxBox(theta, terrain_tasks(terrains), dt=dt, duration=10.0, knots=10, weights=weights, sample_dt=0.08,
                nearest_samples=True)
    mb.loss_and_grad(target)  # compiles; the target's rollout is the reference
    ref = mb.path.copy()
    q = mb.final[0]
    yaw = np.arctan2(2.0 * (q[:, 3] * q[:, 6] + q[:, 4] * q[:, 5]), 1.0 - 2.0 * (q[:, 5] ** 2 + q[:, 6] ** 2))
    mb.goal = np.stack([ref[:, -1, 0], ref[:, -1, 1], yaw], axis=1)
    mb.ref = ref

    def evaluate(U: np.ndarray) -> tuple:
        L, g = mb.loss_and_grad(U)
        return L, g, mb.path

    out = lbfgs_terrain(evaluate, guess, ref, iterations, lr, f"MJX dt={dt:g}")
    out["dt"] = dt
    out["compile_s"] = mb.compile_s
    out["reference_finite"] = int(np.isfinite(ref).all(axis=(1, 2)).sum())
    return out


def find_terrain_dt(theta: dict, target: np.ndarray, guess: np.ndarray, terrains: Sequence, weights: LossWeights,
                    candidates: Sequence[float] = MJX_DT_CANDIDATES, speed: float = 1.0) -> tuple[float, list[dict]]:
    """Largest candidate step, from large to small, at which every seed of a terrain draw (``terrains``,
    ``target``, ``guess``: bench_control passes tuning draw 1's) stays finite and on the ground over the 10 s
    of the terrain task (the chassis 0.2 to 1.0 m above the terrain under it at every 0.08 s sample) when
    driven by (a) the straight-line first guess: every wheel at ``speed`` [m/s] x cmd_scale (within the draw's
    base speeds, 0.5-1.2 m/s; 1 m/s ends 9.6 m out, on the 24 x 24 m terrain), (b) its target knots, (c) its
    first guess."""
    desc = load_robot()
    tried = []
    for dt in candidates:
        t0 = time.perf_counter()
        mb = MjxBox(theta, terrain_tasks(terrains), dt=dt, duration=10.0, knots=10, weights=weights, sample_dt=0.08,
                    nearest_samples=True)
        r: dict = {"dt": dt}
        for key, U in (("straight", np.full_like(target, speed / desc.wheel_radius)), ("target", target),
                       ("guess", guess)):
            L = mb.loss(U)
            c = mb.clearance()
            ok = np.isfinite(L) & np.isfinite(c).all(axis=1) & (c > 0.2).all(axis=1) & (c < 1.0).all(axis=1)
            r[key] = int(ok.sum())
            r[f"{key}_x_final"] = float(np.median(mb.final[0][:, 0]))
        r["seeds"] = len(terrains)
        r["stable"] = all(r[k] == len(terrains) for k in ("straight", "target", "guess"))
        r["wall_s"] = time.perf_counter() - t0
        tried.append(r)
        print(f"  MJX terrain dt={dt:g}: {'stable' if r['stable'] else 'UNSTABLE'}; finite and on the ground "
              f"(0.2-1.0 m above the terrain) over 10 s, of {len(terrains)} seeds: straight line at {speed:g} m/s "
              f"{r['straight']} (median final x {r['straight_x_final']:.2f} m), targets {r['target']}, first "
              f"guesses {r['guess']}; {r['wall_s']:.0f} s incl. jit", flush=True)
        if r["stable"]:
            return dt, tried
    raise RuntimeError("no stable MJX terrain step among the candidates")


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
