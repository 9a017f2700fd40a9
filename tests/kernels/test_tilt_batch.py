"""The deferred record (``kernels.tilt_batch``): a step's layers decoded with ``tilt_batch=`` carry a sound TV⁺ until
``finish`` (the closed forms', or with the forms deferred too (``forms``, the default) 1 and its E⁺, a single-token row
its final 0), after which every record is the fused merge's at the same τ (bit for bit in the interpreter); and its
misuse is refused."""

import pytest
import torch

from tests.helpers.conformance import DEV, build
from tests.helpers.sketch_case import sketch_cache

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]

from kernels.decode import decode  # noqa: E402
from kernels.epilogue_jit import FP64_SLACK  # noqa: E402
from kernels.excess_grid import EXCESS_COLS  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402

FIELDS = ("tv_upper_a", "out_err_upper", "eps_max", "xi", "rho", "tanh", "eform", "tilt", "flag", "hist")


def _layers(kind="plain"):
    """Three 'layers' of one step, each with its own keys and query. "plain": int8 caches of a two-sequence batch
    (lens 1 and 37: a single-token row), GQ 2, the group radius; "sketch": one-sequence int8 caches written by
    the write kernel with the 2-bit sketch and channel weights (the levels' factor |σ|‖a⊙q_h‖), the last of one
    token."""
    out = []
    for i, seed in enumerate((3, 4, 5)):
        if kind == "plain":
            cache, bt, _ = build("int8", [1, 37], 2, 64, G=1, seed=seed, outliers=seed == 4)
            lens = [1, 37]
        else:
            lens = [(70, 45, 1)[i]]
            cache, bt, *_ = sketch_cache("int8", 2, n=lens[0], seed=seed)
        q = (torch.randn(len(lens), 4, 64, generator=torch.Generator().manual_seed(seed)) * 2.0).bfloat16().float()
        out.append((cache, q.to(DEV), bt.to(DEV), torch.tensor(lens, device=DEV)))
    return out


def _same(a, b, exact):
    if exact:
        assert torch.equal(a.cpu(), b.cpu())
    else:  # the GPU may fuse the E⁺ expression's multiply-add differently in the two kernels
        torch.testing.assert_close(a.double().cpu(), b.double().cpu(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind,tau,forms", [("plain", -1.0, True), ("plain", 0.02, True), ("sketch", -1.0, True),
                                            ("sketch", 0.02, True), ("plain", 0.02, False), ("sketch", -1.0, False)])
