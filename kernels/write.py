"""Write path (SPEC §1, §5, §8): quantize new K/V tokens and write their witnesses, one pass.

    write_kv(cache, k, v, block_table, seq_ids, positions)
        k, v         [N, Hkv, D]       new tokens (any float dtype; the model's exact values)
        block_table  [B, max_pages]    int32 physical block ids per sequence (the decode's table)
        seq_ids      [N] int           the sequence of each token
        positions    [N] int           each token's logical index in its sequence

The slot of a token is derived here, ``block_table[seq, pos // T]·T + pos % T``, from the same
(sequence, logical index) pair the decode reads it by: the int8_dither key is that logical
index, so the write and the decode's regeneration of the dither have one source of truth and
cannot disagree (SPEC §5).

One program per (tile of tokens, kv head) quantizes K and V with the cache's scheme, stores codes,
float16 scales (the smallest float16 s with s·divisor ≥ max|x|, computed exactly), the exact
copy, and the witnesses: per group ‖(k̂ − k)[g]‖, ‖v̂ − v‖, ‖v̂‖ and κ ≥ ‖k̂‖, each computed
scaled by its largest entry (no underflow of the squares), inflated by KERNEL_REL_SLACK, floored
at KERNEL_WITNESS_FLOOR for lossy schemes, and rounded **up** into float16 (per token) or merged into the block's
float32 running max with an atomic max (per block; ν and κ with ``PagedKV.block_norms``). ``int8_dither`` draws its
dither in-kernel from the counter-based hash of ``witcert.schemes`` (bit-identical). Under TRITON_INTERPRET the float→fp8
cast is wrong, so fp8 codes are made by torch first and the kernel only loads them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from contract.schemes import SCHEMES

from .fp_bounds import KERNEL_REL_SLACK, KERNEL_WITNESS_FLOOR, sketch_gamma
from .ids import (
    FP8_E4M3_ID,
    FP8_E4M3_RES_FLOOR,
    FP8_E4M3_RES_REL,
    FP8_E4M3_SCALED_ID,
    FP8_E5M2_ID,
    FP8_E5M2_RES_FLOOR,
    FP8_E5M2_RES_REL,
    FP8_SCALED_DIVISOR,
    GROUP,
    INT4_DIVISOR,
    INT4_GROUP_ID,
    INT8_DITHER_ID,
    INT8_ID,
    KIVI2_DIVISOR,
    KIVI2_ID,
    NONE_ID,
)
from .interpret import INTERPRET, INTERPRET_TILE_TOKENS, f32, narrow, torch_fp8_codes
from .paged import SCHEME_IDS, PagedKV, page_scaled_keys

#: the divisors the kernel launches with, from the scheme table (checked against SPEC's declared
#: value by proofs_bridge: a drift of either the table or these fails the bridge)
KERNEL_DITHER_DIVISOR = SCHEMES["int8_dither"].divisor
KERNEL_INT8_DIVISOR = SCHEMES["int8"].divisor


@triton.jit
def mix32(x):
    """lowbias32 on uint32 (same as witcert.schemes._mix32)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * tl.full((), 0x846CA68B, tl.uint32)
    x = x ^ (x >> 16)
    return x


@triton.jit
def token_hash(seed, layer, kv_head, position, stream):
    h = mix32(tl.cast(seed, tl.uint32) ^ tl.full((), 0x9E3779B9, tl.uint32))
    h = mix32(h ^ tl.cast(layer, tl.uint32))
    h = mix32(h ^ tl.cast(kv_head, tl.uint32))
    h = mix32(h ^ tl.cast(position, tl.uint32))
    h = mix32(h ^ tl.cast(stream, tl.uint32))
    return h


@triton.jit
def dither_from_hash(h_tok, ch):
    """u = (2k + 1)·2^-24 − ½, k = top 23 bits of mix(h_tok ^ ch·φ) (witcert.schemes.dither_u)."""
    h = mix32(h_tok ^ (ch.to(tl.uint32) * tl.full((), 0x9E3779B9, tl.uint32)))
    k = (h >> 9).to(tl.int32)
    return (2 * k + 1).to(tl.float32) * (1.0 / 16777216.0) - 0.5


@triton.jit
def fp16_scale_up(amax, DIVISOR: tl.constexpr):
    """Smallest float16 s with s·DIVISOR ≥ amax (exact: s·DIVISOR is exact in fp32)."""
    s = (amax / DIVISOR).to(tl.float16)
    sf = s.to(tl.float32)
    bits = s.to(tl.int16, bitcast=True)
    up = (bits + 1).to(tl.float16, bitcast=True)
    down = (bits - 1).to(tl.float16, bitcast=True)
    s = tl.where(sf * DIVISOR < amax, up, s)
    s = tl.where((bits > 0) & (down.to(tl.float32) * DIVISOR >= amax) & (sf * DIVISOR >= amax), down, s)
    return s


