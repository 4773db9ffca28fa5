"""A kinematic skid-steer *baseline* simulator (no contact physics) with exact forward sensitivities.

This is not the project's physics engine: it has no rigid-body contact, cannot climb a pallet
(z stays at the first odometry sample's height) and models friction only through its effect on
a skid-steer's gross motion. It is fast and exact to differentiate, and serves as a flat-ground
baseline and a stand-in for the engine while it is built. Model, per world, timestep ``h`` [s]:

- wheel servo: first-order lag of each of the n driven wheels' speed towards ``cmd_scale * u`` with
  time constant ``tau = I_eff / kp`` [s], ``I_eff = I_spin + (chassis_mass + n m_wheel) r^2 / n``
  [kg m^2] (each wheel accelerates its share of the robot), discretised exactly:
  ``w += (1 - exp(-h/tau)) (s u - w)``;
- longitudinal traction: the base speed ``v`` follows ``r * mean(w)`` (all driven wheels) with a contact time
  constant of 50 ms, its change per step capped smoothly at ``mu * g * h`` (Coulomb limit); with
  the optional ``slip_speed`` [m/s] the traction is a regularised Coulomb law
  ``mu g tanh(slip / slip_speed)`` and the time constant becomes ``slip_speed / (mu g)`` (the
  real Helhest's forward speed lags its wheel speeds by ~1 s while its yaw rate does not);
- turning: yaw rate ``eta * r (w_right - w_left) / track`` (``w_right``, ``w_left``: the mean speed
  of each side's wheels; ``track``: the sides' mean lateral distance), turn efficiency
  ``eta = mu / (mu + kappa * mu_lateral) / (1 + (v / turn_speed)^2)``,
  ``kappa = sum_i |x_i - x_0| / (sum_side |y_i - y_c| / 2)`` over the driven wheels (``x_0``: the
  side wheels' mean x): lateral friction on wheels that skid sideways resists the turn (the
  Helhest: ``|x_rear| / (track / 2)``; a 4-wheel skid steer: twice its wheelbase over its track; a
  differential drive with casters: 0, it turns at the commanded rate), and the real robot turns
  less efficiently at speed (the paper: efficiency varies per run,
  correlated with speed). ``turn_speed`` [m/s] is optional (default infinite: no speed effect);
- planar integration with the midpoint heading;
- initial state (``initial_speed``): ``rest`` (default: wheels and base at rest at every run's or
  piece's start), ``odometry`` (every wheel rolling at the odometry's speed over its first 0.1 s) or
  ``wheels`` (each wheel at its logged speed over the first 0.1 s, the base at r times their mean);
  the initial state is data, it has no derivative.

Units: SI throughout; wheel commands in rad/s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ingest.run import Run
from ingest.transforms import euler_to_quat
from sysid.errors import RobotDescriptionError
from sysid.robot.description import DEFAULT_ROBOT, NOMINALS, robot_mapping
from sysid.simulators.observation import START_WINDOW, odometry_velocity

PARAMETERS = ("kp", "mu", "mu_lateral", "cmd_scale", "chassis_mass", "turn_speed", "slip_speed")
# Values used for parameters a theta leaves out (turn_speed = inf: no speed dependence;
# slip_speed = nan: fixed contact time constant TAU_CONTACT instead of slip_speed / (mu g)).
DEFAULTS = {
    **NOMINALS,  # kp, mu, mu_lateral, cmd_scale, chassis_mass: the one set (sysid.robot.description)
    "turn_speed": math.inf,
    "slip_speed": math.nan,
}
G = 9.81  # [m/s^2]
TAU_CONTACT = 0.05  # [s] base-speed response to wheel speed when not traction-limited


@functools.cache
def _default_robot() -> dict[str, Any]:
    """The bundled Helhest's robot.yaml mapping, read once."""
    return robot_mapping(DEFAULT_ROBOT)


