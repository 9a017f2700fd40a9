"""The proofs bridge passes on the tree and fails on each kind of drift: a Python constant, a
kernel constant, a Python formula, a kernel formula, a Lean statement, a Lean definition, an
unreadable Lean statement, a `sorry`, and a false statement (falsification)."""

import math
import random

import mpmath as mp

from proofs_bridge import check as C
from proofs_bridge import falsify as Fz
from tests.helpers.bridge import assert_each_edit_fails, failed
from tests.helpers.bridge import edit as _edit
from tests.helpers.bridge import failed_lean as _failed_lean
from tests.helpers.bridge import lean_copy as _lean_copy


def test_bridge_passes():
    assert failed(C.check_constants()) == []
    assert failed(C.check_formulas()) == []
    assert failed(C.check_fp_model()) == []
    assert failed(C.check_falsification(trials=300)) == []
    assert failed(C.check_lean()) == []


def test_drift_in_the_fp_rounding_terms_fails(monkeypatch):
    """SPEC §7: dropping or shrinking a rounding term fails the bridge."""
    from kernels import fp_bounds as P
    from witcert import bounds as B

    real = B.dot_rounding_radius
    monkeypatch.setattr(B, "dot_rounding_radius", lambda q, k, s, u=2.0**-53: real(q, k, s, u) * 0.5)
    assert "dot_rounding_radius = σ γ_{d+2} Σ|q||k̂|" in failed(C.check_fp_model())
    monkeypatch.setattr(B, "dot_rounding_radius", real)
    monkeypatch.setattr(P, "dot_gamma", lambda D, split3=False: D * P.KERNEL_UNIT)
    assert "kernel dot_gamma(D) ≥ γ_{D+2}(KERNEL_UNIT)" in failed(C.check_fp_model())
    monkeypatch.setattr(P, "KERNEL_WITNESS_FLOOR", 0.0)
    assert "kernel witness floor in (0, 2^-24)" in failed(C.check_fp_model())


def test_drift_in_the_python_constant_fails(monkeypatch):
    from witcert import schemes as S

    monkeypatch.setattr(S, "INT8_DITHER_DIVISOR", 126.0)
    assert "int8_dither divisor = 126.5" in failed(C.check_constants())


def test_drift_in_the_scheme_table_fails(monkeypatch):
    import dataclasses

    import triton.language as tl

    from contract import schemes as T
    from kernels import ids as I

    row = T.SCHEMES["int8_dither"]
    monkeypatch.setitem(T.SCHEMES, "int8_dither", dataclasses.replace(row, divisor=127.0))
    assert "scheme table: int8_dither divisor = 126.5" in failed(C.check_constants())
    monkeypatch.setitem(T.SCHEMES, "int8_dither", row)
    assert failed(C.check_constants()) == []
    monkeypatch.setattr(I, "INT4_GROUP_ID", tl.constexpr(5))
    assert "kernel constexpr scheme ids = the scheme table" in failed(C.check_constants())


def test_drift_in_an_asymmetric_divisor_fails(monkeypatch):
    import triton.language as tl

    from kernels import ids as I
    from witcert import schemes as S

    what = "asymmetric divisors = 2^bits − 1 (int4_group 15, kivi2 3) in the table, reference, kernels"
    assert what not in failed(C.check_constants())
    monkeypatch.setattr(I, "KIVI2_DIVISOR", tl.constexpr(4.0))
    assert what in failed(C.check_constants())
    monkeypatch.setattr(I, "KIVI2_DIVISOR", tl.constexpr(3.0))
    monkeypatch.setattr(S, "INT4_DIVISOR", 16.0)
    assert what in failed(C.check_constants())


def test_drift_in_the_kernel_constant_fails(monkeypatch):
    from kernels import write as W

    monkeypatch.setattr(W, "KERNEL_DITHER_DIVISOR", 127.0)
    assert "kernel dither divisor restates 126.5" in failed(C.check_constants())


