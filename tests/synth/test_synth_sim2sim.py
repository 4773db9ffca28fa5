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