def test_finish_gives_the_fused_record(kind, tau, forms):
    layers = _layers(kind)
    fused = [decode(c, q, bt, sl, num_splits=3, tilt_above=tau) for c, q, bt, sl in layers]
    nb = fused[0].plan.hist_columns
    rows = layers[0][1].shape[0] * 4
    batch = TiltBatch.allocate(layers=4, rows=rows, nb=nb, device=DEV, forms=forms)  # one layer more than used
    deferred = [decode(c, q, bt, sl, num_splits=3, tilt_batch=batch, tilt_layer=i)
                for i, (c, q, bt, sl) in enumerate(layers)]
    if forms:
        assert batch.exc_cols == (EXCESS_COLS if kind == "sketch" else 0)
    for f, d in zip(fused, deferred):
        torch.testing.assert_close(d.o, f.o, rtol=0, atol=0)  # the merge itself is the same
        pre = d.meter
        # before finish: never below the fused TV⁺ (a sound bound)
        assert torch.all(pre.tv_upper_a >= f.meter.tv_upper_a) and torch.all(pre.out_err_upper >= f.meter.out_err_upper)
        live = pre.tv_upper_a > 0  # (the single-token row: 0)
        if forms:  # pending: TV⁺ 1 and its E⁺ (a single-token row its final 0 and E⁺), the forms' columns 1
            assert torch.all(pre.tv_upper_a[live] == 1) and torch.all(pre.eform == 1) and torch.all(pre.rho == 1)
            _same(pre.out_err_upper[~live], f.meter.out_err_upper[~live], DEV == "cpu")
            if kind == "sketch":
                assert torch.all(pre.excess == 1)
            continue
        # the closed forms (SPEC §3(a)(b))
        e1 = torch.exp(-pre.xi)
        closed = torch.minimum(pre.tanh, pre.eform) + (1 - e1) / (1 + e1)
        if kind == "sketch":  # the centred sketch box's excess form, a bound of TV(p, p̂) itself (kernels.plan.EXCESS_FORM)
            assert pre.excess is not None and torch.all(pre.excess <= 1)
            closed = torch.minimum(closed, pre.excess)
        closed = torch.clamp(closed + pre.rho + FP64_SLACK, max=1.0)
        torch.testing.assert_close(pre.tv_upper_a[live], closed[live], rtol=1e-12, atol=0)
        assert torch.all(pre.tilt[live] == 1.0)  # no tilt yet
    # the tilt tightens some row here (the finish below then has work to do)
    assert any(bool((d.meter.tv_upper_a > f.meter.tv_upper_a).any()) for f, d in zip(fused, deferred))
    untouched = batch.rec[3].clone()
    batch.finish(tilt_above=tau)
    exact = DEV == "cpu"
    for f, d in zip(fused, deferred):
        for name in FIELDS + (("excess",) if kind == "sketch" else ()):  # (a single-token row's tilt column too: the
            _same(getattr(d.meter, name), getattr(f.meter, name), exact)  # fused merge computes it before TV⁺ = 0)
    # E⁺ (``epilogue_jit._out_err_upper``, the fused merge's and the finish's one formula) pinned from the columns
    # the deferred merge stores: (TV⁺·(2ν_max + φ_max) + extra)(1 + 2⁻⁴⁰) + FP64_SLACK, its slack included
    from kernels.epilogue_jit import REC_EA, REC_EW, REC_EX, REC_TVA

    rec = batch.rec[:3].reshape(-1, batch.rec.shape[-1]).cpu()
    want = (rec[:, REC_TVA.value] * rec[:, REC_EW.value] + rec[:, REC_EX.value]) * (1 + 2.0**-40) + FP64_SLACK
    live = (rec[:, REC_TVA.value] > 0) & torch.isfinite(want)
    assert live.any()
    _same(rec[live, REC_EA.value], want[live], exact)
    single = deferred[0 if kind == "plain" else 2].meter
    assert torch.all(single.tv_upper_a[0] == 0) and torch.all(single.tilt[0] < 1)  # a single-token row
    assert torch.equal(batch.rec[3], untouched)  # an unwritten layer is skipped
    again = batch.rec.clone()
    batch.finish(tilt_above=tau)  # idempotent
    assert torch.equal(batch.rec, again)
    if tau < 0:  # a lazier finish after the full one leaves the full one's record (TV⁺ and tilt column alike)
        batch.finish(tilt_above=0.005)
        assert torch.equal(batch.rec, again)


ALL = FIELDS + ("excess",)


def _deferred_after_finish(call, forms, tau=-1.0, layers=1):
    """(fused record, deferred record after its finish) of one decode ``call(**kw)``."""
    f = call(tilt_above=tau)
    batch = TiltBatch.allocate(layers=layers, rows=f.meter.tv_upper_a.numel(), nb=f.plan.hist_columns, device=DEV,
                               forms=forms)
    d = call(tilt_batch=batch, tilt_layer=0)
    batch.finish(tilt_above=tau)
    return f.meter, d.meter


def _same_record(d, f, exact):
    for name in ALL:
        a, b = getattr(d, name), getattr(f, name)
        assert (a is None) == (b is None), name
        if a is not None:
            _same(torch.nan_to_num(a.double(), nan=-7.0), torch.nan_to_num(b.double(), nan=-7.0), exact)


