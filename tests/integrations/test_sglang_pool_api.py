"""Issue 36: the SGLang meter against the real ``sglang==0.5.23`` pool classes on the CPU, the API side: every
public KV-writing method of a pool class of the pinned SGLang and every allocator is wrapped or audited, a host
load marks device slots unmetered, the switch off is bit-identical, and a reused slot written outside the pool is
unmetered. The holes of the issue: ``test_sglang_pool.py``; the stubbed import of the pool modules and the
shared helpers: ``tests.helpers.sglang_pool``."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import types

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
from tests.helpers.sglang_pool import (  # noqa: E402
    HKV,
    MP,
    ORIG_DECODE,
    ORIG_POOL,
    SGL,
    SIZE,
    D,
    Exact,
    _clean,  # noqa: E402, F401  (the autouse fixture)
    _Layer,
    check,
    decode,
    install,
    kv,
    mha,
    query,
    write,
)

# ---------------------------------------------------------------- the pool API, enumerated


def _kv_write_methods():
    """{"Class.method"} of every public method, defined by a pool class of the pinned SGLang's
    device-pool and host-pool modules, whose name suggests a KV write (sglang_pool.WRITE_NAME)."""
    from witcert.integrations import sglang_pool as P

    found, classes = set(), {}
    for mname in P.POOL_MODULES + P.HOST_MODULES:
        mod = importlib.import_module(mname)
        for cname, cls in vars(mod).items():
            if not inspect.isclass(cls) or cls.__module__ != mname:
                continue
            is_pool = issubclass(cls, MP.KVCache)
            is_host = any(hasattr(cls, n) for n in P.HOST_LOADS)
            if not (is_pool or is_host):
                continue
            classes[cname] = cls
            for n, f in vars(cls).items():
                if not n.startswith("_") and callable(getattr(cls, n, None)) and P.WRITE_NAME.search(n):
                    found.add(f"{cname}.{n}")
    return found, classes


def _unaccounted(found, classes):
    """The "Class.method" of ``found`` in none of sglang_pool's lists."""
    from witcert.integrations import sglang_pool as P

    missing = []
    for qual in sorted(found):
        cname, n = qual.split(".")
        if cname in P.UNREGISTERED:
            continue
        if cname == "MHATokenToKVPool" and n in P.WRAPPED:
            continue
        if n in P.HOST_LOADS:
            continue
        if qual not in P.AUDITED:
            missing.append(qual)
    return missing


