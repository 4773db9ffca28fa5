"""One error type for the ingest package (rosbags-style discipline: typed, fail fast)."""

from __future__ import annotations


class IngestError(Exception):
    """Base class of every error the ingest package raises on bad input.

    The message says what was wrong and what to do about it.
    """


class BagReadError(IngestError):
    """A bag file is missing, truncated, corrupt or in an unknown format."""


class TopicError(IngestError):
    """A requested topic is missing, misnamed or carries the wrong message type."""


class TimestampError(IngestError):
    """Timestamps are non-finite, out of order, or have jumps/gaps beyond tolerance."""


class CloudError(IngestError):
    """A point cloud is empty, all-NaN or has an unreadable field layout."""


class PalletFitError(IngestError):
    """The pallet could not be found or fitted in the lidar data."""


class RunFormatError(IngestError):
    """A run (cache file, JSON run, DataFrame) does not have the expected columns or units."""


class MessageTypeError(TopicError):
    """A topic carries a message type that cannot be used for the requested role."""


class UnknownTypeError(TopicError):
    """A topic's message type is neither a standard type nor defined in the bag (custom type)."""


class ConfigError(IngestError):
    """A topic-map YAML or an argument to the ingest API is invalid."""


class DataError(IngestError):
    """Message values are unusable (NaN/inf poses or wheel speeds, zero quaternions)."""
