"""A decode program's frame (``@triton.jit`` helpers of ``kernels.decode_kernel._decode_kernel``, inlined by
Triton): its share of the sequence's pages, its query columns, the exact window's ring pass and the partial-result
stores that the merge reads."""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_steps import _softmax_step
from .excess_grid import _grid_tile
from .interpret import f32


@triton.jit
def _split_pages(BT, SL, b, sp, num_splits, sink, recent, s_btb,
                 T: tl.constexpr, PAGES: tl.constexpr, CSR: tl.constexpr, HAS_WIN: tl.constexpr):
    """Sequence ``b``'s block-table row, its length and split ``sp``'s pages [p_start, p_end); ``ring_here``: this
    split runs the exact window's ring pass (HAS_WIN; else an unused alias)."""
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
        ring_here = p_end
    return BT, seq_len, p_start, p_end, ring_here


@triton.jit
def _query_columns(Q, b, kvh, s_qb, s_qh, GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
                   PACK_HIST: tl.constexpr, LOWP: tl.constexpr):
    """The program's head columns (``heads_i``, their mask and global heads, ``hcol``: the query head a column
    serves), the channels ``d`` and qᵀ [D, H] (in q's dtype under LOWP) and its fp32 copy."""
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
    q32T = f32(qT)
    if not LOWP:  # on the GPU q keeps its bf16/fp16 dtype (the wrapper guarantees one)
        qT = q32T
    return heads_i, hmask, heads, hcol, d, qT, q32T


@triton.jit
def _key_f16_query(q32T, KEY_F16: tl.constexpr):
    """KEY_F16 (fp8 codes, a bf16 query): qᵀ scaled per head column by 2^e_h into fp16, the column's largest |q| to
    [2^14, 2^15) (an all-zero column: e_h 0; the scale clamped to 2^±126), 2^-e_h per column, and ``ok16``: every
    column's e_h is in [−96, 93] and its fp16 query times 2^-e_h is its query again (exact: the products q16·2^-e_h are
    normal there). Then the tensor core's products are the bf16 dot's times 2^e_h and × 2^-e_h is exact: the same
    logits. e_h ≤ 93 keeps every nonzero sum of such products (multiples of 2^(−33−e_h)) normal, e_h ≥ −96 every sum of
    D ≤ 256 products below 2^128, as the bf16 dot's (an adversarial review, 2026-12-07: a check against the fp32 scaled
    query passed entries that underflowed to 0 in it, q = [2^64, 2^-101]). Where ``ok16`` is false a metered program
    counts its rows non-finite (``_decode_kernel``); a meter-off call's logits are then within
    max(2^-39·max|q|, 2^-151)·Σ|k| of the bf16 dot's exact products (no bound is claimed there). Without KEY_F16:
    unused aliases."""
    if KEY_F16:
        amax = tl.max(tl.abs(q32T), axis=0)  # [H]
        eb = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # the biased exponent of the largest entry
        e = tl.where(amax > 0, 141 - eb, 0)  # 2^(eb − 127 + e) = 2^14
        ec = tl.minimum(tl.maximum(e, -126), 126)  # (2^±ec normal)
        pw = ((ec + 127) << 23).to(tl.float32, bitcast=True)
        kinv = ((127 - ec) << 23).to(tl.float32, bitcast=True)
        q16T = (q32T * pw[None, :]).to(tl.float16)
        good = (q16T.to(tl.float32) * kinv[None, :] == q32T) & ((e >= -96) & (e <= 93))[None, :]
        ok16 = tl.min(good.to(tl.int32)) > 0
    else:
        q16T = q32T
        kinv = q32T
        ok16 = False
    return q16T, kinv, ok16


