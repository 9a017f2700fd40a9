import Mathlib

/-!
# Request budget (SPEC §5)

A request of `T` decode steps over `L` layers and `H` heads spends `δ_step` per (layer, head,
step). Both schedules sum to at most `δ_req` (union bound):

* fixed horizon `δ_step = δ_req / (L·H·T_max)` — exactly `δ_req` over `T_max` steps;
* anytime `δ_step(t) = δ_req · 6/(π² t²) / (L·H)` — at most `δ_req` for every horizon
  (`Σ 1/t² = π²/6`, Mathlib's `hasSum_zeta_two`).

* `request_budget_sound` — SPEC §9; `witcert.bounds.step_budget`, `witcert/cache.py`
  (`WitCertCache.delta_step`).
-/

namespace WitCert

open Finset

/-- Fixed-horizon per-(layer, head, step) budget. -/
noncomputable def budgetFixed (delta_req L H T_max : ℝ) : ℝ := delta_req / (L * H * T_max)

/-- Anytime per-(layer, head, step) budget at decode step `step ≥ 1`. -/
noncomputable def budgetAnytime (delta_req L H step : ℝ) : ℝ :=
  delta_req * 6 / (Real.pi ^ 2 * step ^ 2) / (L * H)

/-- SPEC §5: both schedules sum to at most `δ_req` over a request. -/
theorem request_budget_sound (delta_req : ℝ) (hδ : 0 ≤ delta_req) (L H T_max T : ℕ)
    (hL : 0 < L) (hH : 0 < H) (hT : 0 < T_max) :
    ∑ _t ∈ Finset.range T_max, (L : ℝ) * H * budgetFixed delta_req L H T_max = delta_req ∧
    ∑ t ∈ Finset.range T, (L : ℝ) * H * budgetAnytime delta_req L H ((t : ℝ) + 1) ≤ delta_req := by
  -- `Nat.cast_ne_zero`: Algebra/CharZero/Defs.lean:74
  have hL' : (L : ℝ) ≠ 0 := Nat.cast_ne_zero.mpr hL.ne'
  have hH' : (H : ℝ) ≠ 0 := Nat.cast_ne_zero.mpr hH.ne'
  have hT' : (T_max : ℝ) ≠ 0 := Nat.cast_ne_zero.mpr hT.ne'
  have hLH : (L : ℝ) * H ≠ 0 := mul_ne_zero hL' hH'
  have hLHT : (L : ℝ) * H * T_max ≠ 0 := mul_ne_zero hLH hT'
  constructor
  · rw [Finset.sum_const, Finset.card_range, nsmul_eq_mul]
    unfold budgetFixed
    calc (T_max : ℝ) * ((L : ℝ) * H * (delta_req / ((L : ℝ) * H * T_max)))
        = delta_req * (((L : ℝ) * H * T_max) * ((L : ℝ) * H * T_max)⁻¹) := by ring
      _ = delta_req := by rw [mul_inv_cancel₀ hLHT, mul_one]
  · have hterm : ∀ t ∈ Finset.range T, (L : ℝ) * H * budgetAnytime delta_req L H ((t : ℝ) + 1)
        = delta_req * 6 / Real.pi ^ 2 * (1 / ((t : ℝ) + 1) ^ 2) := by
      intro t _
      unfold budgetAnytime
      calc (L : ℝ) * H * (delta_req * 6 / (Real.pi ^ 2 * ((t : ℝ) + 1) ^ 2) / ((L : ℝ) * H))
          = delta_req * 6 / (Real.pi ^ 2 * ((t : ℝ) + 1) ^ 2) * (((L : ℝ) * H) * ((L : ℝ) * H)⁻¹) := by
            ring
        _ = delta_req * 6 / Real.pi ^ 2 * (1 / ((t : ℝ) + 1) ^ 2) := by
            rw [mul_inv_cancel₀ hLH, mul_one]; ring
    rw [Finset.sum_congr rfl hterm, ← Finset.mul_sum]
    have hz : ∑ t ∈ Finset.range T, (1 / ((t : ℝ) + 1) ^ 2) ≤ Real.pi ^ 2 / 6 := by
      -- `hasSum_zeta_two` (NumberTheory/ZetaValues.lean:457), `sum_le_hasSum` (additive form
      -- of Topology/Algebra/InfiniteSum/Order.lean:93); casts normalised by named rewrites
      have h := sum_le_hasSum (Finset.range (T + 1)) (fun n _ => by positivity) hasSum_zeta_two
      rw [Finset.sum_range_succ'] at h
      have hcast : ∀ i : ℕ, (1 : ℝ) / ((i + 1 : ℕ) : ℝ) ^ 2 = 1 / ((i : ℝ) + 1) ^ 2 :=
        fun i => by rw [Nat.cast_add_one]
      have h0 : (1 : ℝ) / ((0 : ℕ) : ℝ) ^ 2 = 0 := by
        rw [Nat.cast_zero, zero_pow two_ne_zero, div_zero]
      rw [Finset.sum_congr rfl (fun i _ => hcast i), h0, add_zero] at h
      exact h
    have hc : 0 ≤ delta_req * 6 / Real.pi ^ 2 :=
      div_nonneg (mul_nonneg hδ (by norm_num)) (sq_nonneg _)
    have hpi : Real.pi ^ 2 ≠ 0 := pow_ne_zero 2 Real.pi_ne_zero
    calc delta_req * 6 / Real.pi ^ 2 * ∑ t ∈ Finset.range T, (1 / ((t : ℝ) + 1) ^ 2)
        ≤ delta_req * 6 / Real.pi ^ 2 * (Real.pi ^ 2 / 6) := mul_le_mul_of_nonneg_left hz hc
      _ = delta_req * (Real.pi ^ 2 * (Real.pi ^ 2)⁻¹) := by ring
      _ = delta_req := by rw [mul_inv_cancel₀ hpi, mul_one]

end WitCert