def test_every_kv_writing_pool_method_is_wrapped_or_audited():
    """Fails when the pinned SGLang grows a KV-writing pool method (or pool class) that is in
    none of sglang_pool's lists: wrapped on MHATokenToKVPool, wrapped on a host pool (every
    ``load_to_device_per_layer[_physical]``), audited with a reason, or a pool class whose
    buffers are never registered."""
    import pkgutil

    from witcert.integrations import sglang_pool as P

    host_pkg = importlib.import_module("sglang.srt.mem_cache.pool_host")
    on_disk = {f"sglang.srt.mem_cache.pool_host.{m.name}" for m in pkgutil.iter_modules(host_pkg.__path__)}
    walked = set(P.HOST_MODULES)
    # the host modules not walked define no device load (checked here, so a new one is noticed)
    for mname in sorted(on_disk - walked):
        mod = importlib.import_module(mname)
        assert not any(inspect.isclass(c) and c.__module__ == mname and any(n in c.__dict__ for n in P.HOST_LOADS)
                       for c in vars(mod).values()), f"{mname} loads into the device pool; add it to HOST_MODULES"
    found, classes = _kv_write_methods()
    assert _unaccounted(found, classes) == []
    # a new writing method on the metered class is noticed
    MP.MHATokenToKVPool.copy_kv_pages = lambda self, tgt, src: None
    try:
        assert _unaccounted(*_kv_write_methods()) == ["MHATokenToKVPool.copy_kv_pages"]
    finally:
        del MP.MHATokenToKVPool.copy_kv_pages
    # every pool class is metered (MHATokenToKVPool), a delegating composite, or unregistered
    pools = {c for c, k in classes.items() if issubclass(k, MP.KVCache)}
    assert pools - set(P.UNREGISTERED) == {"KVCache", "MHATokenToKVPool", "BaseSWAKVPool", "SWAKVPool"}
    # and after install() every wrapped one is the wrapper, on the class itself
    ws.install(force=True, bare=True)
    for n, kind in P.WRAPPED.items():
        assert MP.MHATokenToKVPool.__dict__[n].__witcert__ == kind
    for cname, cls in classes.items():
        for n in P.HOST_LOADS:
            if n in cls.__dict__:
                assert cls.__dict__[n].__witcert__ == "poison", f"{cname}.{n}"
    # an unregistered subclass inheriting the wrapped write records nothing: no side, decode unmetered
    pm = MP.PageMajorMHATokenToKVPool.__new__(MP.PageMajorMHATokenToKVPool)
    assert ws._recordable(pm, torch.zeros(4, HKV, D)) is not None
    ws.uninstall()
    assert all(MP.MHATokenToKVPool.__dict__[n] is f for n, f in ORIG_POOL.items())
    host = importlib.import_module("sglang.srt.mem_cache.pool_host.mha").MHATokenToKVPoolHost
    assert not hasattr(host.__dict__["load_to_device_per_layer"], "__witcert__")


def test_host_load_marks_device_slots_unmetered():
    """HiCache: a host pool's ``load_to_device_per_layer`` writes the device buffers by transfer
    kernels (no pool method): the loaded slots become unmetered (TV⁺ 1) until rewritten. The
    loader here is a CPU stand-in with the real method's signature (the real one needs
    sgl_kernel's transfer ops); ``install()`` wraps the real classes (test above)."""
    from witcert.integrations import sglang_pool as P

    host_cls = importlib.import_module("sglang.srt.mem_cache.pool_host.mha").MHATokenToKVPoolHost
    real = host_cls.__dict__["load_to_device_per_layer"]

    def loader(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
        device_pool.k_buffer[layer_id][device_indices] = self.k[host_indices]
        device_pool.v_buffer[layer_id][device_indices] = self.v[host_indices]

    loader.__signature__ = inspect.signature(real)
    pool = mha()
    recs = install()
    write(pool, 0, torch.arange(0, 8), *kv(8, 1))
    host = types.SimpleNamespace(k=pool.k_buffer[0][:8].clone() * 0 + 0x30, v=pool.v_buffer[0][:8].clone())
    P.wrap_host_load(loader)(host, pool, torch.arange(0, 4), torch.arange(0, 4), 0, "direct")
    q = query(3, 2, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [[0, 1, 2, 3], [4, 5, 6, 7]])
    tvp = recs[-1][1].tv_upper_a
    assert (tvp[0] == 1).all() and (tvp[1] < 1).all()
    write(pool, 0, torch.arange(0, 4), *kv(4, 2))  # rewritten through the pool: metered again
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert (recs[-1][1].tv_upper_a < 1).all()


def test_switch_off_real_pool_is_bit_identical():
    """WITCERT_SGLANG unset: install() touches nothing; the real pool's writes and moves and
    SGLang's decode give the same bytes as without WitCert imported at all."""
    assert ws.install() is None and not ws.installed()
    assert all(MP.MHATokenToKVPool.__dict__[n] is f for n, f in ORIG_POOL.items())
    a = mha()
    k, v = kv(8, 1)
    a.set_kv_buffer(_Layer(0), torch.arange(0, 8), k.clone(), v.clone(), 0.5, 0.5)
    a.move_kv_cache(torch.arange(20, 24), torch.arange(0, 4))
    b = mha()
    ORIG_POOL["set_kv_buffer"](b, _Layer(0), torch.arange(0, 8), k.clone(), v.clone(), 0.5, 0.5)
    ORIG_POOL["move_kv_cache"](b, torch.arange(20, 24), torch.arange(0, 4))
    for x, y in zip(a.k_buffer + a.v_buffer, b.k_buffer + b.v_buffer):
        assert torch.equal(x, y)
    assert SGL.decode_attention_fwd is ORIG_DECODE and ws.side_of(a.k_buffer[0]) is None


# ---------------------------------------------------------------- allocators: a reused slot


def _allocator_modules():
    from witcert.integrations import sglang_pool as P

    pkg = importlib.import_module("sglang.srt.mem_cache.allocator")
    import pkgutil

    return {f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)}, P


