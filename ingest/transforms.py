"""Rotations in numpy, the one home for both packages: quaternions ``(x, y, z, w)`` (ROS and scipy
order; MuJoCo's ``(w, x, y, z)`` is reordered by the caller), ZYX Euler angles [rad], rotation matrices.

``ingest`` is the leaf both packages import, so `sysid` takes these from here. The engine's Warp
kernels keep their own ``wp.quat_*`` calls: device code, not host duplicates.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike


def quat_yaw(q: np.ndarray) -> np.ndarray:
    """Yaw [rad] (ZYX Euler) of quaternions ``(..., 4)`` ordered ``qx, qy, qz, qw``."""
    qx, qy, qz, qw = (q[..., i] for i in range(4))
    yaw: np.ndarray = np.arctan2(2.0 * (qw * qz + qx * qy), 1.0 - 2.0 * (qy * qy + qz * qz))
    return yaw


def yaw_of(q: ArrayLike) -> float:
    """Yaw [rad] of one quaternion (x, y, z, w) by libm's ``math.atan2``: numpy's SIMD arctan2 differs
    from it in the last bit for some inputs, and a closed-loop controller (the synthetic datasets'
    path follower) must keep the heading it was written with."""
    x, y, z, w = (float(v) for v in np.asarray(q, dtype=float))
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def quat_to_euler(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZYX Euler angles (yaw, pitch, roll) [rad] of unit quaternions (..., 4) in (x, y, z, w)."""
    x, y, z, w = (q[..., i] for i in range(4))
    yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    pitch = np.arcsin(np.clip(2 * (w * y - z * x), -1.0, 1.0))
    roll = np.arctan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    return yaw, pitch, roll


def yaw_to_quat(yaw: ArrayLike) -> np.ndarray:
    """Quaternions (..., 4) (x, y, z, w) of rotations by ``yaw`` [rad] about z (x = y = 0 exactly)."""
    a = np.asarray(yaw, dtype=float)
    return np.stack([np.zeros_like(a), np.zeros_like(a), np.sin(a / 2), np.cos(a / 2)], axis=-1)


def euler_to_quat(yaw: ArrayLike, pitch: ArrayLike | None = None, roll: ArrayLike | None = None) -> np.ndarray:
    """Quaternions ``(..., 4)`` (``qx, qy, qz, qw``) from ZYX Euler angles [rad] (pitch, roll default 0)."""
    y = np.asarray(yaw, dtype=float)
    p = np.zeros_like(y) if pitch is None else np.asarray(pitch, dtype=float)
    r = np.zeros_like(y) if roll is None else np.asarray(roll, dtype=float)
    cy, sy = np.cos(y / 2), np.sin(y / 2)
    cp, sp = np.cos(p / 2), np.sin(p / 2)
    cr, sr = np.cos(r / 2), np.sin(r / 2)
    return np.stack(
        [
            sr * cp * cy - cr * sp * sy,
            cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy,
            cr * cp * cy + sr * sp * sy,
        ],
        axis=-1,
    )


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b of (..., 4) quaternions (x, y, z, w)."""
    ax, ay, az, aw = (a[..., i] for i in range(4))
    bx, by, bz, bw = (b[..., i] for i in range(4))
    return np.stack(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ],
        axis=-1,
    )


def quat_to_matrix(q: ArrayLike, normalize: bool = True) -> np.ndarray:
    """Rotation matrices (..., 3, 3) of quaternions (..., 4) (x, y, z, w); ``normalize=False`` takes
    them as unit quaternions as they are (no division by a norm of 1 that would move the last bit)."""
    a = np.asarray(q, dtype=float)
    if normalize:
        a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    x, y, z, w = (a[..., i] for i in range(4))
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def matrix_to_quat(R: np.ndarray) -> tuple[float, float, float, float]:
    """(x, y, z, w) of a rotation matrix (Shepperd's method)."""
    t = np.trace(R)
    if t > 0:
        s = 2 * math.sqrt(t + 1)
        q = ((R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s, s / 4)
    else:
        i = int(np.argmax(np.diag(R)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2 * math.sqrt(1 + R[i, i] - R[j, j] - R[k, k])
        v = [0.0, 0.0, 0.0]
        v[i] = s / 4
        v[j] = (R[j, i] + R[i, j]) / s
        v[k] = (R[k, i] + R[i, k]) / s
        q = (*v, (R[k, j] - R[j, k]) / s)
    return tuple(float(c) for c in q)  # type: ignore[return-value]


def wxyz_to_xyzw(q: ArrayLike) -> np.ndarray:
    """MuJoCo's quaternion order (w, x, y, z) as (x, y, z, w), over the last axis."""
    return np.asarray(q, dtype=float)[..., [1, 2, 3, 0]]
