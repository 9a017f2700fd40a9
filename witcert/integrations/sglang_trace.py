"""Trace and metrics export of WitCert's SGLang patch (``witcert.integrations.sglang``'s module
doc, "Trace and metrics"); split out of ``sglang.py``, its public names re-exported there."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import torch

from witcert.integrations.sglang_state import STATE, log

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


