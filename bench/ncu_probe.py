"""The decode kernel under Nsight Compute: the production call (decode's defaults: tile, split count, register
cap) of one benchmark shape, meter on then off, each launched twice (the first compiles), so that

    ncu --clock-control none -k regex:_decode_kernel --launch-skip 1 --launch-count 1 \\
        --section WarpStateStats ... python3 bench/ncu_probe.py --shape 8:32768 --meter on

profiles one metered launch (stall reasons, issue slots, achieved occupancy and bandwidth: what limits it).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from bench.decode import int8_shape  # noqa: E402
from kernels.decode import decode  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8:32768", help="B:n")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--meter", choices=("on", "off", "both"), default="both")
    args = ap.parse_args(argv)
    B, n = (int(x) for x in args.shape.split(":"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, caches, q, sl, _ = int8_shape(B, n, args.heads, 8, 128, "cuda", sms)
    cache, bt = caches[0]
    for meter in ((True, False) if args.meter == "both" else (args.meter == "on",)):
        for _ in range(2):
            out = decode(cache, q, bt, sl, meter=meter, validate=False, epilogue=False)
        torch.cuda.synchronize()
        k = out.compiled
        print(f"meter {meter}: regs {k.n_regs} spills {k.n_spills} warps {k.metadata.num_warps}", flush=True)


if __name__ == "__main__":
    main()
