"""A run's start in the model's own motion: a pre-roll before the first sample (``preroll`` [s]).

A run that starts mid-motion (a piece cut from a longer run, or a step of a sweep that begins while
the robot still drives the previous step's command) needs an initial state, and the simulators'
(`initial_speed`) is a guess the model itself would not be in: the base at one speed along its
heading, every wheel rolling without slip. Where the wheels have just changed speed, or the robot
turns, that guess is off by what the model's traction would have made of it: on the Husky sweep
the lidar's speed over a run's first 0.5 s is 0.73-0.80 of the logged wheels' (docs/fit.md).

``PreRoll`` wraps any `sysid.simulators.protocol.Simulator`: each run is replayed from ``seconds``
before its first odometry sample, under the wheel commands logged before it (a piece keeps its
parent's, `sysid.simulators.observation.WHEELS_BEFORE`; a whole run, which has none, holds the wheel
speeds of its first `START_WINDOW`), starting as the inner simulator starts any run (its
``initial_speed``; the pre-roll starts at the first sample's pose). At the first sample the model is
wherever its own dynamics took it: the returned path is that replay from the first sample on, moved
and turned about z so that its pose at the first sample is the odometry's (x, y, yaw). So the run
starts at the model's velocity, yaw rate and wheel slip under the commands that led up to it, with
the odometry's pose, and the parameters set that velocity too.

The derivatives are exact: the inner simulator's derivatives of every pose, including the pose at
the first sample, through the frame change (a rigid motion whose angle is the first sample's
simulated yaw). On flat ground only: the pre-roll moves the robot, so a run with an obstacle placed in
the world (a pallet) is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ingest.run import Run
from ingest.timeline import step_average
from sysid.errors import SimulatorError
from sysid.simulators.observation import START_WINDOW, WHEELS_BEFORE, _yaw_and_tangent
from sysid.simulators.protocol import Simulator

OPTION = "preroll"  # the simulator option [s]


def preroll_run(run: Run, seconds: float) -> Run:
    """``run`` extended ``seconds`` [s] before its first odometry sample t0: the wheel log holds, from
    t0 - seconds, the rows logged before t0 (``meta[WHEELS_BEFORE]``; where they start later, the
    earliest is held back to t0 - seconds) or, without any, the mean of each wheel's speed over the
    run's first `START_WINDOW` (zero-order hold); the odometry gets one sample at t0 - seconds, the
    first sample's pose (the pre-roll's start)."""
    if getattr(run, "pallet", None) is not None:
        raise SimulatorError(f"run {run.name!r} has a pallet: simulator.options.{OPTION} needs runs on flat ground "
                             f"(the pre-roll moves the robot relative to what lies in the world); set {OPTION}: 0")
    t0 = float(run.odom["t"].iloc[0])
    ts = t0 - seconds
    wc = run.wheel_cmd
    cols = [c for c in wc.columns if c != "t"]
    before = (run.meta or {}).get(WHEELS_BEFORE) or {}
    tb = np.asarray(before.get("t", []), float)
    missing = [c for c in cols if c not in before]
    if len(tb) and missing:
        raise SimulatorError(f"run {run.name!r}: the wheel log kept from before its start lacks the columns "
                             f"{missing}; cut the pieces again (sysid.app.runs.split_runs)")
    # every row logged before t0: a piece's kept rows, then the run's own
    early = wc["t"].to_numpy(float) < t0
    th = np.concatenate([tb, wc["t"].to_numpy(float)[early]])
    vh = np.vstack([np.column_stack([np.asarray(before[c], float) for c in cols]) if len(tb)
                    else np.empty((0, len(cols))), wc[cols].to_numpy(float)[early]])
    if len(th):
        order = np.argsort(th, kind="stable")
        th, vh = th[order], vh[order]
        upto = np.flatnonzero(th <= ts)
        first = vh[upto[-1]] if len(upto) else vh[0]
        keep = th > ts
        times, values = np.concatenate([[ts], th[keep]]), np.vstack([first[None], vh[keep]])
    else:
        first = step_average(wc["t"].to_numpy(float), wc[cols].to_numpy(float), np.array([t0]), START_WINDOW)[0]
        times, values = np.array([ts]), first[None]
    head = pd.DataFrame(values, columns=cols)
    head.insert(0, "t", times)
    wheels = pd.concat([head, wc.loc[~early, ["t", *cols]]], ignore_index=True)
    wheels = wheels[np.append(np.diff(wheels["t"].to_numpy(float)) > 0, True)].reset_index(drop=True)
    odom = pd.concat([run.odom.iloc[:1].assign(t=ts), run.odom], ignore_index=True)
    return dataclasses.replace(run, odom=odom, wheel_cmd=wheels)


def _rot(d: float) -> tuple[np.ndarray, np.ndarray]:
    """R(d) and dR/dd (2 x 2), a rotation about z by d [rad]."""
    c, s = math.cos(d), math.sin(d)
    return np.array([[c, -s], [s, c]]), np.array([[-s, -c], [c, -s]])


def _left(d: float) -> tuple[np.ndarray, np.ndarray]:
    """L(d) and dL/dd (4 x 4): the product qz(d) * q of the rotation about z by d [rad] with a
    quaternion q = (qx, qy, qz, qw), as a matrix acting on q."""
    c, s = math.cos(d / 2), math.sin(d / 2)
    L = np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, c, s], [0, 0, -s, c]])
    dL = 0.5 * np.array([[-s, -c, 0, 0], [c, -s, 0, 0], [0, 0, -s, c], [0, 0, -c, -s]])
    return L, dL


@dataclasses.dataclass
class _Frame:
    """The frame change of one run: the simulated path from the first sample on (``P``, (N, 8)),
    moved so that its first pose has the odometry's x, y and yaw (angle ``d`` [rad])."""

    P: np.ndarray
    d: float
    target: np.ndarray  # (2,) the odometry's x, y at the first sample [m]

    @classmethod
    def of(cls, pose: np.ndarray, run: Run) -> _Frame:
        P = np.asarray(pose, float)[1:]
        yaw0 = _yaw_and_tangent(P[:1, 4:8], None)[0][0]
        o = run.odom.iloc[0]
        return cls(P=P, d=float(o["yaw"]) - float(yaw0), target=np.array([float(o["x"]), float(o["y"])]))

    def pose(self) -> np.ndarray:
        R, _ = _rot(self.d)
        L, _ = _left(self.d)
        out = self.P.copy()
        out[:, 1:3] = self.target + (self.P[:, 1:3] - self.P[0, 1:3]) @ R.T
        out[:, 4:8] = self.P[:, 4:8] @ L.T
        return out

    def tangent(self, jac: np.ndarray) -> np.ndarray:
        """(N + 1, 7, m) inner derivatives (the pre-roll's start first) -> (N, 7, m) of `pose`."""
        J = np.asarray(jac, float)[1:]
        R, dR = _rot(self.d)
        L, dL = _left(self.d)
        dd = -_yaw_and_tangent(self.P[:1, 4:8], J[:1, 3:7, :])[1][0]  # type: ignore[index]
        out = J.copy()
        out[:, 0:2] = (np.einsum("ij,njm->nim", R, J[:, 0:2] - J[:1, 0:2])
                       + ((self.P[:, 1:3] - self.P[0, 1:3]) @ dR.T)[:, :, None] * dd[None, None, :])
        out[:, 3:7] = np.einsum("ij,njm->nim", L, J[:, 3:7]) + (self.P[:, 4:8] @ dL.T)[:, :, None] * dd[None, None, :]
        return out

    def cotangent(self, g: np.ndarray) -> np.ndarray:
        """(N, 7) cotangent of `pose` -> (N + 1, 7) of the inner poses (the transpose of `tangent`)."""
        g = np.asarray(g, float)
        R, dR = _rot(self.d)
        L, dL = _left(self.d)
        out = np.zeros((len(g) + 1, 7))
        inner = out[1:]
        inner[:, 0:2] = g[:, 0:2] @ R
        inner[0, 0:2] -= inner[:, 0:2].sum(axis=0)
        inner[:, 2] = g[:, 2]
        inner[:, 3:7] = g[:, 3:7] @ L
        gd = float(np.sum(g[:, 0:2] * ((self.P[:, 1:3] - self.P[0, 1:3]) @ dR.T))
                   + np.sum(g[:, 3:7] * (self.P[:, 4:8] @ dL.T)))
        dyaw = _yaw_and_tangent(self.P[:1, 4:8], np.eye(4)[None])[1][0]  # type: ignore[index]
        inner[0, 3:7] -= gd * dyaw
        return out