def test_drift_in_a_python_formula_fails(monkeypatch):
    from witcert import bounds as B

    real = B.dither_radius
    monkeypatch.setattr(B, "dither_radius", lambda V, n, d, bias=None: real(V, n, d, bias) / math.sqrt(2))
    assert "dither_radius = sqrt(2V ln(2n/δ))" in failed(C.check_formulas())
    monkeypatch.setattr(B, "dither_radius", real)
    real_budget = B.step_budget
    monkeypatch.setattr(B, "step_budget", lambda *a, **k: real_budget(*a, **k) * (1.01 if "step" in k else 1.0))
    assert "step_budget = both schedules" in failed(C.check_formulas())


def test_drift_in_a_kernel_formula_fails(monkeypatch):
    import kernels.decode as Dk

    real = Dk.tier_b_coefficients
    monkeypatch.setattr(Dk, "tier_b_coefficients", lambda *a: real(*a) * 0.9)
    assert "kernel Tier B coefficient = formula + bias" in failed(C.check_formulas())


def test_drift_in_the_fused_merge_kernel_fails(monkeypatch):
    import kernels.epilogue as Ek

    name = "kernel record Tier B coefficient (fused merge) = formula + bias"
    assert name not in failed(C.check_formulas())
    monkeypatch.setattr(Ek, "DITHER_BIAS_FACTOR", Ek.DITHER_BIAS_FACTOR * 1000)  # a kernel constant that drifts
    assert name in failed(C.check_formulas())


def test_a_false_statement_is_falsified():
    # tanh(osc/8) in place of tanh(osc/4): false, and the search must find it
    bad = Fz.tilt_tv_le_tanh(random.Random(3), 500, tanh=lambda osc: mp.tanh(osc / 8))
    assert len(bad) > 0


def test_lean_scan(tmp_path):
    lean = tmp_path / "lean"
    (lean / "WitCert").mkdir(parents=True)
    (lean / "WitCert" / "A.lean").write_text("theorem tv_eq_max_gain : True := by\n  sorry\n")
    res = {name: ok for name, ok, _ in C.check_lean(lean)}
    assert res["no sorry/admit/axiom/native_decide under lean/"] is False
    assert res["every §9 theorem name is stated"] is False
    body = "\n".join(f"theorem {t} : True := trivial  -- no sorry here" for t in C.F.THEOREMS)
    (lean / "WitCert" / "A.lean").write_text(body)
    res = {name: ok for name, ok, _ in C.check_lean(lean)}
    assert res["no sorry/admit/axiom/native_decide under lean/"] and res["every §9 theorem name is stated"]
    # statements that say nothing (True) do not match the formulas
    assert res["lean statement tilt_tv_le_tanh = formula"] is False


def test_the_real_lean_statements_match(tmp_path):
    assert _failed_lean(_lean_copy(tmp_path)) == []


def test_drift_in_a_lean_statement_fails(tmp_path):
    lean = _lean_copy(tmp_path)
    _edit(lean, "TiltTV", "tv p phat ≤ Real.tanh (eps_max / 2)", "tv p phat ≤ Real.tanh (eps_max / 3)")
    assert _failed_lean(lean) == ["lean statement tilt_tv_le_tanh = formula"]
    lean = _lean_copy(tmp_path / "b")
    _edit(lean, "TiltTV", "(hA : A = ∑ j, phat j * Real.exp (eps j))", "(hA : A = ∑ j, phat j * Real.exp (2 * eps j))")
    assert _failed_lean(lean) == ["lean statement tilt_tv_le_eform = formula"]


def test_drift_in_a_lean_definition_fails(tmp_path):
    lean = _lean_copy(tmp_path)
    _edit(lean, "Budget", "delta_req * 6 / (Real.pi ^ 2 * step ^ 2) / (L * H)", "delta_req * 6 / (Real.pi ^ 2 * step) / (L * H)")
    assert _failed_lean(lean) == ["lean def budgetAnytime = formula"]


