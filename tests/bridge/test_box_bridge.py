"""The proofs bridge on SPEC §3(c)'s centred box (lean/WitCert/TiltBox.lean, ``proofs_bridge.formulas_box``,
``proofs_bridge.check_tilt.check_tilt_box``): it passes on the tree and fails on each kind of drift (a Lean
statement or definition, the reference's box tilt, its closed forms, the histogram's boxes, a false statement)."""

import random

import mpmath as mp

from proofs_bridge import check as C
from proofs_bridge import falsify as Fz
from tests.helpers.bridge import assert_each_edit_fails, failed

# ------------------------------- SPEC §3(c), the centred box |δ_j − c_j| ≤ ε_j (lean/WitCert/TiltBox.lean)

def test_every_box_name_is_falsified_and_stated():
    """Each theorem of TiltBox.lean has a falsifier; the endpoint theorems are parsed and compared with their
    formulas, and so are the definitions betaBox, dualDBox."""
    import re

    from proofs_bridge import formulas as F

    for name in F.BOX_THEOREMS:
        assert name in F.THEOREMS and name in F.LEAN_THEOREMS and name in Fz.STATEMENTS
    assert "betaBox" in F.LEAN_DEFS and "dualDBox" in F.LEAN_DEFS
    stated = re.findall(r"^theorem\s+(\S+)", (C.ROOT / "lean" / "WitCert" / "TiltBox.lean").read_text(), re.M)
    assert set(F.BOX_THEOREMS) <= set(stated)
    assert [t for t in stated if t not in Fz.STATEMENTS] == []
    assert "tilt_tv_le_hist_endpoints" in Fz.STATEMENTS  # TiltEndpoints' histogram form: the centre-0 search
    assert "import WitCert.TiltBox" in (C.ROOT / "lean" / "WitCert.lean").read_text()


