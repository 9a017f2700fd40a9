"""WitCertCache on the embedded model: bit-identity when off, soundness of the served meter
against exact attention, gating (a planted bad block is repaired), persistence, idempotence,
an untouched backing store, Tier B, and clear errors for bad input."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from witcert import schemes as S  # noqa: E402
from witcert.cache import Gate, WitCertCache, use_witcert  # noqa: E402

PROMPTS = ["The capital of France is", "Write one sentence about the sea, the harbour and the ships:"]


def _batch(tok, prompts=PROMPTS):
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok(prompts, return_tensors="pt", padding=True)


def _gen(model, enc, new_tokens=6, **kw):
    with torch.no_grad():
        return model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, pad_token_id=0, **kw)


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_off_is_bit_identical_to_stock_transformers(smollm2, base):
    model, tok = smollm2
    enc = _batch(tok)  # batch of 2 with left padding
    model.set_attn_implementation(base)
    ref = _gen(model, enc)
    use_witcert(model, base=base)
    cache = WitCertCache(model.config, scheme="none", meter=False)
    out = _gen(model, enc, past_key_values=cache)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        assert torch.equal(a, b)
    assert cache.records == [] and cache.layers[0].get_seq_length() == enc["input_ids"].shape[1] + 5


@pytest.mark.parametrize("scheme", ["fp8_e4m3", "int8", "int8_dither", "int4_group", "kivi2"])
def test_served_meter_is_sound_against_exact_attention(smollm2, scheme):
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [p * 3 for p in PROMPTS])  # > 16 tokens: kivi2 quantizes whole blocks
    cache = WitCertCache(model.config, scheme=scheme, audit=True, num_groups=2,
                         delta_req=1e-3 if scheme == "int8_dither" else None)
    _gen(model, enc, past_key_values=cache)
    recs = cache.records
    assert len(recs) == 5 * 30  # 5 decode steps x 30 layers (prefill is exact)
    assert sum(r.audit_violations for r in recs) == 0
    real = np.stack([r.tv_real for r in recs])
    bound = np.stack([r.tv_a for r in recs])
    assert real.max() > 0  # the served path really differs from exact attention
    assert np.all(real <= bound) and np.all(bound <= 1.0)
    assert np.all(np.stack([r.out_err_real for r in recs]) <= np.stack([r.out_err for r in recs]))
    if scheme == "int8_dither":
        assert recs[0].tv_b is not None and "non-adaptive" in cache.summary()["tier_b_caveat"]


def _plant(x, ctx):
    """Exact, except keys of positions 16..31, which get a large error (a planted bad block)."""
    x = x.float().clone()
    if ctx.role == "key":
        pos = torch.as_tensor(ctx.positions)
        bad = (pos >= 16) & (pos < 32)
        g = torch.Generator().manual_seed(0)
        x[..., bad, :] += 4.0 * torch.randn(x[..., bad, :].shape, generator=g)
    return x, {}


def test_gate_repairs_a_planted_bad_block(smollm2):
    model, tok = smollm2
    use_witcert(model)
    S.register_scheme("planted_bad_block", _plant, overwrite=True)
    enc = _batch(tok, [PROMPTS[1] * 4])
    n0 = enc["input_ids"].shape[1]
    assert n0 > 32
    ungated = WitCertCache(model.config, scheme="planted_bad_block")
    _gen(model, enc, past_key_values=ungated)
    tv_ungated = np.stack([r.tv_a for r in ungated.records])
    assert tv_ungated.max() > 0.5  # the plant is visible to the meter

    gate = Gate("certified", tau=0.05, max_pagein_blocks=4)
    cache = WitCertCache(model.config, scheme="planted_bad_block", gate=gate, audit=True)
    with torch.no_grad():
        model(**enc, past_key_values=cache, use_cache=True)  # prefill
    layer = cache.layers[5]
    store_k, store_v = layer.exact_k.clone(), layer.exact_v.clone()
    _gen(model, {"input_ids": torch.cat([enc["input_ids"], enc["input_ids"][:, -1:]], 1)[:, -1:],
                 "attention_mask": torch.ones(1, n0 + 1, dtype=torch.long)}, past_key_values=cache)
    first = [r for r in cache.records if r.step == cache.records[0].step]
    assert all(r.pagein_blocks.sum() > 0 for r in first)  # every layer paged in at the first step
    assert all(r.tv_a.max() < r.tv_a_pre.max() for r in first)  # and the bound dropped
    assert sum(r.audit_violations for r in cache.records) == 0
    # the planted block (block 1) is exact now, witnesses 0, in every layer and kv head
    for lay in cache.layers:
        assert bool(lay.repaired[..., 1].all())
        assert torch.equal(lay.k_hat[..., 16:32, :], lay.exact_k[..., 16:32, :].float())
        assert float(lay.k_wit[..., 16:32, :].abs().max()) == 0.0
    # persistent: later steps do not page the block in again; idempotent: a repeat moves nothing
    per_step = {}
    for r in cache.records:
        per_step[r.step] = per_step.get(r.step, 0) + int(r.pagein_blocks.sum())
    steps = sorted(per_step)
    assert per_step[steps[-1]] <= per_step[steps[0]]
    before = layer.k_hat.clone(), int(cache.pagein_bytes.sum())
    assert layer.page_in(0, 0, 1) == 0
    assert torch.equal(layer.k_hat, before[0]) and int(cache.pagein_bytes.sum()) == before[1]
    # accounting: bytes = blocks x 2 (K, V) x 16 tokens x 64 dims x 4 bytes (float32 model)
    assert int(cache.pagein_bytes.sum()) == int(cache.pagein_blocks.sum()) * 2 * 16 * 64 * 4
    s = cache.summary()
    assert np.shape(s["pagein_blocks_per_layer"]) == (30, 1) and s["pagein_blocks"][0] == cache.pagein_blocks.sum()
    # the backing store was never written
    assert torch.equal(layer.exact_k[..., : store_k.shape[-2], :], store_k)
    assert torch.equal(layer.exact_v[..., : store_v.shape[-2], :], store_v)


def test_risk_ranked_pages_in_top_k(smollm2):
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1] * 4])
    cache = WitCertCache(model.config, scheme="kivi2", gate=Gate("risk-ranked", max_pagein_blocks=2))
    _gen(model, enc, past_key_values=cache)
    per = np.stack([r.pagein_blocks for r in cache.records])  # [steps*layers, B, Hkv]
    assert per.max() <= 2 and per.sum() > 0
    assert not any(r.flag.any() for r in cache.records)  # risk-ranked never flags (no certificate)


def test_tier_b_fixed_horizon(smollm2):
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[0]])
    with pytest.raises(ValueError, match="horizon"):
        WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3, schedule="fixed")
    with pytest.raises(ValueError, match="int8_dither"):
        WitCertCache(model.config, scheme="int8", delta_req=1e-3)
    cache = WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3, schedule="fixed", horizon=8)
    _gen(model, enc, past_key_values=cache)
    ds = {float(x) for r in cache.records for x in np.atleast_1d(r.delta_step)}
    assert ds == {1e-3 / (30 * 9 * 8)}
    # every metered row spends its own budget: 5 decode rows x 30 layers x 9 heads ≤ δ_req
    assert cache.summary()["delta_spent"] == pytest.approx(5 * 1e-3 / 8)
    short = WitCertCache(model.config, scheme="int8_dither", delta_req=1e-3, schedule="fixed", horizon=2)
    with pytest.raises(RuntimeError, match="horizon"):
        _gen(model, enc, past_key_values=short)


def test_bad_input_is_refused_or_flagged(smollm2):
    model, tok = smollm2
    use_witcert(model)
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        WitCertCache(model.config, scheme="int3_magic")
    with pytest.raises(ValueError, match="certified"):
        Gate("certified", tau=1.5)
    with pytest.raises(ValueError, match="policy"):
        Gate("sometimes")
    # a cache built for another model
    other = type(model.config).from_dict({**model.config.to_dict(), "num_key_value_heads": 9})
    enc = _batch(tok, [PROMPTS[0]])
    with pytest.raises(ValueError, match="kv heads"):
        _gen(model, enc, past_key_values=WitCertCache(other, scheme="int8"))
    # NaN in the activations: saturated and flagged, never a small bound
    cache = WitCertCache(model.config, scheme="int8")
    with torch.no_grad():
        out = model(**enc, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        h = model.model.layers[3].self_attn.q_proj.register_forward_hook(lambda m, i, o: o * float("nan"))
        try:
            model(input_ids=nxt, past_key_values=cache, use_cache=True)
        finally:
            h.remove()
    r3 = [r for r in cache.records if r.layer == 3][-1]
    assert r3.nonfinite.all() and r3.flag.all() and np.all(r3.tv_a == 1.0) and np.all(np.isinf(r3.out_err))


# the side-by-side kernel tests: their decode steps, and the layers they compress and meter (every third: layer 0's
# outlier keys and the last layers included; the others exact on both caches), each kernel-path step being ~1 s
# per layer in the interpreter
KERNEL_STEPS = 3
KERNEL_LAYERS = frozenset(range(0, 30, 3)) | {29}


def _side_by_side(model, enc, first, second, steps=5):
    """Both caches serve the same request and generate the same tokens (``steps`` metered decode steps): (TV⁺
    of ``first``, TV⁺ of ``second``, the realised TV of the audited ``first``), each stacked over the records."""
    a = _gen(model, enc, steps + 1, past_key_values=first)
    b = _gen(model, enc, steps + 1, past_key_values=second)
    assert torch.equal(a.sequences, b.sequences)
    stack = lambda cache, field: np.stack([getattr(r, field) for r in cache.records])  # noqa: E731
    return stack(first, "tv_a"), stack(second, "tv_a"), stack(first, "tv_real")


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["int8", "int8_dither"])
def test_kernel_backend_meters_like_the_reference(smollm2, scheme):
    """The Triton path (interpreter here, CUDA on the H200) against the fp64 reference path:
    same codes (bit-identical write path), so its TV⁺ must cover the reference's realised TV
    and stay within the kernel's stated tolerance above the reference bound."""
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1]])
    kw = dict(delta_req=1e-3, seed=0) if scheme == "int8_dither" else {}
    # the kernels' formula on both paths (sketch_box="symmetric"); the centred box is the reference path's own
    kw["compress_layers"] = KERNEL_LAYERS
    ref = WitCertCache(model.config, scheme=scheme, backend="reference", audit=True, sketch_box="symmetric", **kw)
    ker = WitCertCache(model.config, scheme=scheme, backend="kernel", **kw)
    tv_ref, tv_ker, real = _side_by_side(model, enc, ref, ker, KERNEL_STEPS)
    assert tv_ker.shape == tv_ref.shape == (KERNEL_STEPS * len(KERNEL_LAYERS), 1, 9)
    assert np.all(tv_ker >= real - 1e-6)
    assert np.all(tv_ker <= np.minimum(1.0, 1.5 * tv_ref + 0.02))
    if scheme == "int8_dither":
        assert all(r.tv_b is not None for r in ker.records)
    from witcert.schemes import register_scheme

    register_scheme("user_nokernel", lambda x: (x.float(), {}), overwrite=True)
    with pytest.raises(ValueError, match="has no kernel"):
        WitCertCache(model.config, scheme="user_nokernel", backend="kernel")
    # a gate is served on the kernel path (tests/kernels/test_kernel_gate_cache.py); G > 1 witnesses are not
    assert WitCertCache(model.config, scheme="int8", backend="kernel", gate=Gate("risk-ranked")).gate is not None
    with pytest.raises(ValueError, match="G = 1"):
        WitCertCache(model.config, scheme="int8", backend="kernel", gate=Gate("risk-ranked"), num_groups=2)


