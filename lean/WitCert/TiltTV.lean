import Mathlib

/-!
# From radii to a TV bound (SPEC §3)

`p` is the tilt of the served distribution `phat` by the logit errors `delta`
(`p j = phat j · e^{-δ_j} / Σ_i phat i · e^{-δ_i}`, SPEC §0) and `|δ_j| ≤ ε_j`.

* `tv_eq_max_gain` — SPEC §0/§9: TV is the largest gain `p(S) − q(S)` over sets `S`;
  `witcert.bounds.tv` and the brute force `tv_sup_bruteforce` of the tests.
* `tilt_tv_le_tanh` — SPEC §3(a): `TV ≤ tanh(ε_max / 2)`; `witcert.bounds.tv_bound_tanh`,
  `kernels/epilogue.py` (the `tanh` column of the meter record).
* `tilt_tv_le_tanh_osc` — SPEC §3(a), `TV ≤ tanh(osc/4)` (shift `δ` to the midpoint of its
  range: `IsTilt.shift`); `tilt_tv_le_tanh_top2` — `TV ≤ tanh((ε₍₁₎ + ε₍₂₎)/4)`. The code uses
  the `ε_max` form today; these are the sharper forms SPEC §3(a) states.
* `tilt_tv_le_eform` — SPEC §3(b): `TV ≤ (A² − 1)/2`, `A = Σ_j p̂_j e^{ε_j}`;
  `witcert.bounds.tv_bound_eform`, `kernels/epilogue.py` (`eform`).
* `tilt_tv_le_dual_grid` — SPEC §3(c): for any finite family of intervals `[lo i, hi i]`
  covering `[0, 1]` (a grid `0 = t_0 < … < t_N = 1` gives `[t_i, t_{i+1}]`) and any
  `λ_i ≥ 0`, `TV ≤ max_i (hi i − D(lo i, λ_i))`; `witcert.bounds.tv_bound_tilt`,
  `kernels/epilogue.py` (`_dual_lower`, `_epilogue_kernel`). Rounding radii up onto levels
  keeps `|δ_j| ≤ ε_j`, so the histogram form of the kernel is an instance.
-/

namespace WitCert

open Finset

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- Total variation `½ Σ_j |p_j − q_j|`. -/
noncomputable def tv (p q : ι → ℝ) : ℝ := (∑ j, |p j - q j|) / 2

/-- The largest gain `p(S) − q(S)` over all sets `S` of tokens. -/
noncomputable def maxGain (p q : ι → ℝ) : ℝ :=
  (Finset.univ : Finset (Finset ι)).sup' Finset.univ_nonempty (fun S => ∑ j ∈ S, (p j - q j))

lemma max_zero_eq (a : ℝ) : max a 0 = (|a| + a) / 2 := by
  rcases le_total a 0 with h | h
  · rw [max_eq_right h, abs_of_nonpos h]; ring
  · rw [max_eq_left h, abs_of_nonneg h]; ring

lemma tv_eq_sum_pos (p q : ι → ℝ) (h : ∑ j, p j = ∑ j, q j) :
    tv p q = ∑ j, max (p j - q j) 0 := by
  have h0 : ∑ j, (p j - q j) = 0 := by rw [Finset.sum_sub_distrib, h, sub_self]
  simp only [max_zero_eq]
  rw [← Finset.sum_div, Finset.sum_add_distrib, h0, add_zero]
  rfl

lemma gain_le_tv (p q : ι → ℝ) (h : ∑ j, p j = ∑ j, q j) (S : Finset ι) :
    ∑ j ∈ S, (p j - q j) ≤ tv p q := by
  rw [tv_eq_sum_pos p q h]
  calc ∑ j ∈ S, (p j - q j) ≤ ∑ j ∈ S, max (p j - q j) 0 :=
        Finset.sum_le_sum fun j _ => le_max_left _ _
    _ ≤ ∑ j, max (p j - q j) 0 :=
        Finset.sum_le_sum_of_subset_of_nonneg (Finset.subset_univ S) fun j _ _ => le_max_right _ _

lemma tv_eq_gain_pos (p q : ι → ℝ) (h : ∑ j, p j = ∑ j, q j) :
    tv p q = ∑ j ∈ Finset.univ.filter (fun j => q j < p j), (p j - q j) := by
  rw [tv_eq_sum_pos p q h, Finset.sum_filter]
  refine Finset.sum_congr rfl fun j _ => ?_
  split_ifs with hj
  · exact max_eq_left (by linarith)
  · exact max_eq_right (by push_neg at hj; linarith)

