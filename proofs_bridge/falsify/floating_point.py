"""Falsification of the floating-point statements of the decode pass (lean/WitCert/FloatTV.lean: SPEC
§7): the rebased tilt, TV against a perturbed base, the restriction to the represented tokens plus the
lost mass, and the bound ρ on the lost mass; also the general forms these rest on (any p against a perturbed
base; any two nonnegative distributions restricted)."""

from __future__ import annotations

import mpmath as mp

from .highprec import _box, _rand_p, _softmax_tilt, _tv


def _fp_instance(rng):
    """p̂, radii ε, errors δ (|δ| ≤ ε), Ξ and ξ (|ξ| ≤ Ξ); a third of the time δ = ξ + small (p
    near p̃: the case where TV(p̃, p̂) carries the whole bound)."""
    n = rng.randint(1, 8)
    ph = _rand_p(rng, n)
    Xi = mp.mpf(rng.random()) * rng.choice([1e-6, 0.01, 0.5, 2.0])
    xi = [Xi * mp.mpf(rng.uniform(-1, 1)) if rng.random() < 0.6 else Xi * rng.choice([-1, 1]) for _ in range(n)]
    if rng.random() < 0.33:
        small = [mp.mpf(rng.uniform(-1, 1)) * mp.mpf(10) ** -rng.randint(1, 8) for _ in range(n)]
        d = [x + s for x, s in zip(xi, small)]
        eps = [abs(di) * (1 + mp.mpf(rng.random()) / 10) for di in d]
    else:
        eps, d = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
    return n, ph, eps, d, Xi, xi


def tilt_rebase(rng, trials):
    """p = tilt(p̂, δ) equals tilt(p̃, δ − ξ) for p̃ = tilt(p̂, ξ), and |δ − ξ| ≤ ε + Ξ."""
    bad = []
    for _ in range(trials):
        n, ph, eps, d, Xi, xi = _fp_instance(rng)
        p, pt = _softmax_tilt(ph, d), _softmax_tilt(ph, xi)
        dd = [a - b for a, b in zip(d, xi)]
        q = _softmax_tilt(pt, dd)
        if max(abs(a - b) for a, b in zip(p, q)) > mp.mpf(10) ** -40 or any(abs(x) > e + Xi for x, e in zip(dd, eps)):
            bad.append((ph, d, xi))
    return bad


def tv_le_perturbed_base(rng, trials, xi_term=None):
    """TV(p, p̂) ≤ F + tanh(Ξ/2) for the sound F on p̃ with radii ε + Ξ: F = TV(p, p̃) itself,
    F = tanh((ε_max + Ξ)/2) (tv_le_perturbed_base_tanh) and the e-form ½(A² − 1) with
    A = Σ p̃ e^{ε+Ξ}; and TV(p̃, p̂) ≤ tanh(Ξ/2)."""
    xi_term = xi_term or (lambda Xi: mp.tanh(Xi / 2))
    bad = []
    for _ in range(trials):
        n, ph, eps, d, Xi, xi = _fp_instance(rng)
        p, pt = _softmax_tilt(ph, d), _softmax_tilt(ph, xi)
        tv = _tv(p, ph)
        A = mp.fsum(a * mp.e ** (e + Xi) for a, e in zip(pt, eps))
        Fs = [_tv(p, pt), mp.tanh((max(eps) + Xi) / 2), (A * A - 1) / 2]
        if any(tv > F + xi_term(Xi) for F in Fs) or _tv(pt, ph) > mp.tanh(Xi / 2):
            bad.append((ph, d, xi))
    return bad


def _restrict(q, V):
    z = mp.fsum(q[j] for j in V)
    return [q[j] / z for j in V]


def _lost_instance(rng):
    """A tilt p of p̂ (or, half the time for the TV statement, any two distributions) and a set U
    of lost tokens with a non-empty complement V."""
    n = rng.randint(2, 9)
    ph = _rand_p(rng, n)
    eps, d = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
    U = [j for j in range(n) if rng.random() < rng.choice([0.1, 0.5, 0.9])]
    if len(U) == n:
        U.pop(rng.randrange(n))
    V = [j for j in range(n) if j not in U]
    return n, ph, eps, d, U, V


def tv_le_restrict_add_lost(rng, trials, lost=None):
    """TV(p, p̂) ≤ TV(p|V, p̂|V) + p(U) + p̂(U) (renormalised restrictions), for tilts and for
    arbitrary pairs of distributions (tv_le_restrict_add_lost_of_nonneg)."""
    lost = lost or (lambda pU, qU: pU + qU)
    bad = []
    for k in range(trials):
        n, ph, eps, d, U, V = _lost_instance(rng)
        p = _softmax_tilt(ph, d) if k % 2 == 0 else _rand_p(rng, n)
        rhs = _tv(_restrict(p, V), _restrict(ph, V)) + lost(mp.fsum(p[j] for j in U), mp.fsum(ph[j] for j in U))
        if _tv(p, ph) > rhs + mp.mpf(10) ** -40:  # U = ∅ is the equality case
            bad.append((p, ph, U))
    return bad