def test_an_unreadable_lean_statement_fails(tmp_path):
    lean = _lean_copy(tmp_path)
    _edit(lean, "Output", "‖o_hat - o‖ ≤ tv_up * (D_v + phi_max) + pphi", "‖o_hat - o‖ ≤ ⨆ i, tv_up")
    res = {name: (ok, d) for name, ok, d in C.check_lean(lean)}
    ok, detail = res["lean statement output_error_le = formula"]
    assert not ok and "cannot parse" in detail


def test_a_sorry_in_the_real_sources_fails(tmp_path):
    lean = _lean_copy(tmp_path)
    _edit(lean, "SplitMerge", "    intro m j\n", "    sorry\n")
    assert _failed_lean(lean) == ["no sorry/admit/axiom/native_decide under lean/"]


def test_drift_in_a_declared_formula_fails(monkeypatch):
    import sympy as sp

    from proofs_bridge import formulas as F

    file, concl, hyps = F.LEAN_THEOREMS["tilt_tv_le_eform"]
    monkeypatch.setitem(F.LEAN_THEOREMS, "tilt_tv_le_eform", (file, [("≤", concl[0][1], (F.A**2 - 1) / 3)], hyps))
    monkeypatch.setitem(F.LEAN_DEFS, "beta", ("TiltTV", ["t", "x"], (1 - F.t) * sp.exp(F.x) + F.t * sp.exp(-2 * F.x)))
    res = {n: ok for n, ok, _ in C.check_lean()}
    assert [n for n, ok in res.items() if ok is False] == ["lean statement tilt_tv_le_eform = formula", "lean def beta = formula"]


