"""Robot descriptions: the one reader of ``robot.yaml``, wheel maps and URDFs, and the one set of defaults.

A robot is described by one of three files (docs/robots.md): a ``robot.yaml`` (the Helhest's form,
`models/helhest/robot.yaml`), a wheel map YAML whose ``urdf:`` names a URDF, or a URDF with its wheel
map beside it (`sysid.robot.urdf`). `load_robot` reads any of them into the engine's value type
`sysid.robot.scenes.RobotDescription`; `robot_mapping` gives the robot.yaml mapping of any of them
(what the simulators' and the fit's ``robot`` arguments take) without loading the engine for a plain
robot.yaml. Every failure is a `sysid.errors.RobotDescriptionError` (a ConfigError: one line on the
command line) naming the file and what to fix. `ingest.topicmap.robot_file` resolves a bundled name.

Defaults live here once: `DEFAULT_ROBOT` (the bundled Helhest), `NOMINALS` (the parameter values a
description or a theta leaves out) and the pallet size (`ingest.run.PALLET_SIZE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.bundled import models_dir
from ingest.fileio import read_yaml
from ingest.run import PALLET_SIZE
from sysid.errors import RobotDescriptionError

if TYPE_CHECKING:  # the engine (newton, Warp) loads only when a description is built
    from sysid.robot.scenes import RobotDescription

DEFAULT_ROBOT = models_dir() / "helhest" / "robot.yaml"  # bundled (ingest.bundled: checkout or wheel)

# Nominal values of the identifiable parameters where neither the robot's description nor a theta
# gives one: the Helhest's (models/helhest/robot.yaml, ROBOT.md). kp [N m s/rad], mu and mu_lateral
# [1] (wheel-ground Coulomb, along / across the rolling direction), cmd_scale [1], chassis_mass [kg].
NOMINALS: dict[str, float] = {"kp": 250.0, "mu": 0.8, "mu_lateral": 0.5, "cmd_scale": 1.0, "chassis_mass": 88.0}


def read_description(path: str | Path) -> Any:
    """The parsed YAML of a robot description file (RobotDescriptionError when missing or invalid)."""
    return read_yaml(path, RobotDescriptionError, "robot description")


def load_robot(path: str | Path = DEFAULT_ROBOT) -> RobotDescription:
    """Read a robot description: a robot.yaml, a wheel map YAML (``urdf:`` names the URDF) or a
    URDF (its wheel map beside it, `sysid.robot.urdf.wheel_map_for`); RobotDescriptionError names a
    missing file, invalid YAML, a missing or bad field, or a description that does not fit together."""
    p = Path(path)
    if not p.is_file():
        raise RobotDescriptionError(f"robot description {str(p)!r} does not exist")
    if p.suffix.lower() == ".urdf":
        from sysid.robot.urdf import load_urdf_robot

        return load_urdf_robot(p)
    return robot_from_dict(read_description(p), source=str(p), base=p.parent)


def robot_mapping(path: str | Path = DEFAULT_ROBOT) -> dict[str, Any]:
    """The robot.yaml mapping of a description file: a robot.yaml as written, a wheel map or a URDF
    as the mapping of the robot they describe (`RobotDescription.to_dict`)."""
    p = Path(path)
    if p.suffix.lower() == ".urdf":
        return load_robot(p).to_dict()
    data = read_description(p)
    if not isinstance(data, dict):
        raise RobotDescriptionError(f"robot description {str(p)!r} is not a mapping")
    if "urdf" in data:  # a URDF and its wheel map (sysid.robot.urdf)
        return robot_from_dict(data, source=str(p), base=p.parent).to_dict()
    return data


def _vec3(v: Any) -> tuple[float, float, float]:
    """Three floats (a position [m], a size [m], a diagonal or a row of an inertia [kg m^2]); a
    ValueError (a malformed field) for any other length."""
    x, y, z = (float(c) for c in v)
    return (x, y, z)


def robot_from_dict(d: dict[str, Any], source: str = "robot description", base: str | Path | None = None
                    ) -> RobotDescription:
    """A `RobotDescription` from the parsed robot.yaml mapping, or from a wheel map (a mapping
    with ``urdf:``; a relative URDF path is taken from ``base``, default the current folder).
    RobotDescriptionError names a missing or malformed field."""
    from sysid.robot.scenes import RobotDescription

    if isinstance(d, dict) and "urdf" in d and "wheels" in d and "radius" not in (d.get("wheels") or {}):
        from sysid.robot.urdf import robot_from_wheel_map

        return robot_from_wheel_map(d, base=Path(base) if base is not None else Path.cwd(), source=source)
    try:
        ch, wh = d["chassis"], d["wheels"]
        joints = wh["joints"]
        inertia = ch.get("inertia")
        return RobotDescription(
            name=str(d["name"]),
            base_height=float(d["base_height"]),
            chassis_mass=float(ch["mass"]),
            base_box=ch.get("base_box") or {},
            fixed_parts=list(ch.get("fixed_parts", [])),
            wheel_radius=float(wh["radius"]),
            wheel_width=float(wh["width"]),
            wheel_mass=float(wh["mass"]),
            wheel_inertia=_vec3(wh["inertia"]),
            wheel_names=[str(j["name"]) for j in joints],
            wheel_positions=[_vec3(j["position"]) for j in joints],
            kp=float(d["servo"]["kp"]),
            mu=float(d["friction"]["mu"]),
            mu_lateral=float(d["friction"]["mu_lateral"]),
            mu_ground=float(d["friction"].get("mu_ground", d["friction"]["mu"])),
            track_width=float(d["skid_steer"]["track_width"]),
            pallet_size=_vec3(d.get("pallet", {}).get("size", PALLET_SIZE)),
            wheel_sides=[str(j["side"]) for j in joints] if all("side" in j for j in joints) else [],
            wheel_joints=[str(j.get("joint", j["name"])) for j in joints],
            wheel_logs=[tuple([j["log"]] if isinstance(j.get("log"), str) else j["log"]) if j.get("log")
                        else tuple(dict.fromkeys((str(j["name"]), str(j.get("joint", j["name"]))))) for j in joints],
            chassis_com=None if ch.get("com") is None else _vec3(ch["com"]),
            chassis_inertia=None if inertia is None else tuple(_vec3(row) for row in inertia),
            chassis_shapes=None if ch.get("shapes") is None else [dict(s) for s in ch["shapes"]],
            casters=[dict(c) for c in d.get("casters") or []],
            caster_mu=float(d["friction"].get("mu_caster", 0.0)),
            source=str(d.get("source", "")),
        )
    except RobotDescriptionError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise RobotDescriptionError(f"{source}: missing or malformed field ({e!r})") from e
