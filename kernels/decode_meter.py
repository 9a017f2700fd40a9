"""The decode kernel's meter (``@triton.jit`` helpers of ``kernels.decode_kernel._decode_kernel``, inlined by
Triton): the key sketch's query factors, each token's key-side radius (group witnesses, or the sketch radius with
the channel weights), the value-side witnesses with the repair overlay and the non-finite count, and a tile's
histogram masses per level."""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_steps import SKETCH_COLD_MASS, _key_level, _sketch_bf16
from .excess_grid import _grid_tile
from .ids import INT4_GROUP_ID, INT8_DITHER_ID, INT8_ID, KIVI2_ID
from .interpret import f32
from .write import sketch_beta, sketch_value


@triton.jit
def _sketch_query(Q, WGT, b, kvh, hmask, hcol, d, q32T, sm_scale, s_qb, s_qh, GQ: tl.constexpr, D: tl.constexpr,
                  SCHEME: tl.constexpr, SKETCH: tl.constexpr, SKB: tl.constexpr, WEIGHTED: tl.constexpr):
    """The sketch radius's per-program query factors: Σ_i q_hi, 1 / c_h, the int8 family's chunks of q (qk0 … qk3)
    and ‖1/a‖. Where a factor is not used (no SKETCH, another scheme, a short sketch) it is an unused alias."""
    q_sum = q32T
    inv_c = q32T
    qk0 = q32T
    qk1 = q32T
    qk2 = q32T
    qk3 = q32T
    inv_a_norm = q32T
    chu = q32T
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
        chu = c_h * (1.0 + 2.0**-20)  # ≥ the exact c_h (a few fp32 roundings): the excess sums' in-tile radius
        q_sum = tl.sum(q32T, axis=0)  # Σ_i q_hi (the magic-number sketch dot's offset)
        # 1 / c_h for the ratio |d_hj| / c_h: 0 on padding columns; +inf where c_h underflowed to 0 (a nonzero d then
        # gives an infinite radius: saturated, flagged; d = 0 there gives NaN, also flagged). A column serving a
        # head (hcol < GQ: with PACK_HIST the upper columns repeat the lower ones' heads) takes its head's factor,
        # so per-head levels (HEAD_LEVELS) bin the lo column of a packed head at its head's level
        serves = hcol < GQ
        inv_c = tl.where(serves & (c_h > 0), 1.0 / c_h, tl.where(serves & (qam > 0), float("inf"), 0.0))
        if SKB > 0 and (SCHEME == INT8_ID or SCHEME == INT8_DITHER_ID):
            # the sketch's chunks of q (chunk k: channels k·D/c …, contract.sketch), loaded once: two-bit codes
            CPB0: tl.constexpr = 8 // SKB
            DB0: tl.constexpr = D // CPB0
            # a chunk's rows padded to the dot's K ≥ 16 (d 64 with a one-bit sketch: 8 channels a chunk), the padding
            # rows of q 0: they add exact zeros to the dot (``_sketch_ratio_int8``)
            DBP0: tl.constexpr = ((DB0 + 15) // 16) * 16
            qi = tl.arange(0, DBP0)
            qrow = Q + b * s_qb + (kvh * GQ + hcol)[None, :] * s_qh + qi[:, None]
            qmask = (hcol < GQ)[None, :] & (qi < DB0)[:, None]
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
    return q_sum, inv_c, qk0, qk1, qk2, qk3, inv_a_norm, chu


@triton.jit
def _sketch_ratio_int8(Q, byt, dbi, pT, l, ks, hmask, hcol, b, kvh, s_qb, s_qh, q_sum, inv_c, qk0, qk1, qk2, qk3,
                       inv_a_norm, sm_scale, GQ: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_H: tl.constexpr, SKB: tl.constexpr, MAGIC_BF16: tl.constexpr,
                       HEAD_LEVELS: tl.constexpr):
    """The int8 family's sketch term u_j = max_h |σ⟨q_h, r̃_j⟩| / c_h of a tile from its packed bytes ``byt``
    (β = s/2 per token: the levels dotted against q, then scaled), or for a cold tile the bound
    (s_j/2)(L − 1)/L·‖1/a‖. HEAD_LEVELS: each head's own |σ⟨q_h, r̃_j⟩| / c_h, [N, H] (a cold tile's bound on
    every column)."""
    LV: tl.constexpr = 1 << SKB
    CPB: tl.constexpr = 8 // SKB
    DB: tl.constexpr = D // CPB
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
                             mask=(hcol < GQ)[None, :] & (dbi < DB)[:, None], other=0.0)  # [D/c (padded), H]
            if MAGIC_BF16:
                dT += tl.dot(_sketch_bf16(byt16, 3 - SKB * kq, SKB), qk)
            else:
                code = (byt.to(tl.int32) >> (SKB * kq)) & (LV - 1)
                dT += tl.dot(sketch_value(code.to(tl.float32), LV), f32(qk))  # (f32: a bf16 q as stored)
        if MAGIC_BF16:
            dT = 2.0 * dT - ((31.0 + LV) * q_sum)[None, :]
        dT = dT * (ks * (0.5 / LV))[:, None]
        cT = dT * sm_scale  # the centre σ⟨q_h, r̃_j⟩ (signed: δ = served − exact logit, bounds.sketch_center)
        dT = tl.abs(dT) * tl.abs(sm_scale)
        ratio = dT * inv_c[None, :]  # (INFL covers the reciprocal's rounding)
        ratio = tl.where(ratio == ratio, ratio, float("inf"))  # 0·inf: saturate
        if HEAD_LEVELS:
            u_tok = ratio
        else:
            u_tok = tl.max(ratio, axis=1)
    else:
        u_tok = ks * ((0.5 * (LV - 1) / LV) * inv_a_norm)
        cT = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
        if HEAD_LEVELS:
            u_tok = u_tok[:, None] + tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
    return u_tok, cT, hot


