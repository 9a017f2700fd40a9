"""SPEC §3 and §7 in fp64 from served **logits**: the three TV bounds with p̂ = softmax(ŝ) never formed
where it could underflow (e-form in the log domain, the tilt over the represented tokens plus the
underflow term of the rest)."""

from __future__ import annotations

import math

import numpy as np

from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS

from .dual_grid import TILT_DEFAULT_TOL, _tilt_row, _tilt_row_box, _tilt_row_grid
from .inputs import _as_np, _broadcast, _check_nonneg, _mask_np, _wrap
from .rounding import _EPS64, FP64_ABS_SLACK
from .tv_bounds import box_levels, round_levels

#: log p̂ below which a token's mass is not represented in the tilt's linear arithmetic: it is
#: accounted for by the underflow term of ``tv_bound_parts_logits`` instead (SPEC §7)
LOG_MASS_FLOOR = -700.0


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log Σ exp(x) along ``axis`` (−inf entries are empty; an all-empty row gives −inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        mf = np.where(np.isfinite(m), m, 0.0)
        s = np.sum(np.exp(x - mf), axis=axis, keepdims=True)
        with np.errstate(divide="ignore"):
            out = np.log(s) + mf
    return np.squeeze(out, axis=axis)


def tv_bound_parts_logits(logits, radius, mask=None, levels=None, tol: float = TILT_DEFAULT_TOL, tilt: bool = True,
                          center=None, grid: bool = False):
    """The three §3 bounds ``(tanh, e-form, tilt)`` from served **logits** ŝ (SPEC §3, §7).

    ``logits``, ``radius``, ``mask``: ``[..., n]`` (mask True = attended; None: all). p̂ =
    softmax(ŝ) over the attended tokens is never formed where it could underflow:

    * tanh: ``tanh(ε_max/2)`` over every attended token, whatever its p̂;
    * e-form: ``log A = logsumexp(log p̂ + ε)`` in the log domain;
    * tilt: on the tokens with ``log p̂ ≥ LOG_MASS_FLOOR`` (set V), renormalised, plus the
      underflow term ``ρ = p̂(U) + Σ_U p̂_j e^{ε_j} / Σ_V p̂_j e^{−ε_j}`` for the rest U: with
      p' = p|V and p̂' = p̂|V (p' is the same tilt of p̂'), ``TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U)``
      and ``p(U) ≤ Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}``. The fp64 error of exp(log p̂) (≤ (|log p̂| + 4)
      ulp relative) is added as ``2·η``.

    Non-finite attended logits or radii saturate (1). A row with no attended token gives 0.
    ``tilt=False`` skips (c) (reported as 1): the closed forms only, for long prefill chunks.

    ``center`` c ``[..., n]`` (None: 0) makes the box centred: ``|δ_j − c_j| ≤ ε_j`` (δ = served − exact
    logits; c from the residual sketch, ``sketch_center``). Then (a) is ``tanh(osc/4)`` with osc = max(c + ε)
    − min(c − ε) (Lean ``tilt_tv_le_tanh_osc``), (b) the e-form at |c| + ε (⊇ the box), (c) the centred tilt
    (``dual_grid._tilt_row_box``, Lean ``tilt_tv_le_dual_grid_box_endpoints``; with ``levels`` the box is
    first widened onto them, ``box_levels``), and the underflow term uses the box's ends.

    ``grid=True``: (c) on the box as given, **unbinned** (``levels`` then only widen the symmetric alternative), on
    the fixed (t, λ) grid of ``contract.constants`` (``GRID_TILT_POINTS``, ``GRID_TILT_LAMBDAS``:
    ``dual_grid._tilt_row_grid``), the smaller of it and the symmetric tilt at |c| + ε on ``levels``: the form a
    one-pass kernel can accumulate (SPEC §3(c), "grid"). Without ``center`` the box is |δ_j| ≤ ε_j.
    """
    la = _as_np(logits, "logits")
    ea = _as_np(radius, "radius")
    if la.ndim < 1 or la.shape[-1] == 0:
        raise ValueError(f"logits: expected a non-empty token axis (last), got shape {la.shape}")
    if ea.shape[-1:] != la.shape[-1:]:
        raise ValueError(f"radius: last axis {ea.shape[-1:]} must equal the logits' token axis {la.shape[-1:]}")
    _check_nonneg(ea, "radius")
    la, ea = _broadcast("logits", la, "radius", ea)
    ca = None
    if center is not None:
        ca = _as_np(center, "center")
        if ca.shape[-1:] != la.shape[-1:]:
            raise ValueError(f"center: last axis {ca.shape[-1:]} must equal the logits' token axis {la.shape[-1:]}")
        la, ca = _broadcast("logits", la, "center", ca)
        ea = np.broadcast_to(ea, la.shape)
    live = _mask_np(mask, la.shape)
    n = la.shape[-1]
    fl_l, fl_e, fl_live = la.reshape(-1, n), ea.reshape(-1, n), live.reshape(-1, n)
    fl_c = None if ca is None else ca.reshape(-1, n)
    out = np.ones((3, fl_l.shape[0]))
    for i in range(fl_l.shape[0]):
        out[:, i] = _parts_logits_row(fl_l[i], fl_e[i], fl_live[i], levels, float(tol), bool(tilt),
                                      None if fl_c is None else fl_c[i], bool(grid))
    shp = la.shape[:-1]
    return tuple(_wrap(out[k].reshape(shp), logits, radius, center) for k in range(3))


def tv_bound_logits(logits, radius, mask=None, levels=None, tol: float = TILT_DEFAULT_TOL, center=None,
                    grid: bool = False):
    """``min(tanh, e-form, tilt)`` of ``tv_bound_parts_logits``."""
    a, b, c = (_as_np(x, "bound") for x in tv_bound_parts_logits(logits, radius, mask=mask, levels=levels, tol=tol,
                                                                  center=center, grid=grid))
    return _wrap(np.minimum(np.minimum(a, b), c), logits, radius, center)


def _box_ends(c: np.ndarray, e: np.ndarray):
    """The exponent box of the tilt, η = −δ ∈ [down, up]: up = −c + ε, down = −c − ε, rounded outward."""
    with np.errstate(over="ignore", invalid="ignore"):
        up = np.nextafter(-c + e, np.inf)
        down = np.nextafter(-c - e, -np.inf)
    return up, down


def _parts_logits_row(s: np.ndarray, e: np.ndarray, live: np.ndarray, levels, tol: float, tilt: bool = True,
                      c: np.ndarray | None = None, grid: bool = False) -> np.ndarray:
    if not live.any():
        return np.zeros(3)
    s, e = s[live], e[live]
    if c is not None:
        c = c[live]
        if not np.all(np.isfinite(c)):
            return np.ones(3)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(e))):
        return np.ones(3)
    if c is None:
        esym = e
        tanh = min(math.tanh(float(e.max()) / 2.0) + FP64_ABS_SLACK, 1.0)
    else:  # tanh(osc/4), osc = max(c + ε) − min(c − ε) (δ's range), rounded up
        up, down = _box_ends(c, e)
        osc = float(np.nextafter(float(up.max()) - float(down.min()), np.inf))
        tanh = min(math.tanh(osc / 4.0) + FP64_ABS_SLACK, 1.0) if math.isfinite(osc) else 1.0
        with np.errstate(over="ignore"):
            esym = np.nextafter(np.abs(c) + e, np.inf)  # the symmetric radius |c| + ε ⊇ the box: the e-form's
        if not np.all(np.isfinite(esym)):
            return np.array([tanh, 1.0, 1.0])
    if s.size == 1:
        return np.array([tanh, 0.0, 0.0])  # one token: p = p̂ = 1
    lp = s - _logsumexp(s)
    # e-form in the log domain; the rounding of logsumexp is bounded explicitly
    x = lp + esym
    logA = float(_logsumexp(x))
    errA = (4.0 * s.size + 8.0 + 2.0 * float(np.max(np.abs(x))) + 2.0 * float(np.max(np.abs(s)))) * _EPS64
    with np.errstate(over="ignore"):
        A2 = math.exp(min(2.0 * (logA + errA), 700.0))
    eform = min(0.5 * (A2 - 1.0) + FP64_ABS_SLACK, 1.0)
    if not tilt:
        return np.array([tanh, eform, 1.0])
    # tilt on the represented tokens V, plus the underflow term for U
    V = lp >= LOG_MASS_FLOOR
    w = np.exp(lp[V])
    eta = (float(np.max(np.abs(lp[V]))) + 4.0 + 2.0 * float(np.max(np.abs(s)))) * _EPS64

    def underflow(up, down):
        """ρ for the tokens U below the floor: p̂(U) + Σ_U p̂ e^{up} / Σ_V p̂ e^{down}."""
        if V.all():
            return 0.0
        logm = float(_logsumexp(lp[V] + down[V]))
        log_rho = np.logaddexp(float(_logsumexp(lp[~V])), float(_logsumexp(lp[~V] + up[~V])) - logm)
        return math.exp(min(float(log_rho) + 1e-12, 10.0))

    def symmetric(e):
        if levels is not None:
            e = _as_np(round_levels(e, levels), "radius")
        return _tilt_row(w, e[V], tol, 1 << 15) + 2.0 * eta + underflow(e, -e)

    if grid:  # the fixed (t, λ) grid on the unbinned box (c = 0 without a centre), or the symmetric tilt on levels
        gu, gd = _box_ends(np.zeros_like(e) if c is None else c, e)
        tilt = min(_tilt_row_grid(w, gu[V], gd[V], GRID_TILT_POINTS, GRID_TILT_LAMBDAS) + 2.0 * eta
                   + underflow(gu, gd), symmetric(e if c is None else esym))
    elif c is None:
        tilt = symmetric(e)
    else:
        if levels is not None:
            cb, eb = box_levels(c, e, levels)
            up, down = _box_ends(cb, eb)
        # the centred tilt, and the symmetric one at |c| + ε (the box lies in it; both sound): the smaller.
        # The box's level widening (centre grid + levels) can make it the larger where |c| ≪ ε.
        tilt = min(_tilt_row_box(w, up[V], down[V], tol, 1 << 15) + 2.0 * eta + underflow(up, down), symmetric(esym))
    return np.array([tanh, eform, min(tilt, 1.0)])