def test_centred_sketch_box_on_the_reference_path(smollm2):
    """The reference path's default ("auto": centred) against the kernels' symmetric form on the same request:
    both cover the realised TV (audit), the centred one is tighter; "centred" is refused off the reference
    path, and an unknown box is refused."""
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1]])
    kw = dict(scheme="int8", backend="reference", audit=True, window=None)  # no window: every token metered
    cen = WitCertCache(model.config, **kw)
    sym = WitCertCache(model.config, sketch_box="symmetric", **kw)
    assert cen.sketch_box == "auto" and cen.sketch_bits == 2
    tv_c, tv_s, real = _side_by_side(model, enc, cen, sym)
    assert sum(r.audit_violations for r in cen.records) == 0
    assert np.all(tv_c >= real) and np.all(tv_s >= real)
    assert np.median(tv_c) < 0.85 * np.median(tv_s)
    with pytest.raises(ValueError, match="reference path only"):
        WitCertCache(model.config, scheme="int8", backend="kernel", sketch_box="centred")
    with pytest.raises(ValueError, match="reference path only"):
        WitCertCache(model.config, scheme="int8", sketch_box="centred")  # auto may pick the kernel path
    with pytest.raises(ValueError, match="sketch_box"):
        WitCertCache(model.config, scheme="int8", sketch_box="centered")


