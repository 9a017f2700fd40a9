"""Issue 36: the SGLang meter against the real ``sglang==0.5.23`` pool classes on the CPU.

The pool modules need SGLang's server stack (torchvision, tvm_ffi, …); ``real_pool_modules``
imports them without it: a few third-party packages and two vision-config modules are stubbed
(``_Stub``: attribute access gives a placeholder), ``sglang.srt.configs`` is entered without its
``__init__`` and ``sglang.srt.model_executor.runner`` (the CUDA-graph runner) is a one-function
stand-in (``get_is_capture_mode() -> False``). The pool classes themselves, their
``set_kv_buffer`` / ``move_kv_cache`` / masked-write Triton kernel, are SGLang's own code.

Each hole of the issue has a test that measures the realised TV of what the decode served
(float64 softmax over the exact K/V the model handed the pool vs over the stored values) against
the record's TV⁺; each failed on the code before the fix (numbers in the docstrings).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import math
import os
import sys
import types
from unittest import mock

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402

D, HKV, GQ, SIZE = 64, 2, 2, 48
HQ = HKV * GQ
MAX_SPLITS = 2
STUB_ROOTS = {"tvm_ffi", "compressed_tensors", "IPython", "einops"}
STUB_LEAVES = ("sglang.srt.configs.deepseek_ocr", "sglang.srt.configs.internvl")


class _Meta(type):
    def __getattr__(cls, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return mock.MagicMock(name=f"{cls.__name__}.{n}")


class _Stub(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        m = _Meta(n, (), {"__module__": self.__name__}) if n[:1].isupper() else mock.MagicMock(name=f"{self.__name__}.{n}")
        setattr(self, n, m)
        return m


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUB_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, m):
        pass


def real_pool_modules():
    """(memory_pool, swa_memory_pool) of the installed SGLang, imported on the CPU (module doc)."""
    if ws.POOL_MODULE in sys.modules:
        return sys.modules[ws.POOL_MODULE], sys.modules["sglang.srt.mem_cache.swa_memory_pool"]
    finder = _Finder()
    sys.meta_path.append(finder)
    try:
        ws.import_bare("sglang.srt")
        root = os.path.dirname(importlib.util.find_spec("sglang").origin)
        name = "sglang.srt.configs"
        if name not in sys.modules:
            p = os.path.join(root, "srt", "configs")
            m = _Stub(name)
            m.__path__ = [p]
            m.__file__ = os.path.join(p, "__init__.py")
            m.__spec__ = importlib.util.spec_from_file_location(name, m.__file__, submodule_search_locations=[p])
            sys.modules[name] = m
        for leaf in STUB_LEAVES:
            sys.modules.setdefault(leaf, _Stub(leaf))
        r = types.ModuleType("sglang.srt.model_executor.runner")
        r.get_is_capture_mode = lambda: False
        sys.modules.setdefault(r.__name__, r)
        mp = importlib.import_module(ws.POOL_MODULE)
        sw = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
    finally:
        sys.meta_path.remove(finder)
    return mp, sw


MP, SW = real_pool_modules()
SGL = ws.import_bare(ws.DECODE_MODULE)
ORIG_DECODE = SGL.decode_attention_fwd
ORIG_POOL = {n: MP.MHATokenToKVPool.__dict__[n] for n in ("set_kv_buffer", "move_kv_cache", "load_cpu_copy",
                                                          "set_kv_buffer_prefix_valid", "_finalize_backing_tokens")}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(ws.ENV, raising=False)
    ws.uninstall()
    yield
    ws.uninstall()
    assert SGL.decode_attention_fwd is ORIG_DECODE
    assert all(MP.MHATokenToKVPool.__dict__[n] is f for n, f in ORIG_POOL.items())


class _Layer:
    def __init__(self, layer_id):
        self.layer_id = layer_id


def mha(dtype=torch.float8_e4m3fn, layers=2, size=SIZE):
    p = MP.MHATokenToKVPool(size=size, page_size=1, dtype=dtype, head_num=HKV, head_dim=D, layer_num=layers,
                            device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    p.use_native_move_kv_cache = True  # the Triton all-layer copy needs data pointers of a GPU
    return p


def install():
    recs = []
    ws.install(force=True, bare=True, on_record=lambda layer, rec: recs.append((layer, rec)))
    return recs


def kv(n, seed, scale=1.0, exact=False):
    """Exact K/V ([n, HKV, D] float32): ``exact``: values an fp8 e4m3 code holds (residual 0)."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(n, HKV, D, generator=g) * scale, torch.randn(n, HKV, D, generator=g) * scale
    if exact:
        k, v = k.to(torch.float8_e4m3fn).float(), v.to(torch.float8_e4m3fn).float()
    else:  # halfway between two fp8 codes: the largest rounding residual
        k[..., :8] = (k[..., :8].to(torch.float8_e4m3fn).float() * 1.0625)
    return k, v


