"""Kernel conformance (SPEC §7, §8) under TRITON_INTERPRET=1 against the fp64 reference.

Random paged caches (GQA 1…8, ragged lengths incl. n = 1, shuffled block tables, split counts
1…8, per-token or per-block witnesses, every kernel scheme). Checks:
* write path: x̂ and scales bit-identical to ``witcert.schemes``; witnesses ≥ the fp64 norms;
* decode: o and lse match the fp64 attention over the dequantized cache;
* meter: TV⁺ ≥ the exact supremum (brute force, n ≤ 12) and ≥ the fractional supremum
  (fp64 tilt − tol) for every n; TV⁺ ≤ the fp64 level-rounded reference + the epilogue's
  grid slack; realised TV and output error (vs the exact backing store) ≤ the bounds;
* split counts give the same result; the meter-off variant gives the same o; NaN saturates.
"""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
# in the device run (WITCERT_DEVICE=cuda, docs/testing.md); the fused Triton merge / epilogue (tests/kernels/conftest.py)
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels.decode import decode  # noqa: E402
from kernels.paged import SCHEME_IDS, PagedKV  # noqa: E402
from tests.helpers.conformance import build, check_case, dequant, on_cpu, stored_witnesses, to_cpu  # noqa: E402

KSCHEMES = sorted(SCHEME_IDS)


@settings(max_examples=int(os.environ.get("WITCERT_CONF_EXAMPLES", "20")))
@given(
    scheme=st.sampled_from(KSCHEMES),
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    Hkv=st.sampled_from([1, 2]),
    GQ=st.sampled_from([1, 2, 4, 8]),
    D=st.sampled_from([64, 128]),
    G=st.sampled_from([1, 2, 4]),
    per_token=st.booleans(),
    splits=st.integers(1, 8),
    outliers=st.booleans(),
    seed=st.integers(0, 10_000),
    levels=st.sampled_from(["token", "page"]),
)
@pytest.mark.skipif(DEV != "cpu", reason="on the GPU each example compiles new variants: the fixed cases run there")
def test_decode_conformance(scheme, lens, Hkv, GQ, D, G, per_token, splits, outliers, seed, levels):
    check_case(scheme, lens, Hkv, GQ, D, G, per_token, splits, outliers, seed, levels)


FIXED = [  # scheme, lens, Hkv, GQ, D, G, per_token, splits, outliers, seed
    ("int8", [1, 37, 300], 2, 4, 128, 1, True, 3, True, 1),
    ("int8_dither", [70, 5, 513], 2, 4, 128, 1, True, 8, False, 2),
    ("int8_dither", [9, 200], 1, 8, 64, 4, False, 2, True, 3),
    ("fp8_e4m3", [33, 128], 2, 2, 128, 1, True, 1, True, 4),
    ("fp8_e4m3_scaled", [100], 1, 1, 256, 2, True, 5, False, 5),
    ("fp8_e5m2", [17, 64], 2, 8, 64, 1, False, 4, False, 6),
    ("none", [50, 3], 2, 4, 128, 1, True, 2, False, 7),
    ("int8", [1000], 1, 4, 128, 1, True, 7, True, 8),
    ("int4_group", [77, 1], 2, 4, 128, 2, True, 3, True, 9),
    ("kivi2", [77, 1, 32], 2, 4, 128, 2, True, 3, True, 10),  # ragged, one token, exactly two pages
    ("kivi2", [150], 1, 8, 64, 1, False, 2, False, 11),  # per-block witnesses (running max over rewrites)
]


@pytest.mark.parametrize("case", FIXED, ids=[f"{c[0]}-gq{c[3]}-d{c[4]}-s{c[7]}" for c in FIXED])
def test_decode_conformance_fixed(case):
    check_case(*case)


PAGE_FIXED = [FIXED[i] for i in (0, 1, 2, 3, 8)]


@pytest.mark.parametrize("case", PAGE_FIXED, ids=[f"{c[0]}-gq{c[3]}-g{c[5]}-s{c[7]}" for c in PAGE_FIXED])
def test_decode_conformance_page_levels(case):
    """levels="page": each token binned at its page's largest radius (sound, looser, cheaper)."""
    check_case(*case, levels="page")


