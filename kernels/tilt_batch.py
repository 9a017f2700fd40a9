"""Deferred record (issue 35): the decode's meter record without the dual-grid tilt — and, by default, without the
closed forms — finished for many layers' rows in one launch.

    batch = TiltBatch.allocate(layers=L, rows=B·Hq, nb=plan.hist_columns, device=dev)
    for ℓ in layers:   out = decode(..., tilt_batch=batch, tilt_layer=ℓ)   # the record pending
    batch.finish(tilt_above=τ)                                             # one launch: every layer's record

    _finish_tilt_kernel[(L·R,)]   one program per (layer, row), rows r = b·Hq + h
        HOUT  [L·R, NB]  float64   the merged histograms (tier A's bins first, ``epilogue.merge``)
        REC   [L·R, REC_COLS] float64   the records (read: TV⁺, ε_max, Ξ, the excess form and the DEFER columns; written:
                                   REC_TVA, REC_EA, REC_TILT; with FORMS also REC_EXCESS, REC_TANH, REC_EFORM, REC_RHO)
        FLAG  [L·R] int8           non-finite rows (1: skipped; ``reset`` marks every row so)
        EXS   [L·R, DEFER_EXS_COLS] float64   FORMS: the merged excess sums Â, B̂ and the grid block / L, how many
                                   of them the row holds (0, 2, EXCESS_COLS; −1 unwritten), the merge's non-finite count
        EDGES [KA − 1] float64;  SCR [L·R, 3·KP + COARSE] float64 scratch

Why: the record is the epilogue's cost. The tilt was ~25-40 µs a call on the H200 (one program per row, serial in
its grid; bench/RESULTS.md run N); without it the record merge is still ~12-13 µs of a ~65 µs call (run F3), a
latency chain of float64 steps: the excess and grid forms, tanh, the e-form, ρ. A decode at batch 1 has 32 rows a
layer: the GPU is nearly idle while they run. Batched over a step's layers they run in a few waves of one launch
instead of one latency per layer. ``forms`` (``kernels.plan.DEFER_FORMS``, on): the per-call merge keeps the merges
over the splits (o, the histograms, Ξ, Λ, ε_max, E⁺'s terms and the excess sums, all it must read the partials for)
and stores the excess sums; the finish computes every form from them. With ``forms`` the batch also holds the hand-over
``prt`` and the arrival counters ``cnt`` of the per-call merge in parts (``kernels.plan.MERGE_PARTS``: a row's merge in
two or three programs at once, ``epilogue_jit._merge_in_parts``); the finish does not read them.

Soundness: until ``finish`` each record's TV⁺ is sound: with ``forms``, 1 and its E⁺ (a single-token row its final
0), the forms' columns 1; without, the closed forms' min(tanh, e-form, excess) + tanh(Ξ/2) + ρ + slack (SPEC §3(a)(b),
§7). ``finish`` runs the fused merge's own lines on the same float64 inputs (the excess and grid forms from the sums
EXS holds; ``_tv_row`` on the masses HOUT holds, the levels |σ|‖a⊙q_h‖·edge, ε_max, Ξ, Λ, the excess form) and keeps
the smaller of the stored and the new TV⁺, which is the fused kernel's TV⁺ (its tilt is ≤ 1, so its TV⁺ ≤ the closed
forms' ≤ 1), then E⁺ from it as the fused kernel does (rows whose TV⁺ is already 0 — a single token, a row with none
zeroed by the decode — keep TV⁺ and E⁺ and take the tilt column, and with ``forms`` the forms' columns; flagged
rows are left as they are, and with ``forms`` so are rows whose merge counted anything non-finite (a dead row's 0/0),
but for the excess column, which the fused merge computes on every row). Layers may differ in their excess sums
(channel weights on some layers only): each row's state says what it holds. Tier A only: a
Tier B cache (int8_dither with δ) is refused; a gate needs the record before its layer's next step, so it keeps the
fused form. ``finish`` keeps the smaller of the stored and the new TV⁺ and tilt: idempotent, and a second finish at
another τ leaves a consistent record (the smaller τ's). A layer's slot takes one write between finishes (``slot``
refuses a second: two layers decoded into one slot would leave the first's records reading the second's). The
records are views into the batch: valid until their slot is written again (the next step), as a graph's static
records.
"""

from __future__ import annotations

import dataclasses
import numbers
import operator

import torch
import triton
import triton.language as tl

