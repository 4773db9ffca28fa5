"""The whole robot against rigid Coulomb friction in closed form: a traction-limited launch and a pivot.

Launch: all three wheels' targets ramp from rest to 6 rad/s in 0.15 s, faster than friction lets the robot
follow; while every wheel slides forward the ground's forces sum to mu m g whatever the load on each wheel,
so the robot accelerates at mu g exactly. A soft contact (MuJoCo at the generator's settings) reaches
0.95-0.97 mu g.

Pivot: the Helhest pivots with its front wheels driven at -2.5 / +2.5 rad/s and its rear wheel held at 0: every
wheel slides (the rear one sideways), so the turn rate is set by friction, the velocity servos' compliance
and the load the rotation shifts between the wheels, not by the wheels' kinematics. In steady rotation the
body-frame twist (vx, vy, w), the wheel speeds and the three normal loads solve nine equations: the planar
forces equal m times the centre of mass's centripetal acceleration, the vertical ones carry the weight, the
three moments about the centre of mass vanish, and each servo's torque kp (target - wheel speed) equals r
times its wheel's longitudinal friction force; each contact's friction is mu N along its slip (isotropic,
mu = mu_lateral, regularised by the slip speed). The engine's steady turn rate must agree with that
solution; a soft contact (MuJoCo at the generator's settings) turns 4-8 % slower (docs/results.md,
"Sim-to-sim recovery through the engine"; docs/traction.md).
"""

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import fsolve

from ingest.run import Run
from sysid.fit.metrics import quat_yaw
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import odom_stub
from tests.helpers.servo import ROBOT, M, R

MU, KP, SLIP, G = 0.6, 250.0, 0.003, 9.81
TARGET = np.array([-2.5, 2.5, 0.0])  # [rad/s] left, right, rear
THETA = {"kp": KP, "mu": MU, "mu_lateral": MU, "slip_speed": SLIP, "cmd_scale": 1.0}


def centre_of_mass() -> np.ndarray:
    """The whole robot's centre of mass in the base frame (x, y, z) [m], from models/helhest/robot.yaml: the
    chassis' fixed parts at their masses, its base box with the rest, and the wheels."""
    ch, wh = ROBOT["chassis"], ROBOT["wheels"]
    parts = [(p["mass"], p["center"]) for p in ch["fixed_parts"]]
    parts.append((ch["mass"] - sum(m for m, _ in parts), ch["base_box"]["center"]))
    parts += [(wh["mass"], j["position"]) for j in wh["joints"]]
    mass = sum(m for m, _ in parts)
    assert mass == pytest.approx(M)
    return sum(m * np.asarray(c, float) for m, c in parts) / mass


def steady_pivot() -> float:
    """The steady turn rate [rad/s] of the closed form in the module docstring."""
    wheels = np.array([j["position"][:2] for j in ROBOT["wheels"]["joints"]], float)
    cm = centre_of_mass()
    arm = wheels - cm[:2]
    height = ROBOT["base_height"] - cm[2]  # centre of mass above the ground [m]

    def equations(z: np.ndarray) -> list[float]:
        vx, vy, w = z[:3]
        spin, load = z[3:6], z[6:9]
        force = np.zeros((3, 2))
        for i in range(3):
            slip = np.array([vx - w * wheels[i, 1] - R * spin[i], vy + w * wheels[i, 0]])
            force[i] = -MU * load[i] * slip / np.sqrt(slip @ slip + SLIP**2)
        v_cm = np.array([vx - w * cm[1], vy + w * cm[0]])
        accel = np.array([-w * v_cm[1], w * v_cm[0]])  # steady rotation: w x v
        return [force[:, 0].sum() - M * accel[0], force[:, 1].sum() - M * accel[1], load.sum() - M * G,
                float(np.sum(arm[:, 1] * load + height * force[:, 1])),
                float(np.sum(-height * force[:, 0] - arm[:, 0] * load)),
                float(np.sum(arm[:, 0] * force[:, 1] - arm[:, 1] * force[:, 0])),
                *(KP * (TARGET - spin) - R * force[:, 0])]

    kinematic = R * (TARGET[1] - TARGET[0]) / (2 * abs(wheels[0, 1]))
    z, _, ok, msg = fsolve(equations, [0, 0, kinematic, *TARGET, M * G / 3, M * G / 3, M * G / 3], full_output=True)
    assert ok == 1, msg
    assert np.max(np.abs(equations(z))) < 1e-3  # [N], [N m] against loads of hundreds of N
    return float(z[2])


def _run(name: str, cmd: np.ndarray, t: np.ndarray) -> Run:
    """A run of wheel targets ``cmd`` (N, 3) [rad/s] at times ``t`` [s], standing at the origin (20 Hz odometry)."""
    wheels = pd.DataFrame({"t": t, "left": cmd[:, 0], "right": cmd[:, 1], "rear": cmd[:, 2]})
    return Run(name, odom_stub(t[::5]), wheels)


def test_traction_limited_launch_accelerates_at_mu_g() -> None:
    t = np.arange(0.0, 1.0, 0.01)
    w = np.interp(t, [0.0, 0.2, 0.35, 1.0], [0.0, 0.0, 6.0, 6.0])
    pose = OstrichReplay(ROBOT).rollout([_run("launch", np.stack([w, w, w], 1), t)], THETA, 0.01)[0]
    tt, x = pose[:, 0], pose[:, 1]
    sliding = (tt >= 0.3 - 1e-9) & (tt <= 0.5 + 1e-9)  # the rims at 5-6 rad/s (1.8-2.2 m/s), the robot below 1.8
    assert np.interp(0.5, tt, np.gradient(x, tt)) < R * 5.0  # still slower than the rims: every wheel slides
    accel = 2.0 * np.polyfit(tt[sliding], x[sliding], 2)[0]
    print(f"\ntraction-limited launch at h = 0.01 s: {accel:.4f} m/s^2 against mu g = {MU * G:.4f}")
    assert accel == pytest.approx(MU * G, rel=5e-3)
    assert abs(pose[-1, 2]) < 1e-3  # straight


@pytest.mark.parametrize("dt", [0.01, 0.1])
def test_pivot_turns_at_the_rigid_coulomb_rate(dt: float) -> None:
    expected = steady_pivot()
    kinematic = R * (TARGET[1] - TARGET[0]) / 0.72
    assert expected < 0.95 * kinematic  # the closed form is not the wheels' kinematics: friction decides
    t = np.arange(0.0, 4.0, 0.01)
    cmd = np.clip(t / 0.3, 0.0, 1.0)[:, None] * TARGET[None, :]  # ramped in over 0.3 s, then held
    pose = OstrichReplay(ROBOT).rollout([_run("pivot", cmd, t)], THETA, dt)[0]
    yaw = np.unwrap(quat_yaw(pose[:, 4:8]))
    steady = (pose[:, 0] > 2.5) & (pose[:, 0] < 3.95)
    rate = np.polyfit(pose[steady, 0], yaw[steady], 1)[0]
    print(f"\nsteady pivot at h = {dt} s: engine {rate:.4f} rad/s, rigid Coulomb closed form {expected:.4f} rad/s "
          f"({(rate / expected - 1) * 100:+.2f} %), wheels' kinematics {kinematic:.4f} rad/s")
    assert rate == pytest.approx(expected, rel=5e-3 if dt <= 0.01 else 1e-2)
