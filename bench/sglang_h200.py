"""H200 timing of the metered decode on SGLang's layout vs SGLang's own Triton decode (issue 12).

Results: bench/SGLANG.md (run on the lent H200).

    python bench/sglang_h200.py --sglang-root /path/to/sglang   # or WITCERT_SGLANG_ROOT=...

``--sglang-root``: a git-ignored folder holding SGLang 0.5.23's ``sglang`` package (its pure-Python
kernel module ``sglang/kernels/ops/attention/decode_attention.py`` is imported from there without
running ``sglang/__init__``). Default: the installed package.

For bf16 and fp8 (e4m3, per-layer scale) KV, B ∈ {1, 8, 32}, n ∈ {4K, 32K, 128K}, Hq=32, Hkv=8, D=128:
time of SGLang's ``decode_attention_fwd`` and of the patched one (metered kernel + epilogue),
their ratio, and the max |Δo| between them (relative to max |o|); "off": WitCert's kernel on the same
CSR rows and buffers with the meter off (``kernels.decode.decode(meter=False)``, what the backend costs
without its meter), CUDA-graph replayed. Two timings of each: eager
(CUDA events around 20 calls from Python: launch and wrapper overheads included) and CUDA-graph
replay of one call (what SGLang's server does for decode batches): the GPU time alone.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode import capture, set_evict  # noqa: E402 (bench/decode.py)
from sglang_gate_cell import gate_cell  # noqa: E402 (bench/sglang_gate_cell.py)

#: seconds of untimed replays before each timed loop (``graph_ms``); triton.testing.do_bench warms up 25 ms
WARMUP_S = 0.2


#: ``--capture-mode``: emulate SGLang's decode runner, whose warm-up and capture run under its process-global
#: capture-mode flag (``sglang.srt.model_executor.runner_utils.capture_mode``, not in the bare kernel import), which
#: the adapter reads to size the deferred records in the warm-up, outside the graph
CAPTURE_MODE = True


@contextlib.contextmanager
def sglang_capture_mode(on: bool):
    """SGLang's capture-mode flag set (``on``) for the block: a stand-in module exposing ``get_is_capture_mode``
    under SGLang's name, removed after (the bare import has none of its own)."""
    from witcert.integrations import sglang_decode

    name = sglang_decode._CAPTURE_MODE_MODULE
    if not on or name in sys.modules:
        yield
        return
    stub = types.ModuleType(name)
    stub.get_is_capture_mode = lambda: True
    sys.modules[name] = stub
    try:
        yield
    finally:
        del sys.modules[name]


def sg_capture(call, debug: bool = False):
    """``bench/decode.capture`` (warm-up call, then the capture) under SGLang's capture-mode flag when
    ``CAPTURE_MODE``, as its decode runner captures."""
    with sglang_capture_mode(CAPTURE_MODE):
        return capture(call, debug=debug)


def graph_ms(call, iters: int) -> float:
    """ms per replay of ``call`` captured in a CUDA graph (NaN, with the reason printed, if the
    capture fails), captured by ``sg_capture``."""
    try:
        g, _ = sg_capture(call)
        # warm-up replays, untimed, for at least WARMUP_S: a cell's first timed loop ran 5-15 % slower than the same
        # call timed later (run Y7: SGLang's kernel 0.225 then 0.201 ms at bf16 B 32 / 4K), which had put the off
        # column, timed first; run Y8's `iters` replays (4 ms at B 32 / 4K) may not have been enough there
        t0 = time.perf_counter()
        while True:
            for _ in range(iters):
                g.replay()
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= WARMUP_S:
                break
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / iters
    except Exception as e:  # noqa: BLE001 (reported, the eager column stands)
        print(f"(graph capture failed: {type(e).__name__}: {e})", flush=True)
        torch.cuda.synchronize()
        return float("nan")


def fresh_slots(ws) -> None:
    """Mark the deferred records' layer slots unwritten (``TiltBatch.reset``) before another capture of a call already
    captured: the adapter gives a slot written since the last finish no deferral (``sglang_decode._tilt_slot``), so
    without this a second capture times the merge with the tilt fused, not the call the graph column timed (what
    runs G4 and H3's ``--kernels`` splits did: their 16-17 µs merge was the fused one). Without ``CAPTURE_MODE`` the
    records are dropped instead, so the capture sizes them again inside the graph, as the graph column's did."""
    if not CAPTURE_MODE:  # (the graph column's capture sized them inside the graph: so again)
        ws.STATE.tilt.clear()
        ws.STATE.tilt_used.clear()
    for tb in ws.STATE.tilt.values():
        tb.reset()


