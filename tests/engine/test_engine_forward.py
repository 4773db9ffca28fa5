"""Forward tests of the Ostrich engine against closed-form mechanics (issue 2, "Must show").

Every test states the equation it checks. Tolerances are float32 round-off, the Newton
tolerance, or an O(h) integration bound, as stated per test. Figures are printed (pytest -s).
"""

from __future__ import annotations

import math

import newton
import numpy as np
import pytest
import warp as wp

from sysid.engine import SolverOptions, SolverOstrich
from sysid.robot.scenes import WorldSpec, sinusoid_terrain, terrain_height
from tests.helpers.engine import (
    G,
    box_model,
    chassis_track,
    drive,
    initial_state,
    robot_scene,
    rolling_state,
    rollout,
    set_gravity,
    wheel_control,
    wheel_rates,
    yaw_of,
)


@pytest.fixture(scope="module")
def robot_rest():
    scene = robot_scene(1)
    r, _ = drive(scene, (0.0, 0.0, 0.0), 0.1, 10.0)
    return scene, r

# ------------------------------------------------------------------------------------ 1. free fall


def test_free_fall_backward_euler_exact_and_half_g_t2() -> None:
    """Backward Euler: v_n = -g h n and z_n = z0 - g h^2 n (n+1) / 2 exactly (float32 round-off);
    versus the continuous z(t) = z0 - g t^2 / 2 the error is g h t / 2, i.e. O(h)."""
    z0, T = 10.0, 1.0
    errs = {}
    for h in (0.01, 0.005):
        model = box_model(z=z0, ground=False)
        n = int(round(T / h))
        r = rollout(model, SolverOstrich(model), n, h)
        k = np.arange(1, n + 1)
        z = r.q[:, 0, 2]
        vz = r.qd[:, 0, 2]
        z_disc = z0 - G * h * h * k * (k + 1) / 2
        # float32: |z| <= 10 m has ulp 1e-6 m; n <= 200 additions -> < 2e-4 m
        assert np.max(np.abs(z - z_disc)) < 2e-4
        assert np.max(np.abs(vz + G * h * k)) < 1e-4
        assert np.max(np.abs(r.q[:, 0, :2])) == 0.0
        t = k * h
        err = np.abs(z - (z0 - 0.5 * G * t * t))
        # exact discrete-minus-continuous gap: g h t / 2 (plus round-off)
        assert np.all(err <= 0.5 * G * h * t + 2e-4)
        errs[h] = float(err[-1])
        print(f"free fall h={h}: |z - discrete| max {np.max(np.abs(z - z_disc)):.2e} m, "
              f"|z - g t^2/2| at t=1 s {err[-1]:.4f} m (bound g h t/2 = {0.5 * G * h * T:.4f})")
    # first order: halving h halves the error
    assert errs[0.005] / errs[0.01] == pytest.approx(0.5, abs=0.01)


# ------------------------------------------------------------------------------ 2. resting bodies


def test_resting_box_no_penetration_no_drift() -> None:
    """A box resting on the ground stays at z = hz (gap >= -1 mm), x = y = yaw = 0 for 10 s at h = 0.1 s."""
    half = (0.2, 0.2, 0.1)
    model = box_model(half=half)
    r = rollout(model, SolverOstrich(model), 100, 0.1)
    q = r.q[:, 0]
    pen = half[2] - q[:, 2].min()
    drift = np.max(np.hypot(q[:, 0], q[:, 1]))
    yaw = np.max(np.abs(yaw_of(q[:, 3:7])))
    print(f"resting box: max penetration {pen * 1e3:.3f} mm, xy drift {drift * 1e3:.4f} mm, yaw {yaw:.2e} rad, "
          f"z range [{q[:, 2].min():.6f}, {q[:, 2].max():.6f}]")
    assert np.all(np.isfinite(q))
    assert pen < 1e-3
    assert q[:, 2].max() - half[2] < 1e-3  # no bouncing up either
    assert drift < 1e-3
    assert yaw < 1e-3
    assert not r.diverged.any()


def test_resting_robot_no_penetration_no_drift(robot_rest) -> None:
    """The robot standing on flat ground with zero wheel targets stays at its base height
    (wheel rims: gap >= -1 mm) and does not drift in x, y or yaw over 10 s at h = 0.1 s."""
    scene, r = robot_rest
    tr = chassis_track(scene, r)
    z0 = scene.robot.base_height
    pen = z0 - tr[:, 2].min()
    drift = np.max(np.hypot(tr[:, 0], tr[:, 1]))
    yaw = np.max(np.abs(tr[:, 3]))
    print(f"resting robot: max penetration {pen * 1e3:.3f} mm, z rise {(tr[:, 2].max() - z0) * 1e3:.3f} mm, "
          f"xy drift {drift * 1e3:.3f} mm, yaw drift {yaw:.2e} rad")
    assert np.all(np.isfinite(r.q))
    assert pen < 1e-3
    assert tr[:, 2].max() - z0 < 1e-3
    assert drift < 1e-3
    assert yaw < 1e-3


# ---------------------------------------------------------------------------- 3. Coulomb friction


def _slide(h: float, v0: float = 2.0, mu: float = 0.5, T: float = 0.6, options: SolverOptions | None = None):
    model = box_model(mu=mu)
    s = model.state()
    s.body_qd.assign(np.array([[v0, 0, 0, 0, 0, 0]], dtype=np.float32))
    return rollout(model, SolverOstrich(model, options), int(round(T / h)), h, state=s)


# the paper's plain clamp with eq. 7's W (the default is friction_safeguard="newton"), kept as a regression figure
CLAMP = SolverOptions(friction_safeguard="clamp")
SLIDE_CLAMP_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="friction_safeguard='clamp', h=0.1 s: the stop step (exact v_4 = 0.038 m/s) does not converge within "
    "16 x 16 (residual 0.61 m/s): v_4 = 0, friction impulse 0.528 vs the cone mu g h = 0.4905 m/s (8 % over), "
    "stop at 0.400 s < v0/(mu g) = 0.4077 s; the box's four corner contacts trade friction in a 2-cycle",
)
SLIDE_PROJ_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="friction_safeguard='projected', h=0.1 s: inside the cone now (v_4 = 0.0453 vs exact 0.038 m/s, "
    "residual 0.033) but v_5 = 0.0033 m/s where the exact step sticks, so it stops at 0.6 s > t* + h = 0.508 s",
)
PROJECTED = SolverOptions(friction_safeguard="projected")


