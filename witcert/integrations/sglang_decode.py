"""The metered decode of WitCert's SGLang patch (``witcert.integrations.sglang``'s module doc,
"Decode"); split out of ``sglang.py``, its public names re-exported there."""

from __future__ import annotations

import dataclasses
import sys

import torch

from kernels.unmetered import UnmeteredSlots
from witcert.integrations import sglang_gate as G
from witcert.integrations import sglang_trace as T
from witcert.integrations.sglang_pool import bad_rows
from witcert.integrations.sglang_state import DECODE_PARAMS, STATE, LayerSide, _Skip, log
from witcert.integrations.sglang_witness import _as_logical, kernel_scale

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
    if q.shape[0] == 0:  # (before any metering step: the warm-up's sizing and a capture's slot need rows)
        return "an empty batch"
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
    ks32, vs32 = kernel_scale(k_scale), kernel_scale(v_scale)  # (SGLang's decode passes Python floats)
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
    # the view's scales against the witnesses' (on the device, once per view: record_write drops the view when
    # it first sets the witnesses' scales); True saturates every row the view serves
    side.view_scale_bad = None if side.scale_t is None else (side.scale_t != torch.tensor([ks32, vs32], **f32)).any()
    # what the kernel counts per row (no torch op per call): the slots' unmetered bits and the scales' mismatch
    side.view_unmetered = UnmeteredSlots.of(side.bad, None if side.view_scale_bad is None
                                            else side.view_scale_bad.reshape(1).to(torch.uint8))
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


#: SGLang's process-global capture-mode flag (its decode runner's warm-up and capture); read only if loaded
_CAPTURE_MODE_MODULE = "sglang.srt.model_executor.runner_utils.capture_mode"


def _fused(B: int, slot: int, why: str, more: str = "") -> None:
    """Say once per (batch size, layer slot, reason) that a captured call keeps its tilt in the merge (slot -1: every
    slot of that batch size); ``more`` is appended to the reason."""
    if (B, slot, why) not in STATE.fused_logged:
        STATE.fused_logged.add((B, slot, why))
        where = f"layer slot {slot}" if slot >= 0 else "every layer"
        log.info("WitCert: captured decode of %s at batch size %d keeps its tilt in the merge (%s%s): sound, slower "
                 "than the deferred record", where, B, why, more)


def _tilt_bytes(B: int, heads: int, layers: int) -> int:
    """Bytes of ``TiltBatch.allocate`` for batch size ``B`` of ``heads`` query heads over ``layers`` layer slots."""
    from kernels.plan import hist_columns
    from kernels.tilt_batch import TiltBatch

    one = TiltBatch.allocate(layers=1, rows=1, nb=hist_columns(False), device="meta")
    per = sum(t.numel() * t.element_size() for t in (getattr(one, f.name) for f in dataclasses.fields(one))
              if isinstance(t, torch.Tensor))
    return per * layers * B * heads


def _sglang_capture_mode() -> bool:
    """Is SGLang's graph runner warming up or capturing (``get_is_capture_mode``)? False when that module is not
    loaded (a bare kernel import): nothing is imported here."""
    mod = sys.modules.get(_CAPTURE_MODE_MODULE)
    return bool(mod is not None and mod.get_is_capture_mode())


