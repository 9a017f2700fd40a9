"""The WitCert meter inside SGLang, without a fork: an environment-guarded in-process patch.

    import witcert.integrations.sglang as ws
    ws.install()          # patches only when WITCERT_SGLANG=1; returns None and touches nothing otherwise
    ws.install(force=True)                         # explicit: patch regardless of the variable

What is wrapped (the whole list; nothing else is touched), for SGLang ``SUPPORTED_VERSIONS``:

* ``sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`` (module attribute; the
  Triton backend ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend`` binds it in its
  ``__init__``, so ``install()`` must run before the model runner is built);
* ``sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer`` (class attribute; the
  subclasses that do not override it inherit the wrapper).

On another SGLang version, or when either target cannot be imported or does not have the
expected signature, ``install()`` raises ``UnsupportedSGLang`` before patching anything (never a
half patch). ``uninstall()`` restores both originals.

KV write (the pool's set-KV path): for each token written at slot ``loc`` the wrapper keeps the
exact K/V it was handed (before SGLang's in-place division by ``k_scale``), calls SGLang's own
write, reads back what SGLang stored and writes side buffers indexed like SGLang's pool
(``[slot, kv_head, 1, ·]``): per-group key witnesses ``W ≥ ‖(k̂ − k)[g]‖``, ``φ ≥ ‖v̂ − v‖``,
``ν ≥ ‖v̂‖``, ``κ ≥ ‖k̂‖`` (fp64 norms × (1 + 2^-12) + 2^-100, rounded up into float16), with
``k̂ = code · k_scale`` for SGLang's fp8 cache (``--kv-cache-dtype fp8_e4m3``) and ``k̂ = k`` for a
bf16/fp16 cache. With ``scheme=<one of ours>`` the wrapper additionally quantizes the exact K/V
with ``kernels.write.write_kv`` into a WitCert ``PagedKV`` (block size 1, block id = SGLang's
slot), and the decode serves attention from those codes (int8_dither is refused: SGLang's write
path does not carry the token's logical index, the dither key).

Decode: ``kernels.decode.decode`` on SGLang's layout (page size 1: ``kv_indices`` are token
slots, so the per-request "block table" is ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` over
``PagedKV`` views of SGLang's buffers with ``block_size = 1``). It writes SGLang's output tensor
``o`` and puts the merged log-sum-exp in ``attn_lse[:, :, 0]`` (the other splits −inf, so a
caller's ``logsumexp`` over splits is unchanged); the meter record of every (request row, query
head) goes to ``on_record(layer_id, record)`` (default: kept in ``STATE.records``). Calls the
metered kernel cannot serve (page size ≠ 1, MLA, logit cap, sinks, score_mod, xai temperature,
head dims outside 64/128/256, GQA > 8, a buffer no patched write has registered) go to SGLang's
own kernel unmetered and are counted in ``STATE.unmetered`` with the reason.

Trace and metrics (``install(..., trace=sink, flush_every=64)``): ``sink`` is what
``WitCertCache(trace=...)`` takes — a ``witcert.trace.Tracer`` (JSON Lines file or memory), a
``witcert.metrics.PrometheusMetrics``, or a ``witcert.trace.Tee`` of them. Every metered (layer,
decode call) becomes one ``SGLangStepRecord`` (the field names of ``witcert.cache.StepRecord``),
i.e. one trace row per (request row, query head): ``layer`` = SGLang's layer id, ``seq`` = the
row of that call's decode batch (SGLang re-forms batches every step; the attention call does
not see request ids), ``head`` / ``kv_head``, ``step`` = the count of metered calls of that layer
since ``install()`` (from 1), ``scheme`` = ``sglang:<what the kernel metered>`` (``sglang:fp8_e4m3``,
``sglang:none`` for a bf16/fp16 cache) or our scheme, ``tv`` / ``tv_pre`` = Tier A TV⁺ after /
before the gate's repair, ``tv_b`` (never here: Tier B needs int8_dither), ``err`` = E⁺_V,
``eps_max``, the tanh / e-form / tilt parts (before repair), ``blocks`` / ``bytes`` paged in per
(row, kv head), flags ``nan`` (non-finite inputs) and ``budget_spent`` (certified gate still over
τ). The whole install is one trace "request" (``tracer.new_request(label)`` before ``install()``
names it). What is synced when: the records stay on the device (a list of the kernel's own
output tensors, no copy, no sync) until ``flush()``, which runs every ``flush_every`` metered
calls, at ``uninstall()``, or when the operator calls it (at shutdown; before scraping metrics);
a flush is one device→host transfer of all pending records (concatenated), then the sink's
``record`` on the host. Records pending at a crash (≤ ``flush_every`` calls) are lost. Without
``trace`` nothing is queued (``on_record`` / ``STATE.records`` as before).

Gate (``install(..., gate=witcert.gate.Gate(...), exact_store=...)``; scheme "sglang" only).
SGLang keeps no exact KV, so the operator supplies it: ``exact_store(layer_id, slots) -> (k, v)``
([m, Hkv, D], the K/V the model handed ``set_kv_buffer`` for those token slots, before SGLang's
scale division), or ``HostExactStore()``, which the patched write keeps current (a host copy of
the whole cache in the model dtype; a reused slot is overwritten). Per metered call:

1. the first pass is the metered decode above; ``witcert.gate.exceeds`` against τ (τ_v) on its
   record, then one host sync (``any``). No row over τ: nothing else happens (record, output
   and trace are those of the ungated path).
2. Rows with some query head over τ are copied into an **overlay**: a ``PagedKV`` of scheme
   "none" in q's dtype holding each such row's tokens compacted (block size 1: a block is one
   slot): rnd(k̂), rnd(v̂) of SGLang's stored values, with witnesses W ⊕ ‖rnd(k̂) − k̂‖ (the
   triangle inequality, rounded up; W itself where rnd(k̂) = k̂).
3. ``witcert.gate.repair`` runs the gate's policy per (row, kv head) with ``block_risk`` (block
   size 1) computed from a float32/float64 reference evaluation of those rows on the overlay
   (p̂ and ε per token: the kernel does not return them). A page-in calls ``exact_store`` for the
   slot (memoised within the call), checks the store against the slot's witnesses
   (‖k̂ − k_store‖[g] ≤ W[g] and ‖v̂ − v_store‖ ≤ φ, which the true exact values satisfy by
   construction; else the page-in is refused and counted in ``STATE.gate_rejected``), writes
   the exact K/V into the overlay in q's dtype and sets that token's witnesses to the fp64
   residual of what was written (0 when the exact value is representable, as a bf16 model's K/V
   are); every round that paged in re-runs the metered kernel on the overlay rows.
4. The rows that paged in get the overlay's output in SGLang's ``o`` / ``attn_lse`` and its
   meter rows in the record (``tv_pre`` keeps the first pass); the others keep the first pass.
   A certified gate flags (``budget_spent``) the rows still over τ. ``STATE.gate_log`` keeps a
   ``GateReport`` per gated call.

Soundness: the bound of every returned row is the metered kernel's on exactly the values that
row was served from, with witnesses ≥ the true residual norms (SGLang's, the triangle-inequality
sum, or the residual of the written exact value); the gate's risk ranking and the store check
only choose and refuse page-ins. The one assumption is the store's: its values are the exact
K/V of the slot (the witness check catches a stale or wrong slot whose residual exceeds the
witness, not every wrong value); ``HostExactStore`` meets it by construction.
Why an overlay and not SGLang's buffers: an fp8 code cannot hold the exact value, and SGLang's
bf16/fp16 write already stored the nearest representable one (its witness is already the
residual: 0 for a model of that dtype), so writing the buffers would repair nothing; zeroing the
side-buffer witnesses of a slot whose fp8 code is unchanged would make later bounds unsound.
So the repair is per call (not persistent across steps: the next call meters SGLang's buffers
again and pages in from the store again). Costs, only when a gate is installed and a row is
over τ: the overlay (the over-τ rows' tokens in q's dtype), host syncs in the repair loop, one
store call per slot, one kernel launch per round. ``scheme=<ours>`` with a gate is refused (the
overlay would need a dequantizer of our codes), and so is Tier B.

Not here: CUDA graphs (the metered decode syncs with the host), and a test of the real server
path (see docs/sglang.md).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import math
import os
import sys
import types

import numpy as np
import torch

from contract.schemes import SCHEMES

log = logging.getLogger("witcert.sglang")

SUPPORTED_VERSIONS = ("0.5.23",)
ENV = "WITCERT_SGLANG"
DECODE_MODULE = "sglang.kernels.ops.attention.decode_attention"
DECODE_FN = "decode_attention_fwd"
POOL_MODULE = "sglang.srt.mem_cache.memory_pool"
POOL_CLASS = "MHATokenToKVPool"
#: the leading parameters each wrapper relies on (checked on the installed functions)
DECODE_PARAMS = ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse",
                 "num_kv_splits", "max_kv_splits", "sm_scale", "k_scale", "v_scale", "logit_cap", "sinks",
                 "xai_temperature_len", "has_mla", "use_pdl", "page_size", "score_mod")
POOL_PARAMS = ("self", "layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale")
WITNESS_SLACK = 2.0**-12
WITNESS_FLOOR = 2.0**-100
#: our kernel schemes SGLang can serve: lossy, not keyed by the token's logical index (SGLang's
#: write does not carry it: int8_dither is refused), and per token (SGLang's pages are single
#: tokens: a block scheme such as kivi2 needs whole 16-token pages), from the scheme table
OUR_SCHEMES = tuple(r.name for r in SCHEMES.values()
                    if r.kernel_supported and r.lossy and not r.position_keyed and not r.per_block)


class UnsupportedSGLang(RuntimeError):
    """SGLang is missing, of another version, or its targets do not look as expected."""


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def import_bare(module: str, root: str | None = None):
    """Import an SGLang submodule without running ``sglang/__init__.py`` (which needs the
    server's dependencies): only for tests and benchmarks on machines without SGLang's full
    environment. ``root``: the ``sglang`` package folder (default: the installed one)."""
    if "sglang" not in sys.modules:
        if root is None:
            spec = importlib.util.find_spec("sglang")
            if spec is None or spec.origin is None:
                raise UnsupportedSGLang("sglang is not installed (pip install --no-deps sglang==0.5.23)")
            root = os.path.dirname(spec.origin)
        pkg = types.ModuleType("sglang")
        pkg.__path__ = [root]
        pkg.__file__ = os.path.join(root, "__init__.py")
        pkg.__spec__ = importlib.util.spec_from_file_location("sglang", pkg.__file__, submodule_search_locations=[root])
        sys.modules["sglang"] = pkg
    return importlib.import_module(module)


# --------------------------------------------------------------------------- state


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
    #: [slot] bool: no witness vouches for the slot (never written through a recorded write, or
    #: changed since by a path that does not record: sglang_pool); a row reading one gets TV⁺ = 1
    bad: torch.Tensor | None = None
    buffer: torch.Tensor | None = None  # the K buffer this side describes (kept alive: its address is the key)
    scales: tuple | None = None  # the fp32 (k_scale, v_scale) the witnesses were taken against


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

    def emit(self, layer_id, rec):
        if self.on_record is not None:
            self.on_record(layer_id, rec)
        else:
            self.records.append((layer_id, rec))


STATE = State()
_ORIGINALS: dict = {}


# --------------------------------------------------------------------------- install


def _check_params(fn, expected, what):
    names = tuple(inspect.signature(fn).parameters)
    if names[: len(expected)] != expected:
        raise UnsupportedSGLang(f"{what}: expected parameters {expected}, found {names[:len(expected)]}; "
                                "this SGLang is not one WitCert's patch was written for")


def _resolve(targets, bare):
    imp = (lambda m: import_bare(m)) if bare else importlib.import_module
    found = {}
    for t in targets:
        try:
            if t == "decode":
                mod = imp(DECODE_MODULE)
                fn = getattr(mod, DECODE_FN)
                _check_params(fn, DECODE_PARAMS, f"{DECODE_MODULE}.{DECODE_FN}")
                found[t] = (mod, DECODE_FN, fn)
            elif t == "pool":
                cls = getattr(imp(POOL_MODULE), POOL_CLASS)
                fn = cls.__dict__["set_kv_buffer"]
                _check_params(fn, POOL_PARAMS, f"{POOL_MODULE}.{POOL_CLASS}.set_kv_buffer")
                found[t] = (cls, "set_kv_buffer", fn)
                from witcert.integrations.sglang_pool import POOL_WRAPPERS

                for name in POOL_WRAPPERS:  # the other KV-touching methods (sglang_pool's module doc)
                    found[f"pool:{name}"] = (cls, name, cls.__dict__[name])
                from witcert.integrations.sglang_pool import HOST_LOADS, HOST_MODULES

                for mname in HOST_MODULES:  # HiCache host pools writing the device buffers
                    mod = imp(mname)
                    for cname, hc in sorted(vars(mod).items()):
                        if isinstance(hc, type) and hc.__module__ == mname:
                            for name in HOST_LOADS:
                                if name in hc.__dict__:
                                    found[f"host:{mname}.{cname}.{name}"] = (hc, name, hc.__dict__[name])
            else:
                raise ValueError(f"targets: unknown {t!r} (expected 'decode', 'pool')")
        except UnsupportedSGLang:
            raise
        except (ImportError, AttributeError, KeyError) as e:
            raise UnsupportedSGLang(f"cannot resolve the {t!r} target of SGLang: {type(e).__name__}: {e}; "
                                    "nothing was patched") from e
    return found


def install(force: bool = False, scheme: str = "sglang", num_groups: int = 1, delta_step: float | None = None,
            on_record=None, targets=("decode", "pool"), bare: bool = False, version: str | None = None,
            trace=None, flush_every: int = 64, gate=None, exact_store=None):
    """Patch SGLang when ``WITCERT_SGLANG=1`` (or ``force``); otherwise do nothing, return None.

    Every target is resolved and checked first; only then is anything replaced (all or none).
    ``targets``/``bare`` exist for tests on machines where SGLang's server modules cannot be
    imported; a server uses the defaults. Returns the list of patched ``module.qualname``.

    ``trace``: a trace sink (``witcert.trace.Tracer``, ``witcert.metrics.PrometheusMetrics`` or a
    ``witcert.trace.Tee`` of them) that receives every metered (layer, decode call) as trace rows
    (module doc "Trace and metrics"); records wait on the device and are handed over every
    ``flush_every`` metered calls and at ``flush()`` / ``uninstall()``.
    ``gate`` (``witcert.gate.Gate``) with ``exact_store`` (a page-in callback, or a
    ``HostExactStore``): repair rows over τ from an exact overlay (module doc "Gate")."""
    if not force and os.environ.get(ENV, "") != "1":
        return None
    ver = sglang_version() if version is None else version
    if ver is None:
        raise UnsupportedSGLang("WitCert's SGLang patch: sglang is not installed; nothing was patched")
    if ver not in SUPPORTED_VERSIONS:
        raise UnsupportedSGLang(f"WitCert's SGLang patch supports sglang {', '.join(SUPPORTED_VERSIONS)}; found "
                                f"{ver}. Nothing was patched (unset {ENV} to serve without the meter).")
    if scheme != "sglang" and scheme not in OUR_SCHEMES:
        raise ValueError(f"scheme: 'sglang' or one of {OUR_SCHEMES}, got {scheme!r}"
                         + (" (int8_dither needs the token's logical index, which SGLang's write path does not carry)"
                            if scheme == "int8_dither" else ""))
    if _ORIGINALS:
        raise RuntimeError("WitCert's SGLang patch is already installed (uninstall() first)")
    if trace is not None and not callable(getattr(trace, "record", None)):
        raise ValueError(f"trace: expected a sink with .record(rec, cache) (Tracer, PrometheusMetrics, Tee), "
                         f"got {type(trace).__name__}")
    if not isinstance(flush_every, int) or isinstance(flush_every, bool) or flush_every < 1:
        raise ValueError(f"flush_every: expected an int >= 1, got {flush_every!r}")
    _check_gate(gate, exact_store, scheme)
    found = _resolve(targets, bare)
    STATE.__init__(scheme=scheme, num_groups=num_groups, delta_step=delta_step, on_record=on_record, trace=trace,
                   flush_every=flush_every, gate=gate, exact_store=exact_store)
    if trace is not None:
        STATE.source = TraceSource(gate)
    from witcert.integrations.sglang_pool import POOL_WRAPPERS

    from witcert.integrations.sglang_pool import wrap_host_load

    wrappers = {"decode": _wrap_decode, "pool": wrap_set_kv_buffer,
                **{f"pool:{n}": w for n, w in POOL_WRAPPERS.items()},
                **{t: wrap_host_load for t in found if t.startswith("host:")}}
    patched = []
    for t, (owner, name, fn) in found.items():
        _ORIGINALS[t] = (owner, name, fn)
        setattr(owner, name, wrappers[t](fn))
        patched.append(f"{getattr(owner, '__module__', owner.__name__)}.{getattr(owner, '__qualname__', '')}.{name}"
                       if isinstance(owner, type) else f"{owner.__name__}.{name}")
    log.warning("WitCert meter installed in SGLang %s: %s (scheme %s)", ver, ", ".join(patched), scheme)
    return patched


def uninstall():
    """Hand pending trace records to the sink (``flush``), then restore SGLang's originals."""
    try:
        if _ORIGINALS:
            flush()
    finally:
        for owner, name, fn in _ORIGINALS.values():
            setattr(owner, name, fn)
        _ORIGINALS.clear()


def installed() -> bool:
    return bool(_ORIGINALS)


# --------------------------------------------------------------------------- KV write


def _round_up_f16(x64: torch.Tensor, lossy: torch.Tensor | bool) -> torch.Tensor:
    from witcert import schemes as S

    w = x64 * (1.0 + WITNESS_SLACK)
    w = torch.where(torch.as_tensor(lossy, device=w.device), w + WITNESS_FLOOR, w)
    return S.round_up_to_dtype(w, torch.float16)


def _group_norms64(x: torch.Tensor, gid: torch.Tensor, G: int) -> torch.Tensor:
    sq = torch.zeros(*x.shape[:-1], G, dtype=torch.float64, device=x.device)
    sq.index_add_(x.dim() - 1, gid.long(), x * x)
    return sq.sqrt()


def _side_for(pool_like_buffer: torch.Tensor, layer_id: int, dtype: torch.dtype) -> LayerSide:
    """The side of this physical K buffer (issue 36: keyed by the buffer, not by a layer id, which
    SGLang's hybrid pools number per sub-pool). A new side has every slot unmetered."""
    key = pool_like_buffer.data_ptr()
    side = STATE.layers.get(key)
    size, H, D = pool_like_buffer.shape[0], pool_like_buffer.shape[-2], pool_like_buffer.shape[-1]
    if side is None or side.k_wit.shape[0] != size or side.k_wit.shape[1] != H or side.dtype != dtype:
        from witcert import bounds as B

        dev = pool_like_buffer.device
        gid = torch.empty(D, dtype=torch.int32)
        for g, idx in enumerate(B.group_slices(D, STATE.num_groups)):
            gid[torch.from_numpy(idx)] = g
        f16 = dict(dtype=torch.float16, device=dev)
        side = LayerSide(layer_id, torch.zeros(size, H, 1, STATE.num_groups, **f16), torch.zeros(size, H, 1, **f16),
                         torch.zeros(size, H, 1, **f16), torch.zeros(size, H, 1, **f16), gid.to(dev), dtype,
                         bad=torch.ones(size, dtype=torch.bool, device=dev), buffer=pool_like_buffer)
        if STATE.scheme != "sglang":
            from kernels.paged import PagedKV

            side.ours = PagedKV.allocate(size, H, D, scheme=STATE.scheme, block_size=1, num_groups=STATE.num_groups,
                                         model_dtype=dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16,
                                         device=dev, layer=layer_id)
        STATE.layers[key] = side
    STATE.by_buffer[key] = side.layer_id
    return side


def side_of(k_buffer: torch.Tensor) -> LayerSide | None:
    """The witness side of SGLang's K buffer (None: no recorded write registered it)."""
    return STATE.layers.get(k_buffer.data_ptr())


def kernel_scale(scale) -> float:
    """The scale as the metered kernel applies it: rounded to float32 (``paged_view`` hands the
    kernel a float32 tensor). Witnesses are taken against this value, not the float64 one: the
    kernel's k̂ is code · fp32(k_scale), so a float64-scale witness can undershoot (issue 36;
    ``tests/test_sglang_pool.py::test_witness_uses_the_kernels_fp32_scale``)."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"k_scale/v_scale: expected a scalar, got shape {tuple(scale.shape)}")
        scale = scale.reshape(()).item()
    return float(torch.tensor(float(scale), dtype=torch.float32))


def _as_logical(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return buf.view(dtype) if buf.dtype != dtype and buf.element_size() == torch.empty(0, dtype=dtype).element_size() else buf


#: tokens per float64 chunk of ``record_write`` (a 4M-token write at once needed 32 GiB: bench/SGLANG.md)
RECORD_CHUNK = 1 << 18


def record_write(k_buffer, v_buffer, layer_id, loc, k_exact, v_exact, k_scale=None, v_scale=None, dtype=None):
    """Witnesses of the tokens just written at ``loc`` (SGLang's stored values vs the exact K/V);
    clears their unmetered bits (sets them when the write's scales are not the side's)."""
    dtype = dtype or k_buffer.dtype
    side = _side_for(k_buffer, layer_id, dtype)
    loc = loc.long()
    kb, vb = _as_logical(k_buffer, dtype), _as_logical(v_buffer, dtype)
    ks, vs = kernel_scale(k_scale), kernel_scale(v_scale)
    if side.scales is None:
        side.scales = (ks, vs)
    G = side.k_wit.shape[-1]
    side.bad[loc] = True  # until the witnesses below are all in place
    for c0 in range(0, loc.numel(), RECORD_CHUNK):  # float64 copies: bounded memory for long prefills
        lc = loc[c0 : c0 + RECORD_CHUNK]
        kh = kb[lc].double() * ks
        vh = vb[lc].double() * vs
        rk = kh - k_exact[c0 : c0 + RECORD_CHUNK].double()
        rv = vh - v_exact[c0 : c0 + RECORD_CHUNK].double()
        side.k_wit[lc, :, 0] = _round_up_f16(_group_norms64(rk, side.group_id, G), (rk != 0).any(-1, keepdim=True))
        side.v_wit[lc, :, 0] = _round_up_f16(rv.norm(dim=-1), (rv != 0).any(-1))
        side.v_norm[lc, :, 0] = _round_up_f16(vh.norm(dim=-1), False)
        side.k_norm[lc, :, 0] = _round_up_f16(kh.norm(dim=-1), False)
    if side.ours is not None:
        from kernels.write import write_kv

        n = loc.numel()
        # the exact K/V as SGLang gave them (write_kv meters against these, in any float dtype)
        write_kv(side.ours, k_exact, v_exact,
                 loc.to(torch.int32)[:, None], torch.arange(n, device=loc.device),
                 torch.zeros(n, dtype=torch.long, device=loc.device))
    if side.scales == (ks, vs):  # a decode meters one scale per buffer: other writes stay unmetered
        side.bad[loc] = False
    else:
        STATE.unmetered["write: k_scale/v_scale differ from the buffer's earlier writes"] += 1
    return side


def _global_layer_id(pool, layer, layer_id):
    """The model's layer id of a write: ``layer.layer_id``, or (a hybrid pool's sub-pool called with
    ``layer=None, layer_id_override=<pool-local id>``) ``pool.model_layer_ids[local]``."""
    if layer is not None and getattr(layer, "layer_id", None) is not None:
        return layer.layer_id
    ids = getattr(pool, "model_layer_ids", None)
    local = layer_id - getattr(pool, "start_layer", 0)
    if ids is not None and 0 <= local < len(ids):
        return ids[local]
    return layer_id


def _recordable(pool, kb):
    """Why this pool's write cannot be recorded (None: it can): the one write SGLang 0.5.23's
    ``MHATokenToKVPool.set_kv_buffer`` does on the NHD, page-size-1-addressable path."""
    own = type(pool).__dict__.get("set_kv_buffer")  # exactly the patched class (a subclass: sglang_pool.UNREGISTERED)
    if not getattr(own, "__witcert__", False):
        return f"{type(pool).__name__} is not the metered pool class (its writes and layout are not audited)"
    if getattr(pool, "is_quantized_kv_cache", False):
        return "quantized KV cache (quant_method)"
    if getattr(pool, "use_hnd", False) or getattr(pool, "kv_cache_layout", "nhd") not in ("nhd", None):
        return f"kv_cache_layout {getattr(pool, 'kv_cache_layout', None)}"
    if kb.dim() != 3:
        return "buffer layout not [slot, head, dim]"
    return None


def wrap_set_kv_buffer(orig):
    """Wrapper of ``MHATokenToKVPool.set_kv_buffer`` (see the module doc). Every outcome either
    records the written slots' witnesses or marks them unmetered (``sglang_pool``)."""
    from witcert.integrations.sglang_pool import mark_unmetered

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None, *args, **kwargs):
        loc = getattr(loc_info, "loc", loc_info)
        layer_id = kwargs.get("layer_id_override")
        if layer_id is None and len(args) >= 1:
            layer_id = args[0]
        if layer_id is None:
            layer_id = layer.layer_id
        mask = kwargs.get("dcp_kv_mask", args[1] if len(args) >= 2 else None)
        k_exact, v_exact = cache_k.clone(), cache_v.clone()  # SGLang divides by the scale in place
        try:
            out = orig(self, layer, loc_info, cache_k, cache_v, k_scale, v_scale, *args, **kwargs)
        except BaseException:  # SGLang's write failed part-way: what it wrote has no witness
            try:
                s_ = STATE.layers.get(self.k_buffer[layer_id - getattr(self, "start_layer", 0)].data_ptr())
                if s_ is not None:
                    mark_unmetered(s_, loc)
            except Exception:
                from witcert.integrations.sglang_pool import sides_of

                for _, s_ in sides_of(self):
                    mark_unmetered(s_, None)
            raise
        kb = side = None
        try:
            local = layer_id - getattr(self, "start_layer", 0)
            kb, vb = self.k_buffer[local], self.v_buffer[local]
            side = STATE.layers.get(kb.data_ptr())
            why = _recordable(self, kb)
            if why is not None:
                raise _Skip(why)
            gid = _global_layer_id(self, layer, layer_id)
            k_exact, v_exact = k_exact.reshape((-1,) + kb.shape[1:]), v_exact.reshape((-1,) + vb.shape[1:])
            loc = loc.reshape(-1)
            if mask is not None:  # decode-context parallel: SGLang's kernel writes the masked-in rows only
                sel = mask.reshape(-1).to(loc.device) != 0
                loc, k_exact, v_exact = loc[sel], k_exact[sel], v_exact[sel]
            store = STATE.exact_store
            if store is not None and hasattr(store, "write"):  # a HostExactStore keeps its copy current
                try:
                    store.write(gid, loc, k_exact, v_exact)
                except Exception as e:  # the slots it missed are refused at page-in (never unsound)
                    STATE.unmetered[f"exact store write: {type(e).__name__}: {e}"] += 1
            record_write(kb, vb, gid, loc, k_exact, v_exact, k_scale, v_scale, getattr(self, "dtype", None))
        except Exception as e:  # the meter never breaks a write; the written slots become unmetered
            STATE.unmetered[f"write: {e}" if isinstance(e, _Skip) else f"write: {type(e).__name__}: {e}"] += 1
            if side is None and kb is not None:
                side = STATE.layers.get(kb.data_ptr())
            if side is not None:
                mark_unmetered(side, getattr(loc_info, "loc", loc_info) if mask is None else None)
            elif kb is None:  # could not even find the buffer: every side of this pool
                from witcert.integrations.sglang_pool import sides_of

                for _, s_ in sides_of(self):
                    mark_unmetered(s_, None)
        return out

    set_kv_buffer.__wrapped__ = orig
    set_kv_buffer.__witcert__ = "record"
    return set_kv_buffer


