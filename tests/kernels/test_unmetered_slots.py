"""``decode(..., unmetered=UnmeteredSlots)`` (issue 36: the SGLang path's unmetered slots counted in the kernels,
not by torch ops after them) and the merge's row without tokens: a row reading a marked slot, a slot outside the
pool, or any row under the ``every`` flag gets the non-finite record (TV⁺ 1, output bound +inf, flagged) while the
other rows keep theirs bit for bit; an empty CSR row gets output 0, TV⁺ 0, no flag. In the interpreter and, in the
device run, on the GPU (fused Triton merge either way)."""

import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels.decode import decode  # noqa: E402
from kernels.unmetered import UnmeteredSlots  # noqa: E402
from tests.helpers.conformance import csr_int8_cache, to_cpu  # noqa: E402

D, HKV, GQ = 64, 2, 2
LENS = [37, 0, 5, 70]  # row 1 has no token


def _cache():
    return csr_int8_cache(LENS, HKV, D, GQ, 11, DEV)


def _run(cache, q, slots, indptr, unmetered=None):
    return to_cpu(decode(cache, q, slots.to(DEV), None, kv_indptr=indptr.to(DEV), num_splits=2, validate=False,
                         sm_scale=1 / math.sqrt(D), unmetered=unmetered))


def _saturated(rec, b):
    return bool((rec.tv_upper_a[b] == 1).all() and torch.isinf(rec.out_err_upper[b]).all() and rec.flag[b].all())


def test_a_marked_slot_saturates_its_row_and_no_other():
    cache, pool, slots, indptr, q = _cache()
    base = _run(cache, q, slots, indptr)
    assert not base.meter.flag.any() and (base.meter.tv_upper_a[[0, 2, 3]] < 1).all()
    bits = torch.zeros(pool, dtype=torch.bool)
    bits[slots[indptr[2] + 3]] = True  # one token of row 2
    bits[slots[-1]] = False
    got = _run(cache, q, slots, indptr, UnmeteredSlots.of(bits.to(DEV)))
    assert _saturated(got.meter, 2)
    for b in (0, 3):
        for f in ("tv_upper_a", "out_err_upper", "xi", "eps_max"):
            assert torch.equal(getattr(got.meter, f)[b], getattr(base.meter, f)[b]), (b, f)
        assert not got.meter.flag[b].any()
    assert torch.equal(got.o, base.o)  # the token is still served: only the record says it is not vouched for
    # a mark on a slot no row reads changes nothing
    spare = torch.zeros(pool, dtype=torch.bool)
    spare[[s for s in range(pool) if s not in set(slots.tolist())]] = True
    assert torch.equal(_run(cache, q, slots, indptr, UnmeteredSlots.of(spare.to(DEV))).meter.tv_upper_a,
                       base.meter.tv_upper_a)


@pytest.mark.parametrize("splits", [1, 3])
def test_a_mark_in_any_tile_of_a_split_saturates_its_row(splits):
    """The kernel counts a tile's marks one iteration after their load and the last tile's after the loop (so the loop
    never waits for the gather, bench/SGLANG.md run X): a mark or an outside slot in the first, a middle or the last
    16-token tile of a split, with one or three splits of row 3's 70 tokens, saturates the row, and no other."""
    cache, pool, slots, indptr, q = _cache()
    for pos, outside in ((0, False), (16, True), (31, False), (69, True)):  # (CI's time: four of the row's tiles)
        bits = torch.zeros(pool, dtype=torch.bool)
        s2 = slots.clone()
        at = int(indptr[3]) + pos
        if outside:
            s2[at] = pool + 5
        else:
            bits[slots[at]] = True
        got = to_cpu(decode(cache, q, s2.to(DEV), None, kv_indptr=indptr.to(DEV), num_splits=splits, validate=False,
                            sm_scale=1 / math.sqrt(D), pages_per_tile=16, unmetered=UnmeteredSlots.of(bits.to(DEV))))
        assert _saturated(got.meter, 3) and not got.meter.flag[[0, 1, 2]].any(), (pos, outside)


def test_every_flag_saturates_every_row_with_tokens():
    cache, pool, slots, indptr, q = _cache()
    zero = torch.zeros(pool, dtype=torch.uint8, device=DEV)
    got = _run(cache, q, slots, indptr, UnmeteredSlots.of(zero, torch.ones(1, dtype=torch.bool, device=DEV)))
    assert all(_saturated(got.meter, b) for b in (0, 2, 3))
    assert (got.meter.tv_upper_a[1] == 0).all() and not got.meter.flag[1].any()  # no token: nothing to vouch for
    off = _run(cache, q, slots, indptr, UnmeteredSlots.of(zero))
    assert not off.meter.flag.any()


