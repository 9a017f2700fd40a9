"""The metered decode call at the plan's split count against the count without ``kernels.plan.METERED_WHOLE_TILES``
(the rule off: the split count before it), side by side in one process, interleaved round by round: int8 on the paged
layout (Hq 32 / Hkv 8, d 128, random codes, caches rotated past the L2, CUDA-graph replay), the group radius (on: τ 0.1)
and the WitCertCache default (2-bit sketch + weights + the (4, 32) window, page maxima, the excess sums and grid, tilt on
every row), at shapes where the rule changes the count. ms, the median over ``--rounds`` of do_bench's median.

    python3 bench/split_ab.py [--shapes 1:4096,1:8192,2:4096,4:2048,8:1024] [--rounds 3]
    python3 bench/split_ab.py --unmetered --shapes 1:32768,1:8192   # the meter-off call, UNMETERED_WHOLE_TILES off / on
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode import graphed_calls, int8_shape, interleaved  # noqa: E402
from sketch_speed import page_norms, random_window, sketched  # noqa: E402

import kernels.plan as kp  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:4096,1:8192,2:4096,4:2048,8:1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unmetered", action="store_true",
                    help="the meter-off call with kernels.plan.UNMETERED_WHOLE_TILES off and on instead")
    args = ap.parse_args(argv)
    import triton

    flag = "UNMETERED_WHOLE_TILES" if args.unmetered else "METERED_WHOLE_TILES"
    dev, Hq, Hkv, D = "cuda", 32, 8, 128
    p = torch.cuda.get_device_properties(0)
    sms = p.multi_processor_count
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}; int8, Hq {Hq} / Hkv {Hkv}, d {D}; whole "
          f"call, graph replay, ms (median of {args.rounds} interleaved rounds); rule: {flag}, default "
          f"{getattr(kp, flag)}")
    print(f"{'B':>3} {'n':>7} {'variant':>8} {'S old':>6} {'S new':>6} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
    rule = getattr(kp, flag)
    for shape in args.shapes.split(","):
        B, n = (int(x) for x in shape.split(":"))
        gen = torch.Generator().manual_seed(0)
        _, base, q, sl, _ = int8_shape(B, n, Hq, Hkv, D, dev, sms)
        win = random_window(B, Hkv, D, 4, 32, dev)
        sk = [(page_norms(sketched(c, 2, True, gen)), bt) for c, bt in base]
        if args.unmetered:
            spec = {"off": (base, None, 0.1), "off+win": (base, win, 0.1)}
        else:
            spec = {"on": (base, None, 0.1), "default": (sk, win, -1.0)}
        graphs, counts = {}, {}
        for v, (cs, w, tau) in spec.items():
            for label, tiles in (("old", False), ("new", True if args.unmetered else rule)):
                setattr(kp, flag, tiles)
                try:
                    counts[v, label] = kp.plan_call(cs[0][0], q, cs[0][1], meter=not args.unmetered,
                                                    window=w).num_splits
                    graphs[v, label] = graphed_calls(cs, q, sl, not args.unmetered, w, tau)
                finally:
                    setattr(kp, flag, rule)
        times = interleaved(graphs, args.rounds)
        for v in spec:
            t_old, t_new = (statistics.median(times[v, x]) for x in ("old", "new"))
            print(f"{B:>3} {n:>7} {v:>8} {counts[v, 'old']:>6} {counts[v, 'new']:>6} {t_old:>9.4f} {t_new:>9.4f} "
                  f"{t_new / t_old:>8.3f}", flush=True)
        del base, sk, graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
