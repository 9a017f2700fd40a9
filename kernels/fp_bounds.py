"""Floating point of the kernels (SPEC §7): the constants and error bounds the write, the decode and the
epilogue share.

    dot_gamma(D, split3=False)                  → γ: |fl(σ s ⟨q, c⟩) − σ s ⟨q, c⟩| ≤ γ σ ‖q‖ κ
    sketch_gamma(scheme, D, bits)               → γ of the decode's key-sketch dot ⟨q, r̃⟩
    mass_eta_terms(tile_tokens, split, packed)  → (a, b) with mass_eta(tiles, …) = a + tiles · b
    store_terms(stored, computed, D)            → (rel, abs·√D, max) of an output stored in a narrower dtype

* every witness / norm is computed scaled by its largest entry (no squaring underflow), inflated
  by ``KERNEL_REL_SLACK``, floored at ``KERNEL_WITNESS_FLOOR`` for lossy schemes (a residual whose
  entries a flush-to-zero GPU treats as 0 is < √D·2^-126) and rounded **up** into its dtype;
* a served logit σ·s_j·⟨q, c_j⟩ computed in fp32 (tensor cores: exact products, fp32 sums that
  may truncate) is within ``σ ‖q‖ κ_j γ`` of the exact one, γ = ``dot_gamma(D)``;
* a p̂ mass accumulated in fp32 (tf32x3 / ieee histogram dot, the running rescale by α per
  tile) is within a relative ``mass_eta(tiles)`` of the exact one; masses below
  ``FP32_FLUSH`` relative to the running maximum may be lost entirely (counted, ``ρ``).
"""

from __future__ import annotations

import math

from contract.constants import store_rounding
from contract.schemes import SCHEMES

#: relative inflation of every fp32 witness / radius computed in a kernel (covers fp32
#: rounding of the residual, the sum of squares over ≤ 256 channels and the sqrt, and of the
#: dequantized value s·(c − u)); then rounded up into the storage dtype.
KERNEL_REL_SLACK = 2.0**-12
#: absolute floor added to every key / value witness of a lossy scheme (see the module doc)
KERNEL_WITNESS_FLOOR = 2.0**-100
#: unit roundoff assumed for an fp32 sum on tensor cores (2^-24 with round-to-nearest; 2^-23
#: covers truncating accumulation)
KERNEL_UNIT = 2.0**-23
#: below this (relative to the running maximum) an fp32 mass may be lost or imprecise: flushed
#: to 0 under 2^-126 (ftz), or its tf32x3 low part flushed; the epilogue's ρ counts it as lost
FP32_FLUSH = 2.0**-100
#: relative error of the fp32 exp of a logit difference (ex2.approx, the log2(e) product)
KERNEL_EXP_REL = 2.0**-20


def dot_gamma(head_dim: int, split3: bool = False) -> float:
    """γ with |fl(σ s ⟨q, c⟩) − σ s ⟨q, c⟩| ≤ γ σ ‖q‖ κ: D exact products summed in fp32, each
    add with relative error ≤ KERNEL_UNIT (truncation included), + the scale products and the
    subtraction of the running max (+32); ``split3``: the int4 tf32x3 dot (three partial products
    per term, each operand split into two tf32 parts: 3·2^-22 relative per product)."""
    if split3:
        return (3 * head_dim + 32) * KERNEL_UNIT + 2.0**-19
    return (head_dim + 32) * KERNEL_UNIT


def sketch_gamma(scheme: str, head_dim: int, bits: int) -> float:
    """γ with |fl(⟨q, r̃⟩) − ⟨q, r̃⟩| ≤ γ Σ|q_i||r̃_i| for the decode's key-sketch dot (``contract.sketch``);
    the write path adds γ‖r̃/a‖ to the witness (Σ|q_i||r̃_i| ≤ ‖a⊙q‖‖r̃/a‖).

    * β per token (int8, int8_dither): the decode dots the codes against q and scales by β after. On the GPU
      with a bf16 q the codes enter as bf16 16 + c (the magic-number conversion) and ⟨q, 2c + 1 − L⟩ =
      2·fl⟨q, 16 + c⟩ − (31 + L)·fl(Σq): the two fp32 dots err by ≤ γ_D Σ|q_i|(15 + L) and γ_D Σ|q_i|, the
      three combining roundings by ≤ 2^-23 (2(15 + L) + 2(31 + L)) Σ|q_i| (relative, fp32, magnitudes ≤
      (2(15 + L) + (31 + L)) Σ|q|): in all ≤ (61 + 3L)(γ_D + 2^-22) Σ|q_i|, and Σ|q_i| β/L ≤ Σ|q_i||r̃_i|
      (every level is an odd multiple of β/L). The interpreter's fp32 dot of the levels errs by less.
    * β per channel (fp8, int4_group, kivi2): β·level in fp32 operands (tf32x3): ``dot_gamma(D, split3=True)``."""
    per_token_beta = SCHEMES[scheme].residual_range == "half-scale" and SCHEMES[scheme].key_scales == "token"
    if per_token_beta:
        L = 1 << bits
        return (61 + 3 * L) * (dot_gamma(head_dim) + 2.0**-22)
    return dot_gamma(head_dim, split3=True)


