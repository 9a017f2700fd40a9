"""Issue 36: the deferred records of a batch size (``install(defer_tilt=True)``) are sized in SGLang's capture-mode
warm-up, not inside the capture.

SGLang's decode runner runs each batch size's forward twice eagerly under its process-global capture-mode flag, then
captures it. Sized inside the capture (what the adapter did before 2026-12-07), ``TiltBatch.allocate``'s seven fills
were recorded into the graph and ran again on every replay (run J1, written and not yet run, is to measure what
that cost the one-layer benchmark).
Now an eager metered call under that flag sizes them, and the capture right after finds them. A capture that still
has to size them (no warm-up under the flag) says so. Also here: the cap on the batch sizes that defer, and a KV
buffer captured twice at one batch size (several graphs of it) said. The capture is simulated (``_capturing`` answers True), as in
``test_sglang_pool.py``; real sglang==0.5.23 pool classes, Triton interpreter.
"""

import importlib.util
import logging
import types

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
import witcert.integrations.sglang_decode as sd  # noqa: E402
from tests.helpers.sglang_pool import (  # noqa: E402
    _clean,  # noqa: E402, F401  (the autouse fixture)
    decode,
    kv,
    write,
)
from tests.integrations.test_sglang_pool import _two_rows_decoded  # noqa: E402


def _capture_mode(monkeypatch, on: bool):
    mod = types.ModuleType(sd._CAPTURE_MODE_MODULE)
    mod.get_is_capture_mode = lambda: on
    monkeypatch.setitem(__import__("sys").modules, sd._CAPTURE_MODE_MODULE, mod)


def _deferred_install(monkeypatch, caplog, **install):
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    pool, ex, recs, loc, q, rows = _two_rows_decoded()
    eager = recs[0][1]
    ws.uninstall()
    ws.install(force=True, bare=True, on_record=lambda *a: None, defer_tilt=True, **install)
    write(pool, 0, loc, *kv(8, 2), ex)
    caplog.set_level(logging.INFO, logger="witcert.sglang")
    return pool, q, rows, eager


