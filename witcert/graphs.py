"""Graphed decode steps: a metered ``WitCertCache(..., cuda_graph=True)`` decode step captured once
in a CUDA graph and replayed (docs/cache.md, "CUDA graphs"; issue 11).

    use_witcert(model)                                   # installs the forward wrapper (``install``)
    cache = WitCertCache(model.config, "int8", cuda_graph=True)
    model.generate(ids, past_key_values=cache, max_new_tokens=256)

Why: a metered decode step is host-bound (three Triton launches and their Python per layer
step, bench/SERVING.md), so its cost is Python, not GPU work. A replayed step costs one graph
launch for the whole model, plus the runner's host work after it (a device copy of the staging
buffer, two asynchronous copies per layer into the exact store on the host pool's side stream with
one event for the step, the record's copy).

What makes the step capturable (everything a replay reads is at a fixed address, nothing on the
host depends on the data):

* ``StaticStep``: the step's inputs (token ids, positions) are copied into static tensors before a
  replay; the write positions, physical slots and sequence lengths of the new token live in device
  tensors that the captured step itself advances by one (``_advance``) — so one replay is exactly
  one decode step; the padding mask is a [B, capacity] device tensor (its new column copied in
  before each replay); the split count comes from the table's capacity, not the length.
* the exact backing store (pinned host memory) cannot be written by a graph at a moving address:
  the step stages each layer's new K / V in a static device buffer and the runner appends it to
  the store after the replay (``_after_step``: from a device copy of the buffer, which the next
  replay overwrites, asynchronous copies on ``witcert.hostpool``'s side stream, no host sync).
* the meter's record columns are copied into a static [L, 6, B, Hq] buffer; the runner keeps a
  device copy per step (``GraphedRecords``), read when ``cache.records`` is.
* a capture is tied to the layers' tensors: it is made again (and logged) when the batch, the
  capacity (the paged cache grows by doubling), the tensors (``reset``, beam reorder) or the input
  signature change. The first step of each capture runs eagerly through the same static code (it
  is a real step: it compiles the kernels' variants and is what the step returns), then the graph
  is captured and serves the steps that follow.
* capture once (issue 35): the layers' tensors and the capture are kept with the cache's pooled storage
  (``witcert.graph_pool``): when the cache is freed or reset they go back to the process's pool and the
  next request of the same shape adopts them, replaying the capture without making one.

Not graphed (refused at construction, ``WitCertCache``): gates (host decisions every step),
Tier B (its budget changes every step), block schemes (kivi2), audits, exact layers. A trace sink
is handed each step's records after the replay (one device-to-host transfer per step).
Off CUDA (the interpreter) the static code runs eagerly every step, which is how the tests pin it
to the ungraphed kernel path.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging

import torch

from contract.schemes import BLOCK_SCHEMES

from .cache_args import defers_tilt
from .graph_pool import POOL
from .records import GraphedRecords
from .store import append_group

log = logging.getLogger("witcert.graphs")



@dataclasses.dataclass
class StaticStep:
    """The static tensors of a graphed decode step (B sequences, L layers, capacity C tokens)."""

    n0: int  # the cached length the device positions describe (host mirror)
    seq: torch.Tensor  # [B] int64: sequence ids
    pos: torch.Tensor  # [B] int32: the new token's position (n0)
    slots: torch.Tensor  # [B] int64: its physical slot (identity block tables: b·C + n0)
    lens: torch.Tensor  # [B] int32: the lengths after the write (n0 + 1)
    mask: torch.Tensor  # [B, C] bool: padding mask (True = attend)
    has_mask: bool
    splits: int
    stage: torch.Tensor  # [L, 2, B, Hkv, D] model dtype: the new K / V for the exact store
    rec: torch.Tensor  # [L, 6, B, Hq] float64: the meter record columns
    inputs: dict  # name → static input tensor (input_ids, position_ids, cache_position)
    tilt: object = None  # kernels.tilt_batch.TiltBatch (``defer_tilt``): the layers' records, finished at the end

    def fill(self, n0: int, layer) -> None:
        """Set the device positions from the host's length (a new capture, a crop); the slots are
        ``kernels.write.token_slots`` of ``layer``'s table (every layer's is the identity layout, so
        ``_advance``'s +1 stays on it)."""
        from kernels.write import token_slots

        self.pos.fill_(n0)
        self.lens.fill_(n0 + 1)
        self.slots.copy_(token_slots(layer.paged, layer.block_table, self.seq, self.pos, validate=False))
        self.n0 = n0