/-- SPEC §0: `TV(p, q) = max_S (p(S) − q(S))`. -/
theorem tv_eq_max_gain (p q : ι → ℝ) (hp : ∑ j, p j = 1) (hq : ∑ j, q j = 1) :
    tv p q = maxGain p q := by
  have h : ∑ j, p j = ∑ j, q j := by rw [hp, hq]
  unfold maxGain
  apply le_antisymm
  · rw [tv_eq_gain_pos p q h]
    exact Finset.le_sup' (fun S => ∑ j ∈ S, (p j - q j)) (Finset.mem_univ _)
  · exact Finset.sup'_le _ _ fun S _ => gain_le_tv p q h S

lemma tv_le_of_gain_le (p q : ι → ℝ) (h : ∑ j, p j = ∑ j, q j) (B : ℝ)
    (hB : ∀ S : Finset ι, ∑ j ∈ S, p j - ∑ j ∈ S, q j ≤ B) : tv p q ≤ B := by
  rw [tv_eq_gain_pos p q h, Finset.sum_sub_distrib]
  exact hB _

/-- `p` is the tilt of the served distribution `phat` (all entries positive, summing to 1)
by the logit errors `delta` (SPEC §0). -/
structure IsTilt (phat delta p : ι → ℝ) : Prop where
  pos : ∀ j, 0 < phat j
  sum_one : ∑ j, phat j = 1
  eq : ∀ j, p j = phat j * Real.exp (-delta j) / ∑ i, phat i * Real.exp (-delta i)

section Tilt

variable {phat delta p : ι → ℝ}

lemma IsTilt.nonempty (ht : IsTilt phat delta p) : (Finset.univ : Finset ι).Nonempty := by
  have h : ∑ j, phat j ≠ 0 := by rw [ht.sum_one]; exact one_ne_zero
  -- `Finset.nonempty_of_sum_ne_zero` (additive form of Algebra/BigOperators/Group/Finset/Defs.lean:575)
  exact Finset.nonempty_of_sum_ne_zero (s := Finset.univ) (f := phat) h

lemma IsTilt.sum_pos (ht : IsTilt phat delta p) (f : ι → ℝ) :
    0 < ∑ i, phat i * Real.exp (f i) :=
  Finset.sum_pos (fun i _ => mul_pos (ht.pos i) (Real.exp_pos _)) ht.nonempty

lemma IsTilt.sum_p (ht : IsTilt phat delta p) : ∑ j, p j = 1 := by
  simp only [ht.eq]
  rw [← Finset.sum_div, div_self (ne_of_gt (ht.sum_pos (fun i => -delta i)))]

lemma IsTilt.sum_eq (ht : IsTilt phat delta p) : ∑ j, p j = ∑ j, phat j := by
  rw [ht.sum_p, ht.sum_one]

