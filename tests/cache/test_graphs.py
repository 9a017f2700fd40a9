"""Graphed decode steps (``witcert.graphs``, ``WitCertCache(cuda_graph=True)``).

In the interpreter (CPU) the static step runs eagerly every step: these tests pin it to the
ungraphed kernel path (same tokens, same meter records, bit for bit, where both use one split),
check its bookkeeping (exact store, counters, growth, crop, padding, a new request) and its
refusals. On the H200 (``WITCERT_DEVICE=cuda``) the same tests capture and replay real graphs.
"""

import os

import numpy as np
import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = pytest.mark.gpu  # in the device run (WITCERT_DEVICE=cuda): docs/testing.md
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from tests.helpers.kernel_gate import MODEL_DTYPE, tiny_llama  # noqa: E402
from witcert.cache import Gate, WitCertCache  # noqa: E402
from witcert.cache_args import defers_tilt  # noqa: E402


def _gen(model, cache, ids, mask=None, new=5, scores=False):
    """Greedy tokens (and, with ``scores``, every step's logits [new, B, V])."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                             past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return (out.sequences, torch.stack(out.logits)) if scores else out.sequences


def _ids(B, n, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (B, n), generator=g).to(DEV)


def _same_records(a, b, exact):
    assert [(r.step, r.layer) for r in a] == [(r.step, r.layer) for r in b]
    for x, y in zip(a, b):
        for f in ("tv_a", "out_err", "flag"):
            if exact:
                assert np.array_equal(getattr(x, f), getattr(y, f)), f
            else:
                assert np.allclose(getattr(x, f), getattr(y, f), rtol=1e-2, atol=1e-6), f
        assert np.all((x.tv_a >= 0) & (x.tv_a <= 1)) and not x.flag.any()


@pytest.mark.parametrize("scheme,window", [("int8", None), ("int8", (2, 5)), ("fp8_e4m3_scaled", None),
                                           ("int4_group", (1, 4))])
def test_graphed_steps_match_the_kernel_path(scheme, window):
    """Same model, scheme, seed: the graphed cache generates the same tokens, records and exact
    store as the ungraphed kernel path (one split each: capacity 64 tokens); with an exact window the
    captured step writes its rings (device index ops) as the eager step does."""
    model = tiny_llama()
    ids = _ids(2, 40)
    ref = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=3, max_tokens=64, window=window)
    gr = WitCertCache(model.config, scheme=scheme, backend="kernel", seed=3, max_tokens=64, cuda_graph=True,
                      window=window)
    t_ref, s_ref = _gen(model, ref, ids, scores=True)
    t_gr, s_gr = _gen(model, gr, ids, scores=True)
    assert gr._graph is not None and gr._graph.st.n0 == 44  # the static step served the decode steps
    assert torch.equal(t_ref, t_gr)
    # every step's logits (each step returns its own, not a stale static output)
    assert not torch.equal(s_gr[1], s_gr[2])
    assert torch.equal(s_ref, s_gr) if DEV == "cpu" else torch.allclose(s_ref, s_gr, atol=5e-2, rtol=5e-2)
    _same_records(ref.records, gr.records, exact=DEV == "cpu")
    assert gr.step == ref.step == 4 and gr.rows_metered == ref.rows_metered == 4
    for la, lb in zip(ref.layers, gr.layers):
        assert torch.equal(la.exact_k, lb.exact_k) and torch.equal(la.exact_v, lb.exact_v)
        assert la.get_seq_length() == lb.get_seq_length() == 44
        if window is not None:  # the rings hold the sinks and the last `recent` tokens, as the eager step wrote them
            sink, recent = window
            cols = lb.win.columns_of(torch.arange(44 - recent, 44, device=lb.win.k.device), 44)
            assert torch.equal(lb.win.k[:, :, cols], lb.exact_k.to(lb.win.k.device)[:, :, 44 - recent:])
            assert torch.equal(la.win.k[:, :, :-1], lb.win.k[:, :, :-1])  # (the last column: the scratch writes land in)
            assert torch.equal(la.win.k_norm[:, :, :-1], lb.win.k_norm[:, :, :-1])
    s = gr.summary()
    assert s["steps"] == 4 and np.all(np.asarray(s["max_tv_a"]) > 0)


@pytest.mark.parametrize("tau", [None, 0.05])
def test_deferred_tilt_gives_the_graphed_records(monkeypatch, tau):
    """``defer_tilt=True`` (the default on a CUDA device): the graphed step's merges skip the tilt and one launch at the step's end finishes
    every layer's (kernels.tilt_batch): the same tokens and the same records as the graphed step with the tilt
    in each layer's merge (the fused Triton merge on both, bit for bit in the interpreter), a left-padded row
    included; and it is refused off the graphed path."""
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")  # (both caches run the fused merge kernel)
    model = tiny_llama()
    ids = _ids(2, 20, seed=7)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    kw = dict(scheme="int8", backend="kernel", seed=3, max_tokens=32, cuda_graph=True, tilt_above=tau)
    ref = WitCertCache(model.config, defer_tilt=False, **kw)
    dt = WitCertCache(model.config, defer_tilt=True, **kw)
    t_ref = _gen(model, ref, ids, mask, new=3)
    t_dt = _gen(model, dt, ids, mask, new=3)
    assert dt._graph is not None and dt._graph.st.tilt is not None and ref._graph.st.tilt is None
    assert torch.equal(t_ref, t_dt)
    a, b = ref.records, dt.records
    _same_records(a, b, exact=DEV == "cpu")
    for x, y in zip(a, b):
        assert np.array_equal(x.parts_pre[2], y.parts_pre[2]) or DEV != "cpu"  # the tilt column
    if tau is None:  # (every row's tilt: the finish launch did tilt rows; at τ 0.05 the closed forms settle these)
        assert any((x.parts_pre[2] < 1).any() for x in b)
    # the default (None): deferred for a graphed step on a CUDA device, not elsewhere nor ungraphed
    assert defers_tilt(None, True, "cuda") and defers_tilt(None, True, torch.device("cuda", 1))
    assert not defers_tilt(None, True, "cpu") and not defers_tilt(None, False, "cuda")
    assert defers_tilt(True, True, "cpu") and not defers_tilt(False, True, "cuda")
    dflt = WitCertCache(model.config, **kw)
    _gen(model, dflt, ids, mask, new=2)
    assert dflt.defer_tilt is None and (dflt._graph.st.tilt is not None) == (DEV == "cuda")
    with pytest.raises(ValueError, match="defer_tilt=True: graphed decode steps only"):
        WitCertCache(model.config, scheme="int8", backend="kernel", defer_tilt=True)
    with pytest.raises(ValueError, match="defer_tilt: expected None, True or False"):
        WitCertCache(model.config, scheme="int8", backend="kernel", cuda_graph=True, defer_tilt=1)


def test_deferred_record_with_channel_weights_on_one_layer_only(monkeypatch):
    """Channel weights on layer 0 only (calibration leaves a layer's weights 1 where it saw no data): layer 0's merge
    stores the excess sums, layer 1's none, into one deferred batch (review, 2026-12-07: the batch refused the second
    layer and ``generate`` raised). The same tokens and records as the step with each layer's record in its merge."""
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    model = tiny_llama()
    w = np.ones((2, 2, 64))
    w[0, :, :4] = 2.0
    ids = _ids(1, 20, seed=7)
    mask = torch.ones_like(ids)
    kw = dict(scheme="int8", backend="kernel", seed=3, max_tokens=32, sketch_bits=0, weights=w, cuda_graph=True)
    ref = WitCertCache(model.config, defer_tilt=False, **kw)
    dt = WitCertCache(model.config, defer_tilt=True, **kw)
    t_ref, t_dt = _gen(model, ref, ids, mask, new=3), _gen(model, dt, ids, mask, new=3)
    assert [layer.paged.has_weights for layer in dt.layers] == [True, False]
    assert dt._graph.st.tilt.exc_cols > 0
    assert torch.equal(t_ref, t_dt)
    _same_records(ref.records, dt.records, exact=DEV == "cpu")


