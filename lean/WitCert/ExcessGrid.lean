import Mathlib
import WitCert.Excess

/-!
# The rescaled dual grid of the centred box (SPEC §3(c), centred; SPEC §7's Ξ)

`tilt_tv_le_dual_grid_box_endpoints` bounds `TV(p, p̂)` by the end values `t − D(t, λ)` of a
cover of `[0, 1]`, `D = dualDBox phat c eps`; the kernel only has the masses `p̃` with
`p̂_j ≤ e^{2Ξ} p̃_j` and `p̃_j ≤ e^{2Ξ} p̂_j`. This file bounds every end value by sums over `p̃`,
as `tilt_tv_le_excess_rescaled` does for the one-interval cover.

* `gridTerm c ε t λ j = (λ β_j(t) − 1)₊ − t (λ b_j − 1)`, `b_j = e^{−c_j−ε_j}`,
  `β_j = betaBox t c_j ε_j`: the per-token term of `t − D(t, λ)`;
* `sum_mul_gridTerm` — for any weights `w`:
  `Σ_j w_j gridTerm_j = Σ_j w_j (λ β_j − 1)₊ − t (λ Σ_j w_j b_j − Σ_j w_j)`;
* `sub_dualDBox_eq_sum` — `Σ p̂ = 1`: `t − D(t, λ) = Σ_j p̂_j gridTerm_j`;
* `abs_sub_le_of_ratio`, `sum_le_of_ratio` — `0 ≤ q`, `a ≤ E q`, `q ≤ E a`, `E > 0`:
  `|a − q| ≤ (E − 1) q` (`E (a − (2 − E) q) = (E a − q) + (E − 1)² q ≥ 0`); so
  `Σ p̂ f ≤ Σ p̃ f + (e^{2Ξ} − 1) Σ p̃ |f|` for any `f`;
* `abs_gridTerm_le` — `t ≥ 0`: `|gridTerm_j| ≤ (λ β_j − 1)₊ + t (|b_j − 1| + |λ − 1| b_j)`;
* `gridBound`, `sub_dualDBox_le_gridBound` — `t − D(t, λ) ≤ G(t, λ)` for `t ≥ 0`, `Ξ ≥ 0`, with
  `G(t, λ) = Σ p̃ (λβ − 1)₊ − t (λ Σ p̃ b − Σ p̃)`
  `+ (e^{2Ξ} − 1)(Σ p̃ (λβ − 1)₊ + t (Σ p̃ |b − 1| + |λ − 1| Σ p̃ b))` (no `Σ p̃ = 1` needed);
* `tilt_tv_le_grid_rescaled` — `p` a tilt of `p̂`, `|δ_j − c_j| ≤ ε_j`, the two ratio bounds, and
  a cover of `[0, 1]` by intervals with nonnegative ends and multipliers `λ_i ≥ 0`: `TV(p, p̂) ≤ B`
  whenever `G(lo i, λ_i) ≤ B` and `G(hi i, λ_i) ≤ B` for every `i`;
* `sub_dualDBox_zero`, `tilt_tv_le_grid_rescaled_capped` — the merge's form: an interval may instead take its cap
  (`λ_i = 0`: `t − D(t, 0) = t ≤ hi i ≤ B`).

Licenses the decode's (t, λ) grid: `kernels/excess_grid.py` (the tile's sums over `p̃` on each (token, head)'s box
raised by the tile's margins, and `_grid_form` / its torch twin `grid_form_torch`: `G` with the sums grown for their
fp32 accumulation, `Σ p̃ b` bounded below and above from the signed sum `Σ p̃ (b − 1)`, `e^{2Ξ} − 1` rounded up, on the
contract's cover `GRID_TILT_POINTS` / `GRID_TILT_LAMBDAS`, each interval's best multiplier or its cap); that the
computed value is at least this file's `B` is not stated here (the bridge checks it numerically: `check_excess`).
-/

namespace WitCert

section Pointwise

variable {ι : Type*}

/-- The per-token term of `t − D(t, λ)`: `(λ β_j(t) − 1)₊ − t (λ e^{−c_j−ε_j} − 1)`. -/
noncomputable def gridTerm (c eps : ι → ℝ) (t lam : ℝ) (j : ι) : ℝ :=
  max (lam * betaBox t (c j) (eps j) - 1) 0 - t * (lam * Real.exp (-c j - eps j) - 1)

