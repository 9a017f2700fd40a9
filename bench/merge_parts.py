"""Where the deferred record merge's time goes on the GPU (issues 35, 36): the merge alone, by part and by warps.

The metered decode call (WitCertCache's int8 default kernel: 2-bit sketch + weights, the (4, 32) window, page maxima,
the excess sums and grid; Hq / Hkv 32 / 8, d 128) runs once per shape with its record deferred to a ``TiltBatch``
(forms deferred too: the graphed default), and the launch of ``epilogue_jit._merge_meter_kernel`` it makes is kept.
That launch is then replayed alone (``--launches`` of them in one CUDA graph, median of ``triton.testing.do_bench``,
µs per launch; PDL off) as it was and with some of its compile-time switches turned off. A variant with a part off
computes a wrong record: these are timings of parts, nothing reads their output.

    off        METER off: the output merge alone (the meter-off call's merge)
    hist       METER on, EPI off: + the merged histograms
    full       the deferred record merge as the call launches it
    no_grid    GRD off (the grid block's 16 merged sums)
    no_exc     EXC and GRD off (no excess sums)
    no_wgt     WEIGHTED off (the weighted head factor)
    wN         full at N warps per program
    partsP     full in P programs a row (``kernels.plan.MERGE_PARTS``), partsP_wN at N warps

    python3 bench/merge_parts.py --shapes 8:4096,8:32768,1:32768 [--launches 20] [--warps 1,2,8] [--flush-mb 128]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import kernels.epilogue as ke  # noqa: E402
import kernels.pdl as kpdl  # noqa: E402
import kernels.plan as kplan  # noqa: E402
from bench.decode import capture, int8_shape, run_shapes  # noqa: E402
from bench.sketch_speed import page_norms, random_window, sketched  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402

VARIANTS = {
    "off": {"METER": False, "EPI": False, "EXC": False, "GRD": False, "DEFER": False, "DEFER_FORMS": False},
    "hist": {"EPI": False, "EXC": False, "GRD": False, "DEFER": False, "DEFER_FORMS": False},
    "full": {},
    "no_grid": {"GRD": False},
    "no_exc": {"EXC": False, "GRD": False},
    "no_wgt": {"WEIGHTED": False},
}


class _Spy:
    """Stands in for the jitted merge: keeps the last launch (grid, args, keywords) and launches it."""

    def __init__(self, real):
        self.real = real
        self.last = None

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.last = (grid, args, dict(kw))
            return self.real[grid](*args, **kw)
        return launch


def launch_us(launch, launches: int, flush: torch.Tensor | None = None) -> float:
    """µs per launch of ``launch()`` (None: no launch), ``launches`` of them in one CUDA graph, each after
    ``flush.fill_(1)`` where ``flush`` is given (median of ``triton.testing.do_bench``)."""
    import triton.testing

    def run():
        for _ in range(launches):
            if flush is not None:
                flush.fill_(1)
            if launch is not None:
                launch()
    g, _ = capture(run)
    return triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median") * 1e3 / launches


def shape_row(B: int, n: int, L: int, warps, launches: int, flush_mb: int = 0) -> dict:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, caches, q, sl, S = int8_shape(B, n, 32, 8, 128, dev, sms)
    gen = torch.Generator().manual_seed(0)
    win = random_window(B, 8, 128, 4, 32, dev)
    c, bt = caches[0]
    c = page_norms(sketched(c, 2, True, gen))
    probe = decode(c, q, bt, sl, num_splits=S, window=win)
    launches_by_parts = {}
    for parts in (1, 2, 3):  # the launch the call makes at each MERGE_PARTS
        tb = TiltBatch.allocate(layers=1, rows=B * 32, nb=probe.plan.hist_columns, device=dev, forms=True)
        spy = _Spy(ke._merge_meter_kernel)
        ke._merge_meter_kernel = spy
        kplan.MERGE_PARTS = parts
        try:
            decode(c, q, bt, sl, num_splits=S, validate=False, window=win, tilt_batch=tb, tilt_layer=0)
        finally:
            ke._merge_meter_kernel = spy.real
            kplan.MERGE_PARTS = 1
        grid, args, kw = spy.last
        kw.pop("launch_pdl", None)
        kw["GDC"] = False
        launches_by_parts[parts] = (grid, args, kw)
    grid, args, kw = launches_by_parts[1]
    row = {"B": B, "n": n, "S": S, "rows": grid[0], "plan_warps": kw["num_warps"],
           "constexprs": {k: v for k, v in kw.items() if k in ("SP", "NB", "KA", "KP", "EXC", "GRD", "WEIGHTED",
                                                                "DEFER", "DEFER_FORMS", "HA_HM", "STORE_REL")}}

    # --flush-mb: a write of that many MB before each launch evicts the partials from the L2, as a decode pass's KV
    # stream does before its merge; the writes' own time (timed alone) is subtracted
    flush = torch.empty(flush_mb << 20, dtype=torch.uint8, device=dev) if flush_mb else None

    def timed(over: dict, parts: int = 1, merge: bool = True) -> float:
        g_, a_, k_ = launches_by_parts[parts]
        k2 = {**k_, **over}
        t = launch_us((lambda: spy.real[g_](*a_, **k2)) if merge else None, launches, flush)
        return round(t - (flush_alone if flush is not None and merge else 0.0), 2)

    flush_alone = timed({}, 1, merge=False) if flush is not None else 0.0
    row["flush_us"] = round(flush_alone, 2)

    variants = {k: (v, 1) for k, v in VARIANTS.items()}
    for w in warps:
        variants[f"w{w}"] = ({"num_warps": w}, 1)
    for parts in (2, 3):
        variants[f"parts{parts}"] = ({}, parts)
        for w in warps:
            variants[f"parts{parts}_w{w}"] = ({"num_warps": w}, parts)
    for _round in range(2):  # two interleaved rounds
        for name, (over, parts) in variants.items():
            try:
                row.setdefault(name + "_us", []).append(timed(over, parts))
            except Exception as e:  # noqa: BLE001 - a variant that fails to build is reported
                row[name + "_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8:4096,8:32768,1:32768")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--warps", default="1,2,8")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--flush-mb", type=int, default=0,
                    help="write this many MB before each launch (the L2 flushed: the partials read from DRAM, as after "
                         "a decode pass), its own time subtracted; 0: none (the partials stay in the L2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    kpdl.PDL_LAUNCHES = ()  # each launch alone: no overlap with the one before
    warps = [int(w) for w in args.warps.split(",") if w]
    run_shapes(args.shapes, lambda B, n: shape_row(B, n, args.layers, warps, args.launches, args.flush_mb), args.out,
               "merge_parts.json")


if __name__ == "__main__":
    main()
