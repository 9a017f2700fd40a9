"""The decode's key-side level grid (SPEC §3, §8): the upper edges of the bins tokens are binned into by
their key radius factor (‖W_j‖, s_j), ratio √2, rounded up.

    key_edges(device) → [KEY_LEVELS + 1] float64: bin 0 = exactly 0, bin m ≤ X0·2^((m−1)/2), m = 1..KEY_LEVELS;
                        the overflow bin KEY_LEVELS + 1 (level: the row's exact maximum) has no edge here

The decode kernel bins with ``X0`` / ``KEY_LEVELS`` as constexprs (``decode._key_level``), the epilogue
(``kernels.epilogue``) turns the bins into levels with ``key_edges``.
"""

from __future__ import annotations

import torch

#: key-side level grid: edges X0·2^((m−1)/2), m = 1..KEY_LEVELS (ratio √2), 0 and overflow bins.
X0 = 2.0**-14
KEY_LEVELS = 29


def key_edges(device=None) -> torch.Tensor:
    """Upper edges of the key-side bins 0..K (bin 0 = exactly 0), float64."""
    m = torch.arange(1, KEY_LEVELS + 1, dtype=torch.float64, device=device)
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), X0 * torch.exp2((m - 1) / 2)])
