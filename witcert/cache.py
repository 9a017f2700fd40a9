"""A metered, gated KV cache for Hugging Face transformers (SPEC §1–§6).

    from witcert.cache import WitCertCache, Gate, use_witcert
    use_witcert(model)                         # attn_implementation "witcert" (sdpa base)
    cache = WitCertCache(model.config, scheme="kivi2", gate=Gate("risk-ranked", max_pagein_blocks=2))
    out = model.generate(ids, past_key_values=cache, max_new_tokens=16)
    cache.summary()                            # request-level meter, page-in bytes, flags

Serving semantics (what a paged server does):

* The first forward of a request (prefill into an empty cache) attends over the exact fresh K/V
  with the base attention (``sdpa`` or ``eager``) and writes the cache compressed.
* Every later forward (decode steps, later prefill chunks) writes its K/V compressed first and
  then reads the compressed cache: ``ô = softmax(σ q k̂ᵀ + mask) v̂``, computed in float64 on
  the model's device (the reference path of the kernels), and metered per (layer, query
  head, step) by SPEC §2–§4 (Tier A) and, for ``int8_dither`` with a request budget, §5
  (Tier B): the radii come from the stored witnesses, the rest is ``witcert.meter.measure``
  (``backend="reference"``). With ``backend="kernel"`` (the default on CUDA for an unaudited
  cache with a kernel scheme) the step is one ``kernels.decode.decode`` call per layer on a
  paged copy written by ``kernels.write.write_kv`` (docs/cache.md). Gated, the
  kernel path syncs once per layer step (the gate reads TV⁺ on the host) and, where a row is
  over τ, pages blocks into the layer's ``kernels.repair.RepairOverlay`` and decodes again
  (``WitCertCache._kernel_attention``). With ``cuda_graph=True`` (ungated, per-token kernel
  schemes) a decode step is captured once in a CUDA graph and replayed (``witcert.graphs``; the
  layers then write and decode through its static buffers: ``_update_static``,
  ``_static_attention``).

Storage per layer: ``witcert.cache_layer``. This module is the ``Cache`` protocol, construction and
``use_witcert``; the modules it is split into by concern (docs/cache.md) are re-exported here.

Gate (SPEC §6): ``witcert.gate`` (the policy, block risk, the choice of blocks and the repair
loop, model-free); ``Gate`` is re-exported here. Per (step, layer) the cache hands it whether the
bounds hold per (sequence, kv head), the block risks from its meter, and ``WitCertLayer.page_in``.
Repair is persistent (the block stays exact, later tokens written into it too) and idempotent;
page-in counts and bytes (K + V, model dtype) are accounted per layer and per sequence. On the
kernel path the repaired blocks live in the overlay (``WitCertLayer.rep``: exact K/V of each
repaired (block, kv head) in a pool slot; the write path routes later tokens of a repaired block
there, on the device), not in ``k_hat`` / ``repaired``, which that path does not keep.
"""

from __future__ import annotations

import functools
import logging
import secrets
import weakref

import numpy as np
import torch
from transformers.cache_utils import Cache

from contract.schemes import BLOCK_SCHEMES, SCHEMES
from contract.sketch import DEFAULT_WINDOW, check_bits, check_window

# (the F401 exemptions: names re-exported from the modules this one was split into by concern, issue 34, and
# the names it imported before; ``from witcert.cache import NAME`` keeps working for each)
from . import bounds as B
from . import meter as M  # noqa: F401
from . import schemes as S  # noqa: F401
from .cache_args import (
    _check_cache_weights,
    check_backend,
    check_compress_layers,
    check_cuda_graph,
    check_defer_tilt,
    check_host_pool,
    check_request_args,
    check_seed,
    check_sketch_box,
    check_sketch_layout,
    check_tilt_above,
    default_sketch_bits,
)
from .cache_attention import ServedAttention, _allowed, _base_fn, _make_attention, register  # noqa: F401
from .cache_host import HostStores, host_bytes, reserve_host  # noqa: F401
from .cache_kernel import KernelPath, _kernel_scheme, served_kv, served_sketch  # noqa: F401
from .cache_layer import _ACTIVE, WitCertLayer, _ExactLayer  # noqa: F401
from .cache_reference import (  # noqa: F401
    AUDIT_ABS_TOL,
    METER_LEVELS,
    REFERENCE_UNIT_ROUNDOFF,
    TILT_MAX_ROWS_PER_HEAD,
    ReferencePath,
    _softmax,
)
from .gate import Gate, block_risk, exceeds, repair  # noqa: F401
from .graph_pool import Holder
from .graphs import install
from .hostcost import HostCost, HostReport  # noqa: F401
from .hostpool import HostPool, align, store_bytes  # noqa: F401
from .model import _model_dims, check_supported_config
from .records import GraphedRecords, StepRecord, jsonable  # noqa: F401
from .schemes import QuantContext, get_scheme, quantize, resolve_scheme  # noqa: F401
from .store import ExactStore, append_pair, first_chunk_tokens  # noqa: F401

