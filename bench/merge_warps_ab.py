"""The metered decode call whose record merge tilts no row (τ = +inf, as a deferred tilt's merge) with the merge in
one-warp programs (``kernels.plan.MERGE_UNTILTED_WARPS`` = 1, the candidate) against four-warp ones (the library's
default where the grid has fewer than 4 rows per SM),
side by side in one process, interleaved round by round: int8 on the paged layout (Hq 32 / Hkv 8, d 128, random
codes, caches rotated past the L2, CUDA-graph replay), the group radius ("group") and the WitCertCache default's
kernel (2-bit sketch + weights + the (4, 32) window, page maxima, the excess sums and grid: "default"). ms, the median
over ``--rounds`` of do_bench's median; the two forms' outputs and records compared first (the largest relative
difference of TV⁺ and E⁺: the reductions' order may differ in the last bits).

    python3 bench/merge_warps_ab.py [--shapes 1:4096,1:32768,8:4096,8:32768,32:32768] [--rounds 3]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode import graphed_calls, int8_shape, interleaved  # noqa: E402
from sketch_speed import page_norms, random_window, sketched  # noqa: E402

import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402


def _rel(a, b):
    a, b = a.double(), b.double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    return float(((a - b).abs() / b.abs().clamp_min(1e-300))[ok].max()) if ok.any() else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:4096,1:32768,8:4096,8:32768,32:32768")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import triton

    dev, Hq, Hkv, D = "cuda", 32, 8, 128
    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}; int8, Hq {Hq} / Hkv {Hkv}, d {D}; whole "
          f"call, τ +inf (no row tilted), graph replay, ms (median of {args.rounds} interleaved rounds)")
    print(f"{'B':>3} {'n':>7} {'variant':>8} {'4 warps':>9} {'1 warp':>9} {'1/4':>7} {'o same':>7} {'TV rel':>9} "
          f"{'E rel':>9}")
    default = kp.MERGE_UNTILTED_WARPS
    for shape in args.shapes.split(","):
        B, n = (int(x) for x in shape.split(":"))
        gen = torch.Generator().manual_seed(0)
        _, base, q, sl, _ = int8_shape(B, n, Hq, Hkv, D, dev, p.multi_processor_count)
        win = random_window(B, Hkv, D, 4, 32, dev)
        sk = [(page_norms(sketched(c, 2, True, gen)), bt) for c, bt in base]
        spec = {"group": (base, None), "default": (sk, win)}
        graphs, cmp = {}, {}
        for v, (cs, w) in spec.items():
            outs = {}
            for warps in (4, 1):
                kp.MERGE_UNTILTED_WARPS = warps
                try:
                    o = decode(cs[0][0], q, cs[0][1], sl, meter=True, validate=False, window=w, tilt_above=math.inf)
                    outs[warps] = (o.o.clone(), o.meter.tv_upper_a.clone(), o.meter.out_err_upper.clone())
                    graphs[v, warps] = graphed_calls(cs, q, sl, True, w, math.inf)
                finally:
                    kp.MERGE_UNTILTED_WARPS = default
            (o4, t4, e4), (o1, t1, e1) = outs[4], outs[1]
            cmp[v] = (torch.equal(o4, o1), _rel(t1, t4), _rel(e1, e4))
        times = interleaved(graphs, args.rounds)
        for v in spec:
            t4, t1 = (statistics.median(times[v, w]) for w in (4, 1))
            same, tv, er = cmp[v]
            print(f"{B:>3} {n:>7} {v:>8} {t4:>9.4f} {t1:>9.4f} {t1 / t4:>7.3f} {str(same):>7} {tv:>9.2e} {er:>9.2e}",
                  flush=True)
        del base, sk, graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
