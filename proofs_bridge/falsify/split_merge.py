"""Falsification of the split-KV merge statements (lean/WitCert/SplitMerge.lean): merging the partial
softmax results of two or of k splits by their log-sum-exp is exact."""

from __future__ import annotations

import mpmath as mp


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