@triton.jit
def f16_round_down(x):
    """Largest float16 ≤ x (witcert.schemes.round_down_f16)."""
    y = x.to(tl.float16)
    bits = y.to(tl.int16, bitcast=True)
    step = tl.where(y > 0, bits - 1, tl.where(y < 0, bits + 1, tl.full(bits.shape, -32767, tl.int16)))
    return tl.where(y.to(tl.float32) > x, step.to(tl.float16, bitcast=True), y)


@triton.jit
def f16_round_up(x):
    """Round a non-negative fp32 value up into float16."""
    y = x.to(tl.float16)
    bits = y.to(tl.int16, bitcast=True)
    up = (bits + 1).to(tl.float16, bitcast=True)
    return tl.where(y.to(tl.float32) < x, up, y)


@triton.jit
def scaled_norm(x, sel):
    """Row norms of x over the columns where ``sel``, computed as m·sqrt(Σ (x/m)²), m = max|x|:
    squares cannot underflow (or overflow); ≥ m; not yet inflated or rounded. A NaN entry gives NaN (the GPU's max
    drops a NaN operand: the reduction's m does, so the last max keeps the sum's NaN explicitly; run B8, 2026-12-06:
    a NaN key input stored a finite witness on the H100, 0.039, where the interpreter stored NaN)."""
    xm = tl.where(sel, x, 0.0)
    am = tl.max(tl.abs(xm), axis=1)
    safe = tl.where(am > 0, am, 1.0)
    y = xm / safe[:, None]
    return tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)) * am, am, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def sketch_beta(xh, sf, sb, SCHEME: tl.constexpr):
    """β_i ≥ |x̂_i − x_i| by the scheme's construction (``witcert.schemes.residual_range``; the key sketch's
    range, ``contract.sketch``), [rows, D] fp32: half the scale step (``sf`` [rows, 1] per token, ``sb``
    [rows, D] per group / channel), or half an fp8 spacing, max(|x̂|·REL, s·FLOOR). Every product is exact
    (powers of two times stored values), so the write and the decode compute the same β bit for bit."""
    if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:
        beta = sb * 0.5
    elif SCHEME == FP8_E4M3_ID or SCHEME == FP8_E4M3_SCALED_ID:
        beta = tl.maximum(tl.abs(xh) * FP8_E4M3_RES_REL, sf * FP8_E4M3_RES_FLOOR)
    elif SCHEME == FP8_E5M2_ID:
        beta = tl.maximum(tl.abs(xh) * FP8_E5M2_RES_REL, sf * FP8_E5M2_RES_FLOOR)
    else:  # int8, int8_dither: half the token's scale
        beta = tl.broadcast_to(sf * 0.5, xh.shape)
    return beta


@triton.jit
def sketch_value(code, LEVELS: tl.constexpr):
    """The sketch level of a code in units of β/L: 2·code + 1 − L (an odd integer, exact in bf16 / fp16)."""
    return 2.0 * code + (1.0 - LEVELS)


@triton.jit
def _store_codes(C, S, Z, E, caddr, saddr, smask, eaddr, code, s, zg, x, m2,
                 ASYM: tl.constexpr, STORE_EXACT: tl.constexpr):
    """Store one role's codes, scale(s) (and the zeros of the asymmetric schemes) and the exact copy."""
    tl.store(C + caddr, code, mask=m2)
    tl.store(S + saddr, s, mask=smask)
    if ASYM:
        tl.store(Z + saddr, zg, mask=smask)
    if STORE_EXACT:
        tl.store(E + eaddr, narrow(x, E), mask=m2)  # (narrow: the interpreter's own bf16 cast truncates)


@triton.jit
def _asym_codes(x, zb, sb, TOP: tl.constexpr):
    """Codes and x̂ of the asymmetric schemes (witcert.schemes._asym_f16): y = (x − z)/s,
    c = floor(y) + [y − floor(y) ≥ ½] clamped to [0, TOP], 0 where s = 0; x̂ = z + s·c."""
    y = tl.math.div_rn(x - zb, tl.where(sb > 0, sb, 1.0))
    fl = tl.floor(y)
    c = tl.clamp(fl + tl.where(y - fl >= 0.5, 1.0, 0.0), 0.0, TOP)
    c = tl.where(sb > 0, c, 0.0)
    return c, zb + sb * c


@triton.jit
def _int8_codes(x, amax, DIVISOR: tl.constexpr):
    """int8: s = the smallest fp16 with s·DIVISOR ≥ max|x|, c = x / s rounded half up in [−127, 127] (0 where
    s = 0). Returns (codes, s [BLOCK_T], x̂ = s·c)."""
    s = fp16_scale_up(amax, DIVISOR)
    sf = s.to(tl.float32)[:, None]
    y = tl.math.div_rn(x, tl.where(sf > 0, sf, 1.0))
    fl = tl.floor(y)
    c = fl + tl.where(y - fl >= 0.5, 1.0, 0.0)  # round half up, exactly
    c = tl.clamp(c, -127.0, 127.0)
    c = tl.where(sf > 0, c, 0.0)
    code = c.to(tl.int8)
    xh = sf * c
    return code, s, xh


