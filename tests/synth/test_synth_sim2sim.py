"""Issue 13: `sysid synth --constant-friction` (one wheel friction for every run) and sim-to-sim
recovery through the engine with honest intervals.

Two recoveries:

1. **Same model class** (default suite, ~45 s): two short constant-friction runs of the synthetic
   design (the MuJoCo operator drives them; mu = 0.6 on every wheel, kp = 250, cmd_scale = 0.96;
   the climb before the turn) and one flat excitation run (`EXCITE`: traction-limited starts, a
   pivot, an arc) are replayed in the engine at those values (slip speed 0.08 m/s) and get the
   generator's odometry error (`sysid.synth.generate.odometry_error`: random-walk drift +
   Gauss-Markov jitter, default scale). The fit starts from the example's nominals (kp 250, mu 0.8,
   mu_lateral 0.5, slip_speed 0.1), calibrates cmd_scale on the design runs' cruise and carries
   the calibration into the fit as a prior on cmd_scale (N(value, its std)), so that its
   uncertainty reaches the other intervals. Measured 2026-12-04 over 7 noise draws (seeds 0-6,
   `test_sim_to_sim_over_noise_draws`, slow): every fit converged (ftol / xtol, 6-9 evaluations,
   27-37 s); errors mu -1.1..+1.5 % (within 5 %: 7 of 7), mu_lateral -5.9..+1.2 % (within 5 %: 6
   of 7), kp -15.1..+12.8 % (within 10 %: 5 of 7), cmd_scale within 0.1 %, slip_speed -12..+17 %;
   the 95 % intervals covered the truth in 30 of 35 cases (seed 4 misses kp, mu_lateral and
   cmd_scale, seed 5 mu_lateral, seed 2 slip_speed: the odometry error is correlated in time, so
   the intervals, though widened by the effective sample size, are a little optimistic). Seed 0
   (the default test): kp -3.9 % (95 % [198, 282]), mu -0.2 % ([0.588, 0.609]), mu_lateral +0.1 %
   ([0.572, 0.628]), cmd_scale -0.1 %, slip_speed -12 %, 8 evaluations. Without the excitation
   run (the design runs alone, 2026-12-03) mu was within 5 % in 2 of 7 draws and kp within 10 % in
   2 of 7: the slip speed's tyre compliance in series with the servo's let mu, kp and the slip
   speed trade off; a traction-limited start (acceleration mu g whatever the slip speed) and a
   pivot (the servos holding the wheels against lateral friction) tell them apart. With the solver
   defaults of issue 21's last change (residual in the energy metric, wheels on the semismooth rows)
   the same 7 draws give kp -15.3..+12.9 % (within 10 %: 5 of 7; seed 0 -5.7 %), mu -1.1..+1.2 %,
   intervals covering the truth in 31 of 35 cases.
   With the turn before the pallet the engine's loss has separate basins a few percent apart (the
   heading at the pallet decides how the wheels meet its edge) and LM from the nominals stops in
   one of them (converged, loss 4x the truth's, mu +31 %; its intervals still covered the truth).

2. **MuJoCo data, engine fit** (slow): `sysid synth --preset sample --constant-friction 0.6
   --noise-seed N` and examples/fit.yaml's fit, as shipped (`test_mujoco_data_engine_fit`) and matched
   to the generator's model class (`test_mujoco_data_model_matched_fit`: friction_combine max, the
   pallet's own friction free, the PI servo). With the generator's ellipsoid wheels the fits replay the
   runs to a few centimetres and generalise, but to effective values away from the generator's: the
   lateral friction at a third to two thirds of the truth on every draw, ki at a fifth to a half (figures:
   docs/results.md, "Sim-to-sim recovery through the engine").

3. **MuJoCo data, a design for the check** (slow; `test_mujoco_design_fit`): a P servo, a stiff contact,
   the two slow crossings and a flat excitation run driven by explicit wheel targets in MuJoCo, fitted at
   h = 0.01 s with the recipe matched to the generator. The held-out run replays to 1.5-2.7 cm, but the
   issue's tolerances do not hold over noise draws: MuJoCo's sliding wheels transmit less than mu N
   (`test_mujoco_launch_transmits_less_than_mu`), its robot turns a few degrees less than the engine's at
   the same values, and nothing in these runs sets the pallet's friction.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ingest.run import PalletPose, Run
from sysid.app.config import FitConfig
from sysid.app.results import FitResults
from sysid.fit import calibrate, optimize
from sysid.fit.metrics import quat_yaw
from sysid.fit.optimizer import FitResult
from sysid.fit.params import Parameter, ParameterSet, Prior, default_parameters
from sysid.synth import (
    DesignOptions,
    MjcfOptions,
    OdomNoise,
    design_runs,
    generate_dataset,
    load_robot,
    make_run,
    simulate_run,
)
from sysid.synth.cli import SAMPLE_LIDAR
from sysid.synth.cli import main as synth_main
from sysid.synth.generate import LidarConfig, SensorConfig, constant_friction, odometry_error
from tests.helpers.fit_doubles import odom_stub

MU = 0.6
TRUTH = {"kp": 250.0, "mu": MU, "mu_lateral": MU, "cmd_scale": 0.96, "chassis_mass": 88.0, "slip_speed": 0.08}
DT = 0.1  # [s] engine timestep
ODOM_RATE = 20.0  # [Hz]
RUNS = ((0.8, 90.0), (1.4, -60.0))  # (speed [m/s], heading change [deg]) of the two short runs


# -- the constant-friction option -------------------------------------------------------------


def test_constant_friction_design_keeps_the_rest_of_the_design():
    base = design_runs(0)
    const = design_runs(0, DesignOptions(constant_friction=MU, constant_torsional=0.01))
    assert constant_friction(base) is None
    assert constant_friction(const) == MU
    assert len({(s.contact.mu_wheel, s.contact.mu_rear) for s in base}) == len(base)  # per run by default
    for a, b in zip(base, const, strict=True):
        assert (b.contact.mu_wheel, b.contact.mu_rear, b.contact.torsional) == (MU, MU, 0.01)
        # the random streams stay aligned: same speeds, turns, pallets, offsets
        assert (a.speed, a.turn_before, a.turn_after, a.pallet, a.lateral_offset, a.split, a.role) == (
            b.speed, b.turn_before, b.turn_after, b.pallet, b.lateral_offset, b.split, b.role)


def test_constant_friction_reaches_the_manifest(tmp_path):
    m = generate_dataset(tmp_path / "ds", design=DesignOptions(constant_friction=MU), runs=["run_13"],
                         sensors=SensorConfig(lidar=LidarConfig(**SAMPLE_LIDAR)), progress=False)
    assert m["truth"]["mu"] == m["truth"]["mu_lateral"] == MU
    # the PI servo and the surfaces, under the names of sysid's parameters (friction_combine: max)
    assert (m["truth"]["kp"], m["truth"]["ki"], m["truth"]["mu_pallet"], m["truth"]["mu_ground"]) == (
        250.0, 1250.0, 1.6, 0.3)
    assert f"mu = {MU}" in m["truth_note"] and "friction_combine: max" in m["truth_note"]
    c = m["runs"][0]["true_params"]["contact"]
    assert c["mu_wheel"] == c["mu_rear"] == MU and c["torsional"] == 0.0
    on_disk = yaml.safe_load((tmp_path / "ds" / "manifest.yaml").read_text())
    assert on_disk["truth"]["mu"] == MU


def _odom_and_commands(bag: Path) -> tuple[np.ndarray, np.ndarray]:
    """(x, y of /local_odom, the /wheel_cmd velocities) of a generated bag."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    odom, cmd = [], []
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as reader:
        for conn, _t, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            if conn.topic == "/local_odom":
                odom.append((msg.pose.pose.position.x, msg.pose.pose.position.y))
            elif conn.topic == "/wheel_cmd":
                cmd.append(list(msg.velocity))
    return np.array(odom), np.array(cmd)


