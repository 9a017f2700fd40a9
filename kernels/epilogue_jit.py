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

from .excess_grid import DEFER_EXS_COLS_C, EXCESS_COLS_C
from .merge_terms import (
    _excess_form,
    _extra,
    _extra_terms,
    _hist_terms,
    _merge_excess,
    _merge_hist,
    _merge_output,
    _merge_weights,
    _output_terms,
    _query_terms,
    _stat_terms,
    _store_sums,
    _with_grid_form,
)

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
def _merge_meter_kernel(
    M_IN, L_IN, ACC_IN, HIST_IN, STAT_IN, Q, SL, EDGES, O, LSE, REC, HOUT, SCR, FLAG, WGT, EX_IN, EXS, PRT, CNT,
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
    PARTS: tl.constexpr = 1,
):
    """Program ``row`` = (b, h): the split-KV merge of the decode's S partials (log-sum-exp rule,
    float64 weights) → O[row] (fp32), LSE[row]; with METER the merged histograms (float64, HOUT)
    and, with EPI, the meter record REC[row] (columns ``REC_*``): Ξ, Λ, both tiers' TV⁺ and E⁺.
    The same arithmetic as the torch path it replaced (``decode_epilogue_torch``), in one launch; the row's terms
    are ``kernels.merge_terms``'.
    DEFER (tier A alone, ``kernels.tilt_batch``): the record without the tilt (TV⁺ from the closed forms, sound)
    and the row's tilt inputs the finishing launch reads (``REC_QNA``, ``REC_LAM``, ``REC_EW``, ``REC_EX``).
    DEFER_FORMS (with DEFER, ``kernels.plan.DEFER_FORMS``): not the closed forms either; the row's merged excess sums
    go to EXS [B·Hq, DEFER_EXS_COLS] float64 (Â, B̂, then the grid block / L with GRD; then how many sums, and the
    row's non-finite count) and the record reads TV⁺ 1, its E⁺
    from it (sound, uninformative; a single-token row its final TV⁺ 0 and E⁺) until the finishing launch computes
    the forms, the tilt and TV⁺ from the same float64 inputs for a whole step's layers at once.
    PARTS > 1 (with DEFER_FORMS, ``kernels.plan.MERGE_PARTS``): the row's merge in PARTS programs (b·Hq + h, p), each
    a share of the terms at once: p 0 the output, p PARTS − 1 the histograms and the excess sums, the record's
    scalars in p 1 (PARTS 3) or with the output (PARTS 2). Each stores what it computed and its share of the
    pending record's inputs into PRT [B·Hq, PRT_COLS] float64, then adds 1 to the row's counter CNT [B·Hq] int32
    (acq_rel, GPU scope, after a barrier of its threads); the program that finds PARTS − 1 there reads the row's PRT
    and writes the pending TV⁺, E⁺, the flag and the non-finite count (``_pending_record``) as the one-program merge
    does, then zeroes the counter for the next call. The same values, bit for bit.
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
    s, smask, ls, mx, w64 = _merge_weights(M_IN, L_IN, row, S, SP)
    # a row without any token (seq_len 0, an empty CSR row): what the reference gives, output 0 and (below) TV⁺ 0,
    # output bound 0, no flag, instead of 0/0
    if SL_CSR:  # SGLang's CSR rows: SL is kv_indptr, the length its difference (no launch of its own)
        n = tl.load(SL + b + 1) - tl.load(SL + b)
    else:
        n = tl.load(SL + b)
    dead = n <= 0
    r = REC + row * REC_COLS
    if PARTS > 1:
        _merge_in_parts(ACC_IN, HIST_IN, STAT_IN, Q, O, LSE, r, HOUT, FLAG, WGT, EX_IN, EXS, PRT, CNT, row, b, h, n,
                        dead, S, s, smask, ls, mx, w64, qn_infl, s_qb, s_qh, s_ob, s_oh, s_lb, s_lh, D, T, PAGES, NB,
                        GAMMA, EXP_REL, DITHER_U, ETA0, ETA1, FLUSH, OUT_REL0, WEIGHTED, GQ, RING_TILES, LSE_W, LSE_WP,
                        STORE_REL, STORE_ABS, STORE_MAX, EXC, GRD, PARTS)
    else:
        L, o = _merge_output(ACC_IN, O, LSE, row, b, h, S, s, smask, ls, mx, w64, dead, s_ob, s_oh, s_lb, s_lh, D,
                             LSE_W, LSE_WP)
        if METER:
            L64 = tl.sum(w64 * ls.to(tl.float64), axis=0)
            c, hm = _merge_hist(HIST_IN, HOUT, row, S, s, smask, w64, L64, NB)
            if EPI:
                wmx, smx, phmx, numx, kpmx, bad = _stat_terms(STAT_IN, row, S, s, smask)
                # non-finite: counted radii, the partials' stats (a max may drop a NaN), L, o, the masses
                bad_o, st_term = _output_terms(L, o, STORE_REL, STORE_ABS, STORE_MAX)
                bad_h, pphi = _hist_terms(c, hm, NB)
                qnorm, q1, qn_a, eps_max, eta, xi, lam, bad_x = _query_terms(
                    Q, WGT, b, h, n, S, L64, wmx, smx, kpmx, qn_infl, s_qb, s_qh, D, T, PAGES, NB, GAMMA, EXP_REL,
                    DITHER_U, ETA0, ETA1, FLUSH, WEIGHTED, GQ, RING_TILES)
                bad += bad_o + bad_h + bad_x
                single = n == 1
                k = tl.arange(0, KP)
                km = k < KA
                edge = tl.load(EDGES + k, mask=k < KA - 1, other=0.0)
                if HA_HM:  # KP == NB (tier A alone): tier A's bins are the merged row's first KA (the same sums)
                    ha = tl.where(km, hm, 0.0)
                else:  # tier A's bins, merged again from the partials (a register vector has no slices)
                    ha = tl.load(HIST_IN + (row * S + s)[:, None] * NB + k[None, :],
                                 mask=smask[:, None] & km[None, :], other=0.0)
                    ha = tl.sum(w64[:, None] * ha.to(tl.float64), axis=0) / L64
                ha = tl.maximum(tl.where(ha == ha, ha, 0.0), 0.0)
                fm, num, x_phi, em = _extra_terms(xi, lam, eta, phmx, numx, OUT_REL0)
                extra = _extra(pphi, x_phi, fm, num, em)
                if STORE_REL > 0:  # the store's rounding (contract STORE_ROUNDING; Lean output_error_stored_le)
                    extra += st_term
                ew = 2.0 * num + fm
                tva = tl.full([], 1.0, tl.float64)
                exc = tl.full([], 1.0, tl.float64)
                if EXC:
                    a_hat, b_hat, gs = _merge_excess(EX_IN, row, S, s, smask, w64, L64, GRD)
                    if DEFER_FORMS:  # the merged sums, for the finishing launch's forms (``kernels.tilt_batch``)
                        _store_sums(EXS + row * DEFER_EXS_COLS_C, a_hat, b_hat, gs, GRD)
                    else:
                        exc = _excess_form(a_hat, b_hat, xi)
                        if GRD:  # the same boxes' (t, λ) grid (``excess_grid``): the smaller form
                            exc = _with_grid_form(exc, a_hat, gs, xi)
                if DEFER:  # the finish's inputs beyond HOUT (kernels.tilt_batch)
                    _store_tilt_inputs(r, qn_a, lam, ew, eps_max, xi)
                if DEFER_FORMS:  # pending (sound, uninformative) until the finish; a flagged row stays so
                    _pending_record(r, EXS + row * DEFER_EXS_COLS_C, FLAG + row, bad, single, dead, ew, extra, EXC,
                                    GRD)
                else:
                    tl.store(r + REC_EXCESS, exc)
                    if DEFER:
                        tl.store(r + REC_EX, extra)
                    if bad == 0:
                        # (DEFER: the launch passes τ = +inf, so the tilt is skipped and TV⁺ is the closed forms')
                        tva, tanh, eform, tilt, rho = _tv_row(ha, qn_a * edge, eps_max, xi, lam, tilt_above, tilt_hi,
                                                              SCR + row * 2 * (3 * KP + N1), exc, KA, KP, N1, RT, NR,
                                                              EPSC, DENSE3D, TC)
                        tl.store(r + REC_TANH, tanh)
                        tl.store(r + REC_EFORM, eform)
                        tl.store(r + REC_TILT, tilt)
                        tl.store(r + REC_RHO, rho)
                        if single:
                            tva = tl.full([], 0.0, tl.float64)
                        ea = _out_err_upper(tva, ew, extra)
                    else:
                        tl.store(r + REC_TANH, 1.0)
                        tl.store(r + REC_EFORM, 1.0)
                        tl.store(r + REC_TILT, 1.0)
                        tl.store(r + REC_RHO, 1.0)
                        ea = tl.full([], float("inf"), tl.float64)
                    tl.store(r + REC_TVA, tl.where(dead, 0.0, tva))
                    tl.store(r + REC_EA, tl.where(dead, 0.0, ea))
                    if not DEFER:  # (DEFER: ``_store_tilt_inputs`` above)
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
                    hb = tl.load(HIST_IN + (row * S + s)[:, None] * NB + KA + k[None, :],
                                 mask=smask[:, None] & km[None, :], other=0.0)
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
                        eb = _out_err_upper(tvb, ew, extra)
                    tl.store(r + REC_TVB, tl.where(dead, 0.0, tvb))
                    tl.store(r + REC_EB, tl.where(dead, 0.0, eb))


@triton.jit
def _store_tilt_inputs(r, qn_a, lam, ew, eps_max, xi):
    """DEFER: the finish's inputs in the row's record: the levels' factor, Λ, 2ν_max + φ_max, ε_max, Ξ."""
    tl.store(r + REC_QNA, qn_a)
    tl.store(r + REC_LAM, lam)
    tl.store(r + REC_EW, ew)
    tl.store(r + REC_EPS, eps_max)
    tl.store(r + REC_XI, xi)


