"""Message -> numpy conversions: point clouds, poses, wheel speeds. SI units throughout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CloudError, DataError, MessageTypeError, TopicError

# sensor_msgs/PointField datatype -> numpy type code.
POINTFIELD_DTYPES: dict[int, str] = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}


def cloud_to_xyz(msg: Any, organized: bool = False, topic: str = "cloud") -> np.ndarray:
    """Points of a sensor_msgs/PointCloud2 as float32 [m].

    Handles any field order and datatype of x/y/z, extra fields, per-point padding (``point_step``),
    row padding (``row_step`` > width * point_step), big-endian data and organized (H x W) clouds.
    Returns (N, 3) with non-finite points dropped, or (H, W, 3) with NaNs kept when ``organized``.
    Raises ``CloudError`` for a layout that cannot be decoded (missing x/y/z, truncated data).
    """
    fields = {f.name: f for f in msg.fields}
    missing = [n for n in ("x", "y", "z") if n not in fields]
    if missing:
        raise CloudError(
            f"{topic}: PointCloud2 has no field(s) {missing}; fields are {list(fields)}. "
            "Only clouds with x, y, z fields can be used"
        )
    h, w, step, row = int(msg.height), int(msg.width), int(msg.point_step), int(msg.row_step)
    if h * w == 0:
        return np.zeros((h, w, 3) if organized else (0, 3), np.float32)
    if step <= 0 or row < w * step:
        raise CloudError(f"{topic}: bad PointCloud2 layout (width {w}, point_step {step}, row_step {row})")
    data = np.asarray(msg.data, dtype=np.uint8)
    if data.size < h * row:
        raise CloudError(
            f"{topic}: PointCloud2 data has {data.size} bytes, layout needs {h * row} "
            f"({h} rows x {row} bytes); the message is truncated"
        )
    endian = ">" if msg.is_bigendian else "<"
    formats, offsets = [], []
    for n in ("x", "y", "z"):
        f = fields[n]
        code = POINTFIELD_DTYPES.get(int(f.datatype))
        if code is None:
            raise CloudError(f"{topic}: field {n!r} has unknown PointField datatype {f.datatype}")
        if f.offset + np.dtype(code).itemsize > step:
            raise CloudError(f"{topic}: field {n!r} (offset {f.offset}) lies outside point_step {step}")
        formats.append(endian + code)
        offsets.append(int(f.offset))
    dtype = np.dtype({"names": ["x", "y", "z"], "formats": formats, "offsets": offsets, "itemsize": step})
    rows = data[: h * row].reshape(h, row)[:, : w * step]
    pts = np.ascontiguousarray(rows).view(dtype).reshape(h, w)
    xyz = np.stack([pts["x"], pts["y"], pts["z"]], axis=-1).astype(np.float32)
    if organized:
        return xyz
    flat = xyz.reshape(-1, 3)
    return flat[np.isfinite(flat).all(axis=1)]


# ----------------------------------------------------------------------------------------------
# Poses

POSE_TYPES = (
    "nav_msgs/msg/Odometry",
    "geometry_msgs/msg/PoseStamped",
    "geometry_msgs/msg/PoseWithCovarianceStamped",
    "tf2_msgs/msg/TFMessage",
)


def pose_of(msg: Any, msgtype: str, frames: tuple[str, str] | None = None) -> np.ndarray | None:
    """(x, y, z, qx, qy, qz, qw) of a pose message, or None (a TF message without the wanted frames)."""
    if msgtype == "nav_msgs/msg/Odometry" or msgtype == "geometry_msgs/msg/PoseWithCovarianceStamped":
        p = msg.pose.pose
    elif msgtype == "geometry_msgs/msg/PoseStamped":
        p = msg.pose
    elif msgtype == "tf2_msgs/msg/TFMessage":
        for tr in msg.transforms:
            pair = (tr.header.frame_id.lstrip("/"), tr.child_frame_id.lstrip("/"))
            if frames is None or pair == frames:
                t, r = tr.transform.translation, tr.transform.rotation
                return np.array([t.x, t.y, t.z, r.x, r.y, r.z, r.w], dtype=float)
        return None
    else:
        raise MessageTypeError(f"cannot read a pose from {msgtype}; use one of {POSE_TYPES}")
    return np.array(
        [p.position.x, p.position.y, p.position.z, p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w],
        dtype=float,
    )


def tf_stamp_ns(msg: Any, frames: tuple[str, str]) -> int | None:
    """header.stamp [ns] of the transform ``frames`` in a TFMessage."""
    for tr in msg.transforms:
        if (tr.header.frame_id.lstrip("/"), tr.child_frame_id.lstrip("/")) == frames:
            st = tr.header.stamp
            return int(st.sec) * 1_000_000_000 + int(st.nanosec) or None
    return None


# ----------------------------------------------------------------------------------------------
# Wheel commands


@dataclass(frozen=True)
class SkidSteer:
    """Skid-steer geometry for cmd_vel -> wheel speed: wheel radius r [m], track width [m].

    Conversion (documented choice): left = (v - w * track / 2) / r, right = (v + w * track / 2) / r,
    rear = v / r. The rear wheel sits on the centreline, so its rolling speed only depends on v when
    the robot turns about the front axle's midpoint (the skid-steer approximation).
    """

    wheel_radius: float = 0.36
    track_width: float = 0.72

    def wheels(self, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(N, 3) wheel speeds [rad/s] (left, right, rear) for forward speed v [m/s], yaw rate w [rad/s]."""
        v = np.asarray(v, dtype=float)
        w = np.asarray(w, dtype=float)
        half = self.track_width / 2
        r = self.wheel_radius
        return np.stack([(v - w * half) / r, (v + w * half) / r, v / r], axis=-1)


