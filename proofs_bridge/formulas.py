"""Each SPEC formula declared once, as sympy (SPEC §2–§5, §8, and the §9 theorem names).

The numeric code in ``witcert.bounds`` and the kernels' constants are checked against these
declarations by ``proofs_bridge.check``; the mpmath falsification suite (``falsify``) evaluates
the §9 statements built from them; and ``LEAN_THEOREMS`` / ``LEAN_DEFS`` state, in the same
sympy, what each Lean statement under ``lean/`` must say (its conclusion, the hypotheses that
define its quantities, and the bodies of the definitions it uses), built from the formulas
above wherever a formula exists — so a change to a formula here, to the Lean statement, or to
the numeric code fails the bridge.
"""

from __future__ import annotations

import sympy as sp

# symbols -------------------------------------------------------------------------------------
sigma, eps_max, A, s, lam, V, n, delta, t, m = sp.symbols("sigma eps_max A s lam V n delta t m", real=True)
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
#: the output served in a narrower float (a bf16 / fp16 output buffer, a cast to the model's dtype):
#: output_error_stored_le, err + rel·‖ô‖ + c with c = abs·√D (contract.constants.STORE_ROUNDING)
st_err, st_rel, st_c, st_onorm, st_abs, st_d = sp.symbols("err rel c onorm abs_ D", nonnegative=True)
STORED_OUTPUT_BOUND = st_err + st_rel * st_onorm + st_c
STORED_ABS_TERM = st_abs * sp.sqrt(st_d)
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
    "output_error_stored_le",
    "uniform_mgf_le",
    "dither_logit_tail",
    "request_budget_sound",
    "lse_merge_exact",
]


# --------------------------------------------------------------------------- the Lean statements
# Parsed Lean (proofs_bridge.lean_parse) is compared with these, side by side.
_f = sp.Function
Sum, setOf, norm, union, UNIV = _f("Sum"), _f("setOf"), _f("norm"), _f("union"), sp.Symbol("univ")
_j, _i, _g, _w, _tt = sp.symbols("j i g ω _t")
p, q, phat, eps, r, W, grp, gnorm = (_f(k) for k in ("p", "q", "phat", "eps", "r", "W", "grp", "gnorm"))
tv, B_, hi, lo, lam_, beta, dualD = _f("tv"), sp.Symbol("B"), _f("hi"), _f("lo"), _f("lam"), _f("beta"), _f("dualD")
phi, nu_max, o, o_hat = _f("phi"), sp.Symbol("nu_max"), sp.Symbol("o"), sp.Symbol("o_hat")
c_, s_, v_ = _f("c"), _f("s"), _f("v")
M, m1, m2, S1, S2 = sp.symbols("M m₁ m₂ S₁ S₂")
G = sp.Symbol("G")
T, Tm, Ls, Hs = sp.symbols("T T_max L H")
budgetFixed, budgetAnytime, ditherRadius = _f("budgetFixed"), _f("budgetAnytime"), _f("ditherRadius")
rng = _f("Finset.range")


def _lse(weight):
    w = weight
    return ("=", sp.exp(m1 - M) * Sum(S1, sp.Lambda(_j, sp.exp(_f("s")(_j) - m1) * w))
            + sp.exp(m2 - M) * Sum(S2, sp.Lambda(_j, sp.exp(_f("s")(_j) - m2) * w)),
            Sum(union(S1, S2), sp.Lambda(_j, sp.exp(_f("s")(_j) - M) * w)))


