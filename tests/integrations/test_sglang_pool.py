"""Issue 36: the SGLang meter against the real ``sglang==0.5.23`` pool classes on the CPU.

The pool modules need SGLang's server stack (torchvision, tvm_ffi, …); ``real_pool_modules``
imports them without it: a few third-party packages and two vision-config modules are stubbed
(``_Stub``: attribute access gives a placeholder), ``sglang.srt.configs`` is entered without its
``__init__`` and ``sglang.srt.model_executor.runner`` (the CUDA-graph runner) is a one-function
stand-in (``get_is_capture_mode() -> False``). The pool classes themselves, their
``set_kv_buffer`` / ``move_kv_cache`` / masked-write Triton kernel, are SGLang's own code.

Each hole of the issue has a test that measures the realised TV of what the decode served
(float64 softmax over the exact K/V the model handed the pool vs over the stored values) against
the record's TV⁺; each failed on the code before the fix (numbers in the docstrings).

The pool API enumerated and the allocators: ``test_sglang_pool_api.py``; the stubbed import and the
shared helpers: ``tests.helpers.sglang_pool``.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import math
import warnings

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
from tests.helpers.sglang_pool import (  # noqa: E402
    HKV,
    HQ,
    MP,
    SIZE,
    SW,
    D,
    Exact,
    _clean,  # noqa: E402, F401  (the autouse fixture)
    _Layer,
    check,
    decode,
    install,
    kv,
    mha,
    query,
    served,
    write,
)

# ---------------------------------------------------------------- hole 2: move_kv_cache


def test_move_kv_cache_carries_witnesses():
    """Issue 36 (2): before the fix the moved tokens kept the target slots' old witnesses (0 here):
    realised TV 0.0092 against TV⁺ 0.00021 on this input (after: TV⁺ 0.12)."""
    pool, ex = mha(), Exact()
    recs = install()
    src, tgt = torch.arange(0, 8), torch.arange(20, 28)
    ka, va = kv(8, 1)  # lossy in fp8
    kb_, vb_ = kv(8, 2, exact=True)  # exact in fp8: witness 0
    write(pool, 0, src, ka, va, ex)
    write(pool, 0, tgt, kb_, vb_, ex)
    pool.move_kv_cache(tgt, src)
    ex.move(tgt, src)
    assert torch.equal(pool.k_buffer[0][tgt], pool.k_buffer[0][src])  # SGLang's own move ran
    q = query(3, 1, scale=1.0).expand(2, HQ, D).contiguous()
    rows = [tgt.tolist(), src.tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert tv[0].max() > 1e-3  # the moved row is lossy
    assert (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert torch.allclose(tvp[0], tvp[1], rtol=1e-3)  # the same tokens and witnesses: the same bound
    assert tvp.max() < 1  # metered, not saturated


def test_move_checks_the_moved_bytes():
    """A move that does not copy what it was asked to (here: SGLang's move replaced by one that
    writes other bytes) leaves its targets unmetered (TV⁺ 1), never with the sources' witnesses."""
    pool = mha()
    recs = install()
    src, tgt = torch.arange(0, 4), torch.arange(10, 14)
    write(pool, 0, src, *kv(4, 1))
    write(pool, 0, tgt, *kv(4, 2))
    orig = ws._ORIGINALS["pool:move_kv_cache"][2]

    def wrong(self, tgt_loc, src_loc):
        orig(self, tgt_loc, src_loc)
        self.k_buffer[0][tgt_loc[:1]] = 0  # the first target's K is not what was moved
        self.v_buffer[0][tgt_loc[1:2]] = 0  # nor the second's V

    installed = MP.MHATokenToKVPool.move_kv_cache
    from witcert.integrations import sglang_pool

    MP.MHATokenToKVPool.move_kv_cache = sglang_pool.wrap_move_kv_cache(wrong)
    try:
        pool.move_kv_cache(tgt, src)
    finally:
        MP.MHATokenToKVPool.move_kv_cache = installed
    q = query(4, 4, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [tgt[:1].tolist(), tgt[1:2].tolist(), tgt[2:].tolist(), src.tolist()])
    tvp = recs[-1][1].tv_upper_a
    assert (tvp[:2] == 1).all() and (tvp[2:] < 1).all()
    assert recs[-1][1].flag[:2].all()


