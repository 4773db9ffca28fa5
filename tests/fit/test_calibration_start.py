"""The command-scale calibration: its value does not depend on where it starts (a scan over the
bounds and a converged 1-D solve, not LM from the start value, which stopped on its relative-loss
tolerance short of the minimum when the model cannot fit the segment exactly), and it calibrates a
speed: a model that turns too little at its start values does not pull the scale off."""

from __future__ import annotations

from pathlib import Path

import pytest

from sysid.fit.calibration import STRAIGHT, calibrate
from sysid.fit.params import default_parameters
from sysid.fit.residuals import RunSet
from tests.helpers.fit_doubles import TRUTH, make_double, make_runs

DT = 0.02


@pytest.fixture(scope="module")
def mismatched_runs():
    """Runs whose traction differs from the calibration's (nominal) parameters, with odometry noise:
    the calibration loss keeps a large floor, so its valley is flat (as on real logs)."""
    truth = {**TRUTH, "mu": 0.3, "mu_lateral": 2.0, "kp": 20.0}
    runs = make_runs(("turn", "slalom", "random"), truth=truth, duration=8.0, noise=0.2, truth_dt=DT, seed=3)
    for r in runs:
        r.segments["cruise"] = (3.0, 8.0)
    return runs


def calibrated(runs, start: float, **theta: float) -> float:
    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    ps["cmd_scale"].value = start
    for k, v in theta.items():
        ps[k].value = v
    return calibrate(sim, runs, ps, DT).value


def test_calibration_independent_of_the_start(mismatched_runs) -> None:
    values = [calibrated(mismatched_runs, s) for s in (0.6, 1.0, 1.4)]
    assert max(values) - min(values) < 1e-3, values


def test_calibration_is_the_minimum_of_its_loss(mismatched_runs) -> None:
    """The calibrated value is the 1-D minimiser: the loss is higher 1e-3 to either side."""
    from sysid.fit.calibration import SpeedResiduals

    sim = make_double()
    ps = default_parameters(None, sim.parameter_names)
    speeds = SpeedResiduals(sim, RunSet.build(mismatched_runs, [r.segments["cruise"] for r in mismatched_runs]),
                            ps, "cmd_scale", DT)
    value = calibrated(mismatched_runs, 1.0)
    assert speeds.loss(value) < speeds.loss(value - 1e-3) and speeds.loss(value) < speeds.loss(value + 1e-3)


def test_a_turn_the_model_misjudges_does_not_move_the_scale() -> None:
    """Steady circles driven at cmd_scale 0.92: calibrated with the turn efficiency far off (mu_lateral
    0.1 or 3 against the truth's 0.9), the scale comes back within 1 %."""
    runs = make_runs(("turn", "turn"), duration=8.0, truth_dt=DT, seed=5)
    for r in runs:
        r.segments["cruise"] = (4.0, 8.0)  # the steady turn after the manoeuvre's start
    for mu_lateral in (0.1, 3.0):
        assert calibrated(runs, 1.0, mu=TRUTH["mu"], kp=TRUTH["kp"], mu_lateral=mu_lateral) == pytest.approx(
            TRUTH["cmd_scale"], rel=0.01)


@pytest.fixture(scope="module")
def straight_then_turn():
    """Two engine runs (Helhest, truth at cmd_scale 0.92): 4 s straight at 0.9 m/s, then 5 s of a steady
    turn (3.2 / 1.2 rad/s), one mirrored; odometry every 0.05 s."""
    import numpy as np
    import pandas as pd

    from ingest.run import Run
    from sysid.simulators.ostrich import OstrichReplay
    from tests.helpers.fit_doubles import odom_from_pose, odom_stub

    sim = OstrichReplay()
    truth = {"kp": 400.0, "mu": 0.6, "mu_lateral": 0.5, "cmd_scale": 0.92, "slip_speed": 0.1, "slip_ratio": 1.0}
    runs = []
    t = np.arange(0.0, 10.0, 0.01)
    for mirror in (False, True):
        left = np.clip(t / 1.0, 0, 1) * 2.5
        right = left.copy()
        left[t >= 5.0], right[t >= 5.0] = 3.2, 1.2
        if mirror:
            left, right = right, left
        stub = Run(f"turn{'-mirror' if mirror else ''}", odom_stub(np.arange(0.0, 10.0 - 1e-9, 0.05)),
                   pd.DataFrame({"t": t, "left": left, "right": right, "rear": (left + right) / 2}))
        run = Run(stub.name, odom_from_pose(stub.odom, sim.rollout([stub], truth, 0.02)[0]), stub.wheel_cmd)
        run.segments["cruise"] = (0.0, 10.0)
        runs.append(run)
    return sim, truth, runs