@pytest.mark.parametrize("case", [FIXED[i] for i in (0, 7, 3, 5)], ids=["int8-ragged", "int8-1000", "fp8_e4m3", "fp8_e5m2"])
def test_decode_conformance_one_warp_tile(case):
    """The metered 8-bit kernels in ``tile_config``'s one-warp programs (32-token tiles under the metered register
    cap: a grid of many programs per SM picks them for the ``ONE_WARP_METERED_SCHEMES``, run P), which the fixed
    cases' small grids do not reach; the fp8 codes too (the tile is the same loop over their conversion)."""
    from kernels.plan import METERED_REGISTER_CAP, Tile
    check_case(*case, tile_kw=dict(pages_per_tile=2, num_warps=1, tile=Tile(32, 1, 1, METERED_REGISTER_CAP)))


def test_decode_conformance_one_warp_tile_many_splits():
    """The one-warp tile at the split counts ``choose_splits`` gives a small metered grid (up to
    SMALL_GRID_MAX_SPLITS, run R): 200 splits of a 63-page sequence, most of them empty, merged from 256 partial
    slots per row (the merge's next power of two)."""
    from kernels.plan import METERED_REGISTER_CAP, Tile
    case = list(FIXED[7])
    case[7] = 200
    check_case(*case, tile_kw=dict(pages_per_tile=2, num_warps=1, tile=Tile(32, 1, 1, METERED_REGISTER_CAP)))


@pytest.mark.parametrize("case", [FIXED[i] for i in (0, 1, 8)], ids=["int8", "int8_dither", "int4_group"])
def test_decode_conformance_prefetched_block_table(case):
    """prefetch_bt=True (the next tile's block-table entries loaded one iteration ahead)."""
    check_case(*case, prefetch_bt=True)


def test_nan_saturates_and_flags():
    cache, bt, _ = build("int8", [20, 7], 1, 64, seed=3)
    q = torch.randn(2, 2, 64).bfloat16().float()  # exact in bf16: the GPU path takes it
    q[1, 0, 5] = float("nan")
    out = to_cpu(decode(cache, q.to(DEV), bt.to(DEV), torch.tensor([20, 7]).to(DEV)))
    assert out.meter.flag[1, 0] and out.meter.tv_upper_a[1, 0] == 1.0
    assert math.isinf(out.meter.out_err_upper[1, 0].item())
    assert not out.meter.flag[0].any() and out.meter.tv_upper_a[0].max() < 1.0


def test_nan_in_cache_saturates():
    cache, bt, _ = build("fp8_e4m3", [10], 1, 64, seed=4)
    cache.k_wit[bt[0, 0].long(), 0, 3, 0] = float("nan")
    out = to_cpu(decode(cache, torch.randn(1, 1, 64).bfloat16().float().to(DEV), bt.to(DEV), torch.tensor([10]).to(DEV)))
    assert out.meter.flag.all() and out.meter.tv_upper_a.item() == 1.0


@pytest.mark.parametrize("scheme", ["int8", "fp8_e4m3_scaled"])
@pytest.mark.parametrize("val", [float("inf"), float("-inf")])  # (NaN propagates to the output: flagged before)
def test_nonfinite_key_scale_saturates_every_head(scheme, val):
    """A stored key scale of ±inf / NaN beside a finite witness (corruption): the logit s·⟨c, q⟩ is −inf for a head
    whose dot is negative, which drops the token from that head's softmax; without the scale's count that head's
    record was finite and unflagged (sketch off: the group radius reads the witness only)."""
    cache, bt, _ = build(scheme, [20, 7], 1, 64, seed=3)
    cache.k_scale[bt[0, 0].long(), 0, 3] = val
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 64, generator=g).bfloat16().float()  # GQ 8: some head's dot with the token is negative
    out = to_cpu(decode(cache, q.to(DEV), bt.to(DEV), torch.tensor([20, 7]).to(DEV)))
    assert out.meter.flag[0].all() and (out.meter.tv_upper_a[0] == 1.0).all()
    assert not out.meter.flag[1].any()


