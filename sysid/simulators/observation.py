"""Observation model of the odometry: a position that trails the motion, a heading that does not.

In the Helhest logs the lidar-inertial odometry's heading follows the wheels within 0.06 s, but its
translation trails them (``ingest.quality.odometry_lag``): from rest it stays put for ~1 s while the
wheels turn, then runs ~0.3 m behind the path the wheels drive, by the same distance during the
whole constant-speed motion (right_turn_a 0.28 m at 0.51 m/s, left_circle 0.30 m at 0.36 m/s), and
it catches up once the wheels stop (right_turn_a's odometry glides on after the stop). A rigid
robot cannot do that (its speed and turn rate follow the same wheels), so it is the sensor: the
odometry integrates a *delayed* body-frame velocity along the *current* heading,

    p_odom(t) = p(t0) + int_t0^t R(yaw(s)) v_b(s - d) ds,       v_b(s) = R(yaw(s))^T dp/ds,

with ``v_b`` before ``t0`` (where the simulation has no past) given by ``odom_history``: the
simulation's first velocity, the odometry's own report at the start, or the logged wheels' speed
over the seconds before the start (`wheel_history`; a piece keeps its parent's wheel log for them).
``d`` = 0 gives back the simulator's path exactly; a delay ``d`` [s] leaves a constant deficit
``v d`` at constant speed, heading-aligned, and recovers it after a stop, which a delay of the
whole pose (``cmd_delay``, ``clock_offset``) cannot: those shift the heading too.

``OdometryDelay`` wraps any `sysid.simulators.protocol.Simulator` and adds the shared parameter
``odom_delay`` [s]. It is a property of the odometry source, not of the robot's physics: it is
fitted like the others (shared by every run), written to the parameter file (a user scoring
against the same odometry needs it) and reported, and a prediction of the robot's true path uses
0. Its derivative is exact: forward-mode through the discrete integral below (the interpolation
of ``v_b`` at ``s - d`` is piecewise linear in ``d``).

Discrete form, on the run's odometry times ``t_k`` (k = 0..N): interval k has the displacement
``dp_k = p_{k+1} - p_k``, the mean heading ``yb_k = (yaw_k + yaw_{k+1}) / 2``, the body velocity
``b_k = R(yb_k)^T dp_k / dt_k`` at the midpoint ``m_k``; ``u_k = b(m_k - d)`` (linear
interpolation in the midpoints, held at the ends), and ``p'_{k+1} = p'_k + R(yb_k) u_k dt_k``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ingest.run import Run
from sysid.errors import SimulatorError

if TYPE_CHECKING:
    from sysid.simulators.protocol import Simulator

DELAY = "odom_delay"  # [s] the parameter's name
# what the delayed odometry integrates before a run's (piece's) first sample, where the simulation
# has no past: "simulated" holds the simulation's first velocity; "odometry" the velocity the
# odometry itself reports over its first START_WINDOW (under this model, the robot's velocity
# d seconds before the start: a piece cut from a moving run starts with the sensor still behind);
# "wheels" the forward speed the logged wheels give over the d seconds before the start (`wheel_history`:
# data from before the start only, so an odometry jump at the start does not enter it)
HISTORY = ("simulated", "odometry", "wheels")
# [s] the least of its parent's wheel log a piece keeps from before its start (sysid.app.runs.split_runs;
# more when a config lets odom_delay grow larger); a delay beyond what is kept holds the earliest row
PRE_START_WINDOW = 3.0
# Run.meta key of those rows: {"t": [...], column: [...]} (plain lists: a run's meta is written as JSON)
WHEELS_BEFORE = "wheel_cmd_before"
# the velocity before a run's first sample: a constant (forward, left) [m/s], or a series
# (times [s], forward, left [m/s]) ending at or before the first sample
History = tuple[float, float] | tuple[np.ndarray, np.ndarray, np.ndarray]
# [s] the window a run's (piece's) starting velocity is read over, from the odometry (here, and the
# simulators' initial state) or from the wheel log (sysid.simulators.kinematic.initial_wheel_speeds)
START_WINDOW = 0.1


def _yaw_and_tangent(q: np.ndarray, dq: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Unwrapped yaw of ``(N, 4)`` quaternions ``(qx, qy, qz, qw)`` [rad] and its tangent
    ``(N, m)`` for quaternion tangents ``(N, 4, m)``."""
    qx, qy, qz, qw = q.T
    a = 2.0 * (qw * qz + qx * qy)
    b = 1.0 - 2.0 * (qy * qy + qz * qz)
    yaw = np.unwrap(np.arctan2(a, b))
    if dq is None:
        return yaw, None
    dx, dy, dz, dw = (dq[:, i, :] for i in range(4))
    da = 2.0 * (qw[:, None] * dz + qz[:, None] * dw + qx[:, None] * dy + qy[:, None] * dx)
    db = -4.0 * (qy[:, None] * dy + qz[:, None] * dz)
    den = (a * a + b * b)[:, None]
    return yaw, (b[:, None] * da - a[:, None] * db) / den