@triton.jit
def _sketch_radius(Q, KW, SK, wbase, blk, kvh, off, valid, pT, l, ks, kq, ksc, hmask, hcol, d, b, s_qb, s_qh,
                   s_skb, s_skh, s_skt, q32T, q_sum, inv_c, qk0, qk1, qk2, qk3, inv_a_norm, sm_scale,
                   INFL: tl.constexpr, GQ: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_H: tl.constexpr, SCHEME: tl.constexpr, SKB: tl.constexpr, MAGIC_BF16: tl.constexpr,
                   PREC32: tl.constexpr, HEAD_LEVELS: tl.constexpr):
    """Returns (U, W_j, the signed centre c̃ [N, H] (0 on a cold tile and off ``valid``), whether the dot ran (hot)).
    The sketch radius (contract.sketch): U_j = W_j + max_h |σ⟨q_h, r̃_j⟩| / c_h, the token part of
    ε_hj = c_h·U_j; r̃_j = β·(2·code + 1 − L)/L from the packed codes and the scheme's β (``kq``: K̂ for the group
    schemes, the codes for fp8; ``ksc``: the group schemes' key scales). Inflated by INFL, 0 off ``valid``.
    HEAD_LEVELS: U_hj = W_j + |σ⟨q_h, r̃_j⟩| / c_h per head column, [N, H] (ε_hj = c_h·U_hj, Lean
    ``sketch_logit_error_le``); with no sketch bits (weights only) the same U_j on every column."""
    wn = tl.load(KW + wbase, mask=valid, other=0.0).to(tl.float32)
    if SKB > 0:
        LV: tl.constexpr = 1 << SKB
        CPB: tl.constexpr = 8 // SKB
        DB: tl.constexpr = D // CPB
        skoff = blk * s_skb + kvh * s_skh + off * s_skt
        # the packed bytes once [N, D/c]; chunk k (bits k·b…) holds channels k·D/c … (contract.sketch). The int8
        # family dots each chunk against q: its width is padded to the dot's K ≥ 16 (d 64 with a one-bit sketch has
        # 8-byte chunks; tl.dot refuses K < 16 on the GPU, the interpreter does not), the padding bytes 0 and their
        # rows of q 0, so they add exact zeros
        DBP: tl.constexpr = ((DB + 15) // 16) * 16
        dbi = tl.arange(0, DBP)
        byt = tl.load(SK + skoff[:, None] + dbi[None, :], mask=valid[:, None] & (dbi < DB)[None, :], other=0)
        if SCHEME == INT8_ID or SCHEME == INT8_DITHER_ID:
            u_tok, cT, hot = _sketch_ratio_int8(Q, byt, dbi, pT, l, ks, hmask, hcol, b, kvh, s_qb, s_qh, q_sum,
                                                inv_c, qk0, qk1, qk2, qk3, inv_a_norm, sm_scale, GQ, D, BLOCK_N,
                                                BLOCK_H, SKB, MAGIC_BF16, HEAD_LEVELS)
        else:
            shift = (SKB * (d // DB))[None, :]
            skc = ((tl.load(SK + skoff[:, None] + (d % DB)[None, :], mask=valid[:, None], other=0).to(tl.int32)
                    >> shift) & (LV - 1)).to(tl.float32)
            lev = sketch_value(skc, LV)  # [N, D] odd integers
            if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:
                beta = sketch_beta(kq, kq, ksc, SCHEME)
            else:  # fp8: half a spacing of x̂ = s·code (the write path's β, bit for bit)
                xh8 = ks[:, None] * kq.to(tl.float32)
                beta = sketch_beta(xh8, ks[:, None], xh8, SCHEME)
            dT = tl.dot(beta * lev * (1.0 / LV), q32T, input_precision=PREC32)
            cT = dT * sm_scale  # the signed centre (every tile: these schemes have no cold skip)
            hot = True
            dT = tl.abs(dT) * tl.abs(sm_scale)
            ratio = dT * inv_c[None, :]
            ratio = tl.where(ratio == ratio, ratio, float("inf"))
            if HEAD_LEVELS:
                u_tok = ratio
            else:
                u_tok = tl.max(ratio, axis=1)
        if HEAD_LEVELS:
            out = tl.where(valid[:, None], (wn[:, None] + u_tok) * INFL, 0.0)
        else:
            out = tl.where(valid, (wn + u_tok) * INFL, 0.0)
    else:
        cT = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
        hot = False
        if HEAD_LEVELS:
            out = tl.where(valid[:, None], wn[:, None] * INFL, 0.0) + tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
        else:
            out = tl.where(valid, wn * INFL, 0.0)
    return out, tl.where(valid, wn, 0.0), tl.where(valid[:, None], cT, 0.0), hot


@triton.jit
def _excess_tile(wn, wraw, cT, hot, pT, chu, rep, alpha, exA, exB, grd, INFL: tl.constexpr, HL: tl.constexpr,
                 HAS_REP: tl.constexpr, GRD: tl.constexpr = False, GRID_ONE: tl.constexpr = False):
    """The two excess sums of the centred box (bench/TIGHTNESS.md, "The centred box unbinned"): with η = −δ in
    [−c − ε, −c + ε] per (token, head), A += Σ_j p̃_j (e^{−c+ε} − 1)₊ and B += Σ_j p̃_j (1 − e^{−c−ε})₊, rescaled by
    α as the histogram is (the merge turns them into TV(p, p̂) ≤ e^{2Ξ} max(A, B)/L, ``merge_terms._excess_form``). A
    hot tile's box is
    centred at the sketch dot c̃ with ε = c_h W_j·INFL + 2^-20 |c̃| (W_j carries the dot's rounding), a cold tile's
    (no dot) is the symmetric radius c_h·U_j around 0, a repaired token's is 0; μ = 2^-19 (1 + |c| + ε) covers the
    exp's and the exponent's rounding. GRD: the same box's grid block ``grd`` (``excess_grid._grid_tile``) too, its
    sums in one reduction with GRID_ONE."""
    if HL:
        sym = wn * chu[None, :]
    else:
        sym = wn[:, None] * chu[None, :]
    if hot:
        eps = (wraw * INFL)[:, None] * chu[None, :] + 2.0**-20 * tl.abs(cT) + 2.0**-100
        c = cT
    else:
        eps = sym
        c = cT * 0.0
    if HAS_REP:
        eps = tl.where(rep[:, None], 0.0, eps)
        c = tl.where(rep[:, None], 0.0, c)
    eps = tl.maximum(eps, 0.0)  # (a negative witness, a corrupt cache: the box of radius 0, as the histogram's level 0)
    mu = 2.0**-19 * (1.0 + tl.abs(c) + eps)
    ea = tl.exp(eps - c + mu)  # a ≥ e^{−c+ε}
    eb = tl.exp(-c - eps - mu)  # b ≤ e^{−c−ε}
    ap = ea - 1.0
    bp = 1.0 - eb
    # a NaN term (ε = 0·inf) counts as +inf, never 0 (the GPU's max drops a NaN operand): the sum is then
    # infinite and the merge's form 1 (``merge_terms._excess_form``)
    ap = tl.where(ap == ap, tl.maximum(ap, 0.0), float("inf"))
    bp = tl.where(bp == bp, tl.maximum(bp, 0.0), float("inf"))
    exA = exA * alpha + tl.sum(pT * ap, axis=0)
    exB = exB * alpha + tl.sum(pT * bp, axis=0)
    if GRD:
        grd = _grid_tile(pT, ea, eb, alpha, grd, GRID_ONE)
    return exA, exB, grd


@triton.jit
def _group_radius(KW, wbase, valid, INFL: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr):
    """‖W_j‖₂ over the G group witnesses of each token, inflated by INFL (0 off ``valid``)."""
    if G == 1:  # ‖W_j‖₂ is the witness itself: no square, no second load
        wn = tl.where(valid, tl.load(KW + wbase, mask=valid, other=0.0).to(tl.float32) * INFL, 0.0)
    else:
        # ‖W_j‖₂ scaled by the largest group witness: squares of tiny fp32 (per-block)
        # witnesses would underflow to a zero radius; ≥ that largest witness, never 0
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
    return wn


@triton.jit
def _value_witnesses(VW, VN, KN, RVN, RKN, wn, vwoff, noff, valid, rep, rnbase, bad, HAS_REP: tl.constexpr):
    """Each token's φ, ν and κ (a repaired token: radius 0, φ = 0, ν / κ its exact norms) and the non-finite count
    ``bad`` raised by the tokens whose radius or witnesses are NaN / inf. ``noff``: ν / κ's offsets (per token, or
    the page's running max: ``_norm_offsets``). Returns (wn, φ, ν, κ, bad)."""
    phi = tl.load(VW + vwoff, mask=valid, other=0.0).to(tl.float32)
    nu = tl.load(VN + noff, mask=valid, other=0.0).to(tl.float32)
    kap = tl.load(KN + noff, mask=valid, other=0.0).to(tl.float32)
    if HAS_REP:  # a repaired token is exact: radius 0, φ = 0, ν / κ ≥ its exact norms (rounded up)
        wn = tl.where(rep, 0.0, wn)
        phi = tl.where(rep, 0.0, phi)
        nu = tl.where(rep, tl.load(RVN + rnbase, mask=rep, other=0.0).to(tl.float32), nu)
        kap = tl.where(rep, tl.load(RKN + rnbase, mask=rep, other=0.0).to(tl.float32), kap)
    # non-finite radii / witnesses; a NaN logit makes l non-finite, flagged after the merge
    nf = (wn != wn) | (wn == float("inf")) | (phi != phi) | (phi == float("inf")) | (nu != nu) | (nu == float("inf")) \
        | (kap != kap) | (kap == float("inf"))
    bad += nf.to(tl.float32)
    return wn, phi, nu, kap, bad


@triton.jit
def _histogram_tile(wn, ks_lvl, pT, phi, col, heads_i, hcol, X0: tl.constexpr, K: tl.constexpr, NB: tl.constexpr,
                    PAGES: tl.constexpr, T: tl.constexpr, BLOCK_H: tl.constexpr, TIER_B: tl.constexpr,
                    PAGE_LEVELS: tl.constexpr, HIST_BF16: tl.constexpr, PACK_HIST: tl.constexpr,
                    PREC_HIST: tl.constexpr, GQ: tl.constexpr, HEAD_LEVELS: tl.constexpr):
    """A tile's histogram masses hdᵀ [NB, H]: Σ p̂ per key level (and per Tier B level of the scale), the last row
    Σ p̂ φ. HEAD_LEVELS: ``wn`` is [N, H], each head column binned at its own level (``_histogram_tile_heads``)."""
    if HEAD_LEVELS:
        hdT = _histogram_tile_heads(wn, ks_lvl, pT, phi, col, heads_i, hcol, X0, K, NB, PAGES, T, BLOCK_H, TIER_B,
                                    PAGE_LEVELS, HIST_BF16, PACK_HIST, PREC_HIST, GQ)
    else:
        hdT = _histogram_tile_shared(wn, ks_lvl, pT, phi, col, heads_i, X0, K, NB, PAGES, T, BLOCK_H, TIER_B,
                                     PAGE_LEVELS, HIST_BF16, PACK_HIST, PREC_HIST)
    return hdT


@triton.jit
def _histogram_tile_shared(wn, ks_lvl, pT, phi, col, heads_i, X0: tl.constexpr, K: tl.constexpr, NB: tl.constexpr,
                           PAGES: tl.constexpr, T: tl.constexpr, BLOCK_H: tl.constexpr, TIER_B: tl.constexpr,
                           PAGE_LEVELS: tl.constexpr, HIST_BF16: tl.constexpr, PACK_HIST: tl.constexpr,
                           PREC_HIST: tl.constexpr):
    """``_histogram_tile`` with one key level per token (``wn`` [N]), shared by the heads."""
    KA: tl.constexpr = K + 2  # bins per tier: 0 (zero radius), 1..K, K+1 (overflow)
    HALF: tl.constexpr = BLOCK_H // 2
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
    else:
        onehotT = col[:, None] == la[None, :]  # [NB, N]
        if TIER_B:
            onehotT = onehotT | (col[:, None] == (_key_level(ks_lvl, X0, K) + KA)[None, :])
        # the last row carries φ_j, so the same dot also accumulates Σ p̂ φ
        if HIST_BF16:
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
    return hdT


@triton.jit
def _histogram_tile_heads(wn, ks_lvl, pT, phi, col, heads_i, hcol, X0: tl.constexpr, K: tl.constexpr,
                          NB: tl.constexpr, PAGES: tl.constexpr, T: tl.constexpr, BLOCK_H: tl.constexpr,
                          TIER_B: tl.constexpr, PAGE_LEVELS: tl.constexpr, HIST_BF16: tl.constexpr,
                          PACK_HIST: tl.constexpr, PREC_HIST: tl.constexpr, GQ: tl.constexpr):
    """``_histogram_tile`` with one key level per (token, head column): ``wn`` [N, H] (HEAD_LEVELS). Token levels:
    one one-hot dot per query head g (its [NB, N] one-hot against p̂ masked to the columns serving g: with
    PACK_HIST its hi and lo columns), summed; the last row carries φ_j in every dot, so each column still gets its
    own Σ p̂ φ. Page levels: each column's page maximum, a [NB, PAGES, H] one-hot (no dot). The Tier B bins are
    the scale's, shared by the heads."""
    KA: tl.constexpr = K + 2
    HALF: tl.constexpr = BLOCK_H // 2
    la = _key_level(wn, X0, K)  # [N, H]
    if PAGE_LEVELS:
        lpg = tl.max(tl.reshape(la, [PAGES, T, BLOCK_H]), axis=1)  # [PAGES, H]: each column's page level
        oh = col[:, None, None] == lpg[None, :, :]  # [NB, PAGES, H]
        if TIER_B:
            lb = tl.max(tl.reshape(_key_level(ks_lvl, X0, K), [PAGES, T]), axis=1) + KA
            oh = oh | (col[:, None, None] == lb[None, :, None])
        psumT = tl.sum(tl.reshape(pT, [PAGES, T, BLOCK_H]), axis=1)  # [PAGES, H]
        hdT = tl.sum(oh.to(tl.float32) * psumT[None, :, :], axis=1)  # [NB, H]
        hdT = tl.where(col[:, None] == NB - 1, tl.sum(pT * phi[:, None], axis=0)[None, :], hdT)
    else:
        if TIER_B:
            lbT = (_key_level(ks_lvl, X0, K) + KA)[None, :]
        if HIST_BF16:
            phi_up = ((phi.to(tl.int32, bitcast=True) + 0xFFFF) & -65536).to(tl.float32, bitcast=True)
            p_hiT = pT.to(tl.bfloat16)
            p_loT = (pT - p_hiT.to(tl.float32)).to(tl.bfloat16)
            if PACK_HIST:
                p_hiT = tl.where(heads_i[None, :] < HALF, p_hiT, p_loT)
        elif PACK_HIST:
            p32T = tl.where(heads_i[None, :] < HALF, pT, 0.0)
        else:
            p32T = pT
        hdT = tl.zeros([NB, BLOCK_H], tl.float32)
        for g in tl.static_range(GQ):
            mine = hcol[None, :] == g  # [1, H]: the columns serving head g (equal levels there)
            la_g = tl.max(tl.where(mine, la, -1), axis=1)  # [N]
            oh_g = col[:, None] == la_g[None, :]  # [NB, N]
            if TIER_B:
                oh_g = oh_g | (col[:, None] == lbT)
            if HIST_BF16:
                ohb = tl.where(col[:, None] == NB - 1, phi_up[None, :], oh_g.to(tl.float32)).to(tl.bfloat16)
                hdT = tl.dot(ohb, tl.where(mine, p_hiT, 0.0).to(tl.bfloat16), acc=hdT)
                if not PACK_HIST:
                    hdT = tl.dot(ohb, tl.where(mine, p_loT, 0.0).to(tl.bfloat16), acc=hdT)
            else:
                ohT = tl.where(col[:, None] == NB - 1, phi[None, :], oh_g.to(tl.float32))
                hdT += tl.dot(ohT, tl.where(mine, p32T, 0.0), input_precision=PREC_HIST)
    return hdT