# --------------------------------------------------------------------------- decode


def block_table_from_indptr(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int):
    """(block_table [B, max_len] int32, seq_lens [B] int32) from SGLang's page-size-1 indices."""
    ip = kv_indptr[: batch + 1].long()
    lens = ip[1:] - ip[:-1]
    mx = max(1, int(lens.max())) if batch else 1
    j = torch.arange(mx, device=kv_indptr.device)
    idx = (ip[:-1, None] + j[None, :]).clamp(max=max(kv_indices.numel() - 1, 0))
    bt = torch.where(j[None, :] < lens[:, None], kv_indices.long()[idx], torch.zeros_like(idx))
    return bt.to(torch.int32), lens.to(torch.int32)


def _unmeterable(args, kwargs):
    q, kb, vb = args[0], args[1], args[2]
    if kwargs.get("page_size", 1) != 1:
        return "page_size != 1"
    if kwargs.get("has_mla"):
        return "MLA"
    if kwargs.get("logit_cap", 0.0):
        return "logit_cap"
    if kwargs.get("sinks") is not None:
        return "sinks"
    if kwargs.get("score_mod") is not None:
        return "score_mod"
    if kwargs.get("xai_temperature_len", -1) not in (-1, None) and kwargs.get("xai_temperature_len", -1) > 0:
        return "xai_temperature_len"
    if kb.dim() != 3 or vb.dim() != 3 or kb.shape[-1] != vb.shape[-1]:
        return "buffer layout"
    if kb.shape[-1] not in (64, 128, 256):
        return f"head_dim {kb.shape[-1]}"
    if q.shape[1] % kb.shape[1] or not 1 <= q.shape[1] // kb.shape[1] <= 8:
        return "GQA group"
    if kb.data_ptr() not in STATE.layers:
        return "no patched write registered this buffer"
    return None


