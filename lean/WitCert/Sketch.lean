import WitCert.Radius
import WitCert.TiltTV

/-!
# The residual-sketch radius (SPEC §2, Tier A: the radius the kernel bins)

For one kv head, a token `j` with residual `r = k̂_j − k_j`, a stored sketch `r̃` of the residual
(any vector: a `b`-bit code, the exact residual on some planes, or `0`), positive per-coordinate
weights `a` (one weight per RoPE band, calibrated per (layer, kv head); `a = 1` is plain
Cauchy–Schwarz) and a stored witness `W ≥ ‖(r − r̃) / a‖`, the logit error `δ = σ ⟨q, r⟩` of a
query head `q` is at most

    |σ| · |⟨q, r̃⟩| + |σ| · ‖a ⊙ q‖ · W.

The kernel shares one level per token between the query heads of a kv head: with
`c_h = |σ| ‖a ⊙ q_h‖` and any `u ≥ 0` with `|σ ⟨q_h', r̃⟩| ≤ c_h' · u` for every head `h'`
(the kernel takes `u = max_h' |σ ⟨q_h', r̃⟩| / c_h'`), `|δ_h| ≤ c_h · (W + u)` for every head.

## Main definitions

* `WitCert.wmul a q` — the weighted query `a ⊙ q` (coordinate-wise product).
* `WitCert.wdiv x a` — the weighted residual `x / a` (coordinate-wise quotient).

## Main statements

* `weighted_inner_le` — weighted Cauchy–Schwarz `|⟨q, x⟩| ≤ ‖a ⊙ q‖ · ‖x / a‖`.
* `sketch_logit_error_le` — the per-head radius above (triangle inequality + `weighted_inner_le`).
* `sketch_centred_error_le` — the centred box `|δ − σ ⟨q, r̃⟩| ≤ |σ| ‖a ⊙ q‖ W` (the reference path's
  centred tilt, `TiltBox.lean`);
