"""A bare ``.mcap`` reads on its own (issue 20, point 2): the bundled sample's files without their
metadata.yaml, files written with per-message compression (recorded only in metadata.yaml and in the
mcap's embedded rosbag2 metadata record), and the project's writer, which now compresses chunks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer

import ingest
from ingest import BagReader, bagio
from ingest.mcapmeta import ZSTD_MAGIC, mcap_summary, rosbag2_compression
from sysid.cli.ingest_program import main as ingest_main
from sysid.synth import load_manifest

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "pallet-sample"
T0 = 1_700_000_000_000_000_000
sample = pytest.mark.skipif(not (SAMPLE / "manifest.yaml").exists(), reason="datasets/pallet-sample missing")


def _odom_messages(n: int = 20) -> list[bagio.BagMessage]:
    out = []
    for i in range(n):
        ns = T0 + i * 50_000_000
        out.append(bagio.BagMessage("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns, (0.1 * i, 0.0, 0.0))))
        out.append(bagio.BagMessage("/cmd", "sensor_msgs/msg/JointState", ns,
                                    bagio.joint_state(ns, ["left", "right", "rear"], [1.0, 1.0, 1.0])))
    return out


def _write_message_compressed(directory: Path) -> Path:
    """A ROS 2 mcap bag as rosbag2 writes it with ``--compression-mode message``; returns the bare .mcap."""
    ts = bagio.typestore(2)
    w = Writer(directory, version=9, storage_plugin=StoragePlugin.MCAP)
    w.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
    with w:
        conns: dict[str, object] = {}
        for m in _odom_messages():
            if m.topic not in conns:
                conns[m.topic] = w.add_connection(m.topic, m.msgtype, typestore=ts)
            w.write(conns[m.topic], m.stamp_ns, ts.serialize_cdr(m.msg, m.msgtype))
    bare = directory.parent / "bare.mcap"
    shutil.copy(directory / f"{directory.name}.mcap", bare)
    return bare


@sample
@pytest.mark.parametrize("run", ["run_10", "run_13"])
def test_bundled_sample_mcap_inspects_on_its_own(tmp_path: Path, run: str, capsys) -> None:
    bare = tmp_path / f"{run}.mcap"
    shutil.copy(SAMPLE / run / f"{run}.mcap", bare)  # no metadata.yaml beside it
    assert ingest_main(["inspect", "--json", "-q", str(bare)]) == 0
    doc = json.loads(capsys.readouterr().out)
    counts = {t["topic"]: t["count"] for t in doc["topics"]}
    entry = next(r for r in load_manifest(SAMPLE)["runs"] if r["name"] == run)
    assert counts == {k: v["count"] for k, v in entry["topics"].items()}
    assert all(t["decodable"] for t in doc["topics"])


@sample
def test_bundled_sample_mcap_loads_like_its_directory(tmp_path: Path) -> None:
    bare = tmp_path / "run_10.mcap"
    shutil.copy(SAMPLE / "run_10" / "run_10.mcap", bare)
    kw = {"config": SAMPLE / "topics.yaml", "fit_pallet": False, "progress": False}
    a = ingest.load_run(bare, **kw)
    b = ingest.load_run(SAMPLE / "run_10", **kw)
    np.testing.assert_array_equal(a.odom.to_numpy(), b.odom.to_numpy())
    np.testing.assert_array_equal(a.wheel_cmd.to_numpy(), b.wheel_cmd.to_numpy())
    # ingest load on the bare file and the mcap file path straight out of the checkout
    assert ingest_main(["load", "-q", str(SAMPLE / "run_10" / "run_10.mcap"), "-c", str(SAMPLE / "topics.yaml")]) == 0


@sample
def test_bundled_sample_is_chunk_compressed_and_readable_by_plain_rosbags() -> None:
    for run in ("run_06", "run_07", "run_10", "run_13"):
        f = SAMPLE / run / f"{run}.mcap"
        assert mcap_summary(f)["chunk_compression"] == ["zstd"]
        assert rosbag2_compression(f) == (None, None)  # nothing per message
        with AnyReader([f], default_typestore=bagio.typestore(2)) as r:  # a generic reader, bare file
            conn, _, raw = next(r.messages())
            assert r.deserialize(raw, conn.msgtype) is not None


def test_bare_mcap_with_per_message_compression_reads(tmp_path: Path) -> None:
    bare = _write_message_compressed(tmp_path / "bag")
    assert rosbag2_compression(bare) == ("message", "zstd")  # what the file says about itself
    with BagReader(bare) as bag:
        msgs = list(bag.messages(["/odom", "/cmd"]))
    assert len(msgs) == 40
    assert msgs[2].msg.pose.pose.position.x == pytest.approx(0.1)
    # the directory (metadata.yaml says message compression) still reads, not decompressed twice
    with BagReader(tmp_path / "bag") as bag:
        assert len(list(bag.messages(["/odom"]))) == 20


def test_writer_compresses_mcap_chunks_and_sqlite_messages(tmp_path: Path) -> None:
    msgs = _odom_messages()
    f = tmp_path / "w.mcap"
    bagio.write_bag(f, msgs, compression="zstd")
    assert mcap_summary(f)["chunk_compression"] == ["zstd"]
    with AnyReader([f], default_typestore=bagio.typestore(2)) as r:
        raws = [bytes(raw) for _, _, raw in r.messages()]
    assert len(raws) == 40 and not any(raw.startswith(ZSTD_MAGIC) for raw in raws)
    db = tmp_path / "w.db3"
    bagio.write_bag(db, msgs, compression="zstd")  # bare .db3, per-message zstd, no metadata.yaml
    with BagReader(db) as bag:
        assert len(list(bag.messages(["/odom", "/cmd"]))) == 40


def test_mcap_summary_of_damaged_files_is_empty(tmp_path: Path) -> None:
    f = tmp_path / "x.mcap"
    f.write_bytes(b"\x89MCAP0\r\n" + b"\0" * 10)
    assert mcap_summary(f) == {"metadata": {}, "chunk_compression": []}
    assert rosbag2_compression(tmp_path / "missing.mcap") == (None, None)