@pytest.mark.parametrize("forms", [True, False])
def test_dead_rows_keep_the_fused_columns(forms):
    """A row without tokens (an empty CSR row) counts its 0/0 as non-finite in the merge, unflagged: the fused merge
    keeps its forms' columns at 1. The finish must not compute them from its garbage inputs (review, 2026-12-07: ρ
    1.3e271 and tanh 5.5e-5 where the fused record has 1) — every column the fused one's."""
    from tests.helpers.conformance import csr_int8_cache

    cache, _pool, slots, indptr, q = csr_int8_cache([37, 0, 5, 70], 2, 64, 2, seed=0, dev=DEV)
    f, d = _deferred_after_finish(lambda **kw: decode(cache, q, slots, None, kv_indptr=indptr, num_splits=2,
                                                      validate=False, **kw), forms)
    assert torch.all(f.tanh[1] == 1) and torch.all(f.tv_upper_a[1] == 0)  # (the case: the dead row's 1s)
    _same_record(d, f, DEV == "cpu")


def test_a_flagged_rows_excess_column_is_the_fused_one():
    """The fused merge computes the excess form on every row, a flagged one too (its TV⁺ 1): the deferred record's
    finish computes it on every written row (review: 1 where the fused record had 0.15-0.29)."""
    from kernels.paged import PagedKV
    from kernels.write import write_kv

    g = torch.Generator().manual_seed(0)
    n, H, D = 40, 2, 64
    w = 2.0 ** torch.randint(-2, 3, (H, D), generator=g).float()
    c = PagedKV.allocate(4, H, D, "int8", num_groups=1, sketch_bits=2, weights=w, device=DEV)
    k = (torch.randn(n, H, D, generator=g) * 2).bfloat16()
    v = (torch.randn(n, H, D, generator=g) * 1e5).bfloat16()  # |o| beyond fp16's range: every row flagged
    bt = torch.tensor([[2, 0, 1]], dtype=torch.int32, device=DEV)
    write_kv(c, k.to(DEV), v.to(DEV), bt, torch.zeros(n, dtype=torch.long, device=DEV), torch.arange(n, device=DEV))
    q = (torch.randn(1, 4, D, generator=g) * 2).bfloat16()
    q = (q if DEV == "cuda" else q.float()).to(DEV)
    f, d = _deferred_after_finish(lambda **kw: decode(c, q, bt, torch.tensor([n], device=DEV), num_splits=3,
                                                      out=torch.empty(1, 4, D, dtype=torch.float16, device=DEV),
                                                      **kw), True)
    assert f.flag.all() and d.flag.all() and (f.excess < 1).any()
    _same_record(d, f, DEV == "cpu")


def test_layers_with_and_without_the_excess_sums_share_a_batch():
    """Channel weights on some layers only (calibration leaves a layer's weights 1 where it has no data): the layers'
    merges store 18, 2 or 0 excess columns into one batch (review, 2026-12-07: the first form refused the second
    layer, and a graphed WitCertCache step raised). Each row's state says what it holds; every layer's record is its
    fused one after the finish, at τ −1 and at a gate's 0.02."""
    import kernels.plan as kp

    sk, bt, *_ = sketch_cache("int8", 2, n=45, seed=4)
    plain, btp, *_ = sketch_cache("int8", 0, n=45, seed=4, weights=False)
    q = (torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(4)) * 2.0).bfloat16()
    q = (q if DEV == "cuda" else q.float()).to(DEV)
    sl = torch.tensor([45], device=DEV)
    # (layer, cache, block table, the grid on): 18 columns, none, 2 columns (the grid off)
    spec = [(0, sk, bt, True), (1, plain, btp, True), (2, sk, bt, False)]
    for tau in (-1.0, 0.02):
        batch, fused, deferred = None, [], []
        for i, c, b, grid in spec:
            old = kp.EXCESS_GRID
            kp.EXCESS_GRID = grid
            try:
                f = decode(c, q, b, sl, num_splits=3, tilt_above=tau)
                if batch is None:
                    batch = TiltBatch.allocate(layers=3, rows=4, nb=f.plan.hist_columns, device=DEV)
                fused.append(f)
                deferred.append(decode(c, q, b, sl, num_splits=3, tilt_batch=batch, tilt_layer=i))
            finally:
                kp.EXCESS_GRID = old
        assert (fused[0].plan.grid, fused[1].plan.excess, fused[2].plan.grid) == (True, False, False)
        assert fused[2].plan.excess and batch.exc_cols == EXCESS_COLS
        batch.finish(tilt_above=tau)
        for f, d in zip(fused, deferred):
            _same_record(d.meter, f.meter, DEV == "cpu")
        assert not torch.equal(fused[0].meter.excess, fused[2].meter.excess)  # (the grid's form differs here)