class PreRoll:
    """``inner`` (any Simulator) replaying every run from ``seconds`` [s] before its first sample
    (module docstring). Parameters, nuisance names and everything else are ``inner``'s."""

    def __init__(self, inner: Simulator, seconds: float) -> None:
        if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise SimulatorError(f"simulator.options.{OPTION} must be a duration > 0 [s] (how long each run is "
                                 f"replayed before its first sample; 0 or absent: none), got {seconds!r}")
        self.inner = inner
        self.seconds = float(seconds)
        self.parameter_names = tuple(inner.parameter_names)

    def __getattr__(self, name: str) -> Any:  # last_status, nuisance_names, options, ...
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _runs(self, runs: Sequence[Run]) -> list[Run]:
        return [preroll_run(r, self.seconds) for r in runs]

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, **kw: Any) -> list[np.ndarray]:
        poses = self.inner.rollout(self._runs(runs), theta, dt, **kw)
        return [_Frame.of(p, r).pose() for p, r in zip(poses, runs, strict=True)]

    def rollout_many(
        self, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float, **kw: Any
    ) -> list[list[np.ndarray]]:
        from sysid.simulators.protocol import rollout_many

        out = rollout_many(self.inner, self._runs(runs), thetas, dt, **kw)
        return [[_Frame.of(p, r).pose() for p, r in zip(ps, runs, strict=True)] for ps in out]

    def rollout_with_jacobian(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str], **kw: Any
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        poses, jacs = self.inner.rollout_with_jacobian(self._runs(runs), theta, dt, names, **kw)
        frames = [_Frame.of(p, r) for p, r in zip(poses, runs, strict=True)]
        return [f.pose() for f in frames], [f.tangent(j) for f, j in zip(frames, jacs, strict=True)]

    def rollout_with_vjp(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str], **kw: Any
    ) -> tuple[list[np.ndarray], Callable[[list[np.ndarray]], np.ndarray]]:
        inner_vjp = getattr(self.inner, "rollout_with_vjp", None)
        if not callable(inner_vjp):  # contract the exact Jacobian
            poses, jacs = self.rollout_with_jacobian(runs, theta, dt, names, **kw)

            def contract(cot: list[np.ndarray]) -> np.ndarray:
                return sum((np.einsum("tk,tkn->n", np.asarray(g, float), j) for g, j in zip(cot, jacs, strict=True)),
                           np.zeros(len(names)))

            return poses, contract
        raw, back = inner_vjp(self._runs(runs), theta, dt, names, **kw)
        frames = [_Frame.of(p, r) for p, r in zip(raw, runs, strict=True)]

        def vjp(cot: list[np.ndarray]) -> np.ndarray:
            return np.asarray(back([f.cotangent(g) for f, g in zip(frames, cot, strict=True)]), float)

        return [f.pose() for f in frames], vjp


def prerolled(sim: Simulator, seconds: float) -> Simulator:
    """``sim`` wrapped in `PreRoll` where ``seconds`` > 0, else ``sim`` itself."""
    return sim if not seconds else PreRoll(sim, seconds)


__all__ = ["OPTION", "PreRoll", "preroll_run", "prerolled"]