def kernel_table(label: str, call, iters: int, before=None) -> None:
    """The GPU kernels of one replay of ``call`` captured in a CUDA graph (``--kernels``): name, launches and µs per
    replay (torch.profiler over ``iters`` replays), printed as ``#   label: ...`` lines. ``before``: called before
    the capture (``fresh_slots``)."""
    from torch.profiler import ProfilerActivity, profile

    if before is not None:
        before()
    g, _ = sg_capture(call)
    for _ in range(iters):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            g.replay()
        torch.cuda.synchronize()
    total = 0.0
    for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if ev.device_time_total <= 0:
            continue
        us = ev.device_time_total / iters
        total += us
        print(f"#   {label}: {ev.count / iters:.1f} × {ev.key[:90]}: {us:.1f} µs per replay", flush=True)
    print(f"#   {label}: kernels {total:.1f} µs per replay", flush=True)


#: ``--merge-alone``: the captured call's merge launch replayed alone with some compile-time switches changed (as
#: bench/merge_parts.py does for the paged call); a switch off computes a wrong record: timings only
MERGE_ALONE_VARIANTS = {
    "full": {},
    "no_store": {"STORE_REL": 0.0, "STORE_ABS": 0.0, "STORE_MAX": 0.0},
    "lse1": {"LSE_W": 1, "LSE_WP": 1},
    "parts1": {"PARTS": 1},
    "hist": {"EPI": False, "EXC": False, "GRD": False, "DEFER": False, "DEFER_FORMS": False, "PARTS": 1},
    "off": {"METER": False, "EPI": False, "EXC": False, "GRD": False, "DEFER": False, "DEFER_FORMS": False,
            "PARTS": 1},
}


