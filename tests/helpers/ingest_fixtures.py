"""Shared helpers for the ingest tests: a synthetic pallet-climb drive written as bag messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ingest import bagio
from ingest.run import PALLET_SIZE
from ingest.simlidar import Box, beam_pattern, scan

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
BAGS = SHARED / "bags"
HELHEST = SHARED / "helhest-real"

T0_NS = 1_700_000_000_000_000_000  # an epoch-like start time
WHEEL_R = 0.36
TRACK = 0.72
WHEELBASE = 0.697
PALLET = PALLET_SIZE  # (1.2, 0.8, 0.144) m
LIDAR_Z = 0.5  # [m] lidar above the base origin


def contact_distance(r: float = WHEEL_R, h: float = PALLET[2]) -> float:
    """Horizontal axle-to-edge distance when a wheel of radius r first touches a step of height h."""
    return float(np.sqrt(r**2 - (r - h) ** 2))


@dataclass
class Drive:
    """Ground truth of a synthetic drive (world = odometry frame, base at axle height)."""

    messages: list[bagio.BagMessage]
    t: np.ndarray  # [s] odometry times from the start
    pose: np.ndarray  # (N, 7)
    cmd_t: np.ndarray
    cmd: np.ndarray  # (M, 3) wheel targets [rad/s]
    v: float
    pallet: tuple[float, float, float]  # (x, y, yaw) in the world
    onset_t: float | None
    start_xy: tuple[float, float]
    start_yaw: float
    extra: dict = field(default_factory=dict)


def _rise(s: np.ndarray, h: float, length: float, r: float = WHEEL_R) -> np.ndarray:
    """Axle height of a wheel rolling onto a step of height h (s = distance past first contact).

    The wheel pivots about the step edge: the axle moves on a circle of radius r around it until it
    is above the edge (s = length = contact distance), then stays at h.
    """
    x = np.clip(length - s, 0.0, length)  # horizontal axle-to-edge distance
    z = np.sqrt(r**2 - x**2) - (r - h)
    return np.where(s <= 0, 0.0, np.minimum(z, h))


def make_drive(
    ros: int = 2,
    duration: float = 8.0,
    v: float = 1.0,
    still: float = 1.0,
    heading: float = 0.3,
    start_xy: tuple[float, float] = (2.0, -1.0),
    edge_ahead: float = 5.0,
    odom_hz: float = 20.0,
    cmd_hz: float = 100.0,
    cloud_hz: float = 2.0,
    n_beams: int = 16,
    cmd_type: str = "sensor_msgs/msg/JointState",
    with_clouds: bool = True,
    with_imu: bool = False,
    cloud_until: float | None = None,
    header_offset_ns: int = 0,
    seed: int = 0,
) -> Drive:
    """A robot standing still for ``still`` s, then driving straight at ``v`` m/s onto a pallet.

    The pallet's near edge lies ``edge_ahead`` m ahead of the start along ``heading``. The base rises
    by the pallet height while the front axle crosses the edge (after the wheel-contact distance),
    pitching nose-up (negative pitch) until the rear wheel follows. Header stamps are record time +
    ``header_offset_ns``.
    """
    rng = np.random.default_rng(seed)
    h = PALLET[2]
    u = np.array([np.cos(heading), np.sin(heading)])
    p0 = np.array(start_xy)
    edge = p0 + edge_ahead * u
    centre = edge + u * PALLET[0] / 2  # long side along the driving direction
    pallet = (float(centre[0]), float(centre[1]), float(heading))
    dc = contact_distance()
    t = np.arange(0.0, duration, 1.0 / odom_hz)
    s = np.where(t > still, v * (t - still), 0.0)  # distance travelled by the base origin
    # Front axle rise starts when the axle is dc before the edge; rear wheel the same, a wheelbase later.
    sf = s - (edge_ahead - dc)
    hf = _rise(sf, h, dc)
    hr = _rise(sf - WHEELBASE, h, dc)
    onset_t = still + (edge_ahead - dc) / v if edge_ahead - dc < v * (duration - still) else None
    z = hf
    pitch = -np.arctan2(hf - hr, WHEELBASE)
    xy = p0 + s[:, None] * u
    yaw = np.full_like(t, heading)
    cy, sy, cp, sp = np.cos(yaw / 2), np.sin(yaw / 2), np.cos(pitch / 2), np.sin(pitch / 2)
    quat = np.stack([-sy * sp, cy * sp, sy * cp, cy * cp], axis=1)  # q = qz(yaw) * qy(pitch)
    pose = np.column_stack([xy, z, quat])
    msgs: list[bagio.BagMessage] = []

    def ns(tt: float) -> int:
        return T0_NS + int(round(tt * 1e9))

    for k, tt in enumerate(t):
        msgs.append(
            bagio.BagMessage(
                "/odom",
                "nav_msgs/msg/Odometry",
                ns(tt),
                bagio.odometry(
                    ns(tt) + header_offset_ns, pose[k, :3], pose[k, 3:], (v if tt > still else 0, 0, 0), ros=ros
                ),
            )
        )
    cmd_t = np.arange(0.0, duration, 1.0 / cmd_hz)
    vc = np.where(cmd_t > still, v, 0.0)
    cmd = np.stack([vc / WHEEL_R, vc / WHEEL_R, vc / WHEEL_R], axis=1)
    for k, tt in enumerate(cmd_t):
        if cmd_type == "sensor_msgs/msg/JointState":
            m = bagio.joint_state(
                ns(tt) + header_offset_ns, ["left_wheel_j", "right_wheel_j", "rear_wheel_j"], cmd[k], ros=ros
            )
        elif cmd_type == "std_msgs/msg/Float64MultiArray":
            m = bagio.float64_multiarray(cmd[k], ros=ros)
        elif cmd_type == "geometry_msgs/msg/TwistStamped":
            m = bagio.twist_stamped(ns(tt) + header_offset_ns, (vc[k], 0, 0), (0, 0, 0), ros=ros)
        else:
            m = bagio.twist((vc[k], 0, 0), (0, 0, 0), ros=ros)
        msgs.append(bagio.BagMessage("/wheel_cmd", cmd_type, ns(tt), m))
    if with_clouds:
        pat = beam_pattern(n_beams, h_res_deg=0.4, max_range=30.0)
        box = Box.on_ground(*pallet, size=PALLET, ground_z=-WHEEL_R)  # ground below the axle
        tc = np.arange(0.0, cloud_until if cloud_until is not None else duration, 1.0 / cloud_hz)
        for tt in tc:
            k = int(np.clip(np.searchsorted(t, tt), 0, len(t) - 1))
            rot_q = pose[k, 3:]
            from ingest.transforms import quat_to_matrix

            rm = quat_to_matrix(rot_q)
            sp_ = pose[k, :3] + rm @ np.array([0.0, 0.0, LIDAR_Z])
            pts = scan(pat, sp_, rm, [box], ground_z=-WHEEL_R, noise_std=0.005, seed=rng)
            msgs.append(
                bagio.BagMessage(
                    "/lidar/points",
                    "sensor_msgs/msg/PointCloud2",
                    ns(t[k]),
                    bagio.point_cloud2(ns(t[k]) + header_offset_ns, pts, ros=ros),
                )
            )
    if with_imu:
        for tt in t:
            msgs.append(bagio.BagMessage("/imu", "sensor_msgs/msg/Imu", ns(tt), bagio.imu(ns(tt), ros=ros)))
    msgs.sort(key=lambda m: m.stamp_ns)
    return Drive(msgs, t, pose, cmd_t, cmd, v, pallet, onset_t, tuple(p0), heading)


def drive_config(**overrides: object) -> dict:
    """Topic map for ``make_drive`` bags."""
    cfg: dict = {
        "geometry": {"wheel_radius": WHEEL_R, "track_width": TRACK},
        "topics": {
            "odom": {"topic": "/odom"},
            "wheel_cmd": {"topic": "/wheel_cmd"},
        },
        "lidar_extrinsic": {"xyz": [0.0, 0.0, LIDAR_Z]},
    }
    cfg.update(overrides)
    return cfg


def bag_path(tmp: Path, fmt: str, name: str = "drive") -> Path:
    return tmp / {"ros1": f"{name}.bag", "ros2-sqlite3": f"{name}_db3", "ros2-mcap": f"{name}_mcap"}[fmt]


def write_drive(tmp: Path, fmt: str = "ros2-mcap", name: str = "drive", **kwargs: object) -> tuple[Path, Drive]:
    drive = make_drive(ros=1 if fmt == "ros1" else 2, **kwargs)  # type: ignore[arg-type]
    path = bag_path(tmp, fmt, name)
    bagio.write_bag(path, drive.messages, fmt=fmt)
    return path, drive


def files_under(p: Path) -> list[Path]:
    return sorted(x for x in p.rglob("*") if x.is_file()) if p.exists() else []
