"""The deferred record's merge in parts (``kernels.plan.MERGE_PARTS``, ``epilogue_jit._merge_in_parts``): two or three
programs per row, the last to arrive writing the pending record, give what the one-program merge gives — the output,
the merged histograms, the excess sums and the row's state, every record column and the flag — bit for bit in the
interpreter, before and after the finish; the arrival counters are back at 0 after every call; a bad setting is
refused."""

import pytest
import torch

from tests.helpers.conformance import DEV, build, csr_int8_cache
from tests.helpers.sketch_case import sketch_cache

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]

import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402


def _equal(a, b, exact):
    a, b = torch.nan_to_num(a.double().cpu(), nan=-7.0), torch.nan_to_num(b.double().cpu(), nan=-7.0)
    if exact:
        assert torch.equal(a, b)
    else:  # (the GPU may contract E⁺'s multiply-add differently in the two programs' code)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def _batches(call, parts, monkeypatch, layers=1):
    """(one-program batch, PARTS batch, their outputs) of ``call(tilt_batch=, tilt_layer=0)``."""
    out = {}
    for p in (1, parts):
        monkeypatch.setattr(kp, "MERGE_PARTS", p)
        probe = call()
        batch = TiltBatch.allocate(layers=layers, rows=probe.meter.tv_upper_a.numel(), nb=probe.plan.hist_columns,
                                   device=DEV, forms=True)
        out[p] = (batch, call(tilt_batch=batch, tilt_layer=0))
    return out[1], out[parts]


def _check(one, many, exact, tau=-1.0):
    (b1, d1), (bp, dp) = one, many
    _equal(dp.o, d1.o, True)  # the output merge is the same code in both
    for stage in ("pending", "finished"):
        if stage == "finished":
            b1.finish(tilt_above=tau)
            bp.finish(tilt_above=tau)
        _equal(bp.rec, b1.rec, exact)
        _equal(bp.hout, b1.hout, True)
        _equal(bp.exs, b1.exs, True)
        assert torch.equal(bp.flag.cpu(), b1.flag.cpu()), stage
        assert torch.all(bp.cnt == 0), "the arrival counters start the next call at 0"


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("kind", ["plain", "sketch"])
def test_parts_give_the_one_program_record(parts, kind, monkeypatch):
    if kind == "plain":  # int8, the group radius, a single-token row (lens 1 and 37), GQ 2, outliers
        cache, bt, _ = build("int8", [1, 37], 2, 64, G=1, seed=4, outliers=True)
        lens = [1, 37]
    else:  # the 2-bit sketch and channel weights: the excess sums and the grid block
        cache, bt, *_ = sketch_cache("int8", 2, n=70, seed=3)
        lens = [70]
    q = (torch.randn(len(lens), 4, 64, generator=torch.Generator().manual_seed(5)) * 2.0).bfloat16().float().to(DEV)
    sl = torch.tensor(lens, device=DEV)
    one, many = _batches(lambda **kw: decode(cache, q, bt.to(DEV), sl, num_splits=3, **kw), parts, monkeypatch)
    if kind == "sketch":
        assert many[0].exs[0, :, -2].eq(18).all()  # (the case: every row holds the 18 sums)
    _check(one, many, DEV == "cpu")


@pytest.mark.parametrize("parts", [2, 3])
def test_parts_on_dead_rows_and_sglang_outputs(parts, monkeypatch):
    """An empty CSR row (its 0/0 counted, unflagged) beside live ones, the output in a narrower float (the store's
    term of E⁺ and its overflow count): the pending record and the finished one are the one-program merge's."""
    cache, _pool, slots, indptr, q = csr_int8_cache([37, 0, 5, 70], 2, 64, 2, seed=0, dev=DEV)

    def call(**kw):
        return decode(cache, q, slots, None, kv_indptr=indptr, num_splits=2, validate=False,
                      out=torch.empty(4, q.shape[1], 64, dtype=torch.float16, device=DEV), **kw)

    one, many = _batches(call, parts, monkeypatch)
    hq = q.shape[1]
    assert many[0].exs[0, hq: 2 * hq, -1].ne(0).all() and many[1].meter.tv_upper_a[1].eq(0).all()  # (the dead row)
    _check(one, many, DEV == "cpu")


