"""Pinned host memory for the exact store, allocated once per process (issue: "Batch 8 at 32K").

    from witcert.hostpool import HostPool, reserve_for
    HostPool.configure(budget_bytes="48G")           # or WITCERT_HOST_POOL_BYTES=48G (default: a fraction of MemAvailable)
    reserve_for(model.config, batch=8, tokens=32768 + 64)   # off the request path: pin it at start-up
    cache = WitCertCache(cfg, scheme="int8", cuda_graph=True, max_tokens=32768 + 64)
    cache.summary()["host"]                           # what this request cost the host (HostCost) and the pool's state

Why. Every ``ExactStore`` used to allocate its chunks with ``torch.empty(..., pin_memory=True)``. At
Llama-8B / B 8 / 32K that is 64 stores of ~0.5 GB: ``cudaHostAlloc`` on the request path (9.6 s in the
issue's profile), and ``torch.cuda.graph`` empties PyTorch's pinned cache before every capture
(``torch._C._host_emptyCache()`` in its ``__enter__``), so a finished request's blocks were
``cudaFreeHost``-ed at the next request's first decode step (7.4 s) and pinned again by the request after.

What. ``HostPool``: one per process (``HostPool.default()``), a byte budget, slabs of pinned memory
allocated in large steps and **never freed by serving**. An ``ExactStore`` chunk is a lease: a view of a
slab. A store gives its leases back (they stay pinned, in the pool) when its cache is ``reset()``,
cropped past a chunk, or garbage-collected; the next request or cache reuses them. PyTorch's pinned
allocator rounds an allocation up to a power of two, so pinned slabs are powers of two (no hidden 2x). A
request's first layer asks the pool for the whole request's store at once (``admit``: all layers' K and V
for the prefill), so a cold pool grows in a few large slabs, and a budget that cannot hold it is refused
**before anything is written** (``HostPoolExhausted``, naming the budget, what the pool holds and what was
asked). Growth later in a request (decoding past ``max_tokens``) takes a quarter of the capacity so far
and raises the same error mid-request if the budget is spent.

Why an error and not a fallback. A silent fallback to pageable memory turns every append into a staged
synchronous copy (the slow path this module removes) and can still exhaust the host: the OOM killer then
takes the process (runs I2 / I5 on the H200 host). An exception is recoverable (reset, smaller batch,
larger budget) and says what to change.

Appends. On CUDA a store's device-to-host copies are issued on a side stream of the pool's
(``SideStreamEngine``): the side stream waits on the producing stream (an event, on the device), the
copies are queued there, the source's memory is kept from reuse until they ran (``record_stream``), and
one completion event is recorded for all the copies of the group (a layer step's K and V; a graphed
step's every layer). Nothing on the request path waits for them. Readers (``ExactStore.read`` / ``data``:
page-in, crop, the reference path, the audit) wait on the completion event only when they need the bytes
(counted in ``HostCost.syncs`` when the host really blocked). A lease given back while its copies are
still in flight is reused in stream order (the next owner's copies queue behind them on the same side
stream); a host-side write into pool memory first waits for such copies (``host_write_fence``).

Counting. ``HostCost`` (per cache, per request; ``WitCertCache.summary()["host"]``) counts the pinned
bytes its stores hold, pool hits / misses, host allocations made on the request path (and their time),
device-to-host copies issued, and every host sync the request forced, by reason (``SYNC_REASONS``). The
first time a reason occurs in the process it is logged once (``logging.getLogger("witcert.store")``,
INFO), and so is the first slab allocated on the request path.

``WITCERT_HOST_POOL=off`` (or ``WitCertCache(..., host_pool=False)``) restores the per-store pinned
allocation and same-stream copies (the A/B of ``bench/host_path.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import threading
import time

import torch

log = logging.getLogger("witcert.store")

#: lease offsets and sizes are multiples of this (a host page)
ALIGN = 4096
GiB = 1 << 30
#: default budget: this fraction of the host's available memory (MemAvailable) when the pool is made
DEFAULT_FRACTION = 0.5
#: default smallest slab
DEFAULT_MIN_SLAB = GiB
ENV_BYTES = "WITCERT_HOST_POOL_BYTES"
ENV_FRACTION = "WITCERT_HOST_POOL_FRACTION"
ENV_SLAB = "WITCERT_HOST_POOL_SLAB_BYTES"
ENV_MODE = "WITCERT_HOST_POOL"  # "off" / "0" / "false": pinned stores allocate per store (the old path)

#: every reason a request can force a host sync, and what it is (the log line says it once per process)
SYNC_REASONS = {
    "read": "a read of the exact store waited for its asynchronous appends (ExactStore.read: page-in, crop, the "
            "reference path's quantization)",
    "exact_k": "exact_k / exact_v / keys / values / ExactStore.data read the whole exact store (waits for its appends)",
    "reorder": "beam search reordered the exact store on the host (waits for its appends)",
    "host_write_fence": "a host-side write into pool memory waited for copies still in flight into memory a store "
                        "had given back",
    "graph_capture": "a decode step was captured in a CUDA graph (torch.cuda.synchronize, and torch.cuda.graph's own "
                     "synchronize / empty_cache / host empty_cache): once per capture, i.e. per request",
    "gate": "a gate read the step's TV+ on the host (one per gated layer step and repair round)",
    "page_in": "a page-in read the block table or the repaired flags on the host",
    "reference_path": "a layer step on the float64 reference path (its meter is computed and recorded on the host)",
    "records": "meter records were copied to the host (cache.records / summary(), or a trace sink every step)",
    "new_request_check": "use_witcert's new-request check read the forward's first positions on the host (2-D "
                         "position_ids on a non-empty cache: every decode step of generate)",
    "beam_reorder": "reorder_cache read the beam indices on the host",
    "kivi2_hold": "a block scheme held a new partial page exact (one per layer every 16 tokens)",
}


class HostPoolExhausted(MemoryError):
    """The host pool's budget cannot hold what a request asked for (the message names both)."""


