import Mathlib

/-!
# Split-KV merge (SPEC §8)

A decode pass splits the tokens into disjoint sets, each with its own running maximum `m_k`;
rescaling each split's sums by `e^{m_k − M}` gives exactly the unsplit sums at the common
offset `M` — for the softmax denominator and for any per-token weight `v` (the output
accumulator, each histogram bin's indicator, `φ`). `M` and the `m_k` are arbitrary (the
kernels use maxima only for range).

* `lse_merge_exact` — SPEC §9; `kernels/decode.py` (the merge after the split-KV kernel:
  `w = exp(m_out − M)`, `L`, `o`, and the histograms rescaled like `l`).
* `lse_merge_exact_k` — the same for any finite family of pairwise disjoint splits (the kernel
  merges `k`).
-/

namespace WitCert

open Finset

/-- SPEC §8: the log-sum-exp merge of two splits equals the unsplit sums. -/
theorem lse_merge_exact {ι : Type*} [DecidableEq ι] (S₁ S₂ : Finset ι) (hdisj : Disjoint S₁ S₂)
    (s v : ι → ℝ) (m₁ m₂ M : ℝ) :
    Real.exp (m₁ - M) * ∑ j ∈ S₁, Real.exp (s j - m₁) + Real.exp (m₂ - M) * ∑ j ∈ S₂, Real.exp (s j - m₂)
        = ∑ j ∈ S₁ ∪ S₂, Real.exp (s j - M) ∧
      Real.exp (m₁ - M) * ∑ j ∈ S₁, Real.exp (s j - m₁) * v j
          + Real.exp (m₂ - M) * ∑ j ∈ S₂, Real.exp (s j - m₂) * v j
        = ∑ j ∈ S₁ ∪ S₂, Real.exp (s j - M) * v j := by
  have key : ∀ m : ℝ, ∀ j, Real.exp (m - M) * Real.exp (s j - m) = Real.exp (s j - M) := by
    intro m j
    rw [← Real.exp_add]
    congr 1
    ring
  constructor
  · rw [Finset.sum_union hdisj, Finset.mul_sum, Finset.mul_sum]
    congr 1
    · exact Finset.sum_congr rfl fun j _ => key m₁ j
    · exact Finset.sum_congr rfl fun j _ => key m₂ j
  · rw [Finset.sum_union hdisj, Finset.mul_sum, Finset.mul_sum]
    congr 1
    · exact Finset.sum_congr rfl fun j _ => by rw [← mul_assoc, key m₁ j]
    · exact Finset.sum_congr rfl fun j _ => by rw [← mul_assoc, key m₂ j]

/-- SPEC §8: the log-sum-exp merge of `k` splits — any finite family `K` of pairwise disjoint
token sets `S k`, each with its own offset `m k` — equals the unsplit sums at the common offset
`M`, for the denominator and for any per-token weight `v`. -/
theorem lse_merge_exact_k {ι κ : Type*} [DecidableEq ι] (K : Finset κ) (S : κ → Finset ι)
    (hdisj : (K : Set κ).PairwiseDisjoint S) (s v : ι → ℝ) (m : κ → ℝ) (M : ℝ) :
    ∑ k ∈ K, Real.exp (m k - M) * ∑ j ∈ S k, Real.exp (s j - m k)
        = ∑ j ∈ K.biUnion S, Real.exp (s j - M) ∧
      ∑ k ∈ K, Real.exp (m k - M) * ∑ j ∈ S k, Real.exp (s j - m k) * v j
        = ∑ j ∈ K.biUnion S, Real.exp (s j - M) * v j := by
  have key : ∀ k j, Real.exp (m k - M) * Real.exp (s j - m k) = Real.exp (s j - M) := by
    intro k j
    rw [← Real.exp_add]
    congr 1
    ring
  have hsplit : ∀ k, Real.exp (m k - M) * ∑ j ∈ S k, Real.exp (s j - m k)
      = ∑ j ∈ S k, Real.exp (s j - M) := by
    intro k
    rw [Finset.mul_sum]
    exact Finset.sum_congr rfl fun j _ => key k j
  have hsplitv : ∀ k, Real.exp (m k - M) * ∑ j ∈ S k, Real.exp (s j - m k) * v j
      = ∑ j ∈ S k, Real.exp (s j - M) * v j := by
    intro k
    rw [Finset.mul_sum]
    exact Finset.sum_congr rfl fun j _ => by rw [← mul_assoc, key k j]
  -- `Finset.sum_biUnion` (additive form of Algebra/BigOperators/Group/Finset/Basic.lean:221)
  constructor
  · rw [Finset.sum_biUnion hdisj]
    exact Finset.sum_congr rfl fun k _ => hsplit k
  · rw [Finset.sum_biUnion hdisj]
    exact Finset.sum_congr rfl fun k _ => hsplitv k

end WitCert
