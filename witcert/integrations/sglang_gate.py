"""The gate of WitCert's SGLang patch; split out of ``sglang.py``, its public names re-exported there.

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
   are); every round that paged in re-runs the metered kernel on the overlay rows, at the first
   pass's split count (``DecodeOutput.plan``; the overlay's own tile, scheme none).
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
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from witcert.integrations.sglang_state import STATE
from witcert.integrations.sglang_witness import _as_logical, _group_norms64, _round_up_f16, kernel_scale

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


def _unrepaired(gate, rec, over0, layer_id, Bsz, H):
    """A call with no row over τ, or no page-in budget: the first pass stands; a certified gate flags the
    rows over τ (they get a report), otherwise there is none."""
    if gate.policy == "certified" and bool(over0.any()):  # no page-in budget: flagged
        report = GateReport(layer_id, [], [], [], np.zeros((Bsz, H), np.int64), over0.cpu().numpy(),
                            rec.tv_upper_a, rec.tv_upper_a, 0)
        STATE.gate_log.append(report)
        return rec, report
    return rec, None


def _row_offsets(slots_r):
    """The over-τ rows' tokens compacted on the overlay, row after row: each row's offset and length."""
    lens = [int(s.numel()) for s in slots_r]
    offs = [0]
    for n in lens[:-1]:
        offs.append(offs[-1] + n)
    return offs, lens


def _block_table(offs, lens, device):
    """The kernel's block table [R, max_len] of the overlay rows (block size 1: a block is one overlay token), the
    longest row's length, and the lengths as int32."""
    nmax = max(lens)
    j = torch.arange(nmax, device=device)
    off_t = torch.tensor(offs, device=device)
    len_t = torch.tensor(lens, device=device, dtype=torch.int32)
    bt = torch.where(j[None] < len_t[:, None], off_t[:, None] + j[None], torch.zeros_like(j)[None]).to(torch.int32)
    return nmax, bt, len_t


@dataclasses.dataclass
class _RepairLoop:
    """What ``witcert.gate.repair`` asks of one gated call (module doc "Gate", step 3): which rows are over
    τ (``over``), the overlay's block risk (``risk``), a page-in from the exact store, checked against the
    slot's witnesses (``page_in``), and the metered kernel again on the overlay rows (``remeasure``); and
    what the loop did (``out`` / ``rec``: the last overlay pass, ``paged``, ``rejected``, ``exact_dtype``)."""

    gate: object
    side: object  # sglang_state.LayerSide of SGLang's K buffer
    q: torch.Tensor  # SGLang's queries [B, Hq, D]
    rows: list  # the request rows over τ
    kbl: torch.Tensor  # SGLang's K / V buffers in their logical dtype, and the fp32 scales
    vbl: torch.Tensor
    ks: float
    vs: float
    slots_r: list  # per row, its token slots
    offs: list
    lens: list
    ov: object  # the overlay (kernels.paged.PagedKV)
    bt: torch.Tensor
    len_t: torch.Tensor
    q_rows: torch.Tensor
    sm: float
    splits: int
    over_rows: torch.Tensor  # [R, Hkv, GQ] the first pass's rows over τ
    repaired: torch.Tensor  # [R, Hkv, max_len] paged in, or refused
    out: object = None
    rec: object = None
    fetched: dict = dataclasses.field(default_factory=dict)
    paged: list = dataclasses.field(default_factory=list)
    rejected: int = 0
    exact_dtype: torch.dtype | None = None
    store_dtype: torch.dtype | None = None  # SGLang's o: the overlay pass's output is served in it (its rounding in E⁺)

    def over(self):
        from witcert.gate import exceeds

        R, H, GQ = self.over_rows.shape
        if self.rec is None:
            return self.over_rows.any(-1).cpu().numpy()
        r = self.rec
        return exceeds(self.gate, r.tv_upper_a, r.tv_upper_b, r.out_err_upper).view(R, H, GQ).any(-1).cpu().numpy()

    def risk(self):
        return _overlay_risk(self.ov, self.q_rows, self.offs, self.lens, self.repaired, self.sm, self.gate.tau_v)

    def _fetch(self, slot, H, D):
        """The exact (k, v) [Hkv, D] of ``slot`` from the store (memoised; (None, None): the store failed)."""
        q = self.q
        if slot not in self.fetched:
            try:
                kx, vx = STATE.exact_store(self.side.layer_id, torch.tensor([slot], device=q.device))
                kx, vx = kx.reshape(H, D), vx.reshape(H, D)
            except Exception as e:  # a store without the slot: refused, the token stays as served
                STATE.gate_rejected[f"store: {type(e).__name__}: {e}"] += 1
                kx = vx = None
            self.fetched[slot] = (kx, vx)
        return self.fetched[slot]

    def page_in(self, r, h, t):
        q, side, ov = self.q, self.side, self.ov
        H, D = self.over_rows.shape[1], q.shape[2]
        self.repaired[r, h, t] = True  # never chosen again this call, moved or refused
        slot = int(self.slots_r[r][t])
        kx, vx = self._fetch(slot, H, D)
        if kx is None:
            self.rejected += 1
            return 0
        kx64, vx64 = kx.to(q.device).double(), vx.to(q.device).double()
        # the store must be consistent with the slot's witnesses (a stale or wrong store is refused:
        # for the true exact K/V, ‖k̂ − k‖[g] ≤ W[g] and ‖v̂ − v‖ ≤ φ by construction of the witnesses)
        kh = self.kbl[slot, h].double() * self.ks
        vh = self.vbl[slot, h].double() * self.vs
        dk = _group_norms64((kh - kx64[h])[None], side.group_id, side.k_wit.shape[-1])[0]
        dv = (vh - vx64[h]).norm()
        if not (torch.isfinite(kx64[h]).all() and torch.isfinite(vx64[h]).all()
                and bool((dk <= side.k_wit[slot, h, 0].double()).all()) and bool(dv <= side.v_wit[slot, h, 0].double())):
            STATE.gate_rejected["store value farther from the stored one than its witness"] += 1
            self.rejected += 1
            return 0
        i = self.offs[r] + t
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
        self.exact_dtype = kx.dtype
        self.paged.append((self.rows[r], h, slot, nbytes))
        return nbytes

    def remeasure(self):
        from kernels.decode import decode

        self.out = decode(self.ov, self.q_rows, self.bt, self.len_t, sm_scale=self.sm, num_splits=self.splits,
                          delta_step=None, store_dtype=self.store_dtype)
        self.rec = self.out.meter


