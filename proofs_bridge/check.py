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
* the §3(c) tilt with endpoint values (``check_tilt_endpoints``, Lean ``tilt_tv_le_dual_grid_endpoints``):
  the epilogue's torch twin ``_interval_upper`` interval by interval, the kernel's ``_tv_row`` tilt on its
  grid and the fp64 reference's ``tv_bound_tilt`` on a fixed grid, against t − D(t, λ) at both ends of every
  interval; the residual-sketch radius (``_check_sketch_radius``, Lean ``sketch_shared_radius_le`` /
  ``sketch_logit_error_le``) against ``formulas.SKETCH_RADIUS`` / ``SKETCH_PER_HEAD``;
* the §3(c) tilt of the centred box (``check_tilt_box``, Lean ``tilt_tv_le_dual_grid_box_endpoints``): the fp64
  reference's ``dual_grid._tilt_row_box`` on a fixed grid against t − dualDBox(t, λ) at both ends of every interval
  (``formulas.DUAL_ITEM_BOX``), and, with ``tv_bound_parts_logits(center=…)``, never below the brute-force supremum;
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
        out.append(_check_kernel_tier_b(q, sig, base + bias))
    except ImportError as exc:
        out.append(("kernel Tier B coefficient", False, f"cannot import kernels: {exc}"))
    out += check_fp_terms(rng, points)
    out += check_tilt_endpoints(rng)
    out += check_tilt_box(rng)
    return out


def _check_sketch_radius(B, rng, points: int):
    """§2 as amended by issue 33 (lean/WitCert/Sketch.lean): ``witcert.bounds.sketch_radius`` is never
    below SKETCH_RADIUS = c_h (W_j + u_j) with c_h = SKETCH_SCALE, u_j = max over the group of
    SKETCH_U_RATIO (``shared=True``), nor below SKETCH_PER_HEAD (``shared=False``), and it is within
    2⁻³⁰ of them (the fp64 dot's allowance and the rounding up, not a looser radius). The decode kernel's
    write of W_j and its fp32 dot allowance are checked against the reference by
    tests/kernels/test_sketch_window.py (``test_write_kernel_sketch_codes_and_witness``, the allowance's drop test)."""
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


# ----------------------------- SPEC §3(c) with endpoint values (lean/WitCert/TiltEndpoints.lean)
_DUAL_ITEM = sp.lambdify((F.lam, F.t, F.x), F.DUAL_ITEM, "numpy")
_BETA = sp.lambdify((F.t, F.x), F.BETA, "numpy")
_ENDS = sp.lambdify((F.g0_, F.g1_), F.ENDPOINT_UPPER, "numpy")
#: the formula evaluated in fp64: the code may be below it by this much at most (its own rounding bound,
#: (4K + 16)·2^-52·(… + 1), is larger than the formula's evaluation error, so a sound code is above it)
_FORMULA_FP64 = 2.0**-46


def _g_formula(t, lam, w, x):
    """g(t) = t − D(t, λ) from ``formulas.DUAL_ITEM`` (D = Σ_k w_k item(x_k)); t, lam broadcast, w, x [K]."""
    t, lam = np.broadcast_arrays(np.asarray(t, float), np.asarray(lam, float))
    return t - np.sum(w * _DUAL_ITEM(lam[..., None], t[..., None], x), axis=-1)


def _interval_upper_formula(t0, h, w, x):
    """Per interval [t0, t0 + h] (t0 [T]) of one row (w, x [K]): the least over λ ∈ {1/β_c(t0) : w_c > 0} of
    ``ENDPOINT_UPPER`` (the larger end value of g), capped at t0 + h (λ = 0: g(t) = t)."""
    t0 = np.asarray(t0, float)
    t1 = t0 + h
    live = w > 0
    lam = 1.0 / _BETA(t0[:, None], x[None, live])  # [T, C] candidates
    u = _ENDS(_g_formula(t0[:, None], lam, w, x), _g_formula(t1[:, None], lam, w, x)).min(-1)
    return np.minimum(u, t1)


