"""Issue 38: time to first token, decode step and host cost of a graphed metered WitCertCache against stock
transformers, Llama-8B shapes (random weights, bf16), B in {1, 8, 32} x prompt {4K, 32K}, one process.

    python3 bench/serving_host.py --out "$OUT"     # on the H200: writes $OUT/serving_host.md and .json (< 9 min)
    python3 bench/serving_host.py --smoke          # tiny shapes on the CPU (interpreter): checks the script runs

Per cell (B, prompt) and column, one request: a prefill of the prompt (time to first token: CUDA events
around the prefill forward and its argmax, so a host stall inside it counts), then ``--warm`` decode steps
untimed (a capture) and ``--steps`` decode steps, each timed with CUDA events (median reported). Columns:

* stock eager: transformers' DynamicCache, sdpa, no graphs;
* stock graphed: a StaticCache, its decode step captured in a CUDA graph and replayed;
* WitCert graphed metered: ``WitCertCache(scheme="int8", backend="kernel", cuda_graph=True)``, its exact
  store in the process's ``witcert.hostpool.HostPool``, reserved once before the first cell (the time
  that takes is in the header: off the request path);
* with ``--ab BxN``: the same WitCert request with the pool off (``host_pool=False``: per-store pinned
  chunks, the path of the issue's profile), last, after the pool's slabs are given back.

The host table has, per WitCert request, what PyTorch's pinned allocator did during it
(``torch.cuda.host_memory_stats``: cudaHostAlloc / cudaFreeHost calls and seconds) and the cache's own
counters (``WitCertCache.host_report()``: allocations on the request path, pool hits / misses, host
syncs and fallbacks by reason, device-to-host copies). Cells that cannot fit (stock's bf16 KV on the GPU,
the exact store in the pool's budget) are skipped by arithmetic and say why; ``--time-limit`` skips what
is left once the run has taken that long.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import os
import pathlib
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from serving import _Timer, build, capture_stock_step  # noqa: E402  (bench/serving.py: shapes, timer, stock graph)
from transformers import DynamicCache, StaticCache  # noqa: E402

from witcert.cache import WitCertCache, host_bytes, reserve_host, use_witcert  # noqa: E402
from witcert.hostpool import HostPool, fmt_bytes  # noqa: E402

GiB = 1 << 30
#: the static cache / WitCert capacity past prompt + decode steps
SLACK_TOKENS = 8
#: the fraction of the GPU a cell's estimate may take before it is skipped
GPU_FRACTION = 0.9
#: untimed short request per column and batch before the cells (Triton compiles, cuBLAS workspaces)
WARMUP_TOKENS = 256
PINNED_KEYS = ("num_host_alloc", "host_alloc_time.total", "num_host_free", "host_free_time.total")


@dataclasses.dataclass
class Run:
    """One request of one column: time to first token and decode steps (ms), and its host cost."""

    ttft_ms: float = float("nan")
    step_ms: float = float("nan")
    note: str = ""
    pinned: dict = dataclasses.field(default_factory=dict)  # PyTorch's pinned allocator during the request
    host: dict | None = None  # WitCertCache.host_report().as_dict()


def pinned_stats() -> dict:
    """cudaHostAlloc / cudaFreeHost calls and seconds so far (PyTorch's pinned allocator), and its bytes."""
    if not torch.cuda.is_available():
        return {}
    s = torch.cuda.host_memory_stats()
    out = {k: s.get(k, 0) for k in PINNED_KEYS}
    out["bytes"] = s.get("allocated_bytes.current", 0)
    return out


def pinned_delta(a: dict, b: dict) -> dict:
    d = {k: b.get(k, 0) - a.get(k, 0) for k in PINNED_KEYS}
    d["host_alloc_s"] = d.pop("host_alloc_time.total") / 1e6  # microseconds
    d["host_free_s"] = d.pop("host_free_time.total") / 1e6
    d["bytes_after"] = b.get("bytes", 0)
    return d


def free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def request(model, ids, cache, steps: int, warm: int, device: str, stock_graph: bool = False) -> Run:
    """Prefill (timed: TTFT), ``warm`` untimed decode steps, ``steps`` timed ones (median)."""
    B, n = ids.shape
    before = pinned_stats()
    cpos = "cache_position" in inspect.signature(model.forward).parameters
    with torch.no_grad():
        t = _Timer(device)
        with t:
            kw = {"cache_position": torch.arange(n, device=device)} if (stock_graph and cpos) else {}
            out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **kw)
            nxt = out.logits[:, -1:].argmax(-1)
        ttft = t.elapsed()
        step = graphed_stock(model, cache, nxt, n, cpos, device) if stock_graph else \
            (lambda x: model(x, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1))
        times = []
        for i in range(warm + steps):
            t = _Timer(device)
            with t:
                nxt = step(nxt)
            if i >= warm:
                times.append(t)
        ms = statistics.median(x.elapsed() for x in times)
    return Run(ttft, ms, pinned=pinned_delta(before, pinned_stats()))


