"""Decode path with the meter (SPEC §2, §3, §5, §8): one pass over the paged KV.

    out = decode(cache, q, block_table, seq_lens, sm_scale, meter=True, num_splits=1,
                 delta_step=None)
        q            [B, Hq, D]       (Hq = GQ · Hkv, GQ in 1…8)
        block_table  [B, max_pages]   int32
        seq_lens     [B]              int32, ≥ 1
        → out.o [B, Hq, D] float32, out.lse [B, Hq], out.meter (MeterRecord) or None

Grid: (B, Hkv, num_splits). A program serves the GQ query heads of one kv head (padded to
BLOCK_H ≥ 16 rows for the tensor-core dot) over its share of the sequence's pages, a tile of
PAGES pages at a time: it dequantizes (regenerating the dither for ``int8_dither``), runs the
online softmax and the output accumulation, and, when METER, in the same pass:

* key-side levels: the Tier A radius ε_j(h) = σ Σ_g ‖q_h[g]‖ W[j, g] ≤ σ ‖q_h‖ ‖W_j‖₂ (Cauchy–
  Schwarz over the groups; equal for G = 1) factors into a head part and a token part, and so
  does the Tier B radius t_j(h) = c_h · s_j. Tokens are binned once per kv head by ‖W_j‖₂ and
  by s_j on a fixed geometric grid (ratio √2, rounded **up**), so all GQ query heads share the
  bins, and one tensor-core dot ``p @ onehot`` per tile accumulates both p̂-mass histograms
  and, in its last column, Σ p̂ φ. The dot takes p̂ in fp32 (tf32x3 on the GPU, ieee in the
  interpreter): fp32's range, so a p̂ that fp16 would flush (a logit gap ≥ ~28 below the
  running maximum) keeps its mass; only masses below 2^-126 of the running maximum can be
  lost, and those are counted into the ρ term of the epilogue;
* max ‖W_j‖, max s_j, max φ, max ν, max κ (≥ ‖k̂_j‖), and a count of non-finite radii / logits.

Floating point (SPEC §7): the histogram is of the distribution p̃ the kernel actually computed;
its log-ratio to p̂ = softmax(σ⟨q, k̂⟩) (exact) is at most Ξ = σ‖q_h‖·max κ·γ (the fp32 logit:
``paged.dot_gamma``) + the fp32 exp + 2.1·η (the mass accumulation: ``paged.mass_eta``); the
epilogue meters p̃ with every level raised by Ξ and adds tanh(Ξ/2) (TV(p̃, p̂)) and ρ (lost
masses), so TV⁺ bounds both TV(p, p̂) and TV(p, p̃).

Tiles are dotted on tensor cores in q's dtype (bf16 or fp16; a float32 q must be exactly bf16)
on the GPU: int8 and fp8 codes are exact in both, the per-token scales are folded into the
logits and into p̂ (p̂·s_v is rounded to q's dtype, as in any bf16 attention kernel), and the
int8_dither term q·u uses u split into hi + lo parts.
``int4_group`` tiles are unpacked and dequantized (z + s·c) in fp32 and dotted with tf32x3.
In the interpreter everything stays in fp32.

Split partials are merged with the log-sum-exp rule (histograms and Σ p̂ φ rescaled like the
denominators) and ``kernels.epilogue`` turns the histograms into TV⁺ and the output bound.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from contract.constants import DITHER_BIAS_FACTOR

from .epilogue import MeterRecord, meter_epilogue
from .paged import FP32_FLUSH, KERNEL_EXP_REL, KERNEL_REL_SLACK, SCHEME_IDS, PagedKV, dot_gamma, mass_eta
from .write import INTERPRET, dither_from_hash, token_hash


@triton.jit
def _key_level(x, X0: tl.constexpr, K: tl.constexpr):
    """Key-side level of a non-negative value: 0 for x = 0, else the smallest m in 1..K with
    x ≤ X0·2^((m−1)/2), or K+1 (overflow). Biased up by 2^-10 in the log domain so fp32
    log2 rounding never assigns a level below the value (sound)."""
    m = 1.0 + tl.ceil(2.0 * tl.log2(tl.maximum(x, 1e-37) / X0) + 0.0009765625)
    m = tl.minimum(tl.maximum(m, 1.0), K + 1.0)
    return tl.where(x > 0, m, 0.0).to(tl.int32)


@triton.jit
def _decode_kernel(
    Q, KC, VC, KS, VS, KZ, VZ, KW, VW, VN, KN, BT, SL,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT, STAT_OUT,
    seed, layer, sm_scale, num_splits,
    s_qb, s_qh,
    s_cb, s_ch, s_ct,
    s_sb, s_sh, s_st,
    s_wb, s_wh, s_wt,
    s_vwb, s_vwh,
    s_btb,
    Hq,
    INFL: tl.constexpr, X0: tl.constexpr,
    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, T: tl.constexpr, G: tl.constexpr,
    PAGES: tl.constexpr, K: tl.constexpr, NB: tl.constexpr,
    SCHEME: tl.constexpr, METER: tl.constexpr, TIER_B: tl.constexpr, PER_TOKEN: tl.constexpr, LOWP: tl.constexpr,
    PREC32: tl.constexpr, PREC_HIST: tl.constexpr,
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
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=hmask[:, None], other=0.0)
    q32 = q.to(tl.float32)
    if not LOWP:  # on the GPU q keeps its bf16/fp16 dtype (the wrapper guarantees one)
        q = q32

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    KA: tl.constexpr = K + 2  # bins per tier: 0 (zero radius), 1..K, K+1 (overflow)
    col = tl.arange(0, NB)
    hist = tl.zeros([BLOCK_H, NB], tl.float32)
    wmax = tl.zeros([BLOCK_H], tl.float32)
    smax = tl.zeros([BLOCK_H], tl.float32)
    phimax = tl.zeros([BLOCK_H], tl.float32)
    numax = tl.zeros([BLOCK_H], tl.float32)
    kapmax = tl.zeros([BLOCK_H], tl.float32)
    bad = tl.zeros([BLOCK_H], tl.float32)

    BLOCK_N: tl.constexpr = PAGES * T
    D2: tl.constexpr = D // 2
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
        sbase = blk * s_sb + kvh * s_sh + off * s_st
        if SCHEME == 6:  # int4_group: unpack nibbles (channel i low, i + D/2 high), z + s·c in fp32
            d2 = tl.arange(0, D2)
            gidx = sbase[:, None] + (d // 32)[None, :]
            kb = tl.load(KC + cbase[:, None] + d2[None, :], mask=valid[:, None], other=0)
            kcode = tl.reshape(tl.permute(tl.join((kb & 15).to(tl.float32), (kb >> 4).to(tl.float32)), (0, 2, 1)), [BLOCK_N, D])
            kh = tl.load(KZ + gidx, mask=valid[:, None], other=0.0).to(tl.float32) + \
                tl.load(KS + gidx, mask=valid[:, None], other=0.0).to(tl.float32) * kcode
            vb = tl.load(VC + cbase[:, None] + d2[None, :], mask=valid[:, None], other=0)
            vcode = tl.reshape(tl.permute(tl.join((vb & 15).to(tl.float32), (vb >> 4).to(tl.float32)), (0, 2, 1)), [BLOCK_N, D])
            vh = tl.load(VZ + gidx, mask=valid[:, None], other=0.0).to(tl.float32) + \
                tl.load(VS + gidx, mask=valid[:, None], other=0.0).to(tl.float32) * vcode
            ks = tl.full([BLOCK_N], 1.0, tl.float32)
            s = tl.dot(q32, tl.trans(kh), input_precision=PREC32) * sm_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p, vh, input_precision=PREC32)
        else:
            kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            vc = tl.load(VC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            if SCHEME == 0:
                ks = tl.full([BLOCK_N], 1.0, tl.float32)
                vs = tl.full([BLOCK_N], 1.0, tl.float32)
            else:
                ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
                vs = tl.load(VS + sbase, mask=valid, other=0.0).to(tl.float32)
            if LOWP:  # tensor cores in q's dtype: int8 / fp8 codes are exact in bf16 and fp16
                kc = kc.to(Q.dtype.element_ty)
                vc = vc.to(Q.dtype.element_ty)
            else:
                kc = kc.to(tl.float32)
                vc = vc.to(tl.float32)
            qk = tl.dot(q, tl.trans(kc))
            if SCHEME == 2:  # k̂ = s (c − u): subtract q·u, u split into bf16 hi + lo parts
                uk = dither_from_hash(token_hash(seed, layer, kvh, tok, 0)[:, None], d[None, :])
                if LOWP:
                    uk_hi = uk.to(Q.dtype.element_ty)
                    uk_lo = (uk - uk_hi.to(tl.float32)).to(Q.dtype.element_ty)
                    qk -= tl.dot(q, tl.trans(uk_hi)) + tl.dot(q, tl.trans(uk_lo))
                else:
                    qk -= tl.dot(q, tl.trans(uk))
            s = qk * (ks * sm_scale)[None, :]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            pv = p * vs[None, :]
            if LOWP:
                pv = pv.to(Q.dtype.element_ty)
            pvv = tl.dot(pv, vc)
            if SCHEME == 2:
                uv = dither_from_hash(token_hash(seed, layer, kvh, tok, 1)[:, None], d[None, :])
                if LOWP:
                    uv_hi = uv.to(Q.dtype.element_ty)
                    uv_lo = (uv - uv_hi.to(tl.float32)).to(Q.dtype.element_ty)
                    pvv -= tl.dot(pv, uv_hi) + tl.dot(pv, uv_lo)
                else:
                    pvv -= tl.dot(pv, uv)
            acc = acc * alpha[:, None] + pvv
        if METER:
            # key side: ‖W_j‖₂ over the groups, shared by the GQ query heads of this kv head
            wbase = blk * s_wb + kvh * s_wh
            if PER_TOKEN:
                wbase += off * s_wt
            # ‖W_j‖₂ scaled by the largest group witness: squares of tiny fp32 (per-block)
            # witnesses would underflow to a zero radius; ≥ that largest witness, never 0
            if G == 1:  # ‖W_j‖₂ is the witness itself: no square, no second load
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
                wn = tl.where(valid, tl.maximum(tl.sqrt(w2) * wmx, wmx) * INFL, 0.0)
            vwoff = blk * s_vwb + kvh * s_vwh
            if PER_TOKEN:
                vwoff += off
            phi = tl.load(VW + vwoff, mask=valid, other=0.0).to(tl.float32)
            nu = tl.load(VN + vwoff, mask=valid, other=0.0).to(tl.float32)
            kap = tl.load(KN + vwoff, mask=valid, other=0.0).to(tl.float32)
            # non-finite radii / witnesses; a NaN logit makes l non-finite, flagged after the merge
            nf = (wn != wn) | (wn == float("inf")) | (phi != phi) | (phi == float("inf")) | (nu != nu) | (nu == float("inf")) \
                | (kap != kap) | (kap == float("inf"))
            bad += tl.sum(nf.to(tl.float32), axis=0)
            la = _key_level(wn, X0, K)
            onehot = col[None, :] == la[:, None]
            if TIER_B:
                onehot = onehot | (col[None, :] == (_key_level(ks, X0, K) + KA)[:, None])
            # the last column carries φ_j, so the same dot also accumulates Σ p̂ φ
            oh = tl.where(col[None, :] == NB - 1, phi[:, None], onehot.to(tl.float32))
            # fp32 operands: no p̂ is flushed above 2^-126 of the running max (paged.mass_eta)
            hd = tl.dot(p, oh, input_precision=PREC_HIST)
            hist = hist * alpha[:, None] + hd
            wmax = tl.maximum(wmax, tl.max(wn, axis=0))
            smax = tl.maximum(smax, tl.max(ks, axis=0))
            phimax = tl.maximum(phimax, tl.max(phi, axis=0))
            numax = tl.maximum(numax, tl.max(nu, axis=0))
            kapmax = tl.maximum(kapmax, tl.max(kap, axis=0))
        m = m_new

    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask)
    tl.store(L_OUT + o_idx, l, mask=hmask)
    tl.store(ACC_OUT + o_idx[:, None] * D + d[None, :], acc, mask=hmask[:, None])
    if METER:
        tl.store(HIST_OUT + o_idx[:, None] * NB + col[None, :], hist, mask=hmask[:, None])
        st = STAT_OUT + o_idx * 6
        tl.store(st + 0, wmax, mask=hmask)
        tl.store(st + 1, smax, mask=hmask)
        tl.store(st + 2, phimax, mask=hmask)
        tl.store(st + 3, numax, mask=hmask)
        tl.store(st + 4, bad, mask=hmask)
        tl.store(st + 5, kapmax, mask=hmask)


@dataclasses.dataclass
class DecodeOutput:
    o: torch.Tensor
    lse: torch.Tensor
    meter: MeterRecord | None
    compiled: object = None  # the launched kernel (registers / spills for the benchmark)


#: key-side level grid: edges X0·2^((m−1)/2), m = 1..KEY_LEVELS (ratio √2), 0 and overflow bins.
X0 = 2.0**-14
KEY_LEVELS = 29


def key_edges(device=None) -> torch.Tensor:
    """Upper edges of the key-side bins 0..K (bin 0 = exactly 0), float64."""
    m = torch.arange(1, KEY_LEVELS + 1, dtype=torch.float64, device=device)
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), X0 * torch.exp2((m - 1) / 2)])


def tier_b_coefficients(q: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, delta_step: float) -> torch.Tensor:
    """c[b, h] with Tier B radius t_j = c · s_j (SPEC §5 with per-token scale s_j):
    ``|σ| (‖q‖ sqrt(2 ln(2n/δ) / 12) + ‖q‖₁ · DITHER_BIAS_FACTOR)``, n = seq_lens[b]. float64."""
    qd = q.double()
    n = seq_lens.double().to(q.device)[:, None]
    log_term = torch.sqrt(2.0 * torch.log(2.0 * n / delta_step) / 12.0)
    c = abs(sm_scale) * (qd.norm(dim=-1) * log_term + qd.abs().sum(-1) * DITHER_BIAS_FACTOR)
    return c * (1.0 + KERNEL_REL_SLACK)


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


def decode(
    cache: PagedKV,
    q: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    meter: bool = True,
    num_splits: int = 1,
    delta_step: float | None = None,
    pages_per_tile: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    validate: bool = True,
    epilogue: bool = True,
) -> DecodeOutput:
    """See the module docstring. ``validate=False`` skips the checks that need a device sync;
    ``epilogue=False`` (benchmarks) stops after the merge, without the meter record."""
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
    if validate:
        if torch.any(seq_lens < 1):
            raise ValueError("seq_lens: every sequence needs at least one cached token")
        if torch.any(seq_lens > block_table.shape[1] * cache.block_size):
            raise ValueError("seq_lens: longer than the block table covers")
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
    BLOCK_H = max(16, triton.next_power_of_2(GQ))
    KA = KEY_LEVELS + 2
    NB = triton.next_power_of_2((2 * KA if tier_b else KA) + 1)  # + the Σ p̂ φ column
    T = cache.block_size
    if pages_per_tile is None:  # measured on the H200 (bench/RESULTS.md): 128-token tiles with
        pages_per_tile = max(1, (128 if meter else 64) // T)  # the meter, 64 without
    if num_stages is None and not INTERPRET:
        num_stages = 2
    lowp = not INTERPRET and dev.type == "cuda"
    if lowp:
        q = tensor_core_query(q, cache, validate)
    q = q.contiguous()
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
    extra = {} if num_stages is None else {"num_stages": num_stages}
    compiled = _decode_kernel[(Bsz, Hkv, S)](
        q, cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_zero, cache.v_zero,
        cache.k_wit, cache.v_wit, cache.v_norm, cache.k_norm, bt, sl,
        m_out, l_out, acc_out, hist, stat,
        cache.seed, cache.layer, sm, S,
        q.stride(0), q.stride(1),
        cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
        cache.k_scale.stride(0), cache.k_scale.stride(1), cache.k_scale.stride(2),
        cache.k_wit.stride(0), cache.k_wit.stride(1), cache.k_wit.stride(2),
        cache.v_wit.stride(0), cache.v_wit.stride(1),
        bt.stride(0),
        Hq,
        INFL=1.0 + KERNEL_REL_SLACK, X0=X0,
        GQ=GQ, BLOCK_H=BLOCK_H, D=D, T=T, G=cache.num_groups,
        PAGES=pages_per_tile, K=KEY_LEVELS, NB=NB,
        SCHEME=SCHEME_IDS[cache.scheme], METER=meter, TIER_B=tier_b, PER_TOKEN=cache.per_token_witness, LOWP=lowp,
        PREC32="tf32x3" if lowp else "ieee", PREC_HIST="tf32x3" if lowp else "ieee",
        num_warps=num_warps, **extra,
    )
    # split-KV merge (log-sum-exp rule); histograms are rescaled like l. float64, so no split's
    # mass is flushed by the merge (the output keeps the float32 of the partials).
    M = m_out.max(dim=-1, keepdim=True).values
    w64 = torch.where(torch.isfinite(m_out), torch.exp((m_out - M).double()), torch.zeros_like(m_out, dtype=torch.float64))
    w = w64.float()
    L = (w * l_out).sum(-1)
    o = (w[..., None] * acc_out).sum(-2) / L[..., None]
    lse = M[..., 0] + torch.log(L)
    rec = None
    if meter and epilogue:
        L64 = (w64 * l_out.double()).sum(-1)
        h = (w64[..., None] * hist.double()).sum(-2) / L64[..., None]  # [B, Hq, NB]
        mx = stat.amax(dim=-2)
        bad = stat[..., 4].sum(-1) + (~torch.isfinite(L)).double() + (~torch.isfinite(o).all(-1)).double()
        qs = q  # exactly the query the kernel used
        qd = qs.double()
        qnorm = qd.norm(dim=-1) * (sm * (1.0 + KERNEL_REL_SLACK))  # σ‖q_h‖ (rounded up)
        edges = key_edges(dev)
        lv_a = qnorm[..., None] * edges  # [B, Hq, K+1]
        eps_max = qnorm * mx[..., 0].double()
        # SPEC §7: Ξ bounds |log p̃_j/p̂_j| (up to normalisation) of the kernel's masses
        n_pages = (sl.double() + T - 1).div(T).floor()
        tiles = torch.ceil(torch.ceil(n_pages / S) / pages_per_tile)[:, None]  # [B, 1]
        BLOCK_N = pages_per_tile * T
        xi = qnorm * mx[..., 5].double() * dot_gamma(D, split3=cache.scheme == "int4_group") + KERNEL_EXP_REL
        if cache.scheme == "int8_dither" and lowp:  # u ≈ u_hi + u_lo (bf16): |Δu| ≤ 2^-19
            xi = xi + abs(sm) * qd.abs().sum(-1) * mx[..., 1].double() * 2.0**-19
        eta = mass_eta(tiles, BLOCK_N)
        xi = (xi + 2.1 * eta) * (1.0 + 2.0**-20)
        # ρ: masses below FP32_FLUSH of a running maximum may be lost (tokens, and the NB
        # histogram entries at each tile's rescale), relative to the merged denominator ≥ 1
        lam = ((sl.double()[:, None] + NB * tiles * S + 16.0) * FP32_FLUSH / L64.clamp_min(1.0)).expand_as(xi)
        tb_max = lv_b = None
        if tier_b:
            cb = tier_b_coefficients(qs, sl, sm, delta_step)
            lv_b = cb[..., None] * edges
            tb_max = cb * mx[..., 1].double()
        rec = meter_epilogue(
            h[..., :KA], h[..., KA : 2 * KA] if tier_b else None, lv_a, lv_b, eps_max, tb_max,
            pphi=h[..., NB - 1], phi_max=mx[..., 2], nu_max=mx[..., 3], bad=bad,
            single=(sl == 1)[:, None].expand(Bsz, Hq), xi=xi, lam=lam,
            out_rel=(2.0**-8 if lowp else 0.0) + eta,
        )
    return DecodeOutput(o=o, lse=lse, meter=rec, compiled=compiled)