@pytest.mark.parametrize(
    "h,options",
    [(0.001, None), (0.01, None), (0.1, None),
     pytest.param(0.1, PROJECTED, marks=SLIDE_PROJ_XFAIL), pytest.param(0.1, CLAMP, marks=SLIDE_CLAMP_XFAIL)],
    ids=["1ms", "10ms", "100ms", "100ms-projected", "100ms-clamp"],
)
def test_sliding_block_decelerates_at_mu_g_and_stops_on_time(h: float, options) -> None:
    """A box sliding at v0 on the ground decelerates at a = mu g and stops at t* = v0 / (mu g)
    (v0 = 2 m/s, mu = 0.5: a = 4.905 m/s^2, t* = 0.4077 s) at every step size: backward Euler
    with impulse-level Coulomb friction gives v_n = v0 - mu g h n until it sticks, so the measured
    stop (first v_n = 0) lies in [t*, t* + h] and no step removes more than mu g h (the Coulomb
    cone); the stopping distance matches v0^2/(2 mu g) to O(v0 h)."""
    v0, mu = 2.0, 0.5
    r = _slide(h, v0, mu, options=options)
    vx = r.qd[:, 0, 0]
    t = h * np.arange(1, len(vx) + 1)
    sliding = vx > 0.05 * v0
    slope = np.polyfit(t[sliding], vx[sliding], 1)[0] if sliding.sum() >= 2 else -(v0 - vx[0]) / h
    t_stop = float(t[np.argmax(np.abs(vx) < 1e-4)])
    t_star = v0 / (mu * G)
    dist = float(r.q[-1, 0, 0])
    d_star = v0 * v0 / (2 * mu * G)
    print(f"sliding h={h}: decel {-slope:.4f} m/s^2 (mu g = {mu * G:.4f}), stop {t_stop:.4f} s "
          f"(v0/(mu g) = {t_star:.4f}), distance {dist:.4f} m (closed form {d_star:.4f})")
    assert np.all(np.isfinite(r.q))
    assert -slope == pytest.approx(mu * G, rel=2e-3)  # Newton tol 1e-6 m/s against 0.5 m/s per step
    dv = -np.diff(np.concatenate([[v0], vx]))
    print(f"  largest per-step velocity drop {dv.max():.4f} m/s (cone mu g h = {mu * G * h:.4f}), "
          f"max residual {r.residual.max():.2e}")
    assert dv.max() <= mu * G * h * (1 + 1e-3) + 1e-5
    assert t_star - 1e-6 <= t_stop <= t_star + h + 1e-6
    assert np.all(np.abs(vx[t > t_star + h]) < 1e-4)  # stays stopped
    assert abs(dist - d_star) <= v0 * h + 1e-3
    assert np.max(np.abs(r.q[:, 0, 1])) < 1e-4 and np.max(np.abs(r.q[:, 0, 2] - 0.1)) < 1e-3


ACTIVE = SolverOptions(friction_safeguard="active")  # the former default, kept as the "before" figure


@pytest.mark.parametrize("h", [0.01, 0.05, 0.1])
def test_exact_coulomb_sliding_stop_converges_every_step(h: float) -> None:
    """Issue 21.1, exact Coulomb (slip_speed 0) through the stick/slip switch. The sliding box
    (v0 = 2 m/s, mu = 0.5) has the closed form of backward Euler with impulse-level Coulomb friction:
    v_n = v0 - mu g h n while v0 - mu g h n > 0 (the stopping step ends at that remainder, at
    h = 0.1 s v_4 = 2 - 4 * 0.4905 = 0.038 m/s), then v_n = 0 (sticking: the needed impulse m v_{n-1}
    is inside the cone mu m g h). Every step's returned Newton residual is below 1e-5 m/s (measured
    max 1e-6); the former active-set weight ended the stopping step at 0.053 m/s with a residual of
    0.056 (checked below as the "before" figure)."""
    v0, mu = 2.0, 0.5
    r = _slide(h, v0, mu)
    vx = r.qd[:, 0, 0]
    n = np.arange(1, len(vx) + 1)
    closed = np.maximum(v0 - mu * G * h * n, 0.0)
    res = r.residual[:, 0]
    print(f"h={h}: residual max {res.max():.2e}, share below 1e-5 {np.mean(res < 1e-5):.0%}, "
          f"|v - closed form| max {np.abs(vx - closed).max():.2e} m/s")
    assert res.max() < 1e-5
    # 2e-4 m/s: in the first step the box settles into the contact compliance (vz ~ -c g h), so its
    # normal impulse, and the friction with it, falls short of m g h by about that much; the later
    # sliding steps to 2e-5 m/s; once stuck the centre of mass moves by at most 5e-5 m/s (measured
    # -3.3e-5 at h = 0.1 s in the step after the stop, converged: the box pitches back on the
    # compliant corners as the friction torque of the deceleration vanishes, vx = hz w_y)
    sliding = closed > 0
    np.testing.assert_allclose(vx, closed, atol=2e-4)
    np.testing.assert_allclose(vx[1:][sliding[1:]], closed[1:][sliding[1:]], atol=2e-5)
    assert np.abs(vx[~sliding]).max() < 5e-5
    if h == 0.1:
        before = _slide(h, v0, mu, options=ACTIVE)
        assert before.residual.max() > 1e-2 and abs(before.qd[3, 0, 0] - 0.038) > 1e-2


