"""Adversarial review of the repaired-page overlay (gated caches on the kernel path, SPEC §3, §4,
§6, §7): every test passes if the code is sound and fails on the bug it probes.

Kernel level (``decode(..., repair=)``): the kernel's TV⁺ / E⁺ against the float64 truth
(softmax over the exact keys vs softmax over the served keys: dequantized codes on unrepaired
pages, the exact values on repaired ones), the dual-grid supremum over the radius box, and flags
for non-finite exact values. Extreme exact values, a dominant repaired token, splits / tiles /
page levels, every kernel scheme, Tier B, an fp32 pool, the CSR layout, a padding mask.

Misuse and the cache level: ``test_overlay_adversarial_cache.py``; helpers: ``tests.helpers.overlay_review``.

Interpreter (TRITON_INTERPRET=1), small shapes.
"""

import math
import os

import numpy as np
import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEV != "cpu", reason="interpreter review tests (fp32 dots, no bf16 rules)")
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1"

from kernels.decode import decode  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from tests.helpers.kernel_gate import gauss_kv  # noqa: E402
from tests.helpers.overlay_review import SIGMA, TOL, D, build_custom, check_sound, overlay, qrand  # noqa: E402
from witcert import bounds as B  # noqa: E402

# --------------------------------------------------------------------------- kernel level: extreme exact values


def _extreme(kind):
    def kv(b, n, g):
        k = torch.randn(n, 1, D, generator=g) * 2
        k[..., :2] *= 8
        v = torch.randn(n, 1, D, generator=g)
        sl = slice(16, 32)  # page 1: the repaired page
        if kind == "k_big":
            k[sl] *= 20.0  # |k| ~ 1e2..1e3: κ drives Ξ
        elif kind == "k_1e4":
            k[sl] = k[sl].sign() * 1e4
        elif kind == "k_tiny":
            k[sl] = k[sl] * 1e-30
        elif kind == "k_outlier":
            k[sl, :, 5] = 3.0e4
        elif kind == "v_big":
            v[sl] *= 1e4
        elif kind == "v_cancel":
            v[sl] = torch.where(torch.arange(16)[:, None, None] % 2 == 0, 1e4, -1e4) + v[sl] * 1e-3
        elif kind == "v_tiny":
            v[sl] = v[sl] * 1e-30
        elif kind == "k_near_max":
            k[sl, :, 0] = 3.0e38  # bf16 max ≈ 3.39e38: the exact norm overflows fp32
        elif kind == "v_near_max":
            v[sl, :, 0] = -3.0e38
        return k, v

    return kv


@pytest.mark.parametrize("kind", ["k_big", "k_1e4", "k_tiny", "k_outlier", "v_big", "v_cancel", "v_tiny",
                                  "k_near_max", "v_near_max"])
def test_extreme_exact_values_on_a_repaired_page(kind):
    lens = [60]
    cache, bt, exact = build_custom("int8", lens, 1, _extreme(kind), seed=11)
    pages = [(0, 1, 0)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(1, 2, 3, scale=1.0)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=2, repair=rep)
    # every row: flagged (TV⁺ = 1, E⁺ = ∞), or sound against the fp64 truth (exact values near the
    # dtype's limit may legitimately leave a row unflagged with a huge, finite E⁺)
    check_sound(out, cache, bt, exact, pages, lens, q, 2)


def test_dominant_token_on_a_repaired_page():
    """One exact token (in a repaired page) carries almost all the mass; the rest is int8."""
    lens = [90]
    q = qrand(1, 2, 4, scale=1.0)

    def kv(b, n, g):
        k = torch.randn(n, 1, D, generator=g) * 2
        k[..., :2] *= 8
        k[37, 0] = q[0, 0] * 6.0  # logit ≈ 6‖q‖²/8 ≫ the others
        return k, torch.randn(n, 1, D, generator=g)

    cache, bt, exact = build_custom("int8", lens, 1, kv, seed=12)
    pages = [(0, 2, 0)]
    rep = overlay(cache, bt, exact, pages)
    for splits, ppt in ((1, None), (3, 1), (6, 2)):
        out = decode(cache, q, bt, torch.tensor(lens), num_splits=splits, pages_per_tile=ppt, repair=rep)
        assert check_sound(out, cache, bt, exact, pages, lens, q, 2) == 2
    # the unrepaired bound is larger: the dominant token's radius counts there
    plain = decode(cache, q, bt, torch.tensor(lens), num_splits=3)
    assert float(out.meter.tv_upper_a[0, 0]) < float(plain.meter.tv_upper_a[0, 0])


# --------------------------------------------------------------------------- kernel level: tiling / splits / schemes


@pytest.mark.parametrize("ppt,splits,levels", [(1, 1, "token"), (1, 3, "token"), (2, 3, "page"), (4, 5, "token"),
                                               (8, 2, "page"), (1, 7, "page")])
