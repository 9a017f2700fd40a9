"""Falsification of the SPEC §9 statements on random instances in high precision (mpmath).

A false statement must not survive even without a Lean checker: each function draws instances
that satisfy the statement's hypotheses, evaluates both sides with 50 significant digits and
returns the counterexamples it found (an empty list means none). ``STATEMENTS`` maps each §9
theorem name to its check; ``proofs_bridge.check`` runs them all.

The searches live in modules by the Lean files they check: ``tier_a`` (Radius, Bands, Sketch),
``tv_bounds`` (TiltTV, TiltEndpoints, Output), ``tilt_box`` (TiltBox: the centred box of §3(c), and
TiltEndpoints' histogram form), ``excess`` (Excess: the centred box's two-sum form), ``excess_grid``
(ExcessGrid: its (t, λ) grid over p̃), ``tier_b`` (SubGaussian, Budget, Union, Request),
``split_merge`` (SplitMerge), ``floating_point`` (FloatTV) and ``composed`` (the composed statements
of issue 37); ``highprec`` holds the 50-digit arithmetic they share.
"""

from __future__ import annotations

import random

from .composed import kernel_tv_sound, request_tv_sound, step_tv_sound
from .excess import (
    excess_widen_down,
    excess_widen_up,
    le_exp_two_mul_of_log_ratio,
    one_sub_add_max_sub_one,
    tilt_tv_le_excess,
    tilt_tv_le_excess_rescaled,
    tilt_tv_le_excess_widened,
)
from .excess_grid import (
    abs_gridTerm_le,
    abs_sub_le_of_ratio,
    sub_dualDBox_eq_sum,
    sub_dualDBox_le_gridBound,
    sub_dualDBox_zero,
    sum_le_of_ratio,
    sum_mul_gridTerm,
    tilt_tv_le_grid_rescaled,
    tilt_tv_le_grid_rescaled_capped,
)
from .floating_point import (
    tilt_mass_lost_le,
    tilt_mass_lost_le_compl,
    tilt_rebase,
    tilt_restrict,
    tv_le_perturbed_base,
    tv_le_restrict_add_lost,
    tv_le_restrict_add_lost_of_nonneg,
    tv_le_restrict_add_rho,
    tv_le_tv_perturbed_add_tanh,
)
from .split_merge import lse_merge_exact, lse_merge_exact_k
from .tier_a import (
    abs_logit_error_le_radius,
    abs_sum_mul_le_gnorm_mul,
    kernel_radius_ge_group_sum,
    projected_logit_error_le,
    rope_group_norm_invariant,
    rope_half_group_norm_invariant,
    rope_interleaved_group_norm_invariant,
    rope_layout_group_norm_invariant,
    ropeBand_sq,
    sketch_centred_error_le,
    sketch_radius,
    sketch_radius_ge_group_sum,
    weighted_inner_le,
    window_radius_zero,
)
from .tier_b import (
    dither_logit_tail,
    dither_logit_tail_bias,
    dither_logit_tail_uniform,
    dither_step_union,
    request_budget_sound,
    request_union_sound,
    uniform_hasSubgaussianMGF,
    uniform_mgf_le,
    union_tail_le,
)
from .tilt_box import (
    dual_D_box,
    dualDBox_regroup,
    dualDBox_zero,
    tilt_tv_le_dual_grid_box_endpoints,
    tilt_tv_le_hist_box_endpoints,
    tilt_tv_le_hist_endpoints,
)
from .tv_bounds import (
    dual_D,
    dualD_regroup,
    output_error_le,
    output_error_stored_le,
    tilt_tv_le_dual_grid,
    tilt_tv_le_dual_grid_endpoints,
    tilt_tv_le_eform,
    tilt_tv_le_tanh,
    tilt_tv_le_tanh_top2,
    tv_eq_max_gain,
)