def test_a_slot_outside_the_pool_reads_the_last_slot_and_saturates_its_row():
    """A slot outside [0, P) (−1, P, 2³¹ − 1: one in each row with tokens) has no witness and its bytes are no
    token's: the row is flagged, and the kernel reads slot P − 1 in its place (an unsigned min: never out of bounds):
    the output is the decode's with slot P − 1 there, bit for bit."""
    cache, pool, slots, indptr, q = _cache()
    drops = {0: (int(indptr[0]) + 10, -1), 2: (int(indptr[2]) + 2, pool), 3: (int(indptr[3]) + 40, 2**31 - 1)}
    s2, s0 = slots.clone(), slots.clone()
    for at, bad in drops.values():
        s2[at], s0[at] = bad, pool - 1
    got = _run(cache, q, s2, indptr, UnmeteredSlots.of(torch.zeros(pool, dtype=torch.bool, device=DEV)))
    assert all(_saturated(got.meter, b) for b in drops) and not got.meter.flag[1].any()
    ref = _run(cache, q, s0, indptr)
    assert torch.isfinite(got.o).all() and torch.equal(got.o, ref.o)


def test_an_int64_slot_past_int32_saturates_its_row():
    """An int64 ``kv_indices`` entry of slot + 2³² wrapped onto slot s in the int32 table and was served metered with
    s's witness (review, 2026-12-05); it is now -1 there, outside the pool, so the row is saturated."""
    cache, pool, slots, indptr, q = _cache()
    s64 = slots.long()
    s64[int(indptr[3]) + 7] += 2**32
    got = _run(cache, q, s64, indptr, UnmeteredSlots.of(torch.zeros(pool, dtype=torch.bool, device=DEV)))
    assert _saturated(got.meter, 3) and not got.meter.flag[[0, 1, 2]].any()


def test_a_row_without_tokens_gives_zero_from_the_merge():
    """SGLang never sends an empty row; the reference's answer (witcert.meter.softmax: p̂ = 0) is output 0, TV⁺ 0 and
    no flag, now written by the merge itself (before: 0/0 = NaN, fixed by five torch ops after it)."""
    cache, pool, slots, indptr, q = _cache()
    out = _run(cache, q, slots, indptr)
    assert (out.o[1] == 0).all() and torch.isfinite(out.o).all()
    assert (out.meter.tv_upper_a[1] == 0).all() and (out.meter.out_err_upper[1] == 0).all()
    assert not out.meter.flag.any() and (out.meter.tv_upper_a[[0, 2, 3]] > 0).all()


def test_misuse_is_refused():
    cache, pool, slots, indptr, q = _cache()
    um = UnmeteredSlots.of(torch.zeros(pool, dtype=torch.bool, device=DEV))
    lens = torch.tensor([37, 1, 5, 70], dtype=torch.int32)
    bt = torch.zeros(4, 70, dtype=torch.int32)
    with pytest.raises(ValueError, match="CSR"):
        decode(cache, q, bt.to(DEV), lens.to(DEV), unmetered=um)
    with pytest.raises(ValueError, match="meter=False"):
        decode(cache, q, slots.to(DEV), None, kv_indptr=indptr.to(DEV), meter=False, validate=False, unmetered=um)
    with pytest.raises(ValueError, match="bool or uint8"):
        UnmeteredSlots.of(torch.zeros(pool, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        UnmeteredSlots.of(torch.zeros(pool, 2, dtype=torch.bool)[:, 0])
    with pytest.raises(ValueError, match="read past the cache"):  # (a pool smaller than the marks: clamp past it)
        decode(cache, q, slots.to(DEV), None, kv_indptr=indptr.to(DEV), validate=False,
               unmetered=UnmeteredSlots.of(torch.zeros(pool + 1, dtype=torch.bool, device=DEV)))
    for bad_slots in (torch.zeros(2, pool, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)):
        # (an empty pool: the kernel's clamp onto slot P − 1 would read slot 2³² − 1)
        with pytest.raises(ValueError, match=r"slots \[P ≥ 1\]"):
            decode(cache, q, slots.to(DEV), None, kv_indptr=indptr.to(DEV), validate=False,
                   unmetered=UnmeteredSlots.of(bad_slots.to(DEV)))
