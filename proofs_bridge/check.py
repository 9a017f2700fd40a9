"""The bridge's checks: constants, formula agreement, falsification, Lean status.

``run_checks()`` returns a list of (check, ok, detail) where ``ok`` is ``True`` (passed), ``False``
(failed) or ``SKIP`` (``None``: the step was not run here, so it proves nothing — it never prints
``ok``). ``python -m proofs_bridge check`` prints them as ``ok`` / ``FAIL`` / ``SKIP``, ends with a
line counting all three, and exits non-zero if any fails. What is checked:

* constants: the int8_dither divisor (126.5), the 1/12 proxy, the default tilt tolerance
  (2^-12) and every kernel constant that restates a formula (the kernels import or restate
  them: a drift in either place fails here);
* formulas: ``witcert.bounds`` and ``kernels.decode.tier_b_coefficients`` evaluated at random
  points equal the sympy declarations of ``proofs_bridge.formulas`` (within the documented
  round-up slack, never below);
* the §3(c) tilt with endpoint values (``check_tilt.check_tilt_endpoints``, Lean ``tilt_tv_le_dual_grid_endpoints``):
  the epilogue's torch twin ``_interval_upper`` interval by interval, the kernel's ``_tv_row`` tilt on its
  grid and the fp64 reference's ``tv_bound_tilt`` on a fixed grid, against t − D(t, λ) at both ends of every
  interval; the residual-sketch radius (``_check_sketch_radius``, Lean ``sketch_shared_radius_le`` /
  ``sketch_logit_error_le``) against ``formulas.SKETCH_RADIUS`` / ``SKETCH_PER_HEAD``;
* the §3(c) tilt of the centred box (``check_tilt.check_tilt_box``, Lean ``tilt_tv_le_dual_grid_box_endpoints``): the fp64
  reference's ``dual_grid._tilt_row_box`` on a fixed grid against t − dualDBox(t, λ) at both ends of every interval
  (``formulas.DUAL_ITEM_BOX``), and, with ``tv_bound_parts_logits(center=…)``, never below the brute-force supremum;
* the same theorem on the fixed (t, λ) grid (``check_tilt.check_tilt_grid``, ``sketch_box="grid"``): the fp64
  reference's ``dual_grid._tilt_row_grid`` with the contract's grid and float32 multipliers against t − dualDBox(t, λ_k)
  at both ends of every interval, the best candidate per interval, and never below the brute-force supremum;
* the excess form's (t, λ) grid over the kernel's masses (``check_excess.check_excess_grid``, Lean
  ``tilt_tv_le_grid_rescaled_capped``): the merge's twin against the capped cover of ``gridBound`` on the contract's
  cover, never below it nor the brute-force supremum, and the merge's hard-coded cover against the contract's;
* the centred box's excess form (``check_excess.check_excess_form``, Lean ``tilt_tv_le_excess``,
  ``tilt_tv_le_excess_widened``): the one interval [0, 1] with λ = 1 of dualDBox against ``formulas.EXCESS_UP`` /
  ``EXCESS_DOWN``, the merge's torch twin against the widened theorem's right side (never below it), the fp64
  reference's one-interval grid against max(A, B), and max(A, B) never below the brute-force supremum;
* falsification: every §9 statement on random instances in 50-digit arithmetic (``falsify``);
* Lean statements: every §9 theorem (and ``tail_at_radius``) is parsed from ``lean/`` by
  ``lean_parse`` and its conclusion and defining hypotheses must equal ``formulas.LEAN_THEOREMS``;
  the bodies of ``beta``, ``dualD``, ``tv``, ``budgetFixed``, ``budgetAnytime`` and
  ``ditherRadius`` must equal ``formulas.LEAN_DEFS`` (built from the same formulas the numeric
  code is checked against). A statement the parser cannot read is a failure, never a pass;
* Lean: ``sorry`` / ``admit`` / ``axiom`` / ``native_decide`` anywhere under ``lean/`` is an
  error; with ``lake`` on PATH, ``lake build`` must pass; without it the step is reported as
  ``SKIP`` (the proofs were not checked here), and the final line counts it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import sympy as sp

from . import falsify
from . import formulas as F
from . import lean_parse as LP
from .check_excess import check_excess_form, check_excess_grid
from .check_tilt import check_tilt_box, check_tilt_endpoints, check_tilt_grid

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: the ``ok`` value of a check that was not run here (printed ``SKIP``, never ``ok``)
SKIP = None


def status(ok) -> str:
    """``ok`` / ``FAIL`` / ``SKIP`` for a check's ``ok`` value (``True`` / ``False`` / ``SKIP``)."""
    return "SKIP" if ok is SKIP else "ok  " if ok else "FAIL"


