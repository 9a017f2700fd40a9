"""Adversarial review of the repaired-page overlay (gated caches on the kernel path, SPEC §3, §4,
§6, §7), misuse and the cache level: every test passes if the code is sound and fails on the bug it probes.
The kernel level: ``test_overlay_adversarial.py``; helpers: ``tests.helpers.overlay_review``.
Misuse: slots outside the pool / at the scratch row / below −1 / at an unwritten row, a
non-contiguous slot, ``page_in`` with a negative block, values that the pool's dtype cannot hold
(``page_in``, ``write``, a bf16 pool on an fp32 cache), an overlay paged in from another cache.

Cache level (``WitCertCache(gate=..., backend="kernel")``): crop after a repair, reset and
reuse, left padding, growth, beams, the pool growing inside the gate loop; after every step the served values of every repaired page
equal the exact store, and the exact store is never modified.

Interpreter (TRITON_INTERPRET=1), small shapes.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEV != "cpu", reason="interpreter review tests (fp32 dots, no bf16 rules)")
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1"

from kernels.decode import decode  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from kernels.write import write_kv  # noqa: E402
from tests.helpers.kernel_gate import gauss_kv, tiny_llama  # noqa: E402
from tests.helpers.overlay_review import SIGMA, TOL, D, T, build_custom, check_sound, overlay, qrand, served  # noqa: E402
from witcert import bounds as B  # noqa: E402

# --------------------------------------------------------------------------- misuse


def _misuse_setup():
    cache, bt, exact = build_custom("int8", [40], 1, gauss_kv(1), seed=21)
    rep = overlay(cache, bt, exact, [(0, 0, 0)])
    return cache, bt, exact, rep, qrand(1, 2, 13)


def _exact_err(out, exact, q):
    kx, vx = exact[0][0][:, 0].double(), exact[0][1][:, 0].double()
    errs = []
    for hq in range(q.shape[1]):
        p = torch.softmax(SIGMA * (kx @ q[0, hq].double()), 0)
        errs.append((out.o[0, hq].double() - p @ vx).norm().item())
    return errs


def test_slot_at_the_scratch_row_is_refused_or_flagged():
    """Row R of the pool is the scratch row that ``write`` fills with tokens of pages NOT repaired.
    A slot pointing at it serves another page's values as 'exact' (radius 0, φ = 0)."""
    cache, bt, exact, rep, q = _misuse_setup()
    k1, v1 = exact[0][0][16:32], exact[0][1][16:32]
    rep.write(torch.full((16,), int(bt[0, 1])), torch.arange(16), k1 * 50, v1 * 50)  # page 1 not repaired: scratch
    bad = dataclasses.replace(rep, slot=rep.slot.clone())
    bad.slot[int(bt[0, 2]), 0] = rep.capacity
    try:
        out = decode(cache, q, bt, torch.tensor([40]), repair=bad)
    except ValueError:
        return
    errs = _exact_err(out, exact, q)
    for hq in range(2):  # accepted: then every row must still be sound (or flagged)
        assert bool(out.meter.flag[0, hq]) or errs[hq] <= out.meter.out_err_upper[0, hq].item(), (errs, out.meter.out_err_upper)


