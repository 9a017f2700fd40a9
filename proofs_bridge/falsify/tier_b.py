"""Falsification of the Tier B statements (lean/WitCert/SubGaussian.lean, Budget.lean, Union.lean,
Request.lean: SPEC §5): the dither's MGF and logit tail, the failure budgets, and the chain of issue 14
(sub-Gaussian uniform dither, the biased tail, the union over tokens, steps and a request), partly by
Monte Carlo."""

from __future__ import annotations

import math

import mpmath as mp

from .highprec import _dot, _rand_p


def uniform_mgf_le(rng, trials):
    """E e^{λr}, r ~ U[−s/2, s/2], is sinh(λs/2)/(λs/2) ≤ exp(λ² (s²/12) / 2)."""
    bad = []
    for _ in range(trials):
        lam, s = mp.mpf(rng.uniform(-60, 60)), mp.mpf(rng.uniform(1e-3, 4))
        x = lam * s / 2
        mgf = mp.sinh(x) / x if x != 0 else mp.mpf(1)
        # and (every 25th instance) the MGF by quadrature agrees with the closed form
        off = 0
        if _ % 25 == 0:
            quad = mp.quad(lambda r: mp.e ** (lam * r), [-s / 2, s / 2]) / s
            off = abs(quad - mgf) > mp.mpf(10) ** -30 * mgf
        if mgf > mp.e ** (lam**2 * (s**2 / 12) / 2) or off:
            bad.append((lam, s))
    return bad


def dither_logit_tail(rng, trials):
    """Chernoff for Σ q_i r_i with independent r_i of proxy s_i²/12: P(|Σ| > t) ≤ 2 e^{−t²/(2V)};
    at t = sqrt(2 V ln(2n/δ)) the union over n tokens is exactly δ. Checked: (i) the exact
    MGF of the weighted sum is ≤ e^{λ² V / 2} (product of uniform_mgf_le); (ii) the identity."""
    bad = []
    for _ in range(trials):
        k = rng.randint(1, 6)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(k)]
        s = [mp.mpf(rng.uniform(1e-3, 2)) for _ in range(k)]
        V = mp.fsum(qi**2 * si**2 / 12 for qi, si in zip(q, s))
        lam = mp.mpf(rng.uniform(-20, 20))
        mgf = mp.fprod(mp.sinh(lam * qi * si / 2) / (lam * qi * si / 2) if lam * qi * si != 0 else 1 for qi, si in zip(q, s))
        n, dlt = rng.randint(1, 10**6), mp.mpf(10) ** rng.uniform(-12, -1)
        t = mp.sqrt(2 * V * mp.log(2 * n / dlt))
        if mgf > mp.e ** (lam**2 * V / 2) or abs(n * 2 * mp.e ** (-(t**2) / (2 * V)) - dlt) > mp.mpf(10) ** -35:
            bad.append((q, s, lam))
    return bad


def request_budget_sound(rng, trials):
    bad = []
    total = mp.nsum(lambda t: 6 / (mp.pi**2 * t**2), [1, mp.inf])  # Σ_t of the anytime weights
    for _ in range(trials):
        dr = mp.mpf(10) ** rng.uniform(-9, -1)
        L, H, T = rng.randint(1, 80), rng.randint(1, 64), rng.randint(1, 10**5)
        fixed = T * L * H * (dr / (L * H * T))
        anytime_all = L * H * (dr / (L * H)) * total
        if fixed > dr * (1 + mp.mpf(10) ** -40) or anytime_all > dr * (1 + mp.mpf(10) ** -30):
            bad.append((dr, L, H, T))
    return bad


# ------------------------------------------------------------ the chain of issue 14