LEAN_THEOREMS = {
    "rope_group_norm_invariant": ("Bands", [("=", _f("groupNorm")(sp.Symbol("g"), _f("rope")(sp.Symbol("θ"), x)),
                                             _f("groupNorm")(sp.Symbol("g"), x))], {}),
    "abs_logit_error_le_radius": ("Radius", [("≤", sp.Abs(delta), sp.Symbol("eps"))], {
        "hdelta": [("=", delta, sigma * Sum(UNIV, sp.Lambda(_i, q(_i) * r(_i))))],
        "heps": [("=", sp.Symbol("eps"), sp.Abs(sigma) * Sum(G, sp.Lambda(_g, gnorm(grp(_g), sp.Symbol("q")) * W(_g))))],
    }),
    "tv_eq_max_gain": ("TiltTV", [("=", tv(sp.Symbol("p"), sp.Symbol("q")), _f("maxGain")(sp.Symbol("p"), sp.Symbol("q")))], {}),
    "tilt_tv_le_tanh": ("TiltTV", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), TANH_BOUND)], {}),
    "tilt_tv_le_eform": ("TiltTV", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), EFORM_BOUND)], {
        "hA": [("=", A, Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.exp(eps(_j)))))],
    }),
    "tilt_tv_le_dual_grid": ("TiltTV", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), B_)], {
        "hB": [("∀", ("i",), [("≤", hi(_i) - dualD(sp.Symbol("phat"), sp.Symbol("eps"), lo(_i), lam_(_i)), B_)])],
    }),
    "output_error_le": ("Output", [("≤", norm(o_hat - o), OUTPUT_BOUND)], {
        "hD": [("=", D_v, 2 * nu_max)],
        "hpphi": [("=", pphi, Sum(UNIV, sp.Lambda(_j, phat(_j) * phi(_j))))],
    }),
    "output_error_stored_le": ("Output", [("≤", norm(sp.Symbol("s") - o), STORED_OUTPUT_BOUND.xreplace(
        {st_err: sp.Symbol("err"), st_rel: sp.Symbol("rel"), st_c: sp.Symbol("c"), st_onorm: norm(o_hat)}))], {
        "herr": [("≤", norm(o_hat - o), sp.Symbol("err"))],
        "hs": [("≤", norm(sp.Symbol("s") - o_hat), sp.Symbol("rel") * norm(o_hat) + sp.Symbol("c"))],
    }),
    "uniform_mgf_le": ("SubGaussian", [("≤", UNIFORM_MGF, UNIFORM_MGF_BOUND)], {}),
    "dither_logit_tail": ("SubGaussian", [("≤", _f("μ.real")(setOf(sp.Lambda(_w, sp.Le(
        t, sp.Abs(sigma * Sum(UNIV, sp.Lambda(_i, q(_i) * r(_i, _w)))), evaluate=False)))),
        2 * sp.exp(-t**2 / (2 * V)))], {
        "hV": [("=", V, sigma**2 * Sum(UNIV, sp.Lambda(_i, q(_i) ** 2 * c_(_i))))],
    }),
    "tail_at_radius": ("SubGaussian", [("=", 2 * sp.exp(-ditherRadius(V, n, delta) ** 2 / (2 * V)), delta / n)], {}),
    "request_budget_sound": ("Budget", [
        ("=", Sum(rng(Tm), sp.Lambda(_tt, Ls * Hs * budgetFixed(delta_req, Ls, Hs, Tm))), delta_req),
        ("≤", Sum(rng(T), sp.Lambda(t, Ls * Hs * budgetAnytime(delta_req, Ls, Hs, t + 1))), delta_req),
    ], {}),
    "lse_merge_exact": ("SplitMerge", [_lse(1), _lse(v_(_j))], {}),
}
#: tail_at_radius is not a §9 name; it carries the §5 radius into Lean (stated as a lemma)
LEAN_LEMMAS = {"tail_at_radius"}

LEAN_DEFS = {
    # name: (file, parameters, body)
    "beta": ("TiltTV", ["t", "x"], BETA),
    "dualD": ("TiltTV", ["phat", "eps", "t", "lam"],
              lam * t * Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.exp(-eps(_j))))
              - Sum(UNIV, sp.Lambda(_j, phat(_j) * HINGE.xreplace({BETA: beta(t, x)}).xreplace({x: eps(_j)})))),
    "tv": ("TiltTV", ["p", "q"], Sum(UNIV, sp.Lambda(_j, sp.Abs(p(_j) - q(_j)))) / 2),
    "budgetFixed": ("Budget", ["delta_req", "L", "H", "T_max"], BUDGET_FIXED),
    "budgetAnytime": ("Budget", ["delta_req", "L", "H", "step"], BUDGET_ANYTIME),
    "ditherRadius": ("SubGaussian", ["V", "n", "delta"], DITHER_RADIUS),
}
#: the proxy of uniform_mgf_le is the per-channel proxy of §5
assert sp.simplify(UNIFORM_MGF_BOUND - sp.exp(lam**2 * VARIANCE_PROXY_PER_CHANNEL / 2)) == 0


# ------------------------------------------------ the chain of issue 14 (SPEC §9, extended)
# Each new theorem is stated so the next link uses it as is: uniform residual → sub-Gaussian
# proxy s²/12 → tail (ideal, and with the fp32 bias) → per-step union over tokens → request
# union (both schedules); k-way merge; the oscillation and top-two forms of §3(a); RoPE layouts.
osc, e12, b_ = sp.symbols("osc e12 b", real=True)
#: SPEC §3(a): tilt_tv_le_tanh_osc, TV ≤ tanh(osc / 4) with osc = max δ − min δ
TANH_OSC_BOUND = sp.tanh(osc / 4)
#: SPEC §3(a): tilt_tv_le_tanh_top2, TV ≤ tanh((ε₍₁₎ + ε₍₂₎) / 4)
TANH_TOP2_BOUND = sp.tanh(e12 / 4)
#: SPEC §5: the per-channel bias factor of the real fp32 scheme (b_j = |σ| Σ_i |q_i| s_{j,i} · 2⁻¹⁴)
DITHER_BIAS_PER_CHANNEL = s * sp.Rational(1, 2**14)

CHAIN_THEOREMS = [
    "uniform_hasSubgaussianMGF",
    "dither_logit_tail_uniform",
    "dither_logit_tail_bias",
    "union_tail_le",
    "dither_step_union",
    "request_union_sound",
    "lse_merge_exact_k",
    "tilt_tv_le_tanh_osc",
    "tilt_tv_le_tanh_top2",
    "rope_layout_group_norm_invariant",
    "rope_half_group_norm_invariant",
    "rope_interleaved_group_norm_invariant",
]
THEOREMS += CHAIN_THEOREMS

_k, _l, _h = sp.symbols("k l h")
mu_real, e_, beta_, E_, tt_, Vf, bf = _f("μ.real"), _f("e"), _f("beta"), _f("E"), _f("tt"), _f("V"), _f("b")
sf, mf, Sf, Ff, Gf = _f("s"), _f("m"), _f("S"), _f("F"), _f("G")
iUnion, exists_ = _f("iUnion"), _f("exists")
coordNorm, coordsOf = _f("coordNorm"), _f("coordsOf")
_sigma_q_sum = lambda res: sp.Abs(sigma * Sum(UNIV, sp.Lambda(_i, q(_i) * res)))  # noqa: E731
_TAIL = 2 * sp.exp(-t**2 / (2 * V))


