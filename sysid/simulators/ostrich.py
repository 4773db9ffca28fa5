"""Open-loop replay of robot runs in the Ostrich engine: the ``"ostrich"`` simulator of
`sysid.simulators.protocol`.

Every run becomes one world of a single model (its own pallet, if it has one; worlds never
collide); the logged wheel-velocity setpoints, step-averaged to the timestep, drive the wheels'
implicit velocity servos from the run's first odometry pose; the base pose is sampled at the
run's odometry timestamps. Any robot description (`sysid.robot.scenes.RobotDescription`: robot.yaml or a
URDF with its wheel map): each driven wheel's servo follows the run's wheel column named by one of
its log names (`RobotDescription.log_columns`). Parameters: `sysid.simulators.ostrich_model` (names,
units, ranges and the engine arrays they set).

Nuisance parameters (``NUISANCE``): per-run quantities that are not physics and do not transfer to
other runs, passed per run (``nuisance=[{name: value}, ...]``, one mapping per run, default 0):

    v0            initial forward-velocity error [m/s]     (added to the estimate of the run's initial
                  speed along its heading, over its first ~0.1 s: the odometry's or, with
                  ``initial_speed="wheels"``, the logged wheels')
    w0            initial yaw-rate error [rad/s]            (added to the odometry's initial yaw rate)
    clock_offset  clock offset of the wheel log [s]         (added to cmd_delay for this run only)

In ``rollout_with_jacobian`` a nuisance name among ``names`` gives, for run i, the derivative of
run i's poses with respect to run i's own value (the Jacobian is block-diagonal across runs): all
runs are perturbed at once in one pair of extra world copies per nuisance name.

Initial state: every run starts at its first odometry pose; its forward speed comes from the
odometry's first 0.1 s (``initial_speed="odometry"``, the default) or from the logged wheels' mean
speed over the same window (``"wheels"``: where the odometry's translation lags, sysid.simulators.observation);
the yaw rate always from the odometry; every body at that twist, every wheel rolling.

Sensitivities: ``rollout_with_vjp`` gives exact gradients from the engine's adjoint (one
backward sweep for any loss). ``rollout_with_jacobian`` (for Gauss-Newton) gives d pose / d names
at every odometry sample: with ``jacobian="tangent"`` (the default) from the engine's forward
sensitivities (`Simulation.jvp`: at each converged step the implicit function theorem on the
step's own linearisation, the solve the adjoint uses), exact for the model as simulated and with
no step size; with ``jacobian="fd"`` by central differences, every parameter perturbed up and down
in extra parallel worlds of one batched rollout (2 p extra copies of the worlds). The tangent
needs converged steps (the theorem linearises the step's solution): when a replay step ends above
``UNCONVERGED`` (exact Coulomb friction at stick/slip) that call falls back to central
differences, which differentiate what the replay returns; ``last_status["jacobian"]`` says which.

Threads (``threads``; default: the environment variable ``SYSID_THREADS`` if set, else 2 on a CPU
with at least 2 cores, else 1; on a GPU always 1): a call's worlds (runs x parameter copies) are
cut into that many contiguous parts of at least ``min_part_worlds_replayed`` (4) worlds (where
the engine replays recordings on worker threads, its default; else ``min_part_worlds``,
32), one model and `Simulation` per part; each part runs a sweep twice alone on the calling thread
(kernels load, its steps are recorded there), then the parts' forward, tangent and adjoint sweeps
run on worker threads, replaying (`sysid.engine.run_threads`; warp's CPU calls release the GIL). The
worlds are independent, so every world's trajectory, Jacobian and gradient is the same as in one
model of all of them (bit for bit; tests/fit/test_ostrich_threads.py); a smaller call runs whole, on
the calling thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import warp as wp

from ingest.run import Run
from ingest.timeline import step_grid_average
from sysid.engine import (
    REPLAY_ON_WORKERS,
    ForwardResult,
    Gradients,
    Simulation,
    SolverOptions,
    SolverOstrich,
    TangentResult,
    Tangents,
    resolve_threads,
    run_threads,
    split_ranges,
)
from sysid.errors import SimulatorError
from sysid.robot import load_robot, robot_from_dict
from sysid.robot.scenes import RobotDescription, WorldSpec, build_robot_scene
from sysid.simulators.kinematic import INITIAL_WINDOW, initial_wheel_speeds
from sysid.simulators.observation import odometry_start_rate
from sysid.simulators.ostrich_model import (
    FRICTION_COMBINE,
    PARAMETERS,
    SLIP_ARRAYS,
    STEP_PARAMETERS,
    TARGET_PARAMETERS,
    TRIM_SIGN,
    engine_for_scene,
    engine_parameters,
    merge_world_columns,
    model_dof_world,
    model_parameters,
    pi_position_targets,
    pi_target_cotangent,
    pi_target_scale_derivative,
    pi_target_tangent,
)
from sysid.simulators.protocol import UNCONVERGED

# the model's names (sysid.simulators.ostrich_model) stay importable from here
__all__ = ["FRICTION_COMBINE", "INITIAL_SPEED", "NUISANCE", "NUISANCE_FD_STEP", "PARAMETERS", "SLIP_ARRAYS",
           "STEP_PARAMETERS", "TARGET_PARAMETERS", "TRIM_SIGN", "WHEEL_ORDER", "OstrichReplay", "engine_for_scene",
           "engine_parameters", "make_simulator", "pi_position_targets", "pi_target_cotangent"]

WHEEL_ORDER = ("left", "right", "rear")  # the Helhest's wheel columns; any robot: RobotDescription.log_columns
NUISANCE = ("v0", "w0", "clock_offset")
# where a run's (piece's) initial forward speed comes from: the odometry's first INITIAL_WINDOW, or
# the logged wheel speeds over the same window (r times their mean; the odometry's translation can
# trail the wheels, sysid.simulators.observation, while its heading does not: the yaw rate always comes from the
# odometry)
INITIAL_SPEED = ("odometry", "wheels")
NUISANCE_FD_STEP = {"v0": 1e-2, "w0": 1e-2, "clock_offset": 1e-2}  # central-difference steps [SI]


# how `OstrichReplay._sample` interpolated one world's poses: per odometry sample the step k before it and
# the weight a of step k + 1, the chassis body, and the sign that puts step k + 1's quaternion on step k's side
_Interpolation = tuple[np.ndarray, np.ndarray, int, np.ndarray]


@dataclass
class _Batch:
    """A built model for a set of worlds (cached by its pallets)."""

    key: tuple[tuple[float, float, float] | None, ...]  # every world's pallet (x [m], y [m], yaw [rad])
    solver: SolverOstrich
    sim: Simulation
    scene: Any
    primed: bool = False  # its collision pipeline made and launched on the main thread (`OstrichReplay._prime`)
    main_runs: dict[tuple[Any, ...], int] = field(default_factory=dict)  # sweeps run alone (`OstrichReplay._alone`)


@dataclass
class _Worlds:
    """The worlds of a batched call, or a contiguous part of them: world w replays ``runs[w]`` at the
    parameters ``thetas[w]`` with the nuisance values ``nuis[w]``. A call's worlds are copy-major:
    world c * len(runs) + i is run i at the c-th parameter set (`_copies`)."""

    runs: list[Run]
    thetas: list[dict[str, float]]
    nuis: list[dict[str, float]]

    def __len__(self) -> int:
        return len(self.runs)

    def part(self, r: range) -> _Worlds:
        return _Worlds(self.runs[r.start:r.stop], self.thetas[r.start:r.stop], self.nuis[r.start:r.stop])


def _copies(runs: Sequence[Run], thetas: Sequence[dict[str, float]], nuis: Sequence[dict[str, float]]) -> _Worlds:
    """The copy-major worlds of ``runs`` once per theta; ``nuis``: every world's nuisance values."""
    if len(nuis) != len(runs) * len(thetas):
        raise AssertionError(f"{len(nuis)} nuisance mappings for {len(runs)} runs x {len(thetas)} copies")
    return _Worlds(list(runs) * len(thetas), [dict(th) for th in thetas for _ in runs], [dict(nu) for nu in nuis])


