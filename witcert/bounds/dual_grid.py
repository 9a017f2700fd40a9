"""SPEC §3(c), one row: the dual-grid tilt bound by branch and bound over intervals of t ∈ [0, 1], with
the dual value D(t, λ) (its rounding bounded explicitly and subtracted), the tight λ of the greedy
fractional knapsack, and each interval's upper value at its two ends (Lean
``tilt_tv_le_dual_grid_endpoints``)."""

from __future__ import annotations

import math

import numpy as np

from contract.constants import check_grid

from .rounding import _EPS64, FP64_ABS_SLACK

#: default branch-and-bound tolerance of the dual-grid tilt bound (SPEC §3(c)).
TILT_DEFAULT_TOL = 2.0**-12


def _greedy(ts: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float):
    """The greedy fractional knapsack at each t in ``ts``: β_k(t) = (1−t) a_k + t b_k sorted descending [T, K], the
    masses in that order, and the tight λ = 1/β of the marginal item (the one sort both ``_dual_values`` and
    ``_lambda_at`` read: one λ, never two copies that could drift)."""
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]  # [T, K]
    order = np.argsort(-beta, axis=1, kind="stable")
    bs = np.take_along_axis(beta, order, axis=1)
    ws = w[order]
    cum = np.cumsum(ws * bs, axis=1)
    k = np.minimum(np.sum(cum < (ts * m)[:, None], axis=1), bs.shape[1] - 1)
    return bs, ws, 1.0 / bs[np.arange(ts.size), k]


def _dual_values(ts: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float):
    """For each t in ``ts``: a safe lower value of ``D(t, λ_t)`` with the tight λ (SPEC §3(c)), the float value, and
    that λ (``_lambda_at``'s, from the same sort).

    ``D(t, λ) = λ t m − Σ_k w_k (λ β_k(t) − 1)₊``, ``β_k(t) = (1−t) a_k + t b_k``. λ is
    ``1/β`` of the marginal item of the greedy fractional knapsack (β descending). The
    returned value is the float value minus a bound on its rounding error, so it never
    exceeds the exact ``D(t, λ)`` for the λ used -- and any λ ≥ 0 is sound.
    """
    bs, ws, lam = _greedy(ts, w, a, b, m)
    target = ts * m
    act = np.maximum(lam[:, None] * bs - 1.0, 0.0)
    D = lam * target - np.sum(ws * act, axis=1)
    # rounding-error bound: every term is computed with relative error <= c·eps, c <= 4K+16.
    mag = lam * target + np.sum(ws * (lam[:, None] * bs + 1.0) * (act > 0), axis=1) + 1.0
    err = (4.0 * bs.shape[1] + 16.0) * _EPS64 * mag
    return D - err, D, lam


def _dual_at(ts: np.ndarray, lam: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float) -> np.ndarray:
    """A safe lower value of ``D(t, λ)`` for given λ per t (the float value minus its rounding bound)."""
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]
    act = np.maximum(lam[:, None] * beta - 1.0, 0.0)
    target = ts * m
    D = lam * target - np.sum(w[None, :] * act, axis=1)
    mag = lam * target + np.sum(w[None, :] * (lam[:, None] * beta + 1.0) * (act > 0), axis=1) + 1.0
    return D - (4.0 * beta.shape[1] + 16.0) * _EPS64 * mag


def _lambda_at(ts: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float) -> np.ndarray:
    """The tight λ at each t (``_greedy``'s, which ``_dual_values`` returns beside D)."""
    return _greedy(ts, w, a, b, m)[2]


def _tilt_row(w: np.ndarray, eps: np.ndarray, tol: float, max_points: int) -> float:
    """The §3(c) bound of one row by branch and bound over intervals [t_i, t_{i+1}], each with the upper value
    max(t_i − D(t_i, λ_i), t_{i+1} − D(t_{i+1}, λ_i)) (λ_i tight at t_i; t − D(t, λ) is convex in t, so that is its
    maximum on the interval: Lean ``tilt_tv_le_dual_grid_endpoints``), splitting every interval whose upper value
    exceeds the best achievable value by more than ``tol``."""
    keep = w > 0
    w, eps = w[keep], eps[keep]
    if w.size <= 1 or float(eps.max()) == 0.0:
        return 0.0
    if float(eps.max()) > 700.0:  # e^ε overflows: the bound is saturated
        return 1.0
    w = w / w.sum()
    eu, inv = np.unique(eps, return_inverse=True)
    wu = np.bincount(inv.reshape(-1), weights=w, minlength=eu.size)
    return _branch_and_bound(wu, np.exp(eu), np.exp(-eu), tol, max_points)


def _box_row(w: np.ndarray, up: np.ndarray, down: np.ndarray):
    """A box row's tokens of positive mass ``(w, up, down, None)``, or its value decided before any tilt: 0 for at most
    one such token (p = p̂), 1 for a non-finite or negative mass or a non-finite or inverted (down > up) box."""
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        return w, up, down, 1.0
    keep = w > 0
    w, up, down = w[keep], up[keep], down[keep]
    if w.size <= 1:
        return w, up, down, 0.0
    if not (np.all(np.isfinite(up)) and np.all(np.isfinite(down))) or np.any(down > up):
        return w, up, down, 1.0
    return w, up, down, None