@triton.jit
def _exact_window(Q, TM, WK, WV, WKN, WVN, m, l, accT, histT, numax, kapmax, bad, exA, exB, grd, ring_here,
                  b, kvh, seq_len, sink, recent, n_idx, d, col, heads_i, qT, q32T, sm_scale, s_tmb, s_wnb, s_wnh,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, K: tl.constexpr, METER: tl.constexpr,
                  TIER_B: tl.constexpr, HAS_MASK: tl.constexpr, LOWP: tl.constexpr, PV_F32: tl.constexpr,
                  PACK_HIST: tl.constexpr, PREC32: tl.constexpr, EXC: tl.constexpr = False,
                  GRD: tl.constexpr = False, GRID_ONE: tl.constexpr = False):
    """The exact window (paged.ExactWindow): the first `sink` and the last `recent` tokens, skipped by the paged
    loop, served from the ring by the split that owns its virtual pages: exact K / V (scale 1, no dither), radius 0
    (bin 0), φ = 0, ν / κ from the ring's norms; its tokens add 0 to the excess sums (a box of radius 0 around 0),
    which are only rescaled (EXC), and to the grid block (GRD) their a = b = 1 terms (``excess_grid._grid_tile``).
    Returns the updated running state."""
    HALF: tl.constexpr = BLOCK_H // 2
    KA: tl.constexpr = K + 2
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
                sT = tl.dot(f32(wk), q32T) * sm_scale
            sT = tl.where(wok[:, None], sT, float("-inf"))
            m_new, alpha, pT, l = _softmax_step(m, l, sT)
            if EXC:
                exA = exA * alpha
                exB = exB * alpha
                if GRD:  # a box of radius 0 around 0: a = b = 1 (their (λ − 1)₊ terms; M', V add 0)
                    one = tl.full([BLOCK_N, BLOCK_H], 1.0, tl.float32)
                    grd = _grid_tile(pT, one, one, alpha, grd, GRID_ONE)
            if LOWP and not PV_F32:
                accT = accT * alpha[None, :] + tl.dot(wvT.to(tl.bfloat16), pT.to(tl.bfloat16))
            else:
                accT = accT * alpha[None, :] + tl.dot(f32(wvT), pT, input_precision=PREC32)
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
    return m, l, accT, histT, numax, kapmax, bad, exA, exB, grd


@triton.jit
def _store_partials(M_OUT, L_OUT, ACC_OUT, HIST_OUT, STAT_OUT, m, l, accT, histT,
                    wcol, smax, phimax, numax, bad, kapmax, b, kvh, sp, heads, hmask, d, col, Hq, num_splits,
                    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, NB: tl.constexpr,
                    METER: tl.constexpr, PACK_HIST: tl.constexpr, EVICT: tl.constexpr = ""):
    """The split's partial results for the merge: running max, sum and accumulator per head, and with the meter its
    histogram (the packed one's hi and lo columns summed) and the six statistics (max radius: ``wcol`` [H], each
    head's; max s, max φ, max ν, the non-finite count, max κ). EVICT: the stores' L2 eviction hint
    (``kernels.plan.PARTIALS_EVICT``)."""
    HALF: tl.constexpr = BLOCK_H // 2
    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask, eviction_policy=EVICT)
    tl.store(L_OUT + o_idx, l, mask=hmask, eviction_policy=EVICT)
    tl.store(ACC_OUT + o_idx[None, :] * D + d[:, None], accT, mask=hmask[None, :], eviction_policy=EVICT)
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
                     mask=(hh < GQ)[None, :], eviction_policy=EVICT)
        else:
            tl.store(HIST_OUT + o_idx[None, :] * NB + col[:, None], histT, mask=hmask[None, :], eviction_policy=EVICT)
        st = STAT_OUT + o_idx * 6
        zero = tl.zeros([BLOCK_H], tl.float32)
        tl.store(st + 0, wcol, mask=hmask, eviction_policy=EVICT)
        tl.store(st + 1, zero + tl.max(smax, axis=0), mask=hmask, eviction_policy=EVICT)
        tl.store(st + 2, zero + tl.max(phimax, axis=0), mask=hmask, eviction_policy=EVICT)
        tl.store(st + 3, zero + tl.max(numax, axis=0), mask=hmask, eviction_policy=EVICT)
        tl.store(st + 4, zero + tl.sum(bad, axis=0), mask=hmask, eviction_policy=EVICT)
        tl.store(st + 5, zero + tl.max(kapmax, axis=0), mask=hmask, eviction_policy=EVICT)