def graphed_stock(model, cache, nxt, n: int, cpos: bool, device: str):
    """Stock's decode step on a StaticCache captured in a CUDA graph (bench/serving.py's ``capture_stock_step``);
    a step function replaying it."""
    graph, s_ids, gout = capture_stock_step(model, cache, nxt, n, cpos, device)

    def step(_):
        graph.replay()
        s_ids.copy_(gout.logits[:, -1:].argmax(-1))
        return s_ids

    return step


def stock_gpu_bytes(cfg, model_bytes: int, B: int, tokens: int) -> int:
    """Model + bf16 K/V + the prefill's largest activations (an estimate for skipping, not a measurement)."""
    L, Hkv, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    kv = 2 * L * B * tokens * Hkv * D * 2
    act = B * tokens * (3 * cfg.intermediate_size + 4 * cfg.hidden_size) * 2
    return model_bytes + kv + act


def _parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompts", default="4096,32768")
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per request")
    ap.add_argument("--warm", type=int, default=2, help="untimed decode steps first (a graph capture)")
    ap.add_argument("--tilt-above", type=float, default=0.1, help="WitCertCache(tilt_above=...), as bench/serving.py")
    ap.add_argument("--ab", default="8x32768", help="cells BxN that also run WitCert with the pool off ('' for none)")
    ap.add_argument("--pool-budget", default=None, help="HostPool budget (default: WITCERT_HOST_POOL_BYTES or half "
                                                         "of MemAvailable)")
    ap.add_argument("--no-reserve", action="store_true", help="a cold pool: the first request pins on its path")
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds; later columns are skipped after it")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    return ap.parse_args(argv)


def _reserve(args, cfg, cells, cap, dtype, pool):
    """Reserve the largest fitting request's exact store in the pool before the first cell (off the request
    path); returns (bytes reserved, seconds)."""
    fits = [(B, n) for B, n in cells if host_bytes(cfg, B, cap(n), dtype) <= pool.budget]
    reserve_s, reserved = 0.0, 0
    if fits and not args.no_reserve:  # the largest request's exact store: every smaller one reuses it
        B, n = max(fits, key=lambda c: host_bytes(cfg, c[0], cap(c[1]), dtype))
        t0 = time.perf_counter()
        reserved = reserve_host(cfg, B, cap(n), dtype, pool=pool)
        reserve_s = time.perf_counter() - t0
    return reserved, reserve_s


def main(argv=None) -> int:
    args = _parse_args(argv)
    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = "llama8b"
    if args.smoke or device == "cpu":
        shape, args.batches, args.prompts, args.steps, args.ab = "tiny", "1,2", "40", 3, "2x40"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cells = [(B, n) for n in map(int, args.prompts.split(",")) for B in map(int, args.batches.split(","))]
    ab = {tuple(map(int, c.split("x"))) for c in args.ab.split(",") if c}
    cfg, model = build(shape, device, dtype)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gpu_total = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else float("inf")
    pool = HostPool.configure(budget_bytes=args.pool_budget) if device == "cuda" else HostPool(args.pool_budget, pin=False)
    cap = lambda n: n + args.warm + args.steps + SLACK_TOKENS  # noqa: E731
    reserved, reserve_s = _reserve(args, cfg, cells, cap, dtype, pool)

    def witcert(host_pool):
        def make(n):
            return WitCertCache(cfg, scheme="int8", backend="kernel", max_tokens=cap(n), cuda_graph=True,
                                tilt_above=args.tilt_above, host_pool=host_pool)
        return make

    columns = {
        "stock eager": ("sdpa", lambda n: DynamicCache(config=cfg), False),
        "stock graphed": ("sdpa", lambda n: StaticCache(config=cfg, max_cache_len=cap(n)), True),
        "WitCert graphed metered": ("witcert", witcert(pool), False),
    }
    if device != "cuda":
        columns.pop("stock graphed")
    results: dict = {}

    def run(col, B, n, attn, make, stock_graph):
        if time.perf_counter() - t_start > args.time_limit:
            return Run(note=f"skipped: past --time-limit {args.time_limit:.0f} s")
        store = host_bytes(cfg, B, cap(n), dtype)
        if attn == "sdpa":
            model.set_attn_implementation("sdpa")
            if stock_gpu_bytes(cfg, model_bytes, B, cap(n)) > GPU_FRACTION * gpu_total:
                return Run(note=f"skipped: ~{stock_gpu_bytes(cfg, model_bytes, B, cap(n)) / GiB:.0f} GiB > the GPU")
        else:
            use_witcert(model)
            if store > pool.budget:  # (the request would be refused: HostPoolExhausted before any write)
                return Run(note=f"skipped: exact store {fmt_bytes(store)} > the pool budget {fmt_bytes(pool.budget)}")
        ids = torch.randint(10, cfg.vocab_size, (B, n), device=device)
        cache = make(n)
        try:
            r = request(model, ids, cache, args.steps, args.warm, device, stock_graph)
        except Exception as e:  # noqa: BLE001 — an out-of-memory, a refusal, any failure: in the table, not fatal
            traceback.print_exc()
            r = Run(note=f"{type(e).__name__}: {str(e)[:160]}".replace("|", "/").replace("\n", " "))
        if isinstance(cache, WitCertCache) and not r.note:
            r.host = cache.host_report().as_dict()  # before records are read (that read is not the request's)
            assert max(float(x.tv_a.max()) for x in cache.records) <= 1.0
        del cache
        free(device)
        print(f"# B {B} n {n} {col}: TTFT {r.ttft_ms:.1f} ms, step {r.step_ms:.2f} ms {r.note}", flush=True)
        return r

    warm_n = min(WARMUP_TOKENS, min(n for _, n in cells))
    for B in sorted({B for B, _ in cells}):  # warm-up: compiles and workspaces, per column and batch
        for col, (attn, make, sg) in columns.items():
            run(col, B, warm_n, attn, make, sg)
    off = "WitCert graphed metered, pool off"

    def report(final: bool) -> None:  # after every cell: a run killed by a timeout still leaves its table
        write(args, cfg, device, cells, ab, columns, off, results, reserved, reserve_s, pool,
              time.perf_counter() - t_start, final)

    for B, n in cells:
        for col, (attn, make, sg) in columns.items():
            results[(B, n, col)] = run(col, B, n, attn, make, sg)
        report(False)
    if ab:
        pool.trim()  # the pool's slabs back to the host before the per-store path pins its own
        for B, n in sorted(ab):
            results[(B, n, off)] = run(off, B, n, "witcert", witcert(False), False)
    report(True)
    return 0


