"""Simulate the runs, turn them into the topics a real robot publishes, write bags and a manifest.

Topics (stamps = header.stamp = record time, integer nanoseconds on a fixed synthetic epoch):

- ``/wheel_cmd``  sensor_msgs/JointState, 100 Hz: wheel-velocity setpoints [rad/s] (left, right, rear)
- ``/joint_states`` sensor_msgs/JointState, 50 Hz: measured wheel angle [rad], speed [rad/s], torque [N m]
- ``/local_odom`` nav_msgs/Odometry, 20 Hz: lidar-inertial odometry of ``base_link`` in ``odom``
  (white noise + slow random-walk drift; the odom frame is the world frame at the start)
- ``/imu``        sensor_msgs/Imu, 100 Hz: orientation, angular velocity, specific force (with noise)
- ``/lidar/points`` sensor_msgs/PointCloud2, 10 Hz: x, y, z (float32, sensor frame ``lidar``) and
  ``ring`` (uint16), ray-cast against the ground and the pallet with `ingest.simlidar`
- ``/ground_truth/pose`` geometry_msgs/PoseStamped, 100 Hz: the true base pose (for checks only)
- ``/tf_static``  tf2_msgs/TFMessage: base_link -> lidar and base_link -> imu_link mounts
"""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ingest.fileio import read_yaml
from ingest.run import PALLET_SIZE
from ingest.transforms import quat_mul, quat_to_matrix, wxyz_to_xyzw
from sysid.errors import optional_import
from sysid.synth.errors import SynthError
from sysid.synth.mjcf import WHEEL_NAMES, ImuMount, LidarMount, MjcfOptions, load_robot
from sysid.synth.scenario import DesignOptions, RunSpec, design_runs, plan_path
from sysid.synth.simulate import CONTROL_RATE, Trajectory, check_timestep, simulate_run

EPOCH_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: fixed, so bags never carry the wall clock
FORMATS = {"mcap": "ros2-mcap", "sqlite3": "ros2-sqlite3", "ros1": "ros1"}
MANIFEST_NAME = "manifest.yaml"
TOPIC_MAP_NAME = "topics.yaml"
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class OdomNoise:
    """Lidar-inertial odometry error model (SI: m, rad, m/s, rad/s).

    Pose error = slow drift (random walk of intensity ``drift_xy`` [m/sqrt(s)], ``drift_z``,
    ``drift_yaw`` [rad/sqrt(s)]) + jitter: a Gauss-Markov process (std ``*_std``, correlation time
    ``jitter_tau`` [s]), smooth like a filter's output rather than white. The first message is the
    exact start pose, as a LIO initialises at identity. Twist noise is white.
    """

    pos_std: float = 0.004
    z_std: float = 0.003
    yaw_std: float = 0.0005
    tilt_std: float = 0.0003
    jitter_tau: float = 0.5
    drift_xy: float = 0.002
    drift_z: float = 0.001
    drift_yaw: float = 0.0003
    lin_vel_std: float = 0.02
    ang_vel_std: float = 0.01


@dataclass(frozen=True)
class LidarConfig:
    """Spinning lidar: beam count (16, 64, 128), azimuth step [deg], ranges [m], range noise [m].

    window: "full" scans the whole run; "climb" stops publishing at the end of the climb (keeps the
    committed sample small; the pallet is fitted from the approach anyway).
    """

    beams: int = 16
    h_res_deg: float = 0.4
    max_range: float = 60.0
    min_range: float = 0.5
    noise_std: float = 0.01
    dropout: float = 0.0
    rate: float = 10.0
    window: str = "full"
    mount: tuple[float, float, float] = LidarMount().position

    def check(self) -> None:
        if self.beams not in (16, 64, 128):
            raise SynthError(f"lidar beams={self.beams}; choose 16, 64 or 128")
        if not 0.05 <= self.h_res_deg <= 10:
            raise SynthError(f"lidar h_res_deg={self.h_res_deg}; use 0.05..10 deg")
        if not 0 < self.min_range < self.max_range:
            raise SynthError(f"lidar ranges min={self.min_range} max={self.max_range} m must be 0 < min < max")
        if self.noise_std < 0 or not 0 <= self.dropout < 1:
            raise SynthError("lidar noise_std must be >= 0 m and dropout in [0, 1)")
        if self.window not in ("full", "climb"):
            raise SynthError(f"lidar window={self.window!r}; choose 'full' or 'climb'")
        if CONTROL_RATE % self.rate:
            raise SynthError(f"lidar rate {self.rate} Hz must divide {CONTROL_RATE} Hz")


