"""Decode path with the meter (SPEC §2, §3, §5, §8): one pass over the paged KV.

    out = decode(cache, q, block_table, seq_lens, sm_scale, meter=True, num_splits=None,
                 delta_step=None, tilt_above=-1.0)
        q            [B, Hq, D]       (Hq = GQ · Hkv, GQ in 1…8)
        block_table  [B, max_pages]   int32
        seq_lens     [B]              int32, ≥ 1
        → out.o [B, Hq, D] float32, out.lse [B, Hq], out.meter (MeterRecord) or None

Grid: (B, Hkv, num_splits). A program serves the GQ query heads of one kv head (padded to
BLOCK_H columns for the tensor-core dots: ``Tile.head_columns``, 8 or 16) over its share of the sequence's pages, a tile of
PAGES pages at a time, every tile transposed (tokens × heads: the K̂, V̂ᵀ and one-hot tiles are
the dots' A operands, read from registers on Hopper): it dequantizes (regenerating the dither for ``int8_dither``), runs the
online softmax and the output accumulation, and, when METER, in the same pass:

* key-side levels: the Tier A radius ε_j(h) = σ Σ_g ‖q_h[g]‖ W[j, g] ≤ σ ‖q_h‖ ‖W_j‖₂ (Cauchy–
  Schwarz over the groups; equal for G = 1) factors into a head part and a token part, and so
  does the Tier B radius t_j(h) = c_h · s_j. Tokens are binned once per kv head by ‖W_j‖₂ and
  by s_j on a fixed geometric grid (ratio √2, rounded **up**), so all GQ query heads share the
  bins, and one tensor-core dot ``onehotᵀ @ p̂ᵀ`` per tile accumulates both p̂-mass histograms
  and, in its last row, Σ p̂ φ. The dot takes p̂ in fp32's range (on the GPU as bf16 hi + lo
  parts, packed into one dot where GQ ≤ BLOCK_H / 2 — PACK_HIST: the upper columns repeat the
  heads and carry the lo parts —, or tf32x3; ieee in the interpreter): so a p̂ that fp16 would flush (a logit gap ≥ ~28 below the
  running maximum) keeps its mass; only masses below 2^-126 of the running maximum can be
  lost, and those are counted into the ρ term of the epilogue;
* max ‖W_j‖, max s_j, max φ, max ν, max κ (≥ ‖k̂_j‖), and a count of non-finite radii / logits.

Floating point (SPEC §7): the histogram is of the distribution p̃ the kernel actually computed;
its log-ratio to p̂ = softmax(σ⟨q, k̂⟩) (exact) is at most Ξ = σ‖q_h‖·max κ·γ (the fp32 logit:
``paged.dot_gamma``) + the fp32 exp + 2.1·η (the mass accumulation: ``paged.mass_eta``); the
epilogue meters p̃ with every level raised by Ξ and adds tanh(Ξ/2) (TV(p̃, p̂)) and ρ (lost
masses), so TV⁺ bounds both TV(p, p̂) and TV(p, p̃).

On the GPU the K̂ tiles are dotted on tensor cores in q's dtype (bf16 or fp16; a float32 q must be
exactly bf16): int8 and fp8 codes are exact in both, the per-token key scales are folded into the
logits, and the int8_dither term q·u uses u split into hi + lo parts. The PV dot takes p̂·s_v
rounded to **bf16 whatever q's dtype** (relative 2^-8, bf16's unit roundoff, down to fp32's 2^-126: ``out_rel0``; fp16
would flush p̂·s_v below 2^-25, a logit gap of ~11 under s_v = 2^-10, which no relative bound
covers) with the 8-bit value codes (exact in bf16); exact fp16 values (scheme none or a repaired
pool under an fp16 query), which bf16 would round, take fp32 operands and tf32x3 (PV_F32).
``int4_group`` and ``kivi2`` tiles are unpacked and dequantized (z + s·c) in fp32 and dotted with
tf32x3 (kivi2: one 2-bit code per byte; the key scale / zero per channel of the page, the value
ones per 32 channels of the token).
In the interpreter everything stays in fp32.

Repaired pages (``repair=``, ``paged.RepairOverlay``; constexpr HAS_REP, off when no page is
repaired: the same code as without): per token lane the page's pool slot is loaded, and a
repaired token's exact K/V replace the dequantized codes before the dots (scale 1, no dither,
the int4 tiles too), with key radius 0, φ = 0, Tier B scale 0 and ν / κ ≥ its exact norms from
the pool. Its fp32 logit error is covered by the same σ‖q‖κγ (κ ≥ ‖k_j‖; on the GPU the pool is
in q's dtype, so the operand is exact).

Split partials are merged with the log-sum-exp rule (histograms and Σ p̂ φ rescaled like the
denominators) and ``kernels.epilogue`` turns the histograms into TV⁺ and the output bound.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from contract.schemes import SCHEMES

from .epilogue import MergeConstants, MeterRecord, merge, merge_torch, tier_b_coefficients  # noqa: F401 (re-export)
from .ids import INT4_GROUP_ID, INT8_DITHER_ID, INT8_ID, KIVI2_ID, NONE_ID
from .paged import (
    KERNEL_REL_SLACK,
    SCHEME_IDS,
    ExactWindow,
    PagedKV,
    RepairOverlay,
    dequantized_fp32,
    dot_gamma,
    mass_eta_terms,
    page_scaled_keys,
)
from .write import INTERPRET, dither_from_hash, sketch_beta, sketch_value, token_hash

#: a tile carrying at most this share of its split's p̂ mass so far, for every head, skips the key sketch's dot: its
#: tokens take the sketch radius's bound u_j ≤ ‖r̃_j/a‖ ≤ (s_j/2)(L − 1)/L·‖1/a‖ instead (sound: any u_j ≥ the
#: shared ratio is; int8 family). Skipped tiles hold at most tiles·2^-17 of a split's mass (0.8 % at 1024 tiles),
#: so the looser radius costs little tightness; on attention that spreads over the whole context no tile is cold
SKETCH_COLD_MASS = tl.constexpr(2.0**-17)


@triton.jit
def _sketch_bf16(x, SH: tl.constexpr, SKB: tl.constexpr):
    """bf16 16 + code of a sketch chunk (GPU only, inline PTX), two tokens' 16-bit lanes per instruction pair:
    ``x`` holds a packed byte per int16 lane; the code of chunk k is (byte >> SKB·k) & (L − 1) and its bf16
    16 + code has the code in mantissa bits 3…6 (exact for L ≤ 16), i.e. ((byte shifted by SH) & ((L − 1) << 3))
    | bf16(16) per lane (SH = 3 − SKB·k: left for SH > 0, right for SH < 0). The shift of the packed pair
    crosses lanes only into bits the mask clears."""
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
def _softmax_step(m, l, sT):
    """One tile of the online softmax: the running max m' = max(m, max sT), the rescale α = e^(m − m'),
    p̂ = e^(sT − m') and the running sum l·α + Σ p̂ (per head column). A split whose tiles so far were all
    masked (left padding ≥ a tile) has m' = −∞: its reference is then 0 (α = 0, p̂ = 0), not −∞ − −∞ = NaN."""
    m_new = tl.maximum(m, tl.max(sT, axis=0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    pT = tl.exp(sT - m_ref[None, :])
    return m_new, alpha, pT, l * alpha + tl.sum(pT, axis=0)


@triton.jit
def _decode_kernel(
    Q, KC, VC, KS, VS, KZ, VZ, KW, VW, VN, KN, BT, SL, TM,
    RS, RK, RV, RKN, RVN,
    SK, WGT, WK, WV, WKN, WVN,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT, STAT_OUT,
    seed, layer, sm_scale, num_splits, sink, recent,
    s_qb, s_qh,
    s_cb, s_ch, s_ct,
    s_sb, s_sh, s_st,
    s_vsb, s_vsh, s_vst,
    s_wb, s_wh, s_wt,
    s_vwb, s_vwh,
    s_btb, s_tmb, s_rsb,
    s_skb, s_skh, s_skt, s_wnb, s_wnh,
    Hq,
    INFL: tl.constexpr, X0: tl.constexpr,
    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, T: tl.constexpr, G: tl.constexpr,
    PAGES: tl.constexpr, K: tl.constexpr, NB: tl.constexpr,
    SCHEME: tl.constexpr, METER: tl.constexpr, TIER_B: tl.constexpr, PER_TOKEN: tl.constexpr, LOWP: tl.constexpr,
    PREC32: tl.constexpr, PREC_HIST: tl.constexpr, HIST_BF16: tl.constexpr, ABLATE: tl.constexpr, PAGE_LEVELS: tl.constexpr,
    HAS_MASK: tl.constexpr, PREFETCH_BT: tl.constexpr, CSR: tl.constexpr, HAS_REP: tl.constexpr,
    PACK_HIST: tl.constexpr, PV_F32: tl.constexpr, PF_AHEAD: tl.constexpr,
    SKB: tl.constexpr, WEIGHTED: tl.constexpr, HAS_WIN: tl.constexpr, MAGIC_BF16: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    if CSR:  # SL is kv_indptr [B + 1], T = 1: sequence b's token slots are BT[SL[b] : SL[b + 1]]
        row0 = tl.load(SL + b)
        seq_len = tl.load(SL + b + 1) - row0
        BT += row0.to(tl.int64)
    else:
        BT += b * s_btb
        seq_len = tl.load(SL + b)
    n_pages = tl.cdiv(seq_len, T)
    if HAS_WIN:
        # the exact window's ring pass counts as RP virtual pages after the sequence's last, so the splits share it
        # out like any pages (the split owning virtual page n_pages runs it); the paged loop skips the pages that lie
        # wholly inside the window (the sinks' full pages, the recent window's)
        RP = tl.cdiv(sink + recent, PAGES * T) * PAGES
        per_split = tl.cdiv(n_pages + RP, num_splits)
        p_start = sp * per_split
        p_virt = p_start + per_split
        ring_here = (p_start <= n_pages) & (n_pages < p_virt)
        p_end = tl.minimum(p_virt, tl.cdiv(tl.maximum(seq_len - recent, 0), T))
        p_start = tl.maximum(p_start, sink // T)
    else:
        per_split = tl.cdiv(n_pages, num_splits)
        p_start = sp * per_split
        p_end = tl.minimum(p_start + per_split, n_pages)

    # every tile is transposed ("swap AB"): tokens are the MMA's M dimension and the GQ query
    # heads its N, so the large operands (the converted K̂ / V̂ᵀ tiles, the one-hot) are A operands,
    # which Hopper's wgmma reads from registers; only qᵀ (once) and p̂ᵀ (small) pass through
    # shared memory. Measured on the H200: the metered kernel 18-21 % faster (bench/RESULTS.md).
    heads_i = tl.arange(0, BLOCK_H)
    hmask = heads_i < GQ
    heads = kvh * GQ + heads_i
    HALF: tl.constexpr = BLOCK_H // 2
    if PACK_HIST:
        # GQ ≤ BLOCK_H / 2: column c serves head c mod HALF, so the upper half of the (padding) columns
        # repeats the lower half's logits and softmax; the histogram dot then takes p̂'s bf16 hi part in
        # the lower columns and its lo part in the upper ones: one dot instead of two (summed after the loop)
        hcol = heads_i % HALF
    else:
        hcol = heads_i
    d = tl.arange(0, D)
    qT = tl.load(Q + b * s_qb + (kvh * GQ + hcol)[None, :] * s_qh + d[:, None], mask=(hcol < GQ)[None, :],
                 other=0.0)  # [D, H]
    q32T = qT.to(tl.float32)
    if not LOWP:  # on the GPU q keeps its bf16/fp16 dtype (the wrapper guarantees one)
        qT = q32T

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    accT = tl.zeros([D, BLOCK_H], tl.float32)
    SKETCH: tl.constexpr = METER and (SKB > 0 or WEIGHTED)
    if SKETCH:
        # the sketch radius's head factor c_h = |σ|·‖a⊙q_h‖ (contract.sketch), scaled by its largest entry
        # (no square underflows); the epilogue's factor, in fp64 and rounded up, is at least this one
        if WEIGHTED:
            qa = q32T * tl.load(WGT + kvh * D + d)[:, None]
        else:
            qa = q32T
        qam = tl.max(tl.abs(qa), axis=0)
        qsc = qa / tl.where(qam > 0, qam, 1.0)[None, :]
        c_h = tl.sqrt(tl.sum(qsc * qsc, axis=0)) * qam * tl.abs(sm_scale)  # [H]
        q_sum = tl.sum(q32T, axis=0)  # Σ_i q_hi (the magic-number sketch dot's offset)
        # 1 / c_h for the ratio |d_hj| / c_h: 0 on padding columns; +inf where c_h underflowed to 0 (a nonzero d then
        # gives an infinite radius: saturated, flagged; d = 0 there gives NaN, also flagged)
        inv_c = tl.where(hmask & (c_h > 0), 1.0 / c_h, tl.where(hmask & (qam > 0), float("inf"), 0.0))
        if SKB > 0 and (SCHEME == INT8_ID or SCHEME == INT8_DITHER_ID):
            # the sketch's chunks of q (chunk k: channels k·D/c …, contract.sketch), loaded once: two-bit codes
            CPB0: tl.constexpr = 8 // SKB
            DB0: tl.constexpr = D // CPB0
            qrow = Q + b * s_qb + (kvh * GQ + hcol)[None, :] * s_qh + tl.arange(0, DB0)[:, None]
            qmask = (hcol < GQ)[None, :]
            qk0 = tl.load(qrow, mask=qmask, other=0.0)
            qk1 = tl.load(qrow + DB0, mask=qmask, other=0.0)
            if CPB0 >= 4:
                qk2 = tl.load(qrow + 2 * DB0, mask=qmask, other=0.0)
                qk3 = tl.load(qrow + 3 * DB0, mask=qmask, other=0.0)
            # a cold tile's tokens (SKETCH_COLD_MASS) take u_j ≤ ‖r̃_j/a‖ ≤ (s_j/2)(L − 1)/L·‖1/a‖ instead of the
            # sketch dot: the per-kv-head constant ‖1/a‖
            if WEIGHTED:
                ainv = 1.0 / tl.load(WGT + kvh * D + d)
                inv_a_norm = tl.sqrt(tl.sum(ainv * ainv, axis=0))
            else:
                inv_a_norm = tl.sqrt(D * 1.0)
    KA: tl.constexpr = K + 2  # bins per tier: 0 (zero radius), 1..K, K+1 (overflow)
    col = tl.arange(0, NB)
    histT = tl.zeros([NB, BLOCK_H], tl.float32)
    if ABLATE // 8 % 2 == 1:  # (diagnosis) the lite meter: no histogram, Σ p̂ φ per token lane
        pphiT = tl.zeros([PAGES * T, BLOCK_H], tl.float32)
    BLOCK_N: tl.constexpr = PAGES * T
    # running maxima / counts per token lane, reduced once after the loop (not per tile)
    wmax = tl.zeros([BLOCK_N], tl.float32)
    smax = tl.zeros([BLOCK_N], tl.float32)
    phimax = tl.zeros([BLOCK_N], tl.float32)
    numax = tl.zeros([BLOCK_N], tl.float32)
    kapmax = tl.zeros([BLOCK_N], tl.float32)
    bad = tl.zeros([BLOCK_N], tl.float32)

    D2: tl.constexpr = D // 2
    D4: tl.constexpr = D // 4
    n_idx = tl.arange(0, BLOCK_N)
    pg_in = n_idx // T
    off = n_idx % T
    # the block-table entries of the next tile are loaded one iteration ahead (PREFETCH_BT), so a
    # tile's code loads do not wait behind its own table load
    if PREFETCH_BT or PF_AHEAD:
        bt_next = tl.load(BT + p_start + pg_in, mask=p_start + pg_in < p_end, other=0)
    if PF_AHEAD:  # the tile after: its block ids arrive during the first tile
        bt_after = tl.load(BT + p_start + PAGES + pg_in, mask=p_start + PAGES + pg_in < p_end, other=0)
    for p0 in range(p_start, p_end, PAGES):
        page = p0 + pg_in
        tok = page * T + off
        pvalid = page < p_end
        valid = pvalid & (tok < seq_len)
        if HAS_MASK:  # token mask (padding): a masked token is not attended and not metered
            valid = valid & (tl.load(TM + b * s_tmb + tok, mask=valid, other=0) != 0)
        if PF_AHEAD:
            # the next tile's code rows (one 128-byte line per token for d 128) and its per-token scales and
            # witnesses are prefetched into the L2 while this tile computes: its loads then wait on the L2, not
            # on DRAM (ncu, run Q: 48 % of the metered one-warp kernel's stall samples were long-scoreboard waits
            # on its code and scale loads). The block ids run two tiles ahead. A prefetch changes no value
            blk = bt_next.to(tl.int64)
            pn = page + PAGES
            nblk = bt_after.to(tl.int64)
            bt_next = bt_after
            bt_after = tl.load(BT + pn + PAGES, mask=pn + PAGES < p_end, other=0)
            nc, ns, nvs = _code_offsets(nblk, kvh, off, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb, s_vsh, s_vst)
            nok = pn < p_end
            _prefetch_l2(KC + nc, nok)
            _prefetch_l2(VC + nc, nok)
            # a page's scales and witnesses share one line: its first token's lane prefetches it
            _prefetch_l2(KS + ns, nok & (off == 0))
            _prefetch_l2(VS + nvs, nok & (off == 0))
            if METER:
                nw, nvw = _witness_offsets(nblk, kvh, off, s_wb, s_wh, s_wt, s_vwb, s_vwh, PER_TOKEN)
                _prefetch_l2(KW + nw, nok & (off == 0))
                _prefetch_l2(VW + nvw, nok & (off == 0))
                _prefetch_l2(VN + nvw, nok & (off == 0))
                _prefetch_l2(KN + nvw, nok & (off == 0))
        elif PREFETCH_BT:
            blk = bt_next.to(tl.int64)
            pn = page + PAGES
            bt_next = tl.load(BT + pn, mask=pn < p_end, other=0)
        else:
            blk = tl.load(BT + page, mask=pvalid, other=0).to(tl.int64)
        cbase, sbase, vsbase = _code_offsets(blk, kvh, off, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb, s_vsh, s_vst)
        if HAS_REP:  # repaired pages (overlay): exact K/V from the pool slot RS[blk, kvh] (-1: none)
            rslot = tl.load(RS + blk * s_rsb + kvh, mask=valid, other=-1)
            rep = valid & (rslot >= 0)
            rbase = tl.where(rep, rslot, 0).to(tl.int64) * (T * D) + off * D  # pool [R, T, D]
            rnbase = tl.where(rep, rslot, 0).to(tl.int64) * T + off  # norms [R, T]
        if HAS_WIN:  # the exact window's tokens (the first `sink`, the last `recent`) are served by the ring pass below
            valid = valid & ~((tok < sink) | (tok >= seq_len - recent))
        if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:  # z + s·c in fp32
            vgidx = vsbase[:, None] + (d // 32)[None, :]  # the value scale / zero of a 32-channel group
            if SCHEME == INT4_GROUP_ID:  # unpack nibbles (channel i low, i + D/2 high)
                d2 = tl.arange(0, D2)
                kb = tl.load(KC + cbase[:, None] + d2[None, :], mask=valid[:, None], other=0)
                kcode = tl.reshape(tl.permute(tl.join((kb & 15).to(tl.float32), (kb >> 4).to(tl.float32)), (0, 2, 1)),
                                   [BLOCK_N, D])
                vb = tl.load(VC + cbase[:, None] + d2[None, :], mask=valid[:, None], other=0)
                vcode = tl.reshape(tl.permute(tl.join((vb & 15).to(tl.float32), (vb >> 4).to(tl.float32)), (0, 2, 1)),
                                   [BLOCK_N, D])
                kgidx = sbase[:, None] + (d // 32)[None, :]
            else:  # kivi2: four codes per byte (channels i, i + D/4, i + D/2, i + 3D/4); key scale / zero per channel
                # channel d is in byte d % (D/4) at bit 2·(d // (D/4)): each byte is loaded for its four
                # channels (L1 hits) and shifted in place. (Unpacking [N, D/4] bytes with join / permute /
                # reshape needed layout conversions through shared memory: 237 KB at 128-token tiles on
                # sm_90, over the H200's 227 KB, 2026-12-02.)
                byte = (d % D4)[None, :]
                shift = (2 * (d // D4))[None, :]
                kcode = ((tl.load(KC + cbase[:, None] + byte, mask=valid[:, None], other=0).to(tl.int32) >> shift) & 3
                         ).to(tl.float32)
                vcode = ((tl.load(VC + cbase[:, None] + byte, mask=valid[:, None], other=0).to(tl.int32) >> shift) & 3
                         ).to(tl.float32)
                kgidx = sbase[:, None] + d[None, :]
            ksc = tl.load(KS + kgidx, mask=valid[:, None], other=0.0).to(tl.float32)  # (the sketch's β = ksc / 2)
            kh = tl.load(KZ + kgidx, mask=valid[:, None], other=0.0).to(tl.float32) + ksc * kcode
            vh = tl.load(VZ + vgidx, mask=valid[:, None], other=0.0).to(tl.float32) + \
                tl.load(VS + vgidx, mask=valid[:, None], other=0.0).to(tl.float32) * vcode
            if HAS_REP:  # a repaired token: its exact K/V (model dtype, exact in fp32) instead of z + s·c
                kh = tl.where(rep[:, None], tl.load(RK + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)
                              .to(tl.float32), kh)
                vh = tl.where(rep[:, None], tl.load(RV + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)
                              .to(tl.float32), vh)
            ks = tl.full([BLOCK_N], 1.0, tl.float32)
            sT = tl.dot(kh, q32T, input_precision=PREC32) * sm_scale  # [N, H]
            sT = tl.where(valid[:, None], sT, float("-inf"))
            m_new, alpha, pT, l = _softmax_step(m, l, sT)
            accT = accT * alpha[None, :] + tl.dot(tl.trans(vh), pT, input_precision=PREC32)
        else:
            if SCHEME == NONE_ID:
                kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0)  # [N, D]
                vcT = tl.load(VC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0.0)  # [D, N]
            else:
                # 8-bit codes are loaded in the other orientation and transposed before their cast: Triton
                # then moves them into the dots' register layout with 16-byte shared-memory stores / loads
                # instead of one to two bytes per load after the cast (sm_90 SASS, bench/RESULTS.md run J)
                kc = tl.trans(tl.load(KC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0.0))  # [N, D]
                vcT = tl.trans(tl.load(VC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0))  # [D, N]
            if SCHEME == NONE_ID:
                ks = tl.full([BLOCK_N], 1.0, tl.float32)
                vs = tl.full([BLOCK_N], 1.0, tl.float32)
            else:
                ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
                vs = tl.load(VS + vsbase, mask=valid, other=0.0).to(tl.float32)
            if LOWP:  # K̂ dot in q's dtype (int8 / fp8 codes are exact in bf16 and fp16); PV dot in bf16 or fp32
                kc = kc.to(Q.dtype.element_ty)
                vcT = vcT.to(tl.float32 if PV_F32 else tl.bfloat16)
            else:
                kc = kc.to(tl.float32)
                vcT = vcT.to(tl.float32)
            if HAS_REP:
                # a repaired token: its exact K/V (the wrapper checks the pool dtype is q's on the GPU,
                # so the conversion is exact) with scale 1 and no dither
                rk = tl.load(RK + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)  # [N, D]
                rvT = tl.load(RV + rbase[None, :] + d[:, None], mask=rep[None, :], other=0.0)  # [D, N]
                if LOWP:
                    rk = rk.to(Q.dtype.element_ty)
                    rvT = rvT.to(tl.float32 if PV_F32 else tl.bfloat16)
                else:
                    rk = rk.to(tl.float32)
                    rvT = rvT.to(tl.float32)
                kc = tl.where(rep[:, None], rk, kc)
                vcT = tl.where(rep[None, :], rvT, vcT)
                ks = tl.where(rep, 1.0, ks)
                vs = tl.where(rep, 1.0, vs)
            if SKETCH and SCHEME != NONE_ID:
                kcode8 = kc  # the codes (in q's dtype on the GPU: fp8 codes are exact in bf16 / fp16) for the sketch's β
            qkT = tl.dot(kc, qT)  # [N, H]
            if SCHEME == INT8_DITHER_ID:  # k̂ = s (c − u): subtract u·q, u split into bf16 hi + lo parts
                uk = dither_from_hash(token_hash(seed, layer, kvh, tok, 0)[:, None], d[None, :])  # [N, D]
                if HAS_REP:
                    uk = tl.where(rep[:, None], 0.0, uk)
                if LOWP:
                    uk_hi = uk.to(Q.dtype.element_ty)
                    uk_lo = (uk - uk_hi.to(tl.float32)).to(Q.dtype.element_ty)
                    qkT -= tl.dot(uk_hi, qT) + tl.dot(uk_lo, qT)
                else:
                    qkT -= tl.dot(uk, qT)
            sT = qkT * (ks * sm_scale)[:, None]
            sT = tl.where(valid[:, None], sT, float("-inf"))
            m_new, alpha, pT, l = _softmax_step(m, l, sT)
            pvT = pT * vs[:, None]
            # the PV dot: p̂·s_v rounded to bf16 (relative 2^-8 down to fp32's 2^-126: out_rel0), whatever q's
            # dtype; fp16 would flush p̂·s_v below 2^-25 (a logit gap of ~11 under s_v = 2^-10), which no
            # relative bound covers. Exact fp16 values (scheme none, a repaired pool) are not bf16: fp32 (PV_F32)
            if LOWP and not PV_F32:
                pvT = pvT.to(tl.bfloat16)
            if PV_F32:
                pvvT = tl.dot(vcT, pvT, input_precision=PREC32)  # [D, H]
            else:
                pvvT = tl.dot(vcT, pvT)  # [D, H]
            if SCHEME == INT8_DITHER_ID:
                uvT = dither_from_hash(token_hash(seed, layer, kvh, tok, 1)[None, :], d[:, None])  # [D, N]
                if HAS_REP:
                    uvT = tl.where(rep[None, :], 0.0, uvT)
                if LOWP and not PV_F32:
                    uv_hiT = uvT.to(tl.bfloat16)
                    uv_loT = (uvT - uv_hiT.to(tl.float32)).to(tl.bfloat16)
                    pvvT -= tl.dot(uv_hiT, pvT) + tl.dot(uv_loT, pvT)
                else:
                    pvvT -= tl.dot(uvT, pvT, input_precision=PREC32)
            accT = accT * alpha[None, :] + pvvT
        # the Tier B scale of a token (its level, and max s): 0 for a repaired token (radius 0)
        ks_lvl = ks
        if HAS_REP:
            ks_lvl = tl.where(rep, 0.0, ks_lvl)
        if METER:
            # key side: ‖W_j‖₂ over the groups, shared by the GQ query heads of this kv head
            wbase, vwoff = _witness_offsets(blk, kvh, off, s_wb, s_wh, s_wt, s_vwb, s_vwh, PER_TOKEN)
            # ‖W_j‖₂ scaled by the largest group witness: squares of tiny fp32 (per-block)
            # witnesses would underflow to a zero radius; ≥ that largest witness, never 0
            if SKETCH:
                # the sketch radius (contract.sketch): U_j = W_j + max_h |σ⟨q_h, r̃_j⟩| / c_h, the token part of
                # ε_hj = c_h·U_j; r̃_j = β·(2·code + 1 − L)/L from the packed codes and the scheme's β
                wn = tl.load(KW + wbase, mask=valid, other=0.0).to(tl.float32)
                if SKB > 0:
                    LV: tl.constexpr = 1 << SKB
                    CPB: tl.constexpr = 8 // SKB
                    DB: tl.constexpr = D // CPB
                    skoff = blk * s_skb + kvh * s_skh + off * s_skt
                    dbi = tl.arange(0, DB)
                    # the packed bytes once [N, D/c]; chunk k (bits k·b…) holds channels k·D/c … (contract.sketch)
                    byt = tl.load(SK + skoff[:, None] + dbi[None, :], mask=valid[:, None], other=0)
                    if SCHEME == INT8_ID or SCHEME == INT8_DITHER_ID:
                        # β = s/2 per token: the levels dotted against q, then scaled. On the GPU with a bf16 q the codes
                        # become bf16 16 + c by the magic number (one shift, one mask-or: 16 + c is exact for c < 16) and
                        # ⟨q, 2c + 1 − L⟩ = 2⟨q, 16 + c⟩ − (31 + L)·Σq (paged.sketch_gamma covers the fp32 error)
                        # a cold tile (every head's mass in it ≤ SKETCH_COLD_MASS of the split's so far) skips the dot
                        hot = tl.max(tl.where(hmask, tl.sum(pT, axis=0) - SKETCH_COLD_MASS * l, float("-inf")), axis=0) > 0
                        if hot:
                            if MAGIC_BF16:
                                byt16 = byt.to(tl.int16)
                            dT = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
                            for kq in tl.static_range(CPB):
                                if kq == 0:
                                    qk = qk0
                                elif kq == 1:
                                    qk = qk1
                                elif kq == 2 and CPB >= 4:
                                    qk = qk2
                                elif kq == 3 and CPB >= 4:
                                    qk = qk3
                                else:  # (one-bit sketch: chunks 4…7 reloaded per tile)
                                    qk = tl.load(Q + b * s_qb + (kvh * GQ + hcol)[None, :] * s_qh + (kq * DB + dbi)[:, None],
                                                 mask=(hcol < GQ)[None, :], other=0.0)  # [D/c, H]
                                if MAGIC_BF16:
                                    dT += tl.dot(_sketch_bf16(byt16, 3 - SKB * kq, SKB), qk)
                                else:
                                    code = (byt.to(tl.int32) >> (SKB * kq)) & (LV - 1)
                                    dT += tl.dot(sketch_value(code.to(tl.float32), LV), qk.to(tl.float32))
                            if MAGIC_BF16:
                                dT = 2.0 * dT - ((31.0 + LV) * q_sum)[None, :]
                            dT = dT * (ks * (0.5 / LV))[:, None]
                            dT = tl.abs(dT) * tl.abs(sm_scale)
                            ratio = dT * inv_c[None, :]  # (INFL covers the reciprocal's rounding)
                            u_tok = tl.max(tl.where(ratio == ratio, ratio, float("inf")), axis=1)  # 0·inf: saturate
                        else:
                            u_tok = ks * ((0.5 * (LV - 1) / LV) * inv_a_norm)
                    else:
                        shift = (SKB * (d // DB))[None, :]
                        skc = ((tl.load(SK + skoff[:, None] + (d % DB)[None, :], mask=valid[:, None], other=0).to(tl.int32)
                                >> shift) & (LV - 1)).to(tl.float32)
                        lev = sketch_value(skc, LV)  # [N, D] odd integers
                        if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:
                            beta = sketch_beta(kh, kh, ksc, SCHEME)
                        else:  # fp8: half a spacing of x̂ = s·code (the write path's β, bit for bit)
                            xh8 = ks[:, None] * kcode8.to(tl.float32)
                            beta = sketch_beta(xh8, ks[:, None], xh8, SCHEME)
                        dT = tl.dot(beta * lev * (1.0 / LV), q32T, input_precision=PREC32)
                        dT = tl.abs(dT) * tl.abs(sm_scale)
                        ratio = dT * inv_c[None, :]
                        u_tok = tl.max(tl.where(ratio == ratio, ratio, float("inf")), axis=1)
                    wn = wn + u_tok
                wn = tl.where(valid, wn * INFL, 0.0)
            elif G == 1:  # ‖W_j‖₂ is the witness itself: no square, no second load
                wn = tl.where(valid, tl.load(KW + wbase, mask=valid, other=0.0).to(tl.float32) * INFL, 0.0)
            else:
                wmx = tl.zeros([BLOCK_N], tl.float32)
                for g in tl.static_range(G):
                    wmx = tl.maximum(wmx, tl.load(KW + wbase + g, mask=valid, other=0.0).to(tl.float32))
                wsafe = tl.where(wmx > 0, wmx, 1.0)
                w2 = tl.zeros([BLOCK_N], tl.float32)
                for g in tl.static_range(G):
                    wr = tl.load(KW + wbase + g, mask=valid, other=0.0).to(tl.float32) / wsafe
                    w2 += wr * wr
                # (a NaN / inf group witness makes w2 NaN: kept NaN, so it is counted and flags the row;
                # the GPU's max drops NaN operands)
                wn = tl.where(valid, tl.where(w2 == w2, tl.maximum(tl.sqrt(w2) * wmx, wmx) * INFL, float("nan")), 0.0)
            if ABLATE // 2 % 2 == 1:  # (diagnosis) no φ / ν / κ loads
                phi = tl.where(valid, 0.5, 0.0)
                nu = phi
                kap = phi
            else:
                phi = tl.load(VW + vwoff, mask=valid, other=0.0).to(tl.float32)
                nu = tl.load(VN + vwoff, mask=valid, other=0.0).to(tl.float32)
                kap = tl.load(KN + vwoff, mask=valid, other=0.0).to(tl.float32)
            if HAS_REP:  # a repaired token is exact: radius 0, φ = 0, ν / κ ≥ its exact norms (rounded up)
                wn = tl.where(rep, 0.0, wn)
                phi = tl.where(rep, 0.0, phi)
                nu = tl.where(rep, tl.load(RVN + rnbase, mask=rep, other=0.0).to(tl.float32), nu)
                kap = tl.where(rep, tl.load(RKN + rnbase, mask=rep, other=0.0).to(tl.float32), kap)
            # non-finite radii / witnesses; a NaN logit makes l non-finite, flagged after the merge
            nf = (wn != wn) | (wn == float("inf")) | (phi != phi) | (phi == float("inf")) | (nu != nu) | (nu == float("inf")) \
                | (kap != kap) | (kap == float("inf"))
            bad += nf.to(tl.float32)
            la = _key_level(wn, X0, K)
            if PAGE_LEVELS:
                # page granularity: each token's level rounded up to its page's largest (sound: any
                # levels ≥ the radii are, SPEC §3(c)); page masses are fp32 sums of T tokens, so no
                # operand split and no one-hot dot; Σ p̂ φ is summed per token, exactly as before
                oh_pgT = col[:, None] == tl.max(tl.reshape(la, [PAGES, T]), axis=1)[None, :]  # [NB, PAGES]
                if TIER_B:
                    lb = _key_level(ks_lvl, X0, K)
                    oh_pgT = oh_pgT | (col[:, None] == (tl.max(tl.reshape(lb, [PAGES, T]), axis=1) + KA)[None, :])
                psumT = tl.sum(tl.reshape(pT, [PAGES, T, BLOCK_H]), axis=1)  # [PAGES, H]
                hdT = tl.sum(oh_pgT.to(tl.float32)[:, :, None] * psumT[None, :, :], axis=1)  # [NB, H]
                hdT = tl.where(col[:, None] == NB - 1, tl.sum(pT * phi[:, None], axis=0)[None, :], hdT)
            elif ABLATE // 8 % 2 == 1:
                pphiT = pphiT * alpha[None, :] + pT * phi[:, None]
                hdT = tl.zeros([NB, BLOCK_H], tl.float32)
            else:
                onehotT = col[:, None] == la[None, :]  # [NB, N]
                if TIER_B:
                    onehotT = onehotT | (col[:, None] == (_key_level(ks_lvl, X0, K) + KA)[None, :])
                # the last row carries φ_j, so the same dot also accumulates Σ p̂ φ
                if ABLATE % 2 == 1:  # (diagnosis) no histogram dot
                    hdT = tl.zeros([NB, BLOCK_H], tl.float32)
                elif HIST_BF16:
                    # p̂ = p_hi + p_lo (bf16 each: |p̂ − p_hi − p_lo| ≤ 2^-16 p̂, fp32's exponent range, so
                    # nothing above 2^-126 is flushed); 0/1 exact in bf16; φ rounded up into bf16
                    phi_up = ((phi.to(tl.int32, bitcast=True) + 0xFFFF) & -65536).to(tl.float32, bitcast=True)
                    ohbT = tl.where(col[:, None] == NB - 1, phi_up[None, :], onehotT.to(tl.float32)).to(tl.bfloat16)
                    p_hiT = pT.to(tl.bfloat16)
                    p_loT = (pT - p_hiT.to(tl.float32)).to(tl.bfloat16)
                    if PACK_HIST:
                        hdT = tl.dot(ohbT, tl.where(heads_i[None, :] < HALF, p_hiT, p_loT))  # [NB, H]: hi | lo
                    else:
                        hdT = tl.dot(ohbT, p_loT, acc=tl.dot(ohbT, p_hiT))  # [NB, H]
                else:
                    ohT = tl.where(col[:, None] == NB - 1, phi[None, :], onehotT.to(tl.float32))
                    # fp32 operands: no p̂ is flushed above 2^-126 of the running max (paged.mass_eta)
                    if PACK_HIST:  # the split is inside the dot: the lo columns carry 0 (the interpreter's check
                        # of the packed layout, tests/test_kernels_conformance.py)
                        hdT = tl.dot(ohT, tl.where(heads_i[None, :] < HALF, pT, 0.0), input_precision=PREC_HIST)
                    else:
                        hdT = tl.dot(ohT, pT, input_precision=PREC_HIST)
            if ABLATE // 8 % 2 == 0:
                histT = histT * alpha[None, :] + hdT
            if ABLATE // 4 % 2 == 0:
                wmax = tl.maximum(wmax, wn)
            if TIER_B or SCHEME == INT8_DITHER_ID:  # max s: only Tier B's and the dither's terms read it
                smax = tl.maximum(smax, ks_lvl)
            phimax = tl.maximum(phimax, phi)
            numax = tl.maximum(numax, nu)
            kapmax = tl.maximum(kapmax, kap)
        m = m_new

    if HAS_WIN:
        # the exact window (paged.ExactWindow): the first `sink` and the last `recent` tokens, skipped by the loop
        # above, served from the ring by the split that owns its virtual pages: exact K / V (scale 1, no dither),
        # radius 0 (bin 0), φ = 0, ν / κ from the ring's norms
        if ring_here:
            for w0 in range(0, sink + recent, BLOCK_N):
                wi = w0 + n_idx
                wtok = tl.where(wi < sink, wi, seq_len - recent + (wi - sink))
                wok = (wi < sink + recent) & (wtok >= 0) & (wtok < seq_len) & ((wi < sink) | (wtok >= sink))
                if HAS_MASK:
                    wok = wok & (tl.load(TM + b * s_tmb + wtok, mask=wok, other=0) != 0)
                wno = b * s_wnb + kvh * s_wnh + tl.where(wtok < sink, wtok, sink + wtok % tl.maximum(recent, 1))
                wk = tl.load(WK + wno[:, None] * D + d[None, :], mask=wok[:, None], other=0.0)  # [N, D]
                wvT = tl.load(WV + wno[None, :] * D + d[:, None], mask=wok[None, :], other=0.0)  # [D, N]
                if LOWP:
                    sT = tl.dot(wk.to(Q.dtype.element_ty), qT) * sm_scale
                else:
                    sT = tl.dot(wk.to(tl.float32), q32T) * sm_scale
                sT = tl.where(wok[:, None], sT, float("-inf"))
                m_new, alpha, pT, l = _softmax_step(m, l, sT)
                if LOWP and not PV_F32:
                    accT = accT * alpha[None, :] + tl.dot(wvT.to(tl.bfloat16), pT.to(tl.bfloat16))
                else:
                    accT = accT * alpha[None, :] + tl.dot(wvT.to(tl.float32), pT, input_precision=PREC32)
                if METER:
                    psum = tl.sum(pT, axis=0)  # [H]: every window token is at level 0 (radius 0)
                    if PACK_HIST:  # the lo columns repeat the heads: the sum goes to the hi ones
                        psum = tl.where(heads_i < HALF, psum, 0.0)
                    row0 = col == 0
                    if TIER_B:
                        row0 = row0 | (col == KA)
                    histT = histT * alpha[None, :] + tl.where(row0[:, None], psum[None, :], 0.0)
                    if ABLATE // 8 % 2 == 1:
                        pphiT = pphiT * alpha[None, :]
                    nu = tl.load(WVN + wno, mask=wok, other=0.0)
                    kap = tl.load(WKN + wno, mask=wok, other=0.0)
                    bad += (wok & ((nu != nu) | (nu == float("inf")) | (kap != kap) | (kap == float("inf")))).to(tl.float32)
                    numax = tl.maximum(numax, tl.where(wok, nu, 0.0))
                    kapmax = tl.maximum(kapmax, tl.where(wok, kap, 0.0))
                m = m_new

    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask)
    tl.store(L_OUT + o_idx, l, mask=hmask)
    tl.store(ACC_OUT + o_idx[None, :] * D + d[:, None], accT, mask=hmask[None, :])
    if METER:
        if ABLATE // 8 % 2 == 1:
            if PACK_HIST:  # the upper columns repeat the heads: their sums are not lo parts
                pphiT = tl.where((heads_i < HALF)[None, :], pphiT, 0.0)
            pphi = tl.sum(pphiT, axis=0)
            histT = tl.where(col[:, None] == NB - 1, pphi[None, :], histT)
        if PACK_HIST:
            # head h's masses: its hi column plus its lo column, the latter taken to the hi column's running
            # max (the two columns compute the same logits, so the factor is exactly 1; kept for rigour)
            hi_lo = tl.permute(tl.reshape(histT, [NB, 2, HALF]), (0, 2, 1))
            hist_hi, hist_lo = tl.split(hi_lo)  # [NB, HALF] each
            m_hi, m_lo = tl.split(tl.permute(tl.reshape(m, [2, HALF]), (1, 0)))
            lo_f = tl.where(m_lo == m_hi, 1.0, tl.exp(m_lo - m_hi))
            hh = tl.arange(0, HALF)
            h_idx = (b * Hq + kvh * GQ + hh) * num_splits + sp
            tl.store(HIST_OUT + h_idx[None, :] * NB + col[:, None], hist_hi + hist_lo * lo_f[None, :],
                     mask=(hh < GQ)[None, :])
        else:
            tl.store(HIST_OUT + o_idx[None, :] * NB + col[:, None], histT, mask=hmask[None, :])
        st = STAT_OUT + o_idx * 6
        zero = tl.zeros([BLOCK_H], tl.float32)
        tl.store(st + 0, zero + tl.max(wmax, axis=0), mask=hmask)
        tl.store(st + 1, zero + tl.max(smax, axis=0), mask=hmask)
        tl.store(st + 2, zero + tl.max(phimax, axis=0), mask=hmask)
        tl.store(st + 3, zero + tl.max(numax, axis=0), mask=hmask)
        tl.store(st + 4, zero + tl.sum(bad, axis=0), mask=hmask)
        tl.store(st + 5, zero + tl.max(kapmax, axis=0), mask=hmask)


@dataclasses.dataclass
class DecodeOutput:
    o: torch.Tensor
    lse: torch.Tensor
    meter: MeterRecord | None
    compiled: object = None  # the launched kernel (registers / spills for the benchmark)
    tile: "Tile | None" = None  # the loop configuration it ran (``decode(tile=)`` for a re-decode of some rows)

    def with_rows(self, rows: torch.Tensor, sub: "DecodeOutput") -> "DecodeOutput":
        """A copy whose sequences ``rows`` come from ``sub`` (a decode of just those sequences;
        every other row kept). Each (sequence, kv head, split) program and each merged row depend
        only on their own sequence, so with the same ``num_splits`` the rows are those of a decode of
        the whole batch (the gate re-decodes only the sequences it repaired), up to the kernel
        variant: a rows-only decode may run another one (the overlay on, HAS_REP, where the first
        decode had none), whose rounding may differ in the last bits (on the H200 and in the
        interpreter, tests/test_kernel_gate.py): every row's bound is the kernel's own, sound either
        way."""
        def put(full, part):
            if full is None:
                return None
            out = full.clone()
            out[rows] = part
            return out

        rec = None
        if self.meter is not None:
            rec = MeterRecord(**{f.name: put(getattr(self.meter, f.name), getattr(sub.meter, f.name))
                                 for f in dataclasses.fields(MeterRecord)})
        return DecodeOutput(o=put(self.o, sub.o), lse=put(self.lse, sub.lse), meter=rec, compiled=sub.compiled,
                            tile=self.tile)


#: off the GPU (the interpreter): "torch" serves the merge / epilogue with its torch twin
#: (``epilogue.merge_torch``, fast), "kernel" runs the fused Triton kernel (the conformance suites)
MERGE_OFF_GPU = "torch"
_LOGGED: dict = {}
#: decode configurations whose default tile did not fit the GPU (OutOfResources): the pages per tile that did
_TILE_FIT: dict = {}
log = logging.getLogger("witcert.kernels")

#: key-side level grid: edges X0·2^((m−1)/2), m = 1..KEY_LEVELS (ratio √2), 0 and overflow bins.
X0 = 2.0**-14
KEY_LEVELS = 29


def key_edges(device=None) -> torch.Tensor:
    """Upper edges of the key-side bins 0..K (bin 0 = exactly 0), float64."""
    m = torch.arange(1, KEY_LEVELS + 1, dtype=torch.float64, device=device)
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), X0 * torch.exp2((m - 1) / 2)])


def choose_splits(batch: int, kv_heads: int, max_len: int, block_size: int, sms: int, meter: bool | None = None,
                  scheme: str = "int8", levels: str = "token", head_dim: int = 128) -> int:
    """Split-KV count for a decode launch of ``batch × kv_heads`` (sequence, kv head) pairs over at
    most ``max_len`` tokens on a GPU of ``sms`` multiprocessors: at least two programs per
    multiprocessor and at least 16 splits (both measured on the H200, ``bench/tune_decode.py``,
    bench/RESULTS.md: more, shorter splits keep more bytes in flight than a few long ones), at
    most 64, and no split shorter than 8 pages: the base count, which the two rules below may replace.
    The one split heuristic of the library.

    With ``meter`` (True / False: the launch's kernel) and a tile whose register cap fixes how many
    programs fit on a multiprocessor (``Tile.resident_programs``), a grid of fewer than ``FEW_WAVES``
    waves is sized to whole waves instead: the largest split count whose grid fills ⌊waves⌋ (at
    least one) waves of that many programs per SM (bench/RESULTS.md run L: one wave two thirds full cost
    the metered B 1 call 12-22 %, a second wave under a third full the unmetered B 8 call 10 %). A count
    that would change the tile is not taken.

    A grid too small for the many-program tiles at those counts (B 1-4 at 8 kv heads; ``SMALL_GRID_SCHEMES``:
    int8, pages no larger than those tiles) takes them anyway where the sequence is long enough: as many
    splits as fill one wave of their programs (metered: one warp, 32 tokens, twelve per SM; unmetered: 64
    tokens under the cap, six per SM), but no split shorter than ``SMALL_GRID_MIN_SPLIT_TOKENS`` tokens or
    one page, at most ``SMALL_GRID_MAX_SPLITS`` (past 64), nor more than the merge's measured partials per
    row allow at ``head_dim`` (``SMALL_GRID_MAX_PARTIALS``: the next power of two of the count times d); a
    count that fills less than ``SMALL_GRID_MIN_WAVE`` of the wave keeps the rules above. bench/RESULTS.md
    run R: a program's chain of tiles on a wave of small programs is shorter than a 4- or 8-warp program's
    chain of 128-token ones, and the unmetered B 2 call had run a second wave of eight programs; past 128
    splits at 32K the merge of 256 partials per row costs more than the shorter chains save."""
    pages = max(1, -(-max_len // block_size))
    pairs = max(1, batch * kv_heads)
    s = max(1, min(max(-(-2 * sms // pairs), 16), 64, pages // 8))
    if meter is None:
        return s
    tile = tile_config(meter, scheme, pairs * s / sms, levels, block_size)
    many = tile_config(meter, scheme, float(MANY_PROGRAMS_PER_SM), levels, block_size)
    if (scheme in SMALL_GRID_SCHEMES and many != tile and many.resident_programs() is not None
            and block_size <= many.tokens):
        # a small grid (too few pairs for MANY_PROGRAMS_PER_SM programs per SM at these counts): the
        # many-program tile (metered: one warp, 32 tokens; unmetered: 64 tokens, capped) on one wave of its
        # resident programs, at least SMALL_GRID_MIN_SPLIT_TOKENS tokens a split, where that grid takes it and
        # fills at least SMALL_GRID_MIN_WAVE of the wave (run R)
        wave = many.resident_programs() * sms
        s1 = min(wave // pairs, max_len // SMALL_GRID_MIN_SPLIT_TOKENS, pages, SMALL_GRID_MAX_SPLITS,
                 SMALL_GRID_MAX_PARTIALS // max(1, head_dim))
        if (s1 >= 1 and pairs * s1 >= SMALL_GRID_MIN_WAVE * wave
                and tile_config(meter, scheme, pairs * s1 / sms, levels, block_size) == many):
            return s1
    per_sm = tile.resident_programs()
    if per_sm is None:
        return s
    slots = per_sm * sms
    waves = pairs * s / slots
    if waves >= FEW_WAVES:
        return s
    whole = max(1, min(max(1, int(waves)) * slots // pairs, 64, pages // 8))
    if tile_config(meter, scheme, pairs * whole / sms, levels, block_size) != tile:
        return s
    return whole


_SMS: dict = {}


def _sm_count(dev) -> int:
    """Multiprocessors of a device (cached; 4 off the GPU, where only the interpreter runs)."""
    if dev.type != "cuda":
        return 4
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _SMS[dev]


def tensor_core_query(q: torch.Tensor, cache: PagedKV, validate: bool = True) -> torch.Tensor:
    """The query for the GPU path, whose tensor-core dots run in q's dtype. A rounding of q
    would change the served logits without being metered, so q must already be bf16/fp16, or a
    float32 that is exactly bf16 (checked only when ``validate``; NaN/Inf pass and saturate)."""
    if q.dtype == torch.float32:
        low = q.to(torch.bfloat16)
        if not (validate and torch.equal(torch.nan_to_num(q), torch.nan_to_num(low.float()))):
            raise ValueError("q: the GPU path multiplies in bf16/fp16; pass q in the model's dtype (a float32 q "
                             "would be rounded without being metered)")
        q = low
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q: expected bfloat16 or float16 on the GPU path, got {q.dtype}")
    if cache.scheme == "none" and q.dtype != cache.exact_k.dtype:
        raise ValueError(f"q: scheme 'none' stores {cache.exact_k.dtype} codes; q must have that dtype, got {q.dtype}")
    return q


#: schemes whose codes the decode loop loads as 8-bit tiles (one code per byte, from the scheme table:
#: transposed loads, one stage; run J timed int8, the others share its loop but were not timed)
EIGHT_BIT_SCHEMES = tuple(name for name in SCHEME_IDS if SCHEMES[name].code_bits == 8)
#: 64-token unmetered tiles and their register cap apply from this many programs per SM
MANY_PROGRAMS_PER_SM = 4
#: register caps per thread for the 8-bit kernels. Metered (128-token tiles, every grid): three programs
#: per SM instead of two; with 8 head columns and the packed histogram no spill (sm_90 SASS), 0.77-0.82×
#: the uncapped time at B ≥ 8 (run K, bench/tile_ab.py); at B 1 the same time on run K's 33 splits and,
#: with ``choose_splits`` filling one wave of three programs per SM (49 splits; since run R long B 1 sequences
#: take the one-warp tile instead), 0.88× at 32K, 0.77× at 128K (run L). Unmetered (64-token tiles, on grids of ≥
#: MANY_PROGRAMS_PER_SM programs per SM): six
#: programs per SM instead of four (24 B of spill), 0.84-0.97× the
#: uncapped time at B ≥ 8 (runs K3, K4; 64 registers: better at B 8, worse at B 32). ``test_register_
#: cap_changes_no_value`` checks capped = uncapped bit for bit: passed on the H200 for both caps
#: (bench/results/2026-12-02/cap_test_2026-12-02_K.log, bench/results/2026-12-02/cuda_subset_2026-12-02_K4.log).
#: ``CAP_REGISTERS`` False turns
#: both off (``decode(_maxnreg=0)`` for one call)
METERED_REGISTER_CAP = 168
UNMETERED_REGISTER_CAP = 80
#: the cap of a capped metered tile that reads the key sketch or the channel weights (its codes, its chunked dot
#: and the weighted head factor): no spill at 232 (58 B of spill under ``METERED_REGISTER_CAP``), 0.85-1.0x
#: the 168-register time at every shape of bench/sketch_speed.py (run S2, bench/TIGHTNESS.md), on the grid
#: ``choose_splits`` sized for the 168-register tile
SKETCH_REGISTER_CAP = 232
CAP_REGISTERS = True
#: the register file, the most resident threads and the most resident programs (thread blocks) of a
#: multiprocessor (sm_80 / sm_89 / sm_90)
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_PROGRAMS = 32
#: the schemes whose metered kernel takes one-warp programs of 32 tokens on grids of ≥ MANY_PROGRAMS_PER_SM
#: programs per SM (run P, 2026-12-03, bench/results/2026-12-03/tile_ab_waves_2026-12-03_P.log, kernel + merge: 0.90× the
#: 128-token / 4-warp time at B 8 / 32K, 0.91× at B 8 / 128K, 0.92× at B 32 / 32K (12 splits); 1.5× slower at B 1
#: at ≤ 64 splits, where the grid is small: run R's ``choose_splits`` gives long B 1-4 sequences a wave of them). A one-warp
#: program exchanges nothing between warps per tile (the 4-warp
#: tile's p̂, one-hot and row maxima pass through shared memory behind 24 barriers per tile, sm_90 SASS);
#: under METERED_REGISTER_CAP twelve fit per SM (spills: Triton's n_spills 28 on the H200, 140 B of spill stores in
#: offline sm_90 ptxas, bench/sass_probe.py). Only int8 was timed: the other 8-bit
#: schemes keep the 4-warp tile
ONE_WARP_METERED_SCHEMES = ("int8",)
#: the one-warp metered tile prefetches the next tile into the L2 (``Tile.prefetch``; run Q, 2026-12-03,
#: bench/results/2026-12-03/tile_ab_prefetch_2026-12-03_Q.log, kernel + merge: 0.955-0.981× the time at B 8 and 32, outputs
#: bit-identical; into the L1 no better). ncu (run Q) had put 48 % of its stall samples on long-scoreboard waits
#: for the tile's code and scale loads, at 2.8 active warps per scheduler. The unmetered 64-token tile spilled
#: under its cap with it (1.2× slower; uncapped, at 96 registers or in one-warp programs 7-35 % slower than the
#: capped default), and the B 1 4-warp metered tile was 5 % slower: neither prefetches
METERED_ONE_WARP_PREFETCH = 1
#: the fewest tokens per split ``choose_splits`` gives a small grid that it puts on one wave of the many-program
#: tile (run R, 2026-12-03, bench/b1_probe.py, Hq 32, whole call, ms; bench/results/2026-12-03/b1_probe_2026-12-03_R.log and _R2 / _R3):
#: metered B 1, one-warp tile: at 32K 128 splits (256 tokens a split) 0.0595 against 0.0647 for the 4-warp tile at
#: 49 and 0.0635 at 192 splits; at 128K 198 splits 0.146 (192), 128 splits 0.153, 4-warp 0.157; B 2 / 4: 3-12 %
#: less time. Unmetered, the capped 64-token tile against the 128-token / 8-warp one: B 1 32K 0.0442 / 0.0483,
#: 128K 0.113 / 0.139; B 2 0.068 / 0.116, 0.209 / 0.418; B 4 8K 0.043 / 0.050, 32K 0.116 / 0.142
SMALL_GRID_MIN_SPLIT_TOKENS = 256
#: the schemes whose small grids ``choose_splits`` puts on one wave of the many-program tile (only int8 was timed)
SMALL_GRID_SCHEMES = ("int8",)
#: and at most this many splits (the merge reads the next power of two of partials per row: measured up to 256 at
#: d 128; a grid of one or two kv heads would otherwise take a thousand)
SMALL_GRID_MAX_SPLITS = 256
#: the most partial-output floats per row (the merge's next power of two of the split count times d) a small grid
#: is given: 256 × 128, the largest measured (run R, d 128); d 256 then takes at most 128 splits
SMALL_GRID_MAX_PARTIALS = 256 * 128
#: the smallest share of a wave that count must fill (run R, metered B 1: 0.65 of a wave (128 splits) was the best
#: measured at 32K; 0.48 (96 splits) no better than the 4-warp tile at 32K and 19 % slower at 128K)
SMALL_GRID_MIN_WAVE = 0.6
#: ``choose_splits`` sizes grids of fewer waves than this to whole waves (run L: 12 vs 16 splits at B 32,
#: 10 waves, measured no better; at 0.7-2.6 waves 3-22 % faster)
FEW_WAVES = 4
#: the 8-bit schemes the caps apply to: not the position-keyed (dithered) ones, whose in-kernel dither
#: generation spills 1.5 KB under the metered cap (sm_90 SASS, bench/sass_probe.py --scheme int8_dither)
CAPPED_SCHEMES = tuple(name for name in EIGHT_BIT_SCHEMES if not SCHEMES[name].position_keyed)


def packs_histogram(gq: int, head_columns: int) -> bool:
    """Whether the padding columns can carry the histogram's lo parts (PACK_HIST): GQ ≤ half the columns."""
    return 2 * gq <= head_columns


@dataclasses.dataclass(frozen=True)
class Tile:
    """A decode launch's loop configuration (``tile_config``)."""
    tokens: int  # tokens per tile (a multiple of the block size)
    stages: int  # software-pipeline stages
    warps: int
    max_registers: int | None = None  # per-thread register cap (Triton's ``maxnreg``), None: the compiler's
    # the fewest query-head columns a program's tiles are padded to (BLOCK_H ≥ GQ; the tensor-core dots take
    # 8 columns as mma.sync n8 where 16 went to wgmma: 2-10 % less time at GQ 4-8, run K)
    head_columns: int = 8
    # 1: the next tile's code rows, scales and witnesses are prefetched into the L2 while a tile computes
    # (prefetch.global.L2, block ids two tiles ahead; on the GPU); 0: none
    prefetch: int = 0

    def resident_programs(self) -> int | None:
        """Programs that fit on one multiprocessor under the register cap (None without a cap: the
        compiler's count is known only after the launch). Shared memory does not bind these tiles
        (the 8-bit one-stage ones; run L's split A/B timed the waves this predicts)."""
        if self.max_registers is None:
            return None
        regs = -(-self.max_registers // 8) * 8  # allocated per warp in units of 8 per thread
        return max(1, min(SM_REGISTERS // (regs * 32 * self.warps), SM_THREADS // (32 * self.warps), SM_PROGRAMS))


def tile_config(meter: bool, scheme: str = "int8", programs_per_sm: float = 0.0, levels: str = "token",
                block_size: int = 16) -> Tile:
    """The decode loop's tile on the H200 for a grid of ``programs_per_sm`` programs per
    multiprocessor (bench/tile_ab.py, bench/RESULTS.md runs J, K and L, 2026-12-02). The 8-bit code tiles are
    loaded in the other orientation and transposed before their cast, so Triton moves them into
    the dots' register layout with 16-byte shared-memory accesses (sm_90 SASS: no byte loads,
    15-18 % fewer instructions per tile, no spills); every 8-bit configuration takes one stage (with two,
    cp.async stages the transposed tiles without bytewise reads now, sm_90 SASS, but every two-stage tile
    was slower on the H200: run M, bench/tile_ab.py --pipe).

    * meter on, 8-bit codes: 128-token tiles, one stage, 4 warps (211 registers with 8 head
      columns and the packed histogram; capped at ``METERED_REGISTER_CAP``, no spill, three programs
      per SM, on every grid while ``CAP_REGISTERS``, for the ``CAPPED_SCHEMES``: not int8_dither);
      for the ``ONE_WARP_METERED_SCHEMES`` (int8) on grids of ≥ ``MANY_PROGRAMS_PER_SM`` programs per
      SM, 32-token tiles in one-warp programs under the same cap (twelve per SM; run P: 7-10 % faster
      at B 8 and 32, and ``choose_splits`` sizes their grid to whole waves of twelve), where a page
      (``block_size`` tokens) fits in such a tile, each prefetching its next tile into the L2
      (``METERED_ONE_WARP_PREFETCH``, run Q: 2-5 % faster);
    * meter off, 8-bit codes: 64-token tiles, one stage, 4 warps (116 registers; capped at
      ``UNMETERED_REGISTER_CAP`` for the ``CAPPED_SCHEMES``: six programs per SM) on grids of ≥
      ``MANY_PROGRAMS_PER_SM`` programs per SM, else 128-token tiles, one stage, 8 warps (fewer, longer
      programs: short sequences at small B; ``choose_splits`` gives int8's long small-B grids enough splits
      for the 64-token tile, run R);
    * the fp32-dequantizing schemes (int4_group, kivi2): 128-token tiles, one stage with the meter,
      else two; 4 warps; scheme none: two stages and 16 head columns (unchanged: Triton 3.6 emits an
      out-of-bounds __shared__ read for the metered none kernel at one stage, bench/crash_probe.py,
      and its 8-column code has not been through that probe).

    Every tile pads the GQ query heads of a kv head to ``head_columns`` (8; the dots run as mma.sync
    n8 instead of wgmma n16: 2-10 % less time, fewer registers, run K), except the metered page-level
    bins (``levels="page"``), which keep run J's tile (16 columns, no cap: under the cap they spill
    184 B, and they were 14-30 % slower with 8 columns in run K).

    The unmetered 64-token one-stage kernel faulted once under graph replay with the older
    untransposed loads (run G, never reproduced under memcheck); the transposed kernel is clean
    under memcheck (every tensor its own allocation), racecheck and synccheck (run J)."""
    many = programs_per_sm >= MANY_PROGRAMS_PER_SM
    capped = CAP_REGISTERS and scheme in CAPPED_SCHEMES
    if meter and levels == "page" and scheme != "none":
        return Tile(128, 1, 4, head_columns=16)
    if scheme in EIGHT_BIT_SCHEMES:
        if meter:
            if many and capped and scheme in ONE_WARP_METERED_SCHEMES and levels == "token" and block_size <= 32:
                return Tile(32, 1, 1, METERED_REGISTER_CAP, prefetch=METERED_ONE_WARP_PREFETCH)
            return Tile(128, 1, 4, METERED_REGISTER_CAP if capped else None)
        return Tile(64, 1, 4, UNMETERED_REGISTER_CAP if capped else None) if many else Tile(128, 1, 8)
    if scheme == "none":
        return Tile(128, 2, 4, head_columns=16)
    return Tile(128, 1, 4) if meter else Tile(128, 2, 4)


def decode(
    cache: PagedKV,
    q: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | None,
    sm_scale: float | None = None,
    meter: bool = True,
    num_splits: int | None = None,
    delta_step: float | None = None,
    pages_per_tile: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    validate: bool = True,
    epilogue: bool = True,
    tilt_above: float = -1.0,
    hist_split: str | None = None,
    levels: str = "token",
    token_mask: torch.Tensor | None = None,
    prefetch_bt: bool | None = None,
    kv_indptr: torch.Tensor | None = None,
    repair: RepairOverlay | None = None,
    tile: Tile | None = None,
    window: ExactWindow | None = None,
    _ablate: int = 0,
    _maxnreg: int | None = None,
    _head_columns: int | None = None,
    _pack_hist: bool | None = None,
    _prefetch: int | None = None,
) -> DecodeOutput:
    """See the module docstring. ``validate=False`` skips the checks that need a device sync;
    ``epilogue=False`` (benchmarks) stops after the merge, without the meter record.
    ``num_splits=None``: ``choose_splits`` (the one heuristic); ``pages_per_tile`` / ``num_stages`` /
    ``num_warps`` None: ``tile_config`` for this grid (and its register cap; ``_maxnreg``: another cap
    for an A/B, 0 for none). ``tile``: the loop configuration to use instead of ``tile_config``'s for this
    grid (a gate's re-decode of some rows passes the whole batch's: the grid is smaller, the tile and so the
    sums must be the same). ``tilt_above`` ≥ 0: the
    dual-grid tilt is computed only for rows whose closed-form TV⁺ (min(tanh, e-form) + the fp
    terms) is above it (a gate with threshold τ passes τ: at or below it the row is certified
    without the tilt), the others report tilt 1; a tilted row refines its grid (``epilogue.COARSE``
    intervals, then up to ``REFINE_TOP`` of them) only until τ is settled either way and reports that
    grid's tilt (the gate's decision is the fully refined one's); TV⁺ is sound either way. ``hist_split``: the histogram dot's operand
    split on the GPU, "bf16x2" (default) or "tf32x3" (``paged.HIST_SPLIT_REL``). ``levels``:
    "token" (each token binned by its own radius) or "page" (by its page's largest: looser where
    radii vary within a page, and cheaper: no one-hot dot, bench/RESULTS.md). ``token_mask``
    [B, ≥ max seq_len] bool (True = attend; left padding of a batch): masked tokens are neither
    attended nor metered (Tier B's n and Λ still count them: conservative). ``prefetch_bt``
    (None: with the meter): load the next tile's block-table entries one iteration ahead
    (measured on the H200, bench/RESULTS.md run E: 2–7 % faster with the meter, mixed without).
    ``kv_indptr`` [≥ B + 1] int32 (SGLang's layout, block size 1 only): ``block_table`` is then the
    flat ``kv_indices`` (token slots; sequence b's are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``)
    and ``seq_lens`` must be None: the kernel reads the CSR rows directly (no [B, max_len] table, no
    host sync); ``num_splits=None`` then sizes the split count from the mean length.
    ``repair`` (``paged.RepairOverlay``, gated caches, SPEC §6): repaired pages are served from its
    exact pool (scale 1, no dither, radius 0, φ = 0, ν / κ from the pool's norms); None, or an
    overlay with no slot in use, launches the kernel without the overlay (HAS_REP off: the same
    code as before). On the GPU the pool's dtype must be q's (bf16 / fp16): the dots run in it.
    Off the GPU the merge / epilogue runs as ``epilogue.merge_torch`` (``MERGE_OFF_GPU``), which
    computes the tilt on every row whatever ``tilt_above`` is. ``window`` (``paged.ExactWindow``, one ring
    per sequence of this batch): each sequence's first ``sink`` and last ``recent`` tokens are served from
    it (model dtype, radius 0, φ = 0, ν / κ from its norms); not with ``kv_indptr``. A cache with a key
    sketch or channel weights (``PagedKV.sketch_bits`` / ``weights``) is metered with the sketch radius
    ε_hj = c_h (W_j + u_j) (``contract.sketch``)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected [B, Hq, D], got {tuple(q.shape)}")
    Bsz, Hq, D = q.shape
    Hkv = cache.num_kv_heads
    if D != cache.head_dim:
        raise ValueError(f"q: head dim {D} does not match the cache's {cache.head_dim}")
    if Hq % Hkv or not 1 <= Hq // Hkv <= 8:
        raise ValueError(f"q: {Hq} query heads over {Hkv} kv heads: GQA group must be an integer in 1..8")
    csr = kv_indptr is not None
    if csr:
        if seq_lens is not None:
            raise ValueError("kv_indptr: seq_lens must be None (the lengths are kv_indptr's differences)")
        if cache.block_size != 1:
            raise ValueError(f"kv_indptr: the CSR layout is for block size 1 (token slots), the cache has {cache.block_size}")
        if kv_indptr.dim() != 1 or kv_indptr.shape[0] < Bsz + 1 or kv_indptr.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"kv_indptr: expected an int32/int64 [≥ B + 1 = {Bsz + 1}] tensor, got "
                             f"{kv_indptr.dtype} {tuple(kv_indptr.shape)}")
        if block_table.dim() != 1:
            raise ValueError(f"kv_indptr: block_table must be the flat kv_indices [total], got {tuple(block_table.shape)}")
        kv_indptr = kv_indptr[: Bsz + 1].to(device=q.device, dtype=torch.int32)
        seq_lens = kv_indptr[1:] - kv_indptr[:-1]  # on the device: no sync
        if validate:
            if torch.any(seq_lens < 1):
                raise ValueError("seq_lens: every sequence needs at least one cached token")
            if int(kv_indptr[-1]) > block_table.shape[0] or int(kv_indptr[0]) < 0:
                raise ValueError("kv_indptr: rows reach outside kv_indices")
    else:
        if seq_lens is None or seq_lens.shape != (Bsz,) or block_table.dim() != 2 or block_table.shape[0] != Bsz:
            raise ValueError("seq_lens [B] and block_table [B, max_pages] must match q's batch")
        if validate:
            if torch.any(seq_lens < 1):
                raise ValueError("seq_lens: every sequence needs at least one cached token")
            if torch.any(seq_lens > block_table.shape[1] * cache.block_size):
                raise ValueError("seq_lens: longer than the block table covers")
    if _ablate and not meter or _ablate and epilogue:
        raise ValueError("_ablate (benchmark diagnosis only: drops parts of the meter) needs meter=True, epilogue=False")
    if levels not in ("token", "page"):
        raise ValueError(f"levels: expected 'token' or 'page', got {levels!r}")
    if hist_split is None:
        hist_split = "bf16x2"
    if hist_split not in ("bf16x2", "tf32x3"):
        raise ValueError(f"hist_split: expected 'bf16x2' or 'tf32x3', got {hist_split!r}")
    if num_splits is None:  # from the table's capacity (CSR: the mean length), not seq_lens: no device sync
        cap = max(1, block_table.shape[0] // max(Bsz, 1)) if csr else block_table.shape[1] * cache.block_size
        num_splits = choose_splits(Bsz, Hkv, cap, cache.block_size, _sm_count(q.device), meter, cache.scheme, levels,
                                   cache.head_dim)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: expected a positive int, got {num_splits!r}")
    if delta_step is not None and not 0 < delta_step < 1:
        raise ValueError(f"delta_step: expected a probability in (0, 1), got {delta_step!r}")
    if q.dtype == torch.float64:
        raise ValueError("q: the kernels compute in fp32 and would round a float64 query without metering it; "
                         "a float64 model uses the reference path")
    tier_b = meter and cache.scheme == "int8_dither" and delta_step is not None
    sm = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    dev = q.device
    GQ = Hq // Hkv
    KA = KEY_LEVELS + 2
    NB = triton.next_power_of_2((2 * KA if tier_b else KA) + 1)  # + the Σ p̂ φ column
    T = cache.block_size
    pages_arg = pages_per_tile
    if tile is None:
        tile = tile_config(meter, cache.scheme, Bsz * Hkv * num_splits / _sm_count(dev), levels, cache.block_size)
    elif not isinstance(tile, Tile):
        raise ValueError(f"tile: expected a kernels.decode.Tile, got {type(tile).__name__}")
    if pages_per_tile is None:
        tokens = tile.tokens
        if INTERPRET and tile.warps == 1:
            # a tile is a GPU scheduling choice (the same sums in another order), and the interpreter's time grows
            # with the tile count: its default path keeps the 4-warp tile's 128 tokens. The one-warp tiling runs
            # in the interpreter through an explicit pages_per_tile (test_decode_conformance_one_warp_tile)
            tokens = 128
            if not _LOGGED.get("one_warp"):
                log.info("decode in the interpreter: 128-token tiles where the GPU takes one-warp 32-token programs")
                _LOGGED["one_warp"] = True
        pages_per_tile = max(1, tokens // T)
    if num_stages is None and not INTERPRET:
        num_stages = tile.stages
    if num_warps is None:
        num_warps = tile.warps
    maxnreg = tile.max_registers if _maxnreg is None else (_maxnreg or None)
    BLOCK_H = max(tile.head_columns if _head_columns is None else _head_columns, triton.next_power_of_2(GQ))
    lowp = not INTERPRET and dev.type == "cuda"
    if not lowp:
        hist_split = "tf32x3"  # the interpreter's fp32 (ieee) dot: no bf16 in kernels there
    if meter and levels == "page":
        hist_split = "page"  # fp32 sums, no operand split
    # the bf16 hi / lo histogram operands packed into one dot where the padding columns can hold the lo parts
    # (``_pack_hist`` True: also the fp32 split, where the lo columns carry 0: the interpreter's test of the layout)
    pack = meter and hist_split != "page" and packs_histogram(GQ, BLOCK_H) and (
        hist_split == "bf16x2" if _pack_hist is None else bool(_pack_hist))
    if lowp:
        q = tensor_core_query(q, cache, validate)
    q = q.contiguous()
    if repair is not None:
        if not isinstance(repair, RepairOverlay):
            raise ValueError(f"repair: expected a kernels.paged.RepairOverlay, got {type(repair).__name__}")
        repair.validate(cache, check_slots=validate)
        if lowp and repair.k.dtype != q.dtype:
            raise ValueError(f"repair: the GPU dots run in q's dtype {q.dtype}; the exact pool is {repair.k.dtype} "
                             "(it would be rounded without being metered)")
    has_rep = repair is not None and repair.count > 0
    if window is not None:
        if not isinstance(window, ExactWindow):
            raise ValueError(f"window: expected a kernels.paged.ExactWindow, got {type(window).__name__}")
        if csr:
            raise ValueError("window: the exact window needs per-sequence rings; not with kv_indptr (SGLang's layout)")
        window.validate(cache, Bsz)
        if lowp and window.k.dtype != q.dtype:
            raise ValueError(f"window: the GPU dots run in q's dtype {q.dtype}; the ring is {window.k.dtype}")
    has_win = window is not None and window.columns > 0
    skb = cache.sketch_bits if (meter and cache.scheme != "none") else 0
    weighted = bool(meter and cache.has_weights)
    # the PV dot's operands on the GPU: bf16 (8-bit codes are exact in it; p̂·s_v keeps fp32's exponent range),
    # fp32 (tf32x3) where the values are exact fp16 that bf16 would round (scheme none, a repaired pool)
    pv_f32 = lowp and q.dtype == torch.float16 and (cache.scheme == "none" or has_rep or has_win)
    # the next tile's codes, scales and witnesses prefetched into the L2 while a tile computes (``Tile.prefetch``;
    # GPU only: inline PTX; ``_prefetch`` for an A/B: 0 none, 1 into the L2. Run Q also timed the L1: no better)
    pf_ahead = (tile.prefetch if _prefetch is None else int(_prefetch)) if lowp else 0
    if pf_ahead not in (0, 1):
        raise ValueError(f"_prefetch: expected 0 or 1, got {_prefetch!r}")
    if (skb or weighted) and maxnreg is not None and _maxnreg is None:
        maxnreg = max(maxnreg, SKETCH_REGISTER_CAP)
    if pv_f32 and _maxnreg is None:
        maxnreg = None  # tf32x3 PV operands spill 0.6-1.3 KB under the 8-bit register caps (sm_90 SASS)
    S = num_splits
    f32 = dict(device=dev, dtype=torch.float32)
    m_out = torch.empty(Bsz, Hq, S, **f32)
    l_out = torch.empty(Bsz, Hq, S, **f32)
    acc_out = torch.empty(Bsz, Hq, S, D, **f32)
    hist = torch.empty(Bsz, Hq, S, NB, **f32) if meter else m_out
    stat = torch.empty(Bsz, Hq, S, 6, **f32) if meter else m_out
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    sl = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    bt, sl = bt.to(dev).contiguous(), sl.to(dev).contiguous()
    sl_or_indptr = kv_indptr.contiguous() if csr else sl
    if token_mask is not None:
        if token_mask.dim() != 2 or token_mask.shape[0] != Bsz or token_mask.dtype != torch.bool:
            raise ValueError(f"token_mask: expected a bool [B={Bsz}, max_len] tensor, got "
                             f"{token_mask.dtype} {tuple(token_mask.shape)}")
        if validate and torch.any(seq_lens.to(token_mask.device) > token_mask.shape[1]):
            raise ValueError("token_mask: shorter than a sequence")
        if token_mask.stride(1) != 1:
            token_mask = token_mask.contiguous()
        tm = token_mask.to(dev).view(torch.uint8)
    else:
        tm = sl
    extra = {} if num_stages is None else {"num_stages": num_stages}
    if maxnreg is not None and not INTERPRET:  # a register cap per thread (tile_config; ``_maxnreg``: A/B, 0 = none)
        extra["maxnreg"] = maxnreg
    def launch(pages):
        return _decode_kernel[(Bsz, Hkv, S)](
            q, cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_zero, cache.v_zero,
            cache.k_wit, cache.v_wit, cache.v_norm, cache.k_norm, bt, sl_or_indptr, tm,
            *((repair.slot, repair.k, repair.v, repair.k_norm, repair.v_norm) if has_rep else (sl, q, q, m_out, m_out)),
            cache.k_sketch if skb else sl, cache.weights if weighted else sl,
            *((window.k, window.v, window.k_norm, window.v_norm) if has_win else (q, q, m_out, m_out)),
            m_out, l_out, acc_out, hist, stat,
            cache.seed, cache.layer, sm, S, window.sink if has_win else 0, window.recent if has_win else 0,
            q.stride(0), q.stride(1),
            cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
            cache.k_scale.stride(0), cache.k_scale.stride(1), 0 if page_scaled_keys(cache.scheme) else cache.k_scale.stride(2),
            cache.v_scale.stride(0), cache.v_scale.stride(1), cache.v_scale.stride(2),
            cache.k_wit.stride(0), cache.k_wit.stride(1), cache.k_wit.stride(2),
            cache.v_wit.stride(0), cache.v_wit.stride(1),
            0 if csr else bt.stride(0), tm.stride(0), repair.slot.stride(0) if has_rep else 0,
            *(cache.k_sketch.stride()[:3] if skb else (0, 0, 0)),
            *(window.k_norm.stride()[:2] if has_win else (0, 0)),
            Hq,
            INFL=1.0 + KERNEL_REL_SLACK, X0=X0,
            GQ=GQ, BLOCK_H=BLOCK_H, D=D, T=T, G=cache.num_groups,
            PAGES=pages, K=KEY_LEVELS, NB=NB,
            SCHEME=SCHEME_IDS[cache.scheme], METER=meter, TIER_B=tier_b, PER_TOKEN=cache.per_token_witness, LOWP=lowp,
            PREC32="tf32x3" if lowp else "ieee", PREC_HIST="tf32x3" if lowp else "ieee", HIST_BF16=hist_split == "bf16x2",
            ABLATE=_ablate, PAGE_LEVELS=levels == "page", HAS_MASK=token_mask is not None,
            PREFETCH_BT=meter if prefetch_bt is None else bool(prefetch_bt), CSR=csr, HAS_REP=has_rep,
            PACK_HIST=pack, PV_F32=pv_f32, PF_AHEAD=pf_ahead, SKB=skb, WEIGHTED=weighted, HAS_WIN=has_win,
            MAGIC_BF16=lowp and q.dtype == torch.bfloat16 and skb > 0,
            num_warps=num_warps, **extra,
        )

    # a tile that does not fit the GPU's shared memory (OutOfResources at compile time: the fp32
    # dequantized kivi2 tiles with G = 2 at 128 tokens on sm_90, 2026-12-02) is retried at half the
    # tokens, logged once per configuration; the meter's constants below take the tile that ran.
    # A tile the caller chose is not changed.
    auto_tile = pages_arg is None
    fit_key = (str(dev), cache.scheme, meter, tier_b, cache.num_groups, cache.per_token_witness, D, T, BLOCK_H, NB,
               num_stages, num_warps, levels, hist_split, has_rep, token_mask is not None, csr, _ablate, maxnreg, pack, pv_f32,
               pf_ahead, skb, weighted, has_win, q.dtype)
    if auto_tile:
        pages_per_tile = min(pages_per_tile, _TILE_FIT.get(fit_key, pages_per_tile))
    while True:
        try:
            compiled = launch(pages_per_tile)
            break
        except OutOfResources as e:
            if not auto_tile or pages_per_tile <= 1:
                raise
            log.warning("decode: %s (scheme %s, meter %s, G %d, d %d, %d-token tiles): retrying at %d-token tiles",
                        e, cache.scheme, meter, cache.num_groups, D, pages_per_tile * T, pages_per_tile * T // 2)
            pages_per_tile //= 2
            _TILE_FIT[fit_key] = pages_per_tile  # later calls of this configuration start there
    consts = MergeConstants(
        D=D, T=T, PAGES=pages_per_tile, NB=NB, KA=KA, sm=sm, tier_b=tier_b,
        delta_step=delta_step, gamma=dot_gamma(D, split3=dequantized_fp32(cache.scheme)),
        dither_u=abs(sm) * 2.0**-19 if cache.scheme == "int8_dither" and lowp else 0.0,
        eta=mass_eta_terms(pages_per_tile * T, hist_split, packed=pack and hist_split == "bf16x2"),
        out_rel0=2.0**-8 if lowp else 0.0,
        weights=cache.weights if weighted else None, gq=GQ,
        ring_tiles=-(-window.columns // (pages_per_tile * T)) if has_win else 0,
    )
    if dev.type != "cuda" and MERGE_OFF_GPU == "torch":
        # the interpreter runs the fused merge at ~0.1 s per row: off the GPU its torch twin (the
        # same function, pinned to the kernel by test_fused_merge_matches_torch_merge) serves
        # instead; the conformance suites set MERGE_OFF_GPU = "kernel" and run the kernel itself
        if not _LOGGED.get("merge"):
            log.info("decode off the GPU: the merge / meter epilogue runs as kernels.epilogue.merge_torch")
            _LOGGED["merge"] = True
        with_rec = meter and epilogue
        o, lse, rec = merge_torch(m_out, l_out, acc_out, hist if with_rec else None, stat if with_rec else None, q, sl,
                                  consts)
    else:
        o, lse, rec = merge(m_out, l_out, acc_out, hist if meter else None, stat if meter else None, q, sl, consts,
                            epilogue=meter and epilogue, tilt_above=tilt_above)
    # a row without any attended token (an empty CSR row, seq_len 0, a fully masked row): what the
    # reference gives (witcert.meter.softmax: p̂ = 0, so output 0, TV⁺ and error bound 0, no flag),
    # not the merge's 0/0 = NaN (issue 36); no host sync; only with SGLang's CSR rows or a token_mask
    # (the block-table path needs seq_lens >= 1: checked when ``validate``)
    if csr or token_mask is not None:
        if csr:
            live = (kv_indptr[1 : Bsz + 1] - kv_indptr[:Bsz]).to(dev) > 0
        else:
            live = sl > 0
            if token_mask is not None:
                j = torch.arange(token_mask.shape[1], device=dev)
                live = live & (token_mask.to(dev) & (j[None] < sl[:, None].long())).any(-1)
        dead = ~live
        o = o.masked_fill(dead.view(Bsz, *([1] * (o.dim() - 1))), 0.0)
        for f in ("tv_upper_a", "tv_upper_b", "out_err_upper", "out_err_upper_b", "flag") if rec is not None else ():
            t = getattr(rec, f, None)
            if t is not None:
                t.masked_fill_(dead.view(Bsz, *([1] * (t.dim() - 1))), False if t.dtype == torch.bool else 0.0)
    return DecodeOutput(o=o, lse=lse, meter=rec, compiled=compiled, tile=tile)