# ---------------------------------------------------------------- hole 1: hybrid (SWA) pools


def test_swa_and_full_layers_do_not_share_witnesses():
    """Issue 36 (1): SWAKVPool writes its sub-pools with ``layer_id_override`` = the pool-local id,
    so the full layer 1 and the SWA layer 0 were both "layer 0": the SWA write (exact values,
    witness 0) overwrote the full layer's witnesses. Before the fix: realised TV 0.0092 against
    TV⁺ 0.00021 on the full layer."""
    pool = SW.SWAKVPool(size=SIZE, size_swa=SIZE, page_size=1, dtype=torch.float8_e4m3fn, head_num=HKV, head_dim=D,
                        swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu",
                        enable_memory_saver=False, enable_alt_stream=False)
    recs = install()
    full_ex, swa_ex = Exact(), Exact()
    loc = torch.arange(5, 13)
    kf, vf = kv(8, 1)  # lossy
    ks_, vs_ = kv(8, 2, exact=True)
    pool.set_kv_buffer(_Layer(1), loc, kf.clone(), vf.clone())  # the full layer
    full_ex.write(loc, kf)
    pool.set_kv_buffer(_Layer(0), MP.KVWriteLoc(loc=loc, swa_loc=loc), ks_.clone(), vs_.clone())  # the SWA layer
    swa_ex.write(loc, ks_)
    q = query(3, 1, scale=1.0)
    fk, fv = pool.full_kv_pool.k_buffer[0], pool.full_kv_pool.v_buffer[0]
    decode(fk, fv, q, [loc.tolist()])
    tv, tvp = check(recs, q, fk, full_ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert recs[-1][0] == 1  # the model's layer id, not the sub-pool's
    sk, sv = pool.swa_kv_pool.k_buffer[0], pool.swa_kv_pool.v_buffer[0]
    decode(sk, sv, q, [loc.tolist()])
    tv, tvp = check(recs, q, sk, swa_ex, [loc.tolist()])
    assert recs[-1][0] == 0 and (tv == 0).all() and (tvp < 1e-3).all()


# ---------------------------------------------------------------- hole 3: dcp_kv_mask


def test_masked_dcp_write_is_recorded():
    """Issue 36 (3): a write through ``dcp_kv_mask`` (SGLang's masked Triton kernel) was not
    recorded: the slots kept the witnesses of what they held before (0: exact values). Before
    the fix: realised TV 0.0083 against TV⁺ 0.00021."""
    pool, ex = mha(), Exact()
    recs = install()
    loc = torch.arange(0, 8)
    write(pool, 0, loc, *kv(8, 2, exact=True), ex)
    k, v = kv(8, 1)
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.int32)  # slot 6 belongs to another rank
    pool.set_kv_buffer(_Layer(0), loc, k.clone(), v.clone(), dcp_kv_mask=mask)
    ex.write(loc[mask.bool()], k[mask.bool()])
    kept = kv(8, 2, exact=True)[0][6]
    assert torch.equal(served(pool.k_buffer[0])[6].float(), kept)  # SGLang did not write slot 6
    q = query(3, 1, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [loc.tolist()])
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tv <= tvp).all() and (tvp < 1).all(), (tv.max().item(), tvp.min().item())


# ---------------------------------------------------------------- hole 4: a failing recorder


