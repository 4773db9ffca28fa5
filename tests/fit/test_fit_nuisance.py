"""Per-run nuisance parameters (``fit.nuisance``): an initial forward-velocity error ``v0``
[m/s], an initial yaw-rate error ``w0`` [rad/s] and a clock offset ``clock_offset`` [s] of each
run's wheel log, fitted per training run beside the shared physical parameters and never written
to the parameter file.

Engine replay (sysid.simulators.ostrich.OstrichReplay), regularised wheel friction (slip_speed 0.1 m/s),
h = 0.1 s, flat ground.
"""

from __future__ import annotations

import numpy as np
import pytest

from ingest.run import Run
from sysid.errors import ConfigError
from sysid.fit import FitOptions, optimize
from sysid.fit.params import Parameter, ParameterSet
from sysid.simulators.kinematic import KinematicSkidSteer
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import ENGINE_THETA, odom_from_pose, stub_run  # noqa: E402

DT = 0.1  # [s]
THETA = ENGINE_THETA


def test_clock_offset_is_a_per_run_delay_and_v0_moves_the_start():
    """Run 0 replayed with clock_offset 0.3 s equals it replayed with cmd_delay 0.3 s (one world,
    to float32 round-off), while run 1 of the same call keeps no offset (equal to its replay
    alone). A standing robot (zero commands) given v0 = 0.5 m/s rolls forward and stops: under
    servo braking the wheels brake it over about v0^2 / (2 mu g) (0.02 m at mu 0.6) to a few cm,
    so it ends ahead of the start, x in (5 mm, 0.25 m), and no further sideways than 1 mm."""
    sim = OstrichReplay()
    runs = [stub_run("turn", 4.0), stub_run("slalom", 4.0, seed=1)]
    both = sim.rollout(runs, THETA, DT, nuisance=[{"clock_offset": 0.3}, {}])
    delayed = sim.rollout(runs[:1], {**THETA, "cmd_delay": 0.3}, DT)[0]
    alone = sim.rollout(runs[1:], THETA, DT)[0]
    print(f"clock_offset vs cmd_delay: max |diff| {np.abs(both[0][:, 1:] - delayed[:, 1:]).max():.2e}; "
          f"other run vs alone {np.abs(both[1][:, 1:] - alone[:, 1:]).max():.2e}")
    assert np.abs(both[0][:, 1:] - delayed[:, 1:]).max() < 1e-5
    assert np.abs(both[1][:, 1:] - alone[:, 1:]).max() < 1e-5
    standing = stub_run("turn", 3.0)
    standing.wheel_cmd.loc[:, ["left", "right", "rear"]] = 0.0
    p = sim.rollout([standing], THETA, DT, nuisance=[{"v0": 0.5}])[0]
    print(f"v0 = 0.5 m/s from rest: x_end {p[-1, 1]:.4f} m, y_end {p[-1, 2]:.2e} m")
    assert 0.005 < p[-1, 1] < 0.25 and abs(p[-1, 2]) < 1e-3
    still = sim.rollout([standing], THETA, DT)[0]
    assert abs(still[-1, 1]) < 1e-3


def test_nuisance_jacobian_is_each_runs_own_derivative():
    """rollout_with_jacobian with names [mu_lateral, v0, w0, clock_offset] over two runs: run i's
    nuisance column equals the central difference of run i's poses in run i's own value (the
    other run held), computed separately (step 1e-2), to 1e-4 relative to the column's largest
    entry; the physical column is the usual one (both runs perturbed together). Central differences
    (``jacobian="fd"``: every run's value perturbed at once in one pair of world copies); the
    tangent path is checked against them in tests/fit/test_fit_tangent_jacobian.py."""
    sim = OstrichReplay(jacobian="fd")
    runs = [stub_run("turn", 3.0), stub_run("slalom", 3.0, seed=1)]
    nu = [{"v0": 0.1, "w0": -0.05, "clock_offset": 0.12}, {"v0": -0.05, "w0": 0.02, "clock_offset": -0.08}]
    names = ["mu_lateral", "v0", "w0", "clock_offset"]
    poses, jac = sim.rollout_with_jacobian(runs, THETA, DT, names, nuisance=nu)
    for i in range(2):
        for j, n in enumerate(names[1:], start=1):
            up = [dict(d) for d in nu]
            dn = [dict(d) for d in nu]
            up[i][n] += 1e-2
            dn[i][n] -= 1e-2
            fd = (sim.rollout(runs, THETA, DT, nuisance=up)[i][:, 1:]
                  - sim.rollout(runs, THETA, DT, nuisance=dn)[i][:, 1:]) / 2e-2
            scale = np.abs(fd).max()
            err = np.abs(jac[i][:, :, j] - fd).max() / scale
            print(f"run {i} d/d{n}: max |column| {scale:.3g}, relative difference {err:.1e}")
            assert scale > 1e-3 and err < 1e-4


