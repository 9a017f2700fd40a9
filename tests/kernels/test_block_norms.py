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
    c, k, v = _written(True)
    q = torch.zeros(1, 2 * H, D, device=DEV)
    sl = torch.tensor([16], dtype=torch.int32, device=DEV)
    for bad in (dataclasses.replace(c, v_norm=c.v_norm.half()),  # float16 page maxima: no atomic max
                dataclasses.replace(c, k_norm=torch.zeros(6, H, T, device=DEV)),  # per-token shape, block flag
                dataclasses.replace(c, block_norms=False)):  # per-token flag on page maxima
        with pytest.raises(ValueError, match="norm"):
            decode(bad, q, BT.to(DEV), sl)
        with pytest.raises(ValueError, match="norm"):
            _write(bad, k, v, BT, 0, 1)
    with pytest.raises(ValueError, match="block_norms"):
        PagedKV.allocate(2, H, D, block_norms=1)


def test_memory_accounting_counts_page_maxima():
    per_tok = bytes_per_token("int8", 128, 1, sketch_bits=2, window=(4, 64), context=4096)
    page = bytes_per_token("int8", 128, 1, sketch_bits=2, window=(4, 64), context=4096, block_norms=True)
    assert per_tok["witnesses"] == 8 and page["witnesses"] == 4 + 8 / 16  # W, φ float16 + ν, κ float32 per page
    assert page["total"] == per_tok["total"] - 3.5