def test_failing_recorder_leaves_unmetered_slots(monkeypatch):
    """Issue 36 (4): an exception in the recorder dropped the layer; the next write made a new
    side with zero witnesses for every older slot. Before the fix: realised TV 0.0176 against
    TV⁺ 0.00011 (the failed write's slots; 0.0092 against 0.00011 on the older ones). Now the failed write's slots are
    unmetered (TV⁺ 1) and the
    older slots keep their witnesses."""
    pool, ex = mha(), Exact()
    recs = install()
    old, failed, new = torch.arange(0, 8), torch.arange(8, 12), torch.arange(12, 16)
    write(pool, 0, old, *kv(8, 1), ex)
    real = ws.record_write
    monkeypatch.setattr(ws, "record_write", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected")))
    write(pool, 0, failed, *kv(4, 4), ex)
    monkeypatch.setattr(ws, "record_write", real)
    write(pool, 0, new, *kv(4, 5), ex)
    assert any("injected" in w for w in ws.STATE.unmetered)
    q = query(3, 1, scale=1.0).expand(3, HQ, D).contiguous()
    rows = [old.tolist(), failed.tolist(), new.tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, rows)
    assert tv[0].max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert (tvp[0] < 1).all() and (tvp[1] == 1).all() and (tvp[2] < 1).all()


def test_fresh_side_starts_unmetered():
    """Slots a recorded write has not seen (written before the meter registered the buffer)
    are unmetered: a side is born with every slot's bit set. Before the fix: TV⁺ 0.0001 on them."""
    pool = mha()
    pool.set_kv_buffer(_Layer(0), torch.arange(0, 4), *kv(4, 1))  # before install
    recs = install()
    pool.set_kv_buffer(_Layer(0), torch.arange(4, 8), *kv(4, 2))
    q = query(3, 2, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [[0, 1, 2, 3], [4, 5, 6, 7]])
    tvp = recs[-1][1].tv_upper_a
    assert (tvp[0] == 1).all() and (tvp[1] < 1).all()


# ---------------------------------------------------------------- a row without tokens; the scale's dtype


def test_empty_row_gives_the_references_zero_not_nan():
    """A request row with no token (SGLang's decode never sends one) and a fully masked row of
    the kernel: output 0 and TV⁺ / output bound 0, no flag, as ``witcert.meter.softmax``
    gives (before: NaN output, TV⁺ 1, bound inf, flagged)."""
    import numpy as np

    from kernels.decode import decode as kdecode
    from witcert.meter import measure, softmax

    pool = mha()
    recs = install()
    write(pool, 0, torch.arange(0, 4), *kv(4, 1))
    q = query(3, 2, scale=1.0)
    o = decode(pool.k_buffer[0], pool.v_buffer[0], q, [[], [0, 1, 2, 3]])
    r = recs[-1][1]
    assert torch.isfinite(o).all() and (o[0] == 0).all() and (o[1] != 0).any()
    assert (r.tv_upper_a[0] == 0).all() and (r.out_err_upper[0] == 0).all() and not r.flag[0].any()
    assert (r.tv_upper_a[1] > 0).all()
    dead = torch.zeros(1, 4, dtype=torch.bool)
    p, live = softmax(torch.zeros(1, 4, dtype=torch.float64), dead)
    assert (p == 0).all() and not live.any()  # the reference's dead row: p̂ = 0 (output 0) …
    assert float(measure(np.zeros((1, 4)), np.full((1, 4), 0.5), mask=dead.numpy()).tv.max()) == 0  # … and TV⁺ 0
    # the kernel itself, a fully masked row of a token_mask
    side = ws.side_of(pool.k_buffer[0])
    cache = ws.paged_view(side, pool.k_buffer[0], pool.v_buffer[0], 1.0, 1.0)
    bt = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]], dtype=torch.int32)
    tm = torch.tensor([[False] * 4, [True] * 4])
    out = kdecode(cache, q, bt, torch.tensor([4, 4], dtype=torch.int32), token_mask=tm)
    assert torch.isfinite(out.o).all() and (out.o[0] == 0).all() and torch.isneginf(out.lse[0]).all()
    assert (out.meter.tv_upper_a[0] == 0).all() and (out.meter.out_err_upper[0] == 0).all()
    assert not out.meter.flag[0].any() and (out.meter.tv_upper_a[1] > 0).all()