def test_graphed_steps_with_left_padding_and_growth():
    """A left-padded batch (the padding mask is read by the kernel from the static buffer) whose
    cache grows during decoding (a new capture at the new capacity): tokens as the kernel path."""
    model = tiny_llama()
    ids = _ids(3, 30, seed=5)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    mask[2, :3] = 0
    ref = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=32)
    gr = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=32, cuda_graph=True)
    t_ref, s_ref = _gen(model, ref, ids, mask, new=6, scores=True)
    t_gr, s_gr = _gen(model, gr, ids, mask, new=6, scores=True)
    assert torch.equal(t_ref, t_gr)
    assert torch.equal(s_ref, s_gr) if DEV == "cpu" else torch.allclose(s_ref, s_gr, atol=5e-2, rtol=5e-2)
    assert gr.layers[0].block_table.shape[1] * 16 == 64  # grew from 32 to 64 tokens per sequence
    assert gr._graph.st.has_mask and gr._graph.st.mask.shape == (3, 64)
    _same_records(ref.records, gr.records, exact=DEV == "cpu")


def test_a_crop_and_a_new_request_reset_the_static_positions():
    model = tiny_llama()
    gr = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    ref = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64)
    ids = _ids(1, 20)
    for c in (ref, gr):
        _gen(model, c, ids, new=4)
        c.crop(-2)  # 23 → 21 tokens
    assert gr.get_seq_length() == 21
    nxt = ids.new_tensor([[5]])
    with torch.no_grad():
        a = model(nxt, past_key_values=ref, use_cache=True).logits
        b = model(nxt, past_key_values=gr, use_cache=True).logits
    assert torch.equal(a, b) if DEV == "cpu" else torch.allclose(a, b, atol=5e-2)
    assert gr._graph.st.n0 == 22 and gr.get_seq_length() == 22
    gr.reset()
    assert gr._graph is None
    t = _gen(model, gr, _ids(1, 24, seed=9), new=3)
    assert t.shape == (1, 27) and gr._graph.st.n0 == 26