/-- `0 ≤ q`, `a ≤ E q`, `q ≤ E a`, `E > 0`: `|a − q| ≤ (E − 1) q`. -/
lemma abs_sub_le_of_ratio {a q E : ℝ} (hE : 0 < E) (hq : 0 ≤ q) (haq : a ≤ E * q)
    (hqa : q ≤ E * a) : |a - q| ≤ (E - 1) * q := by
  have key : E * (a - (2 - E) * q) = (E * a - q) + (E - 1) ^ 2 * q := by ring
  -- `add_nonneg`: additive form of `one_le_mul`, Algebra/Order/Monoid/Unbundled/Basic.lean:975;
  -- `sub_nonneg`: additive form of `one_le_div'`, Algebra/Order/Group/Unbundled/Basic.lean:479;
  -- `mul_nonneg`: alias of `Left.mul_nonneg`, Algebra/Order/GroupWithZero/Unbundled/Basic.lean:68;
  -- `sq_nonneg (a) : 0 ≤ a ^ 2`: Algebra/Order/Ring/Unbundled/Basic.lean:689
  have h1 : 0 ≤ E * a - q := sub_nonneg.mpr hqa
  have h2 : 0 ≤ (E - 1) ^ 2 * q := mul_nonneg (sq_nonneg (E - 1)) hq
  have hnn : 0 ≤ (E * a - q) + (E - 1) ^ 2 * q := add_nonneg h1 h2
  -- `LE.le.trans_eq`: alias of `le_of_le_of_eq`, Order/Basic.lean:80
  have hmul : 0 ≤ E * (a - (2 - E) * q) := hnn.trans_eq key.symm
  -- `nonneg_of_mul_nonneg_right [PosMulStrictMono R] (h : 0 ≤ a * b) (ha : 0 < a) : 0 ≤ b`:
  -- Algebra/Order/Ring/Unbundled/Basic.lean:429
  have hlow : 0 ≤ a - (2 - E) * q := nonneg_of_mul_nonneg_right hmul hE
  -- `abs_le : |a| ≤ b ↔ -b ≤ a ∧ a ≤ b`: additive form of `mabs_le`, Algebra/Order/Group/Abs.lean:64
  -- (`linarith` multiplies out `(E − 1) * q` and `(2 − E) * q`: Tactic/Linarith/Parsing.lean:167)
  have hlo : -((E - 1) * q) ≤ a - q := by linarith [hlow]
  have hhi : a - q ≤ (E - 1) * q := by linarith [haq]
  exact abs_le.mpr ⟨hlo, hhi⟩

/-- `t ≥ 0`: `|gridTerm_j| ≤ (λ β_j − 1)₊ + t (|b_j − 1| + |λ − 1| b_j)`, `b_j = e^{−c_j−ε_j}`. -/
lemma abs_gridTerm_le (c eps : ι → ℝ) (t lam : ℝ) (j : ι) (ht0 : 0 ≤ t) :
    |gridTerm c eps t lam j| ≤ max (lam * betaBox t (c j) (eps j) - 1) 0
      + t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j)) := by
  -- `Real.exp_pos (x) : 0 < exp x`: Analysis/Complex/Exponential.lean:281
  have hb : 0 < Real.exp (-c j - eps j) := Real.exp_pos _
  -- `le_max_right (a b) : b ≤ max a b`: dual of `min_le_right`, Order/Defs/LinearOrder.lean:144
  have hh : 0 ≤ max (lam * betaBox t (c j) (eps j) - 1) 0 := le_max_right _ _
  -- `λ b − 1 = (b − 1) + (λ − 1) b`, then the triangle inequality
  have hsplit : lam * Real.exp (-c j - eps j) - 1
      = (Real.exp (-c j - eps j) - 1) + (lam - 1) * Real.exp (-c j - eps j) := by ring
  have e : |lam * Real.exp (-c j - eps j) - 1|
      = |(Real.exp (-c j - eps j) - 1) + (lam - 1) * Real.exp (-c j - eps j)| :=
    congrArg (fun x : ℝ => |x|) hsplit
  -- `abs_add_le (a b) : |a + b| ≤ |a| + |b|`: additive form of `mabs_mul_le`,
  -- Algebra/Order/Group/Unbundled/Abs.lean:125
  have htri : |(Real.exp (-c j - eps j) - 1) + (lam - 1) * Real.exp (-c j - eps j)|
      ≤ |Real.exp (-c j - eps j) - 1| + |(lam - 1) * Real.exp (-c j - eps j)| := abs_add_le _ _
  -- `abs_mul (a b) : |a * b| = |a| * |b|`: Algebra/Order/Ring/Abs.lean:49; `abs_of_pos (h : 0 < a) : |a| = a`:
  -- additive form of `mabs_of_one_lt`, Algebra/Order/Group/Unbundled/Abs.lean:93 (both as terms, no `rw`)
  have hm1 : |(lam - 1) * Real.exp (-c j - eps j)| = |lam - 1| * |Real.exp (-c j - eps j)| :=
    abs_mul _ _
  have hm2 : |Real.exp (-c j - eps j)| = Real.exp (-c j - eps j) := abs_of_pos hb
  have hmul : |(lam - 1) * Real.exp (-c j - eps j)| = |lam - 1| * Real.exp (-c j - eps j) :=
    hm1.trans (congrArg (fun x : ℝ => |lam - 1| * x) hm2)
  have hx : |lam * Real.exp (-c j - eps j) - 1|
      ≤ |Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j) := by
    linarith [e, htri, hmul]
  have hX := abs_le.mp hx
  -- `mul_le_mul_of_nonneg_left [PosMulMono α] (hbc : b ≤ c) (ha : 0 ≤ a) : a * b ≤ a * c`:
  -- Algebra/Order/GroupWithZero/Unbundled/Defs.lean:224
  have h1 : t * (lam * Real.exp (-c j - eps j) - 1)
      ≤ t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j)) :=
    mul_le_mul_of_nonneg_left hX.2 ht0
  have h2 : t * -(|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j))
      ≤ t * (lam * Real.exp (-c j - eps j) - 1) :=
    mul_le_mul_of_nonneg_left hX.1 ht0
  -- `gridTerm` by its definition (`rfl`), instead of `unfold`
  have hg : gridTerm c eps t lam j
      = max (lam * betaBox t (c j) (eps j) - 1) 0 - t * (lam * Real.exp (-c j - eps j) - 1) := rfl
  rw [hg]
  have hlo : -(max (lam * betaBox t (c j) (eps j) - 1) 0
        + t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j)))
      ≤ max (lam * betaBox t (c j) (eps j) - 1) 0 - t * (lam * Real.exp (-c j - eps j) - 1) := by
    linarith [h1, hh]
  have hhi : max (lam * betaBox t (c j) (eps j) - 1) 0 - t * (lam * Real.exp (-c j - eps j) - 1)
      ≤ max (lam * betaBox t (c j) (eps j) - 1) 0
        + t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j)) := by
    linarith [h2]
  exact abs_le.mpr ⟨hlo, hhi⟩