def test_noise_seed_draws_new_noise_over_the_same_runs(tmp_path):
    """`--noise-seed` (sim-to-sim over noise draws): same commands and trajectory, other odometry noise."""
    sensors = SensorConfig(lidar=LidarConfig(**SAMPLE_LIDAR))
    out = {}
    for noise_seed in (0, 3):
        m = generate_dataset(tmp_path / f"n{noise_seed}", design=DesignOptions(constant_friction=MU), runs=["run_13"],
                             sensors=replace(sensors, noise_seed=noise_seed), progress=False)
        out[noise_seed] = (m, _odom_and_commands(tmp_path / f"n{noise_seed}" / "run_13"))
    (m0, (odom0, cmd0)), (m3, (odom3, cmd3)) = out[0], out[3]
    assert "noise_seed" not in m0["sensors"] and m3["sensors"]["noise_seed"] == 3
    assert np.array_equal(cmd0, cmd3) and len(cmd0) > 100
    def trajectory(m: dict) -> tuple:  # the MuJoCo trajectory's facts (bar the lidar's random dropout)
        r = m["runs"][0]
        return r["segments"], r["duration"], {k: v for k, v in r["measured"].items() if "lidar" not in k}

    assert trajectory(m0) == trajectory(m3)
    diff = np.abs(odom0 - odom3).max(axis=1)
    assert diff[0] == 0.0 and 1e-3 < diff.max() < 0.5  # exact at the start, then another noise draw
    assert synth_main(["--robot", "husky", "--noise-seed", "2", "-o", str(tmp_path / "h")]) == 2


