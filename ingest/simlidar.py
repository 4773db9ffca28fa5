"""Analytic spinning-lidar simulator: rays against a ground plane and oriented boxes.

Everything is numpy-vectorised (rays x boxes), so a 64-beam x 1800-azimuth scan of a few boxes
takes tens of milliseconds. Used by the pallet-fit tests and by the synthetic-bag generator.

Frames and units: SI (metres, radians unless a name says ``_deg``). The sensor frame is x forward,
y left, z up; azimuth is measured from +x towards +y, elevation from the xy plane towards +z.
Quaternions are (x, y, z, w), world-from-sensor.

Example::

    from ingest.simlidar import Box, beam_pattern, scan
    pallet = Box(center=(5.0, 0.5, 0.072), size=(1.2, 0.8, 0.144), yaw=0.3)
    pts = scan(beam_pattern(64), sensor_position=(0, 0, 1.0), boxes=[pallet], noise_std=0.01, seed=0)
    # pts: (N, 3) float32 hits in the sensor frame
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .errors import ConfigError
from .run import PALLET_SIZE
from .transforms import quat_to_matrix

ArrayLike = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class BeamPattern:
    """A spinning lidar's ray pattern.

    Attributes:
        elevations: beam elevation angles [rad], one per laser (rows of an organized cloud).
        azimuths: firing azimuths [rad] over one revolution (columns of an organized cloud).
        max_range: farthest return [m]; rays hitting nothing closer give no point.
        min_range: nearest return [m] (self-hits of the robot body are below this).
    """

    elevations: np.ndarray
    azimuths: np.ndarray
    max_range: float = 100.0
    min_range: float = 0.3

    @property
    def n_beams(self) -> int:
        return int(self.elevations.size)

    @property
    def n_azimuths(self) -> int:
        return int(self.azimuths.size)

    def directions(self) -> np.ndarray:
        """Unit ray directions in the sensor frame, shape (n_beams, n_azimuths, 3)."""
        el = self.elevations[:, None]
        az = self.azimuths[None, :]
        ce = np.cos(el)
        return np.stack(np.broadcast_arrays(ce * np.cos(az), ce * np.sin(az), np.sin(el)), axis=-1)


# Vertical field of view [deg] of common sensors with that many beams (Velodyne VLP-16 / HDL-64E,
# Ouster OS1-128); change with the ``vfov_deg`` argument.
DEFAULT_VFOV_DEG: dict[int, tuple[float, float]] = {
    16: (-15.0, 15.0),
    32: (-30.67, 10.67),
    64: (-24.9, 2.0),
    128: (-22.5, 22.5),
}


def beam_pattern(
    n_beams: int = 64,
    vfov_deg: tuple[float, float] | None = None,
    h_res_deg: float = 0.2,
    max_range: float = 100.0,
    min_range: float = 0.3,
    azimuth_fov_deg: tuple[float, float] = (-180.0, 180.0),
) -> BeamPattern:
    """A beam pattern with ``n_beams`` lasers evenly spread over ``vfov_deg`` (lowest, highest) [deg].

    ``h_res_deg`` is the azimuth step [deg]; ``azimuth_fov_deg`` limits the horizontal field (default a
    full revolution).
    """
    if n_beams < 1:
        raise ConfigError("n_beams must be >= 1")
    if h_res_deg <= 0:
        raise ConfigError("h_res_deg must be > 0")
    lo, hi = vfov_deg if vfov_deg is not None else DEFAULT_VFOV_DEG.get(n_beams, (-15.0, 15.0))
    elev = np.deg2rad(np.linspace(lo, hi, n_beams)) if n_beams > 1 else np.deg2rad(np.array([lo]))
    a0, a1 = azimuth_fov_deg
    n_az = max(1, int(round((a1 - a0) / h_res_deg)))
    az = np.deg2rad(a0 + h_res_deg * np.arange(n_az))
    return BeamPattern(elev, az, float(max_range), float(min_range))


@dataclass(frozen=True)
class Box:
    """An oriented box: centre [m], full size (L, W, H) [m], yaw about world z [rad].

    ``rotation`` (3x3, world-from-box) overrides ``yaw`` for a full 3-D orientation (e.g. a tilted box).
    """

    center: ArrayLike
    size: ArrayLike
    yaw: float = 0.0
    rotation: np.ndarray | None = field(default=None)

    def matrix(self) -> np.ndarray:
        """World-from-box rotation matrix (3x3)."""
        if self.rotation is not None:
            return np.asarray(self.rotation, dtype=float).reshape(3, 3)
        c, s = np.cos(self.yaw), np.sin(self.yaw)
        return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])

    @staticmethod
    def on_ground(x: float, y: float, yaw: float, size: ArrayLike = PALLET_SIZE, ground_z: float = 0.0) -> Box:
        """A box lying flat on the ground plane z = ``ground_z`` (the pallet)."""
        size = np.asarray(size, dtype=float)
        return Box(center=(x, y, ground_z + size[2] / 2), size=size, yaw=yaw)


def _rotation(orientation: ArrayLike | None) -> np.ndarray:
    """World-from-sensor rotation from None (identity), a yaw [rad], a quaternion (x,y,z,w) or a 3x3."""
    if orientation is None:
        return np.eye(3)
    arr = np.asarray(orientation, dtype=float)
    if arr.ndim == 0:
        c, s = np.cos(arr), np.sin(arr)
        return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    if arr.shape == (4,):
        return quat_to_matrix(arr)
    if arr.shape == (3, 3):
        return arr
    raise ConfigError("orientation must be a yaw, a quaternion (x, y, z, w) or a 3x3 rotation matrix")


def raycast(
    origin: ArrayLike,
    directions: np.ndarray,
    boxes: Sequence[Box] = (),
    ground_z: float | None = 0.0,
) -> np.ndarray:
    """Distance [m] along each unit ray in ``directions`` (..., 3, world frame) to the first hit.

    The scene is the plane z = ``ground_z`` (None: no ground) and the boxes. Rays that hit nothing
    get ``inf``. Rays starting inside a box hit its far side.
    """
    o = np.asarray(origin, dtype=float).reshape(3)
    d = np.asarray(directions, dtype=float)
    shape = d.shape[:-1]
    d = d.reshape(-1, 3)
    t_best = np.full(d.shape[0], np.inf)
    if ground_z is not None:
        dz = d[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            tg = (ground_z - o[2]) / dz
        ok = (dz != 0) & (tg > 0)
        t_best = np.where(ok, tg, t_best)
    for box in boxes:
        r = box.matrix()
        half = np.asarray(box.size, dtype=float) / 2
        c = np.asarray(box.center, dtype=float)
        # Slab test in the box frame.
        ol = r.T @ (o - c)
        dl = d @ r  # == (r.T @ d.T).T
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / dl
            t1 = (-half - ol) * inv
            t2 = (half - ol) * inv
        # Axis-parallel rays: inside the slab -> no constraint, outside -> empty interval.
        par = dl == 0
        inside = np.abs(ol) <= half
        lo = np.where(par, np.where(inside, -np.inf, np.inf), np.minimum(t1, t2))
        hi = np.where(par, np.where(inside, np.inf, -np.inf), np.maximum(t1, t2))
        tnear = lo.max(axis=1)
        tfar = hi.min(axis=1)
        hit = tfar >= np.maximum(tnear, 0.0)
        t = np.where(tnear > 0, tnear, tfar)
        t_best = np.where(hit & (t > 0) & (t < t_best), t, t_best)
    return t_best.reshape(shape)


def scan(
    pattern: BeamPattern,
    sensor_position: ArrayLike = (0.0, 0.0, 0.0),
    sensor_orientation: ArrayLike | None = None,
    boxes: Sequence[Box] = (),
    ground_z: float | None = 0.0,
    noise_std: float = 0.0,
    seed: int | np.random.Generator | None = None,
    dropout: float = 0.0,
    organized: bool = False,
) -> np.ndarray:
    """One revolution of the lidar at a pose in the world; hits in the sensor frame.

    Args:
        pattern: beam pattern (``beam_pattern(16 | 64 | 128, ...)``).
        sensor_position: sensor origin in the world [m].
        sensor_orientation: world-from-sensor rotation: None, yaw [rad], quaternion (x,y,z,w) or 3x3.
        boxes: obstacles; ``ground_z``: height of the ground plane [m] (None: no ground).
        noise_std: standard deviation of Gaussian range noise [m].
        seed: seed or ``numpy.random.Generator`` for the noise and dropout.
        dropout: probability that a return is lost.
        organized: return a (n_beams, n_azimuths, 3) array with NaN where there is no return.

    Returns:
        float32 array: (N, 3) hits (or organized grid) in the sensor frame [m].
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    rot = _rotation(sensor_orientation)
    d_sensor = pattern.directions()
    d_world = d_sensor @ rot.T
    rng_m = raycast(sensor_position, d_world, boxes, ground_z)
    if noise_std > 0:
        rng_m = rng_m + rng.normal(0.0, noise_std, size=rng_m.shape)
    valid: NDArray[np.bool_] = np.isfinite(rng_m) & (rng_m >= pattern.min_range) & (rng_m <= pattern.max_range)
    if dropout > 0:
        valid &= rng.random(rng_m.shape) >= dropout
    pts: np.ndarray = d_sensor * np.where(valid, rng_m, np.nan)[..., None]
    if organized:
        return pts.astype(np.float32)
    return pts[valid].astype(np.float32)


