"""Falsification of the rescaled dual grid of the centred box (lean/WitCert/ExcessGrid.lean): the per-token form of
t − D(t, λ) (``sub_dualDBox_eq_sum``, ``sum_mul_gridTerm``), the measure change between p̂ and the kernel's masses p̃
(``abs_sub_le_of_ratio``, ``sum_le_of_ratio``), the bound on each term (``abs_gridTerm_le``), the end value over p̃
(``sub_dualDBox_le_gridBound``), λ = 0's cap (``sub_dualDBox_zero``), and the two cover theorems on the contract's
cover (``tilt_tv_le_grid_rescaled``, ``tilt_tv_le_grid_rescaled_capped``: the merge's form)."""

from __future__ import annotations

import mpmath as mp

from .highprec import _rand_p, _softmax_tilt, _tv
from .tilt_box import _centre, _in_box, _radius

_TINY = mp.mpf(10) ** -40


def beta(t, c, e):
    return (1 - t) * mp.e ** (-c + e) + t * mp.e ** (-c - e)


def grid_term(c, e, t, lam):
    return max(lam * beta(t, c, e) - 1, 0) - t * (lam * mp.e ** (-c - e) - 1)


def dual_d_box(p, c, eps, t, lam):
    m = mp.fsum(pj * mp.e ** (-cj - ej) for pj, cj, ej in zip(p, c, eps))
    return lam * t * m - mp.fsum(pj * max(lam * beta(t, cj, ej) - 1, 0) for pj, cj, ej in zip(p, c, eps))


def grid_bound(pt, c, eps, xi, t, lam, e_term=True):
    """Lean ``gridBound``: G(t, λ) over p̃ (``e_term`` False drops the measure change's term: a drift)."""
    s = mp.fsum(pj * max(lam * beta(t, cj, ej) - 1, 0) for pj, cj, ej in zip(pt, c, eps))
    m = mp.fsum(pj * mp.e ** (-cj - ej) for pj, cj, ej in zip(pt, c, eps))
    v = mp.fsum(pj * abs(mp.e ** (-cj - ej) - 1) for pj, cj, ej in zip(pt, c, eps))
    e = (mp.e ** (2 * xi) - 1) if e_term else 0
    return s - t * (lam * m - mp.fsum(pt)) + e * (s + t * (v + abs(lam - 1) * m))


def _case(rng):
    n = rng.randint(1, 6)
    p = _rand_p(rng, n)
    scale = rng.choice([0.02, 0.1, 0.5, 2.0])
    return p, [_centre(rng) * scale for _ in range(n)], [_radius(rng, scale) for _ in range(n)]


def _masses(rng, p, c, eps, xi):
    """p̃ ∝ p̂ e^{−ξ}, |ξ| ≤ Ξ (random signs, or +Ξ where the box's top is above 0: more p̂ than p̃ there),
    normalised; then p̂ ≤ e^{2Ξ} p̃ and p̃ ≤ e^{2Ξ} p̂."""
    sgn = [rng.choice([-1, 1]) for _ in p] if rng.random() < 0.5 else [1 if -cj + ej > 0 else -1
                                                                      for cj, ej in zip(c, eps)]
    pt = [pj * mp.e ** (-s * xi) for pj, s in zip(p, sgn)]
    z = mp.fsum(pt)
    return [x / z for x in pt]


def _xi(rng):
    return mp.mpf(0) if rng.random() < 0.1 else mp.mpf(10) ** mp.mpf(rng.uniform(-6, -0.5))


def sub_dualDBox_eq_sum(rng, trials):
    """Σ p̂ = 1: t − D(t, λ) = Σ_j p̂_j gridTerm_j, any t and λ."""
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        t, lam = mp.mpf(rng.uniform(-0.5, 1.5)), mp.mpf(rng.uniform(-1, 3))
        lhs = t - dual_d_box(p, c, eps, t, lam)
        rhs = mp.fsum(pj * grid_term(cj, ej, t, lam) for pj, cj, ej in zip(p, c, eps))
        if abs(lhs - rhs) > _TINY * (1 + abs(lhs)):
            bad.append((p, c, eps, t, lam))
    return bad


def sum_mul_gridTerm(rng, trials):
    """Any weights w: Σ w gridTerm = Σ w (λβ − 1)₊ − t (λ Σ w b − Σ w)."""
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        w = [x * mp.mpf(rng.uniform(-3, 3)) for x in p]
        t, lam = mp.mpf(rng.uniform(-0.5, 1.5)), mp.mpf(rng.uniform(-1, 3))
        lhs = mp.fsum(wj * grid_term(cj, ej, t, lam) for wj, cj, ej in zip(w, c, eps))
        rhs = (mp.fsum(wj * max(lam * beta(t, cj, ej) - 1, 0) for wj, cj, ej in zip(w, c, eps))
               - t * (lam * mp.fsum(wj * mp.e ** (-cj - ej) for wj, cj, ej in zip(w, c, eps)) - mp.fsum(w)))
        if abs(lhs - rhs) > _TINY * (1 + abs(lhs)):
            bad.append((w, c, eps, t, lam))
    return bad


