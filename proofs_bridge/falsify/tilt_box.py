"""Falsification of the centred (box) form of SPEC §3(c) (lean/WitCert/TiltBox.lean): the logit errors lie in a
box |δ_j − c_j| ≤ ε_j around a known centre c (not 0); the dual value is ``dualDBox`` (β_j(t) = (1 − t) e^{−c_j+ε_j}
+ t e^{−c_j−ε_j}, m = Σ p̂ e^{−c−ε}). Also the symmetric histogram statement of TiltEndpoints.lean
(``tilt_tv_le_hist_endpoints``), the centre-0 instance of the histogram search."""

from __future__ import annotations

import math

import mpmath as mp

from .highprec import _rand_p, _softmax_tilt, _tv
from .tv_bounds import dual_D

_TINY = mp.mpf(10) ** -40


def beta_box(t, c, x):
    """Lean ``betaBox t c x = (1 − t) e^{−c+x} + t e^{−c−x}``."""
    return (1 - t) * mp.e ** (-c + x) + t * mp.e ** (-c - x)


def dual_D_box(p, c, eps, t, lam):
    """Lean ``dualDBox p c eps t λ = λ t Σ_j p_j e^{−c_j−ε_j} − Σ_j p_j (λ betaBox t c_j ε_j − 1)₊``."""
    m = mp.fsum(pj * mp.e ** (-cj - ej) for pj, cj, ej in zip(p, c, eps))
    return lam * t * m - mp.fsum(pj * max(lam * beta_box(t, cj, ej) - 1, 0) for pj, cj, ej in zip(p, c, eps))


def _centre(rng):
    """A centre of either sign, magnitude log-uniform in [0.01, 3] (sometimes exactly 0)."""
    if rng.random() < 0.1:
        return mp.mpf(0)
    return rng.choice([-1, 1]) * mp.mpf(10) ** mp.mpf(rng.uniform(-2, math.log10(3)))


def _radius(rng, scale):
    return mp.mpf(0) if rng.random() < 0.1 else mp.mpf(rng.random()) * scale


def _in_box(rng, c, e):
    """δ with |δ − c| ≤ e: inside (60%) or at a corner c ± e (40%)."""
    u = mp.mpf(rng.uniform(-1, 1)) if rng.random() < 0.6 else rng.choice([-1, 1])
    return c + e * u


def _tight_lambda_box(p, c, eps, t):
    """The λ among {0} ∪ {1/β_k(t)} with the largest D(t, λ) (the tight λ of the knapsack)."""
    cands = [mp.mpf(0)] + [1 / beta_box(t, ck, ek) for ck, ek in zip(c, eps)]
    return max(cands, key=lambda lam: dual_D_box(p, c, eps, t, lam))


def _cover(rng):
    """A cover of [0, 1] by intervals: a random grid, sometimes overlapping or reaching past 0 and 1."""
    N = rng.randint(1, 10)
    grid = [mp.mpf(0)] + sorted(mp.mpf(rng.random()) for _ in range(N - 1)) + [mp.mpf(1)]
    lo = [g - (mp.mpf(rng.random()) / 20 if rng.random() < 0.2 else 0) for g in grid[:-1]]
    hi = [g + (mp.mpf(rng.random()) / 20 if rng.random() < 0.2 else 0) for g in grid[1:]]
    return lo, hi


def _endpoint_bound(rng, w, c, eps, ends, dual=None, tight=None):
    """max over a random cover of ``ends(g(lo_i), g(hi_i))``, g(t) = t − D(t, λ_i), λ_i tight at lo_i, at hi_i, or
    random (≥ 0); D = ``dual`` (default ``dual_D_box``) over the items (w, c, eps)."""
    dual = dual or dual_D_box
    tight = tight or _tight_lambda_box
    lo, hi = _cover(rng)
    bound = mp.mpf(-1)
    for a, b in zip(lo, hi):
        pick = rng.random()
        lam = (tight(w, c, eps, a) if pick < 0.4 else tight(w, c, eps, b) if pick < 0.6
               else mp.mpf(rng.random()) * rng.choice([0.1, 1, 10]))
        bound = max(bound, ends(a - dual(w, c, eps, a, lam), b - dual(w, c, eps, b, lam)))
    return bound


