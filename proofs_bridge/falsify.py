"""Falsification of the SPEC §9 statements on random instances in high precision (mpmath).

A false statement must not survive even without a Lean checker: each function draws instances
that satisfy the statement's hypotheses, evaluates both sides with 50 significant digits and
returns the counterexamples it found (an empty list means none). ``STATEMENTS`` maps each §9
theorem name to its check; ``proofs_bridge.check`` runs them all.
"""

from __future__ import annotations

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
}


def run(trials: int = 2000, seed: int = 0) -> dict:
    """{theorem name: number of counterexamples} over ``trials`` random instances each."""
    out = {}
    for name, fn in STATEMENTS.items():
        out[name] = len(fn(random.Random(f"{seed}:{name}"), trials))
    return out


__all__ = ["STATEMENTS", "run", "dual_D"] + list(STATEMENTS)