_DECODE_NAMES = DECODE_PARAMS + ("aux_tensors", "enable_lean", "lean_Mp", "lean_Lp", "lean_Op", "lean_locks",
                                 "uneven_batch")


def paged_view(side: LayerSide, k_buffer, v_buffer, k_scale, v_scale):
    """A ``PagedKV`` over SGLang's own buffers (block_size 1) and this layer's side buffers."""
    from kernels.paged import PagedKV

    if side.ours is not None:
        return side.ours
    ks32, vs32 = kernel_scale(k_scale), kernel_scale(v_scale)
    if side.scales is not None and side.scales != (ks32, vs32):
        raise _Skip("k_scale/v_scale differ from the ones the buffer's witnesses were taken against")
    key = (k_buffer.data_ptr(), v_buffer.data_ptr(), tuple(k_buffer.shape), k_buffer.dtype, ks32, vs32,
           side.k_wit.data_ptr())
    if side.view_key == key:
        return side.view
    kb, vb = _as_logical(k_buffer, side.dtype), _as_logical(v_buffer, side.dtype)
    if kb.dtype == torch.float8_e4m3fn:
        scheme = "fp8_e4m3"
    elif kb.dtype == torch.float8_e5m2:
        scheme = "fp8_e5m2"
    elif kb.dtype in (torch.bfloat16, torch.float16, torch.float32):
        scheme = "none"
        if float(k_scale) != 1.0 or float(v_scale) != 1.0:
            raise _Skip("k_scale/v_scale != 1 on an unquantized cache")
    else:
        raise _Skip(f"cache dtype {kb.dtype}")
    size, H = kb.shape[0], kb.shape[1]
    f32 = dict(dtype=torch.float32, device=kb.device)
    # per-layer scalar scales, broadcast to [slot, head, 1] with stride 0 (the kernel loads fp32 fine)
    ks = torch.tensor([ks32], **f32).view(1, 1, 1).expand(size, H, 1)
    vs = torch.tensor([vs32], **f32).view(1, 1, 1).expand(size, H, 1)
    z = torch.zeros(1, dtype=torch.float16, device=kb.device)
    side.view_key = key
    side.view = PagedKV(scheme=scheme, block_size=1, num_groups=side.k_wit.shape[-1], per_token_witness=True,
                   group_id=side.group_id, k_codes=kb.unsqueeze(2), v_codes=vb.unsqueeze(2), k_scale=ks, v_scale=vs,
                   k_zero=z, v_zero=z, k_wit=side.k_wit, v_wit=side.v_wit, v_norm=side.v_norm, k_norm=side.k_norm,
                   exact_k=torch.zeros(1, dtype=kb.dtype if scheme == "none" else torch.bfloat16, device=kb.device),
                   exact_v=z, seed=0, layer=side.layer_id)
    return side.view