def abs_sub_le_of_ratio(rng, trials):
    """E > 0, q ≥ 0, a ≤ E q, q ≤ E a: |a − q| ≤ (E − 1) q."""
    bad = []
    for _ in range(trials):
        E = mp.e ** mp.mpf(rng.uniform(0, 2)) if rng.random() < 0.9 else mp.mpf(1)
        q = mp.mpf(rng.random()) * rng.choice([1e-6, 1, 100])
        a = q / E + (E * q - q / E) * mp.mpf(rng.random()) if rng.random() < 0.8 else rng.choice([q / E, E * q])
        if abs(a - q) > (E - 1) * q + _TINY:
            bad.append((a, q, E))
    return bad


def sum_le_of_ratio(rng, trials):
    """p̃ ≥ 0, p̂ ≤ e^{2Ξ} p̃, p̃ ≤ e^{2Ξ} p̂: Σ p̂ f ≤ Σ p̃ f + (e^{2Ξ} − 1) Σ p̃ |f| for any f."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 6)
        xi = _xi(rng)
        pt = [mp.mpf(rng.random()) for _ in range(n)]
        ph = [x * mp.e ** (2 * xi * mp.mpf(rng.uniform(-1, 1)) if rng.random() < 0.6 else 2 * xi * rng.choice([-1, 1]))
              for x in pt]
        f = [mp.mpf(rng.uniform(-5, 5)) for _ in range(n)]
        lhs = mp.fsum(a * b for a, b in zip(ph, f))
        rhs = mp.fsum(a * b for a, b in zip(pt, f)) + (mp.e ** (2 * xi) - 1) * mp.fsum(a * abs(b) for a, b in zip(pt, f))
        if lhs > rhs + _TINY:
            bad.append((ph, pt, f, xi))
    return bad


def abs_gridTerm_le(rng, trials):
    """t ≥ 0 (any λ): |gridTerm_j| ≤ (λβ_j − 1)₊ + t(|b_j − 1| + |λ − 1| b_j)."""
    bad = []
    for _ in range(trials):
        c, e = _centre(rng), _radius(rng, rng.choice([0.05, 1.0]))
        t, lam = mp.mpf(rng.uniform(0, 2)), mp.mpf(rng.uniform(-1, 3))
        b = mp.e ** (-c - e)
        if abs(grid_term(c, e, t, lam)) > max(lam * beta(t, c, e) - 1, 0) + t * (abs(b - 1) + abs(lam - 1) * b) + _TINY:
            bad.append((c, e, t, lam))
    return bad


def sub_dualDBox_le_gridBound(rng, trials):
    """Σ p̂ = 1, the ratio bounds, Ξ ≥ 0, t ≥ 0: t − D(t, λ) ≤ G(t, λ) over p̃."""
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        xi = _xi(rng)
        pt = _masses(rng, p, c, eps, xi)
        t, lam = mp.mpf(rng.uniform(0, 1.5)), mp.mpf(rng.uniform(-1, 3))
        if t - dual_d_box(p, c, eps, t, lam) > grid_bound(pt, c, eps, xi, t, lam) + _TINY:
            bad.append((p, pt, c, eps, xi, t, lam))
    return bad


def sub_dualDBox_zero(rng, trials):
    """t − D(t, 0) = t."""
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        t = mp.mpf(rng.uniform(-1, 2))
        if abs(t - dual_d_box(p, c, eps, t, 0) - t) > _TINY:
            bad.append((p, c, eps, t))
    return bad


def _cover():
    from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS

    return [mp.mpf(x) for x in GRID_TILT_POINTS], [[mp.mpf(x) for x in r] for r in GRID_TILT_LAMBDAS]


def _needle(rng):
    """One token of small mass whose box is [0, 0.5] in η, the mass error onto it (where the measure change bites)."""
    p1 = mp.mpf(rng.choice([0.005, 0.01, 0.03]))
    return [p1, 1 - p1], [mp.mpf(-0.25), mp.mpf(0)], [mp.mpf(0.25), mp.mpf(0)]


def _grid_case(rng):
    if rng.random() < 0.2:
        p, c, eps = _needle(rng)
        xi = mp.mpf(rng.choice([0.05, 0.3]))
        z = p[0] * mp.e ** (-xi) + p[1] * mp.e ** xi
        return p, [p[0] * mp.e ** (-xi) / z, p[1] * mp.e ** xi / z], c, eps, xi
    p, c, eps = _case(rng)
    xi = _xi(rng)
    return p, _masses(rng, p, c, eps, xi), c, eps, xi


def tilt_tv_le_grid_rescaled(rng, trials, capped=False, e_term=True):
    """δ in the box, p̃ ∝ p̂ e^{−ξ}: TV(p, p̂) ≤ max over the contract's intervals of their best multiplier's larger
    end value G (``capped``: or the cap t_{i+1}, the merge's form). ``e_term`` False: a drift."""
    ts, ls = _cover()
    bad = []
    for _ in range(trials):
        p, pt, c, eps, xi = _grid_case(rng)
        top = mp.mpf(0)
        for i, row in enumerate(ls):
            best = min(max(grid_bound(pt, c, eps, xi, ts[i], lam, e_term), grid_bound(pt, c, eps, xi, ts[i + 1], lam, e_term))
                       for lam in row)
            top = max(top, min(best, ts[i + 1]) if capped else best)
        d = [_in_box(rng, cj, ej) for cj, ej in zip(c, eps)]
        if _tv(_softmax_tilt(p, d), p) > top + _TINY:
            bad.append((p, pt, c, eps, xi, d))
    return bad


def tilt_tv_le_grid_rescaled_capped(rng, trials, e_term=True):
    return tilt_tv_le_grid_rescaled(rng, trials, capped=True, e_term=e_term)