def _HU(res, scale):
    """`MeasureTheory.pdf.IsUniform res (Set.Icc (-(scale / 2)) (scale / 2)) μ` (SPEC §5's U[−s/2, s/2])."""
    return [_f("MeasureTheory.pdf.IsUniform")(res, _f("Set.Icc")(-(scale / 2), scale / 2), sp.Symbol("μ"))]


def _lse_k(w):
    return ("=", Sum(sp.Symbol("K"), sp.Lambda(_k, sp.exp(mf(_k) - M) * Sum(Sf(_k), sp.Lambda(_j, sp.exp(sf(_j) - mf(_k)) * w)))),
            Sum(_f("K.biUnion")(sp.Symbol("S")), sp.Lambda(_j, sp.exp(sf(_j) - M) * w)))


def _rope_inv(fst, snd, rope):
    grp = coordsOf(fst, snd, sp.Symbol("g"))
    return [("=", coordNorm(grp, rope), coordNorm(grp, x))]


LEAN_THEOREMS.update({
    "uniform_hasSubgaussianMGF": ("SubGaussian", [_f("HasSubgaussianMGF")(
        sp.Symbol("r"), _f("Real.toNNReal")(VARIANCE_PROXY_PER_CHANNEL), sp.Symbol("μ"))], {
        "hu": _HU(sp.Symbol("r"), s),
    }),
    "dither_logit_tail_uniform": ("SubGaussian", [("≤", mu_real(setOf(sp.Lambda(_w, sp.Le(
        t, _sigma_q_sum(r(_i, _w)), evaluate=False)))), _TAIL)], {
        "hV": [("=", V, sigma**2 * Sum(UNIV, sp.Lambda(_i, q(_i) ** 2 * VARIANCE_PROXY_PER_CHANNEL.xreplace({s: sf(_i)}))))],
        "hu": [("∀", ("i",), _HU(r(_i), sf(_i)))],
    }),
    "dither_logit_tail_bias": ("SubGaussian", [("≤", mu_real(setOf(sp.Lambda(_w, sp.Le(
        t + b_, _sigma_q_sum(e_(_i, _w)), evaluate=False)))), _TAIL)], {
        "hV": [("=", V, sigma**2 * Sum(UNIV, sp.Lambda(_i, q(_i) ** 2 * c_(_i))))],
        "hb": [("=", b_, sp.Abs(sigma) * Sum(UNIV, sp.Lambda(_i, sp.Abs(q(_i)) * beta_(_i))))],
    }),
    "union_tail_le": ("Union", [("≤", mu_real(iUnion(sp.Symbol("T"), sp.Lambda(_j, E_(_j)))), delta)], {
        "hE": [("∀", ("j", "∈", "T"), [("≤", mu_real(E_(_j)), delta / sp.Symbol("T.card"))])],
    }),
    "dither_step_union": ("Union", [("≤", mu_real(setOf(sp.Lambda(_w, exists_(_j, sp.Le(
        tt_(_j), sp.Abs(sigma * Sum(UNIV, sp.Lambda(_i, q(_i) * e_(_j, _i, _w)))), evaluate=False))))), delta)], {
        "hV": [("∀", ("j",), [("=", Vf(_j), sigma**2 * Sum(UNIV, sp.Lambda(_i, q(_i) ** 2 * c_(_j, _i))))])],
        "hb": [("∀", ("j",), [("=", bf(_j), sp.Abs(sigma) * Sum(UNIV, sp.Lambda(_i, sp.Abs(q(_i)) * beta_(_j, _i))))])],
        "htt": [("∀", ("j",), [("=", tt_(_j), ditherRadius(Vf(_j), _f("Fintype.card")(sp.Symbol("κ")), delta) + bf(_j))])],
    }),
    "request_union_sound": ("Union", [
        ("≤", mu_real(iUnion(rng(Ls), sp.Lambda(_l, iUnion(rng(Hs), sp.Lambda(
            _h, iUnion(rng(Tm), sp.Lambda(t, Ff(_l, _h, t)))))))), delta_req),
        ("≤", mu_real(iUnion(rng(Ls), sp.Lambda(_l, iUnion(rng(Hs), sp.Lambda(
            _h, iUnion(rng(T), sp.Lambda(t, Gf(_l, _h, t)))))))), delta_req),
    ], {
        "hF": [("∀", ("l", "h", "t"), [("≤", mu_real(Ff(_l, _h, t)), budgetFixed(delta_req, Ls, Hs, Tm))])],
        "hG": [("∀", ("l", "h", "t"), [("≤", mu_real(Gf(_l, _h, t)), budgetAnytime(delta_req, Ls, Hs, t + 1))])],
    }),
    "lse_merge_exact_k": ("SplitMerge", [_lse_k(1), _lse_k(v_(_j))], {}),
    "tilt_tv_le_tanh_osc": ("TiltTV", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), TANH_OSC_BOUND)], {
        "hosc": [("∀", ("i", "j"), [("≤", _f("delta")(_i) - _f("delta")(_j), osc)])],
    }),
    "tilt_tv_le_tanh_top2": ("TiltTV", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), TANH_TOP2_BOUND)], {}),
    "rope_layout_group_norm_invariant": ("Bands", _rope_inv(sp.Symbol("fst"), sp.Symbol("snd"), sp.Symbol("y")), {}),
    "rope_half_group_norm_invariant": ("Bands", _rope_inv(
        sp.Symbol("halfFst"), _f("halfSnd")(sp.Symbol("h")), _f("ropeHalf")(sp.Symbol("h"), sp.Symbol("θ"), x)), {}),
    "rope_interleaved_group_norm_invariant": ("Bands", _rope_inv(
        sp.Symbol("ilvFst"), sp.Symbol("ilvSnd"), _f("ropeInterleaved")(sp.Symbol("h"), sp.Symbol("θ"), x)), {}),
})

