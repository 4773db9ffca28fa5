"""PointCloud2 decoding (any field layout, endianness, padding, organized) and the lidar simulator."""

from __future__ import annotations

import numpy as np
import pytest

from ingest import CloudError, bagio, cloud_to_xyz
from ingest.simlidar import Box, beam_pattern, raycast, scan, scan_world, sensor_to_world


@pytest.fixture
def pts() -> np.ndarray:
    return np.random.default_rng(0).normal(0, 10, size=(123, 3)).astype(np.float32)


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("step,pad", [(None, 0), (32, 0), (16, 5)])
def test_layouts(pts: np.ndarray, big: bool, step: int | None, pad: int) -> None:
    inten = np.arange(len(pts), dtype=np.float32)
    msg = bagio.point_cloud2(0, pts, extra={"intensity": inten}, is_bigendian=big, point_step=step, row_padding=pad)
    assert msg.row_step == msg.width * msg.point_step + pad
    np.testing.assert_array_equal(cloud_to_xyz(msg), pts)


def test_float64_fields_shuffled_order(pts: np.ndarray) -> None:
    msg = bagio.point_cloud2(0, pts.astype(np.float64), xyz_dtype="f8")
    # Reverse the field order in the byte layout: z first, then y, then x.
    raw = np.asarray(msg.data).reshape(len(pts), 24)
    msg.data = np.ascontiguousarray(raw[:, [*range(16, 24), *range(8, 16), *range(0, 8)]]).reshape(-1)
    fx, fy, fz = msg.fields
    fx.offset, fy.offset, fz.offset = 16, 8, 0
    np.testing.assert_array_equal(cloud_to_xyz(msg), pts.astype(np.float64).astype(np.float32))


def test_organized_with_nans() -> None:
    grid = np.random.default_rng(1).normal(size=(4, 6, 3)).astype(np.float32)
    grid[1, 2] = np.nan
    grid[3, :] = np.nan
    msg = bagio.point_cloud2(0, grid, row_padding=3)
    assert (msg.height, msg.width) == (4, 6) and not msg.is_dense
    org = cloud_to_xyz(msg, organized=True)
    assert org.shape == (4, 6, 3)
    np.testing.assert_array_equal(np.isnan(org), np.isnan(grid))
    flat = cloud_to_xyz(msg)
    assert flat.shape == (4 * 6 - 1 - 6, 3) and np.isfinite(flat).all()


def test_bad_layouts_raise_cloud_error(pts: np.ndarray) -> None:
    msg = bagio.point_cloud2(0, pts)
    msg.data = msg.data[:-7]
    with pytest.raises(CloudError, match="truncated"):
        cloud_to_xyz(msg)
    msg = bagio.point_cloud2(0, pts)
    msg.fields = msg.fields[:2]
    with pytest.raises(CloudError, match="no field"):
        cloud_to_xyz(msg)
    msg = bagio.point_cloud2(0, pts)
    msg.fields[2].datatype = 42
    with pytest.raises(CloudError, match="datatype"):
        cloud_to_xyz(msg)


def test_empty_cloud_is_empty_array() -> None:
    msg = bagio.point_cloud2(0, np.zeros((0, 3), np.float32))
    assert cloud_to_xyz(msg).shape == (0, 3)


# -- simulator ---------------------------------------------------------------------------------


def test_ground_hits_lie_on_plane_and_box_hits_on_surface() -> None:
    pat = beam_pattern(16, h_res_deg=1.0, max_range=50.0)
    box = Box.on_ground(4.0, 1.0, 0.4)
    sp = (0.0, 0.0, 1.0)
    p = scan(pat, sp, None, [box])
    assert p.dtype == np.float32 and p.ndim == 2 and p.shape[1] == 3
    w = sensor_to_world(p, sp)
    ground = np.abs(w[:, 2]) < 1e-4
    on_box = ~ground
    assert ground.sum() > 100 and on_box.sum() > 10
    # Box points lie on its surface: box-frame coordinate on a face at +-half size.
    c, s = np.cos(0.4), np.sin(0.4)
    d = w[on_box] - np.array([4.0, 1.0, 0.072])
    local = np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1], d[:, 2]], 1)
    face = np.abs(np.abs(local) - np.array([0.6, 0.4, 0.072])).min(axis=1)
    assert face.max() < 1e-4
    # Only the beams below the horizon hit the ground, at z=0 within range.
    assert (np.linalg.norm(p, axis=1) <= 50.0 + 1e-3).all()


def test_patterns_noise_seed_and_organized() -> None:
    for n, lo, hi in ((16, -15, 15), (64, -24.9, 2.0), (128, -22.5, 22.5)):
        pat = beam_pattern(n)
        assert pat.n_beams == n
        assert np.isclose(np.rad2deg(pat.elevations[0]), lo) and np.isclose(np.rad2deg(pat.elevations[-1]), hi)
    pat = beam_pattern(32, vfov_deg=(-10, 10), h_res_deg=0.5, max_range=20)
    assert pat.n_azimuths == 720
    a = scan(pat, (0, 0, 1), None, [], noise_std=0.02, seed=3)
    b = scan(pat, (0, 0, 1), None, [], noise_std=0.02, seed=3)
    c = scan(pat, (0, 0, 1), None, [], noise_std=0.02, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    exact = scan(pat, (0, 0, 1), None, [])
    rng_err = np.linalg.norm(a, axis=1) - np.linalg.norm(exact, axis=1)
    assert 0.015 < rng_err.std() < 0.025
    org = scan(pat, (0, 0, 1), None, [], organized=True)
    assert org.shape == (32, 720, 3)
    assert np.isnan(org[-1]).all()  # upward beams see nothing


def test_pose_helpers_and_raycast() -> None:
    pat = beam_pattern(16, h_res_deg=2.0)
    q = (0.0, 0.0, np.sin(0.25), np.cos(0.25))  # yaw 0.5 rad
    sensor, world = scan_world(pat, (1.0, 2.0, 0.8), q, [Box.on_ground(5, 3, 0.0)])
    assert np.allclose(sensor_to_world(sensor, (1.0, 2.0, 0.8), q), world)
    t = raycast((0, 0, 1), np.array([[0.0, 0.0, -1.0], [1.0, 0.0, 0.0]]), [Box((3, 0, 1), (1, 1, 1))])
    assert np.isclose(t[0], 1.0) and np.isclose(t[1], 2.5)


def test_full_rotation_box_and_mount() -> None:
    from ingest.simlidar import sensor_pose_on_robot

    # A box rolled 90 deg about x is the same as one with height and width swapped.
    roll = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    a = Box((4.0, 0.0, 0.3), (1.0, 0.6, 0.2), rotation=roll)
    b = Box((4.0, 0.0, 0.3), (1.0, 0.2, 0.6))
    pat = beam_pattern(32, h_res_deg=0.5)
    np.testing.assert_allclose(scan(pat, (0, 0, 1), None, [a]), scan(pat, (0, 0, 1), None, [b]), atol=1e-5)
    pos, rot = sensor_pose_on_robot((1.0, 2.0, 0.36), np.pi / 2, mount_offset=(0.2, 0.0, 0.5))
    np.testing.assert_allclose(pos, [1.0, 2.2, 0.86], atol=1e-12)
    np.testing.assert_allclose(rot @ [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], atol=1e-12)
