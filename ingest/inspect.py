"""``ingest inspect``: per-topic types, counts, rates, durations, gaps and clock offsets of a bag."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .errors import BagReadError
from .reader import BagReader


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
    clock: str = "record"  # clock the rate and gaps are measured on


def inspect_bag(
    source: str | Path | Sequence[str | Path], progress: bool = False, gap_factor: float = 5.0
) -> tuple[list[TopicStats], dict[str, Any]]:
    """Scan a bag once; per-topic statistics and bag-level info (files, format, time span)."""
    with BagReader(source) as bag:
        topics = bag.topics
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
        info = {
            "paths": [str(p) for p in bag.paths],
            "format": "ROS 1" if bag.is_ros1 else "ROS 2",
            "undecodable_types": dict(bag.undecodable),
        }
    starts = [v[0] for v in rec.values() if v]
    t0 = min(starts) if starts else 0
    ends = [v[-1] for v in rec.values() if v]
    info["start_ns"] = int(t0)
    info["duration_s"] = (max(ends) - t0) / 1e9 if ends else 0.0
    info["messages"] = sum(len(v) for v in rec.values())
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
            if not st.header_backwards:
                # header.stamp is the sensor's clock: rates and gaps are measured on it.
                stamps = ha
                st.clock = "header"
        if stamps.size >= 2:
            dt = np.diff(stamps) / 1e9
            span = (stamps[-1] - stamps[0]) / 1e9
            mean = span / (stamps.size - 1)
            st.rate_hz = 1.0 / mean if mean > 0 else None
            st.max_gap_s = float(dt.max())
            thr = max(gap_factor * mean, 1e-3)
            st.gaps = [
                (float((stamps[k] - stamps[0]) / 1e9 + (st.start_s or 0.0)), float(dt[k]))
                for k in np.flatnonzero(dt > thr)
            ]
        out.append(st)
    return out, info


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


def format_report(stats: list[TopicStats], info: dict[str, Any]) -> str:
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
            notes.append(f"{s.topic}: cannot decode {s.msgtype}: {' '.join(s.reason.split())[:160]}")
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
    return "\n".join(lines)