SIDE_NAMES = ("left", "right", "center")
# [m] a wheel within this of the base's centre line is on the "center" side (also the rule of sysid's
# robot descriptions, `sysid.robot.scenes`)
SIDE_TOL = 1e-3


def side_of(y: float) -> str:
    """A wheel's side from its lateral position y [m] in the base frame (y left)."""
    return "left" if y > SIDE_TOL else "right" if y < -SIDE_TOL else "center"


@dataclass(frozen=True)
class WheelLayout:
    """The driven wheels of a robot as a log names them: one output column per wheel.

    Attributes:
        names: the run's wheel columns, in order (a robot description's wheel names).
        logs: per wheel, the names a log may give it (JointState names; the first one a message
            has drives the wheel, see `joint_indices`); the wheel's own name is always the last of
            them (a run ingested with this layout names its column so).
        sides: per wheel, ``left`` | ``right`` | ``center``.
        wheel_radius: r [m]. track_width: distance between the left and right wheels' mean
            lateral positions [m].
        robot: the robot's name (for messages).

    Twist commands (cmd_vel, or the odometry twist) become wheel speeds through the drive's
    kinematics (documented choice, as `SkidSteer`): a left wheel (v - w * track / 2) / r, a right
    wheel (v + w * track / 2) / r, a wheel on the centre line v / r, for forward speed v [m/s] and
    yaw rate w [rad/s].
    """

    names: tuple[str, ...]
    logs: tuple[tuple[str, ...], ...]
    sides: tuple[str, ...]
    wheel_radius: float
    track_width: float
    robot: str = "robot"

    def __post_init__(self) -> None:
        n = len(self.names)
        if n == 0 or len(self.logs) != n or len(self.sides) != n:
            raise TopicError(f"robot {self.robot}: wheel layout needs one name, log-name list and side per wheel "
                             f"(got {len(self.names)}, {len(self.logs)}, {len(self.sides)})")
        object.__setattr__(self, "logs", tuple(tuple(dict.fromkeys((*(str(v) for v in lg), str(n))))
                                               for n, lg in zip(self.names, self.logs)))
        bad = [s for s in self.sides if s not in SIDE_NAMES]
        if bad:
            raise TopicError(f"robot {self.robot}: wheel side(s) {bad} unknown; one of {list(SIDE_NAMES)}")
        if not (self.wheel_radius > 0 and self.track_width >= 0):
            raise TopicError(f"robot {self.robot}: wheel radius {self.wheel_radius} m / track {self.track_width} m "
                             "must be positive")

    @classmethod
    def from_description(cls, desc: Any) -> WheelLayout:
        """The layout of a `sysid.robot.scenes.RobotDescription` (wheel names, log names, sides, r, track)."""
        return cls(
            names=tuple(str(n) for n in desc.wheel_names),
            logs=tuple(tuple(str(v) for v in lg) for lg in desc.wheel_logs),
            sides=tuple(str(s) for s in desc.wheel_sides),
            wheel_radius=float(desc.wheel_radius),
            track_width=float(desc.track_width),
            robot=str(desc.name),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"robot": self.robot, "wheel_radius": self.wheel_radius, "track_width": self.track_width,
                "wheels": [{"name": n, "log": list(lg), "side": s} for n, lg, s in zip(self.names, self.logs,
                                                                                      self.sides)]}

    def wheels(self, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(..., N) wheel speeds [rad/s] for forward speed v [m/s] and yaw rate w [rad/s] (class doc)."""
        v = np.asarray(v, dtype=float)
        w = np.asarray(w, dtype=float)
        half = self.track_width / 2
        lever = {"left": -half, "right": half, "center": 0.0}
        return np.stack([(v + w * lever[s]) / self.wheel_radius for s in self.sides], axis=-1)

    def describe(self) -> str:
        return ", ".join(f"{n} (log names {list(lg)})" for n, lg in zip(self.names, self.logs))

    def joint_indices(self, names: Sequence[str], topic: str) -> list[int]:
        """Index in a JointState's ``name`` list of each wheel: the first of its log names the message
        has, else the one joint whose name contains the wheel's name (else one of its log names, in
        order; any case; used only when exactly one joint does). TopicError naming the bag's joints
        and the robot's wheels when a wheel has no joint."""
        names = [str(n) for n in names]
        lower = [n.lower() for n in names]
        hits: list[int | None] = []
        exact: list[bool] = []
        for name, logs in zip(self.names, self.logs):
            hit = next((names.index(lg) for lg in logs if lg in names), None)
            exact.append(hit is not None)
            for key in (name, *logs):
                if hit is not None:
                    break
                cands = [i for i, n in enumerate(lower) if key.lower() in n]
                hit = cands[0] if len(cands) == 1 else None
            hits.append(hit)
        # a joint found by its name's part for two wheels (`left` in `left_wheel_j`) drives neither
        shared = {h for h in hits if h is not None and hits.count(h) > 1}
        hits = [None if h in shared and not ex else h for h, ex in zip(hits, exact)]
        out = [h for h in hits if h is not None]
        missing = [n for n, h in zip(self.names, hits) if h is None]
        if missing:
            what = "none" if len(missing) == len(self.names) else f"{len(self.names) - len(missing)}"
            raise TopicError(
                f"{topic}: the JointState's joints {names} match {what} of the {len(self.names)} wheels of robot "
                f"{self.robot} ({self.describe()}); no joint for {missing}. The bag is of another robot, or its "
                "joints are named otherwise: give the right robot (--robot / `robot:`), add the bag's names to "
                "the wheel map (wheels[].log), or list them in the topic map (topics: <role>: joints: [...], one "
                "per wheel in the robot's order)")
        if len(set(out)) != len(out):
            raise TopicError(f"{topic}: two wheels of robot {self.robot} map to the same joint of {names}; "
                             "list the joints in the topic map (topics: <role>: joints: [...])")
        return out

    def run_columns(self, columns: Sequence[str], run: str = "run") -> list[str]:
        """The column of a run's wheel table (``columns``: its names, ``t`` aside) that drives each wheel:
        the first of the wheel's log names it has (exact names: a run's columns were named when it was
        made). DataError when a wheel has no column, or when a column drives no wheel (a log of another
        robot, whose commands would otherwise be dropped without a word)."""
        have = [str(c) for c in columns if str(c) != "t"]
        hits = [next((lg for lg in logs if lg in have), None) for logs in self.logs]
        missing = [f"{n} (log names {list(lg)})" for n, lg, h in zip(self.names, self.logs, hits) if h is None]
        unused = [c for c in have if c not in hits]
        if missing or unused:
            if missing:
                what = "match none of" if len(missing) == len(self.names) else "miss some of"
                why = f"{what} the wheels of robot {self.robot}: no column for {', '.join(missing)}"
                why += f"; and {unused} drive no wheel" if unused else ""
            else:
                why = f"drive the wheels of robot {self.robot} ({self.describe()}), but {unused} drive none of them"
            raise DataError(
                f"run {run!r}: its wheel columns {have} {why}. A log of another robot? Give the robot that recorded "
                "it (--robot / `robot:`), or name the log's columns in the wheel map (wheels[].log)")
        return [str(h) for h in hits]