@dataclass(frozen=True)
class ImuNoise:
    gyro_std: float = 0.003  # [rad/s]
    gyro_bias_std: float = 0.002  # [rad/s], constant per run
    acc_std: float = 0.05  # [m/s^2]
    quat_std: float = 0.002  # [rad]


@dataclass(frozen=True)
class SensorConfig:
    """Rates [Hz] and noise of every published topic (rates must divide 100 Hz)."""

    odom_rate: float = 20.0
    joint_rate: float = 50.0
    imu_rate: float = 100.0
    truth_rate: float = 100.0
    joint_vel_std: float = 0.01  # [rad/s]
    odom: OdomNoise = field(default_factory=OdomNoise)
    imu: ImuNoise = field(default_factory=ImuNoise)
    lidar: LidarConfig = field(default_factory=LidarConfig)
    # Seed of the sensor noise alone (odometry, IMU, joint states, lidar): 0 draws it from each run's
    # seed; another value draws new noise over the same design, commands and trajectories.
    noise_seed: int = 0

    def check(self) -> None:
        if self.noise_seed < 0:
            raise SynthError(f"noise seed {self.noise_seed} must be >= 0")
        for name in ("odom_rate", "joint_rate", "imu_rate", "truth_rate"):
            rate = getattr(self, name)
            if not (rate > 0 and CONTROL_RATE % rate == 0):
                raise SynthError(f"{name}={rate} Hz must divide the {CONTROL_RATE} Hz control rate")
        self.lidar.check()


TOPICS = {
    "wheel_cmd": ("/wheel_cmd", "sensor_msgs/msg/JointState"),
    "joint_states": ("/joint_states", "sensor_msgs/msg/JointState"),
    "odom": ("/local_odom", "nav_msgs/msg/Odometry"),
    "imu": ("/imu", "sensor_msgs/msg/Imu"),
    "lidar": ("/lidar/points", "sensor_msgs/msg/PointCloud2"),
    "truth": ("/ground_truth/pose", "geometry_msgs/msg/PoseStamped"),
    "tf_static": ("/tf_static", "tf2_msgs/msg/TFMessage"),
}


def _bagio() -> Any:
    try:
        from ingest import bagio
    except ImportError as exc:  # pragma: no cover - ingest ships with this repository
        raise SynthError(
            "sysid.synth writes bags with ingest.bagio; install the repository (pip install -e .)"
        ) from exc
    return bagio


def _simlidar() -> Any:
    from ingest import simlidar

    return simlidar


def _xyzw(q: np.ndarray) -> tuple[float, float, float, float]:
    """A quaternion (x, y, z, w) as four floats (a message field)."""
    return (float(q[0]), float(q[1]), float(q[2]), float(q[3]))


