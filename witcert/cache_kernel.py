"""The kernel adapter of ``WitCertCache`` (``witcert.cache``): the metered decode of the Triton kernels
(``kernels.decode``) per layer step, gated (the repair loop over the layer's overlay, decoding again
the repaired sequences), graphed (``witcert.graphs``'s static step), the StepRecord of a kernel step,
and the float64 views of the paged cache the gate's block risks and the audit read (``served_kv``,
``served_sketch``). ``KernelPath`` is a mixin of ``WitCertCache``. The paged writes are
``WitCertLayer``'s (``witcert.cache_layer``)."""

from __future__ import annotations

import numpy as np
import torch

from contract.schemes import SCHEMES

from . import bounds as B
from . import schemes as S
from .cache_reference import _softmax
from .gate import block_risk, exceeds, repair
from .records import GraphedRecords, StepRecord


def _kernel_scheme(scheme: str) -> bool:
    """A scheme the kernel path serves: implemented by the kernels and lossy (``none`` with the
    meter on is served by the reference path)."""
    row = SCHEMES.get(scheme)
    return row is not None and row.kernel_supported and row.lossy


class KernelPath:
    """The kernel path of ``WitCertCache`` (a mixin: reads the cache's configuration and calls its
    ``delta_step``, ``_page_in_counted``, ``_emit`` and the reference path's ``_audit``)."""

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


    def _kernel_attention(self, layer, query, allowed, sm):
        """Kernel path: one metered split-KV decode (kernels.decode) per step. Gated (SPEC §6): the
        gate reads the step's TV⁺ on the host (one sync per layer step); where a (sequence, kv head)
        is over τ it ranks the blocks by risk (``_kernel_block_risk``, float64 from the served
        pages), pages the chosen ones into the layer's overlay (``WitCertLayer.page_in``) and runs
        the decode again, so the output and the record reflect the repair (certified: up to
        ``max_pagein_blocks`` rounds, one decode each)."""
        from kernels.decode import decode
        from kernels.plan import plan_decode

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
        # the whole batch's plan (split count, tile), from its length n: every decode of this step runs it (decode
        # does not plan again)
        plan = plan_decode(layer.paged, Bsz, Hq, q1.dtype, q1.device, n, self.meter, delta_step=ds,
                           repair=layer.rep, window=layer.win)

        def run(rows=None):
            # validate=False: the cache guarantees 1 ≤ n ≤ the table's capacity (no per-layer host sync);
            # rows: only these sequences, at the whole batch's split count and tile (its smaller grid would
            # pick another tile), so the rows are the whole batch's sums
            q, bt, lens, tm, win = q1, layer.block_table, sl, token_mask, layer.win
            if rows is not None:
                q, bt, lens = q1[rows], layer.block_table[rows], sl[rows]
                tm = None if token_mask is None else token_mask[rows]
                win = None if win is None else win.select(rows)
            # ungated, unpadded: the merge writes the model's dtype itself (no cast launch after it)
            o = (torch.empty(q.shape, dtype=query.dtype, device=q.device)
                 if rows is None and gate is None and tm is None else None)
            if self.meter:  # (before a gate's re-decode too: a page-in may have turned the overlay on)
                self._check_decode(layer, q, sm, ds, plan=plan, token_mask=tm, out=o)
            # (otherwise the float32 output is cast to the model's dtype below: store_dtype puts that rounding in E⁺)
            return decode(layer.paged, q, bt, lens, sm_scale=sm, meter=self.meter, plan=plan, delta_step=ds,
                          validate=False, token_mask=tm, tilt_above=tilt, repair=layer.rep, window=win, out=o,
                          store_dtype=query.dtype)

        out = run()
        if not self.meter:
            return out.o[:, None].to(query.dtype), None
        pre, pagein, flag = out.meter, None, None
        if gate is not None:
            out, pagein, flag = self._kernel_gate(layer, q1, token_mask, sm, out, run)
        args = (self.step, layer.layer_idx, out.meter, ds, Bsz, pre, pagein, flag)
        if self.audit:
            self.host_cost.sync("records")
            self._emit(self._kernel_record(*args, audit=self._kernel_audit(layer, q1, token_mask, sm, out.meter,
                                                                           out.o.to(query.dtype))))
        elif self.trace is None:  # stays on the device until cache.records is read
            self._lazy.append(args)
        else:  # tracing reads the record now (its cost is one transfer per (step, layer))
            self.host_cost.sync("records")
            self._emit(self._kernel_record(*args))
        return out.o[:, None].to(query.dtype), None

    def _kernel_gate(self, layer, q1, token_mask, sm, out, run):
        """The gate's repair loop on a kernel step's decode ``out`` (``run(rows)`` decodes again, all
        sequences or only ``rows``). Returns (the decode after repair, pagein [B, Hkv], the certified
        policy's flag [B, Hq] or None)."""
        gate = self.gate
        Bsz, Hq = q1.shape[:2]
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
        flag = over_rows(out.meter) if gate.policy == "certified" else None  # still over after the budget: flagged
        return out, pagein, flag

    def _static_attention(self, layer, q1, sm, dtype):
        """A graphed decode step's attention (``witcert.graphs``): the metered decode over the
        runner's static lengths / padding mask, split count from the table's capacity, and the meter
        record's columns copied into the runner's record buffer (one row per layer; the runner keeps a
        copy per step, read when ``records`` is)."""
        from kernels.decode import decode

        st = self._static
        defer = dict(tilt_batch=st.tilt, tilt_layer=layer.layer_idx) if st.tilt is not None else {}
        # the merge writes the model's dtype itself (no cast launch per layer); not with a padding mask, whose fully
        # masked rows are zeroed after the merge (decode's out= contract)
        o = None if st.has_mask else torch.empty(q1.shape, dtype=dtype, device=q1.device)
        self._check_decode(layer, q1, sm, None, num_splits=st.splits, token_mask=st.mask if st.has_mask else None,
                           out=o)  # (in the eager step: a capture skips it)
        out = decode(layer.paged, q1, layer.block_table, st.lens, sm_scale=sm, meter=True, num_splits=st.splits,
                     validate=False, token_mask=st.mask if st.has_mask else None, tilt_above=self.tilt_above,
                     window=layer.win, out=o, store_dtype=dtype, **defer)
        if st.tilt is None:  # (deferred: the step's end copies every layer's columns, witcert.graphs._finish_records)
            r = out.meter
            st.rec[layer.layer_idx].copy_(torch.stack([getattr(r, f).double() for f in GraphedRecords.FIELDS]))
        return out.o[:, None].to(dtype), None

    def _check_decode(self, layer, q, sm, ds, plan=None, num_splits=None, token_mask=None, out=None):
        """The compiled metered decode checked on a canary shaped as this launch before it runs
        (``witcert.selftest_decode``: once per launch configuration and process; raises ``DecodeSelfTestError`` rather
        than meter with a decode whose bound comes out below its float64 check). ``q``: the decode's query (its batch);
        ``plan`` None: the plan ``decode`` makes for ``num_splits`` (the graphed step's), made only when the layer's
        memo changes; ``token_mask`` / ``out``: the decode's."""
        rep_on = layer.rep is not None and layer.rep.count > 0
        mstride = None if token_mask is None else token_mask.stride(0)
        odt = None if out is None else out.dtype
        memo = (plan, q.shape, q.dtype, ds is None, num_splits, id(layer.paged), id(layer.win), rep_on, mstride, odt,
                layer.block_table.shape[1])
        if layer.decode_checked == memo:
            return
        from .selftest_decode import check_decode_kernel

        if plan is None:
            from kernels.plan import plan_call

            plan = plan_call(layer.paged, q, layer.block_table, num_splits=num_splits, window=layer.win)
        check_decode_kernel(layer.paged, plan, q.dtype, sm, q.shape[1], window=layer.win, delta_step=ds,
                            repair=layer.rep, token_mask=token_mask, batch=q.shape[0],
                            table_width=layer.block_table.shape[1], out_dtype=odt)
        if not (q.is_cuda and torch.cuda.is_current_stream_capturing()):  # (skipped there: not checked)
            layer.decode_checked = memo

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
        if layer.paged.weighted:  # the kernel's sketch radius c_h (W_j + u_j) (or per head), contract.sketch
            rt = served_sketch(layer.paged, layer.block_table, n, rows)
            if rt is not None:
                zero = rep_tok if layer.rep is not None else torch.zeros_like(W, dtype=torch.bool)
                if layer.win is not None:
                    zero = zero | wm
                rt = torch.where(zero[..., None], torch.zeros_like(rt), rt)
            a = layer.paged.weights.double().to(dev)[None, :, None, :]
            eps = B.sketch_radius(ev["q"].transpose(2, 3), None if rt is None else rt[:, :, None], W[:, :, None], sm, a,
                                  shared=not layer.paged.head_levels)
            eps = eps.to(dev).transpose(2, 3)
        else:
            eps = abs(sm) * ev["q"].norm(dim=-1)[..., None] * W[:, :, None, None, :]
        eps = torch.where(ev["al"], eps, torch.zeros_like(eps))
        r = block_risk(ev["p"], ev["logits"], ev["al"], ev["live"], eps, block_size=T, num_blocks=nb,
                       repaired=rep_blocks, v_wit=phi, tau_v=self.gate.tau_v)
        risk[rows.to(dev)] = r
        return risk

    def _kernel_audit(self, layer, q1, token_mask, sm, rec, served):
        """The reference path's audit (``_audit``: realised TV and ‖ô − o‖ against exact attention
        over the backing store) on the kernel path's served values and bounds, ‖ô − o‖ for the output ``served``
        [B, Hq, D] as the model gets it (the kernel's arithmetic and its rounding into the model's dtype included):
        (tv_real [B, Hq], err_real [B, Hq], violations)."""
        ev = self._kernel_served(layer, q1, token_mask, sm)
        shp, dev = ev["live"].shape, ev["kh"].device  # [B, Hkv, GQ, 1]
        ev["o"] = served.to(dev).double().view(*shp, served.shape[-1])
        m = {"tv": rec.tv_upper_a.to(dev).double().view(shp), "err": rec.out_err_upper.to(dev).double().view(shp),
             "bad": rec.flag.to(dev).view(shp)}
        tv, err, viol = self._audit(layer, ev["q"], ev["al"], sm, ev, m)
        Bsz, Hq = rec.tv_upper_a.shape
        return tv.reshape(Bsz, Hq).cpu().numpy(), err.reshape(Bsz, Hq).cpu().numpy(), int(viol)


def served_kv(cache, block_table: torch.Tensor, n: int, repair=None,
              rows: torch.Tensor | None = None, window=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The values the decode serves, in float64 on the cache's device: (k̂, v̂) [B', Hkv, n, D]
    of the sequences ``rows`` (default all) of ``block_table``, tokens 0..n−1: the codes
    dequantized as the kernel does (s·c, s·(c − u) with the regenerated dither, z + s·c for
    int4_group and kivi2) and, where ``repair`` has the page, its exact pool values. For the gate's block
    risks and the audit (O(B'·Hkv·n·D) device work, no kernel). ``cache``: a ``kernels.paged.PagedKV``,
    ``repair``: a ``kernels.repair.RepairOverlay`` (here, not in ``kernels``: it regenerates the dither
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
    if window is not None and window.columns > 0:  # the exact window (kernels.exact_window.ExactWindow): from its ring
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