def _endpoint_rows(rng, rows, K):
    """Histogram rows: masses w (a distribution, some bins empty) over distinct sorted levels x > 0."""
    out = []
    for r in range(rows):
        w = rng.dirichlet(np.ones(K)) * (rng.random(K) < 0.8)
        w[r % K] = max(w[r % K], 1e-3)
        w = w / w.sum()
        x = np.sort(rng.exponential([0.02, 0.3, 1.0, 3.0][r % 4], K)) + np.arange(K) * 1e-9
        out.append((w, x))
    return out


def _above(got, want, atol):
    """got ≥ want (never below the formula, up to its fp64 evaluation) and got ≤ want + atol."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    return bool(np.all(got >= want - _FORMULA_FP64) and np.all(got <= want + atol))


def check_tilt_endpoints(rng, rows: int = 12, K: int = 6):
    """``tilt_tv_le_dual_grid_endpoints``: every interval's upper value is the larger end value of
    t − D(t, λ) (``formulas.DUAL_ITEM`` / ``ENDPOINT_UPPER``) for a λ ≥ 0, on a cover of [0, 1].

    * the epilogue's torch twin ``kernels.epilogue_torch._interval_upper`` (= the kernel's ``_dense_u``) per interval;
    * the fp64 reference ``witcert.bounds.tv_bound_tilt`` on its first grid (``max_points=33``: 32 intervals,
      λ_i = ``dual_grid._lambda_at`` at the left end, the right end's D from ``dual_grid._dual_at``), every λ_i ≥ 0;
    * the kernel (``_tv_row`` through ``tv_from_hist(force_kernel=True)``): its tilt is the maximum over its grid
      (COARSE intervals; the REFINE_TOP largest split into REFINE, each valued at the smaller of its coarse and
      refined values; the kernel stops refining early when that cannot change the maximum) of the formula's
      interval values."""
    from witcert import bounds as B
    from witcert.bounds import dual_grid

    out = []
    data = _endpoint_rows(rng, rows, K)
    # the fp64 reference on the fixed grid linspace(0, 1, 33)
    ts = np.linspace(0.0, 1.0, 33)
    ok_ref, ok_lam = True, True
    for w, x in data:
        got = float(B.tv_bound_tilt(w[None], x[None], max_points=33)[0])
        live = w > 0
        wl, xl = w[live], x[live]
        lam = dual_grid._lambda_at(ts, wl, np.exp(xl), np.exp(-xl), float(np.dot(wl, np.exp(-xl))))
        ok_lam &= bool(np.all(lam >= 0))  # hlam
        up = np.minimum(_ENDS(_g_formula(ts[:-1], lam[:-1], wl, xl), _g_formula(ts[1:], lam[:-1], wl, xl)), ts[1:])
        want = min(1.0, max(0.0, float(up.max())))
        ok_ref &= _above(got, want, B.FP64_ABS_SLACK + 1e-9)
    out.append(("reference tilt (fixed grid) = max_i max(g(t_i), g(t_i+1)), g = t − D(t, λ_i)", ok_ref, ""))
    out.append(("reference tilt: every λ_i ≥ 0", ok_lam, ""))
    try:
        import torch

        from kernels import epilogue_jit as J
        from kernels import epilogue_torch as Et
    except ImportError as exc:
        return out + [("endpoint tilt: kernels", False, f"cannot import kernels: {exc}")]
    # the torch twin, interval by interval (random left ends, two widths)
    ok = True
    for w, x in data:
        for h in (1.0 / J.COARSE, 1.0 / (J.COARSE * J.REFINE)):
            t0 = np.sort(rng.uniform(0.0, 1.0 - h, 24))
            wt, xt = torch.tensor(w[None]), torch.tensor(x[None])
            got = Et._interval_upper(torch.tensor(t0[None]), h, wt, torch.exp(xt), torch.exp(-xt),
                                    (wt * torch.exp(-xt)).sum(-1))[0].numpy()
            ok &= _above(got, _interval_upper_formula(t0, h, w, x), 1e-9)
    out.append(("torch _interval_upper = min_λ max(g(t0), g(t1)) (formula)", ok, ""))
    out.append(_check_kernel_endpoints(data))
    return out


def _check_kernel_endpoints(data):
    """The kernel's tilt (``_tv_row``, non-lazy) against the formula on the kernel's grid."""
    import torch

    from kernels import epilogue as E
    from kernels import epilogue_jit as J

    name = "kernel tilt (_dense_u) = max over its grid of min_λ max(g(t0), g(t1)) (formula)"
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return (name, SKIP, "no CUDA device and TRITON_INTERPRET unset: the kernel was not run")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    mass = torch.tensor(np.stack([w for w, _ in data]))
    lv = torch.tensor(np.stack([x for _, x in data]))
    rmax = lv[:, -1].clone()  # the last bin is the overflow bin at the row's maximum
    got = E.tv_from_hist(mass.to(dev), lv.to(dev), rmax.to(dev), force_kernel=True)[3].cpu().numpy()
    N1, RT, NR = J.COARSE, min(J.REFINE_TOP, J.COARSE), J.REFINE
    want = []
    for w, x in data:
        t0 = np.arange(N1) / N1
        U = _interval_upper_formula(t0, 1.0 / N1, w, x)
        top = np.argsort(-U, kind="stable")[:RT]  # the RT largest (ties: the lowest index)
        sub = (t0[top][:, None] + np.arange(NR)[None, :] / (N1 * NR)).reshape(-1)
        refined = _interval_upper_formula(sub, 1.0 / (N1 * NR), w, x).reshape(RT, NR).max(axis=1)
        refined = np.minimum(refined, U[top]).max()  # each at min(coarse, refined): the kernel's early stop is exact
        rest = np.delete(U, top).max() if N1 > RT else -1.0
        want.append(min(1.0, max(0.0, refined, rest)))
    return (name, _above(got, np.array(want), 1e-9), "")


# ------------------------------------------- SPEC §3(c), the centred box (lean/WitCert/TiltBox.lean)
_DUAL_ITEM_BOX = sp.lambdify((F.lam, F.t, F.c_box, F.x), F.DUAL_ITEM_BOX, "numpy")
_BOX_UP = sp.lambdify((F.c_box, F.x), F.BOX_UP, "numpy")
_BOX_DOWN = sp.lambdify((F.c_box, F.x), F.BOX_DOWN, "numpy")


def _g_box_formula(t, lam, w, c, x):
    """g(t) = t − D(t, λ) from ``formulas.DUAL_ITEM_BOX`` (D = dualDBox w c x = Σ_k w_k item(c_k, x_k)); t, lam
    broadcast, w, c, x [K]."""
    t, lam = np.broadcast_arrays(np.asarray(t, float), np.asarray(lam, float))
    return t - np.sum(w * _DUAL_ITEM_BOX(lam[..., None], t[..., None], c, x), axis=-1)


def _box_centres(rng, K):
    """Centres of both signs, magnitudes log-uniform in [0.01, 3]."""
    return rng.choice([-1.0, 1.0], K) * 10.0 ** rng.uniform(-2.0, np.log10(3.0), K)


def _box_rows(rng, rows, K):
    """Histogram rows of the centred box: masses w (a distribution, some bins empty), centres c, radii ε ≥ 0 (all 0
    on every fifth row: the tilt is known exactly; on every third row two bins share their box)."""
    out = []
    for r in range(rows):
        w = rng.dirichlet(np.ones(K)) * (rng.random(K) < 0.8)
        w[r % K] = max(w[r % K], 1e-3)
        w = w / w.sum()
        c = _box_centres(rng, K)
        e = rng.exponential([0.02, 0.3, 1.0, 3.0][r % 4], K)
        if r % 5 == 4:
            e[:] = 0.0
        if r % 3 == 2:
            c[1], e[1] = c[0], e[0]
        out.append((w, c, e))
    return out


def _corner_sup(p, c, e):
    """max_S A_S/(A_S + C_S) − p̂(S), A_S = Σ_S p̂ e^{−c+ε}, C_S = Σ_{Sᶜ} p̂ e^{−c−ε} (Lean ``tilt_mass_le_box``), and
    the TV of the corner tilt δ = c − ε on the maximising S, c + ε off it (which attains it)."""
    n = p.size
    best, arg = -1.0, 0
    for S in range(1 << n):
        ins = (S >> np.arange(n)) & 1 == 1
        A = float(np.sum(p[ins] * np.exp(_BOX_UP(c[ins], e[ins]))))
        Cc = float(np.sum(p[~ins] * np.exp(_BOX_DOWN(c[~ins], e[~ins]))))
        v = A / (A + Cc) - float(np.sum(p[ins]))
        if v > best:
            best, arg = v, S
    ins = (arg >> np.arange(n)) & 1 == 1
    d = np.where(ins, c - e, c + e)
    q = p * np.exp(-d)
    return best, 0.5 * float(np.sum(np.abs(q / q.sum() - p)))


def check_tilt_box(rng, rows: int = 12, K: int = 6):
    """``tilt_tv_le_dual_grid_box_endpoints`` (the centred box |δ_j − c_j| ≤ ε_j): the fp64 reference's box tilt
    ``witcert.bounds.dual_grid._tilt_row_box(w, up, down, …)`` (p ∝ p̂ e^{η}, η_j ∈ [down_j, up_j], i.e. up = −c + ε,
    down = −c − ε: ``formulas.BOX_UP`` / ``BOX_DOWN``):

    * on its first grid (``max_points=33``: 32 intervals) it is max_i min(max(g(t_i), g(t_{i+1})), t_{i+1}),
      g(t) = t − dualDBox(t, λ_i) from ``formulas.DUAL_ITEM_BOX`` at c = −(up + down)/2, ε = (up − down)/2, with λ_i
      tight at t_i (``dual_grid._lambda_at`` on a = e^{up}, b = e^{down}, m = Σ w b), every λ_i ≥ 0;
    * on random token rows (n ≤ 9) the brute force ``tv_sup_bruteforce(p̂, ε, center=c)`` is max_S A_S/(A_S+C_S) −
      p̂(S) (``tilt_mass_le_box``) and a corner tilt attains it; the box tilt and the three parts of
      ``tv_bound_parts_logits(log p̂, ε, center=c)``, without and with ``levels`` (``tilt_tv_le_hist_box_endpoints``),
      are at least it;
    * ``box_levels`` (the histogram's boxes) contains every token's box (``_check_box_levels``)."""
    try:
        from witcert import bounds as B
        from witcert.bounds import dual_grid
    except ImportError as exc:
        return [("box tilt: reference", False, f"cannot import witcert.bounds: {exc}")]
    names = ("reference box tilt (fixed grid) = max_i max(g(t_i), g(t_i+1)), g = t − dualDBox(t, λ_i)",
             "reference box tilt: every λ_i ≥ 0",
             "brute force (center) = max_S A_S/(A_S+C_S) − p̂(S), attained at a corner",
             "reference box tilt and tv_bound_parts_logits(center=c) ≥ brute-force supremum")
    if not hasattr(dual_grid, "_tilt_row_box"):
        return [(n, False, "witcert.bounds.dual_grid._tilt_row_box is missing") for n in names]
    out = []
    ts = np.linspace(0.0, 1.0, 33)
    ok_ref, ok_lam, worst = True, True, 0.0
    for w, c, e in _box_rows(rng, rows, K):
        up, down = _BOX_UP(c, e), _BOX_DOWN(c, e)
        got = float(dual_grid._tilt_row_box(w, up, down, B.TILT_DEFAULT_TOL, 33))
        live = w > 0
        wl, cl, el = w[live], -(up[live] + down[live]) / 2, (up[live] - down[live]) / 2
        a, b = np.exp(up[live]), np.exp(down[live])
        lam = dual_grid._lambda_at(ts, wl, a, b, float(np.dot(wl, b)))
        ok_lam &= bool(np.all(lam >= 0))  # hlam
        g0 = _g_box_formula(ts[:-1], lam[:-1], wl, cl, el)
        g1 = _g_box_formula(ts[1:], lam[:-1], wl, cl, el)
        want = min(1.0, max(0.0, float(np.minimum(np.maximum(g0, g1), ts[1:]).max())))
        ok_ref &= _above(got, want, B.FP64_ABS_SLACK + 1e-9)
        worst = max(worst, abs(got - want))
    out.append((names[0], ok_ref, f"largest |got − formula| {worst:.2e}"))
    out.append((names[1], ok_lam, ""))
    ok_bf, ok_sound, detail = True, True, ""
    levels = np.cumsum(rng.exponential(0.1, 16))  # the histogram's levels (box_levels) for the second evaluation
    for r in range(2 * rows):
        n = 2 + r % 8
        p = rng.dirichlet(np.ones(n) * [0.3, 1.0, 3.0][r % 3])
        p = np.maximum(p, 1e-6)
        p = p / p.sum()
        c = _box_centres(rng, n)
        e = rng.exponential([0.02, 0.3, 1.0][r % 3], n) * (r % 4 != 3)  # every fourth row: ε = 0
        brute = float(B.tv_sup_bruteforce(p[None], e[None], center=c[None])[0])
        sup, attained = _corner_sup(p, c, e)
        ok_bf &= abs(brute - sup) <= 1e-12 and abs(attained - sup) <= 1e-12
        tilt = float(dual_grid._tilt_row_box(p, _BOX_UP(c, e), _BOX_DOWN(c, e), B.TILT_DEFAULT_TOL, 1 << 15))
        parts = [float(np.asarray(x).reshape(-1)[0]) for lv in (None, levels) for x in B.tv_bound_parts_logits(
            np.log(p)[None], e[None], levels=lv, center=c[None])]
        if min([tilt] + parts) < sup - 1e-12:
            ok_sound, detail = False, f"row {r}: sup {sup:.6g}, box tilt {tilt:.6g}, parts {parts}"
    out.append((names[2], ok_bf, ""))
    out.append((names[3], ok_sound, detail))
    out.append(_check_box_levels(B, rng))
    return out


def _check_box_levels(B, rng):
    """``witcert.bounds.box_levels`` widens each box onto the levels: [c̄ − L, c̄ + L] ⊇ [c − ε, c + ε] (exactly, in
    the floats' real values), the hypothesis ``hbox`` of ``tilt_tv_le_hist_box_endpoints`` for the histogram over
    the (c̄, L) pairs; L ≥ ε's level (``round_levels``), radii above the top level included."""
    name = "box_levels: [c̄ − L, c̄ + L] ⊇ [c − ε, c + ε] (hbox of tilt_tv_le_hist_box_endpoints)"
    if not hasattr(B, "box_levels"):
        return (name, False, "witcert.bounds.box_levels is missing")
    from fractions import Fraction

    levels = np.cumsum(rng.exponential(0.05, 24))
    c = np.concatenate([_box_centres(rng, 64), [0.0, 1e-3, -2.5]])
    e = np.concatenate([rng.exponential(0.3, 64) * (rng.random(64) < 0.9), [0.0, 5.0, 0.7]])  # 5.0: over the top
    cb, L = (np.asarray(v, float) for v in B.box_levels(c[None], e[None], levels))
    cb, L = cb[0], L[0]
    ok = bool(np.all(L >= np.asarray(B.round_levels(e[None], levels), float)[0]))
    for cj, ej, cbj, Lj in zip(c, e, cb, L):
        cj, ej, cbj, Lj = (Fraction(float(v)) for v in (cj, ej, cbj, Lj))
        ok &= cbj - Lj <= cj - ej and cj + ej <= cbj + Lj
    return (name, ok, "")


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
