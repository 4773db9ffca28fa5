"""Robot and scene builders on newton's ModelBuilder: wheeled robots (the three-wheeled skid-steer
of `models/helhest/robot.yaml`, or any robot from a URDF plus a wheel map, `sysid.robot.urdf`), the
pallet box, flat ground, sum-of-sinusoids mesh terrain. Z up, SI units.

A robot is a `RobotDescription`: one chassis body (every link rigidly fixed to the base, passive
casters folded in as frictionless spheres) and N driven wheels, each a cylinder on a velocity-servo
revolute joint about the base's y axis, with a side (left / right / center) and the log names
(a run's wheel columns, `ingest.Run`) that drive it. `sysid.robot.load_robot` reads either form into
one. The scenes are what the engine (`sysid.engine`) simulates; they sit above it, beside the robot readers,
since they take the pallet and the side rule from `ingest`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import newton
import numpy as np
import warp as wp

from ingest.decode import SIDE_NAMES, side_of
from ingest.run import PALLET_SIZE
from sysid.errors import RobotDescriptionError, SceneError

# Speculative contact distance per shape [m]: a contact is reported within the sum of the two
# shapes' gaps, which must cover one step's motion (2 m/s * 0.1 s) for large-step stability.
WHEEL_GAP = 0.15
GROUND_GAP = 0.15
BODY_GAP = 0.02


@dataclass
class RobotDescription:
    """The robot in numbers (see models/helhest/robot.yaml for the meaning of each field)."""

    name: str
    base_height: float
    chassis_mass: float
    base_box: dict[str, Any]
    fixed_parts: list[dict[str, Any]]
    wheel_radius: float
    wheel_width: float
    wheel_mass: float
    wheel_inertia: tuple[float, float, float]
    wheel_names: list[str]
    wheel_positions: list[tuple[float, float, float]]
    kp: float
    mu: float
    mu_lateral: float
    mu_ground: float
    track_width: float
    pallet_size: tuple[float, float, float] = PALLET_SIZE
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # per wheel: side ("left" | "right" | "center"; default from the sign of y), the joint's name
    # in the URDF (default the wheel's name) and the log names that drive it (a run's wheel
    # columns; the first one a run has is used; default: the wheel's name, then its joint's; the
    # wheel's name is always among them, last when log names are given)
    wheel_sides: list[str] = field(default_factory=list)
    wheel_joints: list[str] = field(default_factory=list)
    wheel_logs: list[tuple[str, ...]] = field(default_factory=list)
    # the chassis given directly (a URDF's links): centre of mass [m] and inertia about it
    # [kg m^2] (3x3, at chassis_mass) in the base frame, and collision shapes (`chassis_shapes`:
    # dicts with type box | sphere | cylinder | capsule, center, quat (x, y, z, w), half sizes /
    # radius / half_height); None: from base_box and fixed_parts (robot.yaml)
    chassis_com: tuple[float, float, float] | None = None
    chassis_inertia: tuple[tuple[float, float, float], ...] | None = None
    chassis_shapes: list[dict[str, Any]] | None = None
    # passive casters: frictionless spheres on the chassis, {name, position [m], radius [m]}
    casters: list[dict[str, Any]] = field(default_factory=list)
    caster_mu: float = 0.0
    source: str = field(default="", compare=False)  # where it was read from

    def __post_init__(self) -> None:
        n = len(self.wheel_names)
        where = self.source or self.name
        if n == 0:
            raise RobotDescriptionError(
                f"robot {where}: no driven wheels; list the driven wheel joints under `wheels:` (robot.yaml "
                "wheels.joints, or the wheel map's wheels with joint / side / log)")
        if len(self.wheel_positions) != n:
            raise RobotDescriptionError(f"robot {where}: {n} wheel names but {len(self.wheel_positions)} positions")
        if not self.wheel_sides:
            self.wheel_sides = [side_of(float(p[1])) for p in self.wheel_positions]
        if not self.wheel_joints:
            self.wheel_joints = list(self.wheel_names)
        if not self.wheel_logs:
            self.wheel_logs = [tuple(dict.fromkeys((w, j))) for w, j in zip(self.wheel_names, self.wheel_joints)]
        # the wheel's own name last: a run ingested with this robot names its column so (ingest's WheelLayout)
        self.wheel_logs = [tuple(dict.fromkeys((*(str(v) for v in lg), str(w))))
                           for w, lg in zip(self.wheel_names, self.wheel_logs)]
        if not (len(self.wheel_sides) == len(self.wheel_joints) == len(self.wheel_logs) == n):
            raise RobotDescriptionError(f"robot {where}: wheel sides / joints / log names do not match the {n} wheels")
        bad = [s for s in self.wheel_sides if s not in SIDE_NAMES]
        if bad:
            raise RobotDescriptionError(
                f"robot {where}: wheel side(s) {bad} unknown; a side is one of {list(SIDE_NAMES)}")
        if len(set(self.wheel_names)) != n:
            raise RobotDescriptionError(f"robot {where}: wheel names {self.wheel_names} repeat; give each its own")
        for side in ("left", "right"):
            if side not in self.wheel_sides:
                raise RobotDescriptionError(
                    f"robot {where}: no driven wheel on the {side} "
                    f"(sides {dict(zip(self.wheel_names, self.wheel_sides))}); "
                    "a skid-steer or differential drive needs driven wheels on both sides: set `side:` in the wheel "
                    "map or check the wheel positions (y > 0 is left)")

    @property
    def total_mass(self) -> float:
        return self.chassis_mass + self.wheel_mass * len(self.wheel_names)

    def side_wheels(self, side: str) -> list[int]:
        """Indices of the driven wheels on ``side``."""
        return [i for i, s in enumerate(self.wheel_sides) if s == side]

    def log_columns(self, columns: Any, run: str = "run") -> list[str]:
        """The column of a run's wheel table (``columns``: its names) that drives each wheel: the
        first of the wheel's log names it has. RobotDescriptionError when a wheel has none."""
        have = [str(c) for c in columns if str(c) != "t"]
        out: list[str] = []
        missing: list[str] = []
        for name, logs in zip(self.wheel_names, self.wheel_logs):
            hit = next((lg for lg in logs if lg in have), None)
            (out if hit is not None else missing).append(hit if hit is not None else f"{name} (log names {list(logs)})")
        if missing:
            what = "match none of" if len(missing) == len(self.wheel_names) else "miss some of"
            raise RobotDescriptionError(
                f"run {run!r}: its wheel columns {have} {what} the wheels of robot {self.name}: no column for "
                f"{', '.join(missing)}. Name the log's wheel joints in the wheel map (wheels[].log), or map the "
                "bag's JointState names in the topic map (topics: wheel_cmd: joints:)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The robot.yaml mapping of this description (`robot_from_dict` reads it back to an equal one)."""
        ch: dict[str, Any] = {"mass": self.chassis_mass}
        if self.base_box:
            ch["base_box"] = self.base_box
            ch["fixed_parts"] = list(self.fixed_parts)
        if self.chassis_com is not None:
            assert self.chassis_inertia is not None  # an explicit chassis gives both (see the fields)
            ch["com"] = [float(v) for v in self.chassis_com]
            ch["inertia"] = [[float(v) for v in row] for row in self.chassis_inertia]
        if self.chassis_shapes is not None:
            ch["shapes"] = [dict(s) for s in self.chassis_shapes]
        joints = [{"name": n, "position": [float(v) for v in p], "side": s, "joint": j, "log": list(lg)}
                  for n, p, s, j, lg in zip(self.wheel_names, self.wheel_positions, self.wheel_sides,
                                            self.wheel_joints, self.wheel_logs)]
        out: dict[str, Any] = {
            "name": self.name,
            "base_height": self.base_height,
            "chassis": ch,
            "wheels": {"radius": self.wheel_radius, "width": self.wheel_width, "mass": self.wheel_mass,
                       "inertia": [float(v) for v in self.wheel_inertia], "joints": joints},
            "servo": {"mode": "velocity", "kp": self.kp},
            "friction": {"mu": self.mu, "mu_lateral": self.mu_lateral, "mu_ground": self.mu_ground},
            "skid_steer": {"track_width": self.track_width},
            "pallet": {"size": [float(v) for v in self.pallet_size]},
        }
        if self.casters:
            out["casters"] = [dict(c) for c in self.casters]
            out["friction"]["mu_caster"] = self.caster_mu
        if self.source:
            out["source"] = self.source
        return out


def chassis_inertia(desc: RobotDescription) -> tuple[np.ndarray, np.ndarray]:
    """Centre of mass [m] and inertia about it [kg m^2] of the chassis body (solid boxes:
    fixed parts at their masses, the base box carrying the rest of chassis_mass); a description
    with an explicit chassis (from a URDF) gives its own."""
    if desc.chassis_inertia is not None:
        return np.asarray(desc.chassis_com, float), np.asarray(desc.chassis_inertia, float)
    if not desc.base_box:
        raise SceneError(f"robot {desc.name}: the chassis needs either base_box (robot.yaml) or com and inertia")
    parts = [(p["center"], p["size"], float(p["mass"])) for p in desc.fixed_parts]
    rest = desc.chassis_mass - sum(m for _, _, m in parts)
    if rest <= 0:
        raise SceneError(f"chassis_mass {desc.chassis_mass} kg must exceed the fixed parts' total mass")
    parts.append((desc.base_box["center"], desc.base_box["size"], rest))
    M = sum(m for _, _, m in parts)
    com = np.asarray(sum(np.asarray(c, float) * m for c, _, m in parts) / M)  # asarray: no-op, typed as an array
    inertia = np.zeros((3, 3))
    for c, s, m in parts:
        sx, sy, sz = s
        Ib = m / 12.0 * np.diag([sy * sy + sz * sz, sx * sx + sz * sz, sx * sx + sy * sy])
        r = np.asarray(c, float) - com
        inertia += Ib + m * (np.dot(r, r) * np.eye(3) - np.outer(r, r))
    return com, inertia


@dataclass
class RobotHandles:
    """Indices of the robot's parts in the builder it was added to (one world)."""

    chassis: int
    wheels: list[int]
    wheel_joints: list[int]
    wheel_shapes: list[int]
    free_joint: int
    caster_shapes: list[int] = field(default_factory=list)


def add_robot(
    builder: newton.ModelBuilder,
    desc: RobotDescription,
    xform: wp.transform | None = None,
    *,
    kp: float | None = None,
) -> RobotHandles:
    """Add the skid-steer robot: chassis on a free joint, wheels on velocity-servo revolute joints.

    ``xform`` places the base frame (axle height); by default at (0, 0, base_height).
    """
    if xform is None:
        xform = wp.transform((0.0, 0.0, desc.base_height), wp.quat_identity())
    com, inertia = chassis_inertia(desc)
    body_cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=desc.mu_ground, gap=BODY_GAP)
    wheel_cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=desc.mu, gap=WHEEL_GAP)
    chassis = builder.add_link(xform=xform, com=wp.vec3(*com), inertia=wp.mat33(*inertia.flatten()),
                               mass=desc.chassis_mass, label=f"{desc.name}/chassis")
    if desc.chassis_shapes is not None:
        for shape in desc.chassis_shapes:
            _add_chassis_shape(builder, chassis, shape, body_cfg)
    else:
        bb = desc.base_box
        builder.add_shape_box(chassis, xform=wp.transform(tuple(bb["center"]), wp.quat_identity()),
                              hx=bb["size"][0] / 2, hy=bb["size"][1] / 2, hz=bb["size"][2] / 2, cfg=body_cfg)
        for part in desc.fixed_parts:
            if part["name"].startswith("holder"):
                s = part["size"]
                builder.add_shape_box(chassis, xform=wp.transform(tuple(part["center"]), wp.quat_identity()),
                                      hx=s[0] / 2, hy=s[1] / 2, hz=s[2] / 2, cfg=body_cfg)
    casters = []
    caster_cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=desc.caster_mu, gap=WHEEL_GAP)
    for c in desc.casters:
        casters.append(builder.add_shape_sphere(chassis, xform=wp.transform(tuple(float(v) for v in c["position"]),
                                                                            wp.quat_identity()),
                                                radius=float(c["radius"]), cfg=caster_cfg))
    free = builder.add_joint_free(chassis)
    gain = desc.kp if kp is None else kp
    Iw = desc.wheel_inertia
    # a cylinder's axis is its local z: rotate it onto the body's y (the axle)
    cyl_rot = wp.quat_from_axis_angle(wp.vec3(1.0, 0.0, 0.0), -0.5 * math.pi)
    wheels, joints, shapes = [], [], []
    base_p = wp.transform_get_translation(xform)
    base_q = wp.transform_get_rotation(xform)
    for name, pos in zip(desc.wheel_names, desc.wheel_positions):
        wpos = base_p + wp.quat_rotate(base_q, wp.vec3(*pos))  # type: ignore[operator]  # warp's stubs lack vec +
        wb = builder.add_link(xform=wp.transform(wpos, base_q), mass=desc.wheel_mass,
                              inertia=wp.mat33(Iw[0], 0, 0, 0, Iw[2], 0, 0, 0, Iw[1]),
                              label=f"{desc.name}/wheel_{name}")
        sid = builder.add_shape_cylinder(wb, xform=wp.transform((0.0, 0.0, 0.0), cyl_rot),
                                         radius=desc.wheel_radius, half_height=desc.wheel_width / 2, cfg=wheel_cfg)
        j = builder.add_joint_revolute(chassis, wb, parent_xform=wp.transform(pos, wp.quat_identity()),
                                       # warp's stubs name two transformf classes (warp., warp._src.types.)
                                       child_xform=wp.transform_identity(),  # type: ignore[arg-type]
                                       axis=(0.0, 1.0, 0.0),
                                       target_ke=0.0, target_kd=gain,
                                       actuator_mode=newton.JointTargetMode.VELOCITY,
                                       label=f"{desc.name}/joint_{name}")
        wheels.append(wb)
        joints.append(j)
        shapes.append(sid)
    # the wheels never touch each other or the chassis: skip those speculative pairs
    chassis_shapes = [s for s in range(builder.shape_count) if builder.shape_body[s] == chassis]
    for i, a in enumerate(shapes):
        for b in shapes[i + 1 :] + chassis_shapes:
            builder.add_shape_collision_filter_pair(a, b)
    builder.add_articulation([free, *joints])
    return RobotHandles(chassis=chassis, wheels=wheels, wheel_joints=joints, wheel_shapes=shapes, free_joint=free,
                        caster_shapes=casters)


