"""Speed of the tightness work (issue 33) side by side in one run: the metered int8 decode call with the
group radius (as bench/RESULTS.md run R timed it) against the sketch radius (2-bit key sketch, channel
weights) and the exact window (4 sinks + 64 recent tokens), on bench/decode.py's shapes (Hq 32 / Hkv 8,
d 128, B ∈ {1, 8, 32}, n ∈ {32K, 128K}, random codes: every tile "hot", the sketch dot never skipped).

Whole call (kernel + fused merge / epilogue, the tilt on every row: the cache's default), CUDA-graph
replay, median of triton.testing.do_bench, caches rotated past the L2.

    python3 bench/sketch_speed.py [--batches 1,8,32] [--lengths 32768,131072] [--heads 32]

"s+w heads": the sketch + window call with per-head key levels (``PagedKV.head_levels``), printed against
"sketch+win" (its cost: GQ one-hot histogram dots per tile instead of one). "s+w no-exc": the sketch + window call
without the centred box's two excess sums (``kernels.plan.EXCESS_FORM`` off while it is built and captured),
printed as sketch+win's time over it (their cost). "s+w no-grid": the same without the excess form's (t, λ) grid
(``kernels.plan.EXCESS_GRID`` off), printed likewise. "s+w pagenorms": sketch+win with ν and κ as float32 page maxima
(``PagedKV.block_norms``, the WitCertCache layout since 2026-12-07), printed as its time over sketch+win's.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode import bench, fill_cache, graphed  # noqa: E402

import kernels.plan as kernel_plan  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.plan import plan_call  # noqa: E402


def sketched(c: PagedKV, bits: int, weighted: bool, gen, head_levels: bool = False) -> PagedKV:
    """The cache with a random ``bits``-bit key sketch and (``weighted``) random power-of-two weights; ``head_levels``:
    the decode bins one key level per (token, query head) (``PagedKV.head_levels``)."""
    import dataclasses

    H, D = c.num_kv_heads, c.head_dim
    w = (2.0 ** torch.randint(-2, 3, (H, D), generator=gen)).float().to(c.k_codes.device) if weighted else \
        torch.ones(H, D, device=c.k_codes.device)
    ksk = torch.randint(0, 256, c.k_codes.shape[:3] + (D * bits // 8,), dtype=torch.uint8, generator=gen).to(
        c.k_codes.device) if bits else torch.zeros(1, dtype=torch.uint8, device=c.k_codes.device)
    return dataclasses.replace(c, sketch_bits=bits, k_sketch=ksk, weights=w, has_weights=weighted,
                               head_levels=head_levels)


def page_norms(c: PagedKV) -> PagedKV:
    """The cache with ν and κ as one float32 running max per page (``PagedKV.block_norms``), drawn as fill_cache's."""
    import dataclasses

    nb, H = c.k_codes.shape[:2]
    vn = torch.empty(nb, H, 1, device=c.k_codes.device).uniform_(1.0, 3.0)
    kn = torch.empty(nb, H, 1, device=c.k_codes.device).uniform_(1.0, 3.0)
    return dataclasses.replace(c, block_norms=True, v_norm=vn, k_norm=kn)


