"""``ingest inspect``: per-topic types, counts, rates, durations, gaps and clock offsets of a bag."""

from __future__ import annotations

import struct
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from tqdm.auto import tqdm

from .errors import BagReadError
from .reader import BagReader

if TYPE_CHECKING:
    from .topicmap import RobotReader


@dataclass
class TopicStats:
    topic: str
    msgtype: str
    count: int
    decodable: bool
    reason: str = ""
    start_s: float | None = None  # first record time, relative to the bag start [s]
    duration_s: float | None = None
    rate_hz: float | None = None  # mean rate (count - 1) / duration
    max_gap_s: float | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (t, length) longer than 5x median
    clock_offset_s: float | None = None  # median(record - header.stamp)
    header_backwards: int = 0  # header stamps going backwards
    clock: str = "record"  # clock the rate, duration and gaps are measured on
    notes: list[str] = field(default_factory=list)  # what is odd about the stamps


class RoleTopic(TypedDict):
    """The topic that serves one role of a run (`fit_readiness`)."""

    topic: str | None  # None: derived from another topic (the odometry's twist)
    type: str  # message type, or how the role is derived
    auto: bool  # auto-detected (False: named by the topic map)


class FitReadiness(TypedDict):
    """Whether a bag can be fitted, and which topics would serve each role (`fit_readiness`)."""

    roles: dict[str, RoleTopic]
    missing: list[str]  # one sentence per missing input, with what to do
    fittable: bool
    verdict: str  # one line for the report


class BagInfo(TypedDict):
    """Bag-level facts of `inspect_bag`."""

    paths: list[str]
    format: str  # "ROS 1" or "ROS 2"
    undecodable_types: dict[str, str]  # message type -> why it cannot be decoded
    fit: FitReadiness
    start_ns: int  # first record time [ns]
    duration_s: float  # last record time - first [s]
    messages: int


WHEEL_INPUT = "a wheel command or wheel speed topic"
RECORD_WHEELS = "record the wheel commands (e.g. /cmd_vel) or the wheels' speeds (/joint_states)"


