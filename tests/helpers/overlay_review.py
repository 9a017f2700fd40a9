"""Shared helpers of the overlay's adversarial review (``tests/kernels/test_overlay_adversarial.py``,
``test_overlay_adversarial_cache.py``): caches with custom exact values, their overlays, the values a row is
served, the float64 soundness check of a decode against the exact and the served keys, random queries."""

import math
import os

import numpy as np
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1"

from kernels.repair import RepairOverlay  # noqa: E402
from tests.helpers.kernel_gate import build, dequant  # noqa: E402
from witcert import bounds as B  # noqa: E402

D = 64
T = 16
SIGMA = 1 / math.sqrt(D)
TOL = 2.0**-14


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