_bb = sp.Symbol("b")
LEAN_DEFS.update({
    # the two RoPE layouts of SPEC §1: band b ↦ coordinate pair
    "halfFst": ("Bands", ["b"], _bb),
    "halfSnd": ("Bands", ["h", "b"], _bb + sp.Symbol("h")),
    "ilvFst": ("Bands", ["b"], 2 * _bb),
    "ilvSnd": ("Bands", ["b"], 2 * _bb + 1),
    "coordNorm": ("Bands", ["S", "x"], sp.sqrt(Sum(sp.Symbol("S"), sp.Lambda(_i, _f("x")(_i) ** 2)))),
})


# ------------------------------------------- SPEC §7: the floating point of the decode pass
# The kernel holds p̃ (log-ratio to p̂ at most Ξ) and may lose the tokens U (masses ≤ Λ):
# TV⁺ = min(§3 bounds at radii ε + Ξ on p̃) + tanh(Ξ/2) + ρ (lean/WitCert/FloatTV.lean).
Xi, F_, Lam = sp.symbols("Xi F Lambda", real=True)
#: SPEC §7 (Ξ): tv_le_perturbed_base, TV(p, p̂) ≤ F + tanh(Ξ/2)
XI_TERM = sp.tanh(Xi / 2)
#: SPEC §7 (Ξ): the radii of p as a tilt of p̃ (tilt_rebase)
REBASE_RADIUS = eps(_j) + Xi
#: SPEC §7 (ρ): tilt_mass_lost_le, p(U) ≤ Σ_U p̂ e^ε / Σ p̂ e^{−ε}
_U = sp.Symbol("U")
LOST_MASS_BOUND = Sum(_U, sp.Lambda(_j, phat(_j) * sp.exp(eps(_j)))) / Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.exp(-eps(_j))))
#: SPEC §7 (ρ): the kernel's ρ = Λ (1 + e^{ε_max + Ξ} / m) (kernels/epilogue_jit.py, kernels/epilogue_torch.py)
RHO_KERNEL = Lam * (1 + sp.exp(eps_max + Xi) / m)
#: the kernel's ρ is the Lean bound p̂(U) + LOST_MASS_BOUND with p̂(U) ≤ Λ, Σ_U p̂ e^ε ≤ Λ e^{ε_max+Ξ}
#: (every radius of p over p̃ is ≤ ε_max + Ξ) and Σ p̂ e^{−ε} ≥ m
_num, _den = sp.symbols("num den")
assert sp.simplify((Lam + _num / _den).subs({_num: Lam * sp.exp(eps_max + Xi), _den: m}) - RHO_KERNEL) == 0

FP_THEOREMS = [
    "tilt_rebase",
    "tv_le_perturbed_base",
    "tv_le_perturbed_base_tanh",
    "tv_le_restrict_add_lost",
    "tilt_restrict",
    "tilt_mass_lost_le",
    "tilt_mass_lost_le_compl",
    "tv_le_restrict_add_rho",
]
THEOREMS += FP_THEOREMS

_P, _Ph, _Pt, _d = (sp.Symbol(k) for k in ("p", "phat", "ptilde", "d"))
restrictNorm, IsTilt, delta_f, xi_f = _f("restrictNorm"), _f("IsTilt"), _f("delta"), _f("xi")
_Uc = sp.Symbol("Uᶜ")
_TV_RESTRICT = tv(restrictNorm(_P, _Uc), restrictNorm(_Ph, _Uc))
_pU, _phU = Sum(_U, sp.Lambda(_j, p(_j))), Sum(_U, sp.Lambda(_j, phat(_j)))
_HXI = [("∀", ("j",), [("≤", sp.Abs(xi_f(_j)), Xi)])]

LEAN_THEOREMS.update({
    "tilt_rebase": ("FloatTV", [IsTilt(_Pt, _d, _P), ("∀", ("j",), [("≤", sp.Abs(_f("d")(_j)), REBASE_RADIUS)])], {
        "hd": [("∀", ("j",), [("=", _f("d")(_j), delta_f(_j) - xi_f(_j))])],
        "hxi": _HXI,
    }),
    "tv_le_perturbed_base": ("FloatTV", [("≤", tv(_P, _Ph), F_ + XI_TERM)], {"hxi": _HXI}),
    "tv_le_perturbed_base_tanh": ("FloatTV", [("≤", tv(_P, _Ph), TANH_BOUND.subs(eps_max, eps_max + Xi) + XI_TERM)], {
        "hxi": _HXI,
    }),
    "tv_le_restrict_add_lost": ("FloatTV", [("≤", tv(_P, _Ph), _TV_RESTRICT + _pU + _phU)], {}),
    "tilt_restrict": ("FloatTV", [IsTilt(restrictNorm(_Ph, _Uc), _d, restrictNorm(_P, _Uc))], {
        "hd": [("∀", ("j",), [("=", _f("d")(_j), delta_f(_j))])],
    }),
    "tilt_mass_lost_le": ("FloatTV", [("≤", _pU, LOST_MASS_BOUND)], {}),
    "tilt_mass_lost_le_compl": ("FloatTV", [("≤", _pU, LOST_MASS_BOUND.subs(UNIV, _Uc))], {}),
    "tv_le_restrict_add_rho": ("FloatTV", [("≤", tv(_P, _Ph), _TV_RESTRICT + _phU + LOST_MASS_BOUND)], {}),
})

