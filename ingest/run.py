"""The `Run`: one robot log, aligned on one clock, ready for identification.

Columns and units (all times in seconds on the run's clock, SI units):

- ``odom``: ``t`` [s], ``x``, ``y``, ``z`` [m], ``qx``, ``qy``, ``qz``, ``qw`` (unit quaternion, world
  from base), ``yaw``, ``pitch``, ``roll`` [rad] (ZYX Euler, derived from the quaternion).
- ``wheel_cmd``: ``t`` [s], ``left``, ``right``, ``rear`` [rad/s] wheel-velocity targets.
- ``wheel_meas`` (optional): same columns, measured wheel speeds.
- ``pallet`` (optional): the obstacle's pose on the ground, ``PalletPose``.
- ``segments``: named time intervals, e.g. ``{"cruise": (t0, t1), "climb": (t0, t1)}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .errors import RunFormatError

ODOM_COLUMNS = ("t", "x", "y", "z", "qx", "qy", "qz", "qw", "yaw", "pitch", "roll")
WHEEL_COLUMNS = ("t", "left", "right", "rear")


@dataclass(frozen=True)
class PalletPose:
    """Pose of a box obstacle lying on the ground: centre (x, y) [m], yaw [rad], size (L, W, H) [m]."""

    x: float
    y: float
    yaw: float
    size: tuple[float, float, float] = (1.2, 0.8, 0.144)
    quality: float | None = None  # fit RMS residual [m], when fitted from lidar


@dataclass
class Run:
    name: str
    odom: pd.DataFrame
    wheel_cmd: pd.DataFrame
    wheel_meas: pd.DataFrame | None = None
    pallet: PalletPose | None = None
    segments: dict[str, tuple[float, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check columns, finiteness and monotonic time; raise RunFormatError naming the problem."""
        _check_frame(self.name, "odom", self.odom, ODOM_COLUMNS)
        _check_frame(self.name, "wheel_cmd", self.wheel_cmd, WHEEL_COLUMNS)
        if self.wheel_meas is not None:
            _check_frame(self.name, "wheel_meas", self.wheel_meas, WHEEL_COLUMNS)
        for key, (t0, t1) in self.segments.items():
            if not (np.isfinite(t0) and np.isfinite(t1) and t1 > t0):
                raise RunFormatError(f"run {self.name!r}: segment {key!r} has bad bounds ({t0}, {t1})")

    @property
    def duration(self) -> float:
        return float(self.odom["t"].iloc[-1] - self.odom["t"].iloc[0])

    def slice(self, t0: float, t1: float, name: str | None = None) -> Run:
        """The part of the run with t0 <= t <= t1 (all tables cut to the same window)."""

        def cut(df: pd.DataFrame | None) -> pd.DataFrame | None:
            if df is None:
                return None
            return df[(df["t"] >= t0) & (df["t"] <= t1)].reset_index(drop=True)

        segs = {k: (max(a, t0), min(b, t1)) for k, (a, b) in self.segments.items() if b > t0 and a < t1}
        return dataclasses.replace(
            self,
            name=name or f"{self.name}[{t0:.2f}:{t1:.2f}]",
            odom=cut(self.odom),
            wheel_cmd=cut(self.wheel_cmd),
            wheel_meas=cut(self.wheel_meas),
            segments=segs,
        )


def _check_frame(run: str, what: str, df: pd.DataFrame, columns: tuple[str, ...]) -> None:
    if not isinstance(df, pd.DataFrame):
        raise RunFormatError(f"run {run!r}: {what} must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise RunFormatError(
            f"run {run!r}: {what} lacks columns {missing}; expected {list(columns)} (see ingest.run docs)"
        )
    if len(df) < 2:
        raise RunFormatError(f"run {run!r}: {what} has {len(df)} rows; need at least 2 samples")
    values = df[list(columns)].to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise RunFormatError(f"run {run!r}: {what} has a non-finite {columns[col]} at row {row}")
    dt = np.diff(values[:, 0])
    if (dt <= 0).any():
        i = int(np.argmax(dt <= 0))
        raise RunFormatError(
            f"run {run!r}: {what} time is not strictly increasing at row {i + 1} "
            f"(t={values[i, 0]:.6f} then {values[i + 1, 0]:.6f}); sort and deduplicate first"
        )
