"""A robot from its URDF plus a short wheel map, as a `sysid.robot.scenes.RobotDescription`
(`sysid.robot.load_robot` reads a URDF or a wheel map through this module).

The URDF (read by newton's importer, ``ModelBuilder.add_urdf``) gives the links, their masses and
inertias, the joints and the collision shapes; the wheel map (YAML) says what the URDF cannot:

.. code-block:: yaml

    urdf: husky.urdf              # relative to the wheel map's folder
    base_link: base_link          # the base frame (x forward, y left, z up); default the URDF's root
    wheels:                       # the driven wheel joints (revolute / continuous, axis +y)
      - {joint: front_left_wheel,  side: left,  log: [front_left_wheel, left]}
      - {joint: rear_left_wheel,   side: left,  log: [rear_left_wheel, left]}
      - {joint: front_right_wheel, side: right, log: [front_right_wheel, right]}
      - {joint: rear_right_wheel,  side: right, log: [rear_right_wheel, right]}
    casters: [caster_wheel_link]  # passive casters (links with a sphere or cylinder), optional
    servo: {kp: 40.0}             # wheel velocity-servo gain [N m s/rad] (default: a 50 ms servo)
    friction: {mu: 0.8, mu_lateral: 0.5, mu_ground: 0.8}

Per wheel: ``joint`` (required; the URDF joint), ``name`` (default the joint's), ``side`` (left |
right | center; default from the sign of its y in the base frame), ``log`` (the names in a log,
JointState names or a run's wheel columns, that drive it; the first a run has is used; default
the wheel's name and joint name), ``radius`` / ``width`` [m] (only for wheels without a cylinder
collision shape). Optional: ``name``, ``base_height`` [m] (default: wheel radius minus the wheels'
height in the base frame), ``pallet: {size}``.

What becomes what: every link fixed to the base link (through fixed joints, either direction) is
the chassis (masses, centres of mass and inertias combined; box / sphere / cylinder / capsule
collision shapes kept, meshes skipped and listed in ``extra["skipped_shapes"]``). A driven wheel
is its joint's child link: its cylinder collision shape (axis along the axle) becomes the engine's
wheel (rim contact, anisotropic friction), at the joint's origin. A caster's links (from the named
link up to the chassis, with everything below) fold into the chassis mass and the caster becomes a
frictionless sphere of its radius on the chassis, at its position in the URDF's zero
configuration. Any other moving joint is an error (the engine's robot is one chassis plus wheels).
Errors: `sysid.errors.RobotDescriptionError`, naming what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ingest.decode import SIDE_NAMES, side_of
from ingest.fileio import read_yaml
from ingest.run import PALLET_SIZE
from ingest.transforms import matrix_to_quat, quat_to_matrix
from sysid.errors import RobotDescriptionError, SceneError
from sysid.robot.description import NOMINALS, _vec3
from sysid.robot.scenes import RobotDescription

WHEEL_KEYS = {"joint", "name", "side", "log", "radius", "width"}
MAP_KEYS = {"urdf", "base_link", "wheels", "casters", "servo", "friction", "name", "base_height", "pallet", "source"}
SERVO_TAU = 0.05  # [s] default servo time constant (kp = I_eff / tau) when the wheel map gives no kp


def _f(v: float | np.floating[Any]) -> float:
    """A float32 figure of newton's builder as the decimal it was written as (shortest repr):
    0.36000001430511475 -> 0.36; computed values keep float32 precision, the model's."""
    v = float(np.float32(v))
    return 0.0 if v == 0 else float(str(np.float32(v)))


def wheel_map_for(urdf: str | Path) -> Path:
    """The wheel map of a URDF: ``<name>.wheels.yaml`` beside it, else the folder's ``robot.yaml``
    when that names this URDF."""
    p = Path(urdf)
    cand = p.with_name(p.stem + ".wheels.yaml")
    if cand.is_file():
        return cand
    ry = p.with_name("robot.yaml")
    if ry.is_file():
        try:
            d = read_yaml(ry, RobotDescriptionError, "robot description") or {}
        except RobotDescriptionError:  # not this URDF's wheel map: the error below says what to write
            d = {}
        if isinstance(d, dict) and "urdf" in d and (ry.parent / str(d["urdf"])).resolve() == p.resolve():
            return ry
    raise RobotDescriptionError(
        f"URDF {p}: no wheel map beside it ({cand.name}, or a robot.yaml whose `urdf:` names it); write one "
        "saying which joints are the driven wheels (docs/robots.md)")


