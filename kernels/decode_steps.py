"""The decode kernel's inlined pieces (``@triton.jit`` helpers of ``kernels.decode_kernel._decode_kernel``):
the key sketch's bf16 split, the key-side level of a radius, the L2 prefetch, the code / scale / witness
offsets of a tile, and the online-softmax step. Triton inlines them into the kernel."""

from __future__ import annotations

import triton
import triton.language as tl

#: a tile carrying at most this share of its split's p̂ mass so far, for every head, skips the key sketch's dot: its
#: tokens take the sketch radius's bound u_j ≤ ‖r̃_j/a‖ ≤ (s_j/2)(L − 1)/L·‖1/a‖ instead (sound: any u_j ≥ the
#: shared ratio is; int8 family). Skipped tiles hold at most tiles·2^-17 of a split's mass (0.8 % at 1024 tiles),
#: so the looser radius costs little tightness; on attention that spreads over the whole context no tile is cold
SKETCH_COLD_MASS = tl.constexpr(2.0**-17)
#: sketch widths whose codes the int8 family's tile turns into bf16 by the magic number (``_sketch_bf16``)
MAGIC_SKETCH_BITS = (2, 4)


@triton.jit
def _sketch_bf16(x, SH: tl.constexpr, SKB: tl.constexpr):
    """bf16 16 + code of a sketch chunk (GPU only, inline PTX), two tokens' 16-bit lanes per instruction pair:
    ``x`` holds a packed byte per int16 lane; the code of chunk k is (byte >> SKB·k) & (L − 1) and its bf16
    16 + code has the code in mantissa bits 3…6 (exact for L ≤ 16), i.e. ((byte shifted by SH) & ((L − 1) << 3))
    | bf16(16) per lane (SH = 3 − SKB·k: left for SH > 0, right for SH < 0). The shift of the packed pair
    crosses lanes only into bits the mask clears. Two- and four-bit sketches only (``MAGIC_SKETCH_BITS``): a one-bit
    sketch took the four-bit masks on the GPU (run A6, 2026-12-06: SmolLM2's median TV⁺ 0.130 against 0.016 at two
    bits), and now takes the fp32 dot of its levels (bf16 q and the odd levels are exact in tf32; run B2: 0.0265)."""
    tl.static_assert(SKB == 2 or SKB == 4, "the bf16 magic-number sketch codes: 2 or 4 bits")
    if SKB == 2:
        if SH == 3:
            return tl.inline_asm_elementwise("{.reg .b32 t; shl.b32 t, $1, 3; and.b32 t, t, 0x00180018; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
        elif SH == 1:
            return tl.inline_asm_elementwise("{.reg .b32 t; shl.b32 t, $1, 1; and.b32 t, t, 0x00180018; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
        elif SH == -1:
            return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 1; and.b32 t, t, 0x00180018; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 3; and.b32 t, t, 0x00180018; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:  # four bits: chunks 0 (SH 3) and 1 (SH −1)
        if SH == 3:
            return tl.inline_asm_elementwise("{.reg .b32 t; shl.b32 t, $1, 3; and.b32 t, t, 0x00780078; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 1; and.b32 t, t, 0x00780078; or.b32 $0, t, 0x41804180;}",
                                             "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _key_level(x, X0: tl.constexpr, K: tl.constexpr):
    """Key-side level of a non-negative value: 0 for x = 0, else the smallest m in 1..K with
    x ≤ X0·2^((m−1)/2), or K+1 (overflow). Biased up by 2^-10 in the log domain so fp32
    log2 rounding never assigns a level below the value (sound)."""
    m = 1.0 + tl.ceil(2.0 * tl.log2(tl.maximum(x, 1e-37) / X0) + 0.0009765625)
    m = tl.minimum(tl.maximum(m, 1.0), K + 1.0)
    return tl.where(x > 0, m, 0.0).to(tl.int32)


@triton.jit
def _prefetch_l2(ptr, mask):
    """prefetch.global.L2 of each address where ``mask`` (GPU only: inline PTX; no value is read or changed)."""
    tl.inline_asm_elementwise(
        asm="""
        {
        .reg .pred p;
        setp.ne.b32 p, $2, 0;
        @p prefetch.global.L2 [$1];
        mov.u32 $0, 0;
        }""", constraints="=r,l,r", args=[ptr, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _code_offsets(blk, kvh, off, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb, s_vsh, s_vst):
    """Element offsets of token ``off`` of block ``blk`` (kv head ``kvh``) in the paged code rows (K and V share
    them), key scales (kivi2: s_st = 0, + the channel) and value scales. The loop's loads and the next tile's L2
    prefetch both take them (and ``_witness_offsets``) from here, so the two cannot drift apart."""
    return blk * s_cb + kvh * s_ch + off * s_ct, blk * s_sb + kvh * s_sh + off * s_st, blk * s_vsb + kvh * s_vsh + off * s_vst


@triton.jit
def _witness_offsets(blk, kvh, off, s_wb, s_wh, s_wt, s_vwb, s_vwh, PER_TOKEN: tl.constexpr):
    """Element offsets of the key witnesses and of the value-side arrays (φ, ν, κ share them) of token ``off`` of
    block ``blk`` (kv head ``kvh``); one per block without PER_TOKEN."""
    wbase = blk * s_wb + kvh * s_wh
    vwoff = blk * s_vwb + kvh * s_vwh
    if PER_TOKEN:
        wbase += off * s_wt
        vwoff += off
    return wbase, vwoff


@triton.jit
def _norm_offsets(blk, kvh, off, s_nb, s_nh, NORMS_PT: tl.constexpr):
    """Element offsets of ν and κ (``v_norm``, ``k_norm``) of token ``off`` of block ``blk``: per token, or the
    page's running max (NORMS_PT False: ``PagedKV.block_norms``, or per-block witnesses)."""
    noff = blk * s_nb + kvh * s_nh
    if NORMS_PT:
        noff += off
    return noff


@triton.jit
def _softmax_step(m, l, sT):
    """One tile of the online softmax: the running max m' = max(m, max sT), the rescale α = e^(m − m'),
    p̂ = e^(sT − m') and the running sum l·α + Σ p̂ (per head column). A split whose tiles so far were all
    masked (left padding ≥ a tile) has m' = −∞: its reference is then 0 (α = 0, p̂ = 0), not −∞ − −∞ = NaN."""
    m_new = tl.maximum(m, tl.max(sT, axis=0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    pT = tl.exp(sT - m_ref[None, :])
    return m_new, alpha, pT, l * alpha + tl.sum(pT, axis=0)
