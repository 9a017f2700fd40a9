"""Pinned host memory for the exact store, allocated once per process (issue 38).

    from witcert.hostpool import HostPool
    HostPool.configure(budget_bytes="48G")   # or WITCERT_HOST_POOL_BYTES=48G (default: half of MemAvailable)
    witcert.cache.reserve_host(model.config, batch=8, tokens=32768 + 64)   # at start-up: off the request path
    cache = WitCertCache(cfg, scheme="int8", cuda_graph=True, max_tokens=32768 + 64)
    cache.summary()["host"]                  # this request's HostCost and the pool's PoolStats

Why. Every ``ExactStore`` allocated its chunks with ``torch.empty(..., pin_memory=True)``: at
Llama-8B / B 8 / 32K, 64 stores of ~0.5 GB, ``cudaHostAlloc`` on the request path (9.6 s in the
issue's profile); and ``torch.cuda.graph`` empties PyTorch's pinned cache before every capture
(``torch._C._host_emptyCache()``), so a finished request's chunks were ``cudaFreeHost``-ed at the next
request's first decode step (7.4 s) and pinned again by the request after.

What. ``HostPool``: one per process (``HostPool.default()``), a byte budget, slabs of pinned memory
allocated in large steps and never freed by serving (only ``trim()`` frees, between phases). A store
chunk is a ``Lease``: a view of a slab. A store gives its leases back (they stay pinned) at
``WitCertCache.reset()``, on a crop past a chunk, or when it is garbage-collected; the next request or
cache reuses them. PyTorch's pinned allocator rounds an allocation up to a power of two, so pinned slabs
are powers of two (no hidden 2x). A request's first layer asks for the whole prefill's store at once
(``ensure_free``, from ``witcert.cache``): a cold pool grows in a few large slabs, and a budget that
cannot hold it is refused before anything is written (``HostPoolExhausted``, naming the budget, what the
pool holds and what was asked). Growth later in a request takes the store's growth step and raises the
same error if the budget is spent.

Why an error, not a fallback. Pageable memory turns every append into a staged synchronous copy (the
slow path this removes) and can still exhaust the host: the OOM killer then takes the process (runs I2 /
I5 of bench/SERVING.md). An exception is recoverable (reset, smaller batch, larger budget) and says
what to change.

Copies. On CUDA a store's device-to-host copies are queued on a side stream of the pool
(``SideStreamEngine``): the side stream waits on the producing stream through an event (on the device),
each source is kept from reuse until the copies ran (``record_stream``), and one completion event is
recorded for the group (a layer step's K and V; a graphed step's every layer). Nothing on the request
path waits; readers wait on the event only when they need the bytes (counted, ``HostCost.syncs``). A
lease given back while its copies are in flight is reused in stream order (the next owner's copies queue
behind them); a host-side write into pool memory first waits for them (``host_write_fence``).

The allocator and the copy engine are injectable (tests run the pool's bookkeeping on the CPU, where this
torch build has no pinned memory: plain memory, copies at once or deferred by a test engine).
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

from .hostcost import HostCost, log_once

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
_OFF = ("off", "0", "false", "no", "none")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class HostPoolExhausted(MemoryError):
    """The host pool's budget cannot hold what a request asked for (the message names both)."""


def parse_bytes(v) -> int:
    """``48G``, ``0.5T``, ``512M``, ``4096`` (binary units) or an int → bytes."""
    bad = ValueError(f"bytes: expected a non-negative int or a string like '48G', got {v!r}")
    if isinstance(v, bool):
        raise bad
    if isinstance(v, (int, float)):
        x, mult = v, 1
    else:
        s = str(v).strip().upper().removesuffix("B").removesuffix("I")
        mult = _UNITS.get(s[-1:], 1)
        try:
            x = float(s[:-1] if s[-1:] in _UNITS else s)
        except ValueError:
            raise bad from None
    if x < 0:
        raise bad
    return int(x * mult)


