"""Probe (issue 10, diagnosis only; its result was adopted by kernels/decode.py): the decode tile loop with the operands
swapped ("swap AB"), timed beside the production kernel on the same caches.

Production (kernels/decode.py) computes s = q·Kᵀ with the query heads as the MMA's M rows
(padded to 16) and the int8 tile, converted to bf16 in registers, as the B operand, which on
Hopper must pass through shared memory; the histogram's one-hot [tokens, bins] is a B operand too.
Here every large tile is the A operand, which Hopper's wgmma reads from registers:

    sᵀ [N, H]  = K̂ [N, D] · qᵀ [D, H]           (K̂ in registers; qᵀ in shared, loaded once)
    oᵀ [D, H] += V̂ᵀ [D, N] · (p̂ s_v)ᵀ [N, H]     (V̂ᵀ in registers; the small p̂ᵀ in shared)
    histᵀ [NB, H] += onehotᵀ [NB, N] · p̂ᵀ        (one-hot built in registers)

int8 per-token scales, block size 16, G = 1 per-token witnesses, token levels, bf16 hi + lo
histogram (the production defaults); no dither, int4, mask, Tier B, prefetch. Its partials are
checked against a torch computation before timing (interpreter: ``--check``).

    python bench/swap_probe.py                  # H200: kernel-only ms, production vs swapped
    TRITON_INTERPRET=1 python bench/swap_probe.py --check
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kernels.decode import KEY_LEVELS, X0, _key_level, decode  # noqa: E402
from kernels.write import INTERPRET  # noqa: E402


@triton.jit
def _swap_kernel(
    Q, KC, VC, KS, VS, KW, VW, BT, SL,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT,
    sm_scale, num_splits,
    s_qb, s_qh, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_wb, s_wh, s_wt, s_vwb, s_vwh, s_btb, Hq,
    X0: tl.constexpr, K: tl.constexpr,
    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, T: tl.constexpr, PAGES: tl.constexpr,
    NB: tl.constexpr, METER: tl.constexpr, LOWP: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(SL + b)
    n_pages = tl.cdiv(seq_len, T)
    per_split = tl.cdiv(n_pages, num_splits)
    p_start = sp * per_split
    p_end = tl.minimum(p_start + per_split, n_pages)
    hcol = tl.arange(0, BLOCK_H)
    hmask = hcol < GQ
    heads = kvh * GQ + hcol
    d = tl.arange(0, D)
    qT = tl.load(Q + b * s_qb + heads[None, :] * s_qh + d[:, None], mask=hmask[None, :], other=0.0)  # [D, H]
    if not LOWP:
        qT = qT.to(tl.float32)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    accT = tl.zeros([D, BLOCK_H], tl.float32)
    binr = tl.arange(0, NB)
    histT = tl.zeros([NB, BLOCK_H], tl.float32)
    BLOCK_N: tl.constexpr = PAGES * T
    n_idx = tl.arange(0, BLOCK_N)
    pg_in = n_idx // T
    off = n_idx % T
    for p0 in range(p_start, p_end, PAGES):
        page = p0 + pg_in
        tok = page * T + off
        valid = (page < p_end) & (tok < seq_len)
        blk = tl.load(BT + b * s_btb + page, mask=page < p_end, other=0).to(tl.int64)
        cbase = blk * s_cb + kvh * s_ch + off * s_ct
        sbase = blk * s_sb + kvh * s_sh + off * s_st
        kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0.0)  # [N, D]
        vT = tl.load(VC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0.0)  # [D, N]
        ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
        vs = tl.load(VS + sbase, mask=valid, other=0.0).to(tl.float32)
        if LOWP:
            kc = kc.to(Q.dtype.element_ty)
            vT = vT.to(Q.dtype.element_ty)
        else:
            kc = kc.to(tl.float32)
            vT = vT.to(tl.float32)
        sT = tl.dot(kc, qT) * (ks * sm_scale)[:, None]  # [N, H]
        sT = tl.where(valid[:, None], sT, float("-inf"))
        m_new = tl.maximum(m, tl.max(sT, axis=0))
        alpha = tl.exp(m - m_new)
        pT = tl.exp(sT - m_new[None, :])
        l = l * alpha + tl.sum(pT, axis=0)
        pvT = pT * vs[:, None]
        if LOWP:
            pvT = pvT.to(Q.dtype.element_ty)
        accT = accT * alpha[None, :] + tl.dot(vT, pvT)
        if METER:
            wbase = blk * s_wb + kvh * s_wh + off * s_wt
            wn = tl.where(valid, tl.load(KW + wbase, mask=valid, other=0.0).to(tl.float32), 0.0)
            phi = tl.load(VW + blk * s_vwb + kvh * s_vwh + off, mask=valid, other=0.0).to(tl.float32)
            la = _key_level(wn, X0, K)
            phi_up = ((phi.to(tl.int32, bitcast=True) + 0xFFFF) & -65536).to(tl.float32, bitcast=True)
            ohT = tl.where(binr[:, None] == NB - 1, phi_up[None, :], (binr[:, None] == la[None, :]).to(tl.float32))
            if LOWP:
                ohb = ohT.to(tl.bfloat16)
                p_hi = pT.to(tl.bfloat16)
                p_lo = (pT - p_hi.to(tl.float32)).to(tl.bfloat16)
                hd = tl.dot(ohb, p_lo, acc=tl.dot(ohb, p_hi))
            else:
                hd = tl.dot(ohT, pT)
            histT = histT * alpha[None, :] + hd
        m = m_new
    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask)
    tl.store(L_OUT + o_idx, l, mask=hmask)
    tl.store(ACC_OUT + o_idx[None, :] * D + d[:, None], accT, mask=hmask[None, :])
    if METER:
        tl.store(HIST_OUT + o_idx[None, :] * NB + binr[:, None], histT, mask=hmask[None, :])


def swap_decode(cache, q, bt, sl, num_splits, meter=True, pages=8, num_warps=4, num_stages=2):
    B, Hq, D = q.shape
    Hkv = cache.num_kv_heads
    GQ = Hq // Hkv
    NB = triton.next_power_of_2(KEY_LEVELS + 3)
    S = num_splits
    f32 = dict(device=q.device, dtype=torch.float32)
    m = torch.empty(B, Hq, S, **f32)
    l = torch.empty(B, Hq, S, **f32)
    acc = torch.empty(B, Hq, S, D, **f32)
    hist = torch.empty(B, Hq, S, NB, **f32)
    lowp = not INTERPRET
    extra = {} if INTERPRET else {"num_stages": num_stages}
    k = _swap_kernel[(B, Hkv, S)](
        q, cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_wit, cache.v_wit, bt, sl,
        m, l, acc, hist, 1 / math.sqrt(D), S,
        q.stride(0), q.stride(1), *cache.k_codes.stride()[:3], *cache.k_scale.stride()[:3],
        *cache.k_wit.stride()[:3], *cache.v_wit.stride()[:2], bt.stride(0), Hq,
        X0=X0, K=KEY_LEVELS, GQ=GQ, BLOCK_H=max(16, triton.next_power_of_2(GQ)), D=D, T=cache.block_size,
        PAGES=pages, NB=NB, METER=meter, LOWP=lowp, num_warps=num_warps, **extra)
    swap_decode.compiled = k
    return m, l, acc, hist


def merged(m, l, acc, hist):
    M = m.amax(-1, keepdim=True)
    w = torch.exp(m - M)
    L = (l * w).sum(-1)
    return (acc * w[..., None]).sum(-2) / L[..., None], (hist * w[..., None]).sum(-2) / L[..., None]


def check():
    from bench.decode import fill_cache

    torch.manual_seed(0)
    B, n, Hkv, D, GQ = 2, 300, 2, 64, 4
    c, bt = fill_cache(B, n, Hkv, D, "int8", "cpu")
    q = torch.randn(B, Hkv * GQ, D).bfloat16().float()
    sl = torch.full((B,), n, dtype=torch.int32)
    ref = decode(c, q, bt, sl, num_splits=2, meter=False)
    o, h = merged(*swap_decode(c, q, bt, sl, 2, pages=4))
    print("max |Δo|", float((o - ref.o).abs().max()))
    assert float((o - ref.o).abs().max()) < 1e-5
    # histogram against torch over the dequantized tokens (same level formula)
    T = 16
    j = torch.arange(n)
    for b in range(B):
        for hq in range(Hkv * GQ):
            hk = hq // GQ
            blk = bt[b, j // T].long()
            kh = c.k_codes[blk, hk, j % T].float() * c.k_scale[blk, hk, j % T].float()[:, None]
            p = torch.softmax(q[b, hq] @ kh.T / math.sqrt(D), 0).double()
            wn = c.k_wit[blk, hk, j % T, 0].float()
            lv = (1.0 + torch.ceil(2.0 * torch.log2(wn.clamp(min=1e-37) / X0) + 2**-10)).clamp(1, KEY_LEVELS + 1)
            lv = torch.where(wn > 0, lv, torch.zeros_like(lv)).long()
            ref_h = torch.zeros(h.shape[-1], dtype=torch.float64).index_add_(0, lv, p)
            phi = c.v_wit[blk, hk, j % T].double()
            ref_h[-1] = (p * phi).sum()
            err = float((h[b, hq, :-1].double() - ref_h[:-1]).abs().max())
            assert err < 1e-5, (b, hq, err)
            # the φ column: φ rounded up to bf16 (as in production), so within 2^-8 above
            assert ref_h[-1] * (1 - 1e-6) <= h[b, hq, -1] <= ref_h[-1] * (1 + 2**-7), (b, hq)
    print("swap probe: output and histogram agree with the references")


#: (pages of 16 tokens per tile, warps, pipeline stages) tried per shape
VARIANTS_ON = ((8, 4, 2), (4, 4, 2), (2, 4, 2), (8, 8, 2), (4, 8, 2), (8, 4, 3), (4, 4, 3))
VARIANTS_OFF = ((8, 4, 2), (4, 4, 2), (8, 8, 2), (16, 8, 2), (8, 4, 3), (4, 4, 3))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--shapes", default="1:32768,8:32768,32:32768")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    from bench.decode import bench, graphed, int8_shape

    dev = "cuda"
    Hq, Hkv, D = 32, 8, 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| B | n | prod off | swap off | prod on (kernel) | swap on (kernel) | swap/prod off | swap/prod on "
          "| regs prod on/off | regs swap on/off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shp in args.shapes.split(","):
        B, n = (int(x) for x in shp.split(":"))
        _, caches, q, sl, S = int8_shape(B, n, Hq, Hkv, D, dev, sms)
        # agreement on this shape
        ref = decode(caches[0][0], q, caches[0][1], sl, num_splits=S, meter=False, validate=False)
        o, _ = merged(*swap_decode(caches[0][0], q, caches[0][1], sl, S, meter=False))
        err = float((o - ref.o).abs().max() / ref.o.abs().max())
        res, regs = {}, {}
        for name, meter in (("off", False), ("on", True)):
            out = decode(caches[0][0], q, caches[0][1], sl, num_splits=S, meter=meter, validate=False, epilogue=False)
            k = out.compiled
            regs["prod", name] = (getattr(k, "n_regs", None), getattr(k, "n_spills", None))
            res["prod", name] = bench(graphed([
                (lambda c=c, bt=bt, meter=meter: decode(c, q, bt, sl, num_splits=S, meter=meter, validate=False,
                                                        epilogue=False)) for c, bt in caches]), False)
            grid = VARIANTS_ON if meter else VARIANTS_OFF
            for pages, warps, stages in grid:
                kw = dict(meter=meter, pages=pages, num_warps=warps, num_stages=stages)
                try:
                    swap_decode(caches[0][0], q, caches[0][1], sl, S, **kw)
                    t = bench(graphed([(lambda c=c, bt=bt, kw=kw: swap_decode(c, q, bt, sl, S, **kw))
                                       for c, bt in caches]), False)
                except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                    print(f"swap {name} p{pages} w{warps} s{stages} failed: {type(e).__name__}: {str(e)[:300]}",
                          flush=True)
                    continue
                k = swap_decode.compiled
                print(f"#   swap {name} p{pages} w{warps} s{stages}: {t:.4f} ms, regs {getattr(k, 'n_regs', None)} "
                      f"spills {getattr(k, 'n_spills', None)}", flush=True)
                if ("swap", name) not in res or t < res["swap", name]:
                    res["swap", name] = t
                    k = swap_decode.compiled
                    regs["swap", name] = (getattr(k, "n_regs", None), getattr(k, "n_spills", None), pages, warps, stages)
        g = lambda k: res.get(k, float("nan"))  # noqa: E731
        print(f"| {B} | {n} | {g(('prod', 'off')):.4f} | {g(('swap', 'off')):.4f} | {g(('prod', 'on')):.4f} "
              f"| {g(('swap', 'on')):.4f} | {g(('swap', 'off')) / g(('prod', 'off')):.2f} "
              f"| {g(('swap', 'on')) / g(('prod', 'on')):.2f} | {regs['prod', 'on']}/{regs['prod', 'off']} "
              f"| {regs.get(('swap', 'on'))}/{regs.get(('swap', 'off'))} (Δo {err:.1e}) |", flush=True)
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
