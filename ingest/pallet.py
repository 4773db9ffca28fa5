"""Pallet (known box) pose from lidar: accumulate, remove ground, cluster, fit (x, y, yaw).

Method (what worked in ``STACK-NOTES.md``; oriented-bounding-box fits are biased on partial views):

1. Accumulate clouds in the odometry frame with the odometry pose at each cloud's stamp.
2. Ground: RANSAC plane (numpy, seeded), refined by least squares on its inliers and then on the
   points near it;
   everything is then expressed in a frame where the ground is z = 0.
3. Keep points 3 cm to H + 10 cm above the ground; 2-D DBSCAN; keep box-sized clusters.
4. Initial yaw from an L-shape search (closeness criterion); two hypotheses (long side along
   either axis); initial centre anchored on the faces seen from the sensor.
5. Refine (x, y, yaw) by robust least squares on the signed distance to the known box whose
   bottom is on the ground.
6. Resolve the 90-degree ambiguity with free-space checks: a hypothesis is penalised for every
   lidar ray that passes through its interior before hitting something.

Fit quality = RMS signed distance [m] of the cluster's inlier points to the fitted box.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree
from tqdm.auto import tqdm

from .errors import CloudError, PalletFitError
from .run import PALLET_SIZE
from .timeline import interp_linear, interp_quat
from .transforms import quat_to_matrix

# One cluster's box: centre x, y [m] and yaw [rad] in the ground frame, RMS distance [m], points, and
# both corner hypotheses (`PalletFit.hypotheses`).
_ClusterBox = tuple[float, float, float, float, int, list[dict[str, float]]]

WHEEL_RADIUS = 0.36  # [m] used by the climb-onset cross-check


@dataclass
class PalletFit:
    """Result of a pallet fit in the frame of the input points (the odometry frame)."""

    x: float
    y: float
    yaw: float
    size: tuple[float, float, float]
    rms: float  # [m]
    n_points: int
    ground: tuple[float, float, float, float]  # plane a x + b y + c z + d = 0, (a, b, c) up, unit
    hypotheses: list[dict[str, float]] = field(default_factory=list)
    n_clusters: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "x": self.x,
            "y": self.y,
            "yaw": self.yaw,
            "size": list(self.size),
            "rms_m": self.rms,
            "n_points": self.n_points,
            "ground_plane": list(self.ground),
            "hypotheses": self.hypotheses,
            "n_clusters": self.n_clusters,
        }


def _rpy_matrix(rpy: Sequence[float]) -> np.ndarray:
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def accumulate(
    t_clouds: np.ndarray,
    clouds: Sequence[np.ndarray],
    t_odom: np.ndarray,
    pose_odom: np.ndarray,
    lidar_xyz: Sequence[float] = (0.0, 0.0, 0.0),
    lidar_rpy: Sequence[float] = (0.0, 0.0, 0.0),
    max_extrapolation_s: float = 0.1,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Clouds (lidar frame) -> (points (N, 3), ray origins (N, 3)) in the odometry frame [m]."""
    t_clouds = np.asarray(t_clouds, dtype=float)
    ok = (t_clouds >= t_odom[0] - max_extrapolation_s) & (t_clouds <= t_odom[-1] + max_extrapolation_s)
    if not ok.any():
        raise CloudError(
            f"no cloud stamp lies within the odometry time span [{t_odom[0]:.3f}, {t_odom[-1]:.3f}] s; "
            "the clouds and odometry use different clocks (try `time: record`)"
        )
    idx = np.flatnonzero(ok)
    pos = interp_linear(t_odom, pose_odom[:, :3], t_clouds[idx])
    quat = interp_quat(t_odom, pose_odom[:, 3:7], t_clouds[idx])
    rots = quat_to_matrix(quat)
    rm = _rpy_matrix(lidar_rpy)
    tm = np.asarray(lidar_xyz, dtype=float)
    pts_out, org_out = [], []
    for k, i in enumerate(tqdm(idx, desc="accumulating clouds", disable=not progress, leave=False)):
        p = np.asarray(clouds[int(i)], dtype=np.float64)
        if p.size == 0:
            continue
        p = p[np.isfinite(p).all(axis=1)]
        origin = rots[k] @ tm + pos[k]
        pts_out.append(p @ (rots[k] @ rm).T + origin)
        org_out.append(np.broadcast_to(origin, (len(p), 3)))
    if not pts_out:
        raise CloudError("every cloud is empty or all-NaN; nothing to fit the pallet on")
    return np.concatenate(pts_out), np.concatenate(org_out)


