"""Synthetic pallet dataset: the robot of `models/helhest/robot.yaml` driven over a pallet in MuJoCo,
written as ROS bags with lidar, odometry, wheel commands and IMU, plus a manifest of the truth.

Public API::

    robot_mjcf(...), build_mujoco_model(...)       # MJCF / MjModel from robot.yaml (+ pallet)
    design_runs(seed) -> list[RunSpec]             # the 14-run design of the paper (§IV-A)
    simulate_run(spec) -> Trajectory               # MuJoCo simulation with a simulated operator
    replay_commands(cmd, contact, servo, pallet)   # open-loop MuJoCo replay of logged setpoints
    generate_run(spec, out_dir, fmt)               # one bag + its manifest entry
    generate_dataset(out_dir, seed, fmt, runs)     # bags + manifest.yaml + topics.yaml
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.lazy import lazy_getattr
from sysid.synth.errors import SynthError

if TYPE_CHECKING:
    from sysid.synth.generate import (
        FORMATS,
        ImuNoise,
        LidarConfig,
        OdomNoise,
        SensorConfig,
        generate_dataset,
        generate_run,
        load_manifest,
        topic_map_yaml,
    )
    from sysid.synth.mjcf import ContactParams, MjcfOptions, Pallet, build_mujoco_model, load_robot, robot_mjcf
    from sysid.synth.scenario import DesignOptions, RunSpec, ServoParams, design_runs, make_run, plan_path
    from sysid.synth.simulate import OperatorParams, Trajectory, replay_commands, simulate_run

# The names below are imported on first use, so that `sysid synth --help` (which imports
# `sysid.synth.cli`) loads neither numpy nor MuJoCo.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("FORMATS", "ImuNoise", "LidarConfig", "OdomNoise", "SensorConfig", "generate_dataset",
                     "generate_run", "load_manifest", "topic_map_yaml"), "generate"),
    **dict.fromkeys(("ContactParams", "MjcfOptions", "Pallet", "build_mujoco_model", "load_robot", "robot_mjcf"),
                    "mjcf"),
    **dict.fromkeys(("DesignOptions", "RunSpec", "ServoParams", "design_runs", "make_run", "plan_path"), "scenario"),
    **dict.fromkeys(("OperatorParams", "Trajectory", "replay_commands", "simulate_run"), "simulate"),
}


__getattr__ = lazy_getattr("sysid.synth", _EXPORTS, globals())


__all__ = [
    "FORMATS",
    "ContactParams",
    "DesignOptions",
    "ImuNoise",
    "LidarConfig",
    "MjcfOptions",
    "OdomNoise",
    "OperatorParams",
    "Pallet",
    "RunSpec",
    "SensorConfig",
    "ServoParams",
    "SynthError",
    "Trajectory",
    "build_mujoco_model",
    "design_runs",
    "generate_dataset",
    "generate_run",
    "load_manifest",
    "load_robot",
    "make_run",
    "plan_path",
    "replay_commands",
    "robot_mjcf",
    "simulate_run",
    "topic_map_yaml",
]
