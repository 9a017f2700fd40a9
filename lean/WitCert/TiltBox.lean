import Mathlib
import WitCert.TiltEndpoints

/-!
# The centred (box) form of the dual-grid tilt bound (SPEC §3(c))

The logit errors are known to lie in a box that is **not** centred at `0`: `|δ_j − c_j| ≤ ε_j`, with a
known centre `c_j` (from the residual sketch). `p` is the tilt of `phat` by `delta` (`IsTilt`), so a set
`S` of tokens has tilted mass at most `A_S / (A_S + C_S)` with `A_S = Σ_{S} p̂_j e^{−c_j+ε_j}` and
`C_S = Σ_{Sᶜ} p̂_j e^{−c_j−ε_j}` (`tilt_mass_le_box`: raise `S` to the top of its box, lower the rest), and
the knapsack dual of §3(c) becomes

* `betaBox t c x = (1 − t) e^{−c+x} + t e^{−c−x}`,
* `dualDBox phat c eps t λ = λ t Σ_j p̂_j e^{−c_j−ε_j} − Σ_j p̂_j (λ betaBox t c_j ε_j − 1)₊`;

`dualDBox_zero` — the box centred at `0` is the symmetric `dualD` (`TiltTV.lean`).

* `mass_ge_dualDBox` (weak duality), `dualDBox_mono` (in `t`, for `ε ≥ 0`), `dualDBox_concave` (in `t`);
  `sub_le_ends_of_concave` — `t − f(t)` is at most its larger end value on a segment for any `f` concave
  along segments (the argument of `sub_dualD_le_ends`, for any `f`);
* `tilt_tv_le_dual_grid_box_endpoints` — for any finite cover of `[0, 1]` by intervals `[lo i, hi i]` and
  any `λ_i ≥ 0`: `TV ≤ B` whenever `lo i − D(lo i, λ_i) ≤ B` and `hi i − D(hi i, λ_i) ≤ B` for every `i`,
  `D = dualDBox phat c eps`;
* `dualDBox_regroup`, `tilt_tv_le_hist_box_endpoints` — the histogram form: tokens binned by `bin`, bin `k`
  with centre `C k` and level `L k` (`|δ_j − C (bin j)| ≤ L (bin j)`): the dual value over the tokens is the
  dual value over the histogram `w k = Σ_{bin j = k} p̂_j`, and the endpoint bound on it bounds TV.

Licenses `witcert.bounds.dual_grid._tilt_row_box` (the tilt of a row with per-token log-weight
intervals `η_j ∈ [down_j, up_j]`, `p ∝ p̂ e^{η}`: `up = −c + ε`, `down = −c − ε`, so its `a = e^{up}`,
`b = e^{down}` are the two exponentials of `betaBox`) and the centred tilt of
`witcert.bounds.tv_bound_parts_logits(…, center=c)` (`δ` = served − exact logits).
-/

namespace WitCert

open Finset

section Box

variable {ι : Type*} [Fintype ι] [DecidableEq ι] {phat delta p : ι → ℝ}

/-- `β_j(t)` of the box `|δ_j − c| ≤ x`: `(1 − t) e^{−c+x} + t e^{−c−x}` (SPEC §3(c), centred). -/
noncomputable def betaBox (t c x : ℝ) : ℝ := (1 - t) * Real.exp (-c + x) + t * Real.exp (-c - x)

/-- The weak-duality value of the centred box: `D(t, λ) = λ t m − Σ_j p̂_j (λ β_j(t) − 1)₊`,
`m = Σ_j p̂_j e^{−c_j−ε_j}`. -/
noncomputable def dualDBox (phat c eps : ι → ℝ) (t lam : ℝ) : ℝ :=
  lam * t * (∑ j, phat j * Real.exp (-c j - eps j)) - ∑ j, phat j * max (lam * betaBox t (c j) (eps j) - 1) 0

