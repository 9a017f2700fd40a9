"""ν and κ as one float32 running max per page (``PagedKV.block_norms``, the WitCertCache default): the write keeps
each page's maxima, the decode's bound holds and differs from the per-token layout's only by the float16 round-up,
non-finite norms stay flagged, a reused or cropped page does not keep another request's maxima, and the memory
accounting counts 3.5 B a token less."""

import dataclasses
import os

import pytest
import torch

if os.environ.get("WITCERT_DEVICE", "cpu") == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1"

from kernels.decode import decode  # noqa: E402
from kernels.memory_accounting import bytes_per_token  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.write import write_kv  # noqa: E402
from tests.helpers.conformance import DEV, check_case  # noqa: E402

H, D, T = 2, 64, 16


def _cache(block_norms, scheme="int8", sketch_bits=2, nb=6):
    return PagedKV.allocate(nb, H, D, scheme=scheme, num_groups=1, sketch_bits=sketch_bits, block_norms=block_norms,
                            model_dtype=torch.bfloat16, device=DEV)


def _kv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, H, D, generator=g)
    v = torch.randn(n, H, D, generator=g)
    v[5] *= 30  # one large value: its page's ν is far above the others'
    k[40] *= 1e-6  # a tiny key in the page of larger ones
    return k.bfloat16(), v.bfloat16()


def _write(c, k, v, bt, lo, hi):
    n = hi - lo
    write_kv(c, k[lo:hi].to(DEV), v[lo:hi].to(DEV), bt.to(DEV), torch.zeros(n, dtype=torch.long, device=DEV),
             torch.arange(lo, hi, device=DEV))


BT = torch.tensor([[3, 1, 0, 5, 2]], dtype=torch.int32)


def _written(block_norms, scheme="int8", sketch_bits=2, n=70):
    c = _cache(block_norms, scheme, sketch_bits)
    k, v = _kv(n)
    cuts = (0, 32, n) if scheme == "kivi2" else (0, 33, 34, n)  # a prefill, one token, the rest
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        _write(c, k, v, BT, lo, hi)
    return c, k, v