def uniform_hasSubgaussianMGF(rng, trials):
    """r ~ U[−s/2, s/2]: E e^{λr} by quadrature equals sinh(λs/2)/(λs/2) and is ≤ e^{λ² (s²/12)/2}
    — and the proxy s²/12 is the least one at small λ (s²/12·(1−10⁻⁶) fails there)."""
    bad = []
    for k in range(trials):
        lam, s = mp.mpf(rng.uniform(-40, 40)), mp.mpf(rng.uniform(1e-3, 4))
        x = lam * s / 2
        mgf = mp.sinh(x) / x if x != 0 else mp.mpf(1)
        off = False
        if k % 25 == 0:
            quad = mp.quad(lambda u: mp.e ** (lam * u), [-s / 2, s / 2]) / s
            off = abs(quad - mgf) > mp.mpf(10) ** -30 * mgf
        if mgf > mp.e ** (lam**2 * (s**2 / 12) / 2) or off:
            bad.append((lam, s))
        lam0 = mp.mpf(10) ** -3 / s
        x0 = lam0 * s / 2
        if not mp.sinh(x0) / x0 > mp.e ** (lam0**2 * (s**2 / 12) * (1 - mp.mpf(10) ** -6) / 2):
            bad.append(("proxy not tight", s))
    return bad


def _mc_tail(rng, q, scales, sigma, t, draws, bias=None):
    """Monte Carlo frequency of |σ Σ q_i e_i| ≥ t + b for e_i = U[−s_i/2, s_i/2] (+ a perturbation
    of size ≤ β_i when ``bias`` = β is given)."""
    import numpy as np

    g = np.random.default_rng(rng.randrange(2**32))
    q, sc = np.asarray(q, float), np.asarray(scales, float)
    r = (g.random((draws, q.size)) - 0.5) * sc
    e = r if bias is None else r + np.asarray(bias, float) * np.sign(g.random((draws, q.size)) - 0.5)
    b = 0.0 if bias is None else abs(sigma) * float(np.sum(np.abs(q) * np.asarray(bias, float)))
    return float(np.mean(np.abs(sigma * (e @ q)) >= t + b))


def dither_logit_tail_uniform(rng, trials):
    """Uniform residuals, V = σ² Σ q² s²/12: the exact MGF of σΣq r is ≤ e^{λ²V/2}; and the
    empirical two-sided tail at random t stays below 2 e^{−t²/(2V)} (+ 4 binomial s.d.)."""
    bad = []
    for k in range(trials):
        d = rng.randint(1, 6)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        s = [mp.mpf(rng.uniform(1e-3, 2)) for _ in range(d)]
        sig = mp.mpf(rng.uniform(0.05, 1))
        V = sig**2 * mp.fsum(qi**2 * si**2 / 12 for qi, si in zip(q, s))
        lam = mp.mpf(rng.uniform(-20, 20))
        mgf = mp.fprod(mp.sinh(lam * sig * qi * si / 2) / (lam * sig * qi * si / 2) if lam * qi * si != 0 else 1
                       for qi, si in zip(q, s))
        if mgf > mp.e ** (lam**2 * V / 2) * (1 + mp.mpf(10) ** -40):
            bad.append((q, s, lam))
        if k % 50 == 0:
            t = float(mp.sqrt(V)) * rng.uniform(0.5, 3)
            bound = 2 * float(mp.e ** (-(t**2) / (2 * V)))
            draws = 4000
            freq = _mc_tail(rng, q, s, float(sig), t, draws)
            if freq > bound + 4 * (max(bound, 1e-3) * (1 - min(bound, 1)) / draws) ** 0.5 + 1e-3:
                bad.append(("tail", q, s, t, freq, bound))
    return bad


def dither_logit_tail_bias(rng, trials):
    """With |e_i − r_i| ≤ β_i and b = |σ| Σ |q_i| β_i: the event |σΣq e| ≥ t + b implies
    |σΣq r| ≥ t (checked pointwise), so the tail of the ideal model bounds the real one."""
    bad = []
    for _ in range(trials):
        d = rng.randint(1, 6)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        r = [mp.mpf(rng.uniform(-1, 1)) for _ in range(d)]
        beta = [mp.mpf(rng.random()) * mp.mpf(2) ** -rng.randint(0, 14) for _ in range(d)]
        e = [ri + bi * mp.mpf(rng.uniform(-1, 1)) for ri, bi in zip(r, beta)]
        sig = mp.mpf(rng.uniform(-1, 1))
        b = abs(sig) * mp.fsum(abs(qi) * bi for qi, bi in zip(q, beta))
        t = mp.mpf(rng.random()) * abs(sig * _dot(q, e))
        if t + b <= abs(sig * _dot(q, e)) and not t <= abs(sig * _dot(q, r)):
            bad.append((q, r, e))
    return bad


