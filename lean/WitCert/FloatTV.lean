import WitCert.TiltTV

/-!
# The floating point of the decode pass (SPEC §7)

The kernel does not hold the served distribution `p̂` exactly: it holds `p̃`, whose log-ratio to
`p̂` is at most `Ξ` per token (`p̃` is a tilt of `p̂` by some `ξ` with `|ξ_j| ≤ Ξ`), and it may
miss the tokens of a set `U` whose masses underflow (the "lost" part). `kernels/epilogue.py`
(module docstring) and `witcert.bounds.tv_bound_parts_logits` add two terms to the §3 bounds:

    TV⁺ = min(tanh, e-form, tilt)(radii ε + Ξ, on p̃) + tanh(Ξ/2) + ρ.

* The Ξ argument. `IsTilt.rebase` / `tilt_rebase`: `p` is a tilt of `p̃` by `δ − ξ`, and
  `|δ_j − ξ_j| ≤ ε_j + Ξ`. `tv_triangle`, `tv_le_tv_perturbed_add_tanh`:
  `TV(p, p̂) ≤ TV(p, p̃) + tanh(Ξ/2)` (`tilt_tv_le_tanh` with `ε_max = Ξ`; the oscillation of `ξ`
  is at most `2Ξ`, so `tilt_tv_le_tanh_osc` gives the same). `tv_le_perturbed_base`: for any
  bound `F` that is sound for every tilt of `p̃` with radii `ε + Ξ` (the §3 bounds are:
  `tilt_tv_le_tanh`, `tilt_tv_le_eform`, `tilt_tv_le_dual_grid` applied to `p̃`),
  `TV(p, p̂) ≤ F + tanh(Ξ/2)`; `tv_le_perturbed_base_tanh` is the instance with `F = tanh`.
* The ρ argument. `restrictNorm q V` is `q` restricted to the kept tokens `V = Uᶜ` and
  renormalised (a distribution on the type `↥V`). `tilt_restrict`: `p' = p|V` is the tilt of
  `p̂' = p̂|V` by the same `δ`. `tv_le_restrict_add_lost`: `TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U)`.
  `tilt_mass_lost_le`: `p(U) ≤ Σ_{j∈U} p̂_j e^{ε_j} / Σ_j p̂_j e^{−ε_j}` (and
  `tilt_mass_lost_le_compl`, the weaker form with the kept tokens' sum in the denominator, which
  `witcert.bounds` uses). `tv_le_restrict_add_rho` puts them together:
  `TV(p, p̂) ≤ TV(p', p̂') + p̂(U) + Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}`; the kernel's
  `ρ = Λ (1 + e^{ε_max + Ξ} / m)` bounds the last two terms when `p̂(U) ≤ Λ` and every radius is
  at most `ε_max + Ξ`.
* The decode pass as one statement (issue 37 (c)): `kernel_tv_sound`. The kernel holds `p̃` (the
  Ξ argument: `p` is a tilt of `p̃` by `δ − ξ`), bins the kept tokens `V = Uᶜ` of `p̃` with radii
  rounded up onto levels `lev_j ≥ ε_j`, all levels at most `ε_max`, raised by `Ξ`, and knows
  `p̃(U) ≤ Λ · p̃(V)` (the lost masses, relative to its denominator) and
  `m ≤ Σ_V p̃_j e^{−(lev_j + Ξ)} / p̃(V)` (its `m`). For any `F` sound for the tilts of `p̃|V` at
  radii `lev + Ξ` (the §3 bounds on the histogram): `TV(p, p̂) ≤ F + tanh(Ξ/2) + ρ`,
  `ρ = Λ (1 + e^{ε_max + Ξ} / m)` — the kernel's `TV⁺` (`kernels/epilogue.py`, module docstring,
  `tv_from_hist_torch`). `kernel_tv_sound_tanh` is the instance `F = tanh((ε_max + Ξ)/2)`.
-/

namespace WitCert

open Finset

variable {ι : Type*} [Fintype ι] [DecidableEq ι]

/-- The triangle inequality for `tv`. -/
lemma tv_triangle (p q r : ι → ℝ) : tv p r ≤ tv p q + tv q r := by
  unfold tv
  have h : ∑ j, |p j - r j| ≤ ∑ j, |p j - q j| + ∑ j, |q j - r j| := by
    rw [← Finset.sum_add_distrib]
    -- `abs_sub_le a b c : |a - c| ≤ |a - b| + |b - c|`: additive form of
    -- `mabs_div_le`, Algebra/Order/Group/Abs.lean:179
    exact Finset.sum_le_sum fun j _ => abs_sub_le (p j) (q j) (r j)
  linarith

