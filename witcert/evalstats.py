"""The evaluation's small helpers (a leaf of ``witcert.quality`` and ``witcert.sweep``): the paired
bootstrap interval and the atomic JSON write."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np


def paired_ci(a, b, draws: int = 10000, seed: int = 0):
    """Mean of a − b and its 95 % paired bootstrap interval."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(draws, d.size))
    means = d[idx].mean(1)
    return float(d.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def write_json_atomic(path, obj) -> None:
    """Write ``obj`` to ``path`` through a temporary file and a rename (never half a file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)
