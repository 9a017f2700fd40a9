import Mathlib

/-!
# Tier B: the sub-Gaussian certificate of the dithered INT8 scheme (SPEC §5)

* `uniform_mgf_le` — SPEC §5/§9: the MGF of `r ~ U[−s/2, s/2]`, `E e^{λr} = sinh(λs/2)/(λs/2)`,
  is at most `exp(λ² (s²/12) / 2)`: variance proxy `s²/12` (termwise comparison of the power
  series, `(2n+1)! ≥ 6ⁿ n!`). Used by `witcert.bounds.dither_variance_proxy` (the `/ 12`) and
  `kernels/decode.py` (`tier_b_coefficients`).
* `dither_logit_tail` — SPEC §5/§9: for independent residuals `r_i` with sub-Gaussian proxies
  `c_i` (e.g. `s_i²/12`, the ideal subtractive dither), `P(|σ Σ_i q_i r_i| ≥ t) ≤ 2 e^{−t²/(2V)}`
  with `V = σ² Σ_i q_i² c_i`.
* `tail_at_radius` — at `t = ditherRadius V n δ = sqrt(2 V ln(2n/δ))` the two-sided tail is
  `δ/n`, so a union over `n` tokens fails with probability ≤ δ: `witcert.bounds.dither_radius`,
  `kernels/decode.py` (`tier_b_coefficients`).