def _saturate_rows(rec, rows: torch.Tensor) -> None:
    """Rows [B, 1] (or [B, Hq]) the record cannot vouch for: flagged, TV⁺ 1, output bound +inf
    (in place, on the device)."""
    rec.flag |= rows
    rec.tv_upper_a.masked_fill_(rows, 1.0)
    if rec.tv_upper_b is not None:
        rec.tv_upper_b.masked_fill_(rows, 1.0)
    rec.out_err_upper.masked_fill_(rows, float("inf"))


class _Skip(Exception):
    pass


def metered_decode(args, kwargs, num_splits=None):
    """Run the metered kernel on SGLang's arguments; writes ``o`` and ``attn_lse``, returns
    (side, DecodeOutput, the PagedKV it read, [B, 1] rows reading an unmetered slot)."""
    from kernels.decode import decode

    q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse = args[:8]
    max_kv_splits, sm_scale, k_scale, v_scale = args[9:13]
    side = STATE.layers[kb.data_ptr()]
    cache = paged_view(side, kb, vb, k_scale, v_scale)
    Bsz = q.shape[0]
    if Bsz == 0:
        raise _Skip("an empty batch")
    # SGLang's CSR rows read by the kernel directly (no [B, max_len] table); no host sync: the
    # split count from the mean length (kernels.decode.choose_splits); an empty row (which SGLang's
    # decode never sends) gets what the reference gives it: output 0, TV⁺ 0 (kernels.decode.decode)
    indptr = kv_indptr[: Bsz + 1]
    out = decode(cache, q, kv_indices, None, kv_indptr=indptr, sm_scale=float(sm_scale), num_splits=num_splits,
                 delta_step=STATE.delta_step, validate=False)
    from witcert.integrations.sglang_pool import bad_rows

    bad = bad_rows(side, indptr, kv_indices, Bsz)
    _saturate_rows(out.meter, bad)
    o.view(Bsz, q.shape[1], -1).copy_(out.o.to(o.dtype))
    attn_lse[:Bsz, : q.shape[1], 0] = out.lse.to(attn_lse.dtype)
    attn_lse[:Bsz, : q.shape[1], 1:] = float("-inf")
    return side, out, cache, bad


