"""fp64 reference of every WitCert formula (SPEC.md §1–§5, §7).

This module is the oracle the kernels, the proofs bridge and the integrations are checked
against. Everything is computed in float64 with numpy; inputs may be numpy arrays or torch
tensors of any float dtype, and the result has the input's library type (a torch input gives
a float64 tensor on the input's device).

Conventions
-----------
* Per-token quantities (``p_hat``, radii, value witnesses) have the **token axis last**.
* Vectors (queries, keys, values) have the **feature axis last**: ``q`` is ``[..., d]``,
  ``k`` / ``k_hat`` / ``v`` / ``v_hat`` are ``[..., n, d]``.
* Leading dimensions broadcast with numpy rules.
* Masking comes from ``mask`` (bool, True = attended), never from ``p_hat == 0``: a masked token
  is in no sum and no maximum. An attended token given ``p_hat == 0`` is taken at its word
  (exact p̂ = 0 means exact p = 0, since p is a tilt of p̂, SPEC §0) -- but a p̂ that came out of
  a floating-point softmax can have underflowed while its exact probability is large, so
  callers holding served **logits** use ``tv_bound_parts_logits`` (log domain, SPEC §7).

Floating point (SPEC §7)
------------------------
Witnesses and radii are rounded **up** by the relative slack ``FP64_REL_SLACK`` and one more
ulp (``rounding._round_up_rel``: the subnormal range, where a relative slack rounds away), and norms are
taken with the vector scaled by its largest entry first (``rounding._safe_norm``), so neither squaring
nor a product can underflow a nonzero residual into a zero witness or radius; TV bounds get
``FP64_ABS_SLACK`` added. ``dot_rounding_radius`` bounds the rounding of a served logit
σ⟨q, k̂⟩ computed with unit roundoff u (fp64 here, fp32 in the kernels); callers add it to ε.
Inside the dual-grid bound (§3(c)) the rounding error of each dual value is bounded explicitly
(``dual_grid._dual_values``) and subtracted, so a huge dual multiplier λ (tiny β) can never turn
cancellation into an unsound bound.

NaN / Inf in the inputs of a bound give the saturated bound (1 for TV, +inf for an output or
logit radius) -- never 0, never NaN. Malformed inputs raise ``ValueError`` naming the argument.

Layout
------
This package is the one public entry: every name of ``__all__`` is imported from here. The
formulas live in modules named after what they hold:

* ``inputs`` -- reading arrays of either library as float64, the results' library type, validation;
* ``rounding`` -- the fp64 slacks, ``_round_up_rel``, ``_safe_norm`` (SPEC §7);
* ``witnesses`` -- §1–§2 Tier A: group norms, ``rope``, key / value witnesses, logit and rounding radii;
* ``sketch_window`` -- §2 as amended by issue 33: the residual sketch and the exact window;
* ``dual_grid`` -- §3(c) for one row: the dual values, the tight λ, the branch and bound;
* ``tv_bounds`` -- §3 from exact p̂: ``tv``, the tanh / e-form / tilt bounds, ``round_levels``;
* ``tv_logits`` -- §3 and §7 from served logits (log domain, the underflow term);
* ``output_error`` -- §4: the output error bound (and served in a narrower float: ``stored_output_error_bound``);
* ``tier_b`` -- §5: the dither's variance proxy, bias, radius and the failure budget.
"""

from __future__ import annotations

from contract.bands import group_slices
from contract.constants import DITHER_BIAS_FACTOR, DITHER_RESOLUTION_BITS

from .dual_grid import TILT_DEFAULT_TOL
from .inputs import PROB_SUM_TOL
from .output_error import output_error_bound, stored_output_error_bound
from .rounding import FP64_ABS_SLACK, FP64_REL_SLACK
from .sketch_window import sketch_center, sketch_decode, sketch_encode, sketch_radius, sketch_witness, window_mask
from .tier_b import dither_bias_bound, dither_radius, dither_variance_proxy, step_budget
from .tv_bounds import (
    box_levels,
    round_levels,
    tv,
    tv_bound,
    tv_bound_eform,
    tv_bound_parts,
    tv_bound_tanh,
    tv_bound_tilt,
    tv_sup_bruteforce,
)
from .tv_logits import tv_bound_logits, tv_bound_parts_logits
from .witnesses import dot_rounding_radius, group_norms, key_witness, logit_radius, rope, value_witness

__all__ = [
    "FP64_REL_SLACK",
    "FP64_ABS_SLACK",
    "PROB_SUM_TOL",
    "TILT_DEFAULT_TOL",
    "DITHER_RESOLUTION_BITS",
    "DITHER_BIAS_FACTOR",
    "group_slices",
    "group_norms",
    "rope",
    "key_witness",
    "value_witness",
    "logit_radius",
    "tv",
    "tv_bound_tanh",
    "tv_bound_eform",
    "tv_bound_tilt",
    "tv_bound",
    "tv_bound_parts",
    "tv_bound_parts_logits",
    "tv_bound_logits",
    "tv_sup_bruteforce",
    "dot_rounding_radius",
    "sketch_encode",
    "sketch_decode",
    "sketch_witness",
    "sketch_center",
    "sketch_radius",
    "window_mask",
    "output_error_bound",
    "stored_output_error_bound",
    "dither_variance_proxy",
    "dither_bias_bound",
    "dither_radius",
    "step_budget",
    "box_levels",
    "round_levels",
]
