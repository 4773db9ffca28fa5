"""The ``"ostrich"`` replay's model (`sysid.simulators.ostrich`): its parameters, their checks
(`engine_parameters`), the engine arrays they set in a robot scene (`engine_for_scene`), and the PI wheel
servos' position targets from the commands (`pi_position_targets` and its derivatives, which the replay and the
planner share), and the per-entity arrays of a model of many worlds. Parameters (SI units):

    kp            wheel velocity-servo gain [N m s/rad]   (joint_kd of the wheel joints)
    mu            longitudinal wheel friction coefficient  (wheel shapes)
    mu_lateral    lateral wheel friction coefficient       (wheel shapes, along the axle)
    cmd_scale     multiplies the logged wheel commands     (motor tracking)
    chassis_mass  chassis body mass [kg] (inertia scales with it)
    slip_speed    wheel friction slip speed [m/s]          (wheel shapes; 0 = exact Coulomb, the
                  default; > 0 regularises it: viscous below v_s, like a tyre's slip region)
    slip_ratio    slip speed per m/s of rolling [1]        (wheel shapes; default 0: each wheel's slip
                  speed is slip_speed + slip_ratio * r |w| at its logged speed w of the step, so a
                  rolling wheel's friction stays in its linear region over a slip that grows with its
                  speed, like a tyre's slip ratio and slip angle, while a wheel dragged sideways
                  without rolling, as the rear wheel in a pivot turn, slides at once)
    slip_speed_lat  lateral slip speed [m/s]               (wheel shapes; default 0: one slip speed,
                  slip_speed, for the cone-scaled slip; > 0 selects the combined-slip law, in which the
                  longitudinal slip speed is slip_speed + slip_ratio r |w| and the lateral one
                  slip_speed_lat + slip_ratio_lat r |w|: each direction its own stiffness mu lam_n / v_s,
                  saturation on the friction ellipse; docs/traction.md)
    slip_ratio_lat  lateral slip speed per m/s of rolling [1] (combined-slip law only; default 0)
    cmd_trim      left/right command trim                  (left-side wheels x (1 + trim), right-side
                  x (1 - trim), centre wheels (the Helhest's rear) unchanged; default 0: a wheel-radius
                  or motor-calibration asymmetry that
                  makes the robot turn more one way than the other, as in UMBmark's E_d)
    cmd_delay     command delay [s]                        (the wheels follow the logged command
                  d seconds late: actuation latency or a clock offset between the wheel and the
                  odometry logs; default 0, negative values advance it)
    torque_limit  wheel servo torque limit [N m]           (joint_effort_limit of the wheel joints;
                  default 0: none; > 0: each servo's torque saturates smoothly at it,
                  tau = tau_max n / sqrt(1 + n^2) with n the unlimited servo torque over tau_max:
                  a motor's current limit, which caps how hard the wheels accelerate and brake)
    ki            wheel servo integral gain [N m/rad]      (joint_ke of the wheel joints; default 0: a
                  velocity servo; > 0: a PI servo, tau = kp (s u - w) + ki (integral of s u - w), the
                  integral from the replay's start: the wheels' position targets are the integrated
                  commands, so a wheel held back by an obstacle pushes harder the longer it is held)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import newton
import numpy as np

from sysid.engine import Simulation, SolverOptions, SolverOstrich
from sysid.robot.scenes import RobotDescription, configure_friction

PARAMETERS = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass", "slip_speed", "slip_ratio", "slip_speed_lat",
              "slip_ratio_lat", "cmd_trim", "cmd_delay", "torque_limit", "mu_ground", "mu_pallet", "ki")
# the surfaces' own friction coefficients: they matter under a friction_combine rule other than "wheel"
SURFACE_PARAMETERS = ("mu_ground", "mu_pallet")
FRICTION_COMBINE = ("wheel", "max", "product", "geometric_mean")
TARGET_PARAMETERS = ("cmd_trim", "cmd_delay")  # applied to the wheel targets, not to the model
STEP_PARAMETERS = ("slip_ratio", "slip_ratio_lat")  # set the wheels' slip speeds anew every step
SLIP_ARRAYS = {"slip_ratio": ("shape_slip", "slip_speed"), "slip_ratio_lat": ("shape_slip_lat", "slip_speed_lat")}
# d(command)/d(trim) per unit command, by the wheel's side ("rear": the Helhest's centre wheel)
TRIM_SIGN = {"left": 1.0, "right": -1.0, "center": 0.0, "rear": 0.0}


def pi_position_targets(u: np.ndarray, dt: float, scale: float) -> np.ndarray:
    """(steps, n) position targets [rad] of PI wheel servos (``ki``) from their velocity targets ``u``
    (steps, n) [rad/s] at command scale ``scale`` (which the engine multiplies them by): the angle a
    wheel turns by to the end of each step spinning at scale u, from 0 (a body turns by
    2 atan(h w / 2) in a step at w, `kinematics.integrate_quat`)."""
    x = 0.5 * dt * scale * np.asarray(u, np.float64)
    return np.asarray(np.cumsum(2.0 * np.arctan(x), axis=0) / scale)


def pi_target_cotangent(g: np.ndarray, u: np.ndarray, dt: float, scale: float) -> np.ndarray:
    """The gradient with respect to the velocity targets ``u`` (steps, n) that the position targets'
    gradient ``g`` (steps, n) passes on through `pi_position_targets`."""
    x = 0.5 * dt * scale * np.asarray(u, np.float64)
    return np.asarray(np.cumsum(np.asarray(g, np.float64)[::-1], axis=0)[::-1] * (dt / (1.0 + x * x)))


def pi_target_tangent(v: np.ndarray, u: np.ndarray, dt: float, scale: float) -> np.ndarray:
    """The direction of `pi_position_targets` for a direction ``v`` (steps, n) of the velocity targets ``u``."""
    x = 0.5 * dt * scale * np.asarray(u, np.float64)
    return np.asarray(np.cumsum(dt / (1.0 + x * x) * np.asarray(v, np.float64), axis=0))


def pi_target_scale_derivative(u: np.ndarray, dt: float, scale: float) -> np.ndarray:
    """d `pi_position_targets` / d scale at fixed ``u``: with T = sum 2 atan(x) / s, x = dt s u / 2,
    (sum dt u / (1 + x^2) - T) / s (the engine's own derivative in s covers the s x T it forms)."""
    u = np.asarray(u, np.float64)
    x = 0.5 * dt * scale * u
    return np.asarray((np.cumsum(dt * u / (1.0 + x * x), axis=0) - np.cumsum(2.0 * np.arctan(x), axis=0) / scale)
                      / scale)


def engine_parameters(desc: RobotDescription, theta: Mapping[str, float]) -> dict[str, float]:
    """Every `PARAMETERS` value: ``theta``'s, the rest at the robot's nominals (or the law's
    neutral value), checked (ValueError names a bad value, KeyError an unknown name)."""
    unknown = sorted(set(theta) - set(PARAMETERS))
    if unknown:
        raise KeyError(f"unknown parameter(s) {unknown} for the ostrich simulator; accepted: {list(PARAMETERS)}")
    d = desc
    full = {"kp": d.kp, "mu": d.mu, "mu_lateral": d.mu_lateral, "cmd_scale": 1.0, "chassis_mass": d.chassis_mass,
            "slip_speed": 0.0, "slip_ratio": 0.0, "slip_speed_lat": 0.0, "slip_ratio_lat": 0.0, "cmd_trim": 0.0,
            "cmd_delay": 0.0, "torque_limit": 0.0, "mu_ground": d.mu_ground, "mu_pallet": d.mu_ground, "ki": 0.0}
    full.update({k: float(v) for k, v in theta.items()})
    for k, v in full.items():
        # cmd_scale: any finite value; slip_speed, slip_ratio: >= 0 (0 = exact Coulomb); cmd_trim:
        # in (-1, 1) (each wheel's command keeps its sign); the rest: > 0
        ok = {"cmd_scale": True, "slip_speed": v >= 0, "slip_ratio": v >= 0, "slip_speed_lat": v >= 0,
              "slip_ratio_lat": v >= 0, "cmd_trim": -1 < v < 1, "cmd_delay": True, "torque_limit": v >= 0,
              "mu_ground": v >= 0, "mu_pallet": v >= 0, "ki": v >= 0}.get(k, v > 0)
        if not (math.isfinite(v) and ok):
            raise ValueError(f"parameter {k} = {v} is not a valid value (finite; cmd_trim in (-1, 1), "
                             "slip_speed, slip_speed_lat, slip_ratio_lat, torque_limit, mu_ground, mu_pallet, ki, "
                             "slip_ratio >= 0, "
                             "kp / mu / mu_lateral / chassis_mass > 0)")
    if full["slip_speed_lat"] > 0 and full["slip_speed"] <= 0:
        raise ValueError("slip_speed_lat > 0 (the combined-slip law) needs slip_speed > 0 as well, the "
                         f"longitudinal slip speed; got slip_speed = {full['slip_speed']}")
    if full["slip_ratio_lat"] > 0 and full["slip_speed_lat"] <= 0:
        raise ValueError("slip_ratio_lat belongs to the combined-slip law: set slip_speed_lat > 0 too "
                         f"(got slip_ratio_lat = {full['slip_ratio_lat']}, slip_speed_lat = 0)")
    return full


def model_parameters(sim: Simulation) -> list[str]:
    """The `PARAMETERS` a replay sets in the engine's model (`Simulation.set_parameters`): not those of the targets
    (TARGET_PARAMETERS) or of every step (STEP_PARAMETERS), and only those registered in ``sim`` (a surface the
    worlds lack, such as a pallet, has none)."""
    return [k for k in PARAMETERS if k not in TARGET_PARAMETERS + STEP_PARAMETERS and k in sim.params]


def surface_shapes(model: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{surface parameter: (shapes, their worlds)} of a robot scene's model: ``mu_ground`` the static
    planes and meshes, ``mu_pallet`` the static boxes (pallets, obstacles); a surface without shapes
    in the model is left out."""
    body, kind, world = (model.shape_body.numpy(), model.shape_type.numpy(), model.shape_world.numpy())
    static = body < 0
    ground = static & np.isin(kind, [int(newton.GeoType.PLANE), int(newton.GeoType.MESH)])
    box = static & (kind == int(newton.GeoType.BOX))
    return {name: (np.flatnonzero(sel), world[sel]) for name, sel in (("mu_ground", ground), ("mu_pallet", box))
            if sel.any()}


def engine_for_scene(scene: Any, options: SolverOptions, *, pullback: str = "full", dt: float = 0.1,
                     friction_combine: str = "wheel") -> tuple[SolverOstrich, Simulation]:
    """The solver and `Simulation` of a robot scene (`build_robot_scene`) with the replay's model
    parameters registered per world (kp, mu, mu_lateral, cmd_scale, chassis_mass, slip_speed,
    slip_speed_lat, and mu_ground / mu_pallet where every such surface belongs to a world) and the
    wheels' friction configured, combined with the surfaces' by ``friction_combine``."""
    solver = SolverOstrich(scene.model, SolverOptions(**vars(options)))
    solver.set_friction_combine(friction_combine)
    configure_friction(solver, scene)  # wheels anisotropic, casters frictionless (their own coefficient)
    sim = Simulation(solver, dt, pullback=pullback)
    H = scene.handles
    wheels = [s for h in H for s in h.wheel_shapes]
    joints = [j for h in H for j in h.wheel_joints]
    sim.register_parameter("kp", "joint_kd", joints, per_world=True)
    sim.register_parameter("mu", "shape_mu", wheels, per_world=True)
    sim.register_parameter("mu_lateral", "shape_mu_lat", wheels, per_world=True)
    sim.register_parameter("cmd_scale", "joint_cmd_scale", joints, per_world=True)
    sim.register_parameter("chassis_mass", "body_mass", [h.chassis for h in H], per_world=True)
    sim.register_parameter("slip_speed", "shape_slip", wheels, per_world=True)
    sim.register_parameter("slip_speed_lat", "shape_slip_lat", wheels, per_world=True)
    sim.register_parameter("torque_limit", "joint_effort_limit", joints, per_world=True)
    sim.register_parameter("ki", "joint_ke", joints, per_world=True)
    for name, (shapes, worlds) in surface_shapes(scene.model).items():
        if (worlds >= 0).all():  # a surface shared by the worlds (world -1) has no per-world value
            sim.register_parameter(name, "shape_mu", shapes, per_world=True, worlds=worlds)
    return solver, sim


def merge_world_columns(parts: Sequence[np.ndarray], entity_world: Sequence[np.ndarray]) -> np.ndarray:
    """Per-entity arrays (..., n_k) of the parts' models as the one model of all their worlds holds
    them: the shared entities (world -1, e.g. the ground; `build_robot_scene` adds them first) once,
    then every part's own in order. ``entity_world[k]``: part k's world of each entity."""
    cols = []
    for k, (a, ew) in enumerate(zip(parts, entity_world, strict=True)):
        g = int(np.argmax(ew >= 0)) if np.any(ew >= 0) else len(ew)  # the shared prefix
        if np.any(ew[g:] < 0):
            raise AssertionError("shared entities (world -1) are expected before every world's own")
        cols.append(a if k == 0 else a[..., g:])
    return np.concatenate(cols, axis=-1)


def model_dof_world(model: Any) -> np.ndarray:
    """The world of each joint degree of freedom of a model (its joint's)."""
    per_joint = np.diff(model.joint_qd_start.numpy()[: model.joint_count + 1])
    return np.repeat(model.joint_world.numpy()[: model.joint_count], per_joint)
