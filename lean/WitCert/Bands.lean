import Mathlib

/-!
# Bands (SPEC §1)

RoPE at any position rotates every band (coordinate pair) by an angle, so it preserves the
norm of the restriction of a vector to any union of whole bands (a *group*). Witnesses and
query group norms therefore do not depend on where, or whether, RoPE was applied.

A head vector is written band by band, `x : ι → ℝ × ℝ`; the layouts `half` (b, b + r/2) and
`interleaved` (2b, 2b+1) of SPEC §1 are two indexings of the same bands.

* `rope_group_norm_invariant` — SPEC §9; used by `witcert.bounds.group_slices` (groups are
  unions of whole bands) and `kernels/paged.py` (`group_id`), and tested numerically in
  `tests/test_bands.py`.

## From coordinates to bands (both layouts)

A head vector in coordinates is `x : ℕ → ℝ` (coordinate `i`); a layout places band `b` at the
coordinate pair `(fst b, snd b)`. With `h = r/2` bands (`r` the rotary dimension):
`half` (HF `rotate_half`) puts band `b` at `(b, b + h)`; `interleaved` (GPT-J) at `(2b, 2b+1)`.
`ropeHalf` / `ropeInterleaved` are the coordinate formulas of the two implementations
(`x·cos + rotate_half(x)·sin`, and the pairwise form); coordinates `≥ r` (partial rotary) pass
through unchanged.

* `rope_layout_group_norm_invariant` — for any layout whose pairs are distinct and disjoint on
  a group `g` of bands, a coordinate vector that rotates each band of `g` keeps the norm of the
  group's coordinates.
* `rope_half_group_norm_invariant`, `rope_interleaved_group_norm_invariant` — the two layouts
  (`witcert.bounds.rope` / `group_slices`, layouts `half` and `interleaved`).
* `rope_half_partial_group_norm_invariant`, `rope_interleaved_partial_group_norm_invariant` —
  issue 37 (f), partial rotary: a group of rotary bands together with passthrough coordinates
  (`≥ 2h`) keeps its coordinate norm (`coordNorm_union_pass`).
-/

namespace WitCert

open Finset

/-- RoPE acting on one band at angle `θ`. -/
noncomputable def ropeBand (θ : ℝ) (p : ℝ × ℝ) : ℝ × ℝ :=
  (p.1 * Real.cos θ - p.2 * Real.sin θ, p.1 * Real.sin θ + p.2 * Real.cos θ)

/-- RoPE on a head vector written band by band; `θ b` is band `b`'s angle at the position. -/
noncomputable def rope {ι : Type*} (θ : ι → ℝ) (x : ι → ℝ × ℝ) : ι → ℝ × ℝ :=
  fun b => ropeBand (θ b) (x b)

/-- Euclidean norm of `x` restricted to the group `g` of bands. -/
noncomputable def groupNorm {ι : Type*} (g : Finset ι) (x : ι → ℝ × ℝ) : ℝ :=
  Real.sqrt (∑ b ∈ g, ((x b).1 ^ 2 + (x b).2 ^ 2))

theorem ropeBand_sq (θ : ℝ) (p : ℝ × ℝ) :
    (ropeBand θ p).1 ^ 2 + (ropeBand θ p).2 ^ 2 = p.1 ^ 2 + p.2 ^ 2 := by
  have h := Real.sin_sq_add_cos_sq θ
  show (p.1 * Real.cos θ - p.2 * Real.sin θ) ^ 2 + (p.1 * Real.sin θ + p.2 * Real.cos θ) ^ 2
      = p.1 ^ 2 + p.2 ^ 2
  linear_combination (p.1 ^ 2 + p.2 ^ 2) * h

