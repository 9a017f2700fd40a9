"""The exact store's host memory of ``WitCertCache`` (``witcert.hostpool``, ``witcert.hostcost``):
``host_bytes`` / ``reserve_host`` (sizing and pinning a request's store ahead of time) and
``HostStores``, the cache's part that opens a layer's stores from the pool and reports what the
request cost the host. Re-exported by ``witcert.cache``."""

from __future__ import annotations

import dataclasses

import torch

from .cache_layer import WitCertLayer
from .hostcost import HostReport
from .hostpool import HostPool, align, store_bytes
from .model import _model_dims
from .store import ExactStore, first_chunk_tokens


def host_bytes(config, batch: int, tokens: int, dtype=torch.bfloat16) -> int:
    """Host pool bytes of one request's exact store (every layer's K and V) for a model of ``config``:
    ``batch`` sequences of ``tokens`` tokens (pass the cache's ``max_tokens``: prompt + new tokens)."""
    _, L, _, Hkv, D, _ = _model_dims(config)
    return store_bytes(L, Hkv, D, batch, tokens, dtype)


def reserve_host(config, batch: int, tokens: int, dtype=torch.bfloat16, pool: HostPool | None = None) -> int:
    """Pin, now, what a request of ``batch`` x ``tokens`` tokens' exact store needs (``host_bytes``) in
    ``pool`` (default: the process-wide ``HostPool``): call it at start-up, off the request path. The bytes
    added (0 when the pool already had them free, or without a pool: ``WITCERT_HOST_POOL=off``)."""
    pool = pool if pool is not None else HostPool.default()
    return 0 if pool is None else pool.reserve(host_bytes(config, batch, tokens, dtype))



class HostStores:
    """``WitCertCache``'s exact stores in host memory (a mixin: reads ``host_pool``, ``host_cost``,
    ``max_tokens``, ``layers``)."""

    def _pool(self, pin: bool) -> HostPool | None:
        """The pool this cache's exact stores lease from (None: per-store memory, plain or pinned)."""
        if self.host_pool is False:
            return None
        if self.host_pool is None:
            return HostPool.default() if pin else None
        return self.host_pool

    def _open_stores(self, key_states: torch.Tensor, pin: bool) -> tuple[ExactStore, ExactStore]:
        """A layer's (K, V) exact stores for a new request. At the request's first store the pool is asked
        for every layer's K and V of this first forward at once (``HostPool.ensure_free``): a cold pool grows
        in a few large slabs, and a budget that cannot hold them is refused (``HostPoolExhausted``) before
        anything is allocated on the device or written."""
        Bsz, H, m, D = key_states.shape
        pool = self._pool(pin)
        expect = self.max_tokens if pool is not None else None
        if pool is not None and not self.host_cost.admitted:
            stores = sum(1 for la in self.layers if isinstance(la, WitCertLayer))
            tokens = first_chunk_tokens(m, expect)
            need = 2 * stores * align(tokens * Bsz * H * D * key_states.element_size())
            pool.ensure_free(need, self.host_cost, f"this request's exact store ({stores} layers x K and V x {tokens} "
                             f"tokens x {Bsz} sequences x {H} kv heads x {D} x {key_states.element_size()} bytes)")
            self.host_cost.admitted = True
        kw = dict(pin=pin, pool=pool if pool is not None else False, cost=self.host_cost, expect=expect)
        return (ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw), ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw))

    def host_report(self) -> HostReport:
        """What the current request cost the host (``HostCost``: pinned bytes held, pool hits / misses,
        allocations on the request path, device-to-host copies, host syncs and fallbacks by reason), where
        its exact store's memory comes from, and the pool's ``PoolStats``."""
        layers = [la for la in self.layers if getattr(la, "is_initialized", False)]
        pin = any(getattr(la, "device", None) is not None and la.device.type == "cuda" for la in layers)
        pool = self._pool(pin)
        mode = "pool" if pool is not None else ("per-store pinned" if pin else "plain")
        return HostReport(cost=dataclasses.replace(self.host_cost, syncs=dict(self.host_cost.syncs),
                                                   fallbacks=dict(self.host_cost.fallbacks)),
                          mode=mode, pool=None if pool is None else pool.stats())
