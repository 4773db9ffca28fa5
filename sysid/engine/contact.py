"""Contact stage: newton's contacts gathered into per-world slots, sorted and merged (once per step), and
the contact geometry (normal, points, gap) evaluated at the iterate, which the rows of `rows.py` and the
adjoint's residual share.

Slots (``world * max_contacts + local``) hold shapes, body-frame points [m], the normal in the frame of
the body it moves with, the summed margins [m] and the anisotropic (wheel) shape, see `types.py`.
"""

from __future__ import annotations

import math
from typing import Any

import newton
import numpy as np
import warp as wp

from .constraints import contact_point
from .kinematics import body_state, origin_from_com
from .types import Contacts, ModelArrays

wp.set_module_options({"enable_backward": False})

# newton's shape types the contact stage tells apart (a wheel is a cylinder), by name; wp.constant needs the plain
# int (a GeoType member would compile to an unknown C++ type)
_ROUND = wp.constant(int(newton.GeoType.CYLINDER))
_BOX = wp.constant(int(newton.GeoType.BOX))
_MESH = wp.constant(int(newton.GeoType.MESH))
# wheel-on-static-box contacts: one per pair, normal and box point from the wheel centre at the
# step's midpoint (wheel_box_contact), smooth in q- and q+; 0 keeps newton's points and normals
EDGE_GEOMETRY = wp.constant(1)
# pose of the wheel-box geometry between q- (0) and the iterate q+ (1); 0.5 tracks a fine-step reference
# best (docs/results.md, "The wheel-on-box contact's pose")
WB_BLEND = wp.constant(0.5)
# wheel-on-static-mesh contacts (terrain): one per pair, from the wheel centre's closest mesh point with
# the mesh's interpolated vertex normal (wheel_mesh_contact), continuous as the wheel crosses triangle
# edges; 0 keeps newton's contacts (one per wheel-triangle pair within the margin)
MESH_GEOMETRY = wp.constant(1)
# faces meeting at more than this angle [rad] keep their own normals (a sharp edge: corner_normals)
CREASE_ANGLE = math.radians(30.0)
CREASE_COS = wp.constant(math.cos(CREASE_ANGLE))
# two of a wheel's contacts on one mesh, each this far [m] above the other's face: a concave corner
CORNER_RISE = wp.constant(0.01)
# newton's contacts gathered per world before the merge, per merged slot (SolverOptions.max_contacts_per_world)
RAW_CONTACTS_PER_SLOT = 4
# how far from the wheel centre the closest mesh point is searched [m]; beyond it newton's geometry is kept
MESH_QUERY_DIST = wp.constant(2.0)


@wp.func
def wheel_on_static_box(s_box: int, s_wheel: int, shape_body: wp.array[int], shape_type: wp.array[int]):
    """Whether shape s_box is a static box and s_wheel a cylinder (a wheel on the pallet): such a
    pair has one contact, computed by wheel_box_contact from the wheel centre."""
    return EDGE_GEOMETRY != 0 and shape_body[s_box] < 0 and shape_type[s_box] == _BOX and shape_type[s_wheel] == _ROUND


@wp.func
def wheel_on_static_mesh(s_mesh: int, s_wheel: int, shape_body: wp.array[int], shape_type: wp.array[int]):
    """Whether shape s_mesh is a static triangle mesh and s_wheel a cylinder (a wheel on terrain): such a
    pair has one contact, computed by wheel_mesh_contact from the wheel centre."""
    return (MESH_GEOMETRY != 0 and shape_body[s_mesh] < 0 and shape_type[s_mesh] == _MESH
            and shape_type[s_wheel] == _ROUND)


@wp.func
def one_wheel_contact(s0: int, s1: int, shape_body: wp.array[int], shape_type: wp.array[int]):
    """Whether the pair (s0, s1) is a wheel on a static box or mesh, in either order."""
    box = wheel_on_static_box(s0, s1, shape_body, shape_type) or wheel_on_static_box(s1, s0, shape_body, shape_type)
    mesh = wheel_on_static_mesh(s0, s1, shape_body, shape_type) or wheel_on_static_mesh(s1, s0, shape_body, shape_type)
    return box or mesh


