"""The bridge's checks of SPEC §3(c)'s tilt with endpoint values (``check_tilt_endpoints``, Lean
``tilt_tv_le_dual_grid_endpoints``) and of the centred box (``check_tilt_box``, Lean
``tilt_tv_le_dual_grid_box_endpoints``, ``tilt_tv_le_hist_box_endpoints``): the fp64 reference, the epilogue's torch
twin and the kernel against ``formulas.DUAL_ITEM`` / ``DUAL_ITEM_BOX`` / ``ENDPOINT_UPPER`` (called by
``proofs_bridge.check.check_formulas``)."""

from __future__ import annotations

import os

import numpy as np
import sympy as sp

from . import formulas as F

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

    from .check import SKIP  # (at call time: check imports this module)

    name = "kernel tilt (_dense_u) = max over its grid of min_λ max(g(t0), g(t1)) (formula)"
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return (name, SKIP, "no CUDA device and TRITON_INTERPRET unset: the kernel was not run")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    mass = torch.tensor(np.stack([w for w, _ in data]))
    lv = torch.tensor(np.stack([x for _, x in data]))
    rmax = lv[:, -1].clone()  # the last bin is the overflow bin at the row's maximum
    got = E.tv_from_hist(mass.to(dev), lv.to(dev), rmax.to(dev), force_kernel=True)[3].cpu().numpy()
    N1, RT, NR = J.COARSE, J.refine_top(), J.REFINE
    want = []
    for w, x in data:
        t0 = np.arange(N1) / N1
        U = _interval_upper_formula(t0, 1.0 / N1, w, x)
        top = np.argsort(-U, kind="stable")[:RT]  # the RT largest (ties: the lowest index; none at RT 0, the default)
        refined = -1.0  # none refined (RT 0): −1, as the kernel's
        if RT:
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