def parse_bytes(v) -> int:
    """``48G``, ``0.5T``, ``512M``, ``4096`` (binary units) or an int → bytes."""
    if isinstance(v, bool):
        raise ValueError(f"bytes: expected an int or a string like '48G', got {v!r}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise ValueError(f"bytes: expected a non-negative size, got {v!r}")
        return int(v)
    s = str(v).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        x = float(s[:-1] if s[-1:] in "KMGT" else s)
    except ValueError:
        raise ValueError(f"bytes: expected an int or a string like '48G', got {v!r}") from None
    if x < 0:
        raise ValueError(f"bytes: expected a non-negative size, got {v!r}")
    return int(x * mult)


def fmt_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def available_host_bytes() -> int:
    """MemAvailable of /proc/meminfo (bytes); else the free physical pages (os.sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 0


def default_budget() -> int:
    """``WITCERT_HOST_POOL_BYTES`` if set, else ``WITCERT_HOST_POOL_FRACTION`` (default 0.5) of MemAvailable."""
    if os.environ.get(ENV_BYTES):
        return parse_bytes(os.environ[ENV_BYTES])
    frac = float(os.environ.get(ENV_FRACTION, DEFAULT_FRACTION))
    if not 0 < frac <= 1:
        raise ValueError(f"{ENV_FRACTION}: expected a fraction in (0, 1], got {frac}")
    return int(frac * available_host_bytes())


def _align(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1) if n > 0 else 0


_LOGGED: set = set()


def _log_once(key, msg, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info(msg, *args)


# --------------------------------------------------------------------------- what a request cost the host


@dataclasses.dataclass
class HostCost:
    """Host-side cost of one cache's current request (``WitCertCache.summary()["host"]``): plain
    Python values. ``pinned_bytes`` is a gauge (what the cache's exact stores hold now); the rest count
    from the request's start (``reset()`` starts a new one)."""

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
    syncs: dict = dataclasses.field(default_factory=dict)  # reason → times the host blocked on the device
    admitted: bool = dataclasses.field(default=False, repr=False)  # the request's store was asked of the pool

    def sync(self, reason: str, n: int = 1) -> None:
        """Count ``n`` host syncs for ``reason`` (one of ``SYNC_REASONS``); logged once per process and reason."""
        self.syncs[reason] = self.syncs.get(reason, 0) + n
        _log_once(("sync", reason), "witcert: a request forced a host sync: %s (%s). Counted in "
                  "WitCertCache.summary()['host']['syncs'] (logged once per reason).", reason,
                  SYNC_REASONS.get(reason, "unlisted"))

    def hold(self, nbytes: int) -> None:
        self.pinned_bytes += int(nbytes)
        self.pinned_peak_bytes = max(self.pinned_peak_bytes, self.pinned_bytes)

    @property
    def sync_total(self) -> int:
        return sum(self.syncs.values())

    def new_request(self) -> None:
        """Zero the per-request counters (the ``pinned_bytes`` gauge stays)."""
        keep = self.pinned_bytes
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        self.pinned_bytes = self.pinned_peak_bytes = keep

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        d["syncs"] = dict(self.syncs)
        d["syncs_total"] = self.sync_total
        return d


# --------------------------------------------------------------------------- copy engines


class SyncEngine:
    """Plain memory (off CUDA): every copy on the host, now; nothing pending."""

    def is_async(self, src: torch.Tensor) -> bool:
        return False

    def issue(self, copies):
        for dst, src in copies:
            dst.copy_(src)
        return None


class SideStreamEngine:
    """Device-to-host copies on a dedicated side stream per device: the side stream waits on the
    producing (current) stream through an event, the copies are queued on it, each source's memory is
    kept from reuse until they ran (``record_stream``), and one completion event is recorded after them.
    No host sync."""

    def __init__(self):
        self._streams: dict = {}

    def is_async(self, src: torch.Tensor) -> bool:
        return src.is_cuda

    def stream(self, device: torch.device):
        idx = device.index if device.index is not None else torch.cuda.current_device()
        s = self._streams.get(idx)
        if s is None:
            s = self._streams[idx] = torch.cuda.Stream(device=idx)
        return s

    def issue(self, copies):
        dev = copies[0][1].device
        side = self.stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for dst, src in copies:
                dst.copy_(src, non_blocking=True)
        seen = set()
        for _, src in copies:  # the producer may free a source before the side stream read it
            p = src.untyped_storage().data_ptr()
            if p not in seen:
                seen.add(p)
                src.record_stream(side)
        ev = torch.cuda.Event()
        ev.record(side)
        return ev


# --------------------------------------------------------------------------- the pool


class Lease:
    """``nbytes`` at ``offset`` of a slab of the pool (an ``ExactStore`` chunk)."""

    __slots__ = ("slab", "offset", "nbytes")

    def __init__(self, slab, offset: int, nbytes: int):
        self.slab, self.offset, self.nbytes = slab, offset, nbytes

    def __repr__(self):
        return f"Lease(slab={self.slab.id}, offset={self.offset}, nbytes={self.nbytes})"


class _Slab:
    __slots__ = ("id", "tensor", "nbytes", "free")

    def __init__(self, sid: int, tensor: torch.Tensor):
        self.id, self.tensor, self.nbytes = sid, tensor, tensor.numel()
        self.free = [[0, self.nbytes]]  # sorted, coalesced [offset, size]


def _pinned_alloc(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _plain_alloc(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


class HostPool:
    """Pinned host memory for exact stores (module docstring). ``budget_bytes``: the most the pool may
    hold (None: ``default_budget()``; an int or ``"48G"``); ``min_slab_bytes``: the smallest slab (1 GiB;
    ``WITCERT_HOST_POOL_SLAB_BYTES``); ``pin``: pinned memory (only where CUDA is available: elsewhere the
    pool degrades to plain memory); ``allocator(nbytes) -> uint8 tensor`` and ``engine`` (copies) may be
    injected (tests); ``pow2``: slabs are powers of two (default: when PyTorch's pinned allocator, which
    rounds up to one, makes them)."""

    _default: "HostPool | None" = None
    _default_lock = threading.Lock()

    def __init__(self, budget_bytes=None, *, min_slab_bytes=None, pin: bool = True, allocator=None, engine=None,
                 pow2: bool | None = None):
        self.pin = bool(pin) and torch.cuda.is_available()
        self._allocator = allocator or (_pinned_alloc if self.pin else _plain_alloc)
        self.pow2 = (allocator is None and self.pin) if pow2 is None else bool(pow2)
        self.budget = default_budget() if budget_bytes is None else parse_bytes(budget_bytes)
        ms = parse_bytes(min_slab_bytes if min_slab_bytes is not None else os.environ.get(ENV_SLAB, DEFAULT_MIN_SLAB))
        self.min_slab = _pow2_ceil(max(ms, ALIGN)) if self.pow2 else _align(max(ms, ALIGN))
        self.engine = engine or (SideStreamEngine() if self.pin else SyncEngine())
        self._lock = threading.RLock()
        self._slabs: dict[int, _Slab] = {}
        self._next_id = 0
        self._later = collections.deque()  # releases from finalizers (run at any point: applied under the lock)
        self._fences: dict = {}  # device → the newest completion event a store gave back memory with
        self.held = 0  # bytes of slabs
        self.in_use = 0  # bytes leased
        self.peak_in_use = 0
        self.slab_allocs = 0
        self.slab_alloc_seconds = 0.0
        self.slab_frees = 0  # trim() only
        self.hits = 0
        self.misses = 0
        self.refusals = 0
        self.gc_runs = 0

    # -- the process-wide pool
    @classmethod
    def default(cls) -> "HostPool | None":
        """The process-wide pool (made at first use), or None when ``WITCERT_HOST_POOL`` is off."""
        if os.environ.get(ENV_MODE, "on").strip().lower() in ("off", "0", "false", "no", "none"):
            return None
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
                log.info("witcert host pool: budget %s (%s), slabs of at least %s", fmt_bytes(cls._default.budget),
                         f"{ENV_BYTES}" if os.environ.get(ENV_BYTES) else
                         f"{float(os.environ.get(ENV_FRACTION, DEFAULT_FRACTION)):g} of MemAvailable",
                         fmt_bytes(cls._default.min_slab))
            return cls._default

    @classmethod
    def configure(cls, budget_bytes=None, min_slab_bytes=None) -> "HostPool":
        """Set the process-wide pool's budget / smallest slab (made now if it does not exist yet; a budget
        below what it holds refuses further growth, nothing is freed)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls(budget_bytes, min_slab_bytes=min_slab_bytes)
                return cls._default
            p = cls._default
        with p._lock:
            if budget_bytes is not None:
                p.budget = parse_bytes(budget_bytes)
            if min_slab_bytes is not None:
                ms = parse_bytes(min_slab_bytes)
                p.min_slab = _pow2_ceil(max(ms, ALIGN)) if p.pow2 else _align(max(ms, ALIGN))
        return p

    # -- leases
    @property
    def free_bytes(self) -> int:
        return self.held - self.in_use

    def _drain(self) -> None:
        while self._later:
            self._release(*self._later.popleft())

    def _take(self, nbytes: int, min_bytes: int, partial: bool):
        """A lease of ``nbytes`` from free memory (best fit), else, with ``partial`` or when the free memory
        adds up to ``nbytes``, the largest free extent of at least ``min_bytes``; None if neither."""
        best = big = None
        total = 0
        for slab in self._slabs.values():
            for ext in slab.free:
                total += ext[1]
                if ext[1] >= nbytes and (best is None or ext[1] < best[1][1]):
                    best = (slab, ext)
                if ext[1] >= min_bytes and (big is None or ext[1] > big[1][1]):
                    big = (slab, ext)
        pick, size = (best, nbytes) if best is not None else (big, big[1][1] if big is not None else 0)
        if pick is None or (best is None and not partial and total < nbytes):
            return None
        slab, ext = pick
        lease = Lease(slab, ext[0], size)
        ext[0] += size
        ext[1] -= size
        if ext[1] == 0:
            slab.free.remove(ext)
        self.in_use += size
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return lease

    def acquire(self, nbytes: int, min_bytes: int | None = None, cost: HostCost | None = None):
        """(a uint8 view of ``k`` bytes, its ``Lease``) with ``min_bytes`` ≤ k ≤ ``nbytes`` (rounded up to
        ``ALIGN``): from memory the pool holds when it can (a hit), else after a new slab (a miss, counted in
        ``cost`` as a host allocation on the request path). ``HostPoolExhausted`` when the budget cannot."""
        nbytes = _align(max(1, nbytes))
        min_bytes = min(nbytes, _align(max(1, min_bytes or nbytes)))
        with self._lock:
            self._drain()
            lease = self._take(nbytes, min_bytes, partial=False)
            if lease is None and self._collect():  # a dropped cache in a reference cycle gives its memory back
                lease = self._take(nbytes, min_bytes, partial=False)
            if lease is None:
                self._grow(nbytes, min_bytes, cost)
                lease = self._take(nbytes, min_bytes, partial=True)
                self.misses += 1
                if cost is not None:
                    cost.pool_misses += 1
            else:
                self.hits += 1
                if cost is not None:
                    cost.pool_hits += 1
        t = lease.slab.tensor
        return t[lease.offset: lease.offset + lease.nbytes], lease

    def _collect(self) -> bool:
        """Run the garbage collector once (a cache's layers reference their cache: a dropped cache is freed
        by the cycle collector, not at once) and apply what it gave back; whether anything came back."""
        before = len(self._later)
        gc.collect()
        self.gc_runs += 1
        got = len(self._later) > before
        self._drain()
        return got

    def release(self, leases, fence=None, device=None, cost: HostCost | None = None) -> None:
        """Give ``leases`` back (kept pinned, reused by the next acquire). ``fence``: the completion event
        of copies still in flight into them (a host-side write into pool memory waits for it first)."""
        with self._lock:
            self._release(list(leases), fence, device, cost)

    def release_later(self, leases, fence=None, device=None, cost: HostCost | None = None) -> None:
        """``release`` from a finalizer (it may run in the middle of a pool operation): applied at the next one."""
        self._later.append((list(leases), fence, device, cost))

    def _release(self, leases, fence, device, cost) -> None:
        for lease in leases:
            slab = lease.slab
            if self._slabs.get(slab.id) is not slab:
                continue  # pragma: no cover — trimmed (a slab is trimmed only when wholly free)
            self._insert(slab, lease.offset, lease.nbytes)
            self.in_use -= lease.nbytes
            if cost is not None:
                cost.pinned_bytes -= lease.nbytes
        if fence is not None:
            self._fences[device] = fence  # the newest: the side stream runs in order, it covers the older ones

    @staticmethod
    def _insert(slab: _Slab, off: int, size: int) -> None:
        free = slab.free
        i = 0
        while i < len(free) and free[i][0] < off:
            i += 1
        free.insert(i, [off, size])
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:  # coalesce with the next
            free[i][1] += free.pop(i + 1)[1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:  # and the previous
            free[i - 1][1] += free.pop(i)[1]

    def host_write_fence(self, cost: HostCost | None = None) -> None:
        """Before a host-side write into pool memory: wait for copies still in flight into memory given back."""
        with self._lock:
            self._drain()
            fences, self._fences = self._fences, {}
        for ev in fences.values():
            if not ev.query():
                ev.synchronize()
                if cost is not None:
                    cost.sync("host_write_fence")

    # -- growth
    def _room(self) -> int:
        return max(0, self.budget - self.held)

    def _refuse(self, asked: int, what: str, cost) -> None:
        self.refusals += 1
        raise HostPoolExhausted(
            f"witcert host pool: {what} needs {fmt_bytes(asked)} more pinned host memory than the pool has free; "
            f"the pool holds {fmt_bytes(self.held)} ({fmt_bytes(self.in_use)} in use, {fmt_bytes(self.free_bytes)} "
            f"free) under a budget of {fmt_bytes(self.budget)}, so at most {fmt_bytes(self._room())} more can be "
            f"pinned. Raise the budget ({ENV_BYTES}=<bytes> or witcert.hostpool.HostPool.configure(budget_bytes=...); "
            f"default {DEFAULT_FRACTION:g} of MemAvailable), or serve fewer sequences / tokens per request.")

    def _new_slab(self, size: int, cost) -> None:
        t0 = time.perf_counter()
        try:
            tensor = self._allocator(size)
        except RuntimeError as e:  # the host could not pin it (below the budget, but not available)
            self.refusals += 1
            raise HostPoolExhausted(f"witcert host pool: pinning a {fmt_bytes(size)} slab failed ({e}); the pool "
                                    f"holds {fmt_bytes(self.held)} under a budget of {fmt_bytes(self.budget)}") from e
        dt = time.perf_counter() - t0
        slab = _Slab(self._next_id, tensor)
        self._next_id += 1
        self._slabs[slab.id] = slab
        self.held += slab.nbytes
        self.slab_allocs += 1
        self.slab_alloc_seconds += dt
        if cost is not None:
            cost.host_allocs += 1
            cost.host_alloc_bytes += slab.nbytes
            cost.host_alloc_seconds += dt
            _log_once("slab", "witcert host pool: a request pinned a %s slab on the request path (%.3f s; the pool "
                      "now holds %s of a %s budget). Pin it ahead, off the request path: "
                      "witcert.hostpool.reserve_for(config, batch, tokens) or HostPool.default().reserve(bytes) "
                      "(logged once).", fmt_bytes(slab.nbytes), dt, fmt_bytes(self.held), fmt_bytes(self.budget))

    def _grow(self, nbytes: int, min_bytes: int, cost) -> None:
        """One new slab holding ``nbytes`` if the budget allows, else the largest the budget allows if it
        holds ``min_bytes``; else ``HostPoolExhausted``."""
        size = max(nbytes, self.min_slab)
        size = _pow2_ceil(size) if self.pow2 else _align(size)
        room = self._room()
        if size > room:
            size = _pow2_floor(room) if self.pow2 else room - room % ALIGN
            if size < nbytes and self.pow2 and _pow2_ceil(nbytes) <= room:
                size = _pow2_ceil(nbytes)
            if size < min_bytes:
                self._refuse(min_bytes, "an exact store chunk", cost)
        self._new_slab(size, cost)

    def _plan(self, deficit: int) -> list[int]:
        """Slab sizes adding up to at least ``deficit`` (few, large; powers of two when ``pow2``)."""
        if not self.pow2:
            return [max(_align(deficit), self.min_slab)]
        out, rest = [], deficit
        while rest > 0:
            p = self.min_slab if rest <= self.min_slab else _pow2_floor(rest)
            out.append(p)
            rest -= p
        return out

    def ensure_free(self, nbytes: int, cost: HostCost | None = None, what: str = "a request") -> int:
        """Grow (in large slabs) until at least ``nbytes`` are free; the bytes added. ``HostPoolExhausted``
        (nothing allocated) when the budget cannot hold them. With ``cost`` the growth is on the request
        path (counted, logged once); ``reserve`` is the same off it."""
        nbytes = _align(nbytes)
        with self._lock:
            self._drain()
            if self.free_bytes < nbytes:
                self._collect()
            deficit = nbytes - self.free_bytes
            if deficit <= 0:
                return 0
            sizes = self._plan(deficit)
            if sum(sizes) > self._room():  # the last slab at its need rather than the minimum, if that fits
                last = _pow2_ceil(deficit - sum(sizes[:-1])) if self.pow2 else _align(deficit - sum(sizes[:-1]))
                sizes[-1] = last
                if sum(sizes) > self._room():
                    self._refuse(deficit, what, cost)
            for s in sizes:
                self._new_slab(s, cost)
            return sum(sizes)

    def reserve(self, nbytes) -> int:
        """Pin enough slabs, now, for ``nbytes`` to be free (call it at start-up: off the request path)."""
        return self.ensure_free(parse_bytes(nbytes), None, "reserve()")

    def trim(self) -> int:
        """Free the slabs nothing is leased from (not on the request path: between phases of a benchmark, or
        to give memory back to the host); the bytes freed. Pinned: PyTorch's cached blocks are emptied too."""
        with self._lock:
            self._drain()
            freed = 0
            for sid in [s.id for s in self._slabs.values() if s.free == [[0, s.nbytes]]]:
                slab = self._slabs.pop(sid)
                freed += slab.nbytes
                self.held -= slab.nbytes
                self.slab_frees += 1
        if freed and self.pin:
            gc.collect()
            empty = getattr(torch._C, "_host_emptyCache", None)
            if empty is not None:
                empty()
        return freed

    def stats(self) -> dict:
        """The pool's state and counters (plain Python values)."""
        with self._lock:
            self._drain()
            largest = max((e[1] for s in self._slabs.values() for e in s.free), default=0)
            return dict(budget_bytes=self.budget, held_bytes=self.held, in_use_bytes=self.in_use,
                        free_bytes=self.free_bytes, largest_free_bytes=largest, peak_in_use_bytes=self.peak_in_use,
                        slabs=len(self._slabs), slab_allocs=self.slab_allocs,
                        slab_alloc_seconds=round(self.slab_alloc_seconds, 6), slab_frees=self.slab_frees,
                        hits=self.hits, misses=self.misses, refusals=self.refusals, gc_runs=self.gc_runs,
                        pinned=self.pin, pow2_slabs=self.pow2, min_slab_bytes=self.min_slab)


# --------------------------------------------------------------------------- the cache's side


def first_chunk_tokens(m: int, expect: int | None = None) -> int:
    """Tokens a store reserves at its first append of ``m`` tokens (``ExactStore``'s policy: a prefill's
    eighth more, no more than ``expect`` tokens when that covers it, at least ``INITIAL_CAPACITY``)."""
    from .store import INITIAL_CAPACITY, PREFILL_HEADROOM

    t = m + (m // PREFILL_HEADROOM if m > 1 else 0)
    if expect is not None and expect >= m:
        t = min(t, expect)
    return max(t, INITIAL_CAPACITY)


def cache_pool(cache, pin: bool):
    """The pool ``cache``'s exact stores use (None: per-store allocation, plain or pinned as before)."""
    hp = getattr(cache, "host_pool", None)
    if hp is False:
        return None
    if hp is None:
        return HostPool.default() if pin and torch.cuda.is_available() else None
    return hp


def open_stores(cache, layer, key_states, pin: bool):
    """The (K, V) exact stores of ``layer`` for a new request (``WitCertLayer.lazy_initialization``). At
    the request's first store the pool is asked for all of them (every layer's K and V of the first
    forward, ``admit``): a cold pool grows in a few large slabs, and a budget that cannot hold them is
    refused before anything is written."""
    from .store import ExactStore

    Bsz, H, m, D = key_states.shape
    pool = cache_pool(cache, pin)
    cost = getattr(cache, "host_cost", None)
    expect = getattr(cache, "max_tokens", None) if pool is not None else None
    if pool is not None and cost is not None and not cost.admitted:
        row = Bsz * H * D * key_states.element_size()
        stores = 2 * sum(1 for lay in cache.layers if type(lay) is type(layer))
        tokens = first_chunk_tokens(m, expect)
        pool.ensure_free(stores * _align(tokens * row), cost,
                         f"this request's exact store ({stores // 2} layers x K and V x {tokens} tokens x {Bsz} "
                         f"sequences x {H} kv heads x {D} x {key_states.element_size()} bytes)")
        cost.admitted = True
    kw = dict(pin=pin, pool=pool if pool is not None else False, cost=cost, expect=expect)
    return (ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw), ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw))


def store_bytes(config, batch: int, tokens: int, dtype=torch.bfloat16) -> int:
    """Pinned bytes of a request's exact store (every layer's K and V) for ``config`` (a transformers
    config or a ``WitCertCache``), ``batch`` sequences of ``tokens`` tokens."""
    from .cache import _model_dims

    if hasattr(config, "num_layers") and hasattr(config, "num_kv_heads"):
        L, Hkv, D = config.num_layers, config.num_kv_heads, config.head_dim
    else:
        _, L, _, Hkv, D, _ = _model_dims(config)
    row = batch * Hkv * D * torch.empty(0, dtype=dtype).element_size()
    return 2 * L * _align(tokens * row)


def reserve_for(config, batch: int, tokens: int, dtype=torch.bfloat16, pool: HostPool | None = None) -> int:
    """Pin, now (off the request path), what a request of ``batch`` x ``tokens`` tokens' exact store needs
    (``store_bytes``); the bytes added. Pass ``tokens`` = the cache's ``max_tokens`` (prompt + new tokens)."""
    pool = pool or HostPool.default()
    if pool is None:
        return 0
    return pool.reserve(store_bytes(config, batch, tokens, dtype))