def delayed_odometry(
    poses: np.ndarray, delay: float, jac: np.ndarray | None = None, with_delay_column: bool = False,
    history: History | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The odometry a source with translation delay ``delay`` [s] reports for the path ``poses``
    (``(T, 8)``: t, x, y, z, qx, qy, qz, qw); z and the orientation are unchanged.

    ``jac`` (``(T, 7, m)``: d(x, y, z, qx, qy, qz, qw)/d theta) is carried through exactly; with
    ``with_delay_column`` one more column d/d(delay) is appended. ``history``: the body-frame velocity
    before the first sample, a constant (forward, left) [m/s] (e.g. what the odometry itself reported
    there) or a series (times [s], forward, left [m/s]) at strictly increasing times up to the first
    sample's (e.g. `wheel_history`), linearly interpolated and held before its first time; None holds
    the path's own first velocity. The history is data: no tangent. Returns ``(poses', jac')``."""
    if not np.isfinite(delay) or delay < 0:
        raise SimulatorError(f"{DELAY} must be a finite delay >= 0 [s], got {delay!r}")
    out = np.array(poses, dtype=float, copy=True)
    n = len(out)
    m = 0 if jac is None else jac.shape[2]
    if jac is not None and jac.shape[:2] != (n, 7):
        raise SimulatorError(f"pose Jacobian of shape {jac.shape} for {n} poses; expected ({n}, 7, m)")
    mt = m + (1 if with_delay_column else 0)
    jout = None
    if jac is not None or with_delay_column:
        jout = np.zeros((n, 7, mt))
        if jac is not None:
            jout[:, :, :m] = jac
    if n < 2 or (delay == 0.0 and not with_delay_column):
        return out, jout
    t = out[:, 0]
    dt = np.diff(t)
    if np.any(dt <= 0):
        raise SimulatorError("odometry times must increase strictly")
    xy = out[:, 1:3]
    dxy = jout[:, 0:2, :] if jout is not None else None  # (n, 2, mt); the delay column is 0 here
    yaw, dyaw = _yaw_and_tangent(out[:, 4:8], jout[:, 3:7, :] if jout is not None else None)
    # body velocity per interval, at its midpoint
    d_p = np.diff(xy, axis=0)  # (N, 2)
    yb = 0.5 * (yaw[1:] + yaw[:-1])
    c, s = np.cos(yb), np.sin(yb)
    bx = (c * d_p[:, 0] + s * d_p[:, 1]) / dt
    by = (-s * d_p[:, 0] + c * d_p[:, 1]) / dt
    mid = t[:-1] + 0.5 * dt
    # the interpolation nodes: the midpoints, behind them (``history``) the nodes of the velocity
    # before the first sample (their values are data: no tangent)
    ht, hx, hy = _history_nodes(history, float(t[0]))
    nodes, nbx, nby = np.concatenate([ht, mid]), np.concatenate([hx, bx]), np.concatenate([hy, by])

    def with_history(v: np.ndarray) -> np.ndarray:  # a tangent (N, mt) at the midpoints -> at the nodes
        return np.concatenate([np.zeros((len(ht),) + v.shape[1:]), v])

    # u_k = b(mid_k - delay): linear interpolation in the nodes, held outside them; side="left"
    # puts q = node_j in the segment below it, so the delay column is the derivative for a growing delay
    q = mid - delay
    nn = len(nodes)
    k = np.clip(np.searchsorted(nodes, q, side="left") - 1, 0, nn - 2) if nn > 1 else np.zeros(len(q), int)
    if nn > 1:
        span = nodes[k + 1] - nodes[k]
        w = np.clip((q - nodes[k]) / span, 0.0, 1.0)
        inside = (q > nodes[0]) & (q <= nodes[-1])
    else:
        span = np.ones(1)
        w = np.zeros(1)
        inside = np.zeros(1, bool)
    k1 = np.minimum(k + 1, nn - 1)

    def interp(v: np.ndarray) -> np.ndarray:  # v: (nodes, ...) at the nodes
        ww = w.reshape((-1,) + (1,) * (v.ndim - 1))
        out: np.ndarray = (1.0 - ww) * v[k] + ww * v[k1]
        return out

    ux, uy = interp(nbx), interp(nby)
    stepx = (c * ux - s * uy) * dt
    stepy = (s * ux + c * uy) * dt
    out[1:, 1] = xy[0, 0] + np.cumsum(stepx)
    out[1:, 2] = xy[0, 1] + np.cumsum(stepy)
    if jout is None:
        return out, None
    # forward mode: the same operations on the tangents (mt directions)
    assert dxy is not None and dyaw is not None
    d_dp = dxy[1:] - dxy[:-1]  # (N, 2, mt)
    d_yb = 0.5 * (dyaw[1:] + dyaw[:-1])  # (N, mt)
    C, S, DT = c[:, None], s[:, None], dt[:, None]
    dbx = (-S * d_yb * d_p[:, 0:1] + C * d_dp[:, 0] + C * d_yb * d_p[:, 1:2] + S * d_dp[:, 1]) / DT
    dby = (-C * d_yb * d_p[:, 0:1] - S * d_dp[:, 0] - S * d_yb * d_p[:, 1:2] + C * d_dp[:, 1]) / DT
    dux, duy = interp(with_history(dbx)), interp(with_history(dby))
    if with_delay_column:  # du/d(delay) = -(slope of the interpolant at q); 0 where it is held
        slope_x = np.where(inside, (nbx[k1] - nbx[k]) / span, 0.0)
        slope_y = np.where(inside, (nby[k1] - nby[k]) / span, 0.0)
        dux[:, -1] -= slope_x
        duy[:, -1] -= slope_y
    UX, UY = ux[:, None], uy[:, None]
    dstepx = (-S * d_yb * UX + C * dux - C * d_yb * UY - S * duy) * DT
    dstepy = (C * d_yb * UX + S * dux - S * d_yb * UY + C * duy) * DT
    jout[1:, 0, :] = dxy[0, 0][None, :] + np.cumsum(dstepx, axis=0)
    jout[1:, 1, :] = dxy[0, 1][None, :] + np.cumsum(dstepy, axis=0)
    return out, jout


def _history_nodes(history: History | None, t0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``history`` as interpolation nodes (times, forward, left) before the first midpoint: none for
    None, one at ``t0`` for a constant, the series itself (checked) otherwise."""
    if history is None:
        return np.empty(0), np.empty(0), np.empty(0)
    if len(history) == 2:
        return np.array([t0]), np.array([float(history[0])]), np.array([float(history[1])])
    ht, hx, hy = (np.asarray(a, float).reshape(-1) for a in history)
    if not (len(ht) == len(hx) == len(hy) >= 1):
        raise SimulatorError(f"odometry history: {len(ht)} times, {len(hx)} forward and {len(hy)} left speeds; "
                             "give one of each per node, at least one node")
    if not (np.all(np.isfinite(ht)) and np.all(np.isfinite(hx)) and np.all(np.isfinite(hy))):
        raise SimulatorError("odometry history: times and speeds must be finite")
    if np.any(np.diff(ht) <= 0) or ht[-1] > t0:
        raise SimulatorError(f"odometry history: times must increase strictly and end at or before the first "
                             f"sample's ({t0} s); got {ht[0]}..{ht[-1]} s")
    return ht, hx, hy


def wheel_history(run: Run, radius: float, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The body velocity (times [s], forward, left [m/s]) the logged wheels give up to a run's first
    odometry sample t0 (``odom_history: wheels``): r [m] times the mean over ``columns`` of the logged
    wheel speeds [rad/s] (as ``initial_speed: wheels`` averages them), lateral 0, at each logged row
    before t0 (the run's own and those its parent's log held before a piece, ``meta[WHEELS_BEFORE]``)
    and at t0 the last row at or before it. A run without earlier rows holds its first wheel speed."""
    t0 = float(run.odom["t"].iloc[0])
    wc = run.wheel_cmd
    before = (run.meta or {}).get(WHEELS_BEFORE) or {}
    tb = np.asarray(before.get("t", []), float)
    missing = [c for c in columns if c not in before]
    if len(tb) and missing:
        raise SimulatorError(f"run {run.name!r}: the wheel log kept from before its start lacks the columns "
                             f"{missing}; cut the pieces again (sysid.app.runs.split_runs)")
    vb = radius * np.mean([np.asarray(before[c], float) for c in columns], axis=0) if len(tb) else np.empty(0)
    tw = wc["t"].to_numpy(float)
    vw = radius * wc[list(columns)].to_numpy(float).mean(axis=1)
    ts, vs = np.concatenate([tb, tw]), np.concatenate([vb, vw])
    if len(ts) == 0:
        return np.array([t0]), np.zeros(1), np.zeros(1)
    order = np.argsort(ts, kind="stable")
    ts, vs = ts[order], vs[order]
    last = np.append(np.diff(ts) > 0, True)  # a time logged twice: its last row
    ts, vs = ts[last], vs[last]
    upto = ts <= t0
    held = float(vs[upto][-1]) if np.any(upto) else float(vs[0])
    earlier = ts < t0
    times = np.append(ts[earlier], t0)
    return times, np.append(vs[earlier], held), np.zeros(len(times))


class OdometryDelay:
    """``inner`` (any Simulator) observed through an odometry whose translation trails the motion
    by ``odom_delay`` [s] (module docstring). Accepts ``inner``'s parameters plus ``odom_delay``
    (0 when absent: the inner simulator's output unchanged); everything else is ``inner``'s.
    ``history``: one of `HISTORY`; ``robot`` (the robot.yaml mapping, default the bundled Helhest)
    gives the wheel radius and the wheels' log columns the ``wheels`` history reads."""

    def __init__(self, inner: Simulator, history: str = "simulated", robot: Mapping[str, Any] | None = None) -> None:
        if history not in HISTORY:
            raise SimulatorError(f"odom_history must be one of {list(HISTORY)} (what the delayed odometry "
                                 f"integrates before a run's first sample), got {history!r}")
        self.inner = inner
        self.history = history
        names = tuple(inner.parameter_names)
        self.parameter_names = names if DELAY in names else names + (DELAY,)
        self._wheels: tuple[float, list[tuple[str, ...]]] | None = None
        if history == "wheels":
            from sysid.simulators.kinematic import robot_geometry  # it imports this module

            geo = robot_geometry(robot)
            self._wheels = (float(geo["radius"]), list(geo["wheel_logs"]))

    def _histories(self, runs: Sequence[Run]) -> list[History | None]:
        if self.history == "odometry":
            return [odometry_velocity(r) for r in runs]
        if self._wheels is not None:
            from sysid.simulators.kinematic import wheel_log_columns

            radius, logs = self._wheels
            return [wheel_history(r, radius, wheel_log_columns(r, logs, i)) for i, r in enumerate(runs)]
        return [None for _ in runs]

    def __getattr__(self, name: str) -> Any:  # last_status, nuisance_names, options, ...
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @staticmethod
    def _split(theta: Mapping[str, float]) -> tuple[dict[str, float], float]:
        rest = {k: v for k, v in theta.items() if k != DELAY}
        d = float(theta.get(DELAY, 0.0))
        if not np.isfinite(d) or d < 0:
            raise ValueError(f"{DELAY} must be a finite delay >= 0 [s], got {theta.get(DELAY)!r}")
        return rest, d

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, **kw: Any) -> list[np.ndarray]:
        rest, d = self._split(theta)
        poses = self.inner.rollout(runs, rest, dt, **kw)
        if d == 0.0:
            return poses
        return [delayed_odometry(p, d, history=hi)[0] for p, hi in zip(poses, self._histories(runs), strict=True)]

    def rollout_many(
        self, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float, **kw: Any
    ) -> list[list[np.ndarray]]:
        from sysid.simulators.protocol import rollout_many

        split = [self._split(th) for th in thetas]
        out = rollout_many(self.inner, runs, [r for r, _ in split], dt, **kw)
        hist = self._histories(runs)
        return [ps if d == 0.0 else [delayed_odometry(p, d, history=hi)[0] for p, hi in zip(ps, hist, strict=True)]
                for ps, (_, d) in zip(out, split, strict=True)]

    def rollout_with_jacobian(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str], **kw: Any
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        rest, d = self._split(theta)
        names = list(names)
        inner_names = [n for n in names if n != DELAY]
        want_d = DELAY in names
        poses, jacs = self.inner.rollout_with_jacobian(runs, rest, dt, inner_names, **kw)
        if d == 0.0 and not want_d:
            return poses, jacs
        po, jo = [], []
        for p, j, hi in zip(poses, jacs, self._histories(runs), strict=True):
            p2, j2 = delayed_odometry(p, d, np.asarray(j, float), with_delay_column=want_d, history=hi)
            assert j2 is not None
            if want_d:  # columns back into the order of ``names``
                order = [inner_names.index(n) if n != DELAY else len(inner_names) for n in names]
                j2 = j2[:, :, order]
            po.append(p2)
            jo.append(j2)
        return po, jo

    def rollout_with_vjp(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str], **kw: Any
    ) -> tuple[list[np.ndarray], Callable[[list[np.ndarray]], np.ndarray]]:
        rest, d = self._split(theta)
        inner_vjp = getattr(self.inner, "rollout_with_vjp", None)
        if d == 0.0 and DELAY not in names and callable(inner_vjp):
            direct: tuple[list[np.ndarray], Callable[[list[np.ndarray]], np.ndarray]] = inner_vjp(
                runs, rest, dt, names, **kw)
            return direct
        # the delay mixes a run's samples: contract the exact Jacobian instead of one adjoint sweep
        poses, jacs = self.rollout_with_jacobian(runs, theta, dt, names, **kw)

        def vjp(cot: list[np.ndarray]) -> np.ndarray:
            return sum((np.einsum("tk,tkn->n", np.asarray(g, float), j) for g, j in zip(cot, jacs, strict=True)),
                       np.zeros(len(names)))

        return poses, vjp


