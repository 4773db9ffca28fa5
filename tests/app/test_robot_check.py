"""``sysid robot check NAME|PATH``: a robot description read as the fit reads it, summarised in
words (wheels, sides, radius, track, masses, start values) with what it leaves to defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sysid.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_husky_urdf_summary_without_cuda_warning() -> None:
    """The Husky's URDF (newton reads it, Warp initialises): the summary on stdout, nothing on stderr."""
    res = subprocess.run([sys.executable, "-m", "sysid.cli", "robot", "check", "models/husky/husky.urdf"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr  # no Warp banner, no CUDA driver warning
    out = res.stdout
    assert out.startswith("robot husky: models/husky/husky.urdf (URDF models/husky/husky.urdf)")
    assert "driven wheels: 4, radius 0.1651 m, width 0.1143 m, mass 2.6 kg each" in out
    for wheel, side in (("front_left_wheel", "left"), ("rear_left_wheel", "left"), ("front_right_wheel", "right"),
                        ("rear_right_wheel", "right")):
        line = next(x for x in out.splitlines() if x.strip().startswith(wheel))
        assert f" {side} " in line and "log names:" in line, line
    assert "sides: left 2, right 2; track 0.555 m" in out
    assert "masses: chassis 39.6 kg + 4 x 2.6 kg wheels = 50 kg" in out
    assert "start values of the fit: servo kp 10 N m s/rad" in out
    assert "pallet" not in out  # the Husky's description has none
    assert "RobotDescription(" not in out


def test_helhest_by_name_lists_its_pallet_and_nothing_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["robot", "check", "helhest"]) == 0
    out = capsys.readouterr().out
    assert "driven wheels: 3, radius 0.36 m" in out and "sides: left 1, right 1, center 1; track 0.72 m" in out
    assert "masses: chassis 88 kg + 3 x 6 kg wheels = 106 kg" in out
    assert "pallet: 1.2 x 0.8 x 0.144 m" in out
    assert "not in the description: nothing (every value is given)" in out


def test_a_short_wheel_map_says_what_was_taken_from_defaults(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A wheel map with only the URDF and the wheel joints: the servo, sides, log names, base height
    and friction come from defaults, each named."""
    (tmp_path / "husky.urdf").write_text((ROOT / "models" / "husky" / "husky.urdf").read_text())
    wm = tmp_path / "robot.yaml"
    wm.write_text("urdf: husky.urdf\nwheels:\n" + "".join(
        f"  - {{joint: {j}}}\n" for j in ("front_left_wheel", "rear_left_wheel", "front_right_wheel",
                                          "rear_right_wheel")))
    assert main(["robot", "check", str(wm)]) == 0
    out = capsys.readouterr().out
    missing = out.split("not in the description (defaults used):\n", 1)[1]
    for what in ("servo kp: a 50 ms velocity servo", "wheel sides: from the sign of each wheel's y",
                 "wheel log names: the wheel's name and joint", "base_height:", "friction mu: 0.8",
                 "friction mu_lateral: 0.5", "friction mu_ground (other bodies): mu"):
        assert what in missing, (what, missing)


def test_unknown_robot_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["robot", "check", "no_such_robot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: robot 'no_such_robot': no such file, and not a bundled robot")