/-- SPEC §1, band unitarity: `‖RoPE_pos(x)[g]‖ = ‖x[g]‖` for every group and every angle. -/
theorem rope_group_norm_invariant {ι : Type*} (θ : ι → ℝ) (g : Finset ι) (x : ι → ℝ × ℝ) :
    groupNorm g (rope θ x) = groupNorm g x := by
  unfold groupNorm
  congr 1
  exact Finset.sum_congr rfl (fun b _ => ropeBand_sq (θ b) (x b))

/-! ### Layouts -/

/-- The coordinates of a group `g` of bands under the layout `(fst, snd)`. -/
def coordsOf (fst snd : ℕ → ℕ) (g : Finset ℕ) : Finset ℕ :=
  g.biUnion (fun b => ({fst b, snd b} : Finset ℕ))

/-- Euclidean norm of the coordinates `S` of `x`. -/
noncomputable def coordNorm (S : Finset ℕ) (x : ℕ → ℝ) : ℝ :=
  Real.sqrt (∑ i ∈ S, x i ^ 2)

/-- Layout `half`: band `b` is the pair `(b, b + h)`. -/
def halfFst (b : ℕ) : ℕ := b

/-- Layout `half`: band `b` is the pair `(b, b + h)`. -/
def halfSnd (h b : ℕ) : ℕ := b + h

/-- Layout `interleaved`: band `b` is the pair `(2b, 2b + 1)`. -/
def ilvFst (b : ℕ) : ℕ := 2 * b

/-- Layout `interleaved`: band `b` is the pair `(2b, 2b + 1)`. -/
def ilvSnd (b : ℕ) : ℕ := 2 * b + 1

