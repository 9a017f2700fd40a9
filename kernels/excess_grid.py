"""The centred sketch box's small (t, λ) grid in the decode (SPEC §3(c) on a fixed cover; bench/TIGHTNESS.md, "A small
grid in the fused merge"): the tile's sums beside the two excess sums, and the merge's closed form from them.

    tile  (``_grid_tile``, inlined in ``decode_meter._excess_tile`` and ``decode_program._exact_window``)
          GRID [BLOCK_H, GRID_COLS] fp32 += per head column, for each (t_k, λ_k) of ``GRID`` (the contract's
          ``grid_sum_points`` less the point (0, 1), which is the excess form's A):
              col k < NG:   Σ_j p̃_j (λ_k β_j(t_k) − 1)₊,   β_j(t) = (1 − t) a_j + t b_j,  a_j = e^{−c+ε}, b_j = e^{−c−ε}
              col NG:       Σ_j p̃_j (b_j − 1)          (signed: M' = Σ p̃ b − Σ p̃)
              col NG + 1:   Σ_j p̃_j |b_j − 1|          (V)
          rescaled by α with the softmax, as the histogram is; the window's tokens have a = b = 1 (radius 0)
    merge (``_grid_form``, float64, in ``merge_terms._excess_form``; torch twin ``grid_form_torch``)
          from Â = A/L, the columns / L and the row's Ξ: for each interval [t_i, t_{i+1}] of the contract's cover the
          smallest over its multipliers of the larger end value G(t, λ), capped by t_{i+1}; the largest over the
          intervals. G(t, λ) = S⁺ − t(λ M₋ − 1) + E·(S⁺ + t(V⁺ + |λ − 1| M⁺)), E = e^{2Ξ} − 1 rounded up, S⁺ the sum
          grown by 1 + Ξ + 2^-21 (its fp32 accumulation, as Â's), V⁺ likewise, M± = 1 + M'/L ± (Ξ + 2^-21)·V⁺ (a
          signed sum's error is relative to Σ p̃ |b − 1|).

Soundness (Lean ``WitCert.tilt_tv_le_grid_rescaled``, lean/WitCert/ExcessGrid.lean): with Σ p̂ = 1, t − D(t, λ) =
Σ_j p̂_j g_j, g_j = (λβ_j − 1)₊ − t(λ b_j − 1) (``sub_dualDBox_eq_sum``); p̂ ≤ e^{2Ξ} p̃ and p̃ ≤ e^{2Ξ} p̂ (Ξ, SPEC §7,
``le_exp_two_mul_of_log_ratio`` both ways) give Σ p̂ g ≤ Σ p̃ g + (e^{2Ξ} − 1) Σ p̃ |g| (``sum_le_of_ratio``), and
|g_j| ≤ (λβ_j − 1)₊ + t(|b_j − 1| + |λ − 1| b_j) (``abs_gridTerm_le``); the cover theorem
``tilt_tv_le_dual_grid_box_endpoints`` then bounds TV(p, p̂) itself (no tanh(Ξ/2): the merge adds ρ only). Unlike
e^{2Ξ}·(the grid on p̃), the measure change costs 2Ξ·(the sums), not 2Ξ·t: D ~ t, the g_j are small.

The tile's a_j, b_j are ``_excess_tile``'s (a ≥ e^{−c+ε}, b ≤ e^{−c−ε}: its exp margin μ), so [−log a, −log b] is a
centred box containing the token's; β is raised by 2^-20·a (≥ its three fp32 roundings, each ≤ 2^-24 a as b ≤ a) before
λβ − 1, whose own rounding the merge's growth covers. A NaN term makes its sum NaN ((s + |s|)/2 keeps it, where the
GPU's max would drop it); a NaN or negative sum (or Ξ) makes the form 1, an infinite sum only its own candidates.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from contract.constants import GRID_A_POINT, GRID_TILT_LAMBDAS, GRID_TILT_POINTS, grid_sum_points

#: the (t, λ) whose sums the tile accumulates, in column order (the contract's, less A's point)
GRID = tuple(p for p in grid_sum_points() if p != GRID_A_POINT)
#: how many; the tile's code below is written for this many (ImportError if the contract drifts)
NG = 11
if len(GRID) != NG:
    raise ImportError(f"kernels.excess_grid: the tile sums {NG} grid points, the contract has {len(GRID)}: {GRID}")
#: the grid block's columns per (row, split): NG sums, M', V, padding to a power of two
GRID_COLS = 16
#: columns of the decode's excess buffer EX [B, Hq, S, EXCESS_COLS] with the grid: A, B, then the grid block
EXCESS_COLS = 2 + GRID_COLS
_NGC = tl.constexpr(NG)
#: a deferred record's row of merged sums (``kernels.tilt_batch``'s EXS): the EXCESS_COLS sums, then the row's state
#: (how many sums the merge stored: 0, 2 or EXCESS_COLS; −1 unwritten) and the merge's non-finite count
DEFER_EXS_COLS = EXCESS_COLS + 2
#: (the widths as the kernels read them)
GRID_COLS_C = tl.constexpr(GRID_COLS)
EXCESS_COLS_C = tl.constexpr(EXCESS_COLS)
DEFER_EXS_COLS_C = tl.constexpr(DEFER_EXS_COLS)
_T0, _L0 = tl.constexpr(GRID[0][0]), tl.constexpr(GRID[0][1])
_T1, _L1 = tl.constexpr(GRID[1][0]), tl.constexpr(GRID[1][1])
_T2, _L2 = tl.constexpr(GRID[2][0]), tl.constexpr(GRID[2][1])
_T3, _L3 = tl.constexpr(GRID[3][0]), tl.constexpr(GRID[3][1])
_T4, _L4 = tl.constexpr(GRID[4][0]), tl.constexpr(GRID[4][1])
_T5, _L5 = tl.constexpr(GRID[5][0]), tl.constexpr(GRID[5][1])
_T6, _L6 = tl.constexpr(GRID[6][0]), tl.constexpr(GRID[6][1])
_T7, _L7 = tl.constexpr(GRID[7][0]), tl.constexpr(GRID[7][1])
_T8, _L8 = tl.constexpr(GRID[8][0]), tl.constexpr(GRID[8][1])
_T9, _L9 = tl.constexpr(GRID[9][0]), tl.constexpr(GRID[9][1])
_T10, _L10 = tl.constexpr(GRID[10][0]), tl.constexpr(GRID[10][1])
#: the sums' relative growth for their fp32 accumulation and products (beside Ξ: 1 + Ξ + this), as the excess form's
SUM_GROWTH = 2.0**-21
#: β's allowance for its three fp32 roundings, relative to a (≥ β, ≥ b)
BETA_UP = 2.0**-20
#: the form's own float64 rounding: relative, then absolute
FORM_REL = 2.0**-40
FORM_ABS = 2.0**-50
_GROW, _BETA, _FREL, _FABS = (tl.constexpr(x) for x in (SUM_GROWTH, BETA_UP, FORM_REL, FORM_ABS))


@triton.jit
def _gterm(pT, a1, d, T: tl.constexpr, LAM: tl.constexpr):
    """[N, H]: 2·p̃_j (λ β_j(t) − 1)₊ with β = a + t(b − a) raised by 2^-20·a (``a1`` = a·(1 + 2^-20)), halved after
    its sum over the tile (exact); (s + |s|)/2 is max(s, 0) and keeps a NaN (a max would drop it on the GPU), so a NaN
    term makes the sum NaN (the form 1); −inf gives NaN too (the form 1, never a value below it)."""
    s = LAM * (T * d + a1) - 1.0
    return pT * (s + tl.abs(s))


@triton.jit
def _put(g, k, col, x):
    """``g`` [H, COLS] with column ``k`` raised by ``x`` [H]."""
    return g + tl.where(col[None, :] == k, x[:, None], 0.0)


@triton.jit
def _add13(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12,
           b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12):
    return (a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7, a8 + b8, a9 + b9, a10 + b10,
            a11 + b11, a12 + b12)


@triton.jit
def _grid_tile(pT, a, b, alpha, grd, ONE: tl.constexpr = False):
    """The grid block [H, GRID_COLS] rescaled by α and raised by this tile's sums (module doc), from the tile's p̃ᵀ
    [N, H] and each (token, head)'s a ≥ b > 0 [N, H] (or [N, 1]). ``ONE`` (``kernels.plan.GRID_ONE_REDUCE``): the 13
    sums in one multi-operand reduction (fewer barriers; the same terms and halving)."""
    col = tl.arange(0, GRID_COLS_C)
    d = b - a
    a1 = a * (1.0 + _BETA)
    g = grd * alpha[:, None]
    bm = b - 1.0
    t0, t1, t2 = _gterm(pT, a1, d, _T0, _L0), _gterm(pT, a1, d, _T1, _L1), _gterm(pT, a1, d, _T2, _L2)
    t3, t4, t5 = _gterm(pT, a1, d, _T3, _L3), _gterm(pT, a1, d, _T4, _L4), _gterm(pT, a1, d, _T5, _L5)
    t6, t7, t8 = _gterm(pT, a1, d, _T6, _L6), _gterm(pT, a1, d, _T7, _L7), _gterm(pT, a1, d, _T8, _L8)
    t9, t10 = _gterm(pT, a1, d, _T9, _L9), _gterm(pT, a1, d, _T10, _L10)
    t11, t12 = pT * bm, pT * tl.abs(bm)
    if ONE:
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = tl.reduce(
            (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12), 0, _add13)
    else:
        s0, s1, s2, s3 = tl.sum(t0, axis=0), tl.sum(t1, axis=0), tl.sum(t2, axis=0), tl.sum(t3, axis=0)
        s4, s5, s6, s7 = tl.sum(t4, axis=0), tl.sum(t5, axis=0), tl.sum(t6, axis=0), tl.sum(t7, axis=0)
        s8, s9, s10 = tl.sum(t8, axis=0), tl.sum(t9, axis=0), tl.sum(t10, axis=0)
        s11, s12 = tl.sum(t11, axis=0), tl.sum(t12, axis=0)
    g = _put(g, 0, col, s0 * 0.5)
    g = _put(g, 1, col, s1 * 0.5)
    g = _put(g, 2, col, s2 * 0.5)
    g = _put(g, 3, col, s3 * 0.5)
    g = _put(g, 4, col, s4 * 0.5)
    g = _put(g, 5, col, s5 * 0.5)
    g = _put(g, 6, col, s6 * 0.5)
    g = _put(g, 7, col, s7 * 0.5)
    g = _put(g, 8, col, s8 * 0.5)
    g = _put(g, 9, col, s9 * 0.5)
    g = _put(g, 10, col, s10 * 0.5)
    g = _put(g, _NGC, col, s11)
    g = _put(g, _NGC + 1, col, s12)
    return g


@triton.jit
def _gval(s, m_lo, m_up, v_up, e2m1, T: tl.constexpr, LAM: tl.constexpr):
    """G(t, λ) of one end (float64, module doc)."""
    t = tl.full([], T, tl.float64)
    lam = tl.full([], LAM, tl.float64)
    return s - t * (lam * m_lo - 1.0) + e2m1 * (s + t * (v_up + tl.abs(lam - 1.0) * m_up))


@triton.jit
def _pick(gs, col, k):
    """Column ``k`` of the float64 vector ``gs``."""
    return tl.sum(tl.where(col == k, gs, 0.0), axis=0)


@triton.jit
def _grid_form(a_hat, gs, xi, e2m1):
    """The grid's closed form (float64, module doc) from Â = A/L, the grid block / L ``gs`` [GRID_COLS], Ξ and
    ``e2m1`` ≥ e^{2Ξ} − 1 (the caller's ``epilogue_jit._expm1_up``, which the excess form uses too); 1
    where a sum or Ξ is NaN or negative (V, the S's; M' is signed) — no form: the others stay sound. An infinite sum
    leaves the candidates that do not read it (an infinite V or Ξ leaves only the caps: 1)."""
    col = tl.arange(0, GRID_COLS_C)
    gr = 1.0 + xi + _GROW
    v_up = _pick(gs, col, _NGC + 1) * gr
    err = (xi + _GROW) * v_up
    mp = _pick(gs, col, _NGC)
    m_lo = 1.0 + mp - err
    m_up = 1.0 + mp + err
    sa = a_hat * gr
    s0 = _pick(gs, col, 0) * gr
    s1 = _pick(gs, col, 1) * gr
    s2 = _pick(gs, col, 2) * gr
    s3 = _pick(gs, col, 3) * gr
    s4 = _pick(gs, col, 4) * gr
    s5 = _pick(gs, col, 5) * gr
    s6 = _pick(gs, col, 6) * gr
    s7 = _pick(gs, col, 7) * gr
    s8 = _pick(gs, col, 8) * gr
    s9 = _pick(gs, col, 9) * gr
    s10 = _pick(gs, col, 10) * gr
    # a NaN anywhere makes the form 1 (a sum propagates it; the GPU's min / max would drop it); an infinite sum only
    # empties its own candidates (each (t, λ) is a bound of its own), a negative one is refused
    tot = sa + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7 + s8 + s9 + s10 + v_up + mp + xi
    smin = tl.minimum(tl.minimum(tl.minimum(sa, s0), tl.minimum(s1, s2)), tl.minimum(tl.minimum(s3, s4), s5))
    smin = tl.minimum(smin, tl.minimum(tl.minimum(s6, s7), tl.minimum(tl.minimum(s8, s9), s10)))
    ok = (tot == tot) & (smin >= 0.0) & (v_up >= 0.0) & (xi >= 0.0)
    # the sums by (t, λ) (``GRID``'s order: the contract's ``grid_sum_points``; the twin reads the same table)
    gA = _gval(sa, m_lo, m_up, v_up, e2m1, 0.0, 1.0)
    g0 = _gval(s0, m_lo, m_up, v_up, e2m1, _T0, _L0)
    g1 = _gval(s1, m_lo, m_up, v_up, e2m1, _T1, _L1)
    g2 = _gval(s2, m_lo, m_up, v_up, e2m1, _T2, _L2)
    g3 = _gval(s3, m_lo, m_up, v_up, e2m1, _T3, _L3)
    g4 = _gval(s4, m_lo, m_up, v_up, e2m1, _T4, _L4)
    g5 = _gval(s5, m_lo, m_up, v_up, e2m1, _T5, _L5)
    g6 = _gval(s6, m_lo, m_up, v_up, e2m1, _T6, _L6)
    g7 = _gval(s7, m_lo, m_up, v_up, e2m1, _T7, _L7)
    g8 = _gval(s8, m_lo, m_up, v_up, e2m1, _T8, _L8)
    g9 = _gval(s9, m_lo, m_up, v_up, e2m1, _T9, _L9)
    g10 = _gval(s10, m_lo, m_up, v_up, e2m1, _T10, _L10)
    # the contract's cover (checked at import against GRID: ``_check_cover``): [0, 5/16] λ ∈ {1, 1 − 3/512,
    # 1 − 7/512}; [5/16, 11/16] λ = 1; [11/16, 1] λ ∈ {1, 1 + 3/512, 1 + 7/512}; each capped by its right end
    i0 = tl.minimum(tl.minimum(tl.maximum(gA, g2), tl.maximum(g0, g3)), tl.minimum(tl.maximum(g1, g4), _T2 * 1.0))
    i1 = tl.minimum(tl.maximum(g2, g5), _T5 * 1.0)
    i2 = tl.minimum(tl.minimum(tl.maximum(g5, g8), tl.maximum(g6, g9)), tl.minimum(tl.maximum(g7, g10), 1.0))
    top = tl.maximum(tl.maximum(tl.maximum(i0, i1), i2), 0.0)
    f = top * (1.0 + _FREL) + _FABS
    ok = ok & (f == f) & (f < float("inf"))
    return tl.where(ok, tl.minimum(f, 1.0), 1.0)


#: the cover as the merge hard-codes it: per interval, the (t, λ) pairs whose larger end value it takes — indices into
#: ("A",) + GRID at (left end, right end)
COVER = (((-1, 2), (0, 3), (1, 4)), ((2, 5),), ((5, 8), (6, 9), (7, 10)))


def _check_cover() -> None:
    """The merge's hard-coded cover is the contract's (ImportError otherwise: a drift in the contract needs the merge
    rewritten)."""
    pts = ((0.0, 1.0),) + GRID
    ts, ls = GRID_TILT_POINTS, GRID_TILT_LAMBDAS
    for i, row in enumerate(COVER):
        got = [(pts[lo + 1], pts[hi + 1]) for lo, hi in row]
        want = [((ts[i], lam), (ts[i + 1], lam)) for lam in ls[i]]
        if got != want:
            raise ImportError(f"kernels.excess_grid: the merge's interval {i} reads {got}, the contract's is {want}")


_check_cover()


def expm1_up_torch(y: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``epilogue_jit._expm1_up`` (float64, 0 ≤ y): y + y²/2 + y³ below 2^-10, else e^y − 1, both up by a
    relative 2^-40 (the excess form's and the grid's e^{2Ξ} − 1)."""
    return torch.where(y < 2.0**-10, y + 0.5 * y * y + y * y * y, torch.expm1(y)) * (1.0 + 2.0**-40)


def grid_block_fp64(w, c, eps):
    """The tile's sums in exact float64 arithmetic (a reference for the self-check, the bridge and the tests): for
    masses ``w`` [..., n] (any positive scale) and the centred boxes c ± ε, a = e^{−c+ε}, b = e^{−c−ε}, returns (Â
    [...], the grid block / Σ w [..., GRID_COLS]): Σ w (a − 1)₊, then the ``GRID`` sums Σ w (λβ(t) − 1)₊,
    Σ w (b − 1), Σ w |b − 1|, each over Σ w (numpy)."""
    w, c, eps = (np.asarray(x, dtype=np.float64) for x in (w, c, eps))
    L = w.sum(-1)
    a, b = np.exp(-c + eps), np.exp(-c - eps)
    gs = np.zeros(np.broadcast_shapes(w.shape, a.shape)[:-1] + (GRID_COLS,))
    for k, (t, lam) in enumerate(GRID):
        gs[..., k] = (w * np.maximum(lam * ((1.0 - t) * a + t * b) - 1.0, 0.0)).sum(-1) / L
    gs[..., NG] = (w * (b - 1.0)).sum(-1) / L
    gs[..., NG + 1] = (w * np.abs(b - 1.0)).sum(-1) / L
    return (w * np.maximum(a - 1.0, 0.0)).sum(-1) / L, gs


def grid_form_torch(a_hat: torch.Tensor, gs: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``_grid_form`` (float64): Â [...], the grid block / L ``gs`` [..., GRID_COLS], Ξ [...] → the form
    [...] (1 where a sum or Ξ is NaN or negative; an infinite sum empties its own candidates)."""
    a_hat, gs, xi = a_hat.double(), gs.double(), xi.double()
    gr = 1.0 + xi + SUM_GROWTH
    v_up = gs[..., NG + 1] * gr
    err = (xi + SUM_GROWTH) * v_up
    m_lo = 1.0 + gs[..., NG] - err
    m_up = 1.0 + gs[..., NG] + err
    e2m1 = expm1_up_torch((2.0 * xi).clamp(max=700.0))
    sums = torch.cat([(a_hat * gr)[..., None], gs[..., :NG] * gr[..., None]], dim=-1)  # ("A",) + GRID
    pts = ((0.0, 1.0),) + GRID
    vals = [sums[..., k] - t * (lam * m_lo - 1.0) + e2m1 * (sums[..., k] + t * (v_up + abs(lam - 1.0) * m_up))
            for k, (t, lam) in enumerate(pts)]
    top = torch.zeros_like(xi)
    for i, row in enumerate(COVER):
        best = torch.full_like(xi, GRID_TILT_POINTS[i + 1])
        for lo, hi in row:
            best = torch.minimum(best, torch.maximum(vals[lo + 1], vals[hi + 1]))
        top = torch.maximum(top, best)
    f = top * (1.0 + FORM_REL) + FORM_ABS
    tot = sums.sum(-1) + v_up + gs[..., NG] + xi
    ok = ~torch.isnan(tot) & (sums.amin(-1) >= 0) & (v_up >= 0) & (xi >= 0) & ~torch.isnan(f) & (f < float("inf"))
    return torch.where(ok, f.clamp(max=1.0), torch.ones_like(f))