LEAN_DEFS.update({
    # p restricted to the kept tokens V and renormalised (SPEC §7)
    "restrictNorm": ("FloatTV", ["q", "V", "j"], q(_j) / Sum(sp.Symbol("V"), sp.Lambda(_i, q(_i)))),
})


# ------------------------------- SPEC §2 (Tier A): the residual-sketch radius (issue 37, (d))
# lean/WitCert/Sketch.lean. One kv head, token j, query head h, softmax scale σ, weights a > 0
# (per RoPE band), residual r_j = k̂_j − k_j, stored sketch r̃_j, witness W_j ≥ ‖(r_j − r̃_j)/a‖:
#   per head   |δ_{h,j}| ≤ |σ| |⟨q_h, r̃_j⟩| + |σ| ‖a ⊙ q_h‖ W_j          (sketch_logit_error_le)
#   shared     |δ_{h,j}| ≤ c_h (W_j + u_j),  c_h = |σ| ‖a ⊙ q_h‖,
#              u_j ≥ |σ ⟨q_h', r̃_j⟩| / c_h' for every head h' of the group (sketch_shared_radius_le)
# `proofs_bridge.check._check_sketch_radius` checks `witcert.bounds.sketch_radius` against these.
c_h, W_j, u_j, qa_norm, qrt_dot = sp.symbols("c_h W_j u_j qa_norm qrt_dot", real=True)
#: the kernel's shared level of (head h, token j)
SKETCH_RADIUS = c_h * (W_j + u_j)
#: c_h = |σ| ‖a ⊙ q_h‖ (qa_norm = ‖a ⊙ q_h‖)
SKETCH_SCALE = sp.Abs(sigma) * qa_norm
#: the per-head form |σ| |⟨q_h, r̃⟩| + |σ| ‖a ⊙ q_h‖ W (qrt_dot = ⟨q_h, r̃⟩)
SKETCH_PER_HEAD = sp.Abs(sigma) * sp.Abs(qrt_dot) + SKETCH_SCALE * W_j
#: one head's ratio |σ ⟨q_h, r̃⟩| / c_h; the kernel's u_j is the maximum over the group
SKETCH_U_RATIO = sp.Abs(sigma * qrt_dot) / c_h
#: SPEC §8's projected radius |σ| (|q_P · r_P| + ‖q_{¬P}‖ ‖r_{¬P}‖) (the orthogonal split)
qP_dot, qPc_norm, rPc_norm = sp.symbols("qP_dot qPc_norm rPc_norm", real=True)
PROJECTED_RADIUS = sp.Abs(sigma) * (sp.Abs(qP_dot) + qPc_norm * rPc_norm)
#: the exact window: a token served in the model dtype has δ_j = 0, radius 0
WINDOW_RADIUS = sp.Integer(0)
#: issue 37 (d): the kernel's key-side level |σ| ‖q‖ ‖(W_g)_g‖₂ (kernels/epilogue_jit.py: `qn · edge`)
q_norm, W_norm2 = sp.symbols("q_norm W_norm2", real=True)
KERNEL_KEY_RADIUS = sp.Abs(sigma) * q_norm * W_norm2
#: the per-head form is the shared radius when u_j is at least the head's own ratio (equality at u_j = ratio)
assert sp.simplify(SKETCH_PER_HEAD - SKETCH_RADIUS.subs({c_h: SKETCH_SCALE, u_j: sp.Abs(qrt_dot) / qa_norm})) == 0

SKETCH_THEOREMS = [
    "weighted_inner_le",
    "sketch_logit_error_le",
    "sketch_shared_radius_le",
    "sketch_u_of_ratio_le",
    "projected_logit_error_le",
    "window_token_radius_zero",
    "window_radii_sound",
    "window_tv_le_eform",
    "kernel_radius_ge_group_sum",
    "sketch_radius_ge_per_head",
    "sketch_radius_ge_group_sum",
]
THEOREMS += SKETCH_THEOREMS

_S = sp.Symbol
wmul, wdiv, qh, rt_, epsw, khat, k_, Wg = (_f(k) for k in ("wmul", "wdiv", "qh", "rt", "epsw", "khat", "k", "Wg"))
_a, _q, _r, _rt, _x, _W, _u, _c = (_S(k) for k in ("a", "q", "r", "rt", "x", "W", "u", "c"))
_Pc = _S("Pᶜ")


def _dot(f, g, dom=UNIV):
    return Sum(dom, sp.Lambda(_i, f * g))


def _sk(expr, **sub):
    """A Sketch formula with its plain symbols replaced by the Lean terms ``sub`` names."""
    names = {"c_h": c_h, "W_j": W_j, "u_j": u_j, "qa_norm": qa_norm, "qrt_dot": qrt_dot, "qP_dot": qP_dot,
             "qPc_norm": qPc_norm, "rPc_norm": rPc_norm, "q_norm": q_norm, "W_norm2": W_norm2}
    return expr.xreplace({names[k]: v for k, v in sub.items()})


