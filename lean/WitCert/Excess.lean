import Mathlib
import WitCert.TiltBox

/-!
# The excess form of the centred box (SPEC §3(c), centred; the kernel's two excess sums)

`tilt_tv_le_dual_grid_box_endpoints` with the one-interval cover `[0, 1]` and `λ = 1` needs no grid
and no multipliers: its two end values are sums over the tokens, linear in `p̂`,

* `t = 0`: `0 − D(0, 1) = A = Σ_j p̂_j (e^{−c_j+ε_j} − 1)₊` (`betaBox 0 c ε = e^{−c+ε}`);
* `t = 1`: `1 − D(1, 1) = Σ p̂ − m + Σ_j p̂_j (e^{−c_j−ε_j} − 1)₊ = B = Σ_j p̂_j (1 − e^{−c_j−ε_j})₊`
  (`Σ p̂ = 1`, `IsTilt.sum_one`, and `(1 − b) + (b − 1)₊ = (1 − b)₊`, `one_sub_add_max_sub_one`).

* `tilt_tv_le_excess` — `|δ_j − c_j| ≤ ε_j`: `TV(p, p̂) ≤ max(A, B)`;
* `excess_widen_up`, `excess_widen_down` — a box widened by `Ξ ≥ 0`, term by term:
  `(e^{x+Ξ} − 1)₊ ≤ e^Ξ (e^x − 1)₊ + (e^Ξ − 1)` and `(1 − e^{x−Ξ})₊ ≤ (1 − e^x)₊ + (1 − e^{−Ξ})`;