section Rebase

variable {phat delta p xi ptilde : ι → ℝ}

/-- `p` (the tilt of `p̂` by `δ`) is the tilt of `p̃` (the tilt of `p̂` by `ξ`) by `δ − ξ`. -/
lemma IsTilt.rebase (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde) :
    IsTilt ptilde (fun j => delta j - xi j) p := by
  have hZx : 0 < ∑ i, phat i * Real.exp (-xi i) := hq.sum_pos (fun i => -xi i)
  have hterm : ∀ i, ptilde i * Real.exp (-(delta i - xi i))
      = phat i * Real.exp (-delta i) / ∑ k, phat k * Real.exp (-xi k) := by
    intro i
    have he : Real.exp (-xi i) * Real.exp (-(delta i - xi i)) = Real.exp (-delta i) := by
      rw [← Real.exp_add]
      congr 1
      ring
    rw [hq.eq i, ← he]
    ring
  have hsum : ∑ i, ptilde i * Real.exp (-(delta i - xi i))
      = (∑ i, phat i * Real.exp (-delta i)) / ∑ k, phat k * Real.exp (-xi k) := by
    rw [Finset.sum_div]
    exact Finset.sum_congr rfl fun i _ => hterm i
  refine ⟨fun j => ?_, hq.sum_p, fun j => ?_⟩
  · rw [hq.eq j]
    exact div_pos (mul_pos (hq.pos j) (Real.exp_pos _)) hZx
  · show p j = ptilde j * Real.exp (-(delta j - xi j)) /
      ∑ i, ptilde i * Real.exp (-(delta i - xi i))
    rw [hsum, hterm j, hp.eq j]
    -- `div_div_div_cancel_right₀`: Algebra/GroupWithZero/Units/Basic.lean:318
    rw [div_div_div_cancel_right₀ hZx.ne']

/-- `|δ_j − ξ_j| ≤ ε_j + Ξ`. -/
lemma abs_sub_le_radius_add {a b e X : ℝ} (ha : |a| ≤ e) (hb : |b| ≤ X) : |a - b| ≤ e + X := by
  have h1 := le_abs_self a
  have h2 := neg_le_abs a
  have h3 := le_abs_self b
  have h4 := neg_le_abs b
  rw [abs_le]
  constructor
  · linarith
  · linarith

/-- SPEC §7, the Ξ argument (composition): `p` is a tilt of `p̃` by `d = δ − ξ`, with radii
`ε + Ξ`. -/
theorem tilt_rebase (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (Xi : ℝ) (hxi : ∀ j, |xi j| ≤ Xi) (d : ι → ℝ)
    (hd : ∀ j, d j = delta j - xi j) :
    IsTilt ptilde d p ∧ ∀ j, |d j| ≤ eps j + Xi := by
  have hdf : d = fun j => delta j - xi j := funext hd
  subst hdf
  exact ⟨hp.rebase hq, fun j => abs_sub_le_radius_add (heps j) (hxi j)⟩

/-- `TV(p, p̂) ≤ TV(p, p̃) + tanh(Ξ/2)`: the triangle inequality and `tilt_tv_le_tanh` for `p̃`. -/
theorem tv_le_tv_perturbed_add_tanh (hq : IsTilt phat xi ptilde) (Xi : ℝ)
    (hxi : ∀ j, |xi j| ≤ Xi) :
    tv p phat ≤ tv p ptilde + Real.tanh (Xi / 2) := by
  have h1 : tv p phat ≤ tv p ptilde + tv ptilde phat := tv_triangle p ptilde phat
  have h2 : tv ptilde phat ≤ Real.tanh (Xi / 2) := tilt_tv_le_tanh hq Xi hxi
  linarith

/-- SPEC §7, the Ξ argument, in the form the kernel uses: any bound `F` sound for the tilts of
`p̃` with radii `ε + Ξ` gives `TV(p, p̂) ≤ F + tanh(Ξ/2)`. -/
theorem tv_le_perturbed_base (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde)
    (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (Xi : ℝ) (hxi : ∀ j, |xi j| ≤ Xi) (F : ℝ)
    (hF : ∀ d : ι → ℝ, IsTilt ptilde d p → (∀ j, |d j| ≤ eps j + Xi) → tv p ptilde ≤ F) :
    tv p phat ≤ F + Real.tanh (Xi / 2) := by
  obtain ⟨ht, hr⟩ := tilt_rebase hp hq eps heps Xi hxi (fun j => delta j - xi j) fun _ => rfl
  have h1 : tv p ptilde ≤ F := hF _ ht hr
  have h2 : tv p phat ≤ tv p ptilde + Real.tanh (Xi / 2) := tv_le_tv_perturbed_add_tanh hq Xi hxi
  linarith

/-- The instance `F = tanh((ε_max + Ξ)/2)` of `tv_le_perturbed_base` (the kernel's `tanh` column
plus `tanh(Ξ/2)`). -/
theorem tv_le_perturbed_base_tanh (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde)
    (eps_max : ℝ) (heps : ∀ j, |delta j| ≤ eps_max) (Xi : ℝ) (hxi : ∀ j, |xi j| ≤ Xi) :
    tv p phat ≤ Real.tanh ((eps_max + Xi) / 2) + Real.tanh (Xi / 2) :=
  tv_le_perturbed_base hp hq (fun _ => eps_max) heps Xi hxi (Real.tanh ((eps_max + Xi) / 2))
    fun d hd hr => tilt_tv_le_tanh hd (eps_max + Xi) hr

end Rebase

section Restrict

/-- `q` restricted to the tokens of `V` and renormalised: a function on the type `↥V`. -/
noncomputable def restrictNorm (q : ι → ℝ) (V : Finset ι) (j : V) : ℝ := q j / ∑ i ∈ V, q i

/-- A sum over the type `↥V` (any `Fintype` instance) is the sum over `V`. -/
lemma sum_over_coe (V : Finset ι) {F : Fintype V} (f : ι → ℝ) : ∑ i : V, f i = ∑ i ∈ V, f i :=
  -- `Finset.sum_subtype`: additive form of `Finset.prod_subtype`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean:462 (`F` implicit there too)
  (Finset.sum_subtype (p := fun x => x ∈ V) V (fun _ => Iff.rfl) f).symm

/-- A lost token: `|x − y| ≤ x + y` for `x, y ≥ 0`. -/
lemma lost_abs_le {x y : ℝ} (hx : 0 ≤ x) (hy : 0 ≤ y) : |x - y| ≤ x + y := by
  rw [abs_le]
  constructor
  · linarith
  · linarith

/-- A kept token: `|x − y| ≤ a |x/a − y/b| + |a − b| (y/b)` (`a = p(V)`, `b = p̂(V)`). -/
lemma kept_abs_le {x y a b : ℝ} (ha : 0 < a) (hb : 0 < b) (hy : 0 ≤ y) :
    |x - y| ≤ a * |x / a - y / b| + |a - b| * (y / b) := by
  -- `div_mul_cancel₀`: Algebra/GroupWithZero/Units/Basic.lean:285
  have h1 : x / a * a = x := div_mul_cancel₀ x ha.ne'
  have h2 : y / b * b = y := div_mul_cancel₀ y hb.ne'
  have hsplit : x - y = a * (x / a - y / b) + (a - b) * (y / b) := by
    have e : a * (x / a - y / b) + (a - b) * (y / b) = x / a * a - y / b * b := by ring
    rw [e, h1, h2]
  rw [hsplit]
  calc |a * (x / a - y / b) + (a - b) * (y / b)|
      ≤ |a * (x / a - y / b)| + |(a - b) * (y / b)| := abs_add_le _ _
    -- `abs_add_le`: additive form of `mabs_mul_le`, Algebra/Order/Group/Unbundled/Abs.lean:125
    _ = a * |x / a - y / b| + |a - b| * (y / b) := by
      rw [abs_mul, abs_mul, abs_of_pos ha, abs_of_nonneg (div_nonneg hy hb.le)]

/-- `TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U)` for any two distributions whose kept parts have
positive mass (`p' = p|V`, `p̂' = p̂|V` renormalised, `V = Uᶜ`). -/
theorem tv_le_restrict_add_lost_of_nonneg {p phat : ι → ℝ} (hp0 : ∀ j, 0 ≤ p j)
    (hq0 : ∀ j, 0 ≤ phat j) (hp1 : ∑ j, p j = 1) (hq1 : ∑ j, phat j = 1) (U : Finset ι)
    (ha : 0 < ∑ j ∈ Uᶜ, p j) (hb : 0 < ∑ j ∈ Uᶜ, phat j) :
    tv p phat ≤ tv (restrictNorm p Uᶜ) (restrictNorm phat Uᶜ) + ∑ j ∈ U, p j + ∑ j ∈ U, phat j := by
  obtain ⟨a, hadef⟩ : ∃ a, a = ∑ j ∈ Uᶜ, p j := ⟨_, rfl⟩
  obtain ⟨b, hbdef⟩ : ∃ b, b = ∑ j ∈ Uᶜ, phat j := ⟨_, rfl⟩
  rw [← hadef] at ha
  rw [← hbdef] at hb
  have hpa : ∑ j ∈ U, p j + a = 1 := by rw [hadef, Finset.sum_add_sum_compl U p, hp1]
  have hqb : ∑ j ∈ U, phat j + b = 1 := by rw [hbdef, Finset.sum_add_sum_compl U phat, hq1]
  have hpU0 : 0 ≤ ∑ j ∈ U, p j := Finset.sum_nonneg fun j _ => hp0 j
  have hqU0 : 0 ≤ ∑ j ∈ U, phat j := Finset.sum_nonneg fun j _ => hq0 j
  -- the restricted TV, as a sum over `Uᶜ`
  have hTV' : tv (restrictNorm p Uᶜ) (restrictNorm phat Uᶜ)
      = (∑ j ∈ Uᶜ, |p j / a - phat j / b|) / 2 := by
    have h : ∑ j : ↥(Uᶜ), |p j / (∑ i ∈ Uᶜ, p i) - phat j / (∑ i ∈ Uᶜ, phat i)|
        = ∑ j ∈ Uᶜ, |p j / (∑ i ∈ Uᶜ, p i) - phat j / (∑ i ∈ Uᶜ, phat i)| :=
      sum_over_coe Uᶜ (fun j => |p j / (∑ i ∈ Uᶜ, p i) - phat j / (∑ i ∈ Uᶜ, phat i)|)
    rw [hadef, hbdef]
    -- `tv` of the restrictions unfolds (by definition) to the left side of `h`, halved
    exact congrArg (fun x : ℝ => x / 2) h
  -- the lost tokens
  have hU : ∑ j ∈ U, |p j - phat j| ≤ ∑ j ∈ U, p j + ∑ j ∈ U, phat j := by
    rw [← Finset.sum_add_distrib]
    exact Finset.sum_le_sum fun j _ => lost_abs_le (hp0 j) (hq0 j)
  -- the kept tokens
  have hV : ∑ j ∈ Uᶜ, |p j - phat j|
      ≤ a * ∑ j ∈ Uᶜ, |p j / a - phat j / b| + |a - b| * ∑ j ∈ Uᶜ, phat j / b := by
    rw [Finset.mul_sum, Finset.mul_sum, ← Finset.sum_add_distrib]
    exact Finset.sum_le_sum fun j _ => kept_abs_le ha hb (hq0 j)
  have hb1 : ∑ j ∈ Uᶜ, phat j / b = 1 := by
    rw [← Finset.sum_div, ← hbdef]
    exact div_self hb.ne'
  rw [hb1, mul_one] at hV
  have hS0 : 0 ≤ ∑ j ∈ Uᶜ, |p j / a - phat j / b| := Finset.sum_nonneg fun j _ => abs_nonneg _
  have ha1 : a ≤ 1 := by linarith
  -- `mul_le_of_le_one_left`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:314
  have haS : a * ∑ j ∈ Uᶜ, |p j / a - phat j / b| ≤ ∑ j ∈ Uᶜ, |p j / a - phat j / b| :=
    mul_le_of_le_one_left hS0 ha1
  have hab : |a - b| ≤ ∑ j ∈ U, p j + ∑ j ∈ U, phat j := by
    rw [abs_le]
    constructor
    · linarith
    · linarith
  have htot : ∑ j, |p j - phat j| = ∑ j ∈ U, |p j - phat j| + ∑ j ∈ Uᶜ, |p j - phat j| :=
    (Finset.sum_add_sum_compl U _).symm
  rw [hTV']
  unfold tv
  linarith

variable {phat delta p : ι → ℝ}

lemma IsTilt.p_pos (ht : IsTilt phat delta p) (j : ι) : 0 < p j := by
  rw [ht.eq j]
  exact div_pos (mul_pos (ht.pos j) (Real.exp_pos _)) (ht.sum_pos (fun i => -delta i))

/-- SPEC §7, the ρ argument: `TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U)` (`p'`, `p̂'`: restricted to
the kept tokens `Uᶜ`, renormalised). -/
theorem tv_le_restrict_add_lost (ht : IsTilt phat delta p) (U : Finset ι) (hV : (Uᶜ).Nonempty) :
    tv p phat ≤ tv (restrictNorm p Uᶜ) (restrictNorm phat Uᶜ) + ∑ j ∈ U, p j + ∑ j ∈ U, phat j :=
  tv_le_restrict_add_lost_of_nonneg (fun j => (ht.p_pos j).le) (fun j => (ht.pos j).le)
    ht.sum_p ht.sum_one U (Finset.sum_pos (fun j _ => ht.p_pos j) hV)
    (Finset.sum_pos (fun j _ => ht.pos j) hV)

/-- SPEC §7: the restriction `p'` is the tilt of `p̂'` by the same logit errors (`d j = δ_j` on
the kept tokens), so every §3 bound applies to `TV(p', p̂')` with the same radii. -/
theorem tilt_restrict (ht : IsTilt phat delta p) (U : Finset ι) (hV : (Uᶜ).Nonempty)
    (d : ↥(Uᶜ) → ℝ) (hd : ∀ j, d j = delta j) :
    IsTilt (restrictNorm phat Uᶜ) d (restrictNorm p Uᶜ) := by
  have hb : 0 < ∑ i ∈ Uᶜ, phat i := Finset.sum_pos (fun i _ => ht.pos i) hV
  have hZ : 0 < ∑ i, phat i * Real.exp (-delta i) := ht.sum_pos (fun i => -delta i)
  have hZV : 0 < ∑ i ∈ Uᶜ, phat i * Real.exp (-delta i) :=
    Finset.sum_pos (fun i _ => mul_pos (ht.pos i) (Real.exp_pos _)) hV
  have hpV : ∑ i ∈ Uᶜ, p i
      = (∑ i ∈ Uᶜ, phat i * Real.exp (-delta i)) / ∑ i, phat i * Real.exp (-delta i) := by
    rw [Finset.sum_div]
    exact Finset.sum_congr rfl fun i _ => ht.eq i
  have hden : ∑ i : ↥(Uᶜ), restrictNorm phat Uᶜ i * Real.exp (-d i)
      = (∑ i ∈ Uᶜ, phat i * Real.exp (-delta i)) / ∑ k ∈ Uᶜ, phat k := by
    have h1 : ∑ i : ↥(Uᶜ), restrictNorm phat Uᶜ i * Real.exp (-d i)
        = ∑ i : ↥(Uᶜ), phat i / (∑ k ∈ Uᶜ, phat k) * Real.exp (-delta i) :=
      Finset.sum_congr rfl fun i _ => by
        unfold restrictNorm
        rw [hd i]
    have h2 : ∑ i : ↥(Uᶜ), phat i / (∑ k ∈ Uᶜ, phat k) * Real.exp (-delta i)
        = ∑ i ∈ Uᶜ, phat i / (∑ k ∈ Uᶜ, phat k) * Real.exp (-delta i) :=
      sum_over_coe Uᶜ (fun i => phat i / (∑ k ∈ Uᶜ, phat k) * Real.exp (-delta i))
    rw [h1, h2, Finset.sum_div]
    exact Finset.sum_congr rfl fun i _ => by ring
  refine ⟨fun j => ?_, ?_, fun j => ?_⟩
  · show 0 < phat j / ∑ i ∈ Uᶜ, phat i
    exact div_pos (ht.pos j) hb
  · show ∑ j : ↥(Uᶜ), phat j / ∑ i ∈ Uᶜ, phat i = 1
    calc ∑ j : ↥(Uᶜ), phat j / ∑ i ∈ Uᶜ, phat i = ∑ j ∈ Uᶜ, phat j / ∑ i ∈ Uᶜ, phat i :=
          sum_over_coe Uᶜ (fun j => phat j / ∑ i ∈ Uᶜ, phat i)
      _ = (∑ j ∈ Uᶜ, phat j) / ∑ i ∈ Uᶜ, phat i := by rw [Finset.sum_div]
      _ = 1 := div_self hb.ne'
  · rw [hden, hd j]
    unfold restrictNorm
    rw [hpV, ht.eq j, div_div_div_cancel_right₀ hZ.ne']
    rw [div_eq_div_iff hZV.ne' (div_pos hZV hb).ne']
    ring

/-- SPEC §7: the lost mass under the tilt, `p(U) ≤ Σ_{j∈U} p̂_j e^{ε_j} / Σ_j p̂_j e^{−ε_j}`. -/
theorem tilt_mass_lost_le (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (U : Finset ι) :
    ∑ j ∈ U, p j ≤ (∑ j ∈ U, phat j * Real.exp (eps j)) / ∑ j, phat j * Real.exp (-eps j) := by
  have hm : 0 < ∑ j, phat j * Real.exp (-eps j) := ht.sum_pos (fun i => -eps i)
  have hpU : ∑ j ∈ U, p j
      = (∑ j ∈ U, phat j * Real.exp (-delta j)) / ∑ i, phat i * Real.exp (-delta i) := by
    rw [Finset.sum_div]
    exact Finset.sum_congr rfl fun j _ => ht.eq j
  have hnum : ∑ j ∈ U, phat j * Real.exp (-delta j) ≤ ∑ j ∈ U, phat j * Real.exp (eps j) :=
    Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_delta_le eps heps j) (ht.pos j).le
  have hden : ∑ j, phat j * Real.exp (-eps j) ≤ ∑ i, phat i * Real.exp (-delta i) :=
    Finset.sum_le_sum fun j _ =>
      mul_le_mul_of_nonneg_left (exp_neg_eps_le eps heps j) (ht.pos j).le
  have hnum0 : 0 ≤ ∑ j ∈ U, phat j * Real.exp (eps j) :=
    Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  rw [hpU]
  -- `div_le_div₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1273
  exact div_le_div₀ hnum0 hnum hm hden

/-- The weaker form `witcert.bounds` uses: the kept tokens' `Σ_{Uᶜ} p̂ e^{−ε}` as denominator. -/
theorem tilt_mass_lost_le_compl (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (U : Finset ι) (hV : (Uᶜ).Nonempty) :
    ∑ j ∈ U, p j ≤ (∑ j ∈ U, phat j * Real.exp (eps j)) / ∑ j ∈ Uᶜ, phat j * Real.exp (-eps j) := by
  have h := tilt_mass_lost_le ht eps heps U
  have hmV : 0 < ∑ j ∈ Uᶜ, phat j * Real.exp (-eps j) :=
    Finset.sum_pos (fun j _ => mul_pos (ht.pos j) (Real.exp_pos _)) hV
  have hle : ∑ j ∈ Uᶜ, phat j * Real.exp (-eps j) ≤ ∑ j, phat j * Real.exp (-eps j) :=
    Finset.sum_le_sum_of_subset_of_nonneg (Finset.subset_univ _)
      fun j _ _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  have hnum0 : 0 ≤ ∑ j ∈ U, phat j * Real.exp (eps j) :=
    Finset.sum_nonneg fun j _ => mul_nonneg (ht.pos j).le (Real.exp_pos _).le
  -- `div_le_div_of_nonneg_left`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1263
  exact h.trans (div_le_div_of_nonneg_left hnum0 hmV hle)

/-- SPEC §7, the ρ argument put together: `TV(p, p̂) ≤ TV(p', p̂') + p̂(U) + Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}`. -/
theorem tv_le_restrict_add_rho (ht : IsTilt phat delta p) (eps : ι → ℝ)
    (heps : ∀ j, |delta j| ≤ eps j) (U : Finset ι) (hV : (Uᶜ).Nonempty) :
    tv p phat ≤ tv (restrictNorm p Uᶜ) (restrictNorm phat Uᶜ) + ∑ j ∈ U, phat j +
      (∑ j ∈ U, phat j * Real.exp (eps j)) / ∑ j, phat j * Real.exp (-eps j) := by
  have h1 := tv_le_restrict_add_lost ht U hV
  have h2 := tilt_mass_lost_le ht eps heps U
  linarith

end Restrict

section Kernel

variable {phat delta p xi ptilde : ι → ℝ}

/-- SPEC §7, the decode pass as one statement (issue 37 (c)): Ξ for the kernel's own logits,
radii rounded up onto levels, and ρ computed from the kernel's `p̃`:
`TV(p, p̂) ≤ F + tanh(Ξ/2) + Λ (1 + e^{ε_max + Ξ} / m)` for any `F` sound for the tilts of the
kept part `p̃|V` at radii `lev + Ξ`. -/
theorem kernel_tv_sound (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde)
    (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (Xi : ℝ) (hxi : ∀ j, |xi j| ≤ Xi)
    (lev : ι → ℝ) (hlev : ∀ j, eps j ≤ lev j) (eps_max : ℝ) (hmax : ∀ j, lev j ≤ eps_max)
    (U : Finset ι) (hV : (Uᶜ).Nonempty)
    (Lam : ℝ) (hLam0 : 0 ≤ Lam) (hLam : ∑ j ∈ U, ptilde j ≤ Lam * ∑ j ∈ Uᶜ, ptilde j)
    (m : ℝ) (hm0 : 0 < m)
    (hm : m ≤ (∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi))) / ∑ j ∈ Uᶜ, ptilde j)
    (F : ℝ)
    (hF : ∀ d : ↥(Uᶜ) → ℝ, IsTilt (restrictNorm ptilde Uᶜ) d (restrictNorm p Uᶜ) →
      (∀ j, |d j| ≤ lev j + Xi) → tv (restrictNorm p Uᶜ) (restrictNorm ptilde Uᶜ) ≤ F)
    (rho : ℝ) (hrho : rho = Lam * (1 + Real.exp (eps_max + Xi) / m)) :
    tv p phat ≤ F + Real.tanh (Xi / 2) + rho := by
  -- 1. the Ξ argument: `TV(p, p̂) ≤ TV(p, p̃) + tanh(Ξ/2)`
  have h1 : tv p phat ≤ tv p ptilde + Real.tanh (Xi / 2) := tv_le_tv_perturbed_add_tanh hq Xi hxi
  -- 2. `p` is the tilt of `p̃` by `δ − ξ`, radii `ε + Ξ ≤ lev + Ξ`
  obtain ⟨ht, hr⟩ := tilt_rebase hp hq eps heps Xi hxi (fun j => delta j - xi j) fun _ => rfl
  have hr' : ∀ j, |delta j - xi j| ≤ lev j + Xi := fun j => (hr j).trans (by linarith [hlev j])
  -- 3. the ρ argument for `p` over `p̃`: `TV(p, p̃) ≤ TV(p|V, p̃|V) + p(U) + p̃(U)`
  have h2 : tv p ptilde ≤ tv (restrictNorm p Uᶜ) (restrictNorm ptilde Uᶜ) + ∑ j ∈ U, p j
      + ∑ j ∈ U, ptilde j :=
    tv_le_restrict_add_lost ht U hV
  -- 4. the kept part is the tilt of `p̃|V` by the same errors: `F` bounds it
  have h3 : tv (restrictNorm p Uᶜ) (restrictNorm ptilde Uᶜ) ≤ F :=
    hF (fun j : ↥(Uᶜ) => delta j - xi j)
      (tilt_restrict ht U hV (fun j : ↥(Uᶜ) => delta j - xi j) fun _ => rfl) fun j => hr' j
  -- 5. the lost mass: `p(U) ≤ Σ_U p̃ e^{lev + Ξ} / Σ_V p̃ e^{−(lev + Ξ)}`
  have h4 : ∑ j ∈ U, p j ≤ (∑ j ∈ U, ptilde j * Real.exp (lev j + Xi)) /
      ∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi)) :=
    tilt_mass_lost_le_compl ht (fun j => lev j + Xi) hr' U hV
  -- 6. the kernel's `ρ` bounds `p(U) + p̃(U)`
  have hPV : 0 < ∑ j ∈ Uᶜ, ptilde j := Finset.sum_pos (fun j _ => hq.p_pos j) hV
  have hN : ∑ j ∈ U, ptilde j * Real.exp (lev j + Xi)
      ≤ (∑ j ∈ U, ptilde j) * Real.exp (eps_max + Xi) := by
    rw [Finset.sum_mul]
    exact Finset.sum_le_sum fun j _ => mul_le_mul_of_nonneg_left
      (Real.exp_le_exp.mpr (by linarith [hmax j])) (hq.p_pos j).le
  have hNc : ∑ j ∈ U, ptilde j * Real.exp (lev j + Xi)
      ≤ Lam * (∑ j ∈ Uᶜ, ptilde j) * Real.exp (eps_max + Xi) :=
    hN.trans (mul_le_mul_of_nonneg_right hLam (Real.exp_pos _).le)
  have hc0 : 0 ≤ Lam * (∑ j ∈ Uᶜ, ptilde j) * Real.exp (eps_max + Xi) :=
    mul_nonneg (mul_nonneg hLam0 hPV.le) (Real.exp_pos _).le
  -- `le_div_iff₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1122
  have hmD : m * ∑ j ∈ Uᶜ, ptilde j ≤ ∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi)) :=
    (le_div_iff₀ hPV).mp hm
  -- `div_le_div₀`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:1273
  have hfrac : (∑ j ∈ U, ptilde j * Real.exp (lev j + Xi)) /
        ∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi))
      ≤ Lam * (∑ j ∈ Uᶜ, ptilde j) * Real.exp (eps_max + Xi) / (m * ∑ j ∈ Uᶜ, ptilde j) :=
    div_le_div₀ hc0 hNc (mul_pos hm0 hPV) hmD
  -- `mul_div_mul_right`: Algebra/GroupWithZero/Units/Basic.lean:312
  have hcancel : Lam * (∑ j ∈ Uᶜ, ptilde j) * Real.exp (eps_max + Xi) / (m * ∑ j ∈ Uᶜ, ptilde j)
      = Lam * (Real.exp (eps_max + Xi) / m) := by
    have e1 : Lam * (∑ j ∈ Uᶜ, ptilde j) * Real.exp (eps_max + Xi)
        = Lam * Real.exp (eps_max + Xi) * ∑ j ∈ Uᶜ, ptilde j := by ring
    rw [e1, mul_div_mul_right (Lam * Real.exp (eps_max + Xi)) m hPV.ne', mul_div_assoc]
  have h4' : ∑ j ∈ U, p j ≤ Lam * (Real.exp (eps_max + Xi) / m) :=
    h4.trans (hfrac.trans (le_of_eq hcancel))
  have hPV1 : ∑ j ∈ Uᶜ, ptilde j ≤ 1 := by
    calc ∑ j ∈ Uᶜ, ptilde j ≤ ∑ j, ptilde j :=
          Finset.sum_le_sum_of_subset_of_nonneg (Finset.subset_univ _)
            fun j _ _ => (hq.p_pos j).le
      _ = 1 := hq.sum_p
  -- `mul_le_of_le_one_right`: Algebra/Order/GroupWithZero/Unbundled/Basic.lean:320
  have hPU : ∑ j ∈ U, ptilde j ≤ Lam := hLam.trans (mul_le_of_le_one_right hLam0 hPV1)
  have hrho' : rho = Lam + Lam * (Real.exp (eps_max + Xi) / m) := by
    rw [hrho]
    ring
  linarith [h1, h2, h3, h4', hPU, hrho']

/-- `kernel_tv_sound` with the §3(a) bound on the histogram: `F = tanh((ε_max + Ξ)/2)`. -/
theorem kernel_tv_sound_tanh (hp : IsTilt phat delta p) (hq : IsTilt phat xi ptilde)
    (eps : ι → ℝ) (heps : ∀ j, |delta j| ≤ eps j) (Xi : ℝ) (hxi : ∀ j, |xi j| ≤ Xi)
    (lev : ι → ℝ) (hlev : ∀ j, eps j ≤ lev j) (eps_max : ℝ) (hmax : ∀ j, lev j ≤ eps_max)
    (U : Finset ι) (hV : (Uᶜ).Nonempty)
    (Lam : ℝ) (hLam0 : 0 ≤ Lam) (hLam : ∑ j ∈ U, ptilde j ≤ Lam * ∑ j ∈ Uᶜ, ptilde j)
    (m : ℝ) (hm0 : 0 < m)
    (hm : m ≤ (∑ j ∈ Uᶜ, ptilde j * Real.exp (-(lev j + Xi))) / ∑ j ∈ Uᶜ, ptilde j)
    (rho : ℝ) (hrho : rho = Lam * (1 + Real.exp (eps_max + Xi) / m)) :
    tv p phat ≤ Real.tanh ((eps_max + Xi) / 2) + Real.tanh (Xi / 2) + rho :=
  kernel_tv_sound hp hq eps heps Xi hxi lev hlev eps_max hmax U hV Lam hLam0 hLam m hm0 hm
    (Real.tanh ((eps_max + Xi) / 2))
    (fun d hd hr => tilt_tv_le_tanh hd (eps_max + Xi) fun j => (hr j).trans (by linarith [hmax j]))
    rho hrho

end Kernel

end WitCert
