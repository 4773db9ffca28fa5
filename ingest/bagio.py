"""Write ROS 1 / ROS 2 bags and build the messages ingest reads (tests, synthetic data).

Formats (``fmt``):

- ``"ros1"``: a ROS 1 ``.bag`` (optionally bz2/lz4 chunk compression, optionally split in parts).
- ``"ros2-sqlite3"``: a ROS 2 bag directory with ``metadata.yaml`` and one ``.db3``.
- ``"ros2-mcap"``: a ROS 2 bag directory with ``metadata.yaml`` and one ``.mcap``.

A path ending in ``.bag`` / ``.db3`` / ``.mcap`` selects the format; a ``.db3`` / ``.mcap`` path gets a
bare storage file without ``metadata.yaml`` (readers take those too).

Determinism: the same messages give byte-identical files. ROS 1 stores only record times and
message definitions; the mcap writer of rosbags stores log/publish time = the given stamp and the
library name ``rosbags-<version>`` (no wall time); sqlite3 stores no time of writing either.

Message builders take an optional ``ros`` version (1 or 2, default 2). ``write_bag`` converts
messages built for the other ROS version field by field (ROS 1 ``Header.seq`` becomes 0), so one
set of builders serves every format.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from rosbags.interfaces import Nodetype
from rosbags.rosbag1 import Writer as Writer1
from rosbags.rosbag2 import StoragePlugin
from rosbags.rosbag2 import Writer as Writer2
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from .errors import ConfigError, UnknownTypeError
from .transforms import yaw_to_quat

FORMATS = ("ros1", "ros2-sqlite3", "ros2-mcap")


class BagMessage(NamedTuple):
    """One message to write: topic, type name (``pkg/msg/Name``), record time [ns], message object."""

    topic: str
    msgtype: str
    stamp_ns: int
    msg: Any


# Standard types the rosbags Noetic store lacks (tf2_msgs lives outside its package set).
ROS1_EXTRA_TYPES = {"tf2_msgs/msg/TFMessage": "geometry_msgs/TransformStamped[] transforms\n"}


@cache
def typestore(ros: int = 2) -> Typestore:
    """The stock typestore for ROS 1 (Noetic, plus tf2_msgs) or ROS 2 (Humble). Shared; do not register."""
    return _fresh_store(ros)


def _fresh_store(ros: int) -> Typestore:
    ts = get_typestore(Stores.ROS1_NOETIC if ros == 1 else Stores.ROS2_HUMBLE)
    if ros == 1:
        typs: dict[str, Any] = {}
        for name, text in ROS1_EXTRA_TYPES.items():
            typs.update(get_types_from_msg(text, name))
        ts.register(typs)
    return ts


def _store(ros: int, custom_types: Mapping[str, str] | None = None) -> Typestore:
    if not custom_types:
        return typestore(ros)
    ts = _fresh_store(ros)
    typs: dict[str, Any] = {}
    for name, text in custom_types.items():
        typs.update(get_types_from_msg(text, name))
    ts.register(typs)
    return ts


# ---------------------------------------------------------------------------------------------
# Message builders (SI units; stamps in integer nanoseconds)


def _t(ros: int) -> Typestore:
    return typestore(ros)


def time_msg(stamp_ns: int, ros: int = 2) -> Any:
    """builtin_interfaces/Time from integer nanoseconds."""
    sec, nsec = divmod(int(stamp_ns), 1_000_000_000)
    return _t(ros).types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec)


def header(stamp_ns: int, frame_id: str = "", ros: int = 2, seq: int = 0) -> Any:
    """std_msgs/Header with ``header.stamp`` = ``stamp_ns`` [ns]."""
    cls = _t(ros).types["std_msgs/msg/Header"]
    if ros == 1:
        return cls(seq=seq, stamp=time_msg(stamp_ns, ros), frame_id=frame_id)
    return cls(stamp=time_msg(stamp_ns, ros), frame_id=frame_id)


def _stamped(msgtype: str, stamp_ns: int, frame_id: str, ros: int, **fields: Any) -> Any:
    """A message of type ``msgtype`` with a ``header`` stamped ``stamp_ns`` [ns] in ``frame_id``."""
    return _t(ros).types[msgtype](header=header(stamp_ns, frame_id, ros), **fields)


def _vec3(v: Sequence[float], ros: int) -> Any:
    return _t(ros).types["geometry_msgs/msg/Vector3"](x=float(v[0]), y=float(v[1]), z=float(v[2]))


def _point(v: Sequence[float], ros: int) -> Any:
    return _t(ros).types["geometry_msgs/msg/Point"](x=float(v[0]), y=float(v[1]), z=float(v[2]))


def _quat(q: Sequence[float], ros: int) -> Any:
    return _t(ros).types["geometry_msgs/msg/Quaternion"](x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3]))


def _pose(position: Sequence[float], orientation: Sequence[float], ros: int) -> Any:
    return _t(ros).types["geometry_msgs/msg/Pose"](position=_point(position, ros), orientation=_quat(orientation, ros))


def yaw_quat(yaw: float) -> tuple[float, float, float, float]:
    """Quaternion (x, y, z, w) of a rotation by ``yaw`` [rad] about z."""
    x, y, z, w = (float(v) for v in yaw_to_quat(yaw))
    return (x, y, z, w)


def odometry(
    stamp_ns: int,
    position: Sequence[float],
    orientation: Sequence[float] = (0.0, 0.0, 0.0, 1.0),
    linear: Sequence[float] = (0.0, 0.0, 0.0),
    angular: Sequence[float] = (0.0, 0.0, 0.0),
    frame_id: str = "odom",
    child_frame_id: str = "base_link",
    ros: int = 2,
) -> Any:
    """nav_msgs/Odometry: pose [m, quaternion x,y,z,w] and body twist [m/s, rad/s]."""
    t = _t(ros).types
    return _stamped(
        "nav_msgs/msg/Odometry",
        stamp_ns,
        frame_id,
        ros,
        child_frame_id=child_frame_id,
        pose=t["geometry_msgs/msg/PoseWithCovariance"](
            pose=_pose(position, orientation, ros), covariance=np.zeros(36, dtype=np.float64)
        ),
        twist=t["geometry_msgs/msg/TwistWithCovariance"](
            twist=t["geometry_msgs/msg/Twist"](linear=_vec3(linear, ros), angular=_vec3(angular, ros)),
            covariance=np.zeros(36, dtype=np.float64),
        ),
    )


def pose_stamped(
    stamp_ns: int,
    position: Sequence[float],
    orientation: Sequence[float] = (0.0, 0.0, 0.0, 1.0),
    frame_id: str = "odom",
    ros: int = 2,
) -> Any:
    """geometry_msgs/PoseStamped."""
    return _stamped("geometry_msgs/msg/PoseStamped", stamp_ns, frame_id, ros, pose=_pose(position, orientation, ros))


def tf_message(
    stamp_ns: int,
    translation: Sequence[float],
    rotation: Sequence[float] = (0.0, 0.0, 0.0, 1.0),
    frame_id: str = "odom",
    child_frame_id: str = "base_link",
    ros: int = 2,
) -> Any:
    """tf2_msgs/TFMessage with one transform parent ``frame_id`` -> ``child_frame_id``."""
    t = _t(ros).types
    tr = _stamped(
        "geometry_msgs/msg/TransformStamped",
        stamp_ns,
        frame_id,
        ros,
        child_frame_id=child_frame_id,
        transform=t["geometry_msgs/msg/Transform"](translation=_vec3(translation, ros), rotation=_quat(rotation, ros)),
    )
    return t["tf2_msgs/msg/TFMessage"](transforms=[tr])


def joint_state(
    stamp_ns: int,
    names: Sequence[str],
    velocity: Sequence[float],
    position: Sequence[float] | None = None,
    effort: Sequence[float] | None = None,
    ros: int = 2,
) -> Any:
    """sensor_msgs/JointState: joint velocities [rad/s] (and optional positions [rad], efforts [N m])."""

    def arr(v: Sequence[float] | None) -> np.ndarray:
        return np.asarray([] if v is None else v, dtype=np.float64)

    return _stamped(
        "sensor_msgs/msg/JointState",
        stamp_ns,
        "",
        ros,
        name=list(names),
        position=arr(position),
        velocity=arr(velocity),
        effort=arr(effort),
    )


def float64_multiarray(values: Sequence[float], labels: Sequence[str] = (), ros: int = 2) -> Any:
    """std_msgs/Float64MultiArray (no header: the record time is its only time)."""
    t = _t(ros).types
    dims = [
        t["std_msgs/msg/MultiArrayDimension"](label=lab, size=len(values) if i == 0 else 1, stride=len(values))
        for i, lab in enumerate(labels)
    ]
    return t["std_msgs/msg/Float64MultiArray"](
        layout=t["std_msgs/msg/MultiArrayLayout"](dim=dims, data_offset=0),
        data=np.asarray(values, dtype=np.float64),
    )


def twist(linear: Sequence[float] = (0.0, 0.0, 0.0), angular: Sequence[float] = (0.0, 0.0, 0.0), ros: int = 2) -> Any:
    """geometry_msgs/Twist: linear [m/s], angular [rad/s] in the base frame."""
    return _t(ros).types["geometry_msgs/msg/Twist"](linear=_vec3(linear, ros), angular=_vec3(angular, ros))


def twist_stamped(
    stamp_ns: int,
    linear: Sequence[float] = (0.0, 0.0, 0.0),
    angular: Sequence[float] = (0.0, 0.0, 0.0),
    frame_id: str = "base_link",
    ros: int = 2,
) -> Any:
    """geometry_msgs/TwistStamped."""
    return _stamped("geometry_msgs/msg/TwistStamped", stamp_ns, frame_id, ros, twist=twist(linear, angular, ros))


def imu(
    stamp_ns: int,
    orientation: Sequence[float] = (0.0, 0.0, 0.0, 1.0),
    angular_velocity: Sequence[float] = (0.0, 0.0, 0.0),
    linear_acceleration: Sequence[float] = (0.0, 0.0, 9.81),
    frame_id: str = "imu_link",
    ros: int = 2,
) -> Any:
    """sensor_msgs/Imu: orientation (x,y,z,w), angular velocity [rad/s], acceleration [m/s^2]."""
    z9 = np.zeros(9, dtype=np.float64)
    return _stamped(
        "sensor_msgs/msg/Imu",
        stamp_ns,
        frame_id,
        ros,
        orientation=_quat(orientation, ros),
        orientation_covariance=z9.copy(),
        angular_velocity=_vec3(angular_velocity, ros),
        angular_velocity_covariance=z9.copy(),
        linear_acceleration=_vec3(linear_acceleration, ros),
        linear_acceleration_covariance=z9.copy(),
    )


# PointField datatypes (sensor_msgs/PointField constants) -> numpy kinds.
POINTFIELD_DTYPES: dict[int, str] = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}
_NP_TO_POINTFIELD = {np.dtype(v).kind + str(np.dtype(v).itemsize): k for k, v in POINTFIELD_DTYPES.items()}


def point_cloud2(
    stamp_ns: int,
    points: np.ndarray,
    frame_id: str = "lidar",
    extra: Mapping[str, np.ndarray] | None = None,
    is_bigendian: bool = False,
    point_step: int | None = None,
    row_padding: int = 0,
    xyz_dtype: str = "f4",
    ros: int = 2,
) -> Any:
    """sensor_msgs/PointCloud2 from (N, 3) points or an organized (H, W, 3) grid [m].

    ``extra`` adds per-point fields (e.g. ``{"intensity": f32 array}``) after x, y, z. ``point_step``
    larger than the packed size pads every point; ``row_padding`` pads every row by that many bytes;
    ``is_bigendian`` writes big-endian values. NaN points are kept (is_dense = False).
    """
    pts = np.asarray(points)
    if pts.ndim == 2:
        pts = pts[None]
    if pts.ndim != 3 or pts.shape[-1] != 3:
        raise ConfigError("points must be (N, 3) or (H, W, 3)")
    height, width = pts.shape[:2]
    endian = ">" if is_bigendian else "<"
    names = ["x", "y", "z"]
    dtypes = [xyz_dtype] * 3
    values = [pts[..., 0], pts[..., 1], pts[..., 2]]
    for name, val in (extra or {}).items():
        val = np.asarray(val).reshape(height, width)
        names.append(name)
        dtypes.append(val.dtype.kind + str(val.dtype.itemsize))
        values.append(val)
    offsets = []
    off = 0
    for dt in dtypes:
        offsets.append(off)
        off += np.dtype(dt).itemsize
    step = max(off, point_step or 0)
    dtype = np.dtype({"names": names, "formats": [endian + d for d in dtypes], "offsets": offsets, "itemsize": step})
    arr = np.zeros((height, width), dtype=dtype)
    for name, val in zip(names, values):
        arr[name] = val
    rows = arr.view(np.uint8).reshape(height, width * step)
    if row_padding:
        rows = np.concatenate([rows, np.zeros((height, row_padding), np.uint8)], axis=1)
    t = _t(ros).types
    fields = [
        t["sensor_msgs/msg/PointField"](name=n, offset=o, datatype=_NP_TO_POINTFIELD[d], count=1)
        for n, o, d in zip(names, offsets, dtypes)
    ]
    return _stamped(
        "sensor_msgs/msg/PointCloud2",
        stamp_ns,
        frame_id,
        ros,
        height=height,
        width=width,
        fields=fields,
        is_bigendian=is_bigendian,
        point_step=step,
        row_step=width * step + row_padding,
        data=np.ascontiguousarray(rows).reshape(-1),
        is_dense=bool(np.isfinite(pts).all()),
    )


# ---------------------------------------------------------------------------------------------
# Conversion between ROS 1 and ROS 2 message classes


def _default(ts: Typestore, desc: tuple[Any, Any]) -> Any:
    node, arg = desc
    if node == Nodetype.BASE:
        kind = arg[0]
        return "" if kind == "string" else (False if kind == "bool" else 0)
    if node == Nodetype.NAME:
        cls = ts.types[arg]
        return cls(**{n: _default(ts, d) for n, d in ts.fielddefs[arg][1]})
    sub, count = arg
    if sub[0] == Nodetype.BASE and sub[1][0] not in ("string", "bool"):
        return np.zeros(count if node == Nodetype.ARRAY else 0, dtype=sub[1][0])
    return [_default(ts, sub) for _ in range(count if node == Nodetype.ARRAY else 0)]


def convert_message(msg: Any, msgtype: str, ts: Typestore) -> Any:
    """``msg`` rebuilt with the classes of typestore ``ts`` (fields matched by name, missing ones zero)."""
    if msgtype not in ts.fielddefs:
        raise UnknownTypeError(f"type {msgtype!r} is not in the target typestore")
    if type(msg) is ts.types[msgtype]:
        return msg
    kwargs = {}
    for name, desc in ts.fielddefs[msgtype][1]:
        if not hasattr(msg, name):
            kwargs[name] = _default(ts, desc)
            continue
        val = getattr(msg, name)
        match desc:
            case (Nodetype.NAME, str() as sub):
                kwargs[name] = convert_message(val, sub, ts)
            case (Nodetype.ARRAY | Nodetype.SEQUENCE, ((Nodetype.NAME, str() as sub), _)):
                kwargs[name] = [convert_message(v, sub, ts) for v in val]
            case _:
                kwargs[name] = val
    return ts.types[msgtype](**kwargs)


# ---------------------------------------------------------------------------------------------
# Writing


def _infer_format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise ConfigError(f"unknown bag format {fmt!r}; choose one of {FORMATS}")
        return fmt
    suffix = path.suffix
    if suffix == ".bag":
        return "ros1"
    if suffix == ".db3":
        return "ros2-sqlite3"
    if suffix == ".mcap":
        return "ros2-mcap"
    raise ConfigError(f"cannot infer the bag format of {path}; pass fmt= one of {FORMATS}")


def write_bag(
    path: str | Path,
    messages: Iterable[BagMessage | tuple[str, str, int, Any]],
    fmt: str | None = None,
    compression: str | None = None,
    custom_types: Mapping[str, str] | None = None,
    split: int = 1,
) -> list[Path]:
    """Write ``messages`` (topic, msgtype, record time [ns], message) to a new bag at ``path``.

    Args:
        path: ``x.bag`` (ROS 1), a directory (ROS 2, needs ``fmt``), or ``x.db3`` / ``x.mcap`` (bare
            ROS 2 storage file without metadata.yaml).
        fmt: ``"ros1"``, ``"ros2-sqlite3"`` or ``"ros2-mcap"`` (default: from the suffix).
        compression: ROS 1 chunk compression ``"bz2"`` / ``"lz4"``; ROS 2 ``"zstd"`` (mcap: chunk
            compression, recorded in the file; sqlite3: per message).
        custom_types: extra message definitions, type name -> ``.msg`` text, embedded in the bag.
        split: ROS 1 only: write the messages (in the given order) into this many files
            ``x_0.bag``, ``x_1.bag``, ... (a split recording).

    Returns:
        The paths written (one, or ``split`` for a split ROS 1 bag).

    Messages are written in the given order; record times need not be sorted (to build bad bags).
    """
    path = Path(path)
    kind = _infer_format(path, fmt)
    msgs = [BagMessage(*m) for m in messages]
    ros = 1 if kind == "ros1" else 2
    ts = _store(ros, custom_types)
    if kind == "ros1":
        if split <= 1:
            _write_ros1(path, msgs, ts, compression)
            return [path]
        parts = np.array_split(np.arange(len(msgs)), split)
        out = []
        for i, idx in enumerate(parts):
            p = path.with_name(f"{path.stem}_{i}{path.suffix}")
            _write_ros1(p, [msgs[j] for j in idx], ts, compression)
            out.append(p)
        return out
    if split != 1:
        raise ConfigError("split is only supported for ROS 1 bags")
    plugin = StoragePlugin.MCAP if kind == "ros2-mcap" else StoragePlugin.SQLITE3
    if path.suffix in (".db3", ".mcap"):
        if path.exists():
            raise FileExistsError(f"{path} exists already, not overwriting")
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            inner = Path(tmp) / path.stem
            _write_ros2(inner, msgs, ts, plugin, compression)
            shutil.move(str(inner / f"{path.stem}{path.suffix}"), path)
        return [path]
    _write_ros2(path, msgs, ts, plugin, compression)
    return [path]


def _write_ros1(path: Path, msgs: list[BagMessage], ts: Typestore, compression: str | None) -> None:
    writer = Writer1(path)
    if compression:
        writer.set_compression(Writer1.CompressionFormat[compression.upper()])
    with writer:
        _write_messages(writer, msgs, ts, ts.serialize_ros1)


def _write_ros2(
    path: Path, msgs: list[BagMessage], ts: Typestore, plugin: StoragePlugin, compression: str | None
) -> None:
    writer = Writer2(path, version=9, storage_plugin=plugin)
    if compression:
        from rosbags.rosbag2 import CompressionFormat, CompressionMode

        # mcap: zstd chunk compression, which the file itself records (any mcap reader decompresses
        # it); per-message compression would be recorded only in metadata.yaml. sqlite3 has no
        # chunks: per message (ingest's reader recognises the zstd frames of a bare .db3 too).
        mode = CompressionMode.STORAGE if plugin == StoragePlugin.MCAP else CompressionMode.MESSAGE
        writer.set_compression(mode, CompressionFormat[compression.upper()])
    with writer:
        _write_messages(writer, msgs, ts, ts.serialize_cdr)


def _write_messages(
    writer: Writer1 | Writer2, msgs: list[BagMessage], ts: Typestore, serialize: Callable[[object, str], Any]
) -> None:
    """Write ``msgs`` in order to the open ``writer``: one connection per (topic, type), each message
    converted to ``ts``'s definition of its type and encoded by ``serialize`` (ROS 1 or CDR)."""
    conns: dict[tuple[str, str], Any] = {}
    for m in msgs:
        key = (m.topic, m.msgtype)
        if key not in conns:
            conns[key] = writer.add_connection(m.topic, m.msgtype, typestore=ts)
        writer.write(conns[key], int(m.stamp_ns), serialize(convert_message(m.msg, m.msgtype, ts), m.msgtype))


def message_fields(msg: object) -> object:
    """A message as nested plain dicts (numpy arrays kept), for comparing messages in tests: a dict per
    message, a list per list, the field's value at the leaves."""
    if dataclasses.is_dataclass(msg):
        return {f.name: message_fields(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
    if isinstance(msg, list):
        return [message_fields(v) for v in msg]
    return msg
