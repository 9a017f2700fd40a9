"""Tensor-parallel meters (heads sharded over ranks).

Each rank runs its own ``WitCertCache`` over its shard of the heads (``shard_config``) and
meters those heads; the request-level record (``WitCertCache.summary()``) is reduced across
ranks with ``torch.distributed``: maxima for bounds, sums for flag counts and page-in bytes.

    summary = reduce_summary(cache.summary(), group=None)   # same on every rank

Per-(layer, head, step) quantities that do not reduce by max or sum (the median) are dropped
from the reduced record rather than misreported.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.distributed as dist

MAX_KEYS = ("max_tv_a", "max_out_err", "max_tv_b", "steps", "metered_rows")
#: delta_spent: each rank spends the Tier B budget of its own heads, so the request's total is the sum
SUM_KEYS = ("flagged_rows", "pagein_blocks", "pagein_bytes", "pagein_blocks_per_layer", "pagein_bytes_per_layer",
            "delta_spent")
PASS_KEYS = ("scheme", "tier_b_caveat")
#: gathered as objects into a list, one entry per rank (``host``: each rank's own host cost and pool)
OBJECT_GATHER_KEYS = ("host",)
#: gathered into a list, one entry per rank (each rank draws its own dither seed)
GATHER_KEYS = ("seed",)


def shard_config(config, rank: int, world_size: int):
    """A copy of ``config`` with this rank's share of the query and kv heads."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hq = text.num_attention_heads
    hkv = getattr(text, "num_key_value_heads", None) or hq
    if not (0 <= rank < world_size) or hkv % world_size:
        raise ValueError(f"cannot shard {hkv} kv heads over {world_size} ranks (rank {rank})")
    c = copy.deepcopy(text)
    c.head_dim = getattr(text, "head_dim", None) or text.hidden_size // hq
    c.num_attention_heads = hq // world_size
    c.num_key_value_heads = hkv // world_size
    return c


def reduce_summary(summary: dict, group=None) -> dict:
    """Reduce a ``WitCertCache.summary()`` over the ranks of ``group`` (all ranks must call)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("reduce_summary: torch.distributed is not initialized")
    unknown = set(summary) - set(MAX_KEYS) - set(SUM_KEYS) - set(PASS_KEYS) - set(GATHER_KEYS) - set(OBJECT_GATHER_KEYS) - {"median_tv_a"}
    if unknown:
        raise ValueError(f"reduce_summary: no reduction defined for {sorted(unknown)}")
    out = {k: summary[k] for k in PASS_KEYS if k in summary}
    for keys, op in ((MAX_KEYS, dist.ReduceOp.MAX), (SUM_KEYS, dist.ReduceOp.SUM)):
        for k in keys:
            if k not in summary:
                continue
            a = np.asarray(summary[k])
            t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64 if a.dtype.kind == "f" else np.int64))
            dist.all_reduce(t, op=op, group=group)
            out[k] = t.numpy().astype(a.dtype).reshape(a.shape).tolist()  # (ascontiguousarray makes a 0-d array 1-d)
    for k in GATHER_KEYS:
        if k in summary:
            parts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, torch.tensor([int(summary[k])], dtype=torch.int64), group=group)
            out[k + "s"] = [int(p.item()) for p in parts]
    for k in OBJECT_GATHER_KEYS:
        if k in summary:
            objs = [None] * dist.get_world_size(group)
            dist.all_gather_object(objs, summary[k], group=group)
            out[k + "s"] = objs
    return out
