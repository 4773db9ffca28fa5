"""The `Run`: one robot log, aligned on one clock, ready for identification.

Columns and units (all times in seconds on the run's clock, SI units):

- ``odom``: ``t`` [s], ``x``, ``y``, ``z`` [m], ``qx``, ``qy``, ``qz``, ``qw`` (unit quaternion, world
  from base), ``yaw``, ``pitch``, ``roll`` [rad] (ZYX Euler, derived from the quaternion).
- ``wheel_cmd``: ``t`` [s] and one column per wheel [rad/s], named as the log names the wheel (a
  JointState name, or ``left``, ``right``, ``rear`` for the Helhest's logs, `WHEEL_COLUMNS`):
  wheel-velocity targets. Any number of wheels; the robot description maps each of its driven
  wheels to a column (`sysid.robot.scenes.RobotDescription.log_columns`).
- ``wheel_meas`` (optional): ``t`` and per-wheel columns, measured wheel speeds.
- ``pallet`` (optional): the obstacle's pose on the ground, ``PalletPose``.
- ``segments``: named time intervals, e.g. ``{"cruise": (t0, t1), "climb": (t0, t1)}``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import RunFormatError
from .fileio import atomic_path, json_safe
from .inputs import check_input_file

ODOM_COLUMNS = ("t", "x", "y", "z", "qx", "qy", "qz", "qw", "yaw", "pitch", "roll")
WHEEL_COLUMNS = ("t", "left", "right", "rear")  # the Helhest's wheel tables (ingest's bag and JSON readers)

# Units of every column (for docs, plots and the cache file).
UNITS: dict[str, dict[str, str]] = {
    "odom": {
        "t": "s",
        "x": "m",
        "y": "m",
        "z": "m",
        "qx": "1",
        "qy": "1",
        "qz": "1",
        "qw": "1",
        "yaw": "rad",
        "pitch": "rad",
        "roll": "rad",
    },
    "wheel_cmd": {"t": "s", "left": "rad/s", "right": "rad/s", "rear": "rad/s"},
    "wheel_meas": {"t": "s", "left": "rad/s", "right": "rad/s", "rear": "rad/s"},
}
CACHE_VERSION = 1

# The wooden pallet of the Helhest logs, (L, W, H) [m] (ROBOT.md: 1.2 x 0.8 m, 14.4 cm tall): the
# default box obstacle of runs, topic maps, robot descriptions, the lidar fit and the synthetic data.
PALLET_SIZE: tuple[float, float, float] = (1.2, 0.8, 0.144)


@dataclass(frozen=True)
class PalletPose:
    """Pose of a box obstacle lying on the ground: centre (x, y) [m], yaw of its first (length) axis
    [rad], size (L, W, H) [m]; ``quality`` when fitted from lidar. The one pallet value type (the
    synthetic generator's `sysid.synth.Pallet` is this class)."""

    x: float
    y: float
    yaw: float
    size: tuple[float, float, float] = PALLET_SIZE
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
        _check_frame(self.name, "wheel_cmd", self.wheel_cmd, wheel_columns(self.name, "wheel_cmd", self.wheel_cmd))
        if self.wheel_meas is not None:
            _check_frame(self.name, "wheel_meas", self.wheel_meas,
                         wheel_columns(self.name, "wheel_meas", self.wheel_meas))
        for key, (t0, t1) in self.segments.items():
            if not (np.isfinite(t0) and np.isfinite(t1) and t1 > t0):
                raise RunFormatError(f"run {self.name!r}: segment {key!r} has bad bounds ({t0}, {t1})")

    # -- cache ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the run to a cache file: ``.npz`` (numpy) or ``.parquet`` (one long table).

        The write is atomic (temporary file + rename): a failure leaves no partial file behind.
        """
        from .errors import IngestError

        path = Path(path)
        if path.suffix not in (".npz", ".parquet"):
            raise RunFormatError(f"cache file must end in .npz or .parquet, got {path.name!r}")
        header = self._header()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(path) as tmp:
                if path.suffix == ".npz":
                    arrays: dict[str, np.ndarray] = {"header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
                    for key, df in self._tables().items():
                        arrays[key] = df.to_numpy(dtype=np.float64)
                    with open(tmp, "wb") as f:
                        np.savez(f, allow_pickle=False, **arrays)  # numeric arrays only
                else:
                    import pyarrow as pa
                    import pyarrow.parquet as pq

                    frames = []
                    for key, df in self._tables().items():
                        d = df.copy()
                        d.insert(0, "table", key)
                        frames.append(d)
                    long = pd.concat(frames, ignore_index=True)
                    table = pa.Table.from_pandas(long, preserve_index=False)
                    table = table.replace_schema_metadata({b"sysid_run": json.dumps(header).encode()})
                    pq.write_table(table, tmp)
        except IngestError:
            raise
        except Exception as err:
            raise RunFormatError(f"cannot write the run cache {path}: {type(err).__name__}: {err}") from None
        return path

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """Read a run written by ``save`` (``.npz`` or ``.parquet``)."""
        path = Path(path)
        if not path.exists():
            raise RunFormatError(f"run cache {path} not found")
        check_input_file(path, "run cache", RunFormatError)
        magic = {".npz": (b"PK\x03\x04", b"PK\x05\x06"), ".parquet": (b"PAR1",)}.get(path.suffix)
        with open(path, "rb") as fh:
            head = fh.read(4)
        if magic is not None and head not in magic:
            raise RunFormatError(f"{path} is not a run cache file (a {path.suffix} file starts otherwise); give a run "
                                 "saved by `ingest load -o`, a bag or a JSON run file")
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    if "header" not in z.files:
                        raise RunFormatError(f"{path} is not a run cache file (an .npz archive without the run's "
                                             "header); give a run saved by `ingest load -o`")
                    header = json.loads(bytes(z["header"]).decode())
                    tables = {k: pd.DataFrame(z[k], columns=header["columns"][k]) for k in header["columns"]}
            elif path.suffix == ".parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(path)
                header = json.loads(table.schema.metadata[b"sysid_run"].decode())
                long = table.to_pandas()
                tables = {
                    k: long[long["table"] == k][header["columns"][k]].reset_index(drop=True).astype(float)
                    for k in header["columns"]
                }
            else:
                raise RunFormatError(f"run cache must be .npz or .parquet, got {path.name!r}")
        except RunFormatError:
            raise
        except Exception as err:
            raise RunFormatError(
                f"run cache {path} is unreadable ({type(err).__name__}: {err}); delete it to re-ingest"
            ) from None
        if header.get("version") != CACHE_VERSION:
            raise RunFormatError(f"run cache {path} has version {header.get('version')}, expected {CACHE_VERSION}")
        pal = header.get("pallet")
        pallet = None
        if pal is not None:
            pallet = PalletPose(pal["x"], pal["y"], pal["yaw"], tuple(pal["size"]), pal.get("quality"))
        return cls(
            name=header["name"],
            odom=tables["odom"],
            wheel_cmd=tables["wheel_cmd"],
            wheel_meas=tables.get("wheel_meas"),
            pallet=pallet,
            segments={k: (float(a), float(b)) for k, (a, b) in header["segments"].items()},
            meta=header["meta"],
        )

    def _tables(self) -> dict[str, pd.DataFrame]:
        out = {"odom": self.odom[list(ODOM_COLUMNS)],
               "wheel_cmd": self.wheel_cmd[list(wheel_columns(self.name, "wheel_cmd", self.wheel_cmd))]}
        if self.wheel_meas is not None:
            out["wheel_meas"] = self.wheel_meas[list(wheel_columns(self.name, "wheel_meas", self.wheel_meas))]
        return {k: v.astype(float) for k, v in out.items()}

    @property
    def wheel_names(self) -> list[str]:
        """The wheel columns of ``wheel_cmd`` (every column but ``t``), in their order."""
        return list(wheel_columns(self.name, "wheel_cmd", self.wheel_cmd)[1:])

    def _header(self) -> dict[str, Any]:
        tables = self._tables()
        units = {"odom": UNITS["odom"]}
        for k in ("wheel_cmd", "wheel_meas"):
            if k in tables:
                units[k] = {c: ("s" if c == "t" else "rad/s") for c in tables[k].columns}
        return {
            "version": CACHE_VERSION,
            "name": self.name,
            "columns": {k: list(v.columns) for k, v in tables.items()},
            "units": units,
            "pallet": None if self.pallet is None else dataclasses.asdict(self.pallet),
            "segments": {k: [float(a), float(b)] for k, (a, b) in self.segments.items()},
            "meta": json_safe(self.meta, other="str"),
        }

    @property
    def duration(self) -> float:
        return float(self.odom["t"].iloc[-1] - self.odom["t"].iloc[0])

    def slice(self, t0: float, t1: float, name: str | None = None) -> Run:
        """The part of the run with t0 <= t <= t1 (all tables cut to the same window)."""

        def cut(df: pd.DataFrame) -> pd.DataFrame:
            return df[(df["t"] >= t0) & (df["t"] <= t1)].reset_index(drop=True)

        segs = {k: (max(a, t0), min(b, t1)) for k, (a, b) in self.segments.items() if b > t0 and a < t1}
        return dataclasses.replace(
            self,
            name=name or f"{self.name}[{t0:.2f}:{t1:.2f}]",
            odom=cut(self.odom),
            wheel_cmd=cut(self.wheel_cmd),
            wheel_meas=None if self.wheel_meas is None else cut(self.wheel_meas),
            segments=segs,
        )


def wheel_sides(columns: Any, sides: dict[str, str] | None = None) -> dict[str, list[str]]:
    """A wheel table's columns by side: ``sides`` (column -> left | right | center) where given,
    else by name (``left`` / ``right`` in it, any case; others ``center``)."""
    out: dict[str, list[str]] = {"left": [], "right": [], "center": []}
    for c in columns:
        c = str(c)
        if c == "t":
            continue
        low = c.lower()
        side = (sides or {}).get(c) or ("left" if "left" in low else "right" if "right" in low else "center")
        out.setdefault(side, []).append(c)
    return out


def side_speeds(df: pd.DataFrame, sides: dict[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean left and right wheel speed [rad/s] of a wheel table (`wheel_sides`); RunFormatError
    when a side has no column."""
    by = wheel_sides(df.columns, sides)
    if not by["left"] or not by["right"]:
        raise RunFormatError(f"wheel columns {[c for c in df.columns if c != 't']} do not say which wheels are left "
                             "and right (no 'left' / 'right' in their names); name them so, or pass their sides")
    return (df[by["left"]].to_numpy(float).mean(axis=1), df[by["right"]].to_numpy(float).mean(axis=1))


def wheel_columns(run: str, what: str, df: pd.DataFrame) -> tuple[str, ...]:
    """``("t", <wheel columns>...)`` of a wheel table: ``t`` first, then every other column in order."""
    if not isinstance(df, pd.DataFrame):
        raise RunFormatError(f"run {run!r}: {what} must be a pandas DataFrame, got {type(df).__name__}")
    wheels = tuple(str(c) for c in df.columns if str(c) != "t")
    if "t" not in df.columns or not wheels:
        raise RunFormatError(
            f"run {run!r}: {what} has columns {[str(c) for c in df.columns]}; it needs t [s] and one column per "
            f"wheel [rad/s] (e.g. {list(WHEEL_COLUMNS)}; see ingest.run docs)"
        )
    return ("t", *wheels)


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