def load_urdf_robot(urdf: str | Path, wheel_map: str | Path | dict[str, Any] | None = None) -> RobotDescription:
    """The robot of a URDF file and its wheel map (a path, a mapping, or found beside the URDF)."""
    p = Path(urdf)
    if not p.is_file():
        raise RobotDescriptionError(f"URDF {p} does not exist; give the path of the robot's .urdf")
    if wheel_map is None:
        wheel_map = wheel_map_for(p)
    if isinstance(wheel_map, dict):
        return robot_from_urdf(p, wheel_map, source=str(p))
    wm = load_wheel_map(wheel_map)
    return robot_from_urdf(p, wm, source=str(wheel_map))


def load_wheel_map(path: str | Path) -> dict[str, Any]:
    """The parsed wheel map file ``path`` (RobotDescriptionError when missing, invalid or not a mapping)."""
    p = Path(path)
    d = read_yaml(p, RobotDescriptionError, "wheel map", missing=f"wheel map {p} does not exist")
    if not isinstance(d, dict):
        raise RobotDescriptionError(f"wheel map {p} must be a mapping with urdf:, wheels: (see sysid/robot/urdf.py)")
    return d


def robot_from_wheel_map(d: dict[str, Any], base: Path, source: str = "") -> RobotDescription:
    """The robot of a wheel map mapping whose ``urdf:`` is relative to ``base``."""
    urdf = Path(str(d["urdf"])).expanduser()
    if not urdf.is_absolute():
        urdf = base / urdf
    if not urdf.is_file():
        raise RobotDescriptionError(f"wheel map {source or '(mapping)'}: its URDF {urdf} does not exist; fix `urdf:`")
    return robot_from_urdf(urdf, d, source=source or str(urdf))