def _add_chassis_shape(builder: newton.ModelBuilder, body: int, shape: dict[str, Any],
                       cfg: newton.ModelBuilder.ShapeConfig) -> int:
    """One explicit chassis collision shape (``RobotDescription.chassis_shapes``)."""
    quat = wp.quat(*(float(v) for v in shape.get("quat", (0, 0, 0, 1))))
    xf = wp.transform(tuple(float(v) for v in shape["center"]), quat)
    kind = shape["type"]
    if kind == "box":
        hx, hy, hz = (float(v) for v in shape["half"])
        return builder.add_shape_box(body, xform=xf, hx=hx, hy=hy, hz=hz, cfg=cfg)
    if kind == "sphere":
        return builder.add_shape_sphere(body, xform=xf, radius=float(shape["radius"]), cfg=cfg)
    if kind == "cylinder":
        return builder.add_shape_cylinder(body, xform=xf, radius=float(shape["radius"]),
                                          half_height=float(shape["half_height"]), cfg=cfg)
    if kind == "capsule":
        return builder.add_shape_capsule(body, xform=xf, radius=float(shape["radius"]),
                                         half_height=float(shape["half_height"]), cfg=cfg)
    raise SceneError(f"chassis shape type {kind!r} unknown; use box, sphere, cylinder or capsule")


