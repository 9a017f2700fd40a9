"""Decode benchmark (issue 3): metered paged int8 decode vs bf16 SDPA, on a CUDA GPU.

For batch ∈ {1, 8, 32}, Hq/Hkv = 32/8, d = 128, n ∈ {4K, 32K, 128K}: time per decode step
(median of triton.testing.do_bench), KV bytes read / time, meter-on / meter-off, and the ratio
to torch SDPA on bf16 KV of the same shape and to our own kernel on bf16 exact KV. Also the
epilogue alone, and the write kernel vs a plain torch int8 quantize.

    python bench/decode.py                  # full table (GPU)
    python bench/decode.py --smoke          # tiny shapes; runs anywhere (CPU interpreter too)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if not torch.cuda.is_available():  # no GPU: run the kernels in Triton's interpreter (smoke only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.decode import decode  # noqa: E402
from kernels.key_levels import KEY_LEVELS  # noqa: E402
from kernels.memory_accounting import bytes_per_token  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.plan import choose_splits  # noqa: E402
from kernels.write import write_kv  # noqa: E402


def bench(fn, smoke):
    if smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def fill_cache(B, n, Hkv, D, scheme, dev, G=1, gen=None):
    T = 16
    pages = math.ceil(n / T)
    nb = B * pages
    c = PagedKV.allocate(nb, Hkv, D, scheme=scheme, block_size=T, num_groups=G, device=dev, with_exact=False)
    if scheme == "none":
        c.k_codes.normal_()
        c.v_codes.normal_()
    else:
        c.k_codes.copy_(torch.randint(-127, 128, c.k_codes.shape, device=dev, dtype=torch.int8))
        c.v_codes.copy_(torch.randint(-127, 128, c.v_codes.shape, device=dev, dtype=torch.int8))
        c.k_scale.uniform_(0.01, 0.03)
        c.v_scale.uniform_(0.01, 0.03)
        c.k_wit.uniform_(0.01, 0.1)
        c.v_wit.uniform_(0.01, 0.1)
        c.v_norm.uniform_(1.0, 3.0)
        c.k_norm.uniform_(1.0, 3.0)
    bt = torch.randperm(nb, device=dev, dtype=torch.int32).view(B, pages)
    return c, bt


def int8_shape(B, n, Hq, Hkv, D, dev, sms):
    """One benchmark shape: (KV bytes, int8 caches rotated past the 60 MB L2, a bf16 query,
    lengths, the split count of ``choose_splits``)."""
    torch.manual_seed(0)
    kvb = B * n * Hkv * (D * 2 + 4)
    copies = max(1, math.ceil(4 * 60e6 / kvb))
    caches = [fill_cache(B, n, Hkv, D, "int8", dev) for _ in range(copies)]
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), n, device=dev, dtype=torch.int32)
    return kvb, caches, q, sl, choose_splits(B, Hkv, n, 16, sms)


def time_sdpa(q, Hkv, n, copies, smoke=False):
    """ms of torch SDPA (enable_gqa) for q [B, Hq, D] over contiguous bf16 K/V [B, Hkv, n, D],
    rotating over ``copies`` K/V sets (past the L2): the baseline of every decode table."""
    B, _, D = q.shape
    sk = [torch.randn(B, Hkv, n, D, device=q.device, dtype=torch.bfloat16) for _ in range(copies)]
    sv = [torch.randn_like(x) for x in sk]
    qs = q[:, :, None, :]
    j = [0]

    def sdpa():
        i = j[0] % len(sk)
        j[0] += 1
        return torch.nn.functional.scaled_dot_product_attention(qs, sk[i], sv[i], enable_gqa=True)

    return bench(sdpa, smoke)


def capture(call, debug: bool = False):
    """``call`` run once on a side stream (its allocations and compiles), then captured in a CUDA graph: (the graph,
    what the captured call returned, whose tensors each replay rewrites). ``debug``: the graph in CUDA-graph debug mode
    (``debug_dump`` can write it)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    if debug:
        g.enable_debug_mode()
    with torch.cuda.graph(g):
        out = call()
    return g, out