def test_warmup_in_capture_mode_sizes_the_records_outside_the_capture(monkeypatch, caplog):
    """An eager call sizes nothing; one under SGLang's flag sizes the batch once; the capture after takes a slot of
    that batch (no in-capture sizing said) and its finished record equals the eager fused one."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)
    _capture_mode(monkeypatch, False)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # eager, not a warm-up: nothing sized
    assert not ws.STATE.tilt
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the warm-up: sized, the record still the fused one
    tb = ws.STATE.tilt[2]
    assert tb.rows == 2 * q.shape[1] and tb.layers == len(ws.STATE.layers) and not tb.written
    assert not ws.STATE.static  # (an eager call: its record went to on_record)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the second warm-up: the same batch, not sized again
    assert ws.STATE.tilt[2] is tb
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the capture: the slot of the batch sized before
    (layer, rec), = ws.STATE.static[2]
    assert ws.STATE.tilt[2] is tb and rec.tv_upper_a.untyped_storage().data_ptr() == tb.rec.untyped_storage().data_ptr()
    (layer, rec), = ws.static_records(2)
    assert (rec.tv_upper_a == eager.tv_upper_a).all()
    msgs = [r.getMessage() for r in caplog.records]
    assert not [m for m in msgs if "inside a CUDA-graph capture" in m]
    assert msgs.count("WitCert: deferred records for batch size 2 sized to 1 layer slots") == 1


def test_capture_without_warmup_sizes_inside_and_says_so(monkeypatch, caplog):
    """No warm-up under the flag: the capture sizes the batch (sound, the same record) and warns, once."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    assert 2 in ws.STATE.tilt and len(ws.STATE.static[2]) == 1
    (layer, rec), = ws.static_records(2)
    assert (rec.tv_upper_a == eager.tv_upper_a).all()
    warned = [r for r in caplog.records if "inside a CUDA-graph capture" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING and "batch size 2" in warned[0].getMessage()


def test_no_sizing_without_deferral(monkeypatch):
    """Without ``defer_tilt`` a warm-up under the flag sizes nothing (no records are deferred)."""
    pool, ex, recs, loc, q, rows = _two_rows_decoded()  # (installed without defer_tilt)
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    assert not ws.STATE.tilt and len(recs) == 2


def test_batches_above_defer_max_batch_keep_the_fused_tilt(monkeypatch, caplog):
    """``install(defer_max_batch=1)``: batch size 2 is sized neither in the warm-up nor in the capture; its captured
    record keeps the tilt in its merge (the eager record, bit for bit), said once with the memory it would take."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog, defer_max_batch=1)
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the warm-up
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the capture
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    assert not ws.STATE.tilt
    recs = ws.static_records(2)
    assert len(recs) == 2 and all(torch.equal(r.tv_upper_a, eager.tv_upper_a) for _, r in recs)
    said = [r.getMessage() for r in caplog.records if "defer_max_batch=1" in r.getMessage()]
    assert len(said) == 1 and "every layer at batch size 2" in said[0], said
    assert f"would hold {sd._tilt_bytes(2, q.shape[1], 1) / 2**20:.2f} MiB a layer" in said[0], said
    assert not [r for r in caplog.records if "inside a CUDA-graph capture" in r.getMessage()]


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "32"])
def test_defer_max_batch_is_checked(bad):
    with pytest.raises(ValueError, match="defer_max_batch: expected an int >= 1"):
        ws.install(force=True, bare=True, defer_tilt=True, defer_max_batch=bad)


def test_first_warmup_before_the_other_layers_wrote_is_sized_again(monkeypatch, caplog):
    """SGLang's first warm-up meters layer 0 before layer 1 has written (registered) its buffer: the records sized
    then have one slot, and layer 1's call in that pass sizes nothing (only the first registered layer's call sizes:
    once a pass, not once a layer). The second pass, with both registered, sizes them again at layer 0, so the capture
    defers both layers; once a capture holds a slot, a warm-up no longer resizes (the captured records are views into
    it)."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)  # (layer 0 written)
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # the first pass
    first = ws.STATE.tilt[2]
    assert first.layers == 1
    loc = torch.arange(0, 8)
    write(pool, 1, loc, *kv(8, 3))
    decode(pool.k_buffer[1], pool.v_buffer[1], q, rows)
    assert ws.STATE.tilt[2] is first
    for layer in (0, 1):  # the second pass
        decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    tb = ws.STATE.tilt[2]
    assert tb.layers == 2
    sized = [r.getMessage() for r in caplog.records if "sized to" in r.getMessage()]
    assert sized == ["WitCert: deferred records for batch size 2 sized to 1 layer slots",
                     "WitCert: deferred records for batch size 2 sized to 2 layer slots"], sized
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    for layer in (0, 1):
        decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    assert [lid for lid, _ in ws.STATE.static[2]] == [0, 1]
    assert all(r.tv_upper_a.untyped_storage().data_ptr() == tb.rec.untyped_storage().data_ptr()
               for _, r in ws.STATE.static[2])
    assert not [r for r in caplog.records if "keeps its tilt in the merge" in r.getMessage()]
    monkeypatch.setattr(sd, "_capturing", lambda q: False)
    monkeypatch.setitem(ws.STATE.layers, -1, ws.STATE.layers[pool.k_buffer[1].data_ptr()])  # a third side
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # a warm-up after the capture: not resized
    assert ws.STATE.tilt[2] is tb


#: torch ops that launch no GPU kernel (allocations and views): all a captured metered call may issue besides its two
#: Triton launches, once its batch's records were sized in the warm-up
NO_KERNEL_OPS = {"empty", "view", "_unsafe_view", "select", "slice", "alias", "t", "unbind", "detach", "expand",
                 "unsqueeze", "as_strided", "lift_fresh"}