@triton.jit
def _pending_record(r, e, flag, bad, single, dead, ew, extra, EXC: tl.constexpr, GRD: tl.constexpr):
    """DEFER_FORMS: the record until the finish. E⁺'s additive part (REC_EX); the forms' columns 1 and TV⁺ 1 (a
    single-token row's final 0), E⁺ from it (+inf where anything was non-finite); a dead row 0 and 0; the row's state
    in EXS (how many sums it holds: 0, 2, EXCESS_COLS; the non-finite count); the flag. A flagged or dead row takes
    the excess column alone in the finish, as in the fused merge, and keeps the pending 1s."""
    tl.store(r + REC_EX, extra)
    tl.store(r + REC_EXCESS, 1.0)
    tl.store(r + REC_TANH, 1.0)
    tl.store(r + REC_EFORM, 1.0)
    tl.store(r + REC_TILT, 1.0)
    tl.store(r + REC_RHO, 1.0)
    ok = bad == 0
    tva = tl.where(ok & single, 0.0, 1.0).to(tl.float64)
    ea = tl.where(ok, _out_err_upper(tva, ew, extra), float("inf"))
    tl.store(r + REC_TVA, tl.where(dead, 0.0, tva))
    tl.store(r + REC_EA, tl.where(dead, 0.0, ea))
    NSUM: tl.constexpr = (EXCESS_COLS_C if GRD else 2) if EXC else 0
    tl.store(e + EXCESS_COLS_C, tl.full([], NSUM, tl.float64))
    tl.store(e + EXCESS_COLS_C + 1, bad.to(tl.float64))
    tl.store(flag, ((bad > 0) & ~dead).to(tl.int8))


