"""The ``"witcert"`` attention function of ``WitCertCache`` (``witcert.cache``): it finds the cache whose
layer wrote last on this thread (``witcert.cache_layer._ACTIVE``) and runs the layer's served attention
(``WitCertCache.served_attention``) or the base attention (sdpa / eager); ``register`` puts it in
transformers' registries. ``use_witcert`` (``witcert.cache``) switches a model to it."""

from __future__ import annotations

import math
import sys
from typing import Callable

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

from .cache_layer import _ACTIVE
from .model import _model_dims


def _allowed(mask, Bsz, Lq, n, device) -> torch.Tensor:
    """Boolean [B, 1|H, Lq, n] (True = attend) from an sdpa (bool / None) or eager (additive) mask."""
    if mask is None:
        i = torch.arange(Lq, device=device)[:, None]
        j = torch.arange(n, device=device)[None, :]
        return (j <= i + (n - Lq)).expand(Bsz, 1, Lq, n)
    if mask.dtype == torch.bool:
        m = mask
    else:
        m = mask > torch.finfo(mask.dtype).min / 2
    m = m[..., -n:] if m.shape[-1] >= n else m
    if m.shape[-1] != n or m.shape[-2] != Lq:
        raise ValueError(f"attention mask {tuple(mask.shape)} does not match {Lq} queries over {n} cached tokens")
    return m.expand(Bsz, m.shape[1], Lq, n)


def _make_attention(base: str) -> Callable:
    def witcert_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        ref = getattr(_ACTIVE, "cache", None)
        cache = ref() if ref is not None else None
        layer = cache.layers[module.layer_idx] if cache is not None and module.layer_idx < len(cache.layers) else None
        mode = layer._pending if layer is not None else None
        if layer is not None:
            layer._pending = None
            cfg = getattr(module, "config", None)
            # checked once per model config (not per layer step: ~0.08 ms of Python each)
            if mode is not None and cfg is not None and getattr(cache, "_dims_checked", None) is not cfg:
                if _model_dims(cfg)[1:5] != (cache.num_layers, cache.num_q_heads, cache.num_kv_heads, cache.head_dim):
                    raise ValueError("WitCertCache: this cache was built for a different model")
                cache._dims_checked = cfg
        if mode != "served":
            fn = _base_fn(base, module)
            return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if module.training and dropout:
            raise ValueError("witcert attention is for inference (no dropout)")
        return cache.served_attention(module, query, attention_mask, scaling)

    return witcert_attention


def _base_fn(base: str, module):
    if base == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"{type(module).__name__}: its modeling file has no eager_attention_forward")
    return fn


def register() -> None:
    """Register ``"witcert"`` (sdpa base) and ``"witcert_eager"`` (eager base) with transformers."""
    AttentionInterface.register("witcert", _make_attention("sdpa"))
    AttentionInterface.register("witcert_eager", _make_attention("eager"))
    ALL_MASK_ATTENTION_FUNCTIONS.register("witcert", sdpa_mask)
    ALL_MASK_ATTENTION_FUNCTIONS.register("witcert_eager", eager_mask)


class ServedAttention:
    """``WitCertCache``'s served attention (a mixin): the entry of the attention function above on the
    served path, dispatched to the kernel path (``witcert.cache_kernel``) or the reference path
    (``witcert.cache_reference``), and the page-in accounting both paths' gates call."""

    def served_attention(self, module, query, attention_mask, scaling):
        layer = self.layers[module.layer_idx]
        layer._pending = None  # this layer's forward runs through the meter
        Bsz, Hq, Lq, D = query.shape
        if Hq != self.num_q_heads or D != self.head_dim:
            raise ValueError(f"query [B, {Hq}, L, {D}] does not match the cache's model; a WitCertCache belongs to one model")
        n = layer.k_hat.shape[-2]
        sm = float(scaling) if scaling is not None else 1.0 / math.sqrt(D)
        if layer.paged is not None:
            allowed = None if attention_mask is None else _allowed(attention_mask, Bsz, Lq, layer.get_seq_length(), query.device)
            return self._kernel_attention(layer, query, allowed, sm)
        self.host_cost.sync("reference_path")
        allowed = _allowed(attention_mask, Bsz, Lq, n, query.device)
        GQ = Hq // self.num_kv_heads
        q = query.detach().double().view(Bsz, self.num_kv_heads, GQ, Lq, D)
        al = allowed.view(Bsz, -1, 1, Lq, n) if allowed.shape[1] == 1 else allowed.view(Bsz, self.num_kv_heads, GQ, Lq, n)
        ev = self._evaluate(layer, q, al, sm)
        if self.meter:
            ev = self._meter_and_gate(layer, q, al, sm, ev, query.dtype)
        o = ev["o"].reshape(Bsz, Hq, Lq, D).transpose(1, 2).contiguous()
        return o.to(query.dtype), None

    def _page_in_counted(self, layer, b, h, blk) -> int:
        """``layer.page_in`` with the request's accounting (blocks and bytes per layer and sequence)."""
        self.host_cost.sync("page_in")
        nbytes = layer.page_in(b, h, blk)
        if nbytes:
            self.pagein_blocks[layer.layer_idx, b] += 1
            self.pagein_bytes[layer.layer_idx, b] += nbytes
        return nbytes






