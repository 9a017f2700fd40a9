"""Tightness report (issue 2): coverage of the §3 bounds vs the realised TV on synthetic decode.

Two workloads of one head, d = 128, per-token key witnesses (T = 1, G = 4 groups), the tilt
bound on a fixed 32-level radius ladder (ratio ≈ 1.35; not the kernel's key-side √2 grid): 'plain' (Gaussian keys) and 'outlier' (4 key
channels ~ N(0, 12²), as real key caches have). Both have heavy-tailed logits and sink tokens.

    python bench/tightness.py                 # the full table (n = 1K … 128K; ~15 min on 2 cores)
    python bench/tightness.py --quick         # n = 1K, 4K, few steps
"""

import argparse
import sys
import time

from witcert.schemes import available_schemes
from witcert.synthetic import coverage_table, granularity_table, run_workload

BUILTINS = ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int8", "int8_dither", "int4_group", "kivi2"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--schemes", default=",".join(BUILTINS))
    ap.add_argument("--lengths", default=None, help="comma-separated n (default 1024,4096,16384,65536,131072)")
    ap.add_argument("--steps", type=int, default=None, help="steps per (workload, n)")
    ap.add_argument("--granularity", action="store_true",
                    help="only the witness granularity table: per token vs per 16-token block, G = 1 vs 4")
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    unknown = [s for s in schemes if s not in available_schemes()]
    if unknown:
        ap.error(f"unknown scheme(s) {unknown}; available: {available_schemes()}")
    if args.granularity:
        print(granularity_table([s for s in schemes if s in ("int8", "int8_dither", "fp8_e4m3_scaled", "int4_group")] or schemes,
                                steps=args.steps or 16))
        return
    lengths = [int(x) for x in (args.lengths or ("1024,4096" if args.quick else "1024,4096,16384,65536,131072")).split(",")]
    t0 = time.time()
    results = []
    for wl, oc, ostd in (("plain", 0, 0.0), ("outlier", 4, 12.0)):
        for n in lengths:
            steps = args.steps or (3 if args.quick else max(4, min(40, 400_000 // n)))
            results += run_workload(schemes, [n], steps, outlier_channels=oc, outlier_std=ostd, workload=wl, seed=1)
            print(f"  {wl} n={n}: {steps} steps done ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    print(coverage_table(results))
    print(f"# {len(results)} metered steps, 0 bound violations, {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
