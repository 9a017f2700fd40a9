"""Could the decode kernel meter the centred box exactly, with the dual's λ carried from the previous step?
(issue 33: the kernel path's ratio; offline, fp64, not built)

SPEC §3(c) holds for **any** cover of [0, 1] by intervals and **any** λ_i ≥ 0 (Lean
``tilt_tv_le_dual_grid_box_endpoints``): TV ≤ max_i max(t_i − D(t_i, λ_i), t_{i+1} − D(t_{i+1}, λ_i)), with
D(t, λ) = λ t m − Σ_j p̂_j (λ β_j(t) − 1)₊ linear in p̂. With the grid and the λ_i fixed before a pass, a kernel
could accumulate those sums over the exact per-(token, head) centred box (a_j = e^{−c_j+ε_j}, b_j = e^{−c_j−ε_j})
beside its softmax, as online sums rescaled like the softmax's (no binning: the binned forms stop at ratio ≥ 4.91
on int8, bench/TIGHTNESS.md). The λ_i would come from the same (layer, head)'s previous decode step: any λ is
sound, a stale one is only looser. This script measures, on the second decode step's rows of one
``witcert tightness`` run (540 of its 1,080 rows; the first step has no previous step), the bound with

    ref            the reference path's centred box (``witcert tightness``' own TV⁺)
    cur{N}         N uniform intervals, λ_i tight for the row itself (the ideal: a second pass)
    prev{N}        N uniform intervals, λ_i tight for the previous step's row (carried)
    prev{N}k{K}    the same with K candidates λ_i·e^{k·1 %} per interval (k centred on 0), the best per interval

A kernel pays 2N·K evaluations (≈ 4 fp32 operations each) per (token, head) for the form prev{N}k{K}.

    python bench/carried_lambda.py [--scheme int8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import kernel_box_forms as KB
import numpy as np

from witcert.bounds.dual_grid import _dual_at, _lambda_at

GRIDS = (16, 32, 64)
CANDIDATES = ((32, 3), (32, 5), (64, 3))
STEP = 0.01  # the candidates' spacing in log λ


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


def forms(rows) -> dict:
    out: dict = {"real": [], "ref": []}
    steps = len(rows) // 60  # rows: prompt-major, then decode step, then layer (30)
    for i, d in enumerate(rows):
        if (i // 30) % steps == 0:
            continue
        dp = rows[i - 30]
        _, Hkv, GQ, _, _ = d["logits"].shape
        mk_all = np.ones(d["logits"].shape, bool) if d["mask"] is None else np.broadcast_to(d["mask"],
                                                                                              d["logits"].shape)
        for h in range(Hkv):
            for g in range(GQ):
                mk = mk_all[0, h, g, 0]
                out["real"].append(0.5 * np.abs(d["p"][0, h, g, 0] - d["p_exact"][0, h, g, 0])[mk].sum())
                out["ref"].append(float(d["tv"][0, h, g, 0]))
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    rows, _ = KB.capture_rows(a.scheme)
    out = forms(rows)
    s = KB.summary(out)
    s.update(scheme=a.scheme, seconds=round(time.time() - t0, 1))
    text = json.dumps(s, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