WHEEL_TYPES = (
    "sensor_msgs/msg/JointState",
    "std_msgs/msg/Float64MultiArray",
    "geometry_msgs/msg/TwistStamped",
    "geometry_msgs/msg/Twist",
)


def joint_indices(names: Sequence[str], joints: Sequence[str] | None, topic: str) -> list[int]:
    """Indices of the (left, right, rear) joints in a JointState's ``name`` list."""
    names = list(names)
    if joints:
        idx = []
        for j in joints:
            if j not in names:
                raise TopicError(
                    f"{topic}: JointState has no joint {j!r}; its joints are {names}. Fix `joints:` in the topic map"
                )
            idx.append(names.index(j))
        return idx
    lower = [n.lower() for n in names]

    def find(*keys: str) -> int | None:
        hits = [i for i, n in enumerate(lower) if any(k in n for k in keys)]
        return hits[0] if len(hits) == 1 else None

    left, right, rear = find("left"), find("right"), find("rear", "back")
    if left is not None and right is not None and rear is not None:
        return [left, right, rear]
    if len(names) == 3:
        return [0, 1, 2]
    raise TopicError(
        f"{topic}: cannot tell the left/right/rear wheel joints apart in {names}; "
        "name them with `joints: [left, right, rear]` in the topic map"
    )


