"""The engine replay's `slip_ratio`: each wheel's friction slip speed follows its rolling speed,
v_s(t) = slip_speed + slip_ratio * r |w(t)| (w the logged wheel speed of the step), set per step
through `Simulation.forward(step_arrays=...)`; its gradient by the adjoint (per-step parameter
gradients, chain rule through r |w(t)|) against central finite differences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ingest.run import Run
from sysid.engine import EngineError
from sysid.fit.metrics import quat_yaw
from sysid.simulators.ostrich import OstrichReplay
from tests.helpers.fit_doubles import ENGINE_THETA, adjoint_and_scalar, assert_adjoint_matches_fd, odom_stub, stub_run

DT = 0.1  # [s]
R_WHEEL, HALF_TRACK = 0.36, 0.36  # [m]
THETA = ENGINE_THETA


def constant_run(name: str, v: float, w: float, seconds: float = 8.0) -> Run:
    """Wheel speeds for a body speed v [m/s] and turn rate w [rad/s] (left/right (v -/+ w b) / r,
    rear v / r), held from t = 0."""
    t = np.arange(0.0, seconds, 0.01)
    one = np.ones_like(t)
    cmd = pd.DataFrame({"t": t, "left": (v - w * HALF_TRACK) / R_WHEEL * one,
                        "right": (v + w * HALF_TRACK) / R_WHEEL * one, "rear": v / R_WHEEL * one})
    return Run(name, odom_stub(np.arange(0.0, seconds - 1e-9, 0.05)), cmd)


def test_schedule_at_zero_and_uniform_rolling_equal_a_fixed_slip_speed():
    """At slip_ratio 0 the per-step schedule replays bit for bit like the fixed slip speed; driving
    straight with all three wheels at w = 2 rad/s from the start, slip_ratio k equals the fixed slip
    speed slip_speed + k r |w| (to float32 round-off)."""
    sim = OstrichReplay()
    turn = stub_run("turn", 5.0)
    plain = sim.rollout([turn], THETA, DT)[0]
    batch, Q, _ = sim._run([turn], [sim._theta(THETA)], DT, schedule=["slip_ratio"])
    assert np.array_equal(sim._sample(batch, [turn], Q, DT)[0][0], plain)
    straight = constant_run("straight", 2.0 * R_WHEEL, 0.0, 4.0)
    a = sim.rollout([straight], {**THETA, "slip_ratio": 0.5}, DT)[0]
    b = sim.rollout([straight], {**THETA, "slip_speed": 0.1 + 0.5 * R_WHEEL * 2.0}, DT)[0]
    assert np.abs(a[:, 1:] - b[:, 1:]).max() < 1e-5
    assert np.abs(a[:, 1:] - sim.rollout([straight], THETA, DT)[0][:, 1:]).max() > 1e-3  # it does matter


def steady_turn_efficiency(sim: OstrichReplay, theta: dict) -> dict[str, float]:
    """Steady yaw rate / the wheels' r (wR - wL) / track over 3-7 s of three held commands."""
    scen = {"right turn": (0.52, -0.6), "circle": (0.35, 0.8), "pivot": (0.0, 1.6)}
    runs = [constant_run(k, v, w) for k, (v, w) in scen.items()]
    out = {}
    for (k, (_v, w)), p in zip(scen.items(), sim.rollout(runs, theta, DT), strict=True):
        m = (p[:, 0] > 3) & (p[:, 0] < 7)
        out[k] = float(np.polyfit(p[m, 0], np.unwrap(quat_yaw(p[m, 4:8])), 1)[0] / w)
    return out


def test_slip_ratio_lets_a_pivot_turn_less_than_a_rolling_turn():
    """With a slip speed independent of rolling (slip_ratio 0) a skid-steer replay turns a pivot on
    the spot at least as efficiently as a rolling circle, at any (mu, mu_lateral, slip_speed) of a
    grid; the real robot turns pivots at 0.59 and its circle at 0.70 (09_55_01, left_circle; the
    report's turn-efficiency table). With slip_ratio 2 the rear wheel, dragged sideways without
    rolling in the pivot, slides at once while rolling wheels stay in their linear region: the
    pivot's efficiency drops below the circle's by more than 0.15."""
    sim = OstrichReplay()
    for mu, mu_lat in ((0.3, 0.15), (0.5, 0.28)):
        for vs in (0.02, 0.1):
            e = steady_turn_efficiency(sim, {**THETA, "mu": mu, "mu_lateral": mu_lat, "slip_speed": vs})
            print(f"slip_ratio 0, mu {mu}, mu_lateral {mu_lat}, slip_speed {vs}: {e}")
            assert e["pivot"] >= e["circle"] - 0.01, e
    e = steady_turn_efficiency(sim, {**THETA, "mu": 0.5, "mu_lateral": 0.28, "slip_speed": 0.02, "slip_ratio": 2.0})
    print(f"slip_ratio 2: {e}")
    assert e["pivot"] < e["circle"] - 0.15 and 0.6 < e["circle"] < 0.9 and 0.6 < e["right turn"] < 0.9, e


def test_slip_ratio_adjoint_matches_finite_differences():
    """d(sum_i c_i . pose_i)/d(slip_ratio, slip_speed, mu_lateral) through the adjoint against
    central differences (1 % steps) on a turn and a slalom at slip_ratio 0.8; at slip_ratio 0 (its
    lower bound) against the Richardson-extrapolated one-sided difference 2 D(h) - D(2h)."""
    sim = OstrichReplay()
    runs = [stub_run(k, 5.0, seed=i) for i, k in enumerate(("turn", "slalom"))]
    theta = {**THETA, "slip_ratio": 0.8}
    names = ["slip_ratio", "slip_speed", "mu_lateral"]
    assert_adjoint_matches_fd(sim, runs, theta, DT, names, rel_step=1e-2, rtol=1e-2)
    zero = {**theta, "slip_ratio": 0.0}
    (g0,), scalar = adjoint_and_scalar(sim, runs, zero, DT, ["slip_ratio"])  # the same cotangents (seed 0)
    h, base = 1e-3, scalar(zero)
    d1 = (scalar({**zero, "slip_ratio": h}) - base) / h
    d2 = (scalar({**zero, "slip_ratio": 2 * h}) - base) / (2 * h)
    rel = abs(g0 - (2 * d1 - d2)) / abs(2 * d1 - d2)
    print(f"d/dslip_ratio at 0: adjoint {g0:.6g}, extrapolated one-sided FD {2 * d1 - d2:.6g}, "
          f"relative error {rel:.2e}")
    assert rel < 1e-2


def test_step_arrays_are_checked():
    sim = OstrichReplay()
    run = constant_run("straight", 0.5, 0.0, 1.0)
    batch, _Q, _ = sim._run([run], [sim._theta(THETA)], DT)
    q0, qd0 = sim._initial_state(batch, [run], sim._nuisance([run], None))
    n = batch.solver.shape_slip.shape[0]
    with pytest.raises(EngineError, match="not a parameter array"):
        batch.sim.forward(q0, qd0, 3, step_arrays={"shape_friction": np.zeros((3, n))})
    with pytest.raises(EngineError, match="must have shape"):
        batch.sim.forward(q0, qd0, 3, step_arrays={"shape_slip": np.zeros((2, n))})
    with pytest.raises(ValueError, match="slip_ratio >= 0"):
        sim.rollout([run], {**THETA, "slip_ratio": -0.1}, DT)
