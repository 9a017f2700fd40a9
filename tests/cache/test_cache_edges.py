"""WitCertCache at the edges (issue 9): float64 models, an underflowed p̂ on the reference path,
Tier B budgets per query row, fresh dither seeds, and a model that never ran the meter.

A tiny random-weight Llama (2 layers, 2 query heads over 1 kv head, head dim 64) keeps these fast.
"""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from witcert.cache import Gate, WitCertCache, use_witcert  # noqa: E402


def tiny(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=2, intermediate_size=64, vocab_size=64, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval().to(dtype)
    return model


def gen(model, cache, n_prompt=40, new=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (1, n_prompt), generator=g)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=new,
                              do_sample=False, pad_token_id=0)


class _Attn(torch.nn.Module):
    """A stand-in attention module for driving ``served_attention`` directly."""

    def __init__(self, layer_idx=0):
        super().__init__()
        self.layer_idx = layer_idx


# --------------------------------------------------------------------------- 4. float64 models


@pytest.mark.parametrize("scheme,gate", [("none", None), ("kivi2", None), ("int8", Gate("certified", tau=0.01, max_pagein_blocks=3))])
def test_float64_model_is_metered_exactly(scheme, gate):
    """A float64 model: exact tokens (scheme none, the kivi2 tail, repaired blocks) are stored in
    float64 -- a float32 copy with witness 0 would be an unmetered error (realised TV ~1e-7)."""
    model = use_witcert(tiny(torch.float64))
    cache = WitCertCache(model.config, scheme=scheme, audit=True, gate=gate)
    gen(model, cache, n_prompt=41)
    lay = cache.layers[0]
    assert lay.k_hat.dtype == torch.float64
    assert sum(r.audit_violations for r in cache.records) == 0
    if scheme == "none":
        assert torch.equal(lay.k_hat, lay.exact_k.to(lay.k_hat.device))
        assert max(float(r.tv_real.max()) for r in cache.records) == 0.0
    if gate is not None:
        rep = lay.repaired.repeat_interleave(16, -1)[..., : lay.k_hat.shape[-2]]
        if bool(rep.any()):
            assert torch.equal(lay.k_hat[rep], lay.exact_k.to(lay.k_hat.device)[rep])


# --------------------------------------------------------------------------- 1. reference path underflow


def _drive_one_layer(cache, keys, values, query, scaling):
    """Prefill ``keys[:-1]``, then one decode step whose own token is ``keys[-1]``; returns the record."""
    lay = cache.layers[0]
    k = keys[None, None]
    v = values[None, None]
    cache.update(k[:, :, :-1], v[:, :, :-1], 0)
    lay._pending = None  # prefill attends exactly (not under test here)
    cache.update(k[:, :, -1:], v[:, :, -1:], 0)
    mask = torch.ones(1, 1, 1, keys.shape[0], dtype=torch.bool)
    out, _ = cache.served_attention(_Attn(0), query[None, :, None, :], mask, scaling)
    lay._pending = None
    return cache.records[-1], out


@pytest.mark.parametrize("scheme", ["int8", "int4_group", "int8_dither"])
def test_underflowed_p_hat_reference_path(scheme):
    """The review's reference-path case: S0 = 800, an outlier channel the query does not read;
    the served logit of token 1 is ~0 while its exact logit ties with token 0's at 800."""
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=1, intermediate_size=32, vocab_size=16)
    cache = WitCertCache(cfg, scheme=scheme, audit=True, seed=0)
    x = 800.0 / 8
    D = 64
    keys = torch.zeros(3, D, dtype=torch.float32)
    keys[0, 1] = x
    keys[1, 0], keys[1, 1] = 1024 * x, x
    keys[2, 1] = x  # the decode step's own token: the same logit as token 0
    values = torch.zeros(3, D)
    values[0, 0] = values[1, 1] = values[2, 0] = 1.0
    q = torch.zeros(1, D)
    q[0, 1] = 64.0
    rec, _ = _drive_one_layer(cache, keys, values, q, 1.0 / 8)
    assert float(rec.tv_real.max()) > 0.3  # exact p = (1/3, 1/3, 1/3); served p̂ ≈ (1/2, 0, 1/2)
    assert rec.audit_violations == 0
    assert float(rec.tv_a.min()) >= float(rec.tv_real.max())
    assert float(rec.out_err.min()) >= float(rec.out_err_real.max())


