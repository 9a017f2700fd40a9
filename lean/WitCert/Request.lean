import WitCert.Union
import WitCert.TiltTV

/-!
# A request's certificate: `P(∃ step, TV > TV⁺) ≤ δ_req` (SPEC §5, issue 37 (b))

The per-token tail (`dither_logit_tail_bias`), the union over a step's tokens
(`dither_step_union`), the §3 bounds and the request budget (`request_budget_sound`) composed
into one statement.

## Main statements

* `step_tv_sound` — one decode step of one (layer, query head): the served `p̂ ω` and the exact
  `p ω` with `p ω` the tilt of `p̂ ω` by the logit errors `δ_j(ω) = σ Σ_i q_i e_{j,i}(ω)`; Tier B
  radii `t_j = ditherRadius V_j n δ + b_j`; `TV⁺ ω` any bound that is sound for every tilt of
  `p̂ ω` within those radii (the §3 bounds are: `tilt_tv_le_tanh`, `tilt_tv_le_eform`,
  `tilt_tv_le_dual_grid`). Then `P(TV⁺ < TV(p, p̂)) ≤ δ`.
* `request_tv_sound` — every (layer `l < L`, head `h < H`, step `t < T`) at its step budget
  `δ_t` with `L · H · Σ_t δ_t ≤ δ_req`: `P(∃ l h t, TV⁺ < TV) ≤ δ_req`.
* `request_tv_sound_fixed`, `request_tv_sound_anytime` — the two schedules of
  `request_budget_sound` (`witcert.bounds.step_budget`, `WitCertCache.delta_step`).

## Implementation notes

The query `q` of each step is a fixed (deterministic) vector: Tier B holds for queries that do
not depend on the dither draw of the tokens they meter (SPEC §9, non-adaptive). The residual
model (independent residuals with sub-Gaussian proxies, served residuals within `β` of them)
is the hypothesis of `dither_step_union`; that the implementation's 2²³-point dither grid
satisfies it is a known gap (`docs/proofs.md`).
-/

namespace WitCert

open Finset MeasureTheory ProbabilityTheory
open scoped NNReal

