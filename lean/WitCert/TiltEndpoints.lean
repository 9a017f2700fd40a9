import Mathlib
import WitCert.TiltTV

/-!
# The dual-grid tilt bound with endpoint values (SPEC §3(c), issue 33)

`tilt_tv_le_dual_grid` bounds an interval `[lo, hi]` of the grid by `hi − D(lo, λ)`: the width `hi − lo`
enters the bound (the kernel's coarse grid of 64 intervals carried `1/64` of slack). For a fixed `λ ≥ 0`,
`t ↦ D(t, λ)` is concave (`β_j` is affine in `t`, the hinge `(λ β_j(t) − 1)₊` convex), so
`t ↦ t − D(t, λ)` is convex and its maximum on `[lo, hi]` is at an end:

* `dualD_concave` — `(1 − θ) D(t₀, λ) + θ D(t₁, λ) ≤ D((1 − θ) t₀ + θ t₁, λ)` for `θ ∈ [0, 1]`;
* `tilt_tv_le_dual_grid_endpoints` — for any finite cover of `[0, 1]` by intervals `[lo i, hi i]` and any
  `λ_i ≥ 0`: `TV ≤ B` whenever `lo i − D(lo i, λ_i) ≤ B` and `hi i − D(hi i, λ_i) ≤ B` for every `i`.

Licenses `witcert.bounds._tilt_row` (its interval upper values) and the epilogue's `_dense_u`
(`kernels/epilogue.py`) with its torch twin `_interval_upper`.

* `sum_mul_regroup`, `dualD_regroup` — issue 37 (e), the histogram regrouping: with radii rounded up
  onto levels `L (bin j)`, `dualD` over the tokens equals `dualD` over the histogram
  `w k = Σ_{bin j = k} p̂_j` (and `Σ_j p̂_j f(L (bin j)) = Σ_k w_k f(L k)`, the e-form's `A`);
  `tilt_tv_le_hist_endpoints` — the endpoint bound on the histogram bounds TV (the kernel's form).
-/

namespace WitCert

open Finset

section Endpoints

variable {ι : Type*} [Fintype ι] [DecidableEq ι] {phat delta p : ι → ℝ}

/-- `β_j` is affine in `t`. -/
lemma beta_affine (t₀ t₁ θ x : ℝ) :
    beta ((1 - θ) * t₀ + θ * t₁) x = (1 - θ) * beta t₀ x + θ * beta t₁ x := by
  unfold beta
  ring

/-- The hinge of an affine combination is at most the combination of the hinges (`θ ∈ [0, 1]`). -/
lemma hinge_combo_le (u v θ : ℝ) (hθ0 : 0 ≤ θ) (hθ1 : θ ≤ 1) :
    max ((1 - θ) * u + θ * v) 0 ≤ (1 - θ) * max u 0 + θ * max v 0 := by
  have h1θ : 0 ≤ 1 - θ := sub_nonneg.mpr hθ1
  have hu : (1 - θ) * u ≤ (1 - θ) * max u 0 := mul_le_mul_of_nonneg_left (le_max_left u 0) h1θ
  have hv : θ * v ≤ θ * max v 0 := mul_le_mul_of_nonneg_left (le_max_left v 0) hθ0
  have hu0 : 0 ≤ (1 - θ) * max u 0 := mul_nonneg h1θ (le_max_right u 0)
  have hv0 : 0 ≤ θ * max v 0 := mul_nonneg hθ0 (le_max_right v 0)
  apply max_le
  · linarith
  · linarith

/-- `D(·, λ)` is concave in `t` along a segment. -/
lemma dualD_concave (phat eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (lam t₀ t₁ θ : ℝ)
    (hθ0 : 0 ≤ θ) (hθ1 : θ ≤ 1) :
    (1 - θ) * dualD phat eps t₀ lam + θ * dualD phat eps t₁ lam ≤
      dualD phat eps ((1 - θ) * t₀ + θ * t₁) lam := by
  unfold dualD
  set m := ∑ j, phat j * Real.exp (-eps j) with hm
  -- the hinge terms, term by term
  have hterm : ∀ j ∈ (Finset.univ : Finset ι),
      phat j * max (lam * beta ((1 - θ) * t₀ + θ * t₁) (eps j) - 1) 0 ≤
        (1 - θ) * (phat j * max (lam * beta t₀ (eps j) - 1) 0) +
          θ * (phat j * max (lam * beta t₁ (eps j) - 1) 0) := by
    intro j _
    have hcomb : lam * beta ((1 - θ) * t₀ + θ * t₁) (eps j) - 1 =
        (1 - θ) * (lam * beta t₀ (eps j) - 1) + θ * (lam * beta t₁ (eps j) - 1) := by
      rw [beta_affine]
      ring
    rw [hcomb]
    have h := mul_le_mul_of_nonneg_left
      (hinge_combo_le (lam * beta t₀ (eps j) - 1) (lam * beta t₁ (eps j) - 1) θ hθ0 hθ1) (hp j)
    have hexp : phat j * ((1 - θ) * max (lam * beta t₀ (eps j) - 1) 0 + θ * max (lam * beta t₁ (eps j) - 1) 0) =
        (1 - θ) * (phat j * max (lam * beta t₀ (eps j) - 1) 0) +
          θ * (phat j * max (lam * beta t₁ (eps j) - 1) 0) := by
      ring
    linarith
  have hsum := Finset.sum_le_sum hterm
  rw [Finset.sum_add_distrib, ← Finset.mul_sum, ← Finset.mul_sum] at hsum
  have hlin : lam * ((1 - θ) * t₀ + θ * t₁) * m =
      (1 - θ) * (lam * t₀ * m) + θ * (lam * t₁ * m) := by
    ring
  rw [hlin]
  linarith

/-- The convex function `t − D(t, λ)` is at most its larger end value on a segment. -/
lemma sub_dualD_le_ends (phat eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (lam lo hi t B : ℝ)
    (hlo : lo ≤ t) (hhi : t ≤ hi)
    (hBlo : lo - dualD phat eps lo lam ≤ B) (hBhi : hi - dualD phat eps hi lam ≤ B) :
    t - dualD phat eps t lam ≤ B := by
  rcases eq_or_lt_of_le (hlo.trans hhi) with heq | hlt
  · -- a degenerate interval: t = lo
    have htlo : t = lo := le_antisymm (by rw [heq]; exact hhi) hlo
    rw [htlo]
    exact hBlo
  · set θ := (t - lo) / (hi - lo) with hθ
    have hpos : 0 < hi - lo := sub_pos.mpr hlt
    have hθ0 : 0 ≤ θ := div_nonneg (sub_nonneg.mpr hlo) hpos.le
    have hθ1 : θ ≤ 1 := by
      rw [hθ, div_le_one hpos]
      linarith
    have ht : (1 - θ) * lo + θ * hi = t := by
      have hmul : θ * (hi - lo) = t - lo := by
        rw [hθ]
        exact div_mul_cancel₀ (t - lo) (ne_of_gt hpos)
      linarith
    have hc := dualD_concave phat eps hp lam lo hi θ hθ0 hθ1
    rw [ht] at hc
    have h1θ : 0 ≤ 1 - θ := sub_nonneg.mpr hθ1
    have e1 := mul_le_mul_of_nonneg_left hBlo h1θ
    have e2 := mul_le_mul_of_nonneg_left hBhi hθ0
    -- the end values' combination, expanded (ring), with the segment point folded back to t
    have hexpand : (1 - θ) * (lo - dualD phat eps lo lam) + θ * (hi - dualD phat eps hi lam) =
        ((1 - θ) * lo + θ * hi) - ((1 - θ) * dualD phat eps lo lam + θ * dualD phat eps hi lam) := by
      ring
    rw [ht] at hexpand
    have hB : (1 - θ) * B + θ * B = B := by ring
    linarith [hc, hexpand, e1, e2, hB]

/-- SPEC §3(c) with endpoint values: for any finite cover of `[0, 1]` by intervals and any
multipliers `λ_i ≥ 0`, `TV ≤ B` when both ends of every interval have `t − D(t, λ_i) ≤ B`. -/
theorem tilt_tv_le_dual_grid_endpoints (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) {κ : Type*} (lo hi lam : κ → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hBlo : ∀ i, lo i - dualD phat eps (lo i) (lam i) ≤ B)
    (hBhi : ∀ i, hi i - dualD phat eps (hi i) (lam i) ≤ B) :
    tv p phat ≤ B := by
  apply tv_le_of_gain_le p phat ht.sum_eq
  intro S
  have hp : ∀ j, 0 ≤ phat j := fun j => (ht.pos j).le
  have he := eps_nonneg eps heps
  set A := ∑ j ∈ S, phat j * Real.exp (eps j) with hAdef
  set C := ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j) with hCdef
  have hA0 : 0 ≤ A := Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have hC0 : 0 ≤ C := Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have hAC : 0 < A + C := by
    have hm : 0 < ∑ j, phat j * Real.exp (-eps j) := ht.sum_pos (fun i => -eps i)
    have hsplit : ∑ j ∈ S, phat j * Real.exp (-eps j) + C = ∑ j, phat j * Real.exp (-eps j) :=
      Finset.sum_add_sum_compl S _
    have hle : ∑ j ∈ S, phat j * Real.exp (-eps j) ≤ A :=
      Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left
        (Real.exp_le_exp.mpr (by linarith [he j])) (hp j)
    linarith
  set t := A / (A + C) with htdef
  have ht0 : 0 ≤ t := div_nonneg hA0 hAC.le
  have ht1 : t ≤ 1 := by rw [htdef, div_le_one hAC]; linarith
  obtain ⟨i, hlo, hhi⟩ := hcover t ht0 ht1
  have h1 : ∑ j ∈ S, p j ≤ t := tilt_mass_le ht eps heps S
  have h2 : dualD phat eps t (lam i) ≤ ∑ j ∈ S, phat j := mass_ge_dualD phat eps hp S (lam i) (hlam i) hAC
  have h3 : t - dualD phat eps t (lam i) ≤ B :=
    sub_dualD_le_ends phat eps hp (lam i) (lo i) (hi i) t B hlo hhi (hBlo i) (hBhi i)
  linarith

end Endpoints

section Regroup

/-! ### The histogram regrouping (issue 37 (e))

The kernel evaluates the §3(c) bound on a histogram: each token's radius rounded up onto a level
`L (bin j) ≥ ε_j`, the p̂ mass summed per level. `tilt_tv_le_dual_grid_endpoints` with the radii
`fun j => L (bin j)` (sound, `|δ_j| ≤ ε_j ≤ L (bin j)`) bounds TV through
`dualD phat (fun j => L (bin j))`, which is the histogram's `dualD` (`dualD_regroup`); the e-form's
`A` regroups the same way (`sum_mul_regroup` with `f = exp ∘ L`). -/

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- A sum over tokens, regrouped by bins: `Σ_j p̂_j f(bin j) = Σ_k (Σ_{bin j = k} p̂_j) f(k)`. -/
lemma sum_mul_regroup {κ : Type*} [Fintype κ] [DecidableEq κ] (phat : ι → ℝ) (bin : ι → κ)
    (f : κ → ℝ) :
    ∑ j, phat j * f (bin j) = ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * f k := by
  -- `Finset.sum_fiberwise`: additive form of `Finset.prod_fiberwise`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:273
  rw [← Finset.sum_fiberwise Finset.univ bin (fun j => phat j * f (bin j))]
  refine Finset.sum_congr rfl fun k _ => ?_
  rw [Finset.sum_mul]
  refine Finset.sum_congr rfl fun j hj => ?_
  rw [(Finset.mem_filter.mp hj).2]

/-- Issue 37 (e): the dual value of the radii rounded up onto the levels `L (bin j)` is the dual
value of the histogram (p̂ mass per level). -/
theorem dualD_regroup {κ : Type*} [Fintype κ] [DecidableEq κ] (phat : ι → ℝ) (bin : ι → κ)
    (L : κ → ℝ) (t lam : ℝ) :
    dualD phat (fun j => L (bin j)) t lam
      = dualD (fun k => ∑ j ∈ Finset.univ with bin j = k, phat j) L t lam := by
  have e1 : ∑ j, phat j * Real.exp (-L (bin j))
      = ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * Real.exp (-L k) :=
    sum_mul_regroup phat bin (fun k => Real.exp (-L k))
  have e2 : ∑ j, phat j * max (lam * beta t (L (bin j)) - 1) 0
      = ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * max (lam * beta t (L k) - 1) 0 :=
    sum_mul_regroup phat bin (fun k => max (lam * beta t (L k) - 1) 0)
  show lam * t * (∑ j, phat j * Real.exp (-L (bin j)))
        - ∑ j, phat j * max (lam * beta t (L (bin j)) - 1) 0
      = lam * t * (∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * Real.exp (-L k))
        - ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * max (lam * beta t (L k) - 1) 0
  rw [e1, e2]

/-- Issue 37 (e), composed: the endpoint bound evaluated on the histogram (`w k` the p̂ mass of bin
`k`, `L k` its level, every radius at most its bin's level) bounds TV — what the kernel computes. -/
theorem tilt_tv_le_hist_endpoints {phat delta p : ι → ℝ} (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) {κ : Type*} [Fintype κ] [DecidableEq κ] (bin : ι → κ)
    (L : κ → ℝ) (hL : ∀ j, eps j ≤ L (bin j)) (w : κ → ℝ)
    (hw : ∀ k, w k = ∑ j ∈ Finset.univ with bin j = k, phat j)
    {ν : Type*} (lo hi lam : ν → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hBlo : ∀ i, lo i - dualD w L (lo i) (lam i) ≤ B)
    (hBhi : ∀ i, hi i - dualD w L (hi i) (lam i) ≤ B) :
    tv p phat ≤ B := by
  have hwf : w = fun k => ∑ j ∈ Finset.univ with bin j = k, phat j := funext hw
  subst hwf
  have heps' : ∀ j, |delta j| ≤ L (bin j) := fun j => (heps j).trans (hL j)
  exact tilt_tv_le_dual_grid_endpoints ht (fun j => L (bin j)) heps' lo hi lam hlam hcover B
    (fun i => by
      rw [dualD_regroup phat bin L (lo i) (lam i)]
      exact hBlo i)
    (fun i => by
      rw [dualD_regroup phat bin L (hi i) (lam i)]
      exact hBhi i)

end Regroup

end WitCert
