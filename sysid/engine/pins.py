"""The coupled pins of the Newton step (`SolverOptions.pin_coupled`): the pinned magnitudes of up to four
sliding contacts of a world solved with its step, so that the step lands on the friction cone. npin + 1 Schur
solves (`coupled_pins`: a world's in turn; `step.iteration_kernel`'s `lane_coupled_pins`: LANES worlds' solve by
solve) and a 4x4 solve; the pieces here are shared by both."""

import warp as wp

from .friction import cone_mu
from .schur import apply_A, schur_rhs, schur_solve
from .types import Contacts, Iterate, ModelArrays, NewtonIterate, NewtonStep, StepConstants


@wp.func
def nth_pinned(w: int, j: int, sc: StepConstants, ct: Contacts, fdir: wp.array[wp.vec4]):
    """Slot (within world w) of the j-th contact whose sliding rows are pinned."""
    n = int(0)
    for ci in range(ct.count[w]):
        if fdir[w * sc.max_contacts + ci][2] != 0.0:
            if n == j:
                return ci
            n += 1
    return -1


@wp.func
def pins_rhs(s: int, w: int, nrows: int, st: NewtonStep):
    """`coupled_pins`' right-hand side of its solve s into scr.rhs: s = 0 the base (every pinned step 0),
    s >= 1 the unit response of the (s-1)-th pinned contact, -A e."""
    if s == 0:
        schur_rhs(w, nrows, st.sc, st.rows, st.it.ydyn, st.scr)
        return 0
    rbase = w * st.sc.max_rows
    cj = nth_pinned(w, s - 1, st.sc, st.ct, st.it.fdir)
    for i in range(nrows):
        st.scr.z[rbase + i] = 0.0
    st.scr.z[rbase + st.sc.jrows + 3 * cj + 1] = 1.0
    apply_A(w, nrows, st.sc, st.rows, st.scr)
    for i in range(nrows):
        st.scr.rhs[rbase + i] = -st.scr.Az[rbase + i]
    return 0


@wp.func
def pins_take(
    s: int,
    rbase: int,
    w: int,
    npin: int,
    b: wp.vec4,
    M: wp.mat44,
    sc: StepConstants,
    model: ModelArrays,
    ct: Contacts,
    at: Iterate,
    it: NewtonIterate,
    dl: wp.array[float],
):
    """`coupled_pins`' use of its solve s (its solution dl): s = 0 the pinned contacts' landing errors b, s >= 1
    column s - 1 of M = I - Z. Returns (b, M)."""
    if s == 0:
        for i in range(npin):
            ci = nth_pinned(w, i, sc, ct, it.fdir)
            kk = w * sc.max_contacts + ci
            rn = rbase + sc.jrows + 3 * ci
            fd = it.fdir[kk]
            m1, m2 = cone_mu(kk, model, ct, at.q)
            lpar = fd[0] * at.lam[rn + 1] / m1 + fd[1] * at.lam[rn + 2] / m2
            b[i] = at.lam[rn] + dl[rn] - lpar
        return b, M
    for i in range(npin):
        ci = nth_pinned(w, i, sc, ct, it.fdir)
        M[i, s - 1] = M[i, s - 1] - dl[rbase + sc.jrows + 3 * ci]
    return b, M


@wp.func
def pins_finish(w: int, npin: int, b: wp.vec4, M: wp.mat44, sc: StepConstants, ct: Contacts, it: NewtonIterate):
    """`coupled_pins`' 4x4 solve M delta = b, the pinned steps delta to fdir[.][3] (kept as they were when M
    is near singular)."""
    det = wp.determinant(M)
    if wp.abs(det) < 1.0e-6:
        return 0
    delta = wp.inverse(M) * b
    for i in range(npin):
        ci = nth_pinned(w, i, sc, ct, it.fdir)
        kk = w * sc.max_contacts + ci
        fd = it.fdir[kk]
        it.fdir[kk] = wp.vec4(fd[0], fd[1], 1.0, delta[i])
    return 0


@wp.func
def coupled_pins(w: int, nrows: int, n_pcr: int, t_pcr: float, direct: int, npin: int, st: NewtonStep):
    """pin_coupled: the pinned magnitudes of up to four sliding contacts that make the step land on the cone,
    l~_par + dl~_par = lam_n + dlam_n, instead of lam_n lagged one iteration. The Schur solution is affine
    in the pinned steps delta (dlam = dlam_0 + Z delta), so npin + 1 solves give dlam_n at the pinned
    contacts as a function of delta and a 4x4 solve gives delta; written to fdir[.][3] for the final solve.
    One world's solves in turn; `lane_coupled_pins` runs the same for LANES worlds, solve by solve."""
    b = wp.vec4(0.0)
    M = wp.identity(n=4, dtype=float)
    for s in range(npin + 1):
        pins_rhs(s, w, nrows, st)
        schur_solve(direct, w, nrows, st.sc, st.rows, st.scr, n_pcr, t_pcr)
        b, M = pins_take(s, w * st.sc.max_rows, w, npin, b, M, st.sc, st.model, st.ct, st.at, st.it, st.scr.x)
    pins_finish(w, npin, b, M, st.sc, st.ct, st.it)
    return 0


@wp.func
def pins_load(pin: wp.array[float], k: int):
    """A world's coupled-pin state (b, M) as `lane_coupled_pins` keeps it at pin[k:k + 20]."""
    b = wp.vec4(0.0)
    M = wp.mat44(0.0)
    for i in range(4):
        b[i] = pin[k + i]
        for c in range(4):
            M[i, c] = pin[k + 4 + 4 * i + c]
    return b, M
