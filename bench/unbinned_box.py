"""The centred sketch box metered without binning, in one pass (issue 33: the kernel path's ratio; offline, fp64,
not built).

SPEC §3(c) holds for **any** cover of [0, 1] by intervals and **any** λ_i ≥ 0 (Lean
``tilt_tv_le_dual_grid_box_endpoints``): TV ≤ max_i max(t_i − D(t_i, λ_i), t_{i+1} − D(t_{i+1}, λ_i)), with
D(t, λ) = λ t m − Σ_j p̂_j (λ β_j(t) − 1)₊, β_j(t) = (1 − t) a_j + t b_j, m = Σ_j p̂_j b_j: linear in p̂. So with the
grid points t_i and the candidate λ's fixed before the pass, a kernel could accumulate the sums
Σ_j ŵ_j (λ β_j(t_i) − 1)₊ over the **exact** per-(token, head) centred box (a_j = e^{−c_j+ε_j}, b_j = e^{−c_j−ε_j})
beside its softmax, rescaled with it as the histogram is, and no token is binned (every binned form stops at int8
ratio ≥ 4.91, bench/TIGHTNESS.md). Two ways to fix the λ's:

    fixed N×K δ    stateless: N uniform intervals, the same K candidates λ = e^{kδ} (k centred on 0) at every grid
                   point, each interval taking the candidate whose larger end value is smallest (λ = 0, the cap t_{i+1},
                   is always a candidate). (N + 1)·K sums per (token, head); every row of the run.
    cur{N}         N uniform intervals, λ_i tight at t_i for the row itself (the ideal of one λ per interval)
    prev{N}        the same with λ_i tight for the same (layer, head)'s previous decode step (carried state: any λ
                   is sound); prev{N}k{K} with K candidates λ_i·e^{k/100}. 2N·K sums; the second step's rows only

Each sum costs ~4 fp32 operations per (token, query head) (a multiply-add for β, one for λβŵ − ŵ, a max, an add),
plus two exps per (token, head) for a and b. ``ref`` is the reference path's own TV⁺ (``witcert tightness``: the
centred box on 2^(1/16) levels, branch and bound). Every form is sound; the real TV is against exact attention in fp64.

    python bench/unbinned_box.py [--scheme int8] [--out FILE.json]
"""

from __future__ import annotations

import time

import kernel_box_forms as KB
import numpy as np

from witcert import bounds as B
from witcert.bounds.dual_grid import _dual_at, _lambda_at

GRIDS = (16, 32, 64)
CANDIDATES = ((32, 3), (32, 5), (64, 3))
STEP = 0.01  # the carried candidates' spacing in log λ
FIXED = ((1, 1, 0.0), (4, 1, 0.0), (2, 3, 0.05), (4, 5, 0.04), (6, 3, 0.06), (8, 3, 0.05), (6, 5, 0.04), (8, 5, 0.03),
         (8, 9, 0.02), (16, 9, 0.02))


def items(d, h, g):
    """The row's p̂ (over its attended tokens) and the centred box's knapsack items a, b (unshifted)."""
    lg = d["logits"]
    mk = np.ones(lg.shape[-1], bool) if d["mask"] is None else np.broadcast_to(d["mask"], lg.shape)[0, h, g, 0]
    s, e, c = lg[0, h, g, 0][mk], d["eps"][0, h, g, 0][mk], d["c"][0, h, g, 0][mk]
    w = np.exp(s - s.max())
    return w / w.sum(), np.exp(-c + e), np.exp(-c - e)


def bound(w, a, b, ts, lams) -> float:
    """max over intervals of the best candidate's endpoint upper value; ``lams`` [K, N] (sound for any λ ≥ 0)."""
    m = float(np.dot(w, b))
    ups = []
    for lam in lams:
        left = ts[:-1] - _dual_at(ts[:-1], lam, w, a, b, m)
        right = ts[1:] - _dual_at(ts[1:], lam, w, a, b, m)
        ups.append(np.minimum(np.maximum(left, right), ts[1:]))
    return float(max(0.0, np.min(ups, axis=0).max()))


def tight(w, a, b, ts):
    return _lambda_at(ts, w, a, b, float(np.dot(w, b)))


