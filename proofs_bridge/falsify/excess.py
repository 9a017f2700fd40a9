"""Falsification of the centred box's excess form (lean/WitCert/Excess.lean): TV(p, p̂) ≤ max(A, B) with A = Σ p̂
(e^{−c+ε} − 1)₊, B = Σ p̂ (1 − e^{−c−ε})₊ (``tilt_tv_le_excess``), the two pointwise widenings by Ξ ≥ 0
(``excess_widen_up``, ``excess_widen_down``), the identity (1 − b) + (b − 1)₊ = (1 − b)₊ (``one_sub_add_max_sub_one``)
and the widened form: a box |δ − c| ≤ ε + Ξ gives TV ≤ max(e^Ξ A + e^Ξ − 1, B + 1 − e^{−Ξ}) with A, B over ε
(``tilt_tv_le_excess_widened``)."""

from __future__ import annotations

import mpmath as mp

from .highprec import _rand_p, _softmax_tilt, _tv
from .tilt_box import _centre, _in_box, _radius

_TINY = mp.mpf(10) ** -40


def excess_sums(p, c, eps):
    """(A, B) = (Σ p (e^{−c+ε} − 1)₊, Σ p (1 − e^{−c−ε})₊)."""
    a = mp.fsum(pj * max(mp.e ** (-cj + ej) - 1, 0) for pj, cj, ej in zip(p, c, eps))
    b = mp.fsum(pj * max(1 - mp.e ** (-cj - ej), 0) for pj, cj, ej in zip(p, c, eps))
    return a, b


def _case(rng):
    n = rng.randint(1, 6)
    p = _rand_p(rng, n)
    scale = rng.choice([0.05, 0.5, 2.0])
    c = [_centre(rng) for _ in range(n)]
    eps = [_radius(rng, scale) for _ in range(n)]
    return p, c, eps


def tilt_tv_le_excess(rng, trials, form=None):
    """Random p̂, centres of both signs, radii ε ≥ 0, δ in the box (corners included): TV(p, p̂) ≤ max(A, B).
    ``form``: (A, B) ↦ the bound (the drift tests pass a wrong one)."""
    form = form or (lambda a, b: max(a, b))
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        d = [_in_box(rng, cj, ej) for cj, ej in zip(c, eps)]
        if _tv(_softmax_tilt(p, d), p) > form(*excess_sums(p, c, eps)) + _TINY:
            bad.append((p, c, eps, d))
    return bad


def tilt_tv_le_excess_widened(rng, trials):
    """The kernel's first form (kept in Lean, unused since the rescaled one): δ in the box widened by Ξ,
    |δ − c| ≤ ε + Ξ; TV ≤ max(e^Ξ A + e^Ξ − 1, B + 1 − e^{−Ξ}) with A, B over the unwidened box."""
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        xi = mp.mpf(0) if rng.random() < 0.1 else mp.mpf(10) ** mp.mpf(rng.uniform(-6, 0))
        d = [_in_box(rng, cj, ej + xi) for cj, ej in zip(c, eps)]
        a, b = excess_sums(p, c, eps)
        bound = max(mp.e ** xi * a + mp.e ** xi - 1, b + 1 - mp.e ** (-xi))
        if _tv(_softmax_tilt(p, d), p) > bound + _TINY:
            bad.append((p, c, eps, xi, d))
    return bad


def _x_xi(rng):
    x = mp.mpf(rng.uniform(-5, 5)) * rng.choice([1e-4, 0.1, 1])
    xi = mp.mpf(0) if rng.random() < 0.1 else mp.mpf(10) ** mp.mpf(rng.uniform(-6, 0.5))
    return x, xi


def excess_widen_up(rng, trials):
    """(e^{x+Ξ} − 1)₊ ≤ e^Ξ (e^x − 1)₊ + (e^Ξ − 1) for Ξ ≥ 0."""
    bad = []
    for _ in range(trials):
        x, xi = _x_xi(rng)
        if max(mp.e ** (x + xi) - 1, 0) > mp.e ** xi * max(mp.e ** x - 1, 0) + (mp.e ** xi - 1) + _TINY:
            bad.append((x, xi))
    return bad


def excess_widen_down(rng, trials):
    """(1 − e^{x−Ξ})₊ ≤ (1 − e^x)₊ + (1 − e^{−Ξ}) for Ξ ≥ 0."""
    bad = []
    for _ in range(trials):
        x, xi = _x_xi(rng)
        if max(1 - mp.e ** (x - xi), 0) > max(1 - mp.e ** x, 0) + (1 - mp.e ** (-xi)) + _TINY:
            bad.append((x, xi))
    return bad


def one_sub_add_max_sub_one(rng, trials):
    """(1 − b) + (b − 1)₊ = (1 − b)₊ for every real b."""
    bad = []
    for _ in range(trials):
        b = mp.mpf(rng.uniform(-3, 3)) * rng.choice([1e-3, 1, 10])
        if abs((1 - b) + max(b - 1, 0) - max(1 - b, 0)) > _TINY:
            bad.append(b)
    return bad


def tilt_tv_le_excess_rescaled(rng, trials, factor=None):
    """The merge's form: p̂ ≤ e^{2Ξ} p̃ (p̃ ∝ p̂ e^{−ξ}, |ξ| ≤ Ξ, signs random or against the sums), δ in the box:
    TV(p, p̂) ≤ e^{2Ξ} max(Ã, B̃), the sums over p̃. ``factor``: Ξ ↦ the scale (the drift tests pass a wrong one)."""
    factor = factor or (lambda xi: mp.e ** (2 * xi))
    bad = []
    for _ in range(trials):
        p, c, eps = _case(rng)
        n = len(p)
        xi = mp.mpf(0) if rng.random() < 0.1 else mp.mpf(10) ** mp.mpf(rng.uniform(-6, 0))
        sgn = [rng.choice([-1, 1]) for _ in range(n)] if rng.random() < 0.5 else \
            [1 if -cj + ej > 0 else -1 for cj, ej in zip(c, eps)]
        pt = [pj * mp.e ** (-s * xi) for pj, s in zip(p, sgn)]
        z = mp.fsum(pt)
        pt = [x / z for x in pt]
        d = [_in_box(rng, cj, ej) for cj, ej in zip(c, eps)]
        a, b = excess_sums(pt, c, eps)
        if _tv(_softmax_tilt(p, d), p) > factor(xi) * max(a, b) + _TINY:
            bad.append((p, pt, c, eps, xi, d))
    return bad


def le_exp_two_mul_of_log_ratio(rng, trials):
    """Two distributions with |log(p̃_j/p̂_j) − C| ≤ Ξ for every j: p̂_j ≤ e^{2Ξ} p̃_j."""
    bad = []
    for _ in range(trials):
        n = rng.randint(1, 6)
        ph = _rand_p(rng, n)
        xi = mp.mpf(10) ** mp.mpf(rng.uniform(-6, 0.5))
        pt = [pj * mp.e ** (mp.mpf(rng.uniform(-1, 1)) * xi + 3) for pj in ph]  # C = 3 before normalising
        z = mp.fsum(pt)
        pt = [x / z for x in pt]
        if any(a > mp.e ** (2 * xi) * b + _TINY for a, b in zip(ph, pt)):
            bad.append((ph, pt, xi))
    return bad