_qa = gnorm(UNIV, wmul(_a, _q))
_qha = gnorm(UNIV, wmul(_a, qh(_h)))
_HW = [("≤", gnorm(UNIV, wdiv(_r - _rt, _a)), _W)]
_GROUP_SUM = lambda w: sp.Abs(sigma) * Sum(G, sp.Lambda(_g, gnorm(grp(_g), _q) * w(_g)))  # noqa: E731
_W2 = lambda w: sp.sqrt(Sum(G, sp.Lambda(_g, w(_g) ** 2)))  # noqa: E731
_HWIN = [("∀", ("j", "∈", "Win"), [("=", epsw(_j), WINDOW_RADIUS)])]

LEAN_THEOREMS.update({
    "weighted_inner_le": ("Sketch", [("≤", sp.Abs(_dot(q(_i), _f("x")(_i))),
                                      _qa * gnorm(UNIV, wdiv(_x, _a)))], {}),
    "sketch_logit_error_le": ("Sketch", [("≤", sp.Abs(sigma * _dot(q(_i), r(_i))),
                                          _sk(SKETCH_PER_HEAD, qrt_dot=_dot(q(_i), rt_(_i)), qa_norm=_qa, W_j=_W))], {
        "hW": _HW,
    }),
    "sketch_shared_radius_le": ("Sketch", [("≤", sp.Abs(sigma * _dot(qh(_h, _i), r(_i))),
                                            _sk(SKETCH_RADIUS, c_h=c_(_h), W_j=_W, u_j=_u))], {
        "hW": _HW,
        "hc": [("∀", ("h",), [("=", c_(_h), _sk(SKETCH_SCALE, qa_norm=_qha))])],
        "hu": [("∀", ("h",), [("≤", sp.Abs(sigma * _dot(qh(_h, _i), rt_(_i))), c_(_h) * _u)])],
    }),
    "sketch_u_of_ratio_le": ("Sketch", [("≤", sp.Abs(sigma * _dot(qh(_h, _i), rt_(_i))), c_(_h) * _u)], {
        "hratio": [("∀", ("h",), [("≤", _sk(SKETCH_U_RATIO, qrt_dot=_dot(qh(_h, _i), rt_(_i)), c_h=c_(_h)), _u)])],
    }),
    "projected_logit_error_le": ("Sketch", [("≤", sp.Abs(sigma * _dot(q(_i), r(_i))), _sk(
        PROJECTED_RADIUS, qP_dot=_dot(q(_i), r(_i), _S("P")), qPc_norm=gnorm(_Pc, _q), rPc_norm=gnorm(_Pc, _r)))], {}),
    "window_token_radius_zero": ("Sketch", [("≤", sp.Abs(delta), WINDOW_RADIUS)], {
        "hdelta": [("=", delta, sigma * _dot(q(_i), khat(_i) - k_(_i)))],
        "hexact": [("∀", ("i",), [("=", khat(_i), k_(_i))])],
    }),
    "window_radii_sound": ("Sketch", [("∀", ("j",), [("≤", sp.Abs(delta_f(_j)), epsw(_j))])], {
        "hwin": [("∀", ("j", "∈", "Win"), [("=", delta_f(_j), 0)])],
        "hw0": _HWIN,
    }),
    "window_tv_le_eform": ("Sketch", [("≤", tv(_P, _Ph), EFORM_BOUND)], {
        "hA": [("=", A, Sum(UNIV, sp.Lambda(_j, phat(_j) * sp.exp(epsw(_j)))))],
        "hw0": _HWIN,
    }),
    "kernel_radius_ge_group_sum": ("Sketch", [("≤", _GROUP_SUM(W), _sk(KERNEL_KEY_RADIUS, q_norm=gnorm(UNIV, _q),
                                                                        W_norm2=_S("Wn")))], {
        "hWn": [("=", _S("Wn"), _W2(W))],
    }),
    "sketch_radius_ge_per_head": ("Sketch", [("≤", _sk(SKETCH_PER_HEAD, qrt_dot=_dot(q(_i), rt_(_i)), qa_norm=_qa, W_j=_W),
                                              _sk(SKETCH_RADIUS, c_h=_c, W_j=_W, u_j=_u))], {
        "hc": [("=", _c, _sk(SKETCH_SCALE, qa_norm=_qa))],
        "hu": [("≤", sp.Abs(sigma * _dot(q(_i), rt_(_i))), _c * _u)],
    }),
    "sketch_radius_ge_group_sum": ("Sketch", [("≤", _GROUP_SUM(Wg), _sk(SKETCH_RADIUS, c_h=_c, W_j=_W, u_j=_u))], {
        "hc": [("=", _c, _sk(SKETCH_SCALE, qa_norm=_qa))],
        "hWn": [("=", _W, _W2(Wg))],
        "ha1": [("∀", ("i",), [("=", _f("a")(_i), 1)])],
    }),
})

