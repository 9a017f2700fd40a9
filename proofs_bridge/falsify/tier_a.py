"""Falsification of the Tier A statements (lean/WitCert/Radius.lean, Bands.lean, Sketch.lean: SPEC §1,
§2): the logit radius, the RoPE invariance of group norms (both layouts, partial rotary; the Lean
coordinate formulas against ``witcert.bounds.rope``), the residual-sketch radius and the exact window; and
the two helpers those rest on, Cauchy–Schwarz on one group and the rotation of one band."""

from __future__ import annotations

import mpmath as mp

from .highprec import _box, _dot, _norm, _rand_p, _softmax_tilt, _tv


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


def sketch_centred_error_le(rng, trials, radius=None):
    """The centred box of the sketch (Sketch.lean, for TiltBox.lean's ``heps``): |σ⟨q, r⟩ − σ⟨q, r̃⟩| ≤ |σ| ‖a⊙q‖ W
    (``radius``: the box's half-width as a function of |σ|, ‖a⊙q‖, W; the drift tests pass a wrong one)."""
    radius = radius or (lambda s, qa, W: s * qa * W)
    bad = []
    for _ in range(trials):
        d, a, r, rt, x, W, qs, sig = _sketch_instance(rng)
        for q in qs:
            err = abs(sig * _dot(q, r) - sig * _dot(q, rt))
            if err > radius(abs(sig), _norm([ai * qi for ai, qi in zip(a, q)]), W) * (1 + mp.mpf(10) ** -40) + mp.mpf(10) ** -60:
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


# ------------------------------------------ the two helper theorems of Radius.lean and Bands.lean

def _magnitude(rng):
    """A scale 10^k: 1, a random k in [−30, 30], or an end of that range."""
    return mp.mpf(10) ** rng.choice([0, rng.randint(-30, 30), rng.randint(-30, 30), -30, 30])


def _extreme_vec(rng, d):
    """d reals: all zero, all equal, one common scale, or every entry at its own scale in [1e-30, 1e30]
    (some entries exactly 0)."""
    mode = rng.choice(["zero", "equal", "scaled", "mixed", "mixed"])
    if mode == "zero":
        return [mp.mpf(0)] * d
    if mode == "equal":
        c = mp.mpf(rng.gauss(0, 1)) * _magnitude(rng)
        return [c] * d
    if mode == "scaled":
        s = _magnitude(rng)
        return [mp.mpf(rng.gauss(0, 1)) * s for _ in range(d)]
    return [mp.mpf(0) if rng.random() < 0.15 else mp.mpf(rng.gauss(0, 1)) * _magnitude(rng) for _ in range(d)]


def abs_sum_mul_le_gnorm_mul(rng, trials, bound=None):
    """Radius.lean: |Σ_{i∈g} q_i r_i| ≤ gnorm g q · gnorm g r (gnorm g x = √Σ_{i∈g} x_i²) for any finite set g of
    coordinates (empty, one coordinate, all, or random) and any q, r (zero vectors, equal entries, magnitudes
    1e-30..1e30 entry by entry); r = c·q on g (the equality case of Cauchy–Schwarz, c of any sign and scale, r
    arbitrary off g), r nearly parallel to q, or independent. ``bound``: the right side as a function of
    (gnorm g q, gnorm g r) (the drift tests pass a smaller one)."""
    bound = bound or (lambda gq, gr: gq * gr)
    bad = []
    for _ in range(trials):
        d = rng.randint(1, 10)
        gmode = rng.choice(["empty", "one", "all", "random", "random"])
        g = ([] if gmode == "empty" else [rng.randrange(d)] if gmode == "one" else list(range(d)) if gmode == "all"
             else [i for i in range(d) if rng.random() < 0.5])
        q = _extreme_vec(rng, d)
        rmode = rng.choice(["parallel", "parallel", "near", "independent", "independent"])
        r = _extreme_vec(rng, d)  # off g (and everywhere when independent)
        if rmode in ("parallel", "near"):
            c = rng.choice([-1, 1]) * _magnitude(rng) * mp.mpf(rng.uniform(0.1, 10))
            for i in g:
                r[i] = c * q[i]
                if rmode == "near":
                    r[i] += mp.mpf(rng.gauss(0, 1)) * abs(c * q[i]) * mp.mpf(10) ** -rng.randint(3, 20)
        lhs = abs(mp.fsum(q[i] * r[i] for i in g))
        gq, gr = mp.sqrt(mp.fsum(q[i] ** 2 for i in g)), mp.sqrt(mp.fsum(r[i] ** 2 for i in g))
        if lhs > bound(gq, gr) * (1 + mp.mpf(10) ** -40):  # g = ∅ or q = 0 on g: 0 ≤ 0
            bad.append((q, r, g))
    return bad