/-- Issue 37 (b), one step: `P(TV⁺ < TV(p, p̂)) ≤ δ` for a `TV⁺` sound for every tilt within the
Tier B radii `t_j`. -/
theorem step_tv_sound {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {κ d : Type*} [Fintype κ] [DecidableEq κ] [Fintype d] (r e : κ → d → Ω → ℝ)
    (hind : ∀ j, iIndepFun (r j) μ) (c : κ → d → ℝ≥0)
    (hsub : ∀ j i, HasSubgaussianMGF (r j i) (c j i) μ) (q : d → ℝ)
    (beta : κ → d → ℝ) (hclose : ∀ j i ω, |e j i ω - r j i ω| ≤ beta j i)
    (sigma delta : ℝ) (V b tt : κ → ℝ)
    (hV : ∀ j, V j = sigma ^ 2 * ∑ i, q i ^ 2 * (c j i : ℝ)) (hVpos : ∀ j, 0 < V j)
    (hb : ∀ j, b j = |sigma| * ∑ i, |q i| * beta j i)
    (htt : ∀ j, tt j = ditherRadius (V j) (Fintype.card κ) delta + b j)
    (hδ : 0 < delta) (hδn : delta ≤ 2 * Fintype.card κ)
    (phat p dl : Ω → κ → ℝ) (hdl : ∀ ω j, dl ω j = sigma * ∑ i, q i * e j i ω)
    (htilt : ∀ ω, IsTilt (phat ω) (dl ω) (p ω)) (TVup : Ω → ℝ)
    (hF : ∀ ω (d' : κ → ℝ), IsTilt (phat ω) d' (p ω) → (∀ j, |d' j| ≤ tt j) →
      tv (p ω) (phat ω) ≤ TVup ω) :
    μ.real {ω | TVup ω < tv (p ω) (phat ω)} ≤ delta := by
  -- off the event of `dither_step_union`, every radius holds and `TV⁺` is sound
  have hsub_set : {ω | TVup ω < tv (p ω) (phat ω)} ⊆
      {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|} := by
    intro ω hω
    simp only [Set.mem_setOf_eq] at hω ⊢
    by_contra hno
    push_neg at hno
    have hr : ∀ j, |dl ω j| ≤ tt j := by
      intro j
      rw [hdl ω j]
      exact (hno j).le
    have hsound : tv (p ω) (phat ω) ≤ TVup ω := hF ω (dl ω) (htilt ω) hr
    linarith
  have hstep : μ.real {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|} ≤ delta :=
    dither_step_union r e hind c hsub q beta hclose sigma delta V b tt hV hVpos hb htt hδ hδn
  have hn : (0 : ℝ) < Fintype.card κ := by linarith
  -- `Nat.cast_pos`: Data/Nat/Cast/Order/Ring.lean:59
  have hn' : 0 < Fintype.card κ := Nat.cast_pos.mp hn
  -- `Fintype.card_pos_iff`: Data/Fintype/Card.lean:275
  have hP : IsProbabilityMeasure μ :=
    (hind (Classical.choice (Fintype.card_pos_iff.mp hn'))).isProbabilityMeasure
  -- `measureReal_mono`: MeasureTheory/Measure/Real.lean:85 (`measure_ne_top`:
  -- MeasureTheory/Measure/Typeclasses/Finite.lean:55)
  calc μ.real {ω | TVup ω < tv (p ω) (phat ω)}
      ≤ μ.real {ω | ∃ j, tt j ≤ |sigma * ∑ i, q i * e j i ω|} :=
        measureReal_mono hsub_set (measure_ne_top μ _)
    _ ≤ delta := hstep

/-- Issue 37 (b), a request: every (layer `l < L`, head `h < H`, step `t < T`) certified at its
step budget `δ_t` (Tier B radii at `δ_t`), the budgets summing to at most `δ_req`:
`P(∃ l h t, TV⁺ < TV) ≤ δ_req`. -/
theorem request_tv_sound {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {κ d : Type*} [Fintype κ] [DecidableEq κ] [Fintype d]
    (delta_req : ℝ) (L H T : ℕ) (ds : ℕ → ℝ) (hds : ∀ t, 0 < ds t)
    (hdsn : ∀ t, ds t ≤ 2 * Fintype.card κ)
    (hbudget : ∑ t ∈ Finset.range T, (L : ℝ) * H * ds t ≤ delta_req)
    (r e : ℕ → ℕ → ℕ → κ → d → Ω → ℝ) (hind : ∀ l h t j, iIndepFun (r l h t j) μ)
    (c : ℕ → ℕ → ℕ → κ → d → ℝ≥0)
    (hsub : ∀ l h t j i, HasSubgaussianMGF (r l h t j i) (c l h t j i) μ)
    (q : ℕ → ℕ → ℕ → d → ℝ) (beta : ℕ → ℕ → ℕ → κ → d → ℝ)
    (hclose : ∀ l h t j i ω, |e l h t j i ω - r l h t j i ω| ≤ beta l h t j i)
    (sigma : ℝ) (V b tt : ℕ → ℕ → ℕ → κ → ℝ)
    (hV : ∀ l h t j, V l h t j = sigma ^ 2 * ∑ i, q l h t i ^ 2 * (c l h t j i : ℝ))
    (hVpos : ∀ l h t j, 0 < V l h t j)
    (hb : ∀ l h t j, b l h t j = |sigma| * ∑ i, |q l h t i| * beta l h t j i)
    (htt : ∀ l h t j, tt l h t j = ditherRadius (V l h t j) (Fintype.card κ) (ds t) + b l h t j)
    (phat p dl : ℕ → ℕ → ℕ → Ω → κ → ℝ)
    (hdl : ∀ l h t ω j, dl l h t ω j = sigma * ∑ i, q l h t i * e l h t j i ω)
    (htilt : ∀ l h t ω, IsTilt (phat l h t ω) (dl l h t ω) (p l h t ω))
    (TVup : ℕ → ℕ → ℕ → Ω → ℝ)
    (hF : ∀ l h t ω (d' : κ → ℝ), IsTilt (phat l h t ω) d' (p l h t ω) →
      (∀ j, |d' j| ≤ tt l h t j) → tv (p l h t ω) (phat l h t ω) ≤ TVup l h t ω)
    (Ev : ℕ → ℕ → ℕ → Set Ω)
    (hEv : ∀ l h t, Ev l h t = {ω | TVup l h t ω < tv (p l h t ω) (phat l h t ω)}) :
    μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, Ev l h t)
      ≤ delta_req := by
  have hstep : ∀ l h t, μ.real (Ev l h t) ≤ ds t := by
    intro l h t
    rw [hEv l h t]
    exact step_tv_sound (r l h t) (e l h t) (hind l h t) (c l h t) (hsub l h t) (q l h t)
      (beta l h t) (hclose l h t) sigma (ds t) (V l h t) (b l h t) (tt l h t) (hV l h t)
      (hVpos l h t) (hb l h t) (htt l h t) (hds t) (hdsn t) (phat l h t) (p l h t) (dl l h t)
      (hdl l h t) (htilt l h t) (TVup l h t) (hF l h t)
  -- the union over steps, heads and layers (`measureReal_biUnion_le_sum`, Union.lean)
  have h3 : ∀ l h, μ.real (⋃ t ∈ Finset.range T, Ev l h t) ≤ ∑ t ∈ Finset.range T, ds t :=
    fun l h => measureReal_biUnion_le_sum _ _ _ fun t _ => hstep l h t
  have h2 : ∀ l, μ.real (⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, Ev l h t)
      ≤ ∑ _h ∈ Finset.range H, ∑ t ∈ Finset.range T, ds t :=
    fun l => measureReal_biUnion_le_sum _ _ _ fun h _ => h3 l h
  have h1 : μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, Ev l h t)
      ≤ ∑ _l ∈ Finset.range L, ∑ _h ∈ Finset.range H, ∑ t ∈ Finset.range T, ds t :=
    measureReal_biUnion_le_sum (Finset.range L) _ _ fun l _ => h2 l
  have hcount : ∑ _l ∈ Finset.range L, ∑ _h ∈ Finset.range H, ∑ t ∈ Finset.range T, ds t
      = (L : ℝ) * ((H : ℝ) * ∑ t ∈ Finset.range T, ds t) := by
    simp only [Finset.sum_const, Finset.card_range, nsmul_eq_mul]
  -- `Finset.mul_sum`: Algebra/BigOperators/Ring/Finset.lean
  have hmul : ∑ t ∈ Finset.range T, (L : ℝ) * H * ds t = (L : ℝ) * H * ∑ t ∈ Finset.range T, ds t :=
    (Finset.mul_sum (Finset.range T) ds ((L : ℝ) * H)).symm
  -- linear in the monomial `L · H · Σ_t δ_t`
  linarith [h1, hcount, hmul, hbudget]

/-- `request_tv_sound` with the fixed-horizon schedule `δ_step = δ_req / (L H T_max)`. -/
theorem request_tv_sound_fixed {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {κ d : Type*} [Fintype κ] [DecidableEq κ] [Fintype d]
    (delta_req : ℝ) (hδ : 0 < delta_req) (L H T_max : ℕ) (hL : 0 < L) (hH : 0 < H)
    (hT : 0 < T_max) (hδn : budgetFixed delta_req L H T_max ≤ 2 * Fintype.card κ)
    (r e : ℕ → ℕ → ℕ → κ → d → Ω → ℝ) (hind : ∀ l h t j, iIndepFun (r l h t j) μ)
    (c : ℕ → ℕ → ℕ → κ → d → ℝ≥0)
    (hsub : ∀ l h t j i, HasSubgaussianMGF (r l h t j i) (c l h t j i) μ)
    (q : ℕ → ℕ → ℕ → d → ℝ) (beta : ℕ → ℕ → ℕ → κ → d → ℝ)
    (hclose : ∀ l h t j i ω, |e l h t j i ω - r l h t j i ω| ≤ beta l h t j i)
    (sigma : ℝ) (V b tt : ℕ → ℕ → ℕ → κ → ℝ)
    (hV : ∀ l h t j, V l h t j = sigma ^ 2 * ∑ i, q l h t i ^ 2 * (c l h t j i : ℝ))
    (hVpos : ∀ l h t j, 0 < V l h t j)
    (hb : ∀ l h t j, b l h t j = |sigma| * ∑ i, |q l h t i| * beta l h t j i)
    (htt : ∀ l h t j, tt l h t j
      = ditherRadius (V l h t j) (Fintype.card κ) (budgetFixed delta_req L H T_max) + b l h t j)
    (phat p dl : ℕ → ℕ → ℕ → Ω → κ → ℝ)
    (hdl : ∀ l h t ω j, dl l h t ω j = sigma * ∑ i, q l h t i * e l h t j i ω)
    (htilt : ∀ l h t ω, IsTilt (phat l h t ω) (dl l h t ω) (p l h t ω))
    (TVup : ℕ → ℕ → ℕ → Ω → ℝ)
    (hF : ∀ l h t ω (d' : κ → ℝ), IsTilt (phat l h t ω) d' (p l h t ω) →
      (∀ j, |d' j| ≤ tt l h t j) → tv (p l h t ω) (phat l h t ω) ≤ TVup l h t ω)
    (Ev : ℕ → ℕ → ℕ → Set Ω)
    (hEv : ∀ l h t, Ev l h t = {ω | TVup l h t ω < tv (p l h t ω) (phat l h t ω)}) :
    μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T_max, Ev l h t)
      ≤ delta_req := by
  -- `Nat.cast_pos`: Data/Nat/Cast/Order/Ring.lean:59
  have hL' : (0 : ℝ) < L := Nat.cast_pos.mpr hL
  have hH' : (0 : ℝ) < H := Nat.cast_pos.mpr hH
  have hT' : (0 : ℝ) < T_max := Nat.cast_pos.mpr hT
  have hpos : 0 < budgetFixed delta_req L H T_max := by
    unfold budgetFixed
    exact div_pos hδ (mul_pos (mul_pos hL' hH') hT')
  have hbudget : ∑ _t ∈ Finset.range T_max, (L : ℝ) * H * budgetFixed delta_req L H T_max
      ≤ delta_req :=
    le_of_eq (request_budget_sound delta_req hδ.le L H T_max T_max hL hH hT).1
  exact request_tv_sound delta_req L H T_max (fun _ => budgetFixed delta_req L H T_max)
    (fun _ => hpos) (fun _ => hδn) hbudget r e hind c hsub q beta hclose sigma V b tt hV hVpos hb
    htt phat p dl hdl htilt TVup hF Ev hEv

/-- `request_tv_sound` with the anytime schedule `δ_step(t) = δ_req · 6/(π² t²) / (L H)`: any
horizon `T`. -/
theorem request_tv_sound_anytime {Ω : Type*} [MeasurableSpace Ω] {μ : Measure Ω}
    {κ d : Type*} [Fintype κ] [DecidableEq κ] [Fintype d]
    (delta_req : ℝ) (hδ : 0 < delta_req) (L H T : ℕ) (hL : 0 < L) (hH : 0 < H)
    (hδn : ∀ t : ℕ, budgetAnytime delta_req L H ((t : ℝ) + 1) ≤ 2 * Fintype.card κ)
    (r e : ℕ → ℕ → ℕ → κ → d → Ω → ℝ) (hind : ∀ l h t j, iIndepFun (r l h t j) μ)
    (c : ℕ → ℕ → ℕ → κ → d → ℝ≥0)
    (hsub : ∀ l h t j i, HasSubgaussianMGF (r l h t j i) (c l h t j i) μ)
    (q : ℕ → ℕ → ℕ → d → ℝ) (beta : ℕ → ℕ → ℕ → κ → d → ℝ)
    (hclose : ∀ l h t j i ω, |e l h t j i ω - r l h t j i ω| ≤ beta l h t j i)
    (sigma : ℝ) (V b tt : ℕ → ℕ → ℕ → κ → ℝ)
    (hV : ∀ l h t j, V l h t j = sigma ^ 2 * ∑ i, q l h t i ^ 2 * (c l h t j i : ℝ))
    (hVpos : ∀ l h t j, 0 < V l h t j)
    (hb : ∀ l h t j, b l h t j = |sigma| * ∑ i, |q l h t i| * beta l h t j i)
    (htt : ∀ l h t j, tt l h t j = ditherRadius (V l h t j) (Fintype.card κ)
      (budgetAnytime delta_req L H ((t : ℝ) + 1)) + b l h t j)
    (phat p dl : ℕ → ℕ → ℕ → Ω → κ → ℝ)
    (hdl : ∀ l h t ω j, dl l h t ω j = sigma * ∑ i, q l h t i * e l h t j i ω)
    (htilt : ∀ l h t ω, IsTilt (phat l h t ω) (dl l h t ω) (p l h t ω))
    (TVup : ℕ → ℕ → ℕ → Ω → ℝ)
    (hF : ∀ l h t ω (d' : κ → ℝ), IsTilt (phat l h t ω) d' (p l h t ω) →
      (∀ j, |d' j| ≤ tt l h t j) → tv (p l h t ω) (phat l h t ω) ≤ TVup l h t ω)
    (Ev : ℕ → ℕ → ℕ → Set Ω)
    (hEv : ∀ l h t, Ev l h t = {ω | TVup l h t ω < tv (p l h t ω) (phat l h t ω)}) :
    μ.real (⋃ l ∈ Finset.range L, ⋃ h ∈ Finset.range H, ⋃ t ∈ Finset.range T, Ev l h t)
      ≤ delta_req := by
  have hL' : (0 : ℝ) < L := Nat.cast_pos.mpr hL
  have hH' : (0 : ℝ) < H := Nat.cast_pos.mpr hH
  have hpos : ∀ t : ℕ, 0 < budgetAnytime delta_req L H ((t : ℝ) + 1) := by
    intro t
    have ht1 : (0 : ℝ) < (t : ℝ) + 1 := by positivity
    have hden : 0 < Real.pi ^ 2 * ((t : ℝ) + 1) ^ 2 :=
      mul_pos (pow_pos Real.pi_pos 2) (pow_pos ht1 2)
    unfold budgetAnytime
    exact div_pos (div_pos (mul_pos hδ (by norm_num)) hden) (mul_pos hL' hH')
  -- `request_budget_sound` (Budget.lean) needs `0 < T_max` for its first half only
  have hbudget : ∑ t ∈ Finset.range T, (L : ℝ) * H * budgetAnytime delta_req L H ((t : ℝ) + 1)
      ≤ delta_req :=
    (request_budget_sound delta_req hδ.le L H 1 T hL hH Nat.one_pos).2
  exact request_tv_sound delta_req L H T (fun t => budgetAnytime delta_req L H ((t : ℝ) + 1))
    hpos hδn hbudget r e hind c hsub q beta hclose sigma V b tt hV hVpos hb htt phat p dl hdl
    htilt TVup hF Ev hEv

end WitCert