LEAN_DEFS.update({
    # the Euclidean norm of a group's coordinates (Radius.lean) and the weighted query / residual (Sketch.lean)
    "gnorm": ("Radius", ["g", "x"], sp.sqrt(Sum(_S("g"), sp.Lambda(_i, _f("x")(_i) ** 2)))),
    "wmul": ("Sketch", ["a", "q", "i"], _f("a")(_i) * q(_i)),
    "wdiv": ("Sketch", ["x", "a", "i"], _f("x")(_i) / _f("a")(_i)),
})


# --------------------- SPEC §3(c) with endpoint values (issue 33; lean/WitCert/TiltEndpoints.lean)
# For λ ≥ 0, t ↦ D(t, λ) is concave (β affine in t, the hinge convex), so g(t) = t − D(t, λ) is convex and
# its maximum on an interval [t₀, t₁] is at an end: any cover of [0, 1] by intervals, each with its own
# λ_i ≥ 0 and both end values ≤ B, gives TV ≤ B. The epilogue (kernels/epilogue_jit.py: `_dense_u`, its torch
# twin `_interval_upper` in kernels/epilogue_torch.py) and the fp64 reference
# (`witcert.bounds.dual_grid._tilt_row`) take per interval the least,
# over their candidate λ (λ = 0 included: g = t, the cap t₁), of the larger end value.
#: D(t, λ) = Σ_k w_k DUAL_ITEM(x_k) for a distribution w over the levels x_k (LEAN_DEFS["dualD"] term by term:
#: λ t Σ_k w_k e^{−x_k} − Σ_k w_k (λ β(t, x_k) − 1)₊)
DUAL_ITEM = lam * t * sp.exp(-x) - HINGE
_one_item = LEAN_DEFS["dualD"][2].replace(Sum, lambda dom, f: f(_j)).replace(
    beta, lambda tt, xx: BETA.xreplace({t: tt, x: xx})).xreplace({phat(_j): 1, eps(_j): x})
assert sp.simplify(_one_item - DUAL_ITEM) == 0
#: the larger end value of g on [t₀, t₁] for one λ (g₀ = t₀ − D(t₀, λ), g₁ = t₁ − D(t₁, λ))
g0_, g1_ = sp.symbols("g0 g1", real=True)
ENDPOINT_UPPER = sp.Max(g0_, g1_)

ENDPOINT_THEOREMS = ["tilt_tv_le_dual_grid_endpoints"]
THEOREMS += ENDPOINT_THEOREMS

def _ends(dual):
    """hlam, hBlo, hBhi of an endpoint theorem whose dual value at (t, λ) is ``dual(t, λ)``."""
    return {
        "hlam": [("∀", ("i",), [("≤", 0, lam_(_i))])],
        "hBlo": [("∀", ("i",), [("≤", lo(_i) - dual(lo(_i), lam_(_i)), B_)])],
        "hBhi": [("∀", ("i",), [("≤", hi(_i) - dual(hi(_i), lam_(_i)), B_)])],
    }


LEAN_THEOREMS.update({
    "tilt_tv_le_dual_grid_endpoints": ("TiltEndpoints", [("≤", tv(sp.Symbol("p"), sp.Symbol("phat")), B_)],
                                       _ends(lambda tt, ll: dualD(sp.Symbol("phat"), sp.Symbol("eps"), tt, ll))),
})


# ------------------------ issue 37 (b), (c): the composed statements (FloatTV.lean, Request.lean)
# (c) kernel_tv_sound: the decode pass as one statement — TV(p, p̂) ≤ F + tanh(Ξ/2) + ρ with the kernel's
#     ρ = Λ (1 + e^{ε_max+Ξ}/m), Λ the lost mass relative to the kept one, m ≤ Σ_V p̃ e^{−(lev+Ξ)} / p̃(V)
#     (kernels/epilogue_jit.py `_tv_row` / epilogue_torch.py `tv_from_hist_torch`: checked by check_fp_terms against RHO_KERNEL,
#     XI_TERM and TANH_BOUND).
# (b) step_tv_sound / request_tv_sound(_fixed, _anytime): P(∃ layer, head, step: TV⁺ < TV) ≤ δ_req at the
#     Tier B radii ditherRadius(V, n, δ_step) + b and the two schedules (witcert.bounds.step_budget,
#     dither_radius, dither_bias_bound: checked in check_formulas against BUDGET_*, DITHER_RADIUS and
#     DITHER_BIAS_PER_CHANNEL).
COMPOSED_THEOREMS = [
    "kernel_tv_sound",
    "kernel_tv_sound_tanh",
    "step_tv_sound",
    "request_tv_sound",
    "request_tv_sound_fixed",
    "request_tv_sound_anytime",
]
THEOREMS += COMPOSED_THEOREMS

_rho, _lev, _ptl = sp.Symbol("rho"), _f("lev"), _f("ptilde")
_RHO_LEAN = RHO_KERNEL.xreplace({Lam: sp.Symbol("Lam")})
_KERNEL_HYPS = {
    "hxi": _HXI,
    "hlev": [("∀", ("j",), [("≤", eps(_j), _lev(_j))])],
    "hmax": [("∀", ("j",), [("≤", _lev(_j), eps_max)])],
    "hLam": [("≤", Sum(_U, sp.Lambda(_j, _ptl(_j))), sp.Symbol("Lam") * Sum(_Uc, sp.Lambda(_j, _ptl(_j))))],
    "hm": [("≤", m, Sum(_Uc, sp.Lambda(_j, _ptl(_j) * sp.exp(-(_lev(_j) + Xi)))) / Sum(_Uc, sp.Lambda(_j, _ptl(_j))))],
    "hrho": [("=", _rho, _RHO_LEAN)],
}
_dl, _TVup, _Ev, _ds = _f("dl"), _f("TVup"), _f("Ev"), _f("ds")
_card = _f("Fintype.card")(sp.Symbol("κ"))