def sensor_to_world(
    points: np.ndarray, sensor_position: ArrayLike, sensor_orientation: ArrayLike | None = None
) -> np.ndarray:
    """Transform (N, 3) sensor-frame points to the world frame (float64)."""
    rot = _rotation(sensor_orientation)
    world: np.ndarray = np.asarray(points, dtype=float) @ rot.T + np.asarray(sensor_position, dtype=float)
    return world


def scan_world(
    pattern: BeamPattern,
    sensor_position: ArrayLike,
    sensor_orientation: ArrayLike | None = None,
    boxes: Sequence[Box] = (),
    **kwargs: object,
) -> tuple[np.ndarray, np.ndarray]:
    """Like ``scan`` but returns (sensor-frame points float32, the same points in the world float64)."""
    pts = scan(pattern, sensor_position, sensor_orientation, boxes, **kwargs)  # type: ignore[arg-type]
    flat = pts.reshape(-1, 3)
    return pts, sensor_to_world(flat, sensor_position, sensor_orientation)


def sensor_pose_on_robot(
    base_position: ArrayLike,
    base_orientation: ArrayLike | None,
    mount_offset: ArrayLike = (0.0, 0.0, 0.5),
    mount_orientation: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """World pose (position, 3x3 rotation) of a sensor mounted at ``mount_offset`` in the base frame."""
    rb = _rotation(base_orientation)
    rm = _rotation(mount_orientation)
    pos = np.asarray(base_position, dtype=float) + rb @ np.asarray(mount_offset, dtype=float)
    return pos, rb @ rm