# --------------------------------------------------------------------------- 6. Tier B accounting


def test_tier_b_budget_is_per_query_row():
    """A later prefill chunk of L rows spends L budgets (each row its own δ), never one δ for all."""
    model = use_witcert(tiny())
    cache = WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (1, 40), generator=g)
    with torch.no_grad():
        model(ids[:, :20], past_key_values=cache, use_cache=True)  # prefill (exact)
        model(ids[:, 20:27], past_key_values=cache, use_cache=True)  # a chunk of 7 rows, metered
        model(ids[:, 27:28], past_key_values=cache, use_cache=True)  # a decode row
    chunk = [r for r in cache.records if r.step == 1]
    ds = np.asarray(chunk[0].delta_step)
    assert ds.shape == (7,)
    want = [1e-3 * 6 / (math.pi**2 * r**2) / (2 * 2) for r in range(1, 8)]
    np.testing.assert_allclose(ds, want, rtol=1e-12)
    dec = [r for r in cache.records if r.step == 2][0]
    np.testing.assert_allclose(np.asarray(dec.delta_step), [1e-3 * 6 / (math.pi**2 * 64) / 4], rtol=1e-12)
    s = cache.summary()
    assert s["metered_rows"] == 8
    assert s["delta_spent"] <= 1e-3 * (1 - 1e-9)
    assert s["delta_spent"] == pytest.approx(sum(want) * 4 + 1e-3 * 6 / (math.pi**2 * 64))
    # the fixed schedule's horizon counts rows: a 7-row chunk does not fit a horizon of 5
    fixed = WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3, schedule="fixed", horizon=5)
    with torch.no_grad():
        model(ids[:, :20], past_key_values=fixed, use_cache=True)
        with pytest.raises(RuntimeError, match="horizon"):
            model(ids[:, 20:27], past_key_values=fixed, use_cache=True)


def test_dither_seed_is_fresh_per_request_and_recorded():
    model = use_witcert(tiny())
    a = WitCertCache(model.config, scheme="int8_dither")
    b = WitCertCache(model.config, scheme="int8_dither")
    assert a.seed != b.seed  # 2^31 values: a clash here has probability 5e-10
    gen(model, a)
    assert a.summary()["seed"] == a.seed
    first = a.seed
    a.reset()
    assert a.seed != first  # a new request draws a new seed
    fixed = WitCertCache(model.config, scheme="int8_dither", seed=7)
    fixed.reset()
    assert fixed.seed == 7
    with pytest.raises(ValueError, match="seed"):
        WitCertCache(model.config, scheme="int8_dither", seed=-1)


# --------------------------------------------------------------------------- 7. silent misuse


def test_generate_without_use_witcert_raises():
    """Without use_witcert the model's own attention sees only the fresh K/V: refused at the
    first decode step, before any token is produced from it; summary() refuses too."""
    model = tiny()
    model.set_attn_implementation("sdpa")
    cache = WitCertCache(model.config, scheme="int8")
    with pytest.raises(RuntimeError, match="use_witcert"):
        gen(model, cache)
    with pytest.raises(RuntimeError, match="use_witcert"):
        cache.summary()
    # a one-layer model: the unmetered last layer is caught by summary()
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=1, intermediate_size=32, vocab_size=16)
    one = LlamaForCausalLM(cfg).eval()
    one.set_attn_implementation("sdpa")
    c1 = WitCertCache(cfg, scheme="int8")
    ids = torch.randint(0, 16, (1, 8))
    with torch.no_grad():
        one(ids, past_key_values=c1, use_cache=True)
        one(ids[:, :1], past_key_values=c1, use_cache=True)
    with pytest.raises(RuntimeError, match="use_witcert"):
        c1.summary()
    # with the meter installed, the same runs are metered and summary() works
    use_witcert(model)
    ok = WitCertCache(model.config, scheme="int8")
    gen(model, ok)
    assert ok.summary()["metered_rows"] == 3 and len(ok.records) == 3 * 2


# --------------------------------------------------------------------------- the kernel path (CPU interpreter; CUDA on the H200)


