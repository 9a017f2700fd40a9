"""The bridge's check of the centred box's excess form (lean/WitCert/Excess.lean: ``tilt_tv_le_excess``, the
one-interval cover with λ = 1 of ``tilt_tv_le_dual_grid_box_endpoints``, and ``tilt_tv_le_excess_rescaled``, the sums
over the kernel's masses p̃ scaled by e^{2Ξ}, p̂ ≤ e^{2Ξ} p̃ by ``le_exp_two_mul_of_log_ratio``): the merge's form
(``kernels.epilogue.excess_form_torch``, the torch twin the fused merge's ``merge_terms._excess_form`` is pinned to by
tests/kernels/test_excess_form.py) against ``formulas.EXCESS_UP`` / ``EXCESS_DOWN`` and the rescaled theorem's right
side, and the fp64 reference's one-interval grid (``witcert.bounds.dual_grid._tilt_row_grid`` on the one interval [0, 1] with λ = 1)
against the theorem's max(A, B) (called by ``proofs_bridge.check.check_formulas``)."""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from . import formulas as F
from .check_tilt import _BOX_DOWN, _BOX_UP, _FORMULA_FP64, _corner_sup, sup_row

_UP = sp.lambdify((F.c_box, F.x), F.EXCESS_UP, "numpy")
_DOWN = sp.lambdify((F.c_box, F.x), F.EXCESS_DOWN, "numpy")
_ITEM = sp.lambdify((F.lam, F.t, F.c_box, F.x), F.DUAL_ITEM_BOX, "numpy")
#: the form's own slacks (the sums' growth 1 + Ξ + 2^-21, the result's 2^-40, e^{2Ξ} rounded up): the twin may be above
#: the theorem's right side by at most (Ξ + this)·it (a drift that drops a term shows as "below")
_REL_ABOVE = 2.0**-19


def _sums(w, c, e):
    """(A, B) = (Σ w EXCESS_UP(c, ε), Σ w EXCESS_DOWN(c, ε)) of a row (a distribution w)."""
    return float(np.sum(w * _UP(c, e))), float(np.sum(w * _DOWN(c, e)))


def _rescaled(a, b, xi):
    """The right side of ``tilt_tv_le_excess_rescaled``: e^{2Ξ} max(A, B)."""
    return np.exp(2 * xi) * max(a, b)


def check_excess_form(rng, rows: int = 24, K: int = 6):
    names = ("excess form: the one-interval λ = 1 ends of dualDBox are EXCESS_UP and EXCESS_DOWN",
             "excess form: the merge's twin = e^{2Ξ} max(A, B) (tilt_tv_le_excess_rescaled), never below it",
             "excess form: the fp64 reference's one-interval grid = max(A, B) (tilt_tv_le_excess)",
             "excess form: max(A, B) ≥ brute-force supremum over the centred box")
    try:
        import torch

        from kernels.epilogue import excess_form_torch
        from witcert.bounds import dual_grid
    except ImportError as exc:
        return [(n, False, f"cannot import: {exc}") for n in names]
    ok_ends = ok_twin = ok_ref = ok_sup = True
    d_ends = d_twin = d_ref = d_sup = ""
    for r in range(rows):
        w, c, e = sup_row(rng, r, K)
        a, b = _sums(w, c, e)
        # 0 − D(0, 1) and 1 − D(1, 1) of the one interval [0, 1] (Σ w = 1), from DUAL_ITEM_BOX
        g0 = 0.0 - float(np.sum(w * _ITEM(1.0, 0.0, c, e)))
        g1 = 1.0 - float(np.sum(w * _ITEM(1.0, 1.0, c, e)))
        if not (abs(g0 - a) <= 1e-12 * (1 + a) and abs(g1 - b) <= 1e-12 * (1 + b)):
            ok_ends, d_ends = False, f"row {r}: ends {g0:.17g}, {g1:.17g} against A {a:.17g}, B {b:.17g}"
        for xi in (0.0, 1e-6, 3e-4, 0.02):
            got = float(excess_form_torch(torch.tensor(a), torch.tensor(b), torch.tensor(xi)))
            want = min(1.0, _rescaled(a, b, xi))
            if not (got >= want - _FORMULA_FP64 and got <= want * (1 + xi + _REL_ABOVE)):
                ok_twin, d_twin = False, f"row {r}, Ξ {xi}: twin {got:.17g} against {want:.17g}"
        ref = float(dual_grid._tilt_row_grid(w, _BOX_UP(c, e), _BOX_DOWN(c, e), (0.0, 1.0), ((1.0,),)))
        want = min(1.0, max(a, b)) if np.any(e > 0) or np.ptp(c) > 0 else 0.0
        if not (ref >= want - _FORMULA_FP64 and ref <= want + 1e-9):
            ok_ref, d_ref = False, f"row {r}: reference {ref:.17g} against max(A, B) {want:.17g}"
        sup, _ = _corner_sup(w, c, e)
        if max(a, b) < sup - 1e-12:
            ok_sup, d_sup = False, f"row {r}: max(A, B) {max(a, b):.6g} below the supremum {sup:.6g}"
    return [(names[0], ok_ends, d_ends), (names[1], ok_twin, d_twin), (names[2], ok_ref, d_ref),
            (names[3], ok_sup, d_sup)]