def _wrap_decode(orig):
    def decode_attention_fwd(*args, **kwargs):
        # normalise to positional (the first 13) + keywords
        names = _DECODE_NAMES
        args = list(args)
        for i in range(len(args), 13):
            args.append(kwargs.pop(names[i]))
        kw = dict(kwargs)
        for i, a in enumerate(args[13:], start=13):
            kw[names[i]] = a
        why = _unmeterable(args, kw)
        if why is None:
            try:
                side, out, cache, bad = metered_decode(args[:13], kw)
            except _Skip as e:
                why = str(e)
            else:
                layer_id = side.layer_id
                rec, report = out.meter, None
                if STATE.gate is not None:
                    try:
                        rec, report = gate_call(args[:13], side, cache, out)
                        if rec is not out.meter:  # a row reading an unmetered slot stays unmetered
                            _saturate_rows(rec, bad)
                    except Exception as e:  # serve the first pass (o, lse and record still agree)
                        STATE.unmetered[f"gate: {type(e).__name__}: {e}"] += 1
                        log.exception("WitCert gate failed on layer %s; served the ungated pass", layer_id)
                        rec, report = out.meter, _failed_gate_report(layer_id, out.meter, cache.num_kv_heads)
                STATE.emit(layer_id, rec)
                if STATE.trace is not None:
                    _queue_trace(layer_id, cache, out.meter, rec, report, args[0])
                return None
        STATE.unmetered[f"decode: {why}"] += 1
        return orig(*args[:13], **kw)

    decode_attention_fwd.__wrapped__ = orig
    decode_attention_fwd.__witcert__ = True
    return decode_attention_fwd


def reduce_tp_records(per_rank: list, dim: int = 1):
    """The records of ranks that each metered a contiguous share of the query heads (SGLang's
    split: rank r holds heads [r·Hq/tp, (r+1)·Hq/tp)), put back in head order: the tensor that
    ``all_gather`` over the TP group would give. Per-request maxima are then ``.amax(dim)``."""
    out = {}
    for f in ("tv_upper_a", "out_err_upper", "eps_max", "xi", "rho", "flag"):
        parts = [getattr(r, f) for r in per_rank]
        if any(p is None for p in parts):
            continue
        out[f] = torch.cat(parts, dim=dim)
    return out


# --------------------------------------------------------------------------- trace and metrics

#: rows of ``TraceSource.pagein_bytes`` (layer ids at or above it are not byte-accounted for
#: Prometheus; the trace's bytes do not need it: block size 1 makes blocks × bytes exact)
PAGEIN_LAYERS = 4096


