"""The float64 reference path of ``WitCertCache`` (``witcert.cache``): the served view of a layer
(the exact window applied), the served attention in float64, its Tier A / Tier B radii, the meter
(``witcert.meter``), the gate's repair loop on this path (``witcert.gate.repair``) and the audit
against exact attention. ``ReferencePath`` is a mixin of ``WitCertCache``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from . import bounds as B
from . import meter as M
from .gate import block_risk, exceeds, repair
from .records import StepRecord

#: levels the tilt bound rounds radii up onto: 0 and 2^-14 … 16 with ratio 2^(1/4) (any set of
#: levels is sound, SPEC §3(c); radii above 16 use the row maximum, where every bound is ≈ 1)
METER_LEVELS = np.concatenate([[0.0], 2.0 ** (np.arange(-56, 17) / 4.0)])
#: levels of the centred sketch box (``witcert.bounds.box_levels``: the radius onto these, the centre onto a
#: power-of-two grid of 1/16 of its level): 0 and 2^-14 … 16 with ratio 2^(1/16). Finer than
#: ``METER_LEVELS``: a centred box has few tokens per (centre, level) pair anyway, and the coarse levels
#: gave back a tenth of its gain (SmolLM2 int8 median TV⁺/TV 4.04 at ratio 2^(1/4), 3.70 here, 3.61 exact)
BOX_LEVELS = np.concatenate([[0.0], 2.0 ** (np.arange(-224, 65) / 16.0)])
#: query rows per forward above which only the closed forms (a), (b) are computed (long prefill
#: chunks); decode steps always get min(tanh, e-form, tilt)
TILT_MAX_ROWS_PER_HEAD = 4
#: absolute tolerance of the audit (fp64 evaluation of both exact and served attention)
AUDIT_ABS_TOL = 1e-12
#: unit roundoff of the reference path's served logits (float64): ``witcert.bounds.dot_rounding_radius``
REFERENCE_UNIT_ROUNDOFF = M.FP64_UNIT_ROUNDOFF


#: masked softmax of the reference path (float64): ``witcert.meter.softmax``
_softmax = M.softmax


class ReferencePath:
    """The reference path of ``WitCertCache`` (a mixin: reads the cache's configuration and calls its
    ``delta_step``, ``_page_in_counted`` and ``_emit``)."""

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

    def _evaluate(self, layer, q, al, sm):
        view = self._view(layer)
        logits = sm * torch.einsum("bhgld,bhnd->bhgln", q, view.kh)
        p, live_row = _softmax(logits, al)
        o = torch.einsum("bhgln,bhnd->bhgld", p, view.vh)
        return {"p": p, "logits": logits, "o": o, "live": live_row.expand(p.shape[:-1]), "al": al, "view": view}

    def _radii(self, view, layer, q, al, sm):
        """``(ε, c)``: ε [B, Hkv, GQ, Lq, n] (Tier A) from the served view's witnesses and the box's centre c
        (None: 0): the centred sketch box (``_sketch_radii``), or ``witcert.bounds.logit_radius`` of the group
        witnesses (per token, or their maximum over each block of T tokens); ε plus the float64 rounding of
        the served logits (``witcert.meter.served_radius``); 0 at masked tokens."""
        if self.sketch:
            eps, c = self._sketch_radii(view, layer, q, sm)
            eps = M.served_radius(eps, q, view.kh[:, :, None, None], sm, REFERENCE_UNIT_ROUNDOFF, mask=al)
            return eps, None if c is None else torch.where(al, c, torch.zeros_like(c))
        W = view.W  # [B, Hkv, n, G]
        n = W.shape[-2]
        T = self.block_size if self.witness == "block" else 1
        if T > 1:
            nb = -(-n // T)
            Wp = torch.nn.functional.pad(W, (0, 0, 0, nb * T - n))
            W = Wp.view(*W.shape[:2], nb, T, W.shape[-1]).amax(-2)
        eps = B.logit_radius(q, W[:, :, None, None], self.groups, sm, block_size=T, n=n).to(q.device)
        return M.served_radius(eps, q, view.kh[:, :, None, None], sm, REFERENCE_UNIT_ROUNDOFF, mask=al), None

    @property
    def centred_box(self) -> bool:
        """Whether this path meters the centred sketch box: a sketch, and ``sketch_box`` "auto", "centred" or "grid"."""
        return self.sketch_bits > 0 and self.sketch_box in ("auto", "centred", "grid")

    def _sketch_radii(self, view, layer, q, sm):
        """The centred sketch box, ``(ε, c)`` [B, Hkv, GQ, Lq, n]: |δ − c| ≤ ε with c = σ⟨q_h, r̃_j⟩ per head
        (``witcert.bounds.sketch_center``) and ε = c_h W_j (``sketch_radius(..., centered=True)``), from the
        view's sketches and witnesses; 0 on tokens served exact (the window, repaired blocks: W = 0, r̃ = 0).
        ``sketch_box="symmetric"`` (or no sketch): ``(ε, None)`` with the kernels' symmetric form,
        |δ| ≤ c_h (W_j + max_h |u_hj|), one level per token for the heads of a kv head; ``"per-head"``:
        ``(ε, None)`` with each head's own u_hj, |δ| ≤ c_h W_j + |σ⟨q_h, r̃_j⟩|."""
        qr = q.transpose(2, 3)  # [B, Hkv, Lq, GQ, D]
        wl = None if self.weights is None else torch.from_numpy(self.weights[layer.layer_idx][None, :, None]).to(q.device)
        W = view.W[:, :, None, :, 0]
        if view.rt is None or not self.centred_box:  # the kernels' forms (or no sketch: c = 0)
            rt = None if view.rt is None else view.rt[:, :, None]
            shared = self.sketch_box != "per-head"
            return B.sketch_radius(qr, rt, W, sm, wl, shared=shared).to(q.device).transpose(2, 3), None
        rt = view.rt[:, :, None]
        eps = B.sketch_radius(qr, rt, W, sm, wl, centered=True)  # [B, Hkv, Lq, GQ, n]
        c = B.sketch_center(qr, rt, sm)
        return eps.to(q.device).transpose(2, 3), c.to(q.device).transpose(2, 3)

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

    def _meter_and_gate(self, layer, q, al, sm, ev, dtype=torch.float64):
        """The meter (and the gate's repair loop) of a reference-path step; ``dtype``: the dtype the fp64 output is served
        in (the model's: its rounding joins E⁺, ``bounds.stored_output_error_bound``)."""
        Bsz, Hkv, GQ, Lq, n = ev["p"].shape
        ds = self.delta_step()
        gate = self.gate

        def measure():
            """TV⁺ = min(tanh, e-form, tilt) from the served logits (log domain: an underflowed p̂
            never hides a token), E⁺_V, ``bad`` (non-finite: saturated, flagged): ``witcert.meter``."""
            view = ev["view"]
            eps, c = self._radii(view, layer, q, al, sm)
            tb = self._tier_b_radii(view, q, al, sm, ds) if ds is not None else None
            # long prefill chunks: the closed forms (sound, looser)
            r = M.measure(ev["logits"], eps, mask=ev["al"], p_hat=ev["p"], values=view.vh[:, :, None, None],
                          value_witness=view.phi[:, :, None, None], radius_b=tb,
                          levels=METER_LEVELS if c is None else BOX_LEVELS,
                          tilt=Lq <= TILT_MAX_ROWS_PER_HEAD, center=c, grid=self.sketch_box == "grid")
            # the block risk reads a symmetric radius: the box ⊆ |δ| ≤ |c| + ε
            err = B.stored_output_error_bound(r.err, ev["o"], str(dtype).removeprefix("torch."))
            # an output past the served dtype's range (E⁺ +inf there) is non-finite, as the kernels count it
            bad = r.bad | (torch.isinf(err) & ~torch.isinf(r.err))
            m = {"tv": r.tv, "err": err, "bad": bad, "parts": r.parts, "eps": eps if c is None else eps + c.abs()}
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
        audit = self._audit(layer, q, al, sm, ev, m, dtype) if self.audit else None
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

    def _audit(self, layer, q, al, sm, ev, m, dtype=torch.float64):
        """Realised TV and ‖ô − o‖ against exact attention over the backing store (tests, demo); ô as served, in
        ``dtype``."""
        ek = layer.exact_k.to(layer.device).double()
        evv = layer.exact_v.to(layer.device).double()
        p, _ = _softmax(sm * torch.einsum("bhgld,bhnd->bhgln", q, ek), al)
        tv = 0.5 * (p - ev["p"]).abs().sum(-1)
        err = (torch.einsum("bhgln,bhnd->bhgld", p, evv) - ev["o"].to(dtype).double()).norm(dim=-1)
        # the audit's own fp64 evaluation error (both sides are fp64 sums over n tokens)
        tol = AUDIT_ABS_TOL * (1.0 + ev["o"].abs().amax(-1))
        viol = ((tv > m["tv"] + AUDIT_ABS_TOL) | (err > m["err"] + tol)) & ev["live"] & ~m["bad"]
        return tv, err, viol.sum()
