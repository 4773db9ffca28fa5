"""Ingest: ROS 1/ROS 2 bags and robot logs into clean, aligned `Run`s.

Public API::

    from ingest import load_run, load_helhest_json, Run, TopicMap
    run = load_run("drive.bag", config="helhest.yaml", dt=0.01)   # bag, cache file or helhest JSON
    run.save("drive.npz"); Run.load("drive.npz")

See docs/ingest.md for the topic-map YAML, caching, the pallet fit and the errors.
"""

from .decode import SkidSteer, cloud_to_xyz
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
from .load import default_cache_dir, load_helhest_json, load_run, load_runs
from .reader import BagReader
from .run import PalletPose, Run
from .topicmap import TopicMap, TopicSpec

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
