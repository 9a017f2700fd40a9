"""The exact backing store of one layer (SPEC §6): K or V as written, never changed by serving.

    store = ExactStore(batch, heads, head_dim, dtype, device, pin=True)
    store.append(x)        # x [B, H, m, D] on any device: an asynchronous copy, no host sync
    store.read(lo, hi)     # [B, H, hi − lo, D]: tokens lo..hi (after pending appends landed)
    store.data             # [B, H, n, D]: every token written so far (a copy when it spans chunks)

Token-major chunks: the store is a list of buffers [C_i, B, H, D], so the m tokens of an append
land in contiguous slices (a [B, H, capacity, D] buffer makes that slice strided whenever B·H > 1,
and PyTorch copies a device tensor into a strided host destination through a pageable temporary:
a synchronous transfer, i.e. a host sync per layer step for K and again for V).

Growth adds a chunk and copies nothing (the previous single buffer doubled and copied the whole
store: at Llama-8B / B = 8 / 32K, 34 GB of host memcpy, with a host sync first): a new chunk holds
at least what the append needs, ``INITIAL_CAPACITY`` tokens, and a quarter of the capacity so far
(so a request of n tokens has O(log n) chunks and at most ~25 % unused capacity), and an append of
many tokens (a prefill) reserves an eighth more for the decode steps after it. PyTorch's pinned
allocator rounds every allocation up to a power of two bytes, so pinned chunks are sized to fill
their rounded allocation or split below it (``_chunk_tokens``): by that policy's arithmetic (modelled
in tests/cache/test_cache_edges.py, not measured on a GPU) memory stays within ~1.4× of the tokens written
(1.02–1.34× over the shapes there), where the previous single buffer, 1.5× the prefill and then
rounded up, came to ~64 GB of pinned memory for 34 GB of K / V (arithmetic; bench/SERVING.md, run I5).

On a CUDA model the store is pinned host memory and an append is a non-blocking device-to-host
copy on the current stream, with a CUDA event recorded after it. **Every read of the store's bytes
waits for it first** (``wait()``): a host-side read (``.clone()``, ``torch.equal``, a strided
slice's ``.to(cuda)``, which PyTorch first copies into a contiguous host temporary) does not wait
for a pending copy and would see stale memory (found in review, 2026-12-01: the reference path
quantized the prompt from the store right after its append). ``read`` and ``data`` wait; the hot
path (appends, lengths) never does.

**The pool** (``witcert.hostpool``, default on CUDA): a pinned store's chunks are leases of the
process-wide ``HostPool`` (pinned once, in large slabs, never freed by serving; given back on ``release``
— ``WitCertCache.reset()`` —, on a crop past a chunk and when the store is garbage-collected), and its
appends are copied on the pool's side stream (``SideStreamEngine``): no ``cudaHostAlloc`` /
``cudaFreeHost`` and no stream synchronisation on the request path once the pool is warm. A pooled store
sizes its chunks to the need (no power-of-two fitting: the pool's slabs are the allocations), caps a
prefill's headroom at ``expect`` tokens (the cache's ``max_tokens``) when that covers the prefill, and may
get a chunk shorter than it asked for (the pool's largest free piece) and then takes another. Its
``data`` is a copy (its memory is reused by the next request once given back); ``read`` is a view, valid
until the store is released or cropped. ``pool=False`` is the per-store allocation of before (pinned with
``torch.empty(pin_memory=True)``, copies on the current stream).
"""

from __future__ import annotations

import bisect
import time
import weakref

import torch

from .hostpool import HostPool

#: tokens of the first chunk at least
INITIAL_CAPACITY = 256
#: a new chunk holds at least 1 / GROWTH of the capacity so far (geometric: O(log n) chunks)
GROWTH = 4
#: an append of m > 1 tokens reserves m / PREFILL_HEADROOM more (the decode steps after a prefill)
PREFILL_HEADROOM = 8


