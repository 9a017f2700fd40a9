"""SPEC §3 in fp64 from exact p̂: total variation, the three bounds on TV(p, p̂) over the radius box
(tanh, e-form, dual-grid tilt), their minimum, rounding radii onto levels, and the exact supremum by
subset enumeration (small n, for tests)."""

from __future__ import annotations

import math

import numpy as np

from .dual_grid import TILT_DEFAULT_TOL, _tilt_row, _tilt_row_box
from .inputs import _as_np, _broadcast, _check_nonneg, _check_prob, _mask_np, _wrap
from .rounding import _EPS64, FP64_ABS_SLACK


def tv(p, q):
    """Total variation ``½ Σ_j |p_j − q_j|`` along the last axis (both must be distributions)."""
    pa, qa = _as_np(p, "p"), _as_np(q, "q")
    if pa.shape[-1:] != qa.shape[-1:]:
        raise ValueError(f"q: last axis {qa.shape[-1:]} does not match p {pa.shape[-1:]}")
    pa, qa = _broadcast("p", pa, "q", qa)
    fp = _check_prob(pa, "p")
    fq = _check_prob(qa, "q")
    out = 0.5 * np.sum(np.abs(pa - qa), axis=-1)
    return _wrap(np.where(fp & fq, out, np.nan), p, q)


def _prep_bound(p_hat, radius, *, need_p: bool = True, mask=None):
    """Shared validation for the §3 bounds: returns (p [..., n], eps [..., n], ok [...], live [..., n]).

    ``live`` is the mask (True = attended). Masked tokens must have p̂ = 0; their radii are
    ignored (0), NaN/Inf included. ``ok``: the row's attended inputs are finite."""
    ea = _as_np(radius, "radius")
    if ea.ndim < 1 or ea.shape[-1] == 0:
        raise ValueError(f"radius: expected a non-empty token axis (last), got shape {ea.shape}")
    _check_nonneg(ea, "radius")
    if not need_p:
        live = _mask_np(mask, ea.shape)
        ea = np.where(live, ea, 0.0)
        return None, ea, np.all(np.isfinite(ea), axis=-1), live
    pa = _as_np(p_hat, "p_hat")
    if pa.ndim < 1 or pa.shape[-1] != ea.shape[-1]:
        raise ValueError(f"radius: last axis {ea.shape[-1:]} must equal p_hat's token axis {pa.shape[-1:]}")
    pa, ea = _broadcast("p_hat", pa, "radius", ea)
    live = _mask_np(mask, pa.shape)
    if np.any(np.where(live, 0.0, np.nan_to_num(pa, nan=1.0)) != 0):
        raise ValueError("p_hat: a masked token (mask False) must have p_hat == 0")
    ea = np.where(live, ea, 0.0)
    okp = _check_prob(pa, "p_hat")
    ok = okp & np.all(np.isfinite(ea), axis=-1)
    return pa, ea, ok, live


def tv_bound_tanh(radius, mask=None):
    """SPEC §3(a): ``TV ≤ tanh(ε_max / 2)`` over the attended tokens (osc ≤ 2 ε_max). NaN/Inf → 1."""
    _, ea, ok, _ = _prep_bound(None, radius, need_p=False, mask=mask)
    emax = np.max(np.where(np.isfinite(ea), ea, 0.0), axis=-1)
    out = np.minimum(np.tanh(emax / 2.0) + FP64_ABS_SLACK, 1.0)
    return _wrap(np.where(ok, out, 1.0), radius)


def tv_bound_eform(p_hat, radius, mask=None):
    """SPEC §3(b): ``TV ≤ ½ (A² − 1)``, ``A = Σ_j p̂_j e^{ε_j}`` (capped at 1). NaN/Inf → 1."""
    pa, ea, ok, _ = _prep_bound(p_hat, radius, mask=mask)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.where(ok[..., None], pa, 0.0)
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300)
        A = np.sum(w * np.exp(np.where(ok[..., None] & (w > 0), ea, 0.0)), axis=-1)
        out = 0.5 * (A * A - 1.0) * (1.0 + 8 * ea.shape[-1] * _EPS64) + FP64_ABS_SLACK
    out = np.where(np.isfinite(out), np.minimum(out, 1.0), 1.0)
    return _wrap(np.where(ok, out, 1.0), p_hat, radius)


