"""Small batches on one wave of the many-program tiles (run R): the whole call, as bench/decode.py's "on" column
(meter on, tilt above τ 0.1, kernel + fused merge / record, CUDA-graph replay, caches rotated past the L2), at
``choose_splits``' count ("production") against explicit split counts. A B 1 grid of 8 kv heads needs ~200 splits
to fill a wave of twelve one-warp programs per SM (each program then runs ~5 tiles of 32 tokens at 32K, against
~5 tiles of 128 in a four-warp one); the merge reads S partials per row (its next power of two).

    python3 bench/b1_probe.py --lengths 32768,131072 --splits 96,128,192
    python3 bench/b1_probe.py --batch 4 --lengths 8192,32768 --splits 12          # the old rule's count
    python3 bench/b1_probe.py --off --batch 2 --lengths 32768 --splits 17         # the same for the unmetered call

At run R's first call (bench/results/2026-12-03/b1_probe_2026-12-03_R.log) production was the old rule: the 4-warp tile on 49 splits
at B 1. Since the small-grid rule (``SMALL_GRID_MIN_SPLIT_TOKENS``) production is one wave of the one-warp tile
(metered) or of the capped 64-token tile (unmetered) at B 1-4, and the explicit counts given in runs R2 / R3 are
the old rule's: metered B 1 49, B 2 24, B 4 12 (4-warp tiles); unmetered B 1 33, B 2 17, B 4 16 (128-token /
8-warp tiles). A printed tile is ``tile_config``'s for that count.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from bench.decode import bench, graphed, int8_shape  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.plan import choose_splits, tile_config  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--heads", default="32,64")
    ap.add_argument("--splits", default="96,128,160,192")
    ap.add_argument("--tau", type=float, default=0.1)
    ap.add_argument("--off", action="store_true", help="the explicit split counts for the unmetered call (against its "
                    "production count) instead of the metered one")
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for Hq in (int(x) for x in args.heads.split(",")):
        for n in (int(x) for x in args.lengths.split(",")):
            kvb, caches, q, sl, _ = int8_shape(args.batch, n, Hq, 8, 128, "cuda", sms)

            def timed(meter, S=None):
                fns = [(lambda c=c, bt=bt: decode(c, q, bt, sl, meter=meter, num_splits=S, validate=False,
                                                  tilt_above=args.tau)) for c, bt in caches]
                out = decode(caches[0][0], q, caches[0][1], sl, meter=meter, num_splits=S, validate=False,
                             tilt_above=args.tau)
                return bench(graphed(fns), False), out

            t_off, ref_off = timed(False)
            t_on, ref = timed(True)
            S0, S0f = (choose_splits(args.batch, 8, n, 16, sms, m) for m in (True, False))
            t0, t0f = (tile_config(m, "int8", args.batch * 8 * x / sms) for m, x in ((True, S0), (False, S0f)))
            line = (f"B={args.batch} Hq={Hq} n={n}: off (production: S {S0f}, {t0f.tokens} tok w{t0f.warps}) {t_off:.4f} ms,"
                    f" on (production: S {S0}, {t0.tokens} tok w{t0.warps}) {t_on:.4f} ms = {t_on / t_off:.3f}x off")
            meter = not args.off
            for S in (int(x) for x in args.splits.split(",")):
                t, out = timed(meter, S)
                tile = tile_config(meter, "int8", args.batch * 8 * S / sms)
                k = out.compiled
                ok = bool(torch.isfinite(out.o).all())
                if meter:
                    ok = ok and bool(torch.all(out.meter.tv_upper_a >= 0))
                    diff = f"max |dTV+| vs production {(out.meter.tv_upper_a - ref.meter.tv_upper_a).abs().max().item():.2e}"
                else:
                    diff = f"max |do| vs production {(out.o - ref_off.o).abs().max().item():.2e}"
                line += (f" | {'on' if meter else 'off'} S {S} ({tile.tokens} tok w{tile.warps}, regs {k.n_regs} spills "
                         f"{k.n_spills}) {t:.4f} ms = {t / t_off:.3f}x off, {diff}{'' if ok else ' BAD'}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