from .epilogue import _dense3d, _edges, _epsc, scratch_per_tier, tau_bracket, tilt_chunk
from .epilogue_jit import (
    COARSE,
    PRT_COLS,
    REC_COLS,
    REC_EA,
    REC_EFORM,
    REC_EPS,
    REC_EW,
    REC_EX,
    REC_EXCESS,
    REC_LAM,
    REC_QNA,
    REC_RHO,
    REC_TANH,
    REC_TILT,
    REC_TVA,
    REC_XI,
    REFINE,
    _out_err_upper,
    _tv_row,
    refine_top,
)
from .excess_grid import DEFER_EXS_COLS, DEFER_EXS_COLS_C, EXCESS_COLS, EXCESS_COLS_C, GRID_COLS_C
from .key_levels import KEY_LEVELS
from .merge_terms import _excess_form, _with_grid_form

#: warps per program of the finish (``num_warps`` None): 4, the fused merge's for a tilting record. One warp (the fused
#: merge's rule from 4 rows per SM up, ``kernels.plan.merge_warps``) was slower here: run G3 (an H100,
#: bench/tilt_batch_probe.py's "forms 1w", the default kernel, 32 layers, τ −1) 0.0331 against 0.0326 ms a layer at
#: B 1 / 4K (1,024 rows), 0.0995 against 0.0970 at B 8 / 4K (8,192 rows)
FINISH_WARPS = 4


@triton.jit
def _finish_tilt_kernel(HOUT, REC, FLAG, EDGES, SCR, EXS, tilt_above, tilt_hi,
                        NB: tl.constexpr, KA: tl.constexpr, KP: tl.constexpr, N1: tl.constexpr, RT: tl.constexpr,
                        NR: tl.constexpr, EPSC: tl.constexpr, DENSE3D: tl.constexpr, TC: tl.constexpr,
                        FORMS: tl.constexpr = False, EXC: tl.constexpr = False, GRD: tl.constexpr = False):
    """Program ``row``: the fused merge's ``_tv_row`` on the row's deferred inputs; REC's TV⁺, E⁺ and tilt. FORMS
    (the merge ran with DEFER_FORMS): first the excess form and the grid's from the merged sums EXS [L·R,
    DEFER_EXS_COLS] as the fused merge computes them (a row's state column says which it holds; EXC / GRD: some
    layer's row may), on every written row, then REC's tanh, e-form and ρ where the merge counted nothing
    non-finite (its other rows keep the merge's 1s, as the fused merge's)."""
    row = tl.program_id(0)
    r = REC + row * REC_COLS
    tv0 = tl.load(r + REC_TVA)
    live = tl.load(FLAG + row) == 0
    xi = tl.load(r + REC_XI)
    exc = tl.load(r + REC_EXCESS)  # (without FORMS: the merge's; with it, computed here, kept in a register)
    if FORMS:
        e = EXS + row * DEFER_EXS_COLS_C
        nsum = tl.load(e + EXCESS_COLS_C)  # (how many sums the merge stored; −1: unwritten)
        if nsum >= 0.0:  # the excess column on every written row, flagged or not, as the fused merge's
            exc = tl.full([], 1.0, tl.float64)
            if EXC:  # (a layer of the batch has the sums: ``epilogue_jit._merge_meter_kernel``'s own lines on them)
                if nsum > 0.0:
                    a_hat = tl.load(e)
                    exc = _excess_form(a_hat, tl.load(e + 1), xi)
                    if GRD:
                        if nsum > 2.0:
                            gs = tl.load(e + 2 + tl.arange(0, GRID_COLS_C))
                            exc = _with_grid_form(exc, a_hat, gs, xi)
            tl.store(r + REC_EXCESS, exc)
        # the rest only where the merge counted nothing non-finite (a dead row counts its 0/0: it keeps the 1s)
        live = live & (nsum >= 0.0) & (tl.load(e + EXCESS_COLS_C + 1) == 0.0)
    if live:
        k = tl.arange(0, KP)
        ha = tl.load(HOUT + row * NB + k, mask=k < KA, other=0.0)
        ha = tl.maximum(tl.where(ha == ha, ha, 0.0), 0.0)  # (the fused merge's sanitising of tier A's bins)
        edge = tl.load(EDGES + k, mask=k < KA - 1, other=0.0)
        tv, tanh, eform, tilt, rho = _tv_row(ha, tl.load(r + REC_QNA) * edge, tl.load(r + REC_EPS), xi,
                                             tl.load(r + REC_LAM), tilt_above, tilt_hi, SCR + row * (3 * KP + N1), exc,
                                             KA, KP, N1, RT, NR, EPSC, DENSE3D, TC)
        if FORMS:  # (functions of the row's inputs alone: the same at any τ)
            tl.store(r + REC_TANH, tanh)
            tl.store(r + REC_EFORM, eform)
            tl.store(r + REC_RHO, rho)
        # the smaller of the two sound values, for the tilt column as for TV⁺: a second finish (any τ) leaves a
        # consistent record (a lazier τ's tilt is ≥ the full one's)
        tl.store(r + REC_TILT, tl.minimum(tl.load(r + REC_TILT), tilt))
        if tv0 > 0.0:  # (0: a single token, or a row with none zeroed by the decode: TV⁺ and E⁺ stay)
            tva = tl.minimum(tv0, tv)
            tl.store(r + REC_TVA, tva)
            tl.store(r + REC_EA, _out_err_upper(tva, tl.load(r + REC_EW), tl.load(r + REC_EX)))