def tilt_restrict(rng, trials):
    """p|V (renormalised) is the tilt of p̂|V by δ|V."""
    bad = []
    for _ in range(trials):
        n, ph, eps, d, U, V = _lost_instance(rng)
        p = _softmax_tilt(ph, d)
        q = _softmax_tilt(_restrict(ph, V), [d[j] for j in V])
        if max(abs(a - b) for a, b in zip(_restrict(p, V), q)) > mp.mpf(10) ** -40:
            bad.append((ph, d, U))
    return bad


def tilt_mass_lost_le(rng, trials, compl=False):
    """p(U) ≤ Σ_U p̂ e^ε / Σ p̂ e^{−ε} (compl: the kept tokens' Σ_V p̂ e^{−ε} below, weaker)."""
    bad = []
    for _ in range(trials):
        n, ph, eps, d, U, V = _lost_instance(rng)
        p = _softmax_tilt(ph, d)
        den = mp.fsum(ph[j] * mp.e ** (-eps[j]) for j in (V if compl else range(n)))
        if mp.fsum(p[j] for j in U) > mp.fsum(ph[j] * mp.e ** eps[j] for j in U) / den:
            bad.append((ph, d, U))
    return bad


def tilt_mass_lost_le_compl(rng, trials):
    return tilt_mass_lost_le(rng, trials, compl=True)


def tv_le_restrict_add_rho(rng, trials):
    """TV(p, p̂) ≤ TV(p|V, p̂|V) + p̂(U) + Σ_U p̂ e^ε / Σ p̂ e^{−ε}; and the kernel's
    ρ = Λ(1 + e^{ε_max}/m) (Λ ≥ p̂(U), m ≤ Σ p̂ e^{−ε}) bounds the last two terms."""
    bad = []
    for _ in range(trials):
        n, ph, eps, d, U, V = _lost_instance(rng)
        p = _softmax_tilt(ph, d)
        qU = mp.fsum(ph[j] for j in U)
        m = mp.fsum(ph[j] * mp.e ** (-eps[j]) for j in range(n))
        lostb = mp.fsum(ph[j] * mp.e ** eps[j] for j in U) / m
        if _tv(p, ph) > _tv(_restrict(p, V), _restrict(ph, V)) + qU + lostb + mp.mpf(10) ** -40:
            bad.append((ph, d, U))
        rho = qU * (1 + mp.e ** max(eps) / m)
        if qU + lostb > rho * (1 + mp.mpf(10) ** -40):
            bad.append(("rho", ph, d, U))
    return bad


# --------------------------------- the two general forms (any p; any two nonnegative distributions)

def _dyadic_p(rng, n, zeros=False, tiny=()):
    """A distribution of n dyadic masses w_j / 2^M (integers w_j), so that Σ = 1 and every p_j ≥ 0 (or > 0) hold
    exactly in 50 digits: each mass is 0 (``zeros``), tiny (w_j ≤ 16 at scales down to 2^-152 ≈ 1e-46; always
    for the indices in ``tiny``) or of any size; one token takes the remainder up to 2^M."""
    K = rng.choice([2, 8, 30, 64, 100, 150])
    kinds = [("tiny" if j in tiny else rng.choice(["zero", "tiny", "big", "big"] if zeros else ["tiny", "big", "big"]))
             for j in range(n)]
    w = [0 if k == "zero" else rng.randint(1, 16) if k == "tiny" else rng.randint(1, 2**K) for k in kinds]
    free = [j for j in range(n) if j not in tiny] or list(range(n))
    M = max(sum(w).bit_length(), K + 1)
    w[rng.choice(free)] += 2**M - sum(w)
    p = [mp.mpf(x) / mp.mpf(2) ** M for x in w]
    assert mp.fsum(p) == 1 and all(x >= 0 for x in p) and (zeros or all(x > 0 for x in p))
    return p