def round_levels(radius, levels):
    """Round radii **up** onto ``levels`` (increasing, ≥ 0); radii above the top level are
    rounded to the largest radius of their row (SPEC §3(c), the kernel's overflow bin)."""
    ea = _as_np(radius, "radius")
    lv = _as_np(levels, "levels").reshape(-1)
    if lv.size == 0 or not np.all(np.isfinite(lv)) or np.any(lv < 0) or np.any(np.diff(lv) <= 0):
        raise ValueError("levels: expected a non-empty, strictly increasing array of finite values >= 0")
    idx = np.searchsorted(lv, ea, side="left")
    over = idx >= lv.size
    rowmax = np.max(ea, axis=-1, keepdims=True) if ea.ndim else ea
    out = np.where(over, np.broadcast_to(rowmax, ea.shape), lv[np.minimum(idx, lv.size - 1)])
    return _wrap(out, radius)


#: the centred box's centre grid: g = the largest power of two ≤ L₀ / BOX_CENTER_STEPS (``box_levels``)
BOX_CENTER_STEPS = 16


def box_levels(center, radius, levels, center_steps: int = BOX_CENTER_STEPS):
    """Widen centred boxes ``|δ_j − c_j| ≤ ε_j`` onto ``levels`` (the centred tilt's histogram, SPEC §3(c) as
    amended): returns ``(c̄, L)`` with ``[c̄ − L, c̄ + L] ⊇ [c − ε, c + ε]`` and L on the levels
    (``round_levels``). The centre is rounded to a multiple of g, the largest power of two ≤ L₀/``center_steps``
    (L₀ = ε rounded onto the levels; L₀ = 0, or L₀/``center_steps`` below the subnormal range, keeps c), which
    is exact, and the radius grows by |c − c̄| ≤ g/2 (rounded up) before it is rounded onto the levels: tokens
    then share few (c̄, L) pairs. Finite inputs only (ValueError otherwise)."""
    if not isinstance(center_steps, (int, np.integer)) or isinstance(center_steps, bool) or center_steps < 1:
        raise ValueError(f"center_steps: expected a positive int, got {center_steps!r}")
    ca, ea = _as_np(center, "center"), _as_np(radius, "radius")
    ca, ea = _broadcast("center", ca, "radius", ea)
    if not (np.all(np.isfinite(ca)) and np.all(np.isfinite(ea))):
        raise ValueError("center, radius: box_levels takes finite boxes (a non-finite one saturates the bound "
                         "before it is binned)")
    L0 = _as_np(round_levels(ea, levels), "radius")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        step = L0 / float(center_steps)
        _, ex = np.frexp(step)
        g = np.where(step > 0, np.ldexp(1.0, ex - 1), 0.0)  # (a step that underflows to 0 keeps c)
        qc = ca / np.where(g > 0, g, 1.0)
        cb = np.where((g > 0) & np.isfinite(qc), g * np.round(qc), ca)
        # widened by |c − c̄| (exact, Sterbenz) rounded up; unchanged where c̄ = c
        e1 = np.where(cb == ca, ea, np.nextafter(ea + np.abs(ca - cb), np.inf))
    eb = _as_np(round_levels(e1, levels), "radius")
    return _wrap(cb, center, radius), _wrap(eb, center, radius)


def tv_bound_tilt(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, max_points: int = 1 << 15, mask=None,
                  center=None):
    """SPEC §3(c): the dual-grid tilt bound, refined by branch and bound to within ``tol``.

    ``p_hat``, ``radius``: ``[..., n]``. With ``levels`` the radii are first rounded up onto
    them (``round_levels``) and p̂ mass is summed per level, exactly as a K-bin histogram.
    Sound for any grid; ``tol`` only controls tightness (the result is within ``tol`` of the
    fractional-relaxation supremum unless ``max_points`` grid points were not enough).
    ``center`` c (None: 0): the centred box ``|δ_j − c_j| ≤ ε_j`` (``dual_grid._tilt_row_box``; with
    ``levels``, widened onto them by ``box_levels``).
    """
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol: expected a positive finite number, got {tol!r}")
    pa, ea, ok, live = _prep_bound(p_hat, radius, mask=mask)
    ca = _center_np(center, pa.shape, live)
    if ca is not None:
        ok = ok & np.all(np.isfinite(ca), axis=-1)
        ca = np.where(np.isfinite(ca), ca, 0.0)
    ea = np.where(np.isfinite(ea), ea, 0.0)
    if levels is not None:
        if ca is None:
            ea = _as_np(round_levels(ea, levels), "radius")
        else:
            ca, ea = (_as_np(x, "radius") for x in box_levels(ca, ea, levels))
    flat_p = pa.reshape(-1, pa.shape[-1])
    flat_e = ea.reshape(-1, ea.shape[-1])
    flat_c = None if ca is None else ca.reshape(-1, ca.shape[-1])
    flat_ok = ok.reshape(-1)
    out = np.ones(flat_ok.shape)
    for i in np.nonzero(flat_ok)[0]:
        if flat_c is None:
            out[i] = _tilt_row(flat_p[i], flat_e[i], float(tol), int(max_points))
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                up = np.nextafter(-flat_c[i] + flat_e[i], np.inf)
                down = np.nextafter(-flat_c[i] - flat_e[i], -np.inf)
            out[i] = _tilt_row_box(flat_p[i], up, down, float(tol), int(max_points))
    return _wrap(out.reshape(ok.shape), p_hat, radius, center)