def test_slot_past_the_pool_is_refused():
    """A slot ≥ R + 1 makes the kernel read past the pool (a segfault in the interpreter, arbitrary
    memory on the GPU). Run in a subprocess: the decode must raise ValueError."""
    code = textwrap.dedent("""
        import os, sys, torch
        sys.path[:0] = [os.getcwd()]
        from tests.kernels.test_overlay_adversarial_cache import _misuse_setup
        from kernels.decode import decode
        cache, bt, exact, rep, q = _misuse_setup()
        rep.slot[int(bt[0, 1]), 0] = 100000
        try:
            out = decode(cache, q, bt, torch.tensor([40]), repair=rep)
        except ValueError:
            print("REFUSED"); sys.exit(0)
        print("ACCEPTED", out.meter.flag.tolist()); sys.exit(3)
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"rc={r.returncode} (139/-11: segfault) stdout={r.stdout[-300:]!r}"


def test_slot_below_minus_one_is_refused():
    cache, bt, exact, rep, q = _misuse_setup()
    rep.slot[int(bt[0, 1]), 0] = -2
    with pytest.raises(ValueError):
        decode(cache, q, bt, torch.tensor([40]), repair=rep)


def test_slot_at_an_unwritten_pool_row_saturates():
    """A slot in [count, R): a pool row nobody filled (NaN norms): flagged, never certified."""
    cache, bt, exact, rep, q = _misuse_setup()
    rep._grow(4)
    assert rep.capacity >= 4 and rep.count == 1
    rep.slot[int(bt[0, 1]), 0] = 2
    try:
        out = decode(cache, q, bt, torch.tensor([40]), repair=rep)
    except ValueError:
        return
    assert out.meter.flag.all() and torch.all(out.meter.tv_upper_a == 1.0)


def test_page_in_with_a_negative_block_is_refused():
    """``page_in(-1, ...)`` silently repairs the LAST block (Python indexing) with the given values."""
    rep = RepairOverlay.allocate(4, 1, T, D, torch.bfloat16, capacity=1)
    z = torch.zeros(T, D)
    try:
        done = rep.page_in(-1, 0, z, z)
    except (ValueError, IndexError):
        done = None
    assert not done and int(rep.slot[3, 0]) == -1


def test_page_in_values_the_pool_cannot_hold():
    """fp32 exact values into a bf16 pool: rounded silently while the norms are taken before the
    rounding (κ, ν below the norm of what is served), and the served 'exact' token differs from the
    caller's exact value with radius 0. Must raise, or store exactly with norms ≥ the stored norms."""
    rep = RepairOverlay.allocate(4, 1, T, D, torch.bfloat16, capacity=1)
    x = torch.full((T, D), 1 + 2.0**-8 + 2.0**-20)  # rounds up to 1 + 2^-7 in bf16
    try:
        rep.page_in(0, 0, x, x)
    except ValueError:
        return
    stored = rep.k[0].double()
    assert torch.equal(stored, x.double())
    assert torch.all(rep.k_norm[0].double() >= stored.norm(dim=-1))


def test_write_values_the_pool_cannot_hold():
    rep = RepairOverlay.allocate(4, 1, T, D, torch.bfloat16, capacity=1)
    rep.page_in(0, 0, torch.zeros(2, D, dtype=torch.bfloat16), torch.zeros(2, D, dtype=torch.bfloat16))
    x = torch.full((1, 1, D), 1 + 2.0**-8 + 2.0**-20)
    try:
        rep.write(torch.tensor([0]), torch.tensor([2]), x, x)
    except ValueError:
        return
    assert torch.equal(rep.k[0, 2].double(), x[0, 0].double())
    assert float(rep.k_norm[0, 2]) >= rep.k[0, 2].double().norm().item()


def test_noncontiguous_slot_is_refused():
    """The kernel indexes the slot as [block · stride, head]: a head stride ≠ 1 must be refused."""
    cache, bt, exact = build_custom("int8", [40], 2, gauss_kv(2), seed=22)
    rep = overlay(cache, bt, exact, [(0, 0, 1)])
    NB = cache.k_codes.shape[0]
    slot_t = torch.full((2, NB), -1, dtype=torch.int32)
    slot_t[1, int(bt[0, 0])] = 0
    bad = dataclasses.replace(rep, slot=slot_t.t())
    assert not bad.slot.is_contiguous() and torch.equal(bad.slot, rep.slot)
    with pytest.raises(ValueError, match="repair"):
        decode(cache, qrand(1, 2, 14), bt, torch.tensor([40]), repair=bad)


# --------------------------------------------------------------------------- cache level


def _check_cache_invariants(cache):
    """Every layer: each repaired page's served values equal the exact store (all tokens < n,
    including those written after the page-in), and audit violations are 0."""
    from witcert.cache import served_kv

    for lay in cache.layers:
        if lay.rep is None or lay.rep.count == 0:
            continue
        n = lay.get_seq_length()
        kh, vh = served_kv(lay.paged, lay.block_table, n, lay.rep)
        ek, ev = lay.exact_k.double(), lay.exact_v.double()
        Bsz, H = ek.shape[:2]
        for b in range(Bsz):
            for pg in range(-(-n // T)):
                for h in range(H):
                    if int(lay.rep.slot[int(lay.block_table[b, pg]), h]) >= 0:
                        sl = slice(pg * T, min(n, (pg + 1) * T))
                        assert torch.equal(kh[b, h, sl].cpu(), ek[b, h, sl]), (lay.layer_idx, b, pg, h)
                        assert torch.equal(vh[b, h, sl].cpu(), ev[b, h, sl]), (lay.layer_idx, b, pg, h)
    assert sum(r.audit_violations for r in cache.records) == 0
    for r in cache.records:
        assert np.all(r.tv_a >= r.tv_real) and np.all(r.out_err >= r.out_err_real)


def _watch_store(monkeypatch, cache):
    """After every metered step, the exact store's prefix written before it is bit-identical."""
    from witcert.cache import WitCertCache

    orig = WitCertCache._kernel_attention
    snaps = {}

    def watched(self, layer, query, allowed, sm):
        n = layer.get_seq_length() - query.shape[2]  # the tokens written before this step
        if layer.layer_idx in snaps:
            k0, v0 = snaps[layer.layer_idx]
            m = min(k0.shape[2], n)
            assert torch.equal(layer.exact_k[:, :, :m], k0[:, :, :m]) and torch.equal(layer.exact_v[:, :, :m], v0[:, :, :m])
        out = orig(self, layer, query, allowed, sm)
        snaps[layer.layer_idx] = (layer.exact_k.clone(), layer.exact_v.clone())
        return out

    monkeypatch.setattr(WitCertCache, "_kernel_attention", watched)
    return snaps


def _step(model, cache, tok):
    out = model(tok, past_key_values=cache, use_cache=True)
    return out.logits[:, -1].argmax(-1, keepdim=True)


def test_crop_after_repair_then_write_into_the_cropped_repaired_page(monkeypatch):
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(3)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", gate=Gate("risk-ranked", tau=1.0),
                         audit=True, seed=5)
    _watch_store(monkeypatch, cache)
    ids = torch.randint(1, 128, (2, 37), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for lay in cache.layers:
            assert lay.page_in(0, 1, 2) > 0  # tail page 2 (tokens 32..36) of sequence 0, head 1
            assert lay.page_in(1, 0, 1) > 0  # full page 1 of sequence 1, head 0
        for _ in range(4):  # tokens 37..40 into the repaired tail page
            nxt = _step(model, cache, nxt)
        cache.crop(-6)  # back to 35 tokens: page 2 keeps tokens 32..34; page 1 intact
        assert cache.get_seq_length() == 35
        # new tokens (different from the rolled-back ones) land in the still-repaired page
        nxt = (nxt + 7) % 128
        for _ in range(5):
            nxt = _step(model, cache, nxt)
        # crop back into page 1 of sequence 1 (tokens 16..31): then write into it again
        cache.crop(-(cache.get_seq_length() - 20))
        for _ in range(3):
            nxt = _step(model, cache, (nxt + 3) % 128)
    assert cache.get_seq_length() == 23
    _check_cache_invariants(cache)


def test_reset_and_reuse_a_gated_kernel_cache(monkeypatch):
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(4)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", audit=True, seed=7,
                         gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=1))
    snaps = _watch_store(monkeypatch, cache)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        ids = torch.randint(1, 128, (2, 33), generator=g)
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=3,
                       min_new_tokens=3, do_sample=False, pad_token_id=0)
        _check_cache_invariants(cache)
        assert cache.layers[0].rep.count > 0
        cache.reset()
        snaps.clear()  # a new request: a new store
        ids = torch.randint(1, 128, (1, 21), generator=g)  # another batch size and length
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=3,
                       min_new_tokens=3, do_sample=False, pad_token_id=0)
    lay = cache.layers[0]
    assert lay.get_seq_length() == 23 and lay.rep.slot.shape[0] == lay.paged.k_codes.shape[0]
    assert lay.rep.count == int(cache.pagein_blocks[0].sum())  # no repair carried over from the last request
    _check_cache_invariants(cache)