def _small_rot(v: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion of the rotation vector ``v`` [rad]."""
    a = float(np.linalg.norm(v))
    if a < 1e-15:
        return np.array([0.0, 0.0, 0.0, 1.0])
    return np.concatenate([np.sin(a / 2) * v / a, [math.cos(a / 2)]])


def _streams(seed: int, noise_seed: int = 0) -> dict[str, np.random.Generator]:
    """One independent random stream per sensor, all from the run's seed (and a nonzero noise seed)."""
    names = ("odom", "imu", "joints", "lidar")
    extra = [1, noise_seed] if noise_seed else []
    return {n: np.random.default_rng(np.random.SeedSequence([seed, 7, i, *extra])) for i, n in enumerate(names)}


def odometry_error(n: int, rate: float, noise: OdomNoise, rng: np.random.Generator) -> np.ndarray:
    """(n, 6) pose error of the simulated odometry at ``rate`` [Hz]: x, y, z [m], yaw, roll-ish,
    pitch-ish tilt [rad] (columns 4, 5 rotate about x, y), the random-walk drift plus the
    Gauss-Markov jitter of ``noise``; zero at the first sample. Draws from ``rng`` in a fixed order
    (the bags' odometry uses the run's "odom" stream)."""
    dt = 1.0 / rate
    on = noise
    scale_rw = np.array([on.drift_xy, on.drift_xy, on.drift_z, on.drift_yaw, 0.0, 0.0])
    scale_j = np.array([on.pos_std, on.pos_std, on.z_std, on.yaw_std, on.tilt_std, on.tilt_std])
    steps = rng.normal(0.0, 1.0, (n, 6)) * np.sqrt(dt) * scale_rw
    steps[0] = 0.0
    drift = np.cumsum(steps, axis=0)
    a = math.exp(-dt / on.jitter_tau) if on.jitter_tau > 0 else 0.0
    white = rng.normal(0.0, 1.0, (n, 6)) * scale_j * math.sqrt(1 - a * a)
    jitter = np.zeros_like(white)
    for j in range(1, n):
        jitter[j] = a * jitter[j - 1] + white[j]
    walk: np.ndarray = drift + jitter
    return walk


def run_messages(
    spec: RunSpec,
    traj: Trajectory,
    sensors: SensorConfig,
    imu_mount: tuple[float, float, float] = ImuMount().position,
) -> tuple[list[Any], dict[str, Any]]:
    """The run's bag messages (sorted by stamp) and the facts for its manifest entry."""
    bagio = _bagio()
    simlidar = _simlidar()
    rng = _streams(spec.seed, sensors.noise_seed)
    t0 = EPOCH_NS + spec.index * 3600 * 10**9
    n = len(traj.t)
    tick_ns = int(round(1e9 / CONTROL_RATE))
    stamps = [t0 + k * tick_ns for k in range(n)]
    msgs: list[tuple[str, str, int, Any]] = []

    def every(rate: float) -> range:
        return range(0, n, int(round(CONTROL_RATE / rate)))

    topic, mtype = TOPICS["tf_static"]
    for child, off in (("lidar", sensors.lidar.mount), ("imu_link", imu_mount)):
        msgs.append((topic, mtype, stamps[0], bagio.tf_message(stamps[0], off, (0, 0, 0, 1), "base_link", child)))

    topic, mtype = TOPICS["wheel_cmd"]
    for k in range(n):
        msgs.append((topic, mtype, stamps[k], bagio.joint_state(stamps[k], WHEEL_NAMES, traj.cmd[k])))

    topic, mtype = TOPICS["joint_states"]
    r = rng["joints"]
    for k in every(sensors.joint_rate):
        vel = traj.wheel_vel[k] + r.normal(0.0, sensors.joint_vel_std, 3)
        msgs.append(
            (
                topic,
                mtype,
                stamps[k],
                bagio.joint_state(stamps[k], WHEEL_NAMES, vel, traj.wheel_pos[k], traj.wheel_torque[k]),
            )
        )

    # Odometry: truth + drift (random walk) + jitter (Gauss-Markov); exact at the first message.
    on = sensors.odom
    r = rng["odom"]
    idx = list(every(sensors.odom_rate))
    err = odometry_error(len(idx), sensors.odom_rate, on, r)
    topic, mtype = TOPICS["odom"]
    for j, k in enumerate(idx):
        q = wxyz_to_xyzw(traj.qpos[k, 3:7])  # MuJoCo's (w, x, y, z)
        pos = traj.qpos[k, :3] + err[j, :3]
        q_meas = quat_mul(_small_rot(np.array([err[j, 4], err[j, 5], err[j, 3]])), q)
        rot = quat_to_matrix(q, normalize=False)
        lin = rot.T @ traj.qvel[k, :3] + r.normal(0.0, on.lin_vel_std, 3)
        ang = traj.qvel[k, 3:6] + r.normal(0.0, on.ang_vel_std, 3)
        msgs.append((topic, mtype, stamps[k], bagio.odometry(stamps[k], pos, _xyzw(q_meas), lin, ang)))

    topic, mtype = TOPICS["imu"]
    im = sensors.imu
    r = rng["imu"]
    bias = r.normal(0.0, im.gyro_bias_std, 3)
    for k in every(sensors.imu_rate):
        q_meas = quat_mul(wxyz_to_xyzw(traj.imu_quat[k]), _small_rot(r.normal(0.0, im.quat_std, 3)))
        gyro = traj.imu_gyro[k] + bias + r.normal(0.0, im.gyro_std, 3)
        acc = traj.imu_acc[k] + r.normal(0.0, im.acc_std, 3)
        msgs.append((topic, mtype, stamps[k], bagio.imu(stamps[k], _xyzw(q_meas), gyro, acc)))

    topic, mtype = TOPICS["truth"]
    for k in every(sensors.truth_rate):
        msgs.append(
            (topic, mtype, stamps[k],
             bagio.pose_stamped(stamps[k], traj.qpos[k, :3], _xyzw(wxyz_to_xyzw(traj.qpos[k, 3:7]))))
        )

    lc = sensors.lidar
    pattern = simlidar.beam_pattern(lc.beams, h_res_deg=lc.h_res_deg, max_range=lc.max_range, min_range=lc.min_range)
    box = simlidar.Box.on_ground(spec.pallet.x, spec.pallet.y, spec.pallet.yaw, spec.pallet.size)
    t_end = traj.segments["climb"][1] if lc.window == "climb" else traj.t[-1]
    topic, mtype = TOPICS["lidar"]
    r = rng["lidar"]
    n_points = []
    rings = np.broadcast_to(np.arange(pattern.n_beams, dtype=np.uint16)[:, None], (pattern.n_beams, pattern.n_azimuths))
    for k in every(lc.rate):
        if traj.t[k] > t_end + 1e-9:
            break
        grid = simlidar.scan(
            pattern,
            traj.lidar_pos[k],
            traj.lidar_rot[k],
            boxes=[box],
            noise_std=lc.noise_std,
            seed=r,
            dropout=lc.dropout,
            organized=True,
        )
        ok = np.isfinite(grid[..., 0])
        pts = grid[ok]
        n_points.append(len(pts))
        cloud = bagio.point_cloud2(stamps[k], pts, frame_id="lidar", extra={"ring": rings[ok]})
        msgs.append((topic, mtype, stamps[k], cloud))

    order = {name: i for i, name in enumerate(t for t, _ in TOPICS.values())}
    msgs.sort(key=lambda m: (m[2], order[m[0]]))
    facts = {"t0_ns": t0, "lidar_points_mean": float(np.mean(n_points)) if n_points else 0.0}
    return msgs, facts


def topic_table(msgs: Sequence[tuple[str, str, int, Any]]) -> dict[str, dict[str, Any]]:
    """Per topic: type, message count, first/last stamp offsets [s] and mean rate [Hz]."""
    table: dict[str, dict[str, Any]] = {}
    stamps: dict[str, list[int]] = {}
    for topic, mtype, st, _ in msgs:
        table.setdefault(topic, {"type": mtype})
        stamps.setdefault(topic, []).append(st)
    for topic, topic_stamps in stamps.items():
        arr = np.asarray(topic_stamps, dtype=np.int64)
        span = (arr[-1] - arr[0]) / 1e9
        table[topic].update(
            count=int(arr.size),
            duration=round(float(span), 6),
            rate_hz=round(float((arr.size - 1) / span), 6) if span > 0 else None,
        )
    return table


def _round(obj: Any, nd: int = 6) -> Any:
    """Plain YAML-safe types with floats rounded (a readable, stable manifest)."""
    if isinstance(obj, dict):
        return {str(k): _round(v, nd) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v, nd) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if not math.isfinite(f) else round(f, nd)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _dir_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bag_path(out_dir: Path, name: str, fmt: str) -> Path:
    """Where a run's bag goes: ``<out>/<name>.bag`` for ROS 1, a ROS 2 bag directory otherwise."""
    return out_dir / (f"{name}.bag" if fmt == "ros1" else name)


def generate_run(
    spec: RunSpec,
    out_dir: str | Path,
    fmt: str = "mcap",
    sensors: SensorConfig | None = None,
    robot: dict[str, Any] | str | Path | None = None,
    timestep: float = 1e-3,
    compression: str | None = "default",
    overwrite: bool = False,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Simulate ``spec``, write its bag under ``out_dir`` and return its manifest entry.

    fmt: "mcap" (ROS 2, default), "sqlite3" (ROS 2) or "ros1". compression: "default" (zstd
    chunks for mcap, recorded in the file itself; zstd per message for sqlite3; lz4 chunks for
    ROS 1), None, or a name `ingest.bagio.write_bag` accepts.
    """
    if fmt not in FORMATS:
        raise SynthError(f"bag format {fmt!r}; choose one of {sorted(FORMATS)}")
    sensors = sensors or SensorConfig()
    sensors.check()
    robot_d = robot if isinstance(robot, dict) else load_robot(robot)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = bag_path(out, spec.name, fmt)
    if target.exists():
        if not overwrite:
            raise SynthError(f"{target} exists; remove it or pass overwrite=True (--force)")
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    mx, my, mz = sensors.lidar.mount
    mj_opts = MjcfOptions(lidar=LidarMount((mx, my, mz)))
    traj = simulate_run(spec, robot_d, timestep=timestep, options=mj_opts, progress=progress)
    msgs, facts = run_messages(spec, traj, sensors, mj_opts.imu.position)
    if compression == "default":
        compression = "lz4" if fmt == "ros1" else "zstd"
    # The ROS 1 (Noetic) typestore lacks tf2_msgs: embed its definition (ROS 1 bags carry them).
    custom = {"tf2_msgs/msg/TFMessage": "geometry_msgs/TransformStamped[] transforms\n"} if fmt == "ros1" else None
    _bagio().write_bag(target, msgs, fmt=FORMATS[fmt], compression=compression, custom_types=custom)
    topics = topic_table(msgs)
    p = spec.pallet
    entry: dict[str, Any] = _round(
        {
            "name": spec.name,
            "bag": target.name,
            "format": FORMATS[fmt],
            "compression": compression,
            "seed": spec.seed,
            "split": spec.split,
            "role": spec.role or None,
            "start_time_ns": facts["t0_ns"],
            "duration": traj.duration,
            "bytes": _dir_bytes(target),
            "topics": topics,
            "pallet": {"x": p.x, "y": p.y, "yaw": p.yaw, "yaw_deg": math.degrees(p.yaw), "size": list(p.size)},
            "design": spec.as_dict(),
            "true_params": {"contact": spec.contact.as_dict(), "servo": spec.servo.as_dict()},
            "segments": {k: list(v) for k, v in traj.segments.items()},
            "measured": dict(traj.stats, lidar_points_per_scan=facts["lidar_points_mean"]),
        }
    )
    return entry


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate_dataset(
    out_dir: str | Path,
    seed: int = 0,
    fmt: str = "mcap",
    runs: Sequence[str | int] | None = None,
    design: DesignOptions | None = None,
    sensors: SensorConfig | None = None,
    robot: str | Path | None = None,
    timestep: float = 1e-3,
    compression: str | None = "default",
    overwrite: bool = False,
    progress: bool = True,
    specs: Sequence[RunSpec] | None = None,
) -> dict[str, Any]:
    """Generate the pallet dataset: one bag per run plus ``manifest.yaml`` in ``out_dir``.

    runs: a subset of the designed runs, by name ("run_03") or index (default: all 14).
    specs: explicit run specs instead of `design_runs(seed, design)` (for custom scenarios).
    Returns the manifest (also written to ``out_dir/manifest.yaml``). Same arguments -> same bytes.
    """
    from tqdm.auto import tqdm

    if fmt not in FORMATS:
        raise SynthError(f"bag format {fmt!r}; choose one of {sorted(FORMATS)}")
    check_timestep(timestep)
    sensors = sensors or SensorConfig()
    sensors.check()
    robot_path = Path(robot) if robot is not None else None
    robot_d = load_robot(robot_path)
    all_specs = list(specs) if specs is not None else design_runs(seed, design)
    chosen = all_specs
    if runs is not None:
        by_name = {s.name: s for s in all_specs}
        chosen = []
        for key in runs:
            if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
                i = int(key)
                if not 0 <= i < len(all_specs):
                    raise SynthError(f"run index {i} out of range 0..{len(all_specs) - 1}")
                chosen.append(all_specs[i])
            elif key in by_name:
                chosen.append(by_name[key])
            else:
                raise SynthError(f"unknown run {key!r}; the design has {sorted(by_name)}")
    out = Path(out_dir)
    created = not out.exists()
    try:
        return _generate_into(out, chosen, fmt, sensors, robot_d, robot_path, timestep, compression, overwrite,
                              progress, seed, tqdm)
    except BaseException:
        # a failure before the first bag is complete leaves no empty folder behind
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _generate_into(
    out: Path,
    chosen: Sequence[RunSpec],
    fmt: str,
    sensors: SensorConfig,
    robot_d: dict[str, Any],
    robot_path: Path | None,
    timestep: float,
    compression: str | None,
    overwrite: bool,
    progress: bool,
    seed: int,
    tqdm: Any,
) -> dict[str, Any]:
    entries = []
    # Planned sim seconds per run: the bar's scale (the simulated time is close to it).
    est = [2 * s.standstill + plan_path(s).length / s.speed + s.speed / s.accel for s in chosen]
    fmt_bar = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}<{remaining}{postfix}]"
    with tqdm(total=sum(est), disable=not progress, desc="synth", bar_format=fmt_bar) as bar:
        for spec, e in zip(chosen, est):
            bar.set_postfix_str(f"{spec.name} v={spec.speed:.2f} m/s")
            done = [0.0]

            def tick(dt: float, done: list[float] = done, cap: float = e) -> None:
                step = min(dt, max(cap - done[0], 0.0))
                done[0] += step
                bar.update(step)

            entries.append(
                generate_run(
                    spec, out, fmt, sensors, robot_d, timestep, compression, overwrite=overwrite, progress=tick
                )
            )
            bar.update(max(e - done[0], 0.0))
    mujoco = optional_import("mujoco", "synth", "sysid synth (the MuJoCo simulation)")
    import rosbags

    from sysid import __version__ as sysid_version

    friction = constant_friction(chosen)
    # The surfaces' own friction (the ground's, the pallet's), where every run shares it: sysid's
    # mu_ground / mu_pallet under friction_combine: max, MuJoCo's rule.
    surfaces = {
        name: values.pop()
        for name, values in (
            ("mu_ground", {s.contact.mu_ground for s in chosen}),
            ("mu_pallet", {s.contact.mu_pallet for s in chosen}),
        )
        if len(values) == 1
    }

    manifest: dict[str, Any] = _round(
        {
            "dataset": "helhest-pallet-synthetic",
            "generator": {
                "version": GENERATOR_VERSION,
                "sysid": sysid_version,
                "mujoco": mujoco.__version__,
                "rosbags": getattr(rosbags, "__version__", "unknown"),
                "command": "sysid synth",
            },
            "seed": seed,
            "format": FORMATS[fmt],
            "robot": {
                "description": str(robot_path) if robot_path else "models/helhest/robot.yaml",
                "sha256": _sha256(
                    robot_path
                    if robot_path
                    else Path(__file__).resolve().parents[2] / "models" / "helhest" / "robot.yaml"
                ),
                "base_height": robot_d["base_height"],
            },
            "simulation": {
                "engine": "mujoco",
                "timestep": timestep,
                "integrator": "implicitfast",
                "cone": "elliptic",
                "wheel_shape": MjcfOptions().wheel_shape,
                "control_rate_hz": CONTROL_RATE,
            },
            "frames": {
                "world": "odom: z up, ground at z = 0, origin below the start pose, +x the start heading",
                "base_link": "x forward, y left, at wheel-axle height (base_height above flat ground)",
                "pallet": "box centre (x, y) on the ground, yaw of its 1.2 m side, in the odom/world frame",
                "times": "segments and durations in seconds from start_time_ns (the run's first stamp)",
            },
            "sensors": _sensor_dict(sensors),
            "ingest_topic_map": TOPIC_MAP_NAME,
            # Dataset-wide true values under the names of sysid's parameters (per-run friction,
            # which varies on purpose, is in each run's true_params).
            "truth": {
                "kp": chosen[0].servo.kv if chosen else None,
                "ki": chosen[0].servo.ki if chosen else None,
                "cmd_scale": chosen[0].servo.cmd_scale if chosen else None,
                "chassis_mass": float(
                    chosen[0].contact.chassis_mass
                    if chosen and chosen[0].contact.chassis_mass is not None
                    else robot_d["chassis"]["mass"]
                ),
                # one friction for every run and wheel (DesignOptions.constant_friction): MuJoCo's
                # friction is isotropic, so it is both the longitudinal and the lateral coefficient
                **({"mu": friction, "mu_lateral": friction} if friction is not None else {}),
                **surfaces,
            },
            "truth_note": (
                "wheel servos are PI (kp = kv, ki the integral gain; its limit in true_params.servo); "
                "a wheel contact takes the larger of the wheel's and the surface's friction (mu_ground, "
                "mu_pallet; friction_combine: max); "
                + (
                    f"one wheel friction mu = {friction} for every run and wheel (isotropic: mu_lateral = mu; "
                    "torsional friction in true_params.contact)"
                    if friction is not None
                    else "wheel friction varies per run (true_params.contact), so no constant mu fits every run"
                )
            ),
            "splits": {
                "train": [e["name"] for e in entries if e["split"] == "train"],
                "heldout": [e["name"] for e in entries if e["split"] == "heldout"],
            },
            "runs": entries,
        }
    )
    (out / TOPIC_MAP_NAME).write_text(topic_map_yaml(sensors))
    (out / MANIFEST_NAME).write_text(yaml.safe_dump(manifest, sort_keys=False, width=100))
    return manifest


def constant_friction(specs: Sequence[RunSpec]) -> float | None:
    """The wheel friction shared by every run and wheel of ``specs`` (left/right and rear alike),
    or None when it varies (the default design draws it per run)."""
    values = {(s.contact.mu_wheel, s.contact.mu_rear) for s in specs}
    if len(values) != 1:
        return None
    mu_wheel, mu_rear = values.pop()
    return float(mu_wheel) if mu_wheel == mu_rear else None


def topic_map_yaml(sensors: SensorConfig | None = None) -> str:
    """The `ingest` topic map of the generated bags (roles, lidar mount, pallet size), as YAML."""
    sensors = sensors or SensorConfig()
    tmap = {
        "time": "header",
        "topics": {
            "odom": {"topic": TOPICS["odom"][0]},
            "wheel_cmd": {"topic": TOPICS["wheel_cmd"][0], "joints": list(WHEEL_NAMES)},
            "wheel_meas": {"topic": TOPICS["joint_states"][0]},
            "cloud": {"topic": TOPICS["lidar"][0]},
            "imu": {"topic": TOPICS["imu"][0]},
        },
        "lidar_extrinsic": {"xyz": [float(v) for v in sensors.lidar.mount], "rpy": [0.0, 0.0, 0.0]},
        "pallet": {"size": list(PALLET_SIZE)},
    }
    head = "# ingest topic map of the sysid-synth bags: ingest.load_run(bag, config=this file)\n"
    return head + yaml.safe_dump(tmap, sort_keys=False)


def _sensor_dict(s: SensorConfig) -> dict[str, Any]:
    def asdict(obj: Any) -> dict[str, Any]:
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}

    d = {k: v for k, v in asdict(s).items() if k not in ("odom", "imu", "lidar")}
    if not s.noise_seed:  # from each run's seed (the manifest's runs[].seed)
        del d["noise_seed"]
    d["odom_noise"] = asdict(s.odom)
    d["imu_noise"] = asdict(s.imu)
    d["lidar"] = dict(asdict(s.lidar), mount=list(s.lidar.mount), vfov_deg=None)
    from ingest.simlidar import DEFAULT_VFOV_DEG

    d["lidar"]["vfov_deg"] = list(DEFAULT_VFOV_DEG[s.lidar.beams])
    d["topics"] = {k: {"topic": t, "type": m} for k, (t, m) in TOPICS.items()}
    return d


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read a dataset's manifest (a directory or the manifest file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    manifest: dict[str, Any] = read_yaml(
        p, SynthError, "manifest", missing=f"no manifest at {p}; generate the dataset with `sysid synth --out DIR`")
    return manifest


__all__ = [
    "FORMATS",
    "LidarConfig",
    "OdomNoise",
    "ImuNoise",
    "SensorConfig",
    "bag_path",
    "constant_friction",
    "generate_dataset",
    "generate_run",
    "load_manifest",
    "odometry_error",
    "run_messages",
    "topic_table",
]