def _voxel_centroids(points: np.ndarray, size: float) -> np.ndarray:
    """The centroid of the points in each occupied cube of side ``size`` [m], cubes in lexicographic order (the
    same on any thread count)."""
    keys = np.floor(points / size).astype(np.int64)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    sums = np.zeros((len(counts), 3))
    np.add.at(sums, inverse, points)
    return sums / counts[:, None]


def _ransac_plane(pts: np.ndarray, threshold: float, iterations: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, float, np.ndarray]:
    """RANSAC plane of points (N, 3): ``iterations`` planes through 3 random points, the one with the most points
    within ``threshold`` [m] kept (the first of equals). Returns its unit normal, d (n.p + d = 0) and inlier mask."""
    best_n, best_d, best_count = np.array([0.0, 0.0, 1.0]), 0.0, -1
    for _ in range(iterations):
        a, b, c = pts[rng.choice(len(pts), 3, replace=False)]
        n = np.cross(b - a, c - a)
        nn = float(np.linalg.norm(n))
        if nn < 1e-12:  # collinear sample
            continue
        n = n / nn
        d = -float(n @ a)
        count = int(np.count_nonzero(np.abs(pts @ n + d) < threshold))
        if count > best_count:
            best_n, best_d, best_count = n, d, count
    return best_n, best_d, np.abs(pts @ best_n + best_d) < threshold


def _plane_lsq(pts: np.ndarray) -> tuple[np.ndarray, float]:
    """Least-squares plane of points (N, 3): unit normal (z >= 0: up) and d, n.p + d = 0."""
    c = pts.mean(axis=0)
    _, _, vt = np.linalg.svd(pts - c, full_matrices=False)
    n = vt[2] / np.linalg.norm(vt[2])
    if n[2] < 0:
        n = -n
    return n, -float(n @ c)


def _ground_plane(points: np.ndarray, threshold: float = 0.03, seed: int = 0) -> tuple[np.ndarray, float]:
    """Ground plane (unit normal up, d) with n.p + d = 0: RANSAC on a 5 cm voxel grid's centroids (up to three
    planes, the first horizontal one kept: walls are skipped), least squares on its inliers, then least squares
    on all points within threshold / 2 of the plane, repeated until that set stops changing. Numpy with a
    seeded generator throughout, so the plane is the same on every machine and thread count."""
    pts = _voxel_centroids(points, 0.05)
    if len(pts) < 3:
        raise PalletFitError(f"only {len(pts)} points after downsampling; cannot find the ground")
    rng = np.random.default_rng(seed)
    best = None
    remaining = pts
    for _ in range(3):  # the dominant plane should be the ground; skip walls
        if len(remaining) < 3:
            break
        n, _d, inl = _ransac_plane(remaining, threshold, 500, rng)
        if abs(n[2]) > 0.9:
            best = remaining[inl]
            break
        remaining = remaining[~inl]
    if best is None or len(best) < 3:
        raise PalletFitError("no horizontal ground plane found in the accumulated cloud")
    n, d = _plane_lsq(best)
    # Then on all points close to the plane (the voxel grid and RANSAC are coarse), to a fixed point.
    close = None
    for _ in range(10):
        near = np.abs(points @ n + d) < threshold / 2
        if np.count_nonzero(near) <= 10 or (close is not None and np.array_equal(near, close)):
            break
        close = near
        n, d = _plane_lsq(points[near])
    return n, d