def test_left_padding_batch_with_repairs(monkeypatch):
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(5)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", audit=True, seed=9,
                         gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=2))
    _watch_store(monkeypatch, cache)
    ids = torch.randint(1, 128, (2, 36), generator=torch.Generator().manual_seed(10))
    am = torch.ones_like(ids)
    am[1, :19] = 0  # left padding: page 0 and part of page 1 of sequence 1
    ids[1, :19] = 0
    with torch.no_grad():
        model.generate(ids, attention_mask=am, past_key_values=cache, max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
    assert int(cache.pagein_blocks.sum()) > 0
    _check_cache_invariants(cache)


def test_growth_past_max_tokens_after_a_manual_repair(monkeypatch):
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(6)
    cache = WitCertCache(model.config, scheme="int8_dither", backend="kernel", audit=True, seed=11, max_tokens=16,
                         gate=Gate("risk-ranked", tau=1.0))
    _watch_store(monkeypatch, cache)
    ids = torch.randint(1, 128, (2, 14), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for lay in cache.layers:
            assert lay.block_table.shape[1] == 1
            lay.page_in(1, 1, 0)  # page 0 of sequence 1 (tokens 0..13): tokens 14, 15 arrive later
        for _ in range(6):  # 14 → 20 tokens: the cache grows from 1 to 2 pages per sequence
            nxt = _step(model, cache, nxt)
    assert cache.layers[0].block_table.shape[1] >= 2
    _check_cache_invariants(cache)


def test_beams_with_repairs_keep_each_beam_exact(monkeypatch):
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(7)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", audit=True, seed=13,
                         gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=1))
    ids = torch.randint(1, 128, (1, 30), generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=5,
                       num_beams=3, do_sample=False, pad_token_id=0)
    assert int(cache.pagein_blocks.sum()) > 0
    _check_cache_invariants(cache)