def test_witness_uses_the_kernels_fp32_scale():
    """The kernel applies k_scale as float32 (``paged_view`` hands it a float32 tensor), so its
    k̂ = code · fp32(k_scale). A witness against the float64 scale can undershoot that residual:
    k_scale = 2^10 (1 + 2^-25) (fp32: 2^10), k = 2^10 (1 + 2^-23) stored as code 1: ‖k̂ − k‖ is
    2^-13 per entry against the kernel's k̂ = 2^10, but 3·2^-15 against 2^10 (1 + 2^-25) (the old
    witness: 0.75x the residual). Pinned: the witness is ≥ the residual against fp32(k_scale) (and equals it,
    rounded up, within the fp16 rounding)."""
    ks = 1024 * (1.0 + 2.0**-25)
    assert ws.kernel_scale(ks) == 1024.0 and ws.kernel_scale(torch.tensor(0.1)) == float(torch.tensor(0.1))
    pool = mha()
    install()
    k = torch.full((1, HKV, D), 1024 * (1.0 + 2.0**-23))
    v = torch.full((1, HKV, D), 1024.0)
    pool.set_kv_buffer(_Layer(0), torch.tensor([3]), k.clone(), v.clone(), ks, ks)
    side = ws.side_of(pool.k_buffer[0])
    code = pool.k_buffer[0][3].view(torch.float8_e4m3fn).double()
    assert (code == 1).all()
    resid32 = (code * ws.kernel_scale(ks) - k[0].double()).norm(dim=-1)  # what the kernel's k̂ misses
    resid64 = (code * ks - k[0].double()).norm(dim=-1)
    w = side.k_wit[3, :, 0, 0].double()
    assert (resid64 < resid32).all()  # the float64 witness would be too small
    assert (w >= resid32).all() and (w <= resid32 * (1 + 2.0**-9)).all()
    assert not side.bad[3]


# ---------------------------------------------------------------- the record step inside CUDA graphs


class _NoHostSync(torch.overrides.TorchFunctionMode):
    """Raises on the torch calls that synchronise a GPU stream with the host (a CUDA graph cannot capture
    them): a tensor read into Python (``item``, ``bool``, ``int``, ``float``, ``tolist``…), a data-dependent
    shape (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``), a copy to the host, a
    tensor made from Python data (``torch.tensor``: a host-to-device copy on the GPU), and a Python scalar
    written through a tensor index (``x[idx] = True``: the scalar becomes a CPU tensor copied to the device,
    which a capture refuses; found on the H200, 2026-12-05, after this detector had passed the code)."""

    SYNC = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select", "unique",
            "cpu", "numpy", "tensor", "as_tensor", "argwhere"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.SYNC:
            raise AssertionError(f"host synchronisation: {name}")
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            idx = args[1] if len(args) > 1 else None
            idx = idx if isinstance(idx, (tuple, list)) else (idx,)
            for t in idx:
                if isinstance(t, torch.Tensor) and t.dtype == torch.bool and t.dim() > 0:
                    raise AssertionError(f"boolean-mask indexing: {name}")
            if name == "__setitem__" and len(args) > 2 and not isinstance(args[2], torch.Tensor) and any(
                    isinstance(t, torch.Tensor) and t.dim() > 0 for t in idx):
                raise AssertionError(f"a Python scalar written through a tensor index: {name}")
        return func(*args, **(kwargs or {}))


