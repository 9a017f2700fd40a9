"""Falsification of the TV statements (lean/WitCert/TiltTV.lean, TiltEndpoints.lean, Output.lean: SPEC
§3, §4): TV as a maximal gain, the tanh, e-form and dual-grid tilt bounds (also with endpoint values)
and the output error bound."""

from __future__ import annotations

import mpmath as mp

from .highprec import _box, _dot, _norm, _rand_p, _softmax_tilt, _tv


def tv_eq_max_gain(rng, trials):
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 7)
        p, q = _rand_p(rng, n), _rand_p(rng, n)
        best = max(mp.fsum(p[i] - q[i] for i in range(n) if m >> i & 1) for m in range(1 << n))
        if abs(_tv(p, q) - best) > mp.mpf(10) ** -40:
            bad.append((p, q))
    return bad


def tilt_tv_le_tanh(rng, trials, tanh=None):
    tanh = tanh or (lambda osc: mp.tanh(osc / 4))
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 8)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
        osc = max(d) - min(d)
        if _tv(_softmax_tilt(p, d), p) > tanh(osc) or tanh(osc) > mp.tanh(max(eps) / 2) + mp.mpf(10) ** -40:
            bad.append((p, d))
    return bad


def tilt_tv_le_eform(rng, trials):
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 8)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
        A = mp.fsum(pi * mp.e ** e for pi, e in zip(p, eps))
        if _tv(_softmax_tilt(p, d), p) > (A * A - 1) / 2:
            bad.append((p, d))
    return bad


def dual_D(p, eps, t, lam):
    m = mp.fsum(pi * mp.e ** (-e) for pi, e in zip(p, eps))
    beta = [(1 - t) * mp.e ** e + t * mp.e ** (-e) for e in eps]
    return lam * t * m - mp.fsum(pi * max(lam * b - 1, 0) for pi, b in zip(p, beta))