@pytest.mark.parametrize("options,bound", [(None, 1e-5), (ACTIVE, None)], ids=["newton", "active"])
def test_incline_stick_converges_every_step(options, bound) -> None:
    """Issue 21.1: the box (mu = 0.5) at rest on the tan(theta) = 0.4 incline sticks (the friction
    impulse m g sin(theta) h is inside the cone mu m g cos(theta) h, split over four corners whose
    share is indeterminate), h = 0.05 s: with the semismooth rows every one of the 40 steps ends below
    1e-5 m/s (measured max 6.6e-7); the active-set weight leaves 60 % of them unconverged (up to
    0.17 m/s) while the box still sticks."""
    th = math.atan(0.4)
    model = box_model(mu=0.5)
    set_gravity(model, (G * math.sin(th), 0.0, -G * math.cos(th)))
    r = rollout(model, SolverOstrich(model, options), 40, 0.05)
    res = r.residual[:, 0]
    print(f"incline stick ({'newton' if options is None else 'active'}): residual max {res.max():.2e}, "
          f"share below 1e-5 {np.mean(res < 1e-5):.0%}, displacement {abs(r.q[-1, 0, 0]) * 1e3:.4f} mm")
    assert np.max(np.abs(r.q[:, 0, 0])) < 1e-3
    if bound is not None:
        assert res.max() < bound
    else:
        assert np.mean(res < 1e-5) < 0.7 and res.max() > 1e-2


TUNED = SolverOptions(newton_iters=64, pcr_iters=32)


@pytest.mark.parametrize(
    "tan_theta,options",
    [(0.4, None), (0.7, None), (0.7, TUNED),
     (0.4, PROJECTED), (0.7, PROJECTED)],
    ids=["stick", "slide-default", "slide-64x32", "stick-projected", "slide-projected"],
)
def test_block_on_incline_sticks_below_mu_and_slides_above(tan_theta: float, options) -> None:
    """Gravity tilted by theta (an incline under a flat ground plane): with mu = 0.5 the block
    sticks for tan(theta) = 0.4 < mu (displacement < 1 mm over 2 s) and slides for 0.7 > mu with
    a = g (sin(theta) - mu cos(theta)) (0.7: 1.607 m/s^2), measured from v_n to 1 %. With 64 x 32
    iterations the first step from rest is still unconverged (residual ~0.6 m/s, v_1 = 0), so the
    slope is fitted from step 2 on."""
    mu, h = 0.5, 0.05
    th = math.atan(tan_theta)
    model = box_model(mu=mu)
    set_gravity(model, (G * math.sin(th), 0.0, -G * math.cos(th)))
    r = rollout(model, SolverOstrich(model, options), 40, h)
    x = r.q[:, 0, 0]
    vx = r.qd[:, 0, 0]
    t = h * np.arange(1, len(vx) + 1)
    a_star = G * (math.sin(th) - mu * math.cos(th))
    assert np.all(np.isfinite(r.q))
    if tan_theta < mu:
        print(f"incline tan={tan_theta}: displacement {abs(x[-1]) * 1e3:.4f} mm after 2 s (sticks)")
        assert np.max(np.abs(x)) < 1e-3
        assert np.max(np.abs(vx)) < 1e-3
    else:
        a = np.polyfit(t[1:], vx[1:], 1)[0]
        print(f"incline tan={tan_theta}: a {a:.4f} m/s^2 (closed form {a_star:.4f}), v_1 {vx[0]:.4f} m/s, "
              f"residual step 1 {r.residual[0, 0]:.2e}, max later {r.residual[1:].max():.2e}")
        assert a == pytest.approx(a_star, rel=1e-2)
        assert np.max(np.abs(r.q[:, 0, 2] - 0.1)) < 1e-3  # stays on the plane




@pytest.mark.parametrize("h", [0.01, 0.1])
@pytest.mark.parametrize("tan_theta,vs", [(0.3, 0.1), (0.45, 0.02), (0.3, 0.001)])
def test_regularised_friction_creeps_at_closed_form_speed(h: float, tan_theta: float, vs: float) -> None:
    """Friction with a slip speed v_s (`set_slip_speed`) is mu N v / sqrt(v^2 + v_s^2). On the
    incline (tan(theta) < mu = 0.5) the block creeps at the speed where it balances gravity:
    mu cos(theta) v / sqrt(v^2 + v_s^2) = sin(theta)  =>  v* = v_s tan / sqrt(mu^2 - tan^2)
    (0.3, 0.1: 0.075 m/s; 0.45, 0.02: 0.0413 m/s; 0.3, 0.001: 7.5e-4 m/s, nearly Coulomb sticking).
    The discrete steady state of backward Euler is that balance exactly, at any h; every step
    converges (the law is smooth; a steep one, small v_s, more slowly: the weight is lagged per
    iteration), so v after 3 s matches v* to 0.1 %."""
    mu = 0.5
    th = math.atan(tan_theta)
    model = box_model(mu=mu)
    set_gravity(model, (G * math.sin(th), 0.0, -G * math.cos(th)))
    solver = SolverOstrich(model)
    solver.set_slip_speed(np.arange(model.shape_count), vs)
    r = rollout(model, solver, int(round(3.0 / h)), h)
    v_star = vs * tan_theta / math.sqrt(mu * mu - tan_theta * tan_theta)
    v = r.qd[-1, 0, 0]
    print(f"regularised friction h={h} tan={tan_theta} v_s={vs}: v {v:.6f} m/s (closed form {v_star:.6f}), "
          f"max residual {r.residual.max():.1e}")
    assert r.residual.max() < 1e-3  # the replays' "unconverged" mark (sysid.simulators.protocol.UNCONVERGED)
    assert v == pytest.approx(v_star, rel=1e-3, abs=2e-6)
    assert np.max(np.abs(r.q[:, 0, 2] - 0.1)) < 1e-3
# ---------------------------------------------------------------------------------- 4. servo/drive


def _spinner(kd: float, I: float, ke: float = 0.0) -> newton.Model:
    """A disc on a revolute joint to the world about y, with a PD servo (target_ke, target_kd)."""
    b = newton.ModelBuilder()
    body = b.add_link(xform=wp.transform_identity(), mass=5.0, inertia=wp.mat33(0.2, 0, 0, 0, I, 0, 0, 0, 0.2))
    mode = newton.JointTargetMode.POSITION if ke > 0 else newton.JointTargetMode.VELOCITY
    j = b.add_joint_revolute(-1, body, axis=(0.0, 1.0, 0.0), target_ke=ke, target_kd=kd, actuator_mode=mode)
    b.add_articulation([j])
    return b.finalize(device="cpu")