def joint_state_values(msg: Any, field: str, topic: str) -> np.ndarray:
    """A JointState's ``field`` array (velocities by default) as floats; an empty one is a TopicError."""
    vals = np.asarray(getattr(msg, field), dtype=float)
    if vals.size == 0:
        raise TopicError(
            f"{topic}: JointState has an empty {field!r} array; wheel commands need velocities "
            "(set `field:` in the topic map if they are in another field)"
        )
    return vals


def joint_state_pick(vals: np.ndarray, idx: Sequence[int], topic: str, field: str) -> np.ndarray:
    """``vals[idx]``; an index past the JointState's ``field`` array is a TopicError."""
    if max(idx) >= vals.size:
        raise TopicError(f"{topic}: JointState {field} has {vals.size} values, need index {max(idx)}")
    return vals[list(idx)]


def wheels_of(
    msg: Any,
    msgtype: str,
    topic: str,
    geometry: SkidSteer,
    joints: Sequence[str] | None = None,
    indices: Sequence[int] | None = None,
    field: str = "velocity",
    layout: WheelLayout | None = None,
) -> np.ndarray:
    """(left, right, rear) wheel-speed targets [rad/s] from one command message; with a robot's
    ``layout``, one value per wheel of the layout, in its order (`wheels_of_layout`)."""
    if layout is not None:
        return wheels_of_layout(msg, msgtype, topic, layout, joints, indices, field)
    if msgtype == "sensor_msgs/msg/JointState":
        vals = joint_state_values(msg, field, topic)
        idx = joint_indices(msg.name, joints, topic) if msg.name else list(indices or (0, 1, 2))
        return joint_state_pick(vals, idx, topic, field)
    if msgtype == "std_msgs/msg/Float64MultiArray":
        vals = np.asarray(msg.data, dtype=float)
        idx = list(indices or (0, 1, 2))
        if vals.size == 2 and indices is None:
            # Two-wheel command (left, right): the rear wheel follows the mean.
            return np.array([vals[0], vals[1], (vals[0] + vals[1]) / 2])
        if vals.size <= max(idx):
            raise TopicError(
                f"{topic}: Float64MultiArray has {vals.size} values, expected (left, right, rear); "
                "set `indices:` in the topic map"
            )
        return vals[idx]
    if msgtype in ("geometry_msgs/msg/TwistStamped", "geometry_msgs/msg/Twist"):
        tw = msg.twist if msgtype.endswith("Stamped") else msg
        return geometry.wheels(np.array(tw.linear.x), np.array(tw.angular.z)).reshape(3)
    raise MessageTypeError(f"{topic}: cannot read wheel commands from {msgtype}; use one of {WHEEL_TYPES}")


