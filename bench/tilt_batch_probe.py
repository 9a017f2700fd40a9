"""The deferred record (``kernels.tilt_batch``, issue 35) against the fused epilogue, on a CUDA GPU.

One decode step of L layers (the same int8 caches for every layer, rotated past the L2; Hq/Hkv 32/8, d 128),
captured in one CUDA graph and replayed (median of ``triton.testing.do_bench``), ms per layer:

    off     decode(meter=False)                                    the attention alone
    fused   decode(tilt_above=τ)                                   the metered call (merge + record per layer)
    defer   decode(tilt_batch=batch, tilt_layer=ℓ), + batch.finish(τ) once per step: the tilt deferred
            (``TiltBatch(forms=False)``: the closed forms in each call's merge)
    forms   the same with the closed forms deferred too (``forms=True``, ``kernels.plan.DEFER_FORMS``)
    forms 1w  the same, the finish in one-warp programs (``TiltBatch.finish(num_warps=1)``)
    pend    the ``forms`` calls without the finish           (the per-call part alone)

for τ = -1 (every row's tilt in full, the WitCertCache default) and τ = 0.1 (a gate's lazy refinement), and checks
that the finished records equal the fused ones (max |Δ TV⁺|, max |Δ E⁺| over both deferred forms, printed).
``--config group``: the group radius; ``default``: WitCertCache's int8 default kernel (2-bit sketch + weights, the
(4, 32) window, page maxima, the excess sums and grid).

    python3 bench/tilt_batch_probe.py                    # B 1, 8, 32 at 32K, 32 layers
    python3 bench/tilt_batch_probe.py --batches 1 --lens 4096 --layers 30 --config default
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.decode import graphed, int8_shape, set_evict  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402


def _cell(B, n, L, Hq, Hkv, D, dev, sms, tau, config, parts=()):
    kvb, caches, q, sl, S = int8_shape(B, n, Hq, Hkv, D, dev, sms)
    win = None
    if config == "default":
        from bench.sketch_speed import page_norms, random_window, sketched

        gen = torch.Generator().manual_seed(0)
        win = random_window(B, Hkv, D, 4, 32, dev)
        caches = [(page_norms(sketched(c, 2, True, gen)), bt) for c, bt in caches]
    layer_cache = [caches[i % len(caches)] for i in range(L)]
    probe = decode(layer_cache[0][0], q, layer_cache[0][1], sl, num_splits=S, window=win)
    batches = {k: TiltBatch.allocate(layers=L, rows=B * Hq, nb=probe.plan.hist_columns, device=dev, forms=k != "defer")
               for k in ("defer", "forms", "forms1", "pend") + tuple(f"{w}{p}" for p in parts for w in ("parts", "pend"))}
    keep = {}
    import kernels.plan as kplan

    default_parts = kplan.MERGE_PARTS

    def step(kind):
        def run():
            outs = []
            # (read by each call's merge while the graph is captured: kinds "partsP" / "pendP" take P programs a row)
            kplan.MERGE_PARTS = (int(kind[5:]) if kind.startswith("parts") else
                                 int(kind[4:]) if kind.startswith("pend") and kind[4:] else default_parts)
            for i, (c, bt) in enumerate(layer_cache):
                if kind == "off":
                    outs.append(decode(c, q, bt, sl, num_splits=S, meter=False, validate=False, window=win))
                elif kind == "fused":
                    outs.append(decode(c, q, bt, sl, num_splits=S, tilt_above=tau, validate=False, window=win))
                else:
                    outs.append(decode(c, q, bt, sl, num_splits=S, validate=False, window=win,
                                       tilt_batch=batches[kind], tilt_layer=i))
            kplan.MERGE_PARTS = default_parts
            if kind in ("defer", "forms") or kind.startswith("parts"):
                batches[kind].finish(tilt_above=tau)
            elif kind == "forms1":
                batches[kind].finish(tilt_above=tau, num_warps=1)
            elif kind.startswith("pend"):  # no finish: only the host's one-write-per-step marks are cleared (no launch)
                batches[kind].written.clear()
            keep[kind] = outs
        return run

    import triton.testing

    kinds = ("off", "fused", "defer", "forms", "forms1", "pend") + tuple(f"{w}{p}" for p in parts
                                                                       for w in ("parts", "pend"))
    graphs = {k: graphed([step(k)]) for k in kinds}
    ms = {k: [] for k in kinds}
    for _ in range(3):  # interleaved rounds
        for k in kinds:
            ms[k].append(triton.testing.do_bench(graphs[k], warmup=10, rep=100, return_mode="median") / L)
    ms = {k: sorted(v)[1] for k, v in ms.items()}
    # the replayed records: the fused against the finished ones (the last replay of each)
    finished = ("defer", "forms", "forms1") + tuple(f"parts{p}" for p in parts)
    dtv = max(float((f.meter.tv_upper_a - d.meter.tv_upper_a).abs().max()) for k in finished
              for f, d in zip(keep["fused"], keep[k]))
    dea = max(float((f.meter.out_err_upper - d.meter.out_err_upper).abs().max()) for k in finished
              for f, d in zip(keep["fused"], keep[k]))
    off = ms["off"]
    print(f"| {config} | {B} | {n} | {L} | {tau:g} | {off:.4f} | {ms['fused']:.4f} | {ms['defer']:.4f} "
          f"| {ms['forms']:.4f} | {ms['forms1']:.4f} | {ms['pend']:.4f} | {ms['fused'] / off:.3f} | {ms['defer'] / off:.3f} "
          f"| {ms['forms'] / off:.3f} | {(ms['fused'] - off) * 1e3:.1f} | {(ms['forms'] - off) * 1e3:.1f} "
          f"| {dtv:.1e} | {dea:.1e} |", flush=True)
    for p in parts:  # the merge in P programs a row (kernels.plan.MERGE_PARTS), against the forms / pend columns
        print(f"#   {config} B {B} n {n} τ {tau:g}: merge in {p} parts: forms {ms[f'parts{p}']:.4f} "
              f"({ms[f'parts{p}'] / ms['forms']:.3f}× forms, {ms[f'parts{p}'] / off:.3f}× off), pend {ms[f'pend{p}']:.4f} "
              f"({ms[f'pend{p}'] / ms['pend']:.3f}× pend)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lens", default="32768")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--taus", default="-1,0.1")
    ap.add_argument("--configs", default="group,default")
    ap.add_argument("--merge-parts", default="",
                    help="programs per row of the deferred merge (kernels.plan.MERGE_PARTS) for the forms / pend "
                         "columns, e.g. 1,2,3: one table per count (empty: the library's)")
    ap.add_argument("--evict", default="", metavar="KV:PARTIALS",
                    help="the decode pass's L2 eviction hints (kernels.plan.KV_EVICT : PARTIALS_EVICT, '-' for none; "
                         "default: the library's)")
    ap.add_argument("--grid-one-reduce", choices=("", "0", "1"), default="",
                    help="the grid's 13 tile sums in one reduction (kernels.plan.GRID_ONE_REDUCE) for every column "
                         "(default: the library's)")
    args = ap.parse_args(argv)
    evict = set_evict(args.evict)
    import kernels.plan as kplan

    if args.grid_one_reduce:
        kplan.GRID_ONE_REDUCE = args.grid_one_reduce == "1"
    if not torch.cuda.is_available():
        raise SystemExit("bench/tilt_batch_probe.py times CUDA graphs: it needs a CUDA GPU "
                         "(tests/kernels/test_tilt_batch.py checks the values on the CPU)")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    import triton

    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
          "ms per layer, one step of L layers in one CUDA graph")
    print(evict)
    print(f"# the grid's tile sums in one reduction (kernels.plan.GRID_ONE_REDUCE): {kplan.GRID_ONE_REDUCE}")
    print("| config | B | n | L | τ | off | fused | defer | forms | forms 1w | pend | fused/off | defer/off | forms/off "
          "| fused − off µs | forms − off µs | max Δ TV⁺ | max Δ E⁺ |")
    print("|---" * 18 + "|")
    for config in args.configs.split(","):
        for B in (int(x) for x in args.batches.split(",")):
            for n in (int(x) for x in args.lens.split(",")):
                for tau in (float(x) for x in args.taus.split(",")):
                    _cell(B, n, args.layers, 32, 8, 128, dev, sms, tau, config,
                          tuple(int(p) for p in args.merge_parts.split(",") if p))
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