def _cell(r: Run | None, key: str) -> str:
    if r is None:
        return "–"
    if r.note:
        return r.note if key == "ttft_ms" else "–"
    return f"{getattr(r, key):.1f}" if key == "ttft_ms" else f"{getattr(r, key):.2f}"


def write(args, cfg, device, cells, ab, columns, off, results, reserved, reserve_s, pool, wall, final) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter, --smoke)"
    cols = list(columns) + ([off] if ab else [])
    lines = [f"# bench/serving_host.py — {name}, torch {torch.__version__}, {cfg.num_hidden_layers} layers "
             f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads d {cfg.head_dim}, random weights",
             "", f"Time to first token (prefill + argmax) and median decode step of {args.steps} (after {args.warm} "
             f"untimed), CUDA events, ms. Host pool: budget {fmt_bytes(pool.budget)}, reserved "
             f"{fmt_bytes(reserved)} before the first cell in {reserve_s:.2f} s (off the request path). "
             f"{'Whole run' if final else 'Partial: so far'}: {wall:.0f} s.", "",
             "| B | prompt | " + " | ".join(f"{c} TTFT | {c} ms/step" for c in cols) + " | WitCert / stock graphed step |",
             "|---" * (2 + 2 * len(cols) + 1) + "|"]
    for B, n in cells:
        rs = [results.get((B, n, c)) for c in cols]
        w, s = results.get((B, n, "WitCert graphed metered")), results.get((B, n, "stock graphed"))
        ratio = f"{w.step_ms / s.step_ms:.2f}" if w and s and not (w.note or s.note) else "–"
        lines.append(f"| {B} | {n} | " + " | ".join(f"{_cell(r, 'ttft_ms')} | {_cell(r, 'step_ms')}" for r in rs)
                     + f" | {ratio} |")
    lines += ["", "Host cost of each WitCert request: PyTorch's pinned allocator during the request "
              "(cudaHostAlloc / cudaFreeHost calls, s) and WitCertCache.host_report() (allocations on the request "
              "path, pool hits / misses, pinned bytes the store holds, host syncs and fallbacks by reason, "
              "device-to-host copies).", "",
              "| B | prompt | column | cudaHostAlloc | s | cudaFreeHost | s | request allocs | pool hits / misses "
              "| store pinned | syncs | fallbacks | D2H copies | D2H GiB |", "|---" * 14 + "|"]
    for (B, n, col), r in results.items():
        if not col.startswith("WitCert") or r.note or r.host is None:
            continue
        p, h = r.pinned, r.host
        lines.append(f"| {B} | {n} | {col} | {p.get('num_host_alloc', '–')} | {p.get('host_alloc_s', 0):.2f} | "
                     f"{p.get('num_host_free', '–')} | {p.get('host_free_s', 0):.2f} | {h['host_allocs']} | "
                     f"{h['pool_hits']} / {h['pool_misses']} | {fmt_bytes(h['pinned_bytes'])} | "
                     f"{json.dumps(h['syncs'], sort_keys=True)} | {json.dumps(h['fallbacks'], sort_keys=True)} | "
                     f"{h['d2h_copies']} | {h['d2h_bytes'] / GiB:.2f} |")
    text = "\n".join(lines) + "\n"
    if final:
        print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving_host.md").write_text(text)
    raw = {f"{B}x{n} {c}": dataclasses.asdict(r) for (B, n, c), r in results.items()}
    raw["_pool"] = dataclasses.asdict(pool.stats())
    (out / "serving_host.json").write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