def _bad_step(*ix):
    """{ω | TV⁺ < TV(p, p̂)} of one step (indices ``ix``: none, or l h t)."""
    return setOf(sp.Lambda(_w, sp.Lt(_TVup(*ix, _w), tv(p(*ix, _w), phat(*ix, _w)), evaluate=False)))


def _request_hyps(step_budget):
    """The hypotheses of request_tv_sound that define its quantities, at the step budget ``step_budget``."""
    return {
        "hV": [("∀", ("l", "h", "t", "j"), [("=", Vf(_l, _h, t, _j), sigma**2 * Sum(UNIV, sp.Lambda(
            _i, q(_l, _h, t, _i) ** 2 * c_(_l, _h, t, _j, _i))))])],
        "hb": [("∀", ("l", "h", "t", "j"), [("=", bf(_l, _h, t, _j), sp.Abs(sigma) * Sum(UNIV, sp.Lambda(
            _i, sp.Abs(q(_l, _h, t, _i)) * beta_(_l, _h, t, _j, _i))))])],
        "htt": [("∀", ("l", "h", "t", "j"), [("=", tt_(_l, _h, t, _j),
                                               ditherRadius(Vf(_l, _h, t, _j), _card, step_budget) + bf(_l, _h, t, _j))])],
        "hdl": [("∀", ("l", "h", "t", "ω", "j"), [("=", _dl(_l, _h, t, _w, _j), sigma * Sum(UNIV, sp.Lambda(
            _i, q(_l, _h, t, _i) * e_(_l, _h, t, _j, _i, _w))))])],
        "hEv": [("∀", ("l", "h", "t"), [("=", _Ev(_l, _h, t), _bad_step(_l, _h, t))])],
    }


def _request_union(horizon):
    return [("≤", mu_real(iUnion(rng(Ls), sp.Lambda(_l, iUnion(rng(Hs), sp.Lambda(_h, iUnion(rng(horizon), sp.Lambda(
        t, _Ev(_l, _h, t)))))))), delta_req)]


LEAN_THEOREMS.update({
    "kernel_tv_sound": ("FloatTV", [("≤", tv(_P, _Ph), F_ + XI_TERM + _rho)], _KERNEL_HYPS),
    "kernel_tv_sound_tanh": ("FloatTV", [("≤", tv(_P, _Ph), TANH_BOUND.subs(eps_max, eps_max + Xi) + XI_TERM + _rho)],
                             _KERNEL_HYPS),
    "step_tv_sound": ("Request", [("≤", mu_real(_bad_step()), delta)], {
        "hV": LEAN_THEOREMS["dither_step_union"][2]["hV"],
        "hb": LEAN_THEOREMS["dither_step_union"][2]["hb"],
        "htt": LEAN_THEOREMS["dither_step_union"][2]["htt"],
        "hdl": [("∀", ("ω", "j"), [("=", _dl(_w, _j), sigma * Sum(UNIV, sp.Lambda(_i, q(_i) * e_(_j, _i, _w))))])],
    }),
    "request_tv_sound": ("Request", _request_union(T), {
        **_request_hyps(_ds(t)),
        "hbudget": [("≤", Sum(rng(T), sp.Lambda(t, Ls * Hs * _ds(t))), delta_req)],
    }),
    "request_tv_sound_fixed": ("Request", _request_union(Tm), _request_hyps(budgetFixed(delta_req, Ls, Hs, Tm))),
    "request_tv_sound_anytime": ("Request", _request_union(T), _request_hyps(budgetAnytime(delta_req, Ls, Hs, t + 1))),
})


# -------------------------- issue 37 (f): partial rotary (lean/WitCert/Bands.lean, passthrough ≥ 2h)
PARTIAL_ROTARY_THEOREMS = [
    "rope_half_partial_group_norm_invariant",
    "rope_interleaved_partial_group_norm_invariant",
]
THEOREMS += PARTIAL_ROTARY_THEOREMS


def _rope_inv_partial(fst, snd, rope):
    grp = union(coordsOf(fst, snd, sp.Symbol("g")), sp.Symbol("P"))
    return [("=", coordNorm(grp, rope), coordNorm(grp, x))]


_HPASS = {"hP": [("∀", ("i", "∈", "P"), [("≤", 2 * sp.Symbol("h"), _i)])]}
LEAN_THEOREMS.update({
    "rope_half_partial_group_norm_invariant": ("Bands", _rope_inv_partial(
        sp.Symbol("halfFst"), _f("halfSnd")(sp.Symbol("h")), _f("ropeHalf")(sp.Symbol("h"), sp.Symbol("θ"), x)), _HPASS),
    "rope_interleaved_partial_group_norm_invariant": ("Bands", _rope_inv_partial(
        sp.Symbol("ilvFst"), sp.Symbol("ilvSnd"), _f("ropeInterleaved")(sp.Symbol("h"), sp.Symbol("θ"), x)), _HPASS),
})


# ------------------------------- SPEC §3(c), the centred box (lean/WitCert/TiltBox.lean): proofs_bridge/formulas_box.py
from .formulas_box import add_box  # noqa: E402

add_box(globals())
