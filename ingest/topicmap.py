"""Topic-mapping config (YAML): which topic plays which role, plus robot geometry and time policy.

Example ``helhest.yaml``::

    robot: ../models/helhest/robot.yaml   # the robot (robot.yaml, wheel map, URDF or a bundled name):
                                          # its wheels are the run's columns; r / track for cmd_vel
    time: header          # header (default: header.stamp where present) | record
    max_gap_s: 0.5        # a longer silence on odom / wheel_cmd is an error (default: auto)
    disorder: error       # error | sort  (out-of-order stamps)
    topics:
      odom:       {topic: /local_odom, type: nav_msgs/msg/Odometry}
      wheel_cmd:  {topic: /wheel_cmd, joints: [left_wheel_j, right_wheel_j, rear_wheel_j]}
      wheel_meas: {topic: /joint_states}
      cloud:      {topic: /lidar/points}
      imu:        {topic: /imu/data}
    lidar_extrinsic: {xyz: [0.0, 0.0, 0.0], rpy: [0.0, 0.0, 0.0]}   # odom frame -> lidar
    pallet: {size: [1.2, 0.8, 0.144]}
    custom_types:
      my_pkg/msg/WheelCmd: |
        float64 left
        float64 right

Roles left out (or given without ``topic``) are auto-detected by message type and name.

With ``robot:`` (or `TopicMap.with_robot`, ``ingest load --robot``) the run has one wheel column
per driven wheel of that robot, named as its description names them (`WheelLayout`): JointState
joints are matched by the wheel map's log names (``joints:`` lists one per wheel, in the robot's
order), and Twist commands or the odometry twist go through the drive's kinematics. Without it
the wheels are the Helhest's three (left, right, rear).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .bundled import models_dir
from .decode import POSE_TYPES, WHEEL_TYPES, SkidSteer, WheelLayout, side_of
from .errors import ConfigError, MessageTypeError, TopicError
from .fileio import read_yaml
from .inputs import load_yaml, read_text
from .run import PALLET_SIZE
from .yamlerr import yaml_problem

ROLES = ("odom", "wheel_cmd", "wheel_meas", "cloud", "imu")
TF_TYPE = "tf2_msgs/msg/TFMessage"

ROLE_TYPES: dict[str, tuple[str, ...]] = {
    "odom": POSE_TYPES,
    "wheel_cmd": WHEEL_TYPES,
    "wheel_meas": ("sensor_msgs/msg/JointState", "std_msgs/msg/Float64MultiArray"),
    "cloud": ("sensor_msgs/msg/PointCloud2",),
    "imu": ("sensor_msgs/msg/Imu",),
}

# Name hints for auto-detection (a topic's last path segment).
ROLE_HINTS: dict[str, tuple[str, ...]] = {
    "odom": ("odom", "odometry", "local_odom", "pose", "lio", "icp"),
    "wheel_cmd": ("cmd", "cmd_vel", "command", "commands", "target", "setpoint", "wheel_cmd"),
    "wheel_meas": ("joint_states", "wheel_states", "wheel_vel", "measured", "feedback"),
    "cloud": ("points", "cloud", "lidar", "velodyne_points", "os_cloud", "cloud_registered"),
    "imu": ("imu", "data"),
}

MODELS = models_dir()  # the bundled robots (ingest.bundled: the checkout's models/ or the wheel's)
DEFAULT_ROBOT = MODELS / "helhest" / "robot.yaml"


def robot_file(spec: str | Path, base: Path | None = None) -> Path:
    """The description file of ``spec``: a robot.yaml / wheel map / URDF path (relative to ``base``),
    or the name of a bundled robot (``models/<name>/robot.yaml``). ConfigError when neither."""
    p = Path(spec).expanduser()
    if not p.is_absolute() and base is not None and (base / p).exists():
        p = base / p
    if p.is_dir() and (p / "robot.yaml").is_file():
        p = p / "robot.yaml"
    if p.is_file():
        return p
    named = MODELS / str(spec) / "robot.yaml"
    if named.is_file() and "/" not in str(spec):
        return named
    bundled = sorted(q.parent.name for q in MODELS.glob("*/robot.yaml"))
    raise ConfigError(f"robot {str(spec)!r}: no such file, and not a bundled robot {bundled}; give the path of "
                      "its robot.yaml, wheel map or URDF (docs/robots.md)")


# What reads a robot description file that ingest cannot read on its own (a wheel map, a URDF):
# path -> a description with wheel_names, wheel_logs, wheel_sides, wheel_radius, track_width and name
# (`sysid.robot.load_robot`; ingest imports no sysid, so its users pass it). A description it cannot
# read is a ValueError (sysid's RobotDescriptionError is one).
RobotReader = Callable[[Path], Any]

NEEDS_READER = ("robot {path}: a wheel map or URDF needs sysid's robot reader: pass reader=sysid.robot.load_robot "
                "(TopicMap.from_yaml / from_dict(..., robot_reader=...), load_run(..., robot_reader=...)), or use "
                "the `sysid` / `ingest` commands")


def layout_from_robot(spec: str | Path | Any, base: Path | None = None,
                      reader: RobotReader | None = None) -> WheelLayout:
    """The `WheelLayout` of a robot: a `WheelLayout`, a description (`sysid.robot.scenes.RobotDescription`),
    or a file / bundled name (`robot_file`) read by ``reader`` (`RobotReader`). Without a reader a plain
    robot.yaml is read here (`robot_yaml_layout`) and a wheel map or URDF is a ConfigError."""
    if isinstance(spec, WheelLayout):
        return spec
    if hasattr(spec, "wheel_names"):
        return WheelLayout.from_description(spec)
    path = robot_file(spec, base)
    if reader is None:
        return robot_yaml_layout(path)
    try:
        return WheelLayout.from_description(reader(path))
    except ValueError as err:
        raise ConfigError(f"robot {path}: {err}") from None


def robot_yaml_layout(path: str | Path) -> WheelLayout:
    """The `WheelLayout` of a plain robot.yaml (models/helhest/robot.yaml's form), read as
    `sysid.robot.load_robot` reads its wheels: ``wheels.joints[]`` (name; side, else from the
    position's y; log names, else the name and joint), ``wheels.radius`` [m],
    ``skid_steer.track_width`` [m] and ``name``. A wheel map or URDF is a ConfigError (`NEEDS_READER`)."""
    p = Path(path)
    data = None if p.suffix.lower() == ".urdf" else read_yaml(p, ConfigError, "robot description")
    if not isinstance(data, Mapping) or "urdf" in data:
        raise ConfigError(NEEDS_READER.format(path=p))
    try:
        joints = data["wheels"]["joints"]
        names = tuple(str(j["name"]) for j in joints)
        sides = (tuple(str(j["side"]) for j in joints) if all("side" in j for j in joints)
                 else tuple(side_of(float(j["position"][1])) for j in joints))
        logs = tuple(tuple(str(v) for v in ([j["log"]] if isinstance(j["log"], str) else j["log"])) if j.get("log")
                     else tuple(dict.fromkeys((n, str(j.get("joint", n))))) for n, j in zip(names, joints))
        return WheelLayout(names=names, logs=logs, sides=sides, wheel_radius=float(data["wheels"]["radius"]),
                           track_width=float(data["skid_steer"]["track_width"]), robot=str(data["name"]))
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise ConfigError(f"robot description {p}: cannot read name, wheels.radius, wheels.joints (name, position) "
                          f"/ skid_steer.track_width ({err!r})") from None


@dataclass
class TopicSpec:
    """One role's topic. ``None`` fields are auto-detected.

    Attributes:
        topic: topic name. type: expected message type (checked when given).
        joints: JointState joint names for (left, right, rear).
        indices: Float64MultiArray / nameless JointState indices for (left, right, rear).
        field: JointState field holding the wheel speeds ("velocity").
        frames: TF (parent, child) for a TFMessage pose source.
        source: wheel_cmd only: "odom_twist" derives wheel speeds from the odometry twist.
        scale: factor applied to wheel values (e.g. -1 for an inverted wheel convention).
    """

    topic: str | None = None
    type: str | None = None
    joints: list[str] | None = None
    indices: list[int] | None = None
    field: str = "velocity"
    frames: tuple[str, str] | None = None
    source: str | None = None
    scale: float = 1.0


@dataclass
class TopicMap:
    """Per-robot ingest configuration; see the module docstring for the YAML form."""

    odom: TopicSpec = field(default_factory=TopicSpec)
    wheel_cmd: TopicSpec = field(default_factory=TopicSpec)
    wheel_meas: TopicSpec = field(default_factory=TopicSpec)
    cloud: TopicSpec = field(default_factory=TopicSpec)
    imu: TopicSpec = field(default_factory=TopicSpec)
    geometry: SkidSteer = field(default_factory=lambda: _default_geometry())
    wheels: WheelLayout | None = None  # the robot's driven wheels (module doc); None: the Helhest's three
    time: str = "header"
    max_gap_s: float | None = None
    disorder: str = "error"
    custom_types: dict[str, str] = field(default_factory=dict)
    lidar_xyz: tuple[float, float, float] = (0.0, 0.0, 0.0)
    lidar_rpy: tuple[float, float, float] = (0.0, 0.0, 0.0)
    pallet_size: tuple[float, float, float] = PALLET_SIZE
    max_clouds: int = 200  # clouds decoded for the pallet fit (evenly spread over the bag)
    cloud_range_m: float | None = 25.0  # lidar points farther than this are dropped [m]

    def spec(self, role: str) -> TopicSpec:
        spec: TopicSpec = getattr(self, role)  # one field per role (ROLES)
        return spec

    def with_robot(self, robot: str | Path | Any, base: Path | None = None,
                   reader: RobotReader | None = None) -> TopicMap:
        """A copy whose wheels (and cmd_vel geometry) are those of ``robot`` (`layout_from_robot`)."""
        lay = layout_from_robot(robot, base, reader)
        return dataclasses.replace(self, wheels=lay, geometry=SkidSteer(lay.wheel_radius, lay.track_width))

    @property
    def wheel_names(self) -> tuple[str, ...]:
        """The run's wheel columns: the robot's wheels, or the Helhest's (left, right, rear)."""
        return self.wheels.names if self.wheels is not None else ("left", "right", "rear")

    def twist_wheels(self, v: Any, w: Any) -> Any:
        """Wheel speeds [rad/s] of the run's wheels for forward speed v [m/s] and yaw rate w [rad/s]."""
        if self.wheels is not None:
            return self.wheels.wheels(v, w)
        return self.geometry.wheels(v, w)

    # -- YAML ---------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, source: str | Path, robot_reader: RobotReader | None = None) -> TopicMap:
        """Load from a YAML file path (or a YAML string containing a newline); ``robot_reader`` reads
        its ``robot:`` (`layout_from_robot`)."""
        text: str
        base = Path.cwd()
        if isinstance(source, Path) or "\n" not in str(source):
            p = Path(source)
            text = read_text(p, "topic map", ConfigError, "yaml", missing=f"topic map {p} not found")
            base = p.resolve().parent
            where: Path | None = p
        else:
            text = str(source)
            where = None
        try:
            data = load_yaml(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"topic map is not valid YAML: {yaml_problem(err, where)}") from None
        return cls.from_dict(data, base, robot_reader)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: Path | None = None,
                  robot_reader: RobotReader | None = None) -> TopicMap:
        if not isinstance(data, Mapping):
            raise ConfigError("topic map must be a YAML mapping")
        known = {
            "robot",
            "geometry",
            "time",
            "max_gap_s",
            "disorder",
            "topics",
            "custom_types",
            "lidar_extrinsic",
            "pallet",
            "wheels",
        }
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"topic map: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
        tm = cls()
        if data.get("robot") is not None:
            tm = tm.with_robot(str(data["robot"]), base, robot_reader)
        if data.get("wheels") is not None:
            w = data["wheels"]
            try:
                tm.wheels = WheelLayout(
                    names=tuple(str(e["name"]) for e in w["wheels"]),
                    logs=tuple(tuple(str(v) for v in e.get("log") or [e["name"]]) for e in w["wheels"]),
                    sides=tuple(str(e["side"]) for e in w["wheels"]),
                    wheel_radius=float(w["wheel_radius"]),
                    track_width=float(w["track_width"]),
                    robot=str(w.get("robot", "robot")),
                )
            except (KeyError, TypeError, ValueError) as err:
                raise ConfigError(
                    f"topic map: `wheels:` needs wheel_radius, track_width and wheels: [{{name, side, log}}] ({err})"
                ) from None
            tm.geometry = SkidSteer(tm.wheels.wheel_radius, tm.wheels.track_width)
        if "geometry" in data:
            g = data["geometry"] or {}
            tm.geometry = SkidSteer(
                float(g.get("wheel_radius", tm.geometry.wheel_radius)),
                float(g.get("track_width", tm.geometry.track_width)),
            )
        tm.time = str(data.get("time", tm.time))
        if tm.time not in ("header", "record"):
            raise ConfigError(f"topic map: time must be 'header' or 'record', got {tm.time!r}")
        tm.disorder = str(data.get("disorder", tm.disorder))
        if tm.disorder not in ("error", "sort"):
            raise ConfigError(f"topic map: disorder must be 'error' or 'sort', got {tm.disorder!r}")
        if data.get("max_gap_s") is not None:
            tm.max_gap_s = float(data["max_gap_s"])
        topics = data.get("topics") or {}
        if not isinstance(topics, Mapping):
            raise ConfigError("topic map: `topics` must be a mapping role -> {topic: ...}")
        for role, spec in topics.items():
            if role not in ROLES:
                raise ConfigError(f"topic map: unknown role {role!r}; roles are {list(ROLES)}")
            if isinstance(spec, str):
                spec = {"topic": spec}
            names = {f.name for f in dataclasses.fields(TopicSpec)}
            bad = set(spec) - names
            if bad:
                raise ConfigError(f"topic map: role {role!r} has unknown keys {sorted(bad)}; use {sorted(names)}")
            spec = dict(spec)
            if spec.get("frames") is not None:
                spec["frames"] = tuple(spec["frames"])
            setattr(tm, role, TopicSpec(**spec))
        tm.custom_types = dict(data.get("custom_types") or {})
        ext = data.get("lidar_extrinsic") or {}
        tm.lidar_xyz = tuple(float(v) for v in ext.get("xyz", tm.lidar_xyz))  # type: ignore[assignment]
        tm.lidar_rpy = tuple(float(v) for v in ext.get("rpy", tm.lidar_rpy))  # type: ignore[assignment]
        pal = data.get("pallet") or {}
        unknown_pal = set(pal) - {"size", "max_clouds", "cloud_range_m"}
        if unknown_pal:
            raise ConfigError(f"topic map: unknown pallet keys {sorted(unknown_pal)}")
        if "size" in pal:
            tm.pallet_size = tuple(float(v) for v in pal["size"])  # type: ignore[assignment]
            if len(tm.pallet_size) != 3 or min(tm.pallet_size) <= 0:
                raise ConfigError(f"topic map: pallet size must be 3 positive lengths [m], got {pal['size']}")
        if "max_clouds" in pal:
            tm.max_clouds = max(1, int(pal["max_clouds"]))
        if "cloud_range_m" in pal:
            tm.cloud_range_m = None if pal["cloud_range_m"] is None else float(pal["cloud_range_m"])
        return tm

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (round-trips through ``from_dict``; used as the cache key)."""
        topics = {}
        for role in ROLES:
            s = dataclasses.asdict(self.spec(role))
            if s.get("frames") is not None:
                s["frames"] = list(s["frames"])
            topics[role] = {k: v for k, v in s.items() if v is not None}
        out: dict[str, Any] = {
            "geometry": {"wheel_radius": self.geometry.wheel_radius, "track_width": self.geometry.track_width},
            "time": self.time,
            "max_gap_s": self.max_gap_s,
            "disorder": self.disorder,
            "topics": topics,
            "custom_types": dict(self.custom_types),
            "lidar_extrinsic": {"xyz": list(self.lidar_xyz), "rpy": list(self.lidar_rpy)},
            "pallet": {
                "size": list(self.pallet_size),
                "max_clouds": self.max_clouds,
                "cloud_range_m": self.cloud_range_m,
            },
        }
        if self.wheels is not None:
            out["wheels"] = self.wheels.to_dict()
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    # -- resolution against a bag ---------------------------------------------------------------
    def resolve(self, topics: Mapping[str, Any]) -> dict[str, tuple[str, str, bool]]:
        """Role -> (topic, msgtype, auto_detected) for the roles found in ``topics`` (name -> info).

        Named topics must exist with an allowed type (``TopicError`` / ``MessageTypeError`` otherwise,
        listing the bag's topics); unnamed roles are auto-detected and silently absent when no
        topic fits.
        """
        listing = ", ".join(f"{t} [{i.msgtype}]" for t, i in sorted(topics.items())) or "(none)"
        out: dict[str, tuple[str, str, bool]] = {}
        used: set[str] = set()
        for role in ROLES:
            spec = self.spec(role)
            if spec.topic is None:
                continue
            info = topics.get(spec.topic)
            if info is None:
                last = spec.topic.strip("/").split("/")[-1]
                close = [t for t in topics if t.strip("/").split("/")[-1] == last]
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise TopicError(
                    f"{role} topic {spec.topic!r} is not in the bag.{hint} Topics in the bag: {listing}. "
                    f"Fix `topics: {role}: topic:` in the topic map, or remove it to auto-detect"
                )
            allowed = (spec.type,) if spec.type else ROLE_TYPES[role]
            if info.msgtype not in allowed:
                raise MessageTypeError(
                    f"{role} topic {spec.topic!r} carries {info.msgtype}, expected {' or '.join(allowed)}. "
                    "Point the role at a topic of that type in the topic map"
                )
            out[role] = (spec.topic, info.msgtype, False)
            used.add(spec.topic)
        # Auto-detect in an order where the more specific roles claim topics first.
        for role in ("odom", "cloud", "imu", "wheel_meas", "wheel_cmd"):
            if role in out or self.spec(role).topic is not None:
                continue
            if role == "wheel_cmd" and self.wheel_cmd.source == "odom_twist":
                continue
            types = (self.spec(role).type,) if self.spec(role).type else ROLE_TYPES[role]
            cands = [(t, i) for t, i in topics.items() if i.msgtype in types and t not in used]
            if role == "wheel_meas":
                # Only claim measured speeds when the name says so (a JointState could be the command).
                cands = [(t, i) for t, i in cands if _score(t, role) > 0]
            if role == "odom":
                # TF carries every frame of a system (sensor mounts, maps): it is the robot's pose only
                # when a topic map names it with its frames, never by auto-detection.
                cands = [c for c in cands if c[1].msgtype != TF_TYPE]
            if not cands:
                continue
            scored = sorted(
                ((_score(t, role), types.index(i.msgtype) * -1, t, i) for t, i in cands),
                key=lambda x: (x[0], x[1]),
                reverse=True,
            )
            best = scored[0]
            ties = [s for s in scored if (s[0], s[1]) == (best[0], best[1])]
            if len(ties) > 1:
                raise TopicError(
                    f"cannot auto-detect the {role} topic: {[s[2] for s in ties]} all fit equally. "
                    f"Name one in the topic map (`topics: {role}: topic: ...`)"
                )
            out[role] = (best[2], best[3].msgtype, True)
            used.add(best[2])
        return out


def _score(topic: str, role: str) -> int:
    last = topic.strip("/").split("/")[-1].lower()
    hints = ROLE_HINTS[role]
    if last in hints:
        return 3
    full = topic.lower()
    if any(re.search(rf"(^|[/_]){re.escape(h)}", full) for h in hints):
        return 2
    return 0


def _default_geometry() -> SkidSteer:
    if DEFAULT_ROBOT.exists():
        try:
            lay = robot_yaml_layout(DEFAULT_ROBOT)
            return SkidSteer(lay.wheel_radius, lay.track_width)
        except (ConfigError, TopicError):
            pass
    return SkidSteer()