def test_grid_sketch_box_on_the_reference_path(smollm2):
    """``sketch_box="grid"``: the centred box unbinned, its tilt on the fixed (t, λ) grid (a one-pass kernel's form):
    it covers the realised TV (audit) on the same request as the centred box on levels, and stays within 15 % of it
    in the median; refused off the reference path."""
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1]])
    kw = dict(scheme="int8", backend="reference", audit=True, window=None)
    cen = WitCertCache(model.config, **kw)
    grid = WitCertCache(model.config, sketch_box="grid", **kw)
    assert grid.metered_sketch_box(False) == "grid" and cen.metered_sketch_box(False) == "centred"
    tv_c, tv_g, real = _side_by_side(model, enc, cen, grid)
    assert sum(r.audit_violations for r in grid.records) == 0
    assert np.all(tv_g >= real)
    assert np.median(tv_g) < 1.15 * np.median(tv_c)
    with pytest.raises(ValueError, match="reference path only"):
        WitCertCache(model.config, scheme="int8", backend="kernel", sketch_box="grid")



@pytest.mark.interpreter
def test_per_head_sketch_box_on_both_paths(smollm2):
    """``sketch_box="per-head"``: each query head's own symmetric radius, the same formula on both paths. The
    kernel path (its per-head key levels) covers the realised TV and stays within its tolerance of the reference
    path's per-head bound; on the reference path it is never above the shared symmetric form (up to the tilt's
    tolerance) and below it in median."""
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1]])
    some = dict(compress_layers=KERNEL_LAYERS)
    ker = WitCertCache(model.config, scheme="int8", backend="kernel", audit=True, sketch_box="per-head", **some)
    ref = WitCertCache(model.config, scheme="int8", backend="reference", sketch_box="per-head", **some)
    tv_ker, tv_ref, real = _side_by_side(model, enc, ker, ref, KERNEL_STEPS)
    assert all(ker.layers[i].paged.head_levels for i in KERNEL_LAYERS)
    assert sum(r.audit_violations for r in ker.records) == 0 and np.all(tv_ker >= real - 1e-6)
    assert np.all(tv_ker <= np.minimum(1.0, 1.5 * tv_ref + 0.02))
    sym = WitCertCache(model.config, scheme="int8", backend="reference", sketch_box="symmetric", **some)
    _gen(model, enc, KERNEL_STEPS + 1, past_key_values=sym)
    tv_sym = np.stack([r.tv_a for r in sym.records])
    assert np.all(tv_ref <= tv_sym + 2.0**-11) and np.median(tv_ref) < np.median(tv_sym)
    # "auto" on the kernel path: per-head levels where the scheme's row says so (int4_group, kivi2, the fp8 ones)
    kc = lambda **kw: WitCertCache(model.config, backend="kernel", **kw).kernel_head_levels  # noqa: E731
    assert kc(scheme="kivi2") and kc(scheme="int4_group") and kc(scheme="int8", sketch_box="per-head")
    assert all(kc(scheme=s) for s in ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled"))
    assert not kc(scheme="int8") and not kc(scheme="int8_dither") and not kc(scheme="kivi2", sketch_box="symmetric")
    assert not kc(scheme="kivi2", sketch_bits=0)  # no sketch: no per-head term
    assert ker.metered_sketch_box(True) == ref.metered_sketch_box(False) == "per-head"
    assert sym.metered_sketch_box(False) == sym.metered_sketch_box(True) == "symmetric"
    auto = WitCertCache(model.config, scheme="kivi2")
    assert auto.metered_sketch_box(False) == "centred" and auto.metered_sketch_box(True) == "per-head"

def test_kernel_backend_refuses_unsupported_head_dim():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                      num_hidden_layers=1, intermediate_size=32, vocab_size=16)
    with pytest.raises(ValueError, match="head_dim 48"):
        WitCertCache(cfg, scheme="int8", backend="kernel")
    cache = WitCertCache(cfg, scheme="int8")  # the reference path serves any head dim
    assert not cache.use_kernel(torch.device("cpu"), 1)


def test_block_witnesses_are_sound_and_never_tighter_than_per_token(smollm2):
    model, tok = smollm2
    use_witcert(model)
    enc = _batch(tok, [PROMPTS[1] * 3])
    per_token = WitCertCache(model.config, scheme="int8", audit=True)
    per_block = WitCertCache(model.config, scheme="int8", audit=True, witness="block")
    _gen(model, enc, past_key_values=per_token)
    _gen(model, enc, past_key_values=per_block)
    assert sum(r.audit_violations for r in per_block.records) == 0
    tok_b = np.stack([r.tv_a for r in per_token.records])
    blk_b = np.stack([r.tv_a for r in per_block.records])
    assert np.all(blk_b >= tok_b - 1e-12) and np.any(blk_b > tok_b)