def fmt_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def available_host_bytes() -> int:
    """MemAvailable of /proc/meminfo (bytes); else the free physical pages (os.sysconf); else 0."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def default_budget() -> int:
    """``WITCERT_HOST_POOL_BYTES`` if set, else ``WITCERT_HOST_POOL_FRACTION`` (default 0.5) of MemAvailable."""
    if os.environ.get(ENV_BYTES):
        return parse_bytes(os.environ[ENV_BYTES])
    frac = float(os.environ.get(ENV_FRACTION, DEFAULT_FRACTION))
    if not 0 < frac <= 1:
        raise ValueError(f"{ENV_FRACTION}: expected a fraction in (0, 1], got {frac}")
    return int(frac * available_host_bytes())


def align(n: int) -> int:
    """``n`` rounded up to ``ALIGN``."""
    return -(-int(n) // ALIGN) * ALIGN


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1) if n > 0 else 0


def store_bytes(layers: int, kv_heads: int, head_dim: int, batch: int, tokens: int, dtype=torch.bfloat16) -> int:
    """Pool bytes of a request's exact store: every layer's K and V, ``batch`` x ``tokens`` tokens."""
    row = batch * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
    return 2 * layers * align(tokens * row)


# --------------------------------------------------------------------------- copy engines
# An engine: ``is_async(src)`` (whether a copy from ``src`` is queued rather than done now) and
# ``issue([(dst, src), ...], after)`` → the group's completion event (``.query()``, ``.synchronize()``) or
# None; ``after``: events the copies must follow (another device's copies into memory given back).


class SyncEngine:
    """Plain memory (off CUDA): every copy on the host, now; nothing pending."""

    def is_async(self, src: torch.Tensor) -> bool:
        return False

    def issue(self, copies, after=()):
        for dst, src in copies:
            dst.copy_(src)
        return None


class SideStreamEngine:
    """Device-to-host copies on a side stream per device: it waits on the producing (current) stream
    through an event, the copies are queued on it, each source is kept from reuse until they ran
    (``record_stream``), and one completion event is recorded after them. No host sync."""

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

    def issue(self, copies, after=()):
        dev = copies[0][1].device
        side = self.stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        for ev in after:  # (on the device: no host sync)
            side.wait_event(ev)
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


@dataclasses.dataclass
class PoolStats:
    """The pool's state and lifetime counters (``HostPool.stats()``), plain Python numbers."""

    budget_bytes: int
    held_bytes: int  # slabs (pinned when ``pinned``)
    in_use_bytes: int  # leased to stores
    free_bytes: int
    largest_free_bytes: int
    peak_in_use_bytes: int
    slabs: int
    slab_allocs: int  # allocations the pool made (reserve() and request-path growth)
    slab_alloc_seconds: float
    slab_frees: int  # trim() only: serving never frees
    hits: int
    misses: int
    refusals: int  # HostPoolExhausted raised
    gc_runs: int
    pinned: bool
    pow2_slabs: bool
    min_slab_bytes: int