def test_drift_in_the_box_statement_fails(tmp_path):
    cases = [
        ("TiltBox", "(heps : ∀ j, |delta j - c j| ≤ eps j) {κ : Type*} (lo hi lam : κ → ℝ)",
         "(heps : ∀ j, |delta j + c j| ≤ eps j) {κ : Type*} (lo hi lam : κ → ℝ)",
         "lean statement tilt_tv_le_dual_grid_box_endpoints = formula"),
        ("TiltBox", "(hBhi : ∀ i, hi i - dualDBox phat c eps (hi i) (lam i) ≤ B)",
         "(hBhi : ∀ i, hi i - dualDBox phat c eps (lo i) (lam i) ≤ B)",
         "lean statement tilt_tv_le_dual_grid_box_endpoints = formula"),
        ("TiltBox", "(hbox : ∀ j, |delta j - C (bin j)| ≤ L (bin j))", "(hbox : ∀ j, |delta j| ≤ L (bin j))",
         "lean statement tilt_tv_le_hist_box_endpoints = formula"),
        ("TiltBox", "(hBlo : ∀ i, lo i - dualDBox w C L (lo i) (lam i) ≤ B)",
         "(hBlo : ∀ i, lo i - dualDBox w (fun _ => 0) L (lo i) (lam i) ≤ B)",
         "lean statement tilt_tv_le_hist_box_endpoints = formula"),
        ("TiltBox", "(1 - t) * Real.exp (-c + x) + t * Real.exp (-c - x)", "(1 - t) * Real.exp (c + x) + t * Real.exp (c - x)",
         "lean def betaBox = formula"),
        ("TiltBox", "lam * t * (∑ j, phat j * Real.exp (-c j - eps j)) - ∑ j,", "lam * t * (∑ j, phat j * Real.exp (-eps j)) - ∑ j,",
         "lean def dualDBox = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_drift_in_the_box_tilt_fails(monkeypatch):
    """The reference's box tilt must be the Lean formula (t − dualDBox at both ends of every interval) and never
    below the brute-force supremum: the symmetric |c| + ε form (sound, but not the formula), a dropped or flipped
    centre, a wrong right-end D, a negative λ, a logits bound that drops the centre, and histogram boxes that do not
    contain the tokens' boxes all fail."""
    import numpy as np

    from witcert import bounds as B
    from witcert.bounds import dual_grid as G

    formula = "reference box tilt (fixed grid) = max_i max(g(t_i), g(t_i+1)), g = t − dualDBox(t, λ_i)"
    sound = "reference box tilt and tv_bound_parts_logits(center=c) ≥ brute-force supremum"

    def bad():
        return failed(C.check_tilt_box(np.random.default_rng(0)))

    assert bad() == []
    real = G._tilt_row_box
    # the symmetric box [−(|c| + ε), |c| + ε] ⊇ the centred one: sound, but not the Lean formula of the centred box
    monkeypatch.setattr(G, "_tilt_row_box", lambda w, up, down, tol, m: G._tilt_row(w, np.maximum(abs(up), abs(down)), tol, m))
    assert bad() == [formula]
    # the centre dropped (radius (up − down)/2 around 0): not the formula, and below the supremum
    monkeypatch.setattr(G, "_tilt_row_box", lambda w, up, down, tol, m: G._tilt_row(w, (up - down) / 2, tol, m))
    assert bad() == [formula, sound]
    # the centre's sign flipped (η ∈ [−up, −down])
    monkeypatch.setattr(G, "_tilt_row_box", lambda w, up, down, tol, m: real(w, -down, -up, tol, m))
    assert formula in bad()
    monkeypatch.setattr(G, "_tilt_row_box", real)
    real_d = G._dual_at
    monkeypatch.setattr(G, "_dual_at", lambda ts, lam, *a: real_d(ts, lam, *a) + 1e-3)
    assert formula in bad()
    monkeypatch.setattr(G, "_dual_at", real_d)
    real_l = G._lambda_at
    monkeypatch.setattr(G, "_lambda_at", lambda *a: -real_l(*a))
    assert "reference box tilt: every λ_i ≥ 0" in bad()
    monkeypatch.setattr(G, "_lambda_at", real_l)
    closed = ("tv_bound_parts_logits(center=c): tanh = tanh(osc/4), osc = max(c+ε) − min(c−ε); e-form = ½(A²−1) at "
              "|c|+ε")
    real_parts = B.tv_bound_parts_logits
    monkeypatch.setattr(B, "tv_bound_parts_logits", lambda lg, r, center=None, **k: real_parts(lg, r, **k))
    assert bad() == [sound, closed]
    monkeypatch.setattr(B, "tv_bound_parts_logits", real_parts)
    # (a) of the centred box on a box twice as wide: sound, but not tanh(osc/4) of the box
    from witcert.bounds import tv_logits as TL

    real_ends = TL._box_ends
    monkeypatch.setattr(TL, "_box_ends", lambda c, e: real_ends(c, 2 * e))
    assert bad() == [closed]
    monkeypatch.setattr(TL, "_box_ends", real_ends)
    # the histogram's boxes: the centre rounded onto its grid without widening the radius
    real_box = B.box_levels
    monkeypatch.setattr(B, "box_levels", lambda c, e, lv, *a: (real_box(c, e, lv, *a)[0], B.round_levels(e, lv)))
    assert bad() == ["box_levels: [c̄ − L, c̄ + L] ⊇ [c − ε, c + ε] (hbox of tilt_tv_le_hist_box_endpoints)"]


def test_a_false_box_statement_is_falsified():
    # the centre dropped, or one end only, is not a bound; the symmetric box of radius |c| + ε (a superset) is
    assert Fz.tilt_tv_le_dual_grid_box_endpoints(random.Random(3), 300, bound_box=lambda c, e: ([0] * len(c), e))
    assert Fz.tilt_tv_le_dual_grid_box_endpoints(random.Random(3), 300, ends=lambda g0, g1: g0)
    assert not Fz.tilt_tv_le_dual_grid_box_endpoints(
        random.Random(3), 300, bound_box=lambda c, e: ([0] * len(c), [abs(a) + b for a, b in zip(c, e)]))
    # the sketch's centred box (Sketch.lean `sketch_centred_error_le`, TiltBox's heps) at 0.7 of its half-width: false
    assert Fz.sketch_centred_error_le(random.Random(1), 300, radius=lambda s, qa, W: 0.7 * s * qa * W)
    # dualDBox is not dualD once the centre is not 0 (dualDBox_zero is the centre-0 case only)
    p, e = [mp.mpf("0.3"), mp.mpf("0.7")], [mp.mpf("0.2"), mp.mpf("1.1")]
    assert abs(Fz.dual_D_box(p, [mp.mpf("0.5")] * 2, e, mp.mpf("0.4"), mp.mpf(2)) - Fz.dual_D(p, e, mp.mpf("0.4"), mp.mpf(2))) > 1e-3


def test_drift_in_the_grid_tilt_fails(monkeypatch):
    """The reference's grid tilt (``sketch_box="grid"``) must be the Lean formula on the contract's grid: a box
    shifted before the fixed multipliers see it (sound, not the formula), the cap dropped (the smallest interval
    taken instead of the largest: below the supremum), every end valued at t = 0, and a negative multiplier
    in the contract all fail."""
    import numpy as np

    import contract.constants as K
    from witcert.bounds import dual_grid as G

    formula = "reference grid tilt = max_i min(t_{i+1}, min_λ max(g_λ(t_i), g_λ(t_{i+1}))), g_λ = t − dualDBox(t, λ)"
    sound = "reference grid tilt and tv_bound_parts_logits(grid=True) ≥ brute-force supremum"

    def bad():
        return failed(C.check_tilt_grid(np.random.default_rng(0)))

    assert bad() == []
    real = G._tilt_row_grid
    monkeypatch.setattr(G, "_tilt_row_grid", lambda w, up, down, n, lams: real(w, up - up.max(), down - up.max(), n, lams))
    assert formula in bad()
    monkeypatch.setattr(G, "_tilt_row_grid", lambda w, up, down, pts, lams: real(w, up, down, (0.0, 1.0), ((1.0,),)) / 8)
    assert formula in bad() and sound in bad()
    real_d = G._dual_at
    monkeypatch.setattr(G, "_tilt_row_grid", real)
    monkeypatch.setattr(G, "_dual_at", lambda ts, lam, *a: real_d(np.zeros_like(ts), lam, *a))
    assert formula in bad()
    monkeypatch.setattr(G, "_dual_at", real_d)
    monkeypatch.setattr(K, "GRID_TILT_LAMBDAS", ((-1.0, 1.0), (1.0,), (1.0,)))
    assert "grid tilt: points 0 < … < 1, every λ finite and ≥ 0" in bad()
