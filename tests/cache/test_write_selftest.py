"""``witcert.selftest``: the once-per-process check of the compiled write kernel (its stored witnesses against the
norms of its stored codes) passes on every scheme, refuses a write whose witnesses fall short, and guards the kernel
path of ``WitCertCache``. On the CPU the write runs in Triton's interpreter; under ``WITCERT_DEVICE=cuda`` on the GPU."""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("WITCERT_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import write as W  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from witcert import selftest as ST  # noqa: E402

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
SCHEMES = ["int8", "int8_dither", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int4_group", "kivi2", "none"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(ST, "_CHECKED", set())


def _paged(scheme, sketch=False, G=1, per_token=True, D=64):
    kw = dict(sketch_bits=2, weights=torch.full((2, D), 2.0)) if sketch else {}
    return PagedKV.allocate(4, 2, D, scheme=scheme, block_size=16, num_groups=G, per_token_witness=per_token,
                            with_exact=False, device=DEV, **kw)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("sketch", [False, True])
def test_every_scheme_passes_once(scheme, sketch):
    if scheme == "none" and sketch:
        pytest.skip("scheme none stores no sketch")
    c = _paged(scheme, sketch)
    r = ST.check_write_kernel(c, torch.bfloat16)
    # the witnesses are rounded up by the kernel's inflation (1 + 2^-12): just above the norms they bound
    assert r is not None and 1.0 <= r.worst_ratio < 1.01 and r.tokens == 3 * 16 * 2
    assert ST.check_write_kernel(_paged(scheme, sketch), torch.bfloat16) is None  # once per configuration


def test_group_and_per_block_witnesses_pass():
    r = ST.check_write_kernel(_paged("int8", G=4, per_token=False, D=128), torch.bfloat16)
    assert r is not None and r.worst_ratio >= 1.0


@pytest.mark.parametrize("field,factor", [("v_norm", 0.98), ("k_norm", 0.98), ("v_wit", 0.5), ("k_wit", 0.5)])
def test_a_short_witness_is_refused(monkeypatch, field, factor):
    """A write that stores one witness 2-50 % below the norm it bounds (what a miscompile did, run B3) raises, names
    the configuration, and is checked again next time (not cached as passed)."""
    real = W.write_kv

    def faulty(cache, *a, **kw):
        real(cache, *a, **kw)
        getattr(cache, field).mul_(factor)

    monkeypatch.setattr(W, "write_kv", faulty)
    c = _paged("int8", sketch=field == "k_wit")
    with pytest.raises(ST.WriteSelfTestError, match="scheme int8, head dim 64"):
        ST.check_write_kernel(c, torch.bfloat16)
    monkeypatch.setattr(W, "write_kv", real)
    assert ST.check_write_kernel(c, torch.bfloat16) is not None


def test_a_nan_witness_is_refused(monkeypatch):
    real = W.write_kv

    def faulty(cache, *a, **kw):
        real(cache, *a, **kw)
        cache.v_wit[1, 0, 3] = float("nan")

    monkeypatch.setattr(W, "write_kv", faulty)
    with pytest.raises(ST.WriteSelfTestError):
        ST.check_write_kernel(_paged("fp8_e4m3"), torch.bfloat16)


def test_the_kernel_path_cache_runs_it(monkeypatch):
    """WitCertCache's kernel path checks its write before the first token: a faulty write stops the request."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from witcert.cache import WitCertCache, use_witcert

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=1, intermediate_size=64, vocab_size=64, max_position_embeddings=256)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    model = use_witcert(LlamaForCausalLM(cfg).eval().to(dtype).to(DEV))
    real = W.write_kv

    def faulty(cache, *a, **kw):
        real(cache, *a, **kw)
        cache.v_norm.mul_(0.5)

    monkeypatch.setattr(W, "write_kv", faulty)
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1)).to(DEV)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5)
    with torch.no_grad(), pytest.raises(ST.WriteSelfTestError, match="backend='reference'"):
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
    monkeypatch.setattr(W, "write_kv", real)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5)
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
    assert cache.layers[0].paged is not None and len(ST._CHECKED) == 1