end Pointwise

section Grid

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- For any weights `w`:
`Σ_j w_j gridTerm_j = Σ_j w_j (λ β_j − 1)₊ − t (λ Σ_j w_j b_j − Σ_j w_j)`. -/
lemma sum_mul_gridTerm (w c eps : ι → ℝ) (t lam : ℝ) :
    ∑ j, w j * gridTerm c eps t lam j
      = ∑ j, w j * max (lam * betaBox t (c j) (eps j) - 1) 0
        - t * (lam * ∑ j, w j * Real.exp (-c j - eps j) - ∑ j, w j) := by
  -- each term, `gridTerm` by its definition (`rfl`), then `ring`
  have hg : ∀ j, w j * gridTerm c eps t lam j
      = w j * max (lam * betaBox t (c j) (eps j) - 1) 0
        - t * lam * (w j * Real.exp (-c j - eps j)) + t * w j := by
    intro j
    have h : gridTerm c eps t lam j = max (lam * betaBox t (c j) (eps j) - 1) 0
        - t * (lam * Real.exp (-c j - eps j) - 1) := rfl
    rw [h]
    ring
  -- `Finset.sum_congr (h : s₁ = s₂) : (∀ x ∈ s₂, f x = g x) → s₁.sum f = s₂.sum g`: additive form of
  -- `Finset.prod_congr`, Algebra/BigOperators/Group/Finset/Basic.lean:104
  have s0 : ∑ j, w j * gridTerm c eps t lam j
      = ∑ j, (w j * max (lam * betaBox t (c j) (eps j) - 1) 0
          - t * lam * (w j * Real.exp (-c j - eps j)) + t * w j) :=
    Finset.sum_congr rfl fun j _ => hg j
  -- `Finset.sum_add_distrib : ∑ i ∈ s, (f i + g i) = ∑ i ∈ s, f i + ∑ i ∈ s, g i` (`f g` implicit): additive
  -- form of `Finset.prod_mul_distrib`, Algebra/BigOperators/Group/Finset/Basic.lean:301
  have s1 : ∑ j, (w j * max (lam * betaBox t (c j) (eps j) - 1) 0
          - t * lam * (w j * Real.exp (-c j - eps j)) + t * w j)
      = ∑ j, (w j * max (lam * betaBox t (c j) (eps j) - 1) 0
          - t * lam * (w j * Real.exp (-c j - eps j))) + ∑ j, t * w j := by
    rw [Finset.sum_add_distrib]
  -- `Finset.sum_sub_distrib (f g) : ∑ i ∈ s, (f i - g i) = ∑ i ∈ s, f i - ∑ i ∈ s, g i` (`f g` explicit):
  -- additive form of `Finset.prod_div_distrib`, Algebra/BigOperators/Group/Finset/Defs.lean:659
  have s2 : ∑ j, (w j * max (lam * betaBox t (c j) (eps j) - 1) 0
          - t * lam * (w j * Real.exp (-c j - eps j)))
      = ∑ j, w j * max (lam * betaBox t (c j) (eps j) - 1) 0
        - ∑ j, t * lam * (w j * Real.exp (-c j - eps j)) := by
    rw [Finset.sum_sub_distrib]
  -- `Finset.mul_sum (s f a) : a * ∑ i ∈ s, f i = ∑ i ∈ s, a * f i`: Algebra/BigOperators/Ring/Finset.lean:56
  have s3 : ∑ j, t * lam * (w j * Real.exp (-c j - eps j))
      = t * lam * ∑ j, w j * Real.exp (-c j - eps j) := by
    rw [Finset.mul_sum]
  have s4 : ∑ j, t * w j = t * ∑ j, w j := by
    rw [Finset.mul_sum]
  -- an equality goal: `linarith` proves `≤` and `≥` (Tactic/Linarith/Frontend.lean:351)
  linarith [s0, s1, s2, s3, s4]

