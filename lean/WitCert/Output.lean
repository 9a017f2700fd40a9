import WitCert.TiltTV

/-!
# Output bound (SPEC §4)

`‖ô − o‖ ≤ TV⁺ · (D_v + φ_max) + Σ_j p̂_j φ_j` with `D_v = 2 ν_max`, `ν_max ≥ max_j ‖v̂_j‖`,
`φ_j ≥ ‖v̂_j − v_j‖`, for any `TV⁺ ≥ TV(p, p̂)` and any two distributions `p`, `p̂`.
Derivation: `ô − o = Σ (p̂_j − p_j) v̂_j + Σ p_j (v̂_j − v_j)`.

(SPEC §4 allows any `D_v ≥ diam{v̂_j}`; what `witcert.bounds.output_error_bound`,
`witcert/cache.py` and `kernels/epilogue.py` (`out_bound`: `tv · (2 ν_max + φ_max) + Σ p̂ φ`)
compute is the instance `D_v = 2 ν_max` proved here.)

* `output_error_le` — SPEC §9.
* `output_error_stored_le` — the served output is the computed one stored in a narrower float (a bf16 / fp16 output
  buffer, a cast to the model's dtype): its error is the computed one's plus the store's, `rel · ‖ô‖ + c`
  (`contract.constants.STORE_ROUNDING`: per element `|s_i − ô_i| ≤ rel · |ô_i| + abs`, so by Minkowski
  `‖s − ô‖₂ ≤ rel · ‖ô‖₂ + abs · √D` — the hypothesis `hs`, with `c = abs · √D`).
-/

namespace WitCert

open Finset

variable {ι : Type*} [Fintype ι] [DecidableEq ι] {E : Type*} [NormedAddCommGroup E]
  [NormedSpace ℝ E]

/-- SPEC §4: the output error bound. -/
theorem output_error_le (p phat : ι → ℝ) (hp0 : ∀ j, 0 ≤ p j)
    (hsum : ∑ j, p j = ∑ j, phat j)
    (v vhat : ι → E) (phi : ι → ℝ) (hphi : ∀ j, ‖vhat j - v j‖ ≤ phi j)
    (phi_max nu_max : ℝ) (hphimax : ∀ j, phi j ≤ phi_max) (hnu : ∀ j, ‖vhat j‖ ≤ nu_max)
    (hnu0 : 0 ≤ nu_max) (hphimax0 : 0 ≤ phi_max)
    (tv_up D_v pphi : ℝ) (htv : tv p phat ≤ tv_up) (hD : D_v = 2 * nu_max)
    (hpphi : pphi = ∑ j, phat j * phi j)
    (o o_hat : E) (ho : o = ∑ j, p j • v j) (hohat : o_hat = ∑ j, phat j • vhat j) :
    ‖o_hat - o‖ ≤ tv_up * (D_v + phi_max) + pphi := by
  subst ho hohat hD hpphi
  have hphi0 : ∀ j, 0 ≤ phi j := fun j => (norm_nonneg _).trans (hphi j)
  have hdecomp : (∑ j, phat j • vhat j) - ∑ j, p j • v j
      = ∑ j, (phat j - p j) • vhat j + ∑ j, p j • (vhat j - v j) := by
    rw [← Finset.sum_sub_distrib, ← Finset.sum_add_distrib]
    refine Finset.sum_congr rfl fun j _ => ?_
    rw [sub_smul, smul_sub]
    abel
  rw [hdecomp]
  have hT0 : 0 ≤ tv p phat := by
    unfold tv
    exact div_nonneg (Finset.sum_nonneg fun j _ => abs_nonneg _) (by norm_num)
  have h1 : ‖∑ j, (phat j - p j) • vhat j‖ ≤ tv p phat * (2 * nu_max) := by
    calc ‖∑ j, (phat j - p j) • vhat j‖ ≤ ∑ j, ‖(phat j - p j) • vhat j‖ := norm_sum_le _ _
      _ = ∑ j, |p j - phat j| * ‖vhat j‖ := by
          refine Finset.sum_congr rfl fun j _ => ?_
          rw [norm_smul, Real.norm_eq_abs, abs_sub_comm]
      _ ≤ ∑ j, |p j - phat j| * nu_max :=
          Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left (hnu j) (abs_nonneg _)
      _ = tv p phat * (2 * nu_max) := by
          rw [← Finset.sum_mul]; unfold tv; ring
  have h2 : ‖∑ j, p j • (vhat j - v j)‖ ≤ ∑ j, p j * phi j := by
    calc ‖∑ j, p j • (vhat j - v j)‖ ≤ ∑ j, ‖p j • (vhat j - v j)‖ := norm_sum_le _ _
      _ ≤ ∑ j, p j * phi j := Finset.sum_le_sum fun j _ => by
          rw [norm_smul, Real.norm_eq_abs, abs_of_nonneg (hp0 j)]
          exact mul_le_mul_of_nonneg_left (hphi j) (hp0 j)
  have h3 : ∑ j, p j * phi j ≤ ∑ j, phat j * phi j + tv p phat * phi_max := by
    rw [tv_eq_sum_pos p phat hsum]
    have hj : ∀ j, p j * phi j ≤ phat j * phi j + max (p j - phat j) 0 * phi_max := by
      intro j
      have hm : p j - phat j ≤ max (p j - phat j) 0 := le_max_left _ _
      have hm0 : 0 ≤ max (p j - phat j) 0 := le_max_right _ _
      -- `mul_le_mul` (alias of `mul_le_mul_of_nonneg'`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:314, :350)
      have h : (p j - phat j) * phi j ≤ max (p j - phat j) 0 * phi_max :=
        mul_le_mul hm (hphimax j) (hphi0 j) hm0
      have e : p j * phi j = phat j * phi j + (p j - phat j) * phi j := by ring
      rw [e]
      linarith
    calc ∑ j, p j * phi j ≤ ∑ j, (phat j * phi j + max (p j - phat j) 0 * phi_max) :=
          Finset.sum_le_sum fun j _ => hj j
      _ = ∑ j, phat j * phi j + (∑ j, max (p j - phat j) 0) * phi_max := by
          rw [Finset.sum_add_distrib, Finset.sum_mul]
  have h4 : tv p phat * (2 * nu_max + phi_max) ≤ tv_up * (2 * nu_max + phi_max) :=
    mul_le_mul_of_nonneg_right htv (by linarith)
  calc ‖∑ j, (phat j - p j) • vhat j + ∑ j, p j • (vhat j - v j)‖
      ≤ ‖∑ j, (phat j - p j) • vhat j‖ + ‖∑ j, p j • (vhat j - v j)‖ := norm_add_le _ _
    _ ≤ tv_up * (2 * nu_max + phi_max) + ∑ j, phat j * phi j := by
        -- `h1 + h2 + h3 + h4`: linear in the monomials `tv · ν`, `tv · φ_max`, `tv⁺ · ν`, `tv⁺ · φ_max`
        have e1 : tv p phat * (2 * nu_max) + tv p phat * phi_max
            = tv p phat * (2 * nu_max + phi_max) := by ring
        linarith [h1, h2, h3, h4, e1]

/-- The served output `s` is the computed `o_hat` stored in a narrower float: if the computed output is within `err` of
exact attention and the store moves it by at most `rel · ‖o_hat‖ + c`, the served output is within
`err + rel · ‖o_hat‖ + c` (`witcert.bounds.stored_output_error_bound`; the kernels' `STORE_REL` / `STORE_ABS`). -/
theorem output_error_stored_le (o o_hat s : E) (err rel c : ℝ)
    (herr : ‖o_hat - o‖ ≤ err) (hs : ‖s - o_hat‖ ≤ rel * ‖o_hat‖ + c) :
    ‖s - o‖ ≤ err + rel * ‖o_hat‖ + c := by
  -- `norm_sub_le_norm_sub_add_norm_sub` (to_additive of `norm_div_le_norm_div_add_norm_div`:
  -- Mathlib/Analysis/Normed/Group/Basic.lean:116)
  have h := norm_sub_le_norm_sub_add_norm_sub s o_hat o
  linarith

end WitCert