def wheels_of_layout(
    msg: Any,
    msgtype: str,
    topic: str,
    layout: WheelLayout,
    joints: Sequence[str] | None = None,
    indices: Sequence[int] | None = None,
    field: str = "velocity",
) -> np.ndarray:
    """One wheel speed [rad/s] per wheel of ``layout`` from one message.

    JointState: each wheel's joint by name (``joints``: one JointState name per wheel in the
    layout's order; default `WheelLayout.joint_indices`), or by ``indices`` for a nameless one;
    Float64MultiArray: ``indices`` (default 0..N-1), or two values (left, right) given to every
    wheel of that side (centre wheels their mean); Twist / TwistStamped: the drive's kinematics.
    """
    n = len(layout.names)
    if msgtype == "sensor_msgs/msg/JointState":
        vals = joint_state_values(msg, field, topic)
        if msg.name:
            if joints:
                if len(joints) != n:
                    raise TopicError(f"{topic}: the topic map lists {len(joints)} joints {list(joints)} for the "
                                     f"{n} wheels of robot {layout.robot} ({list(layout.names)}); list one per wheel")
                idx = joint_indices(msg.name, joints, topic)
            else:
                idx = layout.joint_indices(msg.name, topic)
        else:
            idx = list(indices) if indices else list(range(n))
            if len(idx) != n:
                raise TopicError(f"{topic}: `indices:` {idx} gives {len(idx)} values for the {n} wheels of robot "
                                 f"{layout.robot}; give one index per wheel")
        return joint_state_pick(vals, idx, topic, field)
    if msgtype == "std_msgs/msg/Float64MultiArray":
        vals = np.asarray(msg.data, dtype=float)
        if vals.size == 2 and indices is None and n != 2:
            side = {"left": vals[0], "right": vals[1], "center": (vals[0] + vals[1]) / 2}
            return np.array([side[s] for s in layout.sides])
        idx = list(indices) if indices else list(range(n))
        if len(idx) != n or vals.size <= max(idx):
            raise TopicError(
                f"{topic}: Float64MultiArray has {vals.size} values; robot {layout.robot} has {n} wheels "
                f"({list(layout.names)}): set `indices:` (one per wheel) in the topic map"
            )
        return vals[idx]
    if msgtype in ("geometry_msgs/msg/TwistStamped", "geometry_msgs/msg/Twist"):
        tw = msg.twist if msgtype.endswith("Stamped") else msg
        return layout.wheels(np.array(tw.linear.x), np.array(tw.angular.z)).reshape(n)
    raise MessageTypeError(f"{topic}: cannot read wheel commands from {msgtype}; use one of {WHEEL_TYPES}")