def test_wheel_servo_reaches_target_speed_implicitly() -> None:
    """Implicit velocity servo (eq. 8), I dw/dt = kd (w* - w): backward Euler gives
    w_n = w* (1 - rho^n), rho = I / (I + h kd), unconditionally stable (h kd / I = 125 here)."""
    I, kd, w_star = 0.389, 250.0, 1.0 / 0.36
    out = {}
    for h in (0.002, 0.1):
        model = _spinner(kd, I)
        c = model.control()
        c.joint_target_qd.assign(np.array([w_star], dtype=np.float32))
        r = rollout(model, SolverOstrich(model), 20, h, control=c)
        w = r.qd[:, 0, 4]
        n = np.arange(1, 21)
        rho = I / (I + h * kd)
        closed = w_star * (1 - rho**n)
        out[h] = float(np.max(np.abs(w - closed)))
        print(f"servo h={h}: max |w - w*(1-rho^n)| {out[h]:.2e} rad/s, final w {w[-1]:.5f} (target {w_star:.5f})")
        assert np.all(np.isfinite(r.q))
        assert out[h] < 1e-3 * w_star
        assert np.max(np.abs(r.q[:, 0, :3])) < 1e-5  # the joint holds the disc in place


W_DRIVE = 1.0 / 0.36  # [rad/s] wheel target for 1 m/s with r = 0.36 m


@pytest.fixture(scope="module")
def robot_straight():
    scene = robot_scene(1)
    r, _ = drive(scene, (W_DRIVE, W_DRIVE, W_DRIVE), 0.1, 5.0)
    return scene, r


def test_robot_drives_straight_at_r_omega(robot_straight) -> None:
    """All three wheels at w = 2.778 rad/s: rolling without slip gives v = r w = 1.000 m/s along x,
    no lateral motion and no yaw. Checked on the last 2 s: speed within 0.5 %, wheels at their
    target within 0.5 %, |y| < 1 cm and |yaw| < 5 mrad over 5 s at h = 0.1 s."""
    scene, r = robot_straight
    tr = chassis_track(scene, r)
    h = 0.1
    v = np.diff(tr[-21:, 0]) / h
    wr = wheel_rates(scene, r)[-20:]
    r_w = scene.robot.wheel_radius
    print(f"straight: v {v.mean():.5f} m/s (r w = {r_w * W_DRIVE:.5f}), wheel rates {wr.mean(0).round(5)}, "
          f"|y| {np.abs(tr[:, 1]).max() * 1e3:.3f} mm, |yaw| {np.abs(tr[:, 3]).max():.2e} rad, "
          f"max residual {r.residual.max():.2e}")
    assert np.all(np.isfinite(r.q))
    assert v.mean() == pytest.approx(r_w * W_DRIVE, rel=5e-3)
    assert np.all(np.abs(wr / W_DRIVE - 1) < 5e-3)
    assert np.abs(tr[:, 1]).max() < 0.01
    assert np.abs(tr[:, 3]).max() < 5e-3
    assert np.abs(tr[:, 2] - scene.robot.base_height).max() < 2e-3


def test_robot_turns_in_place_with_opposite_wheels() -> None:
    """Left -w, right +w, rear 0 (w = 2.778 rad/s). A pure rotation about the axle midpoint moves
    the rear wheel's contact (0.697 m behind it) only sideways, so a rolling target of 0 is the
    consistent skid-steer command; its sideways scrub (Coulomb, mu 0.8) slows the turn below the
    kinematic yaw rate 2 r w / track = 2.778 rad/s. Checks: yaw rate positive (CCW), between 50 %
    and 100 % of kinematic, base drifting < 10 cm from the start over 5 s at h = 0.1 s."""
    scene = robot_scene(1)
    r, _ = drive(scene, (-W_DRIVE, W_DRIVE, 0.0), 0.1, 5.0)
    tr = chassis_track(scene, r)
    yaw = np.unwrap(tr[:, 3])
    rate = (yaw[-1] - yaw[9]) / (0.1 * (len(yaw) - 10))
    ideal = 2 * scene.robot.wheel_radius * W_DRIVE / scene.robot.track_width
    drift = np.hypot(tr[:, 0], tr[:, 1]).max()
    print(f"turn in place: yaw rate {rate:.4f} rad/s ({rate / ideal:.1%} of kinematic {ideal:.4f}), "
          f"max base drift {drift * 100:.2f} cm, |z - z0| {np.abs(tr[:, 2] - 0.36).max() * 1e3:.2f} mm, "
          f"max residual {r.residual.max():.2e}, steps with residual > 1e-3: {(r.residual > 1e-3).mean():.0%}")
    assert np.all(np.isfinite(r.q))
    assert 0.5 * ideal < rate <= ideal
    assert drift < 0.10
    assert np.abs(tr[:, 2] - scene.robot.base_height).max() < 0.01


# -------------------------------------------------------------------------------- 5. pallet climb

PALLET_H = (0.1, 0.05, 0.005)


@pytest.fixture(scope="module")
def pallet_tracks():
    """Chassis tracks over the 14.4 cm pallet (centre x = 2 m) for 6 s at each step of PALLET_H."""
    out = {}
    for h in PALLET_H:
        scene = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
        r, _ = drive(scene, (W_DRIVE, W_DRIVE, W_DRIVE), h, 6.0)
        out[h] = (chassis_track(scene, r), r)
    return out


@pytest.mark.parametrize("h", [0.1, 0.05])
def test_robot_climbs_pallet_at_large_steps(pallet_tracks, h: float) -> None:
    """Driving at 1 m/s over the pallet: finite, no diverged step, the chassis rises by the pallet
    height 0.144 m (plateau median within 2 mm, peak overshoot < 2 cm), comes back to 0.36 m and
    reaches x > 5.5 m after 6 s."""
    tr, r = pallet_tracks[h]
    z = tr[:, 2]
    on = (tr[:, 0] > 1.8) & (tr[:, 0] < 2.2)
    rise = float(np.median(z[on]) - 0.36)
    print(f"pallet h={h}: rise {rise:.4f} m (0.144), peak z {z.max():.4f}, final {tr[-1].round(4)}, "
          f"max residual {r.residual.max():.2e}, unconverged steps (>1e-3) {(r.residual > 1e-3).mean():.0%}")
    assert np.all(np.isfinite(r.q)) and not r.diverged.any()
    assert rise == pytest.approx(0.144, abs=2e-3)
    assert z.max() < 0.36 + 0.144 + 0.02
    assert abs(z[-1] - 0.36) < 2e-3
    assert tr[-1, 0] > 5.5


