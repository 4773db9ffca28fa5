"""A small fit whose report exercises pieces (``--split``), segments, a pallet and the sweep: the
kinematic simulator on synthetic runs (seconds, no engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sysid.cli import main
from tests.helpers.fit_doubles import make_runs

ROOT = Path(__file__).resolve().parents[2]


def fit_with_pieces(folder: Path) -> tuple[dict[str, Any], Path]:
    """(results document, report path) of a kinematic fit on two 6 s training runs and one held-out
    run, each cut into 2 s pieces, with a timestep sweep whose plateau reaches its largest h."""
    for r in make_runs(("turn", "accel"), duration=6.0, truth_dt=0.05, prefix="train", noise=0.01):
        r.save(folder / f"{r.name}.npz")
    held = make_runs(("slalom",), duration=6.0, truth_dt=0.05, prefix="held", seed=3, noise=0.01)[0]
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