@triton.jit
def _dither_codes(x, amax, seed, layer, h, pos, which, d_idx, DIVISOR: tl.constexpr):
    """int8_dither: c = floor(x / s + u + ½) with the token's counter-based dither u (``token_hash``, stream
    ``which``). Returns (codes, s [BLOCK_T], x̂ = s·(c − u), the κ / ν magnitude s(‖c‖ + ‖u‖(1 + 2^-7)))."""
    s = fp16_scale_up(amax, DIVISOR)
    sf = s.to(tl.float32)[:, None]
    h_tok = token_hash(seed, layer, h, pos, which)
    u = dither_from_hash(h_tok[:, None], d_idx[None, :])
    y = tl.math.div_rn(x, tl.where(sf > 0, sf, 1.0))
    fl = tl.floor(y)
    c = fl + tl.where(y - fl >= 0.5 - u, 1.0, 0.0)  # floor(y + u + ½), exactly
    c = tl.where(sf > 0, c, 0.0)
    code = c.to(tl.int8)
    xh = sf * (c - u)
    # κ / ν ≥ s(‖c‖ + ‖u_hi‖ + ‖u_lo‖): the decode dots c, u_hi and u_lo (bf16 parts of u, ‖u_hi‖ + ‖u_lo‖ ≤ ‖u‖(1 + 2^-8))
    mag = s.to(tl.float32) * (scaled_norm(c, d_idx[None, :] >= 0) + scaled_norm(u, d_idx[None, :] >= 0) * 1.0078125)
    return code, s, xh, mag


@triton.jit
def _int4_codes(x, BLOCK_T: tl.constexpr, D: tl.constexpr):
    """int4_group: per 32-channel group an fp16 zero (down) and scale (up), codes in [0, 15], two per byte
    (channels i, i + D/2). Returns (packed codes [BLOCK_T, D/2], s, x̂, z [BLOCK_T, D/32], s per channel [BLOCK_T, D])."""
    NG: tl.constexpr = D // GROUP
    D2: tl.constexpr = D // 2
    x3 = tl.reshape(x, [BLOCK_T, NG, GROUP])
    zg = f16_round_down(tl.min(x3, axis=2))
    zf = zg.to(tl.float32)
    sgr = fp16_scale_up(tl.max(x3, axis=2) - zf, INT4_DIVISOR)
    sgf = sgr.to(tl.float32)
    zb = tl.reshape(tl.broadcast_to(zf[:, :, None], [BLOCK_T, NG, GROUP]), [BLOCK_T, D])
    sb = tl.reshape(tl.broadcast_to(sgf[:, :, None], [BLOCK_T, NG, GROUP]), [BLOCK_T, D])
    y = tl.math.div_rn(x - zb, tl.where(sb > 0, sb, 1.0))
    fl = tl.floor(y)
    c = tl.clamp(fl + tl.where(y - fl >= 0.5, 1.0, 0.0), 0.0, 15.0)
    c = tl.where(sb > 0, c, 0.0)
    xh = zb + sb * c
    lo, hi = tl.split(tl.permute(tl.reshape(c, [BLOCK_T, 2, D2]), (0, 2, 1)))
    code = (lo + 16.0 * hi).to(tl.uint8)
    return code, sgr, xh, zg, sb


