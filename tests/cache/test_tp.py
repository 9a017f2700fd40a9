"""Tensor-parallel meters: 2 CPU processes (gloo), each metering half of the heads, reduce to
the same request record as one process metering all heads."""

import os
import pickle
import socket
import types

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402

from witcert.cache import Gate, WitCertCache  # noqa: E402
from witcert.tp import reduce_summary, shard_config  # noqa: E402

CFG = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=2,
           intermediate_size=64, vocab_size=32)


def _run(config, heads, kv_heads):
    """Prefill 40 tokens, then 3 metered, gated decode steps on fixed random q, k, v."""
    g = torch.Generator().manual_seed(1)
    L, B, n0, D = 2, 2, 40, 64
    k = torch.randn(L, B, 2, n0 + 3, D, generator=g)
    k[..., 5, :] *= 6.0  # a high-attention token
    v = torch.randn(L, B, 2, n0 + 3, D, generator=g)
    q = torch.randn(L, B, 4, 3, D, generator=g) * 2.0
    cache = WitCertCache(config, scheme="kivi2", gate=Gate("risk-ranked", max_pagein_blocks=1), window=None)
    # (window=None: spawned ranks do not see conftest)
    for step in range(4):
        sl = slice(0, n0) if step == 0 else slice(n0 + step - 1, n0 + step)
        for layer in range(L):
            cache.update(k[layer][:, kv_heads, sl], v[layer][:, kv_heads, sl], layer)
            if step:
                mod = types.SimpleNamespace(layer_idx=layer)
                cache.served_attention(mod, q[layer][:, heads, step - 1 : step], None, 0.125)
    return cache.summary()


def _worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = shard_config(LlamaConfig(**CFG), rank, world)
        red = reduce_summary(_run(cfg, [2 * rank, 2 * rank + 1], [rank]))
        if rank == 0:
            with open(out, "wb") as f:
                pickle.dump(red, f)
    finally:
        torch.distributed.destroy_process_group()


def test_two_rank_reduction_matches_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "reduced.pkl"
    mp.start_processes(_worker, args=(2, port, str(out)), nprocs=2, join=True, start_method="spawn")
    red = pickle.loads(out.read_bytes())
    full = _run(LlamaConfig(**CFG), [0, 1, 2, 3], [0, 1])
    assert np.sum(full["pagein_blocks"]) > 0  # the gate did something to reduce
    np.testing.assert_allclose(red["max_tv_a"], full["max_tv_a"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(red["max_out_err"], full["max_out_err"], rtol=1e-12, atol=0)
    for k in ("pagein_blocks", "pagein_bytes", "pagein_blocks_per_layer", "flagged_rows"):
        np.testing.assert_array_equal(red[k], full[k])
    assert red["steps"] == full["steps"] == 3 and "median_tv_a" not in red
    assert red["metered_rows"] == full["metered_rows"] == 3 and len(red["seeds"]) == 2
    assert len(red["hosts"]) == 2 and all(h["host_allocs"] >= 0 for h in red["hosts"])


def test_reduce_needs_an_initialized_group():
    with pytest.raises(RuntimeError, match="not initialized"):
        reduce_summary({"max_tv_a": np.zeros(1)})
    with pytest.raises(ValueError, match="shard"):
        shard_config(LlamaConfig(**CFG), 0, 4)
