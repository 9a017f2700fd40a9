"""Shared helpers of the gated kernel path's tests (``tests/kernels/test_kernel_gate.py``,
``test_kernel_gate_cache.py``, ``test_overlay_adversarial.py``, ``tests/cache/test_graphs.py``,
``test_hostpool.py``, ``tests/kernels/test_kivi2_kernel.py``): paged caches with an exact copy, their
dequantization, repaired-page overlays, a tiny random Llama with kernel-sized heads, and ``guard_store`` (every
page-in leaves the exact store bit-identical)."""

import dataclasses
import math
import os

import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels.paged import PagedKV  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from kernels.write import write_kv  # noqa: E402
from witcert import schemes as S  # noqa: E402

D = 64
T = 16


def gauss_kv(Hkv, scale_k=2.0, scale_v=1.0, outlier=8.0):
    """kv_fn of ``build``: Gaussian K (two outlier channels: a visible quantization error) and V."""
    def kv(b, n, g):
        k = torch.randn(n, Hkv, D, generator=g) * scale_k
        k[..., :2] *= outlier
        v = torch.randn(n, Hkv, D, generator=g) * scale_v
        return k, v

    return kv


def build(scheme, lens, Hkv, seed=0, G=1, kv_fn=None, dtype=torch.bfloat16, block_size=T, spare=2, device=DEV):
    """A paged cache (``spare`` unused blocks, a random block table) holding sequence b's exact K/V
    ``kv_fn(b, n, generator)`` [n, Hkv, D] (default ``gauss_kv``) written by ``write_kv``;
    returns (cache, block table, [(k, v)] in ``dtype`` on the CPU)."""
    kv_fn = gauss_kv(Hkv) if kv_fn is None else kv_fn
    g = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / block_size) for n in lens]
    nb = sum(pages) + spare
    cache = PagedKV.allocate(nb, Hkv, D, scheme=scheme, block_size=block_size, num_groups=G, seed=seed % 97,
                             layer=seed % 5, device=device, model_dtype=dtype)
    perm = torch.randperm(nb, generator=g)
    bt = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    exact = []
    i = 0
    for b, n in enumerate(lens):
        bt[b, : pages[b]] = perm[i: i + pages[b]].int()
        i += pages[b]
        k, v = kv_fn(b, n, g)
        k, v = k.to(dtype), v.to(dtype)
        write_kv(cache, k.to(device), v.to(device), bt.to(device), torch.full((n,), b).to(device),
                 torch.arange(n).to(device))
        exact.append((k, v))
    return cache, bt, exact


def assert_served(o, o_ref, v):
    """The kernel's output against an fp64 reference over the served values ``v`` [n, D]: fp32 in the
    interpreter; on the GPU p̂·s_v is rounded to bf16 for the tensor-core dot (relative 2^-9 per
    term), the conformance suite's tolerance (tests/kernels/test_kernels_conformance.py)."""
    o = o.cpu().double()
    if DEV == "cpu":
        torch.testing.assert_close(o, o_ref, rtol=2e-4, atol=2e-4)
    else:
        assert (o - o_ref).norm() <= 1e-2 * (v.double().norm(dim=-1).max() + 1e-6)


def dequant(cache, bt, b, n, h):
    """fp64 k̂, v̂ of sequence b, kv head h (the served values of an unrepaired cache)."""
    j = torch.arange(n)
    blk = bt[b, j // T].long()
    off = j % T
    c = {f.name: getattr(cache, f.name).cpu() for f in dataclasses.fields(cache) if isinstance(getattr(cache, f.name), torch.Tensor)}
    if cache.scheme == "int4_group":
        def deq(codes, scale, zero):
            cc = codes[blk, h, off].long()
            cc = torch.cat([cc & 15, cc >> 4], dim=-1).double()
            gi = torch.arange(D) // 32
            return zero[blk, h, off][:, gi].double() + scale[blk, h, off][:, gi].double() * cc

        return deq(c["k_codes"], c["k_scale"], c["k_zero"]), deq(c["v_codes"], c["v_scale"], c["v_zero"])
    kc, vc = c["k_codes"][blk, h, off].double(), c["v_codes"][blk, h, off].double()
    ks, vs = c["k_scale"][blk, h, off].double()[:, None], c["v_scale"][blk, h, off].double()[:, None]
    if cache.scheme == "int8_dither":
        ch = torch.arange(D)
        uk = S.dither_u(cache.seed, cache.layer, h, j[:, None], ch, 0).double()
        uv = S.dither_u(cache.seed, cache.layer, h, j[:, None], ch, 1).double()
        return ks * (kc - uk), vs * (vc - uv)
    return ks * kc, vs * vc


def overlay_for(cache, bt, exact, pages):
    """An overlay with the (b, logical page, kv head) triples of ``pages`` repaired from ``exact``."""
    NB, Hkv = cache.k_codes.shape[:2]
    rep = RepairOverlay.allocate(NB, Hkv, T, D, torch.bfloat16, device=DEV, capacity=1).bind(cache)
    for b, pg, h in pages:
        k, v = exact[b]
        lo, hi = pg * T, min((pg + 1) * T, k.shape[0])
        assert rep.page_in(int(bt[b, pg]), h, k[lo:hi, h], v[lo:hi, h])
        assert not rep.page_in(int(bt[b, pg]), h, k[lo:hi, h], v[lo:hi, h])  # idempotent
    return rep


#: the tiny model's dtype: float32 in the interpreter, bf16 on the GPU (its tensor cores)
MODEL_DTYPE = torch.float32 if DEV == "cpu" else torch.bfloat16
ESIZE = torch.tensor([], dtype=MODEL_DTYPE).element_size()


def tiny_llama(seed=0):
    """A tiny random Llama with kernel-sized heads: 2 layers, 4 query heads over 2 kv heads, d = 64
    (on DEV, in MODEL_DTYPE)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from witcert.cache import use_witcert

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      num_hidden_layers=2, intermediate_size=128, vocab_size=128, max_position_embeddings=512)
    return use_witcert(LlamaForCausalLM(cfg).eval().to(DEV, MODEL_DTYPE))


def guard_store(monkeypatch):
    """Every page-in reads the exact store and leaves it bit-identical (checked around each call)."""
    from witcert.cache import WitCertLayer

    orig = WitCertLayer.page_in
    calls = []

    def checked(self, b, h, blk):
        before = (self.exact_k.clone(), self.exact_v.clone())
        nbytes = orig(self, b, h, blk)
        assert torch.equal(before[0], self.exact_k) and torch.equal(before[1], self.exact_v)
        calls.append((self.layer_idx, b, h, blk, nbytes))
        return nbytes

    monkeypatch.setattr(WitCertLayer, "page_in", checked)
    return calls