def _advance(st: StaticStep) -> None:
    """Inside the captured step, after the model: the next step writes one token further."""
    st.pos.add_(1)
    st.lens.add_(1)
    st.slots.add_(1)


@dataclasses.dataclass
class _Graph:
    key: tuple
    st: StaticStep
    graph: object  # torch.cuda.CUDAGraph, or None off CUDA (the static code then runs eagerly)
    out: object  # the captured step's output (its logits tensor is static)
    refs: tuple  # the layers' tensors the capture read (kept alive: their ids are in the key)
    request: int = 0  # the pooled storage's request count it last served (witcert.graph_pool; 0: the cache's own)


def _layers(cache):
    return [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]


def _key(cache, B, kwargs, has_mask, orig):
    layers = _layers(cache)
    sig = tuple(sorted((k, tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else (k, repr(v))
                       for k, v in kwargs.items() if k not in ("past_key_values", "attention_mask")))
    # tilt_above and defer_tilt are read when the step is captured (the merge's arguments): a change takes a new
    # capture
    return (id(orig), B, has_mask, cache.tilt_above, cache.defer_tilt, sig,
            tuple((id(layer.paged), id(layer.block_table), id(layer.win)) for layer in layers))


def _why_not(cache, args, kwargs) -> str | None:
    """Why this forward is not a graphable decode step of ``cache`` (None: it is)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if cache.audit or cache.gate is not None or cache.delta_req is not None or cache.scheme in BLOCK_SCHEMES:
        return "audit / gate / Tier B / a block scheme set on the cache after construction (host work every step)"
    if args[1:]:
        return "positional arguments beyond input_ids"
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] != 1:
        return "not a one-token decode step"
    if kwargs.get("inputs_embeds") is not None:
        return "inputs_embeds"
    if kwargs.get("output_attentions") or kwargs.get("output_hidden_states"):
        return "attentions / hidden states requested"
    if kwargs.get("return_dict") is False:
        return "return_dict=False"
    if kwargs.get("labels") is not None:
        return "labels (a loss: the graphed step returns logits)"
    if kwargs.get("use_cache") is False:
        return "use_cache=False"
    layers = cache.layers
    if not layers or not all(getattr(layer, "is_initialized", False) and getattr(layer, "paged", None) is not None
                             for layer in layers):
        return "the cache's layers are not on the kernel path (see the 'served by the reference path' log)"
    if layers[0].get_seq_length() == 0:
        return "the first forward of a request (prefill)"
    if any(layer.device != ids.device for layer in layers):
        return "the cache's layers are not all on the input's device (a model split over devices)"
    if ids.shape[0] != layers[0]._batch():  # the eager path raises (cache.reset() between requests)
        return "a batch size other than the cached request's"
    am = kwargs.get("attention_mask")
    if am is not None and (not isinstance(am, torch.Tensor) or am.dim() != 2):
        return "an attention mask that is not a 2-D padding mask"
    return None


_LOGGED: dict = {}


def _log_once(key, msg, *a, level=logging.INFO):
    if not _LOGGED.get(key):
        log.log(level, msg, *a)
        _LOGGED[key] = True


def step(orig, cache, args, kwargs):
    """One decode step of ``cache`` through its captured graph (captured at need); falls back to
    ``orig`` (logged) where the step is not graphable."""
    why = _why_not(cache, args, kwargs)
    if why is not None:
        if cache.layers and cache.layers[0].get_seq_length() > 0:  # a prefill is expected, not news
            _log_once(("fallback", why), "WitCertCache(cuda_graph=True): forward run eagerly: %s", why)
        return orig(*args, **kwargs)
    kwargs = dict(kwargs)
    if args:
        kwargs["input_ids"] = args[0]
    ids = kwargs["input_ids"]
    B = ids.shape[0]
    layers = cache.layers
    n0 = layers[0].get_seq_length()
    for layer in layers:  # grow before the step: a capture reads fixed tensors
        layer.ensure_capacity(n0 + 1)
    capacity = layers[0].block_table.shape[1] * cache.block_size
    if kwargs.get("position_ids") is None:  # as the model numbers them (from the cached length), but static
        kwargs["position_ids"] = torch.full((B, 1), n0, dtype=torch.long, device=ids.device)
    am = kwargs.pop("attention_mask", None)
    if am is not None and am.shape != (B, n0 + 1):
        _log_once(("mask", tuple(am.shape)), "WitCertCache(cuda_graph=True): a %s attention mask for %d cached + 1 "
                  "new tokens: forward run eagerly", tuple(am.shape), n0)
        return orig(**dict(kwargs, attention_mask=am))  # input_ids is in kwargs now
    # the padding mask: read by the kernel whenever the caller passes one (all ones costs a byte per
    # token; deciding "no padding" once would miss a later masked column without a host sync per step)
    has_mask = am is not None
    store = cache._storage.storage  # the pooled storage (witcert.graph_pool) when every layer's tensors are its
    store = store if store is not None and store.complete(layers) else None
    g = cache._graph if store is None else store.graph
    if g is not None and g.key == _key(cache, B, kwargs, has_mask, orig):
        st = g.st
        if store is not None and g.request != store.requests:  # captured by an earlier request: no capture now
            _reused(store, g, B, capacity)
            cache._graph = g
        if st.n0 != n0:  # a crop moved the length
            st.fill(n0, layers[0])
        if am is not None:  # the whole mask (a device copy, no sync): the caller may change earlier columns,
            st.mask[:, : n0 + 1].copy_(am)  # and an eager step in between wrote none of them
        _inputs(st, kwargs)
        if g.graph is not None:
            g.graph.replay()
            out = g.out
        else:
            out = _run(orig, cache, st, kwargs)
    else:
        cache._graph = None  # the old capture's memory goes first
        if store is not None:
            store.graph = None
        st = _static(cache, B, capacity, n0, am, has_mask, kwargs)
        _inputs(st, kwargs)
        out = _run(orig, cache, st, kwargs)  # a real step (eager): compiles what the capture will launch
        graph = None
        if ids.is_cuda:
            graph, gout = _capture(orig, cache, st, kwargs)
            if graph is None:
                cache.cuda_graph = False  # logged in _capture; this cache serves eagerly from now on
                _after_step(cache, st)
                return type(out)(logits=out.logits.clone(), past_key_values=cache)
        else:
            gout = out
            _log_once("eager", "WitCertCache(cuda_graph=True) off CUDA: the static decode step runs eagerly "
                      "(no graph)")
        # the output without its past_key_values (the cache: held here it would keep the cache alive, and a pooled
        # step's would be an earlier request's); its logits tensor is the captured step's static one
        g = _Graph(key=_key(cache, B, kwargs, has_mask, orig), st=st, graph=graph, out=type(gout)(logits=gout.logits),
                   refs=(orig, *((layer.paged, layer.block_table, layer.win) for layer in layers)))
        cache._graph = g
        if store is not None:  # kept with the storage too: the next request of this shape replays it
            g.request = store.requests
            store.graph = g
    _after_step(cache, st)
    return type(out)(logits=out.logits.clone(), past_key_values=cache)


def _reused(store, g, B: int, capacity: int) -> None:
    """Count (once per request) a replay of a step an earlier request captured on this pooled storage."""
    g.request = store.requests
    POOL.reused_captures += 1
    log.info("WitCertCache(cuda_graph=True): replaying the decode step an earlier request captured (batch %d, "
             "capacity %d tokens): no capture on this request's path", B, capacity)


def _static(cache, B, capacity, n0, am, has_mask, kwargs) -> StaticStep:
    from kernels.plan import plan_decode

    layer = cache.layers[0]
    dev = layer.device

    mask = torch.ones(B, capacity, dtype=torch.bool, device=dev)
    if am is not None:
        mask[:, : n0 + 1].copy_(am.bool())
    plan = plan_decode(layer.paged, B, cache.num_q_heads, layer.dtype, dev, capacity)
    st = StaticStep(
        n0=n0, seq=torch.arange(B, device=dev), pos=torch.empty(B, dtype=torch.int32, device=dev),
        slots=torch.empty(B, dtype=torch.int64, device=dev), lens=torch.empty(B, dtype=torch.int32, device=dev),
        mask=mask, has_mask=has_mask,
        splits=plan.num_splits,
        stage=torch.zeros(len(cache.layers), 2, B, cache.num_kv_heads, cache.head_dim, dtype=layer.dtype, device=dev),
        rec=torch.zeros(len(cache.layers), len(GraphedRecords.FIELDS), B, cache.num_q_heads, dtype=torch.float64,
                        device=dev),
        inputs={k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)},
    )
    if defers_tilt(cache.defer_tilt, True, dev):
        from kernels.tilt_batch import TiltBatch

        st.tilt = TiltBatch.allocate(layers=len(cache.layers), rows=B * cache.num_q_heads, nb=plan.hist_columns,
                                     device=dev)
    st.fill(n0, layer)
    log.info("WitCertCache(cuda_graph=True): capturing the decode step (batch %d, capacity %d tokens, %d splits, "
             "padding mask %s)", B, capacity, st.splits, has_mask)
    return st


def _inputs(st: StaticStep, kwargs) -> None:
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and k in st.inputs:
            st.inputs[k].copy_(v)


def _run(orig, cache, st: StaticStep, kwargs):
    """The static decode step (eagerly, or under capture): the model's forward with the static
    inputs, no attention mask (the kernel reads ``st.mask``), then ``_advance``."""
    kw = dict(kwargs)
    kw.update(st.inputs)
    kw["attention_mask"] = None
    cache._static = st
    if st.tilt is not None:  # a new step writes every layer's slot (an earlier step cut short left some marked)
        st.tilt.written.clear()
    try:
        out = orig(**kw)
    finally:
        cache._static = None
    if st.tilt is not None:  # every layer's tilt in one launch, then their record columns (kernels.tilt_batch)
        _finish_records(cache, st)
    _advance(st)
    return out


def _finish_records(cache, st: StaticStep) -> None:
    """``defer_tilt``: the step's tilt for every layer (one launch), then ``st.rec``'s columns from the batch."""
    from kernels.epilogue import RECORD_COLUMNS

    st.tilt.finish(tilt_above=cache.tilt_above)
    L, _, B, Hq = st.rec.shape
    for i, f in enumerate(GraphedRecords.FIELDS):
        src = st.tilt.flag.to(torch.float64) if f == "flag" else st.tilt.rec[:, :, RECORD_COLUMNS[f].value]
        st.rec[:, i].copy_(src.view(L, B, Hq))


def _capture(orig, cache, st, kwargs):
    dev = st.seq.device
    cache.host_cost.sync("graph_capture")  # (and torch.cuda.graph's own synchronize / empty caches)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.device(dev), torch.cuda.graph(graph):
            gout = _run(orig, cache, st, kwargs)
    except Exception as e:  # noqa: BLE001 — logged, and the cache serves eagerly (sound either way)
        log.warning("WitCertCache(cuda_graph=True): capturing the decode step failed (%s: %s); this cache serves "
                    "its decode steps eagerly", type(e).__name__, e)
        torch.cuda.synchronize(dev)
        return None, None
    return graph, gout


def _after_step(cache, st: StaticStep) -> None:
    """The host side of one graphed step: the exact store's appends from the staging buffer
    (asynchronous), the step counters, and the step's record (a device copy)."""
    cache.step += 1
    cache._row_range = (cache.rows_metered, 1)
    cache.rows_metered += 1
    # every layer's K and V in one group (one completion event). On CUDA from a copy of the staging buffer
    # (one device copy): the pool's side stream reads it while the next replay overwrites the buffer
    stage = st.stage.clone() if st.stage.is_cuda else st.stage
    append_group([(store, stage[li, j][:, :, None]) for li, layer in enumerate(cache.layers)
                  for j, store in enumerate((layer._ek, layer._ev))])
    st.n0 += 1
    recs = GraphedRecords(step=cache.step, rec=st.rec.clone())
    if cache.trace is None:
        cache._lazy.append(recs)
    else:  # a trace sink reads every record now: one transfer per step (the ungraphed path: one per layer step)
        cache.host_cost.sync("records")
        for rec in recs.records(cache):
            cache._emit(rec)


def install(model, cache_type: type):
    """Route ``model``'s forward through ``step`` when its cache is a ``cache_type`` (``WitCertCache``,
    passed by ``witcert.cache.use_witcert``: this module sits below it) with ``cuda_graph=True`` (an
    instance attribute wrapping the class's forward; its signature is kept, so ``generate`` validates
    its arguments as before). Idempotent."""
    if getattr(model.forward, "_witcert_graphs", False):
        return model
    orig = model.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        if isinstance(cache, cache_type) and cache.cuda_graph and cache._graph_off is None:
            return step(orig, cache, args, kwargs)
        return orig(*args, **kwargs)

    forward._witcert_graphs = True
    forward.__signature__ = inspect.signature(orig)
    model.forward = forward
    return model