@pytest.mark.parametrize("scheme", ["int8", "int8_dither", "fp8_e4m3"])
def test_kernel_path_covers_the_reference_realised_tv(scheme):
    """backend='kernel' (Triton) against backend='reference' (fp64, audit) on the same model,
    codes and dither seed: the kernel's TV⁺ covers the realised TV of every row."""
    import os

    dev = os.environ.get("WITCERT_DEVICE", "cpu")
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = use_witcert(tiny(dtype).to(dev))
    kw = dict(delta_req=1e-3) if scheme == "int8_dither" else {}
    ref = WitCertCache(model.config, scheme=scheme, backend="reference", audit=True, seed=5, **kw)
    ker = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=5, **kw)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (1, 70), generator=g).to(dev)
    with torch.no_grad():
        a = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=ref, max_new_tokens=5, do_sample=False, pad_token_id=0)
        b = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=ker, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert ker.layers[0].paged is not None and ref.layers[0].paged is None
    real = np.stack([r.tv_real for r in ref.records])
    tv_ker = np.stack([r.tv_a for r in ker.records])
    if torch.equal(a, b):  # same tokens: same rows, so the kernel bound must cover the realised TV
        assert tv_ker.shape == real.shape and np.all(tv_ker >= real - 1e-6)
    assert sum(r.audit_violations for r in ref.records) == 0
    assert np.all(tv_ker <= 1.0) and not any(bool(r.flag.any()) for r in ker.records)


def test_kernel_path_serves_a_left_padded_batch():
    """Batch 2 with left padding on the kernel path (the mask reaches the kernel as a per-token
    mask, no host sync): the same ids as the fp64 reference path, and every row's TV⁺ covers the
    reference's realised TV; with tilt_above, rows certified by the closed forms skip the tilt
    (reported 1) and keep a TV⁺ ≤ tilt_above."""
    import os

    dev = os.environ.get("WITCERT_DEVICE", "cpu")
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = use_witcert(tiny(dtype).to(dev))
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 64, (2, 40), generator=g)
    am = torch.ones_like(ids)
    ids[1, :13] = 0  # left padding of the shorter prompt
    am[1, :13] = 0
    ids, am = ids.to(dev), am.to(dev)
    ref = WitCertCache(model.config, scheme="int8", backend="reference", audit=True, seed=5)
    ker = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5)
    lazy = WitCertCache(model.config, scheme="int8", backend="kernel", seed=5, tilt_above=0.5)
    out = []
    with torch.no_grad():
        for c in (ref, ker, lazy):
            out.append(model.generate(ids, attention_mask=am, past_key_values=c, max_new_tokens=4, do_sample=False,
                                      pad_token_id=0))
    assert ker.layers[0].paged is not None
    real = np.stack([r.tv_real for r in ref.records])
    tv_ker = np.stack([r.tv_a for r in ker.records])
    tv_lazy = np.stack([r.tv_a for r in lazy.records])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    assert tv_ker.shape == real.shape and real.shape[1] == 2
    assert np.all(tv_ker >= real - 1e-6) and not any(bool(r.flag.any()) for r in ker.records)
    assert sum(r.audit_violations for r in ref.records) == 0
    # the padded row is metered over its own tokens: unlike an unmasked decode over the pads
    assert np.all(tv_lazy >= tv_ker - 1e-12) and np.all(tv_lazy[tv_lazy > tv_ker + 1e-12] <= 0.5)
    with pytest.raises(ValueError, match="tilt_above"):
        WitCertCache(model.config, scheme="int8", tilt_above=float("nan"))


# --------------------------------------------------------------------------- hot path: growth without copies of the context


