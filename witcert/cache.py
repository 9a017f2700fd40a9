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
  over τ, pages blocks into the layer's ``kernels.paged.RepairOverlay`` and decodes again
  (``WitCertCache._kernel_attention``). With ``cuda_graph=True`` (ungated, per-token kernel
  schemes) a decode step is captured once in a CUDA graph and replayed (``witcert.graphs``; the
  layers then write and decode through its static buffers: ``_update_static``,
  ``_static_attention``).

Storage per layer (B sequences, Hkv kv heads, n tokens, head dim D, G groups):

    exact_k, exact_v  [B, Hkv, n, D]  model dtype: the exact backing store (pinned host memory
                                      when the model is on CUDA); written once per token, never
                                      by serving or repair
    k_hat, v_hat      [B, Hkv, n, D]  float32 on the model's device: what attention reads
    k_wit             [B, Hkv, n, G]  float64 ≥ ‖(k̂_j − k_j)[g]‖ (per token; ``witness="block"``
                                      meters with the maximum over each block of T tokens)
    v_wit             [B, Hkv, n]     float64 ≥ ‖v̂_j − v_j‖
    k_scale           [B, Hkv, n]     int8_dither key scales (Tier B)
    repaired          [B, Hkv, nblk]  bool: block paged in (exact, witnesses 0)

