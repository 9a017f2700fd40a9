"""The bridge's sympy declarations of SPEC §3(c)'s centred box (lean/WitCert/TiltBox.lean), added to
``proofs_bridge.formulas`` by its last line (``add_box(globals())``): the formulas (``BETA_BOX``, ``DUAL_ITEM_BOX``,
``BOX_UP`` / ``BOX_DOWN``, the symbol ``c_box``), the Lean definitions ``betaBox`` / ``dualDBox`` (``LEAN_DEFS``) and
the statements of the two box endpoint theorems (``LEAN_THEOREMS``, ``THEOREMS``). Read them as
``proofs_bridge.formulas.NAME``; this module is not imported on its own.

The logit errors lie in a box |δ_j − c_j| ≤ ε_j around a known centre c (the residual sketch's): p(S) ≤ A/(A + C)
with A = Σ_S p̂ e^{−c+ε}, C = Σ_{Sᶜ} p̂ e^{−c−ε}, and the dual of §3(c) has β_j(t) = (1 − t) e^{−c_j+ε_j}
+ t e^{−c_j−ε_j}, m = Σ p̂ e^{−c−ε}. The fp64 reference (``witcert.bounds.dual_grid._tilt_row_box``) takes per
token the log-weight interval η_j ∈ [down_j, up_j] (p ∝ p̂ e^{η}, η = −δ): up = −c + ε, down = −c − ε, its knapsack
items a = e^{up}, b = e^{down} (``proofs_bridge.check_tilt.check_tilt_box``).
"""

from __future__ import annotations

import sympy as sp


