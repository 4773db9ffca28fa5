"""The Helhest on flat ground as the wheel-servo closed-form tests see it (test_engine_pi_servo,
test_engine_torque_limit): its robot file, the figures of the closed forms and the replay's parameters."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROBOT = yaml.safe_load((ROOT / "models" / "helhest" / "robot.yaml").read_text())
# total mass [kg] (chassis 88 + three 6 kg wheels), wheel radius [m], wheel spin inertia [kg m^2], driven wheels
M, R, I_SPIN, NW = 106.0, 0.36, 0.389, 3
H = 0.1  # replay step [s]


def servo_theta(cmd_scale: float) -> dict[str, float]:
    """The replay's parameters for the servo tests at command scale ``cmd_scale``."""
    return {"kp": 250.0, "mu": 0.8, "mu_lateral": 0.5, "cmd_scale": cmd_scale, "slip_speed": 0.05}
