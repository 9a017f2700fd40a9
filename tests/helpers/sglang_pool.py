"""Shared helpers of the SGLang pool tests (``tests/integrations/test_sglang_pool.py``,
``test_sglang_pool_api.py``): the real ``sglang==0.5.23`` pool modules imported without SGLang's server stack
(``real_pool_modules``: stubbed third-party packages, ``sglang.srt.configs`` without its ``__init__``), the
autouse fixture ``_clean`` (import it into a test module: no install leaks between tests), pools, writes, the
decode and the float64 realised TV. Import it only where ``sglang`` is installed."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import os
import sys
import types
from unittest import mock

import pytest
import torch

import witcert.integrations.sglang as ws

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