def add_box(ns: dict) -> None:
    """Add the centred box's declarations to the formulas namespace ``ns`` (its symbols, ``_f``, the tables)."""
    t, x, lam, _j, Sum, UNIV = ns["t"], ns["x"], ns["lam"], ns["_j"], ns["Sum"], ns["UNIV"]
    _f, phat, eps, c_, delta_f, tv = ns["_f"], ns["phat"], ns["eps"], ns["c_"], ns["delta_f"], ns["tv"]
    _P, _Ph, B_, _ends, LEAN_DEFS = ns["_P"], ns["_Ph"], ns["B_"], ns["_ends"], ns["LEAN_DEFS"]
    c_box = sp.Symbol("c", real=True)
    #: betaBox t c x
    BETA_BOX = (1 - t) * sp.exp(-c_box + x) + t * sp.exp(-c_box - x)
    #: D(t, λ) = Σ_k w_k DUAL_ITEM_BOX(c_k, x_k) (LEAN_DEFS["dualDBox"] term by term)
    DUAL_ITEM_BOX = lam * t * sp.exp(-c_box - x) - sp.Max(lam * BETA_BOX - 1, 0)
    #: the reference's log-weight ends of a box: up = −c + ε, down = −c − ε (c = −(up + down)/2, ε = (up − down)/2)
    BOX_UP, BOX_DOWN = -c_box + x, -c_box - x
    assert sp.simplify(BETA_BOX - ((1 - t) * sp.exp(BOX_UP) + t * sp.exp(BOX_DOWN))) == 0
    #: dualDBox_zero: centred at 0 the item is the symmetric one
    assert sp.simplify(DUAL_ITEM_BOX.subs(c_box, 0) - ns["DUAL_ITEM"]) == 0

    betaBox, dualDBox = _f("betaBox"), _f("dualDBox")
    LEAN_DEFS.update({
        "betaBox": ("TiltBox", ["t", "c", "x"], BETA_BOX),
        "dualDBox": ("TiltBox", ["phat", "c", "eps", "t", "lam"],
                     lam * t * Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.exp(-c_(_j) - eps(_j))))
                     - Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.Max(lam * betaBox(t, c_box, x) - 1, 0).xreplace(
                         {c_box: c_(_j), x: eps(_j)})))),
    })
    one_box = LEAN_DEFS["dualDBox"][2].replace(Sum, lambda dom, f: f(_j)).replace(
        betaBox, lambda tt, cc, xx: BETA_BOX.xreplace({t: tt, c_box: cc, x: xx})).xreplace(
        {phat(_j): 1, c_(_j): c_box, eps(_j): x})
    assert sp.simplify(one_box - DUAL_ITEM_BOX) == 0

    #: the excess form's items (lean/WitCert/Excess.lean): the one interval [0, 1] with λ = 1, Σ p̂ = 1, gives
    #: 0 − D(0, 1) = Σ p̂ EXCESS_UP and 1 − D(1, 1) = Σ p̂ EXCESS_DOWN (checked numerically: check_excess)
    EXCESS_UP = sp.Max(sp.exp(-c_box + x) - 1, 0)
    EXCESS_DOWN = sp.Max(1 - sp.exp(-c_box - x), 0)
    assert sp.simplify(DUAL_ITEM_BOX.subs({lam: 1, t: 0}) + EXCESS_UP) == 0
    BOX_THEOREMS = ["tilt_tv_le_dual_grid_box_endpoints", "tilt_tv_le_hist_box_endpoints"]
    ns["THEOREMS"].extend(BOX_THEOREMS)
    Cf, Lf, bin_ = _f("C"), _f("L"), _f("bin")

    def box_ends(w, cc, ee):
        """hlam, hBlo, hBhi of the box endpoint theorems, with D = dualDBox w cc ee."""
        return _ends(lambda tt, ll: dualDBox(w, cc, ee, tt, ll))

    ns["LEAN_THEOREMS"].update({
        "tilt_tv_le_dual_grid_box_endpoints": ("TiltBox", [("≤", tv(_P, _Ph), B_)], {
            "heps": [("∀", ("j",), [("≤", sp.Abs(delta_f(_j) - c_(_j)), eps(_j))])],
            **box_ends(_Ph, sp.Symbol("c"), sp.Symbol("eps")),
        }),
        "tilt_tv_le_hist_box_endpoints": ("TiltBox", [("≤", tv(_P, _Ph), B_)], {
            "hbox": [("∀", ("j",), [("≤", sp.Abs(delta_f(_j) - Cf(bin_(_j))), Lf(bin_(_j)))])],
            **box_ends(sp.Symbol("w"), sp.Symbol("C"), sp.Symbol("L")),
        }),
    })
    # the excess form (lean/WitCert/Excess.lean): max(A, B) over the box, and the kernel's box widened by Ξ
    def excess_sum(item, w):
        return Sum(UNIV, sp.Lambda(_j, w(_j) * item.xreplace({c_box: c_(_j), x: eps(_j)})))

    EXCESS_THEOREMS = ["tilt_tv_le_excess", "tilt_tv_le_excess_widened", "tilt_tv_le_excess_rescaled"]
    ns["THEOREMS"].extend(EXCESS_THEOREMS)
    # the (t, λ) grid over the kernel's masses (lean/WitCert/ExcessGrid.lean; named, not parsed: its right side is a
    # `gridBound` hypothesis; checked numerically, check_excess.check_excess_grid, and by its falsifiers)
    GRID_THEOREMS = ["tilt_tv_le_grid_rescaled", "tilt_tv_le_grid_rescaled_capped"]
    ns["THEOREMS"].extend(GRID_THEOREMS)
    # (tilt_tv_le_excess_widened and _rescaled are named, not parsed: sympy's Max refuses e^Ξ·Σ(…) as "not comparable";
    # the rescaled right side is checked numerically, check_excess._rescaled, and both by their falsifiers)
    ns["LEAN_THEOREMS"].update({
        "tilt_tv_le_excess": ("Excess", [("≤", tv(_P, _Ph), sp.Max(excess_sum(EXCESS_UP, phat),
                                                                    excess_sum(EXCESS_DOWN, phat)))], {
            "heps": [("∀", ("j",), [("≤", sp.Abs(delta_f(_j) - c_(_j)), eps(_j))])],
        }),
    })
    ns.update(c_box=c_box, BETA_BOX=BETA_BOX, DUAL_ITEM_BOX=DUAL_ITEM_BOX, BOX_UP=BOX_UP, BOX_DOWN=BOX_DOWN,
              BOX_THEOREMS=BOX_THEOREMS, EXCESS_THEOREMS=EXCESS_THEOREMS, GRID_THEOREMS=GRID_THEOREMS, betaBox=betaBox, dualDBox=dualDBox,
              EXCESS_UP=EXCESS_UP, EXCESS_DOWN=EXCESS_DOWN)