def test_exact_store_appends_and_grows():
    from witcert.store import INITIAL_CAPACITY, ExactStore

    g = torch.Generator().manual_seed(0)
    st = ExactStore(2, 3, 8, torch.bfloat16, "cpu")
    ref = torch.zeros(2, 3, 0, 8, dtype=torch.bfloat16)
    caps = []
    for m in [300, 1, 1, 5, 200, 1] + [1] * 40 + [600, 1]:
        x = torch.randn(2, 3, m, 8, generator=g).bfloat16()
        chunks = [c.data_ptr() for c in st._chunks]
        st.append(x)
        ref = torch.cat([ref, x], dim=-2)
        caps.append(st.capacity)
        assert torch.equal(st.data, ref) and len(st) == ref.shape[-2]
        # growth adds chunks and copies nothing: the earlier chunks stay where they were
        assert [c.data_ptr() for c in st._chunks[: len(chunks)]] == chunks
        # the append's destinations are contiguous token-major slices (B·H = 6 > 1): on CUDA one
        # asynchronous copy per chunk into pinned memory, not a staged synchronous one (witcert/store.py)
        pieces = list(st._pieces(len(st) - m, len(st)))
        assert sum(k for _, _, k in pieces) == m and all(c[o: o + k].is_contiguous() for c, o, k in pieces)
        assert all(c.shape[1:] == (2, 3, 8) for c in st._chunks)
        # capacity: at most the need, a quarter more, and a prefill's eighth
        assert len(st) <= st.capacity <= max(INITIAL_CAPACITY, len(st) + len(st) // 4 + m // 8 + 1) + len(st) // 8
    assert caps[0] >= 300 + 300 // 8 and caps[0] >= INITIAL_CAPACITY  # headroom after the "prefill"
    assert len(set(caps)) <= 6 and st.num_chunks <= 5  # a few geometric chunks, not one per step
    for lo, hi in [(0, 0), (0, 7), (290, 310), (250, len(st)), (len(st) - 1, len(st))]:  # windows across chunks
        assert torch.equal(st.read(lo, hi), ref[..., lo:hi, :])
    with pytest.raises(ValueError, match="outside"):
        st.read(0, len(st) + 1)
    with pytest.raises(ValueError, match="ExactStore"):
        st.append(torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16))
    st.reorder(torch.tensor([1, 1]))  # beam search: rows picked, the token-major layout kept
    assert torch.equal(st.data, ref[[1, 1]]) and st.capacity == caps[-1]
    st.crop(10)
    assert torch.equal(st.data, ref[[1, 1], :, :10])


@pytest.mark.interpreter
def test_kernel_path_grows_past_max_tokens():
    """The kernel path's paged cache doubles instead of refusing past max_tokens; the served
    ids and the records equal those of a cache allocated large enough up front."""
    model = use_witcert(tiny())
    small = WitCertCache(model.config, scheme="int8", backend="kernel", max_tokens=32, seed=1)
    big = WitCertCache(model.config, scheme="int8", backend="kernel", max_tokens=512, seed=1)
    a = gen(model, small, n_prompt=40, new=4)
    b = gen(model, big, n_prompt=40, new=4)
    assert torch.equal(a, b)
    assert small.layers[0].block_table.shape[1] * 16 >= 43 > 32
    # the invariant WitCertLayer._step_slots relies on (one step's slots shared by all layers):
    # every layer's block table is the identity layout, after growth too
    for c in (small, big):
        for lay in c.layers:
            B, P = lay.block_table.shape
            assert torch.equal(lay.block_table.cpu(), torch.arange(B * P, dtype=torch.int32).view(B, P))
    np.testing.assert_array_equal(np.stack([r.tv_a for r in small.records]), np.stack([r.tv_a for r in big.records]))


def test_summary_and_records_serialize_to_json():
    import json

    from witcert.cache import jsonable

    model = use_witcert(tiny())
    cache = WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3)
    gen(model, cache)
    s = json.loads(json.dumps(cache.summary_json()))
    assert s["scheme"] == "int8_dither" and s["metered_rows"] == 3 and isinstance(s["max_tv_a"], list)
    recs = json.loads(json.dumps(jsonable(cache.records)))
    assert len(recs) == 3 * 2 and recs[0]["layer"] == 0 and len(recs[0]["tv_a"][0]) == 2
    assert jsonable(np.array([np.inf, 1.0])) == [None, 1.0]  # non-finite → null, never a bare Infinity
    # summary() itself is plain Python (issue 34: no numpy arrays), an infinite bound kept as inf

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return x is None or type(x) in (int, float, bool, str)

    raw = cache.summary()
    assert plain(raw) and raw["max_tv_a"] == s["max_tv_a"] and raw["pagein_blocks_per_layer"] == [[0]] * 2
    assert jsonable(np.array([np.inf]), finite=False) == [np.inf]


