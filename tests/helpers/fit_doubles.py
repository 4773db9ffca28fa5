"""Test doubles for the identification layer: a kinematic skid-steer simulator written
independently of ``sysid.simulators.kinematic`` (same equations, plain numpy, Jacobian by central finite
differences) and generators of synthetic ``Run``s with known true parameters.

Usable from a config as ``simulator: {name: "tests.helpers.fit_doubles:make_double"}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ingest.run import Run

NAMES = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass")
TRUTH = {"kp": 60.0, "mu": 0.45, "mu_lateral": 0.9, "cmd_scale": 0.92, "chassis_mass": 88.0}
NOMINAL = {"kp": 250.0, "mu": 0.8, "mu_lateral": 0.5, "cmd_scale": 1.0, "chassis_mass": 88.0}
R, TRACK, REAR_X, M_WHEEL, I_SPIN, G = 0.36, 0.72, 0.697, 6.0, 0.389, 9.81


def _yaw_to_quat(yaw: np.ndarray) -> np.ndarray:
    return np.stack([0 * yaw, 0 * yaw, np.sin(yaw / 2), np.cos(yaw / 2)], axis=-1)


class KinematicDouble:
    """Unicycle with command scale, first-order servo lag (kp), Coulomb-capped traction (mu) and a
    turn efficiency from lateral friction (mu_lateral); exact same equations as the baseline."""

    parameter_names = NAMES
    total_calls = 0  # rollouts by every instance: tests check that bad configs stop before any

    def __init__(
        self,
        robot: Any = None,
        fd_step: float = 1e-6,
        tau_contact: float = 0.05,
        interrupt_after: int | None = None,
    ):
        self.fd_step = fd_step
        self.tau_contact = tau_contact
        self.calls = 0
        self.interrupt_after = interrupt_after  # raise KeyboardInterrupt after N rollouts (Ctrl-C test)

    def _one(self, run: Run, th: Mapping[str, float], dt: float) -> np.ndarray:
        t_odom = run.odom["t"].to_numpy()
        t0 = t_odom[0]
        n = max(1, math.ceil((t_odom[-1] - t0) / dt - 1e-9))
        grid = t0 + dt * np.arange(n + 1)
        ct = run.wheel_cmd["t"].to_numpy()
        cv = run.wheel_cmd[["left", "right", "rear"]].to_numpy()
        i_eff = I_SPIN + (th["chassis_mass"] + 3 * M_WHEEL) * R * R / 3
        alpha = 1 - math.exp(-dt * th["kp"] / i_eff)
        beta = 1 - math.exp(-dt / self.tau_contact)
        dvm = th["mu"] * G * dt
        eta = th["mu"] / (th["mu"] + REAR_X / (TRACK / 2) * th["mu_lateral"])
        x, y, yaw = float(run.odom["x"].iloc[0]), float(run.odom["y"].iloc[0]), float(run.odom["yaw"].iloc[0])
        w = np.zeros(3)
        v = 0.0
        states = [(x, y, yaw)]
        for k in range(n):
            i = np.searchsorted(ct, grid[k] + 1e-9, side="right") - 1
            u = cv[i] if i >= 0 else np.zeros(3)
            w = w + alpha * (th["cmd_scale"] * u - w)
            v = v + dvm * math.tanh(beta * (R * w.mean() - v) / dvm)
            yr = eta * R * (w[1] - w[0]) / TRACK
            x += dt * v * math.cos(yaw + 0.5 * dt * yr)
            y += dt * v * math.sin(yaw + 0.5 * dt * yr)
            yaw += dt * yr
            states.append((x, y, yaw))
        s = np.array(states)
        pose = np.empty((len(t_odom), 8))
        pose[:, 0] = t_odom
        for c, col in ((0, 1), (1, 2), (2, 4)):
            pose[:, col] = np.interp(t_odom, grid, s[:, c])
        yaw_i = pose[:, 4].copy()
        pose[:, 3] = float(run.odom["z"].iloc[0])
        pose[:, 4:8] = _yaw_to_quat(yaw_i)
        return pose

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
        unknown = set(theta) - set(NAMES)
        if unknown:
            raise KeyError(f"unknown parameters {sorted(unknown)}")
        self.calls += 1
        KinematicDouble.total_calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        th = {**NOMINAL, **theta}
        return [self._one(r, th, dt) for r in runs]

    def rollout_with_jacobian(self, runs, theta, dt, names):
        base = self.rollout(runs, theta, dt)
        jacs = [np.zeros((len(b), 7, len(names))) for b in base]
        for k, n in enumerate(names):
            h = self.fd_step * max(1.0, abs(theta[n]))
            plus = self.rollout(runs, {**theta, n: theta[n] + h}, dt)
            minus = self.rollout(runs, {**theta, n: theta[n] - h}, dt)
            for i in range(len(runs)):
                jacs[i][:, :, k] = (plus[i][:, 1:] - minus[i][:, 1:]) / (2 * h)
        return base, jacs


def make_double(robot: Any = None, **options: Any) -> KinematicDouble:
    """Factory for ``get_simulator("tests.helpers.fit_doubles:make_double")``."""
    return KinematicDouble(robot, **options)


def command_profile(kind: str, duration: float, rate: float = 100.0, seed: int = 0) -> pd.DataFrame:
    """Wheel-velocity targets [rad/s] at ``rate`` [Hz]: a flat cruise (soft start, constant speed
    until t = 3 s) followed by a manoeuvre of the given kind."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration, 1.0 / rate)
    base = np.clip(t / 1.0, 0, 1) * 2.5  # soft start to 2.5 rad/s (0.9 m/s)
    left, right = base.copy(), base.copy()
    after = t >= 3.0
    if kind == "turn":
        left[after], right[after] = 3.2, 1.2
    elif kind == "slalom":
        d = 1.2 * np.sign(np.sin(2 * np.pi * 0.3 * (t - 3.0)))
        left[after], right[after] = 2.5 + d[after], 2.5 - d[after]
    elif kind == "accel":  # hard steps: traction-limited accelerations identify mu
        steps = np.where(((t - 3.0) // 1.5) % 2 == 0, 5.5, 0.5)
        left[after] = right[after] = steps[after]
    elif kind == "random":
        knots = rng.uniform(0.0, 5.0, size=(int(duration) + 2, 2))
        idx = np.clip(((t - 3.0) // 1.0).astype(int), 0, len(knots) - 1)
        left[after], right[after] = knots[idx[after], 0], knots[idx[after], 1]
    else:
        raise ValueError(kind)
    return pd.DataFrame({"t": t, "left": left, "right": right, "rear": (left + right) / 2})


def odom_stub(t: np.ndarray) -> pd.DataFrame:
    """Odometry at times ``t`` [s] standing at the origin (base 0.36 m up, heading +x): the frame a
    replay needs to simulate a command profile before the poses are filled in."""
    z = np.zeros_like(t)
    return pd.DataFrame({"t": t, "x": z, "y": z, "z": z + 0.36, "qx": z, "qy": z, "qz": z, "qw": z + 1,
                         "yaw": z, "pitch": z, "roll": z})


def odom_from_pose(stub: pd.DataFrame, pose: np.ndarray) -> pd.DataFrame:
    """The odometry frame ``stub`` with the poses of a replay filled in: ``pose`` rows are
    (t, x, y, z, qx, qy, qz, qw), as ``Simulator.rollout`` returns them; yaw is the quaternion's ZYX yaw."""
    from sysid.fit.metrics import quat_yaw

    return stub.assign(x=pose[:, 1], y=pose[:, 2], z=pose[:, 3], qx=pose[:, 4], qy=pose[:, 5], qz=pose[:, 6],
                       qw=pose[:, 7], yaw=quat_yaw(pose[:, 4:8]))


ENGINE_THETA = {"kp": 400.0, "mu": 0.6, "mu_lateral": 0.35, "cmd_scale": 1.0, "slip_speed": 0.1}  # test replays


def stub_run(kind: str, duration: float = 5.0, mirror: bool = False, seed: int = 0) -> Run:
    """A run of ``command_profile(kind)`` with an odometry frame at 20 Hz standing at the origin (to
    be replayed); ``mirror`` swaps the left and right wheels."""
    cmd = command_profile(kind, duration, seed=seed)
    if mirror:
        cmd = cmd.rename(columns={"left": "right", "right": "left"})[["t", "left", "right", "rear"]]
    return Run(f"{kind}{'-mirror' if mirror else ''}", odom_stub(np.arange(0.0, duration - 1e-9, 0.05)), cmd)


def step_run(w: float, duration: float, right: float | None = None) -> Run:
    """A run of ``duration`` [s] whose wheel targets step from rest to ``w`` [rad/s] at t = 0 (the right
    wheel to ``right`` when given, the rear to the mean of the two), standing at the origin (to be replayed)."""
    t = np.arange(0.0, duration, 0.01)
    wr = w if right is None else right
    cmd = pd.DataFrame({"t": t, "left": np.full_like(t, w), "right": np.full_like(t, wr),
                        "rear": np.full_like(t, (w + wr) / 2)})
    return Run("step", odom_stub(np.arange(0.0, duration - 1e-9, 0.05)), cmd)


def make_runs(
    kinds: Sequence[str] = ("turn", "accel", "slalom", "random"),
    truth: Mapping[str, float] = TRUTH,
    duration: float = 8.0,
    noise: float = 0.0,
    seed: int = 0,
    odom_rate: float = 20.0,
    truth_dt: float = 0.005,
    prefix: str = "synth",
) -> list[Run]:
    """Synthetic runs: odometry simulated by the double at the true parameters with timestep
    ``truth_dt`` [s] plus white noise of std ``noise`` [m] on x, y (and noise/L [rad] on yaw)."""
    rng = np.random.default_rng(seed)
    sim = KinematicDouble()
    runs = []
    for i, kind in enumerate(kinds):
        cmd = command_profile(kind, duration, seed=seed + i)
        t = np.arange(0.0, duration - 1e-9, 1.0 / odom_rate)
        stub = odom_stub(t)
        pose = sim.rollout([Run(f"{prefix}-{i}", stub, cmd)], dict(truth), truth_dt)[0]
        # the first sample stays exact: it is the replay's initial state, not a residual
        white = noise * rng.standard_normal((3, len(t)))
        white[:, 0] = 0.0
        x = pose[:, 1] + white[0]
        y = pose[:, 2] + white[1]
        yaw = 2 * np.arctan2(pose[:, 6], pose[:, 7]) + white[2] / 0.5
        q = _yaw_to_quat(yaw)
        odom = stub.assign(x=x, y=y, yaw=yaw, qx=q[:, 0], qy=q[:, 1], qz=q[:, 2], qw=q[:, 3])
        runs.append(
            Run(
                f"{prefix}-{i}-{kind}",
                odom,
                cmd,
                segments={"cruise": (1.5, 3.0), "manoeuvre": (3.0, duration)},
                meta={"kind": kind, "truth": dict(truth), "source": "tests.helpers.fit_doubles"},
            )
        )
    return runs


def scaled_runs(scales: Sequence[float], prefix: str = "s", dt: float = 0.05) -> list[Run]:
    """One 5 s turning run per command scale, each replayed at its own (runs that disagree about
    cmd_scale), named ``{prefix}{i}-0-turn``; odometry noise 1 cm."""
    return [make_runs(("turn",), truth={**TRUTH, "cmd_scale": s}, duration=5.0, noise=0.01, seed=i, truth_dt=dt,
                      prefix=f"{prefix}{i}")[0] for i, s in enumerate(scales)]


class UnconvergedDouble(KinematicDouble):
    """The double, reporting an engine-like solver status after each rollout: the run whose name
    contains ``bad`` (default "slalom") had a worst Newton residual of 0.5 m/s on 20 % of steps."""

    def __init__(self, robot: Any = None, bad: str = "slalom", **options: Any):
        super().__init__(robot, **options)
        self.bad = bad
        self.last_status: dict[str, Any] = {}

    def rollout(self, runs, theta, dt):
        out = super().rollout(runs, theta, dt)
        flags = [self.bad in r.name for r in runs]
        self.last_status = {
            "residual_max_per_world": [0.5 if f else 1e-7 for f in flags],
            "unconverged_per_world": [0.2 if f else 0.0 for f in flags],
        }
        return out


def make_unconverged_double(robot: Any = None, **options: Any) -> UnconvergedDouble:
    """Factory for ``get_simulator("tests.helpers.fit_doubles:make_unconverged_double")``."""
    return UnconvergedDouble(robot, **options)


def adjoint_and_scalar(sim: Any, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str],
                       seed: int = 0) -> tuple[np.ndarray, Callable[[Mapping[str, float]], float]]:
    """The adjoint gradient of L = sum_i c_i . pose_i (random cotangents c_i, seeded) with respect to
    ``names`` at ``theta``, and L as a function of the parameters, for finite-difference checks."""
    rng = np.random.default_rng(seed)
    poses, vjp = sim.rollout_with_vjp(runs, theta, dt, names)
    cts = [rng.normal(size=(p.shape[0], 7)) for p in poses]

    def scalar(th: Mapping[str, float]) -> float:
        return sum(float(np.sum(c * p[:, 1:])) for c, p in zip(cts, sim.rollout(runs, th, dt), strict=True))

    return vjp(cts), scalar


def central_difference(scalar: Callable[[Mapping[str, float]], float], theta: Mapping[str, float], name: str,
                       rel_step: float) -> float:
    """(L(theta + h e) - L(theta - h e)) / 2h with h = rel_step * theta[name]."""
    h = rel_step * theta[name]
    return (scalar({**theta, name: theta[name] + h}) - scalar({**theta, name: theta[name] - h})) / (2 * h)


def assert_adjoint_matches_fd(sim: Any, runs: Sequence[Run], theta: Mapping[str, float], dt: float,
                              names: Sequence[str], rel_step: float, rtol: float) -> None:
    """`adjoint_and_scalar`'s gradient, each of ``names``, within ``rtol`` (relative) of its
    `central_difference` with ``rel_step``; prints both (``pytest -s``)."""
    grads, scalar = adjoint_and_scalar(sim, runs, theta, dt, names)
    for n, g in zip(names, grads, strict=True):
        fd = central_difference(scalar, theta, n, rel_step)
        rel = abs(g - fd) / abs(fd)
        print(f"d/d{n}: adjoint {g:.6g}, central FD {fd:.6g}, relative error {rel:.2e}")
        assert rel < rtol, (n, g, fd)


def noisy_runs(duration: float) -> tuple[list[Run], Run]:
    """The output and report tests' runs: training turn + accel and a held-out slalom (seed 3), each
    ``duration`` [s] long, simulated at 0.05 s with 1 cm odometry noise."""
    train = make_runs(("turn", "accel"), duration=duration, truth_dt=0.05, prefix="train", noise=0.01)
    held = make_runs(("slalom",), duration=duration, truth_dt=0.05, prefix="held", seed=3, noise=0.01)[0]
    return train, held


def write_noisy_runs(folder: Path, duration: float) -> Path:
    """`noisy_runs` saved in ``folder`` (returned) as train-0-turn.npz, train-1-accel.npz, held-0-slalom.npz."""
    train, held = noisy_runs(duration)
    for r in (*train, held):
        r.save(folder / f"{r.name}.npz")
    return folder


def write_dataset(folder: Path, held_kinds: Sequence[str]) -> Path:
    """The CLI tests' runs as .npz files: training turn + accel (seed 1), held-out ``held_kinds`` (seed 2)."""
    for r in make_runs(("turn", "accel"), duration=5.0, truth_dt=0.05, prefix="train", seed=1):
        r.save(folder / f"{r.name}.npz")
    for r in make_runs(tuple(held_kinds), duration=5.0, truth_dt=0.05, prefix="held", seed=2):
        r.save(folder / f"{r.name}.npz")
    return folder


def residual_jacobian_error(res: Any, h: float = 1e-6) -> float:
    """The largest departure of ``res.evaluate``'s Jacobian d r / d z at the start from central differences
    of its residuals (step ``h`` in z), relative to the largest difference (``res``: a
    `sysid.fit.Residuals`)."""
    z = res.z_start()
    _, j = res.evaluate(z, jac=True)
    fd = np.column_stack([(res.evaluate(z + d)[0] - res.evaluate(z - d)[0]) / (2 * h) for d in np.eye(len(z)) * h])
    return float(np.abs(j - fd).max() / np.abs(fd).max())