def _repaired(rec, loop, fixed):
    """(the record with the repaired rows, ``fixed``: indices into ``loop.rows``, from the last overlay pass; what
    ``write_repaired`` writes into SGLang's ``o`` / ``attn_lse``, or None) — ``rec`` and None where none was repaired.
    Nothing is written here: the caller writes last, once the record is final."""
    if not (fixed and loop.rec is not None):
        return rec, None
    q = loop.q
    rows_t = torch.tensor([loop.rows[i] for i in fixed], device=q.device)
    sel_t = torch.tensor(fixed, device=q.device)
    po = loop.out
    return _merge_rows(rec, po.meter, rows_t, sel_t), (rows_t, po.o[sel_t], po.lse[sel_t])


def write_repaired(pending, o, attn_lse, q) -> None:
    """The repaired rows' output and log-sum-exp (``_repaired``'s ``pending``) into SGLang's ``o`` / ``attn_lse``."""
    rows_t, new_o, new_lse = pending
    Bsz, Hq = q.shape[:2]
    o.view(Bsz, Hq, -1)[rows_t] = new_o.to(o.dtype)
    attn_lse[rows_t, :Hq, 0] = new_lse.to(attn_lse.dtype)


def gate_call(args, side, cache, out):
    """The gate on one metered decode call (module doc "Gate"); returns (record, GateReport|None, pending): ``pending``
    the repaired rows' output for SGLang's ``o`` / ``attn_lse`` (``write_repaired``, which the caller runs last, once
    nothing else can fail: o, lse and the record it serves then agree), or None."""
    from kernels.epilogue import OUT_DTYPES
    from witcert.gate import exceeds, repair

    gate = STATE.gate
    rec = out.meter
    q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse = args[:8]
    sm_scale, k_scale, v_scale = args[10:13]
    Bsz, Hq, D = q.shape
    layer_id = side.layer_id
    H = cache.num_kv_heads
    GQ = Hq // H
    over0 = exceeds(gate, rec.tv_upper_a, rec.tv_upper_b, rec.out_err_upper)  # [B, Hq]
    if gate.max_pagein_blocks == 0 or not bool(over0.any()):  # the gate's one host sync per call
        return (*_unrepaired(gate, rec, over0, layer_id, Bsz, H), None)
    rows = torch.nonzero(over0.any(-1)).flatten().tolist()
    R = len(rows)
    kbl, vbl = _as_logical(kb, side.dtype), _as_logical(vb, side.dtype)
    ks, vs = kernel_scale(k_scale), kernel_scale(v_scale)
    slots_r = _row_slots(kv_indptr, kv_indices, rows)
    offs, lens = _row_offsets(slots_r)
    slots = torch.cat(slots_r)
    ov = _overlay(side, kbl, vbl, ks, vs, slots, q.dtype)
    nmax, bt, len_t = _block_table(offs, lens, q.device)
    q_rows = q[rows].contiguous()
    sm = float(sm_scale)
    # the re-decode runs the batch's split count (out.plan; the bound is sound at any split count). Not its
    # tile: the overlay is another kernel variant (scheme none, q's dtype), whose tile is its own (tile_config)
    splits = out.plan.num_splits
    loop = _RepairLoop(gate, side, q, rows, kbl, vbl, ks, vs, slots_r, offs, lens, ov, bt, len_t, q_rows, sm, splits,
                       repaired=torch.zeros(R, H, nmax, dtype=torch.bool, device=q.device),
                       over_rows=over0[rows].view(R, H, GQ))
    loop.store_dtype = o.dtype if o.dtype in OUT_DTYPES else None
    res = repair(gate, over=loop.over, risk=loop.risk, page_in=loop.page_in, remeasure=loop.remeasure)
    pagein = np.zeros((Bsz, H), dtype=np.int64)
    pagein[rows] = res.pagein
    fixed = [i for i in range(R) if res.pagein[i].sum() > 0]
    final, pending = _repaired(rec, loop, fixed)
    budget = np.zeros((Bsz, Hq), dtype=bool)
    if gate.policy == "certified":
        budget = exceeds(gate, final.tv_upper_a, final.tv_upper_b, final.out_err_upper).cpu().numpy()
    report = GateReport(layer_id, rows, [rows[i] for i in fixed], loop.paged, pagein, budget, rec.tv_upper_a,
                        final.tv_upper_a, loop.rejected, (ov, slots, offs, lens, rows), loop.exact_dtype)
    STATE.gate_log.append(report)
    return final, report, pending
