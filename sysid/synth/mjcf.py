"""MuJoCo model of the robot of `models/helhest/robot.yaml`, on flat ground, optionally with a pallet.

The MJCF is generated from the robot description (never hand-written) so that MuJoCo and our own
engine simulate the same robot. Frames: world z up, ground plane at z = 0; the chassis body frame is
the robot's base frame (x forward, y left, wheel-axle height). SI units throughout.

Collision filtering: robot geoms have ``contype=2, conaffinity=1`` and world geoms (ground, pallet)
``contype=1, conaffinity=2``, so the robot collides with the world but never with itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

import numpy as np

from ingest.run import PalletPose
from sysid.errors import RobotDescriptionError, optional_import
from sysid.robot.description import DEFAULT_ROBOT, robot_mapping
from sysid.synth.errors import SynthError

_P = ParamSpec("_P")

WHEEL_NAMES = ("left", "right", "rear")


def load_robot(path: str | Path | None = None) -> dict[str, Any]:
    """Read a robot description (default: `models/helhest/robot.yaml`) through the one reader
    (`sysid.robot.robot_mapping`) and check what the generator uses: its sections and the
    Helhest's three wheels."""
    p = Path(path) if path is not None else DEFAULT_ROBOT
    if not p.is_file():
        raise SynthError(f"robot description {p} not found; pass the path of a robot.yaml (see models/helhest)")
    try:
        robot = robot_mapping(p)
    except RobotDescriptionError as exc:
        raise SynthError(str(exc)) from None
    for key in ("base_height", "chassis", "wheels", "servo"):
        if key not in robot:
            raise SynthError(f"robot description {p} lacks the {key!r} section; compare with models/helhest")
    names = [j["name"] for j in robot["wheels"]["joints"]]
    if sorted(names) != sorted(WHEEL_NAMES):
        raise SynthError(f"robot description {p}: wheel joints are {names}; the generator expects {WHEEL_NAMES}")
    return robot


@dataclass(frozen=True)
class ContactParams:
    """Contact and actuation parameters of one simulated run (the 'true' values of the dataset).

    mu_wheel: sliding friction of the left/right wheels on ground and pallet [-].
    mu_rear: sliding friction of the rear wheel [-] (separate: it scrubs sideways in every turn).
    torsional: torsional (spin) friction of the wheels [m] (MuJoCo's second friction coefficient,
        active with condim >= 4).
    mu_ground: friction of the ground [-]; MuJoCo uses the max of the two geoms' values, so keep it
        at or below the wheel values to let the wheel values decide on flat ground.
    mu_pallet: friction of the pallet [-]; above the wheel values it decides wheel-pallet contacts
        (a tyre tread catching a wooden edge: what lets the robot climb the 14.4 cm step at a crawl).
    kv: velocity-servo gain of every wheel [N m s/rad].
    condim: contact dimensionality of the wheels (3: sliding only; 4: + torsional; 6: + rolling).
    solref: MuJoCo contact (time constant [s], damping ratio [-]).
    """

    mu_wheel: float = 0.8
    mu_rear: float = 0.8
    torsional: float = 0.02
    mu_ground: float = 0.3
    mu_pallet: float = 1.6
    kv: float = 250.0
    condim: int = 4
    solref: tuple[float, float] = (0.01, 1.0)
    solimp: tuple[float, float, float] = (0.9, 0.95, 0.001)
    chassis_mass: float | None = None  # [kg]; None: the robot description's value

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "solref": list(self.solref), "solimp": list(self.solimp)}


Pallet = PalletPose  # the one pallet value type (ingest.run): centre (x, y) [m], yaw [rad], size (L, W, H) [m]


@dataclass(frozen=True)
class LidarMount:
    """Lidar position in the base frame [m] (sensor axes parallel to the base axes)."""

    position: tuple[float, float, float] = (-0.05, 0.0, 0.45)


@dataclass(frozen=True)
class ImuMount:
    position: tuple[float, float, float] = (-0.1, 0.0, 0.1)


@dataclass
class MjcfOptions:
    timestep: float = 1e-3  # [s]
    integrator: str = "implicitfast"
    ground_size: float = 60.0  # [m] half-extent of the (visual) ground plane
    # Wheel collision shape: "ellipsoid" (smooth: one contact, rolls without a bump), "tyre" (convex
    # mesh: flat tread, shoulders rounded with ``shoulder_radius``; its 48 facets make the wheels bounce
    # at speed, out of contact a quarter of the time at 2 m/s, which cuts the robot's turning to 0.22 of
    # a rigid wheel's) or "cylinder" (MuJoCo primitive; its sharp rim catches on box edges and stalls
    # slow climbs). Radius and width are the description's in every case.
    wheel_shape: str = "ellipsoid"
    shoulder_radius: float = 0.03  # [m]
    lidar: LidarMount = field(default_factory=LidarMount)
    imu: ImuMount = field(default_factory=ImuMount)


