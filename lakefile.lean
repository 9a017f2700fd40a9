import Lake
open Lake DSL

/-! WitCert's Lean development of SPEC §9 (sources under `lean/`).
Written for Lean v4.29.0-rc4 and Mathlib 401ee04251820d5c3604d9fb076a31c70690eb55
(upstream master, 2026-03-07). Check with `lake build`. -/

package witcert where
  leanOptions := #[⟨`autoImplicit, false⟩]

require mathlib from git
  "https://github.com/leanprover-community/mathlib4.git" @ "401ee04251820d5c3604d9fb076a31c70690eb55"

@[default_target]
lean_lib WitCert where
  srcDir := "lean"
