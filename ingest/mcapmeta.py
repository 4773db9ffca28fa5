"""What a bare ``.mcap`` file says about itself: its metadata records and its chunk compression.

rosbag2 (and rosbags' writer) stores the bag's ``metadata.yaml`` inside the mcap as a metadata
record named ``rosbag2`` (key ``serialized_metadata``); a bare file therefore still says whether its
messages are compressed one by one (``compression_mode: message``). The reader also recognises a
zstd frame at the start of a message payload (a CDR payload starts with a zero byte, a zstd frame
with ``28 b5 2f fd``), so a bare file reads even when that record is missing.

Only the footer, the summary section's metadata index and the indexed metadata records are read
(no scan of the data section).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import yaml

from .inputs import load_yaml

MAGIC = b"\x89MCAP0\r\n"
OP_CHUNK_INDEX = 0x08
OP_METADATA = 0x0C
OP_METADATA_INDEX = 0x0D
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<I", buf, pos)
    pos += 4
    if pos + n > len(buf):
        raise ValueError("string runs past its record")
    return buf[pos : pos + n].decode("utf-8", "replace"), pos + n


def _summary(f: Any, size: int) -> tuple[bytes, int]:
    """The summary section's bytes and its offset (empty when the file has none)."""
    if size < 2 * len(MAGIC) + 29:
        return b"", 0
    f.seek(size - len(MAGIC) - 29)
    footer = f.read(29 + len(MAGIC))
    if footer[29:] != MAGIC or footer[0] != 0x02:
        return b"", 0
    _, _, summary_start, summary_offset_start, _ = struct.unpack_from("<BQQQI", footer, 0)
    end = summary_offset_start or (size - len(MAGIC) - 29)
    if not summary_start or not (len(MAGIC) <= summary_start <= end <= size):
        return b"", 0
    f.seek(summary_start)
    return f.read(end - summary_start), summary_start


def _records(buf: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos + 9 <= len(buf):
        op = buf[pos]
        (n,) = struct.unpack_from("<Q", buf, pos + 1)
        body = buf[pos + 9 : pos + 9 + n]
        if len(body) != n:
            break
        out.append((op, body))
        pos += 9 + n
    return out


def mcap_summary(path: str | Path) -> dict[str, Any]:
    """``{"metadata": {name: {key: value}}, "chunk_compression": [..]}`` of an mcap file.

    Never raises on a damaged or summary-less file: what cannot be read is left out.
    """
    meta: dict[str, dict[str, str]] = {}
    chunk_compression: set[str] = set()
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            summary, _ = _summary(f, size)
            for op, body in _records(summary):
                if op == OP_CHUNK_INDEX and len(body) >= 8 * 5 + 4:
                    # start, end, chunk offset, chunk length, message index offsets map, index length, ...
                    (map_len,) = struct.unpack_from("<I", body, 32)
                    pos = 36 + map_len + 8
                    comp, _ = _string(body, pos)
                    chunk_compression.add(comp or "none")
                elif op == OP_METADATA_INDEX and len(body) >= 20:
                    offset, length = struct.unpack_from("<QQ", body, 0)
                    if offset + length > size or length > 64 << 20:
                        continue
                    f.seek(offset)
                    rec = f.read(length)
                    if len(rec) < 9 or rec[0] != OP_METADATA:
                        continue
                    data = rec[9:]
                    name, pos = _string(data, 0)
                    (map_len,) = struct.unpack_from("<I", data, pos)
                    pos += 4
                    end = pos + map_len
                    values: dict[str, str] = {}
                    while pos < end:
                        key, pos = _string(data, pos)
                        val, pos = _string(data, pos)
                        values[key] = val
                    meta[name] = values
    except (OSError, ValueError, struct.error):
        pass
    return {"metadata": meta, "chunk_compression": sorted(chunk_compression)}


def rosbag2_compression(path: str | Path) -> tuple[str | None, str | None]:
    """(compression_mode, compression_format) from the mcap's embedded rosbag2 metadata, or (None, None)."""
    text = mcap_summary(path)["metadata"].get("rosbag2", {}).get("serialized_metadata")
    if not text:
        return None, None
    try:
        doc = load_yaml(text) or {}
    except yaml.YAMLError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    # rosbag2 embeds the inner mapping; accept the metadata.yaml layout as well
    info = doc.get("rosbag2_bagfile_information", doc)
    if not isinstance(info, dict):
        return None, None
    mode = str(info.get("compression_mode") or "").lower() or None
    fmt = str(info.get("compression_format") or "").lower() or None
    return (None if mode == "none" else mode), fmt
