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
    assert r is not None and 1.0 <= r.worst_ratio < 1.01 and r.tokens == ST.CANARY_PAGES * 16 * 2
    assert ST.check_write_kernel(_paged(scheme, sketch), torch.bfloat16) is None  # once per configuration


def test_group_and_per_block_witnesses_pass():
    r = ST.check_write_kernel(_paged("int8", G=4, per_token=False, D=128), torch.bfloat16)
    assert r is not None and r.worst_ratio >= 1.0


FAULTS = [  # (scheme, field, factor, what the allocation takes, the field the message names)
    ("int8", "v_norm", 0.98, {}, "v_norm"), ("int8", "k_norm", 0.98, {}, "k_norm"), ("int8", "v_wit", 0.5, {}, "v_wit"),
    ("int8", "k_wit", 0.5, {}, "group 0"), ("int8", "k_wit", 0.5, dict(sketch=True), "sketch"),
    ("int8", "k_wit", 0.5, dict(G=4, D=128), "group"), ("int8", "v_norm", 0.5, dict(per_token=False), "v_norm"),
    # κ / ν of int8_dither bound s(‖c‖ + ‖u‖), which is above ‖s(c − u)‖ by ~1 %: 0.995 is caught only there
    ("int8_dither", "k_norm", 0.995, {}, "k_norm"),
    # the sketch witness carries the decode dot's γ‖r̃/a‖: 0.995 is below it, not below ‖(r − r̃)/a‖ alone
    ("int8", "k_wit", 0.995, dict(sketch=True), "sketch"),
]


@pytest.mark.parametrize("scheme,field,factor,kw,named", FAULTS)
def test_a_short_witness_is_refused(monkeypatch, scheme, field, factor, kw, named):
    """A write that stores witnesses below the norms they bound (what a miscompile did, run B3) raises, names the
    field and the configuration, and is checked again next time (not cached as passed)."""
    real = W.write_kv

    def faulty(cache, *a, **kws):
        real(cache, *a, **kws)
        t = getattr(cache, field)
        if field == "k_wit" and kw.get("G"):
            t[..., 1].mul_(factor)  # group 1 only
        else:
            t.mul_(factor)

    monkeypatch.setattr(W, "write_kv", faulty)
    c = _paged(scheme, **kw)
    with pytest.raises(ST.WriteSelfTestError, match=f"scheme {scheme}, head dim") as e:
        ST.check_write_kernel(c, torch.bfloat16)
    assert named in str(e.value) and ("group 1" in str(e.value)) == bool(kw.get("G"))
    monkeypatch.setattr(W, "write_kv", real)
    assert ST.check_write_kernel(c, torch.bfloat16) is not None


def test_a_fault_in_the_one_token_launch_is_refused(monkeypatch):
    """The canary's middle launch writes one token (N = 1, a decode step's count at batch 1)."""
    real = W.write_kv

    def faulty(cache, k, *a, **kws):
        real(cache, k, *a, **kws)
        if k.shape[0] == 1:
            cache.v_norm.mul_(0.9)

    monkeypatch.setattr(W, "write_kv", faulty)
    with pytest.raises(ST.WriteSelfTestError):
        ST.check_write_kernel(_paged("int8"), torch.bfloat16)


def test_a_nan_code_is_refused(monkeypatch):
    """A NaN code with finite witnesses (the norm it would bound is NaN) is a fault, not a zero norm."""
    real = W.write_kv

    def faulty(cache, *a, **kws):
        real(cache, *a, **kws)
        cache.v_codes[5, 0, 3, 7] = float("nan")

    monkeypatch.setattr(W, "write_kv", faulty)
    with pytest.raises(ST.WriteSelfTestError, match="v_"):
        ST.check_write_kernel(_paged("fp8_e4m3"), torch.bfloat16)


def test_a_nan_witness_is_refused(monkeypatch):
    real = W.write_kv

    def faulty(cache, *a, **kw):
        real(cache, *a, **kw)
        cache.v_wit[4, 0, 3] = float("nan")  # (the canary uses blocks 2 … 9)

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
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5, window=(4, 8))
    with torch.no_grad(), pytest.raises(ST.WriteSelfTestError, match="backend='reference'"):
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
    monkeypatch.setattr(W, "write_kv", real)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5, window=(4, 8))
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
    assert cache.layers[0].paged is not None and cache.layers[0].win is not None and len(ST._CHECKED) == 2


@pytest.mark.parametrize("window", [(4, 64), (0, 8), (2, 0)])
def test_the_window_write_passes_once(window):
    from kernels.exact_window import ExactWindow

    w = ExactWindow.allocate(2, 2, 64, torch.bfloat16, *window, device=DEV)
    r = ST.check_window_kernel(w, torch.bfloat16)
    assert r is not None and 1.0 <= r.worst_ratio < 1.01 and r.tokens == sum(window) * 2
    assert ST.check_window_kernel(w, torch.bfloat16) is None


@pytest.mark.parametrize("fault", ["k_norm", "v_norm", "values"])
def test_a_faulty_window_write_is_refused(monkeypatch, fault):
    """The window's tokens are served with radius 0: a short norm or a value that is not the exact one is a fault."""
    from kernels.exact_window import ExactWindow

    real = ExactWindow.write

    def faulty(self, *a, **kw):
        real(self, *a, **kw)
        if fault == "values":
            self.v[0, 1, 2, 5] += 1.0
        else:
            getattr(self, fault).mul_(0.99)

    monkeypatch.setattr(ExactWindow, "write", faulty)
    with pytest.raises(ST.WriteSelfTestError, match="exact-window write"):
        ST.check_window_kernel(ExactWindow.allocate(1, 2, 64, torch.bfloat16, 4, 8, device=DEV), torch.bfloat16)