def test_cuda_graph_refusals():
    model = tiny_llama()
    cfg = model.config
    for kw, word in [(dict(gate=Gate("risk-ranked", max_pagein_blocks=1)), "gate"),
                     (dict(scheme="int8_dither", delta_req=1e-3), "delta_req"),
                     (dict(scheme="kivi2"), "kivi2"), (dict(backend="reference"), "reference"),
                     (dict(audit=True), "audit"), (dict(compress_layers=[0]), "compress_layers"),
                     (dict(meter=False), "meter=False"),
                     (dict(scheme="none"), "none"), (dict(cuda_graph=1), "True or False")]:
        kw = {"scheme": "int8", "cuda_graph": True, **kw}
        with pytest.raises(ValueError, match=word):
            WitCertCache(cfg, **kw)


def test_graphed_forward_keeps_generates_argument_checks():
    """The wrapper keeps the forward's signature (generate validates model kwargs against it) and
    passes forwards of other caches through untouched."""
    import inspect

    model = tiny_llama()
    assert "past_key_values" in inspect.signature(model.forward).parameters
    with pytest.raises(ValueError, match="not used by the model"):
        _gen_bad = model.generate(_ids(1, 8), max_new_tokens=2, not_an_argument=3)  # noqa: F841
    # an unmetered forward (no cache) still runs
    with torch.no_grad():
        out = model(_ids(1, 8))
    assert out.logits.shape == (1, 8, 128) and out.logits.dtype == MODEL_DTYPE


def test_beam_search_falls_back_to_eager_steps_and_stays_metered():
    """Beam search reorders the cache every step (new tensors): the request continues on the
    eager kernel path (logged), metered; a reset graphs the next request again."""
    model = tiny_llama()
    gr = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    ref = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64)
    ids = _ids(1, 20)
    outs = []
    for c in (ref, gr):
        with torch.no_grad():
            outs.append(model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=c, max_new_tokens=4,
                                       min_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0))
    assert torch.equal(outs[0], outs[1])
    assert gr._graph_off is not None and gr._graph is None
    assert len(gr.records) == len(ref.records) and all(np.all(r.tv_a > 0) for r in gr.records)
    gr.reset()
    assert gr._graph_off is None
    _gen(model, gr, _ids(1, 20, seed=4), new=3)
    assert gr._graph is not None


def test_a_finished_cache_is_freed():
    """Nothing keeps a dropped cache alive (its exact store is pinned host memory: a reference held
    by the attention dispatch kept a 64 GB store alive on the H200, run I5), not even a reference cycle: it
    is freed when its last reference goes, without the cycle collector."""
    import gc
    import weakref

    model = tiny_llama()
    for graph in (False, True):
        c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=graph)
        _gen(model, c, _ids(1, 20), new=2)
        r = weakref.ref(c)
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()  # freed by reference counting, at once: no cycle (the captured step keeps no output's cache)
        try:
            del c
            assert r() is None
        finally:
            if enabled:
                gc.enable()


