"""Open ROS 1 / ROS 2 bags robustly and iterate deserialized messages.

Wraps ``rosbags``: every library exception is turned into an ``IngestError`` subclass at this
boundary. Differences from ``rosbags.highlevel.AnyReader`` (and why):

- Types are resolved per connection. Definitions embedded in the bag win; types without one fall
  back to the stock ROS 1 Noetic / ROS 2 Humble definitions (AnyReader uses the default typestore
  only when *no* connection has a definition, which breaks bags with mixed definitions).
- A definition that does not parse (e.g. raw ``.srv`` text of service-event topics in mcap) makes only
  that topic undecodable; the bag's other topics still read.
- Accepted inputs: a ROS 1 ``.bag`` or a list / directory / glob of split ``.bag`` files; a ROS 2 bag
  directory (``metadata.yaml``, split files); a bare ``.db3`` / ``.mcap`` or a directory of them
  without ``metadata.yaml``. The format is checked by the file's magic bytes, not only its suffix.
"""

from __future__ import annotations

import glob
import heapq
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from rosbags.interfaces import Connection, MessageDefinitionFormat, Nodetype
from rosbags.rosbag1 import Reader as Reader1
from rosbags.rosbag2 import Reader as Reader2
from rosbags.typesys import get_types_from_idl, get_types_from_msg
from rosbags.typesys.store import Typestore

from .errors import BagReadError, TopicError, UnknownTypeError
from .inputs import input_problem
from .mcapmeta import ZSTD_MAGIC

# Python 3.14 has zstd in the standard library; rosbags depends on the backport before that.
if sys.version_info >= (3, 14):  # pragma: no cover - depends on the Python version
    from compression import zstd
else:
    from backports import zstd

# Upper bound on any sequence length while deserializing: a corrupt length prefix must fail fast
# instead of allocating gigabytes.
MAX_SEQUENCE_LENGTH = 1 << 26

EMBEDDED_BROKEN = "its definition embedded in the bag does not parse"  # a damaged schema record
MAGIC = {b"#ROSBAG V2.0": "ros1", b"\x89MCAP0\r\n": "mcap", b"SQLite format 3\x00": "sqlite3"}


