"""Falsification of the composed statements of issue 37 (b), (c) (lean/WitCert/FloatTV.lean,
Request.lean): the kernel's TV bound with its floating-point terms, and the per-step and per-request
Tier B TV bounds (by Monte Carlo)."""

from __future__ import annotations

import math

import mpmath as mp

from .floating_point import _fp_instance, _restrict
from .highprec import _rand_p, _softmax_tilt, _tv
from .tier_b import request_budget_sound


def kernel_tv_sound(rng, trials, rho=None):
    """The decode pass as one statement: p = tilt(p̂, δ), p̃ = tilt(p̂, ξ) (the kernel's), radii rounded up onto
    levels lev ≥ ε, ε_max ≥ every level, lost tokens U with p̃(U) ≤ Λ p̃(V), m ≤ Σ_V p̃ e^{−(lev+Ξ)} / p̃(V):
    TV(p, p̂) ≤ F + tanh(Ξ/2) + Λ(1 + e^{ε_max+Ξ}/m) for F = TV(p|V, p̃|V), tanh((ε_max+Ξ)/2) and the e-form
    of p̃|V at lev + Ξ. ``rho``: the ρ term as a function of (Λ, ε_max + Ξ, m)."""
    rho = rho or (lambda Lam, r, m: Lam * (1 + mp.e ** r / m))
    bad = []
    for _ in range(trials):
        n, ph, eps, d, Xi, xi = _fp_instance(rng)
        if n < 2:
            continue
        lev = [e * (1 + mp.mpf(rng.random()) / 4) if rng.random() < 0.7 else e for e in eps]
        emax = max(lev) * (1 + (mp.mpf(rng.random()) / 10 if rng.random() < 0.5 else 0))
        U = [j for j in range(n) if rng.random() < rng.choice([0.0, 0.2, 0.5])]
        if len(U) == n:
            U.pop(rng.randrange(n))
        V = [j for j in range(n) if j not in U]
        p, pt = _softmax_tilt(ph, d), _softmax_tilt(ph, xi)
        ptV = mp.fsum(pt[j] for j in V)
        Lam = mp.fsum(pt[j] for j in U) / ptV * (1 + (mp.mpf(rng.random()) if rng.random() < 0.3 else 0))
        m = mp.fsum(pt[j] * mp.e ** (-(lev[j] + Xi)) for j in V) / ptV * (1 - mp.mpf(rng.random()) / 10)
        pV, ptVn = _restrict(p, V), _restrict(pt, V)
        A = mp.fsum(a * mp.e ** (lev[j] + Xi) for a, j in zip(ptVn, V))
        Fs = [_tv(pV, ptVn), mp.tanh((emax + Xi) / 2), (A * A - 1) / 2]
        extra = mp.tanh(Xi / 2) + rho(Lam, emax + Xi, m)
        if any(_tv(p, ph) > F + extra + mp.mpf(10) ** -40 for F in Fs):
            bad.append((ph, d, xi, U))
    return bad


def _step_mc(rng, g, L, H, T, budget, draws=400):
    """Monte Carlo of a request (L layers, H heads, T steps, a step's budget ``budget(t)``): each (l, h, t) has n
    tokens with uniform dither residuals (+ a bias ≤ β), a random p̂ and its tilt p by δ_j = σ Σ_i q_i e_{j,i};
    TV⁺ = min(tanh(max_j t_j / 2), e-form at t_j), sound for every tilt within the Tier B radii t_j. Returns
    (frequency of ∃ (l, h, t): TV⁺ < TV, pointwise failures: every |δ_j| < t_j and still TV⁺ < TV)."""
    import numpy as np

    hit, pointwise = np.zeros(draws, bool), 0
    for _l in range(L):
        for _h in range(H):
            for t in range(T):
                n, d = rng.randint(2, 6), rng.randint(1, 4)
                q = np.array([rng.gauss(0, 1) for _ in range(d)])
                sig = rng.uniform(0.05, 1)
                sc = np.array([[rng.uniform(1e-3, 2) for _ in range(d)] for _ in range(n)])  # [n, d]
                beta = sc * 2.0**-14
                V = sig**2 * np.sum(q**2 * sc**2 / 12, axis=-1)
                b = abs(sig) * np.sum(np.abs(q) * beta, axis=-1)
                tt = np.sqrt(2 * V * math.log(2 * n / budget(t))) + b
                r = (g.random((draws, n, d)) - 0.5) * sc
                e = r + beta * np.sign(g.random((draws, n, d)) - 0.5)
                dl = sig * (e @ q)  # [draws, n]
                ph = np.array([float(x) for x in _rand_p(rng, n)])
                w = ph * np.exp(-dl)
                p = w / w.sum(-1, keepdims=True)
                tv = 0.5 * np.abs(p - ph).sum(-1)
                A = float(np.sum(ph * np.exp(tt)))
                up = min(math.tanh(float(tt.max()) / 2), 0.5 * (A * A - 1)) * (1 + 1e-12) + 1e-15
                ev = up < tv
                pointwise += int(np.sum(ev & np.all(np.abs(dl) < tt, axis=-1)))
                hit |= ev
    return float(hit.mean()), pointwise


def step_tv_sound(rng, trials):
    """One step: off the radii event TV ≤ TV⁺ pointwise, and the frequency of TV⁺ < TV stays below δ
    (+ 4 binomial s.d.)."""
    import numpy as np

    bad = []
    for _ in range(max(trials // 100, 3)):
        dlt = rng.choice([0.2, 0.5, 1.0, 1.9])
        freq, pw = _step_mc(rng, np.random.default_rng(rng.randrange(2**32)), 1, 1, 1, lambda t: dlt)
        if pw or freq > dlt + 4 * (dlt * (1 - min(dlt, 1)) / 400) ** 0.5 + 5e-3:
            bad.append((dlt, freq, pw))
    return bad


def request_tv_sound(rng, trials):
    """A request under both schedules: L·H·Σ_t δ_step(t) ≤ δ_req (request_budget_sound), and the frequency of
    ∃ (layer, head, step): TV⁺ < TV stays below δ_req (+ 4 binomial s.d.), never failing pointwise."""
    import numpy as np

    bad = request_budget_sound(rng, trials)
    for _ in range(max(trials // 200, 2)):
        L, H, T = rng.randint(1, 2), rng.randint(1, 2), rng.randint(1, 3)
        dr = rng.choice([0.3, 1.0])
        for budget in (lambda t: dr / (L * H * T), lambda t: dr * 6 / (math.pi**2 * (t + 1) ** 2) / (L * H)):
            if sum(L * H * budget(t) for t in range(T)) > dr * (1 + 1e-12):
                bad.append(("budget", L, H, T))
            freq, pw = _step_mc(rng, np.random.default_rng(rng.randrange(2**32)), L, H, T, budget)
            if pw or freq > dr + 4 * (dr * (1 - min(dr, 1)) / 400) ** 0.5 + 5e-3:
                bad.append((L, H, T, dr, freq, pw))
    return bad