/-- Consistency with the symmetric form: the box centred at `0` gives `dualD`. -/
theorem dualDBox_zero (phat eps : ι → ℝ) : dualDBox phat (fun _ => 0) eps = dualD phat eps := by
  funext t lam
  have hb : ∀ x : ℝ, betaBox t 0 x = beta t x := by
    intro x
    unfold betaBox beta
    -- `neg_zero`, `zero_sub`, `zero_add`: additive forms of `inv_one`, `one_div`, `one_mul`
    -- (Algebra/Group/Defs.lean:1099, :1060, :376)
    rw [neg_zero, zero_add, zero_sub]
  have he : ∀ x : ℝ, Real.exp (-0 - x) = Real.exp (-x) := by
    intro x
    rw [neg_zero, zero_sub]
  have e1 : ∑ j, phat j * Real.exp (-0 - eps j) = ∑ j, phat j * Real.exp (-eps j) :=
    Finset.sum_congr rfl fun j _ => by rw [he (eps j)]
  have e2 : ∑ j, phat j * max (lam * betaBox t 0 (eps j) - 1) 0
      = ∑ j, phat j * max (lam * beta t (eps j) - 1) 0 :=
    Finset.sum_congr rfl fun j _ => by rw [hb (eps j)]
  show lam * t * (∑ j, phat j * Real.exp (-0 - eps j))
        - ∑ j, phat j * max (lam * betaBox t 0 (eps j) - 1) 0
      = lam * t * (∑ j, phat j * Real.exp (-eps j))
        - ∑ j, phat j * max (lam * beta t (eps j) - 1) 0
  rw [e1, e2]

