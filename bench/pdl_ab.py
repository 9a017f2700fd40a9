"""Programmatic dependent launch (``kernels.pdl``) side by side in one process: the whole decode call (decode pass +
fused merge, CUDA-graph replay) with PDL on no launch, on the merge's, and on both the merge's and the decode's,
interleaved round by round, on bench/decode.py's shapes (Hq 32 / Hkv 8, d 128, int8, random codes, caches rotated
past the L2), and bf16 SDPA on the same shape.

Variants: off (meter off), on (the group radius, tilt only above τ 0.1), full (the group radius, tilt on every row),
default (the WitCertCache default on int8: 2-bit sketch + weights + the (4, 32) window, ν / κ page maxima, the excess
sums and grid, tilt on every row). Per cell the median over ``--rounds`` of ``triton.testing.do_bench``'s median.

    python3 bench/pdl_ab.py [--shapes 1:4096,1:32768,8:32768] [--rounds 3] [--variants off,on,full,default]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode import graphed_calls, int8_shape, interleaved, time_sdpa  # noqa: E402
from sketch_speed import page_norms, random_window, sketched  # noqa: E402

import kernels.pdl as pdl  # noqa: E402

SETTINGS = {"none": (), "merge": ("merge",), "both": ("merge", "decode")}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:4096,1:32768,1:131072,8:32768,8:131072,32:32768")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="off,on,full,default")
    ap.add_argument("--tau", type=float, default=0.1)
    args = ap.parse_args(argv)
    import triton

    dev, Hq, Hkv, D = "cuda", 32, 8, 128
    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}; int8, Hq {Hq} / Hkv {Hkv}, d {D}; "
          f"whole call, graph replay, ms (median of {args.rounds} interleaved rounds); PDL settings {SETTINGS}")
    variants = args.variants.split(",")
    print(f"{'B':>3} {'n':>7} {'variant':>8} " + " ".join(f"{s:>9}" for s in SETTINGS)
          + f" {'merge/none':>10} {'both/none':>9} {'sdpa/x':>28}")
    for shape in args.shapes.split(","):
        B, n = (int(x) for x in shape.split(":"))
        gen = torch.Generator().manual_seed(0)
        _, base, q, sl, _ = int8_shape(B, n, Hq, Hkv, D, dev, p.multi_processor_count)
        copies = len(base)
        win = random_window(B, Hkv, D, 4, 32, dev)
        sk = [(page_norms(sketched(c, 2, True, gen)), bt) for c, bt in base] if "default" in variants else []
        spec = {"off": (base, False, None, -1.0), "on": (base, True, None, args.tau), "full": (base, True, None, -1.0),
                "default": (sk, True, win, -1.0)}
        graphs = {}
        default = pdl.PDL_LAUNCHES
        for v in variants:
            cs, meter, w, tau = spec[v]
            for s, launches in SETTINGS.items():
                pdl.PDL_LAUNCHES = launches
                try:
                    graphs[v, s] = graphed_calls(cs, q, sl, meter, w, tau)
                finally:
                    pdl.PDL_LAUNCHES = default
        times = interleaved(graphs, args.rounds)
        sdpa = time_sdpa(q, Hkv, n, max(1, copies // 2))
        for v in variants:
            t = {s: statistics.median(times[v, s]) for s in SETTINGS}
            print(f"{B:>3} {n:>7} {v:>8} " + " ".join(f"{t[s]:>9.4f}" for s in SETTINGS)
                  + f" {t['merge'] / t['none']:>10.3f} {t['both'] / t['none']:>9.3f}"
                  + f"   sdpa {sdpa:.4f}: " + " ".join(f"{sdpa / t[s]:.3f}" for s in SETTINGS), flush=True)
        print(f"#   rounds {B}:{n}: " + "; ".join(f"{v}/{s} " + ",".join(f"{x:.4f}" for x in times[v, s])
                                            for v, s in times), flush=True)
        del base, sk, graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