def test_record_step_makes_no_host_sync(monkeypatch):
    """Issue 36: the record step (``record_write``) is device operations only after a buffer's first write (which
    allocates its side), so SGLang's CUDA-graph capture can take it with the meter on: tensor scales (SGLang's
    ``layer.k_scale``) stay on the device, a ``dcp_kv_mask`` sends the masked-out rows to the side's trash row
    instead of selecting the others, the scale check and the unmetered bits are device ops. Before: ``.item()``
    on the scale, a boolean index on the mask, a Python comparison of the scales, ``torch.any`` in the fp16
    round-up. The detector itself is pinned (a boolean index and ``.item()`` inside it raise). And what it wrote
    is what the eager path of the earlier code wrote: the masked write's slots, the kept slot 6 untouched."""
    with pytest.raises(AssertionError), _NoHostSync():
        torch.ones(3)[torch.tensor([True, False, True])]
    with pytest.raises(AssertionError), _NoHostSync():
        torch.ones(()).item()
    with pytest.raises(AssertionError), _NoHostSync():
        torch.zeros(4, dtype=torch.bool)[torch.tensor([1, 2])] = True
    pool = mha()
    recs = install()
    loc = torch.arange(0, 8)
    ks = torch.tensor(0.5)
    write(pool, 0, loc, *kv(8, 2), k_scale=ks, v_scale=ks)  # the first write: allocates the side (not captured)
    real = ws.record_write

    def guarded(*a, **k):
        with _NoHostSync():
            return real(*a, **k)

    monkeypatch.setattr(ws, "record_write", guarded)
    k, v = kv(8, 3)
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.int32)
    side = ws.side_of(pool.k_buffer[0])
    before6 = side.k_wit[6].clone()
    write(pool, 0, loc, k, v, k_scale=ks, v_scale=ks, dcp_kv_mask=mask)
    write(pool, 0, torch.arange(8, 12), *kv(4, 4), k_scale=0.5, v_scale=0.5)  # Python scales too
    assert not ws.STATE.unmetered, dict(ws.STATE.unmetered)  # (an exception would have been counted here)
    monkeypatch.setattr(ws, "record_write", real)
    assert torch.equal(side.k_wit[6], before6) and not side.bad[:12].any()
    kh = served(pool.k_buffer[0], 0.5)[:6]
    resid = (kh - (k[:6] / 0.5).to(torch.float8_e4m3fn).double() * 0.5).norm(dim=-1)
    assert torch.equal(resid, torch.zeros_like(resid))  # (the stored codes are what the model's k rounds to)
    want = (kh - k[:6].double()).norm(dim=-1)
    w = side.k_wit[:6, :, 0, 0].double()
    assert (w >= want).all() and (w <= want * (1 + 2.0**-9) + 2.0**-90).all()
    # a write with other scales: its slots stay unmetered, counted on the device
    write(pool, 0, torch.arange(12, 14), *kv(2, 5), k_scale=0.25, v_scale=0.25)
    assert side.bad[12:14].all() and not side.bad[:12].any()
    assert ws.STATE.unmetered_counts()["write: k_scale/v_scale differ from the buffer's earlier writes"] == 1
    # the recorder's fallback too (it runs inside a capture when a recorded write fails): out-of-range slots
    # go to the trash row, the others are marked (a negative one from the end), nothing else is
    from witcert.integrations.sglang_pool import mark_unmetered

    slots = torch.tensor([14, -1, 10**9, 15])
    side.bad[14:16] = False
    side.bad[-1] = False
    want = side.bad.clone()
    want[14:16] = True
    want[-1] = True  # -1: the pool's last row, as torch indexing (SGLang's load_cpu_copy) reads it
    with _NoHostSync():
        mark_unmetered(side, slots)
    assert torch.equal(side.bad, want)  # (not the fallback that marks the whole side)
    q = query(3, 1, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [list(range(12))], ks=0.5, vs=0.5)
    assert (recs[-1][1].tv_upper_a < 1).all()
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [list(range(12))], ks=0.25, vs=0.25)  # not the witnesses' scales
    assert (recs[-1][1].tv_upper_a == 1).all() and recs[-1][1].flag.all()


# ---------------------------------------------------------------- review of 2026-12-05: slot forms, uninstall


def test_a_negative_slot_is_the_pools_last_row():
    """A negative slot is the pool's row from the end, as SGLang's write (torch indexing) reads it. Before the
    fix the recorder stored its witness in the side's trash row past the pool and the last slot kept a stale
    (zero) one: realised TV 0.0097 against TV⁺ 0.00021 (review, 2026-12-05)."""
    pool, ex = mha(), Exact()
    recs = install()
    last = pool.k_buffer[0].shape[0] - 1
    loc = torch.tensor([last - 3, last - 2, last - 1, last])
    write(pool, 0, loc, *kv(4, 2, exact=True), ex)  # exact in fp8: witnesses 0
    k, v = kv(1, 1)  # lossy
    write(pool, 0, torch.tensor([-1]), k, v)
    ex.write(torch.tensor([last]), k)
    q = query(3, 1, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [loc.tolist()])
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tv <= tvp).all(), (tv.max().item(), tvp.min().item())
    assert (tvp < 1).all() and not ws.STATE.unmetered  # metered: the witness is at the written row