@dataclasses.dataclass
class SGLangStepRecord:
    """One metered (layer, decode call) on the host, with the field names ``witcert.trace`` and
    ``witcert.metrics`` read from ``witcert.cache.StepRecord``: arrays [B, Hq] over the rows of
    SGLang's decode batch at that call (``seq`` = the row, not a request id)."""

    step: int
    layer: int
    tv_a: np.ndarray  # Tier A TV⁺ after the gate's repair (= tv_a_pre without a gate or a page-in)
    tv_a_pre: np.ndarray
    out_err: np.ndarray
    tv_b: np.ndarray | None
    flag: np.ndarray  # non-finite inputs, or (certified gate) still over τ after the page-in budget
    nonfinite: np.ndarray
    pagein_blocks: np.ndarray  # [B, Hkv] (slot, kv head) pairs paged in at this call
    eps_max: np.ndarray | None = None  # before repair
    parts_pre: np.ndarray | None = None  # [3, B, Hq] tanh / e-form / tilt before repair
    tv_b_pre: np.ndarray | None = None
    delta_step: float | None = None
    delta_spent: float | None = None


class TraceSource:
    """What a trace sink sees as the ``cache`` argument of ``record(rec, cache)`` for SGLang's
    records: the attributes ``witcert.trace.Tracer`` and ``witcert.metrics.PrometheusMetrics``
    read. One object per ``install()``: the Tracer labels all of it as one request
    (``tracer.new_request(label)`` before ``install()`` names it)."""

    block_size = 1

    def __init__(self, gate=None):
        self.gate = gate
        self.records: list = []  # identity only (the Tracer's request key)
        self.scheme = ""
        self.num_kv_heads = 1
        self.head_dim = 0
        self.layers: list = []
        self.pagein_bytes = np.zeros((PAGEIN_LAYERS, 1), dtype=np.int64)  # cumulative per layer


_TRACE_FIELDS = ("tv_upper_a", "out_err_upper", "flag")
_TRACE_PRE_FIELDS = ("tv_upper_a", "eps_max", "tanh", "eform", "tilt")


def _queue_trace(layer_id, cache, pre, post, report, q):
    """Keep a metered call's records (device tensors, no copy, no sync) for the next flush."""
    STATE.steps[layer_id] += 1
    label = f"sglang:{cache.scheme}" if STATE.scheme == "sglang" else cache.scheme
    STATE.pending.append((layer_id, STATE.steps[layer_id], label, cache.num_kv_heads, cache.head_dim, pre, post,
                          report, q.dtype))
    if len(STATE.pending) >= STATE.flush_every:
        try:
            flush()
        except Exception as e:  # a failing sink never breaks serving: those records are lost, counted
            STATE.unmetered[f"trace: {type(e).__name__}: {e}"] += 1
            log.exception("WitCert trace sink failed; records dropped")


def flush() -> int:
    """Hand the pending records to the trace sink; returns how many (layer, call) records.

    One device→host transfer for all of them (the records' tensors concatenated), then the
    sink's ``record`` per record on the host. Called every ``flush_every`` metered calls, by
    ``uninstall()``, and by an operator (at shutdown, or before reading a metrics endpoint)."""
    pend, STATE.pending = STATE.pending, []
    if not pend or STATE.trace is None:
        return 0
    parts, shapes = [], []
    for (_, _, _, _, _, pre, post, _, _) in pend:
        ts = [getattr(post, f) for f in _TRACE_FIELDS] + [getattr(pre, f) for f in _TRACE_PRE_FIELDS]
        ts += [post.tv_upper_b, pre.tv_upper_b]
        for t in ts:
            shapes.append(None if t is None else tuple(t.shape))
            if t is not None:
                parts.append(t.detach().reshape(-1).double())
    try:
        flat = torch.cat(parts).cpu().numpy() if parts else np.zeros(0)
    except RuntimeError:  # tensors on several devices: one transfer each
        flat = np.concatenate([p.cpu().numpy() for p in parts]) if parts else np.zeros(0)
    pos, it = 0, iter(shapes)

    def take():
        nonlocal pos
        shp = next(it)
        if shp is None:
            return None
        n = int(np.prod(shp))
        a = flat[pos : pos + n].reshape(shp)
        pos += n
        return a

    src = STATE.source
    for (layer_id, step, label, hkv, hd, pre, post, report, qdt) in pend:
        tv, err, flag, tv_pre, eps, tanh, eform, tilt, tvb, tvb_pre = (take() for _ in range(10))
        flag = flag > 0
        Bsz = tv.shape[0]
        blocks = np.zeros((Bsz, hkv), dtype=np.int64)
        budget = np.zeros_like(flag)
        ex_dtype = qdt
        if report is not None:
            blocks, budget = report.pagein, report.budget_spent
            ex_dtype = report.exact_dtype or qdt
            if layer_id < PAGEIN_LAYERS:
                src.pagein_bytes[layer_id, 0] += int(sum(p[3] for p in report.paged))
        ds = STATE.delta_step if tvb is not None else None
        rec = SGLangStepRecord(step=step, layer=layer_id, tv_a=tv, tv_a_pre=tv_pre, out_err=err, tv_b=tvb,
                               flag=flag | budget, nonfinite=flag, pagein_blocks=blocks, eps_max=eps,
                               parts_pre=np.stack([tanh, eform, tilt]), tv_b_pre=tvb_pre, delta_step=ds,
                               delta_spent=ds)
        src.scheme, src.num_kv_heads, src.head_dim = label, hkv, hd
        src.layers = [types.SimpleNamespace(dtype=ex_dtype)]
        STATE.trace.record(rec, src)
    return len(pend)


# --------------------------------------------------------------------------- the gate


class HostExactStore:
    """A host-side exact store keyed by (layer, SGLang token slot), kept current by the patched
    pool write (``install(..., exact_store=HostExactStore())``): every write copies the exact
    K/V it was handed (before SGLang's scale division) here, so a reused slot is overwritten
    with its new token. ``pin``: pinned host memory (faster page-in on CUDA). Memory: one full
    copy of the KV cache in the model dtype per layer, on the host."""

    def __init__(self, device="cpu", pin: bool = False):
        self.device, self.pin = torch.device(device), pin
        self.k: dict = {}
        self.v: dict = {}

    def write(self, layer_id, loc, k, v):
        loc = loc.long().to(self.device)
        kb = self.k.get(layer_id)
        need = int(loc.max()) + 1 if loc.numel() else 0
        if kb is None or kb.shape[0] < need or kb.shape[1:] != k.shape[1:] or kb.dtype != k.dtype:
            size = max(need, 0 if kb is None else 2 * kb.shape[0])  # geometric growth
            nk = torch.zeros((size,) + tuple(k.shape[1:]), dtype=k.dtype, device=self.device)
            nv = torch.zeros((size,) + tuple(v.shape[1:]), dtype=v.dtype, device=self.device)
            if kb is not None and kb.shape[1:] == k.shape[1:] and kb.dtype == k.dtype:
                nk[: kb.shape[0]], nv[: kb.shape[0]] = kb, self.v[layer_id]
            if self.pin and self.device.type == "cpu" and torch.cuda.is_available():
                nk, nv = nk.pin_memory(), nv.pin_memory()
            self.k[layer_id], self.v[layer_id] = nk, nv
        self.k[layer_id][loc] = k.detach().to(self.device)
        self.v[layer_id][loc] = v.detach().to(self.device)

    def __call__(self, layer_id, slots):
        s = slots.long().to(self.device)
        return self.k[layer_id][s], self.v[layer_id][s]


