"""Any wheeled robot from its URDF and a wheel map (issue 15): a 4-wheel skid steer and a
differential drive with a caster, built from URDF strings here, driven straight and turned in place
in the engine (closed forms: forward speed r w, yaw rate r (w_r - w_l) / track), the kinematic
baseline per side, the Helhest from its URDF equal to the Helhest from robot.yaml on a replay, the
Husky shipped in models/husky, and the errors for a wheel map that does not fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ingest.run import Run
from sysid.app.config import FitConfig
from sysid.errors import ConfigError
from sysid.robot import RobotDescriptionError, load_robot, robot_from_dict
from sysid.robot.urdf import robot_from_urdf
from sysid.simulators.kinematic import KinematicSkidSteer
from sysid.simulators.ostrich import OstrichReplay

ROOT = Path(__file__).resolve().parents[2]
R, WIDTH = 0.15, 0.08  # wheel radius and width [m] of the test robots


def _wheel(name: str) -> str:
    return f"""
  <link name="{name}">
    <inertial><mass value="1.5"/>
      <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.017" iyz="0" izz="0.01"/></inertial>
    <collision><origin rpy="1.5707963267948966 0 0"/>
      <geometry><cylinder radius="{R}" length="{WIDTH}"/></geometry></collision>
  </link>"""


def _joint(name: str, child: str, xyz: str) -> str:
    return f"""
  <joint name="{name}" type="continuous"><parent link="base_link"/><child link="{child}"/>
    <origin xyz="{xyz}"/><axis xyz="0 1 0"/></joint>"""


BASE = """
  <link name="base_link">
    <inertial><origin xyz="0 0 0.05"/><mass value="30"/>
      <inertia ixx="0.6" ixy="0" ixz="0" iyy="1.2" iyz="0" izz="1.5"/></inertial>
    <collision><origin xyz="0 0 0.05"/><geometry><box size="0.6 0.3 0.15"/></geometry></collision>
  </link>
  <link name="top_plate"><inertial><origin xyz="0 0 0"/><mass value="2"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.02"/></inertial></link>
  <joint name="top_plate_joint" type="fixed"><parent link="base_link"/><child link="top_plate"/>
    <origin xyz="0 0 0.15"/></joint>"""

# 4-wheel skid steer: wheelbase 0.4 m, track 0.5 m
SKID4_URDF = "<robot name='skid4'>" + BASE + "".join(_wheel(n) for n in ("fl", "fr", "rl", "rr")) + "".join(
    _joint(f"{n}_joint", n, xyz) for n, xyz in
    (("fl", "0.2 0.25 0"), ("fr", "0.2 -0.25 0"), ("rl", "-0.2 0.25 0"), ("rr", "-0.2 -0.25 0"))) + "</robot>"
SKID4_MAP = {"name": "skid4", "wheels": [
    {"joint": "fl_joint", "log": ["front_left"]}, {"joint": "rl_joint", "log": ["rear_left"]},
    {"joint": "fr_joint", "log": ["front_right"]}, {"joint": "rr_joint", "log": ["rear_right"]}],
    "servo": {"kp": 20.0}, "friction": {"mu": 1.5, "mu_lateral": 1.5, "mu_ground": 1.5}}

# differential drive: two wheels on the axle (track 0.44 m), a swivelling caster ball 0.3 m behind
DIFF_URDF = "<robot name='diff'>" + BASE + _wheel("wl") + _wheel("wr") + \
    _joint("left_wheel_joint", "wl", "0 0.22 0") + _joint("right_wheel_joint", "wr", "0 -0.22 0") + f"""
  <link name="caster_swivel"><inertial><mass value="0.3"/>
    <inertia ixx="1e-4" ixy="0" ixz="0" iyy="1e-4" iyz="0" izz="1e-4"/></inertial></link>
  <joint name="caster_swivel_joint" type="continuous"><parent link="base_link"/><child link="caster_swivel"/>
    <origin xyz="-0.3 0 0"/><axis xyz="0 0 1"/></joint>
  <link name="caster_ball"><inertial><mass value="0.2"/>
    <inertia ixx="1e-4" ixy="0" ixz="0" iyy="1e-4" iyz="0" izz="1e-4"/></inertial>
    <collision><geometry><sphere radius="0.05"/></geometry></collision></link>
  <joint name="caster_ball_joint" type="fixed"><parent link="caster_swivel"/><child link="caster_ball"/>
    <origin xyz="0 0 {0.05 - R}"/></joint>