def test_an_unchecked_step_reads_skip_never_ok(monkeypatch, capsys):
    # no Lean toolchain: `lake build` is SKIP (None), never ok, and the last line counts it
    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    res = {n: ok for n, ok, _ in C.check_lean()}
    assert res["lake build"] is C.SKIP and C.status(res["lake build"]) == "SKIP"
    monkeypatch.setattr(C, "run_checks", lambda trials: [("a", True, ""), ("b", C.SKIP, "not run"), ("c", C.SKIP, "")])
    assert C.main(["check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("SKIP b") and not any(l.startswith("ok   b") for l in lines)
    assert lines[-1] == "0 failed, 2 skipped (not checked here), 1 ok"
    monkeypatch.setattr(C, "run_checks", lambda trials: [("a", False, ""), ("b", C.SKIP, "")])
    assert C.main(["check"]) == 1


def test_drift_in_a_chain_statement_fails(tmp_path):
    # issue 14: each new link of the chain is parsed and compared with its formula
    cases = [
        ("SubGaussian", "HasSubgaussianMGF r (Real.toNNReal (s ^ 2 / 12)) μ",
         "HasSubgaussianMGF r (Real.toNNReal (s ^ 2 / 4)) μ", "lean statement uniform_hasSubgaussianMGF = formula"),
        ("SubGaussian", "(hb : b = |sigma| * ∑ i, |q i| * beta i)", "(hb : b = sigma * ∑ i, |q i| * beta i)",
         "lean statement dither_logit_tail_bias = formula"),
        ("Union", "(htt : ∀ j, tt j = ditherRadius (V j) (Fintype.card κ) delta + b j)",
         "(htt : ∀ j, tt j = ditherRadius (V j) (Fintype.card κ) delta)", "lean statement dither_step_union = formula"),
        ("Union", "budgetAnytime delta_req L H ((t : ℝ) + 1))", "budgetAnytime delta_req L H (t : ℝ))",
         "lean statement request_union_sound = formula"),
        ("TiltTV", "tv p phat ≤ Real.tanh (osc / 4)", "tv p phat ≤ Real.tanh (osc / 2)",
         "lean statement tilt_tv_le_tanh_osc = formula"),
        ("Bands", "def ilvSnd (b : ℕ) : ℕ := 2 * b + 1", "def ilvSnd (b : ℕ) : ℕ := 2 * b + 2", "lean def ilvSnd = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_every_chain_name_is_falsified_and_stated():
    from proofs_bridge import formulas as F

    for name in F.CHAIN_THEOREMS:
        assert name in F.THEOREMS and name in F.LEAN_THEOREMS and name in Fz.STATEMENTS


def test_a_false_chain_statement_is_falsified():
    # Hoeffding's proxy s²/4 is sound but s²/12 must not be loosened to s²/13: at small λ it fails
    bad = []
    for _ in range(50):
        lam, s = mp.mpf(10) ** -3, mp.mpf(1)
        x = lam * s / 2
        bad += [1] if mp.sinh(x) / x > mp.e ** (lam**2 * (s**2 / 13) / 2) else []
    assert bad
    # the Lean RoPE formulas match the code; a wrong pairing (interleaved read as half) does not
    import numpy as np

    from proofs_bridge.falsify import tier_a
    from witcert import bounds as B

    x = [0.3, -1.2, 0.7, 2.0]
    y = tier_a._rope_ilv_lean(2, [mp.mpf(1.0), mp.mpf(0.01)], [mp.mpf(a) for a in x])
    ref = B.rope(np.array([x]), np.array([1]), theta=10000.0, layout="half", rotary_dim=4)[0]
    assert max(abs(float(a) - b) for a, b in zip(y, ref)) > 1e-3


def test_drift_in_the_bias_formula_fails(monkeypatch):
    from witcert import bounds as B

    real = B.dither_bias_bound
    monkeypatch.setattr(B, "dither_bias_bound", lambda *a: real(*a) * 0.5)
    assert "dither_bias_bound = |σ| Σ |q| s 2⁻¹⁴" in failed(C.check_formulas())


def test_every_fp_name_is_falsified_and_stated():
    # SPEC §7 (lean/WitCert/FloatTV.lean): each theorem is named, parsed and falsified
    from proofs_bridge import formulas as F

    for name in F.FP_THEOREMS:
        assert name in F.THEOREMS and name in F.LEAN_THEOREMS and name in Fz.STATEMENTS
    assert "restrictNorm" in F.LEAN_DEFS


def test_drift_in_an_fp_statement_fails(tmp_path):
    cases = [
        ("FloatTV", "tv p phat ≤ F + Real.tanh (Xi / 2)", "tv p phat ≤ F + Real.tanh (Xi / 4)",
         "lean statement tv_le_perturbed_base = formula"),
        ("FloatTV", "(hd : ∀ j, d j = delta j - xi j)", "(hd : ∀ j, d j = delta j + xi j)",
         "lean statement tilt_rebase = formula"),
        ("FloatTV", "IsTilt ptilde d p ∧ ∀ j, |d j| ≤ eps j + Xi", "IsTilt ptilde d p ∧ ∀ j, |d j| ≤ eps j",
         "lean statement tilt_rebase = formula"),
        ("FloatTV", "+ ∑ j ∈ U, p j + ∑ j ∈ U, phat j :=\n  tv_le_restrict_add_lost_of_nonneg",
         "+ ∑ j ∈ U, p j :=\n  tv_le_restrict_add_lost_of_nonneg", "lean statement tv_le_restrict_add_lost = formula"),
        ("FloatTV", "∑ j ∈ U, p j ≤ (∑ j ∈ U, phat j * Real.exp (eps j)) / ∑ j, phat j * Real.exp (-eps j) :=",
         "∑ j ∈ U, p j ≤ (∑ j ∈ U, phat j * Real.exp (eps j)) / ∑ j, phat j * Real.exp (eps j) :=",
         "lean statement tilt_mass_lost_le = formula"),
        ("FloatTV", "(j : V) : ℝ := q j / ∑ i ∈ V, q i", "(j : V) : ℝ := q j / ∑ i, q i", "lean def restrictNorm = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_a_false_fp_statement_is_falsified():
    # tanh(Ξ/4) for the Ξ term, and the lost term p(U) alone (or max(p(U), p̂(U))/2): false
    assert Fz.tv_le_perturbed_base(random.Random(1), 300, xi_term=lambda X: mp.tanh(X / 4))
    assert Fz.tv_le_restrict_add_lost(random.Random(1), 300, lost=lambda pU, qU: pU)
    assert Fz.tv_le_restrict_add_lost(random.Random(1), 300, lost=lambda pU, qU: max(pU, qU) / 2)


def test_drift_in_the_kernel_fp_terms_fails(monkeypatch):
    import kernels.epilogue_torch as E

    real = E.tv_from_hist_torch

    def half_rho(*a):
        tv, tanh, eform, tilt, rho = real(*a)
        return tv, tanh, eform, tilt, rho * 0.5

    monkeypatch.setattr(E, "tv_from_hist_torch", half_rho)
    assert "kernel ρ = Λ(1 + e^{ε_max+Ξ}/m)" in failed(C.check_formulas())

    def no_xi(mass, lv, rmax, xi=None, lam=None):
        return real(mass, lv, rmax, None, lam)

    monkeypatch.setattr(E, "tv_from_hist_torch", no_xi)
    bad = failed(C.check_formulas())
    assert "kernel tanh column = tanh((ε_max+Ξ)/2)" in bad and "kernel ρ = Λ(1 + e^{ε_max+Ξ}/m)" in bad


def test_every_endpoint_and_composed_name_is_falsified_and_stated():
    # SPEC §3(c) with endpoints (TiltEndpoints.lean) and issue 37 (b), (c) (Request.lean, FloatTV.lean)
    from proofs_bridge import formulas as F

    for name in F.ENDPOINT_THEOREMS + F.COMPOSED_THEOREMS + F.PARTIAL_ROTARY_THEOREMS:
        assert name in F.THEOREMS and name in F.LEAN_THEOREMS and name in Fz.STATEMENTS
    assert "dualD_regroup" in Fz.STATEMENTS  # issue 37 (e): falsified, not parsed


def test_drift_in_the_endpoint_statement_fails(tmp_path):
    cases = [
        ("TiltEndpoints", "(hBhi : ∀ i, hi i - dualD phat eps (hi i) (lam i) ≤ B)",
         "(hBhi : ∀ i, hi i - dualD phat eps (lo i) (lam i) ≤ B)", "lean statement tilt_tv_le_dual_grid_endpoints = formula"),
        ("TiltEndpoints", "(hlam : ∀ i, 0 ≤ lam i)", "(hlam : ∀ i, -1 ≤ lam i)",
         "lean statement tilt_tv_le_dual_grid_endpoints = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_drift_in_the_endpoint_tilt_fails(monkeypatch):
    """The epilogue's interval upper value (torch twin of `_dense_u`), the fp64 reference's and the kernel's
    tilt are checked against t − D(t, λ) at both ends of every interval: a drift in any of them fails."""
    import numpy as np

    import kernels.epilogue as E
    import kernels.epilogue_torch as Et
    from witcert.bounds import dual_grid as G

    def bad():
        return failed(C.check_tilt_endpoints(np.random.default_rng(0)))

    assert bad() == []
    real_u = Et._interval_upper
    # the left end only (the interval [t0, t0]): not an upper value of the interval
    monkeypatch.setattr(Et, "_interval_upper", lambda t0, h, w, a, b, m: real_u(t0, 0.0, w, a, b, m))
    assert bad() == ["torch _interval_upper = min_λ max(g(t0), g(t1)) (formula)"]
    monkeypatch.setattr(Et, "_interval_upper", real_u)
    # the reference's right-end D too large (its upper values too small)
    real_d = G._dual_at
    monkeypatch.setattr(G, "_dual_at", lambda ts, lam, *a: real_d(ts, lam, *a) + 1e-3)
    assert bad() == ["reference tilt (fixed grid) = max_i max(g(t_i), g(t_i+1)), g = t − D(t, λ_i)"]
    monkeypatch.setattr(G, "_dual_at", real_d)
    # a negative λ (the theorem needs λ_i ≥ 0)
    real_l = G._lambda_at
    monkeypatch.setattr(G, "_lambda_at", lambda *a: -real_l(*a))
    assert "reference tilt: every λ_i ≥ 0" in bad()
    monkeypatch.setattr(G, "_lambda_at", real_l)
    # the kernel's rounding term with the wrong sign (its g below t − D(t, λ))
    import os

    if os.environ.get("TRITON_INTERPRET") == "1" or __import__("torch").cuda.is_available():
        monkeypatch.setattr(E, "_epsc", lambda nbp: -1e-6)
        assert bad() == ["kernel tilt (_dense_u) = max over its grid of min_λ max(g(t0), g(t1)) (formula)"]


def test_a_false_endpoint_statement_is_falsified():
    # one end only (the left, or the right) is not a bound on the interval
    assert Fz.tilt_tv_le_dual_grid_endpoints(random.Random(3), 300, ends=lambda g0, g1: g0)
    assert Fz.tilt_tv_le_dual_grid_endpoints(random.Random(3), 300, ends=lambda g0, g1: g1)


def test_drift_in_a_composed_statement_fails(tmp_path):
    cases = [
        ("FloatTV", "(rho : ℝ) (hrho : rho = Lam * (1 + Real.exp (eps_max + Xi) / m)) :\n    tv p phat ≤ F +",
         "(rho : ℝ) (hrho : rho = Lam * (1 + Real.exp eps_max / m)) :\n    tv p phat ≤ F +",
         "lean statement kernel_tv_sound = formula"),
        ("FloatTV", "(hm : m ≤ (∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi))) / ∑ j ∈ Uᶜ, ptilde j)\n    (F : ℝ)",
         "(hm : m ≤ (∑ j ∈ Uᶜ, ptilde j * Real.exp (-lev j)) / ∑ j ∈ Uᶜ, ptilde j)\n    (F : ℝ)",
         "lean statement kernel_tv_sound = formula"),
        ("Request", "μ.real {ω | TVup ω < tv (p ω) (phat ω)} ≤ delta := by",
         "μ.real {ω | TVup ω ≤ tv (p ω) (phat ω)} ≤ delta := by", "lean statement step_tv_sound = formula"),
        ("Request", "(hbudget : ∑ t ∈ Finset.range T, (L : ℝ) * H * ds t ≤ delta_req)",
         "(hbudget : ∑ t ∈ Finset.range T, (L : ℝ) * ds t ≤ delta_req)", "lean statement request_tv_sound = formula"),
        ("Request", "= ditherRadius (V l h t j) (Fintype.card κ) (budgetFixed delta_req L H T_max) + b l h t j)",
         "= ditherRadius (V l h t j) (Fintype.card κ) delta_req + b l h t j)",
         "lean statement request_tv_sound_fixed = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_a_false_composed_statement_is_falsified():
    # the kernel's TV⁺ without its ρ (the lost masses ignored), or ρ = Λ alone: false
    assert Fz.kernel_tv_sound(random.Random(3), 300, rho=lambda Lam, r, m: 0)
    assert Fz.kernel_tv_sound(random.Random(3), 300, rho=lambda Lam, r, m: Lam)


def test_drift_in_the_sketch_radius_fails(monkeypatch):
    """Issue 33's radius (Sketch.lean): a reference that drops u_j, or takes ‖q‖ for ‖a⊙q‖, fails the bridge
    (``check_formulas`` runs ``_check_sketch_radius``; called alone here: the full check runs kernels)."""
    import inspect

    import numpy as np

    from witcert import bounds as B

    assert "_check_sketch_radius(B, rng, points)" in inspect.getsource(C.check_formulas)

    def ok():
        return C._check_sketch_radius(B, np.random.default_rng(0), 200)[1]

    assert ok()
    real = B.sketch_radius
    monkeypatch.setattr(B, "sketch_radius", lambda q, rt, w, s, a=None, shared=True: real(q, None, w, s, a, shared))
    assert not ok()
    monkeypatch.setattr(B, "sketch_radius", lambda q, rt, w, s, a=None, shared=True: real(q, rt, w, s, None, shared))
    assert not ok()



def test_drift_in_a_partial_rotary_statement_fails(tmp_path):
    # issue 37 (f): the passthrough coordinates must lie past the rotary dimension 2h
    cases = [
        ("Bands", "(hg : ∀ b ∈ g, b < h) (P : Finset ℕ) (hP : ∀ i ∈ P, 2 * h ≤ i) (x : ℕ → ℝ) :\n    coordNorm (coordsOf halfFst",
         "(hg : ∀ b ∈ g, b < h) (P : Finset ℕ) (hP : ∀ i ∈ P, h ≤ i) (x : ℕ → ℝ) :\n    coordNorm (coordsOf halfFst",
         "lean statement rope_half_partial_group_norm_invariant = formula"),
        ("Bands", "coordNorm (coordsOf ilvFst ilvSnd g ∪ P) (ropeInterleaved h θ x)",
         "coordNorm (coordsOf ilvFst ilvSnd g) (ropeInterleaved h θ x)",
         "lean statement rope_interleaved_partial_group_norm_invariant = formula"),
    ]
    assert_each_edit_fails(tmp_path, cases)


def test_falsify_exports_only_names_it_has():
    """``proofs_bridge.falsify.__all__`` names real attributes (theorems sharing a search are STATEMENTS
    keys, not attributes: ``from proofs_bridge.falsify import *`` failed when it listed them)."""
    import proofs_bridge.falsify as falsify

    assert [n for n in falsify.__all__ if not hasattr(falsify, n)] == []
    assert {fn.__name__ for fn in falsify.STATEMENTS.values()} <= set(falsify.__all__)




# ------------------------------------------------- every `theorem` of lean/WitCert has a falsifier (all files)

def _strip_lean_comments(text):
    """``text`` without its comments: ``--`` to the end of the line, and ``/- … -/`` blocks (nested, doc
    comments ``/-- … -/`` and ``/-! … -/`` included), so that prose naming a theorem is not read as one."""
    out, depth, i = [], 0, 0
    while i < len(text):
        two = text[i:i + 2]
        if two == "/-":
            depth, i = depth + 1, i + 2
        elif two == "-/" and depth:
            depth, i = depth - 1, i + 2
        elif depth:
            out.append("\n" if text[i] == "\n" else " ")  # keep the line structure
            i += 1
        elif two == "--":
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_THEOREM = r"^[ \t]*(?:@\[[^\]]*\][ \t]*)?(?:(?:private|protected|nonrec|noncomputable)[ \t]+)*theorem[ \t]+([^\s:({\[]+)"


def _lean_theorems(lean_dir):
    """{theorem name: file} for every ``theorem`` declared in a Lean file under ``lean_dir`` (``lemma``s are
    exempt: they are the proofs' steps, not statements the bridge falsifies)."""
    import re

    out = {}
    for f in sorted(lean_dir.rglob("*.lean")):
        if any(part.startswith(".") for part in f.relative_to(lean_dir).parts):  # a build tree (.lake), never ours
            continue
        for name in re.findall(_THEOREM, _strip_lean_comments(f.read_text()), re.M):
            out[name] = str(f.relative_to(lean_dir))
    return out


def _without_falsifier(lean_dir):
    return sorted(t for t in _lean_theorems(lean_dir) if t not in Fz.STATEMENTS)


def test_every_lean_theorem_is_falsified():
    """Every ``theorem`` of every file of lean/WitCert has a STATEMENTS entry: a theorem added without a
    falsifier fails here."""
    found = _lean_theorems(C.ROOT / "lean")
    files = {f for f in found.values()}
    # the scan reads every file (13 with theorems) and finds the helpers as well as the §9 statements
    assert len(files) >= 13 and len(found) >= 60, (files, len(found))
    assert {"abs_sum_mul_le_gnorm_mul", "ropeBand_sq", "tv_le_restrict_add_lost_of_nonneg",
            "tv_le_tv_perturbed_add_tanh", "tilt_tv_le_tanh", "request_tv_sound"} <= set(found)
    assert _without_falsifier(C.ROOT / "lean") == []


def test_a_new_theorem_without_a_falsifier_fails(tmp_path):
    """The completeness scan sees a new theorem in any file (modifiers and attributes included), and not a
    ``lemma`` or a theorem named only in a comment."""
    lean = _lean_copy(tmp_path)
    assert _without_falsifier(lean) == []
    new = ("\n-- theorem in_a_line_comment : True := trivial\n"
           "/-- A doc comment.\ntheorem in_a_doc_comment : True := trivial -/\n"
           "/- outer /- nested -/\ntheorem in_a_nested_comment : True := trivial -/\n"
           "lemma a_new_lemma : True := trivial\n"
           "theorem a_new_theorem (x : ℝ) : x = x := rfl\n"
           "@[simp] protected theorem WitCert.another_new_theorem : True := trivial\n")
    for file in ("Radius", "SplitMerge"):
        f = lean / "WitCert" / f"{file}.lean"
        f.write_text(f.read_text() + new.replace("new_theorem", f"new_theorem_{file}"))
    assert _without_falsifier(lean) == ["WitCert.another_new_theorem_Radius", "WitCert.another_new_theorem_SplitMerge",
                                        "a_new_theorem_Radius", "a_new_theorem_SplitMerge"]


def test_a_false_helper_statement_is_falsified():
    """The four helper theorems' searches find counterexamples to each claim made slightly stronger (and none to
    the claim itself): they draw the equality cases, not only slack instances."""
    from proofs_bridge.falsify import tier_a

    def n(fn, **kw):
        return len(fn(random.Random(1), 300, **kw))

    tiny = mp.mpf(10) ** -30
    # Radius.lean: |Σ_g q r| ≤ gnorm g q · gnorm g r; the right side shrunk by 1e-30, by 0.1 %, halved
    assert n(Fz.abs_sum_mul_le_gnorm_mul) == 0
    for f in (1 - tiny, mp.mpf("0.999"), mp.mpf("0.5")):
        assert n(Fz.abs_sum_mul_le_gnorm_mul, bound=lambda gq, gr: f * gq * gr) > 0
    # Bands.lean: ropeBand keeps x² + y²; the rotation scaled by 1 + 1e-30, or a sign error (not a rotation)
    assert n(Fz.ropeBand_sq) == 0
    assert n(Fz.ropeBand_sq, band=lambda th, x, y: [(1 + tiny) * z for z in tier_a._rope_band_lean(th, x, y)]) > 0
    assert n(Fz.ropeBand_sq, band=lambda th, x, y: (x * mp.cos(th) - y * mp.sin(th), x * mp.sin(th) - y * mp.cos(th))) > 0
    # FloatTV.lean: TV(p, p̂) ≤ TV(p|V, p̂|V) + p(U) + p̂(U); the right side at 0.99, or without p̂(U), or without p(U)
    assert n(Fz.tv_le_restrict_add_lost_of_nonneg) == 0
    for rhs in (lambda t, a, b: mp.mpf("0.99") * (t + a + b), lambda t, a, b: t + a, lambda t, a, b: t + b):
        assert n(Fz.tv_le_restrict_add_lost_of_nonneg, rhs=rhs) > 0
    # FloatTV.lean: TV(p, p̂) ≤ TV(p, p̃) + tanh(Ξ/2); the Ξ term shrunk by 1e-30, at 0.99, or tanh(Ξ/4)
    assert n(Fz.tv_le_tv_perturbed_add_tanh) == 0
    for term in (lambda X: (1 - tiny) * mp.tanh(X / 2), lambda X: mp.mpf("0.99") * mp.tanh(X / 2), lambda X: mp.tanh(X / 4)):
        assert n(Fz.tv_le_tv_perturbed_add_tanh, xi_term=term) > 0
