"""One tile of the decode's paged loop, its attention side (``@triton.jit`` helpers of
``kernels.decode_kernel._decode_kernel``, inlined by Triton): the next tiles' block ids and L2 prefetch, the repair
overlay's slots, and per scheme the codes' loads, dequantization, logits, online-softmax step and PV accumulation."""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_steps import _code_offsets, _norm_offsets, _prefetch_l2, _softmax_step, _witness_offsets
from .ids import FP8_E5M2_ID, INT4_GROUP_ID, INT8_DITHER_ID, NONE_ID
from .interpret import f16, f32
from .write import dither_from_hash, token_hash


@triton.jit
def _prefetch_next_tile(BT, KC, VC, KS, VS, KW, VW, VN, KN, bt_next, bt_after, page, p_end, kvh, off,
                        s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb, s_vsh, s_vst, s_wb, s_wh, s_wt, s_vwb, s_vwh,
                        s_nb, s_nh, PAGES: tl.constexpr, METER: tl.constexpr, PER_TOKEN: tl.constexpr,
                        NORMS_PT: tl.constexpr):
    """PF_AHEAD: this tile's block ids (loaded two tiles ahead), the block-id window moved on by a tile, and the next
    tile's code rows, scales and witnesses prefetched into the L2. Returns (blk, bt_next, bt_after)."""
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
        nn = _norm_offsets(nblk, kvh, off, s_nb, s_nh, NORMS_PT)
        _prefetch_l2(VN + nn, nok & (off == 0))
        _prefetch_l2(KN + nn, nok & (off == 0))
    return blk, bt_next, bt_after


@triton.jit
def _repair_slots(RS, blk, kvh, off, valid, s_rsb, T: tl.constexpr, D: tl.constexpr, HAS_REP: tl.constexpr):
    """HAS_REP (repaired pages, the overlay): which tokens are repaired (``rep``) and their offsets in the pool's
    exact K / V [R, T, D] and norms [R, T] (slot RS[blk, kvh], -1: none). Without HAS_REP: unused aliases."""
    if HAS_REP:  # repaired pages (overlay): exact K/V from the pool slot RS[blk, kvh] (-1: none)
        rslot = tl.load(RS + blk * s_rsb + kvh, mask=valid, other=-1)
        rep = valid & (rslot >= 0)
        rbase = tl.where(rep, rslot, 0).to(tl.int64) * (T * D) + off * D  # pool [R, T, D]
        rnbase = tl.where(rep, rslot, 0).to(tl.int64) * T + off  # norms [R, T]
    else:
        rep = valid
        rbase = off
        rnbase = off
    return rep, rbase, rnbase


@triton.jit
def _nonfinite_logits(sT, valid):
    """[N] float32: 1 where an attended token's logit is NaN or −inf for some head column. A finite witness beside a
    non-finite stored key (a ±inf code, zero point or scale: corruption after the write) makes the logit −inf for a
    head whose dot is negative, which drops the token from that head's softmax silently (an adversarial review,
    2026-12-05); counted with the non-finite witnesses, the row saturates."""
    bad = (sT != sT) | (sT == float("-inf"))
    return (valid & (tl.max(bad.to(tl.int32), axis=1) > 0)).to(tl.float32)


@triton.jit
def _group_tile(KC, VC, KS, VS, KZ, VZ, RK, RV, cbase, sbase, vsbase, valid, rep, rbase, d, q32T, m, l, accT,
                sm_scale, D: tl.constexpr, BLOCK_N: tl.constexpr, SCHEME: tl.constexpr, HAS_REP: tl.constexpr,
                PREC32: tl.constexpr):
    """int4_group / kivi2: K̂ = z + s·c and V̂ likewise in fp32 from the packed codes, the logits, the online-softmax
    step and the PV dot. Returns (m_new, α, p̂ᵀ, l, accᵀ, the key scale 1 per token, K̂, the key scales, the tokens
    with a non-finite logit: ``_nonfinite_logits``)."""
    D2: tl.constexpr = D // 2
    D4: tl.constexpr = D // 4
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
        kh = tl.where(rep[:, None], f32(tl.load(RK + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)),
                      kh)
        vh = tl.where(rep[:, None], f32(tl.load(RV + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)),
                      vh)
    ks = tl.full([BLOCK_N], 1.0, tl.float32)
    sT = tl.dot(kh, q32T, input_precision=PREC32) * sm_scale  # [N, H]
    nfk = _nonfinite_logits(sT, valid)
    sT = tl.where(valid[:, None], sT, float("-inf"))
    m_new, alpha, pT, l = _softmax_step(m, l, sT)
    accT = accT * alpha[None, :] + tl.dot(tl.trans(vh), pT, input_precision=PREC32)
    return m_new, alpha, pT, l, accT, ks, kh, ksc, nfk


