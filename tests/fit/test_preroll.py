"""A run's start in the model's own motion (`sysid.simulators.preroll`, ``simulator.options.preroll``).

Closed forms: a steady turn (constant wheel targets from before the start) replayed with a pre-roll
turns at its steady yaw rate from the first sample on, where the plain start (the odometry's yaw
rate, here 0) spins up first; the returned path starts at the odometry's pose exactly and is a rigid
motion of the pre-rolled replay. Derivatives through the frame change against central differences
(the kinematic baseline, exact; the engine's forward sensitivities and adjoint), the wheel log
before a piece's start, and the one-line errors.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from ingest.run import PalletPose, Run  # noqa: E402
from sysid.errors import SimulatorError  # noqa: E402
from sysid.fit.metrics import quat_yaw  # noqa: E402
from sysid.simulators.observation import WHEELS_BEFORE  # noqa: E402
from sysid.simulators.preroll import PreRoll, preroll_run  # noqa: E402
from sysid.simulators.protocol import get_simulator, unwrap  # noqa: E402
from tests.helpers.fit_doubles import ENGINE_THETA, odom_stub, stub_run  # noqa: E402

ROBOT = yaml.safe_load((ROOT / "models" / "helhest" / "robot.yaml").read_text())
START = {"x": 1.0, "y": -2.0, "yaw": 0.7}  # the odometry's first pose


def turning_run(duration: float = 4.0) -> Run:
    """Wheel targets constant (left 2, right 4, rear 3 rad/s) from before the first sample; the
    odometry (standing, at `START`) reports no yaw rate at the start."""
    t = np.arange(0.0, duration, 0.01)
    cmd = pd.DataFrame({"t": t, "left": 2.0, "right": 4.0, "rear": 3.0})
    odom = odom_stub(np.arange(0.0, duration - 1e-9, 0.05))
    yaw = START["yaw"]
    odom = odom.assign(x=START["x"], y=START["y"], yaw=yaw, qz=np.sin(yaw / 2), qw=np.cos(yaw / 2))
    return Run("turning", odom, cmd)


def yaw_rate(p: np.ndarray, a: float, b: float) -> float:
    t = p[:, 0]
    i, j = int(np.searchsorted(t, a)), int(np.searchsorted(t, b))
    yaw = np.unwrap(quat_yaw(p[:, 4:8]))
    return float((yaw[j] - yaw[i]) / (t[j] - t[i]))


def test_a_steady_turn_turns_at_its_steady_rate_from_the_first_sample():
    run = turning_run()
    plain = get_simulator("ostrich", robot=ROBOT, initial_speed="wheels")
    rolled = get_simulator("ostrich", robot=ROBOT, initial_speed="wheels", preroll=2.0)
    assert isinstance(unwrap(rolled), type(unwrap(plain))) and isinstance(rolled.inner, PreRoll)
    p = plain.rollout([run], ENGINE_THETA, 0.1)[0]
    q = rolled.rollout([run], ENGINE_THETA, 0.1)[0]
    steady = yaw_rate(q, 2.5, 3.9)
    first_q, first_p = yaw_rate(q, 0.0, 0.5), yaw_rate(p, 0.0, 0.5)
    print(f"\nyaw rate [rad/s] over the first 0.5 s: pre-rolled {first_q:.4f}, plain {first_p:.4f}; steady {steady:.4f}")
    assert abs(first_q - steady) < 0.01 * abs(steady)
    assert abs(first_p - steady) > 0.05 * abs(steady)  # the plain start spins up from the odometry's 0
    # the path starts at the odometry's pose exactly
    assert np.allclose(q[0, 1:3], [START["x"], START["y"]], atol=1e-9)
    assert abs(quat_yaw(q[:1, 4:8])[0] - START["yaw"]) < 1e-6
    assert len(q) == len(run.odom) and np.array_equal(q[:, 0], run.odom["t"].to_numpy(float))


def test_the_path_is_a_rigid_motion_of_the_pre_rolled_replay():
    run = turning_run(3.0)
    rolled = get_simulator("ostrich", robot=ROBOT, initial_speed="wheels", preroll=1.0)
    q = rolled.rollout([run], ENGINE_THETA, 0.1)[0]
    raw = unwrap(rolled).rollout([preroll_run(run, 1.0)], ENGINE_THETA, 0.1)[0][1:]
    d = lambda p: np.hypot(*(p[:, 1:3] - p[0, 1:3]).T)  # noqa: E731
    assert np.allclose(d(q), d(raw), atol=1e-9)
    turn = np.unwrap(quat_yaw(q[:, 4:8])) - np.unwrap(quat_yaw(raw[:, 4:8]))
    assert np.ptp(turn) < 1e-6  # every heading turned by the same angle
    assert np.array_equal(q[:, 3], raw[:, 3])  # z untouched


def test_the_wheel_log_before_a_piece_and_a_whole_runs_first_speeds():
    run = turning_run(3.0)
    whole = preroll_run(run, 0.5)
    assert whole.odom["t"].iloc[0] == pytest.approx(-0.5) and len(whole.odom) == len(run.odom) + 1
    assert whole.wheel_cmd["t"].iloc[0] == pytest.approx(-0.5)
    assert whole.wheel_cmd[["left", "right", "rear"]].iloc[0].tolist() == pytest.approx([2.0, 4.0, 3.0])
    piece = run.slice(1.0, 3.0)
    piece.meta = {WHEELS_BEFORE: {"t": [0.2, 0.6, 0.9], "left": [9.0, 1.0, 5.0], "right": [8.0, 2.0, 6.0],
                                  "rear": [7.0, 3.0, 7.0]}}
    ext = preroll_run(piece, 0.5)
    w = ext.wheel_cmd
    assert w["t"].iloc[:3].tolist() == pytest.approx([0.5, 0.6, 0.9])
    assert w["left"].iloc[:3].tolist() == [9.0, 1.0, 5.0]  # held from the row before t0 - 0.5 s
    assert w["t"].iloc[3] == pytest.approx(1.0) and w["left"].iloc[3] == 2.0  # then the piece's own rows
    # kept rows that start later than the pre-roll: the earliest is held back
    early = preroll_run(piece, 2.0).wheel_cmd
    assert early["t"].iloc[0] == pytest.approx(-1.0) and early["left"].iloc[0] == 9.0


@pytest.mark.parametrize("name", ["kinematic", "ostrich"])
def test_jacobian_and_vjp_through_the_frame_match_central_differences(name):
    runs = [turning_run(3.0), stub_run("slalom", 3.0)]
    sim = get_simulator(name, robot=ROBOT, initial_speed="wheels", preroll=0.8)
    theta = {k: v for k, v in ENGINE_THETA.items() if k in sim.parameter_names}
    dt = 0.1 if name == "ostrich" else 0.02
    names = ["mu", "mu_lateral", "cmd_scale"]
    poses, jacs = sim.rollout_with_jacobian(runs, theta, dt, names)
    tol = 2e-5 if name == "kinematic" else 5e-3
    for i, n in enumerate(names):
        h = 1e-3 * max(1.0, abs(theta[n]))
        up = sim.rollout(runs, {**theta, n: theta[n] + h}, dt)
        dn = sim.rollout(runs, {**theta, n: theta[n] - h}, dt)
        fd = np.concatenate([(a[:, 1:8] - b[:, 1:8]) / (2 * h) for a, b in zip(up, dn, strict=True)])
        an = np.concatenate([j[:, :, i] for j in jacs])
        err = float(np.abs(fd - an).max() / np.abs(fd).max())
        print(f"\n{name} d pose / d {n}: largest error {err:.2e} of the largest entry {np.abs(fd).max():.3g}")
        assert err < tol
    rng = np.random.default_rng(1)
    cot = [rng.normal(size=(len(p), 7)) for p in poses]
    _, vjp = sim.rollout_with_vjp(runs, theta, dt, names)
    g = vjp(cot)
    gj = sum(np.einsum("tk,tkn->n", c, j) for c, j in zip(cot, jacs, strict=True))
    rel = float(np.linalg.norm(g - gj) / np.linalg.norm(gj))
    print(f"vjp {g} against the Jacobian contracted {gj}: relative difference {rel:.1e}")
    # the engine's adjoint and forward sensitivities solve the same linearisation to float32 tolerances
    assert rel < (1e-9 if name == "kinematic" else 5e-3)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1 s", True])
def test_bad_preroll_is_named(bad):
    with pytest.raises(SimulatorError, match="preroll"):
        get_simulator("kinematic", robot=ROBOT, preroll=bad)


def test_a_run_with_a_pallet_is_refused():
    run = turning_run(2.0)
    run.pallet = PalletPose(x=3.0, y=0.0, yaw=0.0)
    sim = get_simulator("kinematic", robot=ROBOT, preroll=1.0)
    with pytest.raises(SimulatorError, match="flat ground"):
        sim.rollout([run], {}, 0.02)


def test_the_baseline_gets_the_preroll(tmp_path):
    from sysid.app.config import FitConfig
    from sysid.app.fitting import baseline_simulator, make_simulator

    cfg = FitConfig.from_mapping({"simulator": {"name": "ostrich", "options": {"preroll": 1.5}}}, base_dir=tmp_path)
    for sim in (baseline_simulator(cfg, ROBOT), make_simulator(cfg, ROBOT)):
        assert isinstance(sim.inner, PreRoll) and sim.inner.seconds == 1.5