def _presize_tilt(q: torch.Tensor):
    """Batch size ``q.shape[0]``'s ``TiltBatch`` (the deferred records of its captured calls), allocated if absent,
    sized to the sides registered now; None above ``install(defer_max_batch=)`` (said once). Called eagerly by a
    metered call in SGLang's capture-mode warm-up, so the allocation's fills run there, once, and not inside the
    graph that the capture right after records."""
    from kernels.plan import hist_columns
    from kernels.tilt_batch import TiltBatch

    B = q.shape[0]
    tb = STATE.tilt.get(B)
    if tb is not None and (tb.layers >= len(STATE.layers) or B in STATE.tilt_used):
        return tb
    if tb is None and B > STATE.defer_max_batch:
        why = f"batch size above install(defer_max_batch={STATE.defer_max_batch})"
        if (B, -1, why) not in STATE.fused_logged:  # (the figure per layer: more layers may register later)
            _fused(B, -1, why, f"; its deferred records would hold {_tilt_bytes(B, q.shape[1], 1) / 2**20:.2f} MiB "
                               f"a layer")
        return None
    # (absent, or sized before layers registered since, e.g. by the first warm-up's first layer, before the others
    # wrote: sized again while no capture holds a slot of it)
    tb = STATE.tilt[B] = TiltBatch.allocate(layers=len(STATE.layers), rows=B * q.shape[1], nb=hist_columns(False),
                                            device=q.device)
    log.info("WitCert: deferred records for batch size %d sized to %d layer slots", B, len(STATE.layers))
    return tb


def _tilt_slot(q: torch.Tensor, kb: torch.Tensor):
    """``install(defer_tilt=True)``, a call being captured: (its batch size's ``TiltBatch``, the buffer's layer
    slot), or None (the tilt stays in the merge: no deferral asked, Tier B, a batch size above ``defer_max_batch``, a
    buffer registered after the batch was sized, or a slot written since the last ``static_records``). Slots are the
    sides' registration order; a batch size's TiltBatch is sized to the sides registered then, and sized again by a
    warm-up only while no capture holds a slot of it (its captured records are views into it)."""
    if not STATE.defer_tilt or STATE.delta_step is not None or kb.data_ptr() not in STATE.layers:
        return None
    i = list(STATE.layers).index(kb.data_ptr())
    B, rows = q.shape[0], q.shape[0] * q.shape[1]
    tb = STATE.tilt.get(B)
    if tb is None:
        if B <= STATE.defer_max_batch:
            log.warning("WitCert: batch size %d's deferred records allocated inside a CUDA-graph capture: their "
                        "initialisation (TiltBatch.allocate's fills) is captured too and replays every step (sound, "
                        "slower; SGLang's warm-up in capture mode sizes them before the capture)", B)
        tb = _presize_tilt(q)
        if tb is None:
            return None
    if i >= tb.layers or tb.rows != rows or i in tb.written:
        # (written since the last finish: a buffer read twice in one capture, e.g. layers sharing their KV, would
        # leave the first call's record reading the second's; that call keeps the tilt in its merge)
        why = (f"registered after batch size {B}'s deferred records were sized" if i >= tb.layers else
               f"{rows} rows against the {tb.rows} its records were sized for" if tb.rows != rows else
               "written since the last static_records()")
        _fused(B, i, why)
        return None
    STATE.tilt_used.add(B)
    return tb, i


class OutputOverCacheError(ValueError):
    """SGLang's ``o`` / ``attn_lse`` share memory with the KV cache, its indices or the meter's side buffers (decode's
    ``OutputBufferError`` of kind "input"): writing the output would change what later calls read under witnesses taken
    before (no bound could vouch for them)."""