def sup_row(rng, r: int, K: int):
    """Row ``r`` of a brute-force soundness check: a distribution p over 2 + r % K tokens (no mass below 1e-6), centres
    of both signs and radii ≥ 0 at one of three scales (radii all 0 on every fourth row)."""
    n = 2 + r % K
    p = rng.dirichlet(np.ones(n) * [0.3, 1.0, 3.0][r % 3])
    p = np.maximum(p, 1e-6)
    p = p / p.sum()
    c = _box_centres(rng, n) * [0.02, 0.3, 1.0][r % 3]
    e = rng.exponential([0.02, 0.3, 1.0][r % 3], n) * (r % 4 != 3)
    return p, c, e


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
      are at least it, and its tanh and e-form parts are ``formulas.TANH_OSC_BOUND`` and ``EFORM_BOUND`` at the box
      (osc = max(c + ε) − min(c − ε); A = Σ p̂ e^{|c|+ε});
    * ``box_levels`` (the histogram's boxes) contains every token's box (``_check_box_levels``)."""
    try:
        from witcert import bounds as B
        from witcert.bounds import dual_grid
    except ImportError as exc:
        return [("box tilt: reference", False, f"cannot import witcert.bounds: {exc}")]
    names = ("reference box tilt (fixed grid) = max_i max(g(t_i), g(t_i+1)), g = t − dualDBox(t, λ_i)",
             "reference box tilt: every λ_i ≥ 0",
             "brute force (center) = max_S A_S/(A_S+C_S) − p̂(S), attained at a corner",
             "reference box tilt and tv_bound_parts_logits(center=c) ≥ brute-force supremum",
             "tv_bound_parts_logits(center=c): tanh = tanh(osc/4), osc = max(c+ε) − min(c−ε); e-form = ½(A²−1) at |c|+ε")
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
    ok_bf, ok_sound, detail, ok_closed = True, True, "", True
    f_osc = sp.lambdify(F.osc, F.TANH_OSC_BOUND, "numpy")
    f_eform = sp.lambdify(F.A, F.EFORM_BOUND, "numpy")
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
        # (a) and (b) of the centred box: Lean tilt_tv_le_tanh_osc (δ ranges over [min(c−ε), max(c+ε)]) and
        # tilt_tv_le_eform at the symmetric radius |c| + ε that contains the box
        ok_closed &= _above(parts[0], min(1.0, float(f_osc(np.max(c + e) - np.min(c - e)))), 1e-9)
        ok_closed &= _above(parts[1], min(1.0, float(f_eform(np.sum(p * np.exp(np.abs(c) + e))))), 1e-9)
        if min([tilt] + parts) < sup - 1e-12:
            ok_sound, detail = False, f"row {r}: sup {sup:.6g}, box tilt {tilt:.6g}, parts {parts}"
    out.append((names[2], ok_bf, ""))
    out.append((names[3], ok_sound, detail))
    out.append((names[4], ok_closed, ""))
    out.append(_check_box_levels(B, rng))
    return out


def check_tilt_grid(rng, rows: int = 12, K: int = 6):
    """``tilt_tv_le_dual_grid_box_endpoints`` on the fixed (t, λ) grid (``sketch_box="grid"``, SPEC §3(c)): the fp64
    reference ``dual_grid._tilt_row_grid(w, up, down, points, λ's)`` with the contract's grid (``GRID_TILT_POINTS``,
    ``GRID_TILT_LAMBDAS``) is max_i min(t_{i+1}, min_{λ ∈ Λ_i} max(g_λ(t_i), g_λ(t_{i+1}))), g_λ(t) = t − dualDBox(t, λ)
    from ``formulas.DUAL_ITEM_BOX`` on the unshifted box (the cover of [0, 1] the theorem takes, λ = 0 giving the
    cap), every λ finite and ≥ 0; and ``tv_bound_parts_logits(..., center=c, grid=True)`` never falls below the
    brute-force supremum."""
    try:
        from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS
        from witcert import bounds as B
        from witcert.bounds import dual_grid
    except ImportError as exc:
        return [("grid tilt: reference", False, f"cannot import the grid's reference: {exc}")]
    names = ("reference grid tilt = max_i min(t_{i+1}, min_λ max(g_λ(t_i), g_λ(t_{i+1}))), g_λ = t − dualDBox(t, λ)",
             "grid tilt: points 0 < … < 1, every λ finite and ≥ 0",
             "reference grid tilt and tv_bound_parts_logits(grid=True) ≥ brute-force supremum")
    if not hasattr(dual_grid, "_tilt_row_grid"):
        return [(n, False, "witcert.bounds.dual_grid._tilt_row_grid is missing") for n in names]
    ts, lams = np.asarray(GRID_TILT_POINTS, dtype=np.float64), GRID_TILT_LAMBDAS
    flat = np.asarray([x for r in lams for x in r], dtype=np.float64)
    if not (np.all(np.isfinite(flat)) and np.all(flat >= 0) and ts[0] == 0.0 and ts[-1] == 1.0
            and np.all(np.diff(ts) > 0) and len(lams) == ts.size - 1):
        return [(n, False, f"the contract's grid {ts.tolist()}, {lams!r}") for n in names]
    ok_ref, worst = True, 0.0
    for w, c, e in _box_rows(rng, rows, K):
        c, e = c * 0.05, e * 0.05  # the boxes the grid's multipliers are for (a few per cent): the formula is tested
        up, down = _BOX_UP(c, e), _BOX_DOWN(c, e)  # where its candidates, not only its cap, decide
        got = float(dual_grid._tilt_row_grid(w, up, down, GRID_TILT_POINTS, lams))
        live = w > 0
        wl, cl, el = w[live], -(up[live] + down[live]) / 2, (up[live] - down[live]) / 2
        best = ts[1:].copy()
        for i, row in enumerate(lams):
            for lam in row:
                g0 = _g_box_formula(ts[i : i + 1], lam, wl, cl, el)[0]
                g1 = _g_box_formula(ts[i + 1 : i + 2], lam, wl, cl, el)[0]
                best[i] = min(best[i], max(g0, g1))
        want = min(1.0, max(0.0, float(best.max()))) if np.any(el > 0) or np.ptp(cl) > 0 else 0.0
        ok_ref &= _above(got, want, B.FP64_ABS_SLACK + 1e-9)
        worst = max(worst, abs(got - want))
    out = [(names[0], ok_ref, f"largest |got − formula| {worst:.2e}"), (names[1], True, "")]
    ok_sound, detail = True, ""
    for r in range(2 * rows):
        p, c, e = sup_row(rng, r, 8)
        sup, _ = _corner_sup(p, c, e)
        tilt = float(dual_grid._tilt_row_grid(p, _BOX_UP(c, e), _BOX_DOWN(c, e), GRID_TILT_POINTS, lams))
        parts = [float(np.asarray(x).reshape(-1)[0]) for x in B.tv_bound_parts_logits(
            np.log(p)[None], e[None], center=c[None], grid=True)]
        if min([tilt] + parts) < sup - 1e-12:
            ok_sound, detail = False, f"row {r}: sup {sup:.6g}, grid tilt {tilt:.6g}, parts {parts}"
    out.append((names[2], ok_sound, detail))
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