@pytest.mark.parametrize("dt", [torch.bool, torch.uint8])
def test_a_mask_given_as_slots_leaves_the_side_unmetered(dt):
    """A bool / uint8 mask as the write's ``loc`` selects slots in SGLang's write; read as slot numbers 0 / 1 it
    left the slots it wrote metered with stale witnesses: realised TV 0.0093 against TV⁺ 0.00021 (review,
    2026-12-05). The recorder refuses it and its fallback marks the whole side."""
    pool, ex = mha(), Exact()
    recs = install()
    loc = torch.arange(5, 13)
    write(pool, 0, loc, *kv(8, 2, exact=True), ex)
    mask = torch.zeros(pool.k_buffer[0].shape[0], dtype=dt)
    mask[loc] = 1
    k, v = kv(8, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's uint8-index deprecation)
        write(pool, 0, mask, k, v)
    ex.write(loc, k)
    assert any("slot indices" in w for w in ws.STATE.unmetered), dict(ws.STATE.unmetered)
    q = query(3, 1, scale=1.0)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, [loc.tolist()])
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tvp == 1).all()


def test_uninstall_leaves_a_decode_bound_earlier_unmetered():
    """SGLang's attention backend binds ``decode_attention_fwd`` once; after ``uninstall`` its bound (patched)
    function still meters with the sides, whose witnesses no recorder updates any more: realised TV 0.0093
    against TV⁺ 0.00021 (review, 2026-12-05). Now ``uninstall`` marks every side's slots unmetered."""
    import tests.helpers.sglang_pool as H

    pool, ex = mha(), Exact()
    recs = install()
    bound = H.SGL.decode_attention_fwd  # what the backend holds
    loc = torch.arange(4, 12)
    write(pool, 0, loc, *kv(8, 2, exact=True), ex)
    ws.uninstall()
    write(pool, 0, loc, *kv(8, 1), ex)  # SGLang's own write: not recorded
    q = query(3, 1, scale=1.0)
    o, lg, lse = torch.zeros(1, HQ, D, dtype=q.dtype), torch.zeros(1, HQ, 2, D), torch.zeros(1, HQ, 2)
    bound(q, pool.k_buffer[0], pool.v_buffer[0], o, torch.tensor([0, 8], dtype=torch.int32), loc.int(), lg, lse,
          torch.full((1,), 2, dtype=torch.int32), 2, 1 / math.sqrt(D), 1.0, 1.0)
    tv, tvp = check(recs, q, pool.k_buffer[0], ex, [loc.tolist()])
    assert tv.max() > 1e-3 and (tvp == 1).all()


def test_our_schemes_record_step_makes_no_host_sync():
    """``install(scheme="int8")``: the record step also writes our own codes (``kernels.write.write_kv``), whose
    range checks read device tensors on the host (three syncs per write, review 2026-12-05): called with
    ``validate=False`` it is device operations only, as the module doc says of the record step."""
    pool = mha()
    ws.install(force=True, bare=True, on_record=lambda *a: None, scheme="int8")
    write(pool, 0, torch.arange(0, 8), *kv(8, 2))  # the first write: allocates the side
    k, v = kv(8, 3)
    loc = torch.arange(0, 8)
    MP.MHATokenToKVPool.set_kv_buffer.__wrapped__(pool, _Layer(0), loc, k.clone(), v.clone())
    side = ws.side_of(pool.k_buffer[0])
    before = side.ours.k_codes.clone()
    with _NoHostSync():
        ws.record_write(pool.k_buffer[0], pool.v_buffer[0], 0, loc, k, v, None, None, pool.dtype)
    assert not torch.equal(side.ours.k_codes, before) and not side.bad[:8].any()


def _two_rows_decoded():
    """A patched pool with 8 metered tokens and one eager decode of two rows (8 and 5 tokens): (pool, exact store,
    records, slots, q, rows)."""
    pool, ex = mha(), Exact()
    recs = install()
    loc = torch.arange(0, 8)
    write(pool, 0, loc, *kv(8, 2), ex)
    q = query(3, 2, scale=1.0)
    rows = [loc.tolist(), loc[:5].tolist()]
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    return pool, ex, recs, loc, q, rows