@dataclasses.dataclass
class TiltBatch:
    """The records of up to ``layers`` decode calls of one step (each ``rows`` = B·Hq rows), their tilt
    deferred to one ``finish`` launch. ``decode(..., tilt_batch=, tilt_layer=ℓ)`` writes layer ℓ's record
    into ``rec[ℓ]`` (its ``MeterRecord`` is a view: ``finish`` updates it in place)."""

    rec: torch.Tensor  # [L, R, REC_COLS] float64
    hout: torch.Tensor  # [L, R, NB] float64
    flag: torch.Tensor  # [L, R] int8
    ka: int
    #: the closed forms deferred too (``kernels.plan.DEFER_FORMS`` at allocation): ``exs`` [L, R, DEFER_EXS_COLS]
    #: float64 holds each row's merged excess sums (its first 0, 2 or EXCESS_COLS columns: the layer's), how many, and
    #: the merge's non-finite count; a record reads TV⁺ 1 until ``finish``
    forms: bool = False
    exs: torch.Tensor | None = None
    exc_cols: int = 0  # the most excess columns a layer wrote since allocation (what the finish compiles for)
    #: with ``forms``: the merge in parts' hand-over [L, R, PRT_COLS] float64 and arrival counters [L, R] int32 (0
    #: between calls: ``epilogue_jit._merge_in_parts``)
    prt: torch.Tensor | None = None
    cnt: torch.Tensor | None = None
    written: set = dataclasses.field(default_factory=set)  # the layers written since the last finish / reset

    @classmethod
    def allocate(cls, layers: int, rows: int, nb: int, device, ka: int = KEY_LEVELS + 2,
                 forms: bool | None = None) -> "TiltBatch":
        """``forms`` None: ``kernels.plan.DEFER_FORMS``."""
        for name, v in (("layers", layers), ("rows", rows), ("nb", nb)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TiltBatch.allocate: {name} must be a positive int, got {v!r}")
        if nb < ka:
            raise ValueError(f"TiltBatch.allocate: nb {nb} < the {ka} tier-A bins")
        if forms is None:
            from . import plan

            forms = plan.DEFER_FORMS
        if not isinstance(forms, bool):
            raise ValueError(f"TiltBatch.allocate: forms must be None, True or False, got {forms!r}")
        f64 = dict(device=device, dtype=torch.float64)
        batch = cls(rec=torch.zeros(layers, rows, REC_COLS.value, **f64), hout=torch.zeros(layers, rows, nb, **f64),
                    flag=torch.ones(layers, rows, device=device, dtype=torch.int8), ka=ka, forms=forms,
                    exs=torch.zeros(layers, rows, DEFER_EXS_COLS, **f64) if forms else None,
                    prt=torch.zeros(layers, rows, PRT_COLS.value, **f64) if forms else None,
                    cnt=torch.zeros(layers, rows, device=device, dtype=torch.int32) if forms else None)
        if forms:
            batch.exs[..., EXCESS_COLS] = -1.0  # (unwritten)
        return batch

    @property
    def layers(self) -> int:
        return self.rec.shape[0]

    @property
    def rows(self) -> int:
        return self.rec.shape[1]

    def slot(self, layer: int, rows: int, nb: int, ka: int, exc_cols: int = 0):
        """(rec [R, REC_COLS], hout [R, NB], flag [R], exs [R, DEFER_EXS_COLS] or None) of ``layer`` for a merge of
        ``rows`` rows, ``nb`` bins and ``exc_cols`` excess columns (0, 2 or EXCESS_COLS); refused when the layer was
        written since the last ``finish`` / ``reset``."""
        try:
            i = operator.index(layer) if not isinstance(layer, bool) else None
        except TypeError:
            i = None
        if i is None or not 0 <= i < self.layers:
            raise ValueError(f"tilt_layer: expected an int in [0, {self.layers}), got {layer!r}")
        if rows != self.rows or nb != self.hout.shape[-1] or ka != self.ka:
            raise ValueError(f"tilt_batch: allocated for {self.rows} rows, {self.hout.shape[-1]} bins, KA {self.ka}; "
                             f"this decode has {rows} rows, {nb} bins, KA {ka}")
        if i in self.written:
            raise ValueError(f"tilt_layer {i}: already written since the last finish() (one decode per layer and "
                             "step: another would overwrite the records the first returned)")
        if isinstance(exc_cols, bool) or not isinstance(exc_cols, int) or exc_cols not in (0, 2, EXCESS_COLS):
            raise ValueError(f"tilt_batch: exc_cols must be 0, 2 or {EXCESS_COLS}, got {exc_cols!r}")
        self.written.add(i)
        if not self.forms:
            return self.rec[i], self.hout[i], self.flag[i], None
        self.exc_cols = max(self.exc_cols, exc_cols)  # (layers may differ: each row's state says what it holds)
        return self.rec[i], self.hout[i], self.flag[i], self.exs[i]

    def handover(self, layer: int):
        """(prt [R, PRT_COLS], cnt [R]) of ``layer`` for the merge in parts (``kernels.plan.MERGE_PARTS``): with
        ``forms`` only (None, None without)."""
        if not self.forms:
            return None, None
        return self.prt[layer], self.cnt[layer]

    def reset(self) -> None:
        """Mark every row unwritten (``finish`` skips it) — for a batch reused across steps with fewer layers. The
        flag view of a record already handed out then reads True (conservative). (``exc_cols``, what the finish
        compiles for, stays: the rows' own states decide.)"""
        self.flag.fill_(1)
        if self.exs is not None:
            self.exs[..., EXCESS_COLS] = -1.0
            self.cnt.zero_()  # (a merge in parts that failed midway leaves a row's arrival count short)
        self.written.clear()

    def finish(self, tilt_above: float = -1.0, num_warps: int | None = None) -> None:
        """The tilt of every written row, in one launch (no host synchronisation): TV⁺, E⁺ and the tilt column
        of each record become the fused merge's at this ``tilt_above`` (< 0: every row's tilt in full; ≥ 0 a
        gate's τ: the lazy refinement; NaN or +inf: no tilt, TV⁺ the closed forms'). With ``forms`` the finish also
        computes the closed forms (the excess, tanh, e-form and ρ columns), at any τ. ``num_warps`` None:
        ``FINISH_WARPS``."""
        if isinstance(tilt_above, bool) or not isinstance(tilt_above, numbers.Real):
            raise ValueError(f"tilt_above: expected a real number, got {tilt_above!r}")
        if num_warps is not None and (isinstance(num_warps, bool) or not isinstance(num_warps, int)
                                      or num_warps not in (1, 2, 4, 8, 16)):
            raise ValueError(f"num_warps: expected None or 1, 2, 4, 8 or 16, got {num_warps!r}")
        n = self.layers * self.rows
        kp = triton.next_power_of_2(self.ka)
        dev = self.rec.device
        ec = self.exc_cols
        exs = self.exs if self.forms else self.rec
        # the tilt's float64 scratch, [L·R, scratch_per_tier(KP)]: two thirds of the batch's bytes if kept, so taken
        # per finish from the caching allocator (inside a capture: the graph's pool; no launch either way)
        scr = torch.empty(n, scratch_per_tier(kp), dtype=torch.float64, device=dev)
        _finish_tilt_kernel[(n,)](
            self.hout, self.rec, self.flag, _edges(dev, self.ka), scr, exs, *tau_bracket(tilt_above),
            NB=self.hout.shape[-1], KA=self.ka, KP=kp, N1=COARSE, RT=refine_top(), NR=REFINE,
            EPSC=_epsc(kp), DENSE3D=_dense3d(dev), TC=tilt_chunk(),
            FORMS=self.forms, EXC=self.forms and ec > 0, GRD=self.forms and ec == EXCESS_COLS,
            num_warps=num_warps or FINISH_WARPS,
        )
        if self.cnt is not None:  # (each merge in parts leaves its rows' counts at 0; this makes a step start there
            # even after a launch that failed midway, which would leave a count short and no row's last program)
            self.cnt.zero_()
        self.written.clear()