def test_the_scale_is_calibrated_on_straight_chords(straight_then_turn) -> None:
    """How much speed the engine loses in a turn depends on its slip and lateral friction parameters, so
    a scale calibrated on the turn depends on their start values (2.6 % apart between the two starts
    below when every chord is compared); on the straight chords it does not (within 0.5 %, at the truth)."""
    from sysid.fit.params import Parameter, ParameterSet

    sim, truth, runs = straight_then_turn
    ps = ParameterSet([*default_parameters(None, ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass")),
                       Parameter(name="slip_speed", nominal=0.1, lower=0.005, upper=1.0),
                       Parameter(name="slip_ratio", nominal=1.0, lower=0.0, upper=5.0)])
    values: dict[object, list[float]] = {}
    for max_curvature in (None, STRAIGHT):
        for slip_ratio, mu_lateral in ((0.3, 2.0), (1.5, 0.3)):
            p = ps.copy()
            for k in ("kp", "mu", "slip_speed"):
                p[k].value = truth[k]
            p["slip_ratio"].value, p["mu_lateral"].value = slip_ratio, mu_lateral
            cal = calibrate(sim, runs, p, 0.1, max_curvature=max_curvature)
            assert not cal.fit.warnings and cal.runs == ["turn", "turn-mirror"]
            values.setdefault(max_curvature, []).append(cal.value)
    every, straight = values[None], values[STRAIGHT]
    assert abs(every[0] - every[1]) > 0.015, every  # what the straight chords avoid
    assert abs(straight[0] - straight[1]) < 0.005 and all(abs(v - 0.92) < 0.005 for v in straight), straight


def test_calibration_on_turns_only_warns(straight_then_turn) -> None:
    """With max_curvature, runs with no straight stretch are calibrated on their turns, with a warning saying
    why the value depends on the other parameters' start values."""
    from sysid.fit.params import Parameter, ParameterSet

    sim, _truth, runs = straight_then_turn
    turning = []
    for r in runs:
        cut = r.odom[r.odom["t"] >= 5.5].reset_index(drop=True)
        turn = type(r)(r.name, cut, r.wheel_cmd)
        turn.segments["cruise"] = (5.5, 10.0)
        turning.append(turn)
    ps = ParameterSet([*default_parameters(None, ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass")),
                       Parameter(name="slip_speed", nominal=0.1, lower=0.005, upper=1.0)])
    cal = calibrate(sim, turning, ps, 0.1, max_curvature=STRAIGHT)
    assert len(cal.fit.warnings) == 1 and "no training run's 'cruise' segment has a straight stretch" in \
        cal.fit.warnings[0], cal.fit.warnings
    assert cal.runs == ["turn", "turn-mirror"]


def test_max_curvature_in_the_config() -> None:
    """fit.calibration.max_curvature: default null (every chord), a number restricts the calibration to
    straight stretches, a bad value is a one-line error naming the key."""

    from sysid.app.config import FitConfig
    from sysid.errors import ConfigError

    robot = str(Path(__file__).resolve().parents[2] / "models/helhest/robot.yaml")
    assert FitConfig.from_mapping({"robot": robot}).fit.calibration.max_curvature is None
    cfg = FitConfig.from_mapping({"robot": robot, "fit": {"calibration": {"max_curvature": None}}})
    assert cfg.fit.calibration.max_curvature is None
    cfg = FitConfig.from_mapping({"robot": robot, "fit": {"calibration": {"max_curvature": 0.3}}})
    assert cfg.fit.calibration.max_curvature == 0.3
    with pytest.raises(ConfigError, match=r"fit.calibration.max_curvature must be > 0"):
        FitConfig.from_mapping({"robot": robot, "fit": {"calibration": {"max_curvature": -1}}})


def test_the_fallback_warning_reaches_the_fit(tmp_path) -> None:
    """`sysid fit` (max_curvature set) on runs whose cruise only turns: the calibration's warning is among the fit's
    warnings (printed, in the results and once in the report), not only in the calibration record."""
    import json

    import yaml

    from sysid.cli import main
    from tests.helpers.fit_doubles import make_runs

    root = Path(__file__).resolve().parents[2]
    for r in make_runs(("turn", "turn"), duration=6.0, truth_dt=0.05, prefix="train", seed=1):
        r.segments["cruise"] = (3.0, 6.0)  # the manoeuvre: no straight stretch
        r.save(tmp_path / f"{r.name}.npz")
    cfg = {"robot": str(root / "models/helhest/robot.yaml"),
           "simulator": {"name": "tests.helpers.fit_doubles:make_double"},
           "data": {"train": [str(tmp_path / "train-*.npz")]},
           "fit": {"dt": 0.05, "max_iter": 3, "baseline": False, "calibration": {"max_curvature": STRAIGHT}},
           "sweep": {"enabled": False},
           "output": {"params": str(tmp_path / "p.yaml"), "report": str(tmp_path / "r.html")}}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["fit", "--config", str(tmp_path / "fit.yaml"), "-q", "--results", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    key = "segment has a straight stretch"
    assert sum(key in w for w in doc["fit"]["warnings"]) == 1, doc["fit"]["warnings"]
    assert (tmp_path / "r.html").read_text().count(key) == 1
