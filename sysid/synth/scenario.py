"""Run design: the 14 pallet traversals of the paper (§IV-A), with their true parameters.

A run is a planned path in the world (z up, ground z = 0, start at the origin heading +x):

1. stand still, accelerate and **cruise** straight on flat ground (calibrates the wheel-command scale),
2. an arc turning by ``turn_before`` [rad],
3. a straight approach and the **climb** over the pallet (crossed along its 0.8 m side),
4. an arc turning by ``turn_after`` [rad], an exit straight, stop, stand still.

The heading change of the run is ``turn_before + turn_after`` (same sign). A simulated operator
(pure pursuit, in `generate.py`) follows the path; its wheel-velocity setpoints are what the bag logs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ingest.run import PALLET_SIZE
from sysid.synth.errors import SynthError
from sysid.synth.mjcf import ContactParams, Pallet

SPEED_RANGE = (0.12, 2.05)  # [m/s] the paper's traversal speeds
MAX_HEADING_CHANGE_DEG = 130.0  # [deg]


@dataclass(frozen=True)
class ServoParams:
    """Wheel motor controllers of the simulated robot (the 'real' one, not our engine's model).

    Each wheel gets torque = kv (s u - w) + ki * integral(s u - w) dt [N m], with u the logged setpoint
    [rad/s], w the wheel speed, s = ``cmd_scale`` (motor tracking: what the flat cruise calibrates),
    the integral clamped to +/- ``integral_limit`` [N m]. A PI loop as many wheel controllers are: it makes up
    the velocity servo's lag and pushes harder the longer a wheel is held back (at the pallet's edge).
    """

    kv: float = 250.0  # [N m s/rad]
    ki: float = 1250.0  # [N m/rad]
    integral_limit: float = 300.0  # [N m]
    cmd_scale: float = 0.96  # [-]

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """One planned traversal. Lengths [m], angles [rad], speed [m/s], times [s]."""

    name: str
    index: int
    seed: int
    speed: float
    turn_before: float
    turn_after: float
    pallet: Pallet
    contact: ContactParams
    servo: ServoParams = field(default_factory=ServoParams)
    split: str = "heldout"
    role: str = ""  # "slow", "fast", "turn-heavy", "mixed" for training runs
    accel: float = 0.8  # [m/s^2] operator's acceleration limit
    cruise_time: float = 3.0  # [s] time at constant speed on the first straight
    approach: float = 0.0  # [m] straight before the pallet's near edge (set by design_runs)
    lateral_offset: float = 0.0  # [m] path offset from the pallet centre, along the pallet's length
    standstill: float = 1.0  # [s] at the start and at the end
    radius: float = 1.2  # [m] turn radius of the planned arcs
    exit_length: float = 1.5  # [m] straight after the second arc

    @property
    def heading_change(self) -> float:
        return self.turn_before + self.turn_after

    def as_dict(self) -> dict[str, Any]:
        return {
            "speed": self.speed,
            "heading_change_deg": math.degrees(self.heading_change),
            "turn_before_deg": math.degrees(self.turn_before),
            "turn_after_deg": math.degrees(self.turn_after),
            "accel": self.accel,
            "cruise_time": self.cruise_time,
            "approach": self.approach,
            "lateral_offset": self.lateral_offset,
            "radius": self.radius,
            "standstill": self.standstill,
        }


@dataclass
class Path:
    """Planned path as a dense polyline: points (N, 2) [m], heading (N,) [rad], arclength s (N,) [m]."""

    xy: np.ndarray
    heading: np.ndarray
    s: np.ndarray
    cruise_end: float  # [m] arclength where the flat cruise ends
    pallet_near: float  # [m] arclength where the path meets the pallet's near edge

    @property
    def length(self) -> float:
        return float(self.s[-1])


def plan_path(spec: RunSpec, step: float = 0.02) -> Path:
    """The polyline of a run: straight, arc, straight over the pallet, arc, straight."""
    v, a = spec.speed, spec.accel
    ramp = v * v / (2 * a)
    lead = max(ramp + v * spec.cruise_time, 1.0)
    depth = spec.pallet.size[1]
    wheelbase = 0.75
    pieces: list[tuple[str, float, float]] = [("line", lead, 0.0)]
    if abs(spec.turn_before) > 1e-9:
        pieces.append(("arc", spec.radius, spec.turn_before))
    over = spec.approach + depth + wheelbase + 1.0
    pieces.append(("line", over, 0.0))
    if abs(spec.turn_after) > 1e-9:
        pieces.append(("arc", spec.radius, spec.turn_after))
    pieces.append(("line", spec.exit_length, 0.0))

    over_index = 2 if abs(spec.turn_before) > 1e-9 else 1
    pts = [np.zeros(2)]
    hd = [0.0]
    x, y, h = 0.0, 0.0, 0.0
    s_total = 0.0
    approach_start = lead
    for k, (kind, p, ang) in enumerate(pieces):
        if k == over_index:
            approach_start = s_total
        if kind == "line":
            n = max(1, int(math.ceil(p / step)))
            for i in range(1, n + 1):
                d = p * i / n
                pts.append(np.array([x + d * math.cos(h), y + d * math.sin(h)]))
                hd.append(h)
            s_total += p
        else:
            length = p * abs(ang)
            n = max(2, int(math.ceil(length / step)))
            sign = 1.0 if ang > 0 else -1.0
            cx, cy = x - sign * p * math.sin(h), y + sign * p * math.cos(h)
            for i in range(1, n + 1):
                hh = h + ang * i / n
                pts.append(np.array([cx + sign * p * math.sin(hh), cy - sign * p * math.cos(hh)]))
                hd.append(hh)
            h += ang
            s_total += length
        x, y = pts[-1]
    xy = np.array(pts)
    s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(xy, axis=0), axis=1))])
    near = approach_start + spec.approach
    cruise_end = min(lead, near - 1.0)
    return Path(xy=xy, heading=np.array(hd), s=s, cruise_end=cruise_end, pallet_near=near)


def place_pallet(spec: RunSpec, yaw_offset: float) -> Pallet:
    """Put the pallet across the planned approach line of ``spec`` (its 0.8 m side along the path)."""
    path = plan_path(spec)
    s_mid = path.pallet_near + spec.pallet.size[1] / 2
    i = int(np.searchsorted(path.s, s_mid))
    px, py = path.xy[i]
    h = path.heading[i]
    # Shift the pallet sideways so the path crosses it off-centre by lateral_offset.
    px -= spec.lateral_offset * -math.sin(h)
    py -= spec.lateral_offset * math.cos(h)
    yaw = _wrap_half(h + math.pi / 2 + yaw_offset)
    # Rounded to what the manifest stores, so a replay from the manifest is exact.
    return Pallet(x=round(float(px), 6), y=round(float(py), 6), yaw=round(float(yaw), 6), size=spec.pallet.size)


def _wrap_half(a: float) -> float:
    """Angle in (-pi/2, pi/2]: a box is the same box after a half turn."""
    a = (a + math.pi / 2) % math.pi - math.pi / 2
    return math.pi / 2 if a == -math.pi / 2 else a


@dataclass(frozen=True)
class DesignOptions:
    """Knobs of `design_runs`; the defaults give the paper's dataset."""

    n_runs: int = 14
    speed_range: tuple[float, float] = SPEED_RANGE
    max_heading_change_deg: float = MAX_HEADING_CHANGE_DEG
    n_train: int = 4
    mu_wheel: tuple[float, float] = (0.65, 0.95)  # per-run range [-]
    mu_rear: tuple[float, float] = (0.3, 0.8)
    torsional: tuple[float, float] = (0.0, 0.03)  # [m]
    mu_pallet: float = 1.6  # wood edge + tyre tread: what lets the wheels climb at a crawl
    servo: ServoParams = field(default_factory=ServoParams)
    # One wheel friction for every run (sim-to-sim recovery): all three wheels get this mu [-] and
    # the torsional friction ``constant_torsional`` [m], instead of the per-run draws above. The
    # random streams are consumed as with per-run friction, so speeds, turns and pallet poses stay
    # those of the same seed's default design.
    constant_friction: float | None = None
    constant_torsional: float = 0.0  # [m]

    def check(self) -> None:
        if self.constant_friction is not None and not (0 < self.constant_friction <= 3.0):
            raise SynthError(f"constant friction {self.constant_friction} must be in (0, 3]")
        if not 0 <= self.constant_torsional <= 0.1:
            raise SynthError(f"constant torsional friction {self.constant_torsional} m must be in [0, 0.1]")


