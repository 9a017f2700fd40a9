"""Decode path with the meter (SPEC §2, §3, §5, §8): one pass over the paged KV.

    out = decode(cache, q, block_table, seq_lens, sm_scale, meter=True, levels=DEFAULT_LEVELS,
                 num_splits=1, delta_step=None)
        q            [B, Hq, D]       (Hq = GQ · Hkv, GQ in 1…8)
        block_table  [B, max_pages]   int32
        seq_lens     [B]              int32, ≥ 1
        → out.o [B, Hq, D] float32, out.lse [B, Hq], out.meter (MeterRecord) or None

Grid: (B, Hkv, num_splits). A program serves the GQ query heads of one kv head (padded to
BLOCK_H ≥ 16 rows for the tensor-core dot) over its share of the sequence's pages, a tile of
PAGES pages at a time: it dequantizes (regenerating the dither for ``int8_dither``), runs the
online softmax and the output accumulation, and, when METER, in the same pass:

* Tier A radius per token ε_j = σ Σ_g ‖q[g]‖ W[j, g] (query group norms from the host),
* Tier B radius t_j = c_h · s_j (``int8_dither``; c_h from ``tier_b_coefficients``),
* a (K+1)-bin histogram of p̂ mass by radius level (radii rounded **up** onto ``levels``; bin K
  is the overflow bin, whose level is the row's ε_max), for each tier,
* Σ p̂ φ, max φ, max ν, max ε, max t, and a count of non-finite radii / logits.

Split partials are merged with the log-sum-exp rule (histograms and Σ p̂ φ rescaled like the
denominators) and ``kernels.epilogue`` turns the histograms into TV⁺ and the output bound.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from witcert import bounds as B

from .epilogue import DEFAULT_LEVELS, MeterRecord, meter_epilogue
from .paged import KERNEL_REL_SLACK, SCHEME_IDS, PagedKV
from .write import INTERPRET, dither_from_hash, token_hash


@triton.jit
def _decode_kernel(
    Q, QN, TBC, LEV,
    KC, VC, KS, VS, KW, VW, VN, BT, SL,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT, HISTB_OUT, STAT_OUT,
    seed, layer, sm_scale, num_splits,
    s_qb, s_qh,
    s_cb, s_ch, s_ct,
    s_sb, s_sh,
    s_wb, s_wh, s_wt,
    s_vwb, s_vwh,
    s_btb,
    Hq,
    INFL: tl.constexpr,
    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, T: tl.constexpr, G: tl.constexpr,
    PAGES: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
    SCHEME: tl.constexpr, METER: tl.constexpr, TIER_B: tl.constexpr, PER_TOKEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(SL + b)
    n_pages = tl.cdiv(seq_len, T)
    per_split = tl.cdiv(n_pages, num_splits)
    p_start = sp * per_split
    p_end = tl.minimum(p_start + per_split, n_pages)

    rows = tl.arange(0, BLOCK_H)
    hmask = rows < GQ
    heads = kvh * GQ + rows
    d = tl.arange(0, D)
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    kcol = tl.arange(0, KB)
    hist = tl.zeros([BLOCK_H, KB], tl.float32)
    histb = tl.zeros([BLOCK_H, KB], tl.float32)
    pphi = tl.zeros([BLOCK_H], tl.float32)
    epsmax = tl.zeros([BLOCK_H], tl.float32)
    tbmax = tl.zeros([BLOCK_H], tl.float32)
    phimax = tl.zeros([BLOCK_H], tl.float32)
    numax = tl.zeros([BLOCK_H], tl.float32)
    bad = tl.zeros([BLOCK_H], tl.float32)
    if TIER_B:
        tbc = tl.load(TBC + b * Hq + heads, mask=hmask, other=0.0)

    BLOCK_N: tl.constexpr = PAGES * T
    n_idx = tl.arange(0, BLOCK_N)
    pg_in = n_idx // T
    off = n_idx % T
    for p0 in range(p_start, p_end, PAGES):
        page = p0 + pg_in
        tok = page * T + off
        pvalid = page < p_end
        valid = pvalid & (tok < seq_len)
        blk = tl.load(BT + b * s_btb + page, mask=pvalid, other=0).to(tl.int64)
        cbase = blk * s_cb + kvh * s_ch + off * s_ct
        sbase = blk * s_sb + kvh * s_sh + off
        kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        vc = tl.load(VC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        if SCHEME == 0:
            kh = kc
            vh = vc
            ks = tl.full([BLOCK_N], 1.0, tl.float32)
        else:
            ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
            vs = tl.load(VS + sbase, mask=valid, other=0.0).to(tl.float32)
            if SCHEME == 2:
                hk = token_hash(seed, layer, kvh, tok, 0)
                hv = token_hash(seed, layer, kvh, tok, 1)
                uk = dither_from_hash(hk[:, None], d[None, :])
                uv = dither_from_hash(hv[:, None], d[None, :])
                kh = ks[:, None] * (kc - uk)
                vh = vs[:, None] * (vc - uv)
            else:
                kh = ks[:, None] * kc
                vh = vs[:, None] * vc
        s = tl.dot(q, tl.trans(kh), input_precision=DOT_PREC) * sm_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, vh, input_precision=DOT_PREC)
        if METER:
            wbase = blk * s_wb + kvh * s_wh
            if PER_TOKEN:
                wbase += off * s_wt
            eps = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
            for g in tl.static_range(G):
                wg = tl.load(KW + wbase + g, mask=valid, other=0.0).to(tl.float32)
                qg = tl.load(QN + (b * Hq + heads) * G + g, mask=hmask, other=0.0)
                eps += qg[:, None] * wg[None, :]
            eps = tl.where(valid[None, :], eps * (sm_scale * INFL), 0.0)
            nonfin = (eps != eps) | (eps == float("inf")) | (valid[None, :] & (s != s))
            bad += tl.sum(nonfin.to(tl.float32), axis=1)
            epsmax = tl.maximum(epsmax, tl.max(eps, axis=1))
            lev = tl.zeros([BLOCK_H, BLOCK_N], tl.int32)
            for k in tl.static_range(K):
                lev += (eps > tl.load(LEV + k)).to(tl.int32)
            hist = hist * alpha[:, None]
            for k in tl.static_range(K + 1):
                hk_ = tl.sum(tl.where(lev == k, p, 0.0), axis=1)
                hist += tl.where(kcol[None, :] == k, hk_[:, None], 0.0)
            vwoff = blk * s_vwb + kvh * s_vwh
            if PER_TOKEN:
                vwoff += off
            phi = tl.load(VW + vwoff, mask=valid, other=0.0).to(tl.float32)
            nu = tl.load(VN + vwoff, mask=valid, other=0.0).to(tl.float32)
            bad += tl.sum(((phi != phi) | (nu != nu) | (phi == float("inf")) | (nu == float("inf"))).to(tl.float32), axis=0)
            pphi = pphi * alpha + tl.sum(p * phi[None, :], axis=1)
            phimax = tl.maximum(phimax, tl.max(phi, axis=0))
            numax = tl.maximum(numax, tl.max(nu, axis=0))
            if TIER_B:
                tb = tl.where(valid[None, :], tbc[:, None] * ks[None, :], 0.0)
                tbmax = tl.maximum(tbmax, tl.max(tb, axis=1))
                levb = tl.zeros([BLOCK_H, BLOCK_N], tl.int32)
                for k in tl.static_range(K):
                    levb += (tb > tl.load(LEV + k)).to(tl.int32)
                histb = histb * alpha[:, None]
                for k in tl.static_range(K + 1):
                    hb_ = tl.sum(tl.where(levb == k, p, 0.0), axis=1)
                    histb += tl.where(kcol[None, :] == k, hb_[:, None], 0.0)
        m = m_new

    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask)
    tl.store(L_OUT + o_idx, l, mask=hmask)
    tl.store(ACC_OUT + o_idx[:, None] * D + d[None, :], acc, mask=hmask[:, None])
    if METER:
        tl.store(HIST_OUT + o_idx[:, None] * KB + kcol[None, :], hist, mask=hmask[:, None])
        if TIER_B:
            tl.store(HISTB_OUT + o_idx[:, None] * KB + kcol[None, :], histb, mask=hmask[:, None])
        st = STAT_OUT + o_idx * 7
        tl.store(st + 0, pphi, mask=hmask)
        tl.store(st + 1, phimax, mask=hmask)
        tl.store(st + 2, numax, mask=hmask)
        tl.store(st + 3, epsmax, mask=hmask)
        tl.store(st + 4, tbmax, mask=hmask)
        tl.store(st + 5, bad, mask=hmask)


@dataclasses.dataclass
class DecodeOutput:
    o: torch.Tensor
    lse: torch.Tensor
    meter: MeterRecord | None


def query_group_norms(q: torch.Tensor, cache: PagedKV) -> torch.Tensor:
    """‖q[g]‖ per (batch, head, group), fp32 rounded up by KERNEL_REL_SLACK: [B, Hq, G]."""
    qf = q.float()
    G = cache.num_groups
    gid = cache.group_id.to(q.device).long()
    sq = torch.zeros(q.shape[0], q.shape[1], G, device=q.device, dtype=torch.float32)
    sq.index_add_(2, gid, qf * qf)
    return (sq.sqrt() * (1.0 + KERNEL_REL_SLACK)).contiguous()


def tier_b_coefficients(q: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, delta_step: float) -> torch.Tensor:
    """c[b, h] with Tier B radius t_j = c · s_j (SPEC §5 with per-token scale s_j):
    ``|σ| (‖q‖ sqrt(2 ln(2n/δ) / 12) + ‖q‖₁ · DITHER_BIAS_FACTOR)``, n = seq_lens[b]."""
    qd = q.double()
    n = seq_lens.double().to(q.device)[:, None]
    log_term = torch.sqrt(2.0 * torch.log(2.0 * n / delta_step) / 12.0)
    c = abs(sm_scale) * (qd.norm(dim=-1) * log_term + qd.abs().sum(-1) * B.DITHER_BIAS_FACTOR)
    return (c * (1.0 + KERNEL_REL_SLACK)).float().contiguous()


def decode(
    cache: PagedKV,
    q: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    meter: bool = True,
    levels: torch.Tensor | None = None,
    num_splits: int = 1,
    delta_step: float | None = None,
    pages_per_tile: int | None = None,
    dot_precision: str | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> DecodeOutput:
    if q.dim() != 3:
        raise ValueError(f"q: expected [B, Hq, D], got {tuple(q.shape)}")
    Bsz, Hq, D = q.shape
    Hkv = cache.num_kv_heads
    if D != cache.head_dim:
        raise ValueError(f"q: head dim {D} does not match the cache's {cache.head_dim}")
    if Hq % Hkv or not 1 <= Hq // Hkv <= 8:
        raise ValueError(f"q: {Hq} query heads over {Hkv} kv heads: GQA group must be an integer in 1..8")
    if seq_lens.shape != (Bsz,) or block_table.dim() != 2 or block_table.shape[0] != Bsz:
        raise ValueError("seq_lens [B] and block_table [B, max_pages] must match q's batch")
    if torch.any(seq_lens < 1):
        raise ValueError("seq_lens: every sequence needs at least one cached token")
    if torch.any(seq_lens > block_table.shape[1] * cache.block_size):
        raise ValueError("seq_lens: longer than the block table covers")
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: expected a positive int, got {num_splits!r}")
    tier_b = meter and cache.scheme == "int8_dither" and delta_step is not None
    if delta_step is not None and not 0 < delta_step < 1:
        raise ValueError(f"delta_step: expected a probability in (0, 1), got {delta_step!r}")
    sm = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    dev = q.device
    GQ = Hq // Hkv
    BLOCK_H = max(16, triton.next_power_of_2(GQ))
    lev = (DEFAULT_LEVELS if levels is None else levels).to(device=dev, dtype=torch.float32).contiguous()
    K = lev.numel()
    KB = triton.next_power_of_2(K + 1)
    T = cache.block_size
    if pages_per_tile is None:
        pages_per_tile = max(1, 64 // T)
    q = q.contiguous()
    qn = query_group_norms(q, cache) if meter else q.new_zeros(1, dtype=torch.float32)
    tbc = tier_b_coefficients(q, seq_lens, sm, delta_step) if tier_b else q.new_zeros(1, dtype=torch.float32)
    S = num_splits
    f32 = dict(device=dev, dtype=torch.float32)
    m_out = torch.empty(Bsz, Hq, S, **f32)
    l_out = torch.empty(Bsz, Hq, S, **f32)
    acc_out = torch.empty(Bsz, Hq, S, D, **f32)
    hist = torch.zeros(Bsz, Hq, S, KB, **f32) if meter else m_out
    histb = torch.zeros(Bsz, Hq, S, KB, **f32) if tier_b else m_out
    stat = torch.zeros(Bsz, Hq, S, 7, **f32) if meter else m_out
    bt = block_table.to(device=dev, dtype=torch.int32).contiguous()
    sl = seq_lens.to(device=dev, dtype=torch.int32).contiguous()
    prec = dot_precision or ("ieee" if INTERPRET else "tf32x3")
    extra = {} if num_stages is None else {"num_stages": num_stages}
    _decode_kernel[(Bsz, Hkv, S)](
        q, qn, tbc, lev,
        cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_wit, cache.v_wit, cache.v_norm, bt, sl,
        m_out, l_out, acc_out, hist, histb, stat,
        cache.seed, cache.layer, sm, S,
        q.stride(0), q.stride(1),
        cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
        cache.k_scale.stride(0), cache.k_scale.stride(1),
        cache.k_wit.stride(0), cache.k_wit.stride(1), cache.k_wit.stride(2),
        cache.v_wit.stride(0), cache.v_wit.stride(1),
        bt.stride(0),
        Hq,
        INFL=1.0 + KERNEL_REL_SLACK,
        GQ=GQ, BLOCK_H=BLOCK_H, D=D, T=T, G=cache.num_groups,
        PAGES=pages_per_tile, K=K, KB=KB,
        SCHEME=SCHEME_IDS[cache.scheme], METER=meter, TIER_B=tier_b, PER_TOKEN=cache.per_token_witness,
        DOT_PREC=prec, num_warps=num_warps, **extra,
    )
    # split-KV merge (log-sum-exp rule); histograms and Σ p̂ φ are rescaled like l
    M = m_out.max(dim=-1, keepdim=True).values
    w = torch.exp(m_out - M)  # empty splits have m = -inf → weight 0
    w = torch.where(torch.isfinite(m_out), w, torch.zeros_like(w))
    L = (w * l_out).sum(-1)
    o = (w[..., None] * acc_out).sum(-2) / L[..., None]
    lse = M[..., 0] + torch.log(L)
    rec = None
    if meter:
        mass = (w[..., None] * hist).sum(-2)[..., : K + 1] / L[..., None]
        massb = (w[..., None] * histb).sum(-2)[..., : K + 1] / L[..., None] if tier_b else None
        pphi = (w * stat[..., 0]).sum(-1) / L
        mx = stat.amax(dim=-2)
        bad = stat[..., 5].sum(-1) + (~torch.isfinite(L)).float() + (~torch.isfinite(o).all(-1)).float()
        rec = meter_epilogue(mass, massb, lev, eps_max=mx[..., 3], tb_max=mx[..., 4] if tier_b else None,
                             pphi=pphi, phi_max=mx[..., 1], nu_max=mx[..., 2], bad=bad,
                             single=(sl == 1)[:, None].expand(Bsz, Hq))
    return DecodeOutput(o=o, lse=lse, meter=rec)