def test_kernel_backend_without_cuda_or_interpreter_is_refused(monkeypatch):
    import kernels.interpret as Wk

    monkeypatch.setattr(Wk, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = tiny()
    with pytest.raises(ValueError, match="no CUDA device"):
        WitCertCache(model.config, scheme="int8", backend="kernel")


def test_kernel_backend_on_a_cpu_model_without_the_interpreter_is_refused_by_name(monkeypatch):
    """backend='kernel' with a CUDA device present but the layer's tensors on the CPU and the interpreter off (a GPU
    machine's test run of a CPU model, run A4): a clear error naming the fix, not Triton's "Pointer argument cannot
    be accessed from Triton (cpu tensor?)" from inside the first write."""
    import kernels.interpret as Wk

    monkeypatch.setattr(Wk, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cache = WitCertCache(tiny().config, scheme="int8", backend="kernel")
    with pytest.raises(ValueError, match="interpreter.*TRITON_INTERPRET=1.*backend='reference'"):
        cache.use_kernel(torch.device("cpu"), 1, torch.float32)
    monkeypatch.setattr(Wk, "INTERPRET", True)
    assert cache.use_kernel(torch.device("cpu"), 1, torch.float32)


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("On", True), ("yes", True), ("0", False),
                                      ("", False), ("off", False)])
def test_the_interpreter_flag_is_tritons_own(monkeypatch, value, on):
    """``kernels.interpret.INTERPRET`` follows Triton's knob: ``TRITON_INTERPRET=true`` runs Triton's interpreter, which
    WitCert took for "off" (refusing backend='kernel' on the CPU, and making the fp8 codes with the interpreter's cast
    instead of torch's; a review, 2026-12-06)."""
    import kernels.interpret as Wk

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert Wk._interpret_knob() is on


@pytest.mark.interpreter
@pytest.mark.parametrize("backend,scheme", [("reference", "kivi2"), ("reference", "int8"), ("kernel", "int8")])
def test_beam_search_stays_metered(backend, scheme):
    """generate(num_beams=2): the cache reorders every per-sequence store; the reference path's
    audit finds no bound below the realised TV on the beams."""
    model = use_witcert(tiny())
    cache = WitCertCache(model.config, scheme=scheme, backend=backend, audit=backend == "reference", seed=2)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 64, (1, 37), generator=g)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=4,
                             num_beams=2, do_sample=False, pad_token_id=0)
    assert out.shape[1] == 41 and len(cache.records) > 0
    if backend == "reference":
        assert sum(r.audit_violations for r in cache.records) == 0
    lay = cache.layers[0]
    assert lay.exact_k.shape[0] == 2 and lay.get_seq_length() == 40


@pytest.mark.parametrize("scheme", ["kivi2", "int8"])
def test_crop_rolls_back_and_stays_metered(scheme):
    model = use_witcert(tiny())
    cache = WitCertCache(model.config, scheme=scheme, audit=True, seed=2)
    gen(model, cache, n_prompt=40, new=4)  # 43 tokens cached
    lay = cache.layers[0]
    before = lay.exact_k.clone()
    cache.crop(-5)
    assert lay.get_seq_length() == 38 and lay.k_hat.shape[-2] == 38 and torch.equal(lay.exact_k, before[..., :38, :])
    if scheme == "kivi2":  # the partial block 32..37 is exact again (KIVI residual)
        assert torch.equal(lay.k_hat[..., 32:, :], lay.exact_k[..., 32:, :].float())
        assert float(lay.k_wit[..., 32:, :].abs().max()) == 0.0
    with pytest.raises(ValueError, match="negative"):
        cache.crop(3)
    ids = torch.randint(0, 64, (1, 1))
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    assert lay.get_seq_length() == 39
    assert sum(r.audit_violations for r in cache.records) == 0


# --------------------------------------------------------------------------- reuse without reset


def _fresh_tokens(model, ids, mask=None, new=3):
    c = WitCertCache(model.config, scheme="int8", seed=0)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask, past_key_values=c,
                              max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("length", [10, 30, 43])
