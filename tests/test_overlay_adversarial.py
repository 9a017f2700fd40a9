"""Adversarial review of the repaired-page overlay (gated caches on the kernel path, SPEC §3, §4,
§6, §7): every test passes if the code is sound and fails on the bug it probes.

Kernel level (``decode(..., repair=)``): the kernel's TV⁺ / E⁺ against the float64 truth
(softmax over the exact keys vs softmax over the served keys: dequantized codes on unrepaired
pages, the exact values on repaired ones), the dual-grid supremum over the radius box, and flags
for non-finite exact values. Extreme exact values, a dominant repaired token, splits / tiles /
page levels, every kernel scheme, Tier B, an fp32 pool, the CSR layout, a padding mask.

Misuse: slots outside the pool / at the scratch row / below −1 / at an unwritten row, a
non-contiguous slot, ``page_in`` with a negative block, values that the pool's dtype cannot hold
(``page_in``, ``write``, a bf16 pool on an fp32 cache), an overlay paged in from another cache.

Cache level (``WitCertCache(gate=..., backend="kernel")``): crop after a repair, reset and
reuse, left padding, growth, beams, the pool growing inside the gate loop; after every step the served values of every repaired page
equal the exact store, and the exact store is never modified.

Interpreter (TRITON_INTERPRET=1), small shapes.
"""

import dataclasses
import math
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

from test_kernel_gate import build, dequant, gauss_kv, tiny_llama  # noqa: E402

from kernels.decode import decode  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from kernels.write import write_kv  # noqa: E402
from witcert import bounds as B  # noqa: E402

D = 64
T = 16
SIGMA = 1 / math.sqrt(D)
TOL = 2.0**-14


# --------------------------------------------------------------------------- helpers


def build_custom(scheme, lens, Hkv, kv_fn, seed=0, dtype=torch.bfloat16, block_size=T):
    """A paged cache on the CPU whose exact K/V of sequence b are ``kv_fn(b, n, generator)``
    (``test_kernel_gate.build`` with three spare blocks)."""
    return build(scheme, lens, Hkv, seed=seed, kv_fn=kv_fn, dtype=dtype, block_size=block_size, spare=3, device="cpu")



def overlay(cache, bt, exact, pages, dtype=torch.bfloat16):
    NB, Hkv = cache.k_codes.shape[:2]
    T_ = cache.block_size
    rep = RepairOverlay.allocate(NB, Hkv, T_, D, dtype, capacity=1).bind(cache)
    for b, pg, h in pages:
        k, v = exact[b]
        lo, hi = pg * T_, min((pg + 1) * T_, k.shape[0])
        assert rep.page_in(int(bt[b, pg]), h, k[lo:hi, h], v[lo:hi, h])
    return rep


def served(cache, bt, exact, pages, b, n, h):
    """fp64 (k̂, v̂) of (b, h): the dequantized codes, the exact values on repaired pages."""
    kh, vh = dequant(cache, bt, b, n, h)
    kx, vx = (t[:n, h].double() for t in exact[b])
    reps = torch.zeros(n, dtype=torch.bool)
    for bb, pg, hh in pages:
        if bb == b and hh == h:
            reps[pg * T: (pg + 1) * T] = True
    return torch.where(reps[:, None], kx, kh), torch.where(reps[:, None], vx, vh), kx, vx, reps


def check_sound(out, cache, bt, exact, pages, lens, q, GQ, mask=None, delta=None):
    """Every unflagged row: TV⁺ ≥ the realised TV and ≥ the supremum over the radius box (the fp64
    dual-grid tilt, within its tolerance); E⁺ ≥ ‖ô_kernel − o‖ and ≥ ‖ô_fp64 − o‖. A flagged row
    must report TV⁺ = 1 and E⁺ = ∞. Returns the number of unflagged rows checked."""
    rec = out.meter
    checked = 0
    for b, n in enumerate(lens):
        for hq in range(q.shape[1]):
            tv_k = rec.tv_upper_a[b, hq].item()
            e_k = rec.out_err_upper[b, hq].item()
            assert 0.0 <= tv_k <= 1.0 and not math.isnan(e_k)
            if bool(rec.flag[b, hq]):
                assert tv_k == 1.0 and e_k == float("inf")
                continue
            h = hq // GQ
            kh, vh, kx, vx, reps = served(cache, bt, exact, pages, b, n, h)
            live = torch.ones(n, dtype=torch.bool) if mask is None else mask[b, :n]
            qq = q[b, hq].double()
            s_hat = SIGMA * (kh @ qq)
            s = SIGMA * (kx @ qq)
            s_hat = torch.where(live, s_hat, torch.full_like(s_hat, -math.inf))
            s = torch.where(live, s, torch.full_like(s, -math.inf))
            p_hat, p = torch.softmax(s_hat, 0), torch.softmax(s, 0)
            assert torch.isfinite(p_hat).all() and torch.isfinite(p).all()
            o, o_hat = p @ vx, p_hat @ vh
            tv_real = B.tv(p, p_hat).item()
            assert tv_real <= tv_k, (b, hq, tv_real, tv_k)
            j = torch.arange(n)
            W = cache.k_wit[bt[b, j // T].long(), h, j % T].double()
            W = torch.where(reps[:, None], torch.zeros_like(W), W)
            eps = B.logit_radius(qq, W, [np.arange(D)], SIGMA, block_size=1, n=n)
            eps = torch.where(live, eps, torch.zeros_like(eps))
            assert torch.all((s_hat - s)[live].abs() <= eps[live])  # the radii cover the realised δ
            sup = B.tv_bound_tilt(p_hat, eps, tol=TOL).item() if n > 1 else 0.0
            assert tv_k >= sup - TOL - 1e-7, (b, hq, sup, tv_k)
            err_kernel = (out.o[b, hq].double() - o).norm().item()
            err_fp64 = (o_hat - o).norm().item()
            assert err_kernel <= e_k and err_fp64 <= e_k, (b, hq, err_kernel, err_fp64, e_k)
            if delta is not None and rec.tv_upper_b is not None:
                sc = cache.k_scale[bt[b, j // T].long(), h, j % T].double()
                sc = torch.where(reps, torch.zeros_like(sc), sc)
                V = B.dither_variance_proxy(qq, sc, SIGMA)
                t = B.dither_radius(V, n, delta, bias=B.dither_bias_bound(qq, sc, SIGMA))
                t = torch.where(live, t, torch.zeros_like(t))
                assert rec.tv_upper_b[b, hq].item() >= B.tv_bound_tilt(p_hat, t, tol=TOL).item() - TOL - 1e-7
            checked += 1
    return checked


def qrand(Bsz, Hq, seed, scale=1.5):
    return (torch.randn(Bsz, Hq, D, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16().float()


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
        sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
        from test_overlay_adversarial import _misuse_setup
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