@dataclasses.dataclass
class GateReport:
    """What the gate did at one metered (layer, decode call) (``STATE.gate_log``)."""

    layer_id: int
    rows: list  # request rows that exceeded τ (some query head) in the first pass
    repaired_rows: list  # rows re-served from the overlay (at least one page-in)
    paged: list  # (row, kv_head, slot, bytes) in page-in order
    pagein: np.ndarray  # [B, Hkv] (slot, kv head) pairs paged in
    budget_spent: np.ndarray  # [B, Hq] bool: certified policy, still over τ after the loop
    tv_pre: torch.Tensor  # [B, Hq] first pass (SGLang's stored values)
    tv_post: torch.Tensor  # [B, Hq] after repair (= tv_pre on rows without a page-in)
    rejected: int  # page-ins refused (the store's value is farther from k̂ than the slot's witness)
    overlay: object = None  # the last overlay (PagedKV, rows' compacted tokens) and its index
    exact_dtype: torch.dtype | None = None


def _check_gate(gate, exact_store, scheme):
    if gate is None:
        if exact_store is not None:
            raise ValueError("exact_store: only used with a gate (install(..., gate=Gate(...), exact_store=...))")
        return
    from witcert.gate import Gate

    if not isinstance(gate, Gate):
        raise ValueError(f"gate: expected a witcert.gate.Gate, got {type(gate).__name__}")
    if exact_store is None or not callable(exact_store):
        raise ValueError("gate: SGLang keeps no exact KV; pass exact_store=<callable (layer_id, slots) -> (k, v)> "
                         "or exact_store=HostExactStore()")
    if gate.tier != "A":
        raise ValueError("gate: tier 'B' needs int8_dither, which SGLang's write path cannot serve")
    if scheme != "sglang":
        raise ValueError(f"gate: with scheme={scheme!r} (codes of ours) the overlay would need a dequantizer of "
                         "those codes; the gate serves scheme='sglang' (SGLang's own bf16/fp16/fp8 cache) only")


def _row_slots(kv_indptr, kv_indices, rows):
    ip = kv_indptr.long()
    return [kv_indices[int(ip[b]) : int(ip[b + 1])].long() for b in rows]


def _overlay(side, kb, vb, ks, vs, slots, dtype):
    """A PagedKV (scheme "none", block size 1, in q's dtype) of the rows' tokens, compacted:
    token t of the overlay holds rnd(k̂) of ``slots[t]`` with witness W ⊕ ‖rnd(k̂) − k̂‖ (the
    triangle inequality: ‖rnd(k̂) − k‖ ≤ ‖rnd(k̂) − k̂‖ + ‖k̂ − k‖ ≤ … + W, rounded up; W itself
    where rnd(k̂) = k̂, as for SGLang's fp8 codes times a power-of-two scale)."""
    from kernels.paged import PagedKV

    G = side.k_wit.shape[-1]
    kh = kb[slots].double() * ks  # [N, H, D] what the first pass served (k̂ = code · k_scale)
    vh = vb[slots].double() * vs
    kst, vst = kh.to(dtype), vh.to(dtype)
    ek = _group_norms64(kst.double() - kh, side.group_id, G)  # [N, H, G]
    evv = (vst.double() - vh).norm(dim=-1)  # [N, H]
    W = side.k_wit[slots, :, 0]  # fp16, rounded up
    P = side.v_wit[slots, :, 0]
    kw = torch.where(ek == 0, W, _round_up_f16(W.double() + ek, True))
    vw = torch.where(evv == 0, P, _round_up_f16(P.double() + evv, True))
    N, H, D = kst.shape
    f32 = dict(dtype=torch.float32, device=kb.device)
    one = torch.ones(1, 1, 1, **f32).expand(N, H, 1)
    z = torch.zeros(1, dtype=torch.float16, device=kb.device)
    return PagedKV(scheme="none", block_size=1, num_groups=G, per_token_witness=True, group_id=side.group_id,
                   k_codes=kst.unsqueeze(2).contiguous(), v_codes=vst.unsqueeze(2).contiguous(), k_scale=one,
                   v_scale=one, k_zero=z, v_zero=z, k_wit=kw.unsqueeze(2).contiguous(),
                   v_wit=vw.unsqueeze(2).contiguous(), v_norm=_round_up_f16(vst.double().norm(dim=-1), False)[:, :, None],
                   k_norm=_round_up_f16(kst.double().norm(dim=-1), False)[:, :, None],
                   exact_k=torch.zeros(1, dtype=dtype, device=kb.device), exact_v=z, seed=0, layer=side.layer_id)


#: tokens per float32 chunk of the risk's logits (bounds the memory of long rows)
RISK_CHUNK = 1 << 15


def _overlay_risk(ov, q_rows, offs, lens, repaired, sm, tau_v):
    """Block risk [R, Hkv, max_len] (``witcert.gate.block_risk``, block size 1) of the overlay's
    current values and witnesses, per row: p̂ and ε from a float32/float64 reference evaluation
    of the rows over τ only. It ranks page-ins; no bound is taken from it."""
    from witcert.gate import block_risk

    R, Hq, D = q_rows.shape
    H = ov.k_codes.shape[1]
    GQ = Hq // H
    G = ov.k_wit.shape[-1]
    nmax = max(lens)
    out = torch.zeros(R, H, nmax, dtype=torch.float64, device=q_rows.device)
    for r in range(R):
        a, n = offs[r], lens[r]
        qf = q_rows[r].float().view(H, GQ, D)
        lg = torch.cat([torch.einsum("hgd,nhd->hgn", qf, ov.k_codes[a + c : a + min(n, c + RISK_CHUNK), :, 0].float())
                        for c in range(0, n, RISK_CHUNK)], -1).double() * sm  # [H, GQ, n]
        qn = _group_norms64(q_rows[r].double().view(H, GQ, D), ov.group_id, G)  # [H, GQ, G]
        W = ov.k_wit[a : a + n, :, 0].double().permute(1, 0, 2)  # [H, n, G]
        eps = abs(sm) * torch.einsum("hgc,hnc->hgn", qn, W)
        p = torch.softmax(lg, -1)
        allowed = torch.ones(1, H, GQ, 1, n, dtype=torch.bool, device=lg.device)
        live = torch.ones(1, H, GQ, 1, dtype=torch.bool, device=lg.device)
        vw = ov.v_wit[a : a + n, :, 0].double().T[None] if tau_v is not None else None
        out[r, :, :n] = block_risk(p[None, :, :, None], lg[None, :, :, None], allowed, live, eps[None, :, :, None],
                                   block_size=1, num_blocks=n, repaired=repaired[r : r + 1, :, :n], v_wit=vw,
                                   tau_v=tau_v)[0]
    return out


_RECORD_ROW_FIELDS = ("tv_upper_a", "tv_upper_b", "out_err_upper", "out_err_upper_b", "eps_max", "tb_max", "hist",
                      "hist_b", "tanh", "eform", "tilt", "flag", "xi", "rho")


def _merge_rows(pre, post, rows_t, sel_t):
    """``pre`` with rows ``rows_t`` replaced by ``post``'s rows ``sel_t`` (a field either lacks: None)."""
    kw = {}
    for f in _RECORD_ROW_FIELDS:
        a, b = getattr(pre, f), getattr(post, f)
        if a is None or b is None:
            kw[f] = None
            continue
        m = a.clone()
        m[rows_t] = b[sel_t].to(m.dtype)
        kw[f] = m
    return dataclasses.replace(pre, **kw)