def test_every_allocator_is_wrapped_or_audited():
    """Every allocator class of the pinned SGLang is wrapped (its ``alloc*`` mark the slots they
    hand out unmetered) or audited with a reason; after install() each wrapped method is ours."""
    mods, P = _allocator_modules()
    classes = {}
    for mname in sorted(mods):
        mod = importlib.import_module(mname)
        for cname, cls in vars(mod).items():
            if inspect.isclass(cls) and cls.__module__ == mname and any(n.startswith("alloc") for n in vars(cls)):
                classes[cname] = cls
    wrapped = {c for by in P.ALLOC_WRAPPED.values() for c in by}
    assert set(classes) - wrapped - set(P.ALLOC_AUDITED) == set(), "allocator classes neither wrapped nor audited"
    ws.install(force=True, bare=True)
    try:
        for mname, by in P.ALLOC_WRAPPED.items():
            mod = importlib.import_module(mname)
            for cname, names in by.items():
                own = [n for n in vars(getattr(mod, cname)) if n.startswith("alloc") and not n.startswith("alloc_group")]
                assert set(own) <= set(names), f"{cname}: unwrapped {set(own) - set(names)}"
                for n in names:
                    assert getattr(mod, cname).__dict__[n].__witcert__ == "poison"
    finally:
        ws.uninstall()
    tok = importlib.import_module("sglang.srt.mem_cache.allocator.token").TokenToKVPoolAllocator
    assert not hasattr(tok.__dict__["alloc"], "__witcert__")


def test_reused_slot_written_outside_the_pool_is_unmetered():
    """A slot recorded, freed, reallocated and then filled by a writer outside the pool's methods
    (as a PD-disaggregation transfer engine writes through raw pointers) must not keep its old
    witness: the allocator's ``alloc`` marks what it hands out unmetered. Without it: realised TV
    0.0092 against TV⁺ 0.00021 (the old tokens' exact witnesses 0)."""
    tok = importlib.import_module("sglang.srt.mem_cache.allocator.token").TokenToKVPoolAllocator
    pool, ex = mha(), Exact()
    allocator = tok(SIZE, torch.int64, "cpu", pool, False)
    recs = install()
    first = allocator.alloc(8)
    write(pool, 0, first, *kv(8, 2, exact=True), ex)  # recorded: witnesses 0
    assert allocator.alloc(SIZE - 8) is not None  # the rest in use: the next alloc reuses the freed ones
    allocator.free(first)
    again = allocator.alloc(8)
    assert set(again.tolist()) == set(first.tolist())  # the same slots, reused
    k, v = kv(8, 1)  # a transfer engine writes them directly (fp8 codes of a lossy K/V)
    pool.k_buffer[0][again] = k.to(torch.float8_e4m3fn).view(torch.uint8)
    pool.v_buffer[0][again] = v.to(torch.float8_e4m3fn).view(torch.uint8)
    ex.write(again, k)
    q = query(3, 1, scale=1.0)
    rows = [again.tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert tv.max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert (tvp == 1).all()
    write(pool, 0, again, k, v, ex)  # a recorded write makes them metered again
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert (tv <= tvp).all() and (tvp < 1).all()