@pytest.mark.parametrize("scheme", ["int4_group", "kivi2", "fp8_e5m2"])
def test_nonfinite_stored_key_saturates_every_head(scheme):
    """A ±inf key zero point (int4_group, kivi2) or key code (fp8_e5m2, which encodes inf) beside a finite witness:
    k̂ is inf on that channel, so a head whose q is negative there gets logit −inf and drops the token silently; the
    tile counts the tokens with a NaN or −inf logit (``decode_tile._nonfinite_logits``; an adversarial review found
    kivi2's TV⁺ 0.068 against a realised 0.81, 2026-12-05). fp8_e5m2: the tile reads its codes through fp16 (Triton's
    direct e5m2 → bf16 reads an inf code as 65536 on the GPU, the interpreter everywhere: run Y1 failed this case)."""
    cache, bt, _ = build(scheme, [20, 7], 1, 64, seed=3)
    blk = bt[0, 0].long()
    if scheme == "fp8_e5m2":
        cache.k_codes[blk, 0, :4, 5] = torch.tensor(float("inf")).to(cache.k_codes.dtype)
    elif scheme == "kivi2":
        cache.k_zero[blk, 0, 5] = float("inf")  # the page's channel 5
    else:
        cache.k_zero[blk, 0, 5, 0] = float("inf")  # token 5's first 32-channel group
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 64, generator=g)
    q[0, 0, :32] = -q[0, 0, :32].abs() - 0.01  # head 0 negative on the whole group: its logit is −inf, not NaN
    q = q.bfloat16().float()
    out = to_cpu(decode(cache, q.to(DEV), bt.to(DEV), torch.tensor([20, 7]).to(DEV)))
    assert out.meter.flag[0].all() and (out.meter.tv_upper_a[0] == 1.0).all()
    assert not out.meter.flag[1].any()


def test_nonfinite_e5m2_value_code_is_never_served_finite():
    """An inf fp8_e5m2 value code (corruption after the write): read through fp16 it stays inf, so the served output
    is non-finite and the row flagged (TV⁺ 1, E⁺ inf). Read as Triton's direct e5m2 → bf16 does (65536 on the GPU and
    in the interpreter) it was a finite output 65536·p̂ off with a finite E⁺ and no flag."""
    cache, bt, _ = build("fp8_e5m2", [20, 7], 1, 64, seed=3)
    cache.v_codes[bt[0, 0].long(), 0, :4, 5] = torch.tensor(float("inf")).to(cache.v_codes.dtype)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(5)).bfloat16().float()
    out = to_cpu(decode(cache, q.to(DEV), bt.to(DEV), torch.tensor([20, 7]).to(DEV)))
    assert out.meter.flag[0].all() and (out.meter.tv_upper_a[0] == 1.0).all()
    assert torch.isinf(out.meter.out_err_upper[0]).all() and not torch.isfinite(out.o[0]).all(dim=-1).any()
    assert not out.meter.flag[1].any() and torch.isfinite(out.o[1]).all()