def test_parts_on_flagged_rows(monkeypatch):
    """|o| beyond fp16's range: every row flagged by the output's part alone; the record's last program must count
    it (a share it did not compute)."""
    from kernels.paged import PagedKV
    from kernels.write import write_kv

    g = torch.Generator().manual_seed(0)
    n, H, D = 40, 2, 64
    w = 2.0 ** torch.randint(-2, 3, (H, D), generator=g).float()
    c = PagedKV.allocate(4, H, D, "int8", num_groups=1, sketch_bits=2, weights=w, device=DEV)
    k = (torch.randn(n, H, D, generator=g) * 2).bfloat16()
    v = (torch.randn(n, H, D, generator=g) * 1e5).bfloat16()
    bt = torch.tensor([[2, 0, 1]], dtype=torch.int32, device=DEV)
    write_kv(c, k.to(DEV), v.to(DEV), bt, torch.zeros(n, dtype=torch.long, device=DEV), torch.arange(n, device=DEV))
    q = (torch.randn(1, 4, D, generator=g) * 2).bfloat16()
    q = (q if DEV == "cuda" else q.float()).to(DEV)
    for parts in (2, 3):
        one, many = _batches(lambda **kw: decode(c, q, bt, torch.tensor([n], device=DEV), num_splits=3,
                                                 out=torch.empty(1, 4, D, dtype=torch.float16, device=DEV), **kw),
                             parts, monkeypatch)
        assert many[0].flag.all() and torch.isinf(many[1].meter.out_err_upper).all()
        _check(one, many, DEV == "cpu")


def test_a_bad_setting_is_refused(monkeypatch):
    cache, bt, _ = build("int8", [9], 2, 64, G=1, seed=1)
    q = torch.randn(1, 4, 64, device=DEV).bfloat16().float()
    sl = torch.tensor([9], device=DEV)
    out = decode(cache, q, bt.to(DEV), sl, num_splits=2)
    batch = TiltBatch.allocate(layers=1, rows=4, nb=out.plan.hist_columns, device=DEV, forms=True)
    for name, bad, match in [("MERGE_PARTS", v, "MERGE_PARTS: expected 1, 2 or 3") for v in (4, 0, True, 2.0)] + \
            [("MERGE_PARTS_WARPS", v, "MERGE_PARTS_WARPS: expected None or 1, 2, 4 or 8") for v in (0, 3, True, 1.0)]:
        monkeypatch.setattr(kp, name, bad)
        with pytest.raises(ValueError, match=match):
            decode(cache, q, bt.to(DEV), sl, num_splits=2, tilt_batch=batch, tilt_layer=0)
        assert not batch.written  # (refused before the layer's slot is claimed: the layer takes the next call)
        monkeypatch.setattr(kp, name, {"MERGE_PARTS": 3, "MERGE_PARTS_WARPS": None}[name])
    decode(cache, q, bt.to(DEV), sl, num_splits=2, tilt_batch=batch, tilt_layer=0)
    batch.finish()
    monkeypatch.setattr(kp, "MERGE_PARTS", 3)  # the fused (undeferred) merge has no parts: it ignores the setting
    torch.testing.assert_close(decode(cache, q, bt.to(DEV), sl, num_splits=2).meter.tv_upper_a, out.meter.tv_upper_a,
                               rtol=0, atol=0)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_the_launch_takes_the_parts_and_their_warps(parts, monkeypatch):
    """The deferred merge launches PARTS programs a row at ``MERGE_PARTS_WARPS`` warps where that is set, else (None, the
    default) at the one-program merge's count, ``merge_warps``'; the undeferred merge is one program a row whatever
    the setting."""
    import kernels.epilogue as ke

    seen = []

    class Spy:
        def __init__(self, real):
            self.real = real

        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append((grid, kw["PARTS"], kw["num_warps"]))
                return self.real[grid](*a, **kw)
            return launch

    cache, bt, _ = build("int8", [9, 20], 2, 64, G=1, seed=1)
    q = torch.randn(2, 4, 64, device=DEV).bfloat16().float()
    sl = torch.tensor([9, 20], device=DEV)
    monkeypatch.setattr(kp, "MERGE_PARTS", parts)
    monkeypatch.setattr(ke, "_merge_meter_kernel", Spy(ke._merge_meter_kernel))
    out = decode(cache, q, bt.to(DEV), sl, num_splits=2)
    for warps in (None, 2):
        monkeypatch.setattr(kp, "MERGE_PARTS_WARPS", warps)
        batch = TiltBatch.allocate(layers=1, rows=8, nb=out.plan.hist_columns, device=DEV, forms=True)
        decode(cache, q, bt.to(DEV), sl, num_splits=2, tilt_batch=batch, tilt_layer=0)
    (g_fused, p_fused, _), (g_def, p_def, w_def), (_, _, w_set) = seen
    assert (g_fused, p_fused) == ((8, 1), 1) and (g_def, p_def) == ((8, parts), parts)
    assert w_def == kp.merge_warps(2, 64, True, 8, 0, tilts=False)  # (off the GPU: no SM count)
    assert w_set == (2 if parts > 1 else w_def)