def test_a_traced_graphed_cache_traces_what_the_kernel_path_traces():
    """A trace sink on a graphed cache gets every step's records after the replay: the same rows
    as the ungraphed kernel path's trace."""
    from witcert.trace import FIELDS, Tracer

    model = tiny_llama()
    ids = _ids(2, 24)
    traces = []
    for graph in (False, True):
        tr = Tracer(None)
        tr.new_request("r")
        c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=graph,
                         trace=tr)
        _gen(model, c, ids, new=3)
        traces.append(tr.to_trace())
        assert tr.records_seen == 2 * 2  # 2 decode steps × 2 layers, handed over during generation
    for f in FIELDS:
        if f.name not in ("time", "req"):
            a, b = traces[0][f.name], traces[1][f.name]
            if DEV == "cpu" or a.dtype.kind not in "f":
                np.testing.assert_array_equal(a, b, err_msg=f.name)
def _prefill_and_step(model, c, x):
    with torch.no_grad():
        model(x, attention_mask=torch.ones_like(x), past_key_values=c, use_cache=True)
        return model(x[:, -1:], past_key_values=c, use_cache=True).logits  # a (graphed) step


def test_a_mask_of_another_length_with_positional_ids_runs_eagerly():
    """A decode step with input_ids passed positionally and a 2-D mask that is not (B, n + 1)
    falls back to the eager path (it raised TypeError: input_ids given twice)."""
    model = tiny_llama()
    x = _ids(2, 20)
    out = []
    for graph in (False, True):
        c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=graph)
        _prefill_and_step(model, c, x)
        n = c.get_seq_length()
        with torch.no_grad():
            out.append(model(x[:, :1], attention_mask=torch.ones(2, n + 4, dtype=torch.long, device=DEV),
                             past_key_values=c, use_cache=True).logits)
        assert c.step == 2 and c.get_seq_length() == n + 1
    assert torch.equal(out[0], out[1]) if DEV == "cpu" else torch.allclose(out[0], out[1], atol=5e-2)


def test_a_batch_change_inside_a_request_is_refused_before_any_write():
    """As on the eager path: a decode step of another batch size is refused with the cache's own
    error (the static step wrote its slots first: b·capacity + n is past the paged cache for a
    larger batch, validate=False)."""
    model = tiny_llama()
    c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    _prefill_and_step(model, c, _ids(2, 20))
    before = c.layers[0].paged.k_codes.clone()
    for Bn in (1, 3):
        with pytest.raises(ValueError, match="batch size"), torch.no_grad():
            model(_ids(Bn, 1), past_key_values=c, use_cache=True)
    assert torch.equal(before, c.layers[0].paged.k_codes) and c.get_seq_length() == 21


@pytest.mark.parametrize("scenario", ["eager_step_between", "earlier_column_changes"])
def test_every_column_of_the_callers_mask_is_read(scenario):
    """The kernel reads the caller's whole padding mask each step, as the eager path does: a column
    masked by a step that ran eagerly in between (output_hidden_states), or an earlier column the
    caller masks later, is not served from a stale static mask."""
    model = tiny_llama()
    x = _ids(2, 20)
    outs, caches = [], []
    for graph in (False, True):
        c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=graph)
        L = []
        with torch.no_grad():
            model(x, attention_mask=torch.ones_like(x), past_key_values=c, use_cache=True)
            for s in range(4):
                n = c.get_seq_length()
                m = torch.ones(2, n + 1, dtype=torch.long, device=DEV)
                kw = {}
                if scenario == "eager_step_between":
                    if s >= 1:
                        m[0, 21] = 0  # token 21 is padding from the step that wrote it on
                    if s == 1:
                        kw = dict(output_hidden_states=True)  # this step runs eagerly
                elif s >= 2:
                    m[1, 3:9] = 0
                L.append(model(x[:, s:s + 1], attention_mask=m, past_key_values=c, use_cache=True, **kw).logits)
        outs.append(torch.cat(L, 1))
        caches.append(c)
    assert torch.equal(outs[0], outs[1]) if DEV == "cpu" else torch.allclose(outs[0], outs[1], atol=5e-2)
    _same_records(caches[0].records, caches[1].records, exact=DEV == "cpu")