def _f(v: Any) -> str:
    """Format numbers for MJCF with full precision (repr) so the model is exactly reproducible."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return " ".join(_f(x) for x in v)
    return repr(float(v))


def tyre_vertices(radius: float, width: float, shoulder: float, n_around: int = 48, n_arc: int = 4) -> np.ndarray:
    """Vertices (n, 3) of a convex tyre about the local y axis: flat tread, rounded shoulders [m]."""
    if not 0 < shoulder < min(radius, width / 2):
        raise SynthError(f"tyre shoulder radius {shoulder} m must be in (0, min(radius, width/2))")
    prof = []  # (radial distance, y) along the tyre's cross-section, one side then mirrored
    for i in range(n_arc + 1):
        a = (math.pi / 2) * i / n_arc
        prof.append((radius - shoulder + shoulder * math.cos(a), width / 2 - shoulder + shoulder * math.sin(a)))
    prof += [(rho, -y) for rho, y in prof]
    prof.append((0.0, width / 2))
    prof.append((0.0, -width / 2))
    verts = []
    for k in range(n_around):
        phi = 2 * math.pi * k / n_around
        for rho, y in prof:
            verts.append((rho * math.cos(phi), y, rho * math.sin(phi)))
    return np.unique(np.round(np.array(verts), 12), axis=0)


def _check_params(params: ContactParams) -> None:
    for name in ("mu_wheel", "mu_rear", "mu_ground", "mu_pallet", "kv"):
        val = getattr(params, name)
        if not (math.isfinite(val) and val > 0):
            raise SynthError(f"contact parameter {name}={val!r} must be a positive finite number")
    if not (math.isfinite(params.torsional) and params.torsional >= 0):
        raise SynthError(f"torsional friction {params.torsional!r} must be >= 0 [m]")
    if params.condim not in (1, 3, 4, 6):
        raise SynthError(f"condim={params.condim} is not one of MuJoCo's 1, 3, 4, 6")
    if params.chassis_mass is not None and not params.chassis_mass > 0:
        raise SynthError(f"chassis_mass={params.chassis_mass!r} must be > 0 [kg]")


def robot_mjcf(
    robot: dict[str, Any] | str | Path | None = None,
    *,
    params: ContactParams | None = None,
    pallet: Pallet | None = None,
    start: tuple[float, float, float] = (0.0, 0.0, 0.0),
    options: MjcfOptions | None = None,
    integral_actuators: bool = False,
) -> str:
    """MJCF text of the robot on a ground plane, with an optional pallet.

    robot: the parsed robot description, a path to one, or None for `models/helhest/robot.yaml`.
    params: contact/servo parameters (defaults: `ContactParams()`).
    pallet: the pallet box, or None for flat ground only.
    start: initial base pose on the ground (x [m], y [m], yaw [rad]); the base starts at the
        description's ``base_height`` above the ground.
    Wheel actuators are MuJoCo ``velocity`` actuators named ``left``, ``right``, ``rear`` (ctrl is the
    wheel-velocity setpoint [rad/s], torque = kv (ctrl - qdot), unlimited). Sites: ``lidar``, ``imu``.
    integral_actuators: also add torque motors ``left_i``, ``right_i``, ``rear_i`` (ctrl = torque
        [N m]) after the servos, through which `generate` applies the servos' integral action.
    """
    if not isinstance(robot, dict):
        robot = load_robot(robot)
    params = params or ContactParams()
    options = options or MjcfOptions()
    _check_params(params)
    if not (options.timestep > 0 and math.isfinite(options.timestep)):
        raise SynthError(f"timestep {options.timestep!r} must be a positive number of seconds")

    ch = robot["chassis"]
    parts = list(ch.get("fixed_parts", []))
    total = float(params.chassis_mass if params.chassis_mass is not None else ch["mass"])
    base_mass = total - sum(float(p["mass"]) for p in parts)
    if base_mass <= 0:
        raise SynthError(
            f"chassis mass {total} kg is not more than its fixed parts ({total - base_mass} kg); "
            "raise chassis.mass / chassis_mass"
        )
    wh = robot["wheels"]
    r, width, wmass = float(wh["radius"]), float(wh["width"]), float(wh["mass"])
    it, _, ispin = (float(x) for x in wh["inertia"])
    h0 = float(robot["base_height"])
    x0, y0, yaw0 = (float(v) for v in start)
    cq, sq = math.cos(yaw0 / 2), math.sin(yaw0 / 2)

    robot_geom = 'contype="2" conaffinity="1"'
    world_geom = 'contype="1" conaffinity="2"'
    lines = [
        '<mujoco model="helhest_synth">',
        f'  <option timestep="{_f(options.timestep)}" integrator="{options.integrator}" cone="elliptic">',
        '    <flag multiccd="enable"/>',
        "  </option>",
        '  <compiler angle="radian" autolimits="true"/>',
        "  <default>",
        f'    <geom solref="{_f(params.solref)}" solimp="{_f(params.solimp)}"/>',
        "  </default>",
    ]
    shape = options.wheel_shape
    if shape not in ("tyre", "cylinder", "ellipsoid"):
        raise SynthError(f"wheel_shape={shape!r}; choose 'tyre', 'cylinder' or 'ellipsoid'")
    if shape == "tyre":
        verts = tyre_vertices(r, width, options.shoulder_radius)
        lines += ["  <asset>", f'    <mesh name="tyre" vertex="{_f(verts.reshape(-1))}"/>', "  </asset>"]
    lines += [
        "  <worldbody>",
        f'    <geom name="ground" type="plane" size="{_f([options.ground_size, options.ground_size, 1.0])}" '
        f'friction="{_f([params.mu_ground, params.torsional, 0.0])}" condim="{params.condim}" {world_geom}/>',
    ]
    if pallet is not None:
        L, W, H = (float(v) for v in pallet.size)
        if min(L, W, H) <= 0:
            raise SynthError(f"pallet size {pallet.size} must be positive [m]")
        pq = (math.cos(pallet.yaw / 2), 0.0, 0.0, math.sin(pallet.yaw / 2))
        lines.append(
            f'    <geom name="pallet" type="box" pos="{_f([pallet.x, pallet.y, H / 2])}" quat="{_f(pq)}" '
            f'size="{_f([L / 2, W / 2, H / 2])}" friction="{_f([params.mu_pallet, params.torsional, 0.0])}" '
            f'condim="{params.condim}" {world_geom}/>'
        )
    lines += [
        f'    <body name="chassis" pos="{_f([x0, y0, h0])}" quat="{_f([cq, 0, 0, sq])}">',
        '      <freejoint name="root"/>',
        f'      <geom name="base_box" type="box" pos="{_f(ch["base_box"]["center"])}" '
        f'size="{_f(np.asarray(ch["base_box"]["size"], float) / 2)}" mass="{_f(base_mass)}" {robot_geom}/>',
    ]
    for p in parts:
        lines.append(
            f'      <geom name="{p["name"]}" type="box" pos="{_f(p["center"])}" '
            f'size="{_f(np.asarray(p["size"], float) / 2)}" mass="{_f(p["mass"])}" {robot_geom}/>'
        )
    lines.append(f'      <site name="lidar" pos="{_f(options.lidar.position)}" size="0.03"/>')
    lines.append(f'      <site name="imu" pos="{_f(options.imu.position)}" size="0.02"/>')
    for j in wh["joints"]:
        name = j["name"]
        mu = params.mu_rear if name == "rear" else params.mu_wheel
        if shape == "tyre":
            geom = 'type="mesh" mesh="tyre"'
        elif shape == "cylinder":
            # Cylinder length axis is local z; +90 deg about x puts it along y (the spin axis).
            geom = f'type="cylinder" size="{_f([r, width / 2])}" euler="{_f([math.pi / 2, 0, 0])}"'
        else:
            geom = f'type="ellipsoid" size="{_f([r, width / 2, r])}"'
        lines += [
            f'      <body name="wheel_{name}" pos="{_f(j["position"])}">',
            f'        <joint name="{name}" type="hinge" axis="0 1 0" damping="0" armature="0"/>',
            f'        <inertial pos="0 0 0" mass="{_f(wmass)}" diaginertia="{_f([it, ispin, it])}"/>',
            f'        <geom name="wheel_{name}" {geom} friction="{_f([mu, params.torsional, 0.0])}" '
            f'condim="{params.condim}" mass="0" {robot_geom}/>',
            "      </body>",
        ]
    lines += ["    </body>", "  </worldbody>", "  <actuator>"]
    for name in WHEEL_NAMES:
        lines.append(f'    <velocity name="{name}" joint="{name}" kv="{_f(params.kv)}"/>')
    if integral_actuators:
        for name in WHEEL_NAMES:
            lines.append(f'    <motor name="{name}_i" joint="{name}"/>')
    lines += [
        "  </actuator>",
        "  <sensor>",
        '    <accelerometer name="imu_acc" site="imu"/>',
        '    <gyro name="imu_gyro" site="imu"/>',
        '    <framequat name="imu_quat" objtype="site" objname="imu"/>',
        "  </sensor>",
        "</mujoco>",
    ]
    return "\n".join(lines) + "\n"


def _compiled(mjcf: Callable[_P, str]) -> Callable[_P, Any]:
    """A function taking ``mjcf``'s arguments and returning its text compiled into a `mujoco.MjModel`."""

    def build(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        mujoco = optional_import("mujoco", "synth", "the MuJoCo model of sysid synth / simulator: mujoco")
        xml = mjcf(*args, **kwargs)
        try:
            return mujoco.MjModel.from_xml_string(xml)
        except ValueError as exc:  # MuJoCo reports compile errors as ValueError
            raise SynthError(f"MuJoCo could not compile the generated model: {exc}") from exc

    return build


build_mujoco_model = _compiled(robot_mjcf)
build_mujoco_model.__doc__ = "Compile `robot_mjcf(...)` into a `mujoco.MjModel` (same arguments)."