lemma eps_nonneg (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (j : ι) : 0 ≤ eps j :=
  (abs_nonneg _).trans (heps j)

lemma exp_neg_delta_le (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (j : ι) :
    Real.exp (-delta j) ≤ Real.exp (eps j) :=
  Real.exp_le_exp.mpr (by linarith [neg_le_abs (delta j), heps j])

lemma exp_neg_eps_le (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (j : ι) :
    Real.exp (-eps j) ≤ Real.exp (-delta j) :=
  Real.exp_le_exp.mpr (by have := le_abs_self (delta j); have := heps j; linarith)

/-- Quotients with a larger numerator and a smaller complement: `a/(a+b) ≤ A/(A+C)`. -/
lemma frac_le_frac {a b A C : ℝ} (ha : 0 ≤ a) (hC : 0 ≤ C) (haA : a ≤ A) (hCb : C ≤ b)
    (hab : 0 < a + b) (hAC : 0 < A + C) : a / (a + b) ≤ A / (A + C) := by
  -- `div_le_div_iff₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1418
  rw [div_le_div_iff₀ hab hAC]
  have hA : 0 ≤ A := ha.trans haA
  -- `a C ≤ A C ≤ A b`; the rest is linear in the monomials (no `nlinarith`)
  have h1 : a * C ≤ A * C := mul_le_mul_of_nonneg_right haA hC
  have h2 : A * C ≤ A * b := mul_le_mul_of_nonneg_left hCb hA
  have e1 : a * (A + C) = a * A + a * C := by ring
  have e2 : A * (a + b) = a * A + A * b := by ring
  rw [e1, e2]
  linarith

/-- `p(S) ≤ A_S / (A_S + C_S)` (raise `S`, lower the rest; SPEC §3(c)). -/
lemma tilt_mass_le (ht : IsTilt phat delta p) (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j)
    (S : Finset ι) :
    ∑ j ∈ S, p j ≤ (∑ j ∈ S, phat j * Real.exp (eps j)) /
      (∑ j ∈ S, phat j * Real.exp (eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j)) := by
  have hZ : 0 < ∑ j, phat j * Real.exp (-delta j) := ht.sum_pos (fun i => -delta i)
  have hsplit : ∑ j ∈ S, phat j * Real.exp (-delta j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-delta j)
      = ∑ j, phat j * Real.exp (-delta j) := Finset.sum_add_sum_compl S _
  have hpS : ∑ j ∈ S, p j = (∑ j ∈ S, phat j * Real.exp (-delta j)) /
      (∑ j ∈ S, phat j * Real.exp (-delta j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-delta j)) := by
    rw [hsplit]
    simp only [ht.eq]
    rw [Finset.sum_div]
  rw [hpS]
  have hm : 0 < ∑ j, phat j * Real.exp (-eps j) := ht.sum_pos (fun i => -eps i)
  have hm' : ∑ j ∈ S, phat j * Real.exp (-eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j)
      = ∑ j, phat j * Real.exp (-eps j) := Finset.sum_add_sum_compl S _
  have hAS : ∑ j ∈ S, phat j * Real.exp (-eps j) ≤ ∑ j ∈ S, phat j * Real.exp (eps j) :=
    Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left
      (Real.exp_le_exp.mpr (by linarith [eps_nonneg eps heps j])) (ht.pos j).le
  apply frac_le_frac
  · exact Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  · exact Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  · exact Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_delta_le eps heps j) (ht.pos j).le
  · exact Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_eps_le eps heps j) (ht.pos j).le
  · rw [hsplit]; exact hZ
  · linarith

/-- The one-variable inequality behind §3(a), with `w = e^{ε/2}`, `w' = e^{-ε/2}`. -/
lemma tanh_algebra (w w' x : ℝ) (hw' : 0 < w') (hww : w' ≤ w) (hx0 : 0 ≤ x) (hx1 : x ≤ 1) :
    w * w * x / (w * w * x + w' * w' * (1 - x)) - x ≤ (w - w') / (w + w') := by
  have hw2 : w' * w' ≤ w * w := mul_self_le_mul_self hw'.le hww
  have hP : 0 < w * w * x + w' * w' * (1 - x) := by
    -- `w'² x ≤ w² x`, so the sum is at least `w'² x + w'² (1 − x) = w'² > 0`
    have h1 : w' * w' * x ≤ w * w * x := mul_le_mul_of_nonneg_right hw2 hx0
    have h2 : 0 < w' * w' := mul_pos hw' hw'
    have e : w' * w' * x + w' * w' * (1 - x) = w' * w' := by ring
    linarith
  have hP' := ne_of_gt hP
  have hs : 0 < w + w' := by linarith
  have hkey : w * w * x / (w * w * x + w' * w' * (1 - x)) - x
      = x * (1 - x) * (w * w - w' * w') / (w * w * x + w' * w' * (1 - x)) := by
    rw [eq_div_iff hP', sub_mul, div_mul_cancel₀ _ hP']
    ring
  rw [hkey, div_le_div_iff₀ hP hs]
  -- the difference of the two sides is `(w − w') (w x − w' (1 − x))² ≥ 0` (an identity)
  have hsq : 0 ≤ (w - w') * (w * x - w' * (1 - x)) ^ 2 :=
    mul_nonneg (sub_nonneg.2 hww) (sq_nonneg (w * x - w' * (1 - x)))
  have hid : (w - w') * (w * w * x + w' * w' * (1 - x))
      - x * (1 - x) * (w * w - w' * w') * (w + w') = (w - w') * (w * x - w' * (1 - x)) ^ 2 := by
    ring
  linarith

/-- SPEC §3(a): `TV ≤ tanh(ε_max / 2)` when every `|δ_j| ≤ ε_max`. -/
theorem tilt_tv_le_tanh (ht : IsTilt phat delta p) (eps_max : ℝ)
    (heps : ∀ j, |delta j| ≤ eps_max) :
    tv p phat ≤ Real.tanh (eps_max / 2) := by
  obtain ⟨j0, -⟩ := ht.nonempty
  have he : 0 ≤ eps_max := (abs_nonneg _).trans (heps j0)
  apply tv_le_of_gain_le p phat ht.sum_eq
  intro S
  have hcompl : ∑ j ∈ Sᶜ, phat j = 1 - ∑ j ∈ S, phat j := by
    have h := Finset.sum_add_sum_compl S phat
    rw [ht.sum_one] at h
    linarith
  have hx0 : 0 ≤ ∑ j ∈ S, phat j := Finset.sum_nonneg fun j _ => (ht.pos j).le
  have hx1 : ∑ j ∈ S, phat j ≤ 1 := by
    have : 0 ≤ ∑ j ∈ Sᶜ, phat j := Finset.sum_nonneg fun j _ => (ht.pos j).le
    linarith
  have hmass : ∑ j ∈ S, p j ≤ (∑ j ∈ S, phat j * Real.exp eps_max) /
      (∑ j ∈ S, phat j * Real.exp eps_max + ∑ j ∈ Sᶜ, phat j * Real.exp (-eps_max)) :=
    tilt_mass_le ht (fun _ => eps_max) heps S
  rw [← Finset.sum_mul, ← Finset.sum_mul, hcompl] at hmass
  have hu : Real.exp eps_max = Real.exp (eps_max / 2) * Real.exp (eps_max / 2) := by
    rw [← Real.exp_add]; congr 1; ring
  have hv : Real.exp (-eps_max) = Real.exp (-(eps_max / 2)) * Real.exp (-(eps_max / 2)) := by
    rw [← Real.exp_add]; congr 1; ring
  rw [hu, hv] at hmass
  have halg := tanh_algebra (Real.exp (eps_max / 2)) (Real.exp (-(eps_max / 2))) (∑ j ∈ S, phat j)
    (Real.exp_pos _) (Real.exp_le_exp.mpr (by linarith)) hx0 hx1
  have e1 : (∑ j ∈ S, phat j) * (Real.exp (eps_max / 2) * Real.exp (eps_max / 2))
      = Real.exp (eps_max / 2) * Real.exp (eps_max / 2) * ∑ j ∈ S, phat j := by ring
  have e2 : (1 - ∑ j ∈ S, phat j) * (Real.exp (-(eps_max / 2)) * Real.exp (-(eps_max / 2)))
      = Real.exp (-(eps_max / 2)) * Real.exp (-(eps_max / 2)) * (1 - ∑ j ∈ S, phat j) := by ring
  rw [e1, e2] at hmass
  rw [Real.tanh_eq]
  linarith

/-- `u + y ≥ 2` when `u, y > 0` and `u y ≥ 1` (AM–GM), by explicit steps. -/
lemma two_le_add_of_one_le_mul {u y : ℝ} (hu : 0 < u) (hy : 0 < y) (h : 1 ≤ u * y) :
    2 ≤ u + y := by
  by_contra hlt
  push_neg at hlt
  have hs : 0 < u + y := by linarith
  -- `mul_lt_mul_of_pos_right`: Algebra/Order/GroupWithZero/Unbundled/Defs.lean:236
  have h1 : (u + y) * (u + y) < 2 * (u + y) := mul_lt_mul_of_pos_right hlt hs
  have h2 : (u + y) * (u + y) = (u - y) * (u - y) + 4 * (u * y) := by ring
  -- `mul_self_nonneg`: Algebra/Order/Ring/Unbundled/Basic.lean:711
  have h3 : 0 ≤ (u - y) * (u - y) := mul_self_nonneg (u - y)
  -- `(u + y)² ≥ 4 u y ≥ 4` against `(u + y)² < 2 (u + y) < 4`: linear in the monomials
  linarith

/-- The tilt is unchanged when every logit error moves by the same constant `c`. -/
lemma IsTilt.shift (ht : IsTilt phat delta p) (c : ℝ) : IsTilt phat (fun j => delta j - c) p := by
  refine ⟨ht.pos, ht.sum_one, fun j => ?_⟩
  show p j = phat j * Real.exp (-(delta j - c)) / ∑ i, phat i * Real.exp (-(delta i - c))
  have he : ∀ i, Real.exp (-(delta i - c)) = Real.exp (-delta i) * Real.exp c := by
    intro i
    rw [← Real.exp_add]
    congr 1
    ring
  have hsum : ∑ i, phat i * Real.exp (-(delta i - c))
      = (∑ i, phat i * Real.exp (-delta i)) * Real.exp c := by
    rw [Finset.sum_mul]
    exact Finset.sum_congr rfl fun i _ => by rw [he i, mul_assoc]
  have hZ : 0 < ∑ i, phat i * Real.exp (-delta i) := ht.sum_pos (fun i => -delta i)
  have hc : 0 < Real.exp c := Real.exp_pos c
  rw [ht.eq j, hsum, he j]
  -- `div_eq_div_iff`: Algebra/GroupWithZero/Units/Basic.lean:415
  rw [div_eq_div_iff hZ.ne' (mul_pos hZ hc).ne']
  ring

/-- SPEC §3(a), oscillation form: `TV ≤ tanh(osc/4)` when every `δ_i − δ_j ≤ osc`
(`osc = max δ − min δ`). Shift `δ` to the midpoint of its range, then `tilt_tv_le_tanh`. -/
theorem tilt_tv_le_tanh_osc (ht : IsTilt phat delta p) (osc : ℝ)
    (hosc : ∀ i j, delta i - delta j ≤ osc) :
    tv p phat ≤ Real.tanh (osc / 4) := by
  -- `Finset.exists_max_image` / `exists_min_image`: Data/Finset/Max.lean:523, :529
  obtain ⟨a, -, ha⟩ := Finset.exists_max_image Finset.univ delta ht.nonempty
  obtain ⟨b, -, hb⟩ := Finset.exists_min_image Finset.univ delta ht.nonempty
  have hab : delta a - delta b ≤ osc := hosc a b
  have hshift : ∀ j, |delta j - (delta a + delta b) / 2| ≤ osc / 2 := by
    intro j
    have h1 : delta j ≤ delta a := ha j (Finset.mem_univ j)
    have h2 : delta b ≤ delta j := hb j (Finset.mem_univ j)
    rw [abs_le]
    constructor
    · linarith
    · linarith
  have h := tilt_tv_le_tanh (ht.shift ((delta a + delta b) / 2)) (osc / 2) hshift
  have e : osc / 2 / 2 = osc / 4 := by ring
  rw [e] at h
  exact h

/-- SPEC §3(a), top-two form: `TV ≤ tanh((ε₍₁₎ + ε₍₂₎)/4)`, where `e12 ≥ 0` bounds the sum of
any two distinct radii (the two largest give the least such `e12`). -/
theorem tilt_tv_le_tanh_top2 (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (e12 : ℝ) (h12 : ∀ i j, i ≠ j → eps i + eps j ≤ e12)
    (h0 : 0 ≤ e12) :
    tv p phat ≤ Real.tanh (e12 / 4) := by
  refine tilt_tv_le_tanh_osc ht e12 fun i j => ?_
  by_cases hij : i = j
  · rw [hij, sub_self]
    exact h0
  · have hi := heps i
    have hj := heps j
    have hi' : delta i ≤ |delta i| := le_abs_self (delta i)
    have hj' : -delta j ≤ |delta j| := neg_le_abs (delta j)
    have h := h12 i j hij
    linarith

/-- SPEC §3(b): `TV ≤ (A² − 1)/2` with `A = Σ_j p̂_j e^{ε_j}`. -/
theorem tilt_tv_le_eform (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (A : ℝ) (hA : A = ∑ j, phat j * Real.exp (eps j)) :
    tv p phat ≤ (A ^ 2 - 1) / 2 := by
  set Z := ∑ i, phat i * Real.exp (-delta i) with hZdef
  have hZ : 0 < Z := ht.sum_pos (fun i => -delta i)
  -- Cauchy–Schwarz: A · Σ p̂ e^{-ε} ≥ (Σ p̂)² = 1
  have hcs : 1 ≤ A * ∑ j, phat j * Real.exp (-eps j) := by
    have h := Finset.sum_mul_sq_le_sq_mul_sq Finset.univ
      (fun j => Real.sqrt (phat j) * Real.exp (eps j / 2))
      (fun j => Real.sqrt (phat j) * Real.exp (-eps j / 2))
    have h1 : ∀ j, Real.sqrt (phat j) * Real.exp (eps j / 2) *
        (Real.sqrt (phat j) * Real.exp (-eps j / 2)) = phat j := by
      intro j
      have hs := Real.mul_self_sqrt (ht.pos j).le
      have he : Real.exp (eps j / 2) * Real.exp (-eps j / 2) = 1 := by
        rw [← Real.exp_add, show eps j / 2 + -eps j / 2 = 0 by ring, Real.exp_zero]
      calc Real.sqrt (phat j) * Real.exp (eps j / 2) * (Real.sqrt (phat j) * Real.exp (-eps j / 2))
          = (Real.sqrt (phat j) * Real.sqrt (phat j)) *
              (Real.exp (eps j / 2) * Real.exp (-eps j / 2)) := by ring
        _ = phat j := by rw [hs, he, mul_one]
    have h2 : ∀ j, (Real.sqrt (phat j) * Real.exp (eps j / 2)) ^ 2 = phat j * Real.exp (eps j) := by
      intro j
      have hx : Real.exp (eps j / 2) ^ 2 = Real.exp (eps j) := by
        rw [sq, ← Real.exp_add]; congr 1; ring
      rw [mul_pow, Real.sq_sqrt (ht.pos j).le, hx]
    have h3 : ∀ j, (Real.sqrt (phat j) * Real.exp (-eps j / 2)) ^ 2
        = phat j * Real.exp (-eps j) := by
      intro j
      have hx : Real.exp (-eps j / 2) ^ 2 = Real.exp (-eps j) := by
        rw [sq, ← Real.exp_add]; congr 1; ring
      rw [mul_pow, Real.sq_sqrt (ht.pos j).le, hx]
    simp only [h1, h2, h3, ht.sum_one] at h
    rw [hA]
    linarith
  have hA1 : 1 ≤ A := by
    rw [hA, ← ht.sum_one]
    exact Finset.sum_le_sum fun j _ =>
      le_mul_of_one_le_right (ht.pos j).le (Real.one_le_exp (eps_nonneg eps heps j))
  have hmZ : ∑ j, phat j * Real.exp (-eps j) ≤ Z :=
    Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left (exp_neg_eps_le eps heps j) (ht.pos j).le
  have hZA : Z ≤ A := by
    rw [hA]
    exact Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_delta_le eps heps j) (ht.pos j).le
  have hAZ : 1 ≤ A * Z := by
    have := mul_le_mul_of_nonneg_left hmZ (by linarith : (0 : ℝ) ≤ A)
    linarith
  -- per token: |p_j − p̂_j| ≤ p̂_j (A e^{ε_j} − 1)
  have hterm : ∀ j, |p j - phat j| ≤ phat j * (A * Real.exp (eps j) - 1) := by
    intro j
    have hu := exp_neg_delta_le eps heps j
    have hl := exp_neg_eps_le eps heps j
    have hpj : p j - phat j = phat j * (Real.exp (-delta j) / Z - 1) := by
      rw [ht.eq j, ← hZdef]; ring
    rw [hpj, abs_mul, abs_of_pos (ht.pos j)]
    refine mul_le_mul_of_nonneg_left ?_ (ht.pos j).le
    have hApos : 0 < A := by linarith
    have hy : 0 < A * Real.exp (eps j) := mul_pos hApos (Real.exp_pos _)
    have hup : Real.exp (-delta j) / Z ≤ A * Real.exp (eps j) := by
      rw [div_le_iff₀ hZ]
      have h1 : Real.exp (eps j) * 1 ≤ Real.exp (eps j) * (A * Z) :=
        mul_le_mul_of_nonneg_left hAZ (Real.exp_pos (eps j)).le
      calc Real.exp (-delta j) ≤ Real.exp (eps j) := hu
        _ = Real.exp (eps j) * 1 := (mul_one _).symm
        _ ≤ Real.exp (eps j) * (A * Z) := h1
        _ = A * Real.exp (eps j) * Z := by ring
    have hlo : 1 ≤ Real.exp (-delta j) / Z * (A * Real.exp (eps j)) := by
      have h1 : Real.exp (-eps j) * Real.exp (eps j) = 1 := by
        rw [← Real.exp_add, show -eps j + eps j = 0 by ring, Real.exp_zero]
      have h2 : 1 ≤ Real.exp (-delta j) * Real.exp (eps j) := by
        have := mul_le_mul_of_nonneg_right hl (Real.exp_pos (eps j)).le
        linarith
      rw [div_mul_eq_mul_div, le_div_iff₀ hZ]
      have h3 : A * 1 ≤ A * (Real.exp (-delta j) * Real.exp (eps j)) :=
        mul_le_mul_of_nonneg_left h2 hApos.le
      calc 1 * Z = Z := one_mul Z
        _ ≤ A := hZA
        _ = A * 1 := (mul_one A).symm
        _ ≤ A * (Real.exp (-delta j) * Real.exp (eps j)) := h3
        _ = Real.exp (-delta j) * (A * Real.exp (eps j)) := by ring
    have hu0 : 0 < Real.exp (-delta j) / Z := div_pos (Real.exp_pos _) hZ
    -- the lower side needs `u + y ≥ 2` from `u y ≥ 1`: a separate lemma with a small context
    have h2 : 2 ≤ Real.exp (-delta j) / Z + A * Real.exp (eps j) :=
      two_le_add_of_one_le_mul hu0 hy hlo
    rw [abs_le]
    constructor
    · linarith
    · linarith
  have hsum : ∑ j, phat j * (A * Real.exp (eps j) - 1) = A ^ 2 - 1 := by
    simp only [mul_sub, mul_one]
    rw [Finset.sum_sub_distrib, ht.sum_one]
    have : ∑ j, phat j * (A * Real.exp (eps j)) = A * A := by
      calc ∑ j, phat j * (A * Real.exp (eps j)) = A * ∑ j, phat j * Real.exp (eps j) := by
            rw [Finset.mul_sum]; exact Finset.sum_congr rfl fun j _ => by ring
        _ = A * A := by rw [← hA]
    rw [this]; ring
  unfold tv
  have := Finset.sum_le_sum fun j (_ : j ∈ Finset.univ) => hterm j
  rw [hsum] at this
  linarith

/-- `β_j(t) = (1 − t) e^{ε_j} + t e^{−ε_j}` (SPEC §3(c)). -/
noncomputable def beta (t x : ℝ) : ℝ := (1 - t) * Real.exp x + t * Real.exp (-x)

/-- The weak-duality value `D(t, λ) = λ t m − Σ_j p̂_j (λ β_j(t) − 1)₊`, `m = Σ_j p̂_j e^{−ε_j}`. -/
noncomputable def dualD (phat eps : ι → ℝ) (t lam : ℝ) : ℝ :=
  lam * t * (∑ j, phat j * Real.exp (-eps j)) - ∑ j, phat j * max (lam * beta t (eps j) - 1) 0

lemma dualD_mono (phat eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (he : ∀ j, 0 ≤ eps j)
    {t t' lam : ℝ} (hlam : 0 ≤ lam) (htt : t ≤ t') : dualD phat eps t lam ≤ dualD phat eps t' lam := by
  unfold dualD
  have hm : 0 ≤ ∑ j, phat j * Real.exp (-eps j) :=
    Finset.sum_nonneg fun j _ => mul_nonneg (hp j) (Real.exp_pos _).le
  have h1 : lam * t * (∑ j, phat j * Real.exp (-eps j)) ≤ lam * t' * (∑ j, phat j * Real.exp (-eps j)) :=
    mul_le_mul_of_nonneg_right (mul_le_mul_of_nonneg_left htt hlam) hm
  have h2 : ∑ j, phat j * max (lam * beta t' (eps j) - 1) 0 ≤
      ∑ j, phat j * max (lam * beta t (eps j) - 1) 0 := by
    refine Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left ?_ (hp j)
    refine max_le_max ?_ le_rfl
    have hexp : Real.exp (-eps j) ≤ Real.exp (eps j) := Real.exp_le_exp.mpr (by linarith [he j])
    have hb : beta t' (eps j) ≤ beta t (eps j) := by
      unfold beta
      -- the difference is `(t' − t) (e^{ε} − e^{−ε}) ≥ 0` (an identity)
      have hprod : 0 ≤ (t' - t) * (Real.exp (eps j) - Real.exp (-eps j)) :=
        mul_nonneg (sub_nonneg.2 htt) (sub_nonneg.2 hexp)
      have hid : (1 - t) * Real.exp (eps j) + t * Real.exp (-eps j)
          - ((1 - t') * Real.exp (eps j) + t' * Real.exp (-eps j))
          = (t' - t) * (Real.exp (eps j) - Real.exp (-eps j)) := by ring
      linarith
    have := mul_le_mul_of_nonneg_left hb hlam
    linarith
  linarith

/-- Weak duality: for `t_S = A_S/(A_S + C_S)` and any `λ ≥ 0`, `p̂(S) ≥ D(t_S, λ)`. -/
lemma mass_ge_dualD (phat eps : ι → ℝ) (hp : ∀ j, 0 ≤ phat j) (S : Finset ι) (lam : ℝ)
    (hlam : 0 ≤ lam)
    (hAC : 0 < ∑ j ∈ S, phat j * Real.exp (eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j)) :
    dualD phat eps ((∑ j ∈ S, phat j * Real.exp (eps j)) /
      (∑ j ∈ S, phat j * Real.exp (eps j) + ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j))) lam
      ≤ ∑ j ∈ S, phat j := by
  set A := ∑ j ∈ S, phat j * Real.exp (eps j) with hAdef
  set C := ∑ j ∈ Sᶜ, phat j * Real.exp (-eps j) with hCdef
  set t := A / (A + C) with htdef
  set E := ∑ j ∈ S, phat j * Real.exp (-eps j) with hEdef
  have hm : ∑ j, phat j * Real.exp (-eps j) = E + C :=
    (Finset.sum_add_sum_compl S (fun j => phat j * Real.exp (-eps j))).symm
  -- Σ_S p̂ β(t) = t·m
  have hbeta : ∑ j ∈ S, phat j * beta t (eps j) = t * (E + C) := by
    have hexp : ∑ j ∈ S, phat j * beta t (eps j) = (1 - t) * A + t * E := by
      unfold beta
      rw [hAdef, hEdef, Finset.mul_sum, Finset.mul_sum, ← Finset.sum_add_distrib]
      refine Finset.sum_congr rfl fun j _ => ?_
      ring
    have hne : A + C ≠ 0 := ne_of_gt hAC
    have htAC : t * (A + C) = A := by rw [htdef]; exact div_mul_cancel₀ A hne
    rw [hexp]; linarith
  -- D(t, λ) ≤ Σ_S p̂
  unfold dualD
  rw [hm]
  have hS : ∑ j ∈ S, phat j * max (lam * beta t (eps j) - 1) 0 ≤
      ∑ j, phat j * max (lam * beta t (eps j) - 1) 0 :=
    Finset.sum_le_sum_of_subset_of_nonneg (Finset.subset_univ S)
      fun j _ _ => mul_nonneg (hp j) (le_max_right _ _)
  have hterm : ∀ j ∈ S, phat j * (1 - lam * beta t (eps j)) ≥
      -(phat j * max (lam * beta t (eps j) - 1) 0) := by
    intro j _
    have := mul_le_mul_of_nonneg_left (le_max_left (lam * beta t (eps j) - 1) 0) (hp j)
    linarith
  have hsum := Finset.sum_le_sum hterm
  rw [Finset.sum_neg_distrib] at hsum
  have hid : ∑ j ∈ S, phat j * (1 - lam * beta t (eps j)) =
      ∑ j ∈ S, phat j - lam * ∑ j ∈ S, phat j * beta t (eps j) := by
    rw [Finset.mul_sum, ← Finset.sum_sub_distrib]
    refine Finset.sum_congr rfl fun j _ => ?_
    ring
  rw [hid, hbeta] at hsum
  -- linear in the monomials `lam * t * E`, `lam * t * C` and the sums
  linarith

/-- SPEC §3(c): the dual-grid tilt bound, for any finite cover of `[0, 1]` by intervals and
any multipliers `λ_i ≥ 0`. -/
theorem tilt_tv_le_dual_grid (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) {κ : Type*} (lo hi lam : κ → ℝ) (hlam : ∀ i, 0 ≤ lam i)
    (hcover : ∀ x : ℝ, 0 ≤ x → x ≤ 1 → ∃ i, lo i ≤ x ∧ x ≤ hi i)
    (B : ℝ) (hB : ∀ i, hi i - dualD phat eps (lo i) (lam i) ≤ B) :
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
  have h3 : dualD phat eps (lo i) (lam i) ≤ dualD phat eps t (lam i) :=
    dualD_mono phat eps hp he (hlam i) hlo
  have h4 := hB i
  linarith

end Tilt

end WitCert
