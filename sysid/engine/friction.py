"""Friction stage: coefficients and slip speeds of a contact, the compliance weight W of the Coulomb cone
(eq. 7) or of the regularised law, and the safeguards of `SolverOptions.friction_safeguard` (cone
projection, the active-set sliding test).
"""

from __future__ import annotations

import warp as wp

from .contact import shares_pair
from .types import Contacts, FrictionCombine, ModelArrays, StepConstants

wp.set_module_options({"enable_backward": False})

SLIP_GAIN_MAX = wp.constant(2.0)  # see friction_weight


@wp.func
def combine_mu(rule: int, a: float, b: float):
    """Two shapes' friction coefficients combined by FrictionCombine ``rule`` (MAX, PRODUCT or
    GEOMETRIC_MEAN; anything else: the mean)."""
    if rule == FrictionCombine.MAX:
        return wp.max(a, b)
    if rule == FrictionCombine.PRODUCT:
        return a * b
    if rule == FrictionCombine.GEOMETRIC_MEAN:
        return wp.sqrt(wp.max(a * b, 0.0))
    return 0.5 * (a + b)


@wp.func
def friction_params(k: int, model: ModelArrays, ct: Contacts, q: wp.array[wp.quat]):
    """(mu_long, mu_lat, lateral axis in world, has_lateral) of contact slot k.

    A contact with an anisotropic shape (a wheel) takes that shape's pair, combined with the other
    shape's by the wheel's ``model.friction_combine`` (FrictionCombine; WHEEL: the wheel's own), and
    its axle as the lateral direction; otherwise the two shapes' coefficients are combined by the
    larger of their two rule codes (WHEEL: averaged), isotropically.
    """
    fs = ct.fric_shape[k]
    lat = wp.vec3(0.0, 0.0, 1.0)
    if fs >= 0:
        b = model.shape_body[fs]
        ql = wp.transform_get_rotation(model.shape_transform[fs])
        if b >= 0:
            ql = q[b] * ql
        lat = wp.quat_rotate(ql, wp.vec3(0.0, 0.0, 1.0))
        m1 = model.shape_mu[fs]
        m2 = model.shape_mu_lat[fs]
        rule = model.friction_combine[fs]
        if rule != FrictionCombine.WHEEL:
            other = ct.shape0[k]
            if other == fs:
                other = ct.shape1[k]
            surface = model.shape_mu[other]  # a surface's one (isotropic) coefficient
            m1 = combine_mu(rule, m1, surface)
            m2 = combine_mu(rule, m2, surface)
        return m1, m2, lat, 1
    s0 = ct.shape0[k]
    s1 = ct.shape1[k]
    rule = wp.max(model.friction_combine[s0], model.friction_combine[s1])
    mu = combine_mu(rule, model.shape_mu[s0], model.shape_mu[s1])
    return mu, mu, lat, 0


@wp.func
def contact_slip(k: int, model: ModelArrays, ct: Contacts):
    """Slip speeds (v_s, v_s,lat) [m/s] of contact slot k's regularised friction: the wheel's own
    where the contact has an anisotropic shape, else the larger of the two shapes'. v_s = 0: exact
    Coulomb; v_s,lat = 0: one slip speed for the cone-scaled slip (see friction_weight); > 0:
    separate longitudinal / lateral slip speeds (the combined-slip law), on anisotropic shapes only
    (an isotropic contact's tangent frame is arbitrary, so it has no lateral direction)."""
    fs = ct.fric_shape[k]
    if fs >= 0:
        return model.shape_slip[fs], model.shape_slip_lat[fs]
    return wp.max(model.shape_slip[ct.shape0[k]], model.shape_slip[ct.shape1[k]]), 0.0


