"""`sysid synth --robot NAME|PATH`: a small flat-ground dataset of any robot (URDF + wheel map).

The pallet dataset (`generate_dataset`) is MuJoCo's model of the Helhest; this generator drives
any robot the project can describe (`sysid.robot.load_robot`: a bundled name, a robot.yaml, a
wheel map or a URDF) in the project's own engine (`sysid.simulators.ostrich.OstrichReplay`, h = `GEN_DT`) at
known parameters (`TRUTH`, relative to the robot's nominal servo gain), so that `sysid fit` on it
is a recovery check of the whole chain for that robot: bags with its joint names, ingest onto its
N wheels, calibration, the engine fit and the report. The generator is the fitted model class
(no model mismatch beyond the timestep: generated at 0.05 s, fitted at 0.1 s), with odometry
noise (`generate.odometry_error`, the pallet dataset's LIO error model).

Runs (10 s each, commands from a forward speed v [m/s] and yaw rate w [rad/s] mapped through the
drive's kinematics, `ingest.decode.WheelLayout.wheels`): a flat cruise at 0.8 m/s from 1 to 4 s
(the calibration segment), then ``arc`` (a steady turn), ``slalom`` (alternating turns),
``pivot`` (stop, turn on the spot, drive on), ``accel`` (speed steps between 0.2 and 1.4 m/s,
traction-limited: they determine mu), and the held-out ``mixed`` (random speeds and turns every
second). Topics of each bare ``.mcap`` bag:

- ``/wheel_cmd`` sensor_msgs/JointState, 50 Hz: wheel-velocity setpoints [rad/s] under the URDF's
  joint names (what a robot's controller logs);
- ``/cmd_vel`` geometry_msgs/Twist, 50 Hz: the (v, w) the setpoints come from;
- ``/odom`` nav_msgs/Odometry, 20 Hz: the replay's base pose plus odometry error, and its twist.

Beside them: ``manifest.yaml`` (splits, truth, generator), ``topics.yaml`` (the ingest topic map,
``robot:`` the robot) and ``fit.yaml`` (a `sysid fit` config for the dataset).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sysid.synth.errors import SynthError

GEN_DT = 0.05  # [s] the generator's engine timestep
FIT_DT = 0.1  # [s] the timestep of the fit.yaml written beside the bags
DURATION = 10.0  # [s] per run
CMD_RATE = 50.0  # [Hz]
ODOM_RATE = 20.0  # [Hz]
KINDS = ("arc", "slalom", "pivot", "accel", "mixed")
SPLITS = {"arc": "train", "slalom": "train", "pivot": "train", "accel": "train", "mixed": "heldout"}
# true parameters (kp as a multiple of the wheel map's nominal; the rest absolute), and the fit's
# start values in fit.yaml (the wheel map's nominals, slip_speed 0.1 m/s)
TRUTH = {"kp_factor": 1.0, "mu": 0.65, "mu_lateral": 0.4, "cmd_scale": 0.96, "slip_speed": 0.06}
EPOCH_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z, as the pallet dataset


def profile(kind: str, seed: int = 0, duration: float = DURATION, rate: float = CMD_RATE
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Command times [s], forward speed v [m/s] and yaw rate w [rad/s] of run ``kind`` (module doc)."""
    t = np.arange(0.0, duration, 1.0 / rate)
    v = np.clip(t / 1.0, 0.0, 1.0) * 0.8
    w = np.zeros_like(t)
    after = t >= 4.0
    if kind == "arc":
        w[after] = 0.5
    elif kind == "slalom":
        w[after] = 0.6 * np.sign(np.sin(2 * np.pi * 0.25 * (t[after] - 4.0)) + 1e-9)
    elif kind == "pivot":
        stop = (t >= 4.5) & (t < 7.5)
        v[(t >= 4.0) & (t < 4.5)] = 0.4
        v[stop] = 0.0
        w[stop] = 0.9
        v[t >= 7.5] = 0.6
        w[t >= 7.5] = -0.3
    elif kind == "accel":  # hard speed steps: the wheels spin past the traction limit, which sets mu
        v[after] = np.where(((t[after] - 4.0) // 1.5) % 2 == 0, 1.4, 0.2)
        w[after] = 0.2
    elif kind == "mixed":
        rng = np.random.default_rng(seed)
        knots = np.column_stack([rng.uniform(0.0, 1.1, int(duration) + 2), rng.uniform(-0.8, 0.8, int(duration) + 2)])
        idx = np.clip(((t - 4.0) // 1.0).astype(int), 0, len(knots) - 1)
        v[after], w[after] = knots[idx[after], 0], knots[idx[after], 1]
    else:
        raise SynthError(f"unknown run kind {kind!r}; one of {list(KINDS)}")
    return t, v, w


def _robot_spec(robot: str | Path) -> tuple[Any, str]:
    """The description of ``robot`` and how the dataset's files name it (a bundled name stays a
    name, a path becomes absolute)."""
    from ingest.errors import ConfigError
    from ingest.topicmap import MODELS, robot_file
    from sysid._quiet import init_warp_quietly

    try:
        path = robot_file(robot)
    except ConfigError as exc:
        raise SynthError(str(exc)) from None
    init_warp_quietly()
    from sysid.errors import SceneError
    from sysid.robot import load_robot

    try:
        desc = load_robot(path)
    except SceneError as exc:
        raise SynthError(f"robot {robot}: {exc}") from None
    bundled = path.parent.parent.resolve() == MODELS.resolve() and str(robot) == path.parent.name
    return desc, (str(robot) if bundled else str(path.resolve()))


def generate_robot_dataset(
    out: str | Path,
    robot: str | Path = "husky",
    *,
    seed: int = 0,
    runs: Sequence[str] | None = None,
    odom_noise: float = 1.0,
    duration: float = DURATION,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write the dataset of ``robot`` into ``out`` (module doc); returns the manifest."""
    from ingest import bagio
    from ingest.decode import WheelLayout
    from sysid.simulators.ostrich import OstrichReplay
    from sysid.synth.generate import OdomNoise, odometry_error

    kinds = list(runs) if runs else list(KINDS)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SynthError(f"--runs: unknown run(s) {bad}; the robot dataset's runs are {list(KINDS)}")
    if not 6.0 <= duration <= 600.0:
        raise SynthError(f"duration {duration} s: give 6 to 600 s (the first 4 s are the start and the cruise)")
    if odom_noise < 0:
        raise SynthError("--odom-noise is a scale and must be >= 0")
    desc, robot_ref = _robot_spec(robot)
    layout = WheelLayout.from_description(desc)
    truth = {"kp": float(desc.kp) * TRUTH["kp_factor"],
             **{k: float(v) for k, v in TRUTH.items() if k != "kp_factor"}}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sim = OstrichReplay(desc)
    from ingest.run import Run

    entries = []
    n0 = OdomNoise()
    noise = OdomNoise(**{k: getattr(n0, k) * (odom_noise if k != "jitter_tau" else 1.0)
                         for k in n0.__dataclass_fields__})
    for i, kind in enumerate(kinds):
        name = f"{desc.name}_{kind}"
        bag = out / f"{name}.mcap"
        if bag.exists():
            if not overwrite:
                raise SynthError(f"{bag} exists; pass --force to replace it")
            bag.unlink() if bag.is_file() else shutil.rmtree(bag)
        if progress:
            progress(f"{name}: replaying {duration:g} s in the engine")
        t, v, w = profile(kind, seed=seed + i, duration=duration)
        wheels = layout.wheels(v, w)  # (T, N) [rad/s]
        cmd = pd.DataFrame({"t": t, **{n: wheels[:, j] for j, n in enumerate(layout.names)}})
        t_o = np.arange(0.0, duration - 1e-9, 1.0 / ODOM_RATE)
        z = np.zeros_like(t_o)
        stub = pd.DataFrame({"t": t_o, "x": z, "y": z, "z": z + desc.base_height, "qx": z, "qy": z, "qz": z,
                             "qw": z + 1, "yaw": z, "pitch": z, "roll": z})
        pose = sim.rollout([Run(name, stub, cmd)], truth, GEN_DT)[0]  # (T, 8): t, x, y, z, qx, qy, qz, qw
        status = dict(sim.last_status)
        rng = np.random.default_rng([seed, i])
        err = odometry_error(len(t_o), ODOM_RATE, noise, rng)
        xyz = pose[:, 1:4] + err[:, :3]
        q = pose[:, 4:8]
        yaw_true = np.unwrap(np.arctan2(2 * (q[:, 3] * q[:, 2] + q[:, 0] * q[:, 1]),
                                        1 - 2 * (q[:, 1] ** 2 + q[:, 2] ** 2)))
        dq = np.column_stack([z, z, np.sin(err[:, 3] / 2), np.cos(err[:, 3] / 2)])
        from ingest.transforms import quat_mul

        qn = quat_mul(dq, q)
        yaw = yaw_true + err[:, 3]
        vel = np.gradient(xyz[:, :2], t_o, axis=0)
        v_fwd = vel[:, 0] * np.cos(yaw) + vel[:, 1] * np.sin(yaw)
        w_z = np.gradient(yaw, t_o)
        t0 = EPOCH_NS + i * 3600 * 10**9
        msgs = []
        for k, tt in enumerate(t_o):
            st = t0 + int(round(tt * 1e9))
            msgs.append(("/odom", "nav_msgs/msg/Odometry", st,
                         bagio.odometry(st, xyz[k], qn[k], (v_fwd[k], 0.0, 0.0), (0.0, 0.0, w_z[k]))))
        for k, tt in enumerate(t):
            st = t0 + int(round(tt * 1e9))
            msgs.append(("/wheel_cmd", "sensor_msgs/msg/JointState", st,
                         bagio.joint_state(st, list(desc.wheel_joints), wheels[k])))
            msgs.append(("/cmd_vel", "geometry_msgs/msg/Twist", st, bagio.twist((v[k], 0.0, 0.0), (0.0, 0.0, w[k]))))
        msgs.sort(key=lambda m: m[2])
        bagio.write_bag(bag, msgs)
        entries.append({"name": name, "bag": bag.name, "split": SPLITS[kind], "kind": kind,
                        "duration_s": duration, "bytes": bag.stat().st_size,
                        "end_pose": {"x": float(pose[-1, 1]), "y": float(pose[-1, 2]),
                                     "yaw": float(yaw_true[-1])},
                        "replay_residual_max": float(status.get("residual_max", float("nan")))})
    topics = {"robot": robot_ref, "time": "header",
              "topics": {"odom": {"topic": "/odom"}, "wheel_cmd": {"topic": "/wheel_cmd"}}}
    (out / "topics.yaml").write_text(
        "# ingest topic map of the `sysid synth --robot` bags: ingest.load_run(bag, config=this file)\n"
        + yaml.safe_dump(topics, sort_keys=False))
    manifest = {
        "dataset": f"{desc.name}-flat-synthetic",
        "generator": {"command": f"sysid synth --robot {robot}",
                      "engine": "ostrich (sysid.simulators.ostrich.OstrichReplay)",
                      "dt": GEN_DT, "seed": seed, "odom_noise_scale": odom_noise},
        "robot": {"description": robot_ref, "name": desc.name, "wheels": list(desc.wheel_names),
                  "wheel_joints": list(desc.wheel_joints), "wheel_radius": desc.wheel_radius,
                  "track_width": desc.track_width},
        "truth": truth,
        "truth_note": "the engine's own parameters (same model class as the fit); kp is the wheel map's nominal",
        "splits": {"train": [e["name"] for e in entries if e["split"] == "train"],
                   "heldout": [e["name"] for e in entries if e["split"] == "heldout"]},
        "ingest_topic_map": "topics.yaml",
        "runs": entries,
    }
    (out / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False, width=100))
    (out / "fit.yaml").write_text(fit_config_yaml(robot_ref, desc))
    return manifest


def fit_config_yaml(robot_ref: str, desc: Any) -> str:
    """The `sysid fit` config of a robot dataset: the engine at h = `FIT_DT`, mu, mu_lateral and
    slip_speed fitted from the wheel map's nominals, cmd_scale calibrated on the cruise, kp frozen
    (at h = 0.1 s a wheel servo of tens of ms tracks its target within a step at any gain near
    the nominal, so the odometry does not determine it)."""
    cfg = {
        "robot": robot_ref,
        "simulator": {"name": "ostrich", "options": {"newton_iters": 16, "pcr_iters": 16}},
        "data": {"manifest": "manifest.yaml", "ingest": {"dt": 0.01, "cache": True}},
        "parameters": {
            "kp": {"frozen": True},
            "mu": {"bounds": [0.05, 2.0]},
            "mu_lateral": {"bounds": [0.05, 5.0]},
            "cmd_scale": {"bounds": [0.7, 1.3]},
            "chassis_mass": {"frozen": True, "bounds": [round(0.5 * desc.chassis_mass, 3),
                                                        round(2.0 * desc.chassis_mass, 3)]},
            "slip_speed": {"nominal": 0.1, "bounds": [0.005, 1.0]},
        },
        "fit": {"optimizer": "lm", "dt": FIT_DT, "max_iter": 30, "jacobian": "tangent",
                "calibration": {"enabled": True, "parameter": "cmd_scale", "segment": "cruise"}},
        "sweep": {"dts": [0.05, 0.1, 0.2], "runs": "held_out"},
        "output": {"report": f"reports/{desc.name}-synth/report.html"},
    }
    head = (f"# sysid fit on the `sysid synth --robot {robot_ref}` dataset beside this file:\n"
            "#   sysid fit --config fit.yaml   (outputs relative to the current folder)\n")
    return head + yaml.safe_dump(cfg, sort_keys=False)


__all__ = ["KINDS", "TRUTH", "fit_config_yaml", "generate_robot_dataset", "profile"]
