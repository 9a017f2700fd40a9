"""What a request cost the host: the exact store's pinned memory, allocations, copies, host syncs
and fallbacks (issue 38). ``WitCertCache.summary()["host"]`` is ``HostReport.as_dict()``.

Every per-request or per-step cost that stays on the host side of a metered request is counted
here by reason, and the first occurrence of each reason in the process is logged once
(``logging.getLogger("witcert.store")``, INFO): the list of what still forces host work is
``SYNC_REASONS`` (the host waits for the device) and ``FALLBACK_REASONS`` (a slower path was
taken). Allocation on the request path is ``HostCost.host_allocs`` (zero once the pool is
reserved ahead, ``witcert.hostpool``).
"""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger("witcert.store")

#: every reason a request can make the host wait for the device, and what it is
SYNC_REASONS = {
    "read": "a read of the exact store waited for its asynchronous appends (page-in, crop, the reference "
            "path's quantization)",
    "exact_k": "exact_k / exact_v / ExactStore.data read the whole exact store (waits for its appends)",
    "reorder": "beam search reordered the exact store on the host (waits for its appends)",
    "host_write_fence": "a host-side write into pool memory waited for copies still in flight into memory "
                        "another store had given back",
    "graph_capture": "a decode step was captured in a CUDA graph (torch.cuda.synchronize and torch.cuda.graph's "
                     "own synchronize / gc / empty_cache): once per capture, i.e. per request",
    "gate": "a gate read the step's TV+ on the host (one per gated layer step and repair round)",
    "page_in": "a page-in read the block table or the repaired flags on the host",
    "reference_path": "a layer step on the float64 reference path (its meter is computed on the host)",
    "records": "meter records were copied to the host (audit, or a trace sink every step)",
    "new_request_check": "use_witcert's new-request check read the forward's first positions on the host "
                         "(2-D position_ids on a non-empty cache: every decode step of generate)",
    "beam_reorder": "reorder_cache read the beam indices on the host",
    "kivi2_hold": "a block scheme held a new partial page exact (one per layer every 16 tokens)",
}

#: every slower path a request can take instead of the pool's, and what it costs
FALLBACK_REASONS = {
    "per_store_pinned": "the exact store is pinned per store, not leased from the pool (host_pool=False or "
                        "WITCERT_HOST_POOL=off): a cudaHostAlloc per chunk on the request path, freed with the store",
    "host_source": "an append from a host tensor into pool memory: copied on the host, synchronously",
    "pool_gc": "the pool ran the garbage collector on the request path to reclaim a dropped cache's memory",
}

_LOGGED: set = set()


def log_once(key, msg: str, *args) -> None:
    """``log.info(msg, *args)`` the first time ``key`` is seen in this process."""
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info(msg, *args)


def _zeroed(x):
    return type(x)() if isinstance(x, (dict, int, float)) else x


@dataclasses.dataclass
class HostCost:
    """Host-side cost of one cache's current request: plain Python numbers. ``pinned_bytes`` is a
    gauge (what the cache's exact stores hold now); the rest count from the request's start
    (``WitCertCache.reset()`` starts a new one)."""

    pinned_bytes: int = 0  # pool memory (or, without the pool, pinned chunks) the cache's stores hold now
    pinned_peak_bytes: int = 0
    pool_hits: int = 0  # store chunks served from memory the pool already held
    pool_misses: int = 0  # chunks that needed a new slab first
    host_allocs: int = 0  # pinned allocations made on the request path (pool slabs; without the pool: chunks)
    host_alloc_bytes: int = 0
    host_alloc_seconds: float = 0.0
    d2h_copies: int = 0  # device-to-host copies issued by the store's appends
    d2h_bytes: int = 0
    host_copies: int = 0  # appends from host tensors (copied on the host)
    syncs: dict = dataclasses.field(default_factory=dict)  # SYNC_REASONS key → times the host waited
    fallbacks: dict = dataclasses.field(default_factory=dict)  # FALLBACK_REASONS key → times taken
    admitted: bool = False  # the request's store was asked of the pool (witcert.cache: its first layer)

    def sync(self, reason: str, n: int = 1) -> None:
        """Count ``n`` host syncs for ``reason``; the first in the process is logged."""
        self.syncs[reason] = self.syncs.get(reason, 0) + n
        log_once(("sync", reason), "witcert: a request made the host wait for the device: %s (%s). Counted in "
                 "WitCertCache.summary()['host']['syncs'] (logged once per reason).", reason,
                 SYNC_REASONS.get(reason, "unlisted"))

    def fallback(self, reason: str, n: int = 1) -> None:
        """Count ``n`` fallbacks for ``reason``; the first in the process is logged."""
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + n
        log_once(("fallback", reason), "witcert: a request took a slower host path: %s (%s). Counted in "
                 "WitCertCache.summary()['host']['fallbacks'] (logged once per reason).", reason,
                 FALLBACK_REASONS.get(reason, "unlisted"))

    def hold(self, nbytes: int) -> None:
        """The stores now hold ``nbytes`` more (negative: given back)."""
        self.pinned_bytes += int(nbytes)
        self.pinned_peak_bytes = max(self.pinned_peak_bytes, self.pinned_bytes)

    def allocated(self, nbytes: int, seconds: float) -> None:
        """A pinned allocation of ``nbytes`` on the request path."""
        self.host_allocs += 1
        self.host_alloc_bytes += int(nbytes)
        self.host_alloc_seconds += float(seconds)

    def new_request(self) -> None:
        """Zero the per-request counters (the ``pinned_bytes`` gauge stays)."""
        keep = self.pinned_bytes
        for f in dataclasses.fields(self):
            setattr(self, f.name, _zeroed(getattr(self, f.name)) if f.name != "admitted" else False)
        self.pinned_bytes = self.pinned_peak_bytes = keep

    @property
    def sync_total(self) -> int:
        return sum(self.syncs.values())

    @property
    def fallback_total(self) -> int:
        return sum(self.fallbacks.values())

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("admitted")
        d.update(syncs_total=self.sync_total, fallbacks_total=self.fallback_total)
        return d


@dataclasses.dataclass
class HostReport:
    """``WitCertCache.host_report()``: the request's ``HostCost``, where its exact store's memory comes
    from (``mode``: "pool", "per-store pinned" or "plain"), and the pool's state (a
    ``witcert.hostpool.PoolStats``, None without a pool)."""

    cost: HostCost
    mode: str
    pool: object = None

    def as_dict(self) -> dict:
        """Plain Python numbers, strings, dicts (what ``summary()["host"]`` holds)."""
        out = self.cost.as_dict()
        out["mode"] = self.mode
        out["pool"] = None if self.pool is None else dataclasses.asdict(self.pool)
        return out