def union_tail_le(rng, trials):
    """Finite sample space: μ(⋃_{j∈T} E_j) ≤ δ whenever every μ(E_j) ≤ δ/|T|."""
    bad = []
    for _ in range(trials):
        omega = rng.randint(2, 40)
        w = _rand_p(rng, omega)
        n, dlt = rng.randint(1, 8), mp.mpf(rng.random())
        events = []
        for _ in range(n):
            pts = [i for i in range(omega) if rng.random() < 0.5]
            rng.shuffle(pts)
            ev, mass = set(), mp.mpf(0)
            for i in pts:  # keep μ(E_j) ≤ δ/n
                if mass + w[i] <= dlt / n:
                    ev.add(i)
                    mass += w[i]
            events.append(ev)
        if mp.fsum(w[i] for i in set().union(*events)) > dlt * (1 + mp.mpf(10) ** -40):
            bad.append((w, events))
    return bad


def dither_step_union(rng, trials):
    """n tokens, each its own scales and V_j, radius t_j = sqrt(2 V_j ln(2n/δ)) + b_j: the
    frequency of ∃ j: |δ_j| ≥ t_j stays below δ (+ 4 binomial s.d.); and n·(δ/n) = δ exactly."""
    import numpy as np

    bad = []
    for k in range(max(trials // 50, 4)):
        n, d = rng.randint(1, 6), rng.randint(1, 5)
        dlt = rng.choice([0.2, 0.5, 1.0, 1.9])
        q = np.array([rng.gauss(0, 1) for _ in range(d)])
        sig = rng.uniform(0.05, 1)
        g = np.random.default_rng(rng.randrange(2**32))
        draws, hit = 3000, np.zeros(3000, bool)
        for _ in range(n):
            sc = np.array([rng.uniform(1e-3, 2) for _ in range(d)])
            beta = sc * 2.0**-14
            V = sig**2 * float(np.sum(q**2 * sc**2 / 12))
            b = abs(sig) * float(np.sum(np.abs(q) * beta))
            t = math.sqrt(2 * V * math.log(2 * n / dlt)) + b
            r = (g.random((draws, d)) - 0.5) * sc
            e = r + beta * np.sign(g.random((draws, d)) - 0.5)
            hit |= np.abs(sig * (e @ q)) >= t
        freq = float(hit.mean())
        if freq > dlt + 4 * (dlt * (1 - min(dlt, 1)) / draws) ** 0.5 + 2e-3:
            bad.append((n, d, dlt, freq))
    return bad


def request_union_sound(rng, trials):
    """Both schedules: L·H·Σ_t δ_step(t) ≤ δ_req (fixed horizon: = δ_req), and on a finite sample
    space the union of (layer, head, step) events each within its budget has mass ≤ δ_req."""
    bad = request_budget_sound(rng, trials)
    for _ in range(max(trials // 20, 4)):
        L, H, T = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 5)
        dr = mp.mpf(rng.random())
        omega = 60
        w = _rand_p(rng, omega)
        for sched in ("fixed", "anytime"):
            total = set()
            for _l in range(L):
                for _h in range(H):
                    for t in range(T):
                        cap = dr / (L * H * T) if sched == "fixed" else dr * 6 / (mp.pi**2 * (t + 1) ** 2) / (L * H)
                        mass = mp.mpf(0)
                        for i in rng.sample(range(omega), omega):
                            if mass + w[i] <= cap:
                                total.add(i)
                                mass += w[i]
            if mp.fsum(w[i] for i in total) > dr * (1 + mp.mpf(10) ** -40):
                bad.append((sched, L, H, T))
    return bad
