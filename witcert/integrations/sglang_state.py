"""The process-wide state of WitCert's SGLang patch (``witcert.integrations.sglang``), below every module of
the patch: its logger, the SGLang signatures the wrappers rely on, the per-buffer witness side buffers
(``LayerSide``), the patch's ``State`` and its one instance ``STATE``, and ``_Skip`` (a call or write the
meter does not serve)."""

from __future__ import annotations

import collections
import dataclasses
import logging

import torch

log = logging.getLogger("witcert.sglang")

#: the leading parameters each wrapper relies on (checked on the installed functions)
DECODE_PARAMS = ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse",
                 "num_kv_splits", "max_kv_splits", "sm_scale", "k_scale", "v_scale", "logit_cap", "sinks",
                 "xai_temperature_len", "has_mla", "use_pdl", "page_size", "score_mod")
POOL_PARAMS = ("self", "layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale")


class _Skip(Exception):
    """A call or write the meter does not serve (the reason is the message)."""


#: ``install(defer_max_batch=)``'s default: SGLang's graph batch sizes up to 32 (1, 2, 4, 8, 12, 16, 24, 32 by
#: default) defer their records' tilt, about 63 MB of records together for Llama-8B (621 bytes per query head,
#: layer and request). Larger batches keep the tilt in the merge: 9.5-10 µs more per layer call at B 8 (run I3: the
#: fused merge 16.3 µs against the deferred 6.8-7.2; 14 % of the call's kernels at 4K, 3 % at 32K); not measured above
#: B 8
DEFER_MAX_BATCH = 32


@dataclasses.dataclass
class LayerSide:
    """Side buffers of one layer, indexed like SGLang's pool: [slot, kv_head, 1, ·]."""

    layer_id: int  # the model's (global) layer id: records, traces and the exact store
    k_wit: torch.Tensor
    v_wit: torch.Tensor
    v_norm: torch.Tensor
    k_norm: torch.Tensor
    group_id: torch.Tensor
    dtype: torch.dtype  # the pool's logical dtype (its buffers may be stored as uint8)
    ours: object = None  # kernels.paged.PagedKV when a scheme of ours serves the attention
    #: the last ``paged_view`` of SGLang's buffers and its key (buffer pointers, shapes, scales):
    #: rebuilt only when one changes (no per-call allocation / host transfer)
    view: object = None
    view_key: tuple | None = None
    #: 0-dim bool on the device: the view's (k_scale, v_scale) are not the witnesses' (``scale_t``); None: no
    #: recorded write yet (every slot unmetered anyway)
    view_scale_bad: torch.Tensor | None = None
    #: ``kernels.unmetered.UnmeteredSlots`` the metered decode hands the kernel (``bad`` and, for a view of SGLang's
    #: buffers, ``view_scale_bad``): built with the view (``sglang_decode.paged_view``)
    view_unmetered: object = None
    #: [slot] bool: no witness vouches for the slot (never written through a recorded write, or
    #: changed since by a path that does not record: sglang_pool); a row reading one gets TV⁺ = 1
    bad: torch.Tensor | None = None
    buffer: torch.Tensor | None = None  # the K buffer this side describes (kept alive: its address is the key)
    #: [2] float32 on the device: the (k_scale, v_scale) the witnesses were taken against (the first
    #: recorded write's); a write with other scales leaves its slots unmetered, a decode with other
    #: scales saturates its rows (both compared on the device: no host synchronisation)
    scale_t: torch.Tensor | None = None
    #: 0-dim int64 on the device: recorded writes whose scales were not ``scale_t`` (``State.unmetered_counts``)
    mismatched: torch.Tensor | None = None
    #: (k_wit, v_wit, v_norm, k_norm, bad) with one more row than the pool (the last, ``trash``): the record
    #: step sends the rows a ``dcp_kv_mask`` masks out there instead of selecting the others (a boolean index
    #: is a host synchronisation); the fields above are views of their first ``trash`` rows
    rows: tuple | None = None
    trash: int = 0


@dataclasses.dataclass
class State:
    scheme: str = "sglang"  # "sglang": meter SGLang's own stored values; else one of OUR_SCHEMES
    num_groups: int = 1
    delta_step: float | None = None
    layers: dict = dataclasses.field(default_factory=dict)  # k_buffer data_ptr -> LayerSide (never a layer id)
    by_buffer: dict = dataclasses.field(default_factory=dict)  # k_buffer data_ptr -> the side's layer id
    records: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=4096))
    unmetered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    on_record: object = None
    # trace / metrics export (module doc "Trace and metrics")
    trace: object = None  # a sink with .record(rec, cache): Tracer, PrometheusMetrics, Tee
    flush_every: int = 64
    pending: list = dataclasses.field(default_factory=list)  # records still on the device
    steps: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # layer -> metered calls
    source: object = None  # TraceSource: what the sink sees as the "cache"
    # the gate (module doc "Gate")
    gate: object = None
    exact_store: object = None
    gate_log: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=256))
    gate_rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: batch size → [(layer id, MeterRecord)] of the metered calls captured in CUDA graphs (``static_records``)
    static: dict = dataclasses.field(default_factory=dict)
    #: ``install(defer_tilt=True)``: a captured call's record skips the tilt; ``static_records`` finishes every
    #: captured layer's in one launch (``kernels.tilt_batch``); batch size → its TiltBatch
    defer_tilt: bool = False
    #: the largest batch size whose captured calls defer (``install(defer_max_batch=)``)
    defer_max_batch: int = DEFER_MAX_BATCH
    tilt: dict = dataclasses.field(default_factory=dict)
    #: batch sizes whose TiltBatch a capture took a slot of (a warm-up no longer resizes it)
    tilt_used: set = dataclasses.field(default_factory=set)
    #: what was logged since ``install`` (once each): (batch size, layer slot, reason) of a fused-tilt fallback,
    #: (batch size, "again") of a KV buffer captured twice
    fused_logged: set = dataclasses.field(default_factory=set)
    #: batch size → the K buffers (data pointers) its captured calls read
    captured_buffers: dict = dataclasses.field(default_factory=dict)

    def unmetered_counts(self) -> collections.Counter:
        """``unmetered`` plus the writes whose scales differed from their buffer's first recorded write
        (counted on the device by the record step: reading them here synchronises)."""
        out = collections.Counter(self.unmetered)
        n = sum(int(side.mismatched) for side in self.layers.values() if side.mismatched is not None)
        if n:
            out["write: k_scale/v_scale differ from the buffer's earlier writes"] += n
        return out

    def emit(self, layer_id, rec):
        if self.on_record is not None:
            self.on_record(layer_id, rec)
        else:
            self.records.append((layer_id, rec))


STATE = State()