def test_a_pool_dtype_narrower_than_the_cache_is_refused_or_sound():
    """An fp32 cache (exact fp32 K/V) given a bf16 overlay: ``decode`` accepts it off the GPU, and
    ``page_in`` rounds the exact keys into bf16 while serving them with radius 0. The served keys
    then differ from the exact ones by up to 2^-8 relative, unmetered: TV⁺ must still cover the truth
    (or the mismatch must be refused)."""
    lens = [32]
    hi, lo = 1 + 2.0**-7, 1 + 2.0**-8 + 2.0**-20  # lo rounds up to hi in bf16; hi is exact
    a = torch.tensor([hi if j % 2 == 0 else lo for j in range(32)])

    def kv(b, n, g):
        k = a[:n, None, None].expand(n, 1, D).clone()
        return k, torch.randn(n, 1, D, generator=g)

    cache, bt, exact = build_custom("int8", lens, 1, kv, seed=23, dtype=torch.float32)
    pages = [(0, 0, 0), (0, 1, 0)]
    q = torch.full((1, 1, D), 32.0)  # exactly bf16; logits 256·a: a 1-nat gap that bf16 erases
    try:
        rep = overlay(cache, bt, exact, pages, dtype=torch.bfloat16)
        out = decode(cache, q, bt, torch.tensor(lens), repair=rep)
    except ValueError:
        return
    kx, vx = exact[0][0][:, 0].double(), exact[0][1][:, 0].double()
    p = torch.softmax(SIGMA * (kx @ q[0, 0].double()), 0)
    p_served = torch.softmax(SIGMA * (rep.k[:2].reshape(32, D).double() @ q[0, 0].double()), 0)
    tv_real = B.tv(p, p_served).item()
    assert bool(out.meter.flag[0, 0]) or tv_real <= out.meter.tv_upper_a[0, 0].item(), (tv_real, out.meter.tv_upper_a)
    err = (out.o[0, 0].double() - p @ vx).norm().item()
    assert bool(out.meter.flag[0, 0]) or err <= out.meter.out_err_upper[0, 0].item(), (err, out.meter.out_err_upper)


