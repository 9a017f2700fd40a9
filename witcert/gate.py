"""The gate (SPEC §6): when to repair, which exact blocks to page in, and the repair loop.

Model-free: it sees per-block risks, whether the bounds hold, and a page-in callback. The cache
(``witcert.cache``) supplies them per (step, layer) from its meter; tests drive it with
synthetic risks and a fake store (``tests/cache/test_gate.py``).

Per (step, layer, sequence, kv head), after the meter:

* ``certified`` (τ < 1): while some query head of the kv head has ``TV⁺ > τ`` (or ``E⁺_V > τ_v``),
  page in the exact block of highest risk, recompute the meter, until the bounds hold or
  ``max_pagein_blocks`` are spent; then the row is flagged (by the caller: ``exceeds`` after the loop).
* ``risk-ranked``: when the bound exceeds τ (default 0: always), page in the top
  ``max_pagein_blocks`` blocks by risk, in one round.
* risk of a block (``block_risk``) = Σ_{j∈B} Σ_heads p̂_j (e^{ε_j} − 1) (+ Σ p̂_j φ_j / τ_v with τ_v),
  the block's first-order contribution to the e-form bound (the per-token terms are
  ``witcert.meter.token_risk``); 0 for repaired blocks. A block is
  paged in only if its risk is > 0, ≥ ``min_risk`` and ≥ ``min_share`` × the total risk of its
  (sequence, kv head): with ``min_share`` the gate repairs the blocks that carry the bound
  (attention sinks, the tokens being read), not the many blocks that each carry a sliver of it.

Repair is persistent and idempotent: ``page_in`` returns the bytes it moved, 0 for a block already
exact, and a block that moves nothing is not counted; a round that moves nothing ends the loop.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
import torch

from .meter import token_risk

__all__ = ["Gate", "GateResult", "exceeds", "block_risk", "select_blocks", "repair"]


@dataclasses.dataclass(frozen=True)
class Gate:
    """Repair policy (SPEC §6). ``max_pagein_blocks``: per (step, layer, sequence, kv head)."""

    policy: str = "certified"
    tau: float | None = None
    tau_v: float | None = None
    max_pagein_blocks: int = 8
    tier: str = "A"
    min_risk: float = 0.0
    min_share: float = 0.0

    def __post_init__(self):
        if self.policy not in ("certified", "risk-ranked"):
            raise ValueError(f"Gate.policy: expected 'certified' or 'risk-ranked', got {self.policy!r}")
        tau = self.tau
        if tau is None:
            object.__setattr__(self, "tau", 0.1 if self.policy == "certified" else 0.0)
        elif not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau >= 0):
            raise ValueError(f"Gate.tau: expected a finite number >= 0, got {tau!r}")
        if self.policy == "certified" and not self.tau < 1:
            raise ValueError("Gate.tau: the certified policy needs tau < 1 (TV⁺ ≤ 1 always); use 'risk-ranked'")
        if self.tau_v is not None and not (isinstance(self.tau_v, (int, float)) and self.tau_v > 0):
            raise ValueError(f"Gate.tau_v: expected a number > 0, got {self.tau_v!r}")
        if not isinstance(self.max_pagein_blocks, int) or isinstance(self.max_pagein_blocks, bool) or self.max_pagein_blocks < 0:
            raise ValueError(f"Gate.max_pagein_blocks: expected an int >= 0, got {self.max_pagein_blocks!r}")
        if not (isinstance(self.min_risk, (int, float)) and self.min_risk >= 0):
            raise ValueError(f"Gate.min_risk: expected a number >= 0, got {self.min_risk!r}")
        if not (isinstance(self.min_share, (int, float)) and 0 <= self.min_share <= 1):
            raise ValueError(f"Gate.min_share: expected a number in [0, 1], got {self.min_share!r}")
        if self.tier not in ("A", "B"):
            raise ValueError(f"Gate.tier: expected 'A' or 'B', got {self.tier!r}")


@dataclasses.dataclass
class GateResult:
    """What one run of the repair loop did."""

    pagein: np.ndarray  # [B, Hkv] int64: blocks paged in (bytes > 0) per (sequence, kv head)
    paged: list  # (b, h, block, bytes) in the order they were paged in
    rounds: int  # rounds that moved at least one block (each followed by a re-measure)


def exceeds(gate: Gate, tv, tv_b=None, err=None):
    """Where the bounds do not hold (elementwise): the gated TV⁺ (Tier A, or min(A, B) with
    ``tier="B"``) is above τ, or E⁺_V is above τ_v (when set). Torch tensors or numpy arrays. A NaN
    bound exceeds (never "within τ": ``not (x ≤ τ)``, not ``x > τ``)."""
    mn = torch.minimum if isinstance(tv, torch.Tensor) else np.minimum
    gtv = tv if gate.tier == "A" else mn(tv, tv_b)
    o = ~(gtv <= gate.tau)
    if gate.tau_v is not None:
        o = o | ~(err <= gate.tau_v)
    return o


def block_risk(p, logits, allowed, live, eps, *, block_size: int, num_blocks: int, repaired, v_wit=None,
               tau_v: float | None = None) -> torch.Tensor:
    """Risk of every block [B, Hkv, num_blocks] (module doc); 0 for repaired blocks.

    ``p``, ``logits``, ``allowed``, ``eps``: [B, Hkv, GQ, Lq, n] (served p̂, served logits, the
    mask, Tier A radii); ``live`` [B, Hkv, GQ, Lq] (rows with a key); ``repaired`` [B, Hkv, ≥ nb]
    bool; ``v_wit`` [B, Hkv, n] with ``tau_v``."""
    # p̂_j (e^{ε_j} − 1) (+ p̂_j φ_j / τ_v) per token, in the log domain: witcert.meter.token_risk
    rt = token_risk(p, logits, allowed, live, eps, None if tau_v is None else v_wit[:, :, None, None], tau_v)
    rt = torch.nan_to_num(rt, nan=0.0, posinf=1e300).sum((2, 3))  # [B, Hkv, n]
    T = block_size
    nb = num_blocks
    n = rt.shape[-1]
    rb = torch.nn.functional.pad(rt, (0, nb * T - n)).view(*rt.shape[:2], nb, T).sum(-1)
    return torch.where(repaired[..., :nb], torch.zeros_like(rb), rb)


def select_blocks(gate: Gate, risk: torch.Tensor, need: np.ndarray, pagein: np.ndarray) -> list:
    """One round's choice: for every (b, h) with ``need[b, h]``, the blocks to page in, highest
    risk first — the top ``max_pagein_blocks − pagein[b, h]`` (risk-ranked) or the top one
    (certified), stopping at the first whose risk is ≤ 0, < ``min_risk`` or < ``min_share`` ×
    Σ risk[b, h]. ``risk`` [B, Hkv, nb] (torch). Returns [(b, h, [block, …]), …]."""
    nb = risk.shape[-1]
    risk_ranked = gate.policy == "risk-ranked"
    floor = torch.clamp(gate.min_share * risk.sum(-1, keepdim=True), min=gate.min_risk)  # [B, Hkv, 1]
    out = []
    for b, h in zip(*np.nonzero(need)):
        k = gate.max_pagein_blocks - int(pagein[b, h]) if risk_ranked else 1
        vals, idx = torch.topk(risk[b, h], min(k, nb))
        chosen = []
        for val, blk in zip(vals.tolist(), idx.tolist()):
            if val <= 0 or val < float(floor[b, h, 0]):
                break
            chosen.append(blk)
        out.append((int(b), int(h), chosen))
    return out


def repair(gate: Gate, over: Callable[[], np.ndarray], risk: Callable[[], torch.Tensor],
           page_in: Callable[[int, int, int], int], remeasure: Callable[[], None] | None = None) -> GateResult:
    """The repair loop of ``gate`` (module doc).

    ``over()``: bool [B, Hkv], where the bounds do not hold now (called at the start of every
    round, so it must reflect the page-ins so far, after ``remeasure``); ``risk()``: the block
    risks [B, Hkv, nb] now; ``page_in(b, h, block)``: make the block exact, return the bytes
    moved (0: already exact); ``remeasure()``: called after every round that moved a block.
    Certified: up to ``max_pagein_blocks`` rounds of one block per (b, h) still over; risk-ranked:
    one round of the top blocks. Never more than ``max_pagein_blocks`` blocks per (b, h)."""
    first = np.asarray(over(), dtype=bool)
    pagein = np.zeros(first.shape, dtype=np.int64)
    paged: list = []
    rounds = 0
    if gate.max_pagein_blocks == 0:
        return GateResult(pagein, paged, rounds)
    for i in range(1 if gate.policy == "risk-ranked" else gate.max_pagein_blocks):
        state = first if i == 0 else np.asarray(over(), dtype=bool)
        need = state & (pagein < gate.max_pagein_blocks)
        if not need.any():
            break
        moved = False
        for b, h, blocks in select_blocks(gate, risk(), need, pagein):
            for blk in blocks:
                nbytes = page_in(b, h, blk)
                if nbytes:
                    pagein[b, h] += 1
                    paged.append((b, h, blk, nbytes))
                    moved = True
        if not moved:
            break
        rounds += 1
        if remeasure is not None:
            remeasure()
    return GateResult(pagein, paged, rounds)
