"""The fp8 decode call with its key dot in fp16 (the decode's KEY_F16; ``kernels.plan.KEY_F16_SCHEMES``, the library's
default for meter-off e4m3 calls) against the bf16 key dot, side by side in one process, interleaved round by round,
for every scheme given and metered too (``KEY_F16_METERED`` on for the f16 form: the A/B that chose the default): the
paged layout (Hq 32 / Hkv 8, d 128, random codes, caches rotated past the L2, CUDA-graph replay), metered (the group
radius, τ 0.1) and meter-off. ms, the median over ``--rounds`` of do_bench's median; the two forms' outputs (and TV⁺)
compared first, bit for bit.

    python3 bench/key_dot_ab.py [--schemes fp8_e4m3,fp8_e5m2] [--shapes 1:32768,8:4096,8:32768] [--rounds 3]
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

from decode import fill_cache, graphed_calls, interleaved  # noqa: E402

import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="fp8_e4m3,fp8_e5m2")
    ap.add_argument("--shapes", default="1:32768,8:4096,8:32768,32:32768")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import triton

    dev, Hq, Hkv, D = "cuda", 32, 8, 128
    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}; Hq {Hq} / Hkv {Hkv}, d {D}; whole call, "
          f"graph replay, ms (median of {args.rounds} interleaved rounds); f16: the key dot in fp16, metered too")
    print(f"{'scheme':>9} {'B':>3} {'n':>7} {'meter':>5} {'bf16 ms':>9} {'f16 ms':>9} {'f16/bf16':>9} {'same':>5}")
    default, metered = kp.KEY_F16_SCHEMES, kp.KEY_F16_METERED
    forms = (("bf16", ()), ("f16", tuple(args.schemes.split(","))))
    for scheme in args.schemes.split(","):
        for shape in args.shapes.split(","):
            B, n = (int(x) for x in shape.split(":"))
            torch.manual_seed(0)
            copies = max(1, math.ceil(4 * 60e6 / (B * n * Hkv * (D * 2 + 4))))
            cs = [fill_cache(B, n, Hkv, D, scheme, dev) for _ in range(copies)]
            q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
            sl = torch.full((B,), n, device=dev, dtype=torch.int32)
            graphs, same = {}, {}
            for meter in (True, False):
                outs = {}
                for label, schemes in forms:
                    kp.KEY_F16_SCHEMES, kp.KEY_F16_METERED = schemes, True
                    try:
                        o = decode(cs[0][0], q, cs[0][1], sl, meter=meter, validate=False, tilt_above=0.1)
                        outs[label] = (o.o.clone(), o.meter.tv_upper_a.clone() if meter else None)
                        graphs[meter, label] = graphed_calls(cs, q, sl, meter, None, 0.1)
                    finally:
                        kp.KEY_F16_SCHEMES, kp.KEY_F16_METERED = default, metered
                (oa, ta), (ob, tb) = outs["bf16"], outs["f16"]
                same[meter] = torch.equal(oa, ob) and (ta is None or torch.equal(ta, tb))
            times = interleaved(graphs, args.rounds)
            for meter in (True, False):
                t_b, t_f = (statistics.median(times[meter, x]) for x in ("bf16", "f16"))
                print(f"{scheme:>9} {B:>3} {n:>7} {'on' if meter else 'off':>5} {t_b:>9.4f} {t_f:>9.4f} "
                      f"{t_f / t_b:>9.3f} {str(same[meter]):>5}", flush=True)
            del cs, graphs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
