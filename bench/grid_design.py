"""Which small (t, λ) grid the decode's excess form should use (issue 33; bench/TIGHTNESS.md, "A small grid in the
fused merge"; offline, float64, not a kernel run).

On the same 1,080 decode rows as ``witcert tightness`` (reference path, defaults; the rows' exact per-(token, head)
centred boxes, ``kernel_box_forms.capture_rows``), each design — cut points of [0, 1] and, per interval, its
multipliers λ — is metered as the merge meters it (``kernels.excess_grid``): per interval the smallest over its λ's of
the larger end value G(t, λ) = S − t(λM − 1) + (e^{2Ξ} − 1)(S + t(V + |λ − 1| M)) (sums over the row's masses, here
p̂ itself), capped by the interval's right end; the largest over the intervals; then the smaller of it and the two-sum
form e^{2Ξ} max(A, B). Ξ is a constant per run (the kernel's is per row; its size on SmolLM2's rows is not measured here). "ideal":
each interval's best λ found by a ternary search (the limit of a design's candidates).

    python bench/grid_design.py [--scheme int8] [--xi 0.001] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import math
import time

import kernel_box_forms as KB
import numpy as np
import unbinned_box as UB

from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS


def _lam(*x):
    return tuple(math.log(v) for v in x)


D = 512.0
DESIGNS = {
    "two sums (λ = 1 on [0, 1])": ((0.0, 1.0), ((0.0,),)),
    "N 3, λ = 1 only": ((0.0, 1 / 3, 2 / 3, 1.0), ((0.0,),) * 3),
    "N 3, {1, 1 ∓ 4/512}": ((0.0, 1 / 3, 2 / 3, 1.0), (_lam(1, 1 - 4 / D), (0.0,), _lam(1, 1 + 4 / D))),
    "N 2, {1, 1 ∓ 3/512, 1 ∓ 6/512}": ((0.0, 0.5, 1.0), (_lam(1, 1 - 3 / D, 1 - 6 / D), _lam(1, 1 + 3 / D, 1 + 6 / D))),
    "the contract's (N 3 at 5/16, 11/16, {1, 1 ∓ 3/512, 1 ∓ 7/512})":
        (GRID_TILT_POINTS, tuple(tuple(math.log(x) for x in r) for r in GRID_TILT_LAMBDAS)),
    "N 3, {1, 1 ∓ 2/512, 1 ∓ 5/512, 1 ∓ 9/512}": ((0.0, 1 / 3, 2 / 3, 1.0),
                                                  (_lam(1, 1 - 2 / D, 1 - 5 / D, 1 - 9 / D), (0.0,),
                                                   _lam(1, 1 + 2 / D, 1 + 5 / D, 1 + 9 / D))),
    "N 4, {1, 1 ∓ 3/512, 1 ∓ 7/512} at the ends, {1, 1 ∓ 1.5/512} inside":
        ((0.0, 0.25, 0.5, 0.75, 1.0), (_lam(1, 1 - 3 / D, 1 - 7 / D), _lam(1, 1 - 1.5 / D), _lam(1, 1 + 1.5 / D),
                                         _lam(1, 1 + 3 / D, 1 + 7 / D))),
}


def _sums(w, a, b, lam, t):
    return float(np.sum(w * np.maximum(lam * ((1 - t) * a + t * b) - 1, 0)))


def _end(w, a, b, m, v, e2, t, lam):
    s = _sums(w, a, b, lam, t)
    return s - t * (lam * m - 1) + e2 * (s + t * (v + abs(lam - 1) * m))


def _ideal(w, a, b, m, v, e2, t0, t1):
    f = lambda ll: max(_end(w, a, b, m, v, e2, t0, math.exp(ll)), _end(w, a, b, m, v, e2, t1, math.exp(ll)))  # noqa
    lo, hi = -0.7, 0.7
    for _ in range(50):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, m2) if f(m1) < f(m2) else (m1, hi)
    return min(f((lo + hi) / 2), f(0.0), t1)


def forms(rows, xi: float) -> dict:
    out: dict = {"real": [], "ref": []}
    e2 = math.expm1(2 * xi)
    for d, _, h, g in UB.head_rows(rows, out, later=False):
        w, a, b = UB.items(d, h, g)
        m, v = float(np.dot(w, b)), float(np.dot(w, np.abs(b - 1)))
        two = (1 + e2) * max(float(np.dot(w, np.maximum(a - 1, 0))), float(np.dot(w, np.maximum(1 - b, 0))))
        for name, (ts, ls) in DESIGNS.items():
            sums = len({(ts[i + k], lam) for i, r in enumerate(ls) for lam in r for k in (0, 1)})
            top = max(min([ts[i + 1]] + [max(_end(w, a, b, m, v, e2, ts[i], math.exp(ll)),
                                              _end(w, a, b, m, v, e2, ts[i + 1], math.exp(ll))) for ll in r])
                      for i, r in enumerate(ls))
            out.setdefault(f"{name} ({sums} sums)", []).append(min(two, max(0.0, top)))
        for n in (2, 3, 8):
            ts = np.linspace(0, 1, n + 1)
            top = max(_ideal(w, a, b, m, v, e2, ts[i], ts[i + 1]) for i in range(n))
            out.setdefault(f"ideal λ per interval, N {n}", []).append(min(two, max(0.0, top)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--xi", type=float, default=1e-3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    rows, _ = KB.capture_rows(a.scheme)
    KB.emit({"scheme": a.scheme, "xi": a.xi, "forms": KB.summary(forms(rows, a.xi)),
             "seconds": round(time.time() - t0, 1)}, a.out)


if __name__ == "__main__":
    main()
