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

end WitCert