@triton.jit
def _merge_in_parts(ACC_IN, HIST_IN, STAT_IN, Q, O, LSE, r, HOUT, FLAG, WGT, EX_IN, EXS, PRT, CNT, row, b, h, n, dead,
                    S, s, smask, ls, mx, w64, qn_infl, s_qb, s_qh, s_ob, s_oh, s_lb, s_lh, D: tl.constexpr,
                    T: tl.constexpr, PAGES: tl.constexpr, NB: tl.constexpr, GAMMA: tl.constexpr,
                    EXP_REL: tl.constexpr, DITHER_U: tl.constexpr, ETA0: tl.constexpr, ETA1: tl.constexpr,
                    FLUSH: tl.constexpr, OUT_REL0: tl.constexpr, WEIGHTED: tl.constexpr, GQ: tl.constexpr,
                    RING_TILES: tl.constexpr, LSE_W: tl.constexpr, LSE_WP: tl.constexpr, STORE_REL: tl.constexpr,
                    STORE_ABS: tl.constexpr, STORE_MAX: tl.constexpr, EXC: tl.constexpr, GRD: tl.constexpr,
                    PARTS: tl.constexpr):
    """``_merge_meter_kernel``'s PARTS > 1 (DEFER_FORMS): this program's share of row ``row``'s terms, its hand-over
    (PRT), and for the row's last program to arrive the pending record (``_pending_record``) from every share."""
    part = tl.program_id(1)
    P_A: tl.constexpr = 1 if PARTS == 3 else 0  # the record's scalars
    P_B: tl.constexpr = PARTS - 1  # the histograms and the excess sums
    p = PRT + row * PRT_COLS
    e = EXS + row * DEFER_EXS_COLS_C
    if part == 0:
        L, o = _merge_output(ACC_IN, O, LSE, row, b, h, S, s, smask, ls, mx, w64, dead, s_ob, s_oh, s_lb, s_lh, D,
                             LSE_W, LSE_WP)
        bad_o, st_term = _output_terms(L, o, STORE_REL, STORE_ABS, STORE_MAX)
        tl.store(p + PRT_BAD_O, bad_o.to(tl.float64))
        tl.store(p + PRT_ST, st_term)
    if part == P_A:
        L64 = tl.sum(w64 * ls.to(tl.float64), axis=0)
        wmx, smx, phmx, numx, kpmx, bad_s = _stat_terms(STAT_IN, row, S, s, smask)
        qnorm, q1, qn_a, eps_max, eta, xi, lam, bad_x = _query_terms(
            Q, WGT, b, h, n, S, L64, wmx, smx, kpmx, qn_infl, s_qb, s_qh, D, T, PAGES, NB, GAMMA, EXP_REL, DITHER_U,
            ETA0, ETA1, FLUSH, WEIGHTED, GQ, RING_TILES)
        fm, num, x_phi, em = _extra_terms(xi, lam, eta, phmx, numx, OUT_REL0)
        _store_tilt_inputs(r, qn_a, lam, 2.0 * num + fm, eps_max, xi)
        tl.store(p + PRT_BAD_A, (bad_s + bad_x).to(tl.float64))
        tl.store(p + PRT_X_PHI, x_phi)
        tl.store(p + PRT_FM, fm)
        tl.store(p + PRT_NUM, num)
        tl.store(p + PRT_EM, em)
    if part == P_B:
        L64 = tl.sum(w64 * ls.to(tl.float64), axis=0)
        c, hm = _merge_hist(HIST_IN, HOUT, row, S, s, smask, w64, L64, NB)
        bad_h, pphi = _hist_terms(c, hm, NB)
        if EXC:
            a_hat, b_hat, gs = _merge_excess(EX_IN, row, S, s, smask, w64, L64, GRD)
            _store_sums(e, a_hat, b_hat, gs, GRD)
        tl.store(p + PRT_BAD_B, bad_h.to(tl.float64))
        tl.store(p + PRT_PPHI, pphi)
    # every thread's stores before the one release of the row's counter; the last program's acquire then sees the
    # other programs' stores (the pattern of a grid-wide barrier's arrival, without any wait)
    tl.debug_barrier()
    prev = tl.atomic_add(CNT + row, 1, sem="acq_rel", scope="gpu")
    if prev == PARTS - 1:
        # (through the L2: no line of the hand-over another row's program brought into this SM's L1 is read)
        bad = tl.load(p + PRT_BAD_O, cache_modifier=".cg") + tl.load(p + PRT_BAD_A, cache_modifier=".cg") \
            + tl.load(p + PRT_BAD_B, cache_modifier=".cg")
        fm = tl.load(p + PRT_FM, cache_modifier=".cg")
        num = tl.load(p + PRT_NUM, cache_modifier=".cg")
        extra = _extra(tl.load(p + PRT_PPHI, cache_modifier=".cg"), tl.load(p + PRT_X_PHI, cache_modifier=".cg"), fm,
                       num, tl.load(p + PRT_EM, cache_modifier=".cg"))
        if STORE_REL > 0:
            extra += tl.load(p + PRT_ST, cache_modifier=".cg")
        _pending_record(r, e, FLAG + row, bad, n == 1, dead, 2.0 * num + fm, extra, EXC, GRD)
        tl.store(CNT + row, 0)  # (the next call's count starts at 0: the next launch sees it)


