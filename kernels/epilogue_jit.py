"""Triton code of the decode epilogue (SPEC §3, §4, §7, §8): TV⁺ of a histogram row and the fused
split-KV merge + meter record. The bounds it computes are stated in ``kernels.epilogue`` (module doc);
the launches are there too (``merge``, ``tv_from_hist``), the torch twin in ``kernels.epilogue_torch``.

    _tv_kernel[(R,)]           one program per histogram row (float64)
        MASS, LV   [R, NB]      p̂ masses per bin, bin levels (the last bin is the overflow bin)
        RMAX, XI, LAM [R]       the row's maximum radius, Ξ, Λ
        OUT        [R, 5]       (TV⁺, tanh, e-form, tilt, ρ)
        SCR        [R, 3·NBP + N1] float64 scratch (``epilogue.scratch_per_tier``)

    _merge_meter_kernel[(B·Hq,)]   one program per (sequence, query head), rows r = b·Hq + h
        M_IN, L_IN  [B·Hq, S]         fp32 split maxima and denominators
        ACC_IN      [B·Hq, S, D]      fp32 split outputs
        HIST_IN     [B·Hq, S, NB]     p̂-mass histograms (tier A bins, tier B bins, Σ p̂ φ last)
        STAT_IN     [B·Hq, S, 6]      max ‖W‖, max s, max φ, max ν, non-finite count, max κ
        Q           [B, Hq, D]        the query (strides s_qb, s_qh);  SL [B] int32 (SL_CSR: kv_indptr [B + 1]);
                                      EDGES [KA − 1] float64
        WGT         [Hkv, D]          the sketch radius's channel weights (WEIGHTED)
        EX_IN       [B·Hq, S, 2 or EXCESS_COLS] fp32 the excess sums (EXC; the grid block after them with GRD)
        → O [B, Hq, D] (strides s_ob, s_oh, 1; its own dtype: fp32, or the caller's buffer, e.g. SGLang's bf16 o),
          LSE [B, Hq, LSE_W] fp32 (strides s_lb, s_lh, 1: the log-sum-exp in column 0, −inf in the others, SGLang's
          attn_lse; LSE_W = 1 otherwise), HOUT [B·Hq, NB] float64, REC [B·Hq, REC_COLS] float64,
          FLAG [B·Hq] int8;  SCR [B·Hq, 2·(3·KP + N1)] float64 scratch (one region per tier);
          with DEFER_FORMS, EXS [B·Hq, DEFER_EXS_COLS] float64 (the merged excess sums and the row's state,
          ``kernels.tilt_batch``)

The tilt's grid (``COARSE`` intervals, the ``REFINE_TOP`` largest split into ``REFINE``) and the float64
slack are defined here: the kernels walk them, the torch twin and the launches read them.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .excess_grid import DEFER_EXS_COLS_C, EXCESS_COLS_C, GRID_COLS_C, _grid_form
from .interpret import f32, narrow

#: absolute slack for the epilogue's own float64 arithmetic (the decode pass's rounding is Ξ, ρ)
FP64_SLACK = 2.0**-40
COARSE = 64
#: the coarse intervals refined (largest first, until refining on cannot change the tilt): 0, the coarse grid alone.
#: Run Y11 (bench/RESULTS.md, an H100): the fully refined record (8) took 51 / 62 / 256 µs at B 1 / 8 / 32 (32K, Hq 32)
#: against 26 / 27 / 77 µs for the coarse grid; on SmolLM2 int8 (``witcert tightness --backend kernel``) the coarse
#: grid's median TV⁺ is 0.58 % higher (0.018627 → 0.018736), its share of rows ≤ 0.05 the same. Read at call time
#: (``refine_top``): a test or a benchmark may set it (the refinement is kept, tested at 8)
REFINE_TOP = 0
REFINE = 32


def refine_top() -> int:
    """The launches' and the twin's RT: ``min(REFINE_TOP, COARSE)``, read when called."""
    return min(REFINE_TOP, COARSE)

FP64_SLACK_C: tl.constexpr = tl.constexpr(FP64_SLACK)
#: points of the tilt's grid evaluated at a time on the GPU (``epilogue.tilt_chunk``; a power of two dividing
#: COARSE and REFINE): its [TC, bins] float64 tiles are what set the fused merge's registers (sm_90: 250 at 4 warps with the whole
#: coarse grid at once, two programs per SM; bench/RESULTS.md run M). The values do not depend on it (every
#: point's U is computed alone; the maxima are exact).
TILT_CHUNK = 16


@triton.jit
def _dense_u(ts, h, w, a, b, m, SCR, nl, NB: tl.constexpr, NBP: tl.constexpr, EPSC: tl.constexpr, DENSE3D: tl.constexpr):
    """For each interval [t, t + h] of ``ts`` [TP]: a sound upper value of the tilt bound on it (SPEC §3(c) with
    endpoints, Lean ``WitCert.tilt_tv_le_dual_grid_endpoints``): for any λ ≥ 0, D(·, λ) is concave in t (β is
    affine in t, the hinge convex), so g(t) = t − D(t, λ) is convex and its maximum on the interval is at an end:
    U = min over λ ∈ {1/β_c(t) : w_c > 0} of max(g(t), g(t + h)), each D minus its rounding-error bound, and
    at most t + h (λ = 0). The width h is not added: the coarse grid's slack is second order (the former form
    t + h − D(t, λ) carried h itself). ``w`` [NBP] bin weights with ``a``/``b`` their β at t = 0 / 1 (DENSE3D:
    one [TP, NBP, NBP] broadcast); else the live bins packed at the front of SCR (weights, a, b; ``nl`` of them),
    walked in a loop that loads bin c + 1 while bin c is used, and whose columns are those packed bins too (read
    back from SCR here: the same λ candidates, so the same minimum; the caller's ``w``/``a``/``b`` broadcast inside
    the refinement loop broke Triton 3.7.1's layout pass at 4 warps, "operand does not dominate this use").
    ``EPSC``: the relative rounding bound of a D."""
    if not DENSE3D:
        kc = tl.arange(0, NBP)
        w = tl.load(SCR + kc, mask=kc < nl, other=0.0)
        a = tl.load(SCR + NBP + kc, mask=kc < nl, other=1.0)
        b = tl.load(SCR + 2 * NBP + kc, mask=kc < nl, other=1.0)
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]  # [TP, NBP]: β_c(t)
    lam = tl.where(w[None, :] > 0, 1.0 / beta, 0.0)
    t1 = ts + h
    tm0 = (ts * m)[:, None]
    tm1 = (t1 * m)[:, None]
    if DENSE3D:
        beta1 = (1.0 - t1)[:, None] * a[None, :] + t1[:, None] * b[None, :]
        x0 = lam[:, :, None] * beta[:, None, :]
        x1 = lam[:, :, None] * beta1[:, None, :]
        act0 = tl.maximum(x0 - 1.0, 0.0)
        act1 = tl.maximum(x1 - 1.0, 0.0)
        d0 = tl.sum(w[None, None, :] * act0, axis=2)
        d1 = tl.sum(w[None, None, :] * act1, axis=2)
        m0 = tl.sum(tl.where(act0 > 0, w[None, None, :] * (x0 + 1.0), 0.0), axis=2)
        m1 = tl.sum(tl.where(act1 > 0, w[None, None, :] * (x1 + 1.0), 0.0), axis=2)
    else:
        d0 = tl.zeros_like(beta)
        d1 = tl.zeros_like(beta)
        m0 = tl.zeros_like(beta)
        m1 = tl.zeros_like(beta)
        w2n = tl.load(SCR)
        a2n = tl.load(SCR + NBP)
        b2n = tl.load(SCR + 2 * NBP)
        for c2 in range(nl):
            w2 = w2n
            a2 = a2n
            b2 = b2n
            nx = tl.minimum(c2 + 1, NBP - 1)
            w2n = tl.load(SCR + nx)
            a2n = tl.load(SCR + NBP + nx)
            b2n = tl.load(SCR + 2 * NBP + nx)
            x0 = lam * ((1.0 - ts)[:, None] * a2 + ts[:, None] * b2)
            x1 = lam * ((1.0 - t1)[:, None] * a2 + t1[:, None] * b2)
            act0 = tl.maximum(x0 - 1.0, 0.0)
            act1 = tl.maximum(x1 - 1.0, 0.0)
            d0 += w2 * act0
            d1 += w2 * act1
            m0 += tl.where(act0 > 0, w2 * (x0 + 1.0), 0.0)
            m1 += tl.where(act1 > 0, w2 * (x1 + 1.0), 0.0)
    g0 = ts[:, None] - (lam * tm0 - d0) + EPSC * (lam * tm0 + m0 + 1.0)
    g1 = t1[:, None] - (lam * tm1 - d1) + EPSC * (lam * tm1 + m1 + 1.0)
    u = tl.min(tl.where(w[None, :] > 0, tl.maximum(g0, g1), float("inf")), axis=1)
    return tl.minimum(u, t1)


@triton.jit
def _tv_row(w, lvl, r, xi, lam, tilt_above, tilt_hi, SCR, exc,
            NB: tl.constexpr, NBP: tl.constexpr, N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr,
            EPSC: tl.constexpr, DENSE3D: tl.constexpr, TC: tl.constexpr):
    """One row of ``tv_from_hist`` (float64): masses ``w`` [NBP] (≥ 0, finite; bins ≥ NB are 0),
    bin levels ``lvl`` [NBP] (the last bin NB − 1 is the overflow bin, its level ``r``), the row's
    maximum radius ``r``, the decode's Ξ and Λ, ``exc`` a bound of TV(p, p̂) from outside the histogram (the centred
    box's excess form, ``_excess_form``: Ξ already in it, so it takes ρ and the slack but not tanh(Ξ/2); 1: none).
    Returns (TV⁺, tanh, e-form, tilt, ρ).

    The dual-grid tilt (coarse N1 intervals, then the RT of largest upper value split into NR)
    is computed only when the closed forms' TV⁺ (min(min(tanh, e-form) + tanh(Ξ/2), exc) + ρ + slack) is
    above ``tilt_above`` (a gate's τ: at or below it the row is certified without the tilt);
    otherwise ``tilt`` is reported as 1 (the trivial bound), which keeps TV⁺ sound. With
    ``tilt_above`` ≥ 0 the refinement is lazy too, interval by interval: it stops (possibly before the
    first) once the grid reached certifies TV⁺ ≤ τ, or once the refined intervals alone put TV⁺ above
    τ; ``tilt`` is then that grid's bound (sound for any grid, SPEC §3(c)), and the gate's decision is the
    non-lazy one's. τ arrives as float32 (``tau_bracket``):
    ``tilt_above`` = τ↓ for the skip and the certified stop, ``tilt_hi`` = τ↑ for the not-certified one.
    A refined interval's value is the smaller of its coarse value and its sub-intervals' maximum (both are
    sound on it), so refining never raises an interval's value; every mode then stops refining once no
    unrefined interval's value is above the refined maximum: refining on could not change the tilt, which is
    exactly the one of refining all RT (bench/RESULTS.md, run T; an adversarial review found the stop's
    boundary discontinuous before the smaller-of-two rule). ``TC``: grid points per [TC, NBP] step on the GPU
    (divides N1 and NR; the values do not depend on it).
    Masses whose sum is not positive and finite give e-form = tilt = 1; a NaN TV⁺ is reported as 1."""
    k = tl.arange(0, NBP)
    lv = tl.where(k == NB - 1, r, lvl)
    # a NaN level under a live mass: no distribution either, tested before the clamp below (the GPU's min / max
    # drop NaN operands: the H200 metered such a bin at r, TV⁺ 0.15 < tanh(r/2) = 0.24, where the interpreter
    # saturated; run U, 2026-12-05)
    nan_lv = tl.sum(((w > 0) & (lv != lv)).to(tl.int32), axis=0)
    lv = tl.maximum(tl.minimum(lv, r), 0.0) + xi
    # masses whose sum is not a positive finite number (all 0, underflowed, overflowed, NaN / inf) carry no
    # distribution: the e-form and the tilt are then 1 (tanh, from the maximum radius alone, still holds)
    ws = tl.sum(w, axis=0)
    okw = (ws >= 1e-300) & (ws < float("inf")) & (nan_lv == 0)
    w = w / tl.maximum(ws, 1e-300)  # (not okw: garbage, unused below; a tl.where here broke Triton 3.6's
    # layout pass at 32+ bins, "operand does not dominate this use", 2026-12-03)
    live = w > 0
    lv = tl.where(live, lv, 0.0)
    a = tl.exp(lv)
    b = tl.exp(-lv)
    m = tl.sum(w * b, axis=0)
    rx = r + xi
    e2 = tl.exp(-rx)
    tanh = (1.0 - e2) / (1.0 + e2)  # tanh((r + Ξ)/2)
    A = tl.sum(w * a, axis=0)
    eform = tl.minimum(0.5 * (A * A - 1.0) * (1.0 + 8.0 * NBP * 2.220446049250313e-16), 1.0)
    eform = tl.where((eform == eform) & okw, eform, 1.0)
    mlo = m * (1.0 - 9.094947017729282e-13)
    rho = lam * (1.0 + tl.exp(tl.minimum(rx, 700.0)) / tl.maximum(mlo, 1e-300)) * (1.0 + 9.094947017729282e-13)
    rho = tl.where(lam > 0, rho, 0.0)
    rho = tl.where(rho == rho, rho, 1.0)
    lmax = tl.where(okw, tl.max(lv, axis=0), float("inf"))  # (no distribution: neither branch below, tilt 1)
    cheap = tl.minimum(tanh, eform)
    e1 = tl.exp(-xi)
    fp_terms = (1.0 - e1) / (1.0 + e1) + rho + FP64_SLACK_C  # tanh(Ξ/2) + ρ + slack
    # the excess form's own TV⁺ (ρ and the slack: it bounds TV(p, p̂) itself); a NaN or negative exc is none (the
    # GPU's min drops NaN operands)
    exc_tv = tl.where((exc == exc) & (exc >= 0.0), exc, 1.0) + rho + FP64_SLACK_C
    tilt = tl.full([], 1.0, tl.float64)
    if lmax == 0:
        tilt = tl.full([], 0.0, tl.float64)  # all radii 0 (and Ξ = 0): TV = 0
    elif (lmax <= 700.0) & (tl.minimum(cheap + fp_terms, exc_tv) > tilt_above):
        # the live bins (w > 0), in bin order, packed to the front of SCR: the loop form of _dense_u
        # visits only those (the dead ones add exactly +0: the same sums, bit for bit)
        live_i = live.to(tl.int32)
        pos = tl.cumsum(live_i, axis=0) - 1
        nl = tl.sum(live_i, axis=0)
        tl.store(SCR + pos, w, mask=live)
        tl.store(SCR + NBP + pos, a, mask=live)
        tl.store(SCR + 2 * NBP + pos, b, mask=live)
        tl.debug_barrier()
        i = tl.arange(0, N1)
        if DENSE3D:
            U = _dense_u(i.to(tl.float64) * (1.0 / N1), 1.0 / N1, w, a, b, m, SCR, nl, NB, NBP, EPSC, DENSE3D)
        else:  # (GPU) TC points at a time, through SCR: [TC, NBP] float64 tiles fit any warp count's registers
            for c0 in range(0, N1, TC):
                ic = c0 + tl.arange(0, TC)
                tl.store(SCR + 3 * NBP + ic, _dense_u(ic.to(tl.float64) * (1.0 / N1), 1.0 / N1, w, a, b, m, SCR, nl,
                                                      NB, NBP, EPSC, DENSE3D))
            tl.debug_barrier()
            U = tl.load(SCR + 3 * NBP + i)
        coarse = tl.minimum(tl.maximum(tl.max(U, axis=0), 0.0), 1.0)
        # lazy (τ ≥ 0): the refinement stops once the gate's question is settled either way. Every interval
        # keeps a sound upper value (its refined maximum, or its coarse U if not refined), so the reported
        # tilt — the maximum over all intervals — is sound for whatever grid was reached (SPEC §3(c)):
        #  * certified: the current tilt already puts TV⁺ ≤ τ (before any refinement: the coarse grid);
        #  * not certified: the refined intervals' maximum alone puts TV⁺ > τ, and the full refinement's
        #    tilt is ≥ it (it refines the same intervals to the same values), so its TV⁺ is > τ too.
        # Non-lazy (τ < 0): until no unrefined interval is above the refined maximum (at most RT intervals).
        lazy = tilt_above >= 0.0
        done = (lazy & (tl.minimum(tl.minimum(cheap, coarse) + fp_terms, exc_tv) <= tilt_above)).to(tl.int32)
        sel = i < 0
        best = tl.full([], -1.0, tl.float64)
        s = tl.arange(0, NR)
        if DENSE3D and RT > 0:  # (interpreter) pick the RT intervals first, then one dense evaluation of all
            rr = tl.arange(0, RT)  # their RT·NR points: the same values, far fewer interpreted calls
            idxv = tl.zeros([RT], tl.int32)
            uv = tl.zeros([RT], tl.float64)  # their coarse values
            selv = i < 0
            for _r in range(RT):
                um = tl.where(selv, -2.0, U)
                mx = tl.max(um, axis=0)
                idx = tl.min(tl.where(um == mx, i, N1), axis=0)
                selv = selv | (i == idx)
                idxv = tl.where(rr == _r, idx, idxv)
                uv = tl.where(rr == _r, mx, uv)
            ts = tl.reshape(idxv.to(tl.float64)[:, None] * (1.0 / N1)
                            + s.to(tl.float64)[None, :] * (1.0 / (N1 * NR)), [RT * NR])
            up = _dense_u(ts, 1.0 / (N1 * NR), w, a, b, m, SCR, nl, NB, NBP, EPSC, DENSE3D)
            bm = tl.minimum(tl.max(tl.reshape(up, [RT, NR]), axis=1), uv)  # each picked interval's refined value
        for _r in range(RT):  # the RT largest upper values (ties: the lowest index), refined in that order
            if done == 0:
                if DENSE3D:
                    idx = tl.max(tl.where(rr == _r, idxv, -1), axis=0)
                    bi = tl.max(tl.where(rr == _r, bm, -2.0), axis=0)
                else:
                    um = tl.where(sel, -2.0, U)
                    mx = tl.max(um, axis=0)
                    idx = tl.min(tl.where(um == mx, i, N1), axis=0)
                    t0 = idx.to(tl.float64) * (1.0 / N1)
                    bi = tl.full([], -2.0, tl.float64)
                    for s0 in range(0, NR, TC):
                        sc = s0 + tl.arange(0, TC)
                        up = _dense_u(t0 + sc.to(tl.float64) * (1.0 / (N1 * NR)), 1.0 / (N1 * NR), w, a, b, m, SCR, nl,
                                      NB, NBP, EPSC, DENSE3D)
                        bi = tl.maximum(bi, tl.max(up, axis=0))
                    bi = tl.minimum(bi, mx)  # its coarse value bounds it too: the smaller of two sound values
                sel = sel | (i == idx)
                best = tl.maximum(best, bi)
                rest_now = tl.max(tl.where(sel, -1.0, U), axis=0)
                cur = tl.minimum(tl.maximum(tl.maximum(best, rest_now), 0.0), 1.0)
                low = tl.minimum(tl.maximum(best, 0.0), 1.0)
                # settled (any τ): no unrefined interval is above the refined maximum, so refining on cannot
                # change the tilt (a refined value is ≤ its coarse one, here ≤ best); lazy: τ settled either way
                done = ((best >= rest_now) | (lazy & ((tl.minimum(tl.minimum(cheap, cur) + fp_terms, exc_tv) <= tilt_above)
                                                      | (tl.minimum(tl.minimum(cheap, low) + fp_terms, exc_tv)
                                                         > tilt_hi)))).to(tl.int32)
        rest = tl.max(tl.where(sel, -1.0, U), axis=0)
        tilt = tl.minimum(tl.maximum(tl.maximum(best, rest), 0.0), 1.0)
        tl.debug_barrier()  # SCR is reused by the next call
    tv = tl.minimum(tl.minimum(tl.minimum(cheap, tilt) + fp_terms, exc_tv), 1.0)
    # a NaN radius, Ξ or Λ saturates (the GPU's min / max drop NaN operands, so test the inputs themselves)
    # (and a negative one: no radius, Ξ or Λ is below 0; a negative one would lower tanh below 0, review of run T)
    tv = tl.where((tv == tv) & (r >= 0.0) & (xi >= 0.0) & (lam >= 0.0), tv, 1.0)
    return tv, tanh, eform, tilt, rho


@triton.jit
def _tv_kernel(MASS, LV, RMAX, XI, LAM, OUT, SCR, s_m, s_l, tilt_above, tilt_hi,
               NB: tl.constexpr, NBP: tl.constexpr, N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr,
               EPSC: tl.constexpr, DENSE3D: tl.constexpr, TC: tl.constexpr):
    """Program ``row``: ``_tv_row`` on one histogram row; OUT[row] = (TV⁺, tanh, e-form, tilt, ρ)."""
    row = tl.program_id(0)
    k = tl.arange(0, NBP)
    km = k < NB
    w = tl.load(MASS + row * s_m + k, mask=km, other=0.0).to(tl.float64)
    w = tl.where(w >= 0.0, w, float("inf"))  # a NaN or negative mass: no distribution (_tv_row saturates)
    lvl = tl.load(LV + row * s_l + k, mask=km, other=0.0).to(tl.float64)
    r = tl.load(RMAX + row).to(tl.float64)
    tv, tanh, eform, tilt, rho = _tv_row(w, lvl, r, tl.load(XI + row).to(tl.float64), tl.load(LAM + row).to(tl.float64),
                                         tilt_above, tilt_hi, SCR + row * (3 * NBP + N1), tl.full([], 1.0, tl.float64),
                                         NB, NBP, N1, RT, NR, EPSC, DENSE3D, TC)
    o = OUT + row * 5
    tl.store(o + 0, tv)
    tl.store(o + 1, tanh)
    tl.store(o + 2, eform)
    tl.store(o + 3, tilt)
    tl.store(o + 4, rho)


@triton.jit
def _out_err_upper(tv, w, extra):
    """E⁺ from a row's TV⁺: (TV⁺·w + extra)(1 + 2⁻⁴⁰) + slack, w = 2ν_max + φ_max, ``extra`` the additive terms
    (Σp̃φ + (tanh(Ξ/2) + Λ)φ_max + the output's own rounding); +inf where not finite. The fused merge's two tiers
    and the deferred tilt's finish (``kernels.tilt_batch``) take it from here."""
    e = (tv * w + extra) * (1.0 + 9.094947017729282e-13) + FP64_SLACK_C
    return tl.where((e == e) & (e != float("inf")), e, float("inf"))


@triton.jit
def _expm1_up(y):
    """An upper bound of e^y − 1 for 0 ≤ y (float64): the series y + y²/2 + y³ below 2^-10 (its
    tail y³/6 + … ≤ y³ there), else e^y − 1; both with a relative 2^-40 for their rounding."""
    small = y + 0.5 * y * y + y * y * y
    big = tl.exp(y) - 1.0
    return tl.where(y < 0.0009765625, small, big) * (1.0 + 9.094947017729282e-13)


@triton.jit
def _excess_form(a, b, xi):
    """The centred box's closed form (float64; bench/TIGHTNESS.md, "The two sums in the decode kernel"): from the merged
    excess sums Â = Σ p̃ (e^{−c+ε} − 1)₊ / L and B̂ = Σ p̃ (1 − e^{−c−ε})₊ / L, each up by Ξ + 2^-21 (their fp32
    accumulation: relative 2.1η ≤ Ξ, and the products'), and the row's Ξ: p̂ ≤ e^{2Ξ} p̃ once both are normalised (Ξ
    bounds |log p̃_j/p̂_j| up to a common constant, SPEC §7), so TV(p, p̂) ≤ e^{2Ξ} max(Â, B̂) (Lean
    ``tilt_tv_le_excess_rescaled``, ``le_exp_two_mul_of_log_ratio``) with e^{2Ξ} = 1 + E(2Ξ) rounded up; up by 2^-40 for
    its own rounding. It bounds TV(p, p̂) itself: ``_tv_row`` adds only ρ (not tanh(Ξ/2)).
    A NaN, an infinite or a negative sum (or Ξ) gives 1 (no form: the others stay sound)."""
    grow = 1.0 + xi + 4.76837158203125e-07
    a = a * grow
    b = b * grow
    e2 = 1.0 + _expm1_up(tl.minimum(2.0 * xi, 700.0))
    f = e2 * tl.maximum(a, b) * (1.0 + 9.094947017729282e-13)
    ok = (f == f) & (a >= 0.0) & (b >= 0.0) & (xi >= 0.0) & (f < float("inf"))
    return tl.where(ok, tl.minimum(f, 1.0), 1.0)


@triton.jit
def _merge_meter_kernel(
    M_IN, L_IN, ACC_IN, HIST_IN, STAT_IN, Q, SL, EDGES, O, LSE, REC, HOUT, SCR, FLAG, WGT, EX_IN, EXS,
    Hq, S, sm, qn_infl, log_delta, tilt_above, tilt_hi, s_qb, s_qh, s_ob, s_oh, s_lb, s_lh,
    D: tl.constexpr, SP: tl.constexpr, T: tl.constexpr, PAGES: tl.constexpr,
    NB: tl.constexpr, KA: tl.constexpr, KP: tl.constexpr,
    METER: tl.constexpr, EPI: tl.constexpr, TIER_B: tl.constexpr,
    GAMMA: tl.constexpr, EXP_REL: tl.constexpr, DITHER_U: tl.constexpr, ETA0: tl.constexpr, ETA1: tl.constexpr,
    FLUSH: tl.constexpr, OUT_REL0: tl.constexpr, BIAS: tl.constexpr,
    N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr, EPSC: tl.constexpr, DENSE3D: tl.constexpr,
    TC: tl.constexpr, HA_HM: tl.constexpr, WEIGHTED: tl.constexpr, GQ: tl.constexpr, RING_TILES: tl.constexpr,
    DEFER: tl.constexpr = False, LSE_W: tl.constexpr = 1, LSE_WP: tl.constexpr = 1, SL_CSR: tl.constexpr = False,
    STORE_REL: tl.constexpr = 0.0, STORE_ABS: tl.constexpr = 0.0, STORE_MAX: tl.constexpr = 0.0,
    EXC: tl.constexpr = False, GRD: tl.constexpr = False, GDC: tl.constexpr = False, DEFER_FORMS: tl.constexpr = False,
):
    """Program ``row`` = (b, h): the split-KV merge of the decode's S partials (log-sum-exp rule,
    float64 weights) → O[row] (fp32), LSE[row]; with METER the merged histograms (float64, HOUT)
    and, with EPI, the meter record REC[row] (columns ``REC_*``): Ξ, Λ, both tiers' TV⁺ and E⁺.
    The same arithmetic as the torch path it replaced (``decode_epilogue_torch``), in one launch.
    DEFER (tier A alone, ``kernels.tilt_batch``): the record without the tilt (TV⁺ from the closed forms, sound)
    and the row's tilt inputs the finishing launch reads (``REC_QNA``, ``REC_LAM``, ``REC_EW``, ``REC_EX``).
    DEFER_FORMS (with DEFER, ``kernels.plan.DEFER_FORMS``): not the closed forms either; the row's merged excess sums
    go to EXS [B·Hq, DEFER_EXS_COLS] float64 (Â, B̂, then the grid block / L with GRD; then how many sums, and the
    row's non-finite count) and the record reads TV⁺ 1, its E⁺
    from it (sound, uninformative; a single-token row its final TV⁺ 0 and E⁺) until the finishing launch computes
    the forms, the tilt and TV⁺ from the same float64 inputs for a whole step's layers at once.
    STORE_REL > 0: the output is served in a narrower float than fp32 (O's dtype, or a cast the caller makes:
    ``fp_bounds.store_terms``): E⁺ adds STORE_REL·‖o‖₂ + STORE_ABS and an |o_i| above STORE_MAX counts as non-finite.
    EXC: the partials' excess sums EX_IN [B·Hq, S, 2] (A, B: the centred box's, ``decode_meter._excess_tile``; with GRD
    [B·Hq, S, EXCESS_COLS], the grid block after them, ``excess_grid._grid_form``: the smaller form) give
    tier A a further closed form, ``_excess_form`` (+ ρ), before the τ decision (REC_EXCESS; 1 without EXC).
    GDC (launched with PDL, ``kernels.pdl``): the decode pass has completed and its partials are visible after the
    first statement's wait."""
    if GDC:
        gdc_wait()
    row = tl.program_id(0)
    b = row // Hq
    h = row % Hq
    s = tl.arange(0, SP)
    smask = s < S
    ms = tl.load(M_IN + row * S + s, mask=smask, other=float("-inf"))
    ls = tl.load(L_IN + row * S + s, mask=smask, other=0.0)
    mx = tl.max(ms, axis=0)
    fin = (ms == ms) & (ms != float("inf")) & (ms != float("-inf"))
    w64 = tl.where(fin, tl.exp((ms - mx).to(tl.float64)), 0.0)
    w32 = w64.to(tl.float32)
    L = tl.sum(w32 * ls, axis=0)
    d = tl.arange(0, D)
    acc = tl.load(ACC_IN + (row * S + s)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(w32[:, None] * acc, axis=0) / L
    # a row without any token (seq_len 0, an empty CSR row): what the reference gives, output 0 and (below) TV⁺ 0,
    # output bound 0, no flag, instead of 0/0
    if SL_CSR:  # SGLang's CSR rows: SL is kv_indptr, the length its difference (no launch of its own)
        n = tl.load(SL + b + 1) - tl.load(SL + b)
    else:
        n = tl.load(SL + b)
    dead = n <= 0
    o = tl.where(dead, 0.0, o)
    # in O's own dtype (the caller's output buffer: no copy after the launch); LSE's columns past the first −inf
    # (int64 offsets: a caller's strided buffer may span more than 2^31 elements)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    tl.store(O + b64 * s_ob + h64 * s_oh + d, narrow(o, O))  # (narrow: exact in the interpreter too)
    lw = tl.arange(0, LSE_WP)  # (LSE_WP: the next power of two of LSE_W)
    tl.store(LSE + b64 * s_lb + h64 * s_lh + lw, tl.where(lw == 0, mx + tl.log(L), float("-inf")), mask=lw < LSE_W)
    if METER:
        L64 = tl.sum(w64 * ls.to(tl.float64), axis=0)
        c = tl.arange(0, NB)
        hs = tl.load(HIST_IN + (row * S + s)[:, None] * NB + c[None, :], mask=smask[:, None], other=0.0)
        hm = tl.sum(w64[:, None] * hs.to(tl.float64), axis=0) / L64
        tl.store(HOUT + row * NB + c, hm)
        if EPI:
            st = STAT_IN + (row * S + s) * 6
            wmx = tl.max(tl.load(st + 0, mask=smask, other=0.0), axis=0)
            smx = tl.max(tl.load(st + 1, mask=smask, other=0.0), axis=0)
            phmx = tl.max(tl.load(st + 2, mask=smask, other=0.0), axis=0)
            numx = tl.max(tl.load(st + 3, mask=smask, other=0.0), axis=0)
            kpmx = tl.max(tl.load(st + 5, mask=smask, other=0.0), axis=0)
            # non-finite: counted radii, the partials' stats (a max may drop a NaN), L, o, the masses
            bad = tl.sum(tl.load(st + 4, mask=smask, other=0.0), axis=0)
            for col in tl.static_range(6):
                sv = tl.load(st + col, mask=smask, other=0.0)
                bad += tl.sum(((sv != sv) | (sv == float("inf"))).to(tl.float32), axis=0)
            bad += ((L != L) | (L == float("inf")) | (L == float("-inf"))).to(tl.float32)
            bad += tl.sum(((o != o) | (o == float("inf")) | (o == float("-inf"))).to(tl.float32), axis=0)
            bad += tl.sum(((hm != hm) | (hm == float("inf"))).to(tl.float32), axis=0)
            qv = f32(tl.load(Q + b * s_qb + h * s_qh + d)).to(tl.float64)  # (f32: a bf16 q's subnormals kept)
            qnorm = tl.sqrt(tl.sum(qv * qv, axis=0))
            qn = qnorm * qn_infl  # |σ| ‖q_h‖ (1 + KERNEL_REL_SLACK)
            q1 = tl.sum(tl.abs(qv), axis=0)
            if WEIGHTED:  # the sketch radius's head factor c_h = |σ| ‖a⊙q_h‖ (contract.sketch), rounded up
                qa = qv * tl.load(WGT + (h // GQ) * D + d).to(tl.float64)
                qn_a = tl.sqrt(tl.sum(qa * qa, axis=0)) * qn_infl
            else:
                qn_a = qn
            eps_max = qn_a * wmx.to(tl.float64)
            n_pages = (n + T - 1) // T
            tiles = ((n_pages + RING_TILES * PAGES + S - 1) // S + PAGES - 1) // PAGES + RING_TILES
            eta = ETA0 + ETA1 * tiles.to(tl.float64)
            # SPEC §7: Ξ bounds |log p̃_j/p̂_j| (up to normalisation) of the kernel's masses
            xi = qn * kpmx.to(tl.float64) * GAMMA + EXP_REL + DITHER_U * q1 * smx.to(tl.float64)
            xi = (xi + 2.1 * eta) * (1.0 + 9.5367431640625e-07)
            lam = (n.to(tl.float64) + NB * tiles.to(tl.float64) * S + 16.0) * FLUSH / tl.maximum(L64, 1.0)
            bad += ((xi != xi) | (xi == float("inf")) | (eps_max != eps_max) | (eps_max == float("inf"))
                    | (lam != lam)).to(tl.float32)
            single = n == 1
            k = tl.arange(0, KP)
            km = k < KA
            edge = tl.load(EDGES + k, mask=k < KA - 1, other=0.0)
            if HA_HM:  # KP == NB (tier A alone): tier A's bins are the merged row's first KA (the same sums)
                ha = tl.where(km, hm, 0.0)
            else:  # tier A's bins, merged again from the partials (a register vector has no slices)
                ha = tl.load(HIST_IN + (row * S + s)[:, None] * NB + k[None, :], mask=smask[:, None] & km[None, :],
                             other=0.0)
                ha = tl.sum(w64[:, None] * ha.to(tl.float64), axis=0) / L64
            ha = tl.maximum(tl.where(ha == ha, ha, 0.0), 0.0)
            pphi = tl.sum(tl.where(c == NB - 1, hm, 0.0), axis=0)
            out_rel = OUT_REL0 + eta
            fm = phmx.to(tl.float64)
            num = numx.to(tl.float64)
            e1 = tl.exp(-xi)
            own = num * _expm1_up(tl.minimum(2.0 * xi + out_rel, 700.0))
            extra = pphi + ((1.0 - e1) / (1.0 + e1) + lam) * fm + own
            if STORE_REL > 0:  # the store's rounding (contract STORE_ROUNDING; Lean output_error_stored_le)
                o64 = o.to(tl.float64)
                extra += STORE_REL * tl.sqrt(tl.sum(o64 * o64, axis=0)) + STORE_ABS
                bad += tl.sum((tl.abs(o) > STORE_MAX).to(tl.float32), axis=0)
            r = REC + row * REC_COLS
            tva = tl.full([], 1.0, tl.float64)
            exc = tl.full([], 1.0, tl.float64)
            if EXC:
                EXW: tl.constexpr = EXCESS_COLS_C if GRD else 2
                ex = EX_IN + (row * S + s) * EXW
                a_hat = tl.sum(w64 * tl.load(ex, mask=smask, other=0.0).to(tl.float64), axis=0) / L64
                b_hat = tl.sum(w64 * tl.load(ex + 1, mask=smask, other=0.0).to(tl.float64), axis=0) / L64
                if DEFER_FORMS:  # the merged sums, for the finishing launch's forms (``kernels.tilt_batch``)
                    tl.store(EXS + row * DEFER_EXS_COLS_C, a_hat)  # (EXS's rows are DEFER_EXS_COLS wide, grid or not)
                    tl.store(EXS + row * DEFER_EXS_COLS_C + 1, b_hat)
                else:
                    exc = _excess_form(a_hat, b_hat, xi)
                if GRD:  # the same boxes' (t, λ) grid (``excess_grid``): the smaller form
                    gk = tl.arange(0, GRID_COLS_C)
                    gs = tl.load(ex[:, None] + 2 + gk[None, :], mask=smask[:, None], other=0.0).to(tl.float64)
                    gs = tl.sum(w64[:, None] * gs, axis=0) / L64
                    if DEFER_FORMS:
                        tl.store(EXS + row * DEFER_EXS_COLS_C + 2 + gk, gs)
                    else:
                        exc = tl.minimum(exc, _grid_form(a_hat, gs, xi, _expm1_up(tl.minimum(2.0 * xi, 700.0))))
            tl.store(r + REC_EXCESS, exc)  # (DEFER_FORMS: 1, pending)
            if DEFER_FORMS:  # the row's state for the finish: how many sums it holds, and this merge's non-finite count
                # (a flagged or dead row takes the excess column alone, as here, and keeps the pending 1s)
                NSUM: tl.constexpr = (EXCESS_COLS_C if GRD else 2) if EXC else 0
                tl.store(EXS + row * DEFER_EXS_COLS_C + EXCESS_COLS_C, tl.full([], NSUM, tl.float64))
                tl.store(EXS + row * DEFER_EXS_COLS_C + EXCESS_COLS_C + 1, bad.to(tl.float64))
            if DEFER:  # the tilt's inputs beyond HOUT, REC_EPS and REC_XI (kernels.tilt_batch)
                tl.store(r + REC_QNA, qn_a)
                tl.store(r + REC_LAM, lam)
                tl.store(r + REC_EW, 2.0 * num + fm)
                tl.store(r + REC_EX, extra)
            if DEFER_FORMS:  # pending (sound, uninformative) until the finish; a flagged row stays so
                tl.store(r + REC_TANH, 1.0)
                tl.store(r + REC_EFORM, 1.0)
                tl.store(r + REC_TILT, 1.0)
                tl.store(r + REC_RHO, 1.0)
                if (bad == 0) & single:  # (its final record: the finish leaves a TV⁺ of 0 as it is)
                    tva = tl.full([], 0.0, tl.float64)
                ea = tl.where(bad == 0, _out_err_upper(tva, 2.0 * num + fm, extra), float("inf"))
            elif bad == 0:
                # (DEFER: the launch passes τ = +inf, so the tilt is skipped and TV⁺ is the closed forms')
                tva, tanh, eform, tilt, rho = _tv_row(ha, qn_a * edge, eps_max, xi, lam, tilt_above, tilt_hi,
                                                      SCR + row * 2 * (3 * KP + N1), exc, KA, KP, N1, RT, NR, EPSC, DENSE3D,
                                                      TC)
                tl.store(r + REC_TANH, tanh)
                tl.store(r + REC_EFORM, eform)
                tl.store(r + REC_TILT, tilt)
                tl.store(r + REC_RHO, rho)
                if single:
                    tva = tl.full([], 0.0, tl.float64)
                ea = _out_err_upper(tva, 2.0 * num + fm, extra)
            else:
                tl.store(r + REC_TANH, 1.0)
                tl.store(r + REC_EFORM, 1.0)
                tl.store(r + REC_TILT, 1.0)
                tl.store(r + REC_RHO, 1.0)
                ea = tl.full([], float("inf"), tl.float64)
            tl.store(r + REC_TVA, tl.where(dead, 0.0, tva))
            tl.store(r + REC_EA, tl.where(dead, 0.0, ea))
            tl.store(r + REC_EPS, eps_max)
            tl.store(r + REC_XI, xi)
            # the record's bool flag (viewed as bool: no launch after)
            tl.store(FLAG + row, ((bad > 0) & ~dead).to(tl.int8))
            if TIER_B:
                # c_h = |σ| (‖q‖ sqrt(2 ln(2n/δ)/12) + ‖q‖₁ DITHER_BIAS_FACTOR) (1 + KERNEL_REL_SLACK)
                lt = tl.sqrt(2.0 * (tl.log(2.0 * n.to(tl.float64)) - log_delta) / 12.0)
                cb = (qnorm * lt + q1 * BIAS) * qn_infl
                tbm = cb * smx.to(tl.float64)
                tl.store(r + REC_TB, tbm)
                tvb = tl.full([], 1.0, tl.float64)
                eb = tl.full([], float("inf"), tl.float64)
                hb = tl.load(HIST_IN + (row * S + s)[:, None] * NB + KA + k[None, :], mask=smask[:, None] & km[None, :],
                             other=0.0)
                hb = tl.sum(w64[:, None] * hb.to(tl.float64), axis=0) / L64
                hb = tl.maximum(tl.where(hb == hb, hb, 0.0), 0.0)
                if (bad == 0) & (tbm == tbm) & (tbm != float("inf")):
                    # (a scratch of its own: no store / load of tier A's bins may be reordered past it)
                    tvb, _t, _e, _l, _r = _tv_row(hb, cb * edge, tbm, xi, lam, tilt_above, tilt_hi,
                                                  SCR + row * 2 * (3 * KP + N1) + 3 * KP + N1,
                                                  tl.full([], 1.0, tl.float64), KA, KP, N1, RT, NR, EPSC,
                                                  DENSE3D, TC)
                    if single:
                        tvb = tl.full([], 0.0, tl.float64)
                    eb = _out_err_upper(tvb, 2.0 * num + fm, extra)
                tl.store(r + REC_TVB, tl.where(dead, 0.0, tvb))
                tl.store(r + REC_EB, tl.where(dead, 0.0, eb))


#: columns of the fused merge's record (float64 per row; the flag is its own int8 output, ``FLAG``); the last
#: four before the last are written with DEFER only: |σ|‖a⊙q_h‖ (the levels' factor), Λ, 2ν_max + φ_max and E⁺'s
#: additive part; the last, the excess form (``_excess_form``; 1 without EXC), by every record
(REC_TVA, REC_TVB, REC_EA, REC_EB, REC_EPS, REC_TB, REC_TANH, REC_EFORM, REC_TILT, REC_XI, REC_RHO,
 REC_QNA, REC_LAM, REC_EW, REC_EX, REC_EXCESS) = range(16)
REC_COLS = 16
for _name in ("REC_TVA", "REC_TVB", "REC_EA", "REC_EB", "REC_EPS", "REC_TB", "REC_TANH", "REC_EFORM", "REC_TILT",
              "REC_XI", "REC_RHO", "REC_QNA", "REC_LAM", "REC_EW", "REC_EX", "REC_EXCESS", "REC_COLS"):
    globals()[_name] = tl.constexpr(globals()[_name])