def test_synth_cli_constant_friction(capsys):
    assert synth_main(["--list", "--constant-friction", "0.7", "--torsional", "0.02"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 14 and all("mu 0.70/0.70" in line for line in lines)
    assert synth_main(["--list", "--torsional", "0.02"]) == 2
    assert "--constant-friction" in capsys.readouterr().err
    assert synth_main(["--list", "--constant-friction", "-1"]) == 2
    assert synth_main(["--list", "--constant-friction", "0.7", "--torsional", "0.5"]) == 2


# -- sim-to-sim through the engine --------------------------------------------------------------


def engine_runs(sim, seed: int = 0) -> list[Run]:
    """The design's constant-friction runs (commands from the MuJoCo operator), replayed in the
    engine at TRUTH, with the generator's odometry error at 20 Hz."""
    opts = DesignOptions(constant_friction=MU)
    robot = load_robot()
    runs = []
    for i, (speed, heading) in enumerate(RUNS):
        spec = make_run(i, 100 + i, speed, heading, np.random.default_rng(i), opts, split="train",
                        turn_before=0.0, turn_after=math.radians(heading))
        # the operator's commands as the figures above were measured: driving the tyre-wheeled MuJoCo robot
        traj = simulate_run(spec, robot, options=MjcfOptions(wheel_shape="tyre"))
        cmd = pd.DataFrame({"t": traj.t, "left": traj.cmd[:, 0], "right": traj.cmd[:, 1], "rear": traj.cmd[:, 2]})
        p = spec.pallet
        pallet = PalletPose(p.x, p.y, p.yaw, p.size)
        odom = engine_odometry(sim, spec.name, traj.t[:: int(round(100 / ODOM_RATE))], cmd, pallet,
                               np.random.default_rng([seed, i]))
        runs.append(Run(spec.name, odom, cmd, pallet=pallet, segments=dict(traj.segments)))
    return runs


def engine_odometry(sim, name: str, t: np.ndarray, cmd: pd.DataFrame, pallet: PalletPose | None,
                    rng: np.random.Generator) -> pd.DataFrame:
    """The odometry at times ``t`` of the commands ``cmd`` replayed in the engine at TRUTH (from the
    origin), with the generator's odometry error drawn from ``rng`` (z relative to the start)."""
    zero = np.zeros_like(t)
    stub = pd.DataFrame({"t": t, "x": zero, "y": zero, "z": zero, "qx": zero, "qy": zero, "qz": zero,
                         "qw": zero + 1, "yaw": zero, "pitch": zero, "roll": zero})
    pose = sim.rollout([Run(name, stub, cmd, pallet=pallet)], TRUTH, DT)[0]
    assert sim.last_status["residual_max"] < 1e-2
    err = odometry_error(len(t), ODOM_RATE, OdomNoise(), rng)
    xyz = pose[:, 1:4] + err[:, :3]
    yaw = quat_yaw(pose[:, 4:8]) + err[:, 3]
    return stub.assign(x=xyz[:, 0], y=xyz[:, 1], z=xyz[:, 2] - xyz[0, 2], qz=np.sin(yaw / 2), qw=np.cos(yaw / 2),
                       yaw=yaw)


# The excitation run (flat ground, 9 s; left / right wheel targets [rad/s], rear their mean): from
# rest a step to 6 rad/s (2.2 m/s, the wheels spin up faster than friction can follow: the
# acceleration is mu g, which sets mu apart from the slip speed), down to 1, a step back to 6, a pivot
# on the spot (-2.5 / 2.5: the servos hold the wheels against the lateral friction, kp), an arc
# (4 / 1), a stop. The design runs alone, at a slip speed's tyre compliance in series with the
# servo's, leave mu and kp to trade off (module docstring).
EXCITE = ((0.0, 0.5, 0.0, 0.0), (0.5, 2.0, 6.0, 6.0), (2.0, 3.0, 1.0, 1.0), (3.0, 4.5, 6.0, 6.0),
          (4.5, 6.0, -2.5, 2.5), (6.0, 7.5, 4.0, 1.0), (7.5, 9.0, 0.0, 0.0))  # (from, to [s], left, right)


def excite_run(sim, seed: int = 0) -> Run:
    """The excitation run replayed in the engine at TRUTH, with the generator's odometry error."""
    t_cmd = np.arange(0.0, EXCITE[-1][1], 0.01)
    left, right = np.zeros_like(t_cmd), np.zeros_like(t_cmd)
    for a, b, wl, wr in EXCITE:
        on = (t_cmd >= a) & (t_cmd < b)
        left[on], right[on] = wl, wr
    cmd = pd.DataFrame({"t": t_cmd, "left": left, "right": right, "rear": (left + right) / 2})
    t = np.arange(0.0, EXCITE[-1][1] - 1e-9, 1.0 / ODOM_RATE)
    return Run("excite", engine_odometry(sim, "excite", t, cmd, None, np.random.default_rng([seed, len(RUNS)])), cmd)


def fit_sim_to_sim(sim, seed: int = 0):
    runs = engine_runs(sim, seed)
    assert all(r.odom["z"].max() > 0.12 for r in runs)  # both climb the pallet
    ps = ParameterSet([*default_parameters(), Parameter(name="slip_speed", nominal=0.1, lower=0.005, upper=1.0)])
    cal = calibrate(sim, runs, ps, DT)  # on the design runs' cruise
    runs.append(excite_run(sim, seed))
    # the calibration goes on as a prior: its uncertainty reaches every interval
    ps["cmd_scale"].value = cal.value
    ps["cmd_scale"].prior = Prior(cal.value, cal.fit.std["cmd_scale"])
    res = optimize(sim, runs, ps, DT, max_iter=40)
    print(f"\nsim-to-sim, seed {seed} ({res.message}; {res.wall_time:.0f} s; loss "
          f"{res.loss_initial:.3g} -> {res.loss_final:.3g} m^2):")
    for n in res.names:
        lo, hi = res.intervals[n]
        v = res.params[n].value
        print(f"  {n:11s} {v:9.4f} ({(v / TRUTH[n] - 1) * 100:+5.1f} %)  95 % [{lo:.4g}, {hi:.4g}]  truth {TRUTH[n]}")
    return res


def _covered(res) -> dict[str, bool]:
    return {n: res.intervals[n][0] <= TRUTH[n] <= res.intervals[n][1] for n in res.names}


@pytest.fixture(scope="module")
def recovered():
    from sysid.simulators.ostrich import OstrichReplay

    return fit_sim_to_sim(OstrichReplay(), seed=0)


def test_sim_to_sim_converges(recovered):
    assert recovered.success, recovered.message
    assert recovered.convergence != "budget" and recovered.iterations < 40


def test_sim_to_sim_intervals_cover_the_truth(recovered):
    covered = _covered(recovered)
    assert set(covered) == {"kp", "mu", "mu_lateral", "cmd_scale", "slip_speed"}
    assert all(covered.values()), {n: recovered.intervals[n] for n, ok in covered.items() if not ok}


def test_sim_to_sim_recovers_lateral_friction_and_scale(recovered):
    assert recovered.params["mu_lateral"].value == pytest.approx(MU, rel=0.10)
    assert recovered.params["cmd_scale"].value == pytest.approx(TRUTH["cmd_scale"], rel=3e-3)


def test_sim_to_sim_to_the_issue_tolerance(recovered):
    """Friction within 5 %, the servo gain within 10 % (seed 0: mu -0.3 %, mu_lateral +0.2 %, kp -5.7 %)."""
    assert recovered.params["mu"].value == pytest.approx(MU, rel=0.05)
    assert recovered.params["mu_lateral"].value == pytest.approx(MU, rel=0.05)
    assert recovered.params["kp"].value == pytest.approx(TRUTH["kp"], rel=0.10)


@pytest.mark.slow
def test_sim_to_sim_over_noise_draws():
    """Seeds 0-6 (~4 min): every fit converges, the intervals cover the truth in >= 85 % of the
    35 parameter-draw cases (measured 30 / 35), mu within 5 % on every draw (measured <= 1.5 %),
    mu_lateral within 10 % (<= 5.9 %) and kp within 10 % on at least 5 of 7 (-15.1 .. +12.8 %)."""
    from sysid.simulators.ostrich import OstrichReplay

    sim = OstrichReplay()
    results = [fit_sim_to_sim(sim, seed) for seed in range(7)]
    assert all(r.success for r in results)
    covered = [ok for r in results for ok in _covered(r).values()]
    print(f"\ncovered {sum(covered)} of {len(covered)}")
    assert sum(covered) >= 0.85 * len(covered)
    assert all(abs(r.params["mu"].value / MU - 1) < 0.05 for r in results)
    assert all(abs(r.params["mu_lateral"].value / MU - 1) < 0.10 for r in results)
    assert sum(abs(r.params["kp"].value / TRUTH["kp"] - 1) < 0.10 for r in results) >= 5


# A traction-limited launch on flat ground for MuJoCo: the three wheel targets ramp from rest to 6 rad/s
# (2.07 m/s at cmd_scale 0.96) in 0.15 s, faster than friction lets the robot follow (mu g = 5.9 m/s^2),
# without a step's spin-up torque spike, which makes the MuJoCo robot hop. (from [s], wheel target [rad/s])
LAUNCH = ((0.0, 0.0), (0.5, 0.0), (0.65, 6.0), (2.5, 6.0))


def _launch_gap(solref: tuple[float, float], solimp: tuple[float, float, float], timestep: float,
                mus: tuple[float, ...]) -> tuple[float, list[float]]:
    """MuJoCo's launch (P servo kp 250, wheels mu 0.6) and the engine's replay of its commands at each of
    ``mus`` (h = 0.01 s, slip speed 0.003 m/s): (MuJoCo's x at the end [m], engine minus MuJoCo there [m])."""
    from sysid.fit.evaluation import simulate
    from sysid.simulators.ostrich import OstrichReplay
    from sysid.synth import ContactParams, ServoParams, replay_commands

    knots = np.array(LAUNCH)
    t = np.arange(0.0, knots[-1, 0], 0.01)
    w = np.interp(t, knots[:, 0], knots[:, 1])
    contact = ContactParams(mu_wheel=MU, mu_rear=MU, torsional=0.0, solref=solref, solimp=solimp)
    q = replay_commands(np.stack([w, w, w], 1), contact, ServoParams(ki=0.0), timestep=timestep)
    k = np.arange(0, len(t), 5)  # odometry at 20 Hz
    odom = odom_stub(t[k]).assign(x=q[k, 0], y=q[k, 1], z=q[k, 2] - q[0, 2])
    run = Run("launch", odom, pd.DataFrame({"t": t, "left": w, "right": w, "rear": w}))
    sim = OstrichReplay(friction_combine="max")
    gaps = []
    for mu in mus:
        theta = {"kp": 250.0, "mu": mu, "mu_lateral": MU, "mu_ground": 0.0, "mu_pallet": 1.6, "slip_speed": 0.003,
                 "cmd_scale": 0.96}
        gaps.append(float(simulate(sim, [run], theta, 0.01)[0][-1, 1] - odom["x"].iloc[-1]))
    return float(odom["x"].iloc[-1]), gaps


@pytest.mark.slow
def test_mujoco_launch_transmits_less_than_mu() -> None:
    """Where a wheel slides, MuJoCo's soft contact transmits less than mu N: its traction-limited launch at
    mu 0.6 (the generator's contact, solref (0.01, 1)) ends ~3 cm behind the engine's at mu 0.6, which
    matches it at mu ~0.555 (measured: +0.029 m at 0.6, +0.011 at 0.57, -0.009 at 0.54), so a fit of
    MuJoCo launches finds mu ~7 % low. A stiff contact (solref (0.002, 1), solimp 0.99, timestep 0.2 ms)
    narrows the gap (+0.018 m at 0.6, 0.000 at 0.57: mu 5 % low); no MuJoCo setting tried (impratio,
    noslip iterations, pyramidal cone, condim 3, wheel shape, integrator) closes it."""
    x, (g60, g57, g54) = _launch_gap((0.01, 1.0), (0.9, 0.95, 0.001), 1e-3, (0.6, 0.57, 0.54))
    assert x > 3.5  # it launched: 2 s at ~2 m/s
    assert 0.02 < g60 < 0.045 and g57 > 0.0 > g54, (g60, g57, g54)  # the engine matches at 0.54 < mu < 0.57
    _, (h60,) = _launch_gap((0.002, 1.0), (0.99, 0.999, 0.001), 2e-4, (0.6,))
    assert 0.008 < h60 < 0.8 * g60, (h60, g60)


# The flat excitation run for MuJoCo (20.2 s; (time [s], left, right wheel target [rad/s]), linear in
# between, rear their mean): three traction-limited launches from rest and one from 1 rad/s (targets
# ramped in 0.15 s: mu sets the acceleration), slow stops (braking above ~3.4 m/s^2 tips this robot
# forward over its front wheels: its centre of mass is 0.12 m behind the front axle, at axle height, and
# MuJoCo's robot flips), pivots on the spot both ways (-2.5 / 2.5: the lateral friction against the
# servos, kp), arcs both ways (4 / 1, 1 / 4).
MUJOCO_EXCITE = ((0.0, 0, 0), (0.5, 0, 0), (0.65, 6, 6), (1.8, 6, 6), (3.0, 0, 0), (3.4, 0, 0),
                 (3.55, 6, 6), (4.7, 6, 6), (5.5, 1, 1), (6.0, 1, 1), (6.15, 6, 6), (7.2, 6, 6), (8.4, 0, 0),
                 (8.8, 0, 0), (8.95, 6, 6), (10.1, 6, 6), (11.3, 0, 0), (11.7, 0, 0),
                 (12.0, -2.5, 2.5), (13.5, -2.5, 2.5), (13.8, 0, 0), (14.1, 2.5, -2.5), (15.6, 2.5, -2.5),
                 (15.9, 0, 0), (16.2, 4, 1), (17.4, 4, 1), (17.7, 1, 4), (18.9, 1, 4), (19.7, 0, 0), (20.2, 0, 0))
# The check's design, stated: the generator's servo without its integral term (a P servo, kp 250: with
# ki 1250 steady servo errors vanish and kp shows only in transients), its contact stiff (the launch
# closest to the engine's, `test_mujoco_launch_transmits_less_than_mu`; no rebound at the slow
# crossings), the two slow crossings of the sample's training runs (run_13's 2 m/s crossing, where
# MuJoCo's contact rebounds and the engine's does not, left out) and the excitation run for training,
# run_10 held out; the engine at h = 0.01 s (backward Euler leads a launch by v h / 2).
DESIGN_SOLREF = (0.002, 1.0)  # MuJoCo contact (time constant [s], damping ratio)
DESIGN_SOLIMP = (0.99, 0.999, 0.001)
DESIGN_TIMESTEP = 2e-4  # [s] MuJoCo's, for the stiff contact
DESIGN_TRAIN = ("run_06", "run_07")


def mujoco_design_runs(noise_seed: int) -> tuple[list[Run], Run]:
    """(training runs, held-out run_10) of the design above, simulated in MuJoCo at wheels mu 0.6 (pallet
    1.6 by max), with the generator's odometry error drawn from ``noise_seed``."""
    from ingest.transforms import quat_yaw as yaw_xyzw
    from sysid.synth import ServoParams, replay_commands

    servo = ServoParams(ki=0.0)
    specs = {s.name: s for s in design_runs(0, DesignOptions(constant_friction=MU, servo=servo))}
    robot = load_robot()

    def to_run(name: str, t: np.ndarray, qpos: np.ndarray, cmd: np.ndarray, seed: int, pallet: PalletPose | None,
               segments: dict[str, tuple[float, float]]) -> Run:
        k = np.arange(0, len(t), int(round(100 / ODOM_RATE)))
        err = odometry_error(len(k), ODOM_RATE, OdomNoise(), np.random.default_rng([noise_seed, seed]))
        xyz = qpos[k, :3] + err[:, :3]
        yaw = yaw_xyzw(qpos[k][:, [4, 5, 6, 3]]) + err[:, 3]
        zero = np.zeros(len(k))
        odom = pd.DataFrame({"t": t[k], "x": xyz[:, 0], "y": xyz[:, 1], "z": xyz[:, 2] - xyz[0, 2], "qx": zero,
                             "qy": zero, "qz": np.sin(yaw / 2), "qw": np.cos(yaw / 2), "yaw": yaw, "pitch": zero,
                             "roll": zero})
        wheels = pd.DataFrame({"t": t, "left": cmd[:, 0], "right": cmd[:, 1], "rear": cmd[:, 2]})
        return Run(name, odom, wheels, pallet=pallet, segments=segments)

    runs = {}
    for name in (*DESIGN_TRAIN, "run_10"):
        spec = specs[name]
        spec = replace(spec, contact=replace(spec.contact, solref=DESIGN_SOLREF, solimp=DESIGN_SOLIMP))
        traj = simulate_run(spec, robot, timestep=DESIGN_TIMESTEP)
        p = spec.pallet
        runs[name] = to_run(name, traj.t, traj.qpos, traj.cmd, spec.seed, PalletPose(p.x, p.y, p.yaw, p.size),
                            dict(traj.segments))
    knots = np.array(MUJOCO_EXCITE, float)
    t = np.arange(0.0, knots[-1, 0], 0.01)
    left, right = np.interp(t, knots[:, 0], knots[:, 1]), np.interp(t, knots[:, 0], knots[:, 2])
    cmd = np.stack([left, right, (left + right) / 2], 1)
    contact = replace(specs["run_06"].contact, solref=DESIGN_SOLREF, solimp=DESIGN_SOLIMP)
    excite = to_run("excite", t, replay_commands(cmd, contact, servo, robot=robot, timestep=DESIGN_TIMESTEP), cmd,
                    1001, None, {})
    return [*(runs[n] for n in DESIGN_TRAIN), excite], runs["run_10"]


def fit_mujoco_design(noise_seed: int, dt: float = 0.01) -> tuple[FitResult, list[float]]:
    """The design's fit, matched to the generator (friction by max, mu_ground frozen at 0, mu_pallet free,
    a P servo) with no priors: kp, mu, mu_lateral, mu_pallet and the slip speed free from off-truth
    starts (kp 400, mu 0.8, mu_lateral 0.5, mu_pallet 1.0; the slip speed from 0.003 m/s, near MuJoCo's
    creep), cmd_scale calibrated on the crossings' cruise and carried in as a prior.
    (result, held-out run_10's mean xy [m] at the identified values and at the start values)."""
    from sysid.fit.evaluation import evaluate
    from sysid.simulators.ostrich import OstrichReplay

    runs, held = mujoco_design_runs(noise_seed)
    sim = OstrichReplay(friction_combine="max")
    ps = ParameterSet([
        Parameter("kp", 400.0, 10.0, 5000.0), Parameter("mu", 0.8, 0.05, 2.0), Parameter("mu_lateral", 0.5, 0.05, 3.0),
        Parameter("cmd_scale", 1.0, 0.5, 1.5), Parameter("chassis_mass", 88.0, 40.0, 200.0, frozen=True),
        Parameter("slip_speed", 0.003, 0.0005, 1.0), Parameter("mu_ground", 0.0, 0.0, 3.0, frozen=True),
        Parameter("mu_pallet", 1.0, 0.05, 3.0)])
    cal = calibrate(sim, [r for r in runs if r.segments], ps, dt)
    ps["cmd_scale"].value = cal.value
    ps["cmd_scale"].prior = Prior(cal.value, cal.fit.std["cmd_scale"])
    start = {n: ps[n].value for n in ps.names}
    res = optimize(sim, runs, ps, dt, max_iter=40)
    held_xy = [float(evaluate(sim, [held], th, dt)[0][0]["mean_xy"])
               for th in ({n: res.params[n].value for n in ps.names}, start)]
    truth = {"kp": 250.0, "mu": MU, "mu_lateral": MU, "mu_pallet": 1.6, "cmd_scale": 0.96}
    print(f"\nMuJoCo design -> engine, noise seed {noise_seed}, h = {dt} s ({res.message}; {res.wall_time:.0f} s; "
          f"loss {res.loss_initial:.3g} -> {res.loss_final:.3g} m^2; held-out run_10 {held_xy[0]:.3f} m, "
          f"start {held_xy[1]:.3f} m):")
    for n in res.names:
        lo, hi = res.intervals[n]
        v = res.params[n].value
        err = f"({(v / truth[n] - 1) * 100:+5.1f} %)" if n in truth else ""
        print(f"  {n:11s} {v:9.4f} {err}  95 % [{lo:.4g}, {hi:.4g}]")
    return res, held_xy


@pytest.mark.slow
@pytest.mark.parametrize("noise_seed", [1, 2])
def test_mujoco_design_fit(noise_seed: int) -> None:
    """The check's design (P servo, stiff contact, two slow crossings and the excitation run; h = 0.01 s;
    ~4 min a draw). Over noise draws 1-5 (docs/results.md, "Sim-to-sim recovery through the engine") every
    fit converges, the loss falls 220-2200x, cmd_scale lands within 0.5 % and the held-out run replays to
    0.015-0.027 m mean xy (0.53-0.56 m at the start values), but the issue's tolerances do not hold: mu
    -18..+2 % (within 5 % on 2 draws), kp +6..+45 % and mu_lateral +3..+42 %, moving together (the
    pivots and arcs pin their ratio), and mu_pallet undetermined (the slow climbs take the same time at a
    pallet friction of 0.6 as at 1.6). Asserted: what held on every draw, and on these two draws (measured
    kp +10.1 / +6.4 %, mu -6.6 / +1.9 %, mu_lateral +10.2 / +6.4 %) kp and mu_lateral within 11 %, mu
    within 7 %."""
    res, (held, start) = fit_mujoco_design(noise_seed)
    v = {n: res.params[n].value for n in res.names}
    assert res.success and res.convergence != "budget", res.message
    assert res.loss_final < res.loss_initial / 200
    assert v["cmd_scale"] == pytest.approx(0.96, rel=5e-3)
    assert held < min(0.05, 0.1 * start), (held, start)
    assert v["kp"] == pytest.approx(250.0, rel=0.11) and v["mu_lateral"] == pytest.approx(MU, rel=0.11), v
    assert v["mu"] == pytest.approx(MU, rel=0.07), v


def example_fit(tmp_path: Path, noise_seed: int, matched: bool) -> tuple[FitResults, FitConfig]:
    """`sysid synth --preset sample --constant-friction 0.6 --noise-seed N`, then examples/fit.yaml's fit of
    it (no sweep): as shipped, or ``matched`` to the generator's model class (the surfaces' friction by
    the larger of the two, MuJoCo's rule, with the pallet's own friction free; the ground's, below the
    wheels', frozen at 0; the PI servo's kp and ki free as in the example). (results document, config)."""
    from sysid.app.pipeline import run_fit

    out = tmp_path / f"cf{noise_seed}"
    assert synth_main(["--preset", "sample", "--constant-friction", str(MU), "--noise-seed", str(noise_seed),
                       "--out", str(out), "--quiet"]) == 0
    root = Path(__file__).resolve().parents[2]
    example = yaml.safe_load((root / "examples" / "fit.yaml").read_text())
    example["data"]["manifest"] = str(out / "manifest.yaml")
    example["data"]["ingest"]["cache"] = False
    example["robot"] = str(root / "models" / "helhest" / "robot.yaml")
    example["sweep"] = False
    if matched:
        example["simulator"]["options"]["friction_combine"] = "max"
        example["parameters"]["mu_ground"] = {"nominal": 0.0, "bounds": [0.0, 3.0], "frozen": True}
        example["parameters"]["mu_pallet"] = {"nominal": 1.0, "bounds": [0.05, 3.0]}
    cfg = FitConfig.from_mapping(example, base_dir=tmp_path)
    doc = run_fit(cfg, progress=False, write=False)
    rows = {r["name"]: r for r in doc["parameters"]}
    variant = "matched" if matched else "shipped"
    print(f"\nMuJoCo -> engine, noise seed {noise_seed}, {variant}: {doc['fit']['message']}")
    for n in ("kp", "ki", "mu", "mu_lateral", "mu_pallet", "cmd_scale", "slip_speed"):
        if n in rows and not rows[n]["frozen"]:
            print(f"  {n:11s} {rows[n]['value']:.4g}  95 % {rows[n]['ci95']}  truth {cfg.truth.get(n)}")
    return doc, cfg


@pytest.mark.slow
def test_mujoco_data_engine_fit(tmp_path: Path) -> None:
    """The example's fit as shipped on the constant-friction sample (noise seed 0; ~1.5 min): converged,
    kp's interval covers the truth, the held-out run replayed below its starting values, and the lateral
    friction identified well below the generator's (on draws 1-5: -33..-68 %; docs/results.md)."""
    doc, cfg = example_fit(tmp_path, 0, matched=False)
    rows = {r["name"]: r for r in doc["parameters"]}
    assert (cfg.truth["mu"], cfg.truth["mu_lateral"], cfg.truth["kp"]) == (MU, MU, 250.0)  # from the manifest
    assert doc["fit"]["converged"], doc["fit"]["message"]
    lo, hi = rows["kp"]["ci95"]
    assert lo <= cfg.truth["kp"] <= hi, (lo, hi)
    assert rows["mu_lateral"]["value"] < 0.8 * MU, rows["mu_lateral"]
    held = doc["generalisation"]["held_out"]["runs"][0]
    assert held["model"]["mean_xy"] < 0.5 * held["start"]["mean_xy"], held


@pytest.mark.slow
@pytest.mark.parametrize("noise_seed", [1, 2])
def test_mujoco_data_model_matched_fit(tmp_path: Path, noise_seed: int) -> None:
    """The example's fit matched to the generator's model class (friction_combine max, mu_pallet free) on
    two noise draws of the constant-friction sample (~2-6 min each). Over draws 1-5 (docs/results.md,
    "Sim-to-sim recovery through the engine") the loss falls 27-44x (draw 1 spends the 40-evaluation
    budget, the others converge in 7-15) to kp -26..+84 %, ki -56..-74 %, mu -10..+55 %, mu_lateral
    -51..-67 %, mu_pallet 0.17-0.84 (below mu on 4 draws), cmd_scale within 0.3 %:
    none of the issue's tolerances (ground friction 5 %, pallet 10 %, servo gain 10 %) holds on every
    draw. What holds and is asserted: the loss's fall, cmd_scale within 0.5 %, kp's interval covering the
    truth on these two draws, the held-out run at a few centimetres (mean xy 0.024-0.046 m), below the
    starting values and the kinematic baseline (0.33 and 0.08 m), and the two measured gaps: the lateral
    friction's interval ends below the truth on every draw, and the engine at the generator's truth (kp,
    ki, mu, mu_lateral, mu_pallet; slip speed and cmd_scale as identified) replays the training runs
    worse than at the identified values (mean combined error 0.16 and 0.62 against 0.05 and 0.07 m on
    draws 1 and 2), so the truth is not the engine's best fit to these data."""
    from sysid.app.config import validate_static
    from sysid.app.fitting import accepted_parameters
    from sysid.app.runs import load_runs
    from sysid.fit.evaluation import evaluate

    doc, cfg = example_fit(tmp_path, noise_seed, matched=True)
    rows = {r["name"]: r for r in doc["parameters"]}
    assert cfg.simulator.options["friction_combine"] == "max" and cfg.truth["mu_pallet"] == 1.6
    assert doc["fit"]["loss_final"] < 0.1 * doc["fit"]["loss_initial"], doc["fit"]["message"]
    assert rows["cmd_scale"]["value"] == pytest.approx(0.96, rel=5e-3)
    lo, hi = rows["kp"]["ci95"]
    assert lo <= cfg.truth["kp"] <= hi, (lo, hi)
    assert rows["mu_lateral"]["ci95"][1] < cfg.truth["mu_lateral"], rows["mu_lateral"]
    held = doc["generalisation"]["held_out"]["runs"][0]
    assert held["model"]["mean_xy"] < min(0.1, held["start"]["mean_xy"], held["baseline"]["mean_xy"]), held

    robot = cfg.load_robot()
    sim, accepted = accepted_parameters(cfg, robot)
    _, train, _ = validate_static(cfg, accepted, robot)
    runs = load_runs(cfg, list(train), "runs", False)
    identified = {n: r["value"] for n, r in rows.items()}
    truth = {**identified, **{n: cfg.truth[n] for n in ("kp", "ki", "mu", "mu_lateral", "mu_pallet")}}
    err = {lab: float(np.mean([m["combined"] for m in evaluate(sim, runs, th, cfg.fit.dt)[0]]))
           for lab, th in (("identified", identified), ("truth", truth))}
    print(f"  training runs' mean combined error [m]: {err}")
    assert err["identified"] == pytest.approx(np.mean(list(doc["fit"]["train_errors_final"].values())), rel=1e-3)
    assert err["truth"] > 2.0 * err["identified"], err