def test_a_capture_belongs_to_its_model():
    """A cache stepped through a second model of the same shapes captures that model's step (a
    replay of the first model's graph would run the first model's weights)."""
    a, b = tiny_llama(seed=0), tiny_llama(seed=1)
    x = _ids(1, 20)
    ref = WitCertCache(a.config, scheme="int8", backend="kernel", seed=1, max_tokens=64)
    gr = WitCertCache(a.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    outs = []
    for c in (ref, gr):
        _prefill_and_step(a, c, x)
        g = c._graph
        with torch.no_grad():
            outs.append(b(x[:, :1], past_key_values=c, use_cache=True).logits)
        if c is gr:
            assert gr._graph is not g  # a new capture, for model b
    assert torch.equal(outs[0], outs[1]) if DEV == "cpu" else torch.allclose(outs[0], outs[1], atol=5e-2)


def test_a_changed_tilt_threshold_takes_a_new_capture():
    """``tilt_above`` is an argument of the captured merge: changing it mid-request captures again
    (the records then follow it, as on the ungraphed path)."""
    model = tiny_llama()
    c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    _prefill_and_step(model, c, _ids(1, 20))
    g = c._graph
    c.tilt_above = 0.5
    with torch.no_grad():
        model(_ids(1, 1), past_key_values=c, use_cache=True)
    assert c._graph is not g and c._graph.key[3] == 0.5


def test_an_audit_switched_on_mid_request_runs_eagerly_and_is_audited():
    """``cache.audit = True`` after construction (bench/serving.py's audited step does it): the
    step leaves the graph and is audited on the kernel path (realised TV, 0 violations)."""
    model = tiny_llama()
    c = WitCertCache(model.config, scheme="int8", backend="kernel", seed=1, max_tokens=64, cuda_graph=True)
    _prefill_and_step(model, c, _ids(1, 20))
    c.audit = True
    with torch.no_grad():
        model(_ids(1, 1), past_key_values=c, use_cache=True)
    last = [r for r in c.records if r.step == c.step]
    assert last and all(r.tv_real is not None and r.audit_violations == 0 for r in last)


def _graphed(model, scheme="int8", seed=3, max_tokens=64, window=(2, 5)):
    return WitCertCache(model.config, scheme=scheme, backend="kernel", seed=seed, max_tokens=max_tokens,
                        cuda_graph=True, window=window)


def test_a_later_request_replays_the_storage_and_capture_of_an_earlier_one():
    """Capture once (issue 35, ``witcert.graph_pool``): a dropped graphed cache's device storage and captured
    step go back to the pool; the next request of its shape adopts the same tensors (no allocation, no
    capture) and returns the tokens, logits and records a request on fresh storage returns, bit for bit, though
    the earlier request was longer and left its values in the tensors."""
    from witcert.graph_pool import POOL

    POOL.clear()
    model = tiny_llama()
    before = POOL.stats()
    a = _graphed(model)
    _gen(model, a, _ids(2, 48, seed=5), new=6)
    ptr = a.layers[0].paged.k_codes.data_ptr()
    del a  # freed at once (no reference cycle): its storage is in the pool
    assert POOL.stats().free == 1
    b = _graphed(model)
    tb, lb = _gen(model, b, _ids(2, 30, seed=7), scores=True)
    assert b.layers[0].paged.k_codes.data_ptr() == ptr  # adopted
    s = POOL.stats()
    assert (s.takes - before.takes, s.fresh - before.fresh) == (1, 1)
    assert s.replays_of_earlier_captures - before.replays_of_earlier_captures == 1
    assert b.summary()["host"]["syncs"].get("graph_capture", 0) == 0  # nothing captured on its path
    rec_b = b.records
    del b
    POOL.clear()
    c = _graphed(model)  # fresh storage
    tc, lc = _gen(model, c, _ids(2, 30, seed=7), scores=True)
    assert POOL.stats().fresh - before.fresh == 2
    assert torch.equal(tb, tc) and torch.equal(lb, lc)
    _same_records(rec_b, c.records, exact=True)


def test_the_pool_never_shares_a_storage_and_keys_it_by_shape_and_dither_seed():
    """A live cache keeps its storage (a second live cache gets another); another batch, capacity or window,
    or a dithered scheme's other seed (the kernels take it as a launch argument a graph would replay), takes
    another storage; a reset gives the storage back and takes it again."""
    from witcert.graph_pool import POOL

    POOL.clear()
    model = tiny_llama()
    a, b = _graphed(model), _graphed(model)
    _gen(model, a, _ids(2, 20), new=2)
    _gen(model, b, _ids(2, 20), new=2)
    assert a.layers[0].paged.k_codes.data_ptr() != b.layers[0].paged.k_codes.data_ptr()
    ptr = a.layers[0].paged.k_codes.data_ptr()
    a.reset()
    _gen(model, a, _ids(2, 24, seed=4), new=2)
    assert a.layers[0].paged.k_codes.data_ptr() == ptr  # its own storage, given back and taken again
    # a's codes held alive: once the pool evicts a's storage, CUDA's caching allocator may hand its address to the
    # next fresh storage (the H100 run of 2026-12-05e did), which a pointer comparison would take for sharing
    keep = a.layers[0].paged.k_codes
    del a, b
    for other in (dict(window=(1, 3)), dict(max_tokens=128)):
        c = _graphed(model, **other)
        _gen(model, c, _ids(2, 20), new=2)
        assert c.layers[0].paged.k_codes.data_ptr() != ptr
        del c
    d = _graphed(model, scheme="int8_dither", seed=11)
    _gen(model, d, _ids(2, 20), new=2)
    keep_d = d.layers[0].paged.k_codes
    pd = keep_d.data_ptr()
    del d
    e = _graphed(model, scheme="int8_dither", seed=12)
    _gen(model, e, _ids(2, 20), new=2)
    assert e.layers[0].paged.seed == 12 and e.layers[0].paged.k_codes.data_ptr() != pd
    assert POOL.stats().free <= POOL.max_free
    assert keep.data_ptr() == ptr and keep_d.data_ptr() == pd


def test_a_request_with_other_key_levels_takes_another_storage():
    """``sketch_box`` fixes the storage's key levels (``PagedKV.head_levels``: one per token or per (token, head)); a
    request asking for per-head levels after a symmetric one freed its storage took that storage and replayed its
    capture (the pool's key missed it until 2026-12-07: the form served was not the one asked for). Now it takes its
    own, and a later symmetric request adopts the first one again; an adopted storage of another variant is refused
    (``WitCertLayer._check_adopted``)."""
    from witcert.graph_pool import POOL

    POOL.clear()
    model = tiny_llama()
    sym = WitCertCache(model.config, scheme="int8", backend="kernel", seed=3, max_tokens=64, cuda_graph=True,
                       window=(2, 5), sketch_box="symmetric")
    _gen(model, sym, _ids(2, 20), new=2)
    keep = sym.layers[0].paged.k_codes
    ptr = keep.data_ptr()
    del sym
    per = WitCertCache(model.config, scheme="int8", backend="kernel", seed=3, max_tokens=64, cuda_graph=True,
                       window=(2, 5), sketch_box="per-head")
    _gen(model, per, _ids(2, 20), new=2)
    assert per.kernel_head_levels and all(layer.paged.head_levels for layer in per.layers)
    assert per.layers[0].paged.k_codes.data_ptr() != ptr
    again = WitCertCache(model.config, scheme="int8", backend="kernel", seed=3, max_tokens=64, cuda_graph=True,
                         window=(2, 5), sketch_box="symmetric")
    _gen(model, again, _ids(2, 20), new=2)
    assert again.layers[0].paged.k_codes.data_ptr() == ptr and not again.layers[0].paged.head_levels
    layer = again.layers[0]
    layer.paged = per.layers[0].paged  # (what a key that misses the levels would hand it)
    with pytest.raises(RuntimeError, match="pooled storage"):
        layer._check_adopted()
    # channel weights all 1 (PagedKV.has_weights False: no weight differs from 1) are adopted, not refused
    cfg = model.config
    ones = np.ones((cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads))
    ptrs = []
    for _ in range(2):
        c = WitCertCache(cfg, scheme="int8", backend="kernel", seed=3, max_tokens=64, cuda_graph=True, window=(2, 5),
                         weights=ones)
        _gen(model, c, _ids(2, 20), new=2)
        ptrs.append(c.layers[0].paged.k_codes.data_ptr())
        del c
    assert ptrs[0] == ptrs[1]