def _track_error(pallet_tracks, h: float) -> tuple[float, float]:
    """Max and final chassis-position distance [m] between step h and the 5 ms reference at the same times."""
    ref = pallet_tracks[0.005][0]
    tr = pallet_tracks[h][0]
    s = int(round(h / 0.005))
    d = np.linalg.norm(tr[:, :3] - ref[s - 1 :: s][: len(tr), :3], axis=1)
    return float(d.max()), float(d[-1])


def test_pallet_traversal_converges_with_wheel_pins() -> None:
    """Issue 21.1, the robot's exact Coulomb wheels: driving at 1 m/s over the pallet from standstill
    (benchmarks/bench_engine.py's scene, 60 steps at h = 0.1 s), wheel targets r w = 1 m/s. With the
    default options (16 Newton iterations, the wheels on the semismooth rows from iteration 4,
    pin_wheels_from=4, the sliding magnitudes solved with the step, pin_coupled, their proximal term
    fading from iteration 8, the residual in the energy metric) every step ends below 1e-5 m/s
    (measured worst 5.0e-6; without the fading term the pallet-edge step ends at 1.19e-5; the options
    before issue 21's last change, pin_wheels_from=0, left 0.80). The former
    rows (pin_wheels_from=0, pin_coupled=False: the lagged active-set weight of a wheel sliding on the
    cone's edge converges linearly) leave the pallet edge above 1e-3 even with 64 iterations (measured
    9.6e-3). It climbs the 0.144 m pallet and ends near x = 5.9 m either way."""
    out = {}
    for name, opts in (("default", SolverOptions()),
                       ("lagged-64", SolverOptions(newton_iters=64, pin_wheels_from=0, pin_coupled=False))):
        sc = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
        s0 = initial_state(sc)
        r = rollout(sc.model, SolverOstrich(sc.model, opts), 60, 0.1, state=s0,
                    control=wheel_control(sc, (1.0 / 0.36,) * 3))
        out[name] = r
        tr = chassis_track(sc, r)
        print(f"pallet traversal ({name}): residual max {r.residual.max():.2e}, share below 1e-5 "
              f"{np.mean(r.residual < 1e-5):.0%}, final x {tr[-1, 0]:.3f} m, peak z {tr[:, 2].max():.3f} m")
        assert tr[-1, 0] > 5.5 and tr[:, 2].max() > 0.36 + 0.13
    assert out["default"].residual.max() < 1e-5
    assert out["lagged-64"].residual.max() > 1e-3


def test_pallet_trajectory_converges_to_5ms_reference(pallet_tracks) -> None:
    """Backward Euler is first order: the distance to the h = 5 ms trajectory (same times) shrinks
    with h. Measured: the implicit servo spins the wheels up within the first step, a constant
    along-track lead of about h v / 3 (3.3 cm at 0.1 s, 1.9 cm at 0.05 s), plus the climb and the
    drop taken in fewer, larger steps. Measured 2026-12-02 (wheel-box geometry at the step's
    midpoint): h = 0.1 s 9.21 cm, h = 0.05 s 5.36 cm; from a rolling or soft start (below) the
    spin-up step goes and both stay within 3 cm. Checks: h = 0.05 s within 6 cm;
    error(0.05) < 0.65 error(0.1)."""
    e1, f1 = _track_error(pallet_tracks, 0.1)
    e05, f05 = _track_error(pallet_tracks, 0.05)
    print(f"pallet vs 5 ms reference: h=0.1 max {e1 * 100:.2f} cm (final {f1 * 100:.2f}), "
          f"h=0.05 max {e05 * 100:.2f} cm (final {f05 * 100:.2f})")
    assert e05 < 0.06
    assert e05 < 0.65 * e1


@pytest.mark.xfail(
    strict=True,
    reason="h=0.1 s deviates 9.21 cm (max; 8.13 cm final) from the 5 ms reference (h=0.05 s: 5.36 cm) after a step "
    "command from standstill: first-order integration error, the one-step wheel spin-up (a traction-limited launch "
    "of ~0.13 s, shorter than the step) leads by ~h v / 2 and the climb is taken in two or three steps. From a "
    "rolling start 2.86 cm, from a 0.5 s soft start 1.51 cm (tests below). Wheel-box geometry at the step's start: "
    "6.58 cm, at its end 11.9 cm, newton's reported edge points 8.45 cm (2026-12-02)",
)
def test_pallet_trajectory_h01_within_5cm_of_5ms_reference(pallet_tracks) -> None:
    """Issue 2: the h = 0.1 s trajectory stays within 5 cm of the h = 5 ms reference."""
    e1, _ = _track_error(pallet_tracks, 0.1)
    assert e1 < 0.05


@pytest.fixture(scope="module")
def pallet_rolling():
    """Tracks over the pallet from a rolling start (1 m/s, wheels at their target) at h = 0.1 s and 5 ms."""
    out = {}
    for h in (0.1, 0.005):
        scene = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
        solver = SolverOstrich(scene.model)
        r = rollout(scene.model, solver, int(round(6.0 / h)), h, state=rolling_state(scene, 1.0, W_DRIVE),
                    control=wheel_control(scene, (W_DRIVE, W_DRIVE, W_DRIVE)))
        out[h] = chassis_track(scene, r)
    return out


def test_pallet_trajectory_h01_from_rolling_start_within_5cm(pallet_rolling) -> None:
    """Without the launch transient (both runs start rolling at 1 m/s), the h = 0.1 s trajectory over
    the pallet stays within 5 cm of the 5 ms one (measured 2.86 cm)."""
    ref, tr = pallet_rolling[0.005], pallet_rolling[0.1]
    d = np.linalg.norm(tr[:, :3] - ref[19::20][: len(tr), :3], axis=1)
    print(f"pallet rolling start: h=0.1 vs 5 ms max {d.max() * 100:.2f} cm at t = {0.1 * (np.argmax(d) + 1):.1f} s, "
          f"final {d[-1] * 100:.2f} cm")
    assert d.max() < 0.05