@triton.jit
def _kivi2_codes(x, m2, WHICH: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr):
    """kivi2: 2-bit codes, four per byte (channels i, i + D/4, i + D/2, i + 3D/4); fp16 zero (down) and scale (up)
    per channel of the page for keys (WHICH 0: over the program's valid rows), per 32 channels of a token for
    values. Returns (packed codes [BLOCK_T, D/4], s, x̂, z, s per channel [BLOCK_T, D])."""
    NG: tl.constexpr = D // GROUP
    D4: tl.constexpr = D // 4
    if WHICH == 0:  # keys: per channel over the page's tokens (the program's valid rows)
        zc = f16_round_down(tl.min(tl.where(m2, x, float("inf")), axis=0))  # [D]
        zf = zc.to(tl.float32)
        sc = fp16_scale_up(tl.max(tl.where(m2, x, float("-inf")), axis=0) - zf, KIVI2_DIVISOR)
        zb = tl.broadcast_to(zf[None, :], [BLOCK_T, D])
        sb = tl.broadcast_to(sc.to(tl.float32)[None, :], [BLOCK_T, D])
        s = tl.broadcast_to(sc[None, :], [BLOCK_T, D])
        zg = tl.broadcast_to(zc[None, :], [BLOCK_T, D])
    else:  # values: per 32 channels of a token (int4_group's groups)
        x3 = tl.reshape(x, [BLOCK_T, NG, GROUP])
        zg = f16_round_down(tl.min(x3, axis=2))
        zf = zg.to(tl.float32)
        s = fp16_scale_up(tl.max(x3, axis=2) - zf, KIVI2_DIVISOR)
        zb = tl.reshape(tl.broadcast_to(zf[:, :, None], [BLOCK_T, NG, GROUP]), [BLOCK_T, D])
        sb = tl.reshape(tl.broadcast_to(s.to(tl.float32)[:, :, None], [BLOCK_T, NG, GROUP]), [BLOCK_T, D])
    c, xh = _asym_codes(x, zb, sb, KIVI2_DIVISOR)
    # four codes per byte: byte i holds channels i, i + D/4, i + D/2, i + 3D/4 (bits 0-1 … 6-7)
    c22 = tl.reshape(tl.permute(tl.reshape(c, [BLOCK_T, 4, D4]), (0, 2, 1)), [BLOCK_T, D4, 2, 2])
    ev, od = tl.split(c22)  # channel quarters k = 2·k1 + k0: k0 = 0 | 1
    c0, c2 = tl.split(ev)
    c1, c3 = tl.split(od)
    code = (c0 + 4.0 * c1 + 16.0 * c2 + 64.0 * c3).to(tl.uint8)
    return code, s, xh, zg, sb


@triton.jit
def _fp8_codes(x, amax, C, PRE, m2, BLOCK_T: tl.constexpr, SCHEME: tl.constexpr, PRECODED: tl.constexpr):
    """The fp8 schemes: raw casts into C's dtype, or scaled per token (fp8_e4m3_scaled); PRECODED (the
    interpreter): the codes torch made, loaded from the pointers PRE. Returns (codes, s [BLOCK_T], x̂ = s·code)."""
    if SCHEME == FP8_E4M3_SCALED_ID:
        s = fp16_scale_up(amax, FP8_SCALED_DIVISOR)
    else:
        s = tl.full([BLOCK_T], 1.0, tl.float16)
    sf = s.to(tl.float32)[:, None]
    if PRECODED:
        code = tl.load(PRE, mask=m2, other=0.0)
    else:
        y = tl.math.div_rn(x, tl.where(sf > 0, sf, 1.0))
        # saturated at the format's largest finite code by the cast itself: on sm_90 Triton (3.6.0 and 3.7.1) lowers float32 → fp8e4nv /
        # fp8e5 to cvt.rn.satfinite (±code_max past the range, NaN kept), the same codes as ``witcert.schemes`` on any torch
        # (contract.schemes ``code_max``; tests/kernels/test_kernel_codegen.py requires the cast's operand to be this division). No clip
        # before it: every explicit one tried (nested tl.where in A5; min / max, with NaN propagation, tl.clamp, min / max then an fp16
        # trip for e4m3 in B3; min / max for e5m2) made the H100 (Triton 3.6.0) compute wrong witnesses from right codes (κ, ν, φ and W
        # off by up to two orders of magnitude either way, growing with the program id; bench/results/2026-12-06c/). Below sm_90 (read in
        # the PTX, not run): for sm_89 Triton 3.7.1 rounds to fp16 first, then the satfinite cvt (a double rounding: a code can differ
        # from the reference's where y is not exact in fp16, the scaled scheme's; the witness is the stored code's, so sound), and 3.6.0
        # converts e5m2 in software, with no satfinite (an overflow may store ±inf: a non-finite witness that flags the row)
        code = y.to(C.dtype.element_ty)
    xh = sf * code.to(tl.float32)
    return code, s, xh


@triton.jit
def _quantize(x, C, PRE, m2, d_idx, seed, layer, h, pos, WHICH: tl.constexpr, DIV_INT8: tl.constexpr,
              DIV_DITHER: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr, SCHEME: tl.constexpr,
              PRECODED: tl.constexpr):
    """One role's (WHICH 0: keys, 1: values) rows ``x`` [BLOCK_T, D] fp32 in the scheme: (codes, scale(s) s, x̂,
    zeros zg, per-channel scales sb, ‖x̂‖-type magnitude for κ / ν). zg and sb are the asymmetric schemes'
    (int4_group, kivi2); the others return zg = s, sb = x̂ (unused)."""
    amax = tl.max(tl.abs(x), axis=1)
    if SCHEME == NONE_ID:
        s = tl.full([BLOCK_T], 1.0, tl.float16)
        code = narrow(x, C)  # (the interpreter's own bf16 cast truncates; ``kernels.interpret``)
        xh = f32(code)
        zg = s
        sb = xh
    elif SCHEME == INT8_ID:
        code, s, xh = _int8_codes(x, amax, DIV_INT8)
        zg = s
        sb = xh
    elif SCHEME == INT8_DITHER_ID:
        code, s, xh, mag = _dither_codes(x, amax, seed, layer, h, pos, WHICH, d_idx, DIV_DITHER)
        zg = s
        sb = xh
    elif SCHEME == INT4_GROUP_ID:
        code, s, xh, zg, sb = _int4_codes(x, BLOCK_T, D)
    elif SCHEME == KIVI2_ID:
        code, s, xh, zg, sb = _kivi2_codes(x, m2, WHICH, BLOCK_T, D)
    else:  # the fp8 schemes: raw casts, or scaled per token
        code, s, xh = _fp8_codes(x, amax, C, PRE, m2, BLOCK_T, SCHEME, PRECODED)
        zg = s
        sb = xh
    if SCHEME != INT8_DITHER_ID:
        mag = scaled_norm(xh, d_idx[None, :] >= 0)
    return code, s, xh, zg, sb, mag