def metered_decode(args, kwargs, num_splits=None, tilt=None):
    """Run the metered kernel on SGLang's arguments (a list); writes ``o`` and ``attn_lse``, returns
    (side, DecodeOutput, the PagedKV it read); a row reading an unmetered slot has the saturated record already (the
    kernel counts it: ``kernels.unmetered``). ``tilt``: (TiltBatch, layer slot) of a deferred tilt (``_tilt_slot``),
    or None. Where ``o`` shares memory with ``q`` and the output is copied into it, ``args[0]`` becomes a copy of
    the query taken before (what later readers of ``args``, the gate, must see)."""
    from kernels.decode import decode
    from kernels.epilogue import OUT_DTYPES, OutputBufferError

    q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse = args[:8]
    max_kv_splits, sm_scale, k_scale, v_scale = args[9:13]
    side = STATE.layers[kb.data_ptr()]
    cache = paged_view(side, kb, vb, k_scale, v_scale)
    Bsz = q.shape[0]
    # SGLang's CSR rows read by the kernel directly (no [B, max_len] table); no host sync: the
    # split count from the mean length (kernels.plan.plan_decode); an empty row (which SGLang's
    # decode never sends) gets what the reference gives it: output 0, TV⁺ 0 (kernels.decode.decode)
    indptr = kv_indptr[: Bsz + 1]
    defer = {} if tilt is None else dict(tilt_batch=tilt[0], tilt_layer=tilt[1])
    # a row reading an unmetered slot (or one outside the pool), or every row when the view's scales are not the
    # witnesses', gets the non-finite record from the kernels themselves (``kernels.unmetered``: no op per call)
    unmet = side.view_unmetered
    if side.ours is not None and (unmet is None or unmet.slots.data_ptr() != side.bad.data_ptr()):
        unmet = side.view_unmetered = UnmeteredSlots.of(side.bad)  # (codes of ours: no view, no scale check)
    # the merge writes SGLang's o and attn_lse (the log-sum-exp in column 0, −inf in the others) itself; buffers it
    # cannot write (epilogue.check_outputs, before any launch) are filled by copies after it instead
    o3, lse3 = o.view(Bsz, q.shape[1], -1), attn_lse[:Bsz, : q.shape[1]]
    kw = dict(kv_indptr=indptr, sm_scale=float(sm_scale), num_splits=num_splits, delta_step=STATE.delta_step,
              validate=False, unmetered=unmet, **defer)
    try:
        out = decode(cache, q, kv_indices, None, out=o3, lse_out=lse3, **kw)
    except OutputBufferError as e:
        if e.kind == "input":  # writing o would overwrite what later calls read (codes no longer their witnesses')
            raise OutputOverCacheError(f"WitCert: SGLang's o / attn_lse: {e}") from None
        if o.dtype not in (torch.float64, *OUT_DTYPES):  # (its rounding would be outside every bound)
            raise _Skip(f"o in {o.dtype}: only float64 / float32 / bfloat16 / float16 outputs are metered") from None
        # (the copy rounds into o's dtype: store_dtype puts that in E⁺, as the merge's own store does)
        out = decode(cache, q, kv_indices, None, store_dtype=o.dtype if o.dtype in OUT_DTYPES else None, **kw)
        if e.kind == "query":  # the copy overwrites the query: whoever reads it after (the gate) gets it as it was
            args[0] = q.clone()
        o3.copy_(out.o)
        lse3[..., 0].copy_(out.lse)
        lse3[..., 1:] = float("-inf")
    return side, out, cache


def _unmetered_rows(args, side) -> torch.Tensor:
    """[B, 1] bool, for the gate's repaired record (its overlay pass does not read the pool's bits): the rows the
    first pass saturated for an unmetered or out-of-pool slot, or for the view's scales."""
    q, kv_indptr, kv_indices = args[0], args[4], args[5]
    bad = bad_rows(side, kv_indptr[: q.shape[0] + 1], kv_indices, q.shape[0])
    if side.ours is None and side.view_scale_bad is not None:
        bad = bad | side.view_scale_bad
    return bad


class GraphCaptureUnsupported(RuntimeError):
    """A part of the SGLang patch that synchronises with the host was reached inside a CUDA-graph capture."""


