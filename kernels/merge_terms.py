"""The fused merge's per-row terms (``@triton.jit`` helpers of ``kernels.epilogue_jit._merge_meter_kernel``, inlined by
Triton): each reads one row's split partials or query and returns what the record is built from. The fused merge
calls them one after another in one program; the deferred record's merge in parts (``kernels.plan.MERGE_PARTS``)
calls them in two or three programs of the row at once, which hand their results over (``epilogue_jit.PRT_*``). Each
term is written once for both.

    _merge_weights   the log-sum-exp weights w_s = e^{m_s − max m} (float64; 0 for a non-finite m_s)
    _merge_output    L = Σ w_s l_s (fp32), o = Σ w_s acc_s / L → O, the log-sum-exp → LSE
    _output_terms    the output's non-finite count and the store's rounding term of E⁺ (STORE_REL)
    _stat_terms      the partials' maxima (‖W‖, s, φ, ν, κ) and their non-finite count
    _query_terms     ‖q‖, ‖q‖₁, |σ|‖a⊙q‖, ε_max, η, Ξ, Λ and their non-finite count (SPEC §7)
    _extra_terms     φ_max, ν_max, tanh(Ξ/2) + Λ and E(2Ξ + out_rel): the factors of E⁺'s additive part
    _extra           that part, Σp̃φ + (tanh(Ξ/2) + Λ)φ_max + ν_max E(2Ξ + out_rel), in explicit FMAs
    _merge_hist      the merged histograms → HOUT, their non-finite count, Σ p̃φ (the last bin)
    _merge_excess    the merged excess sums Â, B̂ and the grid block (``excess_grid``)
    _excess_form     the centred box's closed form from Â, B̂ and Ξ; ``_with_grid_form`` the grid's beside it
    _store_sums      the merged sums into a deferred record's EXS row (``kernels.tilt_batch`` computes the forms)
"""

from __future__ import annotations

import triton
import triton.language as tl

from .excess_grid import EXCESS_COLS_C, GRID_COLS_C, _grid_form
from .interpret import f32, narrow


@triton.jit
def _expm1_up(y):
    """An upper bound of e^y − 1 for 0 ≤ y (float64): the series y + y²/2 + y³ below 2^-10 (its
    tail y³/6 + … ≤ y³ there), else e^y − 1; both with a relative 2^-40 for their rounding."""
    small = y + 0.5 * y * y + y * y * y
    big = tl.exp(y) - 1.0
    return tl.where(y < 0.0009765625, small, big) * (1.0 + 9.094947017729282e-13)


@triton.jit
def _merge_weights(M_IN, L_IN, row, S, SP: tl.constexpr):
    """(s, its mask, the split denominators l_s, max m, the weights w_s float64) of row ``row``'s S partials."""
    s = tl.arange(0, SP)
    smask = s < S
    ms = tl.load(M_IN + row * S + s, mask=smask, other=float("-inf"))
    ls = tl.load(L_IN + row * S + s, mask=smask, other=0.0)
    mx = tl.max(ms, axis=0)
    fin = (ms == ms) & (ms != float("inf")) & (ms != float("-inf"))
    w64 = tl.where(fin, tl.exp((ms - mx).to(tl.float64)), 0.0)
    return s, smask, ls, mx, w64


