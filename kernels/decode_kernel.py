"""The decode pass's Triton kernel (``_decode_kernel``): one program per (sequence, kv head, split) over
its share of the paged KV, with the meter in the same pass. What it computes, and its floating point, is
described in ``kernels.decode`` (the launch: ``kernels.decode.decode`` with a ``kernels.plan.DecodePlan``);
its inlined helpers are in ``kernels.decode_steps``."""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_steps import (
    SKETCH_COLD_MASS,
    _code_offsets,
    _key_level,
    _prefetch_l2,
    _sketch_bf16,
    _softmax_step,
    _witness_offsets,
)
from .ids import INT4_GROUP_ID, INT8_DITHER_ID, INT8_ID, KIVI2_ID, NONE_ID
from .write import dither_from_hash, sketch_beta, sketch_value, token_hash


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
    PREC32: tl.constexpr, PREC_HIST: tl.constexpr, HIST_BF16: tl.constexpr, PAGE_LEVELS: tl.constexpr,
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
            histT = histT * alpha[None, :] + hdT
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
