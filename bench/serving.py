"""End-to-end decode speed of a transformers model (issue 11): stock vs metered, per decode step.

Random weights (the device machine has no model files) of two shapes: SmolLM2-135M (30 layers,
9/3 heads, head dim 64) and Llama-8B (32 layers, 32/8 heads, head dim 128), bf16, batch 1 and 8.

Each configuration prefills the prompt once, then runs a greedy decode loop of ``--new`` steps
(``model(next_token, past_key_values=cache)``), each step timed with CUDA events; the median
step is reported. The first configuration's loop is run twice and only the second counts
(Triton compiles). This replaces the earlier difference of two ``generate`` calls, which was
too noisy to give ratios (bench/SERVING.md).

    python3 bench/serving.py [--prompts 4096,32768] [--new 32] [--shapes smollm2,llama8b]
    python3 bench/serving.py --smoke        # tiny shapes on the CPU (interpreter): checks the script runs

Configurations: stock (sdpa, DynamicCache), with PyTorch's default SDPA backend choice and with its
cuDNN backend off (on the H200 the default picks cuDNN, whose host cost per decode call is ~1.5 ms
for stock's calls: bench/SERVING.md, the retired bench/stock_probe.py); WitCertCache int8 and fp8_e4m3 on the kernel path
(meter on), and int8 with ``cuda_graph=True`` (the decode step captured once and replayed:
``witcert.graphs``); scheme none with the meter off (the pass-through cache); with
``--stock-graphed``, stock with a StaticCache whose decode step is graph-replayed too (the fair
baseline of the graphed column); with ``--gated``, also a
certified gate (τ = ``--gate-tau``, ≤ 2 blocks per step) on int8 (kernel path) and on kivi2 (no
kernel: the float64 reference path), each followed by one audited step (``cache.audit`` on for
one more decode step: the realised TV against exact attention on every row of that step) and
a check that the exact store was not written across that step, its page-ins included (layer 0's
first prompt tokens compared bit for bit; tests/kernels/test_kernel_gate_cache.py checks every page-in).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHAPES = {
    "smollm2": None,  # bench/smollm2_config.json
    "llama8b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=32,
                    intermediate_size=14336, vocab_size=32000, max_position_embeddings=131072, rope_theta=500000.0),
    "tiny": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_hidden_layers=2,
                 intermediate_size=64, vocab_size=256, max_position_embeddings=4096),
}


def build(shape, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    if SHAPES[shape] is None:
        d = json.loads((pathlib.Path(__file__).parent / "smollm2_config.json").read_text())
        d["max_position_embeddings"] = 131072
        cfg = LlamaConfig.from_dict(d)
    else:
        cfg = LlamaConfig(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return cfg, model


class _Timer:
    def __init__(self, device):
        self.cuda = device == "cuda"

    def __enter__(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
        else:
            self.ms = (time.perf_counter() - self.t) * 1e3

    def elapsed(self):
        if self.cuda:
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        return self.ms


@contextlib.contextmanager
def _cudnn_sdp(enabled: bool):
    """PyTorch's cuDNN SDPA backend on or off for the block (restored after)."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def _free(device):
    """Give back the device's cached blocks and PyTorch's cached pinned host blocks (a metered cache's
    exact store is pinned host memory: Llama-8B at B = 8 / 32K holds ~51 GB of it, and two of them
    cached at once exhausted the device machine's 128 GB, run I2)."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()


def decode_steps(model, ids, cache, new, device):
    """Prefill, then ``new`` greedy decode steps; returns the per-step times (ms) and the cache."""
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(new):
            t = _Timer(device)
            with t:
                out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            times.append(t)
        return [t.elapsed() for t in times], cache


def graphed_stock_steps(model, cfg, ids, new, device):
    """Stock transformers with a ``StaticCache``, its decode step captured once in a CUDA graph and
    replayed (what a tuned stock deployment does; transformers' own route is ``torch.compile``):
    per-step times (ms) of ``new`` replays, the same way ``decode_steps`` times a step."""
    import inspect

    from transformers import StaticCache

    B, n = ids.shape
    cache = StaticCache(config=cfg, max_cache_len=n + new + 8)
    cpos = "cache_position" in inspect.signature(model.forward).parameters  # transformers < 5.2x takes it
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                    **({"cache_position": torch.arange(n, device=device)} if cpos else {}))
        graph, s_ids, gout = capture_stock_step(model, cache, out.logits[:, -1:].argmax(-1), n, cpos, device)
        times = []
        for _ in range(new):
            t = _Timer(device)
            with t:
                graph.replay()
            s_ids.copy_(gout.logits[:, -1:].argmax(-1))
            times.append(t)
        return [t.elapsed() for t in times]


def capture_stock_step(model, cache, nxt, n: int, cpos: bool, device: str):
    """Stock's one-token decode step on a ``StaticCache`` holding ``n`` tokens, captured in a CUDA graph after two
    eager steps on a side stream (workspaces, kernels): (graph, its static input ids [B, 1] — ``nxt`` copied,
    its output). A replay decodes ``s_ids`` and advances the static positions by one."""
    B = nxt.shape[0]
    s_ids = nxt.clone()
    s_pos = torch.full((B, 1), n, device=device, dtype=torch.long)
    s_cpos = torch.full((1,), n, device=device, dtype=torch.long)

    def fwd():
        o = model(s_ids, position_ids=s_pos, past_key_values=cache, use_cache=True,
                  **({"cache_position": s_cpos} if cpos else {}))
        s_pos.add_(1)
        s_cpos.add_(1)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            s_ids.copy_(fwd().logits[:, -1:].argmax(-1))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = fwd()
    return graph, s_ids, gout


def audited_step(model, cache, ids, n):
    """One more decode step of a gated cache with ``cache.audit`` on: (page-in blocks of the whole
    run, audit violations of that step, whether layer 0's exact store still holds the prompt's
    keys bit for bit)."""
    lay = cache.layers[0]
    before = lay.exact_k[:, :, : min(n, 256)].clone()
    cache.audit = True
    with torch.no_grad():
        nxt = torch.full((ids.shape[0], 1), 11, dtype=ids.dtype, device=ids.device)
        model(nxt, past_key_values=cache, use_cache=True)
    cache.audit = False
    recs = cache.records
    last = max(r.step for r in recs)
    viol = sum(int(r.audit_violations) for r in recs if r.step == last)
    audited = all(r.tv_real is not None for r in recs if r.step == last)
    if not audited:
        raise RuntimeError("the audited step left a record without the realised TV")
    kept = torch.equal(before, lay.exact_k[:, :, : min(n, 256)])
    return int(cache.pagein_blocks.sum()), viol, kept


def _parse_args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="4096,32768")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--shapes", default="smollm2,llama8b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tau", type=float, default=0.1, help="tilt_above of the metered caches (a gate's tau)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device there is")
    ap.add_argument("--gated", action="store_true", help="add the gated int8 (kernel) and kivi2 columns")
    ap.add_argument("--kivi2-new", type=int, default=4,
                    help="decode steps of the gated kivi2 column (on the float64 reference path a 4K step takes ~3 s)")
    ap.add_argument("--gate-tau", type=float, default=0.1)
    ap.add_argument("--configs", default=None,
                    help="comma list of the configuration keys to run (stock, stock_nocudnn, int8, fp8, int8_graph, none, "
                         "none_nocudnn); the others print nan. Not with --gated")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip each configuration's warm-up run (long prompts: a prefill each; the median step is robust "
                         "to the first step's compiles and capture)")
    ap.add_argument("--fused-tilt", action="store_true",
                    help="the graphed int8 column with defer_tilt=False (each layer's merge runs its tilt; the default "
                         "before run V, bench/RESULTS.md; the default now finishes every layer's tilt in one launch)")
    ap.add_argument("--stock-graphed", action="store_true",
                    help="add stock with a StaticCache, its decode step CUDA-graph replayed (CUDA only)")
    return ap.parse_args(argv)


def _print_header(args, device, dtype):
    """The run's description and the table's head; returns the gated and the graphed column titles ('' when off)."""
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)"
    print(f"# {name}, torch {torch.__version__}; random weights, {dtype}, median decode step over "
          f"{args.new} steps (CUDA events; prefill excluded); metered caches: kernel path, tilt_above = {args.tau}"
          + ("; graphed int8 with defer_tilt=False" if args.fused_tilt else ""))
    gated_cols = " | int8 gated ms | x stock | page-ins | kivi2 gated ms | x stock | page-ins | audit viol. | store kept" \
        if args.gated else ""
    graphed_cols = " | stock graphed ms | int8 graphed / stock graphed" if args.stock_graphed and device == "cuda" else ""
    print("| shape | batch | prompt | stock ms | stock, cuDNN SDPA off ms | int8 metered ms | x stock | x stock w/o cuDNN "
          "| fp8 metered ms | x stock | none/off ms | x stock | none/off, cuDNN off ms | x stock w/o cuDNN "
          "| int8 metered, CUDA graph ms | x stock | x stock w/o cuDNN"
          + gated_cols + graphed_cols + " |")
    print("|---" * (17 + (8 if args.gated else 0) + (2 if graphed_cols else 0)) + "|")
    return gated_cols, graphed_cols


def _configs(args, cfg, n):
    """The (key, attention, cache factory) columns of one (shape, batch, prompt) and the row they fill
    (nan for the columns --configs leaves out)."""
    from transformers import DynamicCache

    from witcert.cache import Gate, WitCertCache

    row = {}
    tau = args.tau
    configs = (
        ("stock", "sdpa", lambda: DynamicCache(config=cfg)),
        ("stock_nocudnn", "sdpa-nocudnn", lambda: DynamicCache(config=cfg)),
        ("int8", "witcert", lambda: WitCertCache(cfg, scheme="int8", backend="kernel", max_tokens=n + 64,
                                                 tilt_above=tau)),
        ("fp8", "witcert", lambda: WitCertCache(cfg, scheme="fp8_e4m3", backend="kernel", max_tokens=n + 64,
                                                tilt_above=tau)),
        ("int8_graph", "witcert", lambda: WitCertCache(cfg, scheme="int8", backend="kernel",
                                                       max_tokens=n + 64, tilt_above=tau, cuda_graph=True,
                                                       defer_tilt=False if args.fused_tilt else None)),
        ("none", "witcert", lambda: WitCertCache(cfg, scheme="none", meter=False)),
        ("none_nocudnn", "witcert-nocudnn", lambda: WitCertCache(cfg, scheme="none", meter=False)),
    )
    if args.gated:
        gate = Gate("certified", tau=args.gate_tau, max_pagein_blocks=2)
        configs += (
            ("int8_gated", "witcert", lambda: WitCertCache(cfg, scheme="int8", gate=gate, tilt_above=tau,
                                                           max_tokens=n + 64)),
            ("kivi2_gated", "witcert", lambda: WitCertCache(cfg, scheme="kivi2", gate=gate)),
        )
    if args.configs:
        if args.gated:
            raise SystemExit("--configs: not with --gated")
        keep = set(args.configs.split(","))
        configs = tuple(c for c in configs if c[0] in keep)
        row = {c: float("nan") for c in ("stock", "stock_nocudnn", "int8", "fp8", "int8_graph", "none",
                                         "none_nocudnn")}
    return configs, row


def _run_configs(args, model, ids, configs, row, device, shape, Bsz, n):
    """Time every column into ``row``; returns the gated columns' audited steps."""
    from witcert.cache import use_witcert

    extra = {}
    for i, (key, attn, make) in enumerate(configs):
        if attn.startswith("sdpa"):
            model.set_attn_implementation("sdpa")
        else:
            use_witcert(model)
        # stock_nocudnn: the same stock model with PyTorch's cuDNN SDPA backend off (the retired bench/stock_probe.py:
        # on the H200 the cuDNN backend costs ~1.5 ms of host time per stock decode call)
        with _cudnn_sdp(not attn.endswith("-nocudnn")):
            new = args.kivi2_new if key == "kivi2_gated" else args.new
            if not args.no_warm:
                decode_steps(model, ids, make(), min(4, new), device)  # warmed (compiles, allocator, clocks)
            times, cache = decode_steps(model, ids, make(), new, device)
        row[key] = statistics.median(times)
        print(f"# {shape} B {Bsz} n {n} {key}: {row[key]:.2f} ms per step", flush=True)
        if key in ("int8", "fp8", "int8_graph"):
            recs = cache.records
            assert recs and max(float(r.tv_a.max()) for r in recs) <= 1.0
        if key.endswith("_gated"):
            extra[key] = audited_step(model, cache, ids, n)
        del cache
        _free(device)
    return extra


def _run_stock_graphed(args, model, cfg, ids, row, device):
    try:
        if not args.no_warm:
            graphed_stock_steps(model, cfg, ids, min(4, args.new), device)  # warmed
        row["stock_graph"] = statistics.median(graphed_stock_steps(model, cfg, ids, args.new, device))
    except Exception as e:  # noqa: BLE001 — reported in the table, not fatal to the run
        print(f"# stock graphed failed: {type(e).__name__}: {e}", flush=True)
        row["stock_graph"] = float("nan")
    torch.cuda.empty_cache()


def _print_row(args, row, extra, graphed_cols, shape, Bsz, n):
    s0, s1 = row["stock"], row["stock_nocudnn"]
    print(f"| {shape} | {Bsz} | {n} | {s0:.2f} | {s1:.2f} | {row['int8']:.2f} | {row['int8'] / s0:.2f} | "
          f"{row['int8'] / s1:.2f} | {row['fp8']:.2f} | "
          f"{row['fp8'] / s0:.2f} | {row['none']:.2f} | {row['none'] / s0:.2f} | {row['none_nocudnn']:.2f} | "
          f"{row['none_nocudnn'] / s1:.2f} | {row['int8_graph']:.2f} | {row['int8_graph'] / s0:.2f} | "
          f"{row['int8_graph'] / s1:.2f}"
          + ("".join(f" | {row[k]:.2f} | {row[k] / s0:.2f} | {extra[k][0]}" for k in ("int8_gated", "kivi2_gated"))
             + f" | {extra['int8_gated'][1] + extra['kivi2_gated'][1]} | "
             f"{'yes' if extra['int8_gated'][2] and extra['kivi2_gated'][2] else 'NO'}"
             if args.gated else "")
          + (f" | {row['stock_graph']:.2f} | {row['int8_graph'] / row['stock_graph']:.2f}" if graphed_cols else "")
          + " |", flush=True)


def main(argv=None):
    args = _parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke or device == "cpu":
        args.shapes, args.prompts, args.new, args.batches = "tiny", "40", 3, "1,2"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gated_cols, graphed_cols = _print_header(args, device, dtype)
    for shape in args.shapes.split(","):
        cfg, model = build(shape, device, dtype)
        for Bsz in map(int, args.batches.split(",")):
            for n in map(int, args.prompts.split(",")):
                ids = torch.randint(10, cfg.vocab_size, (Bsz, n), device=device)
                configs, row = _configs(args, cfg, n)
                extra = _run_configs(args, model, ids, configs, row, device, shape, Bsz, n)
                if graphed_cols:
                    _run_stock_graphed(args, model, cfg, ids, row, device)
                _print_row(args, row, extra, graphed_cols, shape, Bsz, n)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