#: relative error of the p̂ operand split of the histogram dot: tf32x3 (the dropped lo·lo product
#: and the tf32 rounding of the lo parts; also used for the interpreter's ieee dot) and bf16x2
#: (p̂ = p_hi + p_lo in bf16, each rounded to nearest: |p̂ − p_hi − p_lo| ≤ 2^-8 · 2^-8 p̂); "page":
#: page-level bins, masses summed in fp32 (≤ tile_tokens + 16 adds, already counted), no split
HIST_SPLIT_REL = {"tf32x3": 2.0**-19, "bf16x2": 2.0**-16, "page": 0.0}
#: the packed form's own roundings (``decode``'s PACK_HIST: hi and lo accumulated in separate columns,
#: after the loop the lo column rescaled to the hi column's maximum and added: two fp32 roundings)
HIST_PACK_REL = 2 * KERNEL_UNIT
#: growth of the accumulated terms over the mass: the fp32 sums' rounding bounds are relative to the
#: sum of the terms' magnitudes, and a split operand's parts are summed with their signs
#: (Σ|p_hi| + Σ|p_lo| ≤ (1 + 2^-8 + 2^-16) Σ p̂ for bf16 parts rounded to nearest, ≤ (1 + 2^-10 + …) Σ p̂
#: for tf32's; rounded up here to 2^-7 and 2^-9); page masses are sums of p̂ itself
HIST_TERM_GROWTH = {"tf32x3": 2.0**-9, "bf16x2": 2.0**-7, "page": 0.0}
#: products per token that one accumulator sums in the histogram dot: tf32x3 chains three dots (hi·hi,
#: hi·lo, lo·hi) into one accumulator, the two-dot bf16x2 form two (hi, then lo); the packed bf16x2 form
#: (``decode``'s PACK_HIST) one per column, page masses one
HIST_CHAINED_TERMS = {"tf32x3": 3, "bf16x2": 2, "page": 1}


def mass_eta_terms(tile_tokens: int, split: str = "tf32x3", packed: bool = False) -> tuple[float, float]:
    """(a, b) with ``mass_eta(tiles, tile_tokens, split) = a + tiles · b``: the fp32 accumulation of
    ``HIST_CHAINED_TERMS[split]`` (1 when ``packed``) products per token, grown by
    ``HIST_TERM_GROWTH[split]``, plus the operand split ``HIST_SPLIT_REL[split]`` (and, ``packed``,
    ``HIST_PACK_REL``)."""
    g = 1.0 + HIST_TERM_GROWTH[split]
    terms = 1 if packed else HIST_CHAINED_TERMS[split]
    a = g * ((terms * tile_tokens + 16) * KERNEL_UNIT + 2 * (KERNEL_EXP_REL + KERNEL_UNIT)) + HIST_SPLIT_REL[split]
    if packed:
        a += HIST_PACK_REL
    return a, g * (KERNEL_EXP_REL + KERNEL_UNIT)


def mass_eta(tiles, tile_tokens: int, split: str = "tf32x3", packed: bool = False):
    """Relative error of a p̂ mass accumulated by the decode kernel over ``tiles`` tiles of
    ``tile_tokens`` tokens: the histogram dot of one tile (≤ chained terms · tile_tokens + 16 fp32
    sums, ``HIST_CHAINED_TERMS``, and the operand split ``HIST_SPLIT_REL[split]``), the running
    rescale by α = exp(m − m') (``KERNEL_EXP_REL`` per tile) and the fp32 add per tile, every
    accumulation term grown by ``HIST_TERM_GROWTH[split]``."""
    a, b = mass_eta_terms(tile_tokens, split, packed)
    return a + tiles * b


def store_terms(stored: str, computed: str, head_dim: int) -> tuple[float, float, float]:
    """(rel, abs_norm, max) of an attention output computed in the float ``computed`` and served in ``stored`` (dtype
    names, e.g. "float32", "bfloat16"; ``contract.constants.store_rounding``): ‖fl(o) − o‖₂ ≤ rel·‖o‖₂ + abs_norm with
    abs_norm = abs·√D rounded up, and an |o_i| above ``max`` may store as ±inf. (0, 0, 0) where the store is exact."""
    rel, ab, mx = store_rounding(stored, computed)
    return rel, math.nextafter(ab * math.sqrt(head_dim), math.inf) if ab else 0.0, mx