def fit_readiness(topics: Mapping[str, Any], topic_map: Any = None, robot_reader: RobotReader | None = None
                  ) -> FitReadiness:
    """Which topics would serve each role of a run and whether the bag can be fitted.

    ``topics``: name -> TopicInfo (``BagReader.topics``); ``topic_map``: a TopicMap, its YAML path or
    None (auto-detection, as ``ingest load`` / ``sysid fit`` without ``--topics``); ``robot_reader``:
    `ingest.topicmap.RobotReader` for its ``robot:``. Returns
    ``{"roles": {role: {"topic", "type", "auto"}}, "missing": [...], "fittable": bool, "verdict": str}``.
    """
    from .errors import IngestError
    from .topicmap import ROLE_TYPES, TF_TYPE, TopicMap

    tmap = topic_map if isinstance(topic_map, TopicMap) else (
        TopicMap.from_yaml(topic_map, robot_reader) if topic_map is not None else TopicMap())
    readable = {t: i for t, i in topics.items() if getattr(i, "decodable", True)}
    try:
        roles = tmap.resolve(readable)
    except IngestError as exc:
        return {"roles": {}, "missing": [], "fittable": False, "verdict": f"cannot be fitted as is: {exc}"}
    out: dict[str, RoleTopic] = {r: {"topic": t, "type": ty, "auto": auto} for r, (t, ty, auto) in roles.items()}
    missing: list[str] = []
    odom = roles.get("odom")
    if odom is None:
        poses = [t for t in ROLE_TYPES["odom"] if t != TF_TYPE]
        text = f"odometry: no topic of type {', '.join(poses)}"
        tf = sorted(t for t, i in readable.items() if i.msgtype == TF_TYPE)
        if tf:  # TF is never taken on its own: it also carries sensor mounts and maps
            text += (f"; {tf[0]} (TF) is the robot's pose only if one of its transforms is (e.g. odom -> base_link): "
                     f"then name it with its frames in a topic map (`topics: odom: {{topic: {tf[0]}, "
                     "frames: [odom, base_link]}`)")
        else:
            text += "; name one in a topic map (`topics: odom: topic: ...`)"
        missing.append(text)
    if tmap.wheel_cmd.source == "odom_twist":
        # the odometry's own twist as the command: the replay is then compared with the motion it was
        # driven by, and no parameter can be identified (docs/robots.md, the real Husky bag)
        missing.append(f"{WHEEL_INPUT}: the topic map derives the wheel commands from the odometry's twist "
                       "(`wheel_cmd: {source: odom_twist}`), the robot's own measured motion, from which a fit "
                       f"identifies nothing; {RECORD_WHEELS}")
        out["wheel_cmd"] = {"topic": odom[0] if odom else None, "type": "odometry twist", "auto": False}
    elif "wheel_cmd" not in roles:
        meas = roles.get("wheel_meas")
        if meas is not None:  # measured wheel speeds serve as the commands (the helhest-real runs are fitted so)
            missing.append(f"{WHEEL_INPUT}: no wheel command; the measured wheel speeds {meas[0]} can drive the "
                           f"replay instead: name them in a topic map (`topics: wheel_cmd: {{topic: {meas[0]}}}`)")
        else:
            kinds = ", ".join(t.rsplit("/", 1)[-1] for t in ROLE_TYPES["wheel_cmd"])
            alone = "; the odometry alone, the robot's own motion, identifies nothing" if odom is not None else ""
            missing.append(f"{WHEEL_INPUT} ({kinds}): none in the bag{alone}; {RECORD_WHEELS}, or name such a "
                           "topic in a topic map (`topics: wheel_cmd: topic: ...`)")
    fittable = not missing
    if fittable:
        verdict = (f"can be fitted: odometry {out['odom']['topic']}, wheel commands {out['wheel_cmd']['topic']}"
                   + ("" if "cloud" in out else "; no lidar cloud: no pallet fit (fine on flat ground)"))
    else:
        verdict = "cannot be fitted: missing " + "; ".join(missing)
    return {"roles": out, "missing": missing, "fittable": fittable, "verdict": verdict}


