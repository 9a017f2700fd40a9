"""The WitCert meter inside SGLang, without a fork: an environment-guarded in-process patch.

    import witcert.integrations.sglang as ws
    ws.install()          # patches only when WITCERT_SGLANG=1; returns None and touches nothing otherwise
    ws.install(force=True)                         # explicit: patch regardless of the variable

What is wrapped (the whole list; nothing else is touched), for SGLang ``SUPPORTED_VERSIONS``:

* ``sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`` (module attribute; the
  Triton backend ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend`` binds it in its
  ``__init__``, so ``install()`` must run before the model runner is built);
* ``sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer`` (class attribute; it
  records only for an instance of exactly that class: a subclass's buffers are never registered);
* the other KV-touching methods (``move_kv_cache``, ``load_cpu_copy``, ``set_kv_buffer_prefix_valid``,
  ``_finalize_backing_tokens``, HiCache host loads, the allocators' ``alloc*``): ``sglang_pool``
  (the list, the audit of the rest, the per-slot "unmetered" bit: issue 36).

On another SGLang version, or when either target cannot be imported or does not have the
expected signature, ``install()`` raises ``UnsupportedSGLang`` before patching anything (never a
half patch). ``uninstall()`` restores both originals.

Witnesses are kept per physical K buffer (``LayerSide``, keyed by the buffer's address), not per
layer id; ``layer`` in records is the model's layer id (a hybrid pool's sub-pool: through its
``model_layer_ids``). KV write (the pool's set-KV path): for each token written at slot ``loc`` the wrapper keeps the
exact K/V it was handed (before SGLang's in-place division by ``k_scale``), calls SGLang's own
write, reads back what SGLang stored and writes side buffers indexed like SGLang's pool
(``[slot, kv_head, 1, ·]``): per-group key witnesses ``W ≥ ‖(k̂ − k)[g]‖``, ``φ ≥ ‖v̂ − v‖``,
``ν ≥ ‖v̂‖``, ``κ ≥ ‖k̂‖`` (fp64 norms × (1 + 2^-12) + 2^-100, rounded up into float16), with
``k̂ = code · k_scale`` for SGLang's fp8 cache (``--kv-cache-dtype fp8_e4m3``) and ``k̂ = k`` for a
bf16/fp16 cache (``k_scale`` rounded to float32 first, as the kernel applies it: ``kernel_scale``).
With ``dcp_kv_mask`` only the masked-in rows are recorded. With ``scheme=<one of ours>`` the wrapper additionally quantizes the exact K/V
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

Gate (``install(..., gate=witcert.gate.Gate(...), exact_store=...)``; scheme "sglang" only): the operator
supplies the exact K/V; rows over τ are repaired on a per-call overlay (``witcert.integrations.sglang_gate``'s
module doc: the steps, their soundness and their costs).

CUDA graphs: the record step (``record_write``) and the metered decode are device operations only, so
SGLang's decode-graph capture takes them; a captured call's record is a static tensor set rewritten by each
replay, read with ``static_records(batch_size)`` (``on_record`` and the trace are not called for replays). The
gate synchronises with the host and raises ``GraphCaptureUnsupported`` inside a capture. Not run here: a real
capture of SGLang's graph runner, and the real server path (see docs/sglang.md).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types

import torch

from contract.schemes import SCHEMES

# (the F401 exemptions: names of the modules below this one, reachable as ``witcert.integrations.sglang.NAME``
# as before the split: the documented ``ws.flush()``, ``ws.HostExactStore()``, ``ws.STATE``, ...)
from witcert.integrations.sglang_decode import (  # noqa: F401
    GraphCaptureUnsupported,
    _wrap_decode,
    block_table_from_indptr,
    metered_decode,
    paged_view,
    reduce_tp_records,
)
from witcert.integrations.sglang_gate import RISK_CHUNK, GateReport, HostExactStore, _check_gate, gate_call  # noqa: F401
from witcert.integrations.sglang_pool import (
    ALLOC_WRAPPED,
    HOST_LOADS,
    HOST_MODULES,
    POOL_WRAPPERS,
    mark_unmetered,
    sides_of,
    slot_indices,
    wrap_alloc,
    wrap_host_load,
)
from witcert.integrations.sglang_state import (  # noqa: F401
    DECODE_PARAMS,
    DEFER_MAX_BATCH,
    POOL_PARAMS,
    STATE,
    LayerSide,
    State,
    _Skip,
    log,
)
from witcert.integrations.sglang_trace import PAGEIN_LAYERS, SGLangStepRecord, TraceSource, flush  # noqa: F401
from witcert.integrations.sglang_witness import (  # noqa: F401 (kernel_scale: re-exported)
    _as_logical,
    _group_norms64,
    _round_up_f16,
    kernel_scale,
    kernel_scale_tensor,
)

SUPPORTED_VERSIONS = ("0.5.23",)
ENV = "WITCERT_SGLANG"
DECODE_MODULE = "sglang.kernels.ops.attention.decode_attention"
DECODE_FN = "decode_attention_fwd"
POOL_MODULE = "sglang.srt.mem_cache.memory_pool"
POOL_CLASS = "MHATokenToKVPool"
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
                for name in POOL_WRAPPERS:  # the other KV-touching methods (sglang_pool's module doc)
                    found[f"pool:{name}"] = (cls, name, cls.__dict__[name])
                for mname, by_class in ALLOC_WRAPPED.items():  # allocators: fresh slots are unmetered
                    mod = imp(mname)
                    for cname, names in by_class.items():
                        ac = getattr(mod, cname)
                        for name in names:
                            found[f"alloc:{mname}.{cname}.{name}"] = (ac, name, ac.__dict__[name])

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
            trace=None, flush_every: int = 64, gate=None, exact_store=None, defer_tilt: bool = False,
            defer_max_batch: int = DEFER_MAX_BATCH):
    """Patch SGLang when ``WITCERT_SGLANG=1`` (or ``force``); otherwise do nothing, return None.

    Every target is resolved and checked first; only then is anything replaced (all or none).
    ``targets``/``bare`` exist for tests on machines where SGLang's server modules cannot be
    imported; a server uses the defaults. Returns the list of patched ``module.qualname``.

    ``trace``: a trace sink (``witcert.trace.Tracer``, ``witcert.metrics.PrometheusMetrics`` or a
    ``witcert.trace.Tee`` of them) that receives every metered (layer, decode call) as trace rows
    (module doc "Trace and metrics"); records wait on the device and are handed over every
    ``flush_every`` metered calls and at ``flush()`` / ``uninstall()``.
    ``gate`` (``witcert.gate.Gate``) with ``exact_store`` (a page-in callback, or a
    ``HostExactStore``): repair rows over τ from an exact overlay (module doc "Gate").
    ``defer_tilt``: the metered calls captured in CUDA graphs leave their records' tilt and closed forms to
    ``static_records``, which runs every captured layer's in one launch (``kernels.tilt_batch``; until then a
    record's TV⁺ is 1, sound); not with ``delta_step`` (Tier B keeps the tilt in its merge). Each captured batch
    size keeps its own deferred records on the GPU (621 bytes per query head, layer and request: 20 MB at batch 32
    for Llama-8B's 32 layers × 32 heads), so only batch sizes up to ``defer_max_batch`` defer; larger ones keep
    the tilt in their merge (sound; its cost is a smaller share of a large batch's pass), said once per batch size."""
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
    if not isinstance(defer_tilt, bool):
        raise ValueError(f"defer_tilt: expected True or False, got {defer_tilt!r}")
    if not isinstance(defer_max_batch, int) or isinstance(defer_max_batch, bool) or defer_max_batch < 1:
        raise ValueError(f"defer_max_batch: expected an int >= 1, got {defer_max_batch!r}")
    if defer_tilt and delta_step is not None:
        raise ValueError("defer_tilt=True: Tier A only (delta_step set: the Tier B record keeps its tilt in the merge)")
    found = _resolve(targets, bare)
    STATE.__init__(scheme=scheme, num_groups=num_groups, delta_step=delta_step, on_record=on_record, trace=trace,
                   flush_every=flush_every, gate=gate, exact_store=exact_store, defer_tilt=defer_tilt,
                   defer_max_batch=defer_max_batch)
    if trace is not None:
        STATE.source = TraceSource(gate)
    wrappers = {"decode": _wrap_decode, "pool": wrap_set_kv_buffer,
                **{f"pool:{n}": w for n, w in POOL_WRAPPERS.items()},
                **{t: wrap_host_load for t in found if t.startswith("host:")},
                **{t: wrap_alloc for t in found if t.startswith("alloc:")}}
    patched = []
    for t, (owner, name, fn) in found.items():
        _ORIGINALS[t] = (owner, name, fn)
        setattr(owner, name, wrappers[t](fn))
        patched.append(f"{getattr(owner, '__module__', owner.__name__)}.{getattr(owner, '__qualname__', '')}.{name}"
                       if isinstance(owner, type) else f"{owner.__name__}.{name}")
    log.warning("WitCert meter installed in SGLang %s: %s (scheme %s)", ver, ", ".join(patched), scheme)
    return patched


def static_records(batch_size: int) -> list:
    """The records of the metered decode calls captured in the CUDA graph of ``batch_size`` rows, in call order:
    [(layer id, ``MeterRecord``)]. Their tensors are the graph's outputs: after each replay of that graph they
    hold that step's records (rows past the step's real batch are the graph's padding); read or copy them
    before the next replay. Empty without a capture. Under CUDA graphs ``on_record`` and the trace see only
    eager (uncaptured) calls. With ``install(defer_tilt=True)`` the replay leaves each record's TV⁺ at 1 (sound,
    pending) and this call first runs the closed forms and the tilt of every captured layer of that batch size in one
    launch (no host synchronisation; idempotent): call it after each replay, before reading, on the replay's stream
    (or after synchronising with it: a finish running beside a replay would mix two steps' inputs). Several graphs of
    one batch size (SGLang's LoRA or attention variants, a recapture) all add their calls' records here, in capture
    order, and a replay rewrites only its own graph's: the adapter logs a warning at the second capture."""
    tb = STATE.tilt.get(batch_size)
    if tb is not None:
        tb.finish(tilt_above=-1.0)  # (the fused merge's default: every row's tilt in full)
    return list(STATE.static.get(batch_size, ()))


def uninstall():
    """Hand pending trace records to the sink (``flush``), then restore SGLang's originals. Every recorded
    buffer's slots become unmetered: SGLang's writes are no longer recorded, and a decode bound earlier (a
    backend that kept the patched function, a captured graph) still meters with these sides."""
    try:
        if _ORIGINALS:
            flush()
    finally:
        for owner, name, fn in _ORIGINALS.values():
            setattr(owner, name, fn)
        _ORIGINALS.clear()
        for side in STATE.layers.values():
            side.bad.fill_(True)


def installed() -> bool:
    return bool(_ORIGINALS)


# --------------------------------------------------------------------------- KV write


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
        # one row more than the pool: the record step's trash row for masked-out writes (LayerSide.rows)
        rows = (torch.zeros(size + 1, H, 1, STATE.num_groups, **f16), torch.zeros(size + 1, H, 1, **f16),
                torch.zeros(size + 1, H, 1, **f16), torch.zeros(size + 1, H, 1, **f16),
                torch.ones(size + 1, dtype=torch.bool, device=dev))
        side = LayerSide(layer_id, *(r[:size] for r in rows[:4]), gid.to(dev), dtype, bad=rows[4][:size],
                         buffer=pool_like_buffer, rows=rows, trash=size,
                         mismatched=torch.zeros((), dtype=torch.int64, device=dev))
        if STATE.scheme != "sglang":
            from kernels.paged import PagedKV
            from witcert.selftest import check_write_kernel

            md = dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
            side.ours = PagedKV.allocate(size + 1, H, D, scheme=STATE.scheme, block_size=1, num_groups=STATE.num_groups,
                                         model_dtype=md, device=dev, layer=layer_id)
            check_write_kernel(side.ours, md)  # once per configuration and process (witcert.selftest)
        STATE.layers[key] = side
    STATE.by_buffer[key] = side.layer_id
    return side


def side_of(k_buffer: torch.Tensor) -> LayerSide | None:
    """The witness side of SGLang's K buffer (None: no recorded write registered it)."""
    return STATE.layers.get(k_buffer.data_ptr())


#: tokens per float64 chunk of ``record_write`` (a 4M-token write at once needed 32 GiB: bench/SGLANG.md)
RECORD_CHUNK = 1 << 18


def record_write(k_buffer, v_buffer, layer_id, loc, k_exact, v_exact, k_scale=None, v_scale=None, dtype=None,
                 sel=None):
    """Witnesses of the tokens just written at ``loc`` (SGLang's stored values vs the exact K/V);
    clears their unmetered bits (leaves them set when the write's scales are not the side's).
    ``sel`` [n] bool (a ``dcp_kv_mask``): only those rows were written; the others' witnesses go to the
    side's trash row. Device operations only, for any write after a buffer's first (which allocates its
    side): no host synchronisation, so SGLang's CUDA graphs can capture it."""
    dtype = dtype or k_buffer.dtype
    side = _side_for(k_buffer, layer_id, dtype)
    loc = slot_indices(loc, side.trash)  # a negative slot is the pool's row from the end, as SGLang's write reads it
    dst = loc if sel is None else torch.where(sel, loc, side.trash)  # where each row's witnesses go
    kb, vb = _as_logical(k_buffer, dtype), _as_logical(v_buffer, dtype)
    dev = side.bad.device
    scales = torch.stack([kernel_scale_tensor(k_scale, dev), kernel_scale_tensor(v_scale, dev)])
    if side.scale_t is None:  # the buffer's first recorded write fixes the scales its decode meters
        side.scale_t = scales.clone()
        side.view_key = None  # (the decode's view compares its scales with these when it is built)
    ks, vs = scales[0].double(), scales[1].double()
    k_wit, v_wit, v_norm, k_norm, bad = side.rows
    G = k_wit.shape[-1]
    bad.index_fill_(0, dst, True)  # until the witnesses below are all in place (not bad[dst] = True: a CPU scalar
    # copied to the device, which a CUDA-graph capture refuses; H200, 2026-12-05)
    for c0 in range(0, loc.numel(), RECORD_CHUNK):  # float64 copies: bounded memory for long prefills
        lc, dc = loc[c0 : c0 + RECORD_CHUNK], dst[c0 : c0 + RECORD_CHUNK]
        kh = kb[lc].double() * ks
        vh = vb[lc].double() * vs
        rk = kh - k_exact[c0 : c0 + RECORD_CHUNK].double()
        rv = vh - v_exact[c0 : c0 + RECORD_CHUNK].double()
        k_wit[dc, :, 0] = _round_up_f16(_group_norms64(rk, side.group_id, G), (rk != 0).any(-1, keepdim=True))
        v_wit[dc, :, 0] = _round_up_f16(rv.norm(dim=-1), (rv != 0).any(-1))
        v_norm[dc, :, 0] = _round_up_f16(vh.norm(dim=-1), False)
        k_norm[dc, :, 0] = _round_up_f16(kh.norm(dim=-1), False)
    if side.ours is not None:
        from kernels.write import write_kv

        n = loc.numel()
        # the exact K/V as SGLang gave them (write_kv meters against these, in any float dtype)
        write_kv(side.ours, k_exact, v_exact,
                 dst.to(torch.int32)[:, None], torch.arange(n, device=loc.device),
                 torch.zeros(n, dtype=torch.long, device=loc.device),
                 validate=False)  # (no host sync; the slots are the pool's, read above, or the trash row)
    # a decode meters one scale per buffer: a write with other scales stays unmetered (counted on the device)
    differ = (scales != side.scale_t).any()
    bad[dst] = differ
    side.mismatched += differ
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
            sel = None
            if mask is not None:  # decode-context parallel: SGLang's kernel writes the masked-in rows only
                sel = mask.reshape(-1).to(loc.device) != 0
            store = STATE.exact_store
            if store is not None and hasattr(store, "write"):  # a HostExactStore keeps its copy current
                try:  # (a host copy: the gate's exact store is not graph-capturable anyway)
                    store.write(gid, *((loc, k_exact, v_exact) if sel is None else (loc[sel], k_exact[sel], v_exact[sel])))
                except Exception as e:  # the slots it missed are refused at page-in (never unsound)
                    STATE.unmetered[f"exact store write: {type(e).__name__}: {e}"] += 1
            record_write(kb, vb, gid, loc, k_exact, v_exact, k_scale, v_scale, getattr(self, "dtype", None), sel=sel)
        except Exception as e:  # the meter never breaks a write; the written slots become unmetered
            STATE.unmetered[f"write: {e}" if isinstance(e, _Skip) else f"write: {type(e).__name__}: {e}"] += 1
            if side is None and kb is not None:
                side = STATE.layers.get(kb.data_ptr())
            if side is not None:
                mark_unmetered(side, getattr(loc_info, "loc", loc_info) if mask is None else None)
            elif kb is None:  # could not even find the buffer: every side of this pool
                for _, s_ in sides_of(self):
                    mark_unmetered(s_, None)
        return out

    set_kv_buffer.__wrapped__ = orig
    set_kv_buffer.__witcert__ = "record"
    return set_kv_buffer