@triton.jit
def _code_addresses(cbase, rbase, off, d_idx, m2, rmask, WHICH: tl.constexpr, D: tl.constexpr, SCHEME: tl.constexpr):
    """(code addresses [BLOCK_T, bytes per token], scale / zero addresses, their mask) of one role's tile."""
    NG: tl.constexpr = D // GROUP
    ASYM: tl.constexpr = SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID
    if SCHEME == INT4_GROUP_ID:
        caddr = cbase[:, None] + tl.arange(0, D // 2)[None, :]
    elif SCHEME == KIVI2_ID:
        caddr = cbase[:, None] + tl.arange(0, D // 4)[None, :]
    else:
        caddr = cbase[:, None] + d_idx[None, :]
    if SCHEME == KIVI2_ID and WHICH == 0:  # one scale / zero per channel of the page, from its row 0
        saddr = rbase[:, None] + d_idx[None, :]
        smask = m2 & (off == 0)[:, None]
    elif ASYM:  # one scale / zero per 32 channels of a token
        saddr = rbase[:, None] + tl.arange(0, NG)[None, :]
        smask = m2
    else:
        saddr = rbase
        smask = rmask
    return caddr, saddr, smask


@triton.jit
def _sketch_witness(r, xh, s, sb, h, blk, off, s_skb, s_skh, s_skt, m2, SK, WGT, INFL: tl.constexpr, FLOOR: tl.constexpr,
                    SK_GAMMA: tl.constexpr, ABS: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr,
                    SCHEME: tl.constexpr, SKB: tl.constexpr, WEIGHTED: tl.constexpr):
    """The sketch radius's key witness [BLOCK_T] (``contract.sketch``; G = 1, per token): with SKB > 0 the b-bit
    codes of r / β are packed and stored in SK (block ``blk``, kv head ``h``, offset ``off``) and W ≥ ‖(r − r̃)/a‖ + SK_GAMMA·‖r̃/a‖, else
    W ≥ ‖r/a‖; + the asymmetric schemes' 1-ulp term ABS·‖x̂/a‖. Not yet rounded into float16."""
    ASYM: tl.constexpr = SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID
    d_idx = tl.arange(0, D)
    allc = d_idx[None, :] >= 0
    if WEIGHTED:
        ainv = 1.0 / tl.load(WGT + h * D + d_idx)[None, :]  # powers of two: exact
    else:
        ainv = tl.full([1, D], 1.0, tl.float32)
    if SKB > 0:
        LV: tl.constexpr = 1 << SKB
        if SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID:
            beta = sketch_beta(xh, xh, sb, SCHEME)
        elif SCHEME == INT8_ID or SCHEME == INT8_DITHER_ID or SCHEME == FP8_E4M3_SCALED_ID:
            beta = sketch_beta(xh, s.to(tl.float32)[:, None], xh, SCHEME)
        else:
            beta = sketch_beta(xh, tl.full([BLOCK_T, 1], 1.0, tl.float32), xh, SCHEME)
        ok = beta > 0
        yq = tl.floor((tl.math.div_rn(r, tl.where(ok, beta, 1.0)) + 1.0) * (LV / 2))
        skc = tl.where(ok & (yq == yq), tl.clamp(yq, 0.0, LV - 1.0), 0.0)
        rt = beta * sketch_value(skc, LV) * (1.0 / LV)
        e = r - rt
        CPB: tl.constexpr = 8 // SKB
        DB: tl.constexpr = D // CPB
        # byte i holds channels i + k·D/CPB in bits k·SKB … (contract.sketch)
        c3 = tl.permute(tl.reshape(skc, [BLOCK_T, CPB, DB]), (0, 2, 1))  # [BLOCK_T, DB, CPB]
        shift = tl.exp2((tl.arange(0, CPB) * SKB).to(tl.float32))
        packed = tl.sum(c3 * shift[None, None, :], axis=2).to(tl.uint8)
        skaddr = blk * s_skb + h * s_skh + off * s_skt
        tl.store(SK + skaddr[:, None] + tl.arange(0, DB)[None, :], packed, mask=m2)
        ng = scaled_norm(e * ainv, allc) * INFL + SK_GAMMA * scaled_norm(rt * ainv, allc) + FLOOR
    else:
        ng = scaled_norm(r * ainv, allc) * INFL + FLOOR
    if ASYM:
        ng += ABS * scaled_norm(xh * ainv, allc)
    return ng


@triton.jit
def _store_up(ADDR, v, mask, PER_TOKEN: tl.constexpr):
    """A witness / norm ``v`` rounded up into float16 (per token), or merged into the block's float32 running max."""
    if PER_TOKEN:
        tl.store(ADDR, f16_round_up(v), mask=mask)
    else:
        # a NaN as +inf (flagged by the decode): the float atomic max compares bit patterns, and a NaN with its sign
        # bit set (x86's default NaN, the interpreter's) would lose to every finite value
        tl.atomic_max(ADDR, tl.where(v == v, v, float("inf")), mask=mask)


@triton.jit
def _group_witnesses(waddr, r, xh, gid, rmask, INFL: tl.constexpr, FLOOR: tl.constexpr, ABS: tl.constexpr,
                     G: tl.constexpr, ASYM: tl.constexpr, PER_TOKEN: tl.constexpr):
    """The per-group key witnesses ‖r[g]‖·INFL + FLOOR (+ ABS·‖x̂[g]‖ for the asymmetric schemes) at ``waddr`` + g."""
    for g in tl.static_range(G):
        ng = scaled_norm(r, gid[None, :] == g) * INFL + FLOOR
        if ASYM:
            ng += ABS * scaled_norm(xh, gid[None, :] == g)
        _store_up(waddr + g, ng, rmask, PER_TOKEN)


# N, seed and layer are not specialized on (a value of 1 or a multiple of 16 would compile its own binary): every
# call of a configuration runs one binary, the one ``witcert.selftest`` checks with its canary
@triton.jit(do_not_specialize=["N", "seed", "layer"])
def _write_kernel(
    K, V, SLOT, POS, GID,
    KC, VC, KS, VS, KZ, VZ, KW, VW, VN, KN, EK, EV, PK, PV, SK, WGT,
    seed, layer, N,
    s_kn, s_kh, s_vn, s_vh,
    s_cb, s_ch, s_ct,
    s_sb, s_sh, s_st,
    s_vsb, s_vsh, s_vst,
    s_eb, s_eh, s_et,
    s_wb, s_wh, s_wt,
    s_vwb, s_vwh, s_nb, s_nh,
    s_skb, s_skh, s_skt,
    INFL: tl.constexpr, FLOOR: tl.constexpr, DIV_INT8: tl.constexpr, DIV_DITHER: tl.constexpr,
    D: tl.constexpr, T: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr,
    SCHEME: tl.constexpr, PRECODED: tl.constexpr, PER_TOKEN: tl.constexpr, STORE_EXACT: tl.constexpr,
    SKB: tl.constexpr, WEIGHTED: tl.constexpr, SK_GAMMA: tl.constexpr, NORMS_PT: tl.constexpr = True,
):
    """One program per (tile of BLOCK_T new tokens, kv head): rows are tokens, columns channels.
    kivi2: BLOCK_T = T and a tile is one page from its offset 0 (the wrapper's contract), so a
    program sees every token of its key block. SKB / WEIGHTED: the key side writes the sketch radius's
    witness (``contract.sketch``) instead of the group witnesses: the b-bit codes of r / β (packed),
    and W ≥ ‖(r − r̃)/a‖ + SK_GAMMA·‖r̃/a‖ (the decode's sketch dot) + the asymmetric schemes' 1-ulp term."""
    i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    rmask = i < N
    d_idx = tl.arange(0, D)
    m2 = rmask[:, None]
    slot = tl.load(SLOT + i, mask=rmask, other=0).to(tl.int64)
    pos = tl.load(POS + i, mask=rmask, other=0)
    blk = slot // T
    off = slot % T
    gid = tl.load(GID + d_idx)
    cbase = blk * s_cb + h * s_ch + off * s_ct
    sbase = blk * s_sb + h * s_sh + off * s_st  # key scales (kivi2: s_st = 0, + the channel)
    vsbase = blk * s_vsb + h * s_vsh + off * s_vst  # value scales
    ebase = blk * s_eb + h * s_eh + off * s_et
    # int4_group, kivi2: z + s·c may be fused into one FMA elsewhere (the decode): cover a 1-ulp difference of x̂
    ASYM: tl.constexpr = SCHEME == INT4_GROUP_ID or SCHEME == KIVI2_ID
    ABS: tl.constexpr = 2.384185791015625e-07 if ASYM else 0.0  # 2^-22
    woff = off if PER_TOKEN else off * 0
    naddr = blk * s_nb + h * s_nh + (off if NORMS_PT else off * 0)  # ν, κ: NORMS_PT False: the page's running max
    i64 = i.to(tl.int64)[:, None]  # the input rows' offsets: N·s_kn passes 2^31 at 2M tokens of Hkv·D = 1024
    for which in tl.static_range(2):  # 0: keys, 1: values
        if which == 0:
            x = f32(tl.load(K + i64 * s_kn + h * s_kh + d_idx[None, :], mask=m2, other=0.0))
            pre = PK + i64 * s_kn + h * s_kh + d_idx[None, :]
        else:
            x = f32(tl.load(V + i64 * s_vn + h * s_vh + d_idx[None, :], mask=m2, other=0.0))
            pre = PV + i64 * s_vn + h * s_vh + d_idx[None, :]
        code, s, xh, zg, sb, mag = _quantize(x, KC if which == 0 else VC, pre, m2, d_idx, seed, layer, h, pos, which,
                                             DIV_INT8, DIV_DITHER, BLOCK_T, D, SCHEME, PRECODED)
        r = xh - x
        rbase = sbase if which == 0 else vsbase
        caddr, saddr, smask = _code_addresses(cbase, rbase, off, d_idx, m2, rmask, which, D, SCHEME)
        eaddr = ebase[:, None] + d_idx[None, :]
        if which == 0:
            _store_codes(KC, KS, KZ, EK, caddr, saddr, smask, eaddr, code, s, zg, x, m2, ASYM, STORE_EXACT)
            waddr = KW + blk * s_wb + h * s_wh + woff * s_wt
            if SKB > 0 or WEIGHTED:  # the sketch radius's witness (G = 1, per token: the wrapper's contract)
                ng = _sketch_witness(r, xh, s, sb, h, blk, off, s_skb, s_skh, s_skt, m2, SK, WGT, INFL, FLOOR, SK_GAMMA, ABS,
                                     BLOCK_T, D, SCHEME, SKB, WEIGHTED)
                tl.store(waddr, f16_round_up(ng), mask=rmask)
            else:
                _group_witnesses(waddr, r, xh, gid, rmask, INFL, FLOOR, ABS, G, ASYM, PER_TOKEN)
            kap = mag * INFL
            _store_up(KN + naddr, kap, rmask, NORMS_PT)
        else:
            _store_codes(VC, VS, VZ, EV, caddr, saddr, smask, eaddr, code, s, zg, x, m2, ASYM, STORE_EXACT)
            phi = scaled_norm(r, d_idx[None, :] >= 0) * INFL + ABS * mag + FLOOR
            nu = mag * INFL
            vaddr = blk * s_vwb + h * s_vwh + woff
            _store_up(VW + vaddr, phi, rmask, PER_TOKEN)
            _store_up(VN + naddr, nu, rmask, NORMS_PT)


def token_slots(cache: PagedKV, block_table: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor,
                validate: bool = True) -> torch.Tensor:
    """Physical slots ``block_table[seq, pos // T]·T + pos % T`` [N] int64 (range-checked when
    ``validate``: that needs a device-to-host sync, which a serving loop that owns the table skips)."""
    T = cache.block_size
    if block_table.dim() != 2:
        raise ValueError(f"block_table: expected [B, max_pages], got {tuple(block_table.shape)}")
    if seq_ids.dim() != 1 or positions.shape != seq_ids.shape:
        raise ValueError("seq_ids, positions: expected equal shapes [N]")
    dev = block_table.device
    seq = seq_ids.to(device=dev, dtype=torch.int64)
    pos = positions.to(device=dev, dtype=torch.int64)
    if validate and seq.numel() and (int(seq.min()) < 0 or int(seq.max()) >= block_table.shape[0]):
        raise ValueError(f"seq_ids: out of range for a block table of {block_table.shape[0]} sequences")
    if validate and pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= block_table.shape[1] * T):
        raise ValueError(f"positions: logical indices must lie in [0, {block_table.shape[1] * T}) (the block table's pages)")
    blk = block_table[seq, pos // T].to(torch.int64)
    if validate and blk.numel() and (int(blk.min()) < 0 or int(blk.max()) >= cache.k_codes.shape[0]):
        raise ValueError("block_table: a block id is out of range for the cache's blocks")
    return blk * T + pos % T


def write_kv(cache: PagedKV, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
             positions: torch.Tensor, store_exact: bool = True, validate: bool = True,
             slots: torch.Tensor | None = None) -> None:
    """Quantize and write ``k``, ``v`` ``[N, Hkv, D]`` into ``cache`` (see the module doc).
    ``validate=False`` skips the range checks of ``token_slots`` (no host sync). ``slots``: the
    caller's ``token_slots(cache, block_table, seq_ids, positions)`` [N] int64, already computed
    (a cache whose layers share one table layout computes it once per step); only with
    ``validate=False``."""
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k, v: expected equal shapes [N, Hkv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    N, H, D = k.shape
    if H != cache.num_kv_heads or D != cache.head_dim:
        raise ValueError(f"k: [N, {H}, {D}] does not match the cache's [*, {cache.num_kv_heads}, {cache.head_dim}]")
    if seq_ids.shape != (N,) or positions.shape != (N,):
        raise ValueError("seq_ids, positions: expected shape [N]")
    if k.dtype == torch.float64:
        raise ValueError("k: the kernels compute in fp32; a float64 model must use the reference path "
                         "(WitCertCache(..., backend='reference'))")
    if N == 0:
        return
    k = k.contiguous()
    v = v.contiguous()
    if slots is None:
        slots = token_slots(cache, block_table.to(k.device), seq_ids, positions, validate).to(k.device).contiguous()
    elif validate or slots.shape != (N,) or slots.dtype != torch.int64 or slots.device != k.device:
        raise ValueError("slots: pass token_slots' [N] int64 result on k's device, with validate=False")
    if positions.dtype != torch.int32 or positions.device != k.device or not positions.is_contiguous():
        positions = positions.to(device=k.device, dtype=torch.int32).contiguous()
    row = SCHEMES[cache.scheme]
    sid = SCHEME_IDS[cache.scheme]
    precoded = INTERPRET and row.code_dtype is not None and row.code_dtype.startswith("float8")
    pk = pv = k  # unused placeholders
    if precoded:  # interpreter only: torch makes the fp8 codes (same rounding as the GPU cast)
        pk = torch_fp8_codes(cache.scheme, k)
        pv = torch_fp8_codes(cache.scheme, v)
    kw = cache.k_wit
    lossy = row.lossy or k.dtype != cache.k_codes.dtype
    skb = cache.sketch_bits if cache.scheme != "none" else 0
    weighted = cache.has_weights
    ksk = cache.k_sketch if skb else kw
    BLOCK_T = INTERPRET_TILE_TOKENS if INTERPRET else 4
    per_page = page_scaled_keys(cache.scheme)
    if per_page:  # a program quantizes one page (one key block): BLOCK_T = T, tiles are pages
        BLOCK_T = cache.block_size
        if validate:
            _check_whole_pages(cache.block_size, seq_ids, positions)
    _write_kernel[(triton.cdiv(N, BLOCK_T), H)](
        k, v, slots, positions, cache.group_id,
        cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_zero, cache.v_zero, kw, cache.v_wit,
        cache.v_norm, cache.k_norm, cache.exact_k, cache.exact_v, pk, pv, ksk, cache.weights if weighted else kw,
        cache.seed, cache.layer, N,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
        cache.k_scale.stride(0), cache.k_scale.stride(1), 0 if per_page else cache.k_scale.stride(2),
        cache.v_scale.stride(0), cache.v_scale.stride(1), cache.v_scale.stride(2),
        *(cache.exact_k.stride()[:3] if store_exact else (0, 0, 0)),
        kw.stride(0), kw.stride(1), kw.stride(2),
        cache.v_wit.stride(0), cache.v_wit.stride(1), cache.v_norm.stride(0), cache.v_norm.stride(1),
        *(ksk.stride()[:3] if skb else (0, 0, 0)),
        INFL=1.0 + KERNEL_REL_SLACK, FLOOR=KERNEL_WITNESS_FLOOR if lossy else 0.0,
        DIV_INT8=KERNEL_INT8_DIVISOR, DIV_DITHER=KERNEL_DITHER_DIVISOR,
        D=D, T=cache.block_size, G=cache.num_groups, BLOCK_T=BLOCK_T,
        SCHEME=sid, PRECODED=precoded, PER_TOKEN=cache.per_token_witness, STORE_EXACT=store_exact,
        SKB=skb, WEIGHTED=weighted, SK_GAMMA=sketch_gamma(cache.scheme, D, skb) if skb else 0.0, NORMS_PT=cache.norms_per_token,
    )


def _check_whole_pages(T: int, seq_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """kivi2's write contract: the tokens are whole pages in order (token i·T + r is offset r of one
    page of one sequence), the last page possibly partial (its statistics are over its tokens; a
    later write of the whole page replaces them). ValueError otherwise (a host sync)."""
    N = positions.shape[0]
    pos = positions.to("cpu", torch.int64)
    seq = seq_ids.to("cpu", torch.int64)
    r = torch.arange(N) % T
    first = torch.arange(N) - r  # the index of the page's first token
    if not (torch.equal(pos % T, r) and torch.equal(pos // T, pos[first] // T) and torch.equal(seq, seq[first])):
        raise ValueError(f"write_kv(kivi2): the tokens must be whole pages of {T} in order (token i·{T} + r at offset "
                         "r of one page of one sequence; the last page may be partial): a key block is quantized "
                         "over all its tokens at once")

