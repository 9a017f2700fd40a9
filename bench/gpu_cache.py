"""WitCertCache on CUDA: the Triton kernel path against the reference path, on a model with
SmolLM2-135M's architecture (30 layers, 9 / 3 heads, head dim 64) in bf16.

The device machine has no copy of the embedded model (the GGUF is larger than what travels),
so the weights are random (seed 0): that exercises every code path and the meter's soundness
(the audit compares against exact attention), not answer quality.

    python3 bench/gpu_cache.py [--tokens 2048] [--new 16]
"""

import argparse
import json
import pathlib
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from witcert.cache import WitCertCache, use_witcert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--paths-only", action="store_true")
    args = ap.parse_args()
    cfg = LlamaConfig.from_dict(json.loads((pathlib.Path(__file__).parent / "smollm2_config.json").read_text()))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    use_witcert(model)
    ids = torch.randint(100, cfg.vocab_size, (1, args.tokens), device="cuda")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; random-weight SmolLM2-135M architecture, bf16, "
          f"{args.tokens}-token prompt, {args.new} new tokens")
    if args.paths_only:
        return cuda_paths(cfg, model, ids[:, :512])
    print(f"{'scheme':<12}{'backend':<10}{'same ids':>9}{'med TV+':>9}{'max TV+':>9}{'ms/token':>9}{'viol':>6}{'ker>=real':>10}")
    for scheme in ("int8", "int8_dither", "fp8_e4m3", "int4_group"):
        res = {}
        for be in ("reference", "kernel"):
            kw = dict(delta_req=1e-3) if scheme == "int8_dither" else {}
            for _ in range(2):  # the second run is timed (the first compiles the kernels)
                c = WitCertCache(cfg, scheme=scheme, backend=be, audit=be == "reference", **kw)
                torch.cuda.synchronize()
                t = time.time()
                with torch.no_grad():
                    out = model.generate(ids, past_key_values=c, max_new_tokens=args.new, do_sample=False,
                                         attention_mask=torch.ones_like(ids), pad_token_id=0)
                torch.cuda.synchronize()
                dt = (time.time() - t) / args.new * 1e3  # whole generate incl. prefill, per new token
            tv = np.stack([r.tv_a for r in c.records])
            res[be] = (out, tv, c)
            viol = sum(r.audit_violations for r in c.records)
            line = f"{scheme:<12}{be:<10}"
            same = torch.equal(res["reference"][0], out) if be == "kernel" else True
            cover = ""
            if be == "kernel":
                real = np.stack([r.tv_real for r in res["reference"][2].records])
                cover = str(bool(np.all(tv >= real - 1e-6)))
            print(line + f"{str(same):>9}{np.median(tv):>9.3f}{tv.max():>9.3f}{dt:>9.1f}{viol if be == 'reference' else '-':>6}{cover:>10}",
                  flush=True)


def cuda_paths(cfg, model, ids):
    """Bit-identity of the off cache against stock sdpa, and a gated kivi2 cache (tau 0, no share
    floor: random weights give near-uniform attention, so no block carries a large share; reference
    path on the GPU, backing store in pinned host memory) with its audit, on CUDA."""
    from witcert.cache import Gate

    kw = dict(max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    use_witcert(model)
    off = WitCertCache(cfg, scheme="none", meter=False)
    with torch.no_grad():
        got = model.generate(ids, past_key_values=off, **kw)
    same = torch.equal(ref.sequences, got.sequences) and all(torch.equal(a, b) for a, b in zip(ref.logits, got.logits))
    print(f"off cache vs stock sdpa on CUDA (bf16): ids and logits bit-identical: {same}")
    g = WitCertCache(cfg, scheme="kivi2", gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=2), audit=True)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=g, use_cache=True)
        store = g.layers[7].exact_k.clone()
        for _ in range(8):  # greedy decode steps over the gated cache
            out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=g, use_cache=True)
    lay = g.layers[7]
    print(f"gated kivi2 on CUDA: page-in blocks {int(g.pagein_blocks.sum())}, bytes {int(g.pagein_bytes.sum())}, "
          f"audit violations {sum(r.audit_violations for r in g.records)}, backing store pinned "
          f"{lay.exact_k.is_pinned()}, unchanged {torch.equal(lay.exact_k[..., :store.shape[-2], :], store)}")


if __name__ == "__main__":
    main()