def set_evict(spec: str) -> str:
    """``--evict KV:PARTIALS`` ('-' for none; empty: the library's): sets ``kernels.plan.KV_EVICT`` / ``PARTIALS_EVICT``
    (checked) and returns the line a benchmark prints."""
    import kernels.plan as kplan

    if not spec:
        kplan.eviction_hints()
        return f"# L2 eviction hints: KV {kplan.KV_EVICT or 'none'}, partials {kplan.PARTIALS_EVICT or 'none'} (library's)"
    parts = spec.split(":")
    if len(parts) != 2:
        raise SystemExit(f"--evict {spec!r}: expected KV:PARTIALS, e.g. evict_first:- ('-' for none)")
    kplan.KV_EVICT, kplan.PARTIALS_EVICT = ("" if x == "-" else x for x in parts)
    kplan.eviction_hints()
    return f"# L2 eviction hints: KV {kplan.KV_EVICT or 'none'}, partials {kplan.PARTIALS_EVICT or 'none'}"


def run_shapes(spec: str, row, out_dir: str | None, name: str) -> list:
    """``row(B, n)`` for each ``B:n`` of ``spec`` (comma-separated), each printed as a JSON line; the rows written to
    ``out_dir/name`` (``write_rows``) when ``out_dir`` is given."""
    import json

    rows = []
    for shp in spec.split(","):
        B, n = (int(x) for x in shp.split(":"))
        rows.append(row(B, n))
        print(json.dumps(rows[-1]), flush=True)
    if out_dir:
        write_rows(out_dir, name, rows)
    return rows


def write_rows(out_dir: str, name: str, rows: list) -> None:
    """A benchmark's rows as JSON in ``out_dir/name``, with the GPU and torch they ran on."""
    import json

    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


def graphed(fns):
    """Capture each fn in a CUDA graph; return a callable replaying them in rotation."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
            f()
    torch.cuda.current_stream().wait_stream(s)
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        graphs.append(g)
    it = [0]

    def replay():
        graphs[it[0] % len(graphs)].replay()
        it[0] += 1

    return replay


def graphed_calls(cs, q, sl, meter=True, window=None, tau=-1.0):
    """``graphed`` of the whole decode call on each (cache, block table) of ``cs`` (caches rotated past the L2)."""
    return graphed([(lambda c=c, bt=bt: decode(c, q, bt, sl, meter=meter, validate=False, window=window,
                                               tilt_above=tau)) for c, bt in cs])


def interleaved(graphs: dict, rounds: int) -> dict:
    """Each replay's times over ``rounds`` rounds, every graph timed once a round (``bench``): {key: [ms, …]}."""
    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            times[k].append(bench(g, False))
    return times


def diag(Hq, Hkv, D, dev, sms, B=8, n=32768):
    caches = [fill_cache(B, n, Hkv, D, "int8", dev) for _ in range(2)]
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), n, device=dev, dtype=torch.int32)
    S = choose_splits(B, Hkv, n, 16, sms)
    print(f"# diag B={B} n={n} splits={S}: warps pages | regs spills (meter on) | kernel-only ms on / off | full on ms")
    for warps, pages, stages in ((4, 2, 3), (4, 4, 2), (4, 4, 3), (4, 8, 2), (4, 8, 3), (4, 8, 4), (8, 8, 3)):
        def f(c, bt, meter, epi):
            return lambda: decode(c, q, bt, sl, meter=meter, num_splits=S, pages_per_tile=pages, num_warps=warps,
                                  num_stages=stages, validate=False, epilogue=epi)
        out = decode(caches[0][0], q, caches[0][1], sl, meter=True, num_splits=S, pages_per_tile=pages,
                     num_warps=warps, num_stages=stages, validate=False, epilogue=False)
        k = out.compiled
        regs, spills = getattr(k, "n_regs", "?"), getattr(k, "n_spills", "?")
        t_on = bench(graphed([f(c, bt, True, False) for c, bt in caches]), False)
        t_off = bench(graphed([f(c, bt, False, False) for c, bt in caches]), False)
        t_full = bench(graphed([f(c, bt, True, True) for c, bt in caches]), False)
        print(f"#   w{warps} p{pages} s{stages} | {regs} {spills} | {t_on:.4f} / {t_off:.4f} ({t_on / t_off:.3f}x) | {t_full:.4f}", flush=True)


