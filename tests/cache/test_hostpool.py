"""The exact store's host pool (``witcert.hostpool``, issue 38) and what a request costs the host
(``witcert.hostcost``), on the CPU: this torch build has no pinned memory, so the pool runs on plain
memory with an injected allocator (counting its calls) and, where asynchrony matters, an injected copy
engine that defers every copy until its event is waited on (the side stream's contract: a copy reads
its source as it was when issued, lands in issue order, and the host sees it only after a wait)."""

import gc
import logging
import weakref

import numpy as np
import pytest
import torch

import witcert.hostcost as hc
from tests.helpers.kernel_gate import tiny_llama
from tests.helpers.tiny import tiny_model
from witcert.cache import WitCertCache, host_bytes, reserve_host
from witcert.hostpool import HostPool, HostPoolExhausted, fmt_bytes, parse_bytes
from witcert.store import INITIAL_CAPACITY, ExactStore, append_pair

pytestmark = pytest.mark.gpu  # in the device run (WITCERT_DEVICE=cuda): docs/testing.md

MiB = 1 << 20


class Counting:
    """An allocator that counts its calls and bytes (plain memory)."""

    def __init__(self):
        self.calls, self.bytes = 0, 0

    def __call__(self, nbytes):
        self.calls += 1
        self.bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8)


class _Event:
    def __init__(self, eng, k):
        self.eng, self.k = eng, k

    def query(self):
        return self.eng.done >= self.k

    def synchronize(self):
        self.eng.run_until(self.k)


class Deferred:
    """A copy engine whose copies land only when an event at or after them is waited on (or at
    ``flush``: the stream eventually runs everything), in issue order; ``defer=False``: host copies."""

    def __init__(self):
        self.queue, self.after, self.done, self.defer = [], [], 0, True

    def is_async(self, src):
        return self.defer

    def issue(self, copies, after=()):
        self.after.append(list(after))
        self.queue.append([(dst, src.clone()) for dst, src in copies])
        return _Event(self, len(self.queue))

    def run_until(self, k):
        while self.done < k:
            for dst, src in self.queue[self.done]:
                dst.copy_(src)
            self.done += 1

    def flush(self):
        self.run_until(len(self.queue))


def _pool(budget=64 * MiB, engine=None):
    alloc = Counting()
    return HostPool(budget, min_slab_bytes=MiB, allocator=alloc, engine=engine), alloc


