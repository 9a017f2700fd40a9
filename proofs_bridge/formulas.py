"""Each SPEC formula declared once, as sympy (SPEC §2–§5, §8, and the §9 theorem names).

The numeric code in ``witcert.bounds`` and the kernels' constants are checked against these
declarations by ``proofs_bridge.check``; the mpmath falsification suite (``falsify``) evaluates
the §9 statements built from them. (The Lean statements these must equal are not written yet:
when ``lean/`` exists, its parsed conclusions are compared with the same expressions.)
"""

from __future__ import annotations

import sympy as sp

# symbols -------------------------------------------------------------------------------------
sigma, eps_max, A, s, lam, V, n, delta, t, m = sp.symbols("sigma eps_max A s lambda V n delta t m", real=True)
delta_req, L, H, T_max, step = sp.symbols("delta_req L H T_max step", positive=True)
tv_up, D_v, phi_max, pphi = sp.symbols("tv_up D_v phi_max pphi", nonnegative=True)
x = sp.symbols("x", real=True)

#: SPEC §3(a): tilt_tv_le_tanh, in the radius form TV ≤ tanh(ε_max / 2)
TANH_BOUND = sp.tanh(eps_max / 2)
#: SPEC §3(b): tilt_tv_le_eform, TV ≤ ½ (A² − 1) with A = Σ p̂ e^ε
EFORM_BOUND = sp.Rational(1, 2) * (A**2 - 1)
#: SPEC §3(c): β(t) for one item of radius x, and the hinge term of D(t, λ)
BETA = (1 - t) * sp.exp(x) + t * sp.exp(-x)
HINGE = sp.Max(lam * BETA - 1, 0)
#: SPEC §4: output_error_le
OUTPUT_BOUND = tv_up * (D_v + phi_max) + pphi
#: SPEC §5: uniform_mgf_le — sinh(λ s / 2) / (λ s / 2) ≤ exp(λ² (s²/12) / 2)
UNIFORM_MGF = sp.sinh(lam * s / 2) / (lam * s / 2)
UNIFORM_MGF_BOUND = sp.exp(lam**2 * (s**2 / 12) / 2)
VARIANCE_PROXY_PER_CHANNEL = s**2 / 12
#: SPEC §5: dither_logit_tail — the radius t = sqrt(2 V ln(2n/δ))
DITHER_RADIUS = sp.sqrt(2 * V * sp.log(2 * n / delta))
#: SPEC §5: request_budget_sound — the two schedules
BUDGET_FIXED = delta_req / (L * H * T_max)
BUDGET_ANYTIME = delta_req * 6 / (sp.pi**2 * step**2) / (L * H)
#: SPEC §5: the int8_dither scale divisor
INT8_DITHER_DIVISOR = sp.Rational(253, 2)  # 126.5

THEOREMS = [
    "rope_group_norm_invariant",
    "abs_logit_error_le_radius",
    "tv_eq_max_gain",
    "tilt_tv_le_tanh",
    "tilt_tv_le_eform",
    "tilt_tv_le_dual_grid",
    "output_error_le",
    "uniform_mgf_le",
    "dither_logit_tail",
    "request_budget_sound",
    "lse_merge_exact",
]
