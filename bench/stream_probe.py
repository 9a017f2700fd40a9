"""Probe (issue 10, diagnosis only): why the unmetered int8 decode reads 1.2-1.9 TB/s where bf16
SDPA reads 2.7-4.7, and whether loading the next tile's codes before computing the current one
(register double-buffering of the raw int8 bytes) closes it.

The production loop (kernels/decode_kernel.py) loads a tile's K̂ and V̂ᵀ codes at the top of an iteration
and converts them at once: the A operands of the transposed dots live in registers, so Triton's
pipeliner does not stage them through shared memory, and a program has no load in flight while it
converts, dots and exponentiates. Variants timed side by side on the same caches (kernel only,
CUDA-graph replay, Hq/Hkv 32/8, d 128, int8, block size 16, randomly permuted block table):

    read      the same addressing (block table, 2 KB pages), loads only: the ceiling of this layout
    base      the production tile loop (transposed dots; meter on: token levels, bf16 hi+lo dot)
    pf        base + the next tile's raw int8 codes, scales (and witnesses) loaded before the
              current tile is computed; block-table entries two tiles ahead

    python bench/stream_probe.py                       # H200
    TRITON_INTERPRET=1 python bench/stream_probe.py --check
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

from kernels.decode import decode  # noqa: E402
from kernels.decode_steps import _key_level  # noqa: E402
from kernels.key_levels import KEY_LEVELS, X0  # noqa: E402
from kernels.write import INTERPRET  # noqa: E402

#: int8 → bf16 without the conversion pipe (exact): for two's-complement x, y = 0x4300 | (x & 0x7F)
#: is 128 + (x & 0x7F) and z = 0x4300 | (x & 0x80) is 128 (x ≥ 0) or 256 (x < 0), so y − z = x.
#: Four codes per 32-bit register: two prmt (bytes → 16-bit lanes), four lop3, two bf16x2 fma.
_I8_TO_BF16 = tl.constexpr("""{
.reg .b32 lo, hi, ylo, yhi, zlo, zhi, m1;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
lop3.b32 ylo, lo, 0x007F007F, 0x43004300, 0xea;
lop3.b32 yhi, hi, 0x007F007F, 0x43004300, 0xea;
lop3.b32 zlo, lo, 0x00800080, 0x43004300, 0xea;
lop3.b32 zhi, hi, 0x00800080, 0x43004300, 0xea;
mov.b32 m1, 0xBF80BF80;
fma.rn.bf16x2 $0, zlo, m1, ylo;
fma.rn.bf16x2 $1, zhi, m1, yhi;
}""")


@triton.jit
def _i8_bf16(x):
    return tl.inline_asm_elementwise(_I8_TO_BF16, "=r,=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _conv_check_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, _i8_bf16(tl.load(X + i)))


@triton.jit
def _probe_kernel(
    Q, KC, VC, KS, VS, KW, VW, BT, SL,
    M_OUT, L_OUT, ACC_OUT, HIST_OUT,
    sm_scale, num_splits,
    s_qb, s_qh, s_cb, s_ch, s_ct, s_sb, s_sh, s_st, s_wb, s_wh, s_wt, s_vwb, s_vwh, s_btb, Hq,
    X0: tl.constexpr, K: tl.constexpr,
    GQ: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, T: tl.constexpr, PAGES: tl.constexpr,
    NB: tl.constexpr, METER: tl.constexpr, LOWP: tl.constexpr, MODE: tl.constexpr,
):
    # MODE 0: read only; 1: base; 2: register prefetch of the next tile
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
    BT += b * s_btb
    sink = tl.zeros([BLOCK_N, D], tl.int32)
    # prologue of the prefetching loop: tile 0's codes, tile 1's block ids
    page0 = p_start + pg_in
    valid0 = (page0 < p_end) & (page0 * T + off < seq_len)
    blk0 = tl.load(BT + page0, mask=page0 < p_end, other=0).to(tl.int64)
    bt1 = tl.load(BT + page0 + PAGES, mask=page0 + PAGES < p_end, other=0)
    cb0 = blk0 * s_cb + kvh * s_ch + off * s_ct
    sb0 = blk0 * s_sb + kvh * s_sh + off * s_st
    kc_n = tl.load(KC + cb0[:, None] + d[None, :], mask=valid0[:, None], other=0)
    vT_n = tl.load(VC + cb0[None, :] + d[:, None], mask=valid0[None, :], other=0)
    ks_n = tl.load(KS + sb0, mask=valid0, other=0.0)
    vs_n = tl.load(VS + sb0, mask=valid0, other=0.0)
    wb0 = blk0 * s_wb + kvh * s_wh + off * s_wt
    wn_n = tl.load(KW + wb0, mask=valid0, other=0.0)
    phi_n = tl.load(VW + blk0 * s_vwb + kvh * s_vwh + off, mask=valid0, other=0.0)
    for p0 in range(p_start, p_end, PAGES):
        page = p0 + pg_in
        tok = page * T + off
        valid = (page < p_end) & (tok < seq_len)
        if MODE == 2:
            kc = kc_n
            vT = vT_n
            ks = ks_n.to(tl.float32)
            vs = vs_n.to(tl.float32)
            wraw = wn_n
            phiraw = phi_n
            # issue the next tile's loads now: they are in flight while this tile computes
            pn = page + PAGES
            vn = (pn < p_end) & (pn * T + off < seq_len)
            blkn = bt1.to(tl.int64)
            bt1 = tl.load(BT + pn + PAGES, mask=pn + PAGES < p_end, other=0)
            cbn = blkn * s_cb + kvh * s_ch + off * s_ct
            sbn = blkn * s_sb + kvh * s_sh + off * s_st
            kc_n = tl.load(KC + cbn[:, None] + d[None, :], mask=vn[:, None], other=0)
            vT_n = tl.load(VC + cbn[None, :] + d[:, None], mask=vn[None, :], other=0)
            ks_n = tl.load(KS + sbn, mask=vn, other=0.0)
            vs_n = tl.load(VS + sbn, mask=vn, other=0.0)
            if METER:
                wn_n = tl.load(KW + blkn * s_wb + kvh * s_wh + off * s_wt, mask=vn, other=0.0)
                phi_n = tl.load(VW + blkn * s_vwb + kvh * s_vwh + off, mask=vn, other=0.0)
        else:
            blk = tl.load(BT + page, mask=page < p_end, other=0).to(tl.int64)
            cbase = blk * s_cb + kvh * s_ch + off * s_ct
            sbase = blk * s_sb + kvh * s_sh + off * s_st
            kc = tl.load(KC + cbase[:, None] + d[None, :], mask=valid[:, None], other=0)  # [N, D]
            vT = tl.load(VC + cbase[None, :] + d[:, None], mask=valid[None, :], other=0)  # [D, N]
            ks = tl.load(KS + sbase, mask=valid, other=0.0).to(tl.float32)
            vs = tl.load(VS + sbase, mask=valid, other=0.0).to(tl.float32)
            wraw = wn_n
            phiraw = phi_n
            if METER:
                wraw = tl.load(KW + blk * s_wb + kvh * s_wh + off * s_wt, mask=valid, other=0.0)
                phiraw = tl.load(VW + blk * s_vwb + kvh * s_vwh + off, mask=valid, other=0.0)
        if MODE == 0:
            sink += kc.to(tl.int32) + tl.trans(vT).to(tl.int32)
        else:
            if LOWP and MODE == 3:
                kcc = _i8_bf16(kc)
                vTc = _i8_bf16(vT)
            elif LOWP:
                kcc = kc.to(Q.dtype.element_ty)
                vTc = vT.to(Q.dtype.element_ty)
            else:
                kcc = kc.to(tl.float32)
                vTc = vT.to(tl.float32)
            sT = tl.dot(kcc, qT) * (ks * sm_scale)[:, None]  # [N, H]
            sT = tl.where(valid[:, None], sT, float("-inf"))
            m_new = tl.maximum(m, tl.max(sT, axis=0))
            alpha = tl.exp(m - m_new)
            pT = tl.exp(sT - m_new[None, :])
            l = l * alpha + tl.sum(pT, axis=0)
            pvT = pT * vs[:, None]
            if LOWP:
                pvT = pvT.to(Q.dtype.element_ty)
            accT = accT * alpha[None, :] + tl.dot(vTc, pvT)
            if METER:
                wn = tl.where(valid, wraw.to(tl.float32), 0.0)
                phi = phiraw.to(tl.float32)
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
    if MODE == 0:
        l += tl.sum(tl.sum(sink, axis=1), axis=0).to(tl.float32)
    o_idx = (b * Hq + heads) * num_splits + sp
    tl.store(M_OUT + o_idx, m, mask=hmask)
    tl.store(L_OUT + o_idx, l, mask=hmask)
    tl.store(ACC_OUT + o_idx[None, :] * D + d[:, None], accT, mask=hmask[None, :])
    if METER:
        tl.store(HIST_OUT + o_idx[None, :] * NB + binr[:, None], histT, mask=hmask[None, :])


MODES = {"read": 0, "base": 1, "pf": 2, "fastcvt": 3}


def probe_decode(cache, q, bt, sl, num_splits, meter=True, mode="base", pages=8, num_warps=4, num_stages=2):
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
    k = _probe_kernel[(B, Hkv, S)](
        q, cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_wit, cache.v_wit, bt, sl,
        m, l, acc, hist, 1 / math.sqrt(D), S,
        q.stride(0), q.stride(1), *cache.k_codes.stride()[:3], *cache.k_scale.stride()[:3],
        *cache.k_wit.stride()[:3], *cache.v_wit.stride()[:2], bt.stride(0), Hq,
        X0=X0, K=KEY_LEVELS, GQ=GQ, BLOCK_H=max(16, triton.next_power_of_2(GQ)), D=D, T=cache.block_size,
        PAGES=pages, NB=NB, METER=meter and mode != "read", LOWP=lowp, MODE=MODES[mode], num_warps=num_warps, **extra)
    probe_decode.compiled = k
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
    ref = decode(c, q, bt, sl, num_splits=3, meter=True)
    for pages in (2, 4):
        o0, h0 = merged(*probe_decode(c, q, bt, sl, 3, mode="base", pages=pages))
        o1, h1 = merged(*probe_decode(c, q, bt, sl, 3, mode="pf", pages=pages))
        assert float((o0 - ref.o).abs().max()) < 1e-5
        assert torch.equal(o0, o1) and torch.equal(h0, h1), pages
    print("stream probe: base and prefetch agree with decode() and with each other")


def production(shapes):
    """The production kernel (whole decode() minus the epilogue) at its defaults and with the tile
    size, pipeline stages and block-table prefetch forced: an A/B of ``kernels.plan.tile_config``."""
    from bench.decode import bench, graphed, int8_shape
    from kernels.plan import tile_config

    dev = "cuda"
    Hq, Hkv, D = 32, 8, 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for shp in shapes.split(","):
        B, n = (int(x) for x in shp.split(":"))
        kvb, caches, q, sl, S = int8_shape(B, n, Hq, Hkv, D, dev, sms)
        for meter in (False, True):
            default = tile_config(meter)  # (the Tile at few programs per SM)
            for kw in ({}, dict(pages_per_tile=8, num_stages=2), dict(pages_per_tile=4, num_stages=1),
                       dict(pages_per_tile=8, num_stages=1), dict(prefetch_bt=not meter)):
                if not meter and kw == dict(pages_per_tile=4, num_stages=1):
                    continue  # (faulted under graph replay with the old loads, RESULTS.md run G; bench/tile_ab.py times it now)
                t = bench(graphed([(lambda c=c, bt=bt, kw=kw: decode(
                    c, q, bt, sl, num_splits=S, meter=meter, validate=False, epilogue=False, **kw))
                    for c, bt in caches]), False)
                print(f"B={B} n={n} S={S} meter={'on ' if meter else 'off'} default(tokens, stages)={default} "
                      f"{kw or 'defaults'}: {t:.4f} ms", flush=True)
        del caches
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--production", action="store_true",
                    help="time kernels.decode.decode (kernel only) at its default tile_config (kernels.plan) and at alternatives")
    ap.add_argument("--shapes", default="1:32768,8:32768,32:32768,8:131072")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    if args.production:
        return production(args.shapes)
    from bench.decode import bench, graphed, int8_shape, time_sdpa

    dev = "cuda"
    Hq, Hkv, D = 32, 8, 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.arange(-128, 128, device=dev, dtype=torch.int16).to(torch.int8).repeat(4)
    y = torch.empty(x.shape, device=dev, dtype=torch.bfloat16)
    _conv_check_kernel[(1,)](x, y, N=x.numel())
    bad = int((y != x.to(torch.bfloat16)).sum())
    print(f"# int8 -> bf16 bit trick: {bad} of {x.numel()} values differ from torch's conversion", flush=True)
    assert bad == 0
    variants = [("read", False, 4, 4, 2),
                ("base", False, 8, 4, 2), ("base", False, 8, 4, 1), ("base", False, 4, 4, 2), ("base", False, 4, 4, 1),
                ("base", False, 2, 4, 1), ("base", False, 4, 8, 1), ("pf", False, 4, 4, 1), ("fastcvt", False, 4, 4, 1),
                ("base", True, 8, 4, 2), ("base", True, 8, 4, 1), ("base", True, 4, 4, 1), ("base", True, 8, 8, 1),
                ("base", True, 16, 8, 1)]
    for shp in args.shapes.split(","):
        B, n = (int(x) for x in shp.split(":"))
        kvb, caches, q, sl, S = int8_shape(B, n, Hq, Hkv, D, dev, sms)
        t_sdpa = time_sdpa(q, Hkv, n, max(1, math.ceil(4 * 60e6 / (B * n * Hkv * D * 4))))
        refs = {meter: decode(caches[0][0], q, caches[0][1], sl, num_splits=S, meter=meter, validate=False)
                for meter in (False, True)}
        t_prod = {meter: bench(graphed([(lambda c=c, bt=bt, meter=meter: decode(
            c, q, bt, sl, num_splits=S, meter=meter, validate=False, epilogue=False)) for c, bt in caches]), False)
            for meter in (False, True)}
        print(f"# B={B} n={n} S={S}: sdpa {t_sdpa:.4f} ms ({2 * B * n * Hkv * D * 2 / t_sdpa / 1e9:.2f} TB/s); "
              f"production kernel off {t_prod[False]:.4f} ms, on {t_prod[True]:.4f} ms", flush=True)
        for mode, meter, pages, warps, stages in variants:
            kw = dict(meter=meter, mode=mode, pages=pages, num_warps=warps, num_stages=stages)
            try:
                o, h = merged(*probe_decode(caches[0][0], q, caches[0][1], sl, S, **kw))
                err = float("nan") if mode == "read" else float((o - refs[meter].o).abs().max() / refs[meter].o.abs().max())
                t = bench(graphed([(lambda c=c, bt=bt, kw=kw: probe_decode(c, q, bt, sl, S, **kw))
                                   for c, bt in caches]), False)
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                print(f"  {mode} meter={meter} p{pages} w{warps} s{stages} failed: {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                continue
            k = probe_decode.compiled
            ref_t = t_prod[meter]
            print(f"  {mode:4s} {'on ' if meter else 'off'} p{pages} w{warps} s{stages}: {t:.4f} ms  "
                  f"{kvb / t / 1e9:.2f} TB/s  x prod {t / ref_t:.3f}  sdpa/x {t_sdpa / t:.3f}  "
                  f"regs {getattr(k, 'n_regs', None)} spills {getattr(k, 'n_spills', None)}  rel.err {err:.1e}",
                  flush=True)
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