STATEMENTS = {
    "rope_group_norm_invariant": rope_group_norm_invariant,
    "abs_logit_error_le_radius": abs_logit_error_le_radius,
    "tv_eq_max_gain": tv_eq_max_gain,
    "tilt_tv_le_tanh": tilt_tv_le_tanh,
    "tilt_tv_le_eform": tilt_tv_le_eform,
    "tilt_tv_le_dual_grid": tilt_tv_le_dual_grid,
    "output_error_le": output_error_le,
    "output_error_stored_le": output_error_stored_le,
    "uniform_mgf_le": uniform_mgf_le,
    "dither_logit_tail": dither_logit_tail,
    "request_budget_sound": request_budget_sound,
    "lse_merge_exact": lse_merge_exact,
    # the chain of issue 14
    "uniform_hasSubgaussianMGF": uniform_hasSubgaussianMGF,
    "dither_logit_tail_uniform": dither_logit_tail_uniform,
    "dither_logit_tail_bias": dither_logit_tail_bias,
    "union_tail_le": union_tail_le,
    "dither_step_union": dither_step_union,
    "request_union_sound": request_union_sound,
    "lse_merge_exact_k": lse_merge_exact_k,
    "tilt_tv_le_tanh_osc": tilt_tv_le_tanh,  # the same search: TV ≤ tanh(osc/4) ≤ tanh(ε_max/2)
    "tilt_tv_le_tanh_top2": tilt_tv_le_tanh_top2,
    "rope_layout_group_norm_invariant": rope_layout_group_norm_invariant,
    "rope_half_group_norm_invariant": rope_half_group_norm_invariant,
    "rope_interleaved_group_norm_invariant": rope_interleaved_group_norm_invariant,
    # SPEC §7: the floating point of the decode pass (lean/WitCert/FloatTV.lean)
    "tilt_rebase": tilt_rebase,
    "tv_le_perturbed_base": tv_le_perturbed_base,
    "tv_le_perturbed_base_tanh": tv_le_perturbed_base,  # the same search checks F = tanh((ε_max+Ξ)/2)
    "tv_le_restrict_add_lost": tv_le_restrict_add_lost,
    "tilt_restrict": tilt_restrict,
    "tilt_mass_lost_le": tilt_mass_lost_le,
    "tilt_mass_lost_le_compl": tilt_mass_lost_le_compl,
    "tv_le_restrict_add_rho": tv_le_restrict_add_rho,
    # SPEC §2 (Tier A): the residual-sketch radius (lean/WitCert/Sketch.lean)
    "weighted_inner_le": weighted_inner_le,
    "sketch_logit_error_le": sketch_radius,  # the same search checks the per-head and shared forms
    "sketch_shared_radius_le": sketch_radius,
    "sketch_u_of_ratio_le": sketch_radius,  # u = max ratio: the shared form holds at it
    "projected_logit_error_le": projected_logit_error_le,
    "window_token_radius_zero": window_radius_zero,
    "window_radii_sound": window_radius_zero,
    "window_tv_le_eform": window_radius_zero,
    "kernel_radius_ge_group_sum": kernel_radius_ge_group_sum,
    "sketch_radius_ge_per_head": sketch_radius,  # per_head ≤ shared is checked there
    "sketch_radius_ge_group_sum": sketch_radius_ge_group_sum,
    # SPEC §3(c) with endpoint values (lean/WitCert/TiltEndpoints.lean)
    "tilt_tv_le_dual_grid_endpoints": tilt_tv_le_dual_grid_endpoints,
    # issue 37 (f): partial rotary (the layout searches add passthrough coordinates to the group)
    "rope_half_partial_group_norm_invariant": rope_half_group_norm_invariant,
    "rope_interleaved_partial_group_norm_invariant": rope_interleaved_group_norm_invariant,
    "dualD_regroup": dualD_regroup,  # issue 37 (e) (not parsed: its statement has `fun` and a filter)
    # issue 37 (b), (c): the composed statements (lean/WitCert/FloatTV.lean, lean/WitCert/Request.lean)
    "kernel_tv_sound": kernel_tv_sound,
    "kernel_tv_sound_tanh": kernel_tv_sound,  # the same search checks F = tanh((ε_max+Ξ)/2)
    "step_tv_sound": step_tv_sound,
    "request_tv_sound": request_tv_sound,
    "request_tv_sound_fixed": request_tv_sound,  # the same search runs both schedules
    "request_tv_sound_anytime": request_tv_sound,
    "tilt_tv_le_hist_endpoints": tilt_tv_le_hist_endpoints,  # issue 37 (e), composed (TiltEndpoints.lean)
    # SPEC §3(c), the centred box |δ_j − c_j| ≤ ε_j (lean/WitCert/TiltBox.lean)
    "tilt_tv_le_dual_grid_box_endpoints": tilt_tv_le_dual_grid_box_endpoints,
    "tilt_tv_le_hist_box_endpoints": tilt_tv_le_hist_box_endpoints,
    "dualDBox_regroup": dualDBox_regroup,  # not parsed: its statement has `fun` and a filter
    "dualDBox_zero": dualDBox_zero,  # not parsed: an equality of functions with `fun _ => 0`
    "sketch_centred_error_le": sketch_centred_error_le,  # the sketch's centred box (Sketch.lean): TiltBox's heps
    # the centred box's excess (two-sum) form, a closed form of the fused merge (lean/WitCert/Excess.lean)
    "tilt_tv_le_excess": tilt_tv_le_excess,
    "tilt_tv_le_excess_widened": tilt_tv_le_excess_widened,
    "excess_widen_up": excess_widen_up,
    "excess_widen_down": excess_widen_down,
    "one_sub_add_max_sub_one": one_sub_add_max_sub_one,
    "tilt_tv_le_excess_rescaled": tilt_tv_le_excess_rescaled,  # the merge's form (e^{2Ξ} on the sums over p̃)
    "le_exp_two_mul_of_log_ratio": le_exp_two_mul_of_log_ratio,
    # the excess form's (t, λ) grid over the kernel's masses p̃, the fused merge's (lean/WitCert/ExcessGrid.lean)
    "tilt_tv_le_grid_rescaled": tilt_tv_le_grid_rescaled,
    "tilt_tv_le_grid_rescaled_capped": tilt_tv_le_grid_rescaled_capped,  # the merge's form (each interval or its cap)
    "sub_dualDBox_le_gridBound": sub_dualDBox_le_gridBound,
    "sub_dualDBox_eq_sum": sub_dualDBox_eq_sum,
    "sum_mul_gridTerm": sum_mul_gridTerm,
    "sum_le_of_ratio": sum_le_of_ratio,
    "abs_sub_le_of_ratio": abs_sub_le_of_ratio,
    "abs_gridTerm_le": abs_gridTerm_le,
    "sub_dualDBox_zero": sub_dualDBox_zero,
    # the helper theorems the statements above rest on (every `theorem` of lean/WitCert has a search here)
    "abs_sum_mul_le_gnorm_mul": abs_sum_mul_le_gnorm_mul,  # Radius.lean: Cauchy–Schwarz on one group
    "ropeBand_sq": ropeBand_sq,  # Bands.lean: one band's rotation keeps its squared norm
    "tv_le_tv_perturbed_add_tanh": tv_le_tv_perturbed_add_tanh,  # FloatTV.lean: any p, the Ξ term alone
    "tv_le_restrict_add_lost_of_nonneg": tv_le_restrict_add_lost_of_nonneg,  # FloatTV.lean: any p, p̂ ≥ 0
}


def run(trials: int = 2000, seed: int = 0) -> dict:
    """{theorem name: number of counterexamples} over ``trials`` random instances each."""
    out = {}
    for name, fn in STATEMENTS.items():
        out[name] = len(fn(random.Random(f"{seed}:{name}"), trials))
    return out


#: the searches by their own names (several theorems share one search: STATEMENTS maps each theorem to it)
__all__ = ["STATEMENTS", "run", "dual_D", "dual_D_box"] + sorted({fn.__name__ for fn in STATEMENTS.values()})