def _capturing(q: torch.Tensor) -> bool:
    """Is this call being captured into a CUDA graph (SGLang's decode graphs)?"""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def _captured(layer_id: int, rec, batch: int, kb: torch.Tensor) -> None:
    """A metered call inside a CUDA-graph capture: its record's tensors are the graph's outputs, rewritten by
    every replay, so they are kept as that batch size's static records (``static_records``) instead of being
    handed to ``on_record`` / the trace once, at capture, and never again. A KV buffer captured again at a batch
    size is said once: another graph of it (SGLang's LoRA or attention variants, a recapture) or layers sharing
    their KV, whose records all stay in the list while only the graph replayed rewrites its own."""
    if not STATE.static:
        log.warning("WitCert: metered decode captured in a CUDA graph: records are static tensors rewritten by "
                    "every replay (read them after a replay with witcert.integrations.sglang.static_records(bs)); "
                    "on_record and the trace are not called for graph replays")
    seen = STATE.captured_buffers.setdefault(batch, set())
    if kb.data_ptr() in seen and (batch, "again") not in STATE.fused_logged:
        STATE.fused_logged.add((batch, "again"))
        log.warning("WitCert: a KV buffer captured again at batch size %d (another CUDA graph of that batch size: "
                    "SGLang's LoRA or attention variants, or a recapture; or layers sharing their KV): "
                    "static_records(%d) lists every captured call's record in capture order, and after a replay only "
                    "the calls of the graph replayed hold that step's values", batch, batch)
    seen.add(kb.data_ptr())
    STATE.static.setdefault(batch, []).append((layer_id, rec))


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
        capturing = why is None and _capturing(args[0])
        if (why is None and not capturing and STATE.defer_tilt and STATE.delta_step is None
                and args[0].shape[0] not in STATE.tilt_used and next(iter(STATE.layers), None) == args[1].data_ptr()
                and _sglang_capture_mode()):
            # the warm-up before a capture of this batch size, at its first registered layer: SGLang's first warm-up
            # registers the layers one by one as they write, its second finds them all (sized once each pass)
            _presize_tilt(args[0])
        if capturing and STATE.gate is not None:  # its host syncs would break the capture: say so instead
            raise GraphCaptureUnsupported(
                "WitCert's gate repairs rows on the host (device-to-host reads of the records, page-in) and "
                "cannot run inside a CUDA graph: serve the gate with --disable-cuda-graph, or install the meter "
                "without gate= (the metered decode and its record step capture)")
        if why is None:
            margs = args[:13]  # (metered_decode may replace the query by its copy: see there)
            try:
                side, out, cache = metered_decode(margs, kw, tilt=_tilt_slot(args[0], args[1]) if capturing else None)
            except _Skip as e:
                why = str(e)
            else:
                layer_id = side.layer_id
                if capturing:
                    _captured(layer_id, out.meter, args[0].shape[0], args[1])
                    return None
                rec, report = out.meter, None
                if STATE.gate is not None:
                    writing = None
                    try:
                        rec, report, pending = G.gate_call(margs, side, cache, out)
                        if rec is not out.meter:  # a row reading an unmetered slot stays unmetered
                            _saturate_rows(rec, _unmetered_rows(margs, side))
                        if pending is not None:  # o / lse of the repaired rows: last, once the record is final
                            writing = pending[0]
                            G.write_repaired(pending, args[3], args[7], margs[0])
                    except Exception as e:  # serve the first pass (o, lse and record agree, but for rows being written)
                        STATE.unmetered[f"gate: {type(e).__name__}: {e}"] += 1
                        log.exception("WitCert gate failed on layer %s; served the ungated pass", layer_id)
                        if report is not None and STATE.gate_log and STATE.gate_log[-1] is report:
                            STATE.gate_log.pop()  # (the gate's report of repairs that were not served)
                        rec, report = out.meter, G._failed_gate_report(layer_id, out.meter, cache.num_kv_heads)
                        if writing is not None:  # a write that failed part way: those rows are no longer the record's
                            hit = torch.zeros(rec.flag.shape[0], 1, dtype=torch.bool, device=rec.flag.device)
                            _saturate_rows(rec, hit.index_fill_(0, writing, True))
                STATE.emit(layer_id, rec)
                if STATE.trace is not None:
                    T._queue_trace(layer_id, cache, out.meter, rec, report, margs[0])
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


