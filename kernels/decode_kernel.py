"""The decode pass's Triton kernel (``_decode_kernel``): one program per (sequence, kv head, split) over
its share of the paged KV, with the meter in the same pass. What it computes, and its floating point, is
described in ``kernels.decode`` (the launch: ``kernels.decode.decode`` with a ``kernels.plan.DecodePlan``);
its inlined helpers are in ``kernels.decode_program`` (the program's pages, query, exact window and stores),
``kernels.decode_tile`` (a tile's codes, logits, softmax and PV), ``kernels.decode_meter`` (radii, witnesses,
histogram) and ``kernels.decode_steps`` (small shared steps)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .decode_meter import _excess_tile, _group_radius, _histogram_tile, _sketch_query, _sketch_radius, _value_witnesses
from .decode_program import _exact_window, _key_f16_query, _query_columns, _split_pages, _store_partials
from .decode_steps import _code_offsets, _norm_offsets, _witness_offsets
from .decode_tile import _byte_tile, _group_tile, _prefetch_next_tile, _repair_slots
from .excess_grid import EXCESS_COLS_C, GRID_COLS_C
from .ids import INT4_GROUP_ID, INT8_DITHER_ID, KIVI2_ID


# seed and layer (int8_dither's dither hash) are not specialized: one binary for every layer of a configuration, the
# one witcert.selftest_decode's canary runs (Triton would otherwise compile layers 1, multiples of 16 and the others apart)
@triton.jit(do_not_specialize=["seed", "layer"])
def _decode_kernel(
    Q, KC, VC, KS, VS, KZ, VZ, KW, VW, VN, KN, BT, SL, TM,
    RS, RK, RV, RKN, RVN,
    SK, WGT, WK, WV, WKN, WVN, UM, UMA,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT, STAT_OUT, EX_OUT,
    seed, layer, sm_scale, num_splits, sink, recent, um_rows,
    s_qb, s_qh,
    s_cb, s_ch, s_ct,
    s_sb, s_sh, s_st,
    s_vsb, s_vsh, s_vst,
    s_wb, s_wh, s_wt,
    s_vwb, s_vwh, s_nb, s_nh,
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
    HEAD_LEVELS: tl.constexpr, HAS_UNMET: tl.constexpr, EXC: tl.constexpr = False, GRD: tl.constexpr = False,
    NORMS_PT: tl.constexpr = True, GDC: tl.constexpr = False, KEY_F16: tl.constexpr = False,
    KV_EVICT: tl.constexpr = "", PARTIALS_EVICT: tl.constexpr = "", GRID_ONE: tl.constexpr = False,
):
    if GDC:  # launched with PDL (kernels.pdl): the previous kernel has completed and its writes are visible after the
        # wait, before any load or store here
        gdc_wait()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    BT, seq_len, p_start, p_end, ring_here = _split_pages(BT, SL, b, sp, num_splits, sink, recent, s_btb,
                                                          T, PAGES, CSR, HAS_WIN)
    # every tile is transposed ("swap AB"): tokens are the MMA's M dimension and the GQ query
    # heads its N, so the large operands (the converted K̂ / V̂ᵀ tiles, the one-hot) are A operands,
    # which Hopper's wgmma reads from registers; only qᵀ (once) and p̂ᵀ (small) pass through
    # shared memory. Measured on the H200: the metered kernel 18-21 % faster (bench/RESULTS.md).
    heads_i, hmask, heads, hcol, d, qT, q32T = _query_columns(Q, b, kvh, s_qb, s_qh, GQ, BLOCK_H, D, PACK_HIST, LOWP)
    tl.static_assert(not (KEY_F16 and HAS_REP), "KEY_F16: a repaired page's exact keys are bf16, not fp16")
    q16T, kinv, ok16 = _key_f16_query(q32T, KEY_F16)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    accT = tl.zeros([D, BLOCK_H], tl.float32)
    SKETCH: tl.constexpr = METER and (SKB > 0 or WEIGHTED)
    q_sum, inv_c, qk0, qk1, qk2, qk3, inv_a_norm, chu = _sketch_query(Q, WGT, b, kvh, hmask, hcol, d, q32T, sm_scale,
                                                                 s_qb, s_qh, GQ, D, SCHEME, SKETCH, SKB, WEIGHTED)
    col = tl.arange(0, NB)
    histT = tl.zeros([NB, BLOCK_H], tl.float32)
    # EXC (with the sketch): the excess sums of the centred box (``_excess_tile``), per head column
    exA = tl.zeros([BLOCK_H], tl.float32)
    exB = tl.zeros([BLOCK_H], tl.float32)
    # GRD (with EXC): the same boxes' small (t, λ) grid block (``excess_grid``), [H, GRID_COLS]
    grd = tl.zeros([BLOCK_H, GRID_COLS_C], tl.float32)
    BLOCK_N: tl.constexpr = PAGES * T
    # running maxima / counts per token lane, reduced once after the loop (not per tile)
    wmax = tl.zeros([BLOCK_N], tl.float32)
    # HEAD_LEVELS (one key level per (token, head): the per-head sketch radius, contract.sketch): each head's max
    HL: tl.constexpr = HEAD_LEVELS and SKETCH
    wmaxh = tl.zeros([BLOCK_H], tl.float32)
    smax = tl.zeros([BLOCK_N], tl.float32)
    phimax = tl.zeros([BLOCK_N], tl.float32)
    numax = tl.zeros([BLOCK_N], tl.float32)
    kapmax = tl.zeros([BLOCK_N], tl.float32)
    bad = tl.zeros([BLOCK_N], tl.float32)
    if KEY_F16 and METER:  # a query not exact in fp16 at its column's scale: the program's rows are not metered
        bad += tl.where(ok16, 0.0, 1.0)
    if HAS_UNMET:  # the caller's "every slot unmetered" flag (UMA [1] uint8): counted once per lane of every program
        bad += tl.load(UMA).to(tl.float32)
        um_prev = tl.zeros([PAGES * T], tl.uint8)  # the previous tile's marks and outside slots (counted a tile late)
        out_prev = tl.zeros([PAGES * T], tl.int1)

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
        if PF_AHEAD:  # the next tile's lines prefetched into the L2 (its block ids two tiles ahead)
            blk, bt_next, bt_after = _prefetch_next_tile(BT, KC, VC, KS, VS, KW, VW, VN, KN, bt_next, bt_after, page,
                                                         p_end, kvh, off, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb,
                                                         s_vsh, s_vst, s_wb, s_wh, s_wt, s_vwb, s_vwh, s_nb, s_nh,
                                                         PAGES, METER, PER_TOKEN, NORMS_PT)
        elif PREFETCH_BT:
            blk = bt_next.to(tl.int64)
            pn = page + PAGES
            bt_next = tl.load(BT + pn, mask=pn < p_end, other=0)
        else:
            blk = tl.load(BT + page, mask=pvalid, other=0).to(tl.int64)
        if HAS_UNMET:  # (CSR: blk is the token's slot, an int32) a slot marked unmetered (UM [um_rows] uint8), or one
            # outside the pool [0, um_rows) (no witness there), is counted as non-finite, so the merge saturates the
            # row's record. An outside slot reads slot um_rows − 1 instead (never out of bounds): one unsigned 32-bit
            # min per lane, the slot zero-extended. The marks are counted one tile after their load (after the loop
            # for the last tile), so the loop never waits for the byte gather. Measured on SGLang's bf16 tile (two
            # stages, one program per SM) at B 8 / 32K, each of these cost more (bench/SGLANG.md): masking the slot
            # out of the loads (the pipeliner dropped their pipelining: +7 %, run W); a select on the int64 slot
            # (Triton 3.6.0: +212 loop instructions, +19 %, run X2); the count as a pass after the loop (its
            # latency: +9 %, run X5); the marks used in the tile that loads them (+11 %, run X6). This form: ±1 % (X7)
            raw = blk
            # ((um_rows − 1) + a zero tensor: Triton specialises an int argument equal to 1 into a constexpr, on which
            # .to() fails: a one-slot pool would not compile, review 2026-12-05)
            last = ((um_rows - 1) + tl.zeros([], tl.int32)).to(tl.uint32)
            blk = tl.minimum(blk.to(tl.int32).to(tl.uint32), last).to(tl.int64)
            bad += ((um_prev != 0) | out_prev).to(tl.float32)
            um_prev = tl.load(UM + blk, mask=valid, other=0)
            out_prev = valid & (raw != blk)
        cbase, sbase, vsbase = _code_offsets(blk, kvh, off, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_vsb, s_vsh, s_vst)
        rep, rbase, rnbase = _repair_slots(RS, blk, kvh, off, valid, s_rsb, T, D, HAS_REP)
        if HAS_WIN:  # the exact window's tokens (the first `sink`, the last `recent`) are served by the ring pass below
            valid = valid & ~((tok < sink) | (tok >= seq_len - recent))
        # kq: K̂ (group schemes) or the key codes (8-bit schemes), ksc: the group schemes' key scales (the sketch's β)
        if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:  # z + s·c in fp32
            m_new, alpha, pT, l, accT, ks, kq, ksc, nfk = _group_tile(KC, VC, KS, VS, KZ, VZ, RK, RV, cbase, sbase, vsbase,
                                                                 valid, rep, rbase, d, q32T, m, l, accT, sm_scale,
                                                                 D, BLOCK_N, SCHEME, HAS_REP, PREC32)
        else:
            m_new, alpha, pT, l, accT, ks, kq, ksc, nfk = _byte_tile(Q, KC, VC, KS, VS, RK, RV, cbase, sbase, vsbase, valid,
                                                                rep, rbase, d, tok, qT, m, l, accT, seed, layer, kvh,
                                                                sm_scale, q16T, kinv, BLOCK_N, SCHEME, LOWP,
                                                                PV_F32, HAS_REP, PREC32, KEY_F16, KV_EVICT)
        # the Tier B scale of a token (its level, and max s): 0 for a repaired token (radius 0)
        ks_lvl = ks
        if HAS_REP:
            ks_lvl = tl.where(rep, 0.0, ks_lvl)
        if METER:
            # a non-finite stored key (corruption after the write) beside a finite witness: inf times a negative
            # dot drops the token from a head's softmax silently; the tile's count of such tokens (``nfk``)
            bad += nfk
            # key side: ‖W_j‖₂ over the groups (or the sketch radius), shared by the GQ query heads of this kv head
            wbase, vwoff = _witness_offsets(blk, kvh, off, s_wb, s_wh, s_wt, s_vwb, s_vwh, PER_TOKEN)
            noff = _norm_offsets(blk, kvh, off, s_nb, s_nh, NORMS_PT)
            if SKETCH:
                wn, wraw, cT, hot = _sketch_radius(Q, KW, SK, wbase, blk, kvh, off, valid, pT, l, ks, kq, ksc, hmask, hcol, d, b,
                                    s_qb, s_qh, s_skb, s_skh, s_skt, q32T, q_sum, inv_c, qk0, qk1, qk2, qk3,
                                    inv_a_norm, sm_scale, INFL, GQ, D, BLOCK_N, BLOCK_H, SCHEME, SKB, MAGIC_BF16,
                                    PREC32, HL)
            else:
                wn = _group_radius(KW, wbase, valid, INFL, G, BLOCK_N)
            if HL:  # wn [N, H]: the value side and the non-finite count read each token's largest (NaN: +inf)
                wtok = tl.max(tl.where(wn == wn, wn, float("inf")), axis=1)
                wtok, phi, nu, kap, bad = _value_witnesses(VW, VN, KN, RVN, RKN, wtok, vwoff, noff, valid, rep, rnbase,
                                                           bad, HAS_REP)
                if HAS_REP:
                    wn = tl.where(rep[:, None], 0.0, wn)
                wmaxh = tl.maximum(wmaxh, tl.max(wn, axis=0))
            else:
                wn, phi, nu, kap, bad = _value_witnesses(VW, VN, KN, RVN, RKN, wn, vwoff, noff, valid, rep, rnbase,
                                                         bad, HAS_REP)
                wmax = tl.maximum(wmax, wn)
            hdT = _histogram_tile(wn, ks_lvl, pT, phi, col, heads_i, hcol, X0, K, NB, PAGES, T, BLOCK_H, TIER_B,
                                  PAGE_LEVELS, HIST_BF16, PACK_HIST, PREC_HIST, GQ, HL)
            histT = histT * alpha[None, :] + hdT
            if EXC and SKETCH:
                exA, exB, grd = _excess_tile(wn, wraw, cT, hot, pT, chu, rep, alpha, exA, exB, grd, INFL, HL, HAS_REP,
                                             GRD, GRID_ONE)
            if TIER_B or SCHEME == INT8_DITHER_ID:  # max s: only Tier B's and the dither's terms read it
                smax = tl.maximum(smax, ks_lvl)
            phimax = tl.maximum(phimax, phi)
            numax = tl.maximum(numax, nu)
            kapmax = tl.maximum(kapmax, kap)
        m = m_new

    if HAS_UNMET:  # the last tile's marks
        bad += ((um_prev != 0) | out_prev).to(tl.float32)
    if HAS_WIN:  # the exact window's tokens, from the ring (the split that owns its virtual pages)
        m, l, accT, histT, numax, kapmax, bad, exA, exB, grd = _exact_window(
            Q, TM, WK, WV, WKN, WVN, m, l, accT, histT, numax, kapmax, bad, exA, exB, grd, ring_here, b, kvh, seq_len,
            sink,
            recent, n_idx, d, col, heads_i, qT, q32T, sm_scale, s_tmb, s_wnb, s_wnh,
            D, BLOCK_N, BLOCK_H, K, METER, TIER_B, HAS_MASK, LOWP, PV_F32, PACK_HIST, PREC32, EXC and SKETCH,
            GRD and EXC and SKETCH, GRID_ONE)
    if HL:
        wcol = wmaxh
        if PACK_HIST:  # a head's lo column (c + HALF) is binned with it: its maximum counts (equal by construction)
            HALF: tl.constexpr = BLOCK_H // 2
            w_hi, w_lo = tl.split(tl.permute(tl.reshape(wmaxh, [2, HALF]), (1, 0)))
            w_head = tl.maximum(w_hi, w_lo)
            wcol = tl.reshape(tl.permute(tl.join(w_head, w_head), (1, 0)), [BLOCK_H])
    else:
        wcol = tl.zeros([BLOCK_H], tl.float32) + tl.max(wmax, axis=0)
    if EXC and SKETCH:  # the hmask columns (with PACK_HIST the hi ones, whose running max is stored)
        EXW: tl.constexpr = EXCESS_COLS_C if GRD else 2
        e_idx = ((b * Hq + heads) * num_splits + sp) * EXW
        tl.store(EX_OUT + e_idx, exA, mask=hmask, eviction_policy=PARTIALS_EVICT)
        tl.store(EX_OUT + e_idx + 1, exB, mask=hmask, eviction_policy=PARTIALS_EVICT)
        if GRD:
            gcol = tl.arange(0, GRID_COLS_C)
            tl.store(EX_OUT + e_idx[:, None] + 2 + gcol[None, :], grd, mask=hmask[:, None],
                     eviction_policy=PARTIALS_EVICT)
    if GDC:  # the merge's programs may be placed now (they wait for this pass to complete)
        gdc_launch_dependents()
    _store_partials(M_OUT, L_OUT, ACC_OUT, HIST_OUT, STAT_OUT, m, l, accT, histT, wcol, smax, phimax, numax, bad,
                    kapmax, b, kvh, sp, heads, hmask, d, col, Hq, num_splits, GQ, BLOCK_H, D, NB, METER, PACK_HIST,
                    PARTIALS_EVICT)
