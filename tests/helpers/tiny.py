"""A tiny random-weight Llama (the SmolLM2 config shrunk: 4 layers, 4 query / 2 kv heads, d=32),
for fast tests of the cache hook, the tracer and the layer sweep."""

from __future__ import annotations

import functools
import json
import pathlib

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "bench" / "smollm2_config.json"


@functools.lru_cache(maxsize=1)
def tiny_model(layers: int = 4):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads(CONFIG.read_text())
    cfg.update(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               hidden_size=128, intermediate_size=256, vocab_size=512, max_position_embeddings=1024)
    for k in ("_model_name_or_path", "architectures", "transformers_version"):
        cfg.pop(k, None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    from witcert.cache import use_witcert

    use_witcert(model)
    return model


def generate(model, cache, n: int = 40, new: int = 4, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 512, (1, n), generator=g)
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              attention_mask=torch.ones_like(ids), pad_token_id=2)


def record_fixture(path, tracer_kwargs=None):
    """Record the fixture trace (tests/data/tiny.trace.jsonl): kivi2 ungated and gated, int8_dither
    with Tier B, audited, 3 decode steps of the tiny model. Returns {config: cache}."""
    from witcert.cache import Gate, WitCertCache
    from witcert.trace import Tracer

    m = tiny_model()
    caches = {}
    with Tracer(path, meta={"model": "tiny random Llama (tests/helpers/tiny.py)"}, **(tracer_kwargs or {})) as tr:
        for name, scheme, gate in (("kivi2", "kivi2", None),
                                   ("kivi2 +gate", "kivi2", Gate("risk-ranked", tau=0.0, max_pagein_blocks=1)),
                                   ("int8_dither", "int8_dither", None)):
            tr.new_request(name)
            c = WitCertCache(m.config, scheme=scheme, gate=gate, audit=True, trace=tr, window=None,
                             delta_req=1e-3 if scheme == "int8_dither" else None)
            generate(m, c, n=40, new=4)
            caches[name] = c
    return caches
