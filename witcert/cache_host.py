"""The exact store's host memory of ``WitCertCache`` (``witcert.hostpool``, ``witcert.hostcost``):
``host_bytes`` / ``reserve_host`` (sizing and pinning a request's store ahead of time) and
``HostStores``, the cache's part that picks the pool a layer's stores lease from and reports what
the request cost the host (``WitCertCache._open_stores`` opens them: it reads
``witcert.cache.ExactStore``). Re-exported by ``witcert.cache``."""

from __future__ import annotations

import dataclasses

import torch

from .hostcost import HostReport
from .hostpool import HostPool, store_bytes
from .model import _model_dims


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