def _plane_frame(n: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
    """Rotation R and offset o mapping world p to ground frame q = R p + o (ground at z = 0)."""
    z = n / np.linalg.norm(n)
    x = np.array([1.0, 0.0, 0.0]) - z[0] * z
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    r = np.stack([x, y, z])
    o = np.array([0.0, 0.0, d])
    return r, o


def _dbscan_2d(xy: np.ndarray, eps: float, min_points: int) -> np.ndarray:
    """DBSCAN labels of 2-D points (N, 2): clusters 0, 1, ... and -1 for noise.

    Two points are neighbours when closer than ``eps`` [m]; a point is a core point when it has at least
    ``min_points`` neighbours, itself included. A cluster is a connected set of core points with the non-core
    points next to them; a non-core point next to several clusters joins the lowest-numbered one. Clusters are
    numbered in the order of their first core point. These are open3d's ``cluster_dbscan`` rules, so the labels
    are the same as its labels."""
    n = len(xy)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    pairs = cKDTree(xy).query_pairs(eps, output_type="ndarray")
    if len(pairs):  # query_pairs keeps distances <= eps; a neighbour is strictly closer
        pairs = pairs[((xy[pairs[:, 0]] - xy[pairs[:, 1]]) ** 2).sum(axis=1) < eps * eps]
    i, j = pairs[:, 0], pairs[:, 1]
    core = np.bincount(np.concatenate([i, j]), minlength=n) + 1 >= min_points
    labels = np.full(n, -1, dtype=np.int64)
    core_idx = np.flatnonzero(core)
    if core_idx.size == 0:
        return labels
    both = core[i] & core[j]
    pos = np.cumsum(core) - 1  # index of a core point among the core points
    graph = coo_matrix((np.ones(int(both.sum())), (pos[i[both]], pos[j[both]])), shape=(core_idx.size,) * 2)
    _, comp = connected_components(graph, directed=False)
    # Number the components by their first core point.
    first = np.full(int(comp.max()) + 1, core_idx.size)
    np.minimum.at(first, comp, np.arange(core_idx.size))
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    labels[core_idx] = rank[comp]
    # Non-core points next to a core point: the lowest label among those core points.
    none = np.iinfo(np.int64).max
    border = np.full(n, none)
    for a, b in ((i, j), (j, i)):
        edge = core[a] & ~core[b]
        np.minimum.at(border, b[edge], labels[a[edge]])
    hit = border < none
    labels[hit] = border[hit]
    return labels


def _box_sdf(
    q: NDArray[np.float64], cx: float, cy: float, yaw: float, size: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Signed distance of ground-frame points q (N, 3) to the box on the ground (bottom at z = 0)."""
    c, s = np.cos(yaw), np.sin(yaw)
    dx, dy = q[:, 0] - cx, q[:, 1] - cy
    local = np.stack([c * dx + s * dy, -s * dx + c * dy, q[:, 2] - size[2] / 2], axis=1)
    e = np.abs(local) - size / 2
    outside = np.linalg.norm(np.maximum(e, 0.0), axis=1)
    inside = np.minimum(e.max(axis=1), 0.0)
    sdf: NDArray[np.float64] = outside + inside
    return sdf


def _merge_clusters(xy: np.ndarray, labels: np.ndarray, max_diameter: float, max_gap: float) -> np.ndarray:
    labels = labels.copy()
    while True:
        ids = [i for i in np.unique(labels) if i >= 0]
        merged = False
        for a in ids:
            pa = xy[labels == a]
            for b in ids:
                if b <= a:
                    continue
                pb = xy[labels == b]
                sa = pa[:: max(1, len(pa) // 200)]
                sb = pb[:: max(1, len(pb) // 200)]
                gap = np.sqrt(((sa[:, None, :] - sb[None, :, :]) ** 2).sum(-1)).min()
                if gap < max_gap and _diameter(np.vstack([pa, pb])) <= max_diameter:
                    labels[labels == b] = a
                    merged = True
                    break
            if merged:
                break
        if not merged:
            return labels


def _diameter(xy: np.ndarray) -> float:
    """Largest extent of a 2-D point set over 90 directions (close to its diameter)."""
    th = np.linspace(0.0, np.pi, 90, endpoint=False)
    proj = xy @ np.stack([np.cos(th), np.sin(th)])
    return float((proj.max(axis=0) - proj.min(axis=0)).max())


def _lshape_yaw(xy: np.ndarray, step_deg: float = 0.5, d0: float = 0.01) -> float:
    """Rectangle orientation in [0, pi/2) maximising the closeness criterion (points near edges)."""
    best, best_score = 0.0, -np.inf
    for th in np.deg2rad(np.arange(0.0, 90.0, step_deg)):
        e1 = np.array([np.cos(th), np.sin(th)])
        e2 = np.array([-np.sin(th), np.cos(th)])
        c1, c2 = xy @ e1, xy @ e2
        d1 = np.minimum(c1.max() - c1, c1 - c1.min())
        d2 = np.minimum(c2.max() - c2, c2 - c2.min())
        score = float(np.sum(1.0 / np.maximum(np.minimum(d1, d2), d0)))
        if score > best_score:
            best, best_score = th, score
    return float(best)


def _penetration(
    q_end: NDArray[np.float64], q_org: NDArray[np.float64], cx: float, cy: float, yaw: float,
    size: NDArray[np.float64], margin: float,
) -> NDArray[np.float64]:
    """Length [m] of each ray segment origin -> (endpoint - margin) inside the box shrunk by ``margin``."""
    c, s = np.cos(yaw), np.sin(yaw)
    rot = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
    ctr = np.array([cx, cy, size[2] / 2])
    o = (q_org - ctr) @ rot.T
    e = (q_end - ctr) @ rot.T
    d = e - o
    length = np.linalg.norm(d, axis=1)
    d = d / np.maximum(length, 1e-9)[:, None]
    half = size / 2 - margin
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = 1.0 / d
        t1 = (-half - o) * inv
        t2 = (half - o) * inv
    # A ray along a face (or of zero length: a point at the lidar) has infinite slab distances; keep them
    # infinite (nan_to_num's default makes them +-1.8e308, whose difference overflows): such a ray is
    # then inside for no length.
    tn = np.nan_to_num(np.minimum(t1, t2), nan=-np.inf, posinf=np.inf, neginf=-np.inf).max(axis=1)
    tf = np.nan_to_num(np.maximum(t1, t2), nan=np.inf, posinf=np.inf, neginf=-np.inf).min(axis=1)
    inside: NDArray[np.float64] = np.minimum(tf, length - margin) - np.maximum(tn, 0.0)
    return np.maximum(inside, 0.0)


def _free_space_violations(
    q_end: np.ndarray, q_org: np.ndarray, cx: float, cy: float, yaw: float, size: np.ndarray, margin: float
) -> int:
    """Number of rays that cross the (shrunk) box interior before their endpoint."""
    return int((_penetration(q_end, q_org, cx, cy, yaw, size, margin) > 0).sum())


def _rays_near(q_end: np.ndarray, q_org: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """Indices of rays whose 2-D segment passes within ``radius`` of ``centre``."""
    a, b = q_org[:, :2], q_end[:, :2]
    ab = b - a
    u = np.clip(((centre - a) * ab).sum(axis=1) / np.maximum((ab * ab).sum(axis=1), 1e-12), 0.0, 1.0)
    closest = a + u[:, None] * ab
    return np.flatnonzero(np.linalg.norm(closest - centre, axis=1) < radius)


def fit_box(
    points: np.ndarray,
    origins: np.ndarray,
    size: Sequence[float] = PALLET_SIZE,
    ground_threshold: float = 0.03,
    cluster_eps: float = 0.35,
    max_rms: float = 0.05,
    min_points: int = 15,
    max_free_space_rays: int = 30000,
    seed: int = 0,
) -> PalletFit:
    """Fit the known box (L, W, H) [m] lying on the ground to world points (N, 3) with ray origins (N, 3).

    Raises ``PalletFitError`` when there is no ground, no box-sized cluster, or the fit is poor.
    """
    pts = np.asarray(points, dtype=np.float64)
    org = np.broadcast_to(np.asarray(origins, dtype=np.float64), pts.shape)
    good = np.isfinite(pts).all(axis=1)
    pts, org = pts[good], org[good]
    size_a = np.asarray(size, dtype=float)
    if len(pts) < min_points:
        raise PalletFitError(f"only {len(pts)} finite points; cannot fit a pallet")
    n, d = _ground_plane(pts, ground_threshold, seed)
    rg, og = _plane_frame(n, d)
    q = pts @ rg.T + og
    qo = org @ rg.T + og
    h = q[:, 2]
    sel = (h > ground_threshold) & (h < size_a[2] + 0.10)
    cand = np.flatnonzero(sel)
    if cand.size < min_points:
        raise PalletFitError(
            f"no object found above the ground ({cand.size} points 3 cm to {size_a[2] + 0.1:.2f} m high); "
            "is the pallet in the lidar's view? Check the cloud topic and the lidar extrinsic"
        )
    # Voxel-thin the candidates for clustering speed (deterministic: first point per 2 cm cell).
    keys = np.floor(q[cand] / 0.02).astype(np.int64)
    _, first = np.unique(keys, axis=0, return_index=True)
    cand = cand[np.sort(first)]
    labels = _dbscan_2d(q[cand, :2], cluster_eps, 5)
    diag = float(np.hypot(size_a[0], size_a[1]))
    # Far away, a box's scan lines are further apart than eps: merge clusters that together still
    # fit inside one box.
    labels = _merge_clusters(q[cand, :2], labels, diag + 0.1, max_gap=1.0)
    rng = np.random.default_rng(seed)
    if len(q) > max_free_space_rays:
        ray_idx = rng.choice(len(q), max_free_space_rays, replace=False)
    else:
        ray_idx = np.arange(len(q))
    fits: list[tuple[float, _ClusterBox]] = []
    n_clusters = int(labels.max() + 1) if labels.size else 0
    reasons = []
    for lab in range(n_clusters):
        ci = cand[labels == lab]
        if ci.size < min_points:
            reasons.append(f"cluster {lab}: {ci.size} points")
            continue
        xy = q[ci, :2]
        span = _diameter(xy)
        if span > diag + 0.3 or span < 0.15:
            reasons.append(f"cluster {lab}: span {span:.2f} m")
            continue
        fit = _fit_cluster(q, qo, ci, ray_idx, size_a)
        if fit is None:
            continue
        fits.append(fit)
    if not fits:
        detail = "; ".join(reasons[:5]) or "no clusters"
        raise PalletFitError(
            f"no box-sized object ({size_a[0]} x {size_a[1]} x {size_a[2]} m) found on the ground ({detail}). "
            "Check `pallet: size:` in the topic map and that the pallet is in view"
        )
    score, (cx, cy, yaw, rms, npts, hyps) = min(fits, key=lambda f: f[0])
    if rms > max_rms:
        raise PalletFitError(
            f"best box fit is poor: RMS {rms * 100:.1f} cm > {max_rms * 100:.1f} cm over {npts} points; "
            "the object may not be the pallet, or the odometry used to accumulate clouds drifts"
        )
    # Back to the world frame: ground-frame point (cx, cy, 0) and heading.
    cw = rg.T @ (np.array([cx, cy, 0.0]) - og)
    hw = rg.T @ np.array([np.cos(yaw), np.sin(yaw), 0.0])
    yaw_w = float(np.arctan2(hw[1], hw[0]))
    yaw_w = float((yaw_w + np.pi / 2) % np.pi - np.pi / 2)
    return PalletFit(
        float(cw[0]),
        float(cw[1]),
        yaw_w,
        tuple(size_a),
        float(rms),
        int(npts),
        (float(n[0]), float(n[1]), float(n[2]), float(d)),
        hyps,
        n_clusters,
    )


def _fit_cluster(
    q: np.ndarray, qo: np.ndarray, ci: np.ndarray, ray_idx: np.ndarray, size: np.ndarray
) -> tuple[float, _ClusterBox] | None:
    xy = q[ci, :2]
    sensor = qo[ci, :2].mean(axis=0)
    th = _lshape_yaw(xy)
    hyps = []
    fs_rays = np.setdiff1d(ray_idx, ci)
    for yaw0 in (th, th + np.pi / 2):
        e1 = np.array([np.cos(yaw0), np.sin(yaw0)])
        e2 = np.array([-np.sin(yaw0), np.cos(yaw0)])
        centre = np.zeros(2)
        for e, length in ((e1, size[0]), (e2, size[1])):
            u = xy @ e
            lo, hi, s = u.min(), u.max(), sensor @ e
            if s < lo:
                c = lo + length / 2
            elif s > hi:
                c = hi - length / 2
            else:
                c = (lo + hi) / 2
            centre += c * e
        qc = q[ci]
        # Free-space rays near the box: the fitted box must not swallow rays that pass it (this pins
        # faces the lidar did not sample, e.g. the near face in the blind zone below the lowest beam).
        near = fs_rays[_rays_near(q[fs_rays], qo[fs_rays], xy.mean(axis=0), float(np.hypot(*size[:2])) / 2 + 0.5)]
        if near.size > 2000:  # bound the cost of each residual evaluation (evenly thinned)
            near = near[np.linspace(0, near.size - 1, 2000).astype(int)]
        fe, fo = q[near], qo[near]

        def resid(p: np.ndarray, qc: np.ndarray = qc, fe: np.ndarray = fe, fo: np.ndarray = fo) -> np.ndarray:
            return np.concatenate(
                [_box_sdf(qc, p[0], p[1], p[2], size), _penetration(fe, fo, p[0], p[1], p[2], size, 0.01)]
            )

        sol = least_squares(
            resid,
            np.array([centre[0], centre[1], yaw0]),
            loss="soft_l1",
            f_scale=0.02,
            x_scale=np.array([0.1, 0.1, 0.05]),
        )
        cx, cy, yaw = (float(v) for v in sol.x)
        r = _box_sdf(qc, cx, cy, yaw, size)
        inl = np.abs(r) < 0.1
        rms = float(np.sqrt(np.mean(r[inl] ** 2))) if inl.any() else np.inf
        # Rays whose endpoint is the cluster itself are excluded (they end on the box surface).
        viol = _free_space_violations(q[fs_rays], qo[fs_rays], cx, cy, yaw, size, margin=0.03)
        hyps.append(
            {
                "x": cx,
                "y": cy,
                "yaw": yaw,
                "rms": rms,
                "free_space_violations": viol,
                "inlier_fraction": float(inl.mean()),
            }
        )
    a, b = hyps
    tol = max(3, int(0.002 * len(ray_idx)))
    if abs(a["free_space_violations"] - b["free_space_violations"]) > tol:
        best = a if a["free_space_violations"] < b["free_space_violations"] else b
    else:
        best = a if a["rms"] / max(a["inlier_fraction"], 1e-3) <= b["rms"] / max(b["inlier_fraction"], 1e-3) else b
    score = best["rms"] / max(best["inlier_fraction"], 1e-3)
    return score, (best["x"], best["y"], best["yaw"], best["rms"], int(ci.size), hyps)


def fit_pallet_from_clouds(
    t_clouds: np.ndarray,
    clouds: Sequence[np.ndarray],
    t_odom: np.ndarray,
    pose_odom: np.ndarray,
    size: Sequence[float] = PALLET_SIZE,
    lidar_xyz: Sequence[float] = (0.0, 0.0, 0.0),
    lidar_rpy: Sequence[float] = (0.0, 0.0, 0.0),
    max_clouds: int = 200,
    progress: bool = False,
    **kwargs: Any,
) -> PalletFit:
    """Accumulate lidar-frame clouds with the odometry pose (N, 7) and fit the pallet (odometry frame).

    At most ``max_clouds`` clouds (evenly spread) are used to bound time and memory.
    """
    t_clouds = np.asarray(t_clouds, dtype=float)
    if len(clouds) == 0:
        raise CloudError("no point clouds to fit the pallet on")
    if len(clouds) > max_clouds:
        pick = np.unique(np.linspace(0, len(clouds) - 1, max_clouds).round().astype(int))
        t_clouds = t_clouds[pick]
        clouds = [clouds[i] for i in pick]
    pts, org = accumulate(t_clouds, clouds, t_odom, pose_odom, lidar_xyz, lidar_rpy, progress=progress)
    return fit_box(pts, org, size, **kwargs)


def _ray_box_2d(p: np.ndarray, u: np.ndarray, pallet: Any) -> float | None:
    """Distance along the 2-D ray p + t u (t >= 0) to the pallet's footprint, None if it misses."""
    c, s = np.cos(pallet.yaw), np.sin(pallet.yaw)
    rot = np.array([[c, s], [-s, c]])
    o = rot @ (p - np.array([pallet.x, pallet.y]))
    d = rot @ u
    half = np.array(pallet.size[:2]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (-half - o) / d
        t2 = (half - o) / d
    tn = float(np.nan_to_num(np.minimum(t1, t2), nan=-np.inf).max())
    tf = float(np.nan_to_num(np.maximum(t1, t2), nan=np.inf).min())
    return tn if tf >= max(tn, 0.0) and tn >= 0 else None


def onset_cross_check(
    pallet: Any, onset: dict[str, float], wheel_radius: float = WHEEL_RADIUS, track_width: float = 0.72
) -> dict[str, Any]:
    """Compare the lidar pallet with the climb onset from odometry (both in the run frame).

    At the onset the first front wheel (at +-track/2 beside the base origin, on its axle) touches the
    pallet's near edge, so that edge should lie ``sqrt(r^2 - (r - H)^2)`` ahead of the wheel along the
    heading. Reports the smallest wheel-to-edge distance along the heading from the lidar fit (None
    when neither wheel is heading for the pallet), the expected distance and their difference [m].
    """
    h = pallet.size[2]
    expected = float(np.sqrt(max(wheel_radius**2 - (wheel_radius - h) ** 2, 0.0)))
    p = np.array([onset["x"], onset["y"]])
    u = np.array([np.cos(onset["yaw"]), np.sin(onset["yaw"])])
    left = np.array([-u[1], u[0]])
    dists = {}
    for name, side in (("left", 1.0), ("right", -1.0)):
        dists[name] = _ray_box_2d(p + side * track_width / 2 * left, u, pallet)
    hits = [d for d in dists.values() if d is not None]
    edge = min(hits) if hits else None
    out: dict[str, Any] = {
        "onset_t": onset["t"],
        "onset_xy": [onset["x"], onset["y"]],
        "edge_distance_lidar_m": edge,
        "edge_distance_per_wheel_m": dists,
        "edge_distance_expected_m": expected,
    }
    out["discrepancy_m"] = None if edge is None else edge - expected
    out["consistent"] = None if edge is None else bool(abs(edge - expected) < 0.05)
    return out
