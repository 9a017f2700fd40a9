"""The exact supremum of TV over a radius box by its corners (the tests' oracle for ``tv_sup_bruteforce``): the
supremum of TV(tilt(p̂, δ), p̂) over a box is reached at a corner (SPEC §3)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st


@st.composite
def box_instances(draw, n_max=8):
    """(p̂, c, ε) of up to ``n_max`` tokens: Dirichlet masses (some tiny), radii over 1e-6 … 2 (15 % exact), centres
    over 0 … 30 (the centred-box tests' property inputs)."""
    n = draw(st.integers(1, n_max))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    p = rng.dirichlet(np.ones(n) * draw(st.sampled_from([0.05, 0.5, 5.0])))
    p = np.maximum(p, 1e-300)
    p /= p.sum()
    e = rng.exponential(draw(st.sampled_from([1e-6, 0.01, 0.3, 2.0])), n) * (rng.random(n) < 0.85)
    c = rng.normal(0, draw(st.sampled_from([0.0, 1e-3, 0.3, 3.0, 30.0])), n)
    return p, c, e


def corner_sup(p, eps, center=None):
    """sup over δ in the box |δ_j − c_j| ≤ ε_j (c = 0 without ``center``) of TV(p, p̂), p ∝ p̂ e^{−δ}, by
    enumerating the 2^n corners."""
    p, eps = np.asarray(p, dtype=np.float64), np.asarray(eps, dtype=np.float64)
    c = np.zeros_like(eps) if center is None else np.asarray(center, dtype=np.float64)
    best = 0.0
    for signs in itertools.product((-1.0, 1.0), repeat=len(p)):
        delta = c + np.asarray(signs) * eps
        q = p * np.exp(-(delta - delta.max()))
        q /= q.sum()
        best = max(best, 0.5 * np.abs(q - p).sum())
    return best
