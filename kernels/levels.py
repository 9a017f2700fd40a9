"""The decode's key-side level grid (SPEC §5): the upper edges of the bins tokens are sorted into by their
key radius, shared by the decode kernel (``kernels.decode_kernel``, which bins) and the epilogue
(``kernels.epilogue``, which turns the bins into TV⁺)."""

from __future__ import annotations

import torch

#: key-side level grid: edges X0·2^((m−1)/2), m = 1..KEY_LEVELS (ratio √2), 0 and overflow bins.
X0 = 2.0**-14
KEY_LEVELS = 29


def key_edges(device=None) -> torch.Tensor:
    """Upper edges of the key-side bins 0..K (bin 0 = exactly 0), float64."""
    m = torch.arange(1, KEY_LEVELS + 1, dtype=torch.float64, device=device)
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), X0 * torch.exp2((m - 1) / 2)])