def robot_geometry(robot: Mapping[str, Any] | None) -> dict[str, Any]:
    """Radius, track, wheel mass and spin inertia, the driven wheels' log names and sides, and the
    turn lever ``kappa`` from a robot description (the robot.yaml mapping; default the bundled Helhest,
    `sysid.robot.DEFAULT_ROBOT`, whose values also fill what a mapping leaves out)."""
    helhest = _default_robot()
    hw = helhest["wheels"]
    geo: dict[str, Any] = dict(radius=float(hw["radius"]), track=float(helhest["skid_steer"]["track_width"]),
                               rear_x=0.0, wheel_mass=float(hw["mass"]),  # rear_x: the lever, set below
                               wheel_spin_inertia=float(hw["inertia"][2]))
    joints = list(hw["joints"])
    if robot:
        w = robot.get("wheels", {})
        geo["radius"] = float(w.get("radius", geo["radius"]))
        geo["wheel_mass"] = float(w.get("mass", geo["wheel_mass"]))
        if "inertia" in w:
            geo["wheel_spin_inertia"] = float(w["inertia"][2])
        joints = list(w.get("joints") or joints)
    names, sides, pos = [], [], []
    for j in joints:
        p = [float(v) for v in j.get("position", (0.0, 0.0, 0.0))]
        side = str(j.get("side") or ("left" if p[1] > 1e-3 else "right" if p[1] < -1e-3 else "center"))
        log = j.get("log")
        names.append(tuple([log] if isinstance(log, str) else log) if log else
                     tuple(dict.fromkeys((str(j["name"]), str(j.get("joint", j["name"]))))))
        sides.append(side)
        pos.append(p)
    left = [p[1] for p, s in zip(pos, sides) if s == "left"]
    right = [p[1] for p, s in zip(pos, sides) if s == "right"]
    if left and right:
        geo["track"] = float(np.mean(left) - np.mean(right))
    side_x = [p[0] for p, s in zip(pos, sides) if s != "center"]
    x0 = float(np.mean(side_x)) if side_x else 0.0
    yc = (float(np.mean(left)) + float(np.mean(right))) / 2 if left and right else 0.0
    lever = sum(abs(p[0] - x0) for p in pos)
    span = sum(abs(p[1] - yc) for p, s in zip(pos, sides) if s != "center")
    geo["rear_x"] = lever  # the Helhest's rear-wheel lever; in general the summed lever of all wheels
    geo["kappa"] = lever / (span / 2) if span > 0 else 0.0
    geo["wheel_logs"] = names
    geo["sides"] = sides
    return geo


def _log_names(columns: Sequence[str | Sequence[str]] | None) -> list[tuple[str, ...]]:
    """Per wheel its log names as a tuple (default the Helhest's left, right, rear)."""
    return [(c,) if isinstance(c, str) else tuple(c) for c in (columns or ("left", "right", "rear"))]


def wheel_log_columns(run: Run, columns: Sequence[str | Sequence[str]] | None, index: int = 0) -> list[str]:
    """The column of ``run.wheel_cmd`` that drives each wheel: the first of the wheel's log names
    (``columns``, see `command_grid`) the run has. RobotDescriptionError names a wheel it lacks."""
    have = list(run.wheel_cmd.columns)
    cols = []
    for logs in _log_names(columns):
        hit = next((c for c in logs if c in have), None)
        if hit is None:
            raise RobotDescriptionError(
                f"run {getattr(run, 'name', index)!r}: its wheel columns {[c for c in have if c != 't']} have none of "
                f"the wheel's log names {list(logs)}; name the log's wheel joints in the wheel map (wheels[].log)")
        cols.append(hit)
    return cols