@triton.jit
def _byte_codes(Q, KC, VC, KS, VS, RK, RV, cbase, sbase, vsbase, valid, rep, rbase, d,
                BLOCK_N: tl.constexpr, SCHEME: tl.constexpr, LOWP: tl.constexpr, PV_F32: tl.constexpr,
                HAS_REP: tl.constexpr, KEY_F16: tl.constexpr = False, EVICT: tl.constexpr = ""):
    """int8 / int8_dither / fp8 / none: the tile's key codes [N, D] and value codes ᵀ [D, N] in the dots' dtypes
    and the per-token key and value scales (1 for none), a repaired token's exact K / V with scale 1. KEY_F16 (fp8
    codes, a bf16 query, no repair: ``_key_f16_query``): the key codes in fp16, one conversion (the bf16 dot's
    codes went fp8 → fp16 → bf16, the second an unpacked conversion per element: sm_90 SASS)."""
    if SCHEME == NONE_ID:
        kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0)  # [N, D]
        vcT = tl.load(VC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0.0)  # [D, N]
    else:
        # 8-bit codes are loaded in the other orientation and transposed before their cast: Triton
        # then moves them into the dots' register layout with 16-byte shared-memory stores / loads
        # instead of one to two bytes per load after the cast (sm_90 SASS, bench/RESULTS.md run J)
        # (EVICT: the L2 eviction hint of these once-a-step reads, ``kernels.plan.KV_EVICT``)
        kc = tl.trans(tl.load(KC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0.0,
                              eviction_policy=EVICT))  # [N, D]
        vcT = tl.trans(tl.load(VC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0,
                               eviction_policy=EVICT))  # [D, N]
    if SCHEME == FP8_E5M2_ID:
        # through fp16 (sm_90: the native cvt.rn.f16x2.e5m2x2), as the write and torch read the codes: Triton's direct
        # e5m2 → bf16 shifts the bits into a bf16 and multiplies by 2^112, which reads an inf / NaN code as a finite
        # ±65536 … 114688 (the H100 run Y1 served one unflagged; the interpreter reads 65536, which fp16 makes inf)
        # (f16: the interpreter's own cast flushes the subnormal codes; ``kernels.interpret``)
        kc = f16(kc)
        vcT = f16(vcT)
    if SCHEME == NONE_ID:
        ks = tl.full([BLOCK_N], 1.0, tl.float32)
        vs = tl.full([BLOCK_N], 1.0, tl.float32)
    else:
        ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
        vs = tl.load(VS + vsbase, mask=valid, other=0.0).to(tl.float32)
    if LOWP:  # K̂ dot in q's dtype (int8 / fp8 codes are exact in bf16 and fp16); PV dot in bf16 or fp32
        if KEY_F16:
            kc = kc.to(tl.float16)
        else:
            kc = kc.to(Q.dtype.element_ty)
        vcT = vcT.to(tl.float32 if PV_F32 else tl.bfloat16)
    else:
        kc = f32(kc)
        vcT = f32(vcT)
    if HAS_REP:
        # a repaired token: its exact K/V (the wrapper checks the pool dtype is q's on the GPU,
        # so the conversion is exact) with scale 1 and no dither
        rk = tl.load(RK + rbase[:, None] + d[None, :], mask=rep[:, None], other=0.0)  # [N, D]
        rvT = tl.load(RV + rbase[None, :] + d[:, None], mask=rep[None, :], other=0.0)  # [D, N]
        if LOWP:
            rk = rk.to(Q.dtype.element_ty)
            rvT = rvT.to(tl.float32 if PV_F32 else tl.bfloat16)
        else:
            rk = f32(rk)
            rvT = f32(rvT)
        kc = tl.where(rep[:, None], rk, kc)
        vcT = tl.where(rep[None, :], rvT, vcT)
        ks = tl.where(rep, 1.0, ks)
        vs = tl.where(rep, 1.0, vs)
    return kc, vcT, ks, vs


@triton.jit
def _byte_tile(Q, KC, VC, KS, VS, RK, RV, cbase, sbase, vsbase, valid, rep, rbase, d, tok, qT, m, l, accT,
               seed, layer, kvh, sm_scale, q16T, kinv, BLOCK_N: tl.constexpr, SCHEME: tl.constexpr,
               LOWP: tl.constexpr, PV_F32: tl.constexpr, HAS_REP: tl.constexpr, PREC32: tl.constexpr,
               KEY_F16: tl.constexpr = False, EVICT: tl.constexpr = ""):
    """int8 / int8_dither / fp8 / none: the logits s·⟨c − u, q⟩·σ, the online-softmax step and the PV dot (the
    dither subtracted in both). Returns (m_new, α, p̂ᵀ, l, accᵀ, the key scales, the key codes (in q's dtype on the
    GPU: fp8 codes are exact in bf16 / fp16) for the sketch's β, the key scales again, the tokens with a non-finite
    key: a NaN / −inf logit for fp8_e5m2 (``_nonfinite_logits``), a non-finite key scale for the others)."""
    kc, vcT, ks, vs = _byte_codes(Q, KC, VC, KS, VS, RK, RV, cbase, sbase, vsbase, valid, rep, rbase, d,
                                  BLOCK_N, SCHEME, LOWP, PV_F32, HAS_REP, KEY_F16, EVICT)
    if KEY_F16:
        # fp16 codes against the query scaled by 2^e_h into fp16 (``_key_f16_query``; where it is not exact the
        # program's rows are counted non-finite): the bf16 dot's exact products scaled by 2^e_h, summed in fp32 as
        # that dot sums them; × 2^-e_h is exact
        qkT = tl.dot(kc, q16T) * kinv[None, :]
    else:
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
    if SCHEME == FP8_E5M2_ID:  # codes that can be ±inf: every logit checked
        nfk = _nonfinite_logits(sT, valid)
    else:  # codes that cannot be ±inf: the key scale per token (a check of every logit would cost SGLang's bf16
        # tile, one program per SM; scheme none's scale is 1)
        nfk = (valid & ((ks != ks) | (ks == float("inf")) | (ks == float("-inf")))).to(tl.float32)
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
    return m_new, alpha, pT, l, accT, ks, kc, ks, nfk