@wp.func
def friction_weight(
    v1: float,
    v2: float,
    l1: float,
    l2: float,
    ln: float,
    mu1: float,
    mu2: float,
    d1: float,
    d2: float,
    inactive_w: float,
    eps: float,
    vs: float,
    vs_lat: float,
):
    """Compliance weights (W1, W2) >= 0 of the elliptic Coulomb cone |(l1/mu1, l2/mu2)| <= ln,
    and the Newton gains (g1, g2) of the rows (1 for Coulomb friction; see below).

    In cone-scaled variables (v~ = mu v, l~ = l / mu) the isotropic weight is
    W~ = (sqrt(|v~|^2 + b^2) - b) / ln with b = d (ln - |l~|): zero when sticking (v = 0,
    inside the cone), |v~|/ln when sliding on the cone; W_k = W~ / mu_k^2.
    With a slip speed vs > 0 (regularised Coulomb) W~ = sqrt(|v~|^2 + (mu_g vs)^2) / ln,
    mu_g = sqrt(mu1 mu2): the fixed point is |l~| = ln |v~| / sqrt(|v~|^2 + (mu_g vs)^2), viscous
    below vs and Coulomb above it, smooth and strictly inside the cone. Its rows are Newton
    linearisations of that law, not the lagged weight (which converges only linearly, with rate
    |v~|^2 / s^2, s^2 = |v~|^2 + (mu_g vs)^2): row k is g_k (v_k + W_k l_k) = 0 with compliance
    g_k W_k, g_k = s^2 / (s^2 - v~_k^2), so that d(row)/dv_k = 1 at the fixed point (the
    cross-coupling of the two rows is left out), with g_k capped at SLIP_GAIN_MAX: the full
    Newton slope overshoots from deep in the Coulomb part of a steep law (v_s = 1 mm/s on an
    incline at h = 0.1 s diverged; cap 2 converges there and at every case of the tests, 4 and 10
    do not). The fixed point does not depend on g.

    With a lateral slip speed vs_lat > 0 as well (the combined-slip law, docs/traction.md) each
    direction has its own slip speed s_k (s_1 = vs, s_2 = vs_lat): with normalised slip
    n_k = v_k / s_k and S = sqrt(n_1^2 + n_2^2 + 1) the friction is l_k = -mu_k ln n_k / S, i.e.
    W_k = s_k S / (mu_k ln): linear stiffness mu_k ln / s_k per m/s in each direction, saturation
    on the friction ellipse |(l_1/mu_1, l_2/mu_2)| -> ln. The single-slip law above is this law
    with s_k = vs sqrt(mu_1 mu_2) / mu_k. Gains g_k = S^2 / (S^2 - n_k^2) as above.
    """
    m1 = wp.max(mu1, 1.0e-6)
    m2 = wp.max(mu2, 1.0e-6)
    dm = 0.5 * (d1 + d2)
    if ln * dm <= 1.0e-7:
        return inactive_w * d1, inactive_w * d2, 1.0, 1.0
    # the tiny floors keep the adjoint finite at zero slip / zero friction (d sqrt(x)/dx at 0)
    if vs > 0.0 and vs_lat > 0.0:
        n1 = v1 / vs
        n2 = v2 / vs_lat
        S2 = n1 * n1 + n2 * n2 + 1.0
        S = wp.sqrt(S2)
        g1 = wp.min(S2 / (S2 - n1 * n1), SLIP_GAIN_MAX)
        g2 = wp.min(S2 / (S2 - n2 * n2), SLIP_GAIN_MAX)
        return vs * S / (m1 * ln), vs_lat * S / (m2 * ln), g1, g2
    va = wp.sqrt(m1 * m1 * v1 * v1 + m2 * m2 * v2 * v2 + 1.0e-24)
    if vs > 0.0:
        vr = vs * wp.sqrt(m1 * m2)
        s2 = va * va + vr * vr
        Wr = wp.sqrt(s2) / ln
        g1 = wp.min(s2 / (s2 - m1 * m1 * v1 * v1), SLIP_GAIN_MAX)
        g2 = wp.min(s2 / (s2 - m2 * m2 * v2 * v2), SLIP_GAIN_MAX)
        return Wr / (m1 * m1), Wr / (m2 * m2), g1, g2
    lt = wp.sqrt(l1 * l1 / (m1 * m1) + l2 * l2 / (m2 * m2) + 1.0e-24)
    b = dm * (ln - lt)
    Wt = (wp.sqrt(va * va + b * b + eps * eps) - b) / ln
    return wp.max(Wt / (m1 * m1), 0.0), wp.max(Wt / (m2 * m2), 0.0), 1.0, 1.0


