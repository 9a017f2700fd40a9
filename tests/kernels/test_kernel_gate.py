"""Gated caches on the kernel path (SPEC §6, §7): the repaired-page overlay of the decode kernel
(``kernels.repair.RepairOverlay``, ``decode(..., repair=...)``) and ``WitCertCache(gate=...,
backend="kernel")``. Interpreter (TRITON_INTERPRET=1), small shapes.

* an overlay with no repaired page changes nothing (bit-identical to the plain kernel);
* a repaired page is served exact: the output matches the fp64 attention over the mixed
  exact / dequantized keys, TV⁺ ≥ the fp64 exact supremum and ≥ the realised TV;
* bad overlays raise ValueError;
* (the gated WitCertCache on the kernel path: ``test_kernel_gate_cache.py``; helpers:
  ``tests.helpers.kernel_gate``).
"""

import dataclasses
import math
import os

import numpy as np
import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = pytest.mark.gpu  # in the device run (WITCERT_DEVICE=cuda): docs/testing.md
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels.decode import decode  # noqa: E402
from kernels.plan import tile_config  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from kernels.write import write_kv  # noqa: E402
from tests.helpers.kernel_gate import D, T, assert_served, build, dequant, overlay_for  # noqa: E402
from witcert import bounds as B  # noqa: E402

SCHEMES = ["int8", "int8_dither", "fp8_e4m3", "int4_group"]


@pytest.mark.parametrize("meter", [True, False])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_overlay_without_repaired_pages_is_bit_identical(scheme, meter):
    lens = [70, 33]
    cache, bt, exact = build(scheme, lens, 2, seed=1)
    q = torch.randn(2, 4, D, generator=torch.Generator().manual_seed(5)).bfloat16().float().to(DEV)
    sl = torch.tensor(lens).to(DEV)
    kw = dict(num_splits=2, meter=meter, delta_step=1e-3 if meter else None)
    if DEV == "cpu":
        # the interpreter's dots are numpy float32 matmuls, whose rounding at 8 columns depends on the
        # operands' memory order (a loaded-and-transposed tile vs the overlay's selected one; equal at
        # 16): the overlay logic is compared bit for bit at 16 head columns there, at 8 on the GPU
        kw["tile"] = dataclasses.replace(tile_config(meter, scheme), head_columns=16)
    plain = decode(cache, q, bt.to(DEV), sl, **kw)
    empty = RepairOverlay.allocate(cache.k_codes.shape[0], 2, T, D, torch.bfloat16, device=DEV).bind(cache)
    with_empty = decode(cache, q, bt.to(DEV), sl, repair=empty, **kw)
    assert torch.equal(plain.o, with_empty.o) and torch.equal(plain.lse, with_empty.lse)
    # an overlay whose only repaired page belongs to no sequence: the HAS_REP kernel, nothing repaired
    unused = overlay_for(cache, bt, exact, [])
    spare = int(torch.tensor(sorted(set(range(cache.k_codes.shape[0])) - set(bt.flatten().tolist())))[0])
    z = torch.zeros(T, D, dtype=torch.bfloat16)
    unused.page_in(spare, 0, z, z)
    assert unused.count == 1
    has_rep = decode(cache, q, bt.to(DEV), sl, repair=unused, **kw)
    assert torch.equal(plain.o, has_rep.o) and torch.equal(plain.lse, has_rep.lse)
    if meter:
        for f in ("tv_upper_a", "tv_upper_b", "out_err_upper", "eps_max", "tb_max", "hist", "hist_b", "xi", "rho"):
            a, b = getattr(plain.meter, f), getattr(has_rep.meter, f)
            assert (a is None and b is None) or torch.equal(a, b), f