def _parse_args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--heads", default="32,64", help="query heads (kv heads 8)")
    ap.add_argument("--tau", type=float, default=0.1, help="the gate threshold passed as tilt_above for 'on'")
    ap.add_argument("--tau-tilt", type=float, default=0.005,
                    help="tilt_above for 'tilt': below every row's TV+ here, so every row takes the (lazy) tilt")
    ap.add_argument("--diag", action="store_true", help="registers/spills and a warps x tile sweep at B=8, n=32K")
    ap.add_argument("--evict", default="", metavar="KV:PARTIALS",
                    help="the decode pass's L2 eviction hints (kernels.plan.KV_EVICT : PARTIALS_EVICT, '-' for none; "
                         "default: the library's)")
    return ap.parse_args(argv)


def _print_header(args, dev, sms, Hkv, D):
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        import triton

        print(f"# {p.name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}")
    print(f"# Hkv = {Hkv}, d = {D}, int8 K/V with per-token fp16 scales, per-token fp16 witnesses (G = 1), "
          f"{KEY_LEVELS} key-side levels (ratio sqrt 2) + zero and overflow bins; splits by choose_splits (S: meter on / off)")
    print(f"# whole decode call (kernel + fused merge/epilogue), CUDA-graph replay. on: tilt only where the closed"
          f" forms exceed tau = {args.tau} (a gate's question); full: the tilt on every row; page: as on, with"
          f" page-level bins (levels='page'); epi: full minus the same call without the record; tilt: as on with"
          f" tau = {args.tau_tilt}, below every row's TV+ on these witnesses, as tau = 0.1 is on keys with outlier"
          f" channels (bench/TIGHTNESS.md): every row takes the tilt, refined only until tau is settled")