def _gen(model, cache, n=40, new=4, B=1, seed=0):
    ids = torch.randint(3, 512, (B, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              attention_mask=torch.ones_like(ids), pad_token_id=2)


def _plain(x):
    """Whether ``x`` is made of plain Python values only (what summary()["host"] promises)."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    return x is None or type(x) in (int, float, bool, str)


def test_the_pool_allocates_once_and_serves_later_requests_and_caches_without_allocating():
    model = tiny_model()
    pool, alloc = _pool()
    ref = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, host_pool=False)
    want = _gen(model, ref)
    a = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, host_pool=pool)
    assert torch.equal(_gen(model, a), want)
    h = a.summary()["host"]
    assert h["mode"] == "pool" and _plain(h)
    assert alloc.calls == 1 and h["host_allocs"] == 1 and h["pool_misses"] == 0  # admitted: one slab, then hits
    assert h["pool_hits"] == 2 * len(a.layers) and h["pinned_bytes"] > 0 and h["pool"]["slab_frees"] == 0
    for la, lb in zip(a.layers, ref.layers):
        assert torch.equal(la.exact_k, lb.exact_k) and torch.equal(la.exact_v, lb.exact_v)
    held = pool.stats().held_bytes
    a.reset()  # the stores go back to the pool: kept, not freed
    assert a.summary()["host"]["pinned_bytes"] == 0 and pool.stats().in_use_bytes == 0
    assert torch.equal(_gen(model, a), want)
    b = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, host_pool=pool)
    assert torch.equal(_gen(model, b), want)
    for c in (a, b):
        h = c.summary()["host"]
        assert h["host_allocs"] == 0 and h["pool_misses"] == 0 and h["pool_hits"] == 2 * len(c.layers)
    s = pool.stats()
    assert alloc.calls == 1 and s.held_bytes == held and s.slab_frees == 0 and s.slabs == 1
    assert s.in_use_bytes == a.host_cost.pinned_bytes + b.host_cost.pinned_bytes == s.peak_in_use_bytes
    del b, c
    gc.collect()  # a dropped cache's stores go back (its finalizers), without a reset
    assert pool.stats().in_use_bytes == a.host_cost.pinned_bytes


def test_a_budget_that_cannot_hold_the_request_is_refused_before_anything_is_written():
    model = tiny_model()
    need = host_bytes(model.config, 1, INITIAL_CAPACITY, torch.float32)
    pool, alloc = _pool(budget=need // 2)
    c = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, host_pool=pool)
    with pytest.raises(HostPoolExhausted, match="budget") as e:
        _gen(model, c)
    assert "WITCERT_HOST_POOL_BYTES" in str(e.value)
    s = pool.stats()
    assert alloc.calls == 0 and s.held_bytes == 0 and s.refusals == 1
    assert all(len(la._ek) == 0 for la in c.layers if getattr(la, "is_initialized", False))
    pool.budget = need  # recoverable: a larger budget, a reset, the same request
    c.reset()
    _gen(model, c)
    assert alloc.calls == 1 and c.summary()["host"]["host_allocs"] == 1


def test_reserving_ahead_takes_the_allocation_off_the_request_path(caplog, monkeypatch):
    monkeypatch.setattr(hc, "_LOGGED", set())
    model = tiny_model()
    pool, alloc = _pool()
    with caplog.at_level(logging.INFO, logger="witcert.store"):
        added = reserve_host(model.config, 2, 64, torch.float32, pool=pool)
        assert added >= host_bytes(model.config, 2, 64, torch.float32) and alloc.calls == 1
        c = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, max_tokens=64, host_pool=pool)
        _gen(model, c, B=2)
        h = c.summary()["host"]
        assert h["host_allocs"] == 0 and h["pool_misses"] == 0 and alloc.calls == 1
        assert not any("request path" in r.getMessage() for r in caplog.records)
        # a cold pool grows on the request path: counted, and logged once for the process
        for _ in range(2):
            cold, _ = _pool()
            d = WitCertCache(model.config, scheme="int8", backend="reference", seed=1, host_pool=cold)
            _gen(model, d)
            assert d.summary()["host"]["host_allocs"] == 1
    assert sum("request path" in r.getMessage() for r in caplog.records) == 1


def test_appends_never_wait_and_a_read_waits_once():
    pool, _ = _pool(engine=Deferred())
    cost = hc.HostCost()
    k, v = (ExactStore(2, 3, 8, torch.float32, "cpu", pool=pool, cost=cost) for _ in range(2))
    g = torch.Generator().manual_seed(0)
    xk, xv = torch.randn(2, 3, 40, 8, generator=g), torch.randn(2, 3, 40, 8, generator=g)
    append_pair(k, v, xk, xv)
    for _ in range(3):  # decode steps: appends only
        yk, yv = torch.randn(2, 3, 1, 8, generator=g), torch.randn(2, 3, 1, 8, generator=g)
        append_pair(k, v, yk, yv)
        xk, xv = torch.cat([xk, yk], 2), torch.cat([xv, yv], 2)
    assert cost.syncs == {} and cost.d2h_copies == 8 and k._landed is v._landed
    assert not torch.equal(k._gather(0, 43).permute(1, 2, 0, 3), xk)  # not landed yet: reads must wait
    assert torch.equal(k.read(0, 43), xk) and torch.equal(v.read(0, 43), xv)
    assert cost.syncs == {"read": 1}  # one wait: the pair's event covers both stores and the earlier steps
    assert torch.equal(k.data, xk) and cost.syncs == {"read": 1}


def test_memory_given_back_with_copies_in_flight_is_fenced_before_a_host_write():
    eng = Deferred()
    pool, alloc = _pool(engine=eng)
    cost = hc.HostCost()
    a = ExactStore(1, 2, 8, torch.float32, "cpu", pool=pool, cost=cost)
    a.append(torch.full((1, 2, 100, 8), 7.0))  # in flight
    where = a._chunks[0].data_ptr()
    a.release()
    b = ExactStore(1, 2, 8, torch.float32, "cpu", pool=pool, cost=cost)
    eng.defer = False  # a host-side source: copied now, into the memory a just gave back
    x = torch.randn(1, 2, 100, 8, generator=torch.Generator().manual_seed(1))
    b.append(x)
    assert alloc.calls == 1 and pool.stats().hits == 1 and b._chunks[0].data_ptr() == where  # a's memory, reused
    eng.flush()  # whatever the side stream still had queued lands now
    assert torch.equal(b.read(0, 100), x), "a's late copy overwrote b's bytes"
    assert cost.syncs == {"host_write_fence": 1}


def test_copies_follow_memory_another_device_gave_back_with_copies_in_flight():
    """A process serving from two GPUs: a lease given back by a store whose copies ran on another
    device's side stream; the next copies into pool memory wait for them (on the device)."""
    eng = Deferred()
    pool, _ = _pool(engine=eng)
    a = ExactStore(1, 2, 8, torch.float32, "cpu", pool=pool)
    a.append(torch.ones(1, 2, 10, 8))
    pool.release(a._held.leases, a._landed, torch.device("meta"))  # as if a's copies ran on another device
    a._held.leases = []
    b = ExactStore(1, 2, 8, torch.float32, "cpu", pool=pool)
    b.append(torch.zeros(1, 2, 10, 8))
    assert eng.after[0] == [] and eng.after[1] == [a._landed]


def test_growth_past_the_budget_mid_request_is_an_error_and_the_store_is_unchanged():
    pool, alloc = _pool(budget=MiB)
    st = ExactStore(1, 4, 64, torch.float32, "cpu", pool=pool)  # 1 KiB a token: the slab holds 1024
    x = torch.randn(1, 4, 900, 64)
    st.append(x)
    with pytest.raises(HostPoolExhausted, match="exact store chunk"):
        st.append(torch.randn(1, 4, 300, 64))
    assert len(st) == 900 and torch.equal(st.read(0, 900), x) and alloc.calls == 1
    st.crop(0)  # a crop gives back the chunks past the kept tokens
    assert pool.stats().in_use_bytes == 0 and st.capacity == 0
    st.append(x[..., :10, :])
    assert torch.equal(st.data, x[..., :10, :]) and alloc.calls == 1


def test_graphed_decode_appends_from_the_stage_without_waiting():
    model = tiny_llama()
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(2))

    def run(**kw):
        c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True, **kw)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=c, max_new_tokens=3,
                                 min_new_tokens=3, do_sample=False, pad_token_id=0)
        return out, c

    want, ref = run(host_pool=False)
    eng = Deferred()
    pool, alloc = _pool(engine=eng)
    got, c = run(host_pool=pool)
    assert torch.equal(got, want)
    h = c.host_report()
    # the prefill's K / V (a group per layer) and 2 graphed steps (the last token is not written): a group each
    assert h.cost.d2h_copies == 2 * len(c.layers) * 3 and len(eng.queue) == len(c.layers) + 2
    assert "read" not in h.cost.syncs and "exact_k" not in h.cost.syncs and h.cost.host_allocs == 1
    for la, lr in zip(c.layers, ref.layers):
        assert torch.equal(la.exact_k, lr.exact_k) and torch.equal(la.exact_v, lr.exact_v)
    assert c.host_report().cost.syncs["exact_k"] == 1  # the first read waited for every queued step
    assert alloc.calls == 1 and np.isfinite(c.summary()["max_tv_a"]).all()


