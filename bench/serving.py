"""End-to-end decode speed with transformers' own ``generate`` (issue 11), on a CUDA GPU.

Random weights (the device machine has no model files) of two shapes: SmolLM2-135M (30 layers,
9/3 heads, head dim 64) and Llama-8B (32 layers, 32/8 heads, head dim 128), bf16, batch 1.
Decode ms per token = (time of generate with N+1 new tokens − time with 1) / N, so prefill is
excluded; each configuration is run once untimed first (Triton compiles), then twice, and the
smaller value is reported.

    python3 bench/serving.py [--prompts 4096,32768] [--new 32] [--shapes smollm2,llama8b]

Configurations: stock (sdpa, DynamicCache); WitCertCache int8 and fp8_e4m3 on the kernel path
(meter on); scheme none with the meter off (the pass-through cache).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = {
    "smollm2": None,  # bench/smollm2_config.json
    "llama8b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=32,
                    intermediate_size=14336, vocab_size=32000, max_position_embeddings=131072, rope_theta=500000.0),
}


def build(shape):
    from transformers import LlamaConfig, LlamaForCausalLM

    if SHAPES[shape] is None:
        d = json.loads((pathlib.Path(__file__).parent / "smollm2_config.json").read_text())
        d["max_position_embeddings"] = 131072
        cfg = LlamaConfig.from_dict(d)
    else:
        cfg = LlamaConfig(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return cfg, model


def timed_generate(model, ids, cache_fn, new):
    cache = cache_fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t, cache


def main(argv=None):
    from witcert.cache import WitCertCache, use_witcert

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="4096,32768")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--shapes", default="smollm2,llama8b")
    args = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; random weights, bf16, batch 1, "
          f"decode ms/token over {args.new} tokens (prefill excluded)")
    print("| shape | prompt | stock ms | int8 metered ms | x stock | fp8 metered ms | x stock | none/off ms | x stock |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        cfg, model = build(shape)
        for n in map(int, args.prompts.split(",")):
            ids = torch.randint(100, cfg.vocab_size, (1, n), device="cuda")
            row = {}
            for name, attn, fn in (
                ("none", "witcert", lambda: WitCertCache(cfg, scheme="none", meter=False)),
                ("stock", "sdpa", lambda: None),
                ("int8", "witcert", lambda: WitCertCache(cfg, scheme="int8", backend="kernel", max_tokens=n + 64)),
                ("fp8", "witcert", lambda: WitCertCache(cfg, scheme="fp8_e4m3", backend="kernel", max_tokens=n + 64)),
            ):
                if attn == "sdpa":
                    model.set_attn_implementation("sdpa")
                else:
                    use_witcert(model)
                timed_generate(model, ids, fn, 2)  # warm: compile
                best = float("inf")
                for _ in range(2):  # the smaller of two measurements (clock ramps, allocator warm-up)
                    t1, _ = timed_generate(model, ids, fn, 1)
                    tn, cache = timed_generate(model, ids, fn, args.new + 1)
                    best = min(best, (tn - t1) / args.new * 1e3)
                row[name] = best
                if cache is not None and name in ("int8", "fp8"):
                    recs = cache.records
                    assert recs and max(float(r.tv_a.max()) for r in recs) <= 1.0
                del cache
                torch.cuda.empty_cache()
            s = row["stock"]
            print(f"| {shape} | {n} | {s:.1f} | {row['int8']:.1f} | {row['int8'] / s:.2f} | {row['fp8']:.1f} | "
                  f"{row['fp8'] / s:.2f} | {row['none']:.1f} | {row['none'] / s:.2f} |", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