def command_grid(runs: Sequence[Run], dt: float, columns: Sequence[Sequence[str]] | None = None
                 ) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Zero-order-hold wheel commands on each run's step grid ``t0 + k dt``, padded with zeros.

    ``columns``: per wheel its log names (the first a run has is used; default the Helhest's
    left, right, rear). Returns commands ``(B, N, n_wheels)`` [rad/s] for steps 0..N-1, the per-run
    grids ``t_k`` (N_i + 1 points) and N = max N_i.
    """
    columns = _log_names(columns)
    grids, steps = [], []
    for run in runs:
        t = run.odom["t"].to_numpy(float)
        n = max(1, math.ceil((t[-1] - t[0]) / dt - 1e-9))
        grids.append(t[0] + dt * np.arange(n + 1))
        steps.append(n)
    n_max = max(steps)
    u = np.zeros((len(runs), n_max, len(columns)))
    for b, run in enumerate(runs):
        ct = run.wheel_cmd["t"].to_numpy(float)
        vals = run.wheel_cmd[wheel_log_columns(run, columns, b)].to_numpy(float)
        idx = np.searchsorted(ct, grids[b][:-1] + 1e-9, side="right") - 1
        held = np.where(idx[:, None] >= 0, vals[np.clip(idx, 0, None)], 0.0)
        u[b, : steps[b]] = held
    return u, grids, n_max


def interp_matrix(grid: np.ndarray, t: np.ndarray, n_cols: int) -> np.ndarray:
    """Linear-interpolation weights ``(len(t), n_cols)`` from states on ``grid`` to times ``t``."""
    w = np.zeros((len(t), n_cols))
    k = np.clip(np.searchsorted(grid, t, side="right") - 1, 0, len(grid) - 2)
    a = np.clip((t - grid[k]) / (grid[k + 1] - grid[k]), 0.0, 1.0)
    rows = np.arange(len(t))
    w[rows, k] = 1.0 - a
    w[rows, k + 1] = a
    return w


INITIAL_SPEED = ("rest", "odometry", "wheels")  # where a run's initial speed comes from (KinematicSkidSteer)
INITIAL_WINDOW = START_WINDOW  # [s] the window the initial speed is averaged over (odometry or wheel log)


def initial_wheel_speeds(run: Run, columns: Sequence[str], window: float = INITIAL_WINDOW) -> np.ndarray:
    """Each wheel's mean logged speed [rad/s] over the run's first ``window`` seconds (from its first
    odometry sample; zero-order hold), ``columns`` naming the wheels' columns of ``run.wheel_cmd``."""
    from ingest.timeline import step_average

    t0 = float(run.odom["t"].iloc[0])
    wc = run.wheel_cmd
    speeds: np.ndarray = step_average(wc["t"].to_numpy(float), wc[list(columns)].to_numpy(float), np.array([t0]),
                                      window)[0]
    return speeds


def odometry_speed(run: Run, window: float = INITIAL_WINDOW) -> float:
    """The forward speed [m/s] a run's odometry reports over its first ``window`` seconds."""
    return odometry_velocity(run, window)[0]


def initial_planar(run: Run) -> tuple[float, float, float, float]:
    """x, y [m], z [m], yaw [rad] of the first odometry sample."""
    o = run.odom.iloc[0]
    return float(o["x"]), float(o["y"]), float(o["z"]), float(o["yaw"])


def planar_to_pose(t: np.ndarray, xyyaw: np.ndarray, z0: float) -> np.ndarray:
    """(T, 3) x, y, yaw -> (T, 8) pose rows with constant z and a yaw-only quaternion."""
    pose = np.empty((len(t), 8))
    pose[:, 0] = t
    pose[:, 1:3] = xyyaw[:, :2]
    pose[:, 3] = z0
    pose[:, 4:8] = euler_to_quat(xyyaw[:, 2])
    return pose


def planar_jacobian_to_pose(xyyaw: np.ndarray, jac: np.ndarray) -> np.ndarray:
    """(T, 3, n) sensitivities of x, y, yaw -> (T, 7, n) of x, y, z, qx, qy, qz, qw."""
    out = np.zeros((jac.shape[0], 7, jac.shape[2]))
    out[:, 0:2] = jac[:, 0:2]
    half = xyyaw[:, 2] / 2
    out[:, 5] = 0.5 * np.cos(half)[:, None] * jac[:, 2]  # dqz/dyaw
    out[:, 6] = -0.5 * np.sin(half)[:, None] * jac[:, 2]  # dqw/dyaw
    return out