def tv_le_restrict_add_lost_of_nonneg(rng, trials, rhs=None):
    """TV(p, p̂) ≤ TV(p|V, p̂|V) + p(U) + p̂(U) for any two distributions p, p̂ ≥ 0 (exact zeros allowed: disjoint
    supports, point masses, p = p̂, masses down to ~1e-46; dyadic, so Σ = 1 exactly) and any U whose complement V
    keeps positive mass of both (hypotheses ha, hb: checked exactly; at the boundary V is a single token of tiny
    mass in both; U = ∅ is the equality case). ``rhs``: the right side as a function of (TV(p|V, p̂|V), p(U), p̂(U))
    (the drift tests pass a smaller one)."""
    rhs = rhs or (lambda tvr, pU, qU: tvr + pU + qU)
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 9)
        mode = rng.choice(["random", "random", "equal", "thin", "empty", "all_but_one"])
        j0 = rng.randrange(n)
        tiny = (j0,) if mode == "thin" else ()
        p = _dyadic_p(rng, n, zeros=True, tiny=tiny)
        ph = list(p) if mode == "equal" else _dyadic_p(rng, n, zeros=True, tiny=tiny)
        for _ in range(20):
            U = ([] if mode == "empty" else [j for j in range(n) if j != j0] if mode in ("thin", "all_but_one")
                 else [j for j in range(n) if rng.random() < rng.choice([0.2, 0.5, 0.8])])
            V = [j for j in range(n) if j not in U]
            if mp.fsum(p[j] for j in V) > 0 and mp.fsum(ph[j] for j in V) > 0:  # ha, hb
                break
            mode = "random"
        else:
            U, V = [], list(range(n))
        right = rhs(_tv(_restrict(p, V), _restrict(ph, V)), mp.fsum(p[j] for j in U), mp.fsum(ph[j] for j in U))
        if _tv(p, ph) > right + mp.mpf(10) ** -40:
            bad.append((p, ph, U))
    return bad


def tv_le_tv_perturbed_add_tanh(rng, trials, xi_term=None):
    """TV(p, p̂) ≤ TV(p, p̃) + tanh(Ξ/2) for p̃ = tilt(p̂, ξ), |ξ_j| ≤ Ξ, and any p (the theorem asks nothing of
    p: p = p̃, the tight case; p = p̂; a distribution; arbitrary reals of any sign at 1e-30..1e30; zero). p̂ > 0 is
    dyadic (Σ = 1 exactly, masses down to ~1e-46). ξ: zero with Ξ = 0; the extremal tilt ξ = −Ξ on S, +Ξ off S with
    Ξ = ln((1 − s)/s), s = p̂(S) ≤ ½ (then TV(p̃, p̂) = tanh(Ξ/2), the bound's equality); a box |ξ_j| ≤ Ξ with corners
    |ξ_j| = Ξ, Ξ from 1e-30 to 50; or Ξ above max |ξ_j|. ``xi_term``: the Ξ term (the drift tests pass a
    smaller one)."""
    xi_term = xi_term or (lambda Xi: mp.tanh(Xi / 2))
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 8)
        ph = _dyadic_p(rng, n)
        mode = rng.choice(["zero", "extremal", "extremal", "box", "slack"])
        if mode == "zero":
            Xi, xi = mp.mpf(0), [mp.mpf(0)] * n
        elif mode == "extremal":
            S = [j for j in range(n) if rng.random() < 0.5]
            s = mp.fsum(ph[j] for j in S)
            if s > mp.mpf(1) / 2:
                S, s = [j for j in range(n) if j not in S], 1 - s
            Xi = mp.log((1 - s) / s) if s > 0 else mp.mpf(rng.random()) * 5  # S = ∅: any Ξ, ξ = +Ξ (no tilt)
            xi = [-Xi if j in S else Xi for j in range(n)]
        else:
            Xi = mp.mpf(rng.random()) * (mp.mpf(10) ** rng.randint(-30, 0) if rng.random() < 0.3 else rng.choice([0.01, 0.5, 2, 50]))
            xi = [Xi * rng.choice([-1, 1]) if rng.random() < 0.4 else Xi * mp.mpf(rng.uniform(-1, 1)) for _ in range(n)]
            if mode == "slack":
                Xi = Xi * (1 + mp.mpf(rng.random()) * 3)
        assert all(abs(x) <= Xi for x in xi)  # hxi, exactly
        pt = _softmax_tilt(ph, xi)
        pmode = rng.choice(["ptilde", "ptilde", "phat", "dist", "any", "zero"])
        if pmode == "ptilde":
            p = list(pt)
        elif pmode == "phat":
            p = list(ph)
        elif pmode == "dist":
            p = _dyadic_p(rng, n, zeros=True)
        elif pmode == "zero":
            p = [mp.mpf(0)] * n
        else:
            p = [mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** rng.randint(-30, 30) for _ in range(n)]
        tol = mp.mpf(10) ** -40 * (1 + mp.fsum(abs(x) for x in p))
        if _tv(p, ph) > _tv(p, pt) + xi_term(Xi) + tol:
            bad.append((p, ph, xi, Xi))
    return bad