#: (re-exported) BLOCK_SCHEMES: schemes whose key statistics are taken over a block of tokens,
#: quantized per full block (``contract.schemes``: granularity "block")


#: the exact window of a cache built with ``window="default"`` (``contract.sketch.DEFAULT_WINDOW``: the first 4
#: and the last 64 tokens served exact)
CACHE_DEFAULT_WINDOW = DEFAULT_WINDOW
TIER_B_CAVEAT = "Tier B holds for queries that do not depend on the dither (non-adaptive); Tier A holds always."

log = logging.getLogger("witcert.cache")
_LOGGED_REF: dict = {}  # schemes whose "no kernel: reference path" decision was logged


class WitCertCache(ServedAttention, KernelPath, ReferencePath, HostStores, Cache):
    """See the module docstring. ``scheme``: any registered scheme (``witcert.schemes``);
    ``num_groups`` G and ``witness`` ("token" | "block") choose the witness layout;
    ``delta_req`` with ``schedule`` ("fixed" needs ``horizon`` = the maximum number of metered
    query rows: decode steps plus the rows of later prefill chunks; "anytime") enables Tier B
    for ``int8_dither``: every metered query row spends its own budget δ_step(row), so a
    request spends ≤ δ_req however its rows are chunked. ``seed`` keys the dither; None (the
    default) draws a fresh one per request (``reset()`` draws again), recorded in ``seed``
    and ``summary()``. ``sketch_box``: how the sketch radius is metered, "centred"
    (|δ_j − σ⟨q, r̃_j⟩| ≤ c_h W_j, the centred tilt; reference path only), "symmetric"
    (|δ_j| ≤ c_h (W_j + u_j), u_j the largest over a kv head's query heads: the kernels' default bins),
    "per-head" (|δ_hj| ≤ c_h W_j + |σ⟨q_h, r̃_j⟩|: both paths; the kernels bin one level per (token,
    head), tighter, GQ one-hot dots per tile instead of one) or "auto" (each path its own: centred on the
    reference path; on the kernel path per-head for int4_group / kivi2 / the fp8 schemes, ``contract.schemes``
    ``kernel_head_levels``, symmetric for int8 / int8_dither)."""

    #: the kernel path's gate decodes again only the sequences it repaired (False: the whole
    #: batch; the same rows either way, bit-identical in the interpreter: tests/kernels/test_kernel_gate_cache.py,
    #: ``DecodeOutput.with_rows``)
    REDECODE_ROWS = True

    def __init__(
        self,
        config,
        scheme: str = "int8",
        *,
        meter: bool = True,
        gate: Gate | None = None,
        block_size: int = 16,
        num_groups: int = 1,
        witness: str = "token",
        seed: int | None = None,
        delta_req: float | None = None,
        schedule: str = "anytime",
        horizon: int | None = None,
        audit: bool = False,
        backend: str = "auto",
        max_tokens: int = 8192,  # kernel path: initial capacity per sequence (it grows by doubling)
        tilt_above: float | None = None,  # kernel path: the tilt only where the closed forms exceed it
        trace=None,
        compress_layers=None,
        cuda_graph: bool = False,
        defer_tilt: bool | None = None,
        sketch_bits: int | None = None,
        window="default",
        weights=None,
        host_pool=None,
        sketch_box: str = "auto",
    ):
        scheme = resolve_scheme(scheme)  # an alias of the scheme table (fp8, int4, kivi, auto) → its scheme
        get_scheme(scheme)  # ValueError naming the known schemes
        check_supported_config(config)  # NotImplementedError: attention logit soft-capping (Gemma-2)
        text, L, Hq, Hkv, D, rot = _model_dims(config)
        check_request_args(scheme, gate, meter, block_size, witness, schedule, delta_req, horizon, L, Hq)
        self.config = text
        self.num_layers, self.num_q_heads, self.num_kv_heads, self.head_dim = L, Hq, Hkv, D
        if Hq % Hkv:
            raise ValueError(f"model: {Hq} query heads are not a multiple of {Hkv} kv heads")
        self.scheme, self.meter, self.gate = scheme, bool(meter), gate
        check_seed(seed)
        self.block_size, self.witness = block_size, witness
        self._fixed_seed = seed
        self.seed = self._draw_seed()
        self.num_groups = num_groups
        self.groups = B.group_slices(D, num_groups, rot if rot < D else None, "half")
        self._set_key_radius(sketch_bits, window, weights)
        self.delta_req, self.schedule, self.horizon = delta_req, schedule, horizon
        check_backend(backend, scheme, D, num_groups, witness, block_size, Hq, Hkv)
        self.backend = backend
        # sketch_box: how the sketch radius is metered: "centred" (|δ − σ⟨q, r̃⟩| ≤ c_h W, the centred tilt:
        # tightest; the reference path only), "symmetric" (|δ| ≤ c_h (W + u), u the largest over a kv head's query
        # heads: the kernels' default form), "per-head" (|δ| ≤ c_h W + |σ⟨q_h, r̃⟩| for each head: both paths, the
        # kernels bin one level per (token, head)), "auto" (centred where the reference path meters; where the
        # kernels do, per-head or symmetric by the scheme's kernel_head_levels), "grid" (the centred box unbinned,
        # its tilt on the fixed (t, λ) grid of contract.constants: the reference path only, a one-pass kernel's form)
        self.sketch_box = check_sketch_box(sketch_box, backend, self.sketch_bits, scheme)
        # the kernel path bins one key level per (token, query head): "per-head", or "auto" on a scheme whose
        # kernels default to it (contract.schemes ``kernel_head_levels``: int4_group, kivi2, the fp8 schemes)
        row = SCHEMES.get(scheme)
        self.kernel_head_levels = self.sketch_bits > 0 and (
            sketch_box == "per-head" or (sketch_box == "auto" and row is not None and row.kernel_head_levels))
        self.tilt_above = check_tilt_above(tilt_above)
        self.max_tokens = int(max_tokens)
        self.audit = bool(audit)
        self._new_step_state(L)
        # trace: a sink with .record(rec, cache) (witcert.trace.Tracer, witcert.metrics.PrometheusMetrics,
        # witcert.trace.Tee of several) handed every StepRecord; None: no cost
        self.trace = trace
        # compress_layers: layer indices served compressed and metered; the others are exact,
        # unmetered transformers DynamicLayers (the layer sweep, witcert.sweep)
        self.compress_layers = compress_layers = check_compress_layers(compress_layers, L)
        # cuda_graph: decode steps captured once and replayed (witcert.graphs, docs/cache.md "CUDA graphs")
        check_cuda_graph(cuda_graph, backend=backend, scheme=scheme, gate=gate, delta_req=delta_req, audit=audit,
                         compress_layers=compress_layers, meter=self.meter)
        self.cuda_graph = cuda_graph
        # defer_tilt: a graphed step's meter records take their tilt in one launch for every layer at the step's end
        # (kernels.tilt_batch; the same records): None, the default, defers on a CUDA device (cache_args.defers_tilt)
        self.defer_tilt = check_defer_tilt(defer_tilt, cuda_graph)
        # host_pool: where the exact store's host memory comes from (witcert.hostpool): None, the process-wide
        # pinned HostPool on CUDA (plain per-store memory elsewhere); a HostPool; False, per-store pinned
        # allocation as before the pool. host_cost: what the current request cost the host (summary()["host"])
        check_host_pool(host_pool)
        self.host_pool = host_pool
        self.host_cost = HostCost()
        self._weak = weakref.ref(self)  # what _ACTIVE holds (made once: no allocation per layer step)
        self._static = None  # witcert.graphs.StaticStep while a graphed step runs (or is captured)
        self._graph = None  # witcert.graphs: the captured step and its static buffers
        self._graph_off = None  # why this request's steps are not graphed (None: they are)
        # the kernel path's device storage (witcert.graph_pool): a graphed cache takes it from the process's
        # pool and gives it back when freed or reset, so the next request of its shape replays the same capture
        self._storage = Holder()
        if cuda_graph:
            weakref.finalize(self, self._storage.release)
        super().__init__(layers=[WitCertLayer(self, i) if compress_layers is None or i in compress_layers
                                 else _ExactLayer() for i in range(L)])

    def _set_key_radius(self, sketch_bits, window, weights) -> None:
        """The key radius (SPEC §2 as amended by issue 33, contract.sketch): a ``sketch_bits`` residual sketch
        and channel ``weights`` (the sketch radius ε_hj = c_h (W_j + u_j)); with neither, the group
        Cauchy–Schwarz radius of the G witnesses. The exact ``window``: the first / last tokens served exact
        ("default": ``CACHE_DEFAULT_WINDOW``, read here at call time)."""
        sketch_bits = default_sketch_bits(sketch_bits, self.scheme, self.num_groups, self.witness)
        self.sketch_bits = check_bits(sketch_bits)
        self.window = check_window(CACHE_DEFAULT_WINDOW if isinstance(window, str) and window == "default" else window)
        self.weights = _check_cache_weights(weights, self.num_layers, self.num_kv_heads, self.head_dim, self.scheme)
        self.sketch = self.sketch_bits > 0 or self.weights is not None
        check_sketch_layout(self.sketch, self.num_groups, self.witness)

    def _new_step_state(self, L: int) -> None:
        """The per-request step state of a new cache: counters, records, memos, page-in accounting."""
        self.step = 0
        self.rows_metered = 0  # metered query rows so far (Tier B budget index)
        self._row_range = (0, 0)  # rows of the current forward: (first, count)
        self._records: list[StepRecord] = []
        self._lazy: list = []  # kernel path: meter records still on the device (read on demand)
        self._slots_memo = None  # WitCertLayer._step_slots: this step's token slots, shared by the layers
        self._lens_memo = None  # _kernel_attention: this step's seq_lens tensor, shared by the layers
        self.pagein_blocks = np.zeros((L, 0), dtype=np.int64)
        self.pagein_bytes = np.zeros((L, 0), dtype=np.int64)

    # -- bookkeeping
    def quantized_range(self, n: int) -> tuple[int, int]:
        """Tokens [lo, hi) of a sequence of length ``n`` stored compressed on the reference path: all of
        them, but a block scheme's partial last block (KIVI's residual, exact until the block is full). The
        exact window is applied when the cache is read (``_view``), as the kernel path serves it."""
        if self.scheme in BLOCK_SCHEMES:
            return 0, n // self.block_size * self.block_size
        return 0, n


    def _draw_seed(self) -> int:
        if self._fixed_seed is not None:
            return int(self._fixed_seed)
        s = secrets.randbits(31)
        log.info("WitCertCache: dither seed %d (fresh for this request)", s)
        return s

    def reset(self):
        for layer in self.layers:
            layer.reset()
        self.seed = self._draw_seed()
        self.step = 0
        self.rows_metered = 0
        self._row_range = (0, 0)
        self._records = []
        self._lazy = []
        self._slots_memo = None  # WitCertLayer._step_slots: this step's token slots, shared by the layers
        self._lens_memo = None
        self._static = None
        self._graph = None  # a captured step reads the old layers' tensors: dropped
        self._graph_off = None
        self._storage.release()  # (the layers were reset above: the next request takes a storage again)
        self.pagein_blocks = np.zeros((self.num_layers, 0), dtype=np.int64)
        self.pagein_bytes = np.zeros((self.num_layers, 0), dtype=np.int64)
        self.host_cost.new_request()  # (the layers gave their exact stores back to the pool above)

    def check_metered(self) -> None:
        """Raise if a forward wrote this cache but its attention did not run through the meter
        (the model was not switched with ``use_witcert``): its output would have attended
        to the fresh K/V only, and no record would say so."""
        for layer in self.layers:
            if getattr(layer, "_pending", None) == "served":
                raise RuntimeError(
                    f"WitCertCache: layer {layer.layer_idx}'s attention did not run through the meter: the model "
                    "attends with its own attention function, which sees only the fresh K/V. Call "
                    "witcert.cache.use_witcert(model) before generating with a WitCertCache.")

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # the previous layer (or, at layer 0, the previous forward) must have been metered
        prev = self.layers[layer_idx - 1] if layer_idx > 0 else self.layers[-1]
        if getattr(prev, "_pending", None) == "served":
            self.check_metered()
        if layer_idx == 0 and self._static is None:  # (a graphed step's counters are the runner's)
            if self.layers[0].get_seq_length() > 0:
                self.step += 1
                m = int(key_states.shape[-2])
                self._row_range = (self.rows_metered, m)
                if self.meter:
                    self.rows_metered += m
            if self.pagein_blocks.shape[1] != key_states.shape[0]:
                self.pagein_blocks = np.zeros((self.num_layers, key_states.shape[0]), dtype=np.int64)
                self.pagein_bytes = np.zeros((self.num_layers, key_states.shape[0]), dtype=np.int64)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def use_kernel(self, device, batch: int, dtype: torch.dtype | None = None) -> bool:
        """Whether a layer on ``device`` with a model of ``dtype`` is served by the Triton kernels
        (see ``backend``). On the GPU the kernels' dots run in the model's dtype, so a float32 /
        float64 model stays on the reference path under "auto" and is refused under "kernel"."""
        lowp = dtype is None or dtype in (torch.bfloat16, torch.float16)
        if self.backend == "kernel":
            from kernels import interpret as _kw

            if device.type != "cuda" and not _kw.INTERPRET:
                raise ValueError(f"backend='kernel': this layer's tensors are on {device.type}, where the Triton kernels "
                                 "run only in Triton's interpreter (set TRITON_INTERPRET=1 before importing triton); "
                                 "move the model to CUDA, or use backend='reference'")
            if device.type == "cuda" and not lowp:
                raise ValueError(f"backend='kernel': on the GPU the kernels serve bf16 / fp16 models, this one is {dtype} "
                                 "(its queries would be rounded without being metered); use backend='reference'")
            return True
        if self.backend == "reference" or device.type != "cuda":
            return False
        if not lowp:
            if not _LOGGED_REF.get(("dtype", dtype)):
                log.info("WitCertCache: a %s model on CUDA is served by the fp64 reference path (the kernels' dots run "
                         "in bf16 / fp16)", dtype)
                _LOGGED_REF[("dtype", dtype)] = True
            return False
        if self.scheme == "none" and not self.meter:
            return False  # the pass-through cache: the base attention over the exact K/V, no meter
        from kernels.paged import SUPPORTED_HEAD_DIMS

        why = [reason for bad, reason in (
            (self.scheme == "none", "scheme 'none' with the meter on (lossless: the kernel path serves lossy schemes)"),
            (self.scheme != "none" and not _kernel_scheme(self.scheme), f"scheme {self.scheme!r} has no kernel"),
            (self.head_dim not in SUPPORTED_HEAD_DIMS, f"head dim {self.head_dim} not in {SUPPORTED_HEAD_DIMS}"),
            (self.audit, "audit=True"),
            (self.num_groups != 1, f"num_groups={self.num_groups}"),
            (self.witness != "token", f"witness={self.witness!r}"),
            (self.block_size != 16, f"block_size={self.block_size}"),
            (not self.meter, "meter=False"),
            (not 1 <= self.num_q_heads // self.num_kv_heads <= 8, "GQA group outside 1..8"),
        ) if bad]
        key = (*why, self.gate is not None)
        if why and not _LOGGED_REF.get(key):
            log.info("WitCertCache: served on CUDA by the fp64 reference path under backend='auto' (%s)%s",
                     ", ".join(why), "; it serves the gate too" if self.gate is not None else "")
            _LOGGED_REF[key] = True
        return not why

    def delta_step(self) -> np.ndarray | None:
        """Tier B budget of each query row of the current forward [Lq] (SPEC §5): row r (1-based
        over the request's metered rows) gets δ_req/(L·H·T_max) (fixed) or
        δ_req·6/(π² r²)/(L·H) (anytime), so the request's total stays ≤ δ_req."""
        if self.delta_req is None:
            return None
        r0, m = self._row_range
        rows = range(r0 + 1, r0 + max(m, 1) + 1)
        if self.schedule == "fixed":
            if rows[-1] > self.horizon:
                raise RuntimeError(f"Tier B: query row {rows[-1]} is past the fixed horizon {self.horizon} "
                                   "(the horizon counts metered query rows: decode steps and later prefill chunks)")
            return np.full(len(rows), B.step_budget(self.delta_req, self.num_layers, self.num_q_heads, horizon=self.horizon))
        return np.array([B.step_budget(self.delta_req, self.num_layers, self.num_q_heads, step=r) for r in rows])

    def reorder_cache(self, beam_idx):
        """Beam search: every layer reorders (``WitCertLayer.reorder_cache``), and so do the
        per-sequence page-in counts."""
        super().reorder_cache(beam_idx)
        if self.cuda_graph and self._graph_off is None:
            # every step moves the blocks (new tensors): a capture per step would cost more than it saves
            self._graph_off, self._graph = "beam search reorders the cache every step", None
            log.info("WitCertCache(cuda_graph=True): beam search: the rest of this request is served without graphs")
        self.host_cost.sync("beam_reorder")
        idx = beam_idx.detach().cpu().numpy()
        if self.pagein_blocks.shape[1] == len(idx):
            self.pagein_blocks = self.pagein_blocks[:, idx]
            self.pagein_bytes = self.pagein_bytes[:, idx]

    def summary_json(self) -> dict:
        """``summary()`` in JSON types (``json.dumps`` takes it); ``jsonable(cache.records)`` for the records."""
        return jsonable(self.summary())

    def summary(self) -> dict:
        """Request-level record in plain Python values (lists per sequence, per layer × sequence; floats,
        ints, strings; ``host``: ``HostReport.as_dict()``): maxima of the bounds, flags and page-ins.
        Raises if a forward's attention bypassed the meter (``check_metered``)."""
        self.check_metered()
        recs = self.records
        Bsz = self.pagein_blocks.shape[1]
        out = {
            "scheme": self.scheme,
            "seed": self.seed,
            "steps": len({r.step for r in recs}),
            "metered_rows": self.rows_metered if self.meter else 0,
            "max_tv_a": np.max([r.tv_a.max(-1) for r in recs], axis=0) if recs else np.zeros(Bsz),
            "median_tv_a": np.median([r.tv_a for r in recs], axis=(0, 2)) if recs else np.zeros(Bsz),
            "max_out_err": np.max([r.out_err.max(-1) for r in recs], axis=0) if recs else np.zeros(Bsz),
            "flagged_rows": np.sum([r.flag.sum(-1) for r in recs], axis=0) if recs else np.zeros(Bsz, dtype=np.int64),
            "pagein_blocks": self.pagein_blocks.sum(0),
            "pagein_bytes": self.pagein_bytes.sum(0),
            "pagein_blocks_per_layer": self.pagein_blocks.copy(),
            "pagein_bytes_per_layer": self.pagein_bytes.copy(),
            "host": self.host_report().as_dict(),
        }
        if recs and recs[0].tv_b is not None:
            out["max_tv_b"] = np.max([r.tv_b.max(-1) for r in recs], axis=0)
            # per (layer, head): Σ over the request's rows; summed over layers and heads ≤ δ_req
            out["delta_spent"] = float(sum(r.delta_spent for r in recs if r.layer == 0)) * self.num_layers * self.num_q_heads
            out["tier_b_caveat"] = TIER_B_CAVEAT
        return jsonable(out, finite=False)

    # -- the exact store (its host memory: witcert.cache_host)
    def _open_stores(self, key_states: torch.Tensor, pin: bool) -> tuple[ExactStore, ExactStore]:
        """A layer's (K, V) exact stores for a new request. At the request's first store the pool is asked
        for every layer's K and V of this first forward at once (``HostPool.ensure_free``): a cold pool grows
        in a few large slabs, and a budget that cannot hold them is refused (``HostPoolExhausted``) before
        anything is allocated on the device or written."""
        Bsz, H, m, D = key_states.shape
        pool = self._pool(pin)
        expect = self.max_tokens if pool is not None else None
        if pool is not None and not self.host_cost.admitted:
            stores = sum(1 for la in self.layers if isinstance(la, WitCertLayer))
            tokens = first_chunk_tokens(m, expect)
            need = 2 * stores * align(tokens * Bsz * H * D * key_states.element_size())
            pool.ensure_free(need, self.host_cost, f"this request's exact store ({stores} layers x K and V x {tokens} "
                             f"tokens x {Bsz} sequences x {H} kv heads x {D} x {key_states.element_size()} bytes)")
            self.host_cost.admitted = True
        kw = dict(pin=pin, pool=pool if pool is not None else False, cost=self.host_cost, expect=expect)
        return (ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw), ExactStore(Bsz, H, D, key_states.dtype, "cpu", **kw))

    def metered_sketch_box(self, kernel: bool) -> str:
        """The sketch box the ``kernel`` (else the reference) path meters: "centred", "grid", "per-head" or "symmetric"
        (without a sketch every form is the symmetric one; "grid" without one: the symmetric box on the grid)."""
        if kernel:
            return "per-head" if self.kernel_head_levels else "symmetric"
        if self.sketch_box == "grid":
            return "grid"
        if self.centred_box:
            return "centred"
        return "per-head" if self.sketch_bits > 0 and self.sketch_box == "per-head" else "symmetric"

    @property
    def _store_type(self) -> type:
        """The exact store's class, read here at call time (``WitCertLayer``'s checks of its store; tests
        substitute ``witcert.cache.ExactStore``)."""
        return ExactStore

    @property
    def records(self) -> list[StepRecord]:
        """Per (forward step, layer) meter records. The kernel path keeps them on the device
        until they are read here (one host transfer then, none per decode step)."""
        if self._lazy:
            lazy, self._lazy = self._lazy, []
            for args in lazy:
                if isinstance(args, GraphedRecords):
                    self._records.extend(args.records(self))
                else:
                    self._records.append(self._kernel_record(*args))
        return self._records

    def _emit(self, rec: StepRecord) -> None:
        """Keep a step's meter record and hand it to the trace sink, if any."""
        self.records.append(rec)
        if self.trace is not None:
            self.trace.record(rec, self)