lemma eps_nonneg_box (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (j : ι) : 0 ≤ eps j :=
  (abs_nonneg _).trans (heps j)

/-- The top of the box: `e^{−δ_j} ≤ e^{−c_j+ε_j}`. -/
lemma exp_neg_delta_le_box (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (j : ι) :
    Real.exp (-delta j) ≤ Real.exp (-c j + eps j) :=
  -- `neg_le_abs`: additive form of `inv_le_mabs`, Algebra/Order/Group/Unbundled/Abs.lean:71
  Real.exp_le_exp.mpr (by linarith [neg_le_abs (delta j - c j), heps j])

/-- The bottom of the box: `e^{−c_j−ε_j} ≤ e^{−δ_j}`. -/
lemma exp_box_lo_le (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (j : ι) :
    Real.exp (-c j - eps j) ≤ Real.exp (-delta j) :=
  -- `le_abs_self`: additive form of `le_mabs_self`, Algebra/Order/Group/Unbundled/Abs.lean:69
  Real.exp_le_exp.mpr (by linarith [le_abs_self (delta j - c j), heps j])

/-- `p(S) ≤ A_S / (A_S + C_S)` for the centred box (raise `S` to the top of its box, lower the rest). -/
lemma tilt_mass_le_box (ht : IsTilt phat delta p) (c eps : ι → ℝ)
    (heps : ∀ j, |delta j - c j| ≤ eps j) (S : Finset ι) :
    ∑ j ∈ S, p j ≤ (∑ j ∈ S, phat j * Real.exp (-c j + eps j)) /
      (∑ j ∈ S, phat j * Real.exp (-c j + eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j)) := by
  have hZ : 0 < ∑ j, phat j * Real.exp (-delta j) := ht.sum_pos (fun i => -delta i)
  -- `Finset.sum_add_sum_compl`: additive form of `prod_mul_prod_compl`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:173
  have hsplit : ∑ j ∈ S, phat j * Real.exp (-delta j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-delta j)
      = ∑ j, phat j * Real.exp (-delta j) := Finset.sum_add_sum_compl S _
  have hpS : ∑ j ∈ S, p j = (∑ j ∈ S, phat j * Real.exp (-delta j)) /
      (∑ j ∈ S, phat j * Real.exp (-delta j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-delta j)) := by
    rw [hsplit]
    simp only [ht.eq]
    -- `Finset.sum_div`: Algebra/BigOperators/Field.lean:26
    rw [Finset.sum_div]
  rw [hpS]
  have hm : 0 < ∑ j, phat j * Real.exp (-c j - eps j) := ht.sum_pos (fun i => -c i - eps i)
  have hm' : ∑ j ∈ S, phat j * Real.exp (-c j - eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j)
      = ∑ j, phat j * Real.exp (-c j - eps j) := Finset.sum_add_sum_compl S _
  have hAS : ∑ j ∈ S, phat j * Real.exp (-c j - eps j) ≤ ∑ j ∈ S, phat j * Real.exp (-c j + eps j) :=
    Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left
      (Real.exp_le_exp.mpr (by linarith [eps_nonneg_box c eps heps j])) (ht.pos j).le
  apply frac_le_frac
  · exact Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  · exact Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  · exact Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_delta_le_box c eps heps j) (ht.pos j).le
  · exact Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_box_lo_le c eps heps j) (ht.pos j).le
  · rw [hsplit]; exact hZ
  · linarith

/-- Weak duality for the box: for `t_S = A_S/(A_S + C_S)` and any `λ`, `p̂(S) ≥ D(t_S, λ)`. -/
lemma mass_ge_dualDBox (phat c eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (S : Finset ι) (lam : ℝ)
    (hAC : 0 < ∑ j ∈ S, phat j * Real.exp (-c j + eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j)) :
    dualDBox phat c eps ((∑ j ∈ S, phat j * Real.exp (-c j + eps j)) /
      (∑ j ∈ S, phat j * Real.exp (-c j + eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j))) lam
      ≤ ∑ j ∈ S, phat j := by
  set A := ∑ j ∈ S, phat j * Real.exp (-c j + eps j) with hAdef
  set C := ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j) with hCdef
  set t := A / (A + C) with htdef
  set E := ∑ j ∈ S, phat j * Real.exp (-c j - eps j) with hEdef
  have hm : ∑ j, phat j * Real.exp (-c j - eps j) = E + C :=
    (Finset.sum_add_sum_compl S (fun j => phat j * Real.exp (-c j - eps j))).symm
  -- Σ_S p̂ β(t) = t·m
  have hbeta : ∑ j ∈ S, phat j * betaBox t (c j) (eps j) = t * (E + C) := by
    have hexp : ∑ j ∈ S, phat j * betaBox t (c j) (eps j) = (1 - t) * A + t * E := by
      unfold betaBox
      rw [hAdef, hEdef, Finset.mul_sum, Finset.mul_sum, ← Finset.sum_add_distrib]
      refine Finset.sum_congr rfl fun j _ => ?_
      ring
    have hne : A + C ≠ 0 := ne_of_gt hAC
    have htAC : t * (A + C) = A := by rw [htdef]; exact div_mul_cancel₀ A hne
    rw [hexp]; linarith
  -- D(t, λ) ≤ Σ_S p̂
  unfold dualDBox
  rw [hm]
  have hS : ∑ j ∈ S, phat j * max (lam * betaBox t (c j) (eps j) - 1) 0 ≤
      ∑ j, phat j * max (lam * betaBox t (c j) (eps j) - 1) 0 :=
    Finset.sum_le_sum_of_subset_of_nonneg (Finset.subset_univ S)
      fun j _ _ => mul_nonneg (hp j) (le_max_right _ _)
  have hterm : ∀ j ∈ S, phat j * (1 - lam * betaBox t (c j) (eps j)) ≥
      -(phat j * max (lam * betaBox t (c j) (eps j) - 1) 0) := by
    intro j _
    have := mul_le_mul_of_nonneg_left (le_max_left (lam * betaBox t (c j) (eps j) - 1) 0) (hp j)
    linarith
  have hsum := Finset.sum_le_sum hterm
  rw [Finset.sum_neg_distrib] at hsum
  have hid : ∑ j ∈ S, phat j * (1 - lam * betaBox t (c j) (eps j)) =
      ∑ j ∈ S, phat j - lam * ∑ j ∈ S, phat j * betaBox t (c j) (eps j) := by
    rw [Finset.mul_sum, ← Finset.sum_sub_distrib]
    refine Finset.sum_congr rfl fun j _ => ?_
    ring
  rw [hid, hbeta] at hsum
  -- linear in the monomials `lam * t * E`, `lam * t * C` and the sums
  linarith

/-- `D(·, λ)` of the box is nondecreasing in `t` (`λ ≥ 0`, `ε ≥ 0`: `β_j` is nonincreasing in `t`). -/
lemma dualDBox_mono (phat c eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (he : ∀ j, 0 ≤ eps j)
    {t t' lam : ℝ} (hlam : 0 ≤ lam) (htt : t ≤ t') :
    dualDBox phat c eps t lam ≤ dualDBox phat c eps t' lam := by
  unfold dualDBox
  have hm : 0 ≤ ∑ j, phat j * Real.exp (-c j - eps j) :=
    Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have h1 : lam * t * (∑ j, phat j * Real.exp (-c j - eps j)) ≤
      lam * t' * (∑ j, phat j * Real.exp (-c j - eps j)) :=
    mul_le_mul_of_nonneg_right (mul_le_mul_of_nonneg_left htt hlam) hm
  have h2 : ∑ j, phat j * max (lam * betaBox t' (c j) (eps j) - 1) 0 ≤
      ∑ j, phat j * max (lam * betaBox t (c j) (eps j) - 1) 0 := by
    refine Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left ?_ (hp j)
    -- `max_le_max`: Order/MinMax.lean:63
    refine max_le_max ?_ le_rfl
    have hexp : Real.exp (-c j - eps j) ≤ Real.exp (-c j + eps j) :=
      Real.exp_le_exp.mpr (by linarith [he j])
    have hb : betaBox t' (c j) (eps j) ≤ betaBox t (c j) (eps j) := by
      unfold betaBox
      -- the difference is `(t' − t) (e^{−c+ε} − e^{−c−ε}) ≥ 0` (an identity)
      have hprod : 0 ≤ (t' - t) * (Real.exp (-c j + eps j) - Real.exp (-c j - eps j)) :=
        mul_nonneg (sub_nonneg.2 htt) (sub_nonneg.2 hexp)
      have hid : (1 - t) * Real.exp (-c j + eps j) + t * Real.exp (-c j - eps j)
          - ((1 - t') * Real.exp (-c j + eps j) + t' * Real.exp (-c j - eps j))
          = (t' - t) * (Real.exp (-c j + eps j) - Real.exp (-c j - eps j)) := by ring
      linarith
    have := mul_le_mul_of_nonneg_left hb hlam
    linarith
  linarith

/-- `betaBox` is affine in `t`. -/
lemma betaBox_affine (t₀ t₁ θ c x : ℝ) :
    betaBox ((1 - θ) * t₀ + θ * t₁) c x = (1 - θ) * betaBox t₀ c x + θ * betaBox t₁ c x := by
  unfold betaBox
  ring

/-- `D(·, λ)` of the box is concave in `t` along a segment (any `λ`). -/
lemma dualDBox_concave (phat c eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (lam t₀ t₁ θ : ℝ)
    (hθ0 : 0 ≤ θ) (hθ1 : θ ≤ 1) :
    (1 - θ) * dualDBox phat c eps t₀ lam + θ * dualDBox phat c eps t₁ lam ≤
      dualDBox phat c eps ((1 - θ) * t₀ + θ * t₁) lam := by
  unfold dualDBox
  set m := ∑ j, phat j * Real.exp (-c j - eps j) with hm
  -- the hinge terms, term by term
  have hterm : ∀ j ∈ (Finset.univ : Finset ι),
      phat j * max (lam * betaBox ((1 - θ) * t₀ + θ * t₁) (c j) (eps j) - 1) 0 ≤
        (1 - θ) * (phat j * max (lam * betaBox t₀ (c j) (eps j) - 1) 0) +
          θ * (phat j * max (lam * betaBox t₁ (c j) (eps j) - 1) 0) := by
    intro j _
    have hcomb : lam * betaBox ((1 - θ) * t₀ + θ * t₁) (c j) (eps j) - 1 =
        (1 - θ) * (lam * betaBox t₀ (c j) (eps j) - 1) +
          θ * (lam * betaBox t₁ (c j) (eps j) - 1) := by
      rw [betaBox_affine]
      ring
    rw [hcomb]
    have h := mul_le_mul_of_nonneg_left
      (hinge_combo_le (lam * betaBox t₀ (c j) (eps j) - 1) (lam * betaBox t₁ (c j) (eps j) - 1)
        θ hθ0 hθ1) (hp j)
    have hexp : phat j * ((1 - θ) * max (lam * betaBox t₀ (c j) (eps j) - 1) 0 +
          θ * max (lam * betaBox t₁ (c j) (eps j) - 1) 0) =
        (1 - θ) * (phat j * max (lam * betaBox t₀ (c j) (eps j) - 1) 0) +
          θ * (phat j * max (lam * betaBox t₁ (c j) (eps j) - 1) 0) := by
      ring
    linarith
  have hsum := Finset.sum_le_sum hterm
  rw [Finset.sum_add_distrib, ← Finset.mul_sum, ← Finset.mul_sum] at hsum
  have hlin : lam * ((1 - θ) * t₀ + θ * t₁) * m =
      (1 - θ) * (lam * t₀ * m) + θ * (lam * t₁ * m) := by
    ring
  rw [hlin]
  linarith

/-- For any `f` concave along segments, the convex function `t − f(t)` is at most its larger end value
on a segment (the argument of `sub_dualD_le_ends`, for any `f`). -/
lemma sub_le_ends_of_concave (f : ℝ → ℝ)
    (hf : ∀ t₀ t₁ θ : ℝ, 0 ≤ θ → θ ≤ 1 → (1 - θ) * f t₀ + θ * f t₁ ≤ f ((1 - θ) * t₀ + θ * t₁))
    (lo hi t B : ℝ) (hlo : lo ≤ t) (hhi : t ≤ hi) (hBlo : lo - f lo ≤ B) (hBhi : hi - f hi ≤ B) :
    t - f t ≤ B := by
  -- `eq_or_lt_of_le`: Order/Basic.lean:249
  rcases eq_or_lt_of_le (hlo.trans hhi) with heq | hlt
  · -- a degenerate interval: t = lo
    have htlo : t = lo := le_antisymm (by rw [heq]; exact hhi) hlo
    rw [htlo]
    exact hBlo
  · set θ := (t - lo) / (hi - lo) with hθ
    have hpos : 0 < hi - lo := sub_pos.mpr hlt
    have hθ0 : 0 ≤ θ := div_nonneg (sub_nonneg.mpr hlo) hpos.le
    have hθ1 : θ ≤ 1 := by
      -- `div_le_one`: Algebra/Order/Field/Basic.lean:43
      rw [hθ, div_le_one hpos]
      linarith
    have ht : (1 - θ) * lo + θ * hi = t := by
      have hmul : θ * (hi - lo) = t - lo := by
        rw [hθ]
        -- `div_mul_cancel₀`: Algebra/GroupWithZero/Units/Basic.lean:285
        exact div_mul_cancel₀ (t - lo) (ne_of_gt hpos)
      linarith
    have hc := hf lo hi θ hθ0 hθ1
    rw [ht] at hc
    have h1θ : 0 ≤ 1 - θ := sub_nonneg.mpr hθ1
    have e1 := mul_le_mul_of_nonneg_left hBlo h1θ
    have e2 := mul_le_mul_of_nonneg_left hBhi hθ0
    -- the end values' combination, expanded (ring), with the segment point folded back to t
    have hexpand : (1 - θ) * (lo - f lo) + θ * (hi - f hi) =
        ((1 - θ) * lo + θ * hi) - ((1 - θ) * f lo + θ * f hi) := by
      ring
    rw [ht] at hexpand
    have hB : (1 - θ) * B + θ * B = B := by ring
    linarith [hc, hexpand, e1, e2, hB]

/-- SPEC §3(c), centred box, with endpoint values: `|δ_j − c_j| ≤ ε_j`; for any finite cover of `[0, 1]`
by intervals and any multipliers `λ_i ≥ 0`, `TV ≤ B` when both ends of every interval have
`t − D(t, λ_i) ≤ B`, `D = dualDBox phat c eps`. -/
theorem tilt_tv_le_dual_grid_box_endpoints (ht : IsTilt phat delta p) (c eps : ι → ℝ)
    (heps : ∀ j, |delta j - c j| ≤ eps j) {κ : Type*} (lo hi lam : κ → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hBlo : ∀ i, lo i - dualDBox phat c eps (lo i) (lam i) ≤ B)
    (hBhi : ∀ i, hi i - dualDBox phat c eps (hi i) (lam i) ≤ B) :
    tv p phat ≤ B := by
  apply tv_le_of_gain_le p phat ht.sum_eq
  intro S
  have hp : ∀ j, 0 ≤ phat j := fun j => (ht.pos j).le
  have he := eps_nonneg_box c eps heps
  set A := ∑ j ∈ S, phat j * Real.exp (-c j + eps j) with hAdef
  set C := ∑ j ∈ Sᶜ, phat j * Real.exp (-c j - eps j) with hCdef
  have hA0 : 0 ≤ A := Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have hC0 : 0 ≤ C := Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have hAC : 0 < A + C := by
    have hm : 0 < ∑ j, phat j * Real.exp (-c j - eps j) := ht.sum_pos (fun i => -c i - eps i)
    have hsplit : ∑ j ∈ S, phat j * Real.exp (-c j - eps j) + C
        = ∑ j, phat j * Real.exp (-c j - eps j) :=
      Finset.sum_add_sum_compl S _
    have hle : ∑ j ∈ S, phat j * Real.exp (-c j - eps j) ≤ A :=
      Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left
        (Real.exp_le_exp.mpr (by linarith [he j])) (hp j)
    linarith
  set t := A / (A + C) with htdef
  have ht0 : 0 ≤ t := div_nonneg hA0 hAC.le
  have ht1 : t ≤ 1 := by rw [htdef, div_le_one hAC]; linarith
  obtain ⟨i, hlo, hhi⟩ := hcover t ht0 ht1
  have h1 : ∑ j ∈ S, p j ≤ t := tilt_mass_le_box ht c eps heps S
  have h2 : dualDBox phat c eps t (lam i) ≤ ∑ j ∈ S, phat j :=
    mass_ge_dualDBox phat c eps hp S (lam i) hAC
  have h3 : t - dualDBox phat c eps t (lam i) ≤ B :=
    sub_le_ends_of_concave (fun s => dualDBox phat c eps s (lam i))
      (fun t₀ t₁ θ hθ0 hθ1 => dualDBox_concave phat c eps hp (lam i) t₀ t₁ θ hθ0 hθ1)
      (lo i) (hi i) t B hlo hhi (hBlo i) (hBhi i)
  linarith

end Box

section RegroupBox

/-! ### The histogram form of the centred box

Tokens binned by `bin : ι → κ`, bin `k` with centre `C k` and level `L k`, every token in its bin's box
`|δ_j − C (bin j)| ≤ L (bin j)`: `tilt_tv_le_dual_grid_box_endpoints` with `c = C ∘ bin`, `ε = L ∘ bin`
bounds TV through `dualDBox phat (C ∘ bin) (L ∘ bin)`, which is the histogram's `dualDBox`
(`dualDBox_regroup`, by `sum_mul_regroup`). -/

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- The dual value of the binned boxes is the dual value of the histogram (p̂ mass per bin). -/
theorem dualDBox_regroup {κ : Type*} [Fintype κ] [DecidableEq κ] (phat : ι → ℝ) (bin : ι → κ)
    (C L : κ → ℝ) (t lam : ℝ) :
    dualDBox phat (fun j => C (bin j)) (fun j => L (bin j)) t lam
      = dualDBox (fun k => ∑ j ∈ Finset.univ with bin j = k, phat j) C L t lam := by
  have e1 : ∑ j, phat j * Real.exp (-C (bin j) - L (bin j))
      = ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * Real.exp (-C k - L k) :=
    sum_mul_regroup phat bin (fun k => Real.exp (-C k - L k))
  have e2 : ∑ j, phat j * max (lam * betaBox t (C (bin j)) (L (bin j)) - 1) 0
      = ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) *
          max (lam * betaBox t (C k) (L k) - 1) 0 :=
    sum_mul_regroup phat bin (fun k => max (lam * betaBox t (C k) (L k) - 1) 0)
  show lam * t * (∑ j, phat j * Real.exp (-C (bin j) - L (bin j)))
        - ∑ j, phat j * max (lam * betaBox t (C (bin j)) (L (bin j)) - 1) 0
      = lam * t * (∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) * Real.exp (-C k - L k))
        - ∑ k, (∑ j ∈ Finset.univ with bin j = k, phat j) *
            max (lam * betaBox t (C k) (L k) - 1) 0
  rw [e1, e2]

/-- The centred endpoint bound evaluated on the histogram (`w k` the p̂ mass of bin `k`, `C k` its centre,
`L k` its level, every token in its bin's box) bounds TV. -/
theorem tilt_tv_le_hist_box_endpoints {phat delta p : ι → ℝ} (ht : IsTilt phat delta p)
    {κ : Type*} [Fintype κ] [DecidableEq κ] (bin : ι → κ) (C L : κ → ℝ)
    (hbox : ∀ j, |delta j - C (bin j)| ≤ L (bin j)) (w : κ → ℝ)
    (hw : ∀ k, w k = ∑ j ∈ Finset.univ with bin j = k, phat j)
    {ν : Type*} (lo hi lam : ν → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hBlo : ∀ i, lo i - dualDBox w C L (lo i) (lam i) ≤ B)
    (hBhi : ∀ i, hi i - dualDBox w C L (hi i) (lam i) ≤ B) :
    tv p phat ≤ B := by
  have hwf : w = fun k => ∑ j ∈ Finset.univ with bin j = k, phat j := funext hw
  subst hwf
  exact tilt_tv_le_dual_grid_box_endpoints ht (fun j => C (bin j)) (fun j => L (bin j)) hbox
    lo hi lam hlam hcover B
    (fun i => by
      rw [dualDBox_regroup phat bin C L (lo i) (lam i)]
      exact hBlo i)
    (fun i => by
      rw [dualDBox_regroup phat bin C L (hi i) (lam i)]
      exact hBhi i)

end RegroupBox

end WitCert