def test_host_cost_counts_by_reason_and_logs_each_reason_once(caplog, monkeypatch):
    monkeypatch.setattr(hc, "_LOGGED", set())
    a, b = hc.HostCost(), hc.HostCost()
    with caplog.at_level(logging.INFO, logger="witcert.store"):
        for cost in (a, b):
            cost.sync("gate")
            cost.sync("gate", 2)
            cost.fallback("pool_gc")
    assert a.syncs == {"gate": 3} and a.fallbacks == {"pool_gc": 1} and a.sync_total == 3
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("gate" in m for m in msgs) == 1 and sum("pool_gc" in m for m in msgs) == 1
    a.hold(100)
    a.allocated(100, 0.5)
    a.new_request()
    d = a.as_dict()
    assert d["pinned_bytes"] == 100 and d["host_allocs"] == 0 and d["syncs"] == {} and d["fallbacks_total"] == 0
    assert _plain(d)


@pytest.mark.parametrize("v,want", [("48G", 48 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), (4096, 4096),
                                    ("0.5T", 1 << 39)])
def test_parse_bytes(v, want):
    assert parse_bytes(v) == want
    assert parse_bytes(fmt_bytes(want)) == want  # (two decimals: exact for these)


@pytest.mark.parametrize("v", ["-1G", "lots", True, -5])
def test_parse_bytes_refuses(v):
    with pytest.raises(ValueError, match="bytes"):
        parse_bytes(v)


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_a_dropped_cache_gives_its_host_memory_back_at_once_without_the_cycle_collector(backend):
    """A layer refers to its cache weakly (``witcert.cache_layer``): a dropped cache is freed by reference
    counting, its stores' leases go back at once, and the next request in a full pool does not run
    ``gc.collect()`` on its path (0.26 s of a B 1 / 4K time to first token on the H200 before:
    bench/SERVING.md, "prefill profile"). With the collector off, the old reference cycle kept the first
    cache alive and the second request could not be served from the pool."""
    from tests.helpers.kernel_gate import MODEL_DTYPE

    model = tiny_model() if backend == "reference" else tiny_llama()
    dtype = torch.float32 if backend == "reference" else MODEL_DTYPE
    vocab = model.config.vocab_size
    pool, alloc = _pool(budget=host_bytes(model.config, 1, INITIAL_CAPACITY, dtype))

    def request():
        c = WitCertCache(model.config, scheme="int8", backend=backend, seed=1, host_pool=pool)
        ids = torch.randint(3, vocab, (1, 40), generator=torch.Generator().manual_seed(0)).to(model.device)
        with torch.no_grad():
            model.generate(ids, past_key_values=c, max_new_tokens=2, min_new_tokens=2, do_sample=False,
                           attention_mask=torch.ones_like(ids), pad_token_id=2)
        return c

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        a = request()
        assert pool.stats().in_use_bytes > 0 and (a.layers[0].paged is not None) == (backend == "kernel")
        gone = weakref.ref(a)
        del a
        assert gone() is None, "the cache outlived its last reference (a reference cycle)"
        assert pool.stats().in_use_bytes == 0
        b = request()
        s = pool.stats()
        assert s.gc_runs == 0 and s.misses == 0 and alloc.calls == 1 and s.in_use_bytes > 0  # one slab, reused
        assert b.summary()["host"]["pool_misses"] == 0
    finally:
        if enabled:
            gc.enable()