@dataclass
class _Setup:
    """A rollout's model and inputs (`OstrichReplay._setup`)."""

    batch: _Batch
    worlds: _Worlds
    steps: int
    q0: np.ndarray
    qd0: np.ndarray
    tq: np.ndarray  # (steps, dofs) wheel targets [rad/s]
    tqp: np.ndarray | None  # (steps, coords) wheel position targets [rad] (PI servos), None: ki 0 everywhere
    step_arrays: dict[str, np.ndarray]  # per-step slip speeds (empty: none scheduled)
    rolling: np.ndarray | None  # (steps, shapes) logged rolling speeds r |w| [m/s] where scheduled


class OstrichReplay:
    """The engine as a `sysid.simulators.protocol.Simulator` (see the module docstring)."""

    parameter_names: tuple[str, ...] = PARAMETERS
    # parameters the engine needs > 0 (`engine_parameters`), checked against a config's bounds before any work
    positive_parameters: tuple[str, ...] = ("kp", "mu", "mu_lateral", "chassis_mass")
    nuisance_names: tuple[str, ...] = NUISANCE
    # the fewest worlds a part of a split call has (`_parts`), where graphs replays recorded steps on worker
    # threads (graphs.REPLAY_ON_WORKERS, the default; `_alone` records them first): from 4 worlds per part
    # a split is faster than one model (docs/results.md, "Worlds split across two threads")
    min_part_worlds_replayed: int = 4
    # the same where worker threads launch every step (REPLAY_ON_WORKERS off): a split pays only where the
    # kernels' work outweighs the launches, from about 32 worlds per part
    min_part_worlds: int = 32

    def __init__(self, robot: Mapping[str, Any] | RobotDescription | None = None, *, newton_iters: int | None = None,
                 pcr_iters: int = 16, extra_iters: int = 0, extra_tol: float = 1e-3, fd_step: float = 1e-2,
                 pullback: str = "full", adjoint: str = "exact", device: str | None = None,
                 jacobian: str = "tangent", initial_speed: str = "odometry", threads: int | None = None,
                 linear_solver: str | None = None, stall_tol: float | None = None, friction_combine: str = "wheel"):
        if robot is None:
            self.desc = load_robot()
        elif isinstance(robot, RobotDescription):
            self.desc = robot
        else:
            self.desc = robot_from_dict(dict(robot))
        self.options = SolverOptions(newton_iters=SolverOptions.newton_iters if newton_iters is None
                                     else int(newton_iters), pcr_iters=int(pcr_iters),
                                     extra_iters=int(extra_iters), extra_tol=float(extra_tol), adjoint=adjoint)
        if linear_solver is not None:  # the Newton step's Schur solve (SolverOptions.linear_solver)
            self.options.linear_solver = linear_solver
        if stall_tol is not None:  # the Newton steps' stop at the float32 floor (SolverOptions.stall_tol; 0: off)
            self.options.stall_tol = float(stall_tol)
        self.options.validate()
        self.fd_step = float(fd_step)
        if jacobian not in ("tangent", "fd"):
            raise ValueError(f"jacobian must be 'tangent' (forward sensitivities of the converged steps) or 'fd' "
                             f"(central differences in extra worlds), got {jacobian!r}")
        self.jacobian = jacobian
        if initial_speed not in INITIAL_SPEED:
            raise ValueError(f"initial_speed must be one of {list(INITIAL_SPEED)} (where a run's initial forward "
                             f"speed comes from), got {initial_speed!r}")
        self.initial_speed = initial_speed
        if friction_combine not in FRICTION_COMBINE:
            raise ValueError(f"friction_combine must be one of {list(FRICTION_COMBINE)} (how a wheel's friction "
                             f"combines with the surface's: mu_ground, mu_pallet), got {friction_combine!r}")
        # "wheel": the wheels' own coefficients on every surface; otherwise each world gets its own ground
        # plane, so that mu_ground, like mu_pallet, can differ per world (parameter copies of a Jacobian)
        self.friction_combine = friction_combine
        self.pullback = pullback
        self.device = device
        # worker threads a call's worlds are split across (module docstring; EngineError for < 1)
        self.threads = resolve_threads(threads, device)
        self._batches: list[_Batch] = []  # one per part of the last call (`_batch_for`)
        self.last_status: dict[str, Any] = {}

    # ------------------------------------------------------------------ set-up
    def _world_spec(self, run: Run) -> WorldSpec:
        p = getattr(run, "pallet", None)
        return WorldSpec(pallet=None if p is None else (float(p.x), float(p.y), float(p.yaw)))

    def _batch_for(self, specs: list[WorldSpec], slot: int = 0) -> _Batch:
        """The model of part ``slot`` of a call: kept while that part's worlds (their pallets) stay."""
        key = tuple(s.pallet for s in specs)
        if slot < len(self._batches) and self._batches[slot].key == key:
            return self._batches[slot]
        scene = build_robot_scene(specs, self.desc, device=self.device,
                                  ground_per_world=self.friction_combine != "wheel")
        solver, sim = engine_for_scene(scene, self.options, pullback=self.pullback,
                                       friction_combine=self.friction_combine)
        batch = _Batch(key=key, solver=solver, sim=sim, scene=scene)
        if slot < len(self._batches):
            self._batches[slot] = batch
        else:
            self._batches.append(batch)
        return batch

    def _theta(self, theta: Mapping[str, float]) -> dict[str, float]:
        return engine_parameters(self.desc, theta)

    def _nuisance(self, runs: Sequence[Run], nuisance: Sequence[Mapping[str, float]] | None
                  ) -> list[dict[str, float]]:
        """Every run's nuisance values (``NUISANCE``, 0 where not given), checked."""
        if nuisance is None:
            return [dict.fromkeys(NUISANCE, 0.0) for _ in runs]
        if len(nuisance) != len(runs):
            raise SimulatorError(f"nuisance values for {len(nuisance)} runs, but {len(runs)} runs to simulate")
        out = []
        for run, nu in zip(runs, nuisance, strict=True):
            unknown = sorted(set(nu) - set(NUISANCE))
            if unknown:
                raise KeyError(f"unknown nuisance parameter(s) {unknown}; accepted: {list(NUISANCE)}")
            d = dict.fromkeys(NUISANCE, 0.0) | {k: float(v) for k, v in nu.items()}
            bad = [k for k, v in d.items() if not math.isfinite(v)]
            if bad:
                raise ValueError(f"run {getattr(run, 'name', '?')!r}: nuisance {bad} not finite: {d}")
            out.append(d)
        return out

    def _initial_state(self, batch: _Batch, runs: Sequence[Run], nuis: Sequence[Mapping[str, float]]
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Initial body poses and twists of every world: world w replays ``runs[w]`` with the nuisance
        values ``nuis[w]``."""
        model = batch.scene.model
        q = model.body_q.numpy().copy()
        qd = np.zeros((model.body_count, 6), np.float32)
        desc = self.desc
        for w, (run, nu) in enumerate(zip(runs, nuis, strict=True)):
            o = run.odom
            x0, y0 = float(o["x"].iloc[0]), float(o["y"].iloc[0])
            yaw0 = float(o["yaw"].iloc[0])
            # estimate the initial velocity from the first ~0.1 s of odometry
            vx, vy, wz = odometry_start_rate(run, INITIAL_WINDOW)
            vx += nu["v0"] * math.cos(yaw0)
            vy += nu["v0"] * math.sin(yaw0)
            wz += nu["w0"]
            qz = wp.quat_from_axis_angle(wp.vec3(0.0, 0.0, 1.0), yaw0)
            base = wp.transform((x0, y0, desc.base_height), qz)
            handles = batch.scene.handles[w]
            q[handles.chassis] = np.asarray(base, np.float32)
            # every body at the base's estimated velocity and yaw rate, every wheel rolling at the base's
            # forward speed: chosen by cross-validation over the four real runs, the rigid start (each
            # body at v + w x r, each wheel rolling at its own speed) scored worse (leave-one-run-out
            # mean xy 0.562 vs 0.500 m); the joints make the bodies rigid within the first step
            v_fwd = vx * math.cos(yaw0) + vy * math.sin(yaw0)
            if self.initial_speed == "wheels":
                v_fwd = self._wheel_speed(run) + nu["v0"]
                vx, vy = v_fwd * math.cos(yaw0), v_fwd * math.sin(yaw0)
            for wheel, pos in zip(handles.wheels, desc.wheel_positions):
                p = wp.transform_point(base, wp.vec3(*pos))
                q[wheel] = np.asarray(wp.transform(p, qz), np.float32)
                qd[wheel, :3] = (vx, vy, 0.0)
                qd[wheel, 3:] = np.asarray(wp.quat_rotate(qz, wp.vec3(0.0, v_fwd / desc.wheel_radius, 0.0)))
                qd[wheel, 5] += wz
            qd[handles.chassis, :3] = (vx, vy, 0.0)
            qd[handles.chassis, 5] = wz
        return q, qd

    def _wheel_speed(self, run: Run) -> float:
        """The forward speed [m/s] the logged wheels roll at over the run's first INITIAL_WINDOW:
        r times the mean over the wheels of each wheel's mean logged speed (zero-order hold)."""
        cols = self.desc.log_columns(run.wheel_cmd.columns, getattr(run, "name", "run"))
        return float(self.desc.wheel_radius * np.mean(initial_wheel_speeds(run, cols, INITIAL_WINDOW)))

    def _targets(self, batch: _Batch, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float,
                 steps: int, derivative: str | None = None,
                 nuis: Sequence[Mapping[str, float]] | None = None) -> np.ndarray:
        """Wheel targets (steps, dofs) [rad/s] of every world, world w replaying ``runs[w]`` at
        ``thetas[w]``'s trim and delay; with ``derivative`` ("cmd_trim" or "cmd_delay") their
        derivative with respect to it. ``nuis[w]``: world w's nuisance values (its clock_offset adds
        to the delay).

        The logged command u(t) (zero-order hold) is delayed by d = cmd_delay [s] and averaged over
        each step [t_k, t_k + h]; its derivative in d is -(u(t_k + h - d) - u(t_k - d)) / h."""
        model = batch.scene.model
        tq = np.zeros((steps, model.joint_dof_count), np.float32)
        dof = model.joint_qd_start.numpy()
        for w, (run, th) in enumerate(zip(runs, thetas, strict=True)):
            columns = self.desc.log_columns(run.wheel_cmd.columns, getattr(run, "name", "run"))
            trim = th["cmd_trim"]
            delay = th["cmd_delay"] + (nuis[w]["clock_offset"] if nuis is not None else 0.0)
            t0 = float(run.odom["t"].iloc[0])
            tc = run.wheel_cmd["t"].to_numpy(float) + delay
            u = run.wheel_cmd[columns].to_numpy(float)
            if derivative == "cmd_delay":
                edges = t0 + dt * np.arange(steps + 1)
                held = u[np.clip(np.searchsorted(tc, edges, side="right") - 1, 0, len(tc) - 1)]
                vals = -np.diff(held, axis=0) / dt
            else:
                vals = step_grid_average(tc, u, t0, dt, steps)
            for j, col, side in zip(batch.scene.handles[w].wheel_joints, range(len(columns)),
                                    self.desc.wheel_sides, strict=True):
                sign = TRIM_SIGN[side]
                tq[:, dof[j]] = vals[:, col] * (sign if derivative == "cmd_trim" else 1.0 + sign * trim)
        return tq

    def _rolling(self, batch: _Batch, runs: Sequence[Run], dt: float, steps: int) -> np.ndarray:
        """(steps, shapes) rolling speed r |w| [m/s] of every wheel shape at its logged (step-averaged)
        speed w, untrimmed and undelayed, so it depends on no parameter; 0 for other shapes. World w
        replays ``runs[w]``."""
        plain = [{"cmd_trim": 0.0, "cmd_delay": 0.0}] * len(runs)
        tq = self._targets(batch, runs, plain, dt, steps)
        dof = batch.scene.model.joint_qd_start.numpy()
        out = np.zeros((steps, batch.solver.shape_slip.shape[0]), np.float64)
        for h in batch.scene.handles:
            for j, s in zip(h.wheel_joints, h.wheel_shapes, strict=True):
                out[:, s] = self.desc.wheel_radius * np.abs(tq[:, dof[j]])
        return out

    def _slip_schedule(self, batch: _Batch, thetas: Sequence[Mapping[str, float]],
                       rolling: np.ndarray, ratio: str = "slip_ratio") -> np.ndarray:
        """(steps, shapes) slip speed [m/s]: slip_speed + slip_ratio * r |w| for the wheels of every
        world (world w at ``thetas[w]``), the static value for other shapes; ``rolling``: `_rolling`
        of these worlds; ``ratio`` = "slip_ratio_lat": the lateral one, slip_speed_lat +
        slip_ratio_lat * r |w|."""
        array, base = SLIP_ARRAYS[ratio]
        static = getattr(batch.solver, array).numpy().astype(np.float64)
        out = np.repeat(static[None], rolling.shape[0], axis=0)
        for w, h in enumerate(batch.scene.handles):
            th = thetas[w]
            for s in h.wheel_shapes:
                out[:, s] = th[base] + th[ratio] * rolling[:, s]
        return out

    def _steps(self, runs: Sequence[Run], dt: float) -> int:
        if not runs:
            raise SimulatorError("no runs to simulate")
        if not (dt > 0 and math.isfinite(dt)):
            raise SimulatorError(f"timestep dt must be positive, got {dt}")
        return max(1, max(math.ceil((float(r.odom["t"].iloc[-1]) - float(r.odom["t"].iloc[0])) / dt - 1e-9)
                          for r in runs))

    def _sample(self, batch: _Batch, runs: Sequence[Run], Q: np.ndarray, dt: float
                ) -> tuple[list[np.ndarray], list[_Interpolation]]:
        """Chassis pose (T_w, 8) at each world's odometry times (world w replays ``runs[w]``), by
        interpolation between steps."""
        out: list[np.ndarray] = []
        weights: list[_Interpolation] = []
        for w, run in enumerate(runs):
            ch: int = batch.scene.handles[w].chassis
            t = run.odom["t"].to_numpy(float)
            s = (t - t[0]) / dt
            k = np.clip(np.floor(s).astype(int), 0, Q.shape[0] - 2)
            a = np.clip(s - k, 0.0, 1.0)
            p0, p1 = Q[k, ch], Q[k + 1, ch]
            q1 = p1[:, 3:7] * np.sign(np.sum(p0[:, 3:7] * p1[:, 3:7], axis=1, keepdims=True))
            pose = (1 - a)[:, None] * p0 + a[:, None] * np.concatenate([p1[:, :3], q1], axis=1)
            pose[:, 3:7] /= np.linalg.norm(pose[:, 3:7], axis=1, keepdims=True)
            # the world puts the base at base_height above the ground; report z in the run's odometry
            # frame, which starts at the first odometry z
            pose[:, 2] += float(run.odom["z"].iloc[0]) - self.desc.base_height
            out.append(np.concatenate([t[:, None], pose], axis=1))
            weights.append((k, a, ch, np.sign(np.sum(p0[:, 3:7] * p1[:, 3:7], axis=1))))
        return out, weights

    def _parts(self, worlds: int) -> list[range]:
        """The contiguous parts a call's worlds are split into: up to ``threads``, of at least
        ``min_part_worlds_replayed`` (or ``min_part_worlds``) worlds."""
        return split_ranges(worlds, self.threads, min_size=self.min_part_worlds_replayed
                            if REPLAY_ON_WORKERS else self.min_part_worlds)

    def _setups(self, ws: _Worlds, dt: float, schedule: Sequence[str] = ()) -> list[_Setup]:
        """`_setup` of every part of the worlds ``ws`` (`_parts`), on the main thread (scene building is
        Python), all with the call's step count, slip schedule and servo position targets, as one model
        of all worlds has; ``schedule`` may also name ``ki`` (position targets even where every ki is 0)."""
        steps = self._steps(ws.runs, dt)
        pi = "ki" in schedule or any(th["ki"] > 0 for th in ws.thetas)
        schedule = [r for r in SLIP_ARRAYS if r in schedule or any(th[r] for th in ws.thetas)]
        parts = self._parts(len(ws))
        out = [self._setup(ws.part(r), dt, steps, schedule, slot, pi) for slot, r in enumerate(parts)]
        del self._batches[len(parts):]  # no model outlives the call's parts: one call's worth of memory
        if len(out) > 1:
            for st in out:
                self._prime(st.batch)
        return out

    @staticmethod
    def _prime(batch: _Batch) -> None:
        """Make a new model's collision pipeline on the main thread and launch it once, before the model
        steps on a worker thread: newton builds a pipeline's kernels per instance (at the solver's first
        collision), and warp registers a kernel and creates a generic kernel's overload without a lock
        (a concurrent load of the same module can miss it). Contacts are recomputed at every step."""
        if not batch.primed:
            batch.solver.collide(batch.scene.model.state())
            batch.primed = True

    def _setup(self, ws: _Worlds, dt: float, steps: int, schedule: Sequence[str], slot: int = 0,
               pi: bool = False) -> _Setup:
        """The model (part ``slot``'s, `_batch_for`) and the inputs of a batched rollout of the worlds
        ``ws``: parameters set, initial state, wheel targets, slip schedules; ``schedule`` (names of
        STEP_PARAMETERS) sets those slip speeds per step (a ratio above 0 in some world, or its gradient);
        ``pi``: the wheels' position targets too (the integrated targets of PI servos, `_positions`)."""
        batch = self._batch_for([self._world_spec(r) for r in ws.runs], slot)
        batch.sim.dt = float(dt)
        batch.sim.set_parameters({k: np.array([th[k] for th in ws.thetas]) for k in model_parameters(batch.sim)})
        q0, qd0 = self._initial_state(batch, ws.runs, ws.nuis)
        tq = self._targets(batch, ws.runs, ws.thetas, dt, steps, nuis=ws.nuis)
        step_arrays, rolling = {}, None
        ratios = [r for r in SLIP_ARRAYS if r in schedule]
        if ratios:  # the logged rolling speeds, computed once for both directions
            rolling = self._rolling(batch, ws.runs, dt, steps)
            step_arrays = {SLIP_ARRAYS[r][0]: self._slip_schedule(batch, ws.thetas, rolling, r) for r in ratios}
        tqp = self._positions(batch, tq, dt, ws.thetas) if pi else None
        return _Setup(batch, ws, steps, q0, qd0, tq, tqp, step_arrays, rolling)

    @staticmethod
    def _wheel_columns(batch: _Batch, thetas: Sequence[Mapping[str, float]]) -> Iterator[tuple[int, int, float]]:
        """(coordinate, dof, cmd_scale) of every wheel joint of the worlds (world w at ``thetas[w]``)."""
        model = batch.scene.model
        qs, ds = model.joint_q_start.numpy(), model.joint_qd_start.numpy()
        for h, th in zip(batch.scene.handles, thetas, strict=True):
            for j in h.wheel_joints:
                yield int(qs[j]), int(ds[j]), float(th["cmd_scale"])

    def _positions(self, batch: _Batch, tq: np.ndarray, dt: float, thetas: Sequence[Mapping[str, float]],
                   v: np.ndarray | None = None) -> np.ndarray:
        """(steps, coords) position targets [rad] of the wheel joints from their velocity targets ``tq``
        (steps, dofs) (`pi_position_targets`, world w at ``thetas[w]``'s cmd_scale); with a direction ``v``
        (steps, dofs) of ``tq``: their direction instead (`pi_target_tangent`)."""
        out = np.zeros((tq.shape[0], batch.scene.model.joint_coord_count), np.float32)
        for q, d, sc in self._wheel_columns(batch, thetas):
            out[:, q] = (pi_position_targets(tq[:, d], dt, sc) if v is None
                         else pi_target_tangent(v[:, d], tq[:, d], dt, sc))
        return out

    def _scale_positions(self, st: _Setup, dt: float) -> np.ndarray:
        """(steps, coords) d (position targets) / d cmd_scale at fixed s x targets, the part the engine's
        own derivative in s (through s x targets) does not see: each world's in its own columns."""
        out = np.zeros((st.steps, st.batch.scene.model.joint_coord_count), np.float64)
        for q, d, sc in self._wheel_columns(st.batch, st.worlds.thetas):
            out[:, q] = pi_target_scale_derivative(st.tq[:, d], dt, sc)
        return out

    def _record_status(self, res: np.ndarray, steps: int, worlds: int, **extra: Any) -> None:
        """``last_status`` from a rollout's per-step, per-world Newton residuals ``res`` [m/s]."""
        self.last_status = {
            "residual_max": float(np.max(res)) if res.size else 0.0,
            "steps": steps,
            "worlds": worlds,
            # per world (copy-major: world = copy * len(runs) + run): the worst step's residual
            # [m/s] and the share of steps returned above UNCONVERGED [m/s]
            "residual_max_per_world": res.max(axis=0).tolist() if res.size else [],
            "unconverged_per_world": (res > UNCONVERGED).mean(axis=0).tolist() if res.size else [],
            **extra,
        }

    def _warm_key(self, kind: str, st: _Setup, *extra: Any) -> tuple[Any, ...]:
        """`run_threads`' warm key of a sweep: what decides the kernels it launches and their argument
        types (the solver options, the pull-back, the device, the per-step inputs, ``extra``)."""
        return ("ostrich", kind, repr(self.options), self.pullback, str(st.batch.scene.model.device),
                tuple(sorted(st.step_arrays)), st.tqp is not None, repr(extra))

    @staticmethod
    def _alone(kind: str, sts: list[_Setup]) -> list[bool]:
        """The parts of a split sweep to run alone on the calling thread first (`run_threads`' ``alone``).
        Where `graphs` replays recordings on worker threads (``graphs.REPLAY_ON_WORKERS``; recordings
        are made on the main thread only, a sweep's on its second run there), a part's first two runs
        of a sweep, so that its later ones replay on a worker thread; elsewhere none (worker threads
        launch every step: a part run alone would not speed up later calls)."""
        if len(sts) < 2 or not REPLAY_ON_WORKERS:
            return [False] * len(sts)
        out = []
        for st in sts:
            key = (kind, st.steps, tuple(sorted(st.step_arrays)), st.batch.sim.dt)
            n = st.batch.main_runs.get(key, 0)
            out.append(n < 2)
            st.batch.main_runs[key] = n + 1
        return out

    def _forward(self, sts: list[_Setup]) -> list[ForwardResult]:
        """The rollouts of `_setups`' parts, each part on its own worker thread when there are several
        (`run_threads`); their status, every world's in call order, in ``last_status``."""
        def job(st: _Setup) -> Callable[[], ForwardResult]:
            return lambda: st.batch.sim.forward(st.q0, st.qd0, st.steps, st.tq, st.tqp,
                                                step_arrays=st.step_arrays or None)

        outs = run_threads([job(st) for st in sts], self._warm_key("forward", sts[0]), self._alone("forward", sts))
        res = np.concatenate([st.batch.sim.step_residuals for st in sts], axis=1)
        self._record_status(res, sts[0].steps, res.shape[1])
        return outs

    def _run(self, runs: Sequence[Run], thetas: list[dict[str, float]], dt: float,
             schedule: Sequence[str] = (), nuis: Sequence[Mapping[str, float]] | None = None
             ) -> tuple[_Batch, np.ndarray, np.ndarray]:
        """Batched forward rollout of ``runs`` once per theta (copy-major worlds) in ONE model, whatever
        ``threads``: (its batch, body_q, body_qd), for callers that read the model (tests, tools);
        ``nuis``: every world's nuisance values (default 0)."""
        if nuis is None:
            nuis = self._nuisance(runs, None) * len(thetas)
        ws = _copies(runs, thetas, [dict(nu) for nu in nuis])
        schedule = [r for r in SLIP_ARRAYS if r in schedule or any(th[r] for th in ws.thetas)]
        st = self._setup(ws, dt, self._steps(runs, dt), schedule, 0, any(th["ki"] > 0 for th in ws.thetas))
        del self._batches[1:]
        Q, QD = self._forward([st])[0]
        return st.batch, Q, QD

    def _rollout_worlds(self, ws: _Worlds, dt: float) -> list[np.ndarray]:
        """Every world's sampled poses (T_w, 8) (`_sample`), in the order of ``ws``."""
        sts = self._setups(ws, dt)
        outs = self._forward(sts)
        return [p for st, out in zip(sts, outs, strict=True)
                for p in self._sample(st.batch, st.worlds.runs, out.q, dt)[0]]

    # ------------------------------------------------------------------ protocol
    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float,
                nuisance: Sequence[Mapping[str, float]] | None = None) -> list[np.ndarray]:
        return self.rollout_many(runs, [theta], dt, nuisance=nuisance)[0]

    def rollout_many(self, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float,
                     nuisance: Sequence[Mapping[str, float]] | None = None) -> list[list[np.ndarray]]:
        """`sysid.simulators.protocol.BatchSimulator`: every run once per theta as copies of the worlds of one
        batched rollout; ``out[c][i]`` is run i at ``thetas[c]`` (what ``rollout`` returns); the
        runs' ``nuisance`` values are the same in every copy."""
        full = [self._theta(th) for th in thetas]
        nuis = self._nuisance(runs, nuisance) * len(full)
        if not full:
            return []
        poses = self._rollout_worlds(_copies(runs, full, nuis), dt)
        R = len(runs)
        return [poses[c * R:(c + 1) * R] for c in range(len(full))]

    def _check_names(self, names: Sequence[str]) -> None:
        bad = [n for n in names if n not in PARAMETERS + NUISANCE]
        if bad:
            raise KeyError(f"unknown parameter(s) {bad}; accepted: {list(PARAMETERS)}, per run: {list(NUISANCE)}")

    def rollout_with_jacobian(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float,
                              names: Sequence[str], nuisance: Sequence[Mapping[str, float]] | None = None
                              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Poses and, per run, d pose / d names (T, 7, len(names)): forward sensitivities or central
        differences (``self.jacobian``); a nuisance name's column is run i's derivative in its own
        value."""
        base = self._theta(theta)
        self._check_names(names)
        nu0 = self._nuisance(runs, nuisance)
        if self.jacobian == "tangent" and names:
            out = self._tangent_jacobian(runs, base, dt, list(names), nu0)
            if self.last_status["residual_max"] <= UNCONVERGED:
                return out
            # the implicit function theorem needs converged steps: at an unconverged one the tangent is
            # that of a point the replay never returns, central differences follow what it does return
            tangent_status = self.last_status
        else:
            tangent_status = None
        thetas, nuis = [base], list(nu0)
        steps_h = []
        for n in names:
            if n in NUISANCE:  # every run's own value at once: the worlds are independent
                hstep = NUISANCE_FD_STEP[n]
                for sign in (1.0, -1.0):
                    thetas.append(base)
                    nuis += [{**nu, n: nu[n] + sign * hstep} for nu in nu0]
            else:
                hstep = self.fd_step * max(abs(base[n]), 1e-3)
                thetas += [{**base, n: base[n] + hstep}, {**base, n: base[n] - hstep}]
                nuis += nu0 + nu0
            steps_h.append(hstep)
        sampled = self._rollout_worlds(_copies(runs, thetas, nuis), dt)  # copy-major: copy c, run i at c R + i
        R = len(runs)
        poses = sampled[:R]
        jac = []
        for i in range(R):
            J = np.zeros((poses[i].shape[0], 7, len(names)))
            for j, hstep in enumerate(steps_h):
                plus = sampled[(1 + 2 * j) * R + i][:, 1:]
                minus = sampled[(2 + 2 * j) * R + i][:, 1:].copy()
                minus[:, 3:] *= np.sign(np.sum(plus[:, 3:] * minus[:, 3:], axis=1, keepdims=True))
                J[:, :, j] = (plus - minus) / (2 * hstep)
            jac.append(J)
        self.last_status["jacobian"] = "fd"
        if tangent_status is not None:
            worst = tangent_status["residual_max"]
            self.last_status["jacobian"] = f"fd (tangent refused: a step ended at {worst:.2g} m/s > {UNCONVERGED:g})"
        return poses, jac

    def _tangent_jacobian(self, runs: Sequence[Run], base: dict[str, float], dt: float, names: list[str],
                          nu0: list[dict[str, float]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``rollout_with_jacobian`` through `Simulation.jvp`: one direction per name, each world's
        own (the worlds are the runs, so a per-world direction gives run i's column directly); the
        parts' jvps (`_parts`) on worker threads."""
        sts = self._setups(_copies(runs, [base], nu0), dt, [n for n in names if n in STEP_PARAMETERS + ("ki",)])

        def job(st: _Setup, tan: Tangents) -> Callable[[], TangentResult]:
            return lambda: st.batch.sim.jvp(st.q0, st.qd0, st.steps, tan, targets_qd=st.tq, targets_q=st.tqp,
                                            step_arrays=st.step_arrays or None)

        tans = [self._tangent_seeds(st, names, dt) for st in sts]
        t = tans[0]  # the kinds of direction seeded (every part seeds the same)
        seeds = (sorted(t.params), sorted(t.step_arrays), t.targets_qd is not None, t.targets_q is not None,
                 t.body_qd0 is not None)
        results = run_threads([job(st, tan) for st, tan in zip(sts, tans, strict=True)],
                              self._warm_key("jvp", sts[0], seeds), self._alone("jvp", sts))
        res = np.concatenate([r.step_residuals for r in results], axis=1)
        solve = np.concatenate([r.solve_residual for r in results], axis=1)
        self._record_status(res, sts[0].steps, res.shape[1], jacobian="tangent",
                            tangent_solve_residual_max=float(np.max(solve)) if solve.size else 0.0)
        poses, jac = [], []
        for st, r in zip(sts, results, strict=True):
            p, j = self._tangent_poses(st, r, dt)
            poses += p
            jac += j
        return poses, jac

    def _tangent_seeds(self, st: _Setup, names: list[str], dt: float) -> Tangents:
        """The tangent directions of ``names`` for the worlds of ``st``: direction c is name c, each
        world's own value."""
        batch, steps, ws, step_arrays, rolling = st.batch, st.steps, st.worlds, st.step_arrays, st.rolling
        solver, model = batch.solver, batch.scene.model
        W, p = solver.world_count, len(names)
        wheel_shapes = np.zeros(solver.shape_slip.shape[0], np.float32)
        wheel_shapes[[s for h in batch.scene.handles for s in h.wheel_shapes]] = 1.0
        tan = Tangents()
        for c, n in enumerate(names):
            array = next((a for r, (a, b) in SLIP_ARRAYS.items() if n in (r, b)), None)
            if array in step_arrays:  # a scheduled slip speed: its direction lies in the per-step array
                seed = tan.step_arrays.setdefault(array, np.zeros((p, steps, wheel_shapes.size), np.float32))
                seed[c] = rolling if n in STEP_PARAMETERS else wheel_shapes[None, :]
            elif n in STEP_PARAMETERS:
                raise AssertionError(n)  # every named ratio is scheduled above
            elif n in TARGET_PARAMETERS or n == "clock_offset":
                if tan.targets_qd is None:
                    tan.targets_qd = np.zeros((p, steps, model.joint_dof_count), np.float32)
                # a world's clock offset adds to the delay: the same derivative, each world its own
                tan.targets_qd[c] = self._targets(batch, ws.runs, ws.thetas, dt, steps, nuis=ws.nuis,
                                                  derivative="cmd_delay" if n == "clock_offset" else n)
                if st.tqp is not None:  # and the PI servos' position targets, their integral
                    if tan.targets_q is None:
                        tan.targets_q = np.zeros((p, steps, model.joint_coord_count), np.float32)
                    tan.targets_q[c] = self._positions(batch, st.tq, dt, ws.thetas, v=tan.targets_qd[c])
            elif n in ("v0", "w0"):  # the initial twist is affine in them: its exact difference
                if tan.body_qd0 is None:
                    tan.body_qd0 = np.zeros((p, model.body_count, 6), np.float32)
                _, qd1 = self._initial_state(batch, ws.runs, [{**nu, n: nu[n] + 1.0} for nu in ws.nuis])
                tan.body_qd0[c] = qd1 - st.qd0
            elif n in batch.sim.params:
                v = np.zeros((p, W), np.float32)
                v[c] = 1.0
                tan.params[n] = v
                if n == "cmd_scale" and st.tqp is not None:  # the position targets' own dependence on s
                    if tan.targets_q is None:
                        tan.targets_q = np.zeros((p, steps, model.joint_coord_count), np.float32)
                    tan.targets_q[c] = self._scale_positions(st, dt)
            # else: a surface these worlds lack (no pallet): a zero direction
        return tan

    def _tangent_poses(self, st: _Setup, res: TangentResult, dt: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The sampled poses of the worlds of ``st`` and their d pose / d directions (T, 7, p) from a jvp."""
        poses, weights = self._sample(st.batch, st.worlds.runs, res.q, dt)
        jac = []
        for k, a, ch, sgn in weights:
            # pose = (1 - a) Q[k] + a Q[k+1] (quaternion sign-aligned), quaternion normalised
            d = (1 - a)[None, :, None] * res.dq[:, k, ch] + a[None, :, None] * res.dq[:, k + 1, ch] * np.concatenate(
                [np.ones((len(a), 3)), np.repeat(sgn[:, None], 4, axis=1)], axis=1)[None]
            p0, p1 = res.q[k, ch, 3:7], res.q[k + 1, ch, 3:7] * sgn[:, None]
            qt = (1 - a)[:, None] * p0 + a[:, None] * p1
            norm = np.linalg.norm(qt, axis=1)
            qn = qt / norm[:, None]
            dqt = d[:, :, 3:7]
            d[:, :, 3:7] = (dqt - qn[None] * np.sum(qn[None] * dqt, axis=2, keepdims=True)) / norm[None, :, None]
            jac.append(np.transpose(d, (1, 2, 0)).astype(np.float64))  # (T, 7, p)
        return poses, jac

    def rollout_with_vjp(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float,
                         names: Sequence[str], nuisance: Sequence[Mapping[str, float]] | None = None
                         ) -> tuple[list[np.ndarray], Callable[[list[np.ndarray]], np.ndarray]]:
        base = self._theta(theta)
        bad = [n for n in names if n not in PARAMETERS]
        if bad:
            raise KeyError(f"unknown parameter(s) {bad}; accepted: {list(PARAMETERS)} (nuisance parameters "
                           "have no adjoint path: use rollout_with_jacobian)")
        nuis = self._nuisance(runs, nuisance)
        sts = self._setups(_copies(runs, [base], nuis), dt, [n for n in names if n in STEP_PARAMETERS + ("ki",)])
        # each part's tape (ForwardResult.tape): a later rollout on the shared models must not change the vjp
        outs = self._forward(sts)
        poses: list[np.ndarray] = []
        weights = []
        for st, (Q, _) in zip(sts, outs, strict=True):
            p, w = self._sample(st.batch, st.worlds.runs, Q, dt)
            poses += p
            weights.append(w)
        # d slip(t) / d slip_ratio = r |w(t)| per step and wheel (st.rolling): a function of the log alone
        # (scheduled whenever a ratio is among names)
        shape_world = [st.batch.scene.model.shape_world.numpy() for st in sts]
        dof_world = [model_dof_world(st.batch.scene.model) for st in sts]

        def vjp(cotangents: list[np.ndarray]) -> np.ndarray:
            jobs, start = [], 0
            for out, w in zip(outs, weights, strict=True):
                gQ = np.zeros_like(out.q)
                for (k, a, ch, sgn), ct in zip(w, cotangents[start:start + len(w)]):
                    ct = np.asarray(ct, np.float32)
                    # pose = (1 - a) Q[k] + a Q[k+1] (quaternion renormalised: tangent projection is
                    # second order at unit length, so the linear weights carry the cotangent)
                    np.add.at(gQ[:, ch], k, (1 - a)[:, None] * ct)  # gQ[:, ch]: a view (ch an int)
                    ct1 = ct.copy()
                    ct1[:, 3:] *= sgn[:, None]
                    np.add.at(gQ[:, ch], k + 1, a[:, None] * ct1)
                start += len(w)
                jobs.append(lambda tape=out.tape, gQ=gQ: tape.backward(gQ, None))
            grads = run_threads(jobs, self._warm_key("backward", sts[0]), self._alone("backward", sts))
            # every sum runs over the entries of one model of all the worlds, in its order
            # (merge_world_columns), so that it is the same, bit for bit, however the worlds were split
            res = []
            for n in names:
                if n in TARGET_PARAMETERS:  # functions of the targets: chain rule through them
                    terms = [self._target_cotangent(g, st, dt) * self._targets(
                        st.batch, st.worlds.runs, st.worlds.thetas, dt, st.steps, derivative=n, nuis=st.worlds.nuis)
                             for g, st in zip(grads, sts, strict=True)]
                    res.append(float(np.sum(merge_world_columns(terms, dof_world))))
                elif n in STEP_PARAMETERS:
                    terms = [g.step_arrays[SLIP_ARRAYS[n][0]] * st.rolling for g, st in zip(grads, sts, strict=True)]
                    res.append(float(np.sum(merge_world_columns(terms, shape_world))))
                else:  # per-world values: the parts' worlds in order (a surface a part lacks: 0)
                    total = float(np.sum(np.concatenate([np.atleast_1d(g.params.get(n, 0.0)) for g in grads])))
                    if n == "cmd_scale":  # and through the position targets' own dependence on s
                        total += sum(float(np.sum(g.targets_q * self._scale_positions(st, dt)))
                                     for g, st in zip(grads, sts, strict=True) if st.tqp is not None)
                    res.append(total)
            return np.array(res)

        return poses, vjp


    def _target_cotangent(self, g: Gradients, st: _Setup, dt: float) -> np.ndarray:
        """A backward's gradient with respect to the velocity targets, through the position targets too."""
        out: np.ndarray = np.asarray(g.targets_qd)
        if st.tqp is not None and g.targets_q is not None:
            out = out.astype(np.float64)
            for q, d, sc in self._wheel_columns(st.batch, st.worlds.thetas):
                out[:, d] += pi_target_cotangent(g.targets_q[:, q], st.tq[:, d], dt, sc)
        return out


def make_simulator(robot: Mapping[str, Any] | None = None, **options: Any) -> OstrichReplay:
    """Factory registered as ``"ostrich"`` in `sysid.simulators.protocol`."""
    return OstrichReplay(robot, **options)
