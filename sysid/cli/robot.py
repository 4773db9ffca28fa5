"""``sysid robot check NAME|PATH``: read a robot description as the fit will and print what it found.

The description is a bundled robot's name, a robot.yaml, a wheel map or a URDF (docs/robots.md);
`sysid.robot.load_robot` reads it (a bad one is one ``error:`` line naming what to fix) and this
command prints a readable summary: the driven wheels and their sides, the wheel radius and track,
the masses, the servo and friction start values, and what the description does not give (the
defaults taken instead, the collision shapes that were skipped).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sysid.cli.common import Subparsers, quiet_warp

if TYPE_CHECKING:
    from sysid.robot.scenes import RobotDescription

EXAMPLES = """examples:
  sysid robot check husky
  sysid robot check models/husky/husky.urdf
  sysid robot check models/helhest/robot.yaml

docs: docs/robots.md"""


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``robot`` (with its one subcommand ``check``) to the ``sysid`` command's subparsers."""
    about = "check a robot description: wheels, sides, radius, track, masses, and what it leaves to defaults"
    p = subparsers.add_parser("robot", help="robot descriptions: `sysid robot check NAME|PATH`",
                              description="Robot descriptions (docs/robots.md).", epilog=EXAMPLES)
    sub = p.add_subparsers(dest="robot_command", required=True, metavar="COMMAND", help="check: read and summarise")
    c = sub.add_parser("check", help=about, description=about[0].upper() + about[1:] + ".", epilog=EXAMPLES)
    c.add_argument("robot", metavar="NAME|PATH",
                   help="robot: a bundled name (helhest, husky), robot.yaml, wheel map or URDF")
    c.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid robot check``: read the description, print its summary."""
    from ingest.topicmap import robot_file
    from sysid.ingest_errors import from_ingest

    with from_ingest():  # an unknown name / missing file: ingest's ConfigError, one line
        path = robot_file(args.robot)
    quiet_warp()  # a URDF is read by newton (Warp)
    from sysid.robot import load_robot

    robot = load_robot(path)
    print(summary(robot, path, _raw(path)))
    return 0


def _raw(path: Path) -> dict[str, Any]:
    """The mapping the description's values came from: the wheel map of a URDF or wheel map, else
    the robot.yaml itself."""
    from sysid.robot.description import read_description

    if path.suffix.lower() == ".urdf":
        from sysid.robot.urdf import wheel_map_for

        path = wheel_map_for(path)
    data = read_description(path)
    return data if isinstance(data, dict) else {}


def _vec(v: Any) -> str:
    return "(" + ", ".join(f"{float(c):+.3f}" for c in v) + ")"


def summary(robot: RobotDescription, path: Path, raw: dict[str, Any]) -> str:
    """The readable summary of ``robot`` read from ``path`` (``raw``: the mapping it was read from,
    to tell the values given from the defaults)."""
    from sysid.robot.description import NOMINALS

    urdf = robot.extra.get("urdf")
    lines = [f"robot {robot.name}: {path}" + (f" (URDF {urdf})" if urdf else "")]
    n = len(robot.wheel_names)
    lines.append(f"driven wheels: {n}, radius {robot.wheel_radius:.4g} m, width {robot.wheel_width:.4g} m, "
                 f"mass {robot.wheel_mass:.4g} kg each")
    width = max(len(w) for w in robot.wheel_names)
    for name, side, joint, pos, logs in zip(robot.wheel_names, robot.wheel_sides, robot.wheel_joints,
                                            robot.wheel_positions, robot.wheel_logs, strict=True):
        joint_note = "" if joint == name else f"  joint {joint}"
        lines.append(f"  {name:<{width}}  {side:<6} at {_vec(pos)} m{joint_note}  log names: {', '.join(logs)}")
    sides = {s: robot.wheel_sides.count(s) for s in ("left", "right", "center") if s in robot.wheel_sides}
    lines.append("sides: " + ", ".join(f"{s} {k}" for s, k in sides.items())
                 + f"; track {robot.track_width:.4g} m (between the sides' mean wheel positions)")
    lines.append(f"masses: chassis {robot.chassis_mass:.4g} kg + {n} x {robot.wheel_mass:.4g} kg wheels = "
                 f"{robot.total_mass:.4g} kg")
    if robot.casters:
        lines.append("casters: " + ", ".join(
            f"{c.get('name', '?')} (radius {float(c['radius']):.3g} m, frictionless)" for c in robot.casters))
    lines.append(f"base height {robot.base_height:.4g} m above flat ground")
    lines.append(f"start values of the fit: servo kp {robot.kp:.4g} N m s/rad, friction mu {robot.mu:.3g}, "
                 f"mu_lateral {robot.mu_lateral:.3g}, mu_ground {robot.mu_ground:.3g}")
    if isinstance(raw.get("pallet"), dict) and "size" in raw["pallet"]:
        lines.append("pallet: " + " x ".join(f"{float(v):.3g}" for v in robot.pallet_size) + " m")
    missing = _not_given(robot, raw, NOMINALS)
    if missing:
        lines.append("not in the description (defaults used):")
        lines.extend(f"  - {m}" for m in missing)
    else:
        lines.append("not in the description: nothing (every value is given)")
    return "\n".join(lines)


def _not_given(robot: RobotDescription, raw: dict[str, Any], nominals: dict[str, float]) -> list[str]:
    """What the description leaves out and what was taken instead."""
    out: list[str] = []
    servo, friction = raw.get("servo"), raw.get("friction")
    servo = servo if isinstance(servo, dict) else {}
    friction = friction if isinstance(friction, dict) else {}
    wheel_map = "urdf" in raw
    if wheel_map:
        entries = [w for w in raw.get("wheels") or [] if isinstance(w, dict)]
        if "kp" not in servo:
            out.append(f"servo kp: a 50 ms velocity servo on each wheel's share of the mass, {robot.kp:.4g} N m s/rad")
        if not all("side" in w for w in entries):
            out.append("wheel sides: from the sign of each wheel's y (y > 0: left)")
        if not all("log" in w for w in entries):
            out.append("wheel log names: the wheel's name and joint (the names a log must use)")
        if "base_height" not in raw:
            out.append(f"base_height: the wheel radius minus the wheels' height, {robot.base_height:.4g} m")
        skipped = robot.extra.get("skipped_shapes") or []
        if skipped:
            out.append("chassis collision shapes skipped (meshes; the engine takes boxes, spheres, cylinders and "
                       f"capsules): {', '.join(skipped)}")
    for key in ("mu", "mu_lateral"):
        if key not in friction:
            out.append(f"friction {key}: {nominals[key]:g} (the Helhest's)")
    if "mu_ground" not in friction:
        out.append(f"friction mu_ground (other bodies): mu, {robot.mu_ground:.3g}")
    return out
