import WitCert.SubGaussian
import WitCert.Budget

/-!
# Union bounds: a decode step and a request (SPEC §5)

* `union_tail_le` — the union bound over a finite family of events, each of probability at most
  `δ / n` (`n` the family's size), as a probability statement.
* `dither_step_union` — SPEC §5/§9: for a query fixed independently of the dither, with each
  token `j` of a step its own residuals (independent across channels), proxies `c j i`,
  `V_j = σ² Σ_i q_i² c_{j,i} > 0`, served residuals within `β_{j,i}` of the ideal ones and
  `t_j = sqrt(2 V_j ln(2n/δ)) + b_j`, `b_j = |σ| Σ_i |q_i| β_{j,i}`:
  `P(∃ j, |δ_j| ≥ t_j) ≤ δ`. No independence across tokens is needed.
  `witcert.bounds.dither_radius` (with `bias`), `kernels/decode.py` (`tier_b_coefficients`).
* `request_union_sound` — SPEC §5/§9, the probability side of `request_budget_sound`: if every
  (layer, head, step) event has probability at most the schedule's `δ_step`, the union over the
  request has probability at most `δ_req` — fixed horizon over `T_max` steps, anytime over any
  horizon `T`. `witcert.bounds.step_budget`, `witcert/cache.py` (`WitCertCache.delta_step`).

Measure theory: this file and `SubGaussian` are the ones that import probability theory.
-/

namespace WitCert

open Finset MeasureTheory ProbabilityTheory
open scoped NNReal

/-- Union bound over a finite family: `μ(⋃_{j∈T} E_j) ≤ Σ_j μ(E_j) ≤ δ` when each `μ(E_j) ≤ δ/|T|`. -/
theorem union_tail_le {Ω κ : Type*} [MeasurableSpace Ω] {μ : Measure Ω} (T : Finset κ)
    (E : κ → Set Ω) (delta : ℝ) (hδ : 0 ≤ delta)
    (hE : ∀ j ∈ T, μ.real (E j) ≤ delta / T.card) :
    μ.real (⋃ j ∈ T, E j) ≤ delta := by
  -- `measureReal_biUnion_finset_le`: MeasureTheory/Measure/Real.lean:143
  have h1 : μ.real (⋃ j ∈ T, E j) ≤ ∑ j ∈ T, μ.real (E j) := measureReal_biUnion_finset_le T E
  have h2 : ∑ j ∈ T, μ.real (E j) ≤ ∑ _j ∈ T, delta / T.card := Finset.sum_le_sum hE
  have h3 : ∑ _j ∈ T, delta / (T.card : ℝ) = (T.card : ℝ) * (delta / T.card) := by
    rw [Finset.sum_const, nsmul_eq_mul]
  have h4 : (T.card : ℝ) * (delta / T.card) ≤ delta := by
    by_cases hc : (T.card : ℝ) = 0
    · rw [hc, zero_mul]
      exact hδ
    · exact le_of_eq (by rw [mul_comm, div_mul_cancel₀ delta hc])
  linarith

/-- SPEC §5: the per-step union over the `n` tokens, at the Tier B radius with the bias term. -/
theorem dither_step_union {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {κ d : Type*} [Fintype κ] [Fintype d] (r e : κ → d → Ω → ℝ) (hind : ∀ j, iIndepFun (r j) μ)
    (c : κ → d → ℝ≥0) (hsub : ∀ j i, HasSubgaussianMGF (r j i) (c j i) μ) (q : d → ℝ)
    (beta : κ → d → ℝ) (hclose : ∀ j i ω, |e j i ω - r j i ω| ≤ beta j i)
    (sigma delta : ℝ) (V b tt : κ → ℝ)
    (hV : ∀ j, V j = sigma ^ 2 * ∑ i, q i ^ 2 * (c j i : ℝ)) (hVpos : ∀ j, 0 < V j)
    (hb : ∀ j, b j = |sigma| * ∑ i, |q i| * beta j i)
    (htt : ∀ j, tt j = ditherRadius (V j) (Fintype.card κ) delta + b j)
    (hδ : 0 < delta) (hδn : delta ≤ 2 * Fintype.card κ) :
    μ.real {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|} ≤ delta := by
  have hn : (0 : ℝ) < Fintype.card κ := by linarith
  -- each token: the tail at its radius is `δ / n`
  have hj : ∀ j ∈ (Finset.univ : Finset κ),
      μ.real {ω | tt j ≤ |sigma * ∑ i, q i * e j i ω|} ≤ delta / (Finset.univ : Finset κ).card := by
    intro j _
    have hR : 0 ≤ ditherRadius (V j) (Fintype.card κ) delta := Real.sqrt_nonneg _
    have htail := dither_logit_tail_bias (r j) (e j) (hind j) (c j) (hsub j) q (beta j)
      (hclose j) sigma (V j) (ditherRadius (V j) (Fintype.card κ) delta) (b j) (hV j) (hb j) hR
    have hrad := tail_at_radius (V j) (Fintype.card κ) delta (hVpos j) hn hδ hδn
    rw [hrad] at htail
    rw [htt j, Finset.card_univ]
    exact htail
  have hsub_set : {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|} ⊆
      ⋃ j ∈ (Finset.univ : Finset κ), {ω | tt j ≤ |sigma * ∑ i, q i * e j i ω|} := by
    intro ω hω
    obtain ⟨j, hj'⟩ := hω
    exact Set.mem_iUnion₂.mpr ⟨j, Finset.mem_univ j, hj'⟩
  -- `Nat.cast_pos`: Data/Nat/Cast/Order/Ring.lean:59; `Fintype.card_pos_iff`: Data/Fintype/Card.lean:275
  have hn' : 0 < Fintype.card κ := Nat.cast_pos.mp hn
  have hP : IsProbabilityMeasure μ :=
    (hind (Classical.choice (Fintype.card_pos_iff.mp hn'))).isProbabilityMeasure
  calc μ.real {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|}
      ≤ μ.real (⋃ j ∈ (Finset.univ : Finset κ), {ω | tt j ≤ |sigma * ∑ i, q i * e j i ω|}) :=
        measureReal_mono hsub_set (measure_ne_top μ _)
    _ ≤ delta := union_tail_le _ _ delta hδ.le hj

/-- Sum of a bound over a finite union (a step of the request-level union). -/
lemma measureReal_biUnion_le_sum {Ω ι : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    (s : Finset ι) (A : ι → Set Ω) (a : ι → ℝ) (h : ∀ i ∈ s, μ.real (A i) ≤ a i) :
    μ.real (⋃ i ∈ s, A i) ≤ ∑ i ∈ s, a i :=
  (measureReal_biUnion_finset_le s A).trans (Finset.sum_le_sum h)

/-- SPEC §5: the request-level union bound, both schedules. `F l h t` / `G l h t` is the event
that (layer `l`, head `h`, step `t`) leaves its radii. -/
theorem request_union_sound {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    (delta_req : ℝ) (hδ : 0 ≤ delta_req) (L H T_max T : ℕ)
    (hL : 0 < L) (hH : 0 < H) (hT : 0 < T_max) (F G : ℕ → ℕ → ℕ → Set Ω)
    (hF : ∀ l h t, μ.real (F l h t) ≤ budgetFixed delta_req L H T_max)
    (hG : ∀ l h t, μ.real (G l h t) ≤ budgetAnytime delta_req L H ((t : ℝ) + 1)) :
    μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T_max, F l h t)
        ≤ delta_req ∧
    μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, G l h t)
        ≤ delta_req := by
  have hsound := request_budget_sound delta_req hδ L H T_max T hL hH hT
  constructor
  · have h3 : ∀ l h, μ.real (⋃ t ∈ Finset.range T_max, F l h t)
        ≤ ∑ _t ∈ Finset.range T_max, budgetFixed delta_req L H T_max :=
      fun l h => measureReal_biUnion_le_sum _ _ _ fun t _ => hF l h t
    have h2 : ∀ l, μ.real (⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T_max, F l h t)
        ≤ ∑ _h ∈ Finset.range H, ∑ _t ∈ Finset.range T_max, budgetFixed delta_req L H T_max :=
      fun l => measureReal_biUnion_le_sum _ _ _ fun h _ => h3 l h
    have h1 := measureReal_biUnion_le_sum (Finset.range L) _ _ fun l _ => h2 l
    have hcount : ∑ _l ∈ Finset.range L, ∑ _h ∈ Finset.range H, ∑ _t ∈ Finset.range T_max,
        budgetFixed delta_req L H T_max
          = (L : ℝ) * ((H : ℝ) * ((T_max : ℝ) * budgetFixed delta_req L H T_max)) := by
      simp only [Finset.sum_const, Finset.card_range, nsmul_eq_mul]
    have hfix := hsound.1
    rw [Finset.sum_const, Finset.card_range, nsmul_eq_mul] at hfix
    linarith
  · have h3 : ∀ l h, μ.real (⋃ t ∈ Finset.range T, G l h t)
        ≤ ∑ t ∈ Finset.range T, budgetAnytime delta_req L H ((t : ℝ) + 1) :=
      fun l h => measureReal_biUnion_le_sum _ _ _ fun t _ => hG l h t
    have h2 : ∀ l, μ.real (⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, G l h t)
        ≤ ∑ _h ∈ Finset.range H, ∑ t ∈ Finset.range T, budgetAnytime delta_req L H ((t : ℝ) + 1) :=
      fun l => measureReal_biUnion_le_sum _ _ _ fun h _ => h3 l h
    have h1 := measureReal_biUnion_le_sum (Finset.range L) _ _ fun l _ => h2 l
    have hcount : ∑ _l ∈ Finset.range L, ∑ _h ∈ Finset.range H, ∑ t ∈ Finset.range T,
        budgetAnytime delta_req L H ((t : ℝ) + 1)
          = (L : ℝ) * ((H : ℝ) * ∑ t ∈ Finset.range T, budgetAnytime delta_req L H ((t : ℝ) + 1)) := by
      simp only [Finset.sum_const, Finset.card_range, nsmul_eq_mul]
    have hany := hsound.2
    rw [← Finset.mul_sum] at hany
    -- linear in the monomial `L * H * Σ_t δ_step(t)`
    linarith

end WitCert