@triton.jit
def _merge_output(ACC_IN, O, LSE, row, b, h, S, s, smask, ls, mx, w64, dead, s_ob, s_oh, s_lb, s_lh,
                  D: tl.constexpr, LSE_W: tl.constexpr, LSE_WP: tl.constexpr):
    """The split-KV merge's output (log-sum-exp rule, fp32 weights): o → O[b, h] in O's dtype, the log-sum-exp →
    LSE[b, h, 0] (−inf in its other LSE_W − 1 columns); a dead row (no token) 0, not 0/0. Returns (L, o)."""
    w32 = w64.to(tl.float32)
    L = tl.sum(w32 * ls, axis=0)
    d = tl.arange(0, D)
    acc = tl.load(ACC_IN + (row * S + s)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(w32[:, None] * acc, axis=0) / L
    o = tl.where(dead, 0.0, o)
    # in O's own dtype (the caller's output buffer: no copy after the launch); LSE's columns past the first −inf
    # (int64 offsets: a caller's strided buffer may span more than 2^31 elements)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    tl.store(O + b64 * s_ob + h64 * s_oh + d, narrow(o, O))  # (narrow: exact in the interpreter too)
    lw = tl.arange(0, LSE_WP)  # (LSE_WP: the next power of two of LSE_W)
    tl.store(LSE + b64 * s_lb + h64 * s_lh + lw, tl.where(lw == 0, mx + tl.log(L), float("-inf")), mask=lw < LSE_W)
    return L, o


@triton.jit
def _output_terms(L, o, STORE_REL: tl.constexpr, STORE_ABS: tl.constexpr, STORE_MAX: tl.constexpr):
    """(the output's non-finite count: L, o's entries, with STORE_REL > 0 the |o_i| above STORE_MAX; the store's
    rounding term of E⁺, STORE_REL·‖o‖₂ + STORE_ABS, 0 without: contract STORE_ROUNDING, Lean
    output_error_stored_le)."""
    bad = ((L != L) | (L == float("inf")) | (L == float("-inf"))).to(tl.float32)
    bad += tl.sum(((o != o) | (o == float("inf")) | (o == float("-inf"))).to(tl.float32), axis=0)
    st = tl.full([], 0.0, tl.float64)
    if STORE_REL > 0:
        o64 = o.to(tl.float64)
        st = STORE_REL * tl.sqrt(tl.sum(o64 * o64, axis=0)) + STORE_ABS
        bad += tl.sum((tl.abs(o) > STORE_MAX).to(tl.float32), axis=0)
    return bad, st


@triton.jit
def _stat_terms(STAT_IN, row, S, s, smask):
    """(max ‖W‖, max s, max φ, max ν, max κ over the splits, float32; the non-finite count: the partials' own counts
    and any NaN / +inf among their stats, which a max may drop)."""
    st = STAT_IN + (row * S + s) * 6
    wmx = tl.max(tl.load(st + 0, mask=smask, other=0.0), axis=0)
    smx = tl.max(tl.load(st + 1, mask=smask, other=0.0), axis=0)
    phmx = tl.max(tl.load(st + 2, mask=smask, other=0.0), axis=0)
    numx = tl.max(tl.load(st + 3, mask=smask, other=0.0), axis=0)
    kpmx = tl.max(tl.load(st + 5, mask=smask, other=0.0), axis=0)
    bad = tl.sum(tl.load(st + 4, mask=smask, other=0.0), axis=0)
    for col in tl.static_range(6):
        sv = tl.load(st + col, mask=smask, other=0.0)
        bad += tl.sum(((sv != sv) | (sv == float("inf"))).to(tl.float32), axis=0)
    return wmx, smx, phmx, numx, kpmx, bad


@triton.jit
def _query_terms(Q, WGT, b, h, n, S, L64, wmx, smx, kpmx, qn_infl, s_qb, s_qh, D: tl.constexpr, T: tl.constexpr,
                 PAGES: tl.constexpr, NB: tl.constexpr, GAMMA: tl.constexpr, EXP_REL: tl.constexpr,
                 DITHER_U: tl.constexpr, ETA0: tl.constexpr, ETA1: tl.constexpr, FLUSH: tl.constexpr,
                 WEIGHTED: tl.constexpr, GQ: tl.constexpr, RING_TILES: tl.constexpr):
    """(‖q_h‖, ‖q_h‖₁, the levels' factor |σ|‖a⊙q_h‖ (1 + KERNEL_REL_SLACK), ε_max, η, Ξ, Λ, float64; their non-finite
    count)."""
    d = tl.arange(0, D)
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
    bad = ((xi != xi) | (xi == float("inf")) | (eps_max != eps_max) | (eps_max == float("inf"))
           | (lam != lam)).to(tl.float32)
    return qnorm, q1, qn_a, eps_max, eta, xi, lam, bad


@triton.jit
def _extra_terms(xi, lam, eta, phmx, numx, OUT_REL0: tl.constexpr):
    """(φ_max, ν_max, tanh(Ξ/2) + Λ, E(2Ξ + out_rel) = e^{2Ξ + out_rel} − 1 rounded up; float64): with Σp̃φ, E⁺'s
    additive part (``_extra``)."""
    out_rel = OUT_REL0 + eta
    e1 = tl.exp(-xi)
    return (phmx.to(tl.float64), numx.to(tl.float64), (1.0 - e1) / (1.0 + e1) + lam,
            _expm1_up(tl.minimum(2.0 * xi + out_rel, 700.0)))


@triton.jit
def _extra(pphi, x_phi, fm, num, em):
    """E⁺'s additive part Σp̃φ + (tanh(Ξ/2) + Λ)·φ_max + ν_max·E(2Ξ + out_rel) (the output's own rounding), in two
    explicit FMAs: one rounding wherever it is computed (a compiler may contract a product into the sum in one
    kernel and not in another: the merge in parts' pending E⁺ was one ulp under the one-program merge's on an H100,
    run H3). The slack of ``_out_err_upper`` covers either rounding."""
    return tl.fma(num, em, tl.fma(x_phi, fm, pphi))


@triton.jit
def _merge_hist(HIST_IN, HOUT, row, S, s, smask, w64, L64, NB: tl.constexpr):
    """The merged histograms hm = Σ w_s h_s / L (float64) → HOUT[row]. Returns (their columns, hm)."""
    c = tl.arange(0, NB)
    hs = tl.load(HIST_IN + (row * S + s)[:, None] * NB + c[None, :], mask=smask[:, None], other=0.0)
    hm = tl.sum(w64[:, None] * hs.to(tl.float64), axis=0) / L64
    tl.store(HOUT + row * NB + c, hm)
    return c, hm


@triton.jit
def _hist_terms(c, hm, NB: tl.constexpr):
    """(the merged histograms' non-finite count (NaN, +inf); Σ p̃φ, their last bin)."""
    bad = tl.sum(((hm != hm) | (hm == float("inf"))).to(tl.float32), axis=0)
    return bad, tl.sum(tl.where(c == NB - 1, hm, 0.0), axis=0)


@triton.jit
def _merge_excess(EX_IN, row, S, s, smask, w64, L64, GRD: tl.constexpr):
    """The merged excess sums (Â, B̂, and with GRD the grid block [GRID_COLS] / L; without it Â again, unused) from the
    partials' EX_IN [rows, S, 2 or EXCESS_COLS]."""
    EXW: tl.constexpr = EXCESS_COLS_C if GRD else 2
    ex = EX_IN + (row * S + s) * EXW
    a_hat = tl.sum(w64 * tl.load(ex, mask=smask, other=0.0).to(tl.float64), axis=0) / L64
    b_hat = tl.sum(w64 * tl.load(ex + 1, mask=smask, other=0.0).to(tl.float64), axis=0) / L64
    if GRD:
        gk = tl.arange(0, GRID_COLS_C)
        gs = tl.load(ex[:, None] + 2 + gk[None, :], mask=smask[:, None], other=0.0).to(tl.float64)
        gs = tl.sum(w64[:, None] * gs, axis=0) / L64
    else:
        gs = a_hat
    return a_hat, b_hat, gs


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
def _with_grid_form(exc, a_hat, gs, xi):
    """The smaller of ``exc`` and the same boxes' (t, λ) grid form (``excess_grid._grid_form``) from Â and the merged
    grid block ``gs``: the fused merge's and the finish's one line."""
    return tl.minimum(exc, _grid_form(a_hat, gs, xi, _expm1_up(tl.minimum(2.0 * xi, 700.0))))


@triton.jit
def _store_sums(e, a_hat, b_hat, gs, GRD: tl.constexpr):
    """The merged excess sums into the row's EXS (its rows are DEFER_EXS_COLS wide, grid or not)."""
    tl.store(e, a_hat)
    tl.store(e + 1, b_hat)
    if GRD:
        tl.store(e + 2 + tl.arange(0, GRID_COLS_C), gs)