def _tilt_row_box(w: np.ndarray, up: np.ndarray, down: np.ndarray, tol: float, max_points: int) -> float:
    """The centred (box) form of §3(c) for one row (Lean ``tilt_tv_le_dual_grid_box_endpoints``): the exact
    distribution is p ∝ p̂·e^{η} with every η_j in [down_j, up_j] (δ = −η: a box |δ_j − c_j| ≤ ε_j has
    up = −c + ε, down = −c − ε). The knapsack items are a_j = e^{up_j}, b_j = e^{down_j}, m = Σ p̂ b; the
    same branch and bound as ``_tilt_row`` (which is the case up = ε = −down).

    The box is shifted by M = max up (the bound is invariant under a common shift of η) and the shifted ends
    are rounded outward (one ulp), so a, b carry only exp's rounding, as in the symmetric case. A spread
    max up − min down above 700 saturates (1)."""
    w, up, down, early = _box_row(w, up, down)
    if early is not None:
        return early
    M = float(up.max())
    if M - float(down.min()) > 700.0:  # e^{up − down} overflows: the bound is saturated
        return 1.0
    if float(down.min()) == M:  # every η_j is the same constant: p = p̂
        return 0.0
    w = w / w.sum()
    xu = np.nextafter(up - M, np.inf)
    xd = np.nextafter(down - M, -np.inf)
    pairs, inv = np.unique(np.stack([xu, xd], axis=1), axis=0, return_inverse=True)
    wu = np.bincount(inv.reshape(-1), weights=w, minlength=pairs.shape[0])
    return _branch_and_bound(wu, np.exp(pairs[:, 0]), np.exp(pairs[:, 1]), tol, max_points)


def _tilt_row_grid(w: np.ndarray, up: np.ndarray, down: np.ndarray, points, lams) -> float:
    """The centred (box) form of §3(c) for one row on a **fixed** grid, without levels: the items of
    ``_tilt_row_box`` (a_j = e^{up_j}, b_j = e^{down_j}, m = Σ p̂ b) **unshifted** (a kernel's multipliers λ are fixed
    before it sees the row, so the scale is the box's own), [0, 1] cut at ``points`` (0 = t_0 < … < t_N = 1), and for
    each interval i the smallest over its candidates λ ∈ ``lams[i]`` (and λ = 0, whose value is t_{i+1}) of its larger
    end value t − D(t, λ) (D's float error bounded and subtracted: ``_dual_at``); the bound is the largest over the
    intervals (Lean ``tilt_tv_le_dual_grid_box_endpoints``: any cover, any λ_i ≥ 0). The ends are rounded outward; a
    box end past ±700 saturates (1); a constant box (every η_j equal) gives 0; a value that is not a number (a large λ
    times a large box overflows D to inf − inf) saturates (1). ``points`` / ``lams`` as ``contract.constants.check_grid``
    takes them (ValueError otherwise)."""
    ts, ls = check_grid(points, lams)
    w, up, down, early = _box_row(w, up, down)
    if early is not None:
        return early
    if float(np.max(up)) > 700.0 or float(np.min(down)) < -700.0:  # e^{±700}: the unshifted items overflow
        return 1.0
    if float(down.min()) == float(up.max()):
        return 0.0
    w = w / w.sum()
    a = np.exp(np.nextafter(up, np.inf))
    b = np.exp(np.nextafter(down, -np.inf))
    m = float(np.dot(w, b))
    top = 0.0
    for i, row in enumerate(ls):
        best = ts[i + 1]  # λ = 0: D = 0, the cap t_{i+1}
        if row:
            lv = np.asarray(row, dtype=np.float64)
            with np.errstate(over="ignore", invalid="ignore"):  # an overflowing D is handled below
                left = ts[i] - _dual_at(np.full(lv.size, ts[i]), lv, w, a, b, m)
                right = ts[i + 1] - _dual_at(np.full(lv.size, ts[i + 1]), lv, w, a, b, m)
            cand = np.maximum(left, right)
            # a candidate whose D overflowed (NaN, or a −inf never produced but guarded) tells nothing: never the best
            cand = np.where(np.isnan(cand) | (cand == -np.inf), np.inf, cand)
            best = min(best, float(cand.min()))
        top = max(top, best)
    if not math.isfinite(top):  # (the cap t_{i+1} keeps every interval finite; guarded all the same)
        return 1.0
    return float(min(1.0, max(0.0, top) + FP64_ABS_SLACK))


def _branch_and_bound(wu: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float, max_points: int) -> float:
    """max over a refined grid of t of the intervals' endpoint upper values (``_tilt_row``), for items of mass
    ``wu`` (a distribution) with a_k = e^{up_k} ≥ b_k = e^{down_k}, m = Σ wu b."""
    m = float(np.dot(wu, b))
    ts = np.linspace(0.0, 1.0, 33)
    dsafe, dval, lam = _dual_values(ts, wu, a, b, m)

    def uppers(ts, dsafe, lam):
        right = ts[1:] - _dual_at(ts[1:], lam[:-1], wu, a, b, m)
        return np.minimum(np.maximum(ts[:-1] - dsafe[:-1], right), ts[1:])

    while True:
        upper = uppers(ts, dsafe, lam)
        best = float(np.max(ts - dval))  # achievable (fractional relaxation), up to rounding
        bad = np.nonzero(upper > best + tol)[0]
        if bad.size == 0 or ts.size + bad.size > max_points:
            break
        mids = 0.5 * (ts[bad] + ts[bad + 1])
        ms, mv, ml = _dual_values(mids, wu, a, b, m)
        ts = np.concatenate([ts, mids])
        dsafe = np.concatenate([dsafe, ms])
        dval = np.concatenate([dval, mv])
        lam = np.concatenate([lam, ml])
        o = np.argsort(ts, kind="stable")
        ts, dsafe, dval, lam = ts[o], dsafe[o], dval[o], lam[o]
    return float(min(1.0, max(0.0, float(np.max(uppers(ts, dsafe, lam)))) + FP64_ABS_SLACK))
