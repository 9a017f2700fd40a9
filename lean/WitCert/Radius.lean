import Mathlib

/-!
# Tier A logit radius (SPEC §2)

`ε = |σ| Σ_g ‖q[g]‖ W_g ≥ |δ|` with `δ = σ ⟨q, r⟩`, for any partition of the coordinates into
groups and any witnesses `W_g ≥ ‖r[g]‖` (Cauchy–Schwarz on each group).

* `abs_logit_error_le_radius` — SPEC §9; `witcert.bounds.logit_radius`,
  `witcert/cache.py` (`WitCertCache._radii`), and the kernel's key-side level
  `σ‖q_h‖·‖W_j‖₂` in `kernels/decode.py` (the case of one group, an upper bound for G > 1).
-/

namespace WitCert

open Finset

/-- Euclidean norm of `x` restricted to the coordinates in `g`. -/
noncomputable def gnorm {d : Type*} (g : Finset d) (x : d → ℝ) : ℝ :=
  Real.sqrt (∑ i ∈ g, x i ^ 2)

theorem abs_sum_mul_le_gnorm_mul {d : Type*} (g : Finset d) (q r : d → ℝ) :
    |∑ i ∈ g, q i * r i| ≤ gnorm g q * gnorm g r := by
  rw [abs_le]
  constructor
  · have h := Real.sum_mul_le_sqrt_mul_sqrt g (fun i => -q i) r
    simp only [neg_mul, Finset.sum_neg_distrib, neg_sq] at h
    unfold gnorm
    linarith
  · exact Real.sum_mul_le_sqrt_mul_sqrt g q r

/-- SPEC §2: group Cauchy–Schwarz with witnesses. -/
theorem abs_logit_error_le_radius {d κ : Type*} [Fintype d] [DecidableEq d]
    (G : Finset κ) (grp : κ → Finset d)
    (hdisj : (G : Set κ).PairwiseDisjoint grp) (hcover : G.biUnion grp = Finset.univ)
    (q r : d → ℝ) (W : κ → ℝ) (hW : ∀ g ∈ G, gnorm (grp g) r ≤ W g)
    (sigma delta eps : ℝ) (hdelta : delta = sigma * ∑ i, q i * r i)
    (heps : eps = |sigma| * ∑ g ∈ G, gnorm (grp g) q * W g) :
    |delta| ≤ eps := by
  subst hdelta heps
  rw [abs_mul]
  refine mul_le_mul_of_nonneg_left ?_ (abs_nonneg sigma)
  rw [← hcover, Finset.sum_biUnion hdisj]
  refine (Finset.abs_sum_le_sum_abs _ _).trans (Finset.sum_le_sum fun g hg => ?_)
  refine (abs_sum_mul_le_gnorm_mul (grp g) q r).trans ?_
  exact mul_le_mul_of_nonneg_left (hW g hg) (Real.sqrt_nonneg _)

end WitCert