/-- `Σ p̂ = 1`: `t − D(t, λ) = Σ_j p̂_j gridTerm_j`. -/
lemma sub_dualDBox_eq_sum (phat c eps : ι → ℝ) (t lam : ℝ) (hsum : ∑ j, phat j = 1) :
    t - dualDBox phat c eps t lam = ∑ j, phat j * gridTerm c eps t lam j := by
  have h := sum_mul_gridTerm phat c eps t lam
  -- `dualDBox` by its definition (`rfl`; TiltBox.lean), instead of `unfold`
  have hD : dualDBox phat c eps t lam = lam * t * (∑ j, phat j * Real.exp (-c j - eps j))
      - ∑ j, phat j * max (lam * betaBox t (c j) (eps j) - 1) 0 := rfl
  -- `t Σ p̂ = t` (the monomial `t · Σ p̂` of `h`, for `linarith`)
  have ht1 : t * ∑ j, phat j = t :=
    calc t * ∑ j, phat j = t * 1 := by rw [hsum]
      -- `mul_one (a) : a * 1 = a`: Algebra/Group/Defs.lean:380
      _ = t := mul_one t
  linarith [h, hD, ht1]

/-- The ratio bounds `p̂ ≤ e^{2Ξ} p̃`, `p̃ ≤ e^{2Ξ} p̂` (`p̃ ≥ 0`): for any `f`,
`Σ p̂ f ≤ Σ p̃ f + (e^{2Ξ} − 1) Σ p̃ |f|`. -/
lemma sum_le_of_ratio {phat ptilde : ι → ℝ} {Xi : ℝ} (hpt : ∀ j, 0 ≤ ptilde j)
    (hratio_up : ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j)
    (hratio_dn : ∀ j, ptilde j ≤ Real.exp (2 * Xi) * phat j) (f : ι → ℝ) :
    ∑ j, phat j * f j
      ≤ ∑ j, ptilde j * f j + (Real.exp (2 * Xi) - 1) * ∑ j, ptilde j * |f j| := by
  have hterm : ∀ j ∈ (Finset.univ : Finset ι),
      phat j * f j ≤ ptilde j * f j + (Real.exp (2 * Xi) - 1) * (ptilde j * |f j|) := by
    intro j _
    have habs : |phat j - ptilde j| ≤ (Real.exp (2 * Xi) - 1) * ptilde j :=
      abs_sub_le_of_ratio (Real.exp_pos (2 * Xi)) (hpt j) (hratio_up j) (hratio_dn j)
    -- `le_abs_self (a) : a ≤ |a|`: additive form of `le_mabs_self`, Algebra/Order/Group/Unbundled/Abs.lean:69
    have h1 : (phat j - ptilde j) * f j ≤ |(phat j - ptilde j) * f j| := le_abs_self _
    have h2 : |(phat j - ptilde j) * f j| = |phat j - ptilde j| * |f j| := abs_mul _ _
    -- `mul_le_mul_of_nonneg_right [MulPosMono α] (hbc : b ≤ c) (ha : 0 ≤ a) : b * a ≤ c * a`:
    -- Algebra/Order/GroupWithZero/Unbundled/Defs.lean:228; `abs_nonneg (a) : 0 ≤ |a|`: additive form of
    -- `one_le_mabs`, Algebra/Order/Group/Unbundled/Abs.lean:109
    have h3 : |phat j - ptilde j| * |f j| ≤ (Real.exp (2 * Xi) - 1) * ptilde j * |f j| :=
      mul_le_mul_of_nonneg_right habs (abs_nonneg _)
    linarith [h1, h2, h3]
  -- `Finset.sum_le_sum (h : ∀ i ∈ s, f i ≤ g i) : s.sum f ≤ s.sum g`: additive form of
  -- `Finset.prod_le_prod'`, Algebra/Order/BigOperators/Group/Finset.lean:109
  have hle : ∑ j, phat j * f j
      ≤ ∑ j, (ptilde j * f j + (Real.exp (2 * Xi) - 1) * (ptilde j * |f j|)) :=
    Finset.sum_le_sum hterm
  have s1 : ∑ j, (ptilde j * f j + (Real.exp (2 * Xi) - 1) * (ptilde j * |f j|))
      = ∑ j, ptilde j * f j + ∑ j, (Real.exp (2 * Xi) - 1) * (ptilde j * |f j|) := by
    rw [Finset.sum_add_distrib]
  have s2 : ∑ j, (Real.exp (2 * Xi) - 1) * (ptilde j * |f j|)
      = (Real.exp (2 * Xi) - 1) * ∑ j, ptilde j * |f j| := by
    rw [Finset.mul_sum]
  linarith [hle, s1, s2]