def test_captured_decode_keeps_static_records_and_the_gate_refuses(monkeypatch):
    """Issue 36: a metered decode captured in a CUDA graph (SGLang's decode graphs) hands its record to no
    callback (a callback would run once, at capture, and never for the replays: records silently missing);
    it is kept as that batch size's static record (``static_records``: the graph's outputs, rewritten by each
    replay), here equal to the eager call's. The gate syncs with the host: inside a capture it raises
    ``GraphCaptureUnsupported`` with what to do, instead of breaking the capture. (The capture is simulated:
    ``_capturing`` answers True; a real capture needs a GPU.)"""
    import witcert.integrations.sglang_decode as sd
    from witcert.gate import Gate

    pool, ex, recs, loc, q, rows = _two_rows_decoded()
    assert len(recs) == 1 and ws.static_records(2) == []
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    assert len(recs) == 1  # no callback for a captured call
    (layer, rec), = ws.static_records(2)
    assert layer == 0 and torch.equal(rec.tv_upper_a, recs[0][1].tv_upper_a) and ws.static_records(1) == []
    tv, _ = check(recs, q, pool.k_buffer[0], ex, rows)
    assert (tv <= rec.tv_upper_a.double()).all()
    ws.uninstall()
    ws.install(force=True, bare=True, on_record=lambda *a: None, gate=Gate("certified", tau=0.1),
               exact_store=ws.HostExactStore())
    write(pool, 0, loc, *kv(8, 2), ex)
    with pytest.raises(ws.GraphCaptureUnsupported, match="disable-cuda-graph"):
        decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)


def test_metered_decode_makes_no_host_sync_outside_its_kernels():
    """Issue 36: the patched ``decode_attention_fwd`` (view, plan, launches, dead rows, unmetered rows, record)
    makes no host-synchronising torch call once its buffer's view exists, so a CUDA graph can capture it with the
    meter on. The detector of the record-step test, with the Triton interpreter's own conversions exempt (it is
    the CPU's stand-in for the kernels). Pinned: a ``.item()`` in the wrapper's path is reported."""
    import math
    import traceback

    flagged = []

    class _Outside(_NoHostSync):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            try:
                return super().__torch_function__(func, types, args, kwargs)
            except AssertionError as e:
                if not any("triton/runtime" in f.filename or "triton/language" in f.filename
                           for f in traceback.extract_stack()):
                    flagged.append(str(e))
                return func(*args, **(kwargs or {}))

    pool, ex, recs, loc, q, rows = _two_rows_decoded()  # eager: builds the buffer's view
    slots = torch.tensor([s for r in rows for s in r], dtype=torch.int32)
    indptr = torch.tensor([0, 8, 13], dtype=torch.int32)
    o, logits, lse = torch.zeros(2, HQ, D, dtype=q.dtype), torch.zeros(2, HQ, 2, D), torch.zeros(2, HQ, 2)
    splits = torch.full((2,), 2, dtype=torch.int32)
    import tests.helpers.sglang_pool as H

    def call():
        H.SGL.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], o, indptr, slots, logits, lse, splits, 2,
                                   1 / math.sqrt(D), 1.0, 1.0)

    with _Outside():
        call()
    assert not flagged and len(recs) == 2 and not ws.STATE.unmetered, (flagged, dict(ws.STATE.unmetered))
    torch.testing.assert_close(recs[1][1].tv_upper_a, recs[0][1].tv_upper_a, rtol=0, atol=0)
    real = ws.STATE.emit
    ws.STATE.emit = lambda layer, rec: (rec.tv_upper_a.max().item(), real(layer, rec))  # a sync in the path
    try:
        with _Outside():
            call()
    finally:
        ws.STATE.emit = real
    assert flagged == ["host synchronisation: item"]


@pytest.mark.parametrize("slot", [-1, "rows", 1 << 40])
def test_a_slot_outside_the_pool_leaves_its_row_unmetered(slot):
    """A CSR slot outside the pool has no witness (the kernel reads bytes that are no token's); SGLang never sends
    one. Before the fix ``bad_rows`` clamped it onto the pool's first or last slot and read that slot's bit: a
    metered row over a slot without a witness."""
    from witcert.integrations.sglang_pool import bad_rows

    pool = mha()
    install()
    rows = pool.k_buffer[0].shape[0]
    write(pool, 0, torch.arange(0, rows), *kv(rows, 1))  # every slot metered
    side = ws.side_of(pool.k_buffer[0])
    assert not side.bad.any()
    slot = rows if slot == "rows" else slot
    indptr = torch.tensor([0, 3, 6, 9])
    ind = torch.tensor([0, 1, 2, 3, 4, slot, 5, 6, 7])
    assert bad_rows(side, indptr, ind, 3)[:, 0].tolist() == [False, True, False]


