"""The 50-digit arithmetic of the falsification searches (mpmath, set on import) and their shared
pieces: dot products and norms, the softmax tilt of a distribution, total variation, random
distributions and random radius boxes."""

from __future__ import annotations

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