def _failed_gate_report(layer_id, rec, Hkv):
    """The report of a call whose gate raised: nothing paged in; a certified gate flags its rows over τ."""
    from witcert.gate import exceeds

    gate = STATE.gate
    over = exceeds(gate, rec.tv_upper_a, rec.tv_upper_b, rec.out_err_upper).cpu().numpy()
    Bsz = over.shape[0]
    report = GateReport(layer_id, [], [], [], np.zeros((Bsz, Hkv), np.int64),
                        over if gate.policy == "certified" else np.zeros_like(over), rec.tv_upper_a, rec.tv_upper_a, 0)
    STATE.gate_log.append(report)
    return report


def gate_call(args, side, cache, out):
    """The gate on one metered decode call (module doc "Gate"); returns (record, GateReport|None).
    Rewrites the rows of SGLang's ``o`` / ``attn_lse`` it repaired."""
    from kernels.decode import decode
    from witcert.gate import exceeds, repair

    gate = STATE.gate
    rec = out.meter
    q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse = args[:8]
    max_kv_splits, sm_scale, k_scale, v_scale = args[9:13]
    Bsz, Hq, D = q.shape
    layer_id = side.layer_id
    H = cache.num_kv_heads
    GQ = Hq // H
    over0 = exceeds(gate, rec.tv_upper_a, rec.tv_upper_b, rec.out_err_upper)  # [B, Hq]
    if gate.max_pagein_blocks == 0 or not bool(over0.any()):  # the gate's one host sync per call
        if gate.policy == "certified" and bool(over0.any()):  # no page-in budget: flagged
            report = GateReport(layer_id, [], [], [], np.zeros((Bsz, H), np.int64), over0.cpu().numpy(),
                                rec.tv_upper_a, rec.tv_upper_a, 0)
            STATE.gate_log.append(report)
            return rec, report
        return rec, None
    rows = torch.nonzero(over0.any(-1)).flatten().tolist()
    R = len(rows)
    kbl, vbl = _as_logical(kb, side.dtype), _as_logical(vb, side.dtype)
    ks, vs = kernel_scale(k_scale), kernel_scale(v_scale)
    slots_r = _row_slots(kv_indptr, kv_indices, rows)
    lens = [int(s.numel()) for s in slots_r]
    offs = [0]
    for n in lens[:-1]:
        offs.append(offs[-1] + n)
    slots = torch.cat(slots_r)
    ov = _overlay(side, kbl, vbl, ks, vs, slots, q.dtype)
    nmax = max(lens)
    j = torch.arange(nmax, device=q.device)
    off_t = torch.tensor(offs, device=q.device)
    len_t = torch.tensor(lens, device=q.device, dtype=torch.int32)
    bt = torch.where(j[None] < len_t[:, None], off_t[:, None] + j[None], torch.zeros_like(j)[None]).to(torch.int32)
    q_rows = q[rows].contiguous()
    sm = float(sm_scale)
    splits = max(1, min(int(max_kv_splits), math.ceil(nmax / 256)))
    repaired = torch.zeros(R, H, nmax, dtype=torch.bool, device=q.device)  # paged in, or refused
    cur = {"rec": None}
    over_rows = over0[rows].view(R, H, GQ)
    fetched: dict = {}
    paged_full: list = []
    rejected = [0]
    ex_dtype = [None]

    def over():
        if cur["rec"] is None:
            return over_rows.any(-1).cpu().numpy()
        r = cur["rec"]
        return exceeds(gate, r.tv_upper_a, r.tv_upper_b, r.out_err_upper).view(R, H, GQ).any(-1).cpu().numpy()

    def page_in(r, h, t):
        repaired[r, h, t] = True  # never chosen again this call, moved or refused
        slot = int(slots_r[r][t])
        if slot not in fetched:
            try:
                kx, vx = STATE.exact_store(layer_id, torch.tensor([slot], device=q.device))
                kx, vx = kx.reshape(H, D), vx.reshape(H, D)
            except Exception as e:  # a store without the slot: refused, the token stays as served
                STATE.gate_rejected[f"store: {type(e).__name__}: {e}"] += 1
                kx = vx = None
            fetched[slot] = (kx, vx)
        kx, vx = fetched[slot]
        if kx is None:
            rejected[0] += 1
            return 0
        kx64, vx64 = kx.to(q.device).double(), vx.to(q.device).double()
        # the store must be consistent with the slot's witnesses (a stale or wrong store is refused:
        # for the true exact K/V, ‖k̂ − k‖[g] ≤ W[g] and ‖v̂ − v‖ ≤ φ by construction of the witnesses)
        kh = kbl[slot, h].double() * ks
        vh = vbl[slot, h].double() * vs
        dk = _group_norms64((kh - kx64[h])[None], side.group_id, side.k_wit.shape[-1])[0]
        dv = (vh - vx64[h]).norm()
        if not (torch.isfinite(kx64[h]).all() and torch.isfinite(vx64[h]).all()
                and bool((dk <= side.k_wit[slot, h, 0].double()).all()) and bool(dv <= side.v_wit[slot, h, 0].double())):
            STATE.gate_rejected["store value farther from the stored one than its witness"] += 1
            rejected[0] += 1
            return 0
        i = offs[r] + t
        kst, vst = kx64[h].to(q.dtype), vx64[h].to(q.dtype)
        rk, rv = kst.double() - kx64[h], vst.double() - vx64[h]
        ov.k_codes[i, h, 0] = kst
        ov.v_codes[i, h, 0] = vst
        ov.k_wit[i, h, 0] = _round_up_f16(_group_norms64(rk[None], ov.group_id, ov.k_wit.shape[-1])[0],
                                          bool((rk != 0).any()))
        ov.v_wit[i, h, 0] = _round_up_f16(rv.norm(), bool((rv != 0).any()))
        ov.v_norm[i, h, 0] = _round_up_f16(vst.double().norm(), False)
        ov.k_norm[i, h, 0] = _round_up_f16(kst.double().norm(), False)
        nbytes = 2 * D * kx.element_size()
        ex_dtype[0] = kx.dtype
        paged_full.append((rows[r], h, slot, nbytes))
        return nbytes

    def remeasure():
        cur["out"] = decode(ov, q_rows, bt, len_t, sm_scale=sm, num_splits=splits, delta_step=None)
        cur["rec"] = cur["out"].meter

    res = repair(gate, over=over, risk=lambda: _overlay_risk(ov, q_rows, offs, lens, repaired, sm, gate.tau_v),
                 page_in=page_in, remeasure=remeasure)
    pagein = np.zeros((Bsz, H), dtype=np.int64)
    pagein[rows] = res.pagein
    fixed = [i for i in range(R) if res.pagein[i].sum() > 0]
    final = rec
    if fixed and cur["rec"] is not None:
        rows_t = torch.tensor([rows[i] for i in fixed], device=q.device)
        sel_t = torch.tensor(fixed, device=q.device)
        po = cur["out"]
        final = _merge_rows(rec, po.meter, rows_t, sel_t)  # before the writes: a failure leaves the first pass
        new_o, new_lse = po.o[sel_t].to(o.dtype), po.lse[sel_t].to(attn_lse.dtype)
        o.view(Bsz, Hq, -1)[rows_t] = new_o
        attn_lse[rows_t, :Hq, 0] = new_lse
    budget = np.zeros((Bsz, Hq), dtype=bool)
    if gate.policy == "certified":
        budget = exceeds(gate, final.tv_upper_a, final.tv_upper_b, final.out_err_upper).cpu().numpy()
    report = GateReport(layer_id, rows, [rows[i] for i in fixed], paged_full, pagein, budget, rec.tv_upper_a,
                        final.tv_upper_a, rejected[0], (ov, slots, offs, lens, rows), ex_dtype[0])
    STATE.gate_log.append(report)
    return final, report