def test_layout_and_page_maxima_against_the_per_token_layout():
    c0, k, v = _written(False)
    c1, _, _ = _written(True)
    assert c1.norms_per_token is False and c0.norms_per_token is True
    assert c1.v_norm.shape == (6, H, 1) and c1.v_norm.dtype == torch.float32 and c0.v_norm.dtype == torch.float16
    n = k.shape[0]
    for p in range((n + T - 1) // T):
        blk = int(BT[0, p])
        tok = slice(p * T, min(n, (p + 1) * T))
        kh, vh = c0.k_codes[blk, :, : tok.stop - tok.start].double(), c0.v_codes[blk, :, : tok.stop - tok.start].double()
        ks, vs = (s[blk, :, : tok.stop - tok.start].double()[..., None] for s in (c0.k_scale, c0.v_scale))
        kmax = (kh * ks).norm(dim=-1).amax(dim=-1)  # [H]: the page's largest served-key norm
        vmax = (vh * vs).norm(dim=-1).amax(dim=-1)
        # a bound on every token of the page ...
        assert torch.all(c1.k_norm[blk, :, 0].double() >= kmax) and torch.all(c1.v_norm[blk, :, 0].double() >= vmax)
        # ... and not above the per-token layout's largest (float16, rounded up) entry of the page
        assert torch.all(c1.k_norm[blk, :, 0] <= c0.k_norm[blk].float().amax(dim=-1))
        assert torch.all(c1.v_norm[blk, :, 0] <= c0.v_norm[blk].float().amax(dim=-1))
        # and within the write's relative slack of the exact maximum (pins that the max is kept, not a sum)
        assert torch.all(c1.v_norm[blk, :, 0].double() <= vmax * (1 + 2 ** -10) + 1e-6)
    for blk in (4,):  # a page no sequence owns stays at 0
        assert torch.all(c1.v_norm[blk] == 0) and torch.all(c1.k_norm[blk] == 0)


@pytest.mark.parametrize("scheme,bits", [("int8", 2), ("int8", 0), ("fp8_e4m3", 2), ("kivi2", 0)])
def test_decode_bound_same_as_per_token_up_to_the_rounding(scheme, bits):
    """Same served output; every bound of the record within the float16 round-up of the per-token layout's, and
    not above it (the page max in float32 is below the tokens' float16 entries rounded up)."""
    c0, k, v = _written(False, scheme, bits)
    c1, _, _ = _written(True, scheme, bits)
    n = k.shape[0]
    q = torch.randn(1, 2 * H, D, generator=torch.Generator().manual_seed(1)).bfloat16().float().to(DEV)
    sl = torch.tensor([n], dtype=torch.int32, device=DEV)
    o0 = decode(c0, q, BT.to(DEV), sl, num_splits=2)
    o1 = decode(c1, q, BT.to(DEV), sl, num_splits=2)
    assert torch.equal(o0.o, o1.o)
    for f in ("tv_upper_a", "out_err_upper", "xi"):
        a, b = getattr(o0.meter, f).double().cpu(), getattr(o1.meter, f).double().cpu()
        assert torch.all(b <= a * (1 + 1e-9)), f
        assert torch.all(b >= a * (1 - 2 ** -9)), f  # the ν / κ terms move by at most float16's round-up


@pytest.mark.parametrize("scheme,G,levels", [("int8", 4, "token"), ("fp8_e5m2", 1, "page"), ("int8_dither", 2, "token"),
                                             ("int4_group", 1, "token"), ("kivi2", 1, "token")])
def test_conformance_with_block_norms(scheme, G, levels):
    """The conformance suite's fp64 checks (``check_case``: soundness against the exact TV and output error, Ξ against
    max κ) on caches with page maxima."""
    check_case(scheme, [37, 70], 2, 2, 64, G, True, 2, False, 11, levels=levels, block_norms=True)


def test_non_finite_value_in_a_page_is_flagged():
    """A NaN value row: the page's ν is +inf (a NaN is stored as +inf by the atomic max), and the decode's record
    flags the sequence instead of metering it."""
    c, k, v = _written(True)
    assert torch.all(torch.isfinite(c.v_norm))
    n = k.shape[0]
    v2 = v.clone()
    v2[n - 1, 0] = float("nan")
    _write(c, k, v2, BT, n - 1, n)  # rewrite the last token with a NaN value row in kv head 0
    blk = int(BT[0, (n - 1) // T])
    assert c.v_norm[blk, 0, 0].item() == float("inf")
    q = torch.randn(1, 2 * H, D, generator=torch.Generator().manual_seed(2)).bfloat16().float().to(DEV)
    out = decode(c, q, BT.to(DEV), torch.tensor([n], dtype=torch.int32, device=DEV))
    assert bool(out.meter.flag[0, :2].all())  # the query heads of kv head 0


def test_bad_norm_layout_is_refused():
    """A cache whose ν / κ do not have the layout its flags name cannot be built (``PagedKV.__post_init__``: every
    construction, ``dataclasses.replace`` included, so no write or decode ever sees one)."""
    c, k, v = _written(True)
    for bad in (dict(v_norm=c.v_norm.half()),  # float16 page maxima: no atomic max
                dict(k_norm=torch.zeros(6, H, T, device=DEV)),  # per-token shape, block flag
                dict(block_norms=False)):  # per-token flag on page maxima
        with pytest.raises(ValueError, match="norm"):
            dataclasses.replace(c, **bad)
    with pytest.raises(ValueError, match="block_norms"):
        PagedKV.allocate(2, H, D, block_norms=1)


def test_memory_accounting_counts_page_maxima():
    per_tok = bytes_per_token("int8", 128, 1, sketch_bits=2, window=(4, 64), context=4096)
    page = bytes_per_token("int8", 128, 1, sketch_bits=2, window=(4, 64), context=4096, block_norms=True)
    assert per_tok["witnesses"] == 8 and page["witnesses"] == 4 + 8 / 16  # W, φ float16 + ν, κ float32 per page
    assert page["total"] == per_tok["total"] - 3.5


def test_non_contiguous_or_aliased_norms_are_refused():
    """The kernels address a token's ν / κ as blk·s_nb + h·s_nh + off: a per-token tensor whose token axis is not
    unit-stride (heads sharing entries: a later head's store overwrote an earlier's ν, E⁺ 5.8 against a real output
    error of 17, review 2026-12-07) or one tensor for both is refused."""
    c = PagedKV.allocate(6, H, D, scheme="int8", num_groups=1, device=DEV)
    strided = torch.zeros(6, T, H, dtype=torch.float16, device=DEV).transpose(1, 2)  # [6, H, T], token stride H
    for bad in (dict(v_norm=strided, k_norm=strided.clone().transpose(1, 2).contiguous().transpose(1, 2)),
                dict(v_norm=c.k_norm)):
        with pytest.raises(ValueError, match="norm"):
            dataclasses.replace(c, **bad)


def _served_norm_ratio(cache) -> float:
    """min over live, unheld tokens of (page max / served norm) over every layer, kv head and sequence (≥ 1: sound)."""
    from witcert.cache_kernel import served_kv

    worst = float("inf")
    for L in cache.layers:
        p, n = L.paged, L.get_seq_length()
        kh, vh = served_kv(p, L.block_table, n)  # [B, H, n, D] float64, from the stored codes
        blk = L.block_table[:, torch.arange(n) // p.block_size].long()
        for b in range(kh.shape[0]):
            for h in range(kh.shape[1]):
                live = (L.rep.slot[blk[b], h] < 0) if L.rep is not None else torch.ones(n, dtype=torch.bool)
                if live.any():
                    for t, x in ((p.k_norm, kh), (p.v_norm, vh)):
                        r = t[blk[b], h, 0].double().cpu() / x[b, h].norm(dim=-1).cpu().clamp_min(1e-300)
                        worst = min(worst, r[live.cpu()].min().item())
    return worst


@pytest.mark.skipif(DEV != "cpu", reason="the HF cache's kernel path in the interpreter")
@pytest.mark.parametrize("scheme", ["int8", "kivi2"])
def test_cache_page_maxima_through_growth_crop_and_reuse(scheme):
    """WitCertCache (tiny Llama, kernel path): after prefill, decode with growth, and a crop, every live token's
    served ‖k̂‖, ‖v̂‖ is below its page's running max; a crop starts the pages from the new last one on again (a page
    max of +inf left by a removed token is gone), and a pooled storage reused by a later request starts at 0."""
    from tests.helpers.kernel_gate import tiny_llama
    from witcert.cache import WitCertCache
    from witcert.graph_pool import POOL

    torch.manual_seed(0)
    model = tiny_llama()
    ids = torch.randint(1, 128, (2, 21))

    def gen(cache, x, new):
        with torch.no_grad():
            return model.generate(x, attention_mask=torch.ones_like(x), past_key_values=cache, max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, pad_token_id=0)

    c = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=3, max_tokens=16, window=(2, 5))
    out = gen(c, ids, 14)  # 35 tokens: growth past 16, two full pages and a partial one
    assert c.layers[0].paged.block_norms and _served_norm_ratio(c) >= 1.0
    for L in c.layers:  # as if a removed token's norm had overflowed: every page's max at +inf
        L.paged.v_norm.fill_(float("inf"))
        L.paged.k_norm.fill_(float("inf"))
    c.crop(-12)  # 23 tokens: page 1 is the new (partial) last page
    T_ = c.layers[0].paged.block_size
    for L in c.layers:
        Bsz, per_seq = L.block_table.shape
        pn = L.paged.v_norm.view(Bsz, per_seq, -1)
        assert torch.all(torch.isfinite(pn[:, 23 // T_:])) and torch.all(torch.isinf(pn[:, : 23 // T_]))
    assert _served_norm_ratio(c) >= 1.0
    gen(c, out[:, :-12], 6)
    assert _served_norm_ratio(c) >= 1.0
    if scheme == "int8":  # a pooled storage (cuda_graph=True keeps it) taken by a later request starts at 0
        POOL.clear()
        a = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=3, max_tokens=64, cuda_graph=True)
        gen(a, ids, 2)
        for L in a.layers:
            L.paged.v_norm.fill_(1e30)
        ptr = a.layers[0].paged.v_norm.data_ptr()
        del a  # its storage goes back to the pool
        b = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=3, max_tokens=64, cuda_graph=True)
        gen(b, ids, 2)
        assert b.layers[0].paged.v_norm.data_ptr() == ptr  # adopted
        assert float(b.layers[0].paged.v_norm.max()) < 1e30 and _served_norm_ratio(b) >= 1.0