def test_a_count_left_short_is_cleared_by_the_next_finish_or_reset(monkeypatch):
    """A merge in parts that failed midway would leave a row's arrival count short of PARTS (and the next call's last
    program would be found early): ``finish`` and ``reset`` start every row's count at 0 again."""
    cache, bt, _ = build("int8", [9], 2, 64, G=1, seed=1)
    q = torch.randn(1, 4, 64, device=DEV).bfloat16().float()
    sl = torch.tensor([9], device=DEV)
    monkeypatch.setattr(kp, "MERGE_PARTS", 3)
    out = decode(cache, q, bt.to(DEV), sl, num_splits=2)
    batch = TiltBatch.allocate(layers=1, rows=4, nb=out.plan.hist_columns, device=DEV, forms=True)
    for clear in (batch.finish, batch.reset):
        batch.cnt[0, 1] = 2
        clear()
        assert torch.all(batch.cnt == 0)
        d = decode(cache, q, bt.to(DEV), sl, num_splits=2, tilt_batch=batch, tilt_layer=0)
        batch.finish()
        _equal(d.meter.out_err_upper, decode(cache, q, bt.to(DEV), sl, num_splits=2).meter.out_err_upper, DEV == "cpu")


@pytest.mark.skipif(DEV != "cpu", reason="the interpreter's program order is what is permuted")
@pytest.mark.parametrize("order", ["reversed", "shuffled-0", "shuffled-1", "shuffled-2"])
def test_any_arrival_order_gives_the_same_record(order, monkeypatch):
    """The interpreter runs a row's programs in grid order, so the histograms' program would always arrive last. Here
    every launch runs its programs in another order (reversed, or a fixed shuffle of the whole grid): whichever program
    of a row arrives last writes the pending record, and it is the one-program merge's (review, 2026-12-07: with
    ``part == PARTS − 1`` in place of the arrival count as the writer's test, every other test here passed)."""
    import random

    import triton.runtime.interpreter as TI

    cache, bt, *_ = sketch_cache("int8", 2, n=70, seed=3)
    q = (torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(5)) * 2.0).bfloat16().float()
    btx = torch.cat([bt, bt]).to(DEV)
    sl = torch.tensor([70, 33])
    real = TI.InterpreterBuilder.set_grid_idx

    def permuted(self, x, y, z):
        nx, ny, nz = self.grid_dim
        i, n = (x * ny + y) * nz + z, nx * ny * nz
        if order == "reversed":
            j = n - 1 - i
        else:
            perm = list(range(n))
            random.Random(int(order.split("-")[1])).shuffle(perm)
            j = perm[i]
        return real(self, j // (ny * nz), (j // nz) % ny, j % nz)

    def deferred(parts, permute):
        monkeypatch.setattr(kp, "MERGE_PARTS", parts)
        probe = decode(cache, q, btx, sl, num_splits=3)
        batch = TiltBatch.allocate(layers=1, rows=8, nb=probe.plan.hist_columns, device=DEV, forms=True)
        if permute:
            monkeypatch.setattr(TI.InterpreterBuilder, "set_grid_idx", permuted)
        try:
            return batch, decode(cache, q, btx, sl, num_splits=3, tilt_batch=batch, tilt_layer=0)
        finally:
            monkeypatch.setattr(TI.InterpreterBuilder, "set_grid_idx", real)

    for parts in (2, 3):
        _check(deferred(1, False), deferred(parts, True), True)