def _contact(rng: np.random.Generator, opts: DesignOptions, speed_frac: float) -> ContactParams:
    # Rear-wheel scrub friction drifts with speed (turn efficiency correlated with speed, as the
    # paper reports), plus per-run scatter, so no constant friction fits every run exactly.
    lo, hi = opts.mu_rear
    mu_rear = lo + (hi - lo) * float(np.clip(0.35 * speed_frac + 0.65 * rng.random(), 0.0, 1.0))
    mu_wheel = float(rng.uniform(*opts.mu_wheel))
    torsional = float(rng.uniform(*opts.torsional))
    if opts.constant_friction is not None:  # drawn above all the same: the stream stays aligned
        mu_wheel = mu_rear = float(opts.constant_friction)
        torsional = float(opts.constant_torsional)
    return ContactParams(
        mu_wheel=round(mu_wheel, 4),
        mu_rear=round(mu_rear, 4),
        torsional=round(torsional, 5),
        mu_ground=0.3,
        mu_pallet=opts.mu_pallet,
        kv=opts.servo.kv,
    )


def make_run(
    index: int,
    seed: int,
    speed: float,
    heading_change_deg: float,
    rng: np.random.Generator,
    opts: DesignOptions | None = None,
    split: str = "heldout",
    role: str = "",
    name: str | None = None,
    **overrides: Any,
) -> RunSpec:
    """One run with random pallet pose (yaw +/- 12 deg off square, +/- 10 cm lateral) and friction.

    ``overrides`` set other `RunSpec` fields (e.g. ``cruise_time=1.5``) before the pallet is placed
    on the path (a pallet placed for another path would be missed: re-place it with `place_pallet`).
    """
    opts = opts or DesignOptions()
    lo, hi = opts.speed_range
    if not (0 < speed <= 3.0):
        raise SynthError(f"run speed {speed} m/s is outside (0, 3]; the paper's range is {SPEED_RANGE}")
    if abs(heading_change_deg) > 180:
        raise SynthError(f"heading change {heading_change_deg} deg is beyond +/-180 deg")
    frac = float(np.clip((speed - lo) / max(hi - lo, 1e-9), 0, 1))
    hc = math.radians(heading_change_deg)
    split_frac = float(rng.uniform(0.3, 0.7)) if abs(hc) > 1e-9 else 0.0
    spec = RunSpec(
        name=name or f"run_{index:02d}",
        index=index,
        seed=int(seed),
        speed=float(speed),
        turn_before=hc * split_frac,
        turn_after=hc * (1 - split_frac),
        pallet=Pallet(0.0, 0.0, 0.0, PALLET_SIZE),
        contact=_contact(rng, opts, frac),
        servo=opts.servo,
        split=split,
        role=role,
        approach=round(1.5 + 0.8 * speed, 3),
        lateral_offset=round(float(rng.uniform(-0.1, 0.1)), 4),
        radius=round(1.0 + 0.4 * speed, 3),
    )
    bad = sorted(set(overrides) - set(RunSpec.__dataclass_fields__) | ({"pallet"} & set(overrides)))
    if bad:
        raise SynthError(f"make_run: unknown or not overridable RunSpec fields {bad}")
    spec = replace(spec, **overrides)
    yaw_off = math.radians(float(rng.uniform(-12, 12)))
    return replace(spec, pallet=place_pallet(spec, yaw_off))