* `uniform_hasSubgaussianMGF` — a residual with `MeasureTheory.pdf.IsUniform r [−s/2, s/2] μ`
  (`s > 0`) has `HasSubgaussianMGF r (s²/12) μ`: the hypothesis `hsub` above, closed
  (Mathlib's Hoeffding lemma would give only `s²/4`).
* `dither_logit_tail_uniform` — the tail for uniform residuals: no hypothesis left but
  independence.
* `dither_logit_tail_bias` — the real fp32 scheme: served residuals `e_i` within `β_i` of the
  ideal ones give `P(|σ Σ q_i e_i| ≥ t + b) ≤ 2 e^{−t²/(2V)}`, `b = |σ| Σ_i |q_i| β_i`
  (`witcert.bounds.dither_bias_bound`, `β_i = s_i · 2⁻¹⁴`; that bound on `β` is argued there,
  not proved). The unions over tokens and over a request are in `Union.lean`.
-/

namespace WitCert

open Finset MeasureTheory ProbabilityTheory
open scoped NNReal

lemma six_pow_mul_factorial_le (n : ℕ) : 6 ^ n * n.factorial ≤ (2 * n + 1).factorial := by
  induction n with
  | zero => simp
  | succ k ih =>
    have h1 : (2 * (k + 1) + 1).factorial = (2 * k + 3) * ((2 * k + 2) * (2 * k + 1).factorial) := by
      have e : 2 * (k + 1) + 1 = (2 * k + 1) + 1 + 1 := by ring
      rw [e, Nat.factorial_succ (2 * k + 1 + 1), Nat.factorial_succ (2 * k + 1)]
      ring
    have h2 : 6 * (k + 1) ≤ (2 * k + 3) * (2 * k + 2) := by
      calc 6 * (k + 1) = 3 * (2 * k + 2) := by ring
        _ ≤ (2 * k + 3) * (2 * k + 2) := Nat.mul_le_mul_right _ (by omega)
    rw [h1, pow_succ, Nat.factorial_succ k]
    calc 6 ^ k * 6 * ((k + 1) * k.factorial) = (6 * (k + 1)) * (6 ^ k * k.factorial) := by ring
      _ ≤ ((2 * k + 3) * (2 * k + 2)) * (2 * k + 1).factorial := Nat.mul_le_mul h2 ih
      _ = (2 * k + 3) * ((2 * k + 2) * (2 * k + 1).factorial) := by ring

lemma sinh_le_mul_exp {y : ℝ} (hy : 0 ≤ y) : Real.sinh y ≤ y * Real.exp (y ^ 2 / 6) := by
  -- The exponential series, stated in the `Real.exp` form and proved as Mathlib's own
  -- `poissonPMFRealSum` (Probability/Distributions/Poisson/Basic.lean:48) and
  -- Combinatorics/Derangements/Exponential.lean:42 do: rewrite the goal with
  -- `Real.exp_eq_exp_ℝ` (Analysis/SpecialFunctions/Exponential.lean:215), then `exact`
  -- `NormedSpace.expSeries_div_hasSum_exp` (Analysis/Normed/Algebra/Exponential.lean:616).
  have hexp0 : HasSum (fun n : ℕ => (y ^ 2 / 6) ^ n / (n.factorial : ℝ)) (Real.exp (y ^ 2 / 6)) := by
    rw [Real.exp_eq_exp_ℝ]
    exact NormedSpace.expSeries_div_hasSum_exp (y ^ 2 / 6)
  have hexp : HasSum (fun n : ℕ => y * ((y ^ 2 / 6) ^ n / (n.factorial : ℝ)))
      (y * Real.exp (y ^ 2 / 6)) :=
    hexp0.mul_left y
  refine hasSum_le (fun n => ?_) (Real.hasSum_sinh y) hexp
  have hf : (6 : ℝ) ^ n * (n.factorial : ℝ) ≤ ((2 * n + 1).factorial : ℝ) := by
    exact_mod_cast six_pow_mul_factorial_le n
  have hpos : (0 : ℝ) < (6 : ℝ) ^ n * (n.factorial : ℝ) := by positivity
  have hyn : 0 ≤ y ^ (2 * n + 1) := pow_nonneg hy _
  have key : y * ((y ^ 2 / 6) ^ n / (n.factorial : ℝ))
      = y ^ (2 * n + 1) / ((6 : ℝ) ^ n * (n.factorial : ℝ)) := by
    first
      | rw [div_pow, ← pow_mul, div_div, ← mul_div_assoc, ← pow_succ']
      | (field_simp; ring)
  rw [key]
  exact div_le_div_of_nonneg_left hyn hpos hf

/-- SPEC §5: `E e^{λ r} = sinh(λs/2)/(λs/2) ≤ exp(λ² (s²/12) / 2)` for `r ~ U[−s/2, s/2]`. -/
theorem uniform_mgf_le (lam s : ℝ) (h : lam * s ≠ 0) :
    Real.sinh (lam * s / 2) / (lam * s / 2) ≤ Real.exp (lam ^ 2 * (s ^ 2 / 12) / 2) := by
  have harg : lam ^ 2 * (s ^ 2 / 12) / 2 = (lam * s / 2) ^ 2 / 6 := by ring
  rw [harg]
  have hy0 : lam * s / 2 ≠ 0 := div_ne_zero h two_ne_zero
  rcases lt_or_gt_of_ne hy0 with hneg | hpos
  · have hpos' : 0 ≤ -(lam * s / 2) := by linarith
    have hs := sinh_le_mul_exp hpos'
    rw [Real.sinh_neg, neg_sq] at hs
    rw [div_le_iff_of_neg hneg]
    linarith
  · have hs := sinh_le_mul_exp hpos.le
    rw [div_le_iff₀ hpos]
    linarith

/-- The residuals scaled into logit contributions, `σ q_i r_i`. -/
def scaledResidual {Ω d : Type*} (sigma : ℝ) (q : d → ℝ) (r : d → Ω → ℝ) : d → Ω → ℝ :=
  fun i ω => (sigma * q i) * r i ω

/-- SPEC §5: two-sided tail of `σ Σ_i q_i r_i` for independent sub-Gaussian residuals. -/
theorem dither_logit_tail {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {d : Type*} [Fintype d] (r : d → Ω → ℝ) (hind : iIndepFun r μ) (c : d → ℝ≥0)
    (hsub : ∀ i, HasSubgaussianMGF (r i) (c i) μ) (q : d → ℝ) (sigma V t : ℝ)
    (hV : V = sigma ^ 2 * ∑ i, q i ^ 2 * (c i : ℝ)) (ht : 0 ≤ t) :
    μ.real {ω | t ≤ |sigma * ∑ i, q i * r i ω|} ≤ 2 * Real.exp (-t ^ 2 / (2 * V)) := by
  have : IsProbabilityMeasure μ := hind.isProbabilityMeasure
  set X := scaledResidual sigma q r with hXdef
  have hX : iIndepFun X μ :=
    hind.comp (fun i x => (sigma * q i) * x) (fun i => measurable_id.const_mul _)
  have hsubX : ∀ i ∈ (Finset.univ : Finset d),
      HasSubgaussianMGF (X i) (⟨(sigma * q i) ^ 2, sq_nonneg _⟩ * c i) μ :=
    fun i _ => (hsub i).const_mul (sigma * q i)
  have hS := HasSubgaussianMGF.sum_of_iIndepFun hX hsubX
  have hcoe : ((∑ i ∈ (Finset.univ : Finset d), (⟨(sigma * q i) ^ 2, sq_nonneg _⟩ * c i : ℝ≥0)) : ℝ)
      = V := by
    rw [hV, NNReal.coe_sum, Finset.mul_sum]
    refine Finset.sum_congr rfl fun i _ => ?_
    rw [NNReal.coe_mul, NNReal.coe_mk]
    ring
  have hY : ∀ ω, ∑ i ∈ (Finset.univ : Finset d), X i ω = sigma * ∑ i, q i * r i ω := by
    intro ω
    rw [Finset.mul_sum]
    refine Finset.sum_congr rfl fun i _ => ?_
    simp only [hXdef, scaledResidual]
    ring
  have hup := hS.measure_ge_le ht
  have hlo := hS.neg.measure_ge_le ht
  rw [hcoe] at hup hlo
  have hsub_set : {ω | t ≤ |sigma * ∑ i, q i * r i ω|} ⊆
      {ω | t ≤ ∑ i ∈ (Finset.univ : Finset d), X i ω} ∪
        {ω | t ≤ (-(fun ω => ∑ i ∈ (Finset.univ : Finset d), X i ω)) ω} := by
    intro ω hω
    simp only [Set.mem_setOf_eq] at hω
    simp only [Set.mem_union, Set.mem_setOf_eq, Pi.neg_apply, hY ω]
    rcases le_total 0 (sigma * ∑ i, q i * r i ω) with h | h
    · left; rwa [abs_of_nonneg h] at hω
    · right; rwa [abs_of_nonpos h] at hω
  calc μ.real {ω | t ≤ |sigma * ∑ i, q i * r i ω|}
      ≤ μ.real ({ω | t ≤ ∑ i ∈ (Finset.univ : Finset d), X i ω} ∪
          {ω | t ≤ (-(fun ω => ∑ i ∈ (Finset.univ : Finset d), X i ω)) ω}) :=
        -- `measureReal_mono` (MeasureTheory/Measure/Real.lean:85): its finiteness side goal is
        -- given, not left to the `finiteness` auto-param (`measure_ne_top`:
        -- MeasureTheory/Measure/Typeclasses/Finite.lean:55, the local `IsProbabilityMeasure`)
        measureReal_mono hsub_set (measure_ne_top μ _)
    _ ≤ μ.real {ω | t ≤ ∑ i ∈ (Finset.univ : Finset d), X i ω} +
          μ.real {ω | t ≤ (-(fun ω => ∑ i ∈ (Finset.univ : Finset d), X i ω)) ω} :=
        measureReal_union_le _ _
    _ ≤ Real.exp (-t ^ 2 / (2 * V)) + Real.exp (-t ^ 2 / (2 * V)) := add_le_add hup hlo
    _ = 2 * Real.exp (-t ^ 2 / (2 * V)) := by ring

/-! ### The uniform residual is sub-Gaussian with proxy `s²/12` (closes `hsub` above)

Mathlib's Hoeffding lemma (`hasSubgaussianMGF_of_mem_Icc`) gives only `((b − a)/2)² = s²/4`;
the proxy `s²/12` comes from the exact MGF `sinh(λs/2)/(λs/2)` and `uniform_mgf_le`. -/

/-- `∫_{−s/2}^{s/2} e^{t x} dx = t⁻¹ (e^{t s/2} − e^{−t s/2})` for `t ≠ 0`. -/
lemma integral_exp_mul_Icc (t s : ℝ) (ht : t ≠ 0) (hs : 0 ≤ s) :
    ∫ x in Set.Icc (-(s / 2)) (s / 2), Real.exp (t * x)
      = t⁻¹ * (Real.exp (t * (s / 2)) - Real.exp (t * (-(s / 2)))) := by
  have hab : -(s / 2) ≤ s / 2 := by linarith
  -- MeasureTheory/Integral/Bochner/Set.lean:684 and IntervalIntegral/Basic.lean:667
  have h1 : ∫ x in Set.Icc (-(s / 2)) (s / 2), Real.exp (t * x)
      = ∫ x in (-(s / 2))..(s / 2), Real.exp (t * x) := by
    rw [intervalIntegral.integral_of_le hab, MeasureTheory.integral_Icc_eq_integral_Ioc]
  -- IntervalIntegral/Basic.lean:891 (`f` explicit)
  have h2 : ∫ x in (-(s / 2))..(s / 2), Real.exp (t * x)
      = t⁻¹ • ∫ x in (t * (-(s / 2)))..(t * (s / 2)), Real.exp x :=
    intervalIntegral.integral_comp_mul_left Real.exp ht
  -- `integral_exp`: Analysis/SpecialFunctions/Integrals/Basic.lean:236
  rw [h1, h2, integral_exp, smul_eq_mul]

/-- The MGF of the uniform law on `[−s/2, s/2]` (Mathlib's `ProbabilityTheory.cond volume I`,
the law of `MeasureTheory.pdf.IsUniform`): `sinh(t s/2)/(t s/2)` for `t ≠ 0`. -/
lemma uniform_integral_exp (t s : ℝ) (ht : t ≠ 0) (hs : 0 < s) :
    ∫ x, Real.exp (t * x) ∂(ProbabilityTheory.cond (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2)))
      = Real.sinh (t * s / 2) / (t * s / 2) := by
  unfold ProbabilityTheory.cond
  -- `integral_smul_measure`: MeasureTheory/Integral/Bochner/Basic.lean:1048;
  -- `Real.volume_Icc`: MeasureTheory/Measure/Lebesgue/Basic.lean:89
  rw [integral_smul_measure, Real.volume_Icc, integral_exp_mul_Icc t s ht hs.le]
  have hv : s / 2 - -(s / 2) = s := by ring
  have e1 : t * (s / 2) = t * s / 2 := by ring
  have e2 : t * (-(s / 2)) = -(t * s / 2) := by ring
  rw [hv, ENNReal.toReal_inv, ENNReal.toReal_ofReal hs.le, smul_eq_mul, e1, e2, Real.sinh_eq]
  ring

/-- SPEC §5: a residual uniform on `[−s/2, s/2]` has a sub-Gaussian MGF with proxy `s²/12` —
the hypothesis `hsub` of `dither_logit_tail`, for the ideal subtractive dither. -/
theorem uniform_hasSubgaussianMGF {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    (r : Ω → ℝ) (s : ℝ) (hs : 0 < s)
    (hu : MeasureTheory.pdf.IsUniform r (Set.Icc (-(s / 2)) (s / 2)) μ) :
    HasSubgaussianMGF r (Real.toNNReal (s ^ 2 / 12)) μ := by
  have hvol : (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2)) = ENNReal.ofReal s := by
    rw [Real.volume_Icc]
    congr 1
    ring
  have hns : (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2)) ≠ 0 := by
    rw [hvol]
    exact (ENNReal.ofReal_pos.mpr hs).ne'
  have hnt : (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2)) ≠ ⊤ := by
    rw [hvol]
    exact ENNReal.ofReal_ne_top
  -- Probability/Distributions/Uniform.lean:68, :88
  have hmeas : AEMeasurable r μ := hu.aemeasurable hns hnt
  have hP : IsProbabilityMeasure μ := hu.isProbabilityMeasure hns hnt
  have hmap : μ.map r = ProbabilityTheory.cond (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2)) :=
    hu
  -- `r ∈ [−s/2, s/2]` almost surely (`ae_map_iff`: MeasureTheory/Measure/Map.lean:243).
  -- `ProbabilityTheory.ae_cond_mem` (Probability/ConditionalProbability.lean:197) is Mathlib's
  -- own statement of `∀ᵐ x ∂μ[|s], x ∈ s` (its proof is `Measure.ae_smul_measure` of
  -- `ae_restrict_mem`, MeasureTheory/Measure/MeasureSpace.lean:947); the measure is explicit.
  have hbI : ∀ᵐ x ∂(μ.map r), x ∈ Set.Icc (-(s / 2)) (s / 2) := by
    rw [hmap]
    exact ProbabilityTheory.ae_cond_mem (μ := (volume : Measure ℝ)) measurableSet_Icc
  have hmI : MeasurableSet {x : ℝ | x ∈ Set.Icc (-(s / 2)) (s / 2)} := measurableSet_Icc
  have hb : ∀ᵐ ω ∂μ, r ω ∈ Set.Icc (-(s / 2)) (s / 2) :=
    (ae_map_iff hmeas hmI).mp hbI
  have hc : ((Real.toNNReal (s ^ 2 / 12) : ℝ≥0) : ℝ) = s ^ 2 / 12 :=
    Real.coe_toNNReal (s ^ 2 / 12) (by positivity)
  -- integrability: Probability/Moments/Basic.lean:500
  refine ⟨fun t => integrable_exp_mul_of_mem_Icc hmeas hb, fun t => ?_⟩
  rw [hc]
  by_cases ht : t = 0
  · -- Probability/Moments/Basic.lean:165
    have h0 : s ^ 2 / 12 * (0 : ℝ) ^ 2 / 2 = 0 := by ring
    apply le_of_eq
    rw [ht, mgf_zero, h0, Real.exp_zero]
  · have hcont : Continuous (fun x : ℝ => Real.exp (t * x)) := by fun_prop
    -- `integral_map`: MeasureTheory/Integral/Bochner/Basic.lean:1090
    have hchange : ∫ x, Real.exp (t * x) ∂(μ.map r) = ∫ ω, Real.exp (t * r ω) ∂μ :=
      integral_map hmeas hcont.aestronglyMeasurable
    have hmgf : mgf r μ t = Real.sinh (t * s / 2) / (t * s / 2) := by
      calc mgf r μ t = ∫ ω, Real.exp (t * r ω) ∂μ := rfl
        _ = ∫ x, Real.exp (t * x) ∂(μ.map r) := hchange.symm
        _ = ∫ x, Real.exp (t * x)
              ∂(ProbabilityTheory.cond (volume : Measure ℝ) (Set.Icc (-(s / 2)) (s / 2))) := by
            rw [hmap]
        _ = Real.sinh (t * s / 2) / (t * s / 2) := uniform_integral_exp t s ht hs
    have hbound := uniform_mgf_le t s (mul_ne_zero ht hs.ne')
    have e : s ^ 2 / 12 * t ^ 2 / 2 = t ^ 2 * (s ^ 2 / 12) / 2 := by ring
    rw [hmgf, e]
    exact hbound

/-- SPEC §5 for the ideal dither, with no free hypothesis but independence: residuals uniform on
`[−s_i/2, s_i/2]` (per-channel scales `s_i > 0`), `V = σ² Σ_i q_i² s_i²/12`. -/
theorem dither_logit_tail_uniform {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {d : Type*} [Fintype d] (r : d → Ω → ℝ) (hind : iIndepFun r μ) (s : d → ℝ)
    (hs : ∀ i, 0 < s i)
    (hu : ∀ i, MeasureTheory.pdf.IsUniform (r i) (Set.Icc (-(s i / 2)) (s i / 2)) μ)
    (q : d → ℝ) (sigma V t : ℝ) (hV : V = sigma ^ 2 * ∑ i, q i ^ 2 * (s i ^ 2 / 12))
    (ht : 0 ≤ t) :
    μ.real {ω | t ≤ |sigma * ∑ i, q i * r i ω|} ≤ 2 * Real.exp (-t ^ 2 / (2 * V)) := by
  have hsub : ∀ i, HasSubgaussianMGF (r i) (Real.toNNReal (s i ^ 2 / 12)) μ :=
    fun i => uniform_hasSubgaussianMGF (r i) (s i) (hs i) (hu i)
  have hV' : V = sigma ^ 2 * ∑ i, q i ^ 2 * ((Real.toNNReal (s i ^ 2 / 12) : ℝ≥0) : ℝ) := by
    rw [hV]
    congr 1
    refine Finset.sum_congr rfl fun i _ => ?_
    rw [Real.coe_toNNReal (s i ^ 2 / 12) (by positivity)]
  exact dither_logit_tail r hind (fun i => Real.toNNReal (s i ^ 2 / 12)) hsub q sigma V t hV' ht

/-- SPEC §5 with the deterministic bias `b` of the real fp32 scheme: if the served residual `e_i`
is within `β_i` of the ideal one `r_i` everywhere, `P(|σ Σ q_i e_i| ≥ t + b) ≤ 2 e^{−t²/(2V)}`
with `b = |σ| Σ_i |q_i| β_i` (`witcert.bounds.dither_bias_bound`: `β_i = s_i · 2⁻¹⁴`). -/
theorem dither_logit_tail_bias {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {d : Type*} [Fintype d] (r e : d → Ω → ℝ) (hind : iIndepFun r μ) (c : d → ℝ≥0)
    (hsub : ∀ i, HasSubgaussianMGF (r i) (c i) μ) (q beta : d → ℝ)
    (hclose : ∀ i ω, |e i ω - r i ω| ≤ beta i) (sigma V t b : ℝ)
    (hV : V = sigma ^ 2 * ∑ i, q i ^ 2 * (c i : ℝ)) (hb : b = |sigma| * ∑ i, |q i| * beta i)
    (ht : 0 ≤ t) :
    μ.real {ω | t + b ≤ |sigma * ∑ i, q i * e i ω|} ≤ 2 * Real.exp (-t ^ 2 / (2 * V)) := by
  have hP : IsProbabilityMeasure μ := hind.isProbabilityMeasure
  have hdiff : ∀ ω, |sigma * ∑ i, q i * e i ω| ≤ |sigma * ∑ i, q i * r i ω| + b := by
    intro ω
    have hsplit : sigma * ∑ i, q i * e i ω
        = sigma * ∑ i, q i * r i ω + sigma * ∑ i, q i * (e i ω - r i ω) := by
      rw [← mul_add, ← Finset.sum_add_distrib]
      congr 1
      exact Finset.sum_congr rfl fun i _ => by ring
    have hbound : |sigma * ∑ i, q i * (e i ω - r i ω)| ≤ b := by
      rw [hb, abs_mul]
      refine mul_le_mul_of_nonneg_left ?_ (abs_nonneg sigma)
      refine (Finset.abs_sum_le_sum_abs _ _).trans (Finset.sum_le_sum fun i _ => ?_)
      rw [abs_mul]
      exact mul_le_mul_of_nonneg_left (hclose i ω) (abs_nonneg (q i))
    have htri := abs_add_le (sigma * ∑ i, q i * r i ω) (sigma * ∑ i, q i * (e i ω - r i ω))
    rw [hsplit]
    linarith
  have hsub_set : {ω | t + b ≤ |sigma * ∑ i, q i * e i ω|} ⊆
      {ω | t ≤ |sigma * ∑ i, q i * r i ω|} := by
    intro ω hω
    simp only [Set.mem_setOf_eq] at hω ⊢
    have h := hdiff ω
    linarith
  calc μ.real {ω | t + b ≤ |sigma * ∑ i, q i * e i ω|}
      ≤ μ.real {ω | t ≤ |sigma * ∑ i, q i * r i ω|} := measureReal_mono hsub_set (measure_ne_top μ _)
    _ ≤ 2 * Real.exp (-t ^ 2 / (2 * V)) := dither_logit_tail r hind c hsub q sigma V t hV ht

/-- SPEC §5: the Tier B radius `t = sqrt(2 V ln(2n/δ))`. -/
noncomputable def ditherRadius (V n delta : ℝ) : ℝ := Real.sqrt (2 * V * Real.log (2 * n / delta))

/-- At the radius, the two-sided tail of `dither_logit_tail` is `δ / n`. -/
lemma tail_at_radius (V n delta : ℝ) (hV : 0 < V) (hn : 0 < n) (hδ : 0 < delta)
    (hδn : delta ≤ 2 * n) :
    2 * Real.exp (-(ditherRadius V n delta) ^ 2 / (2 * V)) = delta / n := by
  unfold ditherRadius
  have hpos : 0 < 2 * n / delta := div_pos (by linarith) hδ
  have hlog : 0 ≤ Real.log (2 * n / delta) := Real.log_nonneg ((one_le_div hδ).mpr hδn)
  rw [Real.sq_sqrt (mul_nonneg (by linarith) hlog)]
  have h2V : 2 * V ≠ 0 := ne_of_gt (by linarith)
  have hq : -(2 * V * Real.log (2 * n / delta)) / (2 * V) = -Real.log (2 * n / delta) := by
    rw [neg_div, mul_comm (2 * V), mul_div_assoc, div_self h2V, mul_one]
  rw [hq, Real.exp_neg, Real.exp_log hpos, inv_div, ← mul_div_assoc,
    mul_div_mul_left delta n two_ne_zero]

end WitCert
