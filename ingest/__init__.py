"""Ingest: ROS 1/ROS 2 bags and robot logs into clean, aligned `Run`s."""

from .errors import IngestError
from .run import PalletPose, Run

__all__ = ["IngestError", "PalletPose", "Run"]
