"""Ingest: ROS 1/ROS 2 bags and robot logs into clean, aligned `Run`s.

Public API::

    from ingest import load_run, load_helhest_json, Run, TopicMap
    run = load_run("drive.bag", config="helhest.yaml", dt=0.01)   # bag, cache file or helhest JSON
    run.save("drive.npz"); Run.load("drive.npz")

See docs/ingest.md for the topic-map YAML, caching, the pallet fit and the errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    BagReadError,
    CloudError,
    ConfigError,
    DataError,
    IngestError,
    MessageTypeError,
    PalletFitError,
    RunFormatError,
    TimestampError,
    TopicError,
    UnknownTypeError,
)
from .lazy import lazy_getattr

if TYPE_CHECKING:
    from .decode import SkidSteer, cloud_to_xyz
    from .load import default_cache_dir, load_helhest_json, load_run, load_runs
    from .reader import BagReader
    from .run import PalletPose, Run
    from .topicmap import TopicMap, TopicSpec

# The names below are imported on first use, so that `import ingest.clikit` (the command lines'
# conventions, read on every `--help`) does not load numpy, pandas, scipy and rosbags.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("SkidSteer", "cloud_to_xyz"), "decode"),
    **dict.fromkeys(("default_cache_dir", "load_helhest_json", "load_run", "load_runs"), "load"),
    "BagReader": "reader",
    **dict.fromkeys(("PalletPose", "Run"), "run"),
    **dict.fromkeys(("TopicMap", "TopicSpec"), "topicmap"),
}


__getattr__ = lazy_getattr("ingest", _EXPORTS, globals())


__all__ = [
    "BagReadError",
    "BagReader",
    "CloudError",
    "ConfigError",
    "DataError",
    "IngestError",
    "MessageTypeError",
    "PalletFitError",
    "PalletPose",
    "Run",
    "RunFormatError",
    "SkidSteer",
    "TimestampError",
    "TopicError",
    "TopicMap",
    "TopicSpec",
    "UnknownTypeError",
    "cloud_to_xyz",
    "default_cache_dir",
    "load_helhest_json",
    "load_run",
    "load_runs",
]
