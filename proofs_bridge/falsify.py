"""Falsification of the SPEC §9 statements on random instances in high precision (mpmath).

A false statement must not survive even without a Lean checker: each function draws instances
that satisfy the statement's hypotheses, evaluates both sides with 50 significant digits and
returns the counterexamples it found (an empty list means none). ``STATEMENTS`` maps each §9
theorem name to its check; ``proofs_bridge.check`` runs them all.
"""

from __future__ import annotations

import math
import random

import mpmath as mp

mp.mp.dps = 50


def _softmax_tilt(p, d):
    w = [pi * mp.e ** (-di) for pi, di in zip(p, d)]
    z = mp.fsum(w)
    return [wi / z for wi in w]


def _dot(a, b):
    return mp.fsum(x * y for x, y in zip(a, b))


def _norm(a):
    return mp.sqrt(_dot(a, a))


def _tv(p, q):
    return mp.fsum(abs(a - b) for a, b in zip(p, q)) / 2


def _rand_p(rng, n):
    w = [mp.mpf(rng.random()) ** rng.choice([1, 3, 8]) + mp.mpf(10) ** -30 for _ in range(n)]
    z = mp.fsum(w)
    return [x / z for x in w]


def _box(rng, n, scale):
    eps = [mp.mpf(rng.random()) * scale for _ in range(n)]
    delta = [e * mp.mpf(rng.uniform(-1, 1)) if rng.random() < 0.7 else e * rng.choice([-1, 1]) for e in eps]
    return eps, delta


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


def lse_merge_exact(rng, trials):
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 12)
        s = [mp.mpf(rng.gauss(0, 5)) for _ in range(n)]
        v = [mp.mpf(rng.gauss(0, 1)) for _ in range(n)]
        cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
        parts = [list(range(a, b)) for a, b in zip([0] + cuts, cuts + [n])]
        ms = [max(s[j] for j in P) for P in parts]
        ls = [mp.fsum(mp.e ** (s[j] - mi) for j in P) for P, mi in zip(parts, ms)]
        accs = [mp.fsum(mp.e ** (s[j] - mi) * v[j] for j in P) for P, mi in zip(parts, ms)]
        M = max(ms)
        Lm = mp.fsum(li * mp.e ** (mi - M) for li, mi in zip(ls, ms))
        o = mp.fsum(ai * mp.e ** (mi - M) for ai, mi in zip(accs, ms)) / Lm
        z = mp.fsum(mp.e ** (x - M) for x in s)
        o_ref = mp.fsum(mp.e ** (x - M) * vi for x, vi in zip(s, v)) / z
        if abs(o - o_ref) > mp.mpf(10) ** -40 * (1 + abs(o_ref)) or abs(M + mp.log(Lm) - (M + mp.log(z))) > mp.mpf(10) ** -40:
            bad.append((s, cuts))
    return bad


