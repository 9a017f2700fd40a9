"""The metered decode call's two launches (the decode pass and the fused merge / record) run eagerly a few times, for a
profiler to time each apart (ncu: ``--kernel-name regex:'_decode_kernel|_merge_meter_kernel'``): the paged int8 cache
(Hq 32 / Hkv 8, d 128, random codes, the group radius, τ 0.1) at the shapes given.

    ncu --clock-control none --kernel-name regex:'_decode_kernel|_merge_meter_kernel' --launch-skip 8 \\
        --metrics gpu__time_duration.sum python3 bench/ncu_launches.py --shapes 1:32768,8:4096
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode import fill_cache  # noqa: E402

from kernels.decode import decode  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:32768,8:4096")
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--tau", type=float, default=0.1, help="tilt_above (inf: no row tilted)")
    ap.add_argument("--meter", type=int, choices=(0, 1), default=1, help="0: the meter-off call")
    args = ap.parse_args(argv)
    Hq, Hkv, D = 32, 8, 128
    for shape in args.shapes.split(","):
        B, n = (int(x) for x in shape.split(":"))
        torch.manual_seed(0)
        c, bt = fill_cache(B, n, Hkv, D, args.scheme, "cuda")
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        sl = torch.full((B,), n, device="cuda", dtype=torch.int32)
        for _ in range(args.reps):
            out = decode(c, q, bt, sl, meter=bool(args.meter), validate=False, tilt_above=args.tau)
        torch.cuda.synchronize()
        print(f"# B {B} n {n} {args.scheme}: {args.reps} calls, splits {out.plan.num_splits}",
              flush=True)


if __name__ == "__main__":
    main()