* `sketch_shared_radius_le` — the shared form `c_h · (W + u)`, what the kernel bins;
  `sketch_u_of_ratio_le` — the kernel's `u = max_h' ratio` satisfies its hypothesis.
* `projected_logit_error_le` — SPEC §8's projected radius
  `|σ| (|Σ_{i∈P} q_i r_i| + ‖q_{Pᶜ}‖ ‖r_{Pᶜ}‖)` (Cauchy–Schwarz on the orthogonal split `P`, `Pᶜ`).
* `window_token_radius_zero`, `window_radii_sound`, `window_tv_le_eform` — a token served exactly
  has `δ = 0`, so radius `0` is sound, and the §3 theorems take such radii as they are.
* `kernel_radius_ge_group_sum` — issue 37 (d): `|σ| ‖q‖ ‖(W_g)_g‖₂` dominates SPEC §2's group
  sum `|σ| Σ_g ‖q[g]‖ W_g` (Cauchy–Schwarz over the groups);
  `sketch_radius_ge_per_head`, `sketch_radius_ge_group_sum` — the kernel's `c_h (W + u)` dominates
  the per-head form and, for `r̃ = 0`, `a = 1`, the group sum of `abs_logit_error_le_radius`.

## Implementation notes

Norms are `gnorm Finset.univ` (`Radius.lean`). The weights only need to vanish where the sketch
is exact (`a i = 0 → r i = r̃ i`; Lean's `x / 0 = 0`), so positive weights always qualify.
The numeric counterpart is `witcert.bounds.sketch_radius` (to be wired: see
`proofs_bridge/formulas.py`, `SKETCH_RADIUS`).
-/

namespace WitCert

open Finset

/-! ### Definitions -/

section Defs

variable {d : Type*}

/-- The weighted query `a ⊙ q` (coordinate-wise product). -/
noncomputable def wmul (a q : d → ℝ) (i : d) : ℝ := a i * q i

/-- The weighted residual `x / a` (coordinate-wise quotient; Lean's `x i / 0 = 0`). -/
noncomputable def wdiv (x a : d → ℝ) (i : d) : ℝ := x i / a i

end Defs

/-! ### The sketch radius -/

section Sketch

variable {d : Type*} [Fintype d]

/-- Weighted Cauchy–Schwarz: `|⟨q, x⟩| ≤ ‖a ⊙ q‖ · ‖x / a‖`, for weights that vanish only where
`x` does (positive weights always qualify). -/
theorem weighted_inner_le (a q x : d → ℝ) (ha : ∀ i, a i = 0 → x i = 0) :
    |∑ i, q i * x i| ≤ gnorm univ (wmul a q) * gnorm univ (wdiv x a) := by
  have hterm : ∀ i, q i * x i = wmul a q i * wdiv x a i := by
    intro i
    show q i * x i = a i * q i * (x i / a i)
    by_cases hai : a i = 0
    · have hxi : x i = 0 := ha i hai
      rw [hai, hxi]
      ring
    · have e : a i * q i * (x i / a i) = q i * (x i / a i * a i) := by ring
      -- `div_mul_cancel₀`: Algebra/GroupWithZero/Units/Basic.lean:285
      rw [e, div_mul_cancel₀ (x i) hai]
  have hsum : ∑ i, q i * x i = ∑ i, wmul a q i * wdiv x a i :=
    Finset.sum_congr rfl fun i _ => hterm i
  rw [hsum]
  exact abs_sum_mul_le_gnorm_mul Finset.univ (wmul a q) (wdiv x a)

/-- The per-head sketch radius: `|σ ⟨q, r⟩| ≤ |σ| |⟨q, r̃⟩| + |σ| ‖a ⊙ q‖ W` for any sketch `r̃`
and any witness `W ≥ ‖(r − r̃) / a‖`. -/
theorem sketch_logit_error_le (a q r rt : d → ℝ) (ha : ∀ i, a i = 0 → r i = rt i)
    (sigma W : ℝ) (hW : gnorm univ (wdiv (r - rt) a) ≤ W) :
    |sigma * ∑ i, q i * r i| ≤ |sigma| * |∑ i, q i * rt i| + |sigma| * gnorm univ (wmul a q) * W := by
  -- `⟨q, r⟩ = ⟨q, r̃⟩ + ⟨q, r − r̃⟩` (`Pi.sub_apply`: Algebra/Notation/Pi/Defs.lean:110, additive)
  have hsplit : ∑ i, q i * r i = ∑ i, q i * rt i + ∑ i, q i * (r - rt) i := by
    rw [← Finset.sum_add_distrib]
    refine Finset.sum_congr rfl fun i _ => ?_
    rw [Pi.sub_apply]
    ring
  have hx : ∀ i, a i = 0 → (r - rt) i = 0 := by
    intro i hai
    rw [Pi.sub_apply, ha i hai, sub_self]
  have hcs : |∑ i, q i * (r - rt) i| ≤ gnorm univ (wmul a q) * gnorm univ (wdiv (r - rt) a) :=
    weighted_inner_le a q (r - rt) hx
  have hq0 : 0 ≤ gnorm univ (wmul a q) := Real.sqrt_nonneg _
  have hcsW : |∑ i, q i * (r - rt) i| ≤ gnorm univ (wmul a q) * W :=
    hcs.trans (mul_le_mul_of_nonneg_left hW hq0)
  -- `abs_add_le`: additive form of `mabs_mul_le`, Algebra/Order/Group/Unbundled/Abs.lean:125
  have htri : |∑ i, q i * r i| ≤ |∑ i, q i * rt i| + gnorm univ (wmul a q) * W := by
    rw [hsplit]
    exact (abs_add_le _ _).trans (add_le_add (le_refl _) hcsW)
  have hs0 : 0 ≤ |sigma| := abs_nonneg sigma
  rw [abs_mul]
  calc |sigma| * |∑ i, q i * r i|
      ≤ |sigma| * (|∑ i, q i * rt i| + gnorm univ (wmul a q) * W) :=
        mul_le_mul_of_nonneg_left htri hs0
    _ = |sigma| * |∑ i, q i * rt i| + |sigma| * gnorm univ (wmul a q) * W := by ring

/-- The centred box (issue 33, the reference path's `sketch_box="centred"`): the logit error is within
`|σ| ‖a ⊙ q‖ W` of the sketch's centre `σ ⟨q, r̃⟩` — the hypothesis `heps` of
`tilt_tv_le_dual_grid_box_endpoints` (`TiltBox.lean`) with `c = σ ⟨q, r̃⟩`, `ε = |σ| ‖a ⊙ q‖ W`;
`witcert.bounds.sketch_center`, `sketch_radius(..., centered=True)`. -/
theorem sketch_centred_error_le (a q r rt : d → ℝ) (ha : ∀ i, a i = 0 → r i = rt i)
    (sigma W : ℝ) (hW : gnorm univ (wdiv (r - rt) a) ≤ W) :
    |sigma * ∑ i, q i * r i - sigma * ∑ i, q i * rt i| ≤ |sigma| * gnorm univ (wmul a q) * W := by
  -- `⟨q, r⟩ − ⟨q, r̃⟩ = ⟨q, r − r̃⟩` (`Pi.sub_apply`: Algebra/Notation/Pi/Defs.lean:110, additive)
  have hdiff : ∑ i, q i * r i - ∑ i, q i * rt i = ∑ i, q i * (r - rt) i := by
    rw [← Finset.sum_sub_distrib]
    refine Finset.sum_congr rfl fun i _ => ?_
    rw [Pi.sub_apply]
    ring
  have hx : ∀ i, a i = 0 → (r - rt) i = 0 := by
    intro i hai
    rw [Pi.sub_apply, ha i hai, sub_self]
  have hcs : |∑ i, q i * (r - rt) i| ≤ gnorm univ (wmul a q) * gnorm univ (wdiv (r - rt) a) :=
    weighted_inner_le a q (r - rt) hx
  have hq0 : 0 ≤ gnorm univ (wmul a q) := Real.sqrt_nonneg _
  have hcsW : |∑ i, q i * (r - rt) i| ≤ gnorm univ (wmul a q) * W :=
    hcs.trans (mul_le_mul_of_nonneg_left hW hq0)
  have hfac : sigma * ∑ i, q i * r i - sigma * ∑ i, q i * rt i
      = sigma * ∑ i, q i * (r - rt) i := by
    rw [← hdiff]
    ring
  rw [hfac, abs_mul]
  calc |sigma| * |∑ i, q i * (r - rt) i|
      ≤ |sigma| * (gnorm univ (wmul a q) * W) :=
        mul_le_mul_of_nonneg_left hcsW (abs_nonneg sigma)
    _ = |sigma| * gnorm univ (wmul a q) * W := by ring

/-- The shared radius the kernel bins: with `c_h = |σ| ‖a ⊙ q_h‖` and one `u` for the token such
that `|σ ⟨q_h', r̃⟩| ≤ c_h' · u` for every head `h'`, `|σ ⟨q_h, r⟩| ≤ c_h · (W + u)`. -/
theorem sketch_shared_radius_le {κ : Type*} (a : d → ℝ) (qh : κ → d → ℝ) (r rt : d → ℝ)
    (ha : ∀ i, a i = 0 → r i = rt i) (sigma W u : ℝ) (c : κ → ℝ)
    (hW : gnorm univ (wdiv (r - rt) a) ≤ W)
    (hc : ∀ h, c h = |sigma| * gnorm univ (wmul a (qh h)))
    (hu : ∀ h, |sigma * ∑ i, qh h i * rt i| ≤ c h * u) (h : κ) :
    |sigma * ∑ i, qh h i * r i| ≤ c h * (W + u) := by
  have h1 : |sigma * ∑ i, qh h i * r i|
      ≤ |sigma| * |∑ i, qh h i * rt i| + |sigma| * gnorm univ (wmul a (qh h)) * W :=
    sketch_logit_error_le a (qh h) r rt ha sigma W hW
  have h2 : |sigma| * |∑ i, qh h i * rt i| ≤ c h * u := by
    rw [← abs_mul]
    exact hu h
  have h3 : |sigma| * gnorm univ (wmul a (qh h)) * W = c h * W := by
    rw [hc h]
  calc |sigma * ∑ i, qh h i * r i|
      ≤ |sigma| * |∑ i, qh h i * rt i| + |sigma| * gnorm univ (wmul a (qh h)) * W := h1
    _ ≤ c h * u + c h * W := by linarith [h2, h3]
    _ = c h * (W + u) := by ring

