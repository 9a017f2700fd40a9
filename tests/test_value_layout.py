"""Channel-major value pages (``kernels.paged.channel_major_values``): the int8 schemes store a page's value
codes channel-major ([NB, Hkv, D, T], the cache's ``v_codes`` its [NB, Hkv, T, D] view) so the decode's PV
operand is one vector load per page and channel. The layout must change no value: the write path stores the
same codes, the decode serves the same output and meter as from token-major pages (to the last bit's rounding), and a cache copied by
``regrouped`` / ``reordered`` keeps it; any other layout is refused."""

import dataclasses
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")

from kernels.decode import decode  # noqa: E402
from kernels.paged import PagedKV, channel_major_values, value_codes_layout  # noqa: E402
from kernels.write import write_kv  # noqa: E402


def filled(scheme, layout, n=(37, 70), T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-x // T) for x in n]
    nb = sum(pages) + 1
    cache = PagedKV.allocate(nb, 2, 64, scheme=scheme, block_size=T, device=DEV, seed=3, layer=1)
    if layout == "token-major":  # the former layout, as a caller's own tensor would be
        cache = dataclasses.replace(cache, v_codes=torch.zeros(cache.k_codes.shape, dtype=cache.k_codes.dtype, device=DEV))
    bt = torch.zeros(len(n), max(pages), dtype=torch.int32)
    perm = torch.randperm(nb, generator=g)[: sum(pages)]
    i = 0
    for b, x in enumerate(n):
        bt[b, : pages[b]] = perm[i : i + pages[b]].int()
        i += pages[b]
        k = torch.randn(x, 2, 64, generator=g).bfloat16()
        v = torch.randn(x, 2, 64, generator=g).bfloat16()
        write_kv(cache, k.to(DEV), v.to(DEV), bt.to(DEV), torch.full((x,), b, device=DEV), torch.arange(x, device=DEV))
    return cache, bt, torch.tensor(n, dtype=torch.int32)


def test_allocate_picks_the_layout_by_scheme():
    for scheme in ("int8", "int8_dither"):
        c = PagedKV.allocate(3, 2, 64, scheme=scheme, block_size=16)
        assert channel_major_values(scheme, 16) and value_codes_layout(c) == "channel-major"
        assert c.v_codes.shape == c.k_codes.shape and c.v_codes.stride() == (2 * 64 * 16, 64 * 16, 1, 16)
        assert value_codes_layout(PagedKV.allocate(3, 2, 64, scheme=scheme, block_size=1)) == "token-major"
    for scheme in ("fp8_e4m3", "int4_group", "kivi2", "none"):  # an fp8 byte may be NaN; packed codes
        assert value_codes_layout(PagedKV.allocate(3, 2, 64, scheme=scheme, block_size=16)) == "token-major"


@pytest.mark.parametrize("scheme", ["int8", "int8_dither"])
def test_channel_major_values_change_no_value(scheme):
    a, bt, sl = filled(scheme, "channel-major")
    b, _, _ = filled(scheme, "token-major")
    assert value_codes_layout(a) == "channel-major" and value_codes_layout(b) == "token-major"
    assert torch.equal(a.v_codes.cpu(), b.v_codes.cpu()) and torch.equal(a.v_scale.cpu(), b.v_scale.cpu())
    q = (torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(5)) * 1.5).bfloat16().float().to(DEV)
    for kw in (dict(), dict(meter=False), dict(num_splits=3, delta_step=1e-3)):
        oa = decode(a, q, bt.to(DEV), sl.to(DEV), **kw)
        ob = decode(b, q, bt.to(DEV), sl.to(DEV), **kw)
        # the same codes in the same order of tokens; the PV tile reaches the dot in another memory order, which
        # numpy's float32 matmul (the interpreter) may round differently in the last bit (bench/RESULTS.md run K)
        torch.testing.assert_close(oa.o, ob.o, rtol=1e-6, atol=1e-7)
        assert torch.equal(oa.lse, ob.lse)  # the logits do not touch the values
        if oa.meter is not None:
            for f in dataclasses.fields(oa.meter):
                x, y = getattr(oa.meter, f.name), getattr(ob.meter, f.name)
                assert (x is None and y is None) or torch.allclose(x.double(), y.double(), rtol=1e-6, atol=1e-12), f.name


def test_copies_keep_the_layout_and_other_layouts_are_refused():
    c = PagedKV.allocate(4, 1, 64, scheme="int8", block_size=16, device=DEV)
    c.v_codes.copy_(torch.randint(-127, 128, c.v_codes.shape, dtype=torch.int8))
    grown = c.regrouped(2, 2, 3)
    assert value_codes_layout(grown) == "channel-major"
    assert torch.equal(grown.v_codes.view(2, 3, 1, 16, 64)[:, :2].cpu(), c.v_codes.view(2, 2, 1, 16, 64).cpu())
    swapped = c.reordered(2, 2, torch.tensor([1, 0]))
    assert value_codes_layout(swapped) == "channel-major"
    assert torch.equal(swapped.v_codes[:2].cpu(), c.v_codes[2:].cpu())
    odd = dataclasses.replace(c, v_codes=torch.zeros(4, 1, 64, 16, dtype=torch.int8, device=DEV).permute(0, 1, 3, 2)[:, :, :, :64])
    bad = dataclasses.replace(c, v_codes=torch.zeros(4, 1, 16, 128, dtype=torch.int8, device=DEV)[..., :64])  # rows of 128
    with pytest.raises(ValueError, match="v_codes"):
        value_codes_layout(bad)
    with pytest.raises(ValueError, match="v_codes"):
        decode(bad, torch.zeros(1, 1, 64).bfloat16().float().to(DEV), torch.zeros(1, 1, dtype=torch.int32).to(DEV),
               torch.ones(1, dtype=torch.int32).to(DEV))
    with pytest.raises(ValueError, match="v_codes"):
        write_kv(bad, torch.zeros(1, 1, 64).to(DEV), torch.zeros(1, 1, 64).to(DEV), torch.zeros(1, 1, dtype=torch.int32).to(DEV),
                 torch.zeros(1, dtype=torch.long).to(DEV), torch.zeros(1, dtype=torch.long).to(DEV))
    assert value_codes_layout(odd) == "channel-major"  # a view with the same strides is the same layout


def test_fully_masked_pages_are_not_read():
    """A left-padded sequence may leave its padding pages' block ids invalid (found by a review: the
    channel-major load, masked only by the page's place in the split, read block 2^24 and crashed the
    interpreter). Pages whose tokens are all masked are skipped; the result is the one with valid ids."""
    cache, bt, sl = filled("int8", "channel-major", n=(64,))
    mask = torch.ones(1, 64, dtype=torch.bool)
    mask[0, :32] = False  # pages 0 and 1 are padding
    q = (torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(2)) * 1.5).bfloat16().float().to(DEV)
    ref = decode(cache, q, bt.to(DEV), sl.to(DEV), token_mask=mask.to(DEV), num_splits=1)
    bad = bt.clone()
    bad[0, :2] = 1 << 24
    out = decode(cache, q, bad.to(DEV), sl.to(DEV), token_mask=mask.to(DEV), num_splits=1)
    assert torch.equal(out.o, ref.o) and torch.equal(out.meter.tv_upper_a, ref.meter.tv_upper_a)