* `tilt_tv_le_excess_widened` — `p` a tilt of `p̃` by `δ'` with
  `|δ'_j − c_j| ≤ ε_j + Ξ` (the Ξ argument of `FloatTV.lean`: `δ' = δ − ξ`, `tilt_rebase`), the sums
  `A`, `B` over `p̃` at the radii `ε` (not `ε + Ξ`): `TV(p, p̃) ≤ max(e^Ξ A + (e^Ξ − 1), B + (1 − e^{−Ξ}))`.
  No hypothesis beyond `IsTilt`: it gives `p̃ > 0` and `Σ p̃ = 1`. Still true, but no longer used by the
  kernel (its form is now `tilt_tv_le_excess_rescaled`'s).
* `le_exp_two_mul_of_log_ratio` — `p̂, p̃ > 0`, each summing to 1, with `|log(p̃_j / p̂_j) − C| ≤ Ξ` for one
  constant `C` (SPEC §7's Ξ: the kernel's masses `p̃` against the exact-arithmetic served distribution
  `p̂`): `p̂_j ≤ e^{2Ξ} p̃_j` (summing `p̃ ≤ e^{C+Ξ} p̂` gives `C + Ξ ≥ 0`, and `p̂ ≤ e^{Ξ−C} p̃`).
* `tilt_tv_le_excess_rescaled` — the kernel's form: `p` a tilt of `p̂`, `|δ_j − c_j| ≤ ε_j`, and
  `p̂ ≤ e^{2Ξ} p̃` term by term: the two sums over `p̃`, scaled by `e^{2Ξ}`, bound `TV(p, p̂)` itself,
  `TV(p, p̂) ≤ e^{2Ξ} max(Σ_j p̃_j (e^{−c_j+ε_j} − 1)₊, Σ_j p̃_j (1 − e^{−c_j−ε_j})₊)`, with no
  `tanh(Ξ/2)` and no additive `e^Ξ − 1`.

Licenses the centred box's excess form: `kernels/decode_meter._excess_tile` (accumulates `A`, `B` over
`p̃` with each (token, head)'s box, its `ε` raised by the tile's rounding allowance `μ`),
`kernels/epilogue_jit._excess_form` and its torch twin `kernels/epilogue.excess_form_torch`
(`e^{2Ξ} max(Â, B̂)` with `e^{2Ξ}` rounded up and `Â`, `B̂` raised for their fp32 accumulation, so it is at
least this file's `tilt_tv_le_excess_rescaled` bound; that comparison is not stated here), a bound of
`TV(p, p̂)` to which `_tv_row` / `meter_epilogue` add only `ρ` (the lost masses,
`tv_le_restrict_add_lost_of_nonneg`), not `tanh(Ξ/2)`.
-/

namespace WitCert

section Pointwise

/-- `(1 − b) + (b − 1)₊ = (1 − b)₊`. -/
lemma one_sub_add_max_sub_one (b : ℝ) : (1 - b) + max (b - 1) 0 = max (1 - b) 0 := by
  -- `le_total`: Order/Defs/LinearOrder.lean:89
  rcases le_total b 1 with h | h
  · -- `max_eq_right` / `max_eq_left`: duals of `min_eq_right` / `min_eq_left`,
    -- Order/Defs/LinearOrder.lean:169, :166; `sub_nonpos` / `sub_nonneg`: additive forms of
    -- `div_le_one'` / `one_le_div'`, Algebra/Order/Group/Unbundled/Basic.lean:486, :480;
    -- `add_zero`: additive form of `mul_one`, Algebra/Group/Defs.lean:380
    rw [max_eq_right (sub_nonpos.mpr h), max_eq_left (sub_nonneg.mpr h), add_zero]
  · rw [max_eq_left (sub_nonneg.mpr h), max_eq_right (sub_nonpos.mpr h)]
    ring

/-- The top of a box widened by `Ξ ≥ 0`: `(e^{x+Ξ} − 1)₊ ≤ e^Ξ (e^x − 1)₊ + (e^Ξ − 1)`. -/
lemma excess_widen_up (x Xi : ℝ) (hXi : 0 ≤ Xi) :
    max (Real.exp (x + Xi) - 1) 0 ≤ Real.exp Xi * max (Real.exp x - 1) 0 + (Real.exp Xi - 1) := by
  -- `Real.exp_add`: Analysis/Complex/Exponential.lean:207
  have hmul : Real.exp (x + Xi) = Real.exp x * Real.exp Xi := Real.exp_add x Xi
  -- `Real.one_le_exp`: Analysis/Complex/Exponential.lean:278; `Real.exp_pos`: same file, :281
  have hE : 1 ≤ Real.exp Xi := Real.one_le_exp hXi
  -- `le_max_right`: dual of `min_le_right`, Order/Defs/LinearOrder.lean:144 (`le_max_left`: :141)
  have hM : 0 ≤ max (Real.exp x - 1) 0 := le_max_right _ _
  -- `mul_le_mul_of_nonneg_left`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:224
  have h1 : Real.exp Xi * (Real.exp x - 1) ≤ Real.exp Xi * max (Real.exp x - 1) 0 :=
    mul_le_mul_of_nonneg_left (le_max_left _ _) (Real.exp_pos Xi).le
  -- `mul_nonneg`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:68
  have h0 : 0 ≤ Real.exp Xi * max (Real.exp x - 1) 0 := mul_nonneg (Real.exp_pos Xi).le hM
  have hid : Real.exp Xi * (Real.exp x - 1) = Real.exp x * Real.exp Xi - Real.exp Xi := by ring
  -- `max_le`: dual of `le_min`, Order/Defs/LinearOrder.lean:147
  apply max_le
  · rw [hmul]; linarith
  · linarith

/-- The bottom of a box widened by `Ξ ≥ 0`: `(1 − e^{x−Ξ})₊ ≤ (1 − e^x)₊ + (1 − e^{−Ξ})`. -/
lemma excess_widen_down (x Xi : ℝ) (hXi : 0 ≤ Xi) :
    max (1 - Real.exp (x - Xi)) 0 ≤ max (1 - Real.exp x) 0 + (1 - Real.exp (-Xi)) := by
  -- `sub_eq_add_neg`: additive form of `div_eq_mul_inv`, Algebra/Group/Defs.lean:1047
  have hmul : Real.exp (x - Xi) = Real.exp x * Real.exp (-Xi) := by
    rw [sub_eq_add_neg, Real.exp_add]
  have hu0 : 0 < Real.exp (-Xi) := Real.exp_pos (-Xi)
  -- `Real.exp_le_one_iff`: Analysis/Complex/Exponential.lean:340
  have hu1 : Real.exp (-Xi) ≤ 1 := Real.exp_le_one_iff.mpr (by linarith)
  have hM : 0 ≤ max (1 - Real.exp x) 0 := le_max_right _ _
  have h1 : Real.exp (-Xi) * (1 - Real.exp x) ≤ Real.exp (-Xi) * max (1 - Real.exp x) 0 :=
    mul_le_mul_of_nonneg_left (le_max_left _ _) hu0.le
  -- `mul_le_mul_of_nonneg_right`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:228
  have h2 : Real.exp (-Xi) * max (1 - Real.exp x) 0 ≤ 1 * max (1 - Real.exp x) 0 :=
    mul_le_mul_of_nonneg_right hu1 hM
  have hid : Real.exp (-Xi) * (1 - Real.exp x) = Real.exp (-Xi) - Real.exp x * Real.exp (-Xi) := by ring
  apply max_le
  · rw [hmul]; linarith
  · linarith

/-- `betaBox` at `t = 0`: the top of the box. -/
lemma betaBox_zero (c x : ℝ) : betaBox 0 c x = Real.exp (-c + x) := by
  unfold betaBox
  ring

/-- `betaBox` at `t = 1`: the bottom of the box. -/
lemma betaBox_one (c x : ℝ) : betaBox 1 c x = Real.exp (-c - x) := by
  unfold betaBox
  ring

end Pointwise

section Excess

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- The end `t = 0` of the one-interval cover: `0 − D(0, 1) = Σ_j p̂_j (e^{−c_j+ε_j} − 1)₊`. -/
lemma zero_sub_dualDBox_zero_one (phat c eps : ι → ℝ) :
    0 - dualDBox phat c eps 0 1 = ∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0 := by
  -- `Finset.sum_congr`: additive form of `Finset.prod_congr`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:104; `one_mul`: Algebra/Group/Defs.lean:376
  have e : ∑ j, phat j * max (1 * betaBox 0 (c j) (eps j) - 1) 0
      = ∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0 :=
    Finset.sum_congr rfl fun j _ => by rw [betaBox_zero, one_mul]
  unfold dualDBox
  rw [e]
  ring

/-- The end `t = 1` of the one-interval cover: `1 − D(1, 1) = Σ_j p̂_j (1 − e^{−c_j−ε_j})₊` when
`Σ p̂ = 1`. -/
lemma one_sub_dualDBox_one_one (phat c eps : ι → ℝ) (hsum : ∑ j, phat j = 1) :
    1 - dualDBox phat c eps 1 1 = ∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0 := by
  have e1 : ∑ j, phat j * max (1 * betaBox 1 (c j) (eps j) - 1) 0
      = ∑ j, phat j * max (Real.exp (-c j - eps j) - 1) 0 :=
    Finset.sum_congr rfl fun j _ => by rw [betaBox_one, one_mul]
  have e2 : ∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0
      = ∑ j, phat j - ∑ j, phat j * Real.exp (-c j - eps j)
        + ∑ j, phat j * max (Real.exp (-c j - eps j) - 1) 0 := by
    -- `Finset.sum_sub_distrib`: additive form of `Finset.prod_div_distrib`,
    -- Algebra/BigOperators/Group/Finset/Defs.lean:659; `Finset.sum_add_distrib`: additive form of
    -- `Finset.prod_mul_distrib`, Algebra/BigOperators/Group/Finset/Basic.lean:301
    rw [← Finset.sum_sub_distrib, ← Finset.sum_add_distrib]
    refine Finset.sum_congr rfl fun j _ => ?_
    rw [← one_sub_add_max_sub_one (Real.exp (-c j - eps j))]
    ring
  unfold dualDBox
  rw [e1, e2, hsum]
  ring

/-- SPEC §3(c), centred box, the excess form: `|δ_j − c_j| ≤ ε_j` gives
`TV(p, p̂) ≤ max(Σ_j p̂_j (e^{−c_j+ε_j} − 1)₊, Σ_j p̂_j (1 − e^{−c_j−ε_j})₊)` (the endpoint bound on the
cover `[0, 1]` with `λ = 1`). -/
theorem tilt_tv_le_excess {phat delta p : ι → ℝ} (ht : IsTilt phat delta p) (c eps : ι → ℝ)
    (heps : ∀ j, |delta j - c j| ≤ eps j) :
    tv p phat ≤ max (∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0)
      (∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0) := by
  have hlo := zero_sub_dualDBox_zero_one phat c eps
  have hhi := one_sub_dualDBox_one_one phat c eps ht.sum_one
  -- `zero_le_one`: Algebra/Order/ZeroLEOne.lean:28; `le_of_eq`: Order/Defs/PartialOrder.lean:83;
  -- `LE.le.trans`: alias of `le_trans`, Order/Basic.lean:135
  exact tilt_tv_le_dual_grid_box_endpoints ht c eps heps (fun _ : Unit => (0 : ℝ))
    (fun _ : Unit => (1 : ℝ)) (fun _ : Unit => (1 : ℝ)) (fun _ => zero_le_one)
    (fun _ hx0 hx1 => ⟨(), hx0, hx1⟩)
    (max (∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0)
      (∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0))
    (fun _ => (le_of_eq hlo).trans (le_max_left _ _))
    (fun _ => (le_of_eq hhi).trans (le_max_right _ _))

/-- The kernel's form: `p` a tilt of `p̃` by `δ'` with `|δ'_j − c_j| ≤ ε_j + Ξ` (`Ξ ≥ 0`), the two sums
over `p̃` at the radii `ε`: `TV(p, p̃) ≤ max(e^Ξ A + (e^Ξ − 1), B + (1 − e^{−Ξ}))`. -/
theorem tilt_tv_le_excess_widened {ptilde delta' p : ι → ℝ} (ht : IsTilt ptilde delta' p)
    (c eps : ι → ℝ) (Xi : ℝ) (hXi : 0 ≤ Xi) (hbox : ∀ j, |delta' j - c j| ≤ eps j + Xi) :
    tv p ptilde ≤ max
      (Real.exp Xi * (∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0) + (Real.exp Xi - 1))
      ((∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0) + (1 - Real.exp (-Xi))) := by
  have hp : ∀ j, 0 ≤ ptilde j := fun j => (ht.pos j).le
  -- `tilt_tv_le_excess` at the radii `ε + Ξ`
  have h1 : tv p ptilde ≤ max (∑ j, ptilde j * max (Real.exp (-c j + (eps j + Xi)) - 1) 0)
      (∑ j, ptilde j * max (1 - Real.exp (-c j - (eps j + Xi))) 0) :=
    tilt_tv_le_excess ht c (fun j => eps j + Xi) hbox
  -- the top sum, term by term (`Finset.sum_le_sum`: Algebra/Order/BigOperators/Group/Finset.lean:108;
  -- `Finset.mul_sum`: Algebra/BigOperators/Ring/Finset.lean:56)
  have hA : ∑ j, ptilde j * max (Real.exp (-c j + (eps j + Xi)) - 1) 0
      ≤ Real.exp Xi * (∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0) + (Real.exp Xi - 1) := by
    have hterm : ∀ j ∈ (Finset.univ : Finset ι),
        ptilde j * max (Real.exp (-c j + (eps j + Xi)) - 1) 0
          ≤ ptilde j * (Real.exp Xi * max (Real.exp (-c j + eps j) - 1) 0 + (Real.exp Xi - 1)) := by
      intro j _
      have hx : -c j + (eps j + Xi) = -c j + eps j + Xi := by ring
      rw [hx]
      exact mul_le_mul_of_nonneg_left (excess_widen_up (-c j + eps j) Xi hXi) (hp j)
    have hsum : ∑ j, ptilde j * (Real.exp Xi * max (Real.exp (-c j + eps j) - 1) 0 + (Real.exp Xi - 1))
        = Real.exp Xi * (∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0)
          + (Real.exp Xi - 1) * ∑ j, ptilde j := by
      rw [Finset.mul_sum, Finset.mul_sum, ← Finset.sum_add_distrib]
      refine Finset.sum_congr rfl fun j _ => ?_
      ring
    have hone : (Real.exp Xi - 1) * ∑ j, ptilde j = Real.exp Xi - 1 := by
      rw [ht.sum_one, mul_one]
    have hle := Finset.sum_le_sum hterm
    linarith [hle, hsum, hone]
  -- the bottom sum, term by term
  have hB : ∑ j, ptilde j * max (1 - Real.exp (-c j - (eps j + Xi))) 0
      ≤ (∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0) + (1 - Real.exp (-Xi)) := by
    have hterm : ∀ j ∈ (Finset.univ : Finset ι),
        ptilde j * max (1 - Real.exp (-c j - (eps j + Xi))) 0
          ≤ ptilde j * (max (1 - Real.exp (-c j - eps j)) 0 + (1 - Real.exp (-Xi))) := by
      intro j _
      have hx : -c j - (eps j + Xi) = -c j - eps j - Xi := by ring
      rw [hx]
      exact mul_le_mul_of_nonneg_left (excess_widen_down (-c j - eps j) Xi hXi) (hp j)
    have hsum : ∑ j, ptilde j * (max (1 - Real.exp (-c j - eps j)) 0 + (1 - Real.exp (-Xi)))
        = (∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0)
          + (1 - Real.exp (-Xi)) * ∑ j, ptilde j := by
      rw [Finset.mul_sum, ← Finset.sum_add_distrib]
      refine Finset.sum_congr rfl fun j _ => ?_
      ring
    have hone : (1 - Real.exp (-Xi)) * ∑ j, ptilde j = 1 - Real.exp (-Xi) := by
      rw [ht.sum_one, mul_one]
    have hle := Finset.sum_le_sum hterm
    linarith [hle, hsum, hone]
  -- `max_le_max`: Order/MinMax.lean:63
  exact h1.trans (max_le_max hA hB)

/-- SPEC §7's Ξ as a bound on the masses' ratio: `p̂, p̃ > 0`, each summing to 1, with
`|log(p̃_j / p̂_j) − C| ≤ Ξ` for one constant `C`, give `p̂_j ≤ e^{2Ξ} p̃_j`. Summing `p̃_j ≤ e^{C+Ξ} p̂_j`
gives `1 ≤ e^{C+Ξ}`, so `C + Ξ ≥ 0`; then `p̂_j ≤ e^{Ξ−C} p̃_j ≤ e^{2Ξ} p̃_j`. -/
lemma le_exp_two_mul_of_log_ratio {phat ptilde : ι → ℝ} (hphat : ∀ j, 0 < phat j)
    (hptilde : ∀ j, 0 < ptilde j) (hsum : ∑ j, phat j = 1) (hsum' : ∑ j, ptilde j = 1)
    (C Xi : ℝ) (hlog : ∀ j, |Real.log (ptilde j / phat j) - C| ≤ Xi) :
    ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j := by
  -- per token: `e^{C−Ξ} p̂_j ≤ p̃_j ≤ e^{C+Ξ} p̂_j`
  have hbd : ∀ j, Real.exp (C - Xi) * phat j ≤ ptilde j ∧ ptilde j ≤ Real.exp (C + Xi) * phat j := by
    intro j
    -- `div_pos`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:868
    have hq : 0 < ptilde j / phat j := div_pos (hptilde j) (hphat j)
    -- `Real.exp_log`: Analysis/SpecialFunctions/Log/Basic.lean:58
    have he : Real.exp (Real.log (ptilde j / phat j)) = ptilde j / phat j := Real.exp_log hq
    -- `abs_le`: additive form of `mabs_le`, Algebra/Order/Group/Abs.lean:64
    have hr := abs_le.mp (hlog j)
    -- `Real.exp_le_exp`: Analysis/Complex/Exponential.lean:317
    have hlo : Real.exp (C - Xi) ≤ ptilde j / phat j :=
      calc Real.exp (C - Xi) ≤ Real.exp (Real.log (ptilde j / phat j)) :=
            Real.exp_le_exp.mpr (by linarith [hr.1])
        _ = ptilde j / phat j := he
    have hhi : ptilde j / phat j ≤ Real.exp (C + Xi) :=
      calc ptilde j / phat j = Real.exp (Real.log (ptilde j / phat j)) := he.symm
        _ ≤ Real.exp (C + Xi) := Real.exp_le_exp.mpr (by linarith [hr.2])
    -- `le_div_iff₀`, `div_le_iff₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1122, :1126
    exact ⟨(le_div_iff₀ (hphat j)).mp hlo, (div_le_iff₀ (hphat j)).mp hhi⟩
  -- summing the upper bounds: `1 = Σ p̃ ≤ e^{C+Ξ} Σ p̂ = e^{C+Ξ}`
  -- (`Finset.sum_le_sum`: Algebra/Order/BigOperators/Group/Finset.lean:108)
  have hsumle : ∑ j, ptilde j ≤ ∑ j, Real.exp (C + Xi) * phat j :=
    Finset.sum_le_sum fun j _ => (hbd j).2
  -- `Finset.mul_sum`: Algebra/BigOperators/Ring/Finset.lean:56
  have hfac : ∑ j, Real.exp (C + Xi) * phat j = Real.exp (C + Xi) * ∑ j, phat j := by
    rw [Finset.mul_sum]
  have h1 : 1 ≤ Real.exp (C + Xi) := by
    have h := hsumle
    -- `mul_one`: Algebra/Group/Defs.lean:380
    rw [hfac, hsum, hsum', mul_one] at h
    exact h
  -- `Real.one_le_exp_iff`: Analysis/Complex/Exponential.lean:344
  have hC : 0 ≤ C + Xi := Real.one_le_exp_iff.mp h1
  intro j
  -- `Real.exp_pos`: Analysis/Complex/Exponential.lean:281
  have hE : 0 ≤ Real.exp (2 * Xi) := (Real.exp_pos _).le
  -- `mul_le_mul_of_nonneg_left`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:224
  have h2 : Real.exp (2 * Xi) * (Real.exp (C - Xi) * phat j) ≤ Real.exp (2 * Xi) * ptilde j :=
    mul_le_mul_of_nonneg_left (hbd j).1 hE
  -- `Real.exp_add`: Analysis/Complex/Exponential.lean:207
  have h3 : Real.exp (2 * Xi) * (Real.exp (C - Xi) * phat j)
      = Real.exp (2 * Xi + (C - Xi)) * phat j := by
    rw [Real.exp_add (2 * Xi) (C - Xi)]
    ring
  -- `Real.one_le_exp`: Analysis/Complex/Exponential.lean:278
  have h4 : 1 ≤ Real.exp (2 * Xi + (C - Xi)) := Real.one_le_exp (by linarith)
  -- `mul_le_mul_of_nonneg_right`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:228
  have h5 : 1 * phat j ≤ Real.exp (2 * Xi + (C - Xi)) * phat j :=
    mul_le_mul_of_nonneg_right h4 (hphat j).le
  linarith [h2, h3, h5]

/-- The kernel's form: `p` a tilt of `p̂` with `|δ_j − c_j| ≤ ε_j`, and `p̂_j ≤ e^{2Ξ} p̃_j` for every
`j` (`le_exp_two_mul_of_log_ratio`, SPEC §7's Ξ): the two sums over the kernel's masses `p̃`, scaled by
`e^{2Ξ}`, bound `TV(p, p̂)` itself,
`TV(p, p̂) ≤ e^{2Ξ} max(Σ_j p̃_j (e^{−c_j+ε_j} − 1)₊, Σ_j p̃_j (1 − e^{−c_j−ε_j})₊)`. -/
theorem tilt_tv_le_excess_rescaled {phat delta p ptilde : ι → ℝ} (ht : IsTilt phat delta p)
    (c eps : ι → ℝ) (heps : ∀ j, |delta j - c j| ≤ eps j) (Xi : ℝ)
    (hratio : ∀ j, phat j ≤ Real.exp (2 * Xi) * ptilde j) :
    tv p phat ≤ Real.exp (2 * Xi) * max (∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0)
      (∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0) := by
  have hE : 0 ≤ Real.exp (2 * Xi) := (Real.exp_pos _).le
  have h1 := tilt_tv_le_excess ht c eps heps
  -- the top sum, term by term: `p̂_j f_j ≤ e^{2Ξ} p̃_j f_j` as `f_j ≥ 0`
  have hA : ∑ j, phat j * max (Real.exp (-c j + eps j) - 1) 0
      ≤ Real.exp (2 * Xi) * ∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0 := by
    have hterm : ∀ j ∈ (Finset.univ : Finset ι),
        phat j * max (Real.exp (-c j + eps j) - 1) 0
          ≤ Real.exp (2 * Xi) * (ptilde j * max (Real.exp (-c j + eps j) - 1) 0) := by
      intro j _
      have h : phat j * max (Real.exp (-c j + eps j) - 1) 0
          ≤ Real.exp (2 * Xi) * ptilde j * max (Real.exp (-c j + eps j) - 1) 0 :=
        mul_le_mul_of_nonneg_right (hratio j) (le_max_right _ _)
      -- `mul_assoc`: Algebra/Group/Defs.lean:190
      have e : Real.exp (2 * Xi) * ptilde j * max (Real.exp (-c j + eps j) - 1) 0
          = Real.exp (2 * Xi) * (ptilde j * max (Real.exp (-c j + eps j) - 1) 0) :=
        mul_assoc _ _ _
      rw [← e]
      exact h
    have hsum : ∑ j, Real.exp (2 * Xi) * (ptilde j * max (Real.exp (-c j + eps j) - 1) 0)
        = Real.exp (2 * Xi) * ∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0 := by
      rw [Finset.mul_sum]
    have hle := Finset.sum_le_sum hterm
    linarith [hle, hsum]
  -- the bottom sum, term by term
  have hB : ∑ j, phat j * max (1 - Real.exp (-c j - eps j)) 0
      ≤ Real.exp (2 * Xi) * ∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0 := by
    have hterm : ∀ j ∈ (Finset.univ : Finset ι),
        phat j * max (1 - Real.exp (-c j - eps j)) 0
          ≤ Real.exp (2 * Xi) * (ptilde j * max (1 - Real.exp (-c j - eps j)) 0) := by
      intro j _
      have h : phat j * max (1 - Real.exp (-c j - eps j)) 0
          ≤ Real.exp (2 * Xi) * ptilde j * max (1 - Real.exp (-c j - eps j)) 0 :=
        mul_le_mul_of_nonneg_right (hratio j) (le_max_right _ _)
      have e : Real.exp (2 * Xi) * ptilde j * max (1 - Real.exp (-c j - eps j)) 0
          = Real.exp (2 * Xi) * (ptilde j * max (1 - Real.exp (-c j - eps j)) 0) :=
        mul_assoc _ _ _
      rw [← e]
      exact h
    have hsum : ∑ j, Real.exp (2 * Xi) * (ptilde j * max (1 - Real.exp (-c j - eps j)) 0)
        = Real.exp (2 * Xi) * ∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0 := by
      rw [Finset.mul_sum]
    have hle := Finset.sum_le_sum hterm
    linarith [hle, hsum]
  -- `e^{2Ξ} ≥ 0` out of the max (`mul_max_of_nonneg`: Algebra/Order/Ring/Unbundled/Basic.lean:529)
  have hmax : max (Real.exp (2 * Xi) * ∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0)
        (Real.exp (2 * Xi) * ∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0)
      = Real.exp (2 * Xi) * max (∑ j, ptilde j * max (Real.exp (-c j + eps j) - 1) 0)
        (∑ j, ptilde j * max (1 - Real.exp (-c j - eps j)) 0) :=
    (mul_max_of_nonneg _ _ hE).symm
  -- `max_le_max`: Order/MinMax.lean:63
  exact (h1.trans (max_le_max hA hB)).trans (le_of_eq hmax)

end Excess

end WitCert