</robot>"""
DIFF_MAP = {"name": "diff", "wheels": [{"joint": "left_wheel_joint"}, {"joint": "right_wheel_joint"}],
            "casters": ["caster_ball"], "servo": {"kp": 20.0},
            "friction": {"mu": 1.5, "mu_lateral": 1.5, "mu_ground": 1.5}}


def _run(name: str, columns: dict[str, float], duration: float = 3.0, dt: float = 0.05) -> Run:
    """A run at rest at the origin whose wheels are commanded constant speeds [rad/s]."""
    t = np.arange(0.0, duration + 1e-9, dt)
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": z, "y": z, "z": z, "qx": z, "qy": z, "qz": z, "qw": z + 1.0,
                         "yaw": z, "pitch": z, "roll": z})
    cmd = pd.DataFrame({"t": t, **{c: z + v for c, v in columns.items()}})
    return Run(name=name, odom=odom, wheel_cmd=cmd)


def _motion(pose: np.ndarray, t_from: float) -> tuple[float, float]:
    """Mean forward speed [m/s] and yaw rate [rad/s] after t_from (pose rows t, x, y, z, qx..qw)."""
    sel = pose[:, 0] >= t_from
    p = pose[sel]
    yaw = np.unwrap(2 * np.arctan2(p[:, 6], p[:, 7]))
    dt = p[-1, 0] - p[0, 0]
    return float(np.hypot(p[-1, 1] - p[0, 1], p[-1, 2] - p[0, 2]) / dt), float((yaw[-1] - yaw[0]) / dt)


@pytest.fixture(scope="module")
def skid4():
    return robot_from_urdf(SKID4_URDF, SKID4_MAP, source="skid4 (test)")


@pytest.fixture(scope="module")
def diff():
    return robot_from_urdf(DIFF_URDF, DIFF_MAP, source="diff (test)")


def test_skid4_description(skid4):
    d = skid4
    assert d.wheel_names == ["fl_joint", "rl_joint", "fr_joint", "rr_joint"]
    assert d.wheel_sides == ["left", "left", "right", "right"]
    assert d.wheel_logs[0] == ("front_left", "fl_joint")
    assert d.wheel_radius == R and d.wheel_width == WIDTH and d.wheel_mass == 1.5
    assert d.wheel_inertia == (0.01, 0.01, 0.017)  # (transverse, transverse, spin)
    assert d.track_width == 0.5 and d.base_height == R
    assert d.chassis_mass == 32.0  # base link + the fixed top plate
    # combined centre of mass: 30 kg at z 0.05, 2 kg at z 0.15
    np.testing.assert_allclose(d.chassis_com, (0.0, 0.0, (30 * 0.05 + 2 * 0.15) / 32), atol=1e-7)
    assert [s["type"] for s in d.chassis_shapes] == ["box"]
    assert robot_from_dict(d.to_dict()) == d  # the robot.yaml mapping reads back to the same robot


def test_diff_drive_caster_description(diff):
    d = diff
    assert d.wheel_sides == ["left", "right"] and d.track_width == 0.44
    assert len(d.casters) == 1
    c = d.casters[0]
    assert c["radius"] == 0.05
    np.testing.assert_allclose(c["position"], (-0.3, 0.0, 0.05 - R), atol=1e-7)
    assert d.chassis_mass == pytest.approx(32.5, abs=1e-5)  # caster links fold into the chassis


@pytest.mark.parametrize("robot", ["skid4", "diff"])
def test_straight_forward_speed_is_r_omega(robot, request):
    d = request.getfixturevalue(robot)
    w = 4.0  # [rad/s]
    cols = {c[0]: w for c in d.wheel_logs}
    pose = OstrichReplay(d).rollout([_run("straight", cols)], {"slip_speed": 0.02}, 0.05)[0]
    v, yaw_rate = _motion(pose, 1.5)
    print(f"{robot}: forward speed {v:.4f} m/s, r w = {R * w:.4f} m/s, yaw rate {yaw_rate:.2e}")
    assert v == pytest.approx(R * w, rel=0.02)
    assert abs(yaw_rate) < 1e-2


def test_diff_drive_turns_in_place_at_the_commanded_rate(diff):
    w = 3.0
    pose = OstrichReplay(diff).rollout([_run("pivot", {"left_wheel_joint": -w, "right_wheel_joint": w})],
                                       {"slip_speed": 0.02}, 0.05)[0]
    v, yaw_rate = _motion(pose, 1.5)
    commanded = R * (w - (-w)) / diff.track_width
    print(f"diff pivot: yaw rate {yaw_rate:.4f} rad/s, commanded {commanded:.4f}, drift {v:.2e} m/s")
    assert yaw_rate == pytest.approx(commanded, rel=0.03)
    assert v < 0.02


def test_skid4_turns_in_place(skid4):
    """High longitudinal friction: with little lateral grip the skid steer turns at the commanded
    rate; with lateral grip equal to the longitudinal it turns slower (the wheels scrub sideways)."""
    w = 3.0
    run = _run("pivot", {"front_left": -w, "rear_left": -w, "front_right": w, "rear_right": w})
    commanded = R * 2 * w / skid4.track_width
    rates = {}
    for mul in (0.02, 1.5):
        pose = OstrichReplay(skid4).rollout([run], {"slip_speed": 0.02, "mu": 1.5, "mu_lateral": mul}, 0.05)[0]
        v, rates[mul] = _motion(pose, 1.5)
        print(f"skid4 pivot, mu_lateral {mul}: yaw rate {rates[mul]:.4f} rad/s, commanded {commanded:.4f}")
        assert v < 0.03
    assert rates[0.02] == pytest.approx(commanded, rel=0.05)
    assert 0.05 * commanded < rates[1.5] < 0.95 * commanded


def test_kinematic_baseline_per_side(skid4, diff):
    """The kinematic baseline from the description: forward speed r w; yaw rate eta r (w_r - w_l) /
    track with eta = 1 for a differential drive and mu / (mu + kappa mu_lat), kappa = 2 wheelbase /
    track, for the 4-wheel skid steer."""
    w = 3.0
    for d, cols_fwd, cols_turn, kappa in (
        (diff, {"left_wheel_joint": w, "right_wheel_joint": w}, {"left_wheel_joint": -w, "right_wheel_joint": w}, 0.0),
        (skid4, {"front_left": w, "rear_left": w, "front_right": w, "rear_right": w},
         {"front_left": -w, "rear_left": -w, "front_right": w, "rear_right": w}, 2 * 0.4 / 0.5),
    ):
        sim = KinematicSkidSteer(d.to_dict())
        assert sim.geo["kappa"] == pytest.approx(kappa)
        theta = {"kp": 20.0, "mu": 1.0, "mu_lateral": 0.5, "chassis_mass": d.chassis_mass}
        v, _ = _motion(sim.rollout([_run("fwd", cols_fwd)], theta, 0.01)[0], 1.5)
        assert v == pytest.approx(R * w, rel=1e-3)
        _, yr = _motion(sim.rollout([_run("turn", cols_turn)], theta, 0.01)[0], 1.5)
        assert yr == pytest.approx(1.0 / (1.0 + kappa * 0.5) * R * 2 * w / d.track_width, rel=1e-3)


def test_helhest_urdf_equals_robot_yaml_on_a_replay():
    urdf = load_robot(ROOT / "models" / "helhest" / "helhest.urdf")
    yaml_ = load_robot(ROOT / "models" / "helhest" / "robot.yaml")
    assert urdf.wheel_names == yaml_.wheel_names and urdf.wheel_sides == ["left", "right", "center"]
    t = np.arange(0.0, 4.0 + 1e-9, 0.05)
    z = np.zeros_like(t)
    odom = pd.DataFrame({"t": t, "x": z, "y": z, "z": z, "qx": z, "qy": z, "qz": z, "qw": z + 1.0,
                         "yaw": z, "pitch": z, "roll": z})
    cmd = pd.DataFrame({"t": t, "left": 1.0 + 0.5 * np.sin(t), "right": 1.5 - 0.5 * np.sin(t), "rear": 1.25 + 0 * t})
    run = Run(name="turn", odom=odom, wheel_cmd=cmd)
    theta = {"slip_speed": 0.05, "cmd_trim": 0.05}
    a = OstrichReplay(urdf).rollout([run], theta, 0.05)[0]
    b = OstrichReplay(yaml_).rollout([run], theta, 0.05)[0]
    diff = np.abs(a - b).max()
    print(f"Helhest URDF vs robot.yaml replay: largest pose difference {diff:.2e} (travelled "
          f"{np.hypot(*a[-1, 1:3]):.2f} m)")
    assert np.hypot(*a[-1, 1:3]) > 1.0
    assert diff < 1e-5


def test_husky_model():
    d = load_robot(ROOT / "models" / "husky" / "husky.urdf")
    assert d == load_robot(ROOT / "models" / "husky" / "robot.yaml")
    assert (d.wheel_radius, d.track_width, d.total_mass) == (0.1651, 0.555, pytest.approx(50.0))
    xs = sorted({p[0] for p in d.wheel_positions})
    assert xs[1] - xs[0] == pytest.approx(0.512)
    assert d.wheel_sides.count("left") == 2 and d.wheel_sides.count("right") == 2
    cfg = FitConfig(robot="models/husky/husky.urdf", base_dir=ROOT)
    robot = cfg.load_robot()  # what every simulator receives: the robot.yaml mapping
    assert robot["wheels"]["radius"] == 0.1651 and robot["chassis"]["mass"] == pytest.approx(39.6)
    assert cfg.robot_name() == "husky"
    assert FitConfig(robot="husky", base_dir=ROOT).load_robot() == robot


# -- errors ------------------------------------------------------------------------------------


def test_wheel_map_naming_a_joint_not_in_the_urdf():
    bad = {**SKID4_MAP, "wheels": [*SKID4_MAP["wheels"][:3], {"joint": "rr_wheel_joint"}]}
    with pytest.raises(RobotDescriptionError, match=r"wheel joint 'rr_wheel_joint' is not in the URDF.*"
                                                    r"'rr_joint'.*Fix wheels\[3\]\.joint"):
        robot_from_urdf(SKID4_URDF, bad)


def test_robot_without_driven_wheels():
    with pytest.raises(RobotDescriptionError, match="no driven wheels"):
        robot_from_urdf(SKID4_URDF, {**SKID4_MAP, "wheels": []})
    d = load_robot().to_dict()
    d["wheels"]["joints"] = []
    with pytest.raises(RobotDescriptionError, match="no driven wheels"):
        robot_from_dict(d)
    d["wheels"]["joints"] = [j for j in load_robot().to_dict()["wheels"]["joints"] if j["name"] != "right"]
    with pytest.raises(RobotDescriptionError, match="no driven wheel on the right"):
        robot_from_dict(d)


def test_log_whose_wheel_names_match_no_wheel(skid4):
    run = _run("other_robot", {"left": 1.0, "right": 1.0, "rear": 1.0})
    for sim in (OstrichReplay(skid4), KinematicSkidSteer(skid4.to_dict())):
        with pytest.raises(RobotDescriptionError, match=r"run 'other_robot': its wheel columns \['left', 'right', "
                                                        r"'rear'\] .*fl_joint.*wheels\[\]\.log"):
            sim.rollout([run], {}, 0.05)


def test_unused_moving_joint_and_missing_wheel_map(tmp_path):
    with pytest.raises(RobotDescriptionError, match="caster_swivel_joint.*neither a driven wheel nor a caster"):
        robot_from_urdf(DIFF_URDF, {**DIFF_MAP, "casters": []})
    (tmp_path / "r.urdf").write_text(SKID4_URDF)
    with pytest.raises(ConfigError, match="no wheel map beside it"):
        FitConfig(robot=str(tmp_path / "r.urdf"), base_dir=tmp_path).load_robot()


def test_run_with_any_wheel_columns_round_trips(tmp_path):
    """ingest.Run holds N named wheel columns; the cache keeps them; a table without wheels is refused."""
    from ingest.errors import RunFormatError
    from ingest.run import side_speeds

    cols = {"front_left_wheel": 1.0, "rear_left_wheel": 1.1, "front_right_wheel": 2.0, "rear_right_wheel": 2.1}
    run = _run("husky", cols)
    assert run.wheel_names == list(cols)
    left, right = side_speeds(run.wheel_cmd)
    np.testing.assert_allclose(left, 1.05)
    np.testing.assert_allclose(right, 2.05)
    for suffix in (".npz", ".parquet"):
        back = Run.load(run.save(tmp_path / f"husky{suffix}"))
        assert back.wheel_names == list(cols)
        pd.testing.assert_frame_equal(back.wheel_cmd, run.wheel_cmd, check_dtype=False)
    with pytest.raises(RunFormatError, match="needs t .* and one column per wheel"):
        Run(name="bad", odom=run.odom, wheel_cmd=run.wheel_cmd[["t"]])


def test_one_set_of_defaults():
    """The defaults a description may leave out live once (sysid.robot.NOMINALS, ingest.run.PALLET_SIZE)
    and are the bundled Helhest's; the scenes' pallet is that one."""
    from ingest.run import PALLET_SIZE
    from sysid.fit.params import robot_nominals
    from sysid.robot import NOMINALS, robot_mapping
    from sysid.robot.scenes import RobotDescription, add_pallet

    assert RobotDescription.__dataclass_fields__["pallet_size"].default is PALLET_SIZE
    assert any(d is PALLET_SIZE for d in add_pallet.__defaults__ or ())
    helhest = robot_mapping()
    assert robot_nominals(helhest) == {k: NOMINALS[k] for k in ("kp", "mu", "mu_lateral", "chassis_mass")}
    assert tuple(helhest["pallet"]["size"]) == PALLET_SIZE