class HostPool:
    """Pinned host memory for exact stores (module docstring). ``budget_bytes``: the most the pool may
    hold (None: ``default_budget()``; an int or ``"48G"``); ``min_slab_bytes``: the smallest slab (1 GiB;
    ``WITCERT_HOST_POOL_SLAB_BYTES``); ``pin``: pinned memory (only where CUDA is available: elsewhere
    plain memory); ``allocator(nbytes) -> uint8 tensor`` and ``engine`` may be injected (tests);
    ``pow2``: slabs are powers of two (default: when PyTorch's pinned allocator, which rounds up to
    one, makes them)."""

    _default: "HostPool | None" = None
    _default_lock = threading.Lock()

    def __init__(self, budget_bytes=None, *, min_slab_bytes=None, pin: bool = True, allocator=None, engine=None,
                 pow2: bool | None = None):
        self.pin = bool(pin) and torch.cuda.is_available()
        self._allocator = allocator or (_pinned_alloc if self.pin else _plain_alloc)
        self.pow2 = (allocator is None and self.pin) if pow2 is None else bool(pow2)
        self.budget = default_budget() if budget_bytes is None else parse_bytes(budget_bytes)
        self.min_slab = self._slab_floor(min_slab_bytes if min_slab_bytes is not None
                                         else os.environ.get(ENV_SLAB, DEFAULT_MIN_SLAB))
        self.engine = engine or (SideStreamEngine() if self.pin else SyncEngine())
        self._lock = threading.RLock()
        self._slabs: dict[int, _Slab] = {}
        self._next_id = 0
        self._later = collections.deque()  # releases from finalizers (any time: applied under the lock)
        self._fences: dict = {}  # device → the newest completion event a store gave memory back with
        self._released: dict = {}  # the same, kept: another device's copies wait for it (foreign_fences)
        self.held = self.in_use = self.peak_in_use = 0
        self.slab_allocs = self.slab_frees = self.hits = self.misses = self.refusals = self.gc_runs = 0
        self.slab_alloc_seconds = 0.0

    def _slab_floor(self, v) -> int:
        ms = max(parse_bytes(v), ALIGN)
        return _pow2_ceil(ms) if self.pow2 else align(ms)

    # -- the process-wide pool
    @classmethod
    def default(cls) -> "HostPool | None":
        """The process-wide pool (made at first use), or None when ``WITCERT_HOST_POOL`` is off."""
        if os.environ.get(ENV_MODE, "on").strip().lower() in _OFF:
            return None
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
                log.info("witcert host pool: budget %s, slabs of at least %s", fmt_bytes(cls._default.budget),
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
                p.min_slab = p._slab_floor(min_slab_bytes)
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
        ``cost`` as an allocation on the request path). ``HostPoolExhausted`` when the budget cannot."""
        nbytes = align(max(1, nbytes))
        min_bytes = min(nbytes, align(max(1, min_bytes or nbytes)))
        with self._lock:
            self._drain()
            lease = self._take(nbytes, min_bytes, partial=False)
            if lease is None and self.in_use and self._collect(cost):  # a dropped cache in a reference cycle gives memory back
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

    def _collect(self, cost) -> bool:
        """Run the garbage collector once (a cache's layers reference their cache: a dropped cache is freed
        by the cycle collector, not at once) and apply what it gave back; whether anything came back."""
        before = len(self._later)
        gc.collect()
        self.gc_runs += 1
        if cost is not None:
            cost.fallback("pool_gc")
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
                continue  # trimmed (a slab is trimmed only when wholly free: not reached)
            self._insert(slab, lease.offset, lease.nbytes)
            self.in_use -= lease.nbytes
            if cost is not None:
                cost.hold(-lease.nbytes)
        if fence is not None:  # the newest: the side stream runs in order, it covers the older ones
            self._fences[device] = self._released[device] = fence

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

    def foreign_fences(self, device) -> list:
        """The newest release events of other devices' side streams: copies on ``device`` into pool memory
        wait for them on the device (one process serving from several GPUs; none with one device)."""
        with self._lock:
            self._drain()
            return [ev for d, ev in self._released.items() if d != device]

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

    def _refuse(self, asked: int, what: str) -> None:
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
            cost.allocated(slab.nbytes, dt)
            log_once("slab", "witcert host pool: a request pinned a %s slab on the request path (%.3f s; the pool "
                     "now holds %s of a %s budget). Pin ahead, off the request path: witcert.cache.reserve_host("
                     "config, batch, tokens) or HostPool.default().reserve(bytes) (logged once).",
                     fmt_bytes(slab.nbytes), dt, fmt_bytes(self.held), fmt_bytes(self.budget))

    def _grow(self, nbytes: int, min_bytes: int, cost) -> None:
        """One new slab holding ``nbytes`` if the budget allows, else the largest the budget allows if it
        holds ``min_bytes``; else ``HostPoolExhausted``."""
        size = max(nbytes, self.min_slab)
        size = _pow2_ceil(size) if self.pow2 else align(size)
        room = self._room()
        if size > room:
            size = _pow2_floor(room) if self.pow2 else room - room % ALIGN
            if size < min_bytes:
                self._refuse(min_bytes, "an exact store chunk")
        self._new_slab(size, cost)

    def _plan(self, deficit: int) -> list[int]:
        """Slab sizes adding up to at least ``deficit`` (few, large; powers of two when ``pow2``)."""
        if not self.pow2:
            return [max(align(deficit), self.min_slab)]
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
        nbytes = align(nbytes)
        with self._lock:
            self._drain()
            if self.free_bytes < nbytes and self.in_use:
                self._collect(cost)
            deficit = nbytes - self.free_bytes
            if deficit <= 0:
                return 0
            sizes = self._plan(deficit)
            if sum(sizes) > self._room():  # the last slab at its need rather than the minimum, if that fits
                rest = deficit - sum(sizes[:-1])
                sizes[-1] = _pow2_ceil(rest) if self.pow2 else align(rest)
                if sum(sizes) > self._room():
                    self._refuse(deficit, what)
            for s in sizes:
                self._new_slab(s, cost)
            return sum(sizes)

    def reserve(self, nbytes) -> int:
        """Pin enough slabs, now, for ``nbytes`` to be free (call it at start-up: off the request path)."""
        return self.ensure_free(parse_bytes(nbytes), None, "reserve()")

    def trim(self) -> int:
        """Free the slabs nothing is leased from (never on the request path: between phases of a benchmark,
        or to give memory back to the host); the bytes freed. Pinned: PyTorch's cached blocks are emptied."""
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
            torch._C._host_emptyCache()
        return freed

    def stats(self) -> PoolStats:
        """The pool's state and counters."""
        with self._lock:
            self._drain()
            largest = max((e[1] for s in self._slabs.values() for e in s.free), default=0)
            return PoolStats(budget_bytes=self.budget, held_bytes=self.held, in_use_bytes=self.in_use,
                             free_bytes=self.free_bytes, largest_free_bytes=largest, peak_in_use_bytes=self.peak_in_use,
                             slabs=len(self._slabs), slab_allocs=self.slab_allocs,
                             slab_alloc_seconds=float(self.slab_alloc_seconds), slab_frees=self.slab_frees,
                             hits=self.hits, misses=self.misses, refusals=self.refusals, gc_runs=self.gc_runs,
                             pinned=self.pin, pow2_slabs=self.pow2, min_slab_bytes=self.min_slab)