def sniff(path: Path) -> str | None:
    """File kind from magic bytes: "ros1", "mcap", "sqlite3", or None (unknown/empty)."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as err:
        raise BagReadError(f"cannot read {path}: {err.strerror or err}; check the path and permissions") from None
    for magic, kind in MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def _kind_name(kind: str | None) -> str:
    return {"ros1": "ROS 1 bag", "mcap": "mcap file", "sqlite3": "sqlite3 file"}.get(kind or "", "unknown")


def resolve_paths(source: str | Path | Sequence[str | Path]) -> tuple[str, list[Path]]:
    """Classify a bag argument: ("ros1", [split files]) or ("ros2", [a directory or storage files])."""
    if isinstance(source, (str, Path)):
        s = str(source)
        if any(ch in s for ch in "*?["):
            paths = [Path(p) for p in sorted(glob.glob(s))]
            if not paths:
                raise BagReadError(f"no files match {s!r}; check the pattern")
        else:
            paths = [Path(source)]
    else:
        paths = [Path(p) for p in source]
        if not paths:
            raise BagReadError("no bag paths given; pass a .bag, a ROS 2 bag directory, .db3 or .mcap")
    for p in paths:  # a named pipe or device would block the read below; a link loop is not "missing"
        problem = None if p.is_dir() else input_problem(p)
        if problem is not None and problem != "does not exist":
            raise BagReadError(f"bag {str(p)!r} {problem}")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise BagReadError(f"bag not found: {', '.join(missing)}; check the path (relative to {Path.cwd()})")

    if len(paths) == 1 and paths[0].is_dir():
        d = paths[0]
        if (d / "metadata.yaml").exists():
            return "ros2", [d]
        bags = sorted(d.glob("*.bag"))
        if bags:
            paths = bags
        else:
            stores = sorted([*d.glob("*.db3"), *d.glob("*.mcap")])
            if not stores:
                raise BagReadError(
                    f"{d} is a directory without metadata.yaml, .bag, .db3 or .mcap files; "
                    "point at a bag file or a ROS 2 bag directory"
                )
            paths = stores
    kinds = []
    for p in paths:
        if p.is_dir():
            raise BagReadError(f"{p} is a directory; pass either one ROS 2 bag directory or bag files")
        kind = sniff(p)
        if kind is None:
            size = p.stat().st_size
            if p.suffix.lower() == ".json" and size:
                raise BagReadError(
                    f"{p} is a JSON run (helhest format), not a bag: `ingest load {p}` and sysid read it; "
                    "`ingest inspect` reads bags only"
                )
            what = "empty" if size == 0 else f"{size} bytes, no ROS 1/mcap/sqlite3 signature"
            fix = (" (`rosbag reindex` repairs an unindexed ROS 1 bag, not a truncated one)"
                   if p.suffix.lower() == ".bag" else "")
            raise BagReadError(
                f"{p} is not a bag ({what}); it may be truncated or not a ROS bag at all. "
                f"Re-copy or re-record it{fix}"
            )
        kinds.append(kind)
    if all(k == "ros1" for k in kinds):
        return "ros1", paths
    if all(k in ("mcap", "sqlite3") for k in kinds):
        fixed = []
        for p, k in zip(paths, kinds):
            want = ".mcap" if k == "mcap" else ".db3"
            if p.suffix != want:
                raise BagReadError(f"{p} is a {_kind_name(k)} but is named {p.suffix!r}; rename it to *{want}")
            fixed.append(p)
        return "ros2", fixed
    raise BagReadError(f"mixed bag kinds {sorted(set(kinds))} in {[str(p) for p in paths]}; read them separately")


@dataclass
class TopicInfo:
    """One topic of an open bag."""

    topic: str
    msgtype: str
    count: int
    decodable: bool
    reason: str = ""  # why not decodable


@dataclass
class Message:
    """A deserialized message with its record time [ns] and, when it has one, ``header.stamp`` [ns]."""

    topic: str
    msgtype: str
    record_ns: int
    header_ns: int | None
    msg: Any


def stamp_ns(msg: Any) -> int | None:
    """``header.stamp`` of a message in ns (TFMessage: its first transform's), None when absent or zero."""
    hdr = getattr(msg, "header", None)
    if hdr is None:
        tfs = getattr(msg, "transforms", None)
        if tfs:
            hdr = getattr(tfs[0], "header", None)
    st = getattr(hdr, "stamp", None) if hdr is not None else None
    if st is None:
        return None
    ns = int(st.sec) * 1_000_000_000 + int(st.nanosec)
    return ns if ns != 0 else None


def _store_module(ros1: bool) -> Any:
    return import_module("rosbags.typesys.stores." + ("ros1_noetic" if ros1 else "ros2_humble"))


def _referenced(typs: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for _, fields in typs.values():
        for _, desc in fields:
            node, arg = desc
            if node == Nodetype.NAME:
                out.add(arg)
            elif node in (Nodetype.ARRAY, Nodetype.SEQUENCE) and arg[0][0] == Nodetype.NAME:
                out.add(arg[0][1])
    return out


def _decompressed(gen: Iterator[tuple[Connection, int, Any]]) -> Iterator[tuple[Connection, int, Any]]:
    """ROS 2 payloads with per-message zstd compression decompressed (a CDR payload starts with a zero
    byte, a zstd frame with its magic), whatever metadata.yaml says or whether there is one: a bare
    ``.mcap`` / ``.db3`` of a bag recorded with ``compression_mode: message`` reads like its directory."""
    for conn, ns, raw in gen:
        if raw[:4] == ZSTD_MAGIC:
            raw = zstd.decompress(raw)
        yield conn, ns, raw


class BagReader:
    """A bag opened for reading. Use as a context manager::

        with BagReader("run.bag") as bag:
            print(bag.topics)
            for m in bag.messages(["/odom"]):
                ...

    ``extra_types`` maps type names to ``.msg`` definitions for custom types the bag does not embed.
    """

    def __init__(self, source: str | Path | Sequence[str | Path], extra_types: Mapping[str, str] | None = None) -> None:
        self.kind, self.paths = resolve_paths(source)
        self.extra_types = dict(extra_types or {})
        self._readers: list[Any] = []
        self.connections: list[Connection] = []
        self.undecodable: dict[str, str] = {}
        self.typestore: Typestore | None = None
        self._open = False

    @property
    def is_ros1(self) -> bool:
        return self.kind == "ros1"

    @property
    def name(self) -> str:
        p = self.paths[0]
        return p.stem if p.is_file() else p.name

    def __enter__(self) -> BagReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Open every file; raise ``BagReadError`` naming the file when one is corrupt."""
        if self._open:
            return
        try:
            for p in self.paths:
                reader = Reader1(p) if self.is_ros1 else Reader2(p)
                try:
                    reader.open()
                except Exception as err:
                    raise BagReadError(
                        f"cannot open {p} ({_kind_name(sniff(p)) if p.is_file() else 'ROS 2 bag directory'}): "
                        f"{type(err).__name__}: {err}. The file is truncated or corrupt; re-copy it or run "
                        f"{'`rosbag reindex`' if self.is_ros1 else '`ros2 bag reindex`'} on it"
                    ) from None
                self._readers.append(reader)
            self.connections = [c for r in self._readers for c in r.connections]
            self._build_typestore()
        except BaseException:
            self.close()
            raise
        self._open = True

    def close(self) -> None:
        for r in self._readers:
            try:
                r.close()
            except Exception:  # noqa: S110 - closing a broken reader must not mask the real error
                pass
        self._readers = []
        self._open = False

    def _build_typestore(self) -> None:
        base_mod = _store_module(self.is_ros1)
        merged: dict[str, Any] = dict(base_mod.FIELDDEFS)
        if self.is_ros1:
            from .bagio import ROS1_EXTRA_TYPES

            for name, text in ROS1_EXTRA_TYPES.items():
                merged.update(get_types_from_msg(text, name))
        parsed: dict[str, dict[str, Any]] = {}
        for name, text in self.extra_types.items():
            try:
                parsed[name] = dict(get_types_from_msg(text, name))
            except Exception as err:
                from .errors import ConfigError

                raise ConfigError(f"custom type {name!r}: definition does not parse: {err}") from None
        for conn in self.connections:
            if conn.msgtype in parsed or conn.msgtype in self.undecodable:
                continue
            fmt, data = conn.msgdef.format, conn.msgdef.data
            if fmt == MessageDefinitionFormat.NONE or not data:
                continue
            try:
                if fmt == MessageDefinitionFormat.MSG:
                    typs = dict(get_types_from_msg(data, conn.msgtype))
                else:
                    sep = "=" * 80 + "\n"
                    typs = {}
                    if data.startswith(f"{sep}IDL: "):
                        for part in data.split(sep)[1:]:
                            typs.update(get_types_from_idl(part.split("\n", 1)[1]))
                    else:
                        typs.update(get_types_from_idl(data))
            except Exception as err:
                first = " ".join(str(err).split())
                self.undecodable[conn.msgtype] = (
                    f"{EMBEDDED_BROKEN} ({type(err).__name__}: "
                    f"{textwrap.shorten(first, 120, placeholder=' ...')})"
                )
                continue
            parsed[conn.msgtype] = typs
        for typs in parsed.values():
            merged.update(typs)
        # Drop types whose fields reference types nobody defines (register would fail on them).
        while True:
            bad = {n for n in merged if _referenced({n: merged[n]}) - merged.keys()}
            if not bad:
                break
            for n in bad:
                self.undecodable.setdefault(n, "its definition references types that are not defined")
                del merged[n]
        ts = Typestore(max_sequence_length=MAX_SEQUENCE_LENGTH)
        try:
            ts.register(merged)
        except Exception:
            # Conflicting/odd definitions: fall back to the stock store plus what registers cleanly.
            ts = Typestore(base_mod, max_sequence_length=MAX_SEQUENCE_LENGTH)
            for name, typs in parsed.items():
                try:
                    ts.register(typs)
                except Exception as err:
                    self.undecodable[name] = f"its definition cannot be registered ({err})"
        for conn in self.connections:
            if conn.msgtype not in ts.fielddefs and conn.msgtype not in self.undecodable:
                self.undecodable[conn.msgtype] = (
                    "the bag embeds no definition and it is not a standard ROS type (a custom message)"
                )
        self.typestore = ts

    @property
    def topics(self) -> dict[str, TopicInfo]:
        """Topic name -> TopicInfo (type, message count, decodable)."""
        out: dict[str, TopicInfo] = {}
        for c in self.connections:
            if c.topic in out:
                info = out[c.topic]
                info.count += max(c.msgcount, 0)
                continue
            reason = self.undecodable.get(c.msgtype, "")
            out[c.topic] = TopicInfo(c.topic, c.msgtype, max(c.msgcount, 0), not reason, reason)
        return out

    def topic_list(self) -> str:
        """Human-readable list of the bag's topics and types, for error messages."""
        return ", ".join(f"{t} [{i.msgtype}]" for t, i in sorted(self.topics.items())) or "(no topics)"

    def require(self, topic: str) -> TopicInfo:
        """The TopicInfo of ``topic``, or a ``TopicError`` listing what exists."""
        info = self.topics.get(topic)
        if info is None:
            close = [t for t in self.topics if t.strip("/").split("/")[-1] == topic.strip("/").split("/")[-1]]
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TopicError(
                f"topic {topic!r} is not in {self.paths[0]}.{hint} Topics in the bag: {self.topic_list()}. "
                "Fix the topic name in the topic map (YAML) or leave it out to auto-detect"
            )
        if not info.decodable:
            fix = "Add its .msg definition under `custom_types:` in the topic map"
            if info.reason.startswith(EMBEDDED_BROKEN):  # the schema record is damaged, not missing
                standard = info.msgtype in _store_module(self.is_ros1).FIELDDEFS
                fix = ("The bag's schema record is damaged: re-copy or re-record the bag"
                       + ("" if standard else " (or give the type's .msg definition under `custom_types:` in the "
                          "topic map, which replaces the embedded one)"))
            raise UnknownTypeError(
                f"topic {topic!r} has type {info.msgtype!r}, which cannot be decoded: {info.reason}. {fix}"
            )
        return info

    def _raw(self, topics: Sequence[str]) -> Iterator[tuple[Connection, int, bytes]]:
        gens = []
        for reader in self._readers:
            conns = [c for c in reader.connections if c.topic in topics]
            if conns:
                gen = reader.messages(connections=conns)
                gens.append(gen if self.is_ros1 else _decompressed(gen))
        if len(gens) == 1:
            return gens[0]
        return heapq.merge(*gens, key=lambda x: x[1])

    def messages(self, topics: Sequence[str], stride: Mapping[str, int] | None = None) -> Iterator[Message]:
        """Deserialized messages of ``topics`` in record-time order; errors become ``BagReadError``.

        ``stride`` maps a topic to k: only every k-th of its messages is deserialized and yielded
        (e.g. to thin out point clouds without paying for decoding the rest).
        """
        stride = dict(stride or {})
        seen: dict[str, int] = {}
        if not self._open:
            self.open()
        for t in topics:
            self.require(t)
        assert self.typestore is not None
        deser = self.typestore.deserialize_ros1 if self.is_ros1 else self.typestore.deserialize_cdr
        it = self._raw(list(topics))
        n = 0
        last_ns = None
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            except Exception as err:
                where = f"after message {n} (record time {last_ns} ns)" if n else "at the first message"
                raise BagReadError(
                    f"{self.paths[0]}: data is corrupt or truncated {where}: {type(err).__name__}: "
                    f"{str(err)[:200]}. Re-copy the bag or reindex it (`rosbag reindex` / `ros2 bag reindex`)"
                ) from None
            conn, ns, raw = item
            k = stride.get(conn.topic, 1)
            if k > 1:
                i = seen.get(conn.topic, 0)
                seen[conn.topic] = i + 1
                if i % k:
                    n += 1
                    continue
            try:
                msg = deser(raw, conn.msgtype)
            except Exception as err:
                raise BagReadError(
                    f"{self.paths[0]}: message {n} on {conn.topic!r} ({conn.msgtype}) at record time {ns} ns "
                    f"does not deserialize: {type(err).__name__}: {str(err)[:200]}. The bag is corrupt or "
                    "its type definition does not match the data"
                ) from None
            n += 1
            last_ns = ns
            yield Message(conn.topic, conn.msgtype, int(ns), stamp_ns(msg), msg)

    def time_range_ns(self) -> tuple[int, int]:
        """(first, last) record time [ns] over all files (from indexes/metadata)."""
        try:
            return min(r.start_time for r in self._readers), max(r.end_time for r in self._readers)
        except Exception as err:
            raise BagReadError(f"{self.paths[0]}: cannot read the time range: {err}") from None