def configure_friction(solver: Any, scene: Scene) -> None:
    """Wheel friction (anisotropic: longitudinal mu, lateral mu_lateral along the axle) on every
    world's wheels and frictionless (``caster_mu``) contact on its casters."""
    desc = scene.robot
    solver.set_anisotropic_friction([s for h in scene.handles for s in h.wheel_shapes], desc.mu, desc.mu_lateral)
    casters = [s for h in scene.handles for s in h.caster_shapes]
    if casters:
        # anisotropic under the "wheel" rule: the caster's own coefficient decides whatever it touches
        solver.set_anisotropic_friction(casters, desc.caster_mu, desc.caster_mu)
        solver.set_friction_combine("wheel", casters)


def add_pallet(builder: newton.ModelBuilder, x: float, y: float, yaw: float,
               size: tuple[float, float, float] = PALLET_SIZE, mu: float = 0.8) -> int:
    """A static box lying on the ground, centre (x, y) [m], yaw [rad], size (L, W, H) [m]."""
    L, W, H = size
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=GROUND_GAP)
    q = wp.quat_from_axis_angle(wp.vec3(0.0, 0.0, 1.0), float(yaw))
    return builder.add_shape_box(-1, xform=wp.transform((x, y, H / 2), q), hx=L / 2, hy=W / 2, hz=H / 2, cfg=cfg)