@pytest.mark.parametrize("G,per_token", [(4, True), (1, False), (4, False)])
def test_repairs_with_groups_and_block_witnesses(G, per_token):
    """Group witnesses (G > 1: ‖W_j‖₂ over the groups) and per-block witnesses (TW = 1, float32): a
    repaired page's radius is 0 whatever its page's witness row says; the others keep theirs."""
    lens = [70]
    Hkv = 1
    g = torch.Generator().manual_seed(24)
    cache = PagedKV.allocate(8, Hkv, D, scheme="int8", block_size=T, num_groups=G, per_token_witness=per_token,
                             model_dtype=torch.bfloat16)
    bt = torch.tensor([[5, 0, 7, 2, 3]], dtype=torch.int32)
    k = (torch.randn(70, Hkv, D, generator=g) * 2).bfloat16()
    k[..., :2] *= 8
    v = torch.randn(70, Hkv, D, generator=g).bfloat16()
    write_kv(cache, k, v, bt, torch.zeros(70, dtype=torch.long), torch.arange(70))
    exact = [(k, v)]
    pages = [(0, 1, 0), (0, 4, 0)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(1, 2, 15)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=3, pages_per_tile=1, repair=rep)
    assert not out.meter.flag.any()
    j = torch.arange(70)
    blk = bt[0, j // T].long()
    for hq in range(2):
        kh, vh, kx, vx, reps = served(cache, bt, exact, pages, 0, 70, 0)
        qq = q[0, hq].double()
        if per_token:
            W = cache.k_wit[blk, 0, j % T].double()  # [n, G]
        else:
            W = cache.k_wit[blk, 0, 0].double()
        W = torch.where(reps[:, None], torch.zeros_like(W), W)
        Wn = W.norm(dim=-1, keepdim=True)  # the kernel's radius σ‖q‖‖W_j‖₂ (≥ the group sum)
        eps = B.logit_radius(qq, Wn, [np.arange(D)], SIGMA, block_size=1, n=70)
        s_hat, s = SIGMA * (kh @ qq), SIGMA * (kx @ qq)
        assert torch.all((s_hat - s).abs() <= eps)
        p_hat, p = torch.softmax(s_hat, 0), torch.softmax(s, 0)
        tv_k = out.meter.tv_upper_a[0, hq].item()
        assert B.tv(p, p_hat).item() <= tv_k
        assert tv_k >= B.tv_bound_tilt(p_hat, eps, tol=TOL).item() - TOL - 1e-7
        assert (out.o[0, hq].double() - p @ vx).norm().item() <= out.meter.out_err_upper[0, hq].item()


def test_an_overlay_of_another_cache_is_refused():
    """Two caches of the same shape: the overlay paged in from cache A, passed with cache B, serves
    A's exact values as B's (radius 0, unmetered). The overlay carries no owner to check against."""
    lens = [40]
    cache_a, bt, exact_a = build_custom("int8", lens, 1, gauss_kv(1), seed=25)
    cache_b, bt_b, exact_b = build_custom("int8", lens, 1, gauss_kv(1, scale_k=2.5, scale_v=1.7), seed=25)
    assert torch.equal(bt, bt_b)  # the same block table, other values
    rep_a = overlay(cache_a, bt, exact_a, [(0, 0, 0), (0, 1, 0), (0, 2, 0)])
    q = qrand(1, 2, 16)
    try:
        out = decode(cache_b, q, bt_b, torch.tensor(lens), repair=rep_a)
    except ValueError:
        return
    kx, vx = exact_b[0][0][:, 0].double(), exact_b[0][1][:, 0].double()
    for hq in range(2):
        p = torch.softmax(SIGMA * (kx @ q[0, hq].double()), 0)
        err = (out.o[0, hq].double() - p @ vx).norm().item()
        assert bool(out.meter.flag[0, hq]) or err <= out.meter.out_err_upper[0, hq].item(), (err, out.meter.out_err_upper)


def test_pool_grows_inside_the_gate_loop(monkeypatch):
    """More page-ins than the pool's initial capacity (8): the pool grows (``_grow``) between the gate's
    rounds of one step, and the remeasured decode reads the grown pool."""
    from witcert.cache import Gate, WitCertCache

    model = tiny_llama(8)
    cache = WitCertCache(model.config, scheme="int8", backend="kernel", audit=True, seed=15,
                         gate=Gate("certified", tau=1e-4, max_pagein_blocks=4))
    _watch_store(monkeypatch, cache)
    ids = torch.randint(1, 128, (2, 70), generator=torch.Generator().manual_seed(16))
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=4,
                       min_new_tokens=4, do_sample=False, pad_token_id=0)
    lay = cache.layers[0]
    assert lay.rep.count > 8 and lay.rep.capacity >= lay.rep.count
    assert lay.rep.count == int(cache.pagein_blocks[0].sum())
    _check_cache_invariants(cache)
    for r in cache.records:  # certified: a row still over τ after the budget is flagged
        assert np.array_equal(r.flag, r.tv_a > 1e-4)


@pytest.mark.parametrize("tilt_above", [-1.0, 0.02])
def test_fused_merge_kernel_with_repairs(monkeypatch, tilt_above):
    """The GPU's fused merge / epilogue (run here in the interpreter) on repaired pages, with and without
    the gate's ``tilt_above`` shortcut: the same soundness checks."""
    import kernels.decode as KD

    monkeypatch.setattr(KD, "MERGE_OFF_GPU", "kernel")
    lens = [90, 30]
    Hkv, GQ = 2, 2
    cache, bt, exact = build_custom("int8_dither", lens, Hkv, gauss_kv(Hkv), seed=27)
    pages = [(0, 1, 0), (0, 5, 1), (1, 0, 0), (1, 1, 1)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(2, Hkv * GQ, 17)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=3, repair=rep, delta_step=1e-3, tilt_above=tilt_above)
    assert not out.meter.flag.any()
    assert check_sound(out, cache, bt, exact, pages, lens, q, GQ, delta=1e-3) == 8
