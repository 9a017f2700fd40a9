"""Capture once (issue 35): the kernel path's device storage of a graphed cache, and the decode step captured
on it, kept when the cache is done and handed to the next request of the same shape.

A captured CUDA graph reads fixed addresses: every layer's paged K / V (codes, scales, witnesses, sketch,
channel weights), its block table and exact-window rings, and the step's static buffers
(``witcert.graphs.StaticStep``). A ``WitCertCache(cuda_graph=True)`` therefore takes its layers' storage from
this pool when a free one of its shape is there (``take``), and gives it back when it is freed or reset
(``give``): the next request of that shape adopts the same tensors, so the graph captured by an earlier
request replays as it is — no capture on its path. A storage is one request's at a time.

Shape (``storage_key``): the model's layers, kv heads, head dim, dtype and device, the batch, the pages per
sequence (the capacity), the block size, the scheme, the sketch width, the key levels (one per token or per
(token, head): ``sketch_box``, which the storage's ``PagedKV.head_levels`` fixes; until 2026-12-07 a request asking
for the other form replayed the earlier one's), the exact window, the channel weights (by value) and, for a
position-keyed (dithered) scheme, the dither seed, which the kernels take as a launch argument (a graph replays the
seed it captured: a new seed takes a new storage, so dithered caches with fresh seeds do not reuse).

Why reusing the tensors is sound: every field of a token the kernels read (codes, scales, witnesses, norms,
the sketch; a ring column of the window) is written by this request's write before any decode reads it —
the decode reads the first ``len`` tokens of each sequence and the window columns of those tokens only —
so what an earlier request left in the tensors is never read (``tests/cache/test_graphs.py``: a request on
an adopted storage returns the tokens and records of one on fresh storage, bit for bit).

Memory: a free storage keeps its GPU memory (it is the point: allocation and capture are off the next
request's path). At most ``MAX_FREE`` free storages are kept, least recently used dropped first;
``clear()`` drops them all.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import threading

import numpy as np

from contract.schemes import SCHEMES

log = logging.getLogger("witcert.graphs")

#: free storages kept for later requests (each holds a whole cache's paged K / V on the GPU)
MAX_FREE = 2


@dataclasses.dataclass(eq=False)
class Storage:
    """One cache's kernel-path device tensors and the step captured on them."""

    key: tuple
    layers: list  # per layer: (paged, block_table, window rings) or None until that layer allocated
    graph: object = None  # witcert.graphs._Graph captured on these tensors (None: not yet)
    requests: int = 0  # requests that used it

    def complete(self, layers) -> bool:
        """Whether every layer's current tensors are this storage's (a grown, reordered or partly initialised
        cache's are not)."""
        return len(self.layers) == len(layers) and all(
            s is not None and s[0] is la.paged and s[1] is la.block_table and s[2] is la.win
            for s, la in zip(self.layers, layers))


@dataclasses.dataclass
class PoolStats:
    free: int
    takes: int  # storages handed to a request that an earlier request allocated
    fresh: int  # storages allocated (no free one of the request's shape)
    evicted: int  # free storages dropped past MAX_FREE
    replays_of_earlier_captures: int  # requests whose first graphed step replayed an earlier request's capture


class StaticPool:
    def __init__(self, max_free: int = MAX_FREE):
        self.max_free = max_free
        self._free: collections.OrderedDict = collections.OrderedDict()  # id → Storage, least recent first
        self._lock = threading.Lock()
        self.takes = self.fresh = self.evicted = self.reused_captures = 0

    def take(self, key: tuple) -> Storage:
        """A free storage of shape ``key`` (the most recently given back), else a new empty one."""
        with self._lock:
            for sid in reversed(self._free):
                if self._free[sid].key == key:
                    st = self._free.pop(sid)
                    self.takes += 1
                    st.requests += 1
                    log.info("WitCertCache(cuda_graph=True): device storage%s of an earlier request reused",
                             " and its captured decode step" if st.graph is not None else "")
                    return st
            self.fresh += 1
        return Storage(key, [None] * key[0], requests=1)

    def give(self, st: Storage | None) -> None:
        """Back to the free list (a complete storage only: a partial one is dropped)."""
        if st is None or any(s is None for s in st.layers):
            return
        with self._lock:
            self._free[id(st)] = st
            while len(self._free) > self.max_free:
                self._free.popitem(last=False)
                self.evicted += 1

    def clear(self) -> None:
        """Drop every free storage (their GPU memory goes back to PyTorch's allocator)."""
        with self._lock:
            self._free.clear()

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(free=len(self._free), takes=self.takes, fresh=self.fresh, evicted=self.evicted,
                             replays_of_earlier_captures=self.reused_captures)


#: the process's pool
POOL = StaticPool()


def storage_key(cache, batch: int, pages: int, dtype, device) -> tuple:
    """The shape a storage must have to serve ``cache``'s request (module doc)."""
    w = cache.weights
    wkey = None if w is None else hashlib.sha256(np.ascontiguousarray(w, dtype=np.float64).tobytes()).hexdigest()
    row = SCHEMES.get(cache.scheme)
    seed = cache.seed if row is not None and row.position_keyed else None
    return (cache.num_layers, cache.num_kv_heads, cache.head_dim, str(dtype), str(device), int(batch), int(pages),
            cache.block_size, cache.scheme, cache.sketch_bits, bool(cache.kernel_head_levels), tuple(cache.window), wkey,
            seed)


class Holder:
    """A cache's current storage, for the finalizer that gives it back (no reference to the cache)."""

    __slots__ = ("storage",)

    def __init__(self):
        self.storage = None

    def release(self) -> None:
        st, self.storage = self.storage, None
        POOL.give(st)