def design_runs(seed: int = 0, opts: DesignOptions | None = None) -> list[RunSpec]:
    """The dataset's runs: speeds log-spaced over the range, heading changes 0..max, 4 training runs.

    Training runs: the slowest (slow), the fastest (fast), the largest heading change among the
    others (turn-heavy) and the median-speed run of the rest (mixed); every other run is held out.
    """
    opts = opts or DesignOptions()
    opts.check()
    n = opts.n_runs
    if n < 1:
        raise SynthError(f"n_runs={n}; need at least 1 run")
    if not 0 <= opts.n_train <= min(4, n):
        raise SynthError(f"n_train={opts.n_train} must be between 0 and min(4, n_runs={n})")
    lo, hi = opts.speed_range
    if not 0 < lo <= hi:
        raise SynthError(f"speed range {opts.speed_range} must satisfy 0 < low <= high [m/s]")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    speeds = np.exp(np.linspace(math.log(lo), math.log(hi), n)) if n > 1 else np.array([lo])
    if n > 2:
        speeds[1:-1] *= rng.uniform(0.94, 1.06, n - 2)
    speeds = np.round(speeds, 3)
    headings = np.linspace(0.0, opts.max_heading_change_deg, n) if n > 1 else np.array([0.0])
    headings = rng.permutation(headings)
    signs = rng.choice([-1.0, 1.0], size=n)
    order = list(range(n))
    roles: dict[int, str] = {}
    if opts.n_train >= 1:
        roles[int(np.argmin(speeds))] = "slow"
    if opts.n_train >= 2:
        roles[int(np.argmax(speeds))] = "fast"
    if opts.n_train >= 3:
        rest = [i for i in order if i not in roles]
        turn = max(rest, key=lambda i: headings[i])
        roles[turn] = "turn-heavy"
    if opts.n_train >= 4:
        rest = sorted((i for i in order if i not in roles), key=lambda i: speeds[i])
        roles[rest[len(rest) // 2]] = "mixed"
    # Keep the slow and fast training runs from being turn-heavy too: give them the smallest turns.
    small = sorted((i for i in order if i not in roles), key=lambda i: headings[i])
    for r in ("slow", "fast"):
        idx = [i for i, v in roles.items() if v == r]
        if idx and small and headings[idx[0]] > headings[small[0]]:
            j = small.pop(0)
            headings[idx[0]], headings[j] = headings[j], headings[idx[0]]
    runs = []
    for i in order:
        run_rng = np.random.default_rng(np.random.SeedSequence([seed, 2, i]))
        runs.append(
            make_run(
                i,
                seed=int(np.random.SeedSequence([seed, 3, i]).generate_state(1)[0]),
                speed=float(speeds[i]),
                heading_change_deg=float(signs[i] * headings[i]),
                rng=run_rng,
                opts=opts,
                split="train" if i in roles else "heldout",
                role=roles.get(i, ""),
            )
        )
    return runs