@pytest.mark.parametrize("scheme", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled"])
def test_fp8_write_saturates_like_the_reference(scheme):
    """Keys and values past the fp8 range (and ±inf, NaN): the write path stores the reference's codes
    (``witcert.schemes``: saturated at ±448 / ±57344, NaN kept, ``contract.schemes`` ``code_max``), on the GPU from
    the kernel's own cast, in the interpreter from the torch codes it is given; the witness covers the clipped residual.
    torch's own cast differs by version and format past the range (2.13 saturates e4m3fn, 2.11 gives NaN, e5m2 ±inf):
    the device's torch 2.11 failed ``test_raw_fp8_overflow_is_metered_not_hidden`` (run A4, 2026-12-06)."""
    from kernels.write import write_kv
    from witcert.schemes import QuantContext, quantize

    cache = PagedKV.allocate(2, 1, 64, scheme=scheme, device=DEV)
    k = torch.randn(16, 1, 64, generator=torch.Generator().manual_seed(1))
    # a NaN too in the raw casts (the scaled scheme's per-token scale: torch's amax keeps a NaN, the GPU's max drops it,
    # so its other codes differ there; flagged either way)
    nan = [float("nan")] if scheme != "fp8_e4m3_scaled" else [3.0]
    k[:, 0, 0] = torch.tensor([1e9, -1e9, 7e4, -7e4, 600.0, -600.0, 449.0, 60000.0, float("inf"), float("-inf")]
                              + nan + [3.0] * 5)
    v = k.flip(0)
    k, v = k.bfloat16(), v.bfloat16()
    bt = torch.tensor([[1]], dtype=torch.int32)
    write_kv(cache, k.to(DEV), v.to(DEV), bt.to(DEV), torch.zeros(16, dtype=torch.long, device=DEV),
             torch.arange(16, device=DEV))
    for x, codes, name in ((k, cache.k_codes, "key"), (v, cache.v_codes, "value")):
        xh, meta = quantize(scheme, x.float().permute(1, 0, 2), QuantContext(role=name, kv_head=torch.arange(1)))
        got = codes[1, 0].cpu().float()
        want = meta["codes"][0].float()
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # (the scaled scheme: s = inf → NaN)
        assert got.nan_to_num(0.0).abs().max() <= float(torch.finfo(codes.dtype).max)  # never ±inf (e5m2 could)
    wit = cache.k_wit[1, 0, :, 0].cpu().double()
    if scheme != "fp8_e4m3_scaled":  # the raw casts: codes finite but the NaN's, the clipped residual |x − x̂| in the witness
        kc = cache.k_codes[1, 0].cpu().float()
        assert torch.isfinite(kc).sum() == kc.numel() - 1 and torch.isnan(kc[10, 0])  # a NaN stays a NaN code
        clip = (k[:8, 0, 0].double() - cache.k_codes[1, 0, :8, 0].cpu().double()).abs()  # channel 0 alone
        assert (clip[:2] > 1e8).all() and (wit[:8] >= clip).all() and not torch.isfinite(wit[8:11]).any()


@pytest.mark.parametrize("scheme,D,outliers", [("fp8_e4m3", 128, True), ("fp8_e4m3", 64, False),
                                               ("fp8_e5m2", 128, True), ("fp8_e4m3_scaled", 256, False)])
def test_fp8_write_witnesses_cover_the_stored_codes(scheme, D, outliers):
    """Every stored witness of an fp8 write against the stored codes, per token, over several write programs and two
    launches: κ ≥ ‖k̂‖, W ≥ ‖k̂ − k‖, ν ≥ ‖v̂‖, φ ≥ ‖v̂ − v‖. With a clip before the GPU's cast (Triton 3.6.0, H100) the
    codes were right and the witnesses were computed from other values: κ 8.6 against ‖k̂‖ 46.7, ν 127 against 11
    (runs A5, B3, 2026-12-06; B3's probe of this test's e5m2 d 128 case found it short while every decode case of
    e5m2 passed)."""
    lens = [33, 128]
    cache, bt, exact = build(scheme, lens, 2, D, G=1, per_token=True, seed=4, outliers=outliers)
    cache = on_cpu(cache)
    for b, n in enumerate(lens):
        j = torch.arange(n)
        blk, off = bt[b, j // cache.block_size].long(), j % cache.block_size
        for h in range(2):
            kh, vh = dequant(cache, bt, b, n, h)
            kx, vx = (t[:, h].double() for t in exact[b])
            W, phi, nu = stored_witnesses(cache, bt, b, n, h)
            kap = cache.k_norm[blk, h, off].double()
            assert torch.all(kap >= kh.norm(dim=-1)) and torch.all(W[:, 0] >= (kh - kx).norm(dim=-1))
            assert torch.all(nu >= vh.norm(dim=-1)) and torch.all(phi >= (vh - vx).norm(dim=-1))
            # and not loose by more than the stored dtype's rounding (fp16 witnesses, rounded up)
            assert torch.all(kap <= kh.norm(dim=-1) * 1.01 + 1e-6) and torch.all(nu <= vh.norm(dim=-1) * 1.01 + 1e-6)


def test_bad_inputs():
    cache, bt, _ = build("int8", [5], 2, 64)
    bt = bt.to(DEV)
    with pytest.raises(ValueError, match="GQA"):
        decode(cache, torch.randn(1, 3, 64, device=DEV), bt, torch.tensor([5], device=DEV))
    with pytest.raises(ValueError, match="head dim"):
        decode(cache, torch.randn(1, 2, 32, device=DEV), bt, torch.tensor([5], device=DEV))
    with pytest.raises(ValueError, match="seq_lens"):
        decode(cache, torch.randn(1, 2, 64, device=DEV), bt, torch.tensor([0], device=DEV))
    with pytest.raises(ValueError, match="seq_lens"):
        decode(cache, torch.randn(1, 2, 64, device=DEV), bt, torch.tensor([17], device=DEV))
    with pytest.raises(ValueError, match="scheme"):
        PagedKV.allocate(2, 1, 64, scheme="int3")
    with pytest.raises(ValueError, match="head_dim"):
        PagedKV.allocate(2, 1, 96)