Schemes whose key statistics span a block of tokens (``kivi2``) quantize a block when it is
full; until then its tokens stay exact (KIVI's full-precision residual), with witness 0.

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

import dataclasses
import functools
import logging
import math
import os
import secrets
import sys
import threading
import weakref
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

from contract.schemes import BLOCK_SCHEMES, KERNEL_SCHEME_IDS, SCHEMES
from contract.sketch import DEFAULT_SKETCH_BITS, DEFAULT_WINDOW, check_bits, check_window

from . import bounds as B
from . import meter as M
from . import schemes as S
from .gate import Gate, block_risk, exceeds, repair
from .hostcost import HostCost, HostReport
from .hostpool import HostPool, align, store_bytes
from .model import check_supported_config
from .schemes import QuantContext, get_scheme, quantize, resolve_scheme
from .store import ExactStore, append_pair, first_chunk_tokens

#: (re-exported) BLOCK_SCHEMES: schemes whose key statistics are taken over a block of tokens,
#: quantized per full block (``contract.schemes``: granularity "block")


def _check_cache_weights(weights, L: int, Hkv: int, D: int, scheme: str):
    """The sketch radius's channel weights as a float64 [L, Hkv, D] array of powers of two, or None
    (all 1): from a ``witcert.calibrate.Calibration`` or an array of that shape."""
    if weights is None:
        return None
    from .calibrate import Calibration, check_weights

    if isinstance(weights, Calibration):
        if weights.scheme != scheme:
            log.warning("weights: calibrated for scheme %s, used with %s (sound with any weights; maybe looser)",
                        weights.scheme, scheme)
        weights = weights.weights
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.shape != (L, Hkv, D):
        raise ValueError(f"weights: expected [{L} layers, {Hkv} kv heads, {D}] for this model, got shape {w.shape}")
    check_weights(w)
    return w


def _kernel_scheme(scheme: str) -> bool:
    """A scheme the kernel path serves: implemented by the kernels and lossy (``none`` with the
    meter on is served by the reference path)."""
    row = SCHEMES.get(scheme)
    return row is not None and row.kernel_supported and row.lossy
#: the exact window of a cache built with ``window="default"`` (``contract.sketch.DEFAULT_WINDOW``: the first 4
#: and the last 64 tokens served exact)
CACHE_DEFAULT_WINDOW = DEFAULT_WINDOW
#: levels the tilt bound rounds radii up onto: 0 and 2^-14 … 16 with ratio 2^(1/4) (any set of
#: levels is sound, SPEC §3(c); radii above 16 use the row maximum, where every bound is ≈ 1)
METER_LEVELS = np.concatenate([[0.0], 2.0 ** (np.arange(-56, 17) / 4.0)])
#: query rows per forward above which only the closed forms (a), (b) are computed (long prefill
#: chunks); decode steps always get min(tanh, e-form, tilt)
TILT_MAX_ROWS_PER_HEAD = 4
#: absolute tolerance of the audit (fp64 evaluation of both exact and served attention)
AUDIT_ABS_TOL = 1e-12
TIER_B_CAVEAT = "Tier B holds for queries that do not depend on the dither (non-adaptive); Tier A holds always."
#: unit roundoff of the reference path's served logits (float64): ``witcert.bounds.dot_rounding_radius``
REFERENCE_UNIT_ROUNDOFF = M.FP64_UNIT_ROUNDOFF

log = logging.getLogger("witcert.cache")
_LOGGED_REF: dict = {}  # schemes whose "no kernel: reference path" decision was logged

#: the cache whose layer wrote last on this thread, for the attention function (a weak reference: a
#: strong one kept a finished request's cache — its pinned exact store, ~64 GB by arithmetic at Llama-8B /
#: B 8 / 32K — alive until the next request wrote, and the device machine ran out of host memory, run I5)
_ACTIVE = threading.local()


@dataclasses.dataclass
class StepRecord:
    """Meter of one (forward step, layer): arrays [B, Hq] (maxima over the step's query rows)."""

    step: int
    layer: int
    tv_a: np.ndarray  # Tier A TV⁺ after repair
    tv_a_pre: np.ndarray  # before repair
    out_err: np.ndarray  # E⁺_V (Tier A) after repair
    tv_b: np.ndarray | None  # Tier B TV⁺ (int8_dither with delta_req), after repair
    flag: np.ndarray  # bool: not certified (gate budget spent) or non-finite inputs
    nonfinite: np.ndarray  # bool: saturated because of NaN/Inf
    pagein_blocks: np.ndarray  # [B, Hkv] blocks paged in at this step
    delta_step: float | np.ndarray | None = None  # Tier B budget per query row of this forward
    delta_spent: float | None = None  # Σ over the forward's query rows: what each (layer, head) spent
    parts_pre: np.ndarray | None = None  # [3, B, Hq] tanh / e-form / tilt before repair
    tv_b_pre: np.ndarray | None = None
    tv_real: np.ndarray | None = None  # audit=True: realised TV against exact attention
    out_err_real: np.ndarray | None = None
    audit_violations: int = 0  # rows where realised > bound (must stay 0)


def jsonable(obj, finite: bool = True):
    """``obj`` with numpy arrays / scalars, tensors and dataclasses turned into plain Python (lists,
    floats, ints, bools, dicts); ``finite``: non-finite floats become None (JSON). For ``summary()``
    (plain, ``finite=False``: an infinite bound stays inf), ``summary_json()`` and ``StepRecord``s."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name), finite) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v, finite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, finite) for v in obj]
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), finite)
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if (math.isfinite(float(obj)) or not finite) else None
    return obj


def _model_dims(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    Hq = text.num_attention_heads
    Hkv = getattr(text, "num_key_value_heads", None) or Hq
    D = getattr(text, "head_dim", None) or text.hidden_size // Hq
    L = text.num_hidden_layers
    rp = getattr(text, "rope_parameters", None) or {}
    frac = rp.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0)) if isinstance(rp, dict) else 1.0
    rot = int(D * frac)
    return text, L, Hq, Hkv, D, rot - rot % 2


def host_bytes(config, batch: int, tokens: int, dtype=torch.bfloat16) -> int:
    """Host pool bytes of one request's exact store (every layer's K and V) for a model of ``config``:
    ``batch`` sequences of ``tokens`` tokens (pass the cache's ``max_tokens``: prompt + new tokens)."""
    _, L, _, Hkv, D, _ = _model_dims(config)
    return store_bytes(L, Hkv, D, batch, tokens, dtype)


def reserve_host(config, batch: int, tokens: int, dtype=torch.bfloat16, pool: HostPool | None = None) -> int:
    """Pin, now, what a request of ``batch`` x ``tokens`` tokens' exact store needs (``host_bytes``) in
    ``pool`` (default: the process-wide ``HostPool``): call it at start-up, off the request path. The bytes
    added (0 when the pool already had them free, or without a pool: ``WITCERT_HOST_POOL=off``)."""
    pool = pool if pool is not None else HostPool.default()
    return 0 if pool is None else pool.reserve(host_bytes(config, batch, tokens, dtype))


@dataclasses.dataclass
class GraphedRecords:
    """The meter of one graphed decode step (``witcert.graphs``), kept on the device until
    ``records`` is read: ``rec`` [L, len(FIELDS), B, Hq] float64 (``WitCertCache._static_attention``)."""

    #: the MeterRecord fields a graphed step keeps, in ``rec``'s column order (the flag as 0 / 1)
    FIELDS = ("tv_upper_a", "out_err_upper", "flag", "tanh", "eform", "tilt")

    step: int
    rec: torch.Tensor

    def records(self, cache) -> list:
        """One StepRecord per layer, built by ``WitCertCache._kernel_record`` as the ungraphed
        kernel path's (one host transfer for the step)."""
        r = self.rec.cpu()
        col = dict(zip(self.FIELDS, r.unbind(1)))
        col["flag"] = col["flag"] > 0
        return [cache._kernel_record(self.step, li, SimpleNamespace(tv_upper_b=None, **{k: v[li] for k, v in col.items()}),
                                     None, r.shape[2]) for li in range(r.shape[0])]


class WitCertLayer(CacheLayerMixin):
    """One layer's storage (see the module docstring). Created by ``WitCertCache``."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, owner: "WitCertCache", layer_idx: int):
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self._pending = None

    # -- transformers' layer API
    def lazy_initialization(self, key_states, value_states) -> None:
        o = self.owner
        self.dtype, self.device = key_states.dtype, key_states.device
        Bsz, H, _, D = key_states.shape
        if H != o.num_kv_heads or D != o.head_dim:
            raise ValueError(f"layer {self.layer_idx}: keys [B, {H}, n, {D}] do not match the cache's model "
                             f"({o.num_kv_heads} kv heads, head dim {D}); a WitCertCache belongs to one model")
        # scheme "none" with the meter off stores nothing compressed: the exact store is what
        # attention reads, so it stays on the model's device (as in transformers' DynamicLayer)
        passthrough = o.scheme == "none" and not o.meter
        z = lambda *s, dt, dev: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        if passthrough:
            self._ek = z(Bsz, H, 0, D, dt=self.dtype, dev=self.device)
            self._ev = z(Bsz, H, 0, D, dt=self.dtype, dev=self.device)
        else:  # the backing store: host memory (pinned on CUDA: the process's HostPool), async appends
            self._ek, self._ev = o._open_stores(key_states, pin=self.device.type == "cuda")
        # what attention reads: float32 holds every bf16 / fp16 / fp32 value exactly; a float64
        # model keeps float64 (an unmetered cast to float32 would be a silent error)
        self.served_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.k_hat = z(Bsz, H, 0, D, dt=self.served_dtype, dev=self.device)
        self.v_hat = z(Bsz, H, 0, D, dt=self.served_dtype, dev=self.device)
        self.k_wit = z(Bsz, H, 0, o.num_groups, dt=torch.float64, dev=self.device)
        self.v_wit = z(Bsz, H, 0, dt=torch.float64, dev=self.device)
        self.k_scale = z(Bsz, H, 0, dt=torch.float32, dev=self.device)
        # the residual sketch r̃ of each served token (0 where served exact), reference path only
        self.k_sk = z(Bsz, H, 0, D, dt=torch.float64, dev=self.device) if o.sketch_bits else None
        self.repaired = torch.zeros(Bsz, H, 0, dtype=torch.bool, device=self.device)
        self.n_quantized = 0
        self.paged = None
        self.rep = None  # kernel path, gated: the repaired pages (kernels.paged.RepairOverlay)
        self.win = None  # kernel path: the exact window's rings (kernels.paged.ExactWindow)
        if o.use_kernel(self.device, Bsz, self.dtype):
            from kernels.paged import PagedKV, RepairOverlay

            per_seq = -(-o.max_tokens // o.block_size)
            self.paged = PagedKV.allocate(Bsz * per_seq, H, D, scheme=o.scheme, block_size=o.block_size, num_groups=1,
                                          per_token_witness=True, model_dtype=self.dtype, device=self.device,
                                          seed=o.seed, layer=self.layer_idx, with_exact=False, sketch_bits=o.sketch_bits,
                                          weights=None if o.weights is None else torch.from_numpy(o.weights[self.layer_idx]))
            self.block_table = torch.arange(Bsz * per_seq, dtype=torch.int32, device=self.device).view(Bsz, per_seq)
            # the overlay: the gate's repaired pages, and a block scheme's partial last page (held exact)
            if o.gate is not None or o.scheme in BLOCK_SCHEMES:
                self.rep = RepairOverlay.allocate(Bsz * per_seq, H, o.block_size, D, self.dtype,
                                                  device=self.device).bind(self.paged)
            if sum(o.window):  # the exact window's rings (kernels.paged.ExactWindow)
                from kernels.paged import ExactWindow

                self.win = ExactWindow.allocate(Bsz, H, D, self.dtype, *o.window, device=self.device)
        self.is_initialized = True

    @property
    def exact_k(self) -> torch.Tensor:
        """The exact keys written so far [B, Hkv, n, D], after every pending asynchronous append has
        landed (``ExactStore.wait``: a host sync on CUDA when one is pending; a copy when the store
        spans chunks). Not for the hot path (``_exact(lo, hi)`` reads a window)."""
        return self._ek.ready() if isinstance(self._ek, ExactStore) else self._ek

    @property
    def exact_v(self) -> torch.Tensor:
        return self._ev.ready() if isinstance(self._ev, ExactStore) else self._ev

    # transformers' layer attributes ``keys`` / ``values``: the exact K / V [B, Hkv, n, D], read on
    # demand (a chunked store's tokens are gathered then; nothing is built per layer step). The base
    # class assigns them (None at init / reset): ignored, the store is the truth.
    @property
    def keys(self):
        return self.exact_k if getattr(self, "is_initialized", False) else None

    @keys.setter
    def keys(self, value) -> None:
        pass

    @property
    def values(self):
        return self.exact_v if getattr(self, "is_initialized", False) else None

    @values.setter
    def values(self, value) -> None:
        pass

    def _exact(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact (K, V) of tokens lo..hi [B, Hkv, hi − lo, D], after pending appends have landed."""
        if isinstance(self._ek, ExactStore):
            return self._ek.read(lo, hi), self._ev.read(lo, hi)
        return self._ek[..., lo:hi, :], self._ev[..., lo:hi, :]

    def _batch(self) -> int:
        return self._ek.shape[0]

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return len(self._ek) if isinstance(self._ek, ExactStore) else self._ek.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        for st in (getattr(self, "_ek", None), getattr(self, "_ev", None)):
            if isinstance(st, ExactStore):
                st.release()  # its memory back to the host pool (kept pinned) for the next request
        self.is_initialized = False
        self.keys = self.values = None
        self._pending = None

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: sequence b continues from sequence ``beam_idx[b]``. Every per-sequence
        store is copied (exact, served, witnesses, repairs; the kernel path's blocks), so the
        meter keeps reading each beam's own tokens."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self.device).long()
        if isinstance(self._ek, ExactStore):
            self._ek.reorder(idx)
            self._ev.reorder(idx)
        else:
            self._ek, self._ev = self._ek.index_select(0, idx), self._ev.index_select(0, idx)
        for name in ("k_hat", "v_hat", "k_wit", "v_wit", "k_scale", "repaired"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        if self.k_sk is not None:
            self.k_sk = self.k_sk.index_select(0, idx)
        if self.paged is not None:
            Bsz, per_seq = self.block_table.shape
            self.paged = self.paged.reordered(Bsz, per_seq, idx)
            if self.rep is not None:
                self.rep = self.rep.reordered(Bsz, per_seq, idx).bind(self.paged)
            if self.win is not None:
                self.win = self.win.select(idx)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens (transformers' convention: a negative
        count; assisted / speculative decoding rolls back rejected tokens). The served store,
        witnesses and the exact store shrink together; a block scheme's partial block returns
        to exact (KIVI's residual), so what stays is metered as before."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop: pass a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        n = self.get_seq_length()
        n1 = max(0, n + int(tokens_to_remove))
        if isinstance(self._ek, ExactStore):
            self._ek.crop(n1)
            self._ev.crop(n1)
        else:
            self._ek, self._ev = self._ek[..., :n1, :], self._ev[..., :n1, :]
        o = self.owner
        T = o.block_size
        if self.paged is not None and o.scheme in BLOCK_SCHEMES:
            # kernel path: held pages past the new end are given back
            per_seq = self.block_table.shape[1]
            self.rep.release_held(sorted({b for (b, _) in self.rep.held if b % per_seq >= -(-n1 // T)}))
        if self.paged is not None and o.scheme in BLOCK_SCHEMES and n1 % T:
            # the new partial last page is served exact again (held; its tokens from the exact store),
            # unless it is held or repaired already
            p = n1 // T
            lo = p * T
            ek, ev = self._exact(lo, n1)
            self.rep.hold(self._page_blocks(p), ek.to(self.device), ev.to(self.device))
        if self.win is not None and n1 > 0:  # the recent window moved back onto tokens the ring no longer holds
            lo = max(0, n1 - self.win.recent)
            ek, ev = self._exact(lo, n1)
            Bsz, H = ek.shape[:2]
            m = n1 - lo
            self.win.write(torch.arange(Bsz, device=self.device).repeat_interleave(m),
                           torch.arange(lo, n1, device=self.device).repeat(Bsz),
                           ek.to(self.device).transpose(1, 2).reshape(Bsz * m, H, -1),
                           ev.to(self.device).transpose(1, 2).reshape(Bsz * m, H, -1), n1)
        if self.k_hat.shape[-2] > n1:
            self.k_hat, self.v_hat = self.k_hat[..., :n1, :], self.v_hat[..., :n1, :]
            self.k_wit, self.v_wit, self.k_scale = self.k_wit[..., :n1, :], self.v_wit[..., :n1], self.k_scale[..., :n1]
            if self.k_sk is not None:
                self.k_sk = self.k_sk[..., :n1, :]
            self.repaired = self.repaired[..., : -(-n1 // T)]
            # tokens back inside the window (or a partial block) are served exact again
            lo, end = o.quantized_range(n1)
            keep = min(max(end, 0), self.n_quantized)
            a, b = max(keep, lo), min(self.n_quantized, n1)
            if a < b:
                ek, ev = self._exact(a, b)
                self.k_hat[..., a:b, :] = ek.to(self.device, self.served_dtype)
                self.v_hat[..., a:b, :] = ev.to(self.device, self.served_dtype)
                self.k_wit[..., a:b, :] = 0
                self.v_wit[..., a:b] = 0
                self.k_scale[..., a:b] = 0
                if self.k_sk is not None:
                    self.k_sk[..., a:b, :] = 0
            self.n_quantized = keep

    # -- writes
    def update(self, key_states, value_states, *args, **kwargs):
        o = self.owner
        if o._static is not None:  # a decode step of the graphed runner (witcert.graphs)
            return self._update_static(o._static, key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != self._batch() or key_states.dtype != self.dtype:
            raise ValueError("WitCertCache: batch size / dtype changed inside a request; call cache.reset() between requests")
        first = self.get_seq_length() == 0
        passthrough = o.scheme == "none" and not o.meter
        if passthrough:  # as transformers' DynamicLayer: concatenated on the model's device
            self._ek = torch.cat([self._ek, key_states.detach()], dim=-2)
            self._ev = torch.cat([self._ev, value_states.detach()], dim=-2)
        else:  # O(new tokens), asynchronous on CUDA (one event after both copies)
            append_pair(self._ek, self._ev, key_states, value_states)
        if self.paged is not None:
            self._write_kernel(key_states.detach(), value_states.detach())
        elif not passthrough:
            self._append_served(key_states.detach(), value_states.detach())
        self._pending = "base" if (passthrough or first) else "served"
        _ACTIVE.cache = o._weak
        if passthrough:
            return self._ek, self._ev
        return key_states, value_states  # not read by the "witcert" attention on the served path

    def _update_static(self, st, key_states, value_states):
        """One decode token of every sequence, written through the runner's static buffers
        (``witcert.graphs.StaticStep``: positions, slots and the staging of the exact store live in
        device tensors, so the step can be captured in a CUDA graph and replayed). The host-side
        bookkeeping (the exact store's append from the staging buffer, step counters, records) is the
        runner's, once per step."""
        Bsz, H, m, D = key_states.shape
        k, v = key_states.detach(), value_states.detach()
        st.stage[self.layer_idx, 0].copy_(k[:, :, 0])
        st.stage[self.layer_idx, 1].copy_(v[:, :, 0])
        from kernels.write import write_kv

        write_kv(self.paged, k[:, :, 0].contiguous(), v[:, :, 0].contiguous(), self.block_table, st.seq, st.pos,
                 store_exact=False, validate=False, slots=st.slots)
        if self.win is not None:  # device index ops: captured with the step
            self.win.write(st.seq, st.pos, k[:, :, 0], v[:, :, 0], st.pos + 1)
        self._pending = "served"
        _ACTIVE.cache = self.owner._weak
        return key_states, value_states

    def ensure_capacity(self, n1: int) -> bool:
        """Kernel path: grow the paged cache (and overlay) to hold ``n1`` tokens per sequence,
        geometrically (amortised O(1) per token, never an error). Returns whether it grew (new
        tensors: a captured decode step reading the old ones is stale)."""
        o = self.owner
        Bsz, per_seq = self.block_table.shape
        if n1 <= per_seq * o.block_size:
            return False
        new_pages = per_seq
        while new_pages * o.block_size < n1:
            new_pages *= 2
        log.info("WitCertCache layer %d: kernel cache grows from %d to %d pages per sequence",
                 self.layer_idx, per_seq, new_pages)
        self.paged = self.paged.regrouped(Bsz, per_seq, new_pages)
        if self.rep is not None:
            self.rep = self.rep.regrouped(Bsz, per_seq, new_pages).bind(self.paged)
        self.block_table = torch.arange(Bsz * new_pages, dtype=torch.int32, device=self.device).view(Bsz, new_pages)
        return True

    def _write_kernel(self, k, v):
        """Kernel path: quantize + witnesses in one pass (kernels.write) into the paged layout."""
        from kernels.write import write_kv

        o = self.owner
        Bsz, H, m, D = k.shape
        n1 = self.get_seq_length()
        n0 = n1 - m
        self.ensure_capacity(n1)
        seq, p, slots = self._step_slots(Bsz, m, n0, n1)
        kf, vf = k.transpose(1, 2).reshape(Bsz * m, H, D), v.transpose(1, 2).reshape(Bsz * m, H, D)
        if self.win is not None:  # the exact window's rings: the sinks and the last `recent` tokens
            self.win.write(seq, p, kf, vf, n1)
        if o.scheme in BLOCK_SCHEMES:
            self._write_blocks(k, v, n0, n1, kf, vf, slots)
            return
        write_kv(self.paged, kf, vf, self.block_table, seq, p, store_exact=False, validate=False, slots=slots)
        if self.rep is not None:  # repair is persistent: a token written into a repaired page is served exact
            T = o.block_size
            self.rep.write(slots // T, slots % T, kf, vf)

    def _step_slots(self, Bsz: int, m: int, n0: int, n1: int):
        """(sequence ids [N], logical positions [N] int32, physical slots [N] int64) of this
        step's new tokens (N = B·m, sequence-major), as ``kernels.write.token_slots`` gives them.
        Every layer's block table is the identity layout ``arange(B·pages).view(B, pages)``
        (``lazy_initialization``, growth; ``reorder_cache`` moves blocks, not table entries), so
        the three are a function of (B, m, n0, n1, pages) alone: computed at the step's first
        layer, reused by the others (five small tensor ops per layer step fewer, and the slots are not
        gathered again for the overlay)."""
        from kernels.write import token_slots

        key = (Bsz, m, n0, n1, self.block_table.shape[1], self.device)
        memo = self.owner._slots_memo
        if memo is None or memo[0] != key:
            p = torch.arange(n0, n1, device=self.device, dtype=torch.int32).repeat(Bsz)
            seq = torch.arange(Bsz, device=self.device).repeat_interleave(m)
            memo = (key, seq, p, token_slots(self.paged, self.block_table, seq, p, validate=False).contiguous())
            self.owner._slots_memo = memo
        return memo[1], memo[2], memo[3]

    def _page_blocks(self, page: int) -> list:
        """The physical block of logical page ``page`` of every sequence (the layer's table is
        sequence b owning blocks b·pages … (b+1)·pages − 1: host arithmetic, no sync)."""
        per_seq = self.block_table.shape[1]
        return [b * per_seq + page for b in range(self.block_table.shape[0])]

    def _write_blocks(self, k, v, n0, n1, kf, vf, slots):
        """Kernel path of a block scheme (kivi2; a page is one key block of T tokens): tokens n0..n1
        of every sequence. The partial last page is held exact in the overlay (radius 0, KIVI's
        full-precision residual, as the reference path serves it); a page is quantized by the write
        kernel when it is full, from its exact values (the held page's pool row, then the new
        tokens), and its held slot is given back (a page the gate repaired stays exact)."""
        from kernels.write import write_kv

        T = self.owner.block_size
        a, c = (n0 // T) * T, (n1 // T) * T  # the page n0 falls in; the end of the full pages
        if n1 > c and c >= n0:  # a new partial last page: held exact from its first token
            self.owner.host_cost.sync("kivi2_hold")
            self.rep.hold(self._page_blocks(c // T))
        self.rep.write(slots // T, slots % T, kf, vf)  # held and repaired pages get the tokens
        if c <= a:
            return
        Bsz, H, m, D = k.shape
        # the page that was partial: its earlier tokens are in its pool row (held, or repaired by the gate)
        rows = self.rep.slot[self.block_table[:, a // T].long()].long() if n0 > a else None  # [B, H], on the device

        def full(x, pool):  # exact values of tokens a..c [B, H, c − a, D]
            old = [pool[rows, : n0 - a].to(x.dtype)] if n0 > a else []
            return torch.cat(old + [x[:, :, : c - n0]], dim=2)

        kfull, vfull = full(k, self.rep.k), full(v, self.rep.v)
        L = c - a
        write_kv(self.paged, kfull.transpose(1, 2).reshape(Bsz * L, H, D), vfull.transpose(1, 2).reshape(Bsz * L, H, D),
                 self.block_table, torch.arange(Bsz, device=self.device).repeat_interleave(L),
                 torch.arange(a, c, device=self.device).repeat(Bsz), store_exact=False, validate=False)
        if n0 > a:
            self.rep.release_held(self._page_blocks(a // T))

    def _append_served(self, k, v):
        o = self.owner
        n0 = self.k_hat.shape[-2]
        Bsz, H, m, D = k.shape
        n1 = n0 + m
        T = o.block_size
        nblk = -(-n1 // T)
        if self.repaired.shape[-1] < nblk:
            pad = torch.zeros(Bsz, H, nblk - self.repaired.shape[-1], dtype=torch.bool, device=self.device)
            self.repaired = torch.cat([self.repaired, pad], dim=-1)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.k_hat = torch.cat([self.k_hat, k.to(self.served_dtype)], dim=-2)
        self.v_hat = torch.cat([self.v_hat, v.to(self.served_dtype)], dim=-2)
        self.k_wit = torch.cat([self.k_wit, torch.zeros(Bsz, H, m, o.num_groups, **f64)], dim=-2)
        self.v_wit = torch.cat([self.v_wit, torch.zeros(Bsz, H, m, **f64)], dim=-1)
        self.k_scale = torch.cat([self.k_scale, torch.zeros(Bsz, H, m, dtype=torch.float32, device=self.device)], dim=-1)
        if self.k_sk is not None:
            self.k_sk = torch.cat([self.k_sk, torch.zeros(Bsz, H, m, D, **f64)], dim=-2)
        if o.scheme == "none":
            self.n_quantized = n1
            return
        # tokens enter exact (the window, KIVI's partial block) and are quantized once they leave it
        lo, b = o.quantized_range(n1)
        a = max(self.n_quantized, lo)
        if b <= a:
            return
        x_k, x_v = self._exact(a, b)
        x_k, x_v = x_k.to(self.device), x_v.to(self.device)
        common = dict(seed=o.seed, layer=self.layer_idx, positions=torch.arange(a, b), block_size=T)
        kh, kmeta = quantize(o.scheme, x_k.float().cpu(), QuantContext(role="key", **common))
        vh, _ = quantize(o.scheme, x_v.float().cpu(), QuantContext(role="value", **common))
        kh, vh = kh.to(self.device, self.served_dtype), vh.to(self.device, self.served_dtype)
        if o.sketch:  # the sketch radius's witness (and sketch): contract.sketch
            r = kh.double() - x_k.double()
            rt = torch.zeros_like(r)
            if o.sketch_bits:
                beta = S.residual_range(o.scheme, kh.double().cpu(), kmeta)
                codes, beta = B.sketch_encode(r.cpu(), o.sketch_bits, beta)
                rt = B.sketch_decode(codes, beta, o.sketch_bits).to(self.device)
            wl = None if o.weights is None else torch.from_numpy(o.weights[self.layer_idx][None]).to(self.device)
            kw = B.sketch_witness(r, rt, wl)[..., None]
        else:
            kw = B.key_witness(x_k.double(), kh.double(), o.groups, block_size=1)
        vw = B.value_witness(x_v.double(), vh.double(), block_size=1)
        # tokens of repaired blocks stay exact (repair is persistent)
        rep = self.repaired.repeat_interleave(T, dim=-1)[..., a:b]
        self.k_hat[..., a:b, :] = torch.where(rep[..., None], x_k.to(self.served_dtype), kh)
        self.v_hat[..., a:b, :] = torch.where(rep[..., None], x_v.to(self.served_dtype), vh)
        self.k_wit[..., a:b, :] = torch.where(rep[..., None], torch.zeros_like(kw), kw)
        self.v_wit[..., a:b] = torch.where(rep, torch.zeros_like(vw), vw)
        if self.k_sk is not None:
            self.k_sk[..., a:b, :] = torch.where(rep[..., None], torch.zeros_like(rt), rt)
        if "scale" in kmeta and o.scheme == "int8_dither":
            self.k_scale[..., a:b] = torch.where(rep, 0.0, kmeta["scale"].to(self.device))
        self.n_quantized = b

    # -- repair
    def page_in(self, b: int, h: int, blk: int) -> int:
        """Make block ``blk`` of (sequence b, kv head h) exact; returns the bytes moved (0 if
        it was already repaired: idempotent). Reads the backing store, never writes it. On the
        kernel path the exact K/V go to the repaired-page overlay (``self.rep``)."""
        if self.paged is not None:
            T = self.owner.block_size
            lo, hi = blk * T, min((blk + 1) * T, self.get_seq_length())
            ek, ev = (x[b, h] for x in self._exact(lo, hi))
            if not self.rep.page_in(int(self.block_table[b, blk]), h, ek, ev):
                return 0
            return 2 * (hi - lo) * ek.shape[-1] * ek.element_size()
        if bool(self.repaired[b, h, blk]):
            return 0
        T = self.owner.block_size
        lo, hi = blk * T, min((blk + 1) * T, self.k_hat.shape[-2])
        ek, ev = (x[b, h].to(self.device, non_blocking=True) for x in self._exact(lo, hi))
        self.k_hat[b, h, lo:hi] = ek.to(self.served_dtype)
        self.v_hat[b, h, lo:hi] = ev.to(self.served_dtype)
        self.k_wit[b, h, lo:hi] = 0
        self.v_wit[b, h, lo:hi] = 0
        self.k_scale[b, h, lo:hi] = 0
        if self.k_sk is not None:
            self.k_sk[b, h, lo:hi] = 0
        self.repaired[b, h, blk] = True
        return 2 * (hi - lo) * ek.shape[-1] * ek.element_size()


class _ExactLayer(DynamicLayer):
    """A layer outside ``compress_layers``: exact KV, base attention, no meter."""

    _pending = None


class WitCertCache(Cache):
    """See the module docstring. ``scheme``: any registered scheme (``witcert.schemes``);
    ``num_groups`` G and ``witness`` ("token" | "block") choose the witness layout;
    ``delta_req`` with ``schedule`` ("fixed" needs ``horizon`` = the maximum number of metered
    query rows: decode steps plus the rows of later prefill chunks; "anytime") enables Tier B
    for ``int8_dither``: every metered query row spends its own budget δ_step(row), so a
    request spends ≤ δ_req however its rows are chunked. ``seed`` keys the dither; None (the
    default) draws a fresh one per request (``reset()`` draws again), recorded in ``seed``
    and ``summary()``."""

    #: the kernel path's gate decodes again only the sequences it repaired (False: the whole
    #: batch; the same rows either way, bit-identical in the interpreter: tests/test_kernel_gate.py,
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
        sketch_bits: int | None = None,
        window="default",
        weights=None,
        host_pool=None,
    ):
        scheme = resolve_scheme(scheme)  # an alias of the scheme table (fp8, int4, kivi, auto) → its scheme
        get_scheme(scheme)  # ValueError naming the known schemes
        check_supported_config(config)  # NotImplementedError: attention logit soft-capping (Gemma-2)
        text, L, Hq, Hkv, D, rot = _model_dims(config)
        if gate is not None and not isinstance(gate, Gate):
            raise ValueError(f"gate: expected a witcert.cache.Gate, got {type(gate).__name__}")
        if gate is not None and not meter:
            raise ValueError("gate: gating needs the meter (meter=True)")
        if not isinstance(block_size, int) or block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size: expected a power of two, got {block_size!r}")
        if witness not in ("token", "block"):
            raise ValueError(f"witness: expected 'token' or 'block', got {witness!r}")
        if schedule not in ("fixed", "anytime"):
            raise ValueError(f"schedule: expected 'fixed' or 'anytime', got {schedule!r}")
        if delta_req is not None:
            if scheme != "int8_dither":
                raise ValueError("delta_req: Tier B (SPEC §5) is defined for the int8_dither scheme only")
            if schedule == "fixed" and horizon is None:
                raise ValueError("schedule 'fixed' needs horizon= (the maximum number of decode steps)")
            B.step_budget(delta_req, L, Hq, **({"horizon": horizon} if schedule == "fixed" else {"step": 1}))
        if gate is not None and gate.tier == "B" and delta_req is None:
            raise ValueError("Gate(tier='B') needs delta_req (Tier B budget)")
        self.config = text
        self.num_layers, self.num_q_heads, self.num_kv_heads, self.head_dim = L, Hq, Hkv, D
        if Hq % Hkv:
            raise ValueError(f"model: {Hq} query heads are not a multiple of {Hkv} kv heads")
        self.scheme, self.meter, self.gate = scheme, bool(meter), gate
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32):
            raise ValueError(f"seed: expected an int in [0, 2^32) or None (fresh per request), got {seed!r}")
        self.block_size, self.witness = block_size, witness
        self._fixed_seed = seed
        self.seed = self._draw_seed()
        self.num_groups = num_groups
        self.groups = B.group_slices(D, num_groups, rot if rot < D else None, "half")
        # the key radius (SPEC §2 as amended by issue 33, contract.sketch): a sketch_bits residual sketch
        # and channel weights (the sketch radius ε_hj = c_h (W_j + u_j)); with neither, the group
        # Cauchy–Schwarz radius of the G witnesses. The exact window: the first / last tokens served exact
        if sketch_bits is None:  # the scheme table's default (user schemes: the library's); none with G > 1 / blocks
            grouped = num_groups != 1 or witness != "token"
            sketch_bits = 0 if grouped else (SCHEMES[scheme].default_sketch_bits if scheme in SCHEMES
                                             else DEFAULT_SKETCH_BITS)
        self.sketch_bits = check_bits(sketch_bits)
        self.window = check_window(CACHE_DEFAULT_WINDOW if isinstance(window, str) and window == "default" else window)
        self.weights = _check_cache_weights(weights, L, Hkv, D, scheme)
        self.sketch = self.sketch_bits > 0 or self.weights is not None
        if self.sketch and (num_groups != 1 or witness != "token"):
            raise ValueError("sketch_bits / weights: the sketch radius takes one per-token witness (num_groups=1, "
                             "witness='token'); pass sketch_bits=0, weights=None for grouped or block witnesses")
        self.delta_req, self.schedule, self.horizon = delta_req, schedule, horizon
        if backend not in ("auto", "reference", "kernel"):
            raise ValueError(f"backend: expected 'auto', 'reference' or 'kernel', got {backend!r}")
        if backend == "kernel":
            from kernels.paged import SUPPORTED_HEAD_DIMS

            why = []
            if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
                why.append("no CUDA device, and Triton's interpreter is off (set TRITON_INTERPRET=1 before importing "
                           "triton to run the kernels on the CPU, slowly)")
            if not _kernel_scheme(scheme):
                why.append(f"scheme {scheme!r} has no kernel (kernel schemes: "
                           f"{sorted(n for n in KERNEL_SCHEME_IDS if _kernel_scheme(n))})")
            if D not in SUPPORTED_HEAD_DIMS:
                why.append(f"head_dim {D} is not supported by the kernels {SUPPORTED_HEAD_DIMS}")
            if num_groups != 1 or witness != "token" or block_size != 16:
                why.append("the kernel path serves caches with G = 1 per-token witnesses, T = 16")
            if not 1 <= Hq // Hkv <= 8:
                why.append(f"GQA group {Hq // Hkv} is outside the kernels' 1..8")
            if why:
                raise ValueError("backend='kernel': " + "; ".join(why))
        self.backend = backend
        if tilt_above is not None and not (isinstance(tilt_above, (int, float)) and math.isfinite(tilt_above)):
            raise ValueError(f"tilt_above: expected a finite number or None, got {tilt_above!r}")
        # (kernels.decode's tilt_above: rows whose closed-form TV⁺ is ≤ it skip the dual-grid tilt
        # and report tilt 1, rows whose coarse grid settles it skip the refinement; TV⁺ stays sound;
        # None: the tilt on every row, refined)
        self.tilt_above = -1.0 if tilt_above is None else float(tilt_above)
        self.max_tokens = int(max_tokens)
        self.audit = bool(audit)
        self.step = 0
        self.rows_metered = 0  # metered query rows so far (Tier B budget index)
        self._row_range = (0, 0)  # rows of the current forward: (first, count)
        self._records: list[StepRecord] = []
        self._lazy: list = []  # kernel path: meter records still on the device (read on demand)
        self._slots_memo = None  # WitCertLayer._step_slots: this step's token slots, shared by the layers
        self._lens_memo = None  # _kernel_attention: this step's seq_lens tensor, shared by the layers
        self.pagein_blocks = np.zeros((L, 0), dtype=np.int64)
        self.pagein_bytes = np.zeros((L, 0), dtype=np.int64)
        # trace: a sink with .record(rec, cache) (witcert.trace.Tracer, witcert.metrics.PrometheusMetrics,
        # witcert.trace.Tee of several) handed every StepRecord; None: no cost
        self.trace = trace
        # compress_layers: layer indices served compressed and metered; the others are exact,
        # unmetered transformers DynamicLayers (the layer sweep, witcert.sweep)
        if compress_layers is not None:
            compress_layers = frozenset(compress_layers)
            if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < L for i in compress_layers):
                raise ValueError(f"compress_layers: expected layer indices in [0, {L}), got {sorted(compress_layers)!r}")
        self.compress_layers = compress_layers
        # cuda_graph: decode steps captured once and replayed (witcert.graphs, docs/cache.md "CUDA graphs")
        if not isinstance(cuda_graph, bool):
            raise ValueError(f"cuda_graph: expected True or False, got {cuda_graph!r}")
        if cuda_graph:
            why = [reason for bad, reason in (
                (backend == "reference", "backend='reference' (graphs replay the kernel path)"),
                (not _kernel_scheme(scheme) or scheme in BLOCK_SCHEMES,
                 f"scheme {scheme!r} (graphed: the per-token kernel schemes "
                 f"{sorted(n for n in KERNEL_SCHEME_IDS if _kernel_scheme(n) and n not in BLOCK_SCHEMES)}; a block "
                 "scheme holds its partial page on the host's schedule)"),
                (gate is not None, "a gate (it decides page-ins on the host every step)"),
                (delta_req is not None, "delta_req (Tier B's budget changes every step)"),
                (audit, "audit=True (the float64 reference path)"),
                (compress_layers is not None, "compress_layers (its exact layers grow by concatenation)"),
                (not self.meter, "meter=False"),
            ) if bad]
            if why:
                raise ValueError("cuda_graph=True does not serve: " + "; ".join(why))
        self.cuda_graph = cuda_graph
        # host_pool: where the exact store's host memory comes from (witcert.hostpool): None, the process-wide
        # pinned HostPool on CUDA (plain per-store memory elsewhere); a HostPool; False, per-store pinned
        # allocation as before the pool. host_cost: what the current request cost the host (summary()["host"])
        if host_pool is not None and host_pool is not False and not isinstance(host_pool, HostPool):
            raise ValueError(f"host_pool: expected None, False or a witcert.hostpool.HostPool, got {host_pool!r}")
        self.host_pool = host_pool
        self.host_cost = HostCost()
        self._weak = weakref.ref(self)  # what _ACTIVE holds (made once: no allocation per layer step)
        self._static = None  # witcert.graphs.StaticStep while a graphed step runs (or is captured)
        self._graph = None  # witcert.graphs: the captured step and its static buffers
        self._graph_off = None  # why this request's steps are not graphed (None: they are)
        super().__init__(layers=[WitCertLayer(self, i) if compress_layers is None or i in compress_layers
                                 else _ExactLayer() for i in range(L)])

    # -- bookkeeping
    def quantized_range(self, n: int) -> tuple[int, int]:
        """Tokens [lo, hi) of a sequence of length ``n`` stored compressed on the reference path: all of
        them, but a block scheme's partial last block (KIVI's residual, exact until the block is full). The
        exact window is applied when the cache is read (``_view``), as the kernel path serves it."""
        if self.scheme in BLOCK_SCHEMES:
            return 0, n // self.block_size * self.block_size
        return 0, n

    def _view(self, layer) -> SimpleNamespace:
        """What the reference path serves and meters at this step: k̂, v̂ [B, Hkv, n, D] (float64), the key
        witnesses W [B, Hkv, n, G], φ [B, Hkv, n], the sketch r̃ (or None) and the Tier B scales, with the
        exact window's tokens (the first ``sink``, the last ``recent``: ``witcert.bounds.window_mask``)
        served exact from the backing store, radius 0 and φ = 0, as the kernel path serves them."""
        v = SimpleNamespace(kh=layer.k_hat.double(), vh=layer.v_hat.double(), W=layer.k_wit, phi=layer.v_wit,
                            rt=layer.k_sk, ks=layer.k_scale)
        n = layer.k_hat.shape[-2]
        if not sum(self.window) or self.scheme == "none" or n == 0:
            return v
        wm = torch.as_tensor(B.window_mask(n, self.window), device=layer.device)
        sink, recent = self.window
        parts = [(0, min(sink, n))] + ([(max(sink, n - recent), n)] if n - recent < n else [])
        kh, vh = v.kh.clone(), v.vh.clone()
        for lo, hi in parts:
            if lo < hi:
                ek, ev = self._layer_exact(layer, lo, hi)
                kh[..., lo:hi, :] = ek.double()
                vh[..., lo:hi, :] = ev.double()
        v.kh, v.vh = kh, vh
        v.W = torch.where(wm[:, None], torch.zeros_like(v.W), v.W)
        v.phi = torch.where(wm, torch.zeros_like(v.phi), v.phi)
        v.ks = torch.where(wm, torch.zeros_like(v.ks), v.ks)
        if v.rt is not None:
            v.rt = torch.where(wm[:, None], torch.zeros_like(v.rt), v.rt)
        return v

    @staticmethod
    def _layer_exact(layer, lo: int, hi: int):
        ek, ev = layer._exact(lo, hi)
        return ek.to(layer.device), ev.to(layer.device)

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

    # -- the exact store's host memory (witcert.hostpool, witcert.hostcost)
    def _pool(self, pin: bool) -> HostPool | None:
        """The pool this cache's exact stores lease from (None: per-store memory, plain or pinned)."""
        if self.host_pool is False:
            return None
        if self.host_pool is None:
            return HostPool.default() if pin else None
        return self.host_pool

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

    def host_report(self) -> HostReport:
        """What the current request cost the host (``HostCost``: pinned bytes held, pool hits / misses,
        allocations on the request path, device-to-host copies, host syncs and fallbacks by reason), where
        its exact store's memory comes from, and the pool's ``PoolStats``."""
        layers = [la for la in self.layers if getattr(la, "is_initialized", False)]
        pin = any(getattr(la, "device", None) is not None and la.device.type == "cuda" for la in layers)
        pool = self._pool(pin)
        mode = "pool" if pool is not None else ("per-store pinned" if pin else "plain")
        return HostReport(cost=dataclasses.replace(self.host_cost, syncs=dict(self.host_cost.syncs),
                                                   fallbacks=dict(self.host_cost.fallbacks)),
                          mode=mode, pool=None if pool is None else pool.stats())

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

    def _kernel_record(self, step, layer_idx, r, ds, Bsz, pre=None, pagein=None, flag=None, audit=None) -> StepRecord:
        """The StepRecord of a kernel step: ``r`` the meter after repair, ``pre`` before (None:
        ungated, the same), ``pagein`` [B, Hkv] blocks paged in, ``flag`` [B, Hq] the gate's flag
        (certified: still over τ), ``audit`` (tv_real, err_real, violations) or None."""
        a = lambda t: t.detach().cpu().numpy()  # noqa: E731
        pre = r if pre is None else pre
        fl = r.flag if flag is None else (r.flag | flag)
        return StepRecord(
            step=step, layer=layer_idx, tv_a=a(r.tv_upper_a), tv_a_pre=a(pre.tv_upper_a),
            out_err=a(r.out_err_upper), tv_b=None if r.tv_upper_b is None else a(r.tv_upper_b),
            flag=a(fl), nonfinite=a(r.flag),
            pagein_blocks=np.zeros((Bsz, self.num_kv_heads), dtype=np.int64) if pagein is None else pagein,
            delta_step=ds, delta_spent=ds, parts_pre=np.stack([a(pre.tanh), a(pre.eform), a(pre.tilt)]),
            tv_b_pre=None if pre.tv_upper_b is None else a(pre.tv_upper_b),
            tv_real=None if audit is None else audit[0], out_err_real=None if audit is None else audit[1],
            audit_violations=0 if audit is None else audit[2],
        )

    # -- the served attention and its meter
    def served_attention(self, module, query, attention_mask, scaling):
        layer = self.layers[module.layer_idx]
        layer._pending = None  # this layer's forward runs through the meter
        Bsz, Hq, Lq, D = query.shape
        if Hq != self.num_q_heads or D != self.head_dim:
            raise ValueError(f"query [B, {Hq}, L, {D}] does not match the cache's model; a WitCertCache belongs to one model")
        n = layer.k_hat.shape[-2]
        sm = float(scaling) if scaling is not None else 1.0 / math.sqrt(D)
        if layer.paged is not None:
            allowed = None if attention_mask is None else _allowed(attention_mask, Bsz, Lq, layer.get_seq_length(), query.device)
            return self._kernel_attention(layer, query, allowed, sm)
        self.host_cost.sync("reference_path")
        allowed = _allowed(attention_mask, Bsz, Lq, n, query.device)
        GQ = Hq // self.num_kv_heads
        q = query.detach().double().view(Bsz, self.num_kv_heads, GQ, Lq, D)
        al = allowed.view(Bsz, -1, 1, Lq, n) if allowed.shape[1] == 1 else allowed.view(Bsz, self.num_kv_heads, GQ, Lq, n)
        ev = self._evaluate(layer, q, al, sm)
        if self.meter:
            ev = self._meter_and_gate(layer, q, al, sm, ev)
        o = ev["o"].reshape(Bsz, Hq, Lq, D).transpose(1, 2).contiguous()
        return o.to(query.dtype), None

    def _page_in_counted(self, layer, b, h, blk) -> int:
        """``layer.page_in`` with the request's accounting (blocks and bytes per layer and sequence)."""
        self.host_cost.sync("page_in")
        nbytes = layer.page_in(b, h, blk)
        if nbytes:
            self.pagein_blocks[layer.layer_idx, b] += 1
            self.pagein_bytes[layer.layer_idx, b] += nbytes
        return nbytes

    def _kernel_attention(self, layer, query, allowed, sm):
        """Kernel path: one metered split-KV decode (kernels.decode) per step. Gated (SPEC §6): the
        gate reads the step's TV⁺ on the host (one sync per layer step); where a (sequence, kv head)
        is over τ it ranks the blocks by risk (``_kernel_block_risk``, float64 from the served
        pages), pages the chosen ones into the layer's overlay (``WitCertLayer.page_in``) and runs
        the decode again, so the output and the record reflect the repair (certified: up to
        ``max_pagein_blocks`` rounds, one decode each)."""
        from kernels.decode import _sm_count, choose_splits, decode

        Bsz, Hq, Lq, D = query.shape
        if Lq != 1 or (allowed is not None and allowed.shape[1] != 1):
            raise ValueError("the kernel path serves single-token decode steps (padding masks shared by the heads); "
                             "use WitCertCache(..., backend='reference') for chunked prefill or per-head masks")
        # padding (a batch's left padding): a per-token mask read by the kernel, no host sync
        token_mask = None if allowed is None else allowed[:, 0, 0, :]
        n = layer.get_seq_length()
        dsa = self.delta_step() if self.meter else None
        ds = None if dsa is None else float(dsa[0])
        gate = self.gate
        # a gated step needs the tilt only where the closed forms exceed τ (TV⁺ is sound either way)
        tilt = self.tilt_above if gate is None else min(self.tilt_above, gate.tau)
        q1 = query[:, :, 0, :].contiguous()
        if self._static is not None:
            return self._static_attention(layer, q1, sm, query.dtype)
        if self._lens_memo is None or self._lens_memo[0] != (Bsz, n, query.device):  # one per step, not per layer
            self._lens_memo = ((Bsz, n, query.device), torch.full((Bsz,), n, dtype=torch.int32, device=query.device))
        sl = self._lens_memo[1]  # read-only: decode() and the gate never write seq_lens
        splits = choose_splits(Bsz, self.num_kv_heads, n, layer.paged.block_size, _sm_count(query.device), self.meter,
                               layer.paged.scheme, head_dim=layer.paged.head_dim)

        def run(rows=None):
            # validate=False: the cache guarantees 1 ≤ n ≤ the table's capacity (no per-layer host sync);
            # rows: only these sequences, at the whole batch's split count and tile (its smaller grid would
            # pick another tile), so the rows are the whole batch's sums
            q, bt, lens, tm, win = q1, layer.block_table, sl, token_mask, layer.win
            tile = None
            if rows is not None:
                q, bt, lens = q1[rows], layer.block_table[rows], sl[rows]
                tm = None if token_mask is None else token_mask[rows]
                win = None if win is None else win.select(rows)
                tile = out.tile
            return decode(layer.paged, q, bt, lens, sm_scale=sm, meter=self.meter, num_splits=splits,
                          delta_step=ds, validate=False, token_mask=tm, tilt_above=tilt, repair=layer.rep, tile=tile,
                          window=win)

        out = run()
        if not self.meter:
            return out.o[:, None].to(query.dtype), None
        pre, pagein, flag = out.meter, None, None
        if gate is not None:
            Hkv = self.num_kv_heads
            GQ = Hq // Hkv
            cur = {"out": out}

            def over_rows(rec):  # [B, Hq] bool, on the device
                return exceeds(gate, rec.tv_upper_a, rec.tv_upper_b, rec.out_err_upper)

            def over():  # the gate's one host sync per round
                self.host_cost.sync("gate")
                cur["over"] = over_rows(cur["out"].meter).view(Bsz, Hkv, GQ).any(-1).cpu().numpy()
                return cur["over"]

            touched: set = set()  # sequences with a page-in since the last decode

            def page_in(b, h, blk):
                nbytes = self._page_in_counted(layer, b, h, blk)
                if nbytes:
                    touched.add(b)
                return nbytes

            def remeasure():  # decode again only the sequences whose pages changed
                rows = sorted(touched)
                touched.clear()
                if len(rows) == Bsz or not self.REDECODE_ROWS:
                    cur["out"] = run()
                elif rows:
                    idx = torch.tensor(rows, device=q1.device)
                    cur["out"] = cur["out"].with_rows(idx, run(idx))

            pagein = np.zeros((Bsz, Hkv), dtype=np.int64)
            if gate.max_pagein_blocks > 0:
                pagein = repair(gate, over=over, risk=lambda: self._kernel_block_risk(layer, q1, token_mask, sm, cur["over"]),
                                page_in=page_in, remeasure=remeasure).pagein
            out = cur["out"]
            if gate.policy == "certified":  # still over after the budget: flagged
                flag = over_rows(out.meter)
        args = (self.step, layer.layer_idx, out.meter, ds, Bsz, pre, pagein, flag)
        if self.audit:
            self.host_cost.sync("records")
            self._emit(self._kernel_record(*args, audit=self._kernel_audit(layer, q1, token_mask, sm, out.meter)))
        elif self.trace is None:  # stays on the device until cache.records is read
            self._lazy.append(args)
        else:  # tracing reads the record now (its cost is one transfer per (step, layer))
            self.host_cost.sync("records")
            self._emit(self._kernel_record(*args))
        return out.o[:, None].to(query.dtype), None

    def _static_attention(self, layer, q1, sm, dtype):
        """A graphed decode step's attention (``witcert.graphs``): the metered decode over the
        runner's static lengths / padding mask, split count from the table's capacity, and the meter
        record's columns copied into the runner's record buffer (one row per layer; the runner keeps a
        copy per step, read when ``records`` is)."""
        from kernels.decode import decode

        st = self._static
        out = decode(layer.paged, q1, layer.block_table, st.lens, sm_scale=sm, meter=True, num_splits=st.splits,
                     validate=False, token_mask=st.mask if st.has_mask else None, tilt_above=self.tilt_above,
                     window=layer.win)
        r = out.meter
        st.rec[layer.layer_idx].copy_(torch.stack([getattr(r, f).double() for f in GraphedRecords.FIELDS]))
        return out.o[:, None].to(dtype), None

    def _kernel_served(self, layer, q1, token_mask, sm, rows=None):
        """Float64 served logits / p̂ of the kernel path for the sequences ``rows``: q [B', Hkv, GQ, 1, D],
        k̂, v̂ [B', Hkv, n, D] (``served_kv``: dequantized codes, exact repaired pages), the
        mask [B', 1, 1, 1, n], logits, p̂ and live [B', Hkv, GQ, 1]."""
        n = layer.get_seq_length()
        Bsz, Hq, D = q1.shape
        Hkv = self.num_kv_heads
        idx = torch.arange(Bsz) if rows is None else rows
        kh, vh = served_kv(layer.paged, layer.block_table, n, layer.rep, rows=idx, window=layer.win)
        dev = kh.device
        q = q1[idx.to(q1.device)].to(dev).double().view(len(idx), Hkv, Hq // Hkv, 1, D)
        if token_mask is None:
            al = torch.ones(len(idx), 1, 1, 1, n, dtype=torch.bool, device=dev)
        else:
            al = token_mask[idx.to(token_mask.device), :n].to(dev).view(len(idx), 1, 1, 1, n)
        logits = sm * torch.einsum("bhgld,bhnd->bhgln", q, kh)
        p, live = _softmax(logits, al)
        return dict(q=q, kh=kh, vh=vh, al=al, logits=logits, p=p, live=live.expand(p.shape[:-1]), idx=idx)

    def _kernel_block_risk(self, layer, q1, token_mask, sm, need):
        """Block risks [B, Hkv, nb] of the kernel path (``witcert.gate.block_risk``, as the reference
        path ranks them), computed in float64 only for the sequences with a (kv head) row over τ
        (``need`` [B, Hkv]); the radii are the kernel's Tier A radii σ‖q_h‖·W_j (G = 1), 0 on repaired
        pages. Risks only choose blocks: the bound after a repair is the kernel's own."""
        n = layer.get_seq_length()
        T = self.block_size
        nb = -(-n // T)
        Bsz = q1.shape[0]
        dev = layer.paged.k_codes.device
        risk = torch.zeros(Bsz, self.num_kv_heads, nb, dtype=torch.float64, device=dev)
        rows = torch.as_tensor(np.nonzero(np.asarray(need).any(1))[0], dtype=torch.long)
        if rows.numel() == 0:
            return risk
        ev = self._kernel_served(layer, q1, token_mask, sm, rows)
        bt = layer.block_table.to(dev).long()[rows.to(dev)]
        j = torch.arange(n, device=dev)
        blk, off = bt[:, j // T], (j % T)[None, :].expand(len(rows), n)
        W = layer.paged.k_wit[blk, :, off, 0].movedim(2, 1).double()  # [B', Hkv, n]
        phi = layer.paged.v_wit[blk, :, off].movedim(2, 1).double()
        rep_blocks = torch.zeros(len(rows), self.num_kv_heads, nb, dtype=torch.bool, device=dev)
        if layer.rep is not None:
            rep_blocks = layer.rep.slot.long()[bt[:, :nb]].movedim(2, 1) >= 0
            rep_tok = rep_blocks.repeat_interleave(T, dim=-1)[..., :n]
            W = torch.where(rep_tok, torch.zeros_like(W), W)
            phi = torch.where(rep_tok, torch.zeros_like(phi), phi)
        if layer.win is not None:  # window tokens are served exact: radius 0
            wm = torch.as_tensor(B.window_mask(n, self.window), device=dev)
            W = torch.where(wm, torch.zeros_like(W), W)
        if layer.paged.weighted:  # the kernel's sketch radius c_h (W_j + u_j), contract.sketch
            rt = served_sketch(layer.paged, layer.block_table, n, rows)
            if rt is not None:
                zero = rep_tok if layer.rep is not None else torch.zeros_like(W, dtype=torch.bool)
                if layer.win is not None:
                    zero = zero | wm
                rt = torch.where(zero[..., None], torch.zeros_like(rt), rt)
            a = layer.paged.weights.double().to(dev)[None, :, None, :]
            eps = B.sketch_radius(ev["q"].transpose(2, 3), None if rt is None else rt[:, :, None], W[:, :, None], sm, a)
            eps = eps.to(dev).transpose(2, 3)
        else:
            eps = abs(sm) * ev["q"].norm(dim=-1)[..., None] * W[:, :, None, None, :]
        eps = torch.where(ev["al"], eps, torch.zeros_like(eps))
        r = block_risk(ev["p"], ev["logits"], ev["al"], ev["live"], eps, block_size=T, num_blocks=nb,
                       repaired=rep_blocks, v_wit=phi, tau_v=self.gate.tau_v)
        risk[rows.to(dev)] = r
        return risk

    def _kernel_audit(self, layer, q1, token_mask, sm, rec):
        """The reference path's audit (``_audit``: realised TV and ‖ô − o‖ against exact attention
        over the backing store) on the kernel path's served values and bounds:
        (tv_real [B, Hq], err_real [B, Hq], violations)."""
        ev = self._kernel_served(layer, q1, token_mask, sm)
        ev["o"] = torch.einsum("bhgln,bhnd->bhgld", ev["p"], ev["vh"])
        shp, dev = ev["live"].shape, ev["kh"].device  # [B, Hkv, GQ, 1]
        m = {"tv": rec.tv_upper_a.to(dev).double().view(shp), "err": rec.out_err_upper.to(dev).double().view(shp),
             "bad": rec.flag.to(dev).view(shp)}
        tv, err, viol = self._audit(layer, ev["q"], ev["al"], sm, ev, m)
        Bsz, Hq = rec.tv_upper_a.shape
        return tv.reshape(Bsz, Hq).cpu().numpy(), err.reshape(Bsz, Hq).cpu().numpy(), int(viol)

    def _evaluate(self, layer, q, al, sm):
        view = self._view(layer)
        logits = sm * torch.einsum("bhgld,bhnd->bhgln", q, view.kh)
        p, live_row = _softmax(logits, al)
        o = torch.einsum("bhgln,bhnd->bhgld", p, view.vh)
        return {"p": p, "logits": logits, "o": o, "live": live_row.expand(p.shape[:-1]), "al": al, "view": view}

    def _radii(self, view, layer, q, al, sm):
        """ε [B, Hkv, GQ, Lq, n] (Tier A) from the served view's witnesses: the sketch radius
        (``_sketch_radii``), or ``witcert.bounds.logit_radius`` of the group witnesses (per token, or their
        maximum over each block of T tokens); plus the float64 rounding of the served logits
        (``witcert.meter.served_radius``); 0 at masked tokens."""
        if self.sketch:
            return M.served_radius(self._sketch_radii(view, layer, q, sm), q, view.kh[:, :, None, None], sm,
                                   REFERENCE_UNIT_ROUNDOFF, mask=al)
        W = view.W  # [B, Hkv, n, G]
        n = W.shape[-2]
        T = self.block_size if self.witness == "block" else 1
        if T > 1:
            nb = -(-n // T)
            Wp = torch.nn.functional.pad(W, (0, 0, 0, nb * T - n))
            W = Wp.view(*W.shape[:2], nb, T, W.shape[-1]).amax(-2)
        eps = B.logit_radius(q, W[:, :, None, None], self.groups, sm, block_size=T, n=n).to(q.device)
        return M.served_radius(eps, q, view.kh[:, :, None, None], sm, REFERENCE_UNIT_ROUNDOFF, mask=al)

    def _sketch_radii(self, view, layer, q, sm):
        """The sketch radius ε [B, Hkv, GQ, Lq, n] (``witcert.bounds.sketch_radius``, shared over the GQ
        heads of a query row, as the kernels bin it) from the view's sketches and witnesses; 0 on tokens
        served exact (the window, repaired blocks: W = 0, r̃ = 0)."""
        qr = q.transpose(2, 3)  # [B, Hkv, Lq, GQ, D]: the shared maximum is over a row's heads
        rt = None if view.rt is None else view.rt[:, :, None]
        wl = None if self.weights is None else torch.from_numpy(self.weights[layer.layer_idx][None, :, None]).to(q.device)
        eps = B.sketch_radius(qr, rt, view.W[:, :, None, :, 0], sm, wl)  # [B, Hkv, Lq, GQ, n]
        return eps.to(q.device).transpose(2, 3)

    def _tier_b_radii(self, view, q, al, sm, delta_step):
        """t [B, Hkv, GQ, Lq, n] (Tier B, ``witcert.meter.tier_b_radius``) plus the rounding; 0 at masked tokens."""
        s = view.ks.double()[:, :, None, None, :]  # [B, Hkv, 1, 1, n]
        qq = q.double()
        t = M.tier_b_radius(qq, s.expand(*qq.shape[:-1], s.shape[-1]), sm, int(al.shape[-1]), delta_step)
        return M.served_radius(t, q, view.kh[:, :, None, None], sm, REFERENCE_UNIT_ROUNDOFF, mask=al)

    def _block_risk(self, layer, ev, eps, nb):
        """Risk of every block [B, Hkv, nb] (``witcert.gate.block_risk``); 0 for repaired blocks."""
        return block_risk(ev["p"], ev["logits"], ev["al"], ev["live"], eps, block_size=self.block_size,
                          num_blocks=nb, repaired=layer.repaired, v_wit=ev["view"].phi, tau_v=self.gate.tau_v)

    def _meter_and_gate(self, layer, q, al, sm, ev):
        Bsz, Hkv, GQ, Lq, n = ev["p"].shape
        ds = self.delta_step()
        gate = self.gate

        def measure():
            """TV⁺ = min(tanh, e-form, tilt) from the served logits (log domain: an underflowed p̂
            never hides a token), E⁺_V, ``bad`` (non-finite: saturated, flagged): ``witcert.meter``."""
            view = ev["view"]
            eps = self._radii(view, layer, q, al, sm)
            tb = self._tier_b_radii(view, q, al, sm, ds) if ds is not None else None
            # long prefill chunks: the closed forms (sound, looser)
            r = M.measure(ev["logits"], eps, mask=ev["al"], p_hat=ev["p"], values=view.vh[:, :, None, None],
                          value_witness=view.phi[:, :, None, None], radius_b=tb, levels=METER_LEVELS,
                          tilt=Lq <= TILT_MAX_ROWS_PER_HEAD)
            m = {"tv": r.tv, "err": r.err, "bad": r.bad, "parts": r.parts, "eps": eps}
            if ds is not None:
                m["tv_b"] = r.tv_b
            return m

        def over(m):
            return exceeds(gate, m["tv"], m.get("tv_b"), m["err"])

        m = pre = measure()
        pagein = np.zeros((Bsz, Hkv), dtype=np.int64)
        if gate is not None and gate.max_pagein_blocks > 0:  # the repair loop: witcert.gate.repair
            nb = -(-n // self.block_size)
            cur = {"m": m}

            def page_in(b, h, blk):
                return self._page_in_counted(layer, b, h, blk)

            def remeasure():
                ev.update(self._evaluate(layer, q, al, sm))
                cur["m"] = measure()

            pagein = repair(gate, over=lambda: over(cur["m"]).flatten(2).any(-1).cpu().numpy(),
                            risk=lambda: self._block_risk(layer, ev, cur["m"]["eps"], nb),
                            page_in=page_in, remeasure=remeasure).pagein
            m = cur["m"]
        flag = m["bad"]
        if gate is not None and gate.policy == "certified":
            flag = flag | over(m)
        red = lambda x: x.amax(-1).reshape(*x.shape[:-4], Bsz, Hkv * GQ).cpu().numpy()  # noqa: E731
        audit = self._audit(layer, q, al, sm, ev, m) if self.audit else None
        self._emit(StepRecord(
            step=self.step, layer=layer.layer_idx, tv_a=red(m["tv"]), tv_a_pre=red(pre["tv"]), out_err=red(m["err"]),
            tv_b=red(m["tv_b"]) if ds is not None else None, flag=red(flag.double()) > 0,
            nonfinite=red(m["bad"].double()) > 0, pagein_blocks=pagein, delta_step=ds,
            delta_spent=None if ds is None else float(np.sum(ds)),
            parts_pre=red(pre["parts"]), tv_b_pre=red(pre["tv_b"]) if ds is not None else None,
            tv_real=None if audit is None else red(audit[0]), out_err_real=None if audit is None else red(audit[1]),
            audit_violations=0 if audit is None else int(audit[2]),
        ))
        return ev

    def _audit(self, layer, q, al, sm, ev, m):
        """Realised TV and ‖ô − o‖ against exact attention over the backing store (tests, demo)."""
        ek = layer.exact_k.to(layer.device).double()
        evv = layer.exact_v.to(layer.device).double()
        p, _ = _softmax(sm * torch.einsum("bhgld,bhnd->bhgln", q, ek), al)
        tv = 0.5 * (p - ev["p"]).abs().sum(-1)
        err = (torch.einsum("bhgln,bhnd->bhgld", p, evv) - ev["o"]).norm(dim=-1)
        # the audit's own fp64 evaluation error (both sides are fp64 sums over n tokens)
        tol = AUDIT_ABS_TOL * (1.0 + ev["o"].abs().amax(-1))
        viol = ((tv > m["tv"] + AUDIT_ABS_TOL) | (err > m["err"] + tol)) & ev["live"] & ~m["bad"]
        return tv, err, viol.sum()


def served_kv(cache, block_table: torch.Tensor, n: int, repair=None,
              rows: torch.Tensor | None = None, window=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The values the decode serves, in float64 on the cache's device: (k̂, v̂) [B', Hkv, n, D]
    of the sequences ``rows`` (default all) of ``block_table``, tokens 0..n−1: the codes
    dequantized as the kernel does (s·c, s·(c − u) with the regenerated dither, z + s·c for
    int4_group and kivi2) and, where ``repair`` has the page, its exact pool values. For the gate's block
    risks and the audit (O(B'·Hkv·n·D) device work, no kernel). ``cache``: a ``kernels.paged.PagedKV``,
    ``repair``: a ``kernels.paged.RepairOverlay`` (here, not in ``kernels``: it regenerates the dither
    with ``witcert.schemes``, and the kernels never import ``witcert``)."""
    dev = cache.k_codes.device
    bt = block_table.to(dev).long()
    if rows is not None:
        bt = bt[rows.to(dev).long()]
    T, D = cache.block_size, cache.head_dim
    j = torch.arange(n, device=dev)
    blk = bt[:, j // T]  # [B', n]
    off = (j % T)[None, :].expand_as(blk)

    from kernels.paged import dequantized_fp32, page_scaled_keys, unpack_codes

    def gather(t):  # [NB, Hkv, T, ...] → [B', Hkv, n, ...]
        return t[blk, :, off].movedim(2, 1)

    if dequantized_fp32(cache.scheme):  # z + s·c: int4_group (per 32 channels), kivi2 (keys per channel of the page)
        gi = torch.arange(D, device=dev) // 32
        kc, vc = (unpack_codes(gather(c), cache.scheme).double() for c in (cache.k_codes, cache.v_codes))
        if page_scaled_keys(cache.scheme):  # kivi2: one key scale / zero per channel of the page
            kh = cache.k_zero[blk].movedim(2, 1).double() + cache.k_scale[blk].movedim(2, 1).double() * kc
        else:
            kh = gather(cache.k_zero)[..., gi].double() + gather(cache.k_scale)[..., gi].double() * kc
        vh = gather(cache.v_zero)[..., gi].double() + gather(cache.v_scale)[..., gi].double() * vc
    else:
        kh, vh = gather(cache.k_codes).double(), gather(cache.v_codes).double()
        if cache.scheme != "none":
            ks, vs = gather(cache.k_scale).double()[..., None], gather(cache.v_scale).double()[..., None]
            if cache.scheme == "int8_dither":
                H = cache.num_kv_heads
                hh = torch.arange(H, device=dev)[:, None, None]
                ch = torch.arange(D, device=dev)[None, None, :]
                uk = S.dither_u(cache.seed, cache.layer, hh, j[None, :, None], ch, 0).to(dev).double()
                uv = S.dither_u(cache.seed, cache.layer, hh, j[None, :, None], ch, 1).to(dev).double()
                kh, vh = ks * (kh - uk), vs * (vh - uv)
            else:
                kh, vh = ks * kh, vs * vh
    if repair is not None and repair.count > 0:
        sl = repair.slot.long()[blk].movedim(2, 1)  # [B', Hkv, n]
        rep = sl >= 0
        sl = sl.clamp_min(0)
        o = off[:, None, :].expand_as(sl)
        kh = torch.where(rep[..., None], repair.k[sl, o].double(), kh)
        vh = torch.where(rep[..., None], repair.v[sl, o].double(), vh)
    if window is not None and window.columns > 0:  # the exact window (kernels.paged.ExactWindow): from its ring
        win = torch.as_tensor(B.window_mask(n, (window.sink, window.recent)), device=dev)
        col = window.columns_of(j, n)
        rws = torch.arange(window.k.shape[0], device=dev) if rows is None else rows.to(dev).long()
        kh = torch.where(win[None, None, :, None], window.k[rws][:, :, col].double(), kh)
        vh = torch.where(win[None, None, :, None], window.v[rws][:, :, col].double(), vh)
    return kh, vh


def served_sketch(cache, block_table: torch.Tensor, n: int, rows: torch.Tensor | None = None) -> torch.Tensor | None:
    """The key residual sketch r̃ [B', Hkv, n, D] (float64) the decode reconstructs from the packed codes
    and the scheme's β (``contract.sketch``), or None without a sketch: for the gate's block risks."""
    if not cache.sketch_bits:
        return None
    dev = cache.k_codes.device
    bt = block_table.to(dev).long()
    if rows is not None:
        bt = bt[rows.to(dev).long()]
    T, D, b = cache.block_size, cache.head_dim, cache.sketch_bits
    j = torch.arange(n, device=dev)
    blk = bt[:, j // T]
    off = (j % T)[None, :].expand_as(blk)
    packed = cache.k_sketch[blk, :, off].movedim(2, 1).long()  # [B', Hkv, n, D·b/8]
    code = torch.cat([(packed >> (i * b)) & ((1 << b) - 1) for i in range(8 // b)], dim=-1).double()
    L = 1 << b
    row = SCHEMES[cache.scheme]
    gather = lambda t: t[blk, :, off].movedim(2, 1)  # noqa: E731
    if row.residual_range == "fp8":
        s = gather(cache.k_scale).double()[..., None] if row.key_scales == "token" else 1.0
        xh = s * gather(cache.k_codes).double()
        beta = torch.maximum(xh.abs() * row.residual_rel, row.residual_floor * s * torch.ones_like(xh))
    elif row.key_scales == "channel-block":  # kivi2: per channel of the page
        beta = cache.k_scale[blk].movedim(2, 1).double() / 2
    elif row.key_scales == "group":
        beta = gather(cache.k_scale)[..., torch.arange(D, device=dev) // 32].double() / 2
    else:  # per token
        beta = gather(cache.k_scale).double()[..., None] / 2
    return beta * (2 * code + 1 - L) / L


#: masked softmax of the reference path (float64): ``witcert.meter.softmax``
_softmax = M.softmax


def _allowed(mask, Bsz, Lq, n, device) -> torch.Tensor:
    """Boolean [B, 1|H, Lq, n] (True = attend) from an sdpa (bool / None) or eager (additive) mask."""
    if mask is None:
        i = torch.arange(Lq, device=device)[:, None]
        j = torch.arange(n, device=device)[None, :]
        return (j <= i + (n - Lq)).expand(Bsz, 1, Lq, n)
    if mask.dtype == torch.bool:
        m = mask
    else:
        m = mask > torch.finfo(mask.dtype).min / 2
    m = m[..., -n:] if m.shape[-1] >= n else m
    if m.shape[-1] != n or m.shape[-2] != Lq:
        raise ValueError(f"attention mask {tuple(mask.shape)} does not match {Lq} queries over {n} cached tokens")
    return m.expand(Bsz, m.shape[1], Lq, n)


def _make_attention(base: str) -> Callable:
    def witcert_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        ref = getattr(_ACTIVE, "cache", None)
        cache = ref() if ref is not None else None
        layer = cache.layers[module.layer_idx] if cache is not None and module.layer_idx < len(cache.layers) else None
        mode = layer._pending if layer is not None else None
        if layer is not None:
            layer._pending = None
            cfg = getattr(module, "config", None)
            # checked once per model config (not per layer step: ~0.08 ms of Python each)
            if mode is not None and cfg is not None and getattr(cache, "_dims_checked", None) is not cfg:
                if _model_dims(cfg)[1:5] != (cache.num_layers, cache.num_q_heads, cache.num_kv_heads, cache.head_dim):
                    raise ValueError("WitCertCache: this cache was built for a different model")
                cache._dims_checked = cfg
        if mode != "served":
            fn = _base_fn(base, module)
            return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if module.training and dropout:
            raise ValueError("witcert attention is for inference (no dropout)")
        return cache.served_attention(module, query, attention_mask, scaling)

    return witcert_attention


def _base_fn(base: str, module):
    if base == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"{type(module).__name__}: its modeling file has no eager_attention_forward")
    return fn


def register() -> None:
    """Register ``"witcert"`` (sdpa base) and ``"witcert_eager"`` (eager base) with transformers."""
    AttentionInterface.register("witcert", _make_attention("sdpa"))
    AttentionInterface.register("witcert_eager", _make_attention("eager"))
    ALL_MASK_ATTENTION_FUNCTIONS.register("witcert", sdpa_mask)
    ALL_MASK_ATTENTION_FUNCTIONS.register("witcert_eager", eager_mask)


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
    from .graphs import install

    return install(model)  # WitCertCache(cuda_graph=True): decode steps captured and replayed