def tilt_tv_le_dual_grid_box_endpoints(rng, trials, ends=None, bound_box=None):
    """Random p̂, centres c of both signs (magnitudes 0.01..3), radii ε ≥ 0, δ in the box |δ − c| ≤ ε (corners
    included), any cover of [0, 1] and any λ_i ≥ 0: TV(p, p̂) ≤ max_i max(g(lo_i), g(hi_i)), g(t) = t − D(t, λ_i),
    D = dualDBox p̂ c ε. ``ends``: how the two end values combine (default max); ``bound_box``: (c, ε) ↦ the box the
    bound is computed on (default the true one; the drift tests pass a wrong one)."""
    ends = ends or (lambda g0, g1: max(g0, g1))
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 6)
        p = _rand_p(rng, n)
        scale = rng.choice([0.05, 0.5, 2.0])
        c = [_centre(rng) for _ in range(n)]
        eps = [_radius(rng, scale) for _ in range(n)]
        d = [_in_box(rng, cj, ej) for cj, ej in zip(c, eps)]
        cb, eb = bound_box(c, eps) if bound_box else (c, eps)
        bound = _endpoint_bound(rng, p, cb, eb, ends)
        if _tv(_softmax_tilt(p, d), p) > bound + _TINY:
            bad.append((p, c, eps, d))
    return bad


def _binned(rng, centred=True):
    """Tokens binned into K bins, bin k with centre C_k (0 unless ``centred``) and level L_k ≥ 0; δ_j in its bin's
    box (corners included); the histogram w_k = Σ_{bin j = k} p̂_j (empty bins included)."""
    n, K = rng.randint(1, 8), rng.randint(1, 5)
    p = _rand_p(rng, n)
    scale = rng.choice([0.05, 0.5, 2.0])
    C = [_centre(rng) if centred else mp.mpf(0) for _ in range(K)]
    L = [_radius(rng, scale) for _ in range(K)]
    bin_ = [rng.randrange(K) for _ in range(n)]
    if centred and K > 1 and rng.random() < 0.3:  # two bins with the same level and different centres
        L[1] = L[0]
    w = [mp.fsum(p[j] for j in range(n) if bin_[j] == k) for k in range(K)]
    d = [_in_box(rng, C[bin_[j]], L[bin_[j]]) for j in range(n)]
    return p, C, L, bin_, w, d


def tilt_tv_le_hist_box_endpoints(rng, trials):
    """The histogram form: every |δ_j − C_{bin j}| ≤ L_{bin j}; the endpoint bound of ``dualDBox w C L`` on the
    histogram (over any cover, any λ_i ≥ 0) bounds TV(p, p̂)."""
    bad = []
    for _ in range(trials):
        p, C, L, bin_, w, d = _binned(rng)
        bound = _endpoint_bound(rng, w, C, L, lambda g0, g1: max(g0, g1))
        if _tv(_softmax_tilt(p, d), p) > bound + _TINY:
            bad.append((p, C, L, bin_, d))
    return bad


def tilt_tv_le_hist_endpoints(rng, trials):
    """TiltEndpoints.lean's symmetric histogram form (centre 0, |δ_j| ≤ ε_j ≤ L_{bin j}): the endpoint bound of
    ``dualD w L`` on the histogram bounds TV(p, p̂)."""

    def sym(w, c, eps, t, lam):
        return dual_D(w, eps, t, lam)

    bad = []
    for _ in range(trials):
        p, C, L, bin_, w, d = _binned(rng, centred=False)
        d = [dj * mp.mpf(rng.random()) if rng.random() < 0.3 else dj for dj in d]  # ε_j ≤ L: some strictly inside
        bound = _endpoint_bound(rng, w, C, L, lambda g0, g1: max(g0, g1), dual=sym)
        if _tv(_softmax_tilt(p, d), p) > bound + _TINY:
            bad.append((p, L, bin_, d))
    return bad


def dualDBox_regroup(rng, trials):
    """D(t, λ) of the tokens' boxes (C_{bin j}, L_{bin j}) equals D(t, λ) of the histogram w_k = Σ_{bin j = k} p̂_j
    over the bins' (C_k, L_k) (empty bins included), any t, λ."""
    bad = []
    for _ in range(trials):
        p, C, L, bin_, w, _ = _binned(rng)
        t, lam = mp.mpf(rng.uniform(-0.5, 1.5)), mp.mpf(rng.uniform(-1, 1)) * rng.choice([0.1, 1, 10])
        lhs = dual_D_box(p, [C[b] for b in bin_], [L[b] for b in bin_], t, lam)
        if abs(lhs - dual_D_box(w, C, L, t, lam)) > _TINY:
            bad.append((p, C, L, bin_, t, lam))
    return bad


def dualDBox_zero(rng, trials):
    """The box centred at 0 is the symmetric dual: dualDBox p̂ 0 ε = dualD p̂ ε (any t, λ, any ε)."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 8)
        p = [mp.mpf(rng.random()) for _ in range(n)]  # any weights: the identity needs no distribution
        eps = [mp.mpf(rng.uniform(-1, 3)) for _ in range(n)]
        t, lam = mp.mpf(rng.uniform(-0.5, 1.5)), mp.mpf(rng.uniform(-1, 1)) * rng.choice([0.1, 1, 10])
        if abs(dual_D_box(p, [mp.mpf(0)] * n, eps, t, lam) - dual_D(p, eps, t, lam)) > _TINY:
            bad.append((p, eps, t, lam))
    return bad