/-- The kernel's choice of `u`: any `u` at least every head's ratio `|σ ⟨q_h, r̃⟩| / c_h`
(`c_h > 0`) satisfies the hypothesis `hu` of `sketch_shared_radius_le`. -/
theorem sketch_u_of_ratio_le {κ : Type*} (qh : κ → d → ℝ) (rt : d → ℝ) (sigma u : ℝ)
    (c : κ → ℝ) (hc0 : ∀ h, 0 < c h)
    (hratio : ∀ h, |sigma * ∑ i, qh h i * rt i| / c h ≤ u) (h : κ) :
    |sigma * ∑ i, qh h i * rt i| ≤ c h * u := by
  -- `div_le_iff₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1126
  have h1 : |sigma * ∑ i, qh h i * rt i| ≤ u * c h := (div_le_iff₀ (hc0 h)).mp (hratio h)
  calc |sigma * ∑ i, qh h i * rt i| ≤ u * c h := h1
    _ = c h * u := mul_comm u (c h)

/-- SPEC §8's projected radius: Cauchy–Schwarz on the orthogonal split `P`, `Pᶜ`,
`|σ ⟨q, r⟩| ≤ |σ| (|Σ_{i∈P} q_i r_i| + ‖q_{Pᶜ}‖ ‖r_{Pᶜ}‖)`. -/
theorem projected_logit_error_le [DecidableEq d] (P : Finset d) (q r : d → ℝ) (sigma : ℝ) :
    |sigma * ∑ i, q i * r i| ≤ |sigma| * (|∑ i ∈ P, q i * r i| + gnorm Pᶜ q * gnorm Pᶜ r) := by
  -- `Finset.sum_add_sum_compl`: additive form of `Finset.prod_mul_prod_compl`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:173
  have hsplit : ∑ i, q i * r i = ∑ i ∈ P, q i * r i + ∑ i ∈ Pᶜ, q i * r i :=
    (Finset.sum_add_sum_compl P (fun i => q i * r i)).symm
  have hc : |∑ i ∈ Pᶜ, q i * r i| ≤ gnorm Pᶜ q * gnorm Pᶜ r := abs_sum_mul_le_gnorm_mul Pᶜ q r
  have htri : |∑ i, q i * r i| ≤ |∑ i ∈ P, q i * r i| + gnorm Pᶜ q * gnorm Pᶜ r := by
    rw [hsplit]
    exact (abs_add_le _ _).trans (add_le_add (le_refl _) hc)
  rw [abs_mul]
  exact mul_le_mul_of_nonneg_left htri (abs_nonneg sigma)

end Sketch

/-! ### The exact window: radius `0` -/

section Window

/-- A token served exactly (`k̂_j = k_j`) has logit error `0`: radius `0` is sound. -/
theorem window_token_radius_zero {d : Type*} [Fintype d] (q k khat : d → ℝ) (sigma delta : ℝ)
    (hdelta : delta = sigma * ∑ i, q i * (khat i - k i)) (hexact : ∀ i, khat i = k i) :
    |delta| ≤ 0 := by
  -- `Finset.sum_eq_zero`: additive form of `Finset.prod_eq_one`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:108
  have hz : ∑ i, q i * (khat i - k i) = 0 := by
    refine Finset.sum_eq_zero fun i _ => ?_
    rw [hexact i, sub_self, mul_zero]
  have h0 : delta = 0 := by
    rw [hdelta, hz, mul_zero]
  have habs : |delta| = 0 := by
    rw [h0, abs_zero]
  exact le_of_eq habs

/-- Radii `0` on the window `Win` (tokens with `δ_j = 0`) and `ε_j` elsewhere bound every
`|δ_j|`: the hypothesis `heps` of every §3 theorem, with zero radii in it. -/
theorem window_radii_sound {κ : Type*} (Win : Finset κ) (delta eps epsw : κ → ℝ)
    (hwin : ∀ j ∈ Win, delta j = 0) (heps : ∀ j, j ∉ Win → |delta j| ≤ eps j)
    (hw0 : ∀ j ∈ Win, epsw j = 0) (hwo : ∀ j, j ∉ Win → epsw j = eps j) :
    ∀ j, |delta j| ≤ epsw j := by
  intro j
  by_cases hj : j ∈ Win
  · have habs : |delta j| = epsw j := by
      rw [hwin j hj, hw0 j hj, abs_zero]
    exact le_of_eq habs
  · rw [hwo j hj]
    exact heps j hj

/-- SPEC §3(b) with the window at radius `0`: `TV ≤ (A² − 1)/2`, `A = Σ_j p̂_j e^{ε^w_j}`
(`e^0 = 1` on the window). -/
theorem window_tv_le_eform {ι : Type*} [Fintype ι] [DecidableEq ι] {phat delta p : ι → ℝ}
    (ht : IsTilt phat delta p) (Win : Finset ι) (eps epsw : ι → ℝ)
    (hwin : ∀ j ∈ Win, delta j = 0) (heps : ∀ j, j ∉ Win → |delta j| ≤ eps j)
    (hw0 : ∀ j ∈ Win, epsw j = 0) (hwo : ∀ j, j ∉ Win → epsw j = eps j)
    (A : ℝ) (hA : A = ∑ j, phat j * Real.exp (epsw j)) :
    tv p phat ≤ (A ^ 2 - 1) / 2 :=
  tilt_tv_le_eform ht epsw (window_radii_sound Win delta eps epsw hwin heps hw0 hwo) A hA

end Window

/-! ### Issue 37 (d): the kernel's radius dominates the group sum -/

section Dominates

variable {d : Type*} [Fintype d]

/-- `|σ| Σ_g ‖q[g]‖ W_g ≤ |σ| ‖q‖ ‖(W_g)_g‖₂` for any partition of the coordinates into groups
(Cauchy–Schwarz over the groups; equality for one group). -/
theorem kernel_radius_ge_group_sum {κ : Type*} [DecidableEq d] (G : Finset κ) (grp : κ → Finset d)
    (hdisj : (G : Set κ).PairwiseDisjoint grp) (hcover : G.biUnion grp = Finset.univ)
    (q : d → ℝ) (W : κ → ℝ) (sigma Wn : ℝ) (hWn : Wn = Real.sqrt (∑ g ∈ G, W g ^ 2)) :
    |sigma| * ∑ g ∈ G, gnorm (grp g) q * W g ≤ |sigma| * gnorm univ q * Wn := by
  -- `Real.sq_sqrt`: Data/Real/Sqrt.lean:175
  have hsq : ∀ g ∈ G, gnorm (grp g) q ^ 2 = ∑ i ∈ grp g, q i ^ 2 := fun g _ =>
    Real.sq_sqrt (Finset.sum_nonneg fun i _ => sq_nonneg (q i))
  -- `Finset.sum_biUnion`: additive form of `Finset.prod_biUnion`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:221
  have htot : ∑ g ∈ G, gnorm (grp g) q ^ 2 = ∑ i, q i ^ 2 := by
    rw [Finset.sum_congr rfl hsq, ← Finset.sum_biUnion hdisj, hcover]
  -- `Real.sum_mul_le_sqrt_mul_sqrt`: Data/Real/Sqrt.lean:483
  have hcs : ∑ g ∈ G, gnorm (grp g) q * W g
      ≤ Real.sqrt (∑ g ∈ G, gnorm (grp g) q ^ 2) * Real.sqrt (∑ g ∈ G, W g ^ 2) :=
    Real.sum_mul_le_sqrt_mul_sqrt G (fun g => gnorm (grp g) q) W
  rw [htot] at hcs
  have hg : gnorm Finset.univ q = Real.sqrt (∑ i, q i ^ 2) := rfl
  rw [hWn, hg, mul_assoc]
  exact mul_le_mul_of_nonneg_left hcs (abs_nonneg sigma)

/-- The kernel's shared radius `c (W + u)` dominates the per-head form of
`sketch_logit_error_le` whenever `u` satisfies the hypothesis of `sketch_shared_radius_le`. -/
theorem sketch_radius_ge_per_head (a q rt : d → ℝ) (sigma W u c : ℝ)
    (hc : c = |sigma| * gnorm univ (wmul a q)) (hu : |sigma * ∑ i, q i * rt i| ≤ c * u) :
    |sigma| * |∑ i, q i * rt i| + |sigma| * gnorm univ (wmul a q) * W ≤ c * (W + u) := by
  have h1 : |sigma| * |∑ i, q i * rt i| ≤ c * u := by
    rw [← abs_mul]
    exact hu
  have h2 : |sigma| * gnorm univ (wmul a q) * W = c * W := by
    rw [hc]
  linarith [h1, h2]

/-- For `r̃ = 0` and `a = 1` (`u ≥ 0` any, the kernel's is `0`), the kernel's radius `c (W + u)`
with `W = ‖(W_g)_g‖₂` dominates SPEC §2's group sum `|σ| Σ_g ‖q[g]‖ W_g`, the radius of
`abs_logit_error_le_radius`. -/
theorem sketch_radius_ge_group_sum {κ : Type*} [DecidableEq d] (G : Finset κ) (grp : κ → Finset d)
    (hdisj : (G : Set κ).PairwiseDisjoint grp) (hcover : G.biUnion grp = Finset.univ)
    (a q : d → ℝ) (ha1 : ∀ i, a i = 1) (Wg : κ → ℝ) (sigma W u c : ℝ)
    (hWn : W = Real.sqrt (∑ g ∈ G, Wg g ^ 2)) (hu : 0 ≤ u)
    (hc : c = |sigma| * gnorm univ (wmul a q)) :
    |sigma| * ∑ g ∈ G, gnorm (grp g) q * Wg g ≤ c * (W + u) := by
  have hwq : wmul a q = q := by
    funext i
    show a i * q i = q i
    rw [ha1 i, one_mul]
  have hk : |sigma| * ∑ g ∈ G, gnorm (grp g) q * Wg g ≤ |sigma| * gnorm univ q * W :=
    kernel_radius_ge_group_sum G grp hdisj hcover q Wg sigma W hWn
  have hc0 : 0 ≤ c := by
    rw [hc]
    exact mul_nonneg (abs_nonneg sigma) (Real.sqrt_nonneg _)
  have hcu : 0 ≤ c * u := mul_nonneg hc0 hu
  have hcW : c * W = |sigma| * gnorm univ q * W := by
    rw [hc, hwq]
  -- `le_add_of_nonneg_right`: additive form of `le_mul_of_one_le_right'`,
  -- Algebra/Order/Monoid/Unbundled/Basic.lean:415
  calc |sigma| * ∑ g ∈ G, gnorm (grp g) q * Wg g ≤ |sigma| * gnorm univ q * W := hk
    _ = c * W := hcW.symm
    _ ≤ c * W + c * u := le_add_of_nonneg_right hcu
    _ = c * (W + u) := by ring

end Dominates

end WitCert