def inspect_bag(
    source: str | Path | Sequence[str | Path], progress: bool = False, gap_factor: float = 5.0,
    topic_map: Any = None, robot_reader: RobotReader | None = None,
) -> tuple[list[TopicStats], BagInfo]:
    """Scan a bag once; per-topic statistics and bag-level info (files, format, time span, and in
    ``info["fit"]`` which topics would serve as odometry / wheel commands, see ``fit_readiness``;
    ``robot_reader`` reads the topic map's ``robot:``, `ingest.topicmap.RobotReader`)."""
    with BagReader(source) as bag:
        topics = bag.topics
        fit = fit_readiness(topics, topic_map, robot_reader)
        rec: dict[str, list[int]] = {t: [] for t in topics}
        hdr: dict[str, list[int | None]] = {t: [] for t in topics}
        readable = [t for t, i in topics.items() if i.decodable]
        # Messages starting with a std_msgs/Header: read header.stamp straight from the bytes (no
        # full deserialization of e.g. point clouds); the rest are deserialized.
        ts = bag.typestore
        assert ts is not None
        fast = {t for t in readable if _starts_with_header(ts, topics[t].msgtype)}
        slow = [t for t in readable if t not in fast]
        total = sum(topics[t].count for t in readable)
        bar = tqdm(total=total, disable=not progress, desc="scanning", leave=False)
        try:
            for conn, ns, raw in bag._raw(sorted(fast)):
                rec[conn.topic].append(int(ns))
                hdr[conn.topic].append(_raw_stamp(raw, bag.is_ros1))
                bar.update()
        except Exception as err:
            raise BagReadError(f"{bag.paths[0]}: corrupt data while scanning: {type(err).__name__}: {err}") from None
        for m in bag.messages(slow):
            rec[m.topic].append(m.record_ns)
            hdr[m.topic].append(m.header_ns)
            bar.update()
        bar.close()
        # Topics we cannot decode still have record times.
        undecodable = [t for t, i in topics.items() if not i.decodable]
        if undecodable:
            try:
                for conn, ns, _ in bag._raw(undecodable):
                    rec[conn.topic].append(int(ns))
                    hdr[conn.topic].append(None)
            except Exception as err:
                raise BagReadError(f"{bag.paths[0]}: corrupt data while scanning: {err}") from None
        paths = [str(p) for p in bag.paths]
        fmt = "ROS 1" if bag.is_ros1 else "ROS 2"
        undecodable_types = dict(bag.undecodable)
    starts = [v[0] for v in rec.values() if v]
    t0 = min(starts) if starts else 0
    ends = [v[-1] for v in rec.values() if v]
    info: BagInfo = {
        "paths": paths,
        "format": fmt,
        "undecodable_types": undecodable_types,
        "fit": fit,
        "start_ns": int(t0),
        "duration_s": (max(ends) - t0) / 1e9 if ends else 0.0,
        "messages": sum(len(v) for v in rec.values()),
    }
    out = []
    for t, i in sorted(topics.items()):
        r = np.array(rec[t], dtype=np.int64)
        st = TopicStats(t, i.msgtype, int(r.size), i.decodable, i.reason)
        if r.size:
            st.start_s = (r[0] - t0) / 1e9
            st.duration_s = (r[-1] - r[0]) / 1e9
        h = [x for x in hdr[t] if x is not None]
        stamps = r
        if h and len(h) == len(hdr[t]):
            ha = np.array(h, dtype=np.int64)
            st.clock_offset_s = float(np.median((r - ha) / 1e9))
            st.header_backwards = int((np.diff(ha) < 0).sum())
            if not st.header_backwards and _spans_agree(r, ha):
                # header.stamp is the sensor's clock: rates and gaps are measured on it.
                stamps = ha
                st.clock = "header"
                st.duration_s = (ha[-1] - ha[0]) / 1e9
            elif not st.header_backwards and r.size >= 2:
                st.notes.append(
                    f"header.stamp spans {(ha[-1] - ha[0]) / 1e9:.3f} s but the messages were recorded within "
                    f"{(r[-1] - r[0]) / 1e9:.3f} s; rate and gaps from the record times"
                )
        if stamps.size >= 2:
            dt = np.diff(stamps) / 1e9
            span = (stamps[-1] - stamps[0]) / 1e9
            mean = span / (stamps.size - 1)
            if span >= MIN_RATE_SPAN_S and 1.0 / mean <= MAX_RATE_HZ:
                st.rate_hz = 1.0 / mean
            elif stamps.size > 2:
                st.notes.append(
                    f"all {stamps.size} messages within {span * 1e3:.3g} ms on the {st.clock} clock "
                    "(a burst, or stamps that are not real times): no rate or gaps"
                )
            st.max_gap_s = float(dt.max())
            thr = max(gap_factor * mean, 1e-3)
            st.gaps = [] if st.rate_hz is None else [
                (float((stamps[k] - stamps[0]) / 1e9 + (st.start_s or 0.0)), float(dt[k]))
                for k in np.flatnonzero(dt > thr)
            ]
        out.append(st)
    return out, info


MIN_RATE_SPAN_S = 0.01  # [s] below this span a rate means nothing (bursts, synthetic stamps)
MAX_RATE_HZ = 10_000.0  # above this mean rate the messages came in a burst (no robot topic is that fast)