def test_a_new_prompt_on_a_used_cache_is_refused(length):
    """generate on a cache that holds an earlier request's 43 tokens takes input_ids as that prefix
    plus new tokens: a fresh prompt of ≤ 43 tokens was fed as nothing (a reshape error), as its tail
    at positions 13 … (L = 30), or whole after the old tokens (L = 43, silently different tokens).
    Now a ValueError says to call reset(), before anything is written; after reset() the same
    prompt gives what a fresh cache gives."""
    model = use_witcert(tiny())
    cache = WitCertCache(model.config, scheme="int8", seed=0)
    gen(model, cache, n_prompt=40, new=4)
    n, recs, steps = cache.get_seq_length(), len(cache.records), cache.step
    assert n == 43
    g = torch.Generator().manual_seed(5)
    fresh = torch.randint(1, 64, (1, length), generator=g)
    with pytest.raises(ValueError, match=r"cache\.reset\(\)") as e:
        with torch.no_grad():
            model.generate(fresh, attention_mask=torch.ones_like(fresh), past_key_values=cache, max_new_tokens=3,
                           do_sample=False, pad_token_id=0)
    assert "43 tokens of an earlier request" in str(e.value)
    assert (cache.get_seq_length(), len(cache.records), cache.step) == (n, recs, steps)  # nothing written
    cache.reset()
    with torch.no_grad():
        out = model.generate(fresh, attention_mask=torch.ones_like(fresh), past_key_values=cache, max_new_tokens=3,
                             min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(out, _fresh_tokens(model, fresh))
    assert cache.get_seq_length() == length + 2 and cache.summary()["metered_rows"] == 2


def test_a_new_padded_batch_on_a_used_cache_is_refused():
    model = use_witcert(tiny())
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 64, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    cache = WitCertCache(model.config, scheme="int8", seed=0)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=3, do_sample=False, pad_token_id=0)
        with pytest.raises(ValueError, match=r"reset\(\)"):
            model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=3, do_sample=False,
                           pad_token_id=0)