def test_repairs_across_splits_and_tiles(ppt, splits, levels):
    lens = [150, 37]
    Hkv, GQ = 2, 2
    cache, bt, exact = build_custom("int8", lens, Hkv, gauss_kv(Hkv), seed=13)
    # sequence 0: every other page of head 0, the last (partial) page of head 1; sequence 1: all pages of head 0
    pages = [(0, p, 0) for p in range(0, 10, 2)] + [(0, 9, 1)] + [(1, p, 0) for p in range(3)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(2, Hkv * GQ, 5)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=splits, pages_per_tile=ppt, levels=levels, repair=rep)
    assert not out.meter.flag.any()
    assert check_sound(out, cache, bt, exact, pages, lens, q, GQ) == 8


@pytest.mark.parametrize("scheme", ["int8", "int8_dither", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int4_group"])
def test_every_page_repaired_every_scheme(scheme):
    lens = [50]
    cache, bt, exact = build_custom(scheme, lens, 1, gauss_kv(1), seed=14)
    pages = [(0, p, 0) for p in range(4)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(1, 2, 6)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=3, pages_per_tile=1, repair=rep,
                 delta_step=1e-3 if scheme == "int8_dither" else None)
    assert check_sound(out, cache, bt, exact, pages, lens, q, 2, delta=1e-3) == 2
    # only the fp terms remain (int4_group: the tf32x3 γ is larger)
    assert float(out.meter.eps_max.max()) == 0.0 and float(out.meter.tv_upper_a.max()) < (1e-2 if scheme == "int4_group" else 1e-3)
    kx, vx = exact[0][0][:, 0].double(), exact[0][1][:, 0].double()
    p = torch.softmax(SIGMA * (kx @ q[0].double().T), 0)
    torch.testing.assert_close(out.o[0].double(), p.T @ vx, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("levels", ["token", "page"])
def test_tier_b_with_repairs(levels):
    lens = [100, 20]
    Hkv, GQ = 2, 2
    cache, bt, exact = build_custom("int8_dither", lens, Hkv, gauss_kv(Hkv), seed=15)
    pages = [(0, 0, 0), (0, 6, 0), (0, 3, 1), (1, 1, 1)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(2, Hkv * GQ, 7)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=4, pages_per_tile=1, levels=levels, repair=rep,
                 delta_step=1e-3)
    assert out.meter.tv_upper_b is not None
    assert check_sound(out, cache, bt, exact, pages, lens, q, GQ, delta=1e-3) == 8


def test_fp32_pool_values_not_bf16_are_served_exactly():
    """An fp32 model (the interpreter's dots are fp32): exact values that bf16 cannot hold are
    served as they are, and the bound covers them."""
    lens = [40]

    def kv(b, n, g):
        k = torch.randn(n, 1, D, generator=g) * 3 + 2.0**-20  # not bf16
        return k, torch.randn(n, 1, D, generator=g) + 2.0**-21

    cache, bt, exact = build_custom("int8", lens, 1, kv, seed=16, dtype=torch.float32)
    assert not torch.equal(exact[0][0], exact[0][0].bfloat16().float())
    pages = [(0, 0, 0), (0, 2, 0)]
    rep = overlay(cache, bt, exact, pages, dtype=torch.float32)
    q = qrand(1, 2, 8)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=2, repair=rep)
    assert check_sound(out, cache, bt, exact, pages, lens, q, 2) == 2


def test_csr_layout_with_repairs():
    """SGLang's layout (block size 1, kv_indptr): a repaired token slot is a one-token page."""
    lens = [23, 9]
    Hkv = 1
    cache, bt, exact = build_custom("int8", lens, Hkv, gauss_kv(Hkv), seed=17, block_size=1)
    # bt [B, n] token slots; flatten into kv_indices / kv_indptr
    indices = torch.cat([bt[b, :n] for b, n in enumerate(lens)])
    indptr = torch.tensor([0, lens[0], lens[0] + lens[1]], dtype=torch.int32)
    rep = RepairOverlay.allocate(cache.k_codes.shape[0], Hkv, 1, D, torch.bfloat16, capacity=1).bind(cache)
    toks = [(0, 3), (0, 11), (0, 22), (1, 0), (1, 5)]
    for b, j in toks:
        assert rep.page_in(int(bt[b, j]), 0, exact[b][0][j: j + 1, 0], exact[b][1][j: j + 1, 0])
    q = qrand(2, 2, 9)
    out = decode(cache, q, indices, None, kv_indptr=indptr, num_splits=2, repair=rep)
    assert not out.meter.flag.any()
    for b, n in enumerate(lens):
        for hq in range(2):
            kh, vh = dequant_t1(cache, bt, b, n)
            kx, vx = exact[b][0][:, 0].double(), exact[b][1][:, 0].double()
            reps = torch.zeros(n, dtype=torch.bool)
            for bb, j in toks:
                if bb == b:
                    reps[j] = True
            kh, vh = torch.where(reps[:, None], kx, kh), torch.where(reps[:, None], vx, vh)
            qq = q[b, hq].double()
            p_hat, p = torch.softmax(SIGMA * (kh @ qq), 0), torch.softmax(SIGMA * (kx @ qq), 0)
            W = cache.k_wit[bt[b, :n].long(), 0, 0].double()
            W = torch.where(reps[:, None], torch.zeros_like(W), W)
            eps = B.logit_radius(qq, W, [np.arange(D)], SIGMA, block_size=1, n=n)
            tv_k = out.meter.tv_upper_a[b, hq].item()
            assert B.tv(p, p_hat).item() <= tv_k
            assert tv_k >= B.tv_bound_tilt(p_hat, eps, tol=TOL).item() - TOL - 1e-7
            assert (out.o[b, hq].double() - p @ vx).norm().item() <= out.meter.out_err_upper[b, hq].item()
            torch.testing.assert_close(out.o[b, hq].double(), p_hat @ vh, rtol=2e-4, atol=2e-4)


def dequant_t1(cache, bt, b, n):
    blk = bt[b, :n].long()
    kc, vc = cache.k_codes[blk, 0, 0].double(), cache.v_codes[blk, 0, 0].double()
    ks, vs = cache.k_scale[blk, 0, 0].double()[:, None], cache.v_scale[blk, 0, 0].double()[:, None]
    return ks * kc, vs * vc


def test_padding_mask_with_repaired_pages():
    """Left padding: a repaired page partly masked; the masked tokens are neither attended nor metered."""
    lens = [70, 70]
    Hkv, GQ = 1, 2
    cache, bt, exact = build_custom("int8", lens, Hkv, gauss_kv(Hkv), seed=18)
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[1, :21] = False  # sequence 1: 21 padding tokens (page 0 and part of page 1)
    pages = [(0, 1, 0), (1, 1, 0), (1, 0, 0), (1, 4, 0)]
    rep = overlay(cache, bt, exact, pages)
    q = qrand(2, Hkv * GQ, 10)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=3, token_mask=mask, repair=rep)
    assert check_sound(out, cache, bt, exact, pages, lens, q, GQ, mask=mask) == 4


# --------------------------------------------------------------------------- kernel level: non-finite exact values


@pytest.mark.parametrize("where", ["k_nan", "k_inf", "k_neginf", "v_nan", "v_inf"])
def test_nonfinite_exact_values_of_a_repaired_page_flag_their_rows(where):
    lens = [40, 40]
    Hkv, GQ = 2, 2
    cache, bt, exact = build_custom("int8", lens, Hkv, gauss_kv(Hkv), seed=19)
    pages = [(0, 1, 1), (1, 0, 0)]
    rep = overlay(cache, bt, exact, pages)
    r = int(rep.slot[int(bt[0, 1]), 1])  # sequence 0, page 1, kv head 1: poison one exact value in the pool
    val = {"k_nan": math.nan, "k_inf": math.inf, "k_neginf": -math.inf, "v_nan": math.nan, "v_inf": math.inf}[where]
    t = rep.k if where.startswith("k") else rep.v
    t[r, 3, 7] = val
    (rep.k_norm if where.startswith("k") else rep.v_norm)[r, 3] = RepairOverlay.norms_up(t[r, 3:4])[0]
    q = qrand(2, Hkv * GQ, 11)
    out = decode(cache, q, bt, torch.tensor(lens), num_splits=2, repair=rep)
    rec = out.meter
    for hq in (2, 3):  # the poisoned kv head of sequence 0: saturated and flagged, never certified
        assert bool(rec.flag[0, hq]) and rec.tv_upper_a[0, hq].item() == 1.0
        assert rec.out_err_upper[0, hq].item() == float("inf")
    # the other rows are untouched by the poison and stay sound
    assert not rec.flag[1].any() and not rec.flag[0, :2].any()


def test_nonfinite_pool_value_past_seq_len_is_not_read():
    """A NaN in a repaired page's pool beyond the sequence's length is not a token: no flag."""
    lens = [20]
    cache, bt, exact = build_custom("int8", lens, 1, gauss_kv(1), seed=20)
    pages = [(0, 1, 0)]  # tokens 16..19
    rep = overlay(cache, bt, exact, pages)
    r = int(rep.slot[int(bt[0, 1]), 0])
    rep.k[r, 10, :] = math.nan  # token 26: not written, not in the sequence
    q = qrand(1, 2, 12)
    out = decode(cache, q, bt, torch.tensor(lens), repair=rep)
    assert not out.meter.flag.any()
    assert check_sound(out, cache, bt, exact, pages, lens, q, 2) == 2