#: columns of the fused merge's record (float64 per row; the flag is its own int8 output, ``FLAG``); the last
#: four before the last are written with DEFER only: |σ|‖a⊙q_h‖ (the levels' factor), Λ, 2ν_max + φ_max and E⁺'s
#: additive part; the last, the excess form (``_excess_form``; 1 without EXC), by every record
(REC_TVA, REC_TVB, REC_EA, REC_EB, REC_EPS, REC_TB, REC_TANH, REC_EFORM, REC_TILT, REC_XI, REC_RHO,
 REC_QNA, REC_LAM, REC_EW, REC_EX, REC_EXCESS) = range(16)
REC_COLS = 16
#: the merge in parts' hand-over row (``_merge_in_parts``, float64): the output's non-finite count and the store's
#: term; the record scalars' non-finite count and E⁺'s factors (``merge_terms._extra_terms``: tanh(Ξ/2) + Λ, φ_max,
#: ν_max, E(2Ξ + out_rel)); the histograms' non-finite count and Σ p̃φ
(PRT_BAD_O, PRT_ST, PRT_BAD_A, PRT_X_PHI, PRT_FM, PRT_NUM, PRT_EM, PRT_BAD_B, PRT_PPHI) = range(9)
PRT_COLS = 9
for _name in ("REC_TVA", "REC_TVB", "REC_EA", "REC_EB", "REC_EPS", "REC_TB", "REC_TANH", "REC_EFORM", "REC_TILT",
              "REC_XI", "REC_RHO", "REC_QNA", "REC_LAM", "REC_EW", "REC_EX", "REC_EXCESS", "REC_COLS", "PRT_BAD_O",
              "PRT_ST", "PRT_BAD_A", "PRT_X_PHI", "PRT_FM", "PRT_NUM", "PRT_EM", "PRT_BAD_B", "PRT_PPHI",
              "PRT_COLS"):
    globals()[_name] = tl.constexpr(globals()[_name])
