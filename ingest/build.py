"""From decoded streams to a ``Run``: one clock, resampled commands, interpolated odometry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .decode import cloud_to_xyz, pose_of, tf_stamp_ns, wheels_of
from .errors import CloudError, ConfigError, DataError, IngestError, TimestampError, TopicError
from .inspect import RoleTopic
from .reader import BagReader
from .run import Run
from .timeline import check_times, interp_linear, interp_quat, step_average, zoh
from .topicmap import ROLE_TYPES, RobotReader, TopicMap
from .transforms import quat_mul, quat_to_euler, yaw_to_quat

RESAMPLE = ("zoh", "average")


@dataclass
class Stream:
    """One role's samples: times [s] on the run clock and values (N, k)."""

    topic: str
    msgtype: str
    t: np.ndarray
    values: np.ndarray
    clock: str  # "header" or "record"
    offset_s: float | None  # median(record - header) [s]
    report: Any = None


@dataclass
class Clouds:
    """Point clouds: stamps [s] on the run clock and (N_i, 3) float32 points in the lidar frame."""

    topic: str
    t: np.ndarray
    points: list[np.ndarray] = field(default_factory=list)
    empty: int = 0


# What each value column of a decoded stream holds (for messages naming the bad field).
VALUE_FIELDS: dict[str, tuple[str, ...]] = {
    "odom": ("position.x", "position.y", "position.z", "orientation.x", "orientation.y", "orientation.z",
             "orientation.w"),
    "wheel_cmd": ("left wheel", "right wheel", "rear wheel"),
    "wheel_meas": ("left wheel", "right wheel", "rear wheel"),
}

def as_topicmap(
    config: TopicMap | str | Path | dict[str, Any] | None, robot_reader: RobotReader | None = None
) -> TopicMap:
    """The topic map of ``config`` (`load_run`'s); ``robot_reader`` reads its ``robot:`` (`RobotReader`)."""
    if config is None:
        return TopicMap()
    if isinstance(config, TopicMap):
        return config
    if isinstance(config, dict):
        return TopicMap.from_dict(config, robot_reader=robot_reader)
    return TopicMap.from_yaml(config, robot_reader)


def _choose_times(rec: np.ndarray, hdr: list[int | None], policy: str) -> tuple[np.ndarray, str, float | None]:
    have = np.array([h is not None for h in hdr])
    offset = None
    if have.any():
        h = np.array([x if x is not None else 0 for x in hdr], dtype=np.int64)
        offset = float(np.median((rec[have] - h[have]).astype(np.float64)) / 1e9)
    if policy == "header" and have.all():
        return np.array(hdr, dtype=np.int64), "header", offset
    return rec.astype(np.int64), "record", offset


class StreamsInfo(TypedDict):
    """What `read_streams` found: the topic of each role, and the TF frames taken as the pose."""

    roles: dict[str, RoleTopic]
    tf_frames: NotRequired[list[str]]  # (parent, child) when the odometry is a TF transform