def decode(kb, vb, q, rows, ks=1.0, vs=1.0):
    """SGLang's (patched) ``decode_attention_fwd`` over token slots ``rows`` (a list per request)."""
    Bsz = q.shape[0]
    slots = torch.tensor([s for r in rows for s in r], dtype=torch.int32)
    indptr = torch.tensor([0] + list(torch.tensor([len(r) for r in rows]).cumsum(0)), dtype=torch.int32)
    o = torch.zeros(Bsz, HQ, D, dtype=q.dtype)
    logits = torch.zeros(Bsz, HQ, MAX_SPLITS, D, dtype=torch.float32)
    lse = torch.zeros(Bsz, HQ, MAX_SPLITS, dtype=torch.float32)
    SGL.decode_attention_fwd(q, kb, vb, o, indptr, slots, logits, lse, torch.full((Bsz,), MAX_SPLITS, dtype=torch.int32),
                             MAX_SPLITS, 1 / math.sqrt(D), ks, vs)
    return o


def realised_tv(q, served_k, exact_k, rows):
    """[B, HQ] TV between softmax over the exact keys and over the served keys ([slot, HKV, D])."""
    tv = torch.zeros(q.shape[0], HQ, dtype=torch.float64)
    for b, r in enumerate(rows):
        s = torch.tensor(r)
        for h in range(HQ):
            qq = q[b, h].double() / math.sqrt(D)
            p = torch.softmax(exact_k[s, h // GQ].double() @ qq, 0)
            ph = torch.softmax(served_k[s, h // GQ].double() @ qq, 0)
            tv[b, h] = 0.5 * (p - ph).abs().sum()
    return tv


def served(buf, scale=1.0):
    return buf.view(torch.float8_e4m3fn).double() * float(torch.tensor(scale, dtype=torch.float32)) \
        if buf.dtype == torch.uint8 else buf.double() * scale


def query(seed, n=1, scale=6.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, HQ, D, generator=g) * scale).bfloat16()


class Exact:
    """What the model handed each slot of a layer (the reference of the realised TV)."""

    def __init__(self, size=SIZE + 1):
        self.k = torch.zeros(size, HKV, D, dtype=torch.float64)

    def write(self, loc, k):
        self.k[loc] = k.double()

    def move(self, tgt, src):
        self.k[tgt] = self.k[src].clone()


def write(pool, layer, loc, k, v, ex=None, **kw):
    pool.set_kv_buffer(_Layer(layer), loc, k.clone(), v.clone(), **kw)
    if ex is not None:
        ex.write(loc, k)


def check(recs, q, kb, ex, rows, ks=1.0):
    """(realised TV, TV⁺) of the last record."""
    tv = realised_tv(q, served(kb, ks), ex.k, rows)
    return tv, recs[-1][1].tv_upper_a.double()


# ---------------------------------------------------------------- hole 2: move_kv_cache


def test_move_kv_cache_carries_witnesses():
    """Issue 36 (2): before the fix the moved tokens kept the target slots' old witnesses (0 here):
    realised TV 0.0092 against TV⁺ 0.00021 on this input (after: TV⁺ 0.12)."""
    pool, ex = mha(), Exact()
    recs = install()
    src, tgt = torch.arange(0, 8), torch.arange(20, 28)
    ka, va = kv(8, 1)  # lossy in fp8
    kb_, vb_ = kv(8, 2, exact=True)  # exact in fp8: witness 0
    write(pool, 0, src, ka, va, ex)
    write(pool, 0, tgt, kb_, vb_, ex)
    pool.move_kv_cache(tgt, src)
    ex.move(tgt, src)
    assert torch.equal(pool.k_buffer[0][tgt], pool.k_buffer[0][src])  # SGLang's own move ran
    q = query(3, 1, scale=1.0).expand(2, HQ, D).contiguous()
    rows = [tgt.tolist(), src.tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert tv[0].max() > 1e-3  # the moved row is lossy
    assert (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert torch.allclose(tvp[0], tvp[1], rtol=1e-3)  # the same tokens and witnesses: the same bound
    assert tvp.max() < 1  # metered, not saturated


def test_move_checks_the_moved_bytes():
    """A move that does not copy what it was asked to (here: SGLang's move replaced by one that
    writes other bytes) leaves its targets unmetered (TV⁺ 1), never with the sources' witnesses."""
    pool = mha()
    recs = install()
    src, tgt = torch.arange(0, 4), torch.arange(10, 14)
    write(pool, 0, src, *kv(4, 1))
    write(pool, 0, tgt, *kv(4, 2))
    orig = ws._ORIGINALS["pool:move_kv_cache"][2]

    def wrong(self, tgt_loc, src_loc):
        orig(self, tgt_loc, src_loc)
        self.k_buffer[0][tgt_loc[:1]] = 0  # the first target's K is not what was moved
        self.v_buffer[0][tgt_loc[1:2]] = 0  # nor the second's V

    installed = MP.MHATokenToKVPool.move_kv_cache
    from witcert.integrations import sglang_pool

    MP.MHATokenToKVPool.move_kv_cache = sglang_pool.wrap_move_kv_cache(wrong)
    try:
        pool.move_kv_cache(tgt, src)
    finally:
        MP.MHATokenToKVPool.move_kv_cache = installed
    q = query(4, 4, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [tgt[:1].tolist(), tgt[1:2].tolist(), tgt[2:].tolist(), src.tolist()])
    tvp = recs[-1][1].tv_upper_a
    assert (tvp[:2] == 1).all() and (tvp[2:] < 1).all()
    assert recs[-1][1].flag[:2].all()


# ---------------------------------------------------------------- hole 1: hybrid (SWA) pools


def test_swa_and_full_layers_do_not_share_witnesses():
    """Issue 36 (1): SWAKVPool writes its sub-pools with ``layer_id_override`` = the pool-local id,
    so the full layer 1 and the SWA layer 0 were both "layer 0": the SWA write (exact values,
    witness 0) overwrote the full layer's witnesses. Before the fix: realised TV 0.0092 against
    TV⁺ 0.00021 on the full layer."""
    pool = SW.SWAKVPool(size=SIZE, size_swa=SIZE, page_size=1, dtype=torch.float8_e4m3fn, head_num=HKV, head_dim=D,
                        swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu",
                        enable_memory_saver=False, enable_alt_stream=False)
    recs = install()
    full_ex, swa_ex = Exact(), Exact()
    loc = torch.arange(5, 13)
    kf, vf = kv(8, 1)  # lossy
    ks_, vs_ = kv(8, 2, exact=True)
    pool.set_kv_buffer(_Layer(1), loc, kf.clone(), vf.clone())  # the full layer
    full_ex.write(loc, kf)
    pool.set_kv_buffer(_Layer(0), MP.KVWriteLoc(loc=loc, swa_loc=loc), ks_.clone(), vs_.clone())  # the SWA layer
    swa_ex.write(loc, ks_)
    q = query(3, 1, scale=1.0)
    fk, fv = pool.full_kv_pool.k_buffer[0], pool.full_kv_pool.v_buffer[0]
    decode(fk, fv, q, [loc.tolist()])
    tv, tvp = check(recs, q, fk, full_ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert recs[-1][0] == 1  # the model's layer id, not the sub-pool's
    sk, sv = pool.swa_kv_pool.k_buffer[0], pool.swa_kv_pool.v_buffer[0]
    decode(sk, sv, q, [loc.tolist()])
    tv, tvp = check(recs, q, sk, swa_ex, [loc.tolist()])
    assert recs[-1][0] == 0 and (tv == 0).all() and (tvp < 1e-3).all()


# ---------------------------------------------------------------- hole 3: dcp_kv_mask


def test_masked_dcp_write_is_recorded():
    """Issue 36 (3): a write through ``dcp_kv_mask`` (SGLang's masked Triton kernel) was not
    recorded: the slots kept the witnesses of what they held before (0: exact values). Before
    the fix: realised TV 0.0083 against TV⁺ 0.00021."""
    pool, ex = mha(), Exact()
    recs = install()
    loc = torch.arange(0, 8)
    write(pool, 0, loc, *kv(8, 2, exact=True), ex)
    k, v = kv(8, 1)
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.int32)  # slot 6 belongs to another rank
    pool.set_kv_buffer(_Layer(0), loc, k.clone(), v.clone(), dcp_kv_mask=mask)
    ex.write(loc[mask.bool()], k[mask.bool()])
    kept = kv(8, 2, exact=True)[0][6]
    assert torch.equal(served(pool.k_buffer[0])[6].float(), kept)  # SGLang did not write slot 6
    q = query(3, 1, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [loc.tolist()])
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tv <= tvp).all() and (tvp < 1).all(), (tv.max().item(), tvp.min().item())


# ---------------------------------------------------------------- hole 4: a failing recorder


def test_failing_recorder_leaves_unmetered_slots(monkeypatch):
    """Issue 36 (4): an exception in the recorder dropped the layer; the next write made a new
    side with zero witnesses for every older slot. Before the fix: realised TV 0.0176 against
    TV⁺ 0.00011 (the failed write's slots; 0.0092 against 0.00011 on the older ones). Now the failed write's slots are
    unmetered (TV⁺ 1) and the
    older slots keep their witnesses."""
    pool, ex = mha(), Exact()
    recs = install()
    old, failed, new = torch.arange(0, 8), torch.arange(8, 12), torch.arange(12, 16)
    write(pool, 0, old, *kv(8, 1), ex)
    real = ws.record_write
    monkeypatch.setattr(ws, "record_write", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected")))
    write(pool, 0, failed, *kv(4, 4), ex)
    monkeypatch.setattr(ws, "record_write", real)
    write(pool, 0, new, *kv(4, 5), ex)
    assert any("injected" in w for w in ws.STATE.unmetered)
    q = query(3, 1, scale=1.0).expand(3, HQ, D).contiguous()
    rows = [old.tolist(), failed.tolist(), new.tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert tv[0].max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert (tvp[0] < 1).all() and (tvp[1] == 1).all() and (tvp[2] < 1).all()


def test_fresh_side_starts_unmetered():
    """Slots a recorded write has not seen (written before the meter registered the buffer)
    are unmetered: a side is born with every slot's bit set. Before the fix: TV⁺ 0.0001 on them."""
    pool = mha()
    pool.set_kv_buffer(_Layer(0), torch.arange(0, 4), *kv(4, 1))  # before install
    recs = install()
    pool.set_kv_buffer(_Layer(0), torch.arange(4, 8), *kv(4, 2))
    q = query(3, 2, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [[0, 1, 2, 3], [4, 5, 6, 7]])
    tvp = recs[-1][1].tv_upper_a
    assert (tvp[0] == 1).all() and (tvp[1] < 1).all()


# ---------------------------------------------------------------- a row without tokens; the scale's dtype


def test_empty_row_gives_the_references_zero_not_nan():
    """A request row with no token (SGLang's decode never sends one) and a fully masked row of
    the kernel: output 0 and TV⁺ / output bound 0, no flag, as ``witcert.meter.softmax``
    gives (before: NaN output, TV⁺ 1, bound inf, flagged)."""
    import numpy as np

    from kernels.decode import decode as kdecode
    from witcert.meter import measure, softmax

    pool = mha()
    recs = install()
    write(pool, 0, torch.arange(0, 4), *kv(4, 1))
    q = query(3, 2, scale=1.0)
    o = decode(pool.k_buffer[0], pool.v_buffer[0], q, [[], [0, 1, 2, 3]])
    r = recs[-1][1]
    assert torch.isfinite(o).all() and (o[0] == 0).all() and (o[1] != 0).any()
    assert (r.tv_upper_a[0] == 0).all() and (r.out_err_upper[0] == 0).all() and not r.flag[0].any()
    assert (r.tv_upper_a[1] > 0).all()
    dead = torch.zeros(1, 4, dtype=torch.bool)
    p, live = softmax(torch.zeros(1, 4, dtype=torch.float64), dead)
    assert (p == 0).all() and not live.any()  # the reference's dead row: p̂ = 0 (output 0) …
    assert float(measure(np.zeros((1, 4)), np.full((1, 4), 0.5), mask=dead.numpy()).tv.max()) == 0  # … and TV⁺ 0
    # the kernel itself, a fully masked row of a token_mask
    side = ws.side_of(pool.k_buffer[0])
    cache = ws.paged_view(side, pool.k_buffer[0], pool.v_buffer[0], 1.0, 1.0)
    bt = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]], dtype=torch.int32)
    tm = torch.tensor([[False] * 4, [True] * 4])
    out = kdecode(cache, q, bt, torch.tensor([4, 4], dtype=torch.int32), token_mask=tm)
    assert torch.isfinite(out.o).all() and (out.o[0] == 0).all() and torch.isneginf(out.lse[0]).all()
    assert (out.meter.tv_upper_a[0] == 0).all() and (out.meter.out_err_upper[0] == 0).all()
    assert not out.meter.flag[0].any() and (out.meter.tv_upper_a[1] > 0).all()


def test_witness_uses_the_kernels_fp32_scale():
    """The kernel applies k_scale as float32 (``paged_view`` hands it a float32 tensor), so its
    k̂ = code · fp32(k_scale). A witness against the float64 scale can undershoot that residual:
    k_scale = 2^10 (1 + 2^-25) (fp32: 2^10), k = 2^10 (1 + 2^-23) stored as code 1: ‖k̂ − k‖ is
    2^-13 per entry against the kernel's k̂ = 2^10, but 3·2^-15 against 2^10 (1 + 2^-25) (the old
    witness: 0.75x the residual). Pinned: the witness is ≥ the residual against fp32(k_scale) (and equals it,
    rounded up, within the fp16 rounding)."""
    ks = 1024 * (1.0 + 2.0**-25)
    assert ws.kernel_scale(ks) == 1024.0 and ws.kernel_scale(torch.tensor(0.1)) == float(torch.tensor(0.1))
    pool = mha()
    install()
    k = torch.full((1, HKV, D), 1024 * (1.0 + 2.0**-23))
    v = torch.full((1, HKV, D), 1024.0)
    pool.set_kv_buffer(_Layer(0), torch.tensor([3]), k.clone(), v.clone(), ks, ks)
    side = ws.side_of(pool.k_buffer[0])
    code = pool.k_buffer[0][3].view(torch.float8_e4m3fn).double()
    assert (code == 1).all()
    resid32 = (code * ws.kernel_scale(ks) - k[0].double()).norm(dim=-1)  # what the kernel's k̂ misses
    resid64 = (code * ks - k[0].double()).norm(dim=-1)
    w = side.k_wit[3, :, 0, 0].double()
    assert (resid64 < resid32).all()  # the float64 witness would be too small
    assert (w >= resid32).all() and (w <= resid32 * (1 + 2.0**-9)).all()
    assert not side.bad[3]


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