def odometry_start_rate(run: Run, window: float = START_WINDOW) -> tuple[float, float, float]:
    """The world-frame velocity vx, vy [m/s] and yaw rate [rad/s] a run's odometry reports over its
    first ``window`` seconds (at least one sample on): displacement and heading change (wrapped) over
    time; zeros for a single sample."""
    o = run.odom
    t = o["t"].to_numpy(float)
    if len(t) < 2:
        return 0.0, 0.0, 0.0
    k = int(min(len(t) - 1, max(1, np.searchsorted(t, t[0] + window))))
    span = t[k] - t[0]
    vx = (float(o["x"].iloc[k]) - float(o["x"].iloc[0])) / span
    vy = (float(o["y"].iloc[k]) - float(o["y"].iloc[0])) / span
    wz = float(np.angle(np.exp(1j * (float(o["yaw"].iloc[k]) - float(o["yaw"].iloc[0]))))) / span
    return vx, vy, wz


def odometry_velocity(run: Run, window: float = START_WINDOW) -> tuple[float, float]:
    """The body-frame velocity (forward, left) [m/s] a run's odometry reports over its first
    ``window`` seconds (`odometry_start_rate` rotated into the first sample's heading)."""
    vx, vy, _ = odometry_start_rate(run, window)
    yaw = float(run.odom["yaw"].iloc[0])
    c, s = np.cos(yaw), np.sin(yaw)
    return float(c * vx + s * vy), float(-s * vx + c * vy)


def observed(sim: Simulator, history: str = "simulated", robot: Mapping[str, Any] | None = None) -> OdometryDelay:
    """``sim`` wrapped in `OdometryDelay` (once)."""
    return sim if isinstance(sim, OdometryDelay) else OdometryDelay(sim, history=history, robot=robot)


__all__ = ["DELAY", "HISTORY", "PRE_START_WINDOW", "START_WINDOW", "WHEELS_BEFORE", "History", "OdometryDelay",
           "delayed_odometry", "observed", "odometry_start_rate", "odometry_velocity", "wheel_history"]