def add_ground(builder: newton.ModelBuilder, mu: float = 0.8) -> int:
    return builder.add_ground_plane(cfg=newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=GROUND_GAP))


def sinusoid_terrain(size: float = 24.0, resolution: int = 80, amplitude: float = 0.15, waves: int = 4,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sum-of-sinusoids heightmap over [-size/2, size/2]^2 as a triangle mesh.

    Returns vertices (N, 3) [m] and triangle indices (M*3,). ``resolution`` cells per side give
    2 * resolution^2 faces (80 -> 12,800, about the paper's 12,500). Height is zero at the origin
    so a robot can start there.
    """
    rng = np.random.default_rng(seed)
    xs = np.linspace(-size / 2, size / 2, resolution + 1)
    X, Y = np.meshgrid(xs, xs, indexing="ij")
    Z = np.zeros_like(X)
    for _ in range(waves):
        kx, ky = rng.uniform(0.2, 1.0, 2) * rng.choice([-1, 1], 2)
        ph = rng.uniform(0, 2 * np.pi)
        a = amplitude * rng.uniform(0.3, 1.0) / waves
        Z += a * (np.sin(kx * X + ky * Y + ph) - np.sin(ph))
    verts = np.stack([X, Y, Z], axis=-1).reshape(-1, 3).astype(np.float32)
    return verts, grid_triangles(resolution)


def grid_triangles(resolution: int) -> np.ndarray:
    """Triangle indices (2 resolution^2 * 3,) int32 of a grid of ``resolution`` cells per side whose
    (resolution + 1)^2 vertices are numbered row by row: two triangles a cell, counter-clockwise
    seen from above when the first index runs along x."""
    n = resolution + 1
    idx = []
    for i in range(resolution):
        for j in range(resolution):
            a, b, c, d = i * n + j, (i + 1) * n + j, (i + 1) * n + j + 1, i * n + j + 1
            idx += [a, b, c, a, c, d]
    return np.asarray(idx, dtype=np.int32)


def add_terrain(builder: newton.ModelBuilder, vertices: np.ndarray, indices: np.ndarray, mu: float = 0.8) -> int:
    mesh = newton.Mesh(vertices, indices)
    cfg = newton.ModelBuilder.ShapeConfig(density=0.0, mu=mu, gap=GROUND_GAP)
    return builder.add_shape_mesh(-1, mesh=mesh, cfg=cfg)


def terrain_height(vertices: np.ndarray, resolution: int, x: float, y: float) -> float:
    """Bilinear height of a `sinusoid_terrain` grid at (x, y) [m]."""
    n = resolution + 1
    Z = vertices[:, 2].reshape(n, n)
    x0, x1 = vertices[0, 0], vertices[-1, 0]
    fx = (x - x0) / (x1 - x0) * resolution
    fy = (y - x0) / (x1 - x0) * resolution
    i, j = int(np.clip(fx, 0, resolution - 1)), int(np.clip(fy, 0, resolution - 1))
    tx, ty = fx - i, fy - j
    return float((1 - tx) * (1 - ty) * Z[i, j] + tx * (1 - ty) * Z[i + 1, j] + tx * ty * Z[i + 1, j + 1]
                 + (1 - tx) * ty * Z[i, j + 1])


@dataclass
class WorldSpec:
    """What one world holds: the robot's start pose and the obstacles around it."""

    start: tuple[float, float, float] = (0.0, 0.0, 0.0)  # x [m], y [m], yaw [rad] of the base
    pallet: tuple[float, float, float] | None = None  # x [m], y [m], yaw [rad]
    start_z: float | None = None  # base height [m]; default the description's base_height
    # this world's own ground mesh (vertices (N, 3) [m], triangle indices (3M,)), e.g. a
    # `sinusoid_terrain` per world; None: the scene's shared ground
    terrain: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class Scene:
    model: newton.Model
    robot: RobotDescription
    handles: list[RobotHandles]  # per world, global indices
    worlds: list[WorldSpec]


def build_robot_scene(
    worlds: list[WorldSpec] | int,
    desc: RobotDescription,
    *,
    terrain: tuple[np.ndarray, np.ndarray] | None = None,
    device: str | None = None,
    requires_grad: bool = False,
    ground: bool | None = None,
    ground_per_world: bool = False,
) -> Scene:
    """Build one model holding a robot per world (worlds never collide with each other); each
    world may have its own pallet and its own terrain mesh (`WorldSpec.terrain`); the ground
    (plane or ``terrain`` mesh) is shared. Worlds that all bring their own terrain get no shared
    ground plane unless ``ground`` is True (e.g. a world's mesh is an obstacle on flat ground).
    ``desc``: the robot (`sysid.robot.load_robot` reads one; the engine reads no files).
    ``ground_per_world``: every world gets a ground plane of its own instead of one shared plane (so that
    its friction can differ per world, `SolverOstrich.set_friction_combine`)."""
    specs = [WorldSpec() for _ in range(worlds)] if isinstance(worlds, int) else list(worlds)
    if not specs:
        raise SceneError("at least one world is needed")
    scene = newton.ModelBuilder()
    want_ground = terrain is None and (ground or (ground is None and not all(s.terrain is not None for s in specs)))
    if terrain is None:
        if want_ground and not ground_per_world:
            add_ground(scene, desc.mu_ground)
    else:
        add_terrain(scene, *terrain, mu=desc.mu_ground)
    handles = []
    for spec in specs:
        b = newton.ModelBuilder()
        x, y, yaw = spec.start
        z = desc.base_height if spec.start_z is None else spec.start_z
        if want_ground and ground_per_world:
            add_ground(b, desc.mu_ground)
        h = add_robot(b, desc, wp.transform((x, y, z), wp.quat_from_axis_angle(wp.vec3(0.0, 0.0, 1.0), float(yaw))))
        if spec.pallet is not None:
            add_pallet(b, *spec.pallet, size=desc.pallet_size, mu=desc.mu_ground)
        if spec.terrain is not None:
            add_terrain(b, *spec.terrain, mu=desc.mu_ground)
        nb0, nj0, ns0 = scene.body_count, scene.joint_count, scene.shape_count
        scene.add_world(b)
        handles.append(RobotHandles(
            chassis=h.chassis + nb0, wheels=[w + nb0 for w in h.wheels],
            wheel_joints=[j + nj0 for j in h.wheel_joints], wheel_shapes=[s + ns0 for s in h.wheel_shapes],
            free_joint=h.free_joint + nj0, caster_shapes=[s + ns0 for s in h.caster_shapes],
        ))
    model = scene.finalize(device=device, requires_grad=requires_grad)
    return Scene(model=model, robot=desc, handles=handles, worlds=specs)


def add_urdf_robot(builder: newton.ModelBuilder, path: str | Path, xform: wp.transform | None = None,
                   **kwargs: Any) -> None:
    """Load a user's robot from URDF through newton's importer (floating base by default)."""
    p = Path(path)
    if not p.is_file():
        raise SceneError(f"URDF file {p} does not exist")
    kwargs.setdefault("floating", True)
    builder.add_urdf(str(p), xform=xform, **kwargs)