def abs_logit_error_le_radius(rng, trials):
    bad = []
    for _ in range(trials):
        d = 2 * rng.randint(1, 8)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        r = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        G = rng.randint(1, d // 2)
        bands = [[b, b + d // 2] for b in range(d // 2)]
        groups = [sum((bands[b] for b in range(len(bands)) if b % G == g), []) for g in range(G)]
        W = [_norm([r[i] for i in g]) * (1 + mp.mpf(rng.random()) / 10) for g in groups]
        sig = mp.mpf(rng.uniform(0.01, 1))
        lhs = abs(sig * _dot(q, r))
        rhs = sig * mp.fsum(_norm([q[i] for i in g]) * w for g, w in zip(groups, W))
        if lhs > rhs:
            bad.append((q, r))
    return bad


def rope_group_norm_invariant(rng, trials):
    bad = []
    for _ in range(trials):
        d = 2 * rng.randint(1, 8)
        x = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        pos = rng.randint(0, 10**6)
        y = list(x)
        half = d // 2
        for b in range(half):
            th = pos * mp.mpf(10000) ** (-mp.mpf(2 * b) / d)
            c, s = mp.cos(th), mp.sin(th)
            y[b], y[b + half] = x[b] * c - x[b + half] * s, x[b + half] * c + x[b] * s
        for b in range(half):  # every band (hence every union of bands) keeps its norm
            if abs((y[b] ** 2 + y[b + half] ** 2) - (x[b] ** 2 + x[b + half] ** 2)) > mp.mpf(10) ** -40:
                bad.append((x, pos))
                break
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


def lse_merge_exact_k(rng, trials):
    """k pairwise disjoint, non-contiguous token sets, arbitrary offsets m_k and M (not maxima)."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 12)
        s = [mp.mpf(rng.gauss(0, 5)) for _ in range(n)]
        v = [mp.mpf(rng.gauss(0, 1)) for _ in range(n)]
        k = rng.randint(1, 5)
        label = [rng.randrange(k) for _ in range(n)]
        parts = [[j for j in range(n) if label[j] == c] for c in range(k)]
        m = [mp.mpf(rng.gauss(0, 5)) for _ in range(k)]
        M = mp.mpf(rng.gauss(0, 5))
        den = mp.fsum(mp.e ** (m[c] - M) * mp.fsum(mp.e ** (s[j] - m[c]) for j in parts[c]) for c in range(k))
        acc = mp.fsum(mp.e ** (m[c] - M) * mp.fsum(mp.e ** (s[j] - m[c]) * v[j] for j in parts[c]) for c in range(k))
        z = mp.fsum(mp.e ** (x - M) for x in s)
        a = mp.fsum(mp.e ** (x - M) * vi for x, vi in zip(s, v))
        if abs(den - z) > mp.mpf(10) ** -35 * z or abs(acc - a) > mp.mpf(10) ** -35 * (z + abs(a)):
            bad.append((s, label))
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


def _rope_half_lean(h, th, x):
    """``ropeHalf`` of lean/WitCert/Bands.lean, transcribed."""
    def at(i):
        if i < h:
            return x[i] * mp.cos(th[i]) - x[i + h] * mp.sin(th[i])
        if i < 2 * h:
            return x[i] * mp.cos(th[i - h]) + x[i - h] * mp.sin(th[i - h])
        return x[i]
    return [at(i) for i in range(len(x))]


def _rope_ilv_lean(h, th, x):
    """``ropeInterleaved`` of lean/WitCert/Bands.lean, transcribed."""
    def at(i):
        if i < 2 * h:
            if i % 2 == 0:
                return x[i] * mp.cos(th[i // 2]) - x[i + 1] * mp.sin(th[i // 2])
            return x[i] * mp.cos(th[i // 2]) + x[i - 1] * mp.sin(th[i // 2])
        return x[i]
    return [at(i) for i in range(len(x))]


def _rope_layouts(rng, trials, layout):
    """The Lean coordinate formula equals ``witcert.bounds.rope`` (same layout, partial rotary),
    and keeps the norm of every group of bands, with the layout's band → pair map."""
    import numpy as np

    from witcert import bounds as B

    lean_fn = _rope_half_lean if layout == "half" else _rope_ilv_lean
    pair = (lambda b, h: (b, b + h)) if layout == "half" else (lambda b, h: (2 * b, 2 * b + 1))
    bad = []
    for _ in range(trials // 10 + 1):
        h = rng.randint(1, 6)
        d = 2 * h + rng.choice([0, 0, 2, 3])
        x = [rng.gauss(0, 1) for _ in range(d)]
        pos = rng.randint(0, 5000)
        th = [pos * 10000.0 ** (-2.0 * b / (2 * h)) for b in range(h)]
        y = lean_fn(h, [mp.mpf(a) for a in th], [mp.mpf(a) for a in x])
        ref = B.rope(np.array([x]), np.array([pos]), theta=10000.0, layout=layout, rotary_dim=2 * h)[0]
        if max(abs(float(a) - b) for a, b in zip(y, ref)) > 1e-9:
            bad.append(("code", layout, h, d))
        g = [b for b in range(h) if rng.random() < 0.5]
        coords = sorted({c for b in g for c in pair(b, h)})
        if len(coords) != 2 * len(g):
            bad.append(("pairs overlap", layout, h, g))
        if abs(mp.fsum(y[i] ** 2 for i in coords) - mp.fsum(mp.mpf(x[i]) ** 2 for i in coords)) > mp.mpf(10) ** -30:
            bad.append(("norm", layout, h, g))
        # issue 37 (f): the group together with passthrough coordinates P ⊆ [2h, d)
        cp = coords + [i for i in range(2 * h, d) if rng.random() < 0.5]
        if abs(mp.fsum(y[i] ** 2 for i in cp) - mp.fsum(mp.mpf(x[i]) ** 2 for i in cp)) > mp.mpf(10) ** -30:
            bad.append(("norm with passthrough", layout, h, g))
    return bad


def rope_half_group_norm_invariant(rng, trials):
    return _rope_layouts(rng, trials, "half")


def rope_interleaved_group_norm_invariant(rng, trials):
    return _rope_layouts(rng, trials, "interleaved")


def rope_layout_group_norm_invariant(rng, trials):
    return _rope_layouts(rng, trials, rng.choice(["half", "interleaved"]))


# ------------------------------------------------------------ SPEC §7: the floating point

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


# ------------------------------------------------ SPEC §2 (Tier A): the residual-sketch radius

def _sketch_instance(rng):
    """One kv head: d coordinates in RoPE bands (pairs) with one positive weight per band (a few
    bands at weight 0 where the sketch is exact), GQ query heads, a residual r, a b-bit sketch r̃
    (or r̃ = 0, or r̃ exact on some bands), a witness W ≥ ‖(r − r̃)/a‖ rounded up, σ of any sign."""
    h = rng.randint(1, 6)
    d = 2 * h
    a = []
    for _ in range(h):
        w = mp.e ** mp.mpf(rng.gauss(0, 1)) if rng.random() < 0.85 else mp.mpf(1)
        a += [w, w]
    r = [mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** rng.randint(-3, 1) for _ in range(d)]
    mode = rng.choice(["bits", "zero", "exact_bands"])
    if mode == "zero":
        rt = [mp.mpf(0)] * d
    else:
        b = rng.randint(1, 4)
        step = max(abs(x) for x in r) / 2 ** (b - 1) or mp.mpf(1)
        rt = [mp.nint(x / step) * step for x in r]
    if mode == "exact_bands" or rng.random() < 0.3:
        for band in range(h):
            if rng.random() < 0.4:
                for i in (2 * band, 2 * band + 1):
                    rt[i] = r[i]
                    if rng.random() < 0.5:
                        a[i] = mp.mpf(0)  # zero weight where the sketch is exact
    x = [ri - ti for ri, ti in zip(r, rt)]
    xa = [xi / ai if ai != 0 else mp.mpf(0) for xi, ai in zip(x, a)]
    W = _norm(xa) * (1 + mp.mpf(rng.random()) / 8)
    gq = rng.randint(1, 4)
    qs = [[mp.mpf(rng.gauss(0, 1)) for _ in range(d)] for _ in range(gq)]
    sig = mp.mpf(rng.uniform(-1, 1))
    return d, a, r, rt, x, W, qs, sig


def weighted_inner_le(rng, trials):
    """|⟨q, x⟩| ≤ ‖a ⊙ q‖ ‖x / a‖ (weights zero only where x is)."""
    bad = []
    for _ in range(trials):
        d, a, r, rt, x, W, qs, sig = _sketch_instance(rng)
        xa = [xi / ai if ai != 0 else mp.mpf(0) for xi, ai in zip(x, a)]
        for q in qs:
            if abs(_dot(q, x)) > _norm([ai * qi for ai, qi in zip(a, q)]) * _norm(xa) * (1 + mp.mpf(10) ** -40):
                bad.append((a, q, x))
    return bad


def sketch_radius(rng, trials, shared=None):
    """Per head |σ⟨q_h, r⟩| ≤ |σ||⟨q_h, r̃⟩| + |σ|‖a⊙q_h‖W ≤ c_h (W + u) with c_h = |σ|‖a⊙q_h‖ and the
    kernel's u = max_h' |σ⟨q_h', r̃⟩| / c_h' (``shared``: the shared radius as a function of c, W, u)."""
    shared = shared or (lambda c, W, u: c * (W + u))
    bad = []
    for _ in range(trials):
        d, a, r, rt, x, W, qs, sig = _sketch_instance(rng)
        cs = [abs(sig) * _norm([ai * qi for ai, qi in zip(a, q)]) for q in qs]
        if any(c == 0 for c in cs):
            continue
        u = max(abs(sig * _dot(q, rt)) / c for q, c in zip(qs, cs))
        for q, c in zip(qs, cs):
            err = abs(sig * _dot(q, r))
            per_head = abs(sig) * abs(_dot(q, rt)) + c * W
            tol = 1 + mp.mpf(10) ** -40
            if err > per_head * tol or err > shared(c, W, u) * tol or per_head > shared(c, W, u) * tol:
                bad.append((a, q, r, rt))
    return bad


def projected_logit_error_le(rng, trials):
    """|σ⟨q, r⟩| ≤ |σ| (|Σ_P q r| + ‖q_{¬P}‖ ‖r_{¬P}‖) for any set P of coordinates."""
    bad = []
    for _ in range(trials):
        d = rng.randint(1, 12)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        r = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        P = [i for i in range(d) if rng.random() < 0.5]
        Pc = [i for i in range(d) if i not in P]
        sig = mp.mpf(rng.uniform(-1, 1))
        rhs = abs(sig) * (abs(mp.fsum(q[i] * r[i] for i in P)) + _norm([q[i] for i in Pc]) * _norm([r[i] for i in Pc]))
        if abs(sig * _dot(q, r)) > rhs * (1 + mp.mpf(10) ** -40) + mp.mpf(10) ** -60:
            bad.append((q, r, P))
    return bad


def window_radius_zero(rng, trials):
    """Window tokens (k̂ = k) have δ = 0 exactly; the e-form with radius 0 on the window and ε_j
    elsewhere bounds TV (tilt_tv_le_eform with zero radii)."""
    bad = []
    for _ in range(trials):
        n, d = rng.randint(1, 8), rng.randint(1, 6)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        sig = mp.mpf(rng.uniform(-1, 1))
        win = [j for j in range(n) if rng.random() < 0.5]
        eps, delta = _box(rng, n, rng.choice([0.01, 0.5, 3.0]))
        for j in win:
            k = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
            delta[j] = sig * _dot(q, [a - b for a, b in zip(k, list(k))])  # k̂ = k
            eps[j] = mp.mpf(0)
            if abs(delta[j]) > 0:
                bad.append(("window", j))
        p = _rand_p(rng, n)
        A = mp.fsum(pi * mp.e ** e for pi, e in zip(p, eps))
        if _tv(_softmax_tilt(p, delta), p) > (A * A - 1) / 2 + mp.mpf(10) ** -40:  # (all in the window: TV = 0 = bound)
            bad.append((p, delta, win))
    return bad


def kernel_radius_ge_group_sum(rng, trials):
    """|δ| ≤ |σ| Σ_g ‖q[g]‖ W_g ≤ |σ| ‖q‖ ‖(W_g)_g‖₂ for a partition into groups of bands."""
    bad = []
    for _ in range(trials):
        h = rng.randint(1, 6)
        d = 2 * h
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        r = [mp.mpf(rng.gauss(0, 1)) for _ in range(d)]
        G = rng.randint(1, h)
        label = [rng.randrange(G) for _ in range(h)]
        groups = [[i for b in range(h) if label[b] == g for i in (b, b + h)] for g in range(G)]
        groups = [g for g in groups if g]
        Wg = [_norm([r[i] for i in g]) * (1 + mp.mpf(rng.random()) / 10) for g in groups]
        sig = mp.mpf(rng.uniform(-1, 1))
        gsum = abs(sig) * mp.fsum(_norm([q[i] for i in g]) * w for g, w in zip(groups, Wg))
        kern = abs(sig) * _norm(q) * _norm(Wg)
        if abs(sig * _dot(q, r)) > gsum * (1 + mp.mpf(10) ** -40) or gsum > kern * (1 + mp.mpf(10) ** -40):
            bad.append((q, r, groups))
    return bad


def sketch_radius_ge_group_sum(rng, trials):
    """r̃ = 0, a = 1, W = ‖(W_g)_g‖₂, u ≥ 0: |σ| Σ_g ‖q[g]‖ W_g ≤ c (W + u), c = |σ| ‖q‖."""
    bad = []
    for _ in range(trials):
        h = rng.randint(1, 6)
        q = [mp.mpf(rng.gauss(0, 1)) for _ in range(2 * h)]
        G = rng.randint(1, h)
        groups = [[i for b in range(h) if b % G == g for i in (b, b + h)] for g in range(G)]
        Wg = [mp.mpf(rng.random()) for _ in groups]
        sig = mp.mpf(rng.uniform(-1, 1))
        u = mp.mpf(rng.random()) if rng.random() < 0.5 else mp.mpf(0)
        c = abs(sig) * _norm(q)
        if abs(sig) * mp.fsum(_norm([q[i] for i in g]) * w for g, w in zip(groups, Wg)) > c * (_norm(Wg) + u) * (1 + mp.mpf(10) ** -40):
            bad.append((q, Wg))
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

# ------------------------- issue 37 (b), (c): the composed statements (FloatTV.lean, Request.lean)

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


STATEMENTS = {
    "rope_group_norm_invariant": rope_group_norm_invariant,
    "abs_logit_error_le_radius": abs_logit_error_le_radius,
    "tv_eq_max_gain": tv_eq_max_gain,
    "tilt_tv_le_tanh": tilt_tv_le_tanh,
    "tilt_tv_le_eform": tilt_tv_le_eform,
    "tilt_tv_le_dual_grid": tilt_tv_le_dual_grid,
    "output_error_le": output_error_le,
    "uniform_mgf_le": uniform_mgf_le,
    "dither_logit_tail": dither_logit_tail,
    "request_budget_sound": request_budget_sound,
    "lse_merge_exact": lse_merge_exact,
    # the chain of issue 14
    "uniform_hasSubgaussianMGF": uniform_hasSubgaussianMGF,
    "dither_logit_tail_uniform": dither_logit_tail_uniform,
    "dither_logit_tail_bias": dither_logit_tail_bias,
    "union_tail_le": union_tail_le,
    "dither_step_union": dither_step_union,
    "request_union_sound": request_union_sound,
    "lse_merge_exact_k": lse_merge_exact_k,
    "tilt_tv_le_tanh_osc": tilt_tv_le_tanh,  # the same search: TV ≤ tanh(osc/4) ≤ tanh(ε_max/2)
    "tilt_tv_le_tanh_top2": tilt_tv_le_tanh_top2,
    "rope_layout_group_norm_invariant": rope_layout_group_norm_invariant,
    "rope_half_group_norm_invariant": rope_half_group_norm_invariant,
    "rope_interleaved_group_norm_invariant": rope_interleaved_group_norm_invariant,
    # SPEC §7: the floating point of the decode pass (lean/WitCert/FloatTV.lean)
    "tilt_rebase": tilt_rebase,
    "tv_le_perturbed_base": tv_le_perturbed_base,
    "tv_le_perturbed_base_tanh": tv_le_perturbed_base,  # the same search checks F = tanh((ε_max+Ξ)/2)
    "tv_le_restrict_add_lost": tv_le_restrict_add_lost,
    "tilt_restrict": tilt_restrict,
    "tilt_mass_lost_le": tilt_mass_lost_le,
    "tilt_mass_lost_le_compl": tilt_mass_lost_le_compl,
    "tv_le_restrict_add_rho": tv_le_restrict_add_rho,
    # SPEC §2 (Tier A): the residual-sketch radius (lean/WitCert/Sketch.lean)
    "weighted_inner_le": weighted_inner_le,
    "sketch_logit_error_le": sketch_radius,  # the same search checks the per-head and shared forms
    "sketch_shared_radius_le": sketch_radius,
    "sketch_u_of_ratio_le": sketch_radius,  # u = max ratio: the shared form holds at it
    "projected_logit_error_le": projected_logit_error_le,
    "window_token_radius_zero": window_radius_zero,
    "window_radii_sound": window_radius_zero,
    "window_tv_le_eform": window_radius_zero,
    "kernel_radius_ge_group_sum": kernel_radius_ge_group_sum,
    "sketch_radius_ge_per_head": sketch_radius,  # per_head ≤ shared is checked there
    "sketch_radius_ge_group_sum": sketch_radius_ge_group_sum,
    # SPEC §3(c) with endpoint values (lean/WitCert/TiltEndpoints.lean)
    "tilt_tv_le_dual_grid_endpoints": tilt_tv_le_dual_grid_endpoints,
    # issue 37 (f): partial rotary (the layout searches add passthrough coordinates to the group)
    "rope_half_partial_group_norm_invariant": rope_half_group_norm_invariant,
    "rope_interleaved_partial_group_norm_invariant": rope_interleaved_group_norm_invariant,
    "dualD_regroup": dualD_regroup,  # issue 37 (e) (not parsed: its statement has `fun` and a filter)
    # issue 37 (b), (c): the composed statements (lean/WitCert/FloatTV.lean, lean/WitCert/Request.lean)
    "kernel_tv_sound": kernel_tv_sound,
    "kernel_tv_sound_tanh": kernel_tv_sound,  # the same search checks F = tanh((ε_max+Ξ)/2)
    "step_tv_sound": step_tv_sound,
    "request_tv_sound": request_tv_sound,
    "request_tv_sound_fixed": request_tv_sound,  # the same search runs both schedules
    "request_tv_sound_anytime": request_tv_sound,
}


def run(trials: int = 2000, seed: int = 0) -> dict:
    """{theorem name: number of counterexamples} over ``trials`` random instances each."""
    out = {}
    for name, fn in STATEMENTS.items():
        out[name] = len(fn(random.Random(f"{seed}:{name}"), trials))
    return out


__all__ = ["STATEMENTS", "run", "dual_D"] + list(STATEMENTS)