@pytest.mark.parametrize("refine", [0, 8])
def test_deferred_tilt_of_captured_calls(monkeypatch, caplog, refine):
    """``install(defer_tilt=True)``: a captured call's record skips the tilt and the closed forms (its TV⁺ pending:
    1, sound and ≥ the fused one) and ``static_records`` finishes it in one launch: then the eager (fused) call's record, bit for
    bit in the interpreter (both through the Triton merge); idempotent; a second capture of the batch size takes
    the same slot after a finish, a second call before one keeps its tilt. Refused with Tier B. (The capture is simulated, as above.)"""
    import kernels.decode as Dk
    import kernels.epilogue_jit as EJ
    import witcert.integrations.sglang_decode as sd

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    # the default coarse grid, and the refined one: on these rows the coarse grid alone is not below the closed forms
    # (a record without its tilt equals one with it), the refined one is, so there "the tilt was left out" is seen
    monkeypatch.setattr(EJ, "REFINE_TOP", refine)
    pool, ex, recs, loc, q, rows = _two_rows_decoded()
    eager = recs[0][1]
    ws.uninstall()
    got = []
    ws.install(force=True, bare=True, on_record=lambda *a: got.append(a), defer_tilt=True)
    write(pool, 0, loc, *kv(8, 2), ex)  # the same tokens: the same codes and witnesses
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # eager: the fused tilt
    assert torch.equal(got[-1][1].tv_upper_a, eager.tv_upper_a) and not ws.STATE.tilt
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    caplog.set_level(logging.INFO, logger="witcert.sglang")
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    tb = ws.STATE.tilt[2]
    (layer, rec), = ws.STATE.static[2]
    assert layer == 0 and rec.tv_upper_a.untyped_storage().data_ptr() == tb.rec.untyped_storage().data_ptr()
    closed = rec.tv_upper_a.clone()
    assert (closed >= eager.tv_upper_a).all() and (refine == 0 or (closed > eager.tv_upper_a).any())  # tilt left out
    fields = ("tv_upper_a", "out_err_upper", "eps_max", "xi", "rho", "flag")
    for _ in range(2):  # finished by static_records, idempotent
        (layer, rec), = ws.static_records(2)
        for f in fields:
            assert torch.equal(getattr(rec, f), getattr(eager, f)), f
    tv, _ = check(recs, q, pool.k_buffer[0], ex, rows)
    assert (tv <= rec.tv_upper_a.double()).all()
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # a second capture of batch size 2: the same slot
    assert ws.STATE.tilt[2] is tb and len(ws.STATE.static[2]) == 2
    same = ws.STATE.static[2][-1][1].tv_upper_a.untyped_storage().data_ptr() == tb.rec.untyped_storage().data_ptr()
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the buffer again before a finish (layers sharing KV):
    third = ws.STATE.static[2][-1][1]  # its record keeps the tilt in its merge, not the written slot
    assert same and third.tv_upper_a.untyped_storage().data_ptr() != tb.rec.untyped_storage().data_ptr()
    assert torch.equal(third.tv_upper_a, eager.tv_upper_a)
    fused = [r.getMessage() for r in caplog.records if "keeps its tilt in the merge" in r.getMessage()]
    assert fused == ["WitCert: captured decode of layer slot 0 at batch size 2 keeps its tilt in the merge (written "
                     "since the last static_records()): sound, slower than the deferred record"]  # (said once)
    assert torch.equal(ws.static_records(2)[1][1].tv_upper_a, eager.tv_upper_a)
    ws.uninstall()
    with pytest.raises(ValueError, match="Tier A only"):
        ws.install(force=True, bare=True, defer_tilt=True, delta_step=1e-3)
    with pytest.raises(ValueError, match="defer_tilt: expected True or False"):
        ws.install(force=True, bare=True, defer_tilt=1)