def _offset_runs(sim: OstrichReplay, truth: dict, offsets: list[float]) -> list[Run]:
    runs = []
    for i, (kind, off) in enumerate(zip(("turn", "slalom", "turn"), offsets, strict=True)):
        stub = stub_run(kind, 6.0, seed=i, mirror=i == 2)
        pose = sim.rollout([stub], truth, DT, nuisance=[{"clock_offset": off}])[0]
        runs.append(Run(f"{kind}{i}", odom_from_pose(stub.odom, pose), stub.wheel_cmd))
    return runs


def test_lm_recovers_physics_beside_per_run_clock_offsets():
    """Odometry from the engine at mu_lateral 0.35, every run with its own clock offset
    (+0.25, -0.15, +0.1 s). LM with fit.nuisance [clock_offset] from mu_lateral 0.5, offsets 0
    recovers mu_lateral within 2 % and every offset within 15 ms, the offsets stay out of
    ``params``; without the nuisance the same fit must absorb the offsets in mu_lateral (printed)."""
    sim = OstrichReplay()
    truth = {**THETA, "mu_lateral": 0.35}
    offsets = [0.25, -0.15, 0.1]
    runs = _offset_runs(sim, truth, offsets)
    ps = ParameterSet([
        Parameter(name="mu_lateral", nominal=0.5, lower=0.05, upper=3.0),
        *(Parameter(name=n, nominal=THETA[n], lower=THETA[n] / 10, upper=THETA[n] * 10, frozen=True)
          for n in ("kp", "mu", "slip_speed")),
    ])
    res = optimize(sim, runs, ps, DT, optimizer="lm", max_iter=20,
                   options=FitOptions(nuisance=("clock_offset",), xtol=1e-4, ftol=1e-6))
    plain = optimize(sim, runs, ps, DT, optimizer="lm", max_iter=20)
    got = [res.nuisance[r.name]["clock_offset"] for r in runs]
    print(f"with nuisance: mu_lateral {res.params['mu_lateral'].value:.4f} (truth 0.35), offsets "
          f"{np.round(got, 4).tolist()} (truth {offsets}), loss {res.loss_final:.2e}, {res.message}; "
          f"intervals {res.nuisance_intervals}")
    print(f"without: mu_lateral {plain.params['mu_lateral'].value:.4f}, loss {plain.loss_final:.2e}")
    assert res.params["mu_lateral"].value == pytest.approx(0.35, rel=0.02)
    assert np.allclose(got, offsets, atol=0.015)
    assert set(res.params.names) == set(ps.names)  # no nuisance among the physical parameters
    assert res.loss_final < 0.1 * plain.loss_final
    for r, off in zip(runs, offsets, strict=True):
        lo, hi = res.nuisance_intervals[r.name]["clock_offset"]
        assert lo < hi and lo - 0.015 < off < hi + 0.015
    summary = res.summary()
    assert summary["nuisance_names"] == ["clock_offset"] and set(summary["nuisance"]) == {r.name for r in runs}