def _rope_band_lean(th, x, y):
    """``ropeBand θ (x, y)`` of lean/WitCert/Bands.lean, transcribed."""
    return x * mp.cos(th) - y * mp.sin(th), x * mp.sin(th) + y * mp.cos(th)


def ropeBand_sq(rng, trials, band=None):
    """Bands.lean: (ropeBand θ p).1² + (ropeBand θ p).2² = p.1² + p.2² for every angle θ (0, multiples of π/2,
    [−2π, 2π], RoPE angles pos·10000^(−2b/d), ±1e-30..1e30) and every pair p (zero, one coordinate zero, equal
    coordinates, magnitudes 1e-30..1e30, the two coordinates at opposite ends of that range). Equality within
    10^-40 relative. ``band``: the band map (θ, x, y) ↦ (x', y') (the drift tests pass a wrong one)."""
    band = band or _rope_band_lean
    bad = []
    for _ in range(trials):
        tmode = rng.choice(["zero", "quarter", "uniform", "rope", "extreme"])
        if tmode == "zero":
            th = mp.mpf(0)
        elif tmode == "quarter":
            th = mp.pi * rng.randint(-8, 8) / 2
        elif tmode == "uniform":
            th = mp.mpf(rng.uniform(-2, 2)) * mp.pi
        elif tmode == "rope":
            d = 2 * rng.randint(1, 64)
            th = rng.randint(0, 10**6) * mp.mpf(10000) ** (-mp.mpf(2 * rng.randrange(d // 2)) / d)
        else:
            th = rng.choice([-1, 1]) * mp.mpf(rng.random()) * mp.mpf(10) ** rng.randint(-30, 30)
        pmode = rng.choice(["zero", "axis", "equal", "scaled", "mixed", "opposite"])
        if pmode == "zero":
            x = y = mp.mpf(0)
        elif pmode == "axis":
            x, y = mp.mpf(rng.gauss(0, 1)) * _magnitude(rng), mp.mpf(0)
            x, y = (x, y) if rng.random() < 0.5 else (y, x)
        elif pmode == "equal":
            x = y = mp.mpf(rng.gauss(0, 1)) * _magnitude(rng)
            y = y if rng.random() < 0.5 else -y
        elif pmode == "scaled":
            s = _magnitude(rng)
            x, y = mp.mpf(rng.gauss(0, 1)) * s, mp.mpf(rng.gauss(0, 1)) * s
        elif pmode == "mixed":
            x, y = mp.mpf(rng.gauss(0, 1)) * _magnitude(rng), mp.mpf(rng.gauss(0, 1)) * _magnitude(rng)
        else:
            x, y = mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** 30, mp.mpf(rng.gauss(0, 1)) * mp.mpf(10) ** -30
            x, y = (x, y) if rng.random() < 0.5 else (y, x)
        u, v = band(th, x, y)
        lhs, rhs = u**2 + v**2, x**2 + y**2
        if abs(lhs - rhs) > mp.mpf(10) ** -40 * rhs:  # p = 0: both sides exactly 0
            bad.append((th, x, y))
    return bad
