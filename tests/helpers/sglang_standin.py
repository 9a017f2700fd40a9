"""A stand-in for SGLang's ``MHATokenToKVPool`` on the page-size-1 path (``StandInPool``: [slot, head, dim]
buffers, the write divides by the scale in place, casts and stores at ``loc``, as SGLang's does) and the same
pool with WitCert's recorder around its write (``MeteredStandInPool``), for the SGLang tests that need no real
pool module (``tests/integrations/test_sglang.py`` on the CPU, ``test_sglang_graphs.py`` on CUDA). The real
pool classes are ``tests/helpers/sglang_pool.py``'s."""

import torch

import witcert.integrations.sglang as ws


class Layer:
    def __init__(self, layer_id):
        self.layer_id = layer_id


class StandInPool:
    """MHATokenToKVPool's page-size-1 write on ``layers`` pairs of [size, heads, dim] buffers on ``device``."""

    def __init__(self, dtype, size, heads, dim, layers=1, device="cpu"):
        self.dtype, self.start_layer = dtype, 0
        self.k_buffer = [torch.zeros(size, heads, dim, dtype=dtype, device=device) for _ in range(layers)]
        self.v_buffer = [torch.zeros(size, heads, dim, dtype=dtype, device=device) for _ in range(layers)]

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None, layer_id_override=None,
                      dcp_kv_mask=None):
        if cache_k.dtype != self.dtype:
            if k_scale is not None:
                cache_k.div_(k_scale)
            if v_scale is not None:
                cache_v.div_(v_scale)
            cache_k, cache_v = cache_k.to(self.dtype), cache_v.to(self.dtype)
        self.k_buffer[layer.layer_id][loc_info] = cache_k
        self.v_buffer[layer.layer_id][loc_info] = cache_v


class MeteredStandInPool(StandInPool):
    """The stand-in with ``ws.wrap_set_kv_buffer`` around its write (what ``install()`` does to SGLang's class)."""


MeteredStandInPool.set_kv_buffer = ws.wrap_set_kv_buffer(StandInPool.set_kv_buffer)