def _check_new_request(module, args, kwargs):
    """Forward pre-hook of ``use_witcert``: refuse, before anything is written, a forward that
    starts a new request on a cache still holding an earlier one's tokens.

    transformers' ``generate`` takes ``input_ids`` on a non-empty cache as the cached prefix plus
    new tokens and feeds only ``input_ids[:, n:]`` (n = the cached length), with positions from the
    attention mask. A fresh prompt of length L on a cache of n tokens is then fed whole at
    positions 0 … (L = n), or as nothing (L < n: an empty forward), or as its last L − n tokens at
    positions L − (n − L) … (n/2 < L ≤ n), or as nothing (L ≤ n/2: an empty forward), or as its
    last L − n tokens at positions n … (L > n: indistinguishable here from a continuation). While
    the cache holds tokens, these are refused: a forward with no tokens; a 2-D attention mask
    shorter than the cached plus the new tokens (it cannot describe the keys attention would
    read); 2-D position ids whose every row starts at 0, or, without a mask (``generate`` drops an
    all-ones mask: no padding, so positions are token indices), below n. A continuation
    (multi-turn: the full history plus the new turn) starts at position n and passes; so does a
    forward without position ids (the model numbers its tokens from n)."""
    cache = kwargs.get("past_key_values")
    if not isinstance(cache, WitCertCache):
        return None
    n = cache.get_seq_length()
    if n == 0:
        return None
    x = kwargs.get("input_ids", args[0] if args else None)
    if x is None:
        x = kwargs.get("inputs_embeds")
    fix = ("Call cache.reset() before reusing a WitCertCache for a new request (to continue the same "
           "request, pass the full history: the cached tokens followed by the new ones).")
    if x is not None and x.dim() >= 2 and x.shape[1] == 0:
        raise ValueError(f"WitCertCache: the cache holds {n} tokens of an earlier request and this forward has no "
                         f"new tokens (generate drops the first {n} of input_ids as already cached): a new prompt on "
                         f"a used cache. " + fix)
    mask = kwargs.get("attention_mask")
    if x is not None and isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] < n + x.shape[1]:
        raise ValueError(f"WitCertCache: the cache holds {n} tokens of an earlier request, but the attention mask "
                         f"covers {mask.shape[-1]} tokens, fewer than those plus the {x.shape[1]} new ones: the input "
                         f"does not continue the cached sequence (a new prompt on a used cache). " + fix)
    pos = kwargs.get("position_ids")
    if isinstance(pos, torch.Tensor) and pos.dim() == 2 and pos.numel():
        p0 = pos[:, 0]
        cache.host_cost.sync("new_request_check")
        if bool((p0 == 0).all()) or (mask is None and bool((p0 < n).all())):
            raise ValueError(f"WitCertCache: the cache holds {n} tokens of an earlier request and this forward starts "
                             f"at position {int(p0.min())}, not after them (a fresh prompt): its tokens would be "
                             f"appended after the old ones and attend to them. " + fix)
    return None


