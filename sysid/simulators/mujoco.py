"""Reference simulator: the synthetic-data generator's own MuJoCo model, replayed open-loop.

``MujocoReplay`` wraps ``sysid.synth.simulate.replay_commands`` (the generator's MJCF model and
PI wheel servos) in the ``Simulator`` protocol so the identification layer can be checked against
the data set's known truth with a model of the right class. Use it as a *forward* reference
(``sysid evaluate``, the odometry-noise floor at the true parameters): it is not differentiable,
and its finite-difference Jacobian (``len(names) + 1`` replays) is unreliable — on run_13 of the
sample, the column norms of ``dr/dtheta`` change by 10x between relative steps of 3e-3, 1e-2 and
3e-2 (contact-solver non-smoothness), so LM stalls at the nominal values. The MuJoCo timestep
``dt`` must divide the 10 ms control period (e.g. 1e-3, 5e-4 s). Parameter mapping:

- ``kp`` -> velocity-servo gain ``kv`` [N m s/rad] (the integral gain ``ki`` stays at its option value),
- ``mu`` -> left/right wheel friction ``mu_wheel``; ``mu_lateral`` -> rear-wheel friction
  ``mu_rear`` (the wheel that scrubs sideways in every turn),
- ``cmd_scale`` -> servo command scale; ``chassis_mass`` -> chassis body mass [kg].

The replay starts from the generator's initial state (at rest, heading +x) and is translated onto
the run's first odometry position: use it on runs ingested with ``normalize_start`` (the
default: first heading zero), as the synthetic runs are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ingest.run import Run
from sysid.errors import SimulatorError
from sysid.robot.description import NOMINALS
from sysid.simulators.kinematic import command_grid

PARAMETERS = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass")
CONTROL_DT = 0.01  # [s] the generator's 100 Hz setpoint period
# Here "mu_lateral" is the rear wheel's sliding friction (ContactParams.mu_rear), not the engine's
# lateral coefficient: a different fact, whose default is the generator's mu_rear (0.8), not 0.5.
REAR_MU = 0.8


class MujocoReplay:
    """``Simulator`` over the generator's MuJoCo model (see module doc)."""

    parameter_names: tuple[str, ...] = PARAMETERS
    label = "MuJoCo replay of the sysid.synth generator model (forward reference; FD Jacobian unreliable)"

    def __init__(
        self,
        robot: Mapping[str, Any] | None = None,
        ki: float = 1250.0,
        integral_limit: float = 300.0,
        fd_rel: float = 1e-2,
        **contact: Any,
    ):
        try:
            from sysid.synth import mjcf, scenario, simulate
        except ImportError as exc:
            raise SimulatorError(f"the MuJoCo reference needs sysid.synth and mujoco ({exc})") from exc
        self._mjcf, self._scenario, self._simulate = mjcf, scenario, simulate
        self.robot = dict(robot) if robot else None
        self.ki, self.integral_limit, self.fd_rel = float(ki), float(integral_limit), float(fd_rel)
        self.contact = contact  # other ContactParams fields (torsional, mu_ground, mu_pallet, solref, ...)

    def _one(self, run: Run, theta: Mapping[str, float], dt: float, u: np.ndarray, grid: np.ndarray) -> np.ndarray:
        cp = self._mjcf.ContactParams(
            mu_wheel=float(theta["mu"]),
            mu_rear=float(theta["mu_lateral"]),
            kv=float(theta["kp"]),
            chassis_mass=float(theta["chassis_mass"]),
            **self.contact,
        )
        sp = self._scenario.ServoParams(
            kv=float(theta["kp"]),
            ki=self.ki,
            integral_limit=self.integral_limit,
            cmd_scale=float(theta["cmd_scale"]),
        )
        pallet = None
        if run.pallet is not None:
            pallet = run.pallet  # the one pallet type (ingest.run.PalletPose): the generator takes it as is
        try:
            pose = self._simulate.replay_commands(u, contact=cp, servo=sp, pallet=pallet, robot=self.robot, timestep=dt)
        except Exception as exc:  # a MuJoCo instability is a diverged world, not a crash
            if type(exc).__name__ == "SynthError" and "timestep" in str(exc):
                raise ValueError(str(exc)) from exc
            pose = np.full((len(u), 7), np.nan)
        t = run.odom["t"].to_numpy(float)
        tick = grid[: len(u)]
        out = np.empty((len(t), 8))
        out[:, 0] = t
        first = run.odom[["x", "y", "z"]].iloc[0].to_numpy(float)
        for k in range(3):  # the replay starts at the model's rest pose: translate it onto the first sample
            out[:, 1 + k] = np.interp(t, tick, pose[:, k]) - pose[0, k] + first[k]
        q = np.stack([np.interp(t, tick, pose[:, c]) for c in (4, 5, 6, 3)], axis=1)  # wxyz -> xyzw
        out[:, 4:8] = q / np.linalg.norm(q, axis=1, keepdims=True)
        return out

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
        unknown = set(theta) - set(PARAMETERS)
        if unknown:
            raise KeyError(f"the MuJoCo reference has no parameter(s) {sorted(unknown)}; it accepts {PARAMETERS}")
        full = {**NOMINALS, "mu_lateral": REAR_MU, **theta}
        u, grids, _n = command_grid(runs, CONTROL_DT)
        out = []
        for b, run in enumerate(runs):
            steps = len(grids[b]) - 1
            out.append(self._one(run, full, dt, u[b, :steps], grids[b]))
        return out

    def rollout_with_jacobian(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        base = self.rollout(runs, theta, dt)
        jacs = [np.zeros((len(p), 7, len(names))) for p in base]
        for k, n in enumerate(names):
            h = self.fd_rel * max(abs(float(theta[n])), 1e-3)
            plus = self.rollout(runs, {**theta, n: float(theta[n]) + h}, dt)
            for i in range(len(runs)):
                jacs[i][:, :, k] = (plus[i][:, 1:] - base[i][:, 1:]) / h
        return base, jacs


def make_simulator(robot: Mapping[str, Any] | None = None, **options: Any) -> MujocoReplay:
    return MujocoReplay(robot, **options)


__all__ = ["MujocoReplay", "make_simulator"]
