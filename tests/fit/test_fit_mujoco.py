"""The MuJoCo reference simulator reproduces a synthetic pallet run at the generator's true
parameters (skipped without the sample data set or mujoco)."""

from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets" / "pallet-sample"
pytest.importorskip("mujoco")
pytestmark = pytest.mark.skipif(not (SAMPLE / "manifest.yaml").exists(), reason="datasets/pallet-sample absent")


def test_replay_at_true_parameters_matches_odometry_and_jacobian_has_signal():
    import ingest
    from sysid.fit.metrics import run_metrics
    from sysid.simulators.protocol import get_simulator

    man = yaml.safe_load((SAMPLE / "manifest.yaml").read_text())
    entry = man["splits"]["heldout"][0]
    run = ingest.load_run(SAMPLE / entry, config=SAMPLE / man["ingest_topic_map"], dt=0.01, progress=False)
    tp = next(r for r in man["runs"] if r["name"] == entry)["true_params"]
    truth = {
        "kp": tp["servo"]["kv"],
        "mu": tp["contact"]["mu_wheel"],
        "mu_lateral": tp["contact"]["mu_rear"],
        "cmd_scale": tp["servo"]["cmd_scale"],
        "chassis_mass": 88.0,
    }
    sim = get_simulator("mujoco")
    short = run.slice(run.odom["t"].iloc[0], run.odom["t"].iloc[0] + 6.0, name=run.name)
    poses, jacs = sim.rollout_with_jacobian([short], truth, 0.001, ["cmd_scale"])
    meas = short.odom[["t", "x", "y", "z", "qx", "qy", "qz", "qw"]].to_numpy(float)
    m = run_metrics(poses[0], meas)
    assert m["mean_xy"] < 0.05 and m["z_rmse"] < 0.02, m  # odometry noise and drift level
    wrong = sim.rollout([short], {**truth, "cmd_scale": 0.8}, 0.001)[0]
    assert run_metrics(wrong, meas)["mean_xy"] > 3 * m["mean_xy"]
    assert np.abs(jacs[0][:, 0, 0]).max() > 0.5  # d x / d cmd_scale: metres per unit scale
