"""Evaluation of parameters on runs: one rollout at given parameter values and the paper's metrics
per run (combined error, xy distances, yaw RMSE) within each run's scoring window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from sysid.errors import SimulatorError
from sysid.fit.metrics import LEVER_ARM, run_metrics
from sysid.fit.residuals import RunSet, Window, align_start
from sysid.simulators.protocol import Simulator

if TYPE_CHECKING:
    from ingest.run import Run


def simulate(sim: Simulator, runs: Sequence[Run], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
    """Rollout that turns a simulator exception into a SimulatorError naming the timestep."""
    try:
        return sim.rollout(list(runs), dict(theta), dt)
    except (KeyError, ValueError) as exc:
        raise SimulatorError(f"simulator rejected the replay at dt={dt}: {exc}") from exc


def evaluate(
    sim: Simulator,
    runs: Sequence[Run],
    theta: Mapping[str, float],
    dt: float,
    *,
    lever_arm: float = LEVER_ARM,
    windows: Sequence[Window] | None = None,
) -> tuple[list[dict[str, float]], list[np.ndarray]]:
    """Per-run metrics (combined error [m], mean/final xy distance [m], yaw RMSE [rad]) and the
    simulated poses (full run, at odometry timestamps)."""
    data = RunSet.build(runs, windows)
    poses = simulate(sim, data.runs, theta, dt)
    metrics = []
    assert data.origins is not None  # RunSet.build records them
    for pose, mask, meas, origin in zip(poses, data.masks, data.measured, data.origins, strict=True):
        metrics.append(run_metrics(align_start(pose, origin)[mask], meas, lever_arm))
    return metrics, poses