def head_rows(rows, out: dict, later: bool):
    """Each (row, query head) as (its decode step's capture, the previous step's, h, g), its real TV and the reference
    path's TV⁺ appended to ``out``; ``later``: the second and later decode steps only (rows are prompt-major, then
    decode step, then layer: 30 a step)."""
    steps = len(rows) // 60
    for i, d in enumerate(rows):
        if later and (i // 30) % steps == 0:
            continue
        _, Hkv, GQ, _, _ = d["logits"].shape
        mk_all = np.ones(d["logits"].shape, bool) if d["mask"] is None else np.broadcast_to(d["mask"],
                                                                                              d["logits"].shape)
        for h in range(Hkv):
            for g in range(GQ):
                mk = mk_all[0, h, g, 0]
                out["real"].append(0.5 * np.abs(d["p"][0, h, g, 0] - d["p_exact"][0, h, g, 0])[mk].sum())
                out["ref"].append(float(d["tv"][0, h, g, 0]))
                yield d, rows[i - 30] if later else None, h, g


def shared_sqrt2(d, h, g) -> float:
    """The kernels' binned form today on the row (``kernel_box_forms``' ``shared_sqrt2``: one √2 level per token of
    W_j + max_h |c_hj| / c_h, shared by the heads of kv head h)."""
    lg, E, C = d["logits"], d["eps"], d["c"]
    mk = np.ones(lg.shape[-1], bool) if d["mask"] is None else np.broadcast_to(d["mask"], lg.shape)[0, h, g, 0]
    e, c = E[0, h, :, 0], C[0, h, :, 0]
    ch, u = KB.head_factors(e, c)
    return float(B.tv_bound_logits(lg[0, h, g, 0], ch[g] * KB.grid_up(e[0] + u, 0.5), mask=mk))


def fixed_forms(rows) -> dict:
    """The stateless fixed grids (``FIXED``: N, K, δ) on every row; the two sums of 1 × 1 (λ = 1 at t = 0 and 1:
    max(Σ p̂ (a − 1)₊, Σ p̂ (1 − b)₊)) also as the smaller of it and the kernels' binned form today."""
    out: dict = {"real": [], "ref": []}
    for d, _, h, g in head_rows(rows, out, later=False):
        w, a, b = items(d, h, g)
        for n, k, step in FIXED:
            ts = np.linspace(0.0, 1.0, n + 1)
            lams = [np.full(n, np.exp(j * step)) for j in range(-(k // 2), k // 2 + 1)]
            out.setdefault(f"fixed {n}x{k} {step:g} ({(n + 1) * k} sums)", []).append(bound(w, a, b, ts, lams))
        binned = shared_sqrt2(d, h, g)
        out.setdefault("shared sqrt2 (the kernels today)", []).append(binned)
        out.setdefault("min(fixed 1x1, shared sqrt2)", []).append(min(binned, out["fixed 1x1 0 (2 sums)"][-1]))
    return out


def carried_forms(rows) -> dict:
    """The carried λ's, on the second (and later) decode steps' rows."""
    out: dict = {"real": [], "ref": []}
    for d, dp, h, g in head_rows(rows, out, later=True):
        w, a, b = items(d, h, g)
        wp, ap, bp = items(dp, h, g)
        for n in GRIDS:
            ts = np.linspace(0.0, 1.0, n + 1)
            out.setdefault(f"cur{n}", []).append(bound(w, a, b, ts, [tight(w, a, b, ts[:-1])]))
            out.setdefault(f"prev{n}", []).append(bound(w, a, b, ts, [tight(wp, ap, bp, ts[:-1])]))
        for n, k in CANDIDATES:
            ts = np.linspace(0.0, 1.0, n + 1)
            lp = tight(wp, ap, bp, ts[:-1])
            lams = [lp * np.exp(j * STEP) for j in range(-(k // 2), k // 2 + 1)]
            out.setdefault(f"prev{n}k{k}", []).append(bound(w, a, b, ts, lams))
    return out


def main(argv=None) -> None:
    a = KB.parse_args(__doc__, argv)
    t0 = time.time()
    rows, _ = KB.capture_rows(a.scheme)
    KB.emit({"scheme": a.scheme, "all_rows": KB.summary(fixed_forms(rows)),
             "later_steps": KB.summary(carried_forms(rows)), "seconds": round(time.time() - t0, 1)}, a.out)


if __name__ == "__main__":
    main()
