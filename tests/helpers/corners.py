"""The exact supremum of TV over a radius box by its corners (the tests' oracle for ``tv_sup_bruteforce``): the
supremum of TV(tilt(p̂, δ), p̂) over a box is reached at a corner (SPEC §3)."""

from __future__ import annotations

import itertools

import numpy as np


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