def robot_from_urdf(urdf: str | Path, wheel_map: dict[str, Any], *, source: str = "") -> RobotDescription:
    """The `RobotDescription` of a URDF (file path or XML text) and a wheel map mapping (module doc)."""
    import newton

    where = source or "URDF"
    wm = dict(wheel_map)
    unknown = sorted(set(wm) - MAP_KEYS)
    if unknown:
        raise RobotDescriptionError(f"wheel map {where}: unknown key(s) {unknown}; known: {sorted(MAP_KEYS)}")
    entries = wm.get("wheels") or []
    if not isinstance(entries, list) or not entries:
        raise RobotDescriptionError(
            f"wheel map {where}: no driven wheels; list them under `wheels:` as "
            "{joint: <URDF joint>, side: left|right}")
    b = newton.ModelBuilder()
    try:
        b.add_urdf(str(urdf), floating=False, hide_visuals=True, enable_self_collisions=False)
    except Exception as exc:  # the importer raises bare Exceptions / ValueErrors on malformed files
        raise RobotDescriptionError(
            f"URDF {where}: newton's importer cannot read it ({type(exc).__name__}: {exc})") from None
    prefix = b.joint_label[0].rsplit("/", 1)[0] + "/" if "/" in b.joint_label[0] else ""

    def bare(label: str) -> str:
        return label[len(prefix):] if label.startswith(prefix) else label

    link_names = [bare(n) for n in b.body_label]
    joint_names = [bare(n) for n in b.joint_label]
    robot_name = str(wm.get("name") or (prefix.rstrip("/") or "robot"))
    model = b.finalize(device="cpu")
    state = model.state()
    # newton types a model's arrays as optional (a finalized model has them all)
    assert model.joint_q is not None and model.joint_qd is not None
    # newton annotates joint_q as wp.array[wp.float32] and eval_fk's argument as wp.array[float], one dtype
    newton.eval_fk(model, model.joint_q, model.joint_qd, state)  # type: ignore[arg-type]
    assert state.body_q is not None
    body_q = state.body_q.numpy().astype(np.float64)
    base_name = str(wm.get("base_link") or link_names[int(b.joint_child[0])])
    if base_name not in link_names:
        raise RobotDescriptionError(
            f"wheel map {where}: base_link {base_name!r} is not a link of the URDF; its links are "
                                    f"{link_names}")
    base = link_names.index(base_name)
    Rb, pb = quat_to_matrix(body_q[base, 3:7], normalize=False), body_q[base, :3]

    def in_base(body: int, p_local: Sequence[float] = (0.0, 0.0, 0.0),
                R_local: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Position and rotation in the base frame of a point / frame given in ``body``'s frame."""
        R = quat_to_matrix(body_q[body, 3:7], normalize=False)
        p = body_q[body, :3] + R @ np.asarray(p_local, float)
        Rl = R if R_local is None else R @ R_local
        return Rb.T @ (p - pb), Rb.T @ Rl

    jtype = [int(t) for t in b.joint_type]
    parent, child = list(b.joint_parent), list(b.joint_child)
    FIXED = int(newton.JointType.FIXED)
    REVOLUTE = int(newton.JointType.REVOLUTE)
    children: dict[int, list[int]] = {}
    for j, pa in enumerate(parent):
        children.setdefault(pa, []).append(j)

    def subtree(body: int) -> set[int]:
        out, todo = {body}, [body]
        while todo:
            for j in children.get(todo.pop(), []):
                out.add(child[j])
                todo.append(child[j])
        return out

    # -- driven wheels
    wheel_bodies, wheel_joint_ids = [], []
    names, positions, sides, logs, joints, sizes, masses, inertias = [], [], [], [], [], [], [], []
    for k, e in enumerate(entries):
        if isinstance(e, str):
            e = {"joint": e}
        if not isinstance(e, dict) or "joint" not in e:
            raise RobotDescriptionError(
                f"wheel map {where}: wheels[{k}] must be a mapping with joint: <URDF joint name>")
        bad = sorted(set(e) - WHEEL_KEYS)
        if bad:
            raise RobotDescriptionError(f"wheel map {where}: wheels[{k}] has unknown key(s) {bad}; known: "
                                        f"{sorted(WHEEL_KEYS)}")
        jn = str(e["joint"])
        if jn not in joint_names:
            movable = [n for n, t in zip(joint_names, jtype) if t == REVOLUTE]
            raise RobotDescriptionError(
                f"wheel map {where}: wheel joint {jn!r} is not in the URDF {urdf if source else ''}; its revolute/"
                f"continuous joints are {movable}. Fix wheels[{k}].joint")
        j = joint_names.index(jn)
        if jtype[j] != REVOLUTE:
            raise RobotDescriptionError(
                f"wheel map {where}: wheel joint {jn!r} is not revolute/continuous in the URDF; a "
                                        "driven wheel turns on a revolute or continuous joint")
        wb = child[j]
        dof = int(b.joint_qd_start[j]) if hasattr(b, "joint_qd_start") else None
        axis_local = np.asarray(b.joint_axis[dof] if dof is not None else b.joint_axis[j], float)
        pos, R = in_base(wb)
        axis = R @ axis_local  # the joint axis is expressed in the child frame at zero angle
        if abs(axis[1]) < 0.999 or axis[1] < 0:
            raise RobotDescriptionError(
                f"wheel map {where}: wheel joint {jn!r} turns about {np.round(axis, 3).tolist()} in the base frame; "
                "the "
                "engine's wheels turn about +y of the base (x forward, y left), so that a positive speed drives "
                "forward. Check base_link, or give the joint <axis xyz=\"0 1 0\"/>")
        radius, width = e.get("radius"), e.get("width")
        cyl = [s for s in range(len(b.shape_body)) if b.shape_body[s] == wb and int(b.shape_type[s]) ==
               int(newton.GeoType.CYLINDER) and int(b.shape_flags[s]) & int(newton.ShapeFlags.COLLIDE_SHAPES)]
        if cyl:
            s = cyl[0]
            xf = np.asarray(b.shape_transform[s], float)  # position, quaternion (x, y, z, w)
            cpos, cR = in_base(wb, tuple(xf[:3]), quat_to_matrix(np.asarray(xf[3:7], float), normalize=False))
            if abs(abs((cR @ np.array([0.0, 0.0, 1.0]))[1]) - 1.0) > 1e-3:
                raise RobotDescriptionError(
                    f"wheel map {where}: wheel {jn!r}'s cylinder lies across its axle; a URDF cylinder's axis is "
                    "its z: "
                    "rotate the collision by rpy=\"1.5708 0 0\" so it lies along the axle")
            if np.linalg.norm(cpos - pos) > 1e-3:
                raise RobotDescriptionError(
                    f"wheel map {where}: wheel {jn!r}'s cylinder is {np.linalg.norm(cpos - pos):.3f} m "
                                            "off its joint; centre it on the axle")
            radius = float(b.shape_scale[s][0]) if radius is None else float(radius)
            width = 2.0 * float(b.shape_scale[s][1]) if width is None else float(width)
        if radius is None or width is None:
            raise RobotDescriptionError(
                f"wheel map {where}: wheel {jn!r}'s link {link_names[wb]!r} has no cylinder collision shape; add one "
                "(<collision><geometry><cylinder radius=.. length=../>) or give radius: and width: in the wheel map")
        Iw = R @ np.asarray(b.body_inertia[wb], float).reshape(3, 3) @ R.T
        name = str(e.get("name", jn))
        side = str(e.get("side") or side_of(float(pos[1])))
        if side not in SIDE_NAMES:
            raise RobotDescriptionError(
                f"wheel map {where}: wheel {name!r} side {side!r} unknown; one of {list(SIDE_NAMES)}")
        lg = e.get("log")
        lg = [lg] if isinstance(lg, str) else list(lg or [])
        names.append(name)
        joints.append(jn)
        positions.append((_f(pos[0]), _f(pos[1]), _f(pos[2])))
        sides.append(side)
        logs.append(tuple(dict.fromkeys([*(str(v) for v in lg), name, jn])) if lg else tuple(dict.fromkeys((name, jn))))
        sizes.append((_f(radius), _f(width)))
        masses.append(_f(b.body_mass[wb]))
        inertias.append((_f(Iw[0, 0]), _f(Iw[2, 2]), _f(Iw[1, 1])))
        wheel_bodies.append(wb)
        wheel_joint_ids.append(j)
    for what, vals in (("radius and width", sizes), ("mass", masses), ("inertia", inertias)):
        ref = np.asarray(vals[0], float)
        if any(not np.allclose(np.asarray(v, float), ref, rtol=1e-5, atol=1e-9) for v in vals):
            raise RobotDescriptionError(f"wheel map {where}: the driven wheels differ in {what} "
                                        f"({dict(zip(names, vals))}); the toolkit takes one wheel size for all")
    if len(set(wheel_bodies)) != len(wheel_bodies):
        raise RobotDescriptionError(f"wheel map {where}: a wheel joint is listed twice ({joints})")

    # -- the chassis: the links joined to the base by fixed joints (either direction)
    chassis, todo = {base}, [base]
    while todo:
        i = todo.pop()
        for j, t in enumerate(jtype):
            if t != FIXED or parent[j] < 0:
                continue
            for a, other in ((parent[j], child[j]), (child[j], parent[j])):
                if a == i and other not in chassis:
                    chassis.add(other)
                    todo.append(other)
    # -- casters: the named link up to the chassis, with everything below
    caster_bodies: set[int] = set()
    casters = []
    joint_of_child = {c: j for j, c in enumerate(child)}
    for cn in wm.get("casters") or []:
        cn = str(cn)
        if cn in link_names:
            cb = link_names.index(cn)
        elif cn in joint_names:
            cb = child[joint_names.index(cn)]
        else:
            raise RobotDescriptionError(f"wheel map {where}: caster {cn!r} is neither a link nor a joint of the URDF; "
                                        f"its links are {link_names}")
        top = cb
        while True:
            up = joint_of_child.get(top)
            if up is None or parent[up] < 0:
                raise RobotDescriptionError(f"wheel map {where}: caster {cn!r} is not below the base link")
            if parent[up] in chassis:
                break
            top = parent[up]
        caster_bodies |= subtree(top)
        round_shapes = [s for s in range(len(b.shape_body)) if b.shape_body[s] == cb
                        and int(b.shape_type[s]) in (int(newton.GeoType.SPHERE), int(newton.GeoType.CYLINDER))
                        and int(b.shape_flags[s]) & int(newton.ShapeFlags.COLLIDE_SHAPES)]
        if not round_shapes:
            raise RobotDescriptionError(f"wheel map {where}: caster {cn!r} has no sphere or cylinder collision shape "
                                        "touching the ground; add one to its link")
        s = round_shapes[0]
        cpos, _ = in_base(cb, tuple(np.asarray(b.shape_transform[s], float)[:3]))
        casters.append({"name": cn, "position": [_f(v) for v in cpos], "radius": _f(b.shape_scale[s][0])})

    # -- chassis: everything fixed to the base, plus the casters
    for j, t in enumerate(jtype):
        if j == 0 or t == FIXED or j in wheel_joint_ids or child[j] in caster_bodies:
            continue
        if parent[j] in chassis:
            raise RobotDescriptionError(
                f"wheel map {where}: URDF joint {joint_names[j]!r} moves link {link_names[child[j]]!r}, which is "
                "neither a "
                "driven wheel nor a caster; list it under wheels: or casters:, or make the joint fixed")
    bodies = sorted(chassis | caster_bodies)
    M = sum(float(b.body_mass[i]) for i in bodies)
    if M <= 0:
        raise RobotDescriptionError(f"URDF {where}: the chassis links {[link_names[i] for i in bodies]} have no mass; "
                                    "give them <inertial> elements")
    coms, inert = [], np.zeros((3, 3))
    for i in bodies:
        c, R = in_base(i, tuple(float(v) for v in b.body_com[i]))
        coms.append(c)
    com = sum((float(b.body_mass[i]) * c for i, c in zip(bodies, coms)), np.zeros(3)) / M
    for i, c in zip(bodies, coms):
        _, R = in_base(i)
        m = float(b.body_mass[i])
        r = c - com
        Ii = R @ np.asarray(b.body_inertia[i], float).reshape(3, 3) @ R.T
        inert += Ii + m * (np.dot(r, r) * np.eye(3) - np.outer(r, r))
    shapes, skipped = [], []
    kinds = {int(newton.GeoType.BOX): "box", int(newton.GeoType.SPHERE): "sphere",
             int(newton.GeoType.CYLINDER): "cylinder", int(newton.GeoType.CAPSULE): "capsule"}
    for s in range(len(b.shape_body)):
        if b.shape_body[s] not in chassis or not int(b.shape_flags[s]) & int(newton.ShapeFlags.COLLIDE_SHAPES):
            continue
        kind = kinds.get(int(b.shape_type[s]))
        if kind is None:
            skipped.append(f"{link_names[b.shape_body[s]]}: {newton.GeoType(int(b.shape_type[s])).name}")
            continue
        xf = np.asarray(b.shape_transform[s], float)
        c, R = in_base(b.shape_body[s], tuple(xf[:3]), quat_to_matrix(np.asarray(xf[3:7], float), normalize=False))
        sc = [_f(v) for v in b.shape_scale[s]]
        sh: dict[str, Any] = {"type": kind, "center": [_f(v) for v in c], "quat": [_f(v) for v in matrix_to_quat(R)]}
        if kind == "box":
            sh["half"] = sc
        elif kind == "sphere":
            sh["radius"] = sc[0]
        else:
            sh["radius"], sh["half_height"] = sc[0], sc[1]
        shapes.append(sh)

    radius, width = sizes[0]
    wz = float(np.mean([p[2] for p in positions]))
    fr: dict[str, Any] = dict(wm.get("friction") or {})
    left = [p[1] for p, s in zip(positions, sides) if s == "left"]
    right = [p[1] for p, s in zip(positions, sides) if s == "right"]
    track = _f(np.mean(left) - np.mean(right)) if left and right else 0.0
    n = len(names)
    kp: float | None = (wm.get("servo") or {}).get("kp")
    if kp is None:  # a 50 ms servo on the wheel's share of the robot
        kp = (inertias[0][2] + (M + n * masses[0]) * radius * radius / n) / SERVO_TAU
    try:
        return RobotDescription(
            name=robot_name,
            base_height=float(wm.get("base_height", _f(radius - wz))),
            chassis_mass=_f(M),
            base_box={},
            fixed_parts=[],
            wheel_radius=radius,
            wheel_width=width,
            wheel_mass=masses[0],
            wheel_inertia=inertias[0],
            wheel_names=names,
            wheel_positions=positions,
            kp=float(kp),
            mu=float(fr.get("mu", NOMINALS["mu"])),
            mu_lateral=float(fr.get("mu_lateral", NOMINALS["mu_lateral"])),
            mu_ground=float(fr.get("mu_ground", fr.get("mu", NOMINALS["mu"]))),
            track_width=track,
            pallet_size=_vec3((wm.get("pallet") or {}).get("size", PALLET_SIZE)),
            extra={"urdf": str(urdf) if Path(str(urdf)).suffix else "(xml)", "base_link": base_name,
                   "skipped_shapes": skipped},
            wheel_sides=sides,
            wheel_joints=joints,
            wheel_logs=logs,
            chassis_com=(_f(com[0]), _f(com[1]), _f(com[2])),
            chassis_inertia=tuple((_f(row[0]), _f(row[1]), _f(row[2])) for row in inert),
            chassis_shapes=shapes,
            casters=casters,
            caster_mu=float(fr.get("mu_caster", 0.0)),
            source=source,
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, SceneError):
            raise
        raise RobotDescriptionError(f"wheel map {where}: malformed value ({e})") from None