#: ``model.generate(..., cache_implementation=CACHE_IMPLEMENTATION, cache_config={...})`` after ``use_witcert``
#: builds ``WitCertCache(model.config, **cache_config)`` for the call (transformers validates its own names
#: against a fixed tuple, so the name is taken before ``generate`` sees it)
CACHE_IMPLEMENTATION = "witcert"


def _accept_cache_implementation(model) -> None:
    """Wrap ``model.generate`` (an instance attribute, once) so that ``cache_implementation="witcert"``
    builds a fresh ``WitCertCache`` per call from ``cache_config`` (the cache's keyword arguments)."""
    if getattr(model.generate, "_witcert_cache_impl", False):
        return
    orig = model.generate

    @functools.wraps(orig)
    def generate(*args, **kwargs):
        if kwargs.get("cache_implementation") == CACHE_IMPLEMENTATION:
            kwargs.pop("cache_implementation")
            opts = kwargs.pop("cache_config", None) or {}
            if not isinstance(opts, dict):
                raise ValueError(f"cache_config: expected a dict of WitCertCache arguments, got {type(opts).__name__}")
            if kwargs.get("past_key_values") is not None:
                raise ValueError("generate: pass cache_implementation='witcert' or past_key_values, not both")
            kwargs["past_key_values"] = WitCertCache(model.config, **opts)
            log.info("generate: cache_implementation='witcert' → WitCertCache(%s)", opts)
        return orig(*args, **kwargs)

    generate._witcert_cache_impl = True
    model.generate = generate


def use_witcert(model, base: str = "sdpa"):
    """Switch ``model`` to the witcert attention (``base``: the attention used for prefill and
    when the cache is off: "sdpa" or "eager"), and refuse a new prompt on a used cache
    (``_check_new_request``). Returns the model."""
    if base not in ("sdpa", "eager"):
        raise ValueError(f"base: expected 'sdpa' or 'eager', got {base!r}")
    check_supported_config(model.config)  # NotImplementedError: attention logit soft-capping (Gemma-2)
    register()
    model.set_attn_implementation("witcert" if base == "sdpa" else "witcert_eager")
    if getattr(model, "_witcert_reuse_hook", None) is None:
        model._witcert_reuse_hook = model.register_forward_pre_hook(_check_new_request, with_kwargs=True)
    _accept_cache_implementation(model)
    return install(model, WitCertCache)  # WitCertCache(cuda_graph=True): decode steps captured and replayed