def test_a_slot_takes_one_write_between_finishes():
    """Two decodes into one layer's slot before a finish would leave the first's records reading the second's
    (review, 2026-12-05: a kivi2 layer's row read TV⁺ 0.0015 against its realised 0.34): refused; after finish
    the slot takes the next step's write. A layer index is any integer, and it must be given."""
    import numpy as np

    (c, q, bt, sl), (c2, q2, bt2, sl2) = _layers()[:2]
    out = decode(c, q, bt, sl, num_splits=2)
    batch = TiltBatch.allocate(layers=2, rows=8, nb=out.plan.hist_columns, device=DEV)
    decode(c, q, bt, sl, num_splits=2, tilt_batch=batch, tilt_layer=np.int64(0))
    with pytest.raises(ValueError, match="tilt_layer 0: already written"):
        decode(c2, q2, bt2, sl2, num_splits=2, tilt_batch=batch, tilt_layer=0)
    with pytest.raises(ValueError, match="expected a kernels.tilt_batch.TiltBatch and tilt_layer"):
        decode(c2, q2, bt2, sl2, num_splits=2, tilt_batch=batch)
    with pytest.raises(ValueError, match="expected a kernels.tilt_batch.TiltBatch"):
        decode(c2, q2, bt2, sl2, num_splits=2, tilt_batch=batch.rec, tilt_layer=1)
    with pytest.raises(ValueError, match="tilt_above: expected a real number"):
        batch.finish(tilt_above=None)
    for warps in (0, 3, True, 1.0):
        with pytest.raises(ValueError, match="num_warps: expected None or 1, 2, 4, 8 or 16"):
            batch.finish(num_warps=warps)
    for cols in (2.0, 3, True):
        with pytest.raises(ValueError, match="exc_cols must be 0, 2 or"):
            batch.slot(1, 8, out.plan.hist_columns, batch.ka, cols)
    batch.finish()
    decode(c2, q2, bt2, sl2, num_splits=2, tilt_batch=batch, tilt_layer=0)  # the next step
    batch.reset()
    assert torch.all(batch.flag == 1) and not batch.written


def test_misuse_is_refused():
    c, q, bt, sl = _layers()[0]
    out = decode(c, q, bt, sl, num_splits=2)
    nb = out.plan.hist_columns
    batch = TiltBatch.allocate(layers=2, rows=8, nb=nb, device=DEV)
    with pytest.raises(ValueError, match="tilt_layer"):
        decode(c, q, bt, sl, num_splits=2, tilt_batch=batch, tilt_layer=2)
    with pytest.raises(ValueError, match="allocated for 16 rows"):
        decode(c, q, bt, sl, num_splits=2, tilt_batch=TiltBatch.allocate(layers=1, rows=16, nb=nb, device=DEV),
               tilt_layer=0)
    with pytest.raises(ValueError, match="tier-A tilt"):
        decode(c, q, bt, sl, num_splits=2, epilogue=False, tilt_batch=batch, tilt_layer=0)
    dith, btd, _ = build("int8_dither", [5, 9], 2, 64, G=1, seed=1)
    with pytest.raises(ValueError, match="no Tier B"):
        decode(dith, q, btd.to(DEV), torch.tensor([5, 9], device=DEV), num_splits=2, delta_step=1e-6, tilt_batch=batch,
               tilt_layer=1)
    for bad in (dict(layers=0, rows=8, nb=nb), dict(layers=1, rows=8, nb=4), dict(layers=1.0, rows=8, nb=nb)):
        with pytest.raises(ValueError, match="TiltBatch.allocate"):
            TiltBatch.allocate(device=DEV, **bad)