@pytest.fixture(scope="module")
def pallet_soft_start():
    """Tracks over the pallet from standstill with a soft-start command: wheel targets ramp linearly
    to 1 m/s over the first 0.5 s, each step taking the ramp's average over the step (as the
    replays step-average logged commands), at h = 0.1 s and 5 ms."""
    out = {}
    ramp = 0.5  # [s]
    for h in (0.1, 0.005):
        scene = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
        solver = SolverOstrich(scene.model)
        s0, s1 = initial_state(scene), scene.model.state()
        track, res = [], []

        def ramp_integral(t: float) -> float:  # integral of min(t / ramp, 1)
            return t * t / (2 * ramp) if t < ramp else t - ramp / 2

        for k in range(int(round(6.0 / h))):
            frac = (ramp_integral((k + 1) * h) - ramp_integral(k * h)) / h
            solver.step(s0, s1, wheel_control(scene, (W_DRIVE * frac,) * 3), None, h)
            s0, s1 = s1, s0
            track.append(s0.body_q.numpy()[scene.handles[0].chassis, :3].copy())
            res.append(float(solver.status().residual.max()))
        out[h] = (np.asarray(track), np.asarray(res))
    return out


def test_pallet_trajectory_h01_soft_start_within_5cm(pallet_soft_start) -> None:
    """Issue 2's criterion from standstill with a command the step resolves (a 0.5 s soft start, the
    shape of the sample's logged commands): the h = 0.1 s chassis trajectory over the pallet stays
    within 5 cm of the 5 ms one at the same times (measured 1.51 cm). The
    step command above launches in a transient shorter than one 0.1 s step (traction-limited,
    about 0.13 s), which a first-order method cannot place to better than ~h v / 2."""
    (tr, res), (ref, _) = pallet_soft_start[0.1], pallet_soft_start[0.005]
    d = np.linalg.norm(tr - ref[19::20][: len(tr)], axis=1)
    print(f"pallet soft start: h=0.1 vs 5 ms max {d.max() * 100:.2f} cm at t = {0.1 * (np.argmax(d) + 1):.1f} s, "
          f"final {d[-1] * 100:.2f} cm, max residual {res.max():.1e}")
    assert tr[-1, 0] > 4.5 and np.abs(tr[:, 2] - 0.36).max() > 0.13  # it drove over the pallet
    assert d.max() < 0.05


# ------------------------------------------------------------------------------ 7. many worlds


def test_four_worlds_equal_four_single_world_runs() -> None:
    """Worlds are independent: four worlds with different wheel commands over a pallet give each
    world exactly the trajectory of the same scene solved alone (contacts sorted per world, one
    thread per world), so the difference must be float32 round-off at most (measured: bitwise 0)."""
    cmds = [(W_DRIVE, W_DRIVE, W_DRIVE), (-W_DRIVE, W_DRIVE, 0.0), (0.5 * W_DRIVE, W_DRIVE, 0.75 * W_DRIVE),
            (0.0, 0.0, 0.0)]
    scene4 = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0)) for _ in cmds])
    r4, _ = drive(scene4, cmds, 0.1, 3.0)
    diffs = []
    for i, c in enumerate(cmds):
        scene1 = robot_scene([WorldSpec(pallet=(2.0, 0.0, 0.0))])
        r1, _ = drive(scene1, c, 0.1, 3.0)
        for hw, h1 in zip([scene4.handles[i].chassis, *scene4.handles[i].wheels],
                          [scene1.handles[0].chassis, *scene1.handles[0].wheels]):
            diffs.append(max(np.abs(r4.q[:, hw] - r1.q[:, h1]).max(), np.abs(r4.qd[:, hw] - r1.qd[:, h1]).max()))
    x_end = [chassis_track(scene4, r4, i)[-1, 0] for i in range(4)]
    print(f"4 worlds vs single: max abs difference {max(diffs):.3e} (q and qd), final x per world {np.round(x_end, 3)}")
    assert np.all(np.isfinite(r4.q))
    assert max(diffs) < 1e-5
    assert len(set(np.round(x_end, 3))) == 4  # the commands really differ


# ------------------------------------------------------------------------------- 6. mesh terrain


def test_robot_drives_across_mesh_terrain() -> None:
    """10 s at h = 80 ms over the 12,800-triangle sum-of-sinusoids mesh (heights -0.14..0.10 m),
    wheels at 1 m/s: finite, no diverged step, the base stays at the wheel radius above the local
    terrain (0.36 m +- 5 cm: slopes are below 0.15, so the wheel contact lies within a few cm of
    the height under the base) and it makes progress (> 7 m of the ideal 10 m)."""
    verts, idx = sinusoid_terrain()
    scene = robot_scene(1, terrain=(verts, idx))
    r, _ = drive(scene, (W_DRIVE, W_DRIVE, W_DRIVE), 0.08, 10.0)
    tr = chassis_track(scene, r)
    ground = np.array([terrain_height(verts, 80, x, y) for x, y in tr[:, :2]])
    clear = tr[:, 2] - ground
    print(f"terrain: final {tr[-1].round(3)}, clearance [{clear.min():.4f}, {clear.max():.4f}] m (0.36), "
          f"terrain under path [{ground.min():.3f}, {ground.max():.3f}] m, max residual {r.residual.max():.2e}, "
          f"{r.seconds:.1f} s for 125 steps")
    assert np.all(np.isfinite(r.q)) and not r.diverged.any()
    assert np.all(np.abs(clear - 0.36) < 0.05)
    assert tr[-1, 0] > 7.0 and abs(tr[-1, 1]) < 1.0
    assert np.ptp(ground) > 0.1  # the path really crosses relief


# ------------------------------------------------------------------------- 8. non-finite guards