/-- RoPE in coordinates, layout `half` (`x·cos + rotate_half(x)·sin`; `θ b` is band `b`'s angle). -/
noncomputable def ropeHalf (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (i : ℕ) : ℝ :=
  if i < h then x i * Real.cos (θ i) - x (i + h) * Real.sin (θ i)
  else if i < 2 * h then x i * Real.cos (θ (i - h)) + x (i - h) * Real.sin (θ (i - h))
  else x i

/-- RoPE in coordinates, layout `interleaved` (GPT-J: pairs `(2b, 2b+1)`). -/
noncomputable def ropeInterleaved (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (i : ℕ) : ℝ :=
  if i < 2 * h then
    (if i % 2 = 0 then x i * Real.cos (θ (i / 2)) - x (i + 1) * Real.sin (θ (i / 2))
     else x i * Real.cos (θ (i / 2)) + x (i - 1) * Real.sin (θ (i / 2)))
  else x i

/-- The norm of a group's coordinates is the band-wise group norm of the layout's pairs. -/
lemma coordNorm_eq_groupNorm (fst snd : ℕ → ℕ) (g : Finset ℕ) (hne : ∀ b ∈ g, fst b ≠ snd b)
    (hdisj : (g : Set ℕ).PairwiseDisjoint (fun b => ({fst b, snd b} : Finset ℕ))) (x : ℕ → ℝ) :
    coordNorm (coordsOf fst snd g) x = groupNorm g (fun b => (x (fst b), x (snd b))) := by
  unfold coordNorm coordsOf groupNorm
  congr 1
  -- `Finset.sum_biUnion` (Algebra/BigOperators/Group/Finset/Basic.lean:221),
  -- `Finset.sum_pair` (same file, :86)
  rw [Finset.sum_biUnion hdisj]
  exact Finset.sum_congr rfl fun b hb => Finset.sum_pair (hne b hb)

lemma groupNorm_congr {ι : Type*} (g : Finset ι) (y z : ι → ℝ × ℝ) (h : ∀ b ∈ g, y b = z b) :
    groupNorm g y = groupNorm g z := by
  unfold groupNorm
  congr 1
  exact Finset.sum_congr rfl fun b hb => by rw [h b hb]

/-- SPEC §1 in coordinates, any layout: if `y` rotates every band of `g` (`θ b` the angle),
`‖y[g]‖ = ‖x[g]‖`. -/
theorem rope_layout_group_norm_invariant (fst snd : ℕ → ℕ) (g : Finset ℕ)
    (hne : ∀ b ∈ g, fst b ≠ snd b)
    (hdisj : (g : Set ℕ).PairwiseDisjoint (fun b => ({fst b, snd b} : Finset ℕ)))
    (θ : ℕ → ℝ) (x y : ℕ → ℝ)
    (hy : ∀ b ∈ g, (y (fst b), y (snd b)) = ropeBand (θ b) (x (fst b), x (snd b))) :
    coordNorm (coordsOf fst snd g) y = coordNorm (coordsOf fst snd g) x := by
  rw [coordNorm_eq_groupNorm fst snd g hne hdisj y, coordNorm_eq_groupNorm fst snd g hne hdisj x]
  have hr : groupNorm g (fun b => (y (fst b), y (snd b)))
      = groupNorm g (rope θ (fun b => (x (fst b), x (snd b)))) :=
    groupNorm_congr g _ _ fun b hb => hy b hb
  rw [hr]
  exact rope_group_norm_invariant θ g _

/-- `ropeBand` on a pair literal, without projections (stated so `rw` can use it). -/
lemma ropeBand_apply (θ a b : ℝ) :
    ropeBand θ (a, b) = (a * Real.cos θ - b * Real.sin θ, a * Real.sin θ + b * Real.cos θ) := rfl

lemma ropeHalf_band (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (b : ℕ) (hb : b < h) :
    (ropeHalf h θ x (halfFst b), ropeHalf h θ x (halfSnd h b))
      = ropeBand (θ b) (x (halfFst b), x (halfSnd h b)) := by
  have h2 : ¬ (b + h < h) := by omega
  have h3 : b + h < 2 * h := by omega
  have h4 : b + h - h = b := by omega
  unfold ropeHalf halfFst halfSnd
  rw [ropeBand_apply, if_pos hb, if_neg h2, if_pos h3, h4, Prod.mk.injEq]
  constructor
  · ring
  · ring

lemma ropeInterleaved_band (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (b : ℕ) (hb : b < h) :
    (ropeInterleaved h θ x (ilvFst b), ropeInterleaved h θ x (ilvSnd b))
      = ropeBand (θ b) (x (ilvFst b), x (ilvSnd b)) := by
  have l1 : 2 * b < 2 * h := by omega
  have l2 : 2 * b + 1 < 2 * h := by omega
  have e1 : 2 * b % 2 = 0 := by omega
  have e2 : 2 * b / 2 = b := by omega
  have e3 : ¬ ((2 * b + 1) % 2 = 0) := by omega
  have e4 : (2 * b + 1) / 2 = b := by omega
  have e5 : 2 * b + 1 - 1 = 2 * b := by omega
  unfold ropeInterleaved ilvFst ilvSnd
  rw [ropeBand_apply, if_pos l1, if_pos e1, if_pos l2, if_neg e3, e2, e4, e5, Prod.mk.injEq]
  constructor
  · ring
  · ring

/-- Coordinates at or past the rotary dimension `2h` pass through (partial rotary). -/
lemma ropeHalf_pass (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (i : ℕ) (hi : 2 * h ≤ i) :
    ropeHalf h θ x i = x i := by
  have h1 : ¬ (i < h) := by omega
  have h2 : ¬ (i < 2 * h) := by omega
  unfold ropeHalf
  rw [if_neg h1, if_neg h2]

lemma ropeInterleaved_pass (h : ℕ) (θ : ℕ → ℝ) (x : ℕ → ℝ) (i : ℕ) (hi : 2 * h ≤ i) :
    ropeInterleaved h θ x i = x i := by
  have h2 : ¬ (i < 2 * h) := by omega
  unfold ropeInterleaved
  rw [if_neg h2]

/-- SPEC §1, layout `half` (HF `rotate_half`, band `b` = coordinates `(b, b + r/2)`): RoPE keeps
the norm of every group of bands `g ⊆ [0, h)`. -/
theorem rope_half_group_norm_invariant (h : ℕ) (θ : ℕ → ℝ) (g : Finset ℕ)
    (hg : ∀ b ∈ g, b < h) (x : ℕ → ℝ) :
    coordNorm (coordsOf halfFst (halfSnd h) g) (ropeHalf h θ x)
      = coordNorm (coordsOf halfFst (halfSnd h) g) x := by
  have hne : ∀ b ∈ g, halfFst b ≠ halfSnd h b := by
    intro b hb
    have := hg b hb
    unfold halfFst halfSnd
    omega
  have hdisj : (g : Set ℕ).PairwiseDisjoint (fun b => ({halfFst b, halfSnd h b} : Finset ℕ)) := by
    intro b hb b' hb' hbb
    have hb1 := hg b (Finset.mem_coe.mp hb)
    have hb2 := hg b' (Finset.mem_coe.mp hb')
    show Disjoint ({halfFst b, halfSnd h b} : Finset ℕ) {halfFst b', halfSnd h b'}
    rw [Finset.disjoint_left]
    intro i hi hi'
    simp only [Finset.mem_insert, Finset.mem_singleton, halfFst, halfSnd] at hi hi'
    omega
  exact rope_layout_group_norm_invariant halfFst (halfSnd h) g hne hdisj θ x (ropeHalf h θ x)
    fun b hb => ropeHalf_band h θ x b (hg b hb)

/-- SPEC §1, layout `interleaved` (GPT-J, band `b` = coordinates `(2b, 2b+1)`). -/
theorem rope_interleaved_group_norm_invariant (h : ℕ) (θ : ℕ → ℝ) (g : Finset ℕ)
    (hg : ∀ b ∈ g, b < h) (x : ℕ → ℝ) :
    coordNorm (coordsOf ilvFst ilvSnd g) (ropeInterleaved h θ x)
      = coordNorm (coordsOf ilvFst ilvSnd g) x := by
  have hne : ∀ b ∈ g, ilvFst b ≠ ilvSnd b := by
    intro b _
    unfold ilvFst ilvSnd
    omega
  have hdisj : (g : Set ℕ).PairwiseDisjoint (fun b => ({ilvFst b, ilvSnd b} : Finset ℕ)) := by
    intro b _ b' _ hbb
    show Disjoint ({ilvFst b, ilvSnd b} : Finset ℕ) {ilvFst b', ilvSnd b'}
    rw [Finset.disjoint_left]
    intro i hi hi'
    simp only [Finset.mem_insert, Finset.mem_singleton, ilvFst, ilvSnd] at hi hi'
    omega
  exact rope_layout_group_norm_invariant ilvFst ilvSnd g hne hdisj θ x (ropeInterleaved h θ x)
    fun b hb => ropeInterleaved_band h θ x b (hg b hb)


/-! ### Partial rotary: groups with passthrough coordinates (issue 37 (f)) -/

/-- The squared coordinate sum from a coordinate norm (both sums are nonnegative). -/
lemma sum_sq_eq_of_coordNorm_eq (S : Finset ℕ) (x y : ℕ → ℝ) (h : coordNorm S y = coordNorm S x) :
    ∑ i ∈ S, y i ^ 2 = ∑ i ∈ S, x i ^ 2 := by
  have hy : 0 ≤ ∑ i ∈ S, y i ^ 2 := Finset.sum_nonneg fun i _ => sq_nonneg (y i)
  have hx : 0 ≤ ∑ i ∈ S, x i ^ 2 := Finset.sum_nonneg fun i _ => sq_nonneg (x i)
  unfold coordNorm at h
  -- `Real.sqrt_inj`: Data/Real/Sqrt.lean:259
  exact (Real.sqrt_inj hy hx).mp h

/-- A rotary group `C` and passthrough coordinates `P` (disjoint, fixed by `y`): if `y` keeps the
norm of `C`, it keeps the norm of `C ∪ P`. -/
lemma coordNorm_union_pass (C P : Finset ℕ) (hdisj : Disjoint C P) (x y : ℕ → ℝ)
    (hC : coordNorm C y = coordNorm C x) (hP : ∀ i ∈ P, y i = x i) :
    coordNorm (C ∪ P) y = coordNorm (C ∪ P) x := by
  have hR : ∑ i ∈ C, y i ^ 2 = ∑ i ∈ C, x i ^ 2 := sum_sq_eq_of_coordNorm_eq C x y hC
  have hPass : ∑ i ∈ P, y i ^ 2 = ∑ i ∈ P, x i ^ 2 :=
    Finset.sum_congr rfl fun i hi => by rw [hP i hi]
  unfold coordNorm
  -- `Finset.sum_union`: additive form of `Finset.prod_union`,
  -- Algebra/BigOperators/Group/Finset/Basic.lean
  rw [Finset.sum_union hdisj, Finset.sum_union hdisj, hR, hPass]

/-- Issue 37 (f), layout `half` with partial rotary: a group of rotary bands `g ⊆ [0, h)` together
with any passthrough coordinates `P ⊆ [2h, ∞)` keeps its coordinate norm under `ropeHalf`. -/
theorem rope_half_partial_group_norm_invariant (h : ℕ) (θ : ℕ → ℝ) (g : Finset ℕ)
    (hg : ∀ b ∈ g, b < h) (P : Finset ℕ) (hP : ∀ i ∈ P, 2 * h ≤ i) (x : ℕ → ℝ) :
    coordNorm (coordsOf halfFst (halfSnd h) g ∪ P) (ropeHalf h θ x)
      = coordNorm (coordsOf halfFst (halfSnd h) g ∪ P) x := by
  have hdisj : Disjoint (coordsOf halfFst (halfSnd h) g) P := by
    rw [Finset.disjoint_left]
    intro i hi hiP
    have h2 := hP i hiP
    unfold coordsOf at hi
    rw [Finset.mem_biUnion] at hi
    obtain ⟨b, hb, hib⟩ := hi
    have hbh := hg b hb
    simp only [Finset.mem_insert, Finset.mem_singleton, halfFst, halfSnd] at hib
    omega
  exact coordNorm_union_pass _ P hdisj x (ropeHalf h θ x)
    (rope_half_group_norm_invariant h θ g hg x) fun i hi => ropeHalf_pass h θ x i (hP i hi)

/-- Issue 37 (f), layout `interleaved` with partial rotary. -/
theorem rope_interleaved_partial_group_norm_invariant (h : ℕ) (θ : ℕ → ℝ) (g : Finset ℕ)
    (hg : ∀ b ∈ g, b < h) (P : Finset ℕ) (hP : ∀ i ∈ P, 2 * h ≤ i) (x : ℕ → ℝ) :
    coordNorm (coordsOf ilvFst ilvSnd g ∪ P) (ropeInterleaved h θ x)
      = coordNorm (coordsOf ilvFst ilvSnd g ∪ P) x := by
  have hdisj : Disjoint (coordsOf ilvFst ilvSnd g) P := by
    rw [Finset.disjoint_left]
    intro i hi hiP
    have h2 := hP i hiP
    unfold coordsOf at hi
    rw [Finset.mem_biUnion] at hi
    obtain ⟨b, hb, hib⟩ := hi
    have hbh := hg b hb
    simp only [Finset.mem_insert, Finset.mem_singleton, ilvFst, ilvSnd] at hib
    omega
  exact coordNorm_union_pass _ P hdisj x (ropeInterleaved h θ x)
    (rope_interleaved_group_norm_invariant h θ g hg x)
    fun i hi => ropeInterleaved_pass h θ x i (hP i hi)

end WitCert