def read_streams(
    bag: BagReader, tmap: TopicMap, progress: bool = True, want_clouds: bool = True
) -> tuple[dict[str, tuple[np.ndarray, list[int | None], list[Any], str, str]], StreamsInfo]:
    """One pass over the bag: raw (record ns, header ns, values, topic, type) per role."""
    roles = tmap.resolve(bag.topics)
    if "odom" not in roles:
        raise TopicError(
            f"no odometry topic in {bag.paths[0]} (looked for {', '.join(ROLE_TYPES['odom'])}). "
            f"Topics in the bag: {bag.topic_list()}. Name it in the topic map (`topics: odom: topic:`)"
        )
    if "wheel_cmd" not in roles and tmap.wheel_cmd.source != "odom_twist":
        raise TopicError(
            f"no wheel-command topic in {bag.paths[0]} (looked for {', '.join(ROLE_TYPES['wheel_cmd'])}). "
            f"Topics in the bag: {bag.topic_list()}. Name it in the topic map, or set "
            "`topics: wheel_cmd: {source: odom_twist}` to derive wheel speeds from the odometry twist"
        )
    if tmap.wheel_cmd.source == "odom_twist" and roles["odom"][1] != "nav_msgs/msg/Odometry":
        raise TopicError("wheel_cmd source odom_twist needs a nav_msgs/Odometry odom topic")
    if not want_clouds:
        roles.pop("cloud", None)
    if tmap.imu.topic is None:
        roles.pop("imu", None)  # IMU is only read (rates, clock report) when the map names it
    for topic, _, _ in roles.values():
        bag.require(topic)
    by_topic: dict[str, list[str]] = {}
    for role, (topic, _, _) in roles.items():
        by_topic.setdefault(topic, []).append(role)
    raw: dict[str, tuple[list[int], list[int | None], list[Any]]] = {r: ([], [], []) for r in roles}
    if tmap.wheel_cmd.source == "odom_twist":
        raw["wheel_cmd"] = ([], [], [])
    frames = tmap.odom.frames
    if roles["odom"][1] == "tf2_msgs/msg/TFMessage" and frames is None:
        frames = _detect_tf_frames(bag, roles["odom"][0])
    stride = {}
    if "cloud" in roles:
        # Decode at most ~max_clouds clouds, evenly spread: the fit needs coverage, not every scan.
        ct = roles["cloud"][0]
        stride[ct] = max(1, -(-bag.topics[ct].count // tmap.max_clouds))
    total = sum(bag.topics[t].count // stride.get(t, 1) for t in by_topic)
    it = bag.messages(list(by_topic), stride=stride)
    for m in tqdm(it, total=total, desc=f"reading {bag.name}", unit="msg", disable=not progress, leave=False):
        for role in by_topic[m.topic]:
            rec, hdr, vals = raw[role]
            if role == "odom":
                pose = pose_of(m.msg, m.msgtype, frames)
                if pose is None:
                    continue
                h = tf_stamp_ns(m.msg, frames) if m.msgtype == "tf2_msgs/msg/TFMessage" and frames else m.header_ns
                rec.append(m.record_ns)
                hdr.append(h)
                vals.append(pose)
                if tmap.wheel_cmd.source == "odom_twist":
                    tw = m.msg.twist.twist
                    w = tmap.twist_wheels(np.array(tw.linear.x), np.array(tw.angular.z)).reshape(-1)
                    raw["wheel_cmd"][0].append(m.record_ns)
                    raw["wheel_cmd"][1].append(h)
                    raw["wheel_cmd"][2].append(w * tmap.wheel_cmd.scale)
            elif role in ("wheel_cmd", "wheel_meas"):
                spec = tmap.spec(role)
                w = wheels_of(m.msg, m.msgtype, m.topic, tmap.geometry, spec.joints, spec.indices, spec.field,
                              layout=tmap.wheels)
                rec.append(m.record_ns)
                hdr.append(m.header_ns)
                vals.append(w * spec.scale)
            elif role == "cloud":
                rec.append(m.record_ns)
                hdr.append(m.header_ns)
                xyz = cloud_to_xyz(m.msg, topic=m.topic)
                if tmap.cloud_range_m:
                    # Only the neighbourhood matters for the pallet; far points cost memory.
                    xyz = xyz[np.einsum("ij,ij->i", xyz, xyz) <= tmap.cloud_range_m**2]
                vals.append(xyz)
            elif role == "imu":
                msg = m.msg
                rec.append(m.record_ns)
                hdr.append(m.header_ns)
                vals.append(
                    np.array(
                        [
                            msg.angular_velocity.x,
                            msg.angular_velocity.y,
                            msg.angular_velocity.z,
                            msg.linear_acceleration.x,
                            msg.linear_acceleration.y,
                            msg.linear_acceleration.z,
                        ]
                    )
                )
    out = {}
    for role, (rec, hdr, vals) in raw.items():
        topic, msgtype = (roles[role][0], roles[role][1]) if role in roles else (roles["odom"][0], "odom_twist")
        out[role] = (np.array(rec, dtype=np.int64), hdr, vals, topic, msgtype)
    info: StreamsInfo = {"roles": {r: {"topic": v[0], "type": v[1], "auto": v[2]} for r, v in roles.items()}}
    if frames:
        info["tf_frames"] = list(frames)
    return out, info


def _detect_tf_frames(bag: BagReader, topic: str) -> tuple[str, str]:
    counts: dict[tuple[str, str], int] = {}
    for i, m in enumerate(bag.messages([topic])):
        for tr in m.msg.transforms:
            pair = (tr.header.frame_id.lstrip("/"), tr.child_frame_id.lstrip("/"))
            counts[pair] = counts.get(pair, 0) + 1
        if i > 500:
            break
    base = [p for p in counts if "base" in p[1]]
    if len(base) == 1:
        return base[0]
    raise TopicError(
        f"{topic}: cannot tell which TF transform is the robot pose among {sorted(counts)}; "
        "set `topics: odom: {topic: /tf, frames: [odom, base_link]}` in the topic map"
    )


def streams_from_raw(
    raw: dict[str, Any], tmap: TopicMap
) -> tuple[dict[str, Stream], Clouds | None, int, dict[str, Any]]:
    """Choose the clock per role, validate times, and express them in seconds from a common origin."""
    chosen: dict[str, tuple[np.ndarray, str, float | None]] = {}
    for role, (rec, hdr, _vals, topic, _) in raw.items():
        if len(rec) == 0:
            raise TimestampError(f"{role} topic {topic!r}: no usable messages in the bag")
        chosen[role] = _choose_times(rec, hdr, tmap.time)
    origin = int(min(chosen["odom"][0].min(), chosen["wheel_cmd"][0].min()))
    streams: dict[str, Stream] = {}
    clouds = None
    report: dict[str, Any] = {"clock_offsets_s": {}, "clocks": {}, "rates_hz": {}, "duplicates": {}}
    for role, (_rec, _hdr, vals, topic, msgtype) in raw.items():
        t_ns, clock, offset = chosen[role]
        t = (t_ns - origin).astype(np.float64) / 1e9
        report["clock_offsets_s"][topic] = offset
        report["clocks"][topic] = clock
        if role == "cloud":
            order = np.argsort(t, kind="stable")
            pts = [vals[i] for i in order]
            clouds = Clouds(topic, t[order], pts, sum(1 for p in pts if len(p) == 0))
            continue
        name = f"{role} topic {topic!r}"
        gap = tmap.max_gap_s if role in ("odom", "wheel_cmd") else (tmap.max_gap_s or np.inf)
        order, rep = check_times(t, name, gap, tmap.disorder)
        values = np.asarray(vals, dtype=float)[order]
        bad = ~np.isfinite(values)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            names = tuple(f"{w} wheel" for w in tmap.wheel_names) if role in ("wheel_cmd", "wheel_meas") else \
                VALUE_FIELDS.get(role, ())
            field = names[j] if values.ndim == 2 and j < len(names) else f"column {j}"
            t_rel = t[order[i]] - t[order[0]]
            raise DataError(
                f"{name}: sample {int(order[i])} at t={t_rel:.3f} s from the topic's start has a non-finite "
                f"{field} ({values[i, j]}); {int(bad.any(axis=1).sum())} bad samples. Fix the log or cut the run"
            )
        report["rates_hz"][topic] = rep.rate_hz
        report["duplicates"][topic] = rep.duplicates
        streams[role] = Stream(topic, msgtype, t[order], values, clock, offset, rep)
    # Mixed clocks (one topic on header stamps in sim time, another on wall time) show as offsets.
    offs = [o for o in report["clock_offsets_s"].values() if o is not None]
    report["clock_offset_spread_s"] = float(max(offs) - min(offs)) if offs else 0.0
    return streams, clouds, origin, report


def normalize_quats(q: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        n = np.linalg.norm(q, axis=1)
    bad = ~np.isfinite(n) | (n < 1e-6)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: orientation quaternion {i} is {q[i].tolist()} (norm {n[i]}); the pose source does not "
            "fill a valid orientation"
        )
    unit: np.ndarray = q / n[:, None]
    return unit


MAX_SAMPLES = 20_000_000  # samples of a resampled run: 55 h at 0.01 s, a few GiB of tables
# warn when the overlap of odometry and wheel log cuts off more than this much odometry [s] and share of it
OVERLAP_WARN_S = 0.5
OVERLAP_WARN_SHARE = 0.9


def make_run(
    name: str,
    t_odom: np.ndarray,
    pose: np.ndarray,
    t_cmd: np.ndarray,
    cmd: np.ndarray,
    dt: float | None = 0.01,
    resample: str = "zoh",
    normalize_start: bool = True,
    resample_odom: bool = True,
    t_meas: np.ndarray | None = None,
    meas: np.ndarray | None = None,
    meta: dict[str, Any] | None = None,
    wheel_names: tuple[str, ...] | list[str] = ("left", "right", "rear"),
) -> Run:
    """Build a Run from sample arrays on one clock [s].

    ``pose`` is (N, 7) (x, y, z, qx, qy, qz, qw); ``cmd``/``meas`` (M, n) [rad/s], one column per
    name of ``wheel_names`` (default the Helhest's left, right, rear).
    The run covers the overlap of odometry and commands; its clock starts at 0 there. With ``dt``,
    commands are resampled to the step (``resample`` = "zoh": value held from the last sample;
    "average": mean of the held signal over each step) and odometry is interpolated on the same grid
    (linear positions, slerp orientations) unless ``resample_odom`` is False (native odometry stamps
    within the overlap). ``normalize_start`` moves the first pose to the origin with zero yaw.
    """
    if resample not in RESAMPLE:
        raise IngestError(f"resample must be one of {RESAMPLE}, got {resample!r}")
    meta = dict(meta or {})
    q = normalize_quats(pose[:, 3:7], f"{name}: odometry")
    t0 = max(t_odom[0], t_cmd[0])
    t1 = min(t_odom[-1], t_cmd[-1])
    if dt is not None and dt <= 0:
        raise IngestError(f"dt must be > 0 s, got {dt}")
    if t1 - t0 < (dt or 0.0) * 2 or t1 <= t0:
        raise TimestampError(
            f"{name}: odometry [{t_odom[0]:.3f}, {t_odom[-1]:.3f}] s and wheel commands "
            f"[{t_cmd[0]:.3f}, {t_cmd[-1]:.3f}] s do not overlap. If their clocks differ (see "
            "meta clock_offsets_s), use `time: record` in the topic map"
        )
    lost = (t_odom[-1] - t_odom[0]) - (t1 - t0)  # [s] of odometry outside the overlap, cut off
    if lost > OVERLAP_WARN_S and t1 - t0 < OVERLAP_WARN_SHARE * (t_odom[-1] - t_odom[0]):
        meta["warnings"] = [*meta.get("warnings", []),
            f"{name}: the wheel log [{t_cmd[0]:.2f}, {t_cmd[-1]:.2f}] s overlaps the odometry [{t_odom[0]:.2f}, "
            f"{t_odom[-1]:.2f}] s for only {t1 - t0:.2f} s: the run is cut from {t_odom[-1] - t_odom[0]:.2f} s to "
            f"{t1 - t0:.2f} s (are both logs of one drive, on one clock?)"]
    if dt is not None:
        n = int(np.floor((t1 - t0) / dt + 1e-9)) + 1
        if n > MAX_SAMPLES:
            columns = 12 + 2 * cmd.shape[1]  # odometry's columns, the commands' and the measured speeds'
            raise ConfigError(
                f"{name}: resampling its {t1 - t0:.1f} s at dt = {dt:g} s would make {n:.3g} samples "
                f"(about {n * columns * 8 / 2**30:.3g} GiB), more than {MAX_SAMPLES:,}; give a dt of at least "
                f"{(t1 - t0) / MAX_SAMPLES:.2g} s (data.ingest.dt, --dt; 0.01 s is usual)")
        grid = t0 + dt * np.arange(n)
        if resample == "average":
            grid = grid[grid + dt <= t1 + 1e-9]
            cmd_g = step_average(t_cmd, cmd, grid, dt)
        else:
            cmd_g = zoh(t_cmd, cmd, grid)
        t_cmd_out = grid
    else:
        sel = (t_cmd >= t0) & (t_cmd <= t1)
        t_cmd_out, cmd_g = t_cmd[sel], cmd[sel]
        grid = None
    if resample_odom and grid is not None:
        tg = grid
        pos = interp_linear(t_odom, pose[:, :3], tg)
        quat = interp_quat(t_odom, q, tg)
    else:
        sel = (t_odom >= t0 - 1e-12) & (t_odom <= t1 + 1e-12)
        tg, pos, quat = t_odom[sel], pose[sel, :3], q[sel]
    start = {"x": float(pos[0, 0]), "y": float(pos[0, 1]), "z": float(pos[0, 2])}
    yaw0 = float(quat_to_euler(quat[0])[0])
    start["yaw"] = yaw0
    if normalize_start:
        c, s = np.cos(-yaw0), np.sin(-yaw0)
        d = pos - pos[0]
        pos = np.stack([c * d[:, 0] - s * d[:, 1], s * d[:, 0] + c * d[:, 1], d[:, 2]], axis=1)
        quat = quat_mul(np.broadcast_to(yaw_to_quat(-yaw0), quat.shape), quat)
    yaw, pitch, roll = quat_to_euler(quat)
    yaw = np.unwrap(yaw)
    odom = pd.DataFrame(
        {
            "t": tg - t0,
            "x": pos[:, 0],
            "y": pos[:, 1],
            "z": pos[:, 2],
            "qx": quat[:, 0],
            "qy": quat[:, 1],
            "qz": quat[:, 2],
            "qw": quat[:, 3],
            "yaw": yaw,
            "pitch": pitch,
            "roll": roll,
        }
    )
    names = [str(n) for n in wheel_names]
    if cmd_g.ndim != 2 or cmd_g.shape[1] != len(names):
        raise IngestError(f"{name}: wheel commands have {cmd_g.shape[-1] if cmd_g.ndim else 0} columns, "
                          f"expected one per wheel {names}")
    wheel_cmd = pd.DataFrame({"t": t_cmd_out - t0, **{w: cmd_g[:, i] for i, w in enumerate(names)}})
    wheel_meas = None
    if t_meas is not None and meas is not None and len(t_meas) >= 2:
        tm = t_cmd_out if grid is not None else t_meas[(t_meas >= t0) & (t_meas <= t1)]
        mv = interp_linear(t_meas, meas, tm)
        wheel_meas = pd.DataFrame({"t": tm - t0, **{w: mv[:, i] for i, w in enumerate(names)}})
    meta.update(
        {
            "dt": dt,
            "resample": resample,
            "odom_resampled": bool(resample_odom and grid is not None),
            "normalized_start": normalize_start,
            "start_pose": start,
            "t0_s": float(t0),
        }
    )
    return Run(name=name, odom=odom, wheel_cmd=wheel_cmd, wheel_meas=wheel_meas, meta=meta)


def world_to_run(run: Run, xy: np.ndarray, yaw: float | None = None) -> tuple[np.ndarray, float | None]:
    """Express a world (odometry-frame) point / heading in the run's normalised frame."""
    if not run.meta.get("normalized_start"):
        return xy, yaw
    st = run.meta["start_pose"]
    c, s = np.cos(-st["yaw"]), np.sin(-st["yaw"])
    d = np.asarray(xy, dtype=float) - np.array([st["x"], st["y"]])
    out = np.array([c * d[0] - s * d[1], s * d[0] + c * d[1]])
    return out, (None if yaw is None else yaw - st["yaw"])


def check_clouds(clouds: Clouds) -> None:
    """Raise ``CloudError`` if no cloud has a finite point."""
    if not clouds.points or all(len(p) == 0 for p in clouds.points):
        raise CloudError(
            f"cloud topic {clouds.topic!r}: all {len(clouds.points)} clouds are empty or all-NaN; "
            "check the lidar driver output, or remove the cloud topic from the topic map to skip the pallet fit"
        )


__all__ = ["Clouds", "Stream", "as_topicmap", "make_run", "read_streams", "streams_from_raw", "world_to_run"]