def corner_normals(vertices: np.ndarray, indices: np.ndarray, crease: float = CREASE_ANGLE) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """Smooth normals of a triangle mesh that keep its sharp edges: per triangle corner (3 per face,
    face-major) the area-weighted mean of the normals of the faces around that vertex within ``crease``
    [rad] of this face's, unit length; and per face a bitmask of its sharp edges (bit e: the edge from
    corner e to corner e + 1 meets its neighbour at more than ``crease``, or has none). On a smooth
    heightfield every corner of a vertex gets the vertex normal; on a box made of triangles every
    corner gets its face's normal."""
    v = np.asarray(vertices, np.float64).reshape(-1, 3)
    f = np.asarray(indices, np.int64).reshape(-1, 3)
    M = len(f)
    fw = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])  # |fw| = 2 x area
    fn = fw / np.maximum(np.linalg.norm(fw, axis=1, keepdims=True), 1e-30)
    cos_c = math.cos(crease)
    # corners grouped by vertex; every pair of corners at one vertex (sum of degree^2 pairs)
    vid, fid = f.ravel(), np.repeat(np.arange(M), 3)
    order = np.argsort(vid, kind="stable")
    vs = vid[order]
    starts = np.r_[0, np.flatnonzero(np.diff(vs)) + 1]
    sizes = np.diff(np.r_[starts, len(vs)])
    grp = np.repeat(np.arange(len(starts)), sizes)
    rep = sizes[grp]
    ia = np.repeat(np.arange(len(vs)), rep)
    ib = starts[grp[ia]] + np.arange(len(ia)) - np.repeat(np.cumsum(rep) - rep, rep)
    fa, fb = fid[order[ia]], fid[order[ib]]
    keep = np.einsum("ij,ij->i", fn[fa], fn[fb]) >= cos_c
    acc = np.zeros((len(vs), 3))
    np.add.at(acc, ia[keep], fw[fb[keep]])
    cn = np.zeros((3 * M, 3))
    cn[order] = acc / np.maximum(np.linalg.norm(acc, axis=1, keepdims=True), 1e-30)
    # sharp edges: edge e of face t joins corners e and e + 1
    ea, eb = f, np.roll(f, -1, axis=1)
    key = (np.minimum(ea, eb) * (len(v) + 1) + np.maximum(ea, eb)).ravel()
    eo = np.argsort(key, kind="stable")
    ks = key[eo]
    sharp = np.ones(3 * M, bool)  # boundary edges (no neighbour) count as sharp
    same = np.flatnonzero(ks[1:] == ks[:-1])
    x, y = eo[same], eo[same + 1]  # the two faces of an interior edge
    smooth = np.einsum("ij,ij->i", fn[x // 3], fn[y // 3]) >= cos_c
    sharp[x[smooth]] = False
    sharp[y[smooth]] = False
    mask = (sharp.reshape(M, 3) * np.array([1, 2, 4])).sum(axis=1).astype(np.int32)
    return cn, mask


def mesh_contact_arrays(model: newton.Model, device: Any) -> tuple[wp.array[Any], ...]:
    """Per shape: its warp mesh id (0: not a mesh) and the first face of its entries in two arrays of all
    meshes' faces: `corner_normals` (3 per face, mesh frame) and the sharp-edge bitmasks, which
    wheel_mesh_contact uses. Computed once on the host from newton's mesh sources (the meshes are static)."""
    ns = max(model.shape_count, 1)
    ids = np.zeros(ns, np.uint64)
    start = np.full(ns, -1, np.int32)
    normals: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    n_faces = 0
    if model.shape_count:
        types = model.shape_type.numpy()
        ptrs = model.shape_source_ptr.numpy()
        for s in range(model.shape_count):
            src = model.shape_source[s]
            if int(types[s]) != _MESH or src is None:
                continue
            cn, mask = corner_normals(src.vertices, src.indices)
            ids[s] = ptrs[s]
            start[s] = n_faces
            normals.append(cn)
            masks.append(mask)
            n_faces += len(mask)
    cn_all = np.concatenate(normals) if normals else np.zeros((1, 3))
    mask_all = np.concatenate(masks) if masks else np.zeros(1, np.int32)
    return (wp.array(ids, dtype=wp.uint64, device=device), wp.array(start, dtype=int, device=device),
            wp.array(cn_all.astype(np.float32), dtype=wp.vec3, device=device),
            wp.array(mask_all, dtype=int, device=device))


@wp.kernel
def gather_contacts(
    # Model:
    shape_body: wp.array[int],
    body_world: wp.array[int],
    max_raw: int,
    # Data in:
    rigid_contact_count: wp.array[int],
    rigid_contact_shape0: wp.array[int],
    rigid_contact_shape1: wp.array[int],
    # Data out:
    ct_count_out: wp.array[int],
    ct_overflow_out: wp.array[int],
    ct_src_out: wp.array[int],
):
    i = wp.tid()
    if i >= rigid_contact_count[0]:
        return
    s0 = rigid_contact_shape0[i]
    s1 = rigid_contact_shape1[i]
    if s0 < 0 or s1 < 0:
        return
    b0 = shape_body[s0]
    b1 = shape_body[s1]
    w = -1
    if b0 >= 0:
        w = body_world[b0]
    elif b1 >= 0:
        w = body_world[b1]
    if w < 0:
        return
    slot = wp.atomic_add(ct_count_out, w, 1)
    if slot >= max_raw:
        wp.atomic_add(ct_overflow_out, w, 1)
        return
    ct_src_out[w * max_raw + slot] = i


@wp.func
def mesh_face_at(model: ModelArrays, sm: int, p: wp.vec3):
    """The outward unit normal (world) of static mesh shape sm's face nearest to world point p (a point
    newton reported on it) and whether one lies within CORNER_RISE."""
    X = model.shape_transform[sm]
    scale = model.shape_scale[sm]
    mesh = model.shape_mesh[sm]
    pm = wp.cw_div(wp.transform_point(wp.transform_inverse(X), p), scale)
    hit = wp.mesh_query_point_no_sign(mesh, pm, CORNER_RISE)
    if not hit.result:
        return int(0), wp.vec3()
    tri = wp.mesh_get(mesh).indices
    pts = wp.mesh_get(mesh).points
    a = pts[tri[hit.face * 3 + 0]]
    b = pts[tri[hit.face * 3 + 1]]
    c = pts[tri[hit.face * 3 + 2]]
    nf = wp.cross(b - a, c - a)
    return int(1), wp.normalize(wp.quat_rotate(wp.transform_get_rotation(X), wp.cw_div(nf, scale)))


@wp.func
def mesh_side_point(
    c: int,
    mesh_is_0: bool,
    rigid_contact_point0: wp.array[wp.vec3],
    rigid_contact_point1: wp.array[wp.vec3],
):
    """newton's contact c's point on the static mesh (world: a static shape's frame)."""
    if mesh_is_0:
        return rigid_contact_point0[c]
    return rigid_contact_point1[c]


@wp.func
def mesh_corner(
    model: ModelArrays,
    sm: int,
    base: int,
    i0: int,
    n: int,
    s0: int,
    s1: int,
    ct_src: wp.array[int],
    rigid_contact_shape0: wp.array[int],
    rigid_contact_shape1: wp.array[int],
    rigid_contact_point0: wp.array[wp.vec3],
    rigid_contact_point1: wp.array[wp.vec3],
):
    """Whether newton's contacts of the wheel-mesh pair (s0, s1; sm the static mesh) starting at sorted
    raw index i0 lie on two faces that meet in a concave corner: face normals apart by more than
    CREASE_ANGLE and each contact point above the other's face by more than CORNER_RISE (a wheel
    against a step). On smooth terrain the faces agree; at a convex edge the points coincide."""
    i = i0
    found = int(0)
    while i < n and found == 0:
        a = ct_src[base + i]
        if rigid_contact_shape0[a] != s0 or rigid_contact_shape1[a] != s1:
            break
        pa = mesh_side_point(a, sm == s0, rigid_contact_point0, rigid_contact_point1)
        oka, na = mesh_face_at(model, sm, pa)
        j = i + 1
        while j < n and oka != 0:
            b = ct_src[base + j]
            if rigid_contact_shape0[b] != s0 or rigid_contact_shape1[b] != s1:
                break
            pb = mesh_side_point(b, sm == s0, rigid_contact_point0, rigid_contact_point1)
            okb, nb = mesh_face_at(model, sm, pb)
            if okb != 0 and wp.dot(na, nb) < CREASE_COS:
                if wp.dot(pb - pa, na) > CORNER_RISE and wp.dot(pa - pb, nb) > CORNER_RISE:
                    found = 1
            j += 1
        i += 1
    return found


@wp.kernel
def prepare_contacts(
    # Model:
    model: ModelArrays,
    shape_aniso: wp.array[int],
    max_contacts: int,
    max_raw: int,
    shape_key_stride: int,
    # Data in:
    q_prev: wp.array[wp.quat],
    rigid_contact_shape0: wp.array[int],
    rigid_contact_shape1: wp.array[int],
    rigid_contact_point0: wp.array[wp.vec3],
    rigid_contact_point1: wp.array[wp.vec3],
    rigid_contact_normal: wp.array[wp.vec3],
    rigid_contact_margin0: wp.array[float],
    rigid_contact_margin1: wp.array[float],
    # Data in/out (ct.count in: gathered per world, out: kept after the merge; ct_overflow: dropped):
    ct_src: wp.array[int],
    ct_overflow: wp.array[int],
    # Data out:
    ct: Contacts,
    ct_nw_out: wp.array[wp.vec3],
):
    """Sort a world's contacts by (shape pair, newton index) so the row order, and hence the
    floating-point result, does not depend on the other worlds; then store them in the frames
    they move with."""
    w = wp.tid()
    n = wp.min(ct.count[w], max_raw)
    base = w * max_raw
    # insertion sort by key
    for i in range(1, n):
        v = ct_src[base + i]
        kv = rigid_contact_shape0[v] * shape_key_stride + rigid_contact_shape1[v]
        j = i - 1
        while j >= 0:
            u = ct_src[base + j]
            ku = rigid_contact_shape0[u] * shape_key_stride + rigid_contact_shape1[u]
            if ku > kv or (ku == kv and u > v):
                ct_src[base + j + 1] = u
                j = j - 1
            else:
                break
        ct_src[base + j + 1] = v
    # A cylinder (wheel) touching a face gets two rim points from newton; they share one normal
    # and their load split is a stiff, nearly indeterminate mode, so merge them into one contact
    # at the tread centre (camber is held by the wheel's joint). Contacts with distinct normals
    # (a pallet edge and its top face) stay separate.
    m = int(0)
    single = int(0)  # the current pair's contacts share one slot from the wheel centre
    for i in range(n):
        src = ct_src[base + i]
        s0 = rigid_contact_shape0[src]
        s1 = rigid_contact_shape1[src]
        first = int(1)
        if i > 0:
            pv = ct_src[base + i - 1]
            if rigid_contact_shape0[pv] == s0 and rigid_contact_shape1[pv] == s1:
                first = 0
        if first != 0:
            # a wheel and a static box or mesh touch at one point (contact_geometry computes it from
            # the wheel centre), unless the wheel sits in a concave corner of the mesh (a step): then
            # it touches two faces and keeps newton's contacts
            single = int(0)
            if one_wheel_contact(s0, s1, model.shape_body, model.shape_type):
                single = 1
                sm = static_shape(s0, s1, model.shape_body)
                if model.shape_type[sm] == _MESH:
                    if mesh_corner(model, sm, base, i, n, s0, s1, ct_src, rigid_contact_shape0, rigid_contact_shape1,
                                   rigid_contact_point0, rigid_contact_point1) != 0:
                        single = 0
        merged = int(0)
        if m > 0 and (model.shape_type[s0] == _ROUND or model.shape_type[s1] == _ROUND):
            prev = ct_src[base + m - 1]
            if rigid_contact_shape0[prev] == s0 and rigid_contact_shape1[prev] == s1:
                if wp.dot(rigid_contact_normal[prev], rigid_contact_normal[src]) > 0.98:
                    merged = 1
                if single != 0:
                    merged = 1
        if merged == 0:
            ct_src[base + m] = src
            if m < max_contacts:
                ct.single[w * max_contacts + m] = single
            m += 1
    # newton's raw contacts have max_raw slots (a wheel on a mesh brings a dozen that merge into one);
    # the merged ones max_contacts
    if m > max_contacts:
        ct_overflow[w] = ct_overflow[w] + m - max_contacts
        m = max_contacts
    n = m
    ct.count[w] = n
    for i in range(n):
        k = w * max_contacts + i
        src = ct_src[base + i]
        s0 = rigid_contact_shape0[src]
        s1 = rigid_contact_shape1[src]
        b0 = model.shape_body[s0]
        b1 = model.shape_body[s1]
        n_w = rigid_contact_normal[src]
        # The normal moves with the static side if any, else with the non-round shape.
        nb = -1
        if b0 >= 0 and b1 >= 0:
            nb = b0
            if model.shape_type[s0] == _ROUND:
                nb = b1
        n_l = n_w
        if nb >= 0:
            n_l = wp.quat_rotate_inv(q_prev[nb], n_w)
        p0 = rigid_contact_point0[src]
        p1 = rigid_contact_point1[src]
        ax0 = float(0.0)
        ax1 = float(0.0)
        # a wheel's contact sits at the tread centre (axial offset 0) after the merge above
        if b0 >= 0 and model.shape_type[s0] == _ROUND:
            ax0 = float(0.0)
        if b1 >= 0 and model.shape_type[s1] == _ROUND:
            ax1 = float(0.0)
        fs = -1
        if shape_aniso[s0] != 0:
            fs = s0
        if shape_aniso[s1] != 0:
            fs = s1
        ct.shape0[k] = s0
        ct.shape1[k] = s1
        ct.p0[k] = p0
        ct.p1[k] = p1
        ct.n[k] = n_l
        ct_nw_out[k] = n_w
        ct.nbody[k] = nb
        ct.thick[k] = rigid_contact_margin0[src] + rigid_contact_margin1[src]
        ct.axial0[k] = ax0
        ct.axial1[k] = ax1
        ct.fric_shape[k] = fs


@wp.func
def wheel_box_contact(
    X_box: wp.transform,
    half: wp.vec3,
    C: wp.vec3,
):
    """Contact of a cylinder (wheel) with a static box from the wheel centre C [m] (world): the box
    point P closest to C (C clamped to the box) and the unit normal from P
    toward C. On a face that is the face's normal, over an edge the edge point with the normal
    toward C, continuous from the front face over the edge onto the top face, whatever point
    newton reported. ok = 0 when C lies inside the box (the stored geometry is kept).
    contact_geometry evaluates it at the wheel pose halfway between the step's start (q-) and the
    iterate (q+) (WB_BLEND): at q+ alone a 0.1 s step cuts the corner round the pallet's far edge,
    at q- alone the wheel rides the top face's plane past the edge for a step; the adjoint
    differentiates it through both."""
    Cb = wp.transform_point(wp.transform_inverse(X_box), C)
    Pb = wp.vec3(wp.clamp(Cb[0], -half[0], half[0]), wp.clamp(Cb[1], -half[1], half[1]),
                 wp.clamp(Cb[2], -half[2], half[2]))
    d = Cb - Pb
    L = wp.length(d)
    if L < 1.0e-6:
        return int(0), wp.vec3(), wp.vec3()
    n = wp.quat_rotate(wp.transform_get_rotation(X_box), d / L)
    return int(1), n, wp.transform_point(X_box, Pb)


@wp.func
def wheel_mesh_contact(
    mesh: wp.uint64,
    mesh_cn: wp.array[wp.vec3],
    mesh_sharp: wp.array[int],
    face_start: int,
    X_mesh: wp.transform,
    scale: wp.vec3,
    C: wp.vec3,
):
    """Contact of a cylinder (wheel) with a static triangle mesh from the wheel centre C [m] (world):
    P is the mesh point closest to C, the normal n the face's corner normals
    (corner_normals: smooth across edges flatter than CREASE_ANGLE, the face's own at sharper ones)
    interpolated at P, or, where P lies on a sharp edge or corner, the direction from P to C (rounding
    it like the box's edge in wheel_box_contact); the mesh point is C - d n with d = |C - P|, so the gap
    is the distance from the wheel centre minus the radius. d is continuous everywhere and n across
    every edge (a smooth edge: both faces share the corner normals there; a sharp convex edge: P - C
    turns from one face's normal to the other's; at a smooth concave crease, where P jumps from one
    face to the other, both feet lie within d x the crease angle of the edge and see nearly its normal),
    so the step map does not jump as the wheel crosses triangles, whereas one contact per
    wheel-triangle pair appears and vanishes there. Outward normals need counter-clockwise triangles
    (as newton's collision does). ok = 0 when no mesh point is within MESH_QUERY_DIST (the stored
    geometry is kept). The closest point's barycentrics carry warp's adjoint, so the adjoint
    differentiates n and d."""
    Cm = wp.cw_div(wp.transform_point(wp.transform_inverse(X_mesh), C), scale)
    hit = wp.mesh_query_point_no_sign(mesh, Cm, MESH_QUERY_DIST)
    if not hit.result:
        return int(0), wp.vec3(), wp.vec3()
    u = hit.u
    v = hit.v
    w = 1.0 - u - v
    c = (face_start + hit.face) * 3
    nm = u * mesh_cn[c] + v * mesh_cn[c + 1] + w * mesh_cn[c + 2]
    Pm = wp.mesh_eval_position(mesh, hit.face, u, v)
    R = wp.transform_get_rotation(X_mesh)
    n = wp.normalize(wp.quat_rotate(R, wp.cw_div(nm, scale)))
    dC = C - wp.transform_point(X_mesh, wp.cw_mul(Pm, scale))
    L = wp.length(dC)
    # on a sharp edge (bit e: corners e, e + 1; the opposite corner's weight is 0) or a corner of one
    sharp = mesh_sharp[face_start + hit.face]
    on_sharp = int(0)
    if (w < 1.0e-6 and (sharp & 1) != 0) or (u < 1.0e-6 and (sharp & 2) != 0) or (v < 1.0e-6 and (sharp & 4) != 0):
        on_sharp = 1
    if on_sharp != 0 and L > 1.0e-6:
        n = dC / L
    # the normal on the wheel's side (interpolated normals can tilt past C - P on a coarse mesh; a wheel
    # centre never passes through the terrain, so the unsigned distance is the gap's)
    if wp.dot(dC, n) < 0.0:
        n = -n
    return int(1), n, C - L * n


@wp.func
def midstep_wheel_centre(
    b: int,
    x: wp.array[wp.vec3],
    q: wp.array[wp.quat],
    x_prev: wp.array[wp.vec3],
    q_prev: wp.array[wp.quat],
    body_com: wp.array[wp.vec3],
    X_cyl: wp.transform,
):
    """World centre [m] of the wheel (cylinder frame X_cyl) of body b at the pose WB_BLEND of the way
    from q- to the iterate."""
    xb = WB_BLEND * x[b] + (1.0 - WB_BLEND) * x_prev[b]
    qb = wp.normalize(WB_BLEND * q[b] + (1.0 - WB_BLEND) * q_prev[b])
    return wp.transform_get_translation(wp.transform_multiply(origin_from_com(xb, qb, body_com[b]), X_cyl))


@wp.func
def static_shape(s0: int, s1: int, shape_body: wp.array[int]):
    """The static shape of a wheel-on-static pair (one_wheel_contact): s0 unless it moves with a body."""
    if shape_body[s0] >= 0:
        return s1
    return s0


@wp.func
def contact_geometry(
    k: int,
    model: ModelArrays,
    ct: Contacts,
    x: wp.array[wp.vec3],
    q: wp.array[wp.quat],
    x_prev: wp.array[wp.vec3],
    q_prev: wp.array[wp.quat],
):
    """Normal n, points P0/P1 [m] and gap [m] of contact slot k at body poses (x, q); a wheel on a
    static box or mesh takes its normal and static point from the wheel halfway between q-
    (x_prev, q_prev) and (x, q) (midstep_wheel_centre, wheel_box_contact, wheel_mesh_contact) unless
    the slot keeps newton's contacts (ct.single 0: a wheel in a concave corner of a mesh)."""
    s0 = ct.shape0[k]
    s1 = ct.shape1[k]
    b0 = model.shape_body[s0]
    b1 = model.shape_body[s1]
    nb = ct.nbody[k]
    n = ct.n[k]
    if nb >= 0:
        n = wp.quat_rotate(q[nb], n)
    x0, q0, c0 = body_state(b0, x, q, model.body_com)
    x1, q1, c1 = body_state(b1, x, q, model.body_com)
    cyl0 = 0
    if model.shape_type[s0] == _ROUND:
        cyl0 = 1
    cyl1 = 0
    if model.shape_type[s1] == _ROUND:
        cyl1 = 1
    p0 = ct.p0[k]
    p1 = ct.p1[k]
    # a wheel on a static box (the pallet): normal and box point from the wheel centre at the
    # step's midpoint (closest box point), smooth over faces and edges and independent of which
    # points newton reported, so the step map, the adjoint and finite differences agree
    # a wheel on a static mesh (terrain) likewise, from the closest mesh point (wheel_mesh_contact)
    # (ct.single: set by prepare_contacts for exactly these pairs)
    if ct.single[k] != 0:
        # sw: the static shape, cw / bw: the wheel's shape and body, sgn: +1 when the static shape is side 0
        sw = static_shape(s0, s1, model.shape_body)
        cw = s1
        bw = b1
        sgn = float(1.0)
        if sw == s1:
            cw = s0
            bw = b0
            sgn = -1.0
        C = midstep_wheel_centre(bw, x, q, x_prev, q_prev, model.body_com, model.shape_transform[cw])
        ok = int(0)
        nn = wp.vec3()
        pe = wp.vec3()
        if model.shape_type[sw] == _BOX:
            ok, nn, pe = wheel_box_contact(model.shape_transform[sw], model.shape_scale[sw], C)
        else:
            ok, nn, pe = wheel_mesh_contact(model.shape_mesh[sw], model.mesh_cn, model.mesh_sharp,
                                            model.shape_face_start[sw], model.shape_transform[sw],
                                            model.shape_scale[sw], C)
        if ok != 0:
            n = sgn * nn
            if sgn > 0.0:
                p0 = pe
            else:
                p1 = pe
    P0 = contact_point(b0, x0, q0, c0, p0, cyl0, model.shape_transform[s0], model.shape_scale[s0][0], ct.axial0[k], n)
    P1 = contact_point(b1, x1, q1, c1, p1, cyl1, model.shape_transform[s1], model.shape_scale[s1][0], ct.axial1[k], -n)
    gap = wp.dot(n, P1 - P0) - ct.thick[k]
    return n, P0, P1, x0, x1, gap


@wp.func
def shares_pair(w: int, ci: int, max_contacts: int, count: wp.array[int], shape0: wp.array[int],
                shape1: wp.array[int], normal: wp.array[wp.vec3]):
    """Whether contact ci of world w belongs to a redundant set: another contact of the same shape pair
    with (nearly) the same normal, so that their friction rows share the tangent plane (a box's corners
    on a face). Contacts are sorted by shape pair, so a neighbour tells; the normals of one pair are
    stored in the same frame. A wheel's contacts on a mesh have distinct normals (equal ones are merged
    in prepare_contacts) and do not count. The contact slots' arrays (Contacts' count, shape0, shape1, n) come
    one by one: a call is not inlined, and a whole group would be copied at every call."""
    k = w * max_contacts + ci
    same = int(0)
    if ci > 0:
        if shape0[k - 1] == shape0[k] and shape1[k - 1] == shape1[k]:
            if wp.dot(normal[k - 1], normal[k]) > 0.98:
                same = 1
    if ci + 1 < count[w]:
        if shape0[k + 1] == shape0[k] and shape1[k + 1] == shape1[k]:
            if wp.dot(normal[k + 1], normal[k]) > 0.98:
                same = 1
    return same
