"""The pallet's 2-D DBSCAN (scipy KD-tree and connected components) against DBSCAN's definition, point by point:
a brute-force O(n^2) reference written here, and open3d's ``cluster_dbscan`` where open3d imports."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from ingest.pallet import _dbscan_2d


def _dbscan_reference(xy: np.ndarray, eps: float, min_points: int) -> np.ndarray:
    """Textbook DBSCAN: neighbours strictly closer than eps (the point itself included), points visited in index
    order, each unvisited core point seeds a new cluster grown breadth-first; a border point keeps the first
    cluster that reaches it."""
    n = len(xy)
    d2 = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1)
    nbrs = [np.flatnonzero(d2[k] < eps * eps) for k in range(n)]
    core = np.array([len(nb) >= min_points for nb in nbrs], dtype=bool)
    labels = np.full(n, -1)
    cluster = 0
    for seed in range(n):
        if labels[seed] >= 0 or not core[seed]:
            continue
        labels[seed] = cluster
        queue = deque([seed])
        while queue:
            p = queue.popleft()
            for q in nbrs[p]:
                if labels[q] >= 0:
                    continue
                labels[q] = cluster
                if core[q]:
                    queue.append(q)
        cluster += 1
    return labels


def _blobs(seed: int, n_blobs: int = 6, n_noise: int = 40) -> np.ndarray:
    """Gaussian blobs of varied size and spread, close enough to touch sometimes, with uniform noise."""
    rng = np.random.default_rng(seed)
    parts = [rng.uniform(-3.0, 3.0, (n_noise, 2))]
    for _ in range(n_blobs):
        centre = rng.uniform(-2.5, 2.5, 2)
        parts.append(centre + rng.normal(0.0, rng.uniform(0.05, 0.3), (int(rng.integers(5, 80)), 2)))
    return rng.permutation(np.concatenate(parts))


def _shared_border() -> np.ndarray:
    """Two dense clusters whose only link is a point that is not a core point (with eps 0.51 it has 3 neighbours,
    itself included, and min_points is 4): it is a border point of both and joins the first cluster."""
    right = np.array([[0.5, 0.0], [0.55, 0.0], [0.6, 0.0], [0.55, 0.05], [0.55, -0.05]])
    left = -right
    bridge = np.array([[0.0, 0.0]])
    return np.concatenate([right, bridge, left])  # the right cluster comes first, so it gets the bridge


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("eps", "min_points"), [(0.1, 5), (0.25, 5), (0.15, 3), (0.3, 10)])
def test_dbscan_matches_the_brute_force_reference(seed: int, eps: float, min_points: int) -> None:
    xy = _blobs(seed)
    expected = _dbscan_reference(xy, eps, min_points)
    got = _dbscan_2d(xy, eps, min_points)
    assert got.shape == (len(xy),)
    np.testing.assert_array_equal(got, expected)
    assert expected.max() >= 1 and (expected == -1).any()  # the cases have several clusters and noise


def test_dbscan_shared_border_point_and_ties() -> None:
    """The border point shared by two clusters goes to the first; on a lattice with spacing eps exactly, points at
    eps are not neighbours (every point is noise), and just above that spacing they are."""
    xy = _shared_border()
    labels = _dbscan_2d(xy, 0.51, 4)
    np.testing.assert_array_equal(labels, _dbscan_reference(xy, 0.51, 4))
    assert labels.tolist() == [0] * 6 + [1] * 5
    grid = np.stack(np.meshgrid(np.arange(6) * 0.5, np.arange(6) * 0.5), axis=-1).reshape(-1, 2)
    assert (_dbscan_2d(grid, 0.5, 2) == -1).all()
    assert (_dbscan_2d(grid, 0.5000001, 2) == 0).all()


def test_dbscan_degenerate_inputs() -> None:
    assert _dbscan_2d(np.zeros((0, 2)), 0.1, 5).shape == (0,)
    assert _dbscan_2d(np.zeros((1, 2)), 0.1, 1).tolist() == [0]
    assert _dbscan_2d(np.zeros((3, 2)), 0.1, 4).tolist() == [-1, -1, -1]
    assert _dbscan_2d(np.zeros((4, 2)), 0.1, 4).tolist() == [0, 0, 0, 0]  # duplicates are neighbours


@pytest.mark.parametrize("seed", range(4))
def test_dbscan_matches_open3d(seed: int) -> None:
    """Where open3d imports (it needs libusb), its ``cluster_dbscan`` gives the same labels."""
    o3d = pytest.importorskip("open3d", exc_type=ImportError)
    for xy, eps, min_points in [(_blobs(seed), 0.15, 5), (_blobs(seed + 100, 10, 200), 0.1, 5),
                                (_shared_border(), 0.51, 4)]:
        pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.c_[xy, np.zeros(len(xy))]))
        expected = np.asarray(pc.cluster_dbscan(eps=eps, min_points=min_points, print_progress=False))
        np.testing.assert_array_equal(_dbscan_2d(xy, eps, min_points), expected)