def tilt_tv_le_dual_grid(rng, trials):
    """For any grid 0 = t_0 < … < t_N = 1 and any λ_i ≥ 0: TV ≤ max_i t_{i+1} − D(t_i, λ_i)."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 6)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.05, 0.5, 2.0]))
        N = rng.randint(1, 12)
        grid = [mp.mpf(0)] + sorted(mp.mpf(rng.random()) for _ in range(N - 1)) + [mp.mpf(1)]
        lams = [mp.mpf(rng.random()) * rng.choice([0.1, 1, 10]) for _ in range(N)]
        bound = max(grid[i + 1] - dual_D(p, eps, grid[i], lams[i]) for i in range(N))
        if _tv(_softmax_tilt(p, d), p) > bound:
            bad.append((p, d, grid, lams))
    return bad


def output_error_le(rng, trials):
    bad = []
    for _ in range(trials):
        n, dv = rng.randint(1, 6), rng.randint(1, 4)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.05, 1.0]))
        ph = _softmax_tilt(p, d)  # p_hat is the served distribution; p (exact) a tilt of it
        vh = [[mp.mpf(rng.gauss(0, 1)) for _ in range(dv)] for _ in range(n)]
        f = [[mp.mpf(rng.gauss(0, 0.1)) for _ in range(dv)] for _ in range(n)]
        phi = [_norm(fj) * (1 + mp.mpf(rng.random())) for fj in f]
        v = [[a - b for a, b in zip(vj, fj)] for vj, fj in zip(vh, f)]
        o = [mp.fsum(p[j] * v[j][c] for j in range(n)) for c in range(dv)]
        oh = [mp.fsum(ph[j] * vh[j][c] for j in range(n)) for c in range(dv)]
        err = _norm([a - b for a, b in zip(oh, o)])
        Dv = 2 * max(_norm(vj) for vj in vh)
        bound = _tv(p, ph) * (Dv + max(phi)) + _dot(ph, phi)
        if err > bound:
            bad.append((p, d))
    return bad


def _store(x, bits, tiny, mode):
    """x stored in a float of ``bits`` significant bits (``mode``: "rn" round to nearest, "rz" truncate), values below
    ``tiny`` flushed to 0 (a subnormal flush)."""
    if abs(x) < tiny:
        return mp.mpf(0)
    ulp = mp.mpf(2) ** (mp.floor(mp.log(abs(x), 2)) - (bits - 1))
    y = x / ulp
    return (mp.nint(y) if mode == "rn" else (mp.floor(y) if y > 0 else mp.ceil(y))) * ulp


def output_error_stored_le(rng, trials):
    """The served output is the computed one stored element by element (one ulp relative, a flush below ``tiny``):
    ‖s − o‖ ≤ err + rel‖ô‖ + tiny·√D with err = ‖ô − o‖, rel = 2^(1 − bits) (the contract's STORE_ROUNDING model)."""
    bad = []
    for _ in range(trials):
        dv = rng.randint(1, 8)
        bits = rng.choice([8, 11, 24])
        tiny = mp.mpf(2) ** -rng.choice([14, 30, 126])
        o = [mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** rng.randint(-6, 3) for _ in range(dv)]
        oh = [a + mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** rng.randint(-9, 0) for a in o]
        st = [_store(x, bits, tiny, rng.choice(["rn", "rz"])) for x in oh]
        err = _norm([a - b for a, b in zip(oh, o)])
        bound = err + mp.mpf(2) ** (1 - bits) * _norm(oh) + tiny * mp.sqrt(dv)
        if _norm([a - b for a, b in zip(st, o)]) > bound:
            bad.append((o, oh, bits))
    return bad


def tilt_tv_le_tanh_top2(rng, trials):
    """TV ≤ tanh((ε₍₁₎ + ε₍₂₎)/4) ≤ tanh(ε_max/2), with e12 = 0 for a single token."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 8)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
        top = sorted(eps, reverse=True)
        e12 = top[0] + top[1] if n > 1 else mp.mpf(0)
        if _tv(_softmax_tilt(p, d), p) > mp.tanh(e12 / 4) or mp.tanh(e12 / 4) > mp.tanh(max(eps) / 2) + mp.mpf(10) ** -40:
            bad.append((p, d))
    return bad


# ------------------------------------- SPEC §3(c) with endpoint values (lean/WitCert/TiltEndpoints.lean)

def _tight_lambda(p, eps, t):
    """The λ among {0} ∪ {1/β_c(t)} with the largest D(t, λ) (D(t, ·) is concave, piecewise linear with its
    breakpoints at the 1/β_c: this is the tight λ the code's knapsack finds)."""
    cands = [mp.mpf(0)] + [1 / ((1 - t) * mp.e ** e + t * mp.e ** (-e)) for e in eps]
    return max(cands, key=lambda lam: dual_D(p, eps, t, lam))


def tilt_tv_le_dual_grid_endpoints(rng, trials, ends=None):
    """Any cover of [0, 1] by intervals [lo_i, hi_i] (a grid, sometimes overlapping or reaching past 0 and 1)
    and any λ_i ≥ 0 (tight at lo_i, at hi_i, or random): TV ≤ max_i max(g(lo_i), g(hi_i)), g(t) = t − D(t, λ_i).
    ``ends``: how the two end values are combined (default max)."""
    ends = ends or (lambda g0, g1: max(g0, g1))
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 6)
        p = _rand_p(rng, n)
        eps, d = _box(rng, n, rng.choice([0.05, 0.5, 2.0]))
        N = rng.randint(1, 10)
        grid = [mp.mpf(0)] + sorted(mp.mpf(rng.random()) for _ in range(N - 1)) + [mp.mpf(1)]
        lo = [g - (mp.mpf(rng.random()) / 20 if rng.random() < 0.2 else 0) for g in grid[:-1]]
        hi = [g + (mp.mpf(rng.random()) / 20 if rng.random() < 0.2 else 0) for g in grid[1:]]
        bound = mp.mpf(-1)
        for a, b in zip(lo, hi):
            pick = rng.random()
            lam = (_tight_lambda(p, eps, a) if pick < 0.4 else _tight_lambda(p, eps, b) if pick < 0.6
                   else mp.mpf(rng.random()) * rng.choice([0.1, 1, 10]))
            bound = max(bound, ends(a - dual_D(p, eps, a, lam), b - dual_D(p, eps, b, lam)))
        if _tv(_softmax_tilt(p, d), p) > bound + mp.mpf(10) ** -40:
            bad.append((p, d, lo, hi))
    return bad


def dualD_regroup(rng, trials):
    """Issue 37 (e): D(t, λ) of the radii rounded up onto levels L(bin j) equals D(t, λ) of the histogram
    w_k = Σ_{bin j = k} p̂_j over the levels (empty bins included), and so does the e-form's A."""
    bad = []
    for _ in range(trials):
        n, K = rng.randint(1, 8), rng.randint(1, 5)
        p = _rand_p(rng, n)
        L = sorted(mp.mpf(rng.random()) * rng.choice([0.05, 0.5, 3.0]) for _ in range(K))
        bin_ = [rng.randrange(K) for _ in range(n)]
        w = [mp.fsum(p[j] for j in range(n) if bin_[j] == k) for k in range(K)]
        t, lam = mp.mpf(rng.random()), mp.mpf(rng.random()) * rng.choice([0.1, 1, 10])
        eps = [L[b] for b in bin_]
        A1, A2 = mp.fsum(pj * mp.e ** e for pj, e in zip(p, eps)), mp.fsum(wk * mp.e ** lk for wk, lk in zip(w, L))
        if abs(dual_D(p, eps, t, lam) - dual_D(w, L, t, lam)) > mp.mpf(10) ** -40 or abs(A1 - A2) > mp.mpf(10) ** -40:
            bad.append((p, bin_, L))
    return bad