@pytest.mark.parametrize("scheme", SCHEMES)
def test_repaired_pages_are_served_exact_and_metered_soundly(scheme):
    lens = [70, 12]
    Hkv, GQ = 2, 2
    cache, bt, exact = build(scheme, lens, Hkv, seed=2)
    # sequence 0: pages 0 and 4 (the partial tail) of kv head 0, page 2 of kv head 1; sequence 1: its only page, head 1
    pages = [(0, 0, 0), (0, 4, 0), (0, 2, 1), (1, 0, 1)]
    rep = overlay_for(cache, bt, exact, pages)
    q = (torch.randn(2, Hkv * GQ, D, generator=torch.Generator().manual_seed(7)) * 1.5).bfloat16().float()
    sigma = 1 / math.sqrt(D)
    delta = 1e-3
    out = decode(cache, q.to(DEV), bt.to(DEV), torch.tensor(lens).to(DEV), num_splits=3, repair=rep, delta_step=delta)
    rec = out.meter
    assert not rec.flag.any()
    for b, n in enumerate(lens):
        for hq in range(Hkv * GQ):
            h = hq // GQ
            kh, vh = dequant(cache, bt, b, n, h)
            kx, vx = (t[:, h].double() for t in exact[b])
            reps = torch.zeros(n, dtype=torch.bool)
            for bb, pg, hh in pages:
                if bb == b and hh == h:
                    reps[pg * T: (pg + 1) * T] = True
            kh = torch.where(reps[:, None], kx, kh)  # the served keys: exact on repaired pages
            vh = torch.where(reps[:, None], vx, vh)
            qq = q[b, hq].double()
            p_hat = torch.softmax(sigma * (kh @ qq), 0)
            o_ref = p_hat @ vh
            assert_served(out.o[b, hq], o_ref, vh)
            # radii: the stored witnesses, 0 on repaired pages (each ≥ |δ_j|)
            j = torch.arange(n)
            W = cache.k_wit.cpu()[bt[b, j // T].long(), h, j % T].double()
            W = torch.where(reps[:, None], torch.zeros_like(W), W)
            eps = B.logit_radius(qq, W, [np.arange(D)], sigma, block_size=1, n=n)
            assert torch.all((sigma * ((kh - kx) @ qq)).abs() <= eps)
            tv_k = rec.tv_upper_a[b, hq].item()
            assert tv_k >= B.tv_bound_tilt(p_hat, eps, tol=2**-14).item() - 2**-14 - 1e-7
            if n <= 12:
                assert tv_k >= B.tv_sup_bruteforce(p_hat, eps).item()
            p = torch.softmax(sigma * (kx @ qq), 0)
            assert B.tv(p, p_hat).item() <= tv_k
            assert (o_ref - p @ vx).norm().item() <= rec.out_err_upper[b, hq].item()
            if scheme == "int8_dither":
                sc = cache.k_scale.cpu()[bt[b, j // T].long(), h, j % T].double()
                sc = torch.where(reps, torch.zeros_like(sc), sc)  # a repaired token: Tier B radius 0
                V = B.dither_variance_proxy(qq, sc, sigma)
                t = B.dither_radius(V, n, delta, bias=B.dither_bias_bound(qq, sc, sigma))
                assert rec.tv_upper_b[b, hq].item() >= B.tv_bound_tilt(p_hat, t, tol=2**-14).item() - 2**-14 - 1e-7
    # the pool's norms bound the exact norms (ν, κ), rounded up
    for (b, pg, h), r in zip(pages, range(len(pages))):
        k, v = exact[b]
        lo, hi = pg * T, min((pg + 1) * T, k.shape[0])
        assert int(rep.slot[int(bt[b, pg]), h]) == r
        assert torch.all(rep.k_norm[r, : hi - lo].cpu().double() >= k[lo:hi, h].double().norm(dim=-1))
        assert torch.all(rep.v_norm[r, : hi - lo].cpu().double() >= v[lo:hi, h].double().norm(dim=-1))


def test_repaired_pages_in_the_one_warp_tile(monkeypatch):
    """The same, int8, in the one-warp metered tile (``tile_config`` on grids of many programs per SM, run P):
    a one-"SM" device makes the test's grid a many-program one (on the GPU; the interpreter's default path keeps
    128-token tiles)."""
    from kernels import plan as kp

    monkeypatch.setattr(kp, "sm_count", lambda dev: 1)
    assert kp.tile_config(True, "int8", 12.0).warps == 1
    test_repaired_pages_are_served_exact_and_metered_soundly("int8")


def test_fully_repaired_cache_meters_only_the_fp_terms():
    lens = [40]
    cache, bt, exact = build("int8", lens, 1, seed=3)
    rep = overlay_for(cache, bt, exact, [(0, pg, 0) for pg in range(3)])
    q = torch.randn(1, 2, D, generator=torch.Generator().manual_seed(1)).bfloat16().float().to(DEV)
    plain = decode(cache, q, bt.to(DEV), torch.tensor(lens).to(DEV))
    out = decode(cache, q, bt.to(DEV), torch.tensor(lens).to(DEV), repair=rep)
    assert float(out.meter.eps_max.max()) == 0.0
    assert float(out.meter.tv_upper_a.max()) < 1e-3 < float(plain.meter.tv_upper_a.max())
    k, v = exact[0]
    p = torch.softmax((k[:, 0].double() @ q[0].cpu().double().T) / math.sqrt(D), 0)  # [n, 2]
    for hq in range(2):
        assert_served(out.o[0, hq], p[:, hq] @ v[:, 0].double(), v[:, 0])


def test_overlay_write_routes_tokens_of_repaired_pages():
    """A token written later into a repaired page (the tail) lands in the pool; the others in the
    scratch row; the decode then serves the whole page exact."""
    lens = [20]
    cache, bt, exact = build("int8", lens, 2, seed=4)
    k, v = exact[0]
    rep = overlay_for(cache, bt, exact, [(0, 1, 1)])  # tokens 16..19 of kv head 1
    g = torch.Generator().manual_seed(9)
    k2 = torch.randn(3, 2, D, generator=g).bfloat16()
    v2 = torch.randn(3, 2, D, generator=g).bfloat16()
    pos = torch.arange(20, 23)
    write_kv(cache, k2.to(DEV), v2.to(DEV), bt.to(DEV), torch.zeros(3, dtype=torch.long).to(DEV), pos.to(DEV))
    rep.write(bt[0, pos // T].to(DEV), (pos % T).to(DEV), k2.to(DEV), v2.to(DEV))
    r = int(rep.slot[int(bt[0, 1]), 1])
    assert torch.equal(rep.k[r, 4:7].cpu(), k2[:, 1]) and torch.equal(rep.v[r, 4:7].cpu(), v2[:, 1])
    assert torch.all(rep.k_norm[r, 4:7].cpu().double() >= k2[:, 1].double().norm(dim=-1))
    assert torch.equal(rep.k[r, :4].cpu(), k[16:20, 1]) and torch.all(rep.k[r, 7:].cpu() == 0)
    q = torch.randn(1, 2, D, generator=g).bfloat16().float()
    out = decode(cache, q.to(DEV), bt.to(DEV), torch.tensor([23]).to(DEV), repair=rep)
    kx = torch.cat([k, k2])[:, 1].double()
    vx = torch.cat([v, v2])[:, 1].double()
    kh, vh = dequant(cache, bt, 0, 23, 1)
    kh[16:], vh[16:] = kx[16:], vx[16:]
    p = torch.softmax((kh @ q[0, 1].double()) / math.sqrt(D), 0)
    assert_served(out.o[0, 1], p @ vh, vh)


def test_overlay_regroup_and_reorder():
    rep = RepairOverlay.allocate(4, 2, T, D, torch.float32, device=DEV, capacity=1)
    x = torch.randn(T, D)
    rep.page_in(1, 0, x, -x)  # sequence 0, page 1
    rep.page_in(2, 1, 2 * x, x)  # sequence 1, page 0
    assert rep.count == 2 and rep.capacity >= 2
    grown = rep.regrouped(2, 2, 4)
    assert grown.slot.shape == (8, 2) and int(grown.slot[1, 0]) == 0 and int(grown.slot[4, 1]) == 1
    beams = grown.reordered(2, 4, torch.tensor([1, 1]))  # both beams continue sequence 1
    assert beams.count == 2 and int(beams.slot[0, 1]) != int(beams.slot[4, 1])  # copies, not a shared slot
    assert torch.equal(beams.k[int(beams.slot[0, 1])].cpu(), 2 * x) and torch.equal(beams.k[int(beams.slot[4, 1])].cpu(), 2 * x)
    assert int((beams.slot >= 0).sum()) == 2


def test_bad_overlays_raise():
    cache, bt, exact = build("int8", [20], 2, seed=5)
    q = torch.randn(1, 2, D).bfloat16().float().to(DEV)
    args = (cache, q, bt.to(DEV), torch.tensor([20]).to(DEV))
    good = overlay_for(cache, bt, exact, [(0, 0, 0)])
    decode(*args, repair=good)
    NB = cache.k_codes.shape[0]
    bad = [
        dataclasses.replace(good, slot=good.slot.long()),  # int64 slots
        dataclasses.replace(good, slot=good.slot[:-1]),  # too few blocks
        dataclasses.replace(good, slot=torch.full((NB, 3), -1, dtype=torch.int32, device=DEV)),  # kv heads
        dataclasses.replace(good, k=good.k[:, :, :32].contiguous()),  # head dim
        dataclasses.replace(good, k=good.k.to(torch.float64), v=good.v.to(torch.float64)),  # dtype
        dataclasses.replace(good, v=good.v.half()),  # k / v dtypes differ
        dataclasses.replace(good, k_norm=good.k_norm.half()),  # norms not float32
        dataclasses.replace(good, v_norm=good.v_norm[:, :4].contiguous()),  # norms' shape
        dataclasses.replace(good, count=good.capacity + 1),
    ]
    for ov in bad:
        with pytest.raises(ValueError, match="repair"):
            decode(*args, repair=ov)
    with pytest.raises(ValueError, match="repair"):
        decode(*args, repair=good.slot)
    with pytest.raises(ValueError, match="RepairOverlay"):
        RepairOverlay.allocate(NB, 2, T, D, torch.float64)
    with pytest.raises(ValueError, match="page_in"):
        good.page_in(3, 1, torch.zeros(T + 1, D), torch.zeros(T + 1, D))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_served_kv_matches_the_kernel_values(scheme):
    from witcert.cache import served_kv

    lens = [40, 20]
    cache, bt, exact = build(scheme, lens, 2, seed=6)
    rep = overlay_for(cache, bt, exact, [(0, 1, 1), (1, 0, 0)])
    kh, vh = served_kv(cache, bt, 40, rep)
    for b, n in enumerate(lens):
        for h in range(2):
            rk, rv = dequant(cache, bt, b, n, h)
            for bb, pg, hh in [(0, 1, 1), (1, 0, 0)]:
                if (bb, hh) == (b, h):
                    sl = slice(pg * T, min((pg + 1) * T, n))
                    rk[sl], rv[sl] = exact[b][0][sl, h].double(), exact[b][1][sl, h].double()
            assert torch.equal(kh[b, h, :n].cpu(), rk) and torch.equal(vh[b, h, :n].cpu(), rv)
    kh1, _ = served_kv(cache, bt, 20, rep, rows=torch.tensor([1]))
    assert torch.equal(kh1[0], kh[1, :, :20])
