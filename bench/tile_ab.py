"""Tile A/B of the decode kernel on the GPU (kernel + split merge, no epilogue; CUDA-graph replay,
cache copies rotated past the L2): which (tokens per tile, pipeline stages, warps) ``tile_config``
should take, with the registers / spills of each, and bf16 SDPA of the same shape beside them.

    python3 bench/tile_ab.py --shape 8:32768          # one shape per process (a fault kills only it)

Configurations that once faulted on the H200 (bench/RESULTS.md run G) run last in each process.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from bench.decode import bench, graphed, int8_shape, time_sdpa  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.plan import Tile, plan_call, tile_config  # noqa: E402

# (tokens, stages, warps, register cap or None (0: none), head columns BLOCK_H[, packed histogram (None: the plan's,
#  False: two dots)[, block-table prefetch (None: the plan's)[, split multiplier[, L2 prefetch (None: the grid's
#  default tile's)]]]]): the Tile and DecodePlan fields each configuration forces (kernels.plan)
OFF = [(64, 1, 4, 0, 8), (64, 1, 4, 80, 8), (64, 1, 4, 72, 8), (64, 1, 4, 64, 8), (128, 1, 8, None, 8)]
ON = [(128, 1, 4, 168, 8, True), (128, 1, 4, 128, 8, True), (128, 1, 4, 0, 8, True)]
# --pipe: the metered kernel with its codes in flight during its compute (two stages: cp.async into shared memory,
# the 8-bit tiles still loaded transposed, so no bytewise shared reads: sm_90 SASS) or at more warps per SM
# (registers as sm_90 SASS gives them under each cap; programs per SM in brackets)
PIPE_ON = [(128, 1, 4, 168, 8, True),   # the default [3]
           (64, 1, 4, 120, 8, True),    # 120, no spill [4]
           (64, 2, 4, 160, 8, True),    # 160, no spill [3], double-buffered
           (64, 2, 4, 128, 8, True),    # 128, 60 B spill [4], double-buffered
           (128, 1, 8, 128, 8, True)]   # 128, no spill [2 × 8 warps]
# --warp1: one- and two-warp programs (no cross-warp exchange of p̂ / the one-hot per tile: each program's
# dots and reductions stay inside its warps), at 1x / 2x the split count (a one-warp program covers a quarter of
# a four-warp one's threads; sm_90 registers, no spill: meter on 32 tokens / 1 warp 200 under the cap (46.8 SASS
# per token against the default's 48.7), meter off 32 / 1 186, 64 / 1 243)
WARP1_ON = [(128, 1, 4, 168, 8, True),               # the default [3 x 4 warps]
            (32, 1, 1, 200, 8, True, None, 1),      # [10 x 1]
            (32, 1, 1, 200, 8, True, None, 2),
            (32, 1, 1, 200, 8, True, None, 4),
            (32, 1, 1, 168, 8, True, None, 2),      # 140 B spill [12 x 1]
            (64, 1, 2, 200, 8, True, None, 2)]      # [5 x 2]
WARP1_OFF = [(64, 1, 4, 80, 8),                        # the default [6 x 4]
             (32, 1, 1, 0, 8, None, None, 1),       # 186 [11 x 1]
             (32, 1, 1, 0, 8, None, None, 2),
             (32, 1, 1, 0, 8, None, None, 4),
             (64, 1, 1, 0, 8, None, None, 2),       # 243 [8 x 1]
             (32, 1, 2, 0, 8, None, None, 2)]       # 146 [7 x 2]
PIPE_OFF = [(64, 1, 4, 80, 8),             # the default [6]
            (128, 1, 8, 80, 8),            # 80, no spill [3 × 8 warps]
            (64, 2, 4, 0, 8),              # 120, no spill [4], double-buffered
            (64, 2, 4, 96, 8)]             # 96, 44 B spill [5], double-buffered


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8:32768")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="only ON[0], ON[2], OFF[1], OFF[4] (split-count A/B)")
    ap.add_argument("--pipe", action="store_true", help="two-stage and 8-warp tiles (PIPE_ON / PIPE_OFF)")
    ap.add_argument("--warp1", action="store_true", help="one- and two-warp programs (WARP1_ON / WARP1_OFF)")
    ap.add_argument("--configs", help="explicit configurations instead of a plan: 'on|off:tokens:stages:warps:cap:S,...' "
                    "(cap 0: none; S 0: the shape's split count; an optional 7th field: the L2 prefetch, Tile.prefetch), 8 head "
                    "columns, the packed histogram")
    ap.add_argument("--splits", type=int, help="another split count than choose_splits'")
    ap.add_argument("--prefetch", help="comma-separated prefetch levels (DecodePlan.prefetch: 0 none, 1 L2) "
                    "for the production tiles and split counts (decode's defaults), meter on and off; the outputs "
                    "must be bit-identical")
    ap.add_argument("--only", choices=("on", "off"), help="with --prefetch: only the metered / unmetered call")
    args = ap.parse_args(argv)
    B, n, *split = (int(x) for x in args.shape.split(":"))  # B:n or B:n:S (S as --splits)
    Hq, Hkv, D = args.heads, 8, 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kvb, caches, q, sl, S = int8_shape(B, n, Hq, Hkv, D, "cuda", sms)
    S = args.splits or (split[0] if split else S)
    t_sdpa = time_sdpa(q, Hkv, n, max(1, len(caches) // 2))
    pps = B * Hkv * S / sms
    print(f"B={B} n={n} Hq={Hq} S={S} sdpa {t_sdpa:.4f} ms; defaults off {tile_config(False, 'int8', pps)} "
          f"on {tile_config(True, 'int8', pps)}", flush=True)
    plan = ((True, WARP1_ON), (False, WARP1_OFF)) if args.warp1 else ((True, PIPE_ON), (False, PIPE_OFF)) if args.pipe else \
        ((True, ON[0::2]), (False, OFF[1::3])) if args.quick else ((True, ON), (False, OFF))
    if args.prefetch:
        for meter in (True, False) if not args.only else (args.only == "on",):
            outs = []
            for l2 in (int(x) for x in args.prefetch.split(",")):
                kw = dict(meter=meter, validate=False, epilogue=False,
                          plan=plan_call(caches[0][0], q, caches[0][1], meter=meter, force=dict(prefetch=l2)))
                out = decode(caches[0][0], q, caches[0][1], sl, **kw)
                outs.append(out)
                t = bench(graphed([(lambda c=c, bt=bt: decode(c, q, bt, sl, **kw)) for c, bt in caches]), False)
                k = out.compiled
                print(f"  {'on ' if meter else 'off'} default, prefetch {('none', 'L2')[l2]}: {t:.4f} ms  sdpa/x "
                      f"{t_sdpa / t:.3f}  TB/s {kvb / t / 1e9:.2f}  regs {k.n_regs} spills {k.n_spills}", flush=True)
            same = all(torch.equal(outs[0].o, x.o) and torch.equal(outs[0].lse, x.lse) for x in outs)
            print(f"  {'on ' if meter else 'off'} bit-identical across prefetch levels: {same}", flush=True)
        return
    if args.configs:
        plan = []
        for c in args.configs.split(","):
            m, tk, st, w, cap, sx, *pf = c.split(":")
            plan.append((m == "on", [(int(tk), int(st), int(w), int(cap), 8, True if m == "on" else None, None,
                                      int(sx) / S if int(sx) else 1, int(pf[0]) if pf else None)]))
    for meter, configs in plan:
        for tokens, stages, warps, cap, hc, *rest in configs:
            pack, pbt, mult, pf = (list(rest) + [None] * 4)[:4]
            Sx = min(64, round(S * mult)) if mult is not None else S
            if pf is None:  # the grid's default tile's L2 prefetch
                pf = tile_config(meter, "int8", B * Hkv * Sx / sms).prefetch
            try:
                kw = dict(meter=meter, validate=False, epilogue=False, plan=plan_call(
                    caches[0][0], q, caches[0][1], meter=meter, num_splits=Sx, tile=Tile(tokens, stages, warps,
                                                                                         cap or None, hc, pf),
                    pages_per_tile=tokens // 16, num_stages=stages, num_warps=warps, prefetch_bt=pbt,
                    force=dict(pack_hist=False) if pack is False else None))
                out = decode(caches[0][0], q, caches[0][1], sl, **kw)
                t = bench(graphed([(lambda c=c, bt=bt: decode(c, q, bt, sl, **kw)) for c, bt in caches]), False)
                k = out.compiled
                print(f"  {'on ' if meter else 'off'} {tokens:>3} tok s{stages} w{warps}{f' r{cap}' if cap else ''}{f' h{hc}' if hc else ''}{(' packed' if pack else ' 2 dots') if pack is not None else ''}{(' prefetch' if pbt else ' no prefetch') if pbt is not None else ''}{f' S {Sx}' if Sx != S else ''}{f' prefetch {pf}' if pf else ''}: {t:.4f} ms  sdpa/x "
                      f"{t_sdpa / t:.3f}  TB/s {kvb / t / 1e9:.2f}  regs {k.n_regs} spills {k.n_spills}", flush=True)
            except Exception as e:  # a configuration that does not build is reported
                print(f"  {'on ' if meter else 'off'} {tokens} tok s{stages} w{warps}: {type(e).__name__}: {str(e)[:200]}",
                      flush=True)


if __name__ == "__main__":
    main()