_EXTREME = {
    "absurd-dt": ((3.0, 0.0, -2.0, 0.0, 0.0, 0.0), 1.0e3),
    "huge-spin": ((0.0, 0.0, -5.0, 1.0e6, 0.0, 1.0e6), 0.1),
    "huge-velocity": ((0.0, 0.0, -1.0e8, 0.0, 0.0, 0.0), 0.1),
    "tiny-dt": ((0.0, 0.0, -2.0, 0.0, 0.0, 0.0), 1.0e-9),
}
@pytest.mark.parametrize(
    "case",
    ["absurd-dt", "huge-spin", "huge-velocity", "tiny-dt"],
)
def test_no_nan_leaves_a_step(case: str) -> None:
    """Extreme inputs (a box 0.2 m above the ground): every state after 10 steps is finite, and the
    status flags an abnormal first step (not converged, or diverged), except
    - tiny dt: converged, nothing moves beyond v h;
    - 1e8 m/s into the ground: the relative normal compliance c admits a penetration
      c h d_n lam_n per corner; with lam_n = m dv / 4 and d_n m = 1 + m |r x n|^2_{I^-1} = 5.8 for
      this box's corners, the converged step ends 1.45 c h |v0| (2,900 m) deep (checked to 5 %).
      The next step pushes that depth out in one step (29,000 m/s upward): harmless at real speeds
      (5 m/s: 0.15 mm, 1.5 mm/s)."""
    qd, h = _EXTREME[case]
    model = box_model(z=0.3)
    s = model.state()
    s.body_qd.assign(np.array([qd], dtype=np.float32))
    solver = SolverOstrich(model)
    s1 = model.state()
    flags: list[tuple[bool, bool, float]] = []
    flags_z: list[float] = []
    for _ in range(10):
        solver.step(s, s1, None, None, h)
        s, s1 = s1, s
        st = solver.status()
        assert np.all(np.isfinite(s.body_q.numpy())) and np.all(np.isfinite(s.body_qd.numpy()))
        assert np.isfinite(st.residual).all() or st.diverged.all()
        flags.append((bool(st.converged[0]), bool(st.diverged[0]), float(st.residual[0])))
        flags_z.append(float(s.body_q.numpy()[0, 2]))
    print(f"{case}: first step converged/diverged/residual {flags[0]}, final z {s.body_q.numpy()[0, 2]:.4g} m, "
          f"final |qd| {np.abs(s.body_qd.numpy()).max():.3g}")
    if case == "tiny-dt":
        assert flags[0][0] and abs(s.body_q.numpy()[0, 2] - 0.3) < 1e-6
    elif case == "huge-velocity":
        depth = 0.1 - flags_z[0]
        c = SolverOptions().contact_compliance
        r2 = 0.2**2 + 0.2**2  # corner lever arm about the x and y axes [m^2]
        dn_m = 1.0 + 10.0 * r2 / (10.0 / 3.0 * (0.2**2 + 0.1**2))
        expected = c * h * abs(qd[2]) * dn_m / 4.0
        print(f"  first-step depth {depth:.1f} m, compliance prediction {expected:.1f} m")
        assert flags[0][0] and depth == pytest.approx(expected, rel=0.05)
    else:
        assert not flags[0][0] or flags[0][1]


@pytest.mark.parametrize("h,gyro", [(0.01, True), (0.1, True), (0.1, False)])
def test_free_tumbling_box_does_not_gain_energy(h: float, gyro: bool) -> None:
    """Torque-free rotation conserves the kinetic energy w^T I w / 2; backward Euler may only
    dissipate, so E_n <= E_0 (1 + 1e-3) over 2 s (float32 round-off << 1e-3). The explicit
    gyroscopic impulse -h w x I w failed this (E x 227 at h = 0.01 s, 2e15 rad/s at 0.1 s); the
    engine now uses the linearly implicit one (kinematics.gyroscopic_impulse)."""
    model = box_model(z=5.0, ground=False)
    s = model.state()
    s.body_qd.assign(np.array([(0.0, 0.0, 0.0, 30.0, 0.0, 30.0)], dtype=np.float32))
    r = rollout(model, SolverOstrich(model, SolverOptions(gyroscopic=gyro)), int(round(2.0 / h)), h, state=s)
    I_body = model.body_inertia.numpy()[0].astype(np.float64)
    w0 = np.array([30.0, 0.0, 30.0])
    E0 = 0.5 * w0 @ I_body @ w0
    E = []
    for q, qd in zip(r.q[:, 0], r.qd[:, 0]):
        R = _rotmat(q[3:7])
        Iw = R @ I_body @ R.T
        E.append(0.5 * qd[3:] @ Iw @ qd[3:])
    E = np.asarray(E)
    w_max = np.abs(r.qd[:, 0, 3:]).max()
    print(f"tumbling box h={h} gyroscopic={gyro}: max E/E0 {E.max() / E0:.4g}, max |w| {w_max:.4g} rad/s")
    assert np.all(np.isfinite(r.qd))
    assert E.max() <= E0 * (1 + 1e-3)