def random_window(B: int, Hkv: int, D: int, sink: int, recent: int, dev) -> ExactWindow:
    """An exact window of random bf16 K / V rings (norms 12: above any ring row's, as the write would store them
    rounded up)."""
    win = ExactWindow.allocate(B, Hkv, D, torch.bfloat16, sink, recent, device=dev)
    win.k.normal_()
    win.v.normal_()
    win.k_norm.fill_(12.0)
    win.v_norm.fill_(12.0)
    return win


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--heads", default="32")
    ap.add_argument("--window", default="4,64")
    ap.add_argument("--caps", default="", help="also time sketch+win under these register caps (e.g. 200,232)")
    ap.add_argument("--tiles", default="", metavar="TOKENS:WARPS:CAP,...",
                    help="also time sketch+win with these tiles forced (plan_call's force: pages per tile, warps, "
                         "register cap; CAP 0: none), e.g. 64:4:168,128:4:168")
    ap.add_argument("--lean", action="store_true", help="only off, group, sketch+win and the --caps / --tiles variants")
    args = ap.parse_args(argv)
    caps = [int(x) for x in args.caps.split(",") if x]
    tiles = [tuple(int(v) for v in x.split(":")) for x in args.tiles.split(",") if x]
    dev = "cuda"
    Hkv, D = 8, 128
    sink, recent = (int(x) for x in args.window.split(","))
    import triton

    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}; int8, Hkv {Hkv}, d {D}, whole call, "
          f"graph replay, ms; group: run R's radius; sketch: 2-bit key sketch + weights; win: + exact window "
          f"({sink}, {recent})")
    cols = ("off", "group", "sketch", "sketch+win", "win", "sketch4+win")
    print(f"{'Hq':>3} {'B':>3} {'n':>7} " + " ".join(f"{c:>11}" for c in cols)
          + f" {'sketch/grp':>10} {'s+win/grp':>10} {'s4+w/grp':>9}")
    for Hq in (int(x) for x in args.heads.split(",")):
        for B in (int(x) for x in args.batches.split(",")):
            for n in (int(x) for x in args.lengths.split(",")):
                torch.manual_seed(0)
                gen = torch.Generator().manual_seed(0)
                kvb = B * n * Hkv * (D * 2 + 4)
                copies = max(1, math.ceil(4 * 60e6 / kvb))
                base = [fill_cache(B, n, Hkv, D, "int8", dev) for _ in range(copies)]
                q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
                sl = torch.full((B,), n, device=dev, dtype=torch.int32)
                win = random_window(B, Hkv, D, sink, recent, dev)
                variants = {
                    **{f"s+w cap{c}": ([(sketched(c0, 2, True, gen), bt) for c0, bt in base], True, win,
                                       dict(max_registers=c or None)) for c in caps},
                    **{f"s+w t{tk}:{wp}:{c}": ([(sketched(c0, 2, True, gen), bt) for c0, bt in base], True, win,
                                              dict(pages_per_tile=tk // 16, num_warps=wp, max_registers=c or None))
                       for tk, wp, c in tiles},
                    "off": ([(c, bt) for c, bt in base], False, None, None),
                    "group": ([(c, bt) for c, bt in base], True, None, None),
                    "sketch": ([(sketched(c, 2, True, gen), bt) for c, bt in base], True, None, None),
                    "sketch+win": ([(sketched(c, 2, True, gen), bt) for c, bt in base], True, win, None),
                    "win": ([(c, bt) for c, bt in base], True, win, None),
                    "sketch4+win": ([(sketched(c, 4, True, gen), bt) for c, bt in base], True, win, None),
                    # per-head key levels (PagedKV.head_levels, the kernel's HEAD_LEVELS): GQ histogram dots per tile
                    "s+w heads": ([(sketched(c, 2, True, gen, True), bt) for c, bt in base], True, win, None),
                    "s+w no-exc": ([(sketched(c, 2, True, gen), bt) for c, bt in base], True, win, None),
                    "s+w no-grid": ([(sketched(c, 2, True, gen), bt) for c, bt in base], True, win, None),
                    "s+w pagenorms": ([(page_norms(sketched(c, 2, True, gen)), bt) for c, bt in base], True, win, None),
                }
                if args.lean:
                    variants = {k: v for k, v in variants.items()
                                if k in ("off", "group", "sketch+win", "s+w no-exc", "s+w no-grid", "s+w pagenorms")
                                or k.startswith(("s+w cap", "s+w t"))}
                t = {}
                regs = {}
                for name, (cs, meter, w, force) in variants.items():
                    def run(c, bt, meter=meter, w=w, force=force):  # force: DecodePlan fields forced, None: the plan's
                        plan = None if force is None else plan_call(c, q, bt, meter=meter, window=w, force=force)
                        return decode(c, q, bt, sl, meter=meter, validate=False, window=w, plan=plan)

                    def one(c, bt, run=run):
                        return lambda: run(c, bt)
                    kernel_plan.EXCESS_FORM = name != "s+w no-exc"
                    kernel_plan.EXCESS_GRID = name != "s+w no-grid"
                    try:
                        k = run(cs[0][0], cs[0][1]).compiled
                        pl = plan_call(cs[0][0], q, cs[0][1], meter=meter, window=w, force=force)
                        regs[name] = (f"{getattr(k, 'n_regs', '?')}/{getattr(k, 'n_spills', '?')}"
                                      f"[{pl.pages_per_tile * 16}t{pl.num_warps}w{pl.num_splits}s]")
                        t[name] = bench(graphed([one(c, bt) for c, bt in cs]), False)
                    except Exception as exc:  # a variant that fails to build is reported, not fatal
                        print(f"# {name}: {type(exc).__name__}: {exc}"[:400], flush=True)
                        t[name] = float("nan")
                    finally:
                        kernel_plan.EXCESS_FORM = True
                        kernel_plan.EXCESS_GRID = True
                g = lambda c: t.get(c, float("nan"))  # noqa: E731 (--lean leaves some out)
                print(f"{Hq:>3} {B:>3} {n:>7} " + " ".join(f"{g(c):>11.4f}" for c in cols)
                      + f" {g('sketch') / g('group'):>10.3f} {g('sketch+win') / g('group'):>10.3f}"
                      f" {g('sketch4+win') / g('group'):>9.3f}  regs/spills " + " ".join(f"{k}:{v}" for k, v in regs.items())
                      + "".join(f"  {c}: {t[c]:.4f} ({t[c] / g('group'):.3f} of group, {t[c] / g('sketch+win'):.3f} of s+w)"
                                for c in t if c.startswith(("s+w cap", "s+w t")))
                      + (f"  s+w heads: {g('s+w heads'):.4f} ({g('s+w heads') / g('sketch+win'):.3f} of sketch+win)"
                         if "s+w heads" in t else "")
                      + (f"  s+w no-exc: {g('s+w no-exc'):.4f} (sketch+win / it {g('sketch+win') / g('s+w no-exc'):.3f})"
                         if "s+w no-exc" in t else "")
                      + (f"  s+w no-grid: {g('s+w no-grid'):.4f} (sketch+win / it {g('sketch+win') / g('s+w no-grid'):.3f})"
                         if "s+w no-grid" in t else "")
                      + (f"  s+w pagenorms: {g('s+w pagenorms'):.4f} (it / sketch+win "
                         f"{g('s+w pagenorms') / g('sketch+win'):.3f}, / group {g('s+w pagenorms') / g('group'):.3f})"
                         if "s+w pagenorms" in t else ""), flush=True)
                del base, variants
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