def _center_np(center, shape, live):
    """The centres as float64 broadcast to ``shape`` (0 at masked tokens), or None."""
    if center is None:
        return None
    ca = _as_np(center, "center")
    if ca.shape[-1:] != shape[-1:]:
        raise ValueError(f"center: last axis {ca.shape[-1:]} must equal the token axis {shape[-1:]}")
    try:
        ca = np.broadcast_to(ca, shape)
    except ValueError:
        raise ValueError(f"center: shape {ca.shape} does not broadcast to {shape}") from None
    return np.where(live, ca, 0.0)


def tv_bound_parts(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, mask=None):
    """The three §3 bounds ``(tanh, e-form, tilt)`` of ``tv_bound`` (each NaN/Inf → 1).

    ``p_hat`` is taken as exact; masking comes from ``mask`` only. For p̂ out of a
    floating-point softmax use ``tv_bound_parts_logits``."""
    pa, ea, ok, live = _prep_bound(p_hat, radius, mask=mask)
    parts = (tv_bound_tanh(ea, mask=live), tv_bound_eform(pa, ea, mask=live),
             tv_bound_tilt(pa, ea, levels=levels, tol=tol, mask=live))
    return tuple(_wrap(np.where(ok, _as_np(x, "bound"), 1.0), p_hat, radius) for x in parts)


def tv_bound(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, mask=None):
    """The reported §3 bound: ``min(tanh, e-form, dual-grid tilt)``; NaN/Inf → 1."""
    a, b, c = (_as_np(x, "bound") for x in tv_bound_parts(p_hat, radius, levels=levels, tol=tol, mask=mask))
    return _wrap(np.minimum(np.minimum(a, b), c), p_hat, radius)


def tv_sup_bruteforce(p_hat, radius, mask=None, center=None):
    """Exact ``sup TV(p, p̂)`` over the radius box by subset enumeration (n ≤ 16):
    ``max_S A_S / (A_S + C_S) − p̂(S)``, ``A_S = Σ_S p̂ e^{ε}``, ``C_S = Σ_{S^c} p̂ e^{−ε}``; with ``center`` c
    the box ``|δ_j − c_j| ≤ ε_j``: ``A_S = Σ_S p̂ e^{−c+ε}``, ``C_S = Σ_{S^c} p̂ e^{−c−ε}`` (p(S) is largest
    with δ at the box's lower end on S and its upper end off S)."""
    pa, ea, ok, live = _prep_bound(p_hat, radius, mask=mask)
    ca = _center_np(center, pa.shape, live)
    if ca is not None:
        ok = ok & np.all(np.isfinite(ca), axis=-1)
        ca = np.where(np.isfinite(ca), ca, 0.0)
    n = pa.shape[-1]
    if n > 16:
        raise ValueError(f"p_hat: brute force enumerates 2^n subsets and supports n <= 16, got n = {n}")
    masks = ((np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1).astype(np.float64)  # [S, n]
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where(ok[..., None], ea, 0.0)
        p = np.where(ok[..., None], pa, 0.0)
        p = p / np.maximum(p.sum(axis=-1, keepdims=True), 1e-300)
        if ca is None:
            up, dn = p * np.exp(e), p * np.exp(-e)
        else:  # shifted by the row's largest upper end (a common factor cancels in A / (A + C))
            hi, lo = -ca + e, -ca - e
            sh = np.max(np.where(p > 0, hi, -np.inf), axis=-1, keepdims=True)
            sh = np.where(np.isfinite(sh), sh, 0.0)
            up, dn = p * np.exp(hi - sh), p * np.exp(lo - sh)
        A = up @ masks.T
        C = dn @ (1.0 - masks).T
        P = p @ masks.T
        tS = np.where(A + C > 0, A / np.where(A + C > 0, A + C, 1.0), 0.0)
        sup = np.max(tS - P, axis=-1)
    sup = np.clip(sup, 0.0, 1.0)
    return _wrap(np.where(ok, sup, 1.0), p_hat, radius, center)
