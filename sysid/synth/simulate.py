"""Simulate one planned run in MuJoCo: a simulated operator drives the robot along the path.

The physics runs at ``timestep`` (1 ms by default); the operator and the logged wheel setpoints run at
100 Hz (zero-order hold), as on the real robot. Everything is recorded at the 100 Hz ticks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ingest.transforms import wxyz_to_xyzw, yaw_of
from sysid.errors import optional_import
from sysid.synth.errors import SynthError
from sysid.synth.mjcf import WHEEL_NAMES, ContactParams, MjcfOptions, Pallet, build_mujoco_model, load_robot
from sysid.synth.scenario import Path, RunSpec, ServoParams, plan_path

CONTROL_RATE = 100.0  # [Hz] wheel setpoints and recorded ticks


@dataclass
class Trajectory:
    """Ground truth of a simulated run at the 100 Hz ticks (k = 0..N-1, t = k / 100 s).

    qpos: base pose (x, y, z [m], qw, qx, qy, qz); qvel: base linear velocity (world) [m/s] and
    angular velocity (base frame) [rad/s]; wheel_pos [rad], wheel_vel [rad/s], wheel_torque [N m]
    (left, right, rear); cmd: logged setpoints [rad/s] held from t[k] to t[k+1]; imu_acc [m/s^2],
    imu_gyro [rad/s], imu_quat (w, x, y, z) of the IMU site; lidar_pos [m] and lidar_rot (3x3,
    world from sensor) of the lidar site. ``segments``: name -> (t0, t1) [s]. ``stats``: measured
    figures (climb rise [m], turn efficiency, ...).
    """

    t: np.ndarray
    qpos: np.ndarray
    qvel: np.ndarray
    wheel_pos: np.ndarray
    wheel_vel: np.ndarray
    wheel_torque: np.ndarray
    cmd: np.ndarray
    imu_acc: np.ndarray
    imu_gyro: np.ndarray
    imu_quat: np.ndarray
    lidar_pos: np.ndarray
    lidar_rot: np.ndarray
    segments: dict[str, tuple[float, float]] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def yaw(self) -> np.ndarray:
        w, x, y, z = self.qpos[:, 3], self.qpos[:, 4], self.qpos[:, 5], self.qpos[:, 6]
        yaw: np.ndarray = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        return yaw

    @property
    def duration(self) -> float:
        return float(self.t[-1] - self.t[0])


@dataclass(frozen=True)
class OperatorParams:
    """The simulated driver: pure pursuit with acceleration limits (a joystick, not a planner)."""

    turn_gain: float = 1.6  # [-] skid-steer turns under-respond; the operator over-steers
    max_yaw_rate: float = 1.6  # [rad/s]
    yaw_accel: float = 3.0  # [rad/s^2]
    lookahead_min: float = 0.6  # [m]
    lookahead_per_speed: float = 0.6  # [s]


class _ServoStepper:
    """Apply one 10 ms setpoint through the PI wheel servos (integral part updated every physics step)."""

    def __init__(self, model: Any, data: Any, servo: ServoParams, timestep: float, sub: int) -> None:
        self.model, self.data, self.servo, self.timestep, self.sub = model, data, servo, timestep, sub
        self.dof = [int(model.jnt_dofadr[model.joint(n).id]) for n in WHEEL_NAMES]
        self.act_v = [int(model.actuator(n).id) for n in WHEEL_NAMES]
        self.act_i = [int(model.actuator(n + "_i").id) for n in WHEEL_NAMES]
        self.ilim = servo.integral_limit / servo.ki if servo.ki > 0 else 0.0
        self.integ = [0.0, 0.0, 0.0]

    def step(self, cmd: Any) -> None:
        mujoco = optional_import("mujoco", "synth", "sysid synth (the MuJoCo simulation)")

        data, servo = self.data, self.servo
        u = [servo.cmd_scale * float(c) for c in cmd]
        for a, val in zip(self.act_v, u):
            data.ctrl[a] = val
        for _ in range(self.sub):
            for i in range(3):
                e = self.integ[i] + (u[i] - data.qvel[self.dof[i]]) * self.timestep
                self.integ[i] = min(max(e, -self.ilim), self.ilim)
                data.ctrl[self.act_i[i]] = servo.ki * self.integ[i]
            mujoco.mj_step(self.model, data)



def check_timestep(timestep: float) -> int:
    """MuJoCo steps per control period; a ``SynthError`` unless ``timestep`` divides the 10 ms period."""
    try:
        ok = math.isfinite(timestep) and timestep > 0
    except TypeError:
        ok = False
    if not ok:
        raise SynthError(f"timestep {timestep!r} s must be a positive number dividing the 10 ms control period")
    sub = int(round(1.0 / (CONTROL_RATE * timestep)))
    if sub < 1 or abs(sub * timestep * CONTROL_RATE - 1.0) > 1e-9:
        raise SynthError(f"timestep {timestep} s must divide the 10 ms control period (e.g. 1e-3, 5e-4)")
    return sub

def replay_commands(
    cmd: np.ndarray,
    contact: ContactParams | None = None,
    servo: ServoParams | None = None,
    pallet: Pallet | None = None,
    robot: dict[str, Any] | None = None,
    timestep: float = 1e-3,
    options: MjcfOptions | None = None,
) -> np.ndarray:
    """Open-loop MuJoCo replay of logged 100 Hz wheel setpoints ``cmd`` (N, 3) [rad/s].

    Uses the generator's model and PI servos with the given true parameters (e.g. a manifest run's
    ``true_params`` and ``pallet``); returns the base pose (N, 7) (x, y, z, qw, qx, qy, qz) at each
    setpoint's tick, before it is applied. With a run's exact parameters this reproduces the run.
    """
    mujoco = optional_import("mujoco", "synth", "sysid synth (the MuJoCo simulation)")

    cmd = np.asarray(cmd, dtype=float)
    if cmd.ndim != 2 or cmd.shape[1] != 3 or not np.isfinite(cmd).all():
        raise SynthError(f"cmd must be a finite (N, 3) array of left/right/rear setpoints, got shape {cmd.shape}")
    sub = check_timestep(timestep)
    robot = robot if robot is not None else load_robot()
    opts = dataclasses.replace(options or MjcfOptions(), timestep=timestep)
    model = build_mujoco_model(robot, params=contact, pallet=pallet, options=opts, integral_actuators=True)
    data = mujoco.MjData(model)
    stepper = _ServoStepper(model, data, servo or ServoParams(), timestep, sub)
    out = np.empty((len(cmd), 7))
    for k in range(len(cmd)):
        mujoco.mj_forward(model, data)  # same call sequence as simulate_run: identical numbers
        out[k] = data.qpos[0:7]
        stepper.step(cmd[k])
    return out


def simulate_run(
    spec: RunSpec,
    robot: dict[str, Any] | None = None,
    timestep: float = 1e-3,
    operator: OperatorParams | None = None,
    options: MjcfOptions | None = None,
    progress: Callable[[float], None] | None = None,
) -> Trajectory:
    """Drive the robot of ``robot`` (default `models/helhest/robot.yaml`) along ``spec``'s path.

    ``progress`` is called with the simulated seconds done since the last call. Raises SynthError
    when the robot gets stuck (e.g. friction too low to climb the pallet) or leaves the path.
    """
    mujoco = optional_import("mujoco", "synth", "sysid synth (the MuJoCo simulation)")

    robot = robot if robot is not None else load_robot()
    op = operator or OperatorParams()
    opts = options or MjcfOptions()
    opts = dataclasses.replace(opts, timestep=timestep)
    sub = check_timestep(timestep)
    model = build_mujoco_model(robot, params=spec.contact, pallet=spec.pallet, options=opts, integral_actuators=True)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)

    path: Path = plan_path(spec)
    r = float(robot["wheels"]["radius"])
    track = float(robot.get("skid_steer", {}).get("track_width", 0.72))
    dof = [int(model.jnt_dofadr[model.joint(n).id]) for n in WHEEL_NAMES]
    qadr = [int(model.jnt_qposadr[model.joint(n).id]) for n in WHEEL_NAMES]
    act_v = [int(model.actuator(n).id) for n in WHEEL_NAMES]
    act_i = [int(model.actuator(n + "_i").id) for n in WHEEL_NAMES]
    s_acc = model.sensor("imu_acc").adr[0]
    s_gyr = model.sensor("imu_gyro").adr[0]
    s_quat = model.sensor("imu_quat").adr[0]
    lidar_site = model.site("lidar").id

    stepper = _ServoStepper(model, data, spec.servo, timestep, sub)
    v_cmd = 0.0
    w_cmd = 0.0
    idx = 0  # nearest path index, advanced monotonically
    expected = spec.standstill * 2 + path.length / spec.speed + 2 * spec.speed / spec.accel
    t_max = 2.5 * expected + 15.0
    stop_since: float | None = None
    move_start = spec.standstill

    rec: dict[str, list[Any]] = {k: [] for k in Trajectory.__dataclass_fields__ if k not in ("segments", "stats")}
    s_hist: list[float] = []
    vcmd_hist: list[float] = []
    k = 0
    last_progress = 0.0

    def fail(msg: str) -> SynthError:
        err = SynthError(msg)
        err.partial = {key: np.asarray(val) for key, val in rec.items()}  # type: ignore[attr-defined]
        return err

    while True:
        t = k / CONTROL_RATE
        mujoco.mj_forward(model, data)  # sensors consistent with the state at this tick
        pos = data.qpos[0:3]
        quat = data.qpos[3:7]
        yaw = yaw_of(wxyz_to_xyzw(quat))  # MuJoCo's (w, x, y, z)
        # Nearest path point in a window ahead (the path may cross itself after big turns).
        hi = min(len(path.s), idx + 200)
        d2 = np.sum((path.xy[idx:hi] - pos[:2]) ** 2, axis=1)
        idx = idx + int(np.argmin(d2))
        s_now = float(path.s[idx])
        off_path = math.sqrt(float(d2.min()))
        if off_path > 1.5:
            raise fail(
                f"run {spec.name}: the robot left the planned path by {off_path:.2f} m at t={t:.1f} s; "
                "lower the speed or the heading change, or raise the operator's turn_gain"
            )
        # Operator: speed from the time ramp and the stopping distance; steering by pure pursuit.
        remaining = path.length - s_now
        if t < move_start or stop_since is not None:
            v_target = 0.0
        else:
            v_target = min(
                spec.speed,
                spec.accel * (t - move_start),
                math.sqrt(2 * spec.accel * max(remaining - 0.05, 0)),
            )
        v_cmd = float(np.clip(v_target, v_cmd - spec.accel / CONTROL_RATE, v_cmd + spec.accel / CONTROL_RATE))
        look = max(op.lookahead_min, op.lookahead_per_speed * spec.speed)
        j = min(int(np.searchsorted(path.s, s_now + look)), len(path.s) - 1)
        dx, dy = path.xy[j] - pos[:2]
        alpha = math.atan2(dy, dx) - yaw
        alpha = (alpha + math.pi) % (2 * math.pi) - math.pi
        w_target = op.turn_gain * 2.0 * v_cmd * math.sin(alpha) / max(math.hypot(dx, dy), 1e-3)
        w_target = float(np.clip(w_target, -op.max_yaw_rate, op.max_yaw_rate))
        w_cmd = float(np.clip(w_target, w_cmd - op.yaw_accel / CONTROL_RATE, w_cmd + op.yaw_accel / CONTROL_RATE))
        cmd = [(v_cmd - w_cmd * track / 2) / r, (v_cmd + w_cmd * track / 2) / r, v_cmd / r]
        if stop_since is None and t > move_start + 1.0 and remaining < 0.1 and v_cmd < 0.02:
            stop_since = t

        rec["t"].append(t)
        rec["qpos"].append(data.qpos[0:7].copy())
        rec["qvel"].append(data.qvel[0:6].copy())
        rec["wheel_pos"].append(data.qpos[qadr].copy())
        rec["wheel_vel"].append(data.qvel[dof].copy())
        rec["wheel_torque"].append(data.actuator_force[act_v] + data.actuator_force[act_i])
        rec["cmd"].append(np.array(cmd))
        rec["imu_acc"].append(data.sensordata[s_acc : s_acc + 3].copy())
        rec["imu_gyro"].append(data.sensordata[s_gyr : s_gyr + 3].copy())
        rec["imu_quat"].append(data.sensordata[s_quat : s_quat + 4].copy())
        rec["lidar_pos"].append(data.site_xpos[lidar_site].copy())
        rec["lidar_rot"].append(data.site_xmat[lidar_site].reshape(3, 3).copy())
        s_hist.append(s_now)
        vcmd_hist.append(v_cmd)
        if stop_since is not None and t - stop_since >= spec.standstill:
            break
        if t > t_max:
            raise fail(
                f"run {spec.name}: not finished after {t:.0f} s (planned ~{expected:.0f} s); the robot "
                f"is stuck at s={s_now:.2f} of {path.length:.2f} m (pallet at {path.pallet_near:.2f} m): "
                "raise friction (mu_pallet) or the servo's integral gain"
            )

        stepper.step(cmd)
        if not np.all(np.isfinite(data.qpos)):
            raise SynthError(f"run {spec.name}: the simulation diverged at t={t:.2f} s; use a smaller timestep")
        k += 1
        if progress is not None and t - last_progress >= 1.0:
            progress(t - last_progress)
            last_progress = t
    if progress is not None:
        progress(rec["t"][-1] - last_progress)

    a = {key: np.asarray(val) for key, val in rec.items()}
    traj = Trajectory(
        t=a["t"], qpos=a["qpos"], qvel=a["qvel"], wheel_pos=a["wheel_pos"], wheel_vel=a["wheel_vel"],
        wheel_torque=a["wheel_torque"], cmd=a["cmd"], imu_acc=a["imu_acc"], imu_gyro=a["imu_gyro"],
        imu_quat=a["imu_quat"], lidar_pos=a["lidar_pos"], lidar_rot=a["lidar_rot"],
    )
    traj.segments, traj.stats = _segments(spec, path, traj, np.asarray(s_hist), np.asarray(vcmd_hist), r, track)
    return traj


def _segments(
    spec: RunSpec,
    path: Path,
    traj: Trajectory,
    s: np.ndarray,
    vcmd: np.ndarray,
    radius: float,
    track: float,
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    t = traj.t
    at_speed = np.nonzero(vcmd >= spec.speed - 1e-9)[0]
    if at_speed.size == 0:
        raise SynthError(f"run {spec.name}: the operator never reached {spec.speed} m/s; lengthen the cruise")
    c0 = t[at_speed[0]] + 0.5  # let the servos settle after the ramp
    past = np.nonzero(s >= path.cruise_end)[0]
    c1 = t[past[0]] if past.size else t[-1]
    if c1 - c0 < 0.5:
        raise SynthError(
            f"run {spec.name}: the flat cruise lasts only {c1 - c0:.2f} s; raise cruise_time (now {spec.cruise_time} s)"
        )
    z = traj.qpos[:, 2]
    z0 = float(np.median(z[(t >= c0) & (t <= c1)]))
    up = np.nonzero(z > z0 + 0.01)[0]
    if up.size == 0:
        raise SynthError(
            f"run {spec.name}: the robot never climbed the pallet (max z rise {z.max() - z0:.3f} m); "
            "check the pallet placement and friction"
        )
    k0 = int(np.nonzero(t >= t[up[0]] - 0.5)[0][0])
    k1 = int(np.nonzero(t <= t[up[-1]] + 0.5)[0][-1])
    climb = (float(t[k0]), float(t[k1]))
    # Turn efficiency: measured yaw rate over ideal skid-steer yaw rate from measured wheel speeds.
    wl, wr = traj.wheel_vel[:, 0], traj.wheel_vel[:, 1]
    ideal = (wr - wl) * radius / track
    yaw_rate = traj.qvel[:, 5]
    mask = np.abs(ideal) > 0.1
    eff = float(np.sum(yaw_rate[mask] * ideal[mask]) / np.sum(ideal[mask] ** 2)) if mask.sum() > 10 else float("nan")
    yaw = np.unwrap(traj.yaw)
    stats = {
        "climb_rise": float(z[k0 : k1 + 1].max() - z0),
        "base_z_flat": z0,
        "max_pitch_deg": float(np.degrees(np.max(np.abs(_pitch(traj.qpos[:, 3:7]))))),
        "heading_change_deg": float(np.degrees(yaw[-1] - yaw[0])),
        "max_heading_change_deg": float(np.degrees(np.max(np.abs(yaw - yaw[0])))),
        "turn_efficiency": eff,
        "path_length": float(np.sum(np.linalg.norm(np.diff(traj.qpos[:, :2], axis=0), axis=1))),
        "max_speed": float(np.max(np.linalg.norm(traj.qvel[:, :2], axis=1))),
    }
    return {"cruise": (float(c0), float(c1)), "climb": climb}, stats


def _pitch(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    pitch: np.ndarray = np.arcsin(np.clip(2 * (w * y - z * x), -1, 1))
    return pitch