class KinematicSkidSteer:
    """Kinematic skid-steer baseline implementing the ``Simulator`` protocol (see module doc)."""

    parameter_names: tuple[str, ...] = PARAMETERS
    label = "kinematic skid-steer baseline (no contact physics)"

    def __init__(self, robot: Mapping[str, Any] | None = None, tau_contact: float = TAU_CONTACT,
                 initial_speed: str = "rest"):
        if initial_speed not in INITIAL_SPEED:
            raise ValueError(f"initial_speed must be one of {list(INITIAL_SPEED)}, got {initial_speed!r}")
        self.geo = robot_geometry(robot)
        self.tau_contact = float(tau_contact)
        self.initial_speed = initial_speed

    # -- core, batched over worlds, with forward sensitivities -----------------------------------
    def _simulate(
        self,
        theta: Mapping[str, float],
        u: np.ndarray,
        init: np.ndarray,
        dt: float,
        names: Sequence[str] = (),
        w0: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Step all worlds; returns states (B, N+1, 3) = x, y, yaw and their exact derivatives
        (B, N+1, 3, n) with respect to ``theta[names]`` (tangent-linear model, forward mode). ``w0``
        ``(B, n_wheels)``: the wheels' initial speeds [rad/s] (data, no tangent; the base starts at
        r times their mean); None: at rest."""
        g = self.geo
        r, track = g["radius"], g["track"]
        kappa = g["kappa"]
        left = [i for i, sd in enumerate(g["sides"]) if sd == "left"]
        right = [i for i, sd in enumerate(g["sides"]) if sd == "right"]
        n_w = len(g["sides"])
        kp, mu, mul, s, m, vc, vs = (float(theta.get(k, DEFAULTS[k])) for k in PARAMETERS)
        n_p = len(names)
        col = {n: i for i, n in enumerate(names)}

        def unit(name: str, value: float = 1.0) -> np.ndarray:
            d = np.zeros(n_p)
            if name in col:
                d[col[name]] = value
            return d

        r2_3 = r * r / n_w
        i_eff = g["wheel_spin_inertia"] + (m + n_w * g["wheel_mass"]) * r2_3
        a = kp / i_eff
        alpha = 1 - math.exp(-dt * a)
        d_alpha = dt * math.exp(-dt * a) * (unit("kp", 1 / i_eff) + unit("chassis_mass", -kp / i_eff**2 * r2_3))
        if math.isfinite(vs):
            tau_v = vs / (mu * G)
            d_tau = unit("slip_speed", 1 / (mu * G)) + unit("mu", -vs / (mu * mu * G))
        else:
            tau_v, d_tau = self.tau_contact, np.zeros(n_p)
        beta = 1 - math.exp(-dt / tau_v)
        d_beta = -math.exp(-dt / tau_v) * dt / tau_v**2 * d_tau
        dvm = mu * G * dt  # Coulomb limit on the speed change per step [m/s]
        d_dvm = unit("mu", G * dt)
        den = mu + kappa * mul
        eta = mu / den
        d_eta = unit("mu", kappa * mul / den**2) + unit("mu_lateral", -mu * kappa / den**2)
        d_s = unit("cmd_scale")
        d_vc = unit("turn_speed")
        speed_effect = math.isfinite(vc)

        b, n_steps = u.shape[0], u.shape[1]
        w = np.zeros((b, n_w)) if w0 is None else np.array(w0, float)
        dw = np.zeros((b, n_w, n_p))
        v = r * w.mean(axis=1)
        dv = np.zeros((b, n_p))
        x, y, yaw = init[:, 0].copy(), init[:, 1].copy(), init[:, 2].copy()
        dx, dy, dyaw = np.zeros((b, n_p)), np.zeros((b, n_p)), np.zeros((b, n_p))
        states = np.empty((b, n_steps + 1, 3))
        jac = np.empty((b, n_steps + 1, 3, n_p))
        states[:, 0] = np.stack([x, y, yaw], axis=-1)
        jac[:, 0] = 0.0
        for k in range(n_steps):
            uk = u[:, k]
            e = s * uk - w
            dw = dw + d_alpha * e[:, :, None] + alpha * (uk[:, :, None] * d_s - dw)
            w = w + alpha * e
            vt = r * w.mean(axis=1)
            dvt = r * dw.mean(axis=1)
            z = beta * (vt - v) / dvm
            th = np.tanh(z)
            dz = (
                beta * (dvt - dv) / dvm
                - (beta * (vt - v) / dvm**2)[:, None] * d_dvm
                + ((vt - v) / dvm)[:, None] * d_beta
            )
            dv = dv + d_dvm * th[:, None] + (dvm * (1 - th * th))[:, None] * dz
            v = v + dvm * th
            w_l, w_r = w[:, left].mean(axis=1), w[:, right].mean(axis=1)
            dw_l, dw_r = dw[:, left].mean(axis=1), dw[:, right].mean(axis=1)
            diff = w_r - w_l
            if speed_effect:
                f = 1.0 / (1.0 + (v / vc) ** 2)
                df = (-2 * f * f * v / vc**2)[:, None] * dv + (2 * f * f * v * v / vc**3)[:, None] * d_vc
            else:
                f, df = np.ones(b), np.zeros((b, n_p))
            yr = eta * f * r * diff / track
            dyr = (d_eta * f[:, None] + eta * df) * (r * diff / track)[:, None] + (eta * f * r / track)[:, None] * (
                dw_r - dw_l
            )
            mid = yaw + 0.5 * dt * yr
            dmid = dyaw + 0.5 * dt * dyr
            c, sn = np.cos(mid), np.sin(mid)
            dx = dx + dt * (dv * c[:, None] - (v * sn)[:, None] * dmid)
            dy = dy + dt * (dv * sn[:, None] + (v * c)[:, None] * dmid)
            x = x + dt * v * c
            y = y + dt * v * sn
            dyaw = dyaw + dt * dyr
            yaw = yaw + dt * yr
            states[:, k + 1, 0], states[:, k + 1, 1], states[:, k + 1, 2] = x, y, yaw
            jac[:, k + 1, 0], jac[:, k + 1, 1], jac[:, k + 1, 2] = dx, dy, dyaw
        return states, jac

    def _prepare(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float
                 ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray, np.ndarray | None]:
        """The runs' wheel commands (B, N, wheels) [rad/s] on their step grids (`command_grid`), the grids,
        the initial poses (x [m], y [m], yaw [rad]) (B, 3) and heights z (B,) [m], and the initial wheel
        speeds (`_initial_wheels`)."""
        unknown = set(theta) - set(self.parameter_names)
        if unknown:
            raise KeyError(f"kinematic baseline has no parameter(s) {sorted(unknown)}; it accepts {PARAMETERS}")
        if not dt > 0:
            raise ValueError(f"timestep must be > 0, got {dt}")
        u, grids, n = command_grid(runs, dt, self.geo["wheel_logs"])
        init = np.array([initial_planar(r) for r in runs])
        return u, grids, init[:, [0, 1, 3]], init[:, 2], self._initial_wheels(runs)

    def _initial_wheels(self, runs: Sequence[Run]) -> np.ndarray | None:
        """Every run's initial wheel speeds [rad/s] (``initial_speed``): None at rest; the logged
        wheels' over the first INITIAL_WINDOW; or every wheel rolling at the odometry's speed."""
        if self.initial_speed == "rest":
            return None
        n_w = len(self.geo["sides"])
        if self.initial_speed == "odometry":
            return np.array([[odometry_speed(r) / self.geo["radius"]] * n_w for r in runs])
        return np.array([initial_wheel_speeds(r, wheel_log_columns(r, self.geo["wheel_logs"], b))
                         for b, r in enumerate(runs)])

    def _sample(self, runs: Sequence[Run], grids: Sequence[np.ndarray], states: np.ndarray) -> list[np.ndarray]:
        """Interpolate per-run step states (B, N+1, ...) at each run's odometry times."""
        out = []
        for b, run in enumerate(runs):
            t = run.odom["t"].to_numpy(float)
            m = interp_matrix(grids[b], t, states.shape[1])
            out.append(np.tensordot(m, states[b], axes=(1, 0)))
        return out

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
        poses, _ = self.rollout_with_jacobian(runs, theta, dt, ())
        return poses

    def rollout_with_jacobian(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Poses plus exact forward sensitivities (tangent-linear model): cost grows with the
        number of parameters, not with the number of residuals, which is what Gauss-Newton needs."""
        bad = [n for n in names if n not in self.parameter_names]
        if bad:
            raise KeyError(f"cannot differentiate with respect to unknown parameter(s) {bad}")
        u, grids, init, z0, w0 = self._prepare(runs, theta, dt)
        states, jac = self._simulate(theta, u, init, dt, tuple(names), w0)
        planar = self._sample(runs, grids, states)
        jacs = self._sample(runs, grids, jac)
        poses, pose_jacs = [], []
        for i, run in enumerate(runs):
            poses.append(planar_to_pose(run.odom["t"].to_numpy(float), planar[i], z0[i]))
            pose_jacs.append(planar_jacobian_to_pose(planar[i], jacs[i]))
        return poses, pose_jacs