def _close_above(got, want, rel):
    """got ≥ want (never below the formula) and got ≤ want·(1 + rel) + tiny."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    return bool(np.all(got >= want * (1 - 1e-15) - 1e-300) and np.all(got <= want * (1 + rel) + 1e-300))


def check_constants():
    from contract import schemes as T
    from witcert import bounds as B
    from witcert import schemes as S

    out = []
    out.append(("int8_dither divisor = 126.5", float(S.INT8_DITHER_DIVISOR) == float(F.INT8_DITHER_DIVISOR), f"{S.INT8_DITHER_DIVISOR}"))
    out.append(("scheme table: int8_dither divisor = 126.5",
                float(T.SCHEMES["int8_dither"].divisor) == float(F.INT8_DITHER_DIVISOR), f"{T.SCHEMES['int8_dither'].divisor}"))
    ids = [r.kernel_id for r in T.SCHEMES.values() if r.kernel_id is not None]
    out.append(("scheme table: kernel ids distinct, 'none' is 0, the built-ins are the table",
                len(set(ids)) == len(ids) and T.SCHEMES["none"].kernel_id == 0
                and set(S.available_schemes()) >= set(T.SCHEMES), f"{T.KERNEL_SCHEME_IDS}"))
    out.append(("tilt tolerance default = 2^-12", B.TILT_DEFAULT_TOL == 2.0**-12, f"{B.TILT_DEFAULT_TOL}"))
    out.append(("dither grid = 2^23 points", B.DITHER_RESOLUTION_BITS == 23, f"{B.DITHER_RESOLUTION_BITS}"))
    out.append(_check_store_table())
    try:
        from kernels import fp_bounds as FB
        from kernels import paged as P
        from kernels import write as W

        out.append(("kernel dither divisor restates 126.5", float(W.KERNEL_DITHER_DIVISOR) == float(F.INT8_DITHER_DIVISOR),
                    f"{W.KERNEL_DITHER_DIVISOR}"))
        out.append(("kernel int8 divisor = 127", float(W.KERNEL_INT8_DIVISOR) == float(S.INT8_DIVISOR), f"{W.KERNEL_INT8_DIVISOR}"))
        out.append(("kernel witness round-up ≥ 1", FB.KERNEL_REL_SLACK > 0, f"{FB.KERNEL_REL_SLACK}"))
        from kernels import ids as I

        kid = {n: int(getattr(I, n.upper() + "_ID").value) for n in P.SCHEME_IDS}
        out.append(("kernel constexpr scheme ids = the scheme table", kid == T.KERNEL_SCHEME_IDS == P.SCHEME_IDS, f"{kid}"))
        # the asymmetric schemes' divisor is their largest code (codes 0 … 2^bits − 1): table, reference, kernels
        asym = {"int4_group": (S.INT4_DIVISOR, I.INT4_DIVISOR.value), "kivi2": (S.KIVI2_DIVISOR, I.KIVI2_DIVISOR.value)}
        got = {n: (float(T.SCHEMES[n].divisor), float(a), float(b)) for n, (a, b) in asym.items()}
        out.append(("asymmetric divisors = 2^bits − 1 (int4_group 15, kivi2 3) in the table, reference, kernels",
                    all(v == (2.0 ** T.SCHEMES[n].code_bits - 1,) * 3 for n, v in got.items()), f"{got}"))
    except ImportError as exc:  # kernels need triton
        out.append(("kernel constants", False, f"cannot import kernels: {exc}"))
    return out


# points of the fused merge kernel check (the kernel's time is linear in them; the formulas keep `points`)
KERNEL_POINTS = 24


def check_formulas(seed: int = 0, points: int = 200):
    from witcert import bounds as B

    rng = np.random.default_rng(seed)
    out = []
    # §3(a) tanh
    e = rng.exponential(1.0, (points, 5))
    f = sp.lambdify(F.eps_max, F.TANH_BOUND, "numpy")
    out.append(("tv_bound_tanh = tanh(ε_max/2)", _close_above(B.tv_bound_tanh(e), np.minimum(f(e.max(-1)), 1), 1e-9), ""))
    # §3(b) e-form
    p = rng.dirichlet(np.ones(5), points)
    e = rng.exponential(0.2, (points, 5))
    fe = sp.lambdify(F.A, F.EFORM_BOUND, "numpy")
    want = np.minimum(fe((p * np.exp(e)).sum(-1)), 1.0)
    out.append(("tv_bound_eform = ½(A²−1)", _close_above(B.tv_bound_eform(p, e), want, 1e-9), ""))
    # §5 variance proxy and radius
    q = rng.normal(size=(points, 8))
    sc = rng.uniform(0.01, 1, (points, 3))
    sig = 0.35
    Vw = sig**2 * (q**2).sum(-1)[:, None] * sc**2 * float(F.VARIANCE_PROXY_PER_CHANNEL.subs(F.s, 1))
    out.append(("dither_variance_proxy = σ² Σ q² s²/12", _close_above(B.dither_variance_proxy(q, sc, sig), Vw, 1e-9), ""))
    fr = sp.lambdify((F.V, F.n, F.delta), F.DITHER_RADIUS, "numpy")
    out.append(("dither_radius = sqrt(2V ln(2n/δ))", _close_above(B.dither_radius(Vw, 1000, 1e-6), fr(Vw, 1000, 1e-6), 1e-9), ""))
    # §5 the fp32 bias term b_j = |σ| Σ_i |q_i| β_{j,i}, β = s · 2⁻¹⁴ (dither_logit_tail_bias)
    fbias = sp.lambdify(F.s, F.DITHER_BIAS_PER_CHANNEL, "numpy")
    bw = abs(sig) * np.sum(np.abs(q)[:, None, :] * fbias(sc)[:, :, None], axis=-1)
    out.append(("dither_bias_bound = |σ| Σ |q| s 2⁻¹⁴", _close_above(B.dither_bias_bound(q, sc, sig), bw, 1e-9), ""))
    # §5 budgets
    fb = sp.lambdify((F.delta_req, F.L, F.H, F.T_max), F.BUDGET_FIXED)
    fa = sp.lambdify((F.delta_req, F.L, F.H, F.step), F.BUDGET_ANYTIME)
    ok = all(abs(B.step_budget(1e-3, 30, 9, horizon=T) - fb(1e-3, 30, 9, T)) <= 1e-18 for T in (1, 7, 4096))
    ok &= all(abs(B.step_budget(1e-3, 30, 9, step=t) - fa(1e-3, 30, 9, t)) <= 1e-18 for t in (1, 2, 1000))
    out.append(("step_budget = both schedules", ok, ""))
    out.append(_check_sketch_radius(B, rng, points))
    out.append(_check_stored_output(B, rng, points))
    # kernels: Tier B coefficient c with t_j = c·s_j
    try:
        import torch

        from kernels.decode import tier_b_coefficients

        qt = torch.tensor(q[:, None, :])
        n = torch.full((points,), 1000)
        c = tier_b_coefficients(qt, n, sig, 1e-6)[:, 0].numpy()
        base = fr(sig**2 * (q**2).sum(-1) / 12, 1000, 1e-6)  # the radius for s = 1
        bias = sig * np.abs(q).sum(-1) * B.DITHER_BIAS_FACTOR
        out.append(("kernel Tier B coefficient = formula + bias", _close_above(c, base + bias, 2.0**-11), ""))
        # the fused merge runs one interpreter program per point: a few dozen points find a drifted constant
        k = min(points, KERNEL_POINTS)
        out.append(_check_kernel_tier_b(q[:k], sig, (base + bias)[:k]))
        out.append(_check_kernel_store(rng, k))
    except ImportError as exc:
        out.append(("kernel Tier B coefficient", False, f"cannot import kernels: {exc}"))
    out += check_fp_terms(rng, points)
    out += check_tilt_endpoints(rng)
    out += check_tilt_box(rng)
    out += check_tilt_grid(rng)
    out += check_excess_form(rng)
    out += check_excess_grid(rng)
    return out


def _check_sketch_radius(B, rng, points: int):
    """§2 as amended by issue 33 (lean/WitCert/Sketch.lean): ``witcert.bounds.sketch_radius`` is never
    below SKETCH_RADIUS = c_h (W_j + u_j) with c_h = SKETCH_SCALE, u_j = max over the group of
    SKETCH_U_RATIO (``shared=True``), nor below SKETCH_PER_HEAD (``shared=False``), and it is within
    2⁻³⁰ of them (the fp64 dot's allowance and the rounding up, not a looser radius). The decode kernel's
    write of W_j and its fp32 dot allowance are checked against the reference by
    tests/kernels/test_sketch_window.py (``test_write_kernel_sketch_codes_and_witness``, the allowance's drop test);
    its per-head levels (``PagedKV.head_levels``: SKETCH_PER_HEAD binned per (token, head)) by
    tests/kernels/test_head_levels.py (sound against the per-head boxes' supremum, within tolerance of the
    reference at its levels; a halved W_j fails it)."""
    name = "sketch_radius = c_h (W + max_h |σ⟨q_h, r̃⟩|/c_h), c_h = |σ| ‖a⊙q_h‖ (shared and per head)"
    cases = max(4, points // 20)
    gq, d, n, sig = 4, 16, 6, 0.125
    qs = rng.normal(size=(cases, gq, d))
    rts = rng.normal(size=(cases, n, d)) * 0.1
    ws = rng.exponential(0.05, (cases, n))
    a = 2.0 ** rng.integers(-2, 3, d).astype(np.float64)
    fc = sp.lambdify((F.sigma, F.qa_norm), F.SKETCH_SCALE, "numpy")
    fu = sp.lambdify((F.sigma, F.qrt_dot, F.c_h), F.SKETCH_U_RATIO, "numpy")
    fr = sp.lambdify((F.c_h, F.W_j, F.u_j), F.SKETCH_RADIUS, "numpy")
    fp = sp.lambdify((F.sigma, F.qrt_dot, F.qa_norm, F.W_j), F.SKETCH_PER_HEAD, "numpy")
    qa = np.linalg.norm(qs * a, axis=-1)  # [cases, GQ]
    c = fc(sig, qa)
    dots = np.einsum("chd,cnd->chn", qs, rts)
    u = fu(sig, dots, c[..., None]).max(axis=1, keepdims=True)  # [cases, 1, n]
    want_shared = fr(c[..., None], ws[:, None, :], u)
    want_head = fp(sig, dots, qa[..., None], ws[:, None, :])
    got_shared = B.sketch_radius(qs, rts, ws, sig, a, shared=True)
    got_head = B.sketch_radius(qs, rts, ws, sig, a, shared=False)
    ok = _close_above(got_shared, want_shared, 2.0**-30) and _close_above(got_head, want_head, 2.0**-30)
    return (name, ok, "")


def _check_store_table():
    """``contract.constants.STORE_ROUNDING`` / ``STORE_MAX`` against the dtypes themselves: rel is one ulp (torch's eps:
    round-to-nearest and truncation both stay within it), abs at least the smallest subnormal and at least 2^-126 for
    the dtypes sharing fp32's exponent range (a flush of fp32 subnormals), max the largest finite value."""
    import torch

    from contract.constants import STORE_MAX, STORE_ROUNDING

    ok = True
    for name, (rel, ab) in STORE_ROUNDING.items():
        f = torch.finfo(getattr(torch, name))
        sub = f.smallest_normal * f.eps
        ok &= rel == f.eps and ab >= sub and STORE_MAX[name] == f.max
        ok &= ab >= 2.0**-126 or f.smallest_normal > 2.0**-126
    return ("contract STORE_ROUNDING: rel = one ulp, abs ≥ the smallest subnormal, max = the largest finite", bool(ok),
            f"{STORE_ROUNDING}")


def _stored_formula(err, onorm, stored, computed, d):
    """``formulas.STORED_OUTPUT_BOUND`` with the contract's (rel, abs) of storing ``computed`` into ``stored``."""
    from contract.constants import store_rounding

    rel, ab, _ = store_rounding(stored, computed)
    c = float(F.STORED_ABS_TERM.subs({F.st_abs: ab, F.st_d: d}))
    f = sp.lambdify((F.st_err, F.st_rel, F.st_onorm, F.st_c), F.STORED_OUTPUT_BOUND, "numpy")
    return f(err, rel, onorm, c)


def _check_stored_output(B, rng, points: int):
    """Lean ``output_error_stored_le``: ``witcert.bounds.stored_output_error_bound`` equals err + rel·‖ô‖ + abs·√D
    (``formulas.STORED_OUTPUT_BOUND``, the contract's STORE_ROUNDING) within its round-up, never below, for each narrow
    dtype; a store into a wider dtype leaves err unchanged."""
    name = "stored_output_error_bound = err + rel·‖ô‖ + abs·√D (contract STORE_ROUNDING)"
    d = 64
    o = rng.normal(size=(points, d)) * rng.exponential(1.0, (points, 1))
    err = rng.exponential(0.01, points)
    ok = True
    for stored, computed in (("bfloat16", "float32"), ("float16", "float32"), ("float32", "float64")):
        want = _stored_formula(err, np.linalg.norm(o, axis=-1), stored, computed, d)
        ok &= _close_above(B.stored_output_error_bound(err, o, stored, computed), want, 2.0**-30)
    ok &= bool(np.array_equal(B.stored_output_error_bound(err, o, "float32", "float32"), err))
    return (name, ok, "")


def _check_kernel_store(rng, pts: int):
    """The fused merge's E⁺ with the output served in bfloat16 / float16 (``MergeConstants.store``, the kernel's
    STORE_REL / STORE_ABS) is its E⁺ served in float32 plus rel·‖o‖ + abs·√D of the contract, within the merge's
    round-up (Lean ``output_error_stored_le``): a dropped or drifted store term fails here."""
    import dataclasses
    import os

    import torch

    name = "kernel record E⁺ of a bf16 / fp16 output = E⁺ + rel·‖o‖ + abs·√D (fused merge)"
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return (name, SKIP, "no CUDA device and TRITON_INTERPRET unset: the kernel was not run")
    from kernels import epilogue as E
    from kernels.fp_bounds import dot_gamma, mass_eta_terms, store_terms
    from kernels.key_levels import KEY_LEVELS

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    D, KA, NB = 16, KEY_LEVELS + 2, 64
    m = torch.zeros(pts, 1, 1)
    acc = torch.tensor(rng.normal(size=(pts, 1, 1, D)) * rng.exponential(1.0, (pts, 1, 1, 1)), dtype=torch.float32)
    hist = torch.zeros(pts, 1, 1, NB)
    hist[..., 1] = 1.0
    stat = torch.zeros(pts, 1, 1, 6)
    stat[..., 0] = 1e-3  # max W: a live row with a small TV⁺
    stat[..., 3] = acc.norm(dim=-1)  # ν ≥ ‖v̂‖
    stat[..., 5] = 1.0
    q = torch.tensor(rng.normal(size=(pts, 1, D)), dtype=torch.float32)
    c = E.MergeConstants(D=D, T=16, PAGES=8, NB=NB, KA=KA, sm=0.25, tier_b=False, delta_step=None, gamma=dot_gamma(D),
                         dither_u=0.0, eta=mass_eta_terms(128), out_rel0=0.0)
    args = [t.to(dev) for t in (m, m + 1.0, acc, hist, stat, q)]
    sl = torch.full((pts,), 1000, dtype=torch.int32, device=dev)
    o, _, rec = E.merge(*args, sl, c)
    base = rec.out_err_upper[:, 0].double().cpu().numpy()
    onorm = o[:, 0].double().norm(dim=-1).cpu().numpy()
    ok = True
    for stored in ("bfloat16", "float16"):
        _, _, r2 = E.merge(*args, sl, dataclasses.replace(c, store=store_terms(stored, "float32", D)))
        got = r2.out_err_upper[:, 0].double().cpu().numpy()
        ok &= _close_above(got, _stored_formula(base, onorm, stored, "float32", D), 2.0**-30)
    return (name, ok, "")


def _check_kernel_tier_b(q, sig, want):
    """The Tier B coefficient the decode's fused merge kernel computes (``kernels.epilogue.merge``:
    its record's ``tb_max`` = c · max s_j, read here with max s_j = 1, n = 1000, δ = 1e-6)."""
    import os

    import torch

    name = "kernel record Tier B coefficient (fused merge) = formula + bias"
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return (name, SKIP, "no CUDA device and TRITON_INTERPRET unset: the kernel was not run")
    from kernels import epilogue as E
    from kernels.fp_bounds import dot_gamma, mass_eta_terms
    from kernels.key_levels import KEY_LEVELS

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pts, d = q.shape
    D = 1 << max(3, (d - 1).bit_length())  # a power of two; the padding channels are 0
    qt = torch.zeros(pts, 1, D, dtype=torch.float32)
    qt[:, 0, :d] = torch.tensor(q, dtype=torch.float32)
    KA = KEY_LEVELS + 2
    NB = 64
    m = torch.zeros(pts, 1, 1)
    hist = torch.zeros(pts, 1, 1, NB)
    hist[..., 0] = 1.0
    stat = torch.zeros(pts, 1, 1, 6)
    stat[..., 1] = 1.0  # max s_j
    c = E.MergeConstants(D=D, T=16, PAGES=8, NB=NB, KA=KA, sm=sig, tier_b=True, delta_step=1e-6, gamma=dot_gamma(D),
                         dither_u=0.0, eta=mass_eta_terms(128), out_rel0=0.0)
    args = [t.to(dev) for t in (m, m + 1.0, torch.zeros(pts, 1, 1, D), hist, stat, qt)]
    _, _, rec = E.merge(*args, torch.full((pts,), 1000, dtype=torch.int32, device=dev), c)
    got = rec.tb_max[:, 0].double().cpu().numpy()
    # the kernel takes q in fp32: compare at the fp32 query (relative 2^-11 covers it and the slack)
    return (name, _close_above(got, want, 2.0**-11), "")


def check_fp_terms(rng, points: int = 200):
    """SPEC §7: the epilogue's Ξ and ρ terms (``kernels.epilogue_torch.tv_from_hist_torch``) against
    ``formulas.XI_TERM`` / ``RHO_KERNEL`` / ``TANH_BOUND`` at radii ε + Ξ (lean/WitCert/FloatTV.lean)."""
    out = []
    try:
        import torch

        from kernels.epilogue_torch import tv_from_hist_torch
    except ImportError as exc:
        return [("kernel Ξ and ρ terms", False, f"cannot import kernels: {exc}")]
    nb = 9
    w = torch.tensor(rng.dirichlet(np.ones(nb), points))
    lv = torch.tensor(np.sort(rng.exponential(0.3, (points, nb - 1)), axis=-1))
    rmax = lv[:, -1] + torch.tensor(rng.exponential(0.1, points))
    xi = torch.tensor(rng.exponential(1e-3, points))
    lam = torch.tensor(rng.exponential(1e-4, points))
    tv, tanh, eform, tilt, rho = tv_from_hist_torch(w, lv, rmax, xi, lam)
    lvr = torch.cat([torch.minimum(lv, rmax[:, None]).clamp_min(0.0), rmax[:, None]], dim=-1) + xi[:, None]
    m = ((w / w.sum(-1, keepdim=True)) * torch.exp(-lvr)).sum(-1).numpy()
    frho = sp.lambdify((F.Lam, F.eps_max, F.Xi, F.m), F.RHO_KERNEL, "numpy")
    out.append(("kernel ρ = Λ(1 + e^{ε_max+Ξ}/m)", _close_above(rho.numpy(), frho(lam.numpy(), rmax.numpy(), xi.numpy(), m), 1e-9), ""))
    ftanh = sp.lambdify(F.eps_max, F.TANH_BOUND, "numpy")
    out.append(("kernel tanh column = tanh((ε_max+Ξ)/2)", _close_above(tanh.numpy(), ftanh(rmax.numpy() + xi.numpy()), 1e-12), ""))
    fxi = sp.lambdify(F.Xi, F.XI_TERM, "numpy")
    base = torch.minimum(torch.minimum(tanh, eform), tilt).numpy()
    want = np.minimum(base + fxi(xi.numpy()) + rho.numpy(), 1.0)
    out.append(("kernel TV⁺ ≥ min(§3 at ε+Ξ) + tanh(Ξ/2) + ρ", bool(np.all(tv.numpy() >= want * (1 - 1e-15))), ""))
    return out


def check_falsification(trials: int = 2000, seed: int = 0):
    return [(f"falsify {name}", bad == 0, f"{bad} counterexamples in {trials}") for name, bad in falsify.run(trials, seed).items()]


def check_lean(lean_dir: pathlib.Path | None = None):
    lean_dir = lean_dir or ROOT / "lean"
    out = []
    if not lean_dir.exists():
        out.append(("lean sources", SKIP, "no lean/ directory yet: the §9 theorems are not written"))
        return out
    pat = re.compile(r"\b(sorry|admit|axiom|native_decide)\b")
    hits = []
    for f in sorted(lean_dir.rglob("*.lean")):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            if pat.search(code):
                hits.append(f"{f.relative_to(lean_dir.parent)}:{i}")
    out.append(("no sorry/admit/axiom/native_decide under lean/", not hits, ", ".join(hits[:10])))
    names = " ".join(f.read_text() for f in lean_dir.rglob("*.lean"))
    missing = [t for t in F.THEOREMS if not re.search(rf"theorem\s+{t}\b", names)]
    out.append(("every §9 theorem name is stated", not missing, ", ".join(missing)))
    out += check_lean_statements(lean_dir)
    if shutil.which("lake"):
        r = subprocess.run(["lake", "build"], cwd=ROOT, capture_output=True, text=True)
        out.append(("lake build", r.returncode == 0, (r.stdout + r.stderr)[-2000:]))
    else:
        out.append(("lake build", SKIP, "proofs NOT checked here: no Lean toolchain (lake) on this machine"))
    return out


def check_lean_statements(lean_dir: pathlib.Path):
    """Parse each statement and definition and compare it with ``formulas``."""
    out = []
    src = {}

    def source(name):
        if name not in src:
            f = lean_dir / "WitCert" / f"{name}.lean"
            src[name] = f.read_text() if f.exists() else ""
        return src[name]

    for thm, (fname, concl, hyps) in F.LEAN_THEOREMS.items():
        try:
            st = LP.theorem(source(fname), thm)
            ok = LP.same_rel(LP.parse_expr(st["conclusion"]), concl)
            detail = "" if ok else f"conclusion {st['conclusion']!r} differs from the formula"
            for h, want in hyps.items():
                if h not in st["binders"]:
                    ok, detail = False, f"hypothesis {h} missing"
                    break
                if not LP.same_rel(LP.parse_expr(st["binders"][h]), want):
                    ok, detail = False, f"hypothesis {h}: {st['binders'][h]!r} differs from the formula"
                    break
        except LP.LeanParseError as exc:
            ok, detail = False, f"cannot parse: {exc}"
        out.append((f"lean statement {thm} = formula", ok, detail))
    for name, (fname, params, body) in F.LEAN_DEFS.items():
        try:
            ps, text = LP.definition(source(fname), name)
            got = LP.parse_expr(text)
            ok = ps == params and len(got) == 1 and LP.same_expr(got[0], body)
            detail = "" if ok else f"def {name} ({' '.join(ps)}) := {text!r} differs from the formula"
        except LP.LeanParseError as exc:
            ok, detail = False, f"cannot parse: {exc}"
        out.append((f"lean def {name} = formula", ok, detail))
    return out


def check_fp_model(seed: int = 1, points: int = 100):
    """SPEC §7: the rounding terms. ``witcert.bounds.dot_rounding_radius`` is σ γ_{d+2} Σ|q||k̂|
    with γ_m = m·u/(1 − m·u); the kernels' ``dot_gamma(D)`` is at least that γ for their unit
    roundoff (KERNEL_UNIT, which covers truncating fp32 sums), and their witness floor is
    positive and below the smallest fp16 witness."""
    from witcert import bounds as B

    rng = np.random.default_rng(seed)
    out = []
    q = rng.normal(size=(points, 16)) * 10.0 ** rng.uniform(-3, 3, (points, 1))
    k = rng.normal(size=(points, 5, 16)) * 10.0 ** rng.uniform(-3, 3, (points, 1, 1))
    u = 2.0**-24
    m = 16 + 2
    want = 0.3 * (m * u / (1 - m * u)) * np.einsum("pd,pnd->pn", np.abs(q), np.abs(k))
    out.append(("dot_rounding_radius = σ γ_{d+2} Σ|q||k̂|", _close_above(B.dot_rounding_radius(q, k, 0.3, u), want, 1e-9), ""))
    try:
        from kernels import fp_bounds as P
        from kernels.paged import SUPPORTED_HEAD_DIMS

        ok = all(P.dot_gamma(D) >= (D + 2) * P.KERNEL_UNIT / (1 - (D + 2) * P.KERNEL_UNIT) for D in SUPPORTED_HEAD_DIMS)
        ok &= all(P.dot_gamma(D, split3=True) >= P.dot_gamma(D) for D in SUPPORTED_HEAD_DIMS)
        out.append(("kernel dot_gamma(D) ≥ γ_{D+2}(KERNEL_UNIT)", ok and P.KERNEL_UNIT >= 2.0**-24, f"{P.KERNEL_UNIT}"))
        out.append(("kernel witness floor in (0, 2^-24)", 0 < P.KERNEL_WITNESS_FLOOR < 2.0**-24, f"{P.KERNEL_WITNESS_FLOOR}"))
        out.append(("kernel flush threshold ≥ 2^-126", P.FP32_FLUSH >= 2.0**-126, f"{P.FP32_FLUSH}"))
    except ImportError as exc:
        out.append(("kernel fp constants", False, f"cannot import kernels: {exc}"))
    return out


def run_checks(trials: int = 2000):
    return check_constants() + check_formulas() + check_fp_model() + check_falsification(trials) + check_lean()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m proofs_bridge")
    ap.add_argument("cmd", choices=["check"])
    ap.add_argument("--trials", type=int, default=int(os.environ.get("BRIDGE_TRIALS", "2000")))
    args = ap.parse_args(argv)
    counts = {"ok  ": 0, "FAIL": 0, "SKIP": 0}
    for name, ok, detail in run_checks(args.trials):
        tag = status(ok)
        counts[tag] += 1
        print(f"{tag} {name}" + (f"  ({detail})" if detail else ""))
    print(f"{counts['FAIL']} failed, {counts['SKIP']} skipped (not checked here), {counts['ok  ']} ok")
    return 1 if counts["FAIL"] else 0