def _rotmat(q: np.ndarray) -> np.ndarray:
    x, y, z, w = (float(v) for v in q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


# ---------------------------------------------------------------------------- 9. MuJoCo cross-check


def _mujoco_track(cmd: tuple[float, float, float], duration: float, every: float) -> np.ndarray:
    """(n, 4) base x, y, z [m], yaw [rad] of the robot in MuJoCo (1 ms, implicitfast, cylinder wheels,
    mu 0.8 everywhere, condim 3: sliding friction only, as in our engine), sampled every ``every`` s."""
    mujoco = pytest.importorskip("mujoco")
    from sysid.synth.mjcf import ContactParams, MjcfOptions, build_mujoco_model

    p = ContactParams(mu_wheel=0.8, mu_rear=0.8, mu_ground=0.8, mu_pallet=0.8, torsional=0.0, condim=3, kv=250.0)
    m = build_mujoco_model(params=p, options=MjcfOptions(timestep=1e-3, wheel_shape="cylinder"))
    d = mujoco.MjData(m)
    for name, v in zip(("left", "right", "rear"), cmd):
        d.ctrl[m.actuator(name).id] = v
    k_every = int(round(every / m.opt.timestep))
    out = []
    for k in range(int(round(duration / m.opt.timestep))):
        mujoco.mj_step(m, d)
        if (k + 1) % k_every == 0:
            qw, qx, qy, qz = d.qpos[3:7]
            out.append([*d.qpos[:3], math.atan2(2 * (qw * qz + qx * qy), 1 - 2 * (qy * qy + qz * qz))])
    return np.asarray(out)


def test_mujoco_cross_check_straight_and_turn(robot_straight) -> None:
    """Same robot (MJCF from robot.yaml), same wheel targets and servo gain, in MuJoCo at 1 ms.
    Straight at 1 m/s: both reach r w (speeds within 1 %) and the positions at equal times stay
    within 10 cm over 5 s (soft vs hard contact and the one-step spin-up lead of h = 0.1 s).
    Turning in place (left -w, right +w, rear 0): the yaw rates over 1-5 s are compared in
    magnitude. They differ by design of the contact models, not by noise: the rear wheel must scrub
    sideways, which MuJoCo's soft elliptic cone resists less than our hard Coulomb contact lets it,
    so MuJoCo turns slower. Measured 2026-12-03: ours 2.531 rad/s (0.91 of the kinematic skid-steer
    rate 2.778), MuJoCo 1.501 (0.54), ratio 1.69. Asserted: both rates positive and at most the
    kinematic rate (slip only slows a turn), ours within 0.85-0.97 of kinematic, MuJoCo within
    0.45-0.65 of it, and ours / MuJoCo within 1.69 +- 10 %."""
    scene, r = robot_straight
    ours = chassis_track(scene, r)
    mj = _mujoco_track((W_DRIVE, W_DRIVE, W_DRIVE), 5.0, 0.1)
    d = np.linalg.norm(ours[:, :2] - mj[:, :2], axis=1)
    v_ours = (ours[-1, 0] - ours[-21, 0]) / 2.0
    v_mj = (mj[-1, 0] - mj[-21, 0]) / 2.0
    print(f"MuJoCo straight: max position difference {d.max() * 100:.2f} cm (final {d[-1] * 100:.2f} cm), "
          f"speed ours {v_ours:.4f} vs MuJoCo {v_mj:.4f} m/s, final y ours {ours[-1, 1]:.4f} MuJoCo {mj[-1, 1]:.4f}")
    assert v_ours == pytest.approx(v_mj, rel=1e-2)
    assert d.max() < 0.10

    cmd = (-W_DRIVE, W_DRIVE, 0.0)
    scene_t = robot_scene(1)
    rt, _ = drive(scene_t, cmd, 0.1, 5.0)
    ours_t = chassis_track(scene_t, rt)
    mj_t = _mujoco_track(cmd, 5.0, 0.1)
    rate = [(np.unwrap(x[:, 3])[-1] - np.unwrap(x[:, 3])[9]) / 4.0 for x in (ours_t, mj_t)]
    dt_pos = np.linalg.norm(ours_t[:, :2] - mj_t[:, :2], axis=1)
    print(f"MuJoCo turn in place: yaw rate ours {rate[0]:.3f} vs MuJoCo {rate[1]:.3f} rad/s "
          f"(kinematic {2 * 0.36 * W_DRIVE / 0.72:.3f}), max base position difference {dt_pos.max() * 100:.2f} cm")
    kin = 2 * 0.36 * W_DRIVE / 0.72
    assert 0 < rate[0] <= kin and 0 < rate[1] <= kin
    assert 0.85 <= rate[0] / kin <= 0.97 and 0.45 <= rate[1] / kin <= 0.65, (rate, kin)
    assert rate[0] / rate[1] == pytest.approx(1.69, rel=0.10), rate


def test_extra_iterations_converge_a_traction_limited_speed_step() -> None:
    """Rolling at 0.9 m/s, every wheel target jumps from 2.5 to 5.5 rad/s (mu 0.6: traction-limited).
    With the lagged active-set wheel rows (pin_wheels_from=0, pin_coupled=False, the defaults before
    issue 21.1's wheel pins) the 16-iteration budget ends the step far from converged (measured 5.1 m/s),
    the same budget plus `extra_iters=48` for unconverged worlds converges it (measured 1.2e-5 m/s after
    64 iterations), and the following steps need no extra iterations. With the wheels' semismooth rows
    (pin_wheels_from=4) the 16 iterations converge the jump (measured 3.4e-6 m/s)."""
    out = {}
    for extra in (0, 48):
        scene = robot_scene(1)
        solver = SolverOstrich(scene.model, SolverOptions(extra_iters=extra, newton_iters=16, pin_wheels_from=0,
                                                          pin_coupled=False))
        solver.set_anisotropic_friction(scene.handles[0].wheel_shapes, 0.6, 0.35)
        s0, s1 = rolling_state(scene, 0.9, 2.5), scene.model.state()
        control = wheel_control(scene, (5.5, 5.5, 5.5))
        res, its = [], []
        for _ in range(3):
            solver.step(s0, s1, control, None, 0.1)
            s0, s1 = s1, s0
            st = solver.status()
            res.append(float(st.residual[0]))
            its.append(int(st.iterations[0]))
        assert solver.status().trace.shape == (1, 16 + extra + 1)
        out[extra] = (res, its)
        print(f"speed step, extra_iters={extra}: residual per step {np.array2string(np.array(res), precision=2)}, "
              f"last iteration {its}")
    assert out[0][0][0] > 1e-2  # the default budget does not converge the jump
    assert out[48][0][0] < 1e-4 and out[48][1][0] > 16  # the extra iterations did
    assert max(out[48][0][1:]) < 1e-4 and max(out[48][1][1:]) <= 16  # no extra work once converged
    scene = robot_scene(1)
    solver = SolverOstrich(scene.model, SolverOptions(newton_iters=16, pin_wheels_from=4))
    solver.set_anisotropic_friction(scene.handles[0].wheel_shapes, 0.6, 0.35)
    s0, s1 = rolling_state(scene, 0.9, 2.5), scene.model.state()
    solver.step(s0, s1, wheel_control(scene, (5.5, 5.5, 5.5)), None, 0.1)
    print(f"speed step, pin_wheels_from=4: residual {float(solver.status().residual[0]):.2e}")
    assert float(solver.status().residual[0]) < 1e-4  # the semismooth wheel rows converge it in 16 iterations
