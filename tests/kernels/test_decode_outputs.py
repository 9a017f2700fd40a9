"""``decode(..., out=, lse_out=)`` (issue 36: the SGLang call's output copies into the merge): the merge writes the
caller's output buffer in its dtype and the log-sum-exp into column 0 of ``lse_out`` (−inf in its other columns, SGLang's
``attn_lse``), the same values as the default call's o / lse, leaving every other row of the buffers as it was; the
record is the default call's. The fused Triton merge (in the interpreter and, in the device run, on the GPU), the
deferred record (``tilt_batch``: the kernel on any device) and the torch twin's path off the GPU."""

import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

import kernels.decode as Dk  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.plan import hist_columns  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402
from tests.helpers.conformance import csr_int8_cache, to_cpu  # noqa: E402

D, HKV, GQ = 64, 2, 2
LENS = [37, 0, 5, 70]  # row 1 has no token
EXTRA = 2  # buffer rows past the batch (SGLang's buffers are sized for its largest batch)
W = 5  # lse columns (SGLang's max_kv_splits)
SENTINEL = 7.0
FIELDS = ("tv_upper_a", "out_err_upper", "xi", "eps_max", "flag")


def _cache():
    cache, _pool, slots, indptr, q = csr_int8_cache(LENS, HKV, D, GQ, 21, DEV)
    return cache, slots.to(DEV), indptr.to(DEV), q


def _decode(cache, slots, indptr, q, **kw):
    return decode(cache, q, slots, None, kv_indptr=indptr, num_splits=2, validate=False, sm_scale=1 / math.sqrt(D), **kw)


def _buffers(dtype):
    B, Hq = len(LENS), HKV * GQ
    o_buf = torch.full((B + EXTRA, Hq, D), SENTINEL, dtype=dtype, device=DEV)
    lse_buf = torch.full((B + EXTRA, Hq, W), SENTINEL, dtype=torch.float32, device=DEV)
    return o_buf, lse_buf


def _deferred(rows):
    return dict(tilt_batch=TiltBatch.allocate(1, rows, hist_columns(False), DEV), tilt_layer=0)