def target_tokens(need: int, m: int, expect: int | None = None) -> int:
    """Tokens a store reserves for ``need`` tokens after an append of ``m``: a prefill's eighth more
    (``PREFILL_HEADROOM``), capped at ``expect`` (the cache's ``max_tokens``) when that covers ``need``. A
    request's first append reserves at least ``INITIAL_CAPACITY`` (``first_chunk_tokens``)."""
    t = need + (m // PREFILL_HEADROOM if m > 1 else 0)
    if expect is not None and expect >= need:
        t = min(t, expect)
    return t


def first_chunk_tokens(m: int, expect: int | None = None) -> int:
    """Tokens of a store's first chunk after a first append of ``m`` tokens (what the cache asks the
    pool for at a request's start)."""
    return max(target_tokens(m, m, expect), INITIAL_CAPACITY)


def _pinned_bytes(t: torch.Tensor) -> int:
    """What PyTorch's pinned allocator takes for ``t``: its bytes rounded up to a power of two."""
    return 1 << max(0, t.numel() * t.element_size() - 1).bit_length()


class _Held:
    """What a pooled store holds, for its finalizer (no reference to the store): the pool, the leases
    (in chunk order), the completion event of its pending copies and their device, its cost counters."""

    __slots__ = ("pool", "leases", "event", "device", "cost")

    def __init__(self, pool, cost):
        self.pool, self.leases, self.event, self.device, self.cost = pool, [], None, None, cost


def _give_back(held: _Held) -> None:
    """Finalizer of a pooled store: its leases go back to the pool (applied at the pool's next operation)."""
    if held.pool is not None and held.leases:
        ev = held.event if held.event is not _UNRECORDED else None
        held.pool.release_later(held.leases, ev, held.device, held.cost)
        held.leases = []


class ExactStore:
    def __init__(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device, pin: bool = False, *,
                 pool=None, cost=None, expect: int | None = None):
        """``pool``: a ``witcert.hostpool.HostPool`` to lease chunks from (any device: a pool without
        pinning gives plain memory); None: the process-wide pool when the store is pinned, else plain
        per-store memory; False: per-store allocation (pinned when ``pin``), as before the pool.
        ``cost``: a ``HostCost`` to count into (the cache's). ``expect``: the tokens the request is expected
        to reach (caps a prefill's headroom when it covers the prefill; pooled stores only)."""
        self.shape = (int(batch), int(heads), int(head_dim))
        self.dtype = dtype
        self.device = torch.device(device)
        self.pin = bool(pin) and torch.cuda.is_available()
        if pool is None and self.pin:
            pool = HostPool.default()
        self._pool = pool if pool is not False and self.device.type == "cpu" else None
        self.cost = cost
        self.expect = None if expect is None or self._pool is None else int(expect)
        self.n = 0
        self._chunks: list[torch.Tensor] = []  # [C_i, B, H, D] each
        self._starts: list[int] = []  # first token index of each chunk
        self._cap = 0
        self._held = _Held(self._pool, cost)  # ._landed: the CUDA event after the last asynchronous append
        if self._pool is not None:
            weakref.finalize(self, _give_back, self._held)

    # the completion event of the pending asynchronous appends (None: nothing pending)
    @property
    def _landed(self):
        return self._held.event

    @_landed.setter
    def _landed(self, ev) -> None:
        self._held.event = ev

    @property
    def pooled(self) -> bool:
        return self._pool is not None

    def _row(self) -> int:
        B, H, D = self.shape
        return B * H * D * torch.empty(0, dtype=self.dtype).element_size()

    def _alloc(self, tokens: int) -> torch.Tensor:
        """A chunk of ``tokens`` tokens [tokens', B, H, D]; a pooled store's may be shorter (tokens' ≥ 1:
        the pool's largest free piece), ``_reserve`` then takes another."""
        B, H, D = self.shape
        if self._pool is None:
            t0 = time.perf_counter()
            t = torch.empty(tokens, B, H, D, dtype=self.dtype, device=self.device, pin_memory=self.pin)
            if self.pin and self.cost is not None:  # PyTorch's pinned allocator: a power of two (cudaHostAlloc
                nbytes = _pinned_bytes(t)  # unless it had one cached)
                self.cost.allocated(nbytes, time.perf_counter() - t0)
                self.cost.hold(nbytes)
                self.cost.fallback("per_store_pinned")
            return t
        row = self._row()
        buf, lease = self._pool.acquire(tokens * row, min_bytes=min(tokens, INITIAL_CAPACITY) * row, cost=self.cost)
        k = lease.nbytes // row
        self._held.leases.append(lease)
        if self.cost is not None:
            self.cost.hold(lease.nbytes)
        return buf[: k * row].view(self.dtype).view(k, B, H, D)

    def _chunk_tokens(self, target: int) -> int:
        """Tokens of a new chunk for a need of ``target``. Pinned (without the pool), PyTorch's allocator
        rounds the bytes up to a power of two: the chunk takes all the tokens the rounded-up allocation
        holds when that is at most 1/8 more than ``target``; otherwise the largest power of two below (at
        least half the target; ``_reserve`` adds another chunk for the rest), so no allocation hides up
        to 2× of unused memory. Pooled: ``target`` (the pool's slabs are the allocations)."""
        if not self.pin or self._pool is not None:
            return target
        row = self._row()
        nbytes = target * row
        up = 1 << max(0, nbytes - 1).bit_length()  # the allocation a chunk of `target` tokens gets
        if up // row <= target + target // 8:
            return max(target, up // row)
        return max(1, (up // 2) // row)

    def _target(self, need: int, m: int) -> int:
        """Capacity to reserve for ``need`` tokens after an append of ``m`` (``target_tokens``)."""
        return target_tokens(need, m, self.expect)

    def _reserve(self, need: int) -> None:
        while self._cap < need:
            tokens = self._chunk_tokens(max(need - self._cap, INITIAL_CAPACITY, self._cap // GROWTH))
            c = self._alloc(tokens)
            self._chunks.append(c)
            self._starts.append(self._cap)
            self._cap += c.shape[0]

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def _pieces(self, lo: int, hi: int):
        """(chunk, offset in it, token count) covering tokens lo..hi, in order."""
        i = bisect.bisect_right(self._starts, lo) - 1
        while lo < hi:
            c = self._chunks[i]
            off = lo - self._starts[i]
            k = min(hi - lo, c.shape[0] - off)
            yield c, off, k
            lo += k
            i += 1

    def _gather(self, lo: int, hi: int, copy: bool = False) -> torch.Tensor:
        """Tokens lo..hi token-major [hi − lo, B, H, D] (a view inside one chunk unless ``copy``, else a
        copy); no wait."""
        parts = [c[off: off + k] for c, off, k in self._pieces(lo, hi)]
        if not parts:
            B, H, D = self.shape
            return torch.empty(0, B, H, D, dtype=self.dtype, device=self.device)
        if len(parts) == 1:
            return parts[0].clone() if copy else parts[0]
        return torch.cat(parts, 0)

    def _copies(self, lo: int, x_tm: torch.Tensor) -> list:
        """(destination, source) of token-major ``x_tm`` [m, B, H, D] to tokens lo..lo+m (reserved): one
        contiguous destination per chunk it touches."""
        out, i = [], 0
        for c, off, k in self._pieces(lo, lo + x_tm.shape[0]):
            out.append((c[off: off + k], x_tm[i: i + k]))
            i += k
        return out

    def _put(self, lo: int, x_tm: torch.Tensor) -> None:
        """Copy token-major ``x_tm`` [m, B, H, D] to tokens lo..lo+m (reserved), on the current stream
        (non-blocking into pinned memory)."""
        for dst, src in self._copies(lo, x_tm):
            dst.copy_(src, non_blocking=self.pin)

    def read(self, lo: int, hi: int, reason: str = "read") -> torch.Tensor:
        """Tokens lo..hi [B, H, hi − lo, D], after every pending append has landed (a view inside one
        chunk: valid until the store is released or cropped)."""
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"ExactStore.read: [{lo}, {hi}) is outside the {self.n} tokens written")
        self._wait(reason)
        return self._gather(lo, hi).permute(1, 2, 0, 3)

    @property
    def data(self) -> torch.Tensor:
        """Every token written [B, H, n, D] (``read(0, n)``: waits for pending appends); a copy for a pooled
        store (its memory goes to the next request once given back)."""
        self._wait("exact_k")
        return self._gather(0, self.n, copy=self._pool is not None).permute(1, 2, 0, 3)

    def __len__(self) -> int:
        return self.n

    def wait(self, reason: str = "read") -> None:
        """Block the host until every append so far has landed in the buffer (one event sync;
        nothing to do off CUDA or when nothing is pending). Counted in ``cost.syncs[reason]`` when the
        host really waited."""
        ev = self._landed
        if ev is _UNRECORDED:
            raise RuntimeError("ExactStore.wait: an append without record=True was not given its event (append_pair)")
        if ev is not None:
            if not ev.query():
                ev.synchronize()
                if self.cost is not None:
                    self.cost.sync(reason)
            self._landed = None

    def _wait(self, reason: str) -> None:
        if type(self).wait is ExactStore.wait:
            self.wait(reason)
        else:  # a subclass's wait (a test's simulated asynchronous store)
            self.wait()

    def ready(self) -> torch.Tensor:
        """``data`` (it waits): the view to read the store's values through (a copy when pooled)."""
        return self.data

    def release(self) -> None:
        """Give the store's memory back and empty it (``WitCertCache.reset()``): a pooled store's leases go
        back to the pool (kept pinned, reused by the next request; copies still in flight into them are
        fenced), a per-store allocation is dropped."""
        h = self._held
        if self._pool is not None and h.leases:
            ev = h.event if h.event is not _UNRECORDED else None
            self._pool.release(h.leases, ev, h.device, self.cost)
        elif self.pin and self.cost is not None:
            self.cost.hold(-sum(_pinned_bytes(c) for c in self._chunks))
        h.leases = []
        h.event = None
        self._chunks, self._starts, self._cap, self.n = [], [], 0, 0

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens (speculative decoding rolls back rejected tokens). A pooled store
        gives back the chunks that start at or after ``n``."""
        if not 0 <= n <= self.n:
            raise ValueError(f"ExactStore.crop: {n} is outside [0, {self.n}]")
        self.n = n
        if self._pool is not None:
            i = bisect.bisect_left(self._starts, n)  # the first chunk starting at or after n
            if i < len(self._chunks):
                h = self._held
                ev = h.event if h.event is not _UNRECORDED else None
                self._pool.release(h.leases[i:], ev, h.device, self.cost)
                h.leases = h.leases[:i]
                self._cap = self._starts[i]
                del self._chunks[i:], self._starts[i:]

    def reorder(self, index: torch.Tensor) -> None:
        """Rows ``index`` of the batch (beam search), in place (no allocation)."""
        self._wait("reorder")  # pending appends land first
        idx = index.to(self.device)
        for c, start in zip(self._chunks, self._starts):
            k = max(0, min(c.shape[0], self.n - start))
            if k:
                c[:k].copy_(c[:k].index_select(1, idx))

    def append(self, x: torch.Tensor, record: bool = True) -> None:
        """Copy ``x`` [B, H, m, D] after the stored tokens. Pinned, the copy is asynchronous: pooled, on the
        pool's side stream with a completion event; without the pool, on the current stream and, with
        ``record``, a CUDA event is recorded after it (``record=False`` leaves the event to the caller,
        who must set it before anyone waits)."""
        _append_group([(self, x)], record)


#: ``ExactStore._landed`` between an unrecorded append and its caller's event (waiting on it is a bug)
_UNRECORDED = object()


def append_group(items, record: bool = True) -> None:
    """Append ``x`` [B, H, m, D] to ``store`` for every (store, x) of ``items``, with one completion event
    for the whole group (per pool, and one for the per-store pinned ones: recorded after all their copies,
    stream order covers the first ones too) — a layer step's K and V (``append_pair``), a graphed step's
    every layer (``witcert.graphs``). Pooled stores' copies run on the pool's side stream (no host sync);
    a host-side source into pool memory first waits for copies still in flight into memory given back
    (``HostPool.host_write_fence``)."""
    own = [(st, x) for st, x in items if not isinstance(st, ExactStore) or type(st).append is not ExactStore.append]
    if own:  # a store of another class (a test's oracle) or with its own append: through it
        for st, x in own:
            st.append(x)
        items = [(st, x) for st, x in items if all(st is not o for o, _ in own)]
    _append_group(items, record)


def _append_group(items, record: bool) -> None:
    for st, x in items:  # every store's room first: a refused reservation leaves every store as it was
        B, H, m, D = x.shape
        if (B, H, D) != st.shape:
            raise ValueError(f"ExactStore: expected [{st.shape[0]}, {st.shape[1]}, m, {st.shape[2]}], got {tuple(x.shape)}")
        st._reserve(st._target(st.n + m, m))
    groups: dict = {}  # pool (None: per-store) → [(store, copies)]
    unpooled = []
    for st, x in items:
        x_tm = x.detach().permute(2, 0, 1, 3)
        if st._pool is None:
            unpooled.append((st, st.n, x_tm))
        else:
            groups.setdefault(id(st._pool), (st._pool, []))[1].append((st, st._copies(st.n, x_tm)))
        st.n += x.shape[2]
    if unpooled:
        _append_unpooled(unpooled, record)
    for pool, plan in groups.values():
        eng = pool.engine
        dev_copies: dict = {}
        host = []
        for st, copies in plan:
            for dst, src in copies:
                if eng.is_async(src):
                    dev_copies.setdefault(src.device, []).append((dst, src))
                    if st.cost is not None:
                        st.cost.d2h_copies += 1
                        st.cost.d2h_bytes += dst.numel() * dst.element_size()
                else:
                    host.append((dst, src))
                    if st.cost is not None:
                        st.cost.host_copies += 1
                        if pool.pin:  # a host tensor into pinned pool memory: a synchronous host copy
                            st.cost.fallback("host_source")
        if host:
            pool.host_write_fence(plan[0][0].cost)
            for dst, src in host:
                dst.copy_(src)
        events = {dev: eng.issue(cs, pool.foreign_fences(dev)) for dev, cs in dev_copies.items()}
        for st, copies in plan:  # (a store's source is on one device)
            dev = next((src.device for _, src in copies if eng.is_async(src)), None)
            if dev is not None:
                st._landed, st._held.device = events[dev], dev


def _append_unpooled(plan, record: bool) -> None:
    """Per-store memory: copies on the current stream (non-blocking into pinned memory), one event after
    the group's pinned device copies (or, with ``record=False``, left to the caller)."""
    pending = []
    for st, lo, x_tm in plan:
        m = x_tm.shape[0]
        st._put(lo, x_tm)
        if st.cost is not None:
            k = sum(1 for _ in st._pieces(lo, lo + m))
            if x_tm.is_cuda:
                st.cost.d2h_copies += k
                st.cost.d2h_bytes += x_tm.numel() * x_tm.element_size()
            else:
                st.cost.host_copies += k
        if st.pin and x_tm.is_cuda:
            pending.append(st)
    if pending:
        if record:
            ev = torch.cuda.Event()
            ev.record()  # on the current stream, after the group's copies
        else:
            ev = _UNRECORDED
        for st in pending:
            st._landed = ev


def append_pair(k_store: ExactStore, v_store: ExactStore, k: torch.Tensor, v: torch.Tensor) -> None:
    """``k_store.append(k)`` and ``v_store.append(v)`` with one completion event shared by the two stores
    (``append_group``) — half the event work of two appends on a layer step's hot path."""
    append_group([(k_store, k), (v_store, v)])
