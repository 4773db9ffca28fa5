"""MuJoCo model built from models/helhest/robot.yaml: masses, rest height, servos, bad input."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from sysid.synth import ContactParams, MjcfOptions, Pallet, SynthError, build_mujoco_model, load_robot, robot_mjcf


def test_model_matches_robot_description() -> None:
    robot = load_robot()
    m = build_mujoco_model(robot)
    wheel_mass = float(robot["wheels"]["mass"])
    assert math.isclose(float(m.body("chassis").mass[0]), float(robot["chassis"]["mass"]), rel_tol=1e-9)
    for name in ("left", "right", "rear"):
        body = m.body(f"wheel_{name}")
        assert math.isclose(float(body.mass[0]), wheel_mass, rel_tol=1e-9)
        # Spin axis is body y: the description's third inertia value.
        assert math.isclose(float(body.inertia[1]), robot["wheels"]["inertia"][2], rel_tol=1e-6)
    pos = {j["name"]: j["position"] for j in robot["wheels"]["joints"]}
    assert np.allclose(m.body("wheel_rear").pos, pos["rear"])
    assert [m.actuator(i).name for i in range(m.nu)] == ["left", "right", "rear"]
    assert math.isclose(float(m.actuator("left").gainprm[0]), float(robot["servo"]["kp"]))


@pytest.mark.parametrize("shape", ["tyre", "cylinder"])
def test_rests_at_base_height_and_rolls_at_commanded_speed(shape: str) -> None:
    robot = load_robot()
    m = build_mujoco_model(robot, options=MjcfOptions(wheel_shape=shape))
    d = mujoco.MjData(m)
    for _ in range(500):
        mujoco.mj_step(m, d)
    assert abs(d.qpos[2] - robot["base_height"]) < 0.005
    w = 2.0  # [rad/s]
    d.ctrl[:] = w
    for _ in range(3000):
        mujoco.mj_step(m, d)
    speed = float(np.hypot(d.qvel[0], d.qvel[1]))
    assert abs(speed - w * robot["wheels"]["radius"]) < 0.03


def test_pallet_geom_and_friction_exposed() -> None:
    params = ContactParams(mu_wheel=0.7, mu_rear=0.4, mu_pallet=1.5, condim=3)
    xml = robot_mjcf(params=params, pallet=Pallet(2.0, 0.5, 0.3))
    m = mujoco.MjModel.from_xml_string(xml)
    g = m.geom("pallet")
    assert np.allclose(g.size, [0.6, 0.4, 0.072])
    assert np.allclose(g.pos, [2.0, 0.5, 0.072])
    assert math.isclose(float(g.friction[0]), 1.5)
    assert math.isclose(float(m.geom("wheel_rear").friction[0]), 0.4)
    assert int(m.geom("wheel_left").condim[0]) == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"params": ContactParams(mu_wheel=-1.0)}, "mu_wheel"),
        ({"params": ContactParams(condim=5)}, "condim"),
        ({"params": ContactParams(chassis_mass=10.0)}, "chassis mass"),
        ({"options": MjcfOptions(wheel_shape="square")}, "wheel_shape"),
        ({"options": MjcfOptions(timestep=0.0)}, "timestep"),
    ],
)
def test_bad_input_raises_synth_error(kwargs: dict, match: str) -> None:
    with pytest.raises(SynthError, match=match):
        robot_mjcf(**kwargs)


def test_missing_robot_file(tmp_path) -> None:
    with pytest.raises(SynthError, match="not found"):
        load_robot(tmp_path / "nope.yaml")