def test_nuisance_errors():
    """Unknown nuisance names and simulators without per-run parameters are ConfigErrors that say
    what is accepted."""
    with pytest.raises(ConfigError, match="unknown nuisance"):
        FitOptions(nuisance=("v1",))
    with pytest.raises(ConfigError, match="twice"):
        FitOptions(nuisance=("v0", "v0"))
    ps = ParameterSet([Parameter(name="mu", nominal=0.5, lower=0.05, upper=3.0)])
    with pytest.raises(ConfigError, match="not accepted by the simulator"):
        optimize(KinematicSkidSteer(), [stub_run("turn", 2.0)], ps, DT, options=FitOptions(nuisance=("v0",)))
    with pytest.raises(KeyError, match="unknown nuisance"):
        OstrichReplay().rollout([stub_run("turn", 2.0)], THETA, DT, nuisance=[{"v1": 0.0}])


def test_sysid_fit_keeps_nuisance_out_of_the_parameter_file(tmp_path):
    """`sysid fit` with the engine and fit.nuisance [v0, clock_offset] on 2.5 s pieces: the results
    hold one nuisance row per training piece and name (value inside its interval and bounds), the
    report a Nuisance table naming every piece, the parameter file none of the nuisance names, and
    the held-out pieces are scored (at nuisance 0)."""
    import json

    import yaml

    from sysid.cli import main
    from tests.fit.test_fit_baseline import write_config
    from tests.helpers.fit_doubles import write_dataset

    data = write_dataset(tmp_path / "runs", ("slalom",))
    cfg = write_config(tmp_path / "fit.yaml", data, nuisance=["v0", "clock_offset"], max_iter=4, dt=0.1,
                       baseline=False, calibration={"enabled": False})
    raw = yaml.safe_load(cfg.read_text())
    raw["simulator"] = "ostrich"
    raw["parameters"] = {"mu_lateral": {"bounds": [0.05, 5.0]}, "slip_speed": {"nominal": 0.1, "bounds": [0.01, 1]},
                         "kp": {"frozen": True}, "mu": {"frozen": True}, "cmd_scale": {"frozen": True},
                         "chassis_mass": {"frozen": True}}
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["fit", "--config", str(cfg), "-q"]) == 0
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    train = [r["name"] for r in doc["runs"] if r["split"] == "train"]
    rows = doc["nuisance"]
    assert len(train) >= 4 and len(rows) == 2 * len(train)
    assert {r["run"] for r in rows} == set(train) and {r["name"] for r in rows} == {"v0", "clock_offset"}
    for r in rows:
        lo, hi = r["interval"]
        assert r["bounds"][0] <= lo <= r["value"] <= hi <= r["bounds"][1]
    params = (tmp_path / "out" / "params.yaml").read_text()
    assert "v0" not in params and "clock_offset" not in params
    html = (tmp_path / "out" / "r.html").read_text()
    assert "Nuisance (per training run)" in html and all(name in html for name in train)
    assert any(r["split"] == "held_out" and r["metrics_identified"]["mean_xy"] >= 0 for r in doc["runs"])


def test_calibration_carried_as_prior(tmp_path):
    """fit.calibration.carry: prior keeps the calibrated parameter free with the prior N(calibrated
    value, its std): the fit lists it among its free names and the calibration record says
    "prior"; 'freeze' (the default) leaves it out of them; anything else is a ConfigError."""
    import json

    from sysid.app.config import FitConfig
    from sysid.cli import main
    from tests.fit.test_fit_baseline import write_config
    from tests.helpers.fit_doubles import write_dataset

    data = write_dataset(tmp_path / "runs", ("slalom",))
    for carry in ("prior", "freeze"):
        cfg = write_config(tmp_path / f"fit-{carry}.yaml", data, baseline=False,
                           calibration={"enabled": True, "parameter": "cmd_scale", "segment": "cruise", "carry": carry})
        assert main(["fit", "--config", str(cfg), "-q", "--results", str(tmp_path / f"{carry}.json")]) == 0
        doc = json.loads((tmp_path / f"{carry}.json").read_text())
        assert doc["calibration"]["carry"] == carry
        assert ("cmd_scale" in doc["fit"]["names"]) == (carry == "prior")

    assert FitConfig.from_mapping({"fit": {"calibration": {"carry": "prior"}}}).fit.calibration.carry == "prior"
    assert FitConfig.from_mapping({}).fit.calibration.carry == "freeze"
    with pytest.raises(ConfigError, match="carry"):
        FitConfig.from_mapping({"fit": {"calibration": {"carry": "fixed"}}})
