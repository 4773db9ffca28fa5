"""Fuzz: random byte corruption of valid bags never raises anything but IngestError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingest
from ingest import IngestError, bagio
from ingest.inspect import inspect_bag
from tests.helpers.ingest_fixtures import T0_NS

N_CASES = 30  # per format; bounded so the test stays fast


def _valid(tmp: Path, fmt: str) -> Path:
    ros = 1 if fmt == "ros1" else 2
    rng = np.random.default_rng(0)
    msgs = []
    for i in range(30):
        ns = T0_NS + i * 50_000_000
        msgs.append(("/odom", "nav_msgs/msg/Odometry", ns, bagio.odometry(ns, (0.01 * i, 0, 0), ros=ros)))
        msgs.append(
            (
                "/wheel_cmd",
                "sensor_msgs/msg/JointState",
                ns,
                bagio.joint_state(ns, ["left", "right", "rear"], [1.0, 1.0, 1.0], ros=ros),
            )
        )
        if i % 10 == 0:
            pts = rng.normal(size=(20, 3)).astype(np.float32)
            msgs.append(("/points", "sensor_msgs/msg/PointCloud2", ns, bagio.point_cloud2(ns, pts, ros=ros)))
    name = {"ros1": "v.bag", "ros2-sqlite3": "v.db3", "ros2-mcap": "v.mcap"}[fmt]
    (p,) = bagio.write_bag(tmp / name, msgs)
    return p


@pytest.mark.parametrize("fmt", ["ros1", "ros2-sqlite3", "ros2-mcap"])
def test_random_corruption_only_raises_ingest_error(tmp_path: Path, fmt: str) -> None:
    src = _valid(tmp_path, fmt)
    good = src.read_bytes()
    rng = np.random.default_rng({"ros1": 1, "ros2-sqlite3": 2, "ros2-mcap": 3}[fmt])
    outcomes = {"ok": 0, "error": 0}
    for case in range(N_CASES):
        data = bytearray(good)
        mode = case % 3
        if mode == 0:  # flip a few random bytes
            for i in rng.integers(0, len(data), size=int(rng.integers(1, 20))):
                data[i] = int(rng.integers(0, 256))
        elif mode == 1:  # overwrite a random span
            a = int(rng.integers(0, len(data)))
            b = min(len(data), a + int(rng.integers(1, 200)))
            data[a:b] = rng.integers(0, 256, size=b - a, dtype=np.uint8).tobytes()
        else:  # truncate
            data = data[: int(rng.integers(0, len(data)))]
        bad = tmp_path / f"case{case}{src.suffix}"
        bad.write_bytes(bytes(data))
        cache = tmp_path / f"cache{case}"
        for action in ("load", "inspect"):
            try:
                if action == "load":
                    ingest.load_run(bad, dt=0.01, cache=cache, progress=False, fit_pallet=False)
                else:
                    inspect_bag(bad)
                outcomes["ok"] += 1
            except IngestError:
                outcomes["error"] += 1
                if action == "load":
                    assert not cache.exists() or not any(cache.iterdir())
            except Exception as err:  # pragma: no cover - this is the failure being tested for
                pytest.fail(f"{fmt} case {case} ({action}): {type(err).__name__} escaped: {err}")
    assert outcomes["error"] > 0  # the corruption is real