def _grid_rhs(w, c, e, xi, cover):
    """The right side of ``tilt_tv_le_grid_rescaled_capped`` on the contract's cover (float64): max over the intervals
    of min(t_{i+1}, min over its multipliers of max(G(t_i, λ), G(t_{i+1}, λ))), G = Lean ``gridBound`` over p̃ = w."""
    ts, ls = cover
    b = np.exp(-c - e)
    m, v, tot = float(np.sum(w * b)), float(np.sum(w * np.abs(b - 1))), float(np.sum(w))
    E = math.expm1(2 * xi)

    def G(t, lam):
        s = float(np.sum(w * np.maximum(lam * ((1 - t) * np.exp(-c + e) + t * b) - 1, 0)))
        return s - t * (lam * m - tot) + E * (s + t * (v + abs(lam - 1) * m))

    return max(min([ts[i + 1]] + [max(G(ts[i], lam), G(ts[i + 1], lam)) for lam in row]) for i, row in enumerate(ls))


def check_excess_grid(rng, rows: int = 24, K: int = 6):
    """``tilt_tv_le_grid_rescaled_capped`` (lean/WitCert/ExcessGrid.lean): the merge's twin
    (``kernels.excess_grid.grid_form_torch``) on the sums a tile accumulates (float64 here) is never below the theorem's
    right side on the contract's cover (``GRID_TILT_POINTS`` / ``GRID_TILT_LAMBDAS``) and at most its slacks above it;
    the merge's hard-coded cover is the contract's (``excess_grid.COVER``); and the twin is ≥ the brute-force supremum
    over the centred box."""
    names = ("excess grid: the merge's twin = the capped cover of gridBound (tilt_tv_le_grid_rescaled_capped), never below",
             "excess grid: the merge's cover is the contract's",
             "excess grid: the twin ≥ brute-force supremum over the centred box")
    try:
        import torch

        from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS
        from kernels import excess_grid as X
    except ImportError as exc:
        return [(n, False, f"cannot import: {exc}") for n in names]
    try:
        X._check_cover()
        ok_cover, d_cover = True, ""
    except ImportError as exc:
        ok_cover, d_cover = False, str(exc)
    cover = (GRID_TILT_POINTS, GRID_TILT_LAMBDAS)
    ok_twin = ok_sup = True
    d_twin = d_sup = ""
    for r in range(rows):
        w, c, e = sup_row(rng, r, K)
        scale = (0.02, 0.1, 1.0)[r % 3]
        c, e = c * scale, e * scale
        a_hat, gs = X.grid_block_fp64(w, c, e)  # (the tile's sums, exact; w is a distribution)
        a_hat = float(a_hat)
        for xi in (0.0, 1e-6, 3e-4, 0.02):
            got = float(X.grid_form_torch(torch.tensor(a_hat), torch.from_numpy(gs), torch.tensor(xi)))
            want = min(1.0, max(0.0, _grid_rhs(w, c, e, xi, cover)))
            # above it by at most the sums' growth (relative) and the signed sum's allowance (Ξ + 2^-21)·V⁺ on M₋ and M⁺
            signed = 2 * (xi + 2.0**-21) * gs[X.NG + 1] * (1 + xi + 2.0**-21) * math.exp(2 * xi)
            if not (got >= want - _FORMULA_FP64 and got <= want * (1 + 3 * xi + _REL_ABOVE) + signed + 1e-12):
                ok_twin, d_twin = False, f"row {r}, Ξ {xi}: twin {got:.17g} against {want:.17g}"
        sup, _ = _corner_sup(w, c, e)
        got0 = float(X.grid_form_torch(torch.tensor(a_hat), torch.from_numpy(gs), torch.tensor(0.0)))
        if got0 < sup - 1e-12:
            ok_sup, d_sup = False, f"row {r}: twin {got0:.6g} below the supremum {sup:.6g}"
    return [(names[0], ok_twin, d_twin), (names[1], ok_cover, d_cover), (names[2], ok_sup, d_sup)]
