"""SPEC §1 bands and groups: which coordinates one RoPE rotation acts on, and the partition of
the head dimension into unions of whole bands. Shared by the fp64 reference (``witcert.bounds``)
and the kernels' paged layout (``kernels.paged``)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _bands(head_dim: int, rotary_dim: int, layout: str) -> list[list[int]]:
    half = rotary_dim // 2
    if layout == "half":
        bands = [[b, b + half] for b in range(half)]
    elif layout == "interleaved":
        bands = [[2 * b, 2 * b + 1] for b in range(half)]
    else:
        raise ValueError(f"layout: expected 'half' or 'interleaved', got {layout!r}")
    bands += [[c] for c in range(rotary_dim, head_dim)]  # partial rotary: 1-D bands
    return bands


def _check_rope_dims(head_dim: Any, rotary_dim: Any) -> tuple[int, int]:
    if not isinstance(head_dim, (int, np.integer)) or isinstance(head_dim, bool) or head_dim < 1:
        raise ValueError(f"head_dim: expected a positive int, got {head_dim!r}")
    if rotary_dim is None:
        rotary_dim = head_dim
    if not isinstance(rotary_dim, (int, np.integer)) or isinstance(rotary_dim, bool):
        raise ValueError(f"rotary_dim: expected an int or None, got {rotary_dim!r}")
    if rotary_dim < 0 or rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be even and in [0, head_dim={head_dim}], got {rotary_dim}")
    return int(head_dim), int(rotary_dim)


def group_slices(head_dim: int, num_groups: int, rotary_dim: int | None = None, layout: str = "half") -> list[np.ndarray]:
    """Partition the ``head_dim`` coordinates into ``num_groups`` unions of whole RoPE bands.

    Bands are taken in band order (RoPE frequency order) and split into contiguous runs of
    as-equal-as-possible length. Returns a list of sorted int64 index arrays (SPEC §1).
    """
    head_dim, rotary_dim = _check_rope_dims(head_dim, rotary_dim)
    bands = _bands(head_dim, rotary_dim, layout)
    if not isinstance(num_groups, (int, np.integer)) or isinstance(num_groups, bool) or not 1 <= num_groups <= len(bands):
        raise ValueError(f"num_groups: expected an int in [1, {len(bands)}] (the number of bands), got {num_groups!r}")
    out = []
    for chunk in np.array_split(np.arange(len(bands)), int(num_groups)):
        idx = sorted(c for b in chunk for c in bands[b])
        out.append(np.asarray(idx, dtype=np.int64))
    return out