def _spans_agree(rec: np.ndarray, hdr: np.ndarray) -> bool:
    """Header stamps and record times cover about the same time span (within 2x, or both under 10 ms)."""
    if rec.size < 2:
        return True
    a, b = (rec[-1] - rec[0]) / 1e9, (hdr[-1] - hdr[0]) / 1e9
    if max(a, b) < 0.01:
        return True
    return 0.5 <= (b / a if a > 0 else np.inf) <= 2.0


def _starts_with_header(ts: Any, msgtype: str) -> bool:
    fields = ts.fielddefs.get(msgtype, (None, []))[1]
    return bool(fields) and fields[0][0] == "header" and fields[0][1][1] == "std_msgs/msg/Header"


def _raw_stamp(raw: bytes | memoryview, ros1: bool) -> int | None:
    """header.stamp [ns] from serialized bytes (ROS 1: after seq; CDR: after the 4-byte encapsulation)."""
    b = bytes(raw[:12])
    if len(b) < 12:
        raise ValueError("message shorter than its header")
    if ros1:
        sec, nsec = struct.unpack_from("<II", b, 4)
    else:
        endian = "<" if b[1] == 1 else ">"
        sec, nsec = struct.unpack_from(endian + "iI", b, 4)
    ns = sec * 1_000_000_000 + nsec
    return ns or None


def format_report(stats: list[TopicStats], info: BagInfo) -> str:
    """Human-readable table for ``ingest inspect``."""
    lines = [
        f"{info['format']} bag: {', '.join(info['paths'])}",
        f"duration {info['duration_s']:.3f} s, {info['messages']} messages, {len(stats)} topics",
        "",
        f"{'topic':40s} {'type':40s} {'count':>7s} {'rate Hz':>8s} {'dur s':>8s} {'max gap s':>9s} "
        f"{'clock off s':>11s}",
    ]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for s in stats:
        lines.append(
            f"{s.topic:40s} {s.msgtype:40s} {s.count:7d} {f(s.rate_hz, '8.2f')} {f(s.duration_s, '8.2f')} "
            f"{f(s.max_gap_s, '9.3f')} {f(s.clock_offset_s, '11.4f')}"
        )
    notes = []
    for s in stats:
        if not s.decodable:
            notes.append(f"{s.topic}: cannot decode {s.msgtype}: {_short(s.reason, 200)}")
        notes += [f"{s.topic}: {n}" for n in s.notes]
        if s.gaps:
            where = ", ".join(f"t={a:.3f} s ({b:.3f} s)" for a, b in s.gaps[:5])
            more = f" and {len(s.gaps) - 5} more" if len(s.gaps) > 5 else ""
            notes.append(f"{s.topic}: {len(s.gaps)} gap(s) > 5x the mean period at {where}{more}")
        if s.header_backwards:
            notes.append(f"{s.topic}: header.stamp goes backwards {s.header_backwards} time(s)")
    offs = [s.clock_offset_s for s in stats if s.clock_offset_s is not None]
    if offs and max(offs) - min(offs) > 1.0:
        notes.append(
            f"header.stamp clocks differ between topics by {max(offs) - min(offs):.3f} s "
            "(mixed sim/wall time?); consider `time: record` in the topic map"
        )
    if notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in notes]
    fit = info.get("fit")
    if fit:
        lines += ["", "for a fit (odometry and wheel commands; `--topics MAP.yaml` to check a topic map):"]
        names = {"odom": "odometry", "wheel_cmd": "wheel commands", "wheel_meas": "measured wheels",
                 "cloud": "lidar cloud", "imu": "imu"}
        for role, label in names.items():
            r = fit["roles"].get(role)
            if r:
                how = " (auto-detected)" if r["auto"] else " (topic map)"
                lines.append(f"  {label + ':':17s}{r['topic']} [{r['type']}]{how}")
            else:
                lines.append(f"  {label + ':':17s}-")
        lines.append(f"  {fit['verdict']}")
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    """One line of at most ``width`` characters, cut at a word boundary (never mid-word)."""
    return textwrap.shorten(" ".join(str(text).split()), width, placeholder=" ...")