@pytest.mark.parametrize("warmup", [True, False])
def test_captured_call_launches_nothing_but_its_kernels(monkeypatch, caplog, warmup):
    """What the capture records: every torch op of the captured call logged (a ``TorchDispatchMode`` over
    ``_tilt_slot`` and ``metered_decode``, the decode and merge Triton launches stubbed; ops on 0-d tensors only,
    the host's scalar arithmetic, left out). Sized in the warm-up, the
    call issues allocations and views only; sized inside the capture, ``TiltBatch.allocate``'s seven fills (five
    zeros, one ones, the excess columns' -1) are recorded too: what every replay ran again before 2026-12-07."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    import kernels.decode as Dk
    import kernels.epilogue as E

    class _Log(TorchDispatchMode):
        ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen = [x for x in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(x, torch.Tensor)]
            if any(x.dim() > 0 for x in seen):  # (0-d: scalar host arithmetic, e.g. tau_bracket's float32 bracket)
                _Log.ops[func.overloadpacket.__name__] += 1
            return out

    def logged(fn):
        def call(*a, **k):
            with _Log():
                return fn(*a, **k)
        return call

    class _NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)
    _capture_mode(monkeypatch, warmup)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)  # eager (the view built; sized if a warm-up)
    assert (2 in ws.STATE.tilt) == warmup
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    monkeypatch.setattr(Dk, "_decode_kernel", _NoLaunch())
    monkeypatch.setattr(E, "_merge_meter_kernel", _NoLaunch())
    monkeypatch.setattr(sd, "_tilt_slot", logged(sd._tilt_slot))
    monkeypatch.setattr(sd, "metered_decode", logged(sd.metered_decode))
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    assert len(ws.STATE.static[2]) == 1 and sum(_Log.ops.values()) > 0  # (the log saw the call)
    kernels = collections.Counter({op: n for op, n in _Log.ops.items() if op not in NO_KERNEL_OPS})
    assert kernels == (collections.Counter() if warmup else collections.Counter(zeros=5, ones=1, fill_=1)), kernels


def test_deferred_record_bytes_are_what_the_docs_say():
    """docs/sglang.md and ``install``'s docstring cite 621 bytes per query head, layer and request (the finish's
    float64 scratch, 1,280 bytes more, is taken per finish): this pins the figure they quote."""
    assert sd._tilt_bytes(1, 1, 1) == 621
    assert sd._tilt_bytes(32, 32, 32) == 621 * 32 * 32 * 32 == 20_348_928  # (docs: 20 MB at batch 32, Llama-8B)


def test_above_the_cap_said_once_while_layers_register(monkeypatch, caplog):
    """Above the cap the warm-up says once per batch size that it keeps the tilt fused, however many layers register
    during the first pass (the figure is per layer, so it does not change with them)."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog, defer_max_batch=1)
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q, rows)
    write(pool, 1, torch.arange(0, 8), *kv(8, 3))
    for layer in (1, 0, 1):
        decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    for layer in (0, 1):
        decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    said = [r for r in caplog.records if "defer_max_batch=1" in r.getMessage()]
    assert len(said) == 1 and not ws.STATE.tilt and len(ws.STATE.static[2]) == 2


def test_an_empty_batch_in_the_warmup_is_served_unmetered(monkeypatch, caplog):
    """A batch of no request, in the warm-up under the capture-mode flag or in a capture, sizes nothing (no records of 0
    rows: ``TiltBatch.allocate`` refuses them) and falls back to SGLang's kernel, counted, as it does without the flag
    (an adversarial review, 2026-12-07: both raised; ``_unmeterable`` now says so before any metering step)."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)
    _capture_mode(monkeypatch, True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q[:0], [])
    assert not ws.STATE.tilt and ws.STATE.unmetered_counts()["decode: an empty batch"] == 1
    monkeypatch.setattr(sd, "_capturing", lambda q: True)
    decode(pool.k_buffer[0], pool.v_buffer[0], q[:0], [])
    assert not ws.STATE.tilt and not ws.STATE.static and ws.STATE.unmetered_counts()["decode: an empty batch"] == 2


def test_a_buffer_captured_again_at_a_batch_size_is_said(monkeypatch, caplog):
    """SGLang 0.5.23 captures several graphs of one batch size (its LoRA / no-LoRA and attention variants) and may
    recapture: ``static_records`` then lists every capture's records, of which a replay rewrites only its own graph's.
    The second capture of a KV buffer at a batch size says so, once (an adversarial review, 2026-12-07); other layers
    and batch sizes say nothing."""
    pool, q, rows, eager = _deferred_install(monkeypatch, caplog)
    write(pool, 1, torch.arange(0, 8), *kv(8, 3))
    monkeypatch.setattr(sd, "_capturing", lambda q: True)

    def again():
        return [r for r in caplog.records if "captured again" in r.getMessage()]

    for layer in (0, 1):
        decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    decode(pool.k_buffer[0], pool.v_buffer[0], q[:1], rows[:1])  # another batch size
    assert not again()
    for _ in range(2):  # the second graph of batch size 2, twice over
        for layer in (0, 1):
            decode(pool.k_buffer[layer], pool.v_buffer[layer], q, rows)
    assert len(again()) == 1 and "batch size 2" in again()[0].getMessage()
    assert [lid for lid, _ in ws.static_records(2)] == [0, 1] * 3