@wp.func
def cone_mu(k: int, model: ModelArrays, ct: Contacts, q_it: wp.array[wp.quat]):
    """Contact k's (longitudinal, lateral) friction coefficients, floored at 1e-6 so the cone-scaled
    variables l / mu stay finite."""
    mu1, mu2, lat, has_lat = friction_params(k, model, ct, q_it)
    return wp.max(mu1, 1.0e-6), wp.max(mu2, 1.0e-6)


@wp.func
def cone_projection(
    k: int,
    ln: float,
    l1: float,
    l2: float,
    model: ModelArrays,
    ct: Contacts,
    q_it: wp.array[wp.quat],
    slack: float,
):
    """Friction safeguards on one contact's multipliers: lam_n >= 0 and |(l1/mu1, l2/mu2)| <= slack lam_n
    (slack 1: the cone). Returns the projection and whether it changed anything."""
    fixed = int(0)
    if ln < 0.0:
        ln = 0.0
        fixed = 1
    m1, m2 = cone_mu(k, model, ct, q_it)
    lt = wp.sqrt(l1 * l1 / (m1 * m1) + l2 * l2 / (m2 * m2))
    if lt > slack * ln:
        sc = slack * ln / lt
        l1 = sc * l1
        l2 = sc * l2
        fixed = 1
    return ln, l1, l2, fixed


@wp.func
def project_cone(
    w: int,
    sc: StepConstants,
    model: ModelArrays,
    ct: Contacts,
    q_it: wp.array[wp.quat],
    lam: wp.array[float],
    slack: float,
    widen_single: int,
):
    """`cone_projection` applied in place to every contact of world w; the cone is widened by slack for
    contacts that share their shape pair with another and, with widen_single, for exact-Coulomb single
    contacts (friction_safeguard="newton", pin_wheels_from)."""
    rbase = w * sc.max_rows
    for ci in range(ct.count[w]):
        rn = rbase + sc.jrows + 3 * ci
        sl = float(1.0)
        if slack != 1.0:
            if shares_pair(w, ci, sc.max_contacts, ct.count, ct.shape0, ct.shape1, ct.n) != 0:
                sl = slack
            elif widen_single != 0:
                vs, vs_lat = contact_slip(w * sc.max_contacts + ci, model, ct)
                if vs <= 0.0:
                    sl = slack
        ln, l1, l2, fixed = cone_projection(
            w * sc.max_contacts + ci, lam[rn], lam[rn + 1], lam[rn + 2], model, ct, q_it, sl
        )
        lam[rn] = ln
        lam[rn + 1] = l1
        lam[rn + 2] = l2
    return 0


@wp.func
def slide_weight(
    k: int,
    ln: float,
    l1: float,
    l2: float,
    v1: float,
    v2: float,
    d1: float,
    d2: float,
    model: ModelArrays,
    ct: Contacts,
    q_it: wp.array[wp.quat],
):
    """Active-set test of one contact in cone-scaled variables (l~ = l / mu, v~ = mu v, one rho
    per contact so that the sliding fixed point opposes the slip): z~ = l~ - rho v~ outside the
    cone |z~| > lam_n means sliding. Returns (slides, W1, W2) with the sliding weight
    W~ = |v~| / lam_n, W_k = W~ / mu_k^2 (eq. 7 at b = 0)."""
    m1, m2 = cone_mu(k, model, ct, q_it)
    rho = 2.0 / wp.max(m1 * m1 * d1 + m2 * m2 * d2, 1.0e-12)
    z1 = l1 / m1 - rho * m1 * v1
    z2 = l2 / m2 - rho * m2 * v2
    if z1 * z1 + z2 * z2 <= ln * ln:
        return int(0), 0.0, 0.0
    Wt = wp.sqrt(m1 * m1 * v1 * v1 + m2 * m2 * v2 * v2) / ln
    return int(1), Wt / (m1 * m1), Wt / (m2 * m2)