def _shape_row(args, dev, smoke, sms, Hq, B, n, Hkv, D):
    """One table row: the whole decode call for (Hq, B, n), meter on / full / page / off / tilt, SDPA, own kernel."""
    torch.manual_seed(0)
    kv_bytes_i8 = B * n * Hkv * D * 2 + B * n * Hkv * 2 * 2  # codes + fp16 scales
    copies = 1 if smoke else max(1, math.ceil(4 * 60e6 / kv_bytes_i8))  # rotate past the L2
    caches = [fill_cache(B, n, Hkv, D, "int8", dev) for _ in range(copies)]
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), n, device=dev, dtype=torch.int32)

    def one(c, bt, meter, tau=-1.0, epi=True, levels="token"):
        return lambda: decode(c, q, bt, sl, meter=meter, validate=False, tilt_above=tau, epilogue=epi,
                              levels=levels)

    def timed(meter, tau=-1.0, epi=True, cs=None, levels="token"):
        cs = caches if cs is None else cs
        try:
            if smoke:
                return bench(one(*cs[0], meter, tau, epi, levels), smoke)
            return bench(graphed([one(c, bt, meter, tau, epi, levels) for c, bt in cs]), smoke)
        except Exception as exc:  # a variant that fails to build is reported, not fatal
            print(f"# {levels} meter={meter}: {type(exc).__name__}: {exc}"[:300], flush=True)
            return float("nan")

    S = "/".join(str(choose_splits(B, Hkv, caches[0][1].shape[1] * 16, 16, sms, m)) for m in (True, False))
    t_on = timed(True, args.tau)
    t_full = timed(True)
    t_noepi = timed(True, epi=False)
    t_off = timed(False)
    t_page = timed(True, args.tau, levels="page")
    t_tilt = timed(True, args.tau_tilt)
    rec = decode(caches[0][0], q, caches[0][1], sl, meter=True, validate=False,
                 tilt_above=args.tau_tilt).meter
    tilted = float((rec.tilt < 1).double().mean())  # rows that took the tilt at tau_tilt (want 1)
    del caches
    bf = [fill_cache(B, n, Hkv, D, "none", dev) for _ in range(max(1, copies // 2))]
    t_own = timed(False, cs=bf)
    del bf
    t_sdpa = time_sdpa(q, Hkv, n, max(1, copies // 2), smoke)
    bw_off = kv_bytes_i8 / (t_off * 1e-3) / 1e12
    bw_sdpa = (B * n * Hkv * D * 2 * 2) / (t_sdpa * 1e-3) / 1e12
    return (f"{Hq:>3} {B:>3} {n:>7} {S:>8} {t_on:>8.4f} {t_full:>8.4f} {t_page:>8.4f} {t_off:>8.4f} "
            f"{t_on / t_off:>7.3f} {t_full / t_off:>8.3f} {t_page / t_off:>8.3f} {t_tilt:>8.4f} {t_tilt / t_off:>8.3f} {tilted:>6.3f} {t_sdpa:>8.4f} {t_sdpa / t_on:>7.3f} {t_sdpa / t_off:>8.3f} {t_own:>8.4f} "
            f"{t_full - t_noepi:>7.4f} {bw_off:>8.2f} {bw_sdpa:>9.2f}")


def _write_path_and_memory(dev, smoke, Hkv, D):
    """The write path against a plain torch quantize, then the memory per token of each scheme."""
    N = 4096 if not smoke else 32
    c = PagedKV.allocate(math.ceil(N / 16) + 1, Hkv, D, scheme="int8_dither", device=dev)
    k = torch.randn(N, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    pos = torch.arange(N, device=dev)
    table = torch.arange(math.ceil(N / 16), device=dev, dtype=torch.int32)[None]
    seq = torch.zeros(N, device=dev, dtype=torch.long)
    t_w = bench(lambda: write_kv(c, k, v, table, seq, pos), smoke)

    def plain():
        for x in (k, v):
            s = x.float().abs().amax(-1, keepdim=True) / 127
            torch.round(x.float() / s).to(torch.int8)

    t_p = bench(plain, smoke)
    print(f"# write path, {N} tokens x {Hkv} kv heads, int8_dither + witnesses + exact copy: {t_w:.4f} ms; "
          f"plain torch int8 quantize of K and V: {t_p:.4f} ms; ratio {t_w / t_p:.2f}")
    for sch in ("int8_dither", "int8", "fp8_e4m3_scaled", "int4_group", "kivi2"):
        for wb in (2, 1):
            r = bytes_per_token(sch, head_dim=128, num_groups=4, witness_bytes=wb)
            print(f"# memory {sch:<16} witnesses {'fp16' if wb == 2 else 'fp8 '}: {r['total']:.2f} B/token/kv-head, "
                  f"{r['ratio_vs_model_dtype']:.3f}x tokens vs bf16")
    r = bytes_per_token("int8_dither", head_dim=128, num_groups=1, witness_bytes=1)
    print(f"# memory int8_dither G=1 fp8 witnesses: {r['total']:.2f} B, {r['ratio_vs_model_dtype']:.3f}x vs bf16")


def main(argv=None):
    args = _parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke or dev == "cpu"
    Hkv, D = (8, 128) if not smoke else (2, 64)
    heads = [int(x) for x in args.heads.split(",")] if not smoke else [4]
    batches = [int(x) for x in args.batches.split(",")] if not smoke else [1, 2]
    lengths = [int(x) for x in args.lengths.split(",")] if not smoke else [40, 100]
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 4
    evict = set_evict(args.evict)
    _print_header(args, dev, sms, Hkv, D)
    print(evict)
    if args.diag and not smoke:
        diag(32, Hkv, D, dev, sms)
    hdr = (f"{'Hq':>3} {'B':>3} {'n':>7} {'S on/off':>8} {'on ms':>8} {'full ms':>8} {'page ms':>8} {'off ms':>8} {'on/off':>7} "
           f"{'full/off':>8} {'page/off':>8} {'tilt ms':>8} {'tilt/off':>8} {'tilted':>6} "
           f"{'sdpa ms':>8} {'sdpa/on':>7} {'sdpa/off':>8} {'own ms':>8} {'epi ms':>7} {'TB/s off':>8} {'sdpa TB/s':>9}")
    print(hdr)
    rows = []
    for Hq in heads:
        for B in batches:
            for n in lengths:
                row = _shape_row(args, dev, smoke, sms, Hq, B, n, Hkv, D)
                print(row, flush=True)
                rows.append(row)
                if dev == "cuda":
                    torch.cuda.empty_cache()
    # write path vs a plain quantize
    _write_path_and_memory(dev, smoke, Hkv, D)
    return rows


if __name__ == "__main__":
    main()