@pytest.mark.parametrize("merge_off_gpu", ["kernel", "torch"])
@pytest.mark.parametrize("defer", [False, True], ids=["fused", "deferred"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merge_writes_the_callers_buffers(monkeypatch, merge_off_gpu, defer, dtype):
    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", merge_off_gpu)
    cache, slots, indptr, q = _cache()
    B, Hq = len(LENS), HKV * GQ
    base = to_cpu(_decode(cache, slots, indptr, q, **(_deferred(B * Hq) if defer else {})))
    o_buf, lse_buf = _buffers(dtype)
    got = _decode(cache, slots, indptr, q, out=o_buf[:B], lse_out=lse_buf[:B], **(_deferred(B * Hq) if defer else {}))
    assert got.o.data_ptr() == o_buf.data_ptr() and got.lse.data_ptr() == lse_buf.data_ptr()
    o_buf, lse_buf, got = o_buf.cpu(), lse_buf.cpu(), to_cpu(got)
    if dtype == torch.float32:
        assert torch.equal(o_buf[:B], base.o)
    elif DEV == "cuda":  # the store's conversion rounds to nearest, as torch's
        assert torch.equal(o_buf[:B], base.o.to(dtype))
    else:  # (the interpreter's bf16 conversion: within one bf16 step of torch's rounding)
        assert torch.allclose(o_buf[:B].float(), base.o, rtol=2.0**-7, atol=0.0)
    assert (o_buf[1] == 0).all()  # the row without tokens: output 0
    assert torch.equal(lse_buf[:B, :, 0], base.lse) and torch.equal(got.lse, base.lse)
    assert torch.isneginf(lse_buf[:B, :, 1:]).all()
    assert (o_buf[B:] == SENTINEL).all() and (lse_buf[B:] == SENTINEL).all()  # rows past the batch untouched
    for f in FIELDS:
        assert torch.equal(getattr(got.meter, f), getattr(base.meter, f)), f


def test_one_lse_column_and_an_unmetered_call(monkeypatch):
    """W = 1 (no −inf columns) and the unmetered merge write the same buffers."""
    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    cache, slots, indptr, q = _cache()
    B, Hq = len(LENS), HKV * GQ
    for meter in (True, False):
        base = to_cpu(_decode(cache, slots, indptr, q, meter=meter))
        o_buf = torch.empty(B, Hq, D, device=DEV)
        lse_buf = torch.empty(B, Hq, 1, device=DEV)
        _decode(cache, slots, indptr, q, meter=meter, out=o_buf, lse_out=lse_buf)
        assert torch.equal(o_buf.cpu(), base.o) and torch.equal(lse_buf[..., 0].cpu(), base.lse)


def test_output_buffers_misuse_is_refused():
    cache, slots, indptr, q = _cache()
    B, Hq = len(LENS), HKV * GQ
    o_buf, lse_buf = _buffers(torch.bfloat16)
    bad_out = [
        (o_buf, "out: expected"),  # B + EXTRA rows
        (torch.empty(B, Hq, D, dtype=torch.int32, device=DEV), "out: expected a float32"),
        (torch.empty(B, Hq, 2 * D, device=DEV)[..., ::2], "last dimension contiguous"),
        (torch.empty(B, Hq * D, device=DEV), "out: expected"),
    ]
    for out, msg in bad_out:
        with pytest.raises(ValueError, match=msg):
            _decode(cache, slots, indptr, q, out=out)
    bad_lse = [
        (lse_buf[:B].half(), "lse_out: expected a float32"),
        (lse_buf[:B, :, 0], "lse_out: expected"),  # [B, Hq]: no column dimension
        (lse_buf[:B, :, :0], "W ≥ 1"),
        (lse_buf[:B].transpose(1, 2).contiguous().transpose(1, 2), "last dimension contiguous"),
    ]
    for lse, msg in bad_lse:
        with pytest.raises(ValueError, match=msg):
            _decode(cache, slots, indptr, q, lse_out=lse)
    # an output that shares memory with the query (the merge reads a row's query after writing its output) or with the
    # other output
    qbig = torch.zeros(B, Hq, D, dtype=q.dtype, device=DEV)
    qbig.copy_(q)
    with pytest.raises(ValueError, match="shares memory with an input"):
        _decode(cache, slots, indptr, qbig, out=qbig)
    lse_view = torch.empty(B, Hq, D, device=DEV)
    with pytest.raises(ValueError, match="share memory"):
        _decode(cache, slots, indptr, q, out=lse_view, lse_out=lse_view[..., :W])
    # the lengths inside the output (the merge reads a row's kv_indptr entries after other rows wrote theirs: an
    # adversarial review served a 5-token row as 0 with TV⁺ 0 that way)
    mem = torch.zeros(B * Hq * D, dtype=torch.float32, device=DEV)
    ind_in = mem.view(torch.int32)[: B + 1]
    ind_in.copy_(indptr)
    with pytest.raises(ValueError, match="shares memory with an input"):
        _decode(cache, slots, ind_in, q, out=mem.view(B, Hq, D))
    # two elements in one place: a broadcast output, heads of lse_out over each other
    with pytest.raises(ValueError, match="two of its elements"):
        _decode(cache, slots, indptr, q, out=torch.empty(1, Hq, D, device=DEV).expand(B, Hq, D))
    with pytest.raises(ValueError, match="two of its elements"):
        _decode(cache, slots, indptr, q, lse_out=torch.empty(B * 8, device=DEV).as_strided((B, Hq, W), (8, 1, 1)))
    lens = torch.tensor([37, 1, 5, 70], dtype=torch.int32, device=DEV)
    mask = torch.ones(B, 70, dtype=torch.bool, device=DEV)
    with pytest.raises(ValueError, match="not with token_mask"):
        decode(cache, q, torch.zeros(B, 70, dtype=torch.int32, device=DEV), lens, token_mask=mask, validate=False,
               out=o_buf[:B])
