"""Synthetic split-KV partials for the fused merge's tests (``kernels.epilogue.merge`` against ``merge_torch``)."""

from __future__ import annotations

import torch


def synthetic_partials(g: torch.Generator, Bsz: int, Hq: int, S: int, D: int, NB: int):
    """(m_out, l_out, acc, hist, stat, q) of B sequences × Hq heads × S splits, the last split of every row empty
    (m −inf, l 0): split maxima of a few units, denominators 1-51, histograms with most mass in few bins, the six
    statistics at the decode's scales (max ‖W‖, max s, max φ, max ν, no non-finite count, max κ)."""
    m_out = torch.randn(Bsz, Hq, S, generator=g) * 3
    m_out[:, :, -1] = float("-inf")  # an empty split
    l_out = torch.rand(Bsz, Hq, S, generator=g) * 50 + 1
    l_out[:, :, -1] = 0
    acc = torch.randn(Bsz, Hq, S, D, generator=g)
    hist = torch.rand(Bsz, Hq, S, NB, generator=g) ** 6 * l_out[..., None] / 4
    stat = torch.rand(Bsz, Hq, S, 6, generator=g) * torch.tensor([0.05, 0.03, 0.3, 3.0, 0.0, 3.0])
    q = torch.randn(Bsz, Hq, D, generator=g)
    return m_out, l_out, acc, hist, stat, q
