"""The proofs bridge on the centred box's excess form (lean/WitCert/Excess.lean, ``proofs_bridge.check_excess``,
``proofs_bridge.falsify.excess``): it passes on the tree and fails on each kind of drift (the merge's twin, the fp64
reference's one-interval grid, a false statement), and every theorem of Excess.lean has a search and is stated."""

import random
import re

import numpy as np

from proofs_bridge import check as C
from proofs_bridge import falsify as Fz
from proofs_bridge.check_excess import check_excess_form
from tests.helpers.bridge import assert_each_edit_fails, failed

NAMES = ("tilt_tv_le_excess", "tilt_tv_le_excess_widened", "excess_widen_up", "excess_widen_down",
         "one_sub_add_max_sub_one", "tilt_tv_le_excess_rescaled", "le_exp_two_mul_of_log_ratio")


def test_every_excess_theorem_is_falsified_and_stated():
    from proofs_bridge import formulas as F

    text = (C.ROOT / "lean" / "WitCert" / "Excess.lean").read_text()
    stated = re.findall(r"^(?:theorem|lemma)\s+(\S+)", text, re.M)
    assert set(NAMES) <= set(stated)
    theorems = re.findall(r"^theorem\s+(\S+)", text, re.M)
    assert [t for t in theorems if t not in Fz.STATEMENTS] == []
    assert set(F.EXCESS_THEOREMS) == set(theorems) and set(theorems) <= set(F.THEOREMS)
    assert "tilt_tv_le_excess" in F.LEAN_THEOREMS  # parsed and compared with the formula
    assert "import WitCert.Excess" in (C.ROOT / "lean" / "WitCert.lean").read_text()
    for name in NAMES:
        assert Fz.STATEMENTS[name](random.Random(name), 200) == []


def test_a_false_excess_statement_is_falsified():
    """The smaller of the two sums (or either alone) is not a bound: the search finds counterexamples."""
    from proofs_bridge.falsify import excess as X

    assert X.tilt_tv_le_excess(random.Random(0), 400, form=lambda a, b: min(a, b))
    assert X.tilt_tv_le_excess(random.Random(1), 400, form=lambda a, b: a)
    # the sums over the kernel's p̃ without e^{2Ξ} (the mass error moved onto the tokens that count)
    assert X.tilt_tv_le_excess_rescaled(random.Random(3), 3000, factor=lambda xi: 1)


def test_drift_in_the_excess_form_fails(monkeypatch):
    """The merge's twin must be the rescaled theorem's right side (never below it): the smaller of the two sums, B
    without e^{2Ξ}, or e^{−2Ξ} on A fail; so does the fp64 reference's grid if it is not max(A, B) on one interval with
    λ = 1."""
    import torch

    import kernels.epilogue as E
    from witcert.bounds import dual_grid as G

    twin = "excess form: the merge's twin = e^{2Ξ} max(A, B) (tilt_tv_le_excess_rescaled), never below it"
    ref = "excess form: the fp64 reference's one-interval grid = max(A, B) (tilt_tv_le_excess)"

    def bad():
        return failed(check_excess_form(np.random.default_rng(0)))

    assert bad() == []
    real = E.excess_form_torch
    monkeypatch.setattr(E, "excess_form_torch", lambda a, b, xi: torch.minimum(real(a, 0 * b, xi), real(0 * a, b, xi)))
    assert twin in bad()
    monkeypatch.setattr(E, "excess_form_torch", lambda a, b, xi: torch.maximum(real(a, 0 * b, xi), b * (1 + 2.0**-21)))
    assert twin in bad()
    monkeypatch.setattr(E, "excess_form_torch", lambda a, b, xi: real(a * torch.exp(-2 * xi), b, xi))
    assert twin in bad()
    monkeypatch.setattr(E, "excess_form_torch", real)
    real_g = G._tilt_row_grid
    monkeypatch.setattr(G, "_tilt_row_grid", lambda w, up, down, pts, lams: real_g(w, up, down, pts, ((0.5,),)))
    assert ref in bad()


def test_drift_in_the_excess_statement_fails(tmp_path):
    """The parsed statement of ``tilt_tv_le_excess`` must be max(Σ p̂ EXCESS_UP, Σ p̂ EXCESS_DOWN) under the box."""
    cases = [
        ("Excess", "tv p phat ≤ max (∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0)",
         "tv p phat ≤ min (∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0)", "lean statement tilt_tv_le_excess = formula"),
        ("Excess", "(∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0) := by",
         "(∑ j, phat j * max (1 - Real.exp (-c j + eps j)) 0) := by", "lean statement tilt_tv_le_excess = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


GRID_NAMES = ("tilt_tv_le_grid_rescaled", "tilt_tv_le_grid_rescaled_capped", "sub_dualDBox_le_gridBound",
              "sub_dualDBox_eq_sum", "sum_mul_gridTerm", "sum_le_of_ratio", "abs_sub_le_of_ratio", "abs_gridTerm_le",
              "sub_dualDBox_zero")


def test_every_grid_theorem_is_falsified_and_stated():
    from proofs_bridge import formulas as F

    text = (C.ROOT / "lean" / "WitCert" / "ExcessGrid.lean").read_text()
    stated = re.findall(r"^(?:theorem|lemma)\s+(\S+)", text, re.M)
    assert set(GRID_NAMES) == set(stated)
    theorems = re.findall(r"^theorem\s+(\S+)", text, re.M)
    assert set(F.GRID_THEOREMS) == set(theorems) and set(theorems) <= set(F.THEOREMS)
    assert "import WitCert.ExcessGrid" in (C.ROOT / "lean" / "WitCert.lean").read_text()
    for name in GRID_NAMES:
        assert Fz.STATEMENTS[name](random.Random(name), 150) == []


def test_a_false_grid_statement_is_falsified():
    """Without the measure change's term the sums over p̃ do not bound TV(p, p̂): the search finds counterexamples."""
    from proofs_bridge.falsify import excess_grid as XG

    assert XG.tilt_tv_le_grid_rescaled_capped(random.Random(1), 400, e_term=False)


def test_drift_in_the_grid_form_fails(monkeypatch):
    """The merge's twin must be the capped cover of ``gridBound`` (never below it): the measure change's term dropped,
    the signed sum's allowance dropped on M₋, or a wrong multiplier in the contract (the merge's hard-coded cover no
    longer the contract's) fail."""
    import torch

    import kernels.excess_grid as X
    from proofs_bridge.check_excess import check_excess_grid

    twin = "excess grid: the merge's twin = the capped cover of gridBound (tilt_tv_le_grid_rescaled_capped), never below"
    cover = "excess grid: the merge's cover is the contract's"

    def bad():
        return failed(check_excess_grid(np.random.default_rng(0)))

    assert bad() == []
    monkeypatch.setattr(X, "expm1_up_torch", lambda y: torch.zeros_like(y))
    assert twin in bad()
    monkeypatch.undo()
    real = X.grid_form_torch
    monkeypatch.setattr(X, "grid_form_torch", lambda a, g, xi: real(a, g, xi) * 0.9)
    assert twin in bad()
    monkeypatch.undo()
    monkeypatch.setattr(X, "GRID_TILT_LAMBDAS", ((1.0, 0.5), (1.0,), (1.0, 1.005859375, 1.013671875)))
    assert cover in bad()