def merge_alone(label: str, call, launches: int = 20, before=None) -> None:
    """``--merge-alone``: capture ``call`` with the merge launch kept (bench/merge_parts.py's spy), then replay that
    launch alone, ``launches`` in one CUDA graph (PDL off), per ``MERGE_ALONE_VARIANTS``; and with 128 MB written
    before each launch (the L2 flushed, that write's own time subtracted). Prints ``#   label: merge alone ...``."""
    from merge_parts import _Spy, launch_us  # (bench/merge_parts.py)

    import kernels.epilogue as ke

    spy = _Spy(ke._merge_meter_kernel)
    ke._merge_meter_kernel = spy
    if before is not None:
        before()
    try:
        sg_capture(call)
    finally:
        ke._merge_meter_kernel = spy.real
    if spy.last is None:
        print(f"#   {label}: merge alone: no merge launch captured", flush=True)
        return
    grid, args, kw = spy.last
    kw = {k: v for k, v in kw.items() if k != "launch_pdl"}
    kw["GDC"] = False
    shown = ("SP", "NB", "KA", "KP", "EXC", "GRD", "WEIGHTED", "DEFER", "DEFER_FORMS", "HA_HM", "STORE_REL",
             "LSE_W", "SL_CSR", "PARTS", "num_warps")
    print(f"#   {label}: merge launch grid {tuple(grid)}, " + ", ".join(f"{k} {kw[k]}" for k in shown if k in kw),
          flush=True)
    flush = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    def timed(over: dict, flushed: bool, merge: bool = True) -> float:
        k2 = {**kw, **over}
        g2 = (grid[0], k2.get("PARTS", 1)) if len(grid) > 1 else grid
        return launch_us((lambda: spy.real[g2](*args, **k2)) if merge else None, launches, flush if flushed else None)

    base = timed({}, True, merge=False)
    for name, over in MERGE_ALONE_VARIANTS.items():
        try:
            warm, cold = timed(over, False), timed(over, True) - base
            print(f"#   {label}: merge alone {name}: {warm:.1f} µs (L2 flushed before each: {cold:.1f})", flush=True)
        except Exception as e:  # noqa: BLE001 (a variant that does not build is reported)
            print(f"#   {label}: merge alone {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)


def graph_dump(path: str, call, before=None) -> None:
    """``--graph-dump DIR``: ``call`` captured with CUDA-graph debug mode and its graph written as DOT to ``path``;
    prints the node types it holds (kernels by name, memsets, copies, host and event nodes)."""
    import collections
    import re

    if before is not None:
        before()
    g, _ = sg_capture(call, debug=True)
    g.debug_dump(path)
    if not os.path.exists(path):
        # (run J1, torch 2.11: debug_dump wrote nothing after this capture; the --kernels profile names the nodes)
        print(f"#   graph {os.path.basename(path)}: not written by CUDAGraph.debug_dump", flush=True)
        return
    dot = open(path).read()
    kinds = collections.Counter(re.findall(r"\b(KERNEL|MEMSET|MEMCPY|HOST|EVENT_RECORD|WAIT_EVENT|EMPTY|GRAPH|MEM_ALLOC|"
                                           r"MEM_FREE|BATCH_MEM_OP|CONDITIONAL)\b", dot))
    names = collections.Counter(re.findall(r"name\\?=\\?\"?([A-Za-z_][A-Za-z0-9_]{2,60})", dot))
    print(f"#   graph {os.path.basename(path)}: {dict(kinds)}; {dict(names.most_common(8))}", flush=True)


def _references(kb, vb, loc, q, s, Bsz, n, Hq, Hkv, D):
    """fp32 reference for the first and last request (all heads) over the stored values."""
    refs = {}
    for b in (0, Bsz - 1):
        sl_b = loc[b * n:(b + 1) * n]
        kk = kb[sl_b].float() * s
        vv = vb[sl_b].float() * s
        qq = q[b].float().view(Hkv, Hq // Hkv, D)
        att = torch.softmax(torch.einsum("hgd,nhd->hgn", qq, kk) / math.sqrt(D), -1)
        refs[b] = torch.einsum("hgn,nhd->hgd", att, vv).reshape(Hq, D)
        del kk, vv, att
    return refs


def _time_call(fn, q, kb, vb, indptr, loc, s, Bsz, Hq, D, max_splits, iters, dev):
    """One decode function's eager time (ms) on a cell, its output buffer and the call (to graph-replay)."""
    o = torch.empty(Bsz, Hq, D, device=dev, dtype=torch.bfloat16)
    lg = torch.empty(Bsz, Hq, max_splits, D, device=dev)
    lse = torch.empty(Bsz, Hq, max_splits, device=dev)
    ns = torch.full((Bsz,), max_splits, device=dev, dtype=torch.int32)
    # int32 indices made once, outside the call, as SGLang's backend hands them over (runs before 2026-12-07 I4
    # converted them inside the call: a 2 µs copy kernel in both graphs)
    loc32 = loc.int()
    call = lambda: fn(q, kb, vb, o, indptr, loc32, lg, lse, ns, max_splits,  # noqa: E731
                      1 / math.sqrt(D), s, s)
    call()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        call()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters, o, call


def _bench_cell(ws, patched, orig, args, kv, Bsz, n, dev, Hq, Hkv, D, max_splits):
    """One table row: SGLang's decode against the metered one on a random cache of Bsz requests of n tokens."""
    size = Bsz * n
    dtype = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    scale = None if kv == "bf16" else 0.5
    kb = torch.zeros(size, Hkv, D, dtype=dtype, device=dev)
    vb = torch.zeros_like(kb)
    k = torch.randn(size, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    loc = torch.randperm(size, device=dev)
    s = 1.0 if scale is None else scale
    kb[loc] = (k.float() / s).to(dtype)
    vb[loc] = (v.float() / s).to(dtype)
    ws.record_write(kb, vb, 0, loc, k, v, scale, scale, dtype)
    indptr = torch.arange(0, size + 1, n, device=dev, dtype=torch.int32)
    q = torch.randn(Bsz, Hq, D, device=dev, dtype=torch.bfloat16)
    # fp32 reference for the first and last request (all heads) over the stored values
    refs = _references(kb, vb, loc, q, s, Bsz, n, Hq, Hkv, D)
    outs, times, gtimes, errs = [], [], [], []
    from kernels.decode import decode
    from witcert.integrations.sglang_decode import paged_view

    view = paged_view(ws.STATE.layers[kb.data_ptr()], kb, vb, s, s)
    loc32 = loc.int()
    off = lambda: decode(view, q, loc32, None, kv_indptr=indptr, sm_scale=1 / math.sqrt(D), meter=False,  # noqa: E731
                         validate=False)
    g_off = graph_ms(off, args.iters)
    if getattr(args, "kernels", False):
        kernel_table("off", off, args.iters)
    for fn in (patched, orig):  # ours first: a crash in SGLang's kernel leaves our row printed
        t, o, call = _time_call(fn, q, kb, vb, indptr, loc, s, Bsz, Hq, D, max_splits, args.iters, dev)
        if fn is patched:
            for tau in (float(x) for x in getattr(args, "gate", "").split(",") if x):
                lid = ws.STATE.layers[kb.data_ptr()].layer_id
                print(gate_cell(ws, call, tau, lid, loc, k, v, args.iters).line(t), flush=True)
        times.append(t)
        outs.append(o.float().clone())
        errs.append(max(float((o[b].float() - r).abs().max() / r.abs().max()) for b, r in refs.items()))
        gtimes.append(graph_ms(call, args.iters))
        if getattr(args, "kernels", False):
            kernel_table("metered" if fn is patched else "SGLang", call, args.iters, before=lambda: fresh_slots(ws))
        if getattr(args, "graph_dump", None):
            name = f"{'metered' if fn is patched else 'sglang'}_{kv}_{Bsz}_{n}_mode{'on' if CAPTURE_MODE else 'off'}"
            graph_dump(os.path.join(args.graph_dump, name + ".dot"), call, before=lambda: fresh_slots(ws))
        if getattr(args, "merge_alone", False) and fn is patched:
            merge_alone("metered", call, before=lambda: fresh_slots(ws))
        print(f"#   {'metered' if fn is patched else 'SGLang'}: {times[-1]:.3f} ms, graph {gtimes[-1]:.3f} ms, "
              f"max|o − ref|/max|ref| {errs[-1]:.2e} (first and last request)", flush=True)
    fin = float("nan")
    tb = ws.STATE.tilt.get(Bsz) if getattr(args, "defer_tilt", False) else None
    if tb is not None:  # the deferred tilt's finish of this one captured layer (a step's is one launch for all)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(args.iters):
            tb.finish(-1.0)
        e1.record()
        torch.cuda.synchronize()
        fin = e0.elapsed_time(e1) / args.iters
        print(f"#   deferred tilt: finish of the captured layer {fin:.3f} ms (eager launch)", flush=True)
    t1, t0 = times
    g1, g0 = gtimes
    e1, e0 = errs
    err = float((outs[0] - outs[1]).abs().max() / outs[1].abs().max())
    gr = f"{g1 / g0:.2f}" if g0 == g0 and g1 == g1 else "—"
    print(f"| {kv} | {Bsz} | {n} | {t0:.3f} | {t1:.3f} | {t1 / t0:.2f} "
          f"| {g0:.3f} | {g1:.3f} | {gr} | {g_off:.3f} | {g_off / g0:.2f} | {err:.2e} | {e0:.1e} | {e1:.1e} |",
          flush=True)
    del kb, vb, k, v, call, off, view  # (the last call holds the buffers too)
    ws.STATE.layers.clear()
    ws.STATE.by_buffer.clear()
    ws.STATE.tilt.clear()
    ws.STATE.tilt_used.clear()
    ws.STATE.captured_buffers.clear()
    ws.STATE.static.clear()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-root", default=os.environ.get("WITCERT_SGLANG_ROOT"))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lens", default="4096,32768,131072")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--defer-tilt", action="store_true",
                    help="install(defer_tilt=True): the captured call's record without its tilt (the graph column); "
                         "the finish of that layer timed apart")
    ap.add_argument("--one-warp", default="", metavar="SCHEMES",
                    help="A/B: schemes added to kernels.plan.ONE_WARP_METERED_SCHEMES and SMALL_GRID_SCHEMES for this "
                         "process (the one-warp metered tile and its small-grid split rule, timed for int8 alone)")
    ap.add_argument("--metered-tile", default="", metavar="TOKENS:WARPS:CAP[:PREFETCH]",
                    help="A/B: the metered tile of the 8-bit schemes for this process (kernels.plan.tile_config; CAP 0: "
                         "no register cap; PREFETCH 1: Tile.prefetch, the next tile into the L2), e.g. 64:4:168, "
                         "128:4:168:1")
    ap.add_argument("--metered-splits", default="", metavar="S,...",
                    help="A/B: the table again for each split count forced on the metered call (the adapter's "
                         "metered_decode num_splits; default: the plan's, kernels.plan.choose_splits), one label line each")
    ap.add_argument("--pdl", choices=("none", "merge", "both"), default="both",
                    help="A/B: the launches that take programmatic dependent launch (kernels.pdl.PDL_LAUNCHES; both: "
                         "the library's default)")
    ap.add_argument("--key-dot", choices=("f16", "bf16"), default="f16",
                    help="A/B: the meter-off e4m3 key dot in fp16 against the scaled query (kernels.plan.KEY_F16_SCHEMES, "
                         "the library's default) or in bf16 (the form before)")
    ap.add_argument("--merge-warps", type=int, default=0,
                    help="A/B: warps of a record merge that tilts no row (kernels.plan.MERGE_UNTILTED_WARPS; "
                         "0: the library's)")
    ap.add_argument("--kernels", action="store_true",
                    help="also print each graphed call's kernels (torch.profiler over the replays): name, launches, µs")
    ap.add_argument("--defer-forms", choices=("1", "0"), default="1",
                    help="A/B, with --defer-tilt: the captured call's merge leaves the closed forms to the finish too "
                         "(kernels.plan.DEFER_FORMS, 1: the library's default) or computes them (0: the form before)")
    ap.add_argument("--merge-parts", type=int, default=0,
                    help="A/B, with --defer-tilt: programs per row of the deferred record's merge "
                         "(kernels.plan.MERGE_PARTS: 1, 2, 3; 0: the library's)")
    ap.add_argument("--one-warp-schemes", default=None,
                    help="A/B: the schemes whose metered call takes the one-warp 32-token tile and the small-grid rule "
                         "(kernels.plan.ONE_WARP_METERED_SCHEMES / SMALL_GRID_SCHEMES, comma-separated; "
                         "default: the library's, int8)")
    ap.add_argument("--merge-alone", action="store_true",
                    help="also replay the metered call's captured merge launch alone, as called and with some "
                         "compile-time switches changed, the L2 warm and flushed (bench/merge_parts.py's method)")
    ap.add_argument("--graph-dump", default=None, metavar="DIR",
                    help="also write each call's CUDA graph (debug mode) as DOT into DIR and print its node types")
    ap.add_argument("--evict", default="", metavar="KV:PARTIALS,...",
                    help="A/B: the decode pass's L2 eviction hints (kernels.plan.KV_EVICT : PARTIALS_EVICT, '-' for "
                         "none), the table again for each pair, e.g. -:-,evict_first:-,evict_first:evict_last "
                         "(default: the library's)")
    ap.add_argument("--gate", default="", metavar="TAU,...",
                    help="also time the metered call eager with the certified gate at each τ (a HostExactStore of the "
                         "cell's exact K / V; bench/sglang_gate_cell.py): a comment line per τ after the metered one. "
                         "The gate cannot be captured, so it has no graph column")
    ap.add_argument("--capture-mode", default="on", metavar="on,off",
                    help="A/B: the graph columns' warm-up and capture under SGLang's capture-mode flag (on: as its "
                         "decode runner, the deferred records sized in the warm-up; off: sized inside the capture, "
                         "their fills in the graph, as the runs before 2026-12-07 J1 timed), the table again for each")
    args = ap.parse_args()
    import kernels.pdl as pdl
    import kernels.plan as kplan

    if args.merge_parts:
        kplan.MERGE_PARTS = args.merge_parts
    if args.one_warp_schemes is not None:
        kplan.ONE_WARP_METERED_SCHEMES = tuple(x for x in args.one_warp_schemes.split(",") if x)
        kplan.SMALL_GRID_SCHEMES = kplan.ONE_WARP_METERED_SCHEMES
    print(f"# metered one-warp tile (and small-grid rule) for {kplan.ONE_WARP_METERED_SCHEMES}")
    print(f"# deferred record's merge: {kplan.MERGE_PARTS} program(s) per row")

    if args.key_dot == "bf16":
        kplan.KEY_F16_SCHEMES = ()
    print(f"# fp8 key dot in {args.key_dot}")
    kplan.DEFER_FORMS = args.defer_forms == "1"
    print(f"# deferred record's closed forms in the finish: {kplan.DEFER_FORMS}")
    if args.merge_warps:
        kplan.MERGE_UNTILTED_WARPS = args.merge_warps
        print(f"# untilted record merge in {args.merge_warps}-warp programs")

    pdl.PDL_LAUNCHES = {"none": (), "merge": ("merge",), "both": ("merge", "decode")}[args.pdl]
    print(f"# PDL on the launches {pdl.PDL_LAUNCHES}")
    if args.metered_tile:
        import kernels.plan as kp

        tok, warps, cap, *pf = (int(x) for x in args.metered_tile.split(":"))
        forced = kp.Tile(tok, 1, warps, cap or None, prefetch=pf[0] if pf else 0)
        base_tile = kp.tile_config

        def tile_config(meter, scheme="int8", programs_per_sm=0.0, levels="token", block_size=16):
            if meter and scheme in kp.EIGHT_BIT_SCHEMES and levels == "token":
                return forced
            return base_tile(meter, scheme, programs_per_sm, levels, block_size)

        kp.tile_config = tile_config
        print(f"# metered 8-bit tile forced to {forced}")
    if args.one_warp:
        import kernels.plan as kp

        extra = tuple(x for x in args.one_warp.split(",") if x)
        kp.ONE_WARP_METERED_SCHEMES = kp.ONE_WARP_METERED_SCHEMES + extra
        kp.SMALL_GRID_SCHEMES = kp.SMALL_GRID_SCHEMES + extra
        print(f"# one-warp metered tile and small-grid rule also for {extra}")
    import witcert.integrations.sglang as ws

    root = args.sglang_root
    if root and os.path.basename(os.path.normpath(root)) != "sglang":
        root = os.path.join(root, "sglang")
    mod = ws.import_bare(ws.DECODE_MODULE, root)
    orig = mod.decode_attention_fwd
    # the folder given is SGLang 0.5.23's package unpacked from its wheel (not pip-installed there)
    ws.install(force=True, targets=("decode",), bare=True, on_record=lambda lid, r: None, version="0.5.23",
               **({"defer_tilt": True} if args.defer_tilt else {}))
    print(f"# metered graph column: tilt {'deferred (install(defer_tilt=True))' if args.defer_tilt else 'fused'}")
    patched = mod.decode_attention_fwd
    dev = "cuda"
    Hq, Hkv, D, max_splits = 32, 8, 128, 16
    print("| KV | B | n | SGLang ms | metered ms | ratio | SGLang graph ms | metered graph ms | graph ratio "
          "| off graph ms | off / SGLang graph | max|Δo|/max|o| | SGLang err | metered err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    from witcert.integrations import sglang_decode

    global CAPTURE_MODE
    for mode, pair in ((m, p) for m in args.capture_mode.split(",") for p in args.evict.split(",")):
        if mode not in ("on", "off"):
            raise SystemExit(f"--capture-mode {mode!r}: expected on or off")
        CAPTURE_MODE = mode == "on"
        print(f"# SGLang capture-mode flag around the graph columns' warm-up and capture: {mode}")
        print(set_evict(pair))
        for splits in [None] + [int(x) for x in args.metered_splits.split(",") if x]:
            if splits is not None:
                print(f"# metered call at {splits} splits (forced)")
            sglang_decode.metered_decode.__defaults__ = (splits, None)  # (num_splits, tilt)
            for kv in args.kv.split(","):
                for Bsz in map(int, args.batches.split(",")):
                    for n in map(int, args.lens.split(",")):
                        _bench_cell(ws, patched, orig, args, kv, Bsz, n, dev, Hq, Hkv, D, max_splits)
    print("unmetered calls:", dict(ws.STATE.unmetered_counts()))


if __name__ == "__main__":
    main()