@pytest.mark.parametrize("padded", [False, True])
def test_continuing_the_same_request_is_allowed(padded):
    """Multi-turn on one cache: input_ids = the whole history (prompt + generated) + the new turn
    (its mask covering both): generate feeds only what is not cached, and the tokens equal a fresh
    run over the whole history."""
    model = use_witcert(tiny())
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :6] = 0
    cache = WitCertCache(model.config, scheme="int8", seed=0)
    with torch.no_grad():
        first = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=3, min_new_tokens=3,
                               do_sample=False, pad_token_id=0)
    turn = torch.cat([first, torch.randint(1, 64, (2, 5), generator=g)], 1)
    tmask = torch.cat([mask, torch.ones(2, turn.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    with torch.no_grad():
        out = model.generate(turn, attention_mask=tmask, past_key_values=cache, max_new_tokens=3, min_new_tokens=3,
                             do_sample=False, pad_token_id=0)
    assert torch.equal(out, _fresh_tokens(model, turn, tmask))
    assert cache.get_seq_length() == turn.shape[1] + 2
    # a manual forward without position ids continues the cache (chunked prefill): allowed
    with torch.no_grad():
        model(out[:, -1:], past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == turn.shape[1] + 3


def test_a_cache_built_for_another_model_is_refused():
    """A cache sized for one model (layers, heads, head dim) used with another raises, and the
    check (now done once per model config, not per layer step) still runs when the model changes."""
    model = use_witcert(tiny())
    torch.manual_seed(3)
    # the same K/V shapes (1 kv head, d 64) but 4 query heads: only the attention-level check sees it
    other_cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                            num_hidden_layers=2, intermediate_size=64, vocab_size=64, max_position_embeddings=512)
    other = use_witcert(LlamaForCausalLM(other_cfg).eval())
    with pytest.raises(ValueError, match="different model"):
        gen(other, WitCertCache(model.config, scheme="int8"), new=2)
    cache = WitCertCache(model.config, scheme="int8")
    gen(model, cache, new=2)  # the right model: checked once, then cached
    cache.reset()
    with pytest.raises(ValueError, match="different model"):
        gen(other, cache, new=2)


@pytest.mark.parametrize("B,H,D,n", [(8, 8, 128, 32768), (8, 8, 128, 33000), (8, 8, 128, 30000), (1, 3, 64, 4096),
                                     (8, 3, 64, 32768), (1, 8, 128, 131072), (1, 3, 64, 40)])
def test_pinned_store_chunks_stay_within_their_power_of_two_allocations(B, H, D, n):
    """A pinned store's chunks are sized against PyTorch's power-of-two rounding of pinned
    allocations (witcert/store.py): the bytes the allocator really takes stay within 1.4× of the
    K (or V) written, after a prefill of n and 600 decode steps (the earlier single buffer took
    ~1.96× at Llama-8B / B 8 / 32K). The allocator is modelled, nothing is pinned here."""
    from witcert.store import ExactStore

    class Modelled(ExactStore):
        def __init__(self, *a):
            super().__init__(*a)
            self.pin = True  # the pinned sizing policy, on the CPU

        def _alloc(self, tokens):  # sizes only: a 1-byte row
            return torch.empty(tokens, 1, 1, 1, dtype=torch.int8)

        def _put(self, lo, x):
            pass

    st = Modelled(B, H, D, torch.bfloat16, "cpu")
    st.append(torch.empty(B, H, n, D, dtype=torch.bfloat16))
    for _ in range(600):
        st.append(torch.empty(B, H, 1, D, dtype=torch.bfloat16))
    row = B * H * D * 2
    taken = sum(1 << (c.shape[0] * row - 1).bit_length() for c in st._chunks)  # the allocator's rounding
    assert len(st) == n + 600 <= st.capacity
    assert taken <= 1.4 * max(len(st), 256) * row, (taken / (len(st) * row), st.num_chunks)
    assert st.num_chunks <= 4


def test_generate_takes_cache_implementation_witcert():
    """``generate(..., cache_implementation="witcert", cache_config={...})`` after ``use_witcert``: a fresh
    WitCertCache per call with those arguments (the same tokens and records as passing the cache), and
    clear errors for a cache passed as well, a non-dict cache_config and a bad cache argument."""
    from tests.helpers.tiny import generate, tiny_model

    model = tiny_model()
    ids = torch.randint(3, 512, (1, 40), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=2)
    with torch.no_grad():
        out = model.generate(ids, cache_implementation="witcert", cache_config=dict(scheme="int8", seed=1, window=None),
                             return_dict_in_generate=True, **kw)
    cache = out.past_key_values
    assert isinstance(cache, WitCertCache) and cache.scheme == "int8" and cache.step == 2
    ref = WitCertCache(model.config, scheme="int8", seed=1, window=None)
    assert torch.equal(out.sequences, generate(model, ref, new=3))
    np.testing.assert_array_equal(cache.records[-1].tv_a, ref.records[-1].tv_a)
    with pytest.raises(ValueError, match="not both"):
        model.generate(ids, cache_implementation="witcert", past_key_values=ref, **kw)
    with pytest.raises(ValueError, match="cache_config: expected a dict"):
        model.generate(ids, cache_implementation="witcert", cache_config="int8", **kw)
    with pytest.raises(ValueError, match="scheme"):
        model.generate(ids, cache_implementation="witcert", cache_config=dict(scheme="int7"), **kw)


def test_reference_path_output_past_float16_is_flagged():
    """A float16 model whose served output passes 65504 (values at fp16's max, int8 dequantization above it): the
    reference path's E⁺ is +inf (``bounds.stored_output_error_bound``) and the row is flagged non-finite, as the kernel
    path counts it (a review found E⁺ +inf beside flag False)."""
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=64, num_hidden_layers=1,
                      intermediate_size=32, vocab_size=16)
    cache = WitCertCache(cfg, scheme="int8", backend="reference", audit=True, seed=0, window=None)
    D, n = 64, 4
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, n, D, generator=g).half()
    v = torch.randn(1, 1, n, D, generator=g).half()
    v[..., 0] = 65504.0
    cache.update(k[:, :, :-1], v[:, :, :-1], 0)
    cache.layers[0]._pending = None
    cache.update(k[:, :, -1:], v[:, :, -1:], 0)

    class _Attn(torch.nn.Module):
        layer_idx = 0

    q = torch.randn(1, 1, 1, D, generator=g).half()
    o, _ = cache.served_attention(_Attn(), q, torch.ones(1, 1, 1, n, dtype=torch.bool), 1.0 / 8)
    r = cache.records[-1]
    assert not torch.isfinite(o).all()
    assert np.isinf(r.out_err).all() and r.flag.all() and r.nonfinite.all()
