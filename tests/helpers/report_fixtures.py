"""A small fit whose report exercises pieces (``--split``), segments, a pallet and the sweep: the
kinematic simulator on synthetic runs (seconds, no engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sysid.cli import main
from tests.helpers.fit_doubles import make_runs, noisy_runs

ROOT = Path(__file__).resolve().parents[2]


def fit_with_pieces(folder: Path) -> tuple[dict[str, Any], Path]:
    """(results document, report path) of a kinematic fit on two 6 s training runs and one held-out
    run, each cut into 2 s pieces, with a timestep sweep whose plateau reaches its largest h."""
    train, held = noisy_runs(6.0)
    for r in train:
        r.save(folder / f"{r.name}.npz")
    from ingest.run import PalletPose

    held.pallet = PalletPose(2.0, 0.2, 0.3)
    held.save(folder / f"{held.name}.npz")
    out = folder / "out"
    rc = main(["fit", "-q", "--robot", str(ROOT / "models/helhest/robot.yaml"), "--simulator", "kinematic",
               "--train", str(folder / "train-*.npz"), "--held-out", str(folder / "held-0-slalom.npz"),
               "--dt", "0.05", "--split", "2", "--max-iter", "8", "--sweep-dts", "0.02,0.05",
               "--params-out", str(out / "p.yaml"), "--report", str(out / "report.html")])
    assert rc == 0
    return json.loads((out / "report.json").read_text()), out / "report.html"


DOUBLE = "tests.helpers.fit_doubles:make_double"


def _write_runs(folder: Path) -> None:
    for r in make_runs(("turn", "accel"), duration=6.0, truth_dt=0.05, prefix="train", noise=0.01):
        r.save(folder / f"{r.name}.npz")
    from ingest.run import PalletPose

    for i, kind in enumerate(("slalom", "random")):
        held = make_runs((kind,), duration=6.0, truth_dt=0.05, prefix=f"held{i}", seed=3 + i, noise=0.01)[0]
        held.pallet = PalletPose(2.0, 0.2, 0.3) if i == 0 else None
        held.save(folder / f"{held.name}.npz")


def fit_config(folder: Path, **fit: Any) -> Path:
    """A fit config in ``folder`` over synthetic runs written beside it: the kinematic double as the model
    (so the kinematic baseline is fitted beside it), two training and two held-out 6 s runs cut into 2 s
    pieces, a pallet on the first held-out run, a timestep sweep; outputs in ``folder/out``."""
    import yaml

    _write_runs(folder)
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": DOUBLE},
        "data": {"train": ["train-*.npz"], "held_out": ["held*.npz"], "split": 2.0},
        "parameters": {"kp": {"bounds": [10, 2000]}, "mu_lateral": {"bounds": [0.05, 5.0]}},
        "fit": {"dt": 0.05, "max_iter": 8, **fit},
        "sweep": {"dts": [0.02, 0.05, 0.1]},
        "output": {"params": "out/params.yaml", "report": "out/report.html"},
    }
    path = folder / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit_with_baseline(folder: Path) -> tuple[dict[str, Any], Path]:
    """(results document, report path) of ``sysid fit`` on `fit_config` (run from ``folder``, as a user
    runs it beside their config)."""
    import os

    cfg = fit_config(folder)
    here = Path.cwd()
    os.chdir(folder)
    try:
        rc = main(["fit", "-q", "--config", str(cfg)])
    finally:
        os.chdir(here)
    assert rc == 0
    return json.loads((folder / "out" / "report.json").read_text()), folder / "out" / "report.html"


def cv_document(folder: Path) -> dict[str, Any]:
    """A two-fold cross-validation of `fit_config` (the double and its kinematic baseline)."""
    from sysid.app.config import FitConfig
    from sysid.app.cv import cross_validate

    return cross_validate(FitConfig.from_file(fit_config(folder, max_iter=6)), 2, workers=1)


def plan_document(scene: str = "terrain") -> dict[str, Any]:
    """A plan document as `sysid.app.plan.plan` returns it (no engine run): one trial driving a curve
    from the origin to (3, 1, 0.3) over 4 s, on a sum-of-sinusoids heightmap with ``scene="terrain"``,
    over a pallet with ``scene="pallet"``."""
    import numpy as np

    steps, dt = 40, 0.1
    s = np.linspace(0.0, 1.0, steps + 1)
    xy = np.stack([3.0 * s, 1.0 * s**2], axis=1)
    guess = np.stack([3.2 * s, 0.3 * s], axis=1)
    size, res = 24.0, 80
    g = np.linspace(-size / 2, size / 2, res + 1)
    X, Y = np.meshgrid(g, g, indexing="ij")
    Z = 0.05 * (np.sin(0.7 * X + 0.4 * Y + 1.0) - np.sin(1.0)) + 0.03 * (np.sin(-0.5 * X + 0.9 * Y) - 0.0)
    z_path = 0.36 + np.array([np.interp(p[1], g, Z[int(np.argmin(abs(g - p[0])))]) for p in xy])
    cmds = (2.0 + 0.5 * np.sin(np.linspace(0, 3, steps))[:, None] * np.array([1.0, 1.2, 1.1])).tolist()
    trial = {
        "start": [0.0, 0.0, 0.0], "goal": [3.0, 1.0, 0.3], "pallet": [1.5, 0.3, 0.3] if scene == "pallet" else None,
        "knots": cmds[::8], "targets": cmds, "commands": cmds, "chassis_xy": xy.tolist(),
        "initial_xy": guess.tolist(), "chassis_z": z_path.tolist() if scene == "terrain" else [0.36] * (steps + 1),
        "position_error": 0.03, "yaw_error": 0.01, "terminal_speed": 0.05, "success": True,
        "iterations_to_success": 7, "loss": 0.02, "residual_max": 1e-5,
    }
    doc: dict[str, Any] = {
        "format": "sysid-plan", "version": 1, "robot": "helhest", "params": str(ROOT / "models/helhest/p.yaml"),
        "created": "2026-01-01T00:00:00+00:00", "parameters": {"kp": 200.0}, "channels": ["left", "right", "rear"],
        "wheels": ["left", "right", "rear"], "pallet_size": [1.2, 0.8, 0.144],
        "times": [round(i * dt, 9) for i in range(steps)],
        "options": {"scene": scene, "terrain_seed": 5 if scene == "terrain" else None, "duration": 4.0, "dt": dt,
                    "steps": steps, "knots": 6, "optimizer": "lbfgs", "iterations": 15, "lr": 0.3, "pullback": "full",
                    "trials": 1, "seed": 0, "position_tol": 0.2, "speed_tol": 0.3, "yaw_tol": None, "weights": {}},
        "trials": [trial],
        "best_history": [[2.0 / (1 + i) ** 1.5] for i in range(15)],
        "summary": {"successes": 1, "best_trial": 0, "best_position_error": 0.03, "best_yaw_error": 0.01,
                    "iteration_s_median": 0.4},
    }
    if scene == "terrain":
        doc["terrain"] = {"size": size, "resolution": res, "heights": np.round(Z, 4).tolist()}
    return doc