/-- The endpoint value over `p̃`:
`G(t, λ) = Σ p̃ (λβ − 1)₊ − t (λ Σ p̃ b − Σ p̃)`
`+ (e^{2Ξ} − 1)(Σ p̃ (λβ − 1)₊ + t (Σ p̃ |b − 1| + |λ − 1| Σ p̃ b))`,
`b_j = e^{−c_j−ε_j}`, `β_j = betaBox t c_j ε_j`. -/
noncomputable def gridBound (ptilde c eps : ι → ℝ) (Xi t lam : ℝ) : ℝ :=
  ∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
    - t * (lam * ∑ j, ptilde j * Real.exp (-c j - eps j) - ∑ j, ptilde j)
    + (Real.exp (2 * Xi) - 1) * (∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
      + t * (∑ j, ptilde j * |Real.exp (-c j - eps j) - 1|
        + |lam - 1| * ∑ j, ptilde j * Real.exp (-c j - eps j)))

/-- `Σ p̂ = 1`, the ratio bounds with `Ξ ≥ 0`, and `t ≥ 0`: `t − D(t, λ) ≤ G(t, λ)`. -/
lemma sub_dualDBox_le_gridBound {phat ptilde : ι → ℝ} (c eps : ι → ℝ) (Xi t lam : ℝ)
    (hsum : ∑ j, phat j = 1) (hpt : ∀ j, 0 ≤ ptilde j) (hXi : 0 ≤ Xi)
    (hratio_up : ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j)
    (hratio_dn : ∀ j, ptilde j ≤ Real.exp (2 * Xi) * phat j) (ht0 : 0 ≤ t) :
    t - dualDBox phat c eps t lam ≤ gridBound ptilde c eps Xi t lam := by
  have h1 : t - dualDBox phat c eps t lam = ∑ j, phat j * gridTerm c eps t lam j :=
    sub_dualDBox_eq_sum phat c eps t lam hsum
  have h2 : ∑ j, phat j * gridTerm c eps t lam j
      ≤ ∑ j, ptilde j * gridTerm c eps t lam j
        + (Real.exp (2 * Xi) - 1) * ∑ j, ptilde j * |gridTerm c eps t lam j| :=
    sum_le_of_ratio hpt hratio_up hratio_dn (gridTerm c eps t lam)
  have h3 : ∑ j, ptilde j * gridTerm c eps t lam j
      = ∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
        - t * (lam * ∑ j, ptilde j * Real.exp (-c j - eps j) - ∑ j, ptilde j) :=
    sum_mul_gridTerm ptilde c eps t lam
  -- `Σ p̃ |gridTerm| ≤ Σ p̃ (λβ − 1)₊ + t (Σ p̃ |b − 1| + |λ − 1| Σ p̃ b)`, term by term
  have h4 : ∑ j, ptilde j * |gridTerm c eps t lam j|
      ≤ ∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
        + t * (∑ j, ptilde j * |Real.exp (-c j - eps j) - 1|
          + |lam - 1| * ∑ j, ptilde j * Real.exp (-c j - eps j)) := by
    have hle : ∑ j, ptilde j * |gridTerm c eps t lam j|
        ≤ ∑ j, ptilde j * (max (lam * betaBox t (c j) (eps j) - 1) 0
          + t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j))) :=
      Finset.sum_le_sum fun j _ =>
        mul_le_mul_of_nonneg_left (abs_gridTerm_le c eps t lam j ht0) (hpt j)
    have s0 : ∑ j, ptilde j * (max (lam * betaBox t (c j) (eps j) - 1) 0
          + t * (|Real.exp (-c j - eps j) - 1| + |lam - 1| * Real.exp (-c j - eps j)))
        = ∑ j, (ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
          + (t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
            + t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j)))) :=
      Finset.sum_congr rfl fun j _ => by ring
    have s1 : ∑ j, (ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
          + (t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
            + t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j))))
        = ∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
          + ∑ j, (t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
            + t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j))) := by
      rw [Finset.sum_add_distrib]
    have s2 : ∑ j, (t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
            + t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j)))
        = ∑ j, t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
          + ∑ j, t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j)) := by
      rw [Finset.sum_add_distrib]
    have s3 : ∑ j, t * (ptilde j * |Real.exp (-c j - eps j) - 1|)
        = t * ∑ j, ptilde j * |Real.exp (-c j - eps j) - 1| := by
      rw [Finset.mul_sum]
    have s4 : ∑ j, t * |lam - 1| * (ptilde j * Real.exp (-c j - eps j))
        = t * |lam - 1| * ∑ j, ptilde j * Real.exp (-c j - eps j) := by
      rw [Finset.mul_sum]
    linarith [hle, s0, s1, s2, s3, s4]
  -- `Real.one_le_exp {x} (hx : 0 ≤ x) : 1 ≤ exp x`: Analysis/Complex/Exponential.lean:278
  have hE1 : 1 ≤ Real.exp (2 * Xi) := Real.one_le_exp (by linarith)
  have hE : 0 ≤ Real.exp (2 * Xi) - 1 := by linarith
  have h5 : (Real.exp (2 * Xi) - 1) * ∑ j, ptilde j * |gridTerm c eps t lam j|
      ≤ (Real.exp (2 * Xi) - 1) * (∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
        + t * (∑ j, ptilde j * |Real.exp (-c j - eps j) - 1|
          + |lam - 1| * ∑ j, ptilde j * Real.exp (-c j - eps j))) :=
    mul_le_mul_of_nonneg_left h4 hE
  -- `gridBound` by its definition (`rfl`), instead of `unfold`
  have hG : gridBound ptilde c eps Xi t lam
      = ∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
        - t * (lam * ∑ j, ptilde j * Real.exp (-c j - eps j) - ∑ j, ptilde j)
        + (Real.exp (2 * Xi) - 1) * (∑ j, ptilde j * max (lam * betaBox t (c j) (eps j) - 1) 0
          + t * (∑ j, ptilde j * |Real.exp (-c j - eps j) - 1|
            + |lam - 1| * ∑ j, ptilde j * Real.exp (-c j - eps j))) := rfl
  -- linear in the atoms `dualDBox …`, `gridBound …`, the sums, `e^{2Ξ}`, `t`, `λ`, `|λ − 1|`
  -- (products of them are `linarith`'s monomials, up to degree 4)
  linarith [h1, h2, h3, h5, hG]

/-- SPEC §3(c), centred box, over the kernel's masses: `p` a tilt of `p̂`, `|δ_j − c_j| ≤ ε_j`,
`p̂_j ≤ e^{2Ξ} p̃_j` and `p̃_j ≤ e^{2Ξ} p̂_j` (`Ξ ≥ 0`, `p̃ ≥ 0`); for any finite cover of `[0, 1]`
by intervals with nonnegative ends and any `λ_i ≥ 0`, `TV(p, p̂) ≤ B` when `G(lo i, λ_i) ≤ B` and
`G(hi i, λ_i) ≤ B` for every `i`, `G = gridBound ptilde c eps Ξ`. -/
theorem tilt_tv_le_grid_rescaled {phat delta p ptilde : ι → ℝ} (ht : IsTilt phat delta p)
    (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (Xi : ℝ) (hXi : 0 ≤ Xi)
    (hpt : ∀ j, 0 ≤ ptilde j)
    (hratio_up : ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j)
    (hratio_dn : ∀ j, ptilde j ≤ Real.exp (2 * Xi) * phat j)
    {κ : Type*} (lo hi lam : κ → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hlo0 : ∀ i, 0 ≤ lo i) (hhi0 : ∀ i, 0 ≤ hi i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hBlo : ∀ i, gridBound ptilde c eps Xi (lo i) (lam i) ≤ B)
    (hBhi : ∀ i, gridBound ptilde c eps Xi (hi i) (lam i) ≤ B) :
    tv p phat ≤ B := by
  -- `IsTilt.sum_one : ∑ j, phat j = 1` (a field, TiltTV.lean); `LE.le.trans`: alias of `le_trans`,
  -- Order/Basic.lean:135
  have hlo : ∀ i, lo i - dualDBox phat c eps (lo i) (lam i) ≤ B := fun i =>
    (sub_dualDBox_le_gridBound c eps Xi (lo i) (lam i) ht.sum_one hpt hXi
      hratio_up hratio_dn (hlo0 i)).trans (hBlo i)
  have hhi : ∀ i, hi i - dualDBox phat c eps (hi i) (lam i) ≤ B := fun i =>
    (sub_dualDBox_le_gridBound c eps Xi (hi i) (lam i) ht.sum_one hpt hXi
      hratio_up hratio_dn (hhi0 i)).trans (hBhi i)
  exact tilt_tv_le_dual_grid_box_endpoints ht c eps heps lo hi lam hlam hcover B hlo hhi

/-- `λ = 0`: `D(t, 0) = 0`, so `t − D(t, 0) = t` (an interval's cap: its right end). -/
lemma sub_dualDBox_zero (phat c eps : ι → ℝ) (t : ℝ) : t - dualDBox phat c eps t 0 = t := by
  have hterm : ∀ j ∈ (Finset.univ : Finset ι),
      phat j * max ((0 : ℝ) * betaBox t (c j) (eps j) - 1) 0 = 0 := by
    intro j _
    have hneg : (0 : ℝ) * betaBox t (c j) (eps j) - 1 ≤ 0 := by
      -- `zero_mul (a) : 0 * a = 0`: `MulZeroClass.zero_mul`, exported, Algebra/GroupWithZero/Defs.lean:39, :43
      have h0 : (0 : ℝ) * betaBox t (c j) (eps j) = 0 := zero_mul _
      linarith [h0]
    -- `max_eq_right (h : a ≤ b) : max a b = b`: dual of `min_eq_right`, Order/Defs/LinearOrder.lean:169
    have hm : max ((0 : ℝ) * betaBox t (c j) (eps j) - 1) 0 = 0 := max_eq_right hneg
    -- `mul_zero (a) : a * 0 = 0`: `MulZeroClass.mul_zero`, exported, Algebra/GroupWithZero/Defs.lean:43
    calc phat j * max ((0 : ℝ) * betaBox t (c j) (eps j) - 1) 0 = phat j * 0 := by rw [hm]
      _ = 0 := mul_zero _
  -- `Finset.sum_eq_zero (h : ∀ i ∈ s, f i = 0) : ∑ i ∈ s, f i = 0`: additive form of `Finset.prod_eq_one`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:108
  have hs : ∑ j, phat j * max ((0 : ℝ) * betaBox t (c j) (eps j) - 1) 0 = 0 :=
    Finset.sum_eq_zero hterm
  -- `dualDBox` by its definition (`rfl`), instead of `unfold` + `rw`
  have hD : dualDBox phat c eps t 0 = 0 * t * (∑ j, phat j * Real.exp (-c j - eps j))
      - ∑ j, phat j * max ((0 : ℝ) * betaBox t (c j) (eps j) - 1) 0 := rfl
  linarith [hD, hs]

/-- The merge's form (``kernels.excess_grid._grid_form``): as `tilt_tv_le_grid_rescaled`, but an interval may take
its cap instead (`λ_i = 0`, whose end values are `t` itself by `sub_dualDBox_zero`: `B ≥ hi i ≥ lo i`), so each
interval `i` has either `λ_i = 0 ∧ hi i ≤ B` or both ends `G(·, λ_i) ≤ B`. -/
theorem tilt_tv_le_grid_rescaled_capped {phat delta p ptilde : ι → ℝ} (ht : IsTilt phat delta p)
    (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (Xi : ℝ) (hXi : 0 ≤ Xi)
    (hpt : ∀ j, 0 ≤ ptilde j)
    (hratio_up : ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j)
    (hratio_dn : ∀ j, ptilde j ≤ Real.exp (2 * Xi) * phat j)
    {κ : Type*} (lo hi lam : κ → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hlo0 : ∀ i, 0 ≤ lo i) (hhi0 : ∀ i, 0 ≤ hi i) (hlohi : ∀ i, lo i ≤ hi i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i) (B : ℝ)
    (hB : ∀ i, (lam i = 0 ∧ hi i ≤ B) ∨
      (gridBound ptilde c eps Xi (lo i) (lam i) ≤ B ∧ gridBound ptilde c eps Xi (hi i) (lam i) ≤ B)) :
    tv p phat ≤ B := by
  have hlo : ∀ i, lo i - dualDBox phat c eps (lo i) (lam i) ≤ B := by
    intro i
    rcases hB i with ⟨h0, hcap⟩ | ⟨g1, _⟩
    · have hz : lo i - dualDBox phat c eps (lo i) 0 = lo i := sub_dualDBox_zero phat c eps (lo i)
      rw [h0]
      linarith [hz, hlohi i, hcap]
    · exact (sub_dualDBox_le_gridBound c eps Xi (lo i) (lam i) ht.sum_one hpt hXi hratio_up hratio_dn
        (hlo0 i)).trans g1
  have hhi : ∀ i, hi i - dualDBox phat c eps (hi i) (lam i) ≤ B := by
    intro i
    rcases hB i with ⟨h0, hcap⟩ | ⟨_, g2⟩
    · have hz : hi i - dualDBox phat c eps (hi i) 0 = hi i := sub_dualDBox_zero phat c eps (hi i)
      rw [h0]
      linarith [hz, hcap]
    · exact (sub_dualDBox_le_gridBound c eps Xi (hi i) (lam i) ht.sum_one hpt hXi hratio_up hratio_dn
        (hhi0 i)).trans g2
  exact tilt_tv_le_dual_grid_box_endpoints ht c eps heps lo hi lam hlam hcover B hlo hhi

end Grid

end WitCert

/-
Likely failure points (NOT compiled: no Lean toolchain on the drafting or the reviewing machine).

Reviewed (helper pass) against the pinned Mathlib 401ee04251 (read at that commit, not built). Verified there,
name, explicit / implicit arguments and argument order:
  `nonneg_of_mul_nonneg_right [PosMulStrictMono R] (h : 0 ≤ a * b) (ha : 0 < a) : 0 ≤ b`
    Algebra/Order/Ring/Unbundled/Basic.lean:429;
  `abs_le : |a| ≤ b ↔ -b ≤ a ∧ a ≤ b` (additive `mabs_le`) Algebra/Order/Group/Abs.lean:64;
  `abs_add_le (a b)` (additive `mabs_mul_le`) Algebra/Order/Group/Unbundled/Abs.lean:125;
  `abs_of_pos` (additive `mabs_of_one_lt`) same file :93; `le_abs_self (a)` :69; `abs_nonneg (a)` :109;
  `abs_mul (a b)` Algebra/Order/Ring/Abs.lean:49;
  `mul_le_mul_of_nonneg_left (hbc : b ≤ c) (ha : 0 ≤ a) : a * b ≤ a * c`, `mul_le_mul_of_nonneg_right … :
    b * a ≤ c * a` Algebra/Order/GroupWithZero/Unbundled/Defs.lean:224, :228;
  `mul_nonneg` (alias of `Left.mul_nonneg`) Algebra/Order/GroupWithZero/Unbundled/Basic.lean:68;
  `add_nonneg` (additive `one_le_mul`) Algebra/Order/Monoid/Unbundled/Basic.lean:975;
  `sub_nonneg` (additive `one_le_div'`) Algebra/Order/Group/Unbundled/Basic.lean:479;
  `sq_nonneg (a) : 0 ≤ a ^ 2` Algebra/Order/Ring/Unbundled/Basic.lean:689;
  `LE.le.trans_eq` Order/Basic.lean:80; `le_max_right (a b)`, `max_eq_right (h : a ≤ b)` (duals of
    `min_le_right`, `min_eq_right`) Order/Defs/LinearOrder.lean:144, :169;
  `zero_mul`, `mul_zero` (`MulZeroClass`, exported) Algebra/GroupWithZero/Defs.lean:39, :43;
  `mul_one (a)` Algebra/Group/Defs.lean:380;
  `Real.exp_pos (x)`, `Real.one_le_exp {x} (hx : 0 ≤ x)` Analysis/Complex/Exponential.lean:281, :278;
  `Finset.sum_congr` (additive `prod_congr`) Algebra/BigOperators/Group/Finset/Basic.lean:104;
  `Finset.sum_eq_zero` (additive `prod_eq_one`) same file :108;
  `Finset.sum_add_distrib` (`f g` implicit; additive `prod_mul_distrib`) same file :301;
  `Finset.sum_sub_distrib (f g)` (explicit; additive `prod_div_distrib`) Algebra/BigOperators/Group/Finset/Defs.lean:659;
  `Finset.mul_sum (s f a) : a * ∑ i ∈ s, f i = ∑ i ∈ s, a * f i` Algebra/BigOperators/Ring/Finset.lean:56;
  `Finset.sum_le_sum` (additive `prod_le_prod'`, `f g s` implicit) Algebra/Order/BigOperators/Group/Finset.lean:109;
  `∑ x, body` parses its body at precedence 67 (so `∑ j, a j - ∑ j, b j` is a difference of two sums)
    Algebra/BigOperators/Group/Finset/Defs.lean:179;
  `linarith` multiplies products out into monomials over atoms (Tactic/Linarith/Parsing.lean:167) and splits an
    equality goal into two inequalities (Tactic/Linarith/Frontend.lean:351).
Project definitions read: `betaBox`, `dualDBox`, `tilt_tv_le_dual_grid_box_endpoints` (TiltBox.lean:43, :47, :279),
`IsTilt` and its field `sum_one` (TiltTV.lean:83).

Hardened in this pass: no `unfold`; `gridTerm`, `dualDBox` and `gridBound` are restated by `rfl` equations fed to
`rw` (own `gridTerm` equation only) or to `linarith`; `rw [hsum] at h` replaced by `t * Σ p̂ = t` for `linarith`;
`abs_mul` / `abs_of_pos` used as terms (no `rw` through `|·|` instances); the two `abs_le.mpr` conjuncts stated
with their types; the two cover theorems build `hBlo` / `hBhi` as named `have`s before the final `exact` (no
`apply` goal order); `sub_dualDBox_zero` by `Finset.sum_eq_zero` and `linarith`.

What remains risky (by decreasing likelihood):
1. `rw [Finset.mul_sum]` (`s3`, `s4`, `s2`, and h4's `s3`, `s4`): it must rewrite the right side's `a * ∑` (the
   closed subterms `t * lam`, `t * |lam - 1|`, `2 * Xi` met first are rejected as their right factor is no sum), then
   close by `rfl`; the same idiom as Excess.lean's `hfac` (also not compiled).
2. `rw [Finset.sum_add_distrib]` / `rw [Finset.sum_sub_distrib]`: higher-order pattern `?f i + ?g i` against the
   written-out summands, then `rfl` against the stated right side (the `Finset.sum` / `HAdd` instances of ℝ unified
   at instance transparency, as everywhere in Mathlib).
3. The final `linarith` of `sub_dualDBox_le_gridBound`: five hypotheses, monomials up to degree 4 (e.g.
   `e^{2Ξ} t |λ − 1| Σ p̃ b`); each must be the same product in `hG`, `h3`, `h5` (checked by hand: they are).
4. `Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left … (hpt j)` against the stated `hle` (as in TiltBox).
5. `sub_dualDBox_zero`'s `hD` by `rfl`: `dualDBox`'s body at `lam = 0` must be syntactically the literal `0 : ℝ`
   (only needed up to defeq, which `rfl` checks).
6. `[DecidableEq ι]` is unused in several lemmas of section `Grid` (linter warning only).
-/
