"""Decode path with the meter (SPEC §2, §3, §5, §8): one pass over the paged KV.

    out = decode(cache, q, block_table, seq_lens, sm_scale, meter=True, num_splits=None,
                 delta_step=None, tilt_above=-1.0, plan=None)
        q            [B, Hq, D]       (Hq = GQ · Hkv, GQ in 1…8)
        block_table  [B, max_pages]   int32
        seq_lens     [B]              int32, ≥ 1
        → out.o [B, Hq, D] float32, out.lse [B, Hq], out.meter (MeterRecord) or None

Plan + run: ``kernels.plan.plan_decode`` fixes the launch from the shape (split count, tile, register
cap, the kernel variant: ``DecodePlan``); ``decode`` runs a plan (its own when given none). The kernel
is ``kernels.decode_kernel._decode_kernel``.

Grid: (B, Hkv, num_splits). A program serves the GQ query heads of one kv head (padded to
BLOCK_H columns for the tensor-core dots: ``Tile.head_columns``, 8 or 16) over its share of the sequence's pages, a tile of
PAGES pages at a time, every tile transposed (tokens × heads: the K̂, V̂ᵀ and one-hot tiles are
the dots' A operands, read from registers on Hopper): it dequantizes (regenerating the dither for ``int8_dither``), runs the
online softmax and the output accumulation, and, when METER, in the same pass:

* key-side levels: the Tier A radius ε_j(h) = σ Σ_g ‖q_h[g]‖ W[j, g] ≤ σ ‖q_h‖ ‖W_j‖₂ (Cauchy–
  Schwarz over the groups; equal for G = 1) factors into a head part and a token part, and so
  does the Tier B radius t_j(h) = c_h · s_j. Tokens are binned once per kv head by ‖W_j‖₂ and
  by s_j on a fixed geometric grid (ratio √2, rounded **up**), so all GQ query heads share the
  bins, and one tensor-core dot ``onehotᵀ @ p̂ᵀ`` per tile accumulates both p̂-mass histograms
  and, in its last row, Σ p̂ φ. The dot takes p̂ in fp32's range (on the GPU as bf16 hi + lo
  parts, packed into one dot where GQ ≤ BLOCK_H / 2 — PACK_HIST: the upper columns repeat the
  heads and carry the lo parts —, or tf32x3; ieee in the interpreter): so a p̂ that fp16 would flush (a logit gap ≥ ~28 below the
  running maximum) keeps its mass; only masses below 2^-126 of the running maximum can be
  lost, and those are counted into the ρ term of the epilogue;
* max ‖W_j‖, max s_j, max φ, max ν, max κ (≥ ‖k̂_j‖), and a count of non-finite radii / logits.

Floating point (SPEC §7): the histogram is of the distribution p̃ the kernel actually computed;
its log-ratio to p̂ = softmax(σ⟨q, k̂⟩) (exact) is at most Ξ = σ‖q_h‖·max κ·γ (the fp32 logit:
``paged.dot_gamma``) + the fp32 exp + 2.1·η (the mass accumulation: ``paged.mass_eta``); the
epilogue meters p̃ with every level raised by Ξ and adds tanh(Ξ/2) (TV(p̃, p̂)) and ρ (lost
masses), so TV⁺ bounds both TV(p, p̂) and TV(p, p̃).

On the GPU the K̂ tiles are dotted on tensor cores in q's dtype (bf16 or fp16; a float32 q must be
exactly bf16): int8 and fp8 codes are exact in both, the per-token key scales are folded into the
logits, and the int8_dither term q·u uses u split into hi + lo parts. The PV dot takes p̂·s_v
rounded to **bf16 whatever q's dtype** (relative 2^-8, bf16's unit roundoff, down to fp32's 2^-126: ``out_rel0``; fp16
would flush p̂·s_v below 2^-25, a logit gap of ~11 under s_v = 2^-10, which no relative bound
covers) with the 8-bit value codes (exact in bf16); exact fp16 values (scheme none or a repaired
pool under an fp16 query), which bf16 would round, take fp32 operands and tf32x3 (PV_F32).
``int4_group`` and ``kivi2`` tiles are unpacked and dequantized (z + s·c) in fp32 and dotted with
tf32x3 (kivi2: one 2-bit code per byte; the key scale / zero per channel of the page, the value
ones per 32 channels of the token).
In the interpreter everything stays in fp32.

Repaired pages (``repair=``, ``paged.RepairOverlay``; constexpr HAS_REP, off when no page is
repaired: the same code as without): per token lane the page's pool slot is loaded, and a
repaired token's exact K/V replace the dequantized codes before the dots (scale 1, no dither,
the int4 tiles too), with key radius 0, φ = 0, Tier B scale 0 and ν / κ ≥ its exact norms from
the pool. Its fp32 logit error is covered by the same σ‖q‖κγ (κ ≥ ‖k_j‖; on the GPU the pool is
in q's dtype, so the operand is exact).

Split partials are merged with the log-sum-exp rule (histograms and Σ p̂ φ rescaled like the
denominators) and ``kernels.epilogue`` turns the histograms into TV⁺ and the output bound.

Arguments of ``decode`` (beside its docstring's): ``tilt_above`` ≥ 0: the dual-grid tilt is computed
only for rows whose closed-form TV⁺ (min(tanh, e-form) + the fp terms, or the excess form + ρ where smaller) is above it (a gate with
threshold τ passes τ: at or below it the row is certified without the tilt), the others report tilt 1;
a tilted row refines its grid (``epilogue.COARSE`` intervals, then up to ``REFINE_TOP`` of them, 0 by default) only
until τ is settled either way and reports that grid's tilt (the gate's decision is the fully refined
one's); TV⁺ is sound either way. ``hist_split``: the histogram dot's operand split on the GPU, "bf16x2"
(default) or "tf32x3" (``paged.HIST_SPLIT_REL``). ``levels``: "token" (each token binned by its own
radius) or "page" (by its page's largest: looser where radii vary within a page, and cheaper: no
one-hot dot, bench/RESULTS.md). ``token_mask`` [B, ≥ max seq_len] bool (True = attend; left padding of
a batch): masked tokens are neither attended nor metered (Tier B's n and Λ still count them:
conservative). ``prefetch_bt`` (None: with the meter): load the next tile's block-table entries one
iteration ahead (measured on the H200, bench/RESULTS.md run E: 2–7 % faster with the meter, mixed
without)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import NamedTuple

import torch
from triton.runtime.errors import OutOfResources

from . import plan as plan_mod
from .decode_kernel import _decode_kernel
from .decode_steps import MAGIC_SKETCH_BITS
from .epilogue import (  # noqa: F401 (re-export)
    OUT_DTYPES,
    MergeConstants,
    MeterRecord,
    OutputBufferError,
    check_outputs,
    merge,
    merge_torch,
    tier_b_coefficients,
    zero_rows,
)
from .exact_window import ExactWindow
from .excess_grid import EXCESS_COLS
from .fp_bounds import KERNEL_REL_SLACK, dot_gamma, mass_eta_terms, store_terms
from .interpret import INTERPRET
from .key_levels import KEY_LEVELS, X0
from .paged import SCHEME_IDS, PagedKV, dequantized_fp32, page_scaled_keys
from .pdl import gdc, pdl_call
from .plan import DecodePlan, Tile, check_plan, launch_variant, plan_call
from .repair import RepairOverlay
from .unmetered import UnmeteredSlots


@dataclasses.dataclass
class DecodeOutput:
    o: torch.Tensor
    lse: torch.Tensor
    meter: MeterRecord | None
    compiled: object = None  # the launched kernel (registers / spills for the benchmark)
    plan: DecodePlan | None = None  # the plan it ran (its split count and tile for a re-decode of some rows)

    def with_rows(self, rows: torch.Tensor, sub: "DecodeOutput") -> "DecodeOutput":
        """A copy whose sequences ``rows`` come from ``sub`` (a decode of just those sequences;
        every other row kept). Each (sequence, kv head, split) program and each merged row depend
        only on their own sequence, so with the same ``num_splits`` the rows are those of a decode of
        the whole batch (the gate re-decodes only the sequences it repaired), up to the kernel
        variant: a rows-only decode may run another one (the overlay on, HAS_REP, where the first
        decode had none), whose rounding may differ in the last bits (on the H200 and in the
        interpreter, tests/test_kernel_gate.py): every row's bound is the kernel's own, sound either
        way."""
        def put(full, part):
            if full is None:
                return None
            out = full.clone()
            out[rows] = part
            return out

        rec = None
        if self.meter is not None:
            rec = MeterRecord(**{f.name: put(getattr(self.meter, f.name), getattr(sub.meter, f.name))
                                 for f in dataclasses.fields(MeterRecord)})
        return DecodeOutput(o=put(self.o, sub.o), lse=put(self.lse, sub.lse), meter=rec, compiled=sub.compiled,
                            plan=self.plan)




#: off the GPU (the interpreter): "torch" serves the merge / epilogue with its torch twin
#: (``epilogue.merge_torch``, fast), "kernel" runs the fused Triton kernel (the conformance suites)
MERGE_OFF_GPU = "torch"
_LOGGED: dict = {}
#: decode configurations whose default tile did not fit the GPU (OutOfResources): the pages per tile that did
_TILE_FIT: dict = {}
log = logging.getLogger("witcert.kernels")


def tensor_core_query(q: torch.Tensor, cache: PagedKV, validate: bool = True) -> torch.Tensor:
    """The query for the GPU path, whose tensor-core dots run in q's dtype. A rounding of q
    would change the served logits without being metered, so q must already be bf16/fp16, or a
    float32 that is exactly bf16 (checked only when ``validate``; NaN/Inf pass and saturate)."""
    if q.dtype == torch.float32:
        low = q.to(torch.bfloat16)
        if not (validate and torch.equal(torch.nan_to_num(q), torch.nan_to_num(low.float()))):
            raise ValueError("q: the GPU path multiplies in bf16/fp16; pass q in the model's dtype (a float32 q "
                             "would be rounded without being metered)")
        q = low
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q: expected bfloat16 or float16 on the GPU path, got {q.dtype}")
    if cache.scheme == "none" and q.dtype != cache.exact_k.dtype:
        raise ValueError(f"q: scheme 'none' stores {cache.exact_k.dtype} codes; q must have that dtype, got {q.dtype}")
    return q




def decode(
    cache: PagedKV,
    q: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | None,
    sm_scale: float | None = None,
    meter: bool = True,
    num_splits: int | None = None,
    delta_step: float | None = None,
    pages_per_tile: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    validate: bool = True,
    epilogue: bool = True,
    tilt_above: float = -1.0,
    hist_split: str | None = None,
    levels: str = "token",
    token_mask: torch.Tensor | None = None,
    prefetch_bt: bool | None = None,
    kv_indptr: torch.Tensor | None = None,
    repair: RepairOverlay | None = None,
    tile: Tile | None = None,
    window: ExactWindow | None = None,
    plan: DecodePlan | None = None,
    tilt_batch=None,
    tilt_layer: int | None = None,
    unmetered: UnmeteredSlots | None = None,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    store_dtype: torch.dtype | None = None,
) -> DecodeOutput:
    """See the module docstring. ``validate=False`` skips the checks that need a device sync;
    ``epilogue=False`` (benchmarks) stops after the merge, without the meter record.
    ``plan`` (``kernels.plan.plan_decode``): the launch's configuration; None: ``plan_decode`` with this
    call's shape and ``num_splits`` (None: ``choose_splits``, the one heuristic), ``tile`` (None:
    ``tile_config`` for this grid and its register cap; a gate's re-decode of some rows passes the whole
    batch's: the grid is smaller, the tile and so the sums must be the same), ``pages_per_tile`` /
    ``num_stages`` / ``num_warps`` (None: the tile's), ``hist_split``, ``prefetch_bt``; with a plan
    those must be None, and a plan made for another kernel variant is refused. ``tilt_above``,
    ``hist_split``, ``levels``, ``token_mask``, ``prefetch_bt``: the module docstring ("Arguments").
    ``kv_indptr`` [≥ B + 1] int32 (SGLang's layout, block size 1 only): ``block_table`` is then the
    flat ``kv_indices`` (token slots; sequence b's are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``)
    and ``seq_lens`` must be None: the kernel reads the CSR rows directly (no [B, max_len] table, no
    host sync); ``num_splits=None`` then sizes the split count from the mean length.
    ``repair`` (``paged.RepairOverlay``, gated caches, SPEC §6): repaired pages are served from its
    exact pool (scale 1, no dither, radius 0, φ = 0, ν / κ from the pool's norms); None, or an
    overlay with no slot in use, launches the kernel without the overlay (HAS_REP off: the same
    code as before). On the GPU the pool's dtype must be q's (bf16 / fp16): the dots run in it.
    Off the GPU the merge / epilogue runs as ``epilogue.merge_torch`` (``MERGE_OFF_GPU``), which
    computes the tilt on every row whatever ``tilt_above`` is. ``window`` (``paged.ExactWindow``, one ring
    per sequence of this batch): each sequence's first ``sink`` and last ``recent`` tokens are served from
    it (model dtype, radius 0, φ = 0, ν / κ from its norms); not with ``kv_indptr``. A cache with a key
    sketch or channel weights (``PagedKV.sketch_bits`` / ``weights``) is metered with the sketch radius
    ε_hj = c_h (W_j + u_j) (``contract.sketch``), or with ``PagedKV.head_levels`` each head's own
    c_h W_j + |σ⟨q_h, r̃_j⟩|, binned per (token, head). ``tilt_batch`` (``kernels.tilt_batch.TiltBatch``): the
    record is written to its layer ``tilt_layer`` with the tilt deferred to ``tilt_batch.finish`` (one launch
    for a step's layers; until then TV⁺ is sound: 1, or the closed forms' where the batch does not defer them, ``TiltBatch.forms``);
    the fused merge kernel runs on any device.
    ``unmetered`` (``UnmeteredSlots``, CSR rows and the meter only): token slots without a valid witness; a row that
    reads one, or a slot outside the pool (slot P − 1 read instead), or any row when its ``every`` flag is set, gets the record of a
    non-finite row (TV⁺ 1, output bound +inf, flagged), counted in the kernel: no launch of its own, no sync.
    A row without any attended token (an empty CSR row, seq_len 0) gets output 0, TV⁺ and output bound 0, no flag (what
    the reference gives), from the merge; a fully masked row (``token_mask``) after it (``_zero_dead_rows``).
    ``out`` [B, Hq, D] (float32 / bfloat16 / float16) and ``lse_out`` [B, Hq, W] float32 (``epilogue.check_outputs``;
    not with ``token_mask``): the caller's buffers, which the merge writes itself (the output in ``out``'s dtype, the
    log-sum-exp in ``lse_out[..., 0]`` and −inf in its other columns: SGLang's ``o`` and ``attn_lse``, no copy
    launches after it); ``out.o`` / ``out.lse`` are then those buffers. ``store_dtype`` (float32 / bfloat16 / float16;
    None: ``out``'s dtype, else float32): the dtype the output is served in, where the caller casts the float32 output
    itself; its rounding joins the output bound E⁺ (``fp_bounds.store_terms``), as the merge's own store into a
    narrower ``out`` does."""
    if tilt_batch is not None:
        from .tilt_batch import TiltBatch

        if not isinstance(tilt_batch, TiltBatch) or tilt_layer is None:
            raise ValueError("tilt_batch: expected a kernels.tilt_batch.TiltBatch and tilt_layer, this decode's "
                             f"layer in it (got {type(tilt_batch).__name__}, tilt_layer={tilt_layer!r})")
    seq_lens, kv_indptr = _check_inputs(cache, q, block_table, seq_lens, kv_indptr, delta_step, validate)
    served = _served_dtype(out, store_dtype)
    csr = kv_indptr is not None
    Bsz, Hq, D = q.shape
    q_in = q
    lowp = not INTERPRET and q.device.type == "cuda"  # tensor-core dots in q's dtype (the interpreter: fp32)
    q = (tensor_core_query(q, cache, validate) if lowp else q).contiguous()
    has_rep, has_win = _check_overlays(cache, q, repair, window, csr, Bsz, validate, lowp)
    if unmetered is not None:
        unmetered.check(csr, meter, q.device, cache.k_codes.shape[0])
    if out is not None or lse_out is not None:
        if token_mask is not None:
            raise OutputBufferError("out / lse_out: not with token_mask (its fully masked rows are zeroed after the merge)")
        # (what the merge reads after other rows were written, and what this and later calls read: the cache, the
        # block table, the overlays, a deferred tilt's records and scratch)
        check_outputs(out, lse_out, Bsz, Hq, D, q.device, query=(q, q_in),
                      reads=(seq_lens, kv_indptr, block_table, *_tensors_of(cache, repair, window, unmetered, tilt_batch)))
    if plan is None:  # the split count from the table's capacity (CSR: the mean length), not seq_lens: no sync
        plan = plan_call(cache, q, block_table, csr, meter=meter, levels=levels, hist_split=hist_split,
                         delta_step=delta_step, repair=repair, window=window, num_splits=num_splits, tile=tile,
                         pages_per_tile=pages_per_tile, num_warps=num_warps, num_stages=num_stages,
                         prefetch_bt=prefetch_bt)
    elif any(a is not None for a in (num_splits, tile, pages_per_tile, num_warps, num_stages, hist_split, prefetch_bt)):
        raise ValueError("plan: with a plan, num_splits, tile, pages_per_tile, num_warps, num_stages, hist_split "
                         "and prefetch_bt come from it (pass None)")
    check_plan(plan, launch_variant(cache, q.dtype, q.device, meter, levels, delta_step, repair, window, csr),
               Hq // cache.num_kv_heads)
    tm = _token_mask(token_mask, seq_lens, Bsz, q.device, validate)
    sm = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    ws = _workspace(q, plan)
    rows = _rows(block_table, seq_lens, kv_indptr, tm, q.device)
    sl = rows.sl
    compiled, pages = _launch(cache, q, plan, rows, ws, sm, repair if has_rep else None, window if has_win else None,
                              unmetered)
    consts = _merge_constants(cache, plan, pages, sm, delta_step, window if has_win else None, Hq // cache.num_kv_heads)
    if served != "float32":  # the output's rounding into the dtype it is served in joins E⁺
        consts = dataclasses.replace(consts, store=store_terms(served, "float32", D))
    o, lse, rec = _merge(plan, ws, q, sl, consts, epilogue, tilt_above, tilt_batch, tilt_layer, out, lse_out)
    if token_mask is not None:  # (a row with no token, seq_len 0, is the merge's: output 0, TV⁺ 0)
        o = _zero_dead_rows(o, rec, sl[1:] - sl[:-1] if consts.csr_lens else sl, token_mask)
    return DecodeOutput(o=o, lse=lse, meter=rec, compiled=compiled, plan=plan)


def _tensors_of(*objs) -> list:
    """The tensors among the fields of these dataclasses (None skipped): what an output buffer must not overlap."""
    return [v for o in objs if o is not None for f in dataclasses.fields(o)
            if isinstance(v := getattr(o, f.name), torch.Tensor)]


def _served_dtype(out: torch.Tensor | None, store_dtype: torch.dtype | None) -> str:
    """The name of the dtype the decode's output is served in (``decode``'s ``store_dtype``)."""
    if store_dtype is not None:
        if store_dtype not in OUT_DTYPES:
            raise ValueError(f"store_dtype: expected torch.float32, bfloat16 or float16, got {store_dtype!r}")
        if out is not None and isinstance(out, torch.Tensor) and out.dtype != store_dtype:
            raise ValueError(f"store_dtype: {store_dtype} but out is {out.dtype} (the merge stores into out's dtype)")
    dt = store_dtype if store_dtype is not None else out.dtype if isinstance(out, torch.Tensor) else torch.float32
    return str(dt).removeprefix("torch.")


def _check_inputs(cache: PagedKV, q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor | None,
                  kv_indptr: torch.Tensor | None, delta_step: float | None, validate: bool):
    """q's shape and dtype against the cache, ``delta_step``, and the rows: ``seq_lens`` [B] with a
    [B, max_pages] block table, or SGLang's CSR rows (``kv_indptr``: the lengths are its differences, on
    the device). Returns (seq_lens, kv_indptr: its first B + 1 entries as int32 on q's device, or None)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected [B, Hq, D], got {tuple(q.shape)}")
    Bsz, Hq, D = q.shape
    Hkv = cache.num_kv_heads
    if D != cache.head_dim:
        raise ValueError(f"q: head dim {D} does not match the cache's {cache.head_dim}")
    if Hq % Hkv or not 1 <= Hq // Hkv <= 8:
        raise ValueError(f"q: {Hq} query heads over {Hkv} kv heads: GQA group must be an integer in 1..8")
    csr = kv_indptr is not None
    if csr:
        if seq_lens is not None:
            raise ValueError("kv_indptr: seq_lens must be None (the lengths are kv_indptr's differences)")
        if cache.block_size != 1:
            raise ValueError(f"kv_indptr: the CSR layout is for block size 1 (token slots), the cache has {cache.block_size}")
        if kv_indptr.dim() != 1 or kv_indptr.shape[0] < Bsz + 1 or kv_indptr.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"kv_indptr: expected an int32/int64 [≥ B + 1 = {Bsz + 1}] tensor, got "
                             f"{kv_indptr.dtype} {tuple(kv_indptr.shape)}")
        if block_table.dim() != 1:
            raise ValueError(f"kv_indptr: block_table must be the flat kv_indices [total], got {tuple(block_table.shape)}")
        raw = kv_indptr[: Bsz + 1]
        if validate:  # (on the rows as given: an int64 entry past 2^31 would wrap in the int32 the kernels read)
            if torch.any(raw[1:] - raw[:-1] < 1):
                raise ValueError("seq_lens: every sequence needs at least one cached token")
            if int(raw[-1]) > block_table.shape[0] or int(raw[0]) < 0:
                raise ValueError("kv_indptr: rows reach outside kv_indices")
        kv_indptr = raw.to(device=q.device, dtype=torch.int32)
        seq_lens = kv_indptr[1:] - kv_indptr[:-1] if validate else None  # (the kernels read kv_indptr itself)
    else:
        if seq_lens is None or seq_lens.shape != (Bsz,) or block_table.dim() != 2 or block_table.shape[0] != Bsz:
            raise ValueError("seq_lens [B] and block_table [B, max_pages] must match q's batch")
        if validate:
            if torch.any(seq_lens < 1):
                raise ValueError("seq_lens: every sequence needs at least one cached token")
            if torch.any(seq_lens > block_table.shape[1] * cache.block_size):
                raise ValueError("seq_lens: longer than the block table covers")
    if delta_step is not None and not 0 < delta_step < 1:
        raise ValueError(f"delta_step: expected a probability in (0, 1), got {delta_step!r}")
    if q.dtype == torch.float64:
        raise ValueError("q: the kernels compute in fp32 and would round a float64 query without metering it; "
                         "a float64 model uses the reference path")
    return seq_lens, kv_indptr


def _check_overlays(cache: PagedKV, q: torch.Tensor, repair: RepairOverlay | None, window: ExactWindow | None,
                    csr: bool, Bsz: int, validate: bool, lowp: bool) -> tuple[bool, bool]:
    """The repair overlay and the exact window against the cache and q's dtype (the GPU's dots run in it).
    Returns whether each is on (an overlay with no slot in use, an empty window: off, the same code as without)."""
    if repair is not None:
        if not isinstance(repair, RepairOverlay):
            raise ValueError(f"repair: expected a kernels.repair.RepairOverlay, got {type(repair).__name__}")
        repair.validate(cache, check_slots=validate)
        if lowp and repair.k.dtype != q.dtype:
            raise ValueError(f"repair: the GPU dots run in q's dtype {q.dtype}; the exact pool is {repair.k.dtype} "
                             "(it would be rounded without being metered)")
    has_rep = repair is not None and repair.count > 0
    if window is not None:
        if not isinstance(window, ExactWindow):
            raise ValueError(f"window: expected a kernels.exact_window.ExactWindow, got {type(window).__name__}")
        if csr:
            raise ValueError("window: the exact window needs per-sequence rings; not with kv_indptr (SGLang's layout)")
        window.validate(cache, Bsz)
        if lowp and window.k.dtype != q.dtype:
            raise ValueError(f"window: the GPU dots run in q's dtype {q.dtype}; the ring is {window.k.dtype}")
    has_win = window is not None and window.columns > 0
    return has_rep, has_win


def _rows(block_table: torch.Tensor, seq_lens: torch.Tensor, kv_indptr: torch.Tensor | None,
          tm: torch.Tensor | None, dev) -> _Rows:
    bt = block_table
    if bt.dtype != torch.int32:
        if kv_indptr is not None and bt.dtype == torch.int64:
            # a CSR slot past int32's range would wrap onto a slot of the pool (and be served, metered, with that slot's
            # witness): it becomes -1, which the unmetered count flags (review, 2026-12-05); SGLang passes int32
            bt = torch.where((bt < -(2**31)) | (bt >= 2**31), -1, bt)
        bt = bt.to(torch.int32)
    if kv_indptr is not None:  # CSR: the kernels read the lengths as kv_indptr's differences (MergeConstants.csr_lens)
        sl = kv_indptr
    else:
        sl = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    bt, sl = bt.to(dev).contiguous(), sl.to(dev).contiguous()
    return _Rows(bt=bt, sl=sl, tm=sl if tm is None else tm, masked=tm is not None)


def _token_mask(token_mask: torch.Tensor | None, seq_lens: torch.Tensor, Bsz: int, dev, validate: bool):
    """The padding mask as the kernel reads it (uint8 rows on the device), or None."""
    if token_mask is None:
        return None
    if token_mask.dim() != 2 or token_mask.shape[0] != Bsz or token_mask.dtype != torch.bool:
        raise ValueError(f"token_mask: expected a bool [B={Bsz}, max_len] tensor, got "
                         f"{token_mask.dtype} {tuple(token_mask.shape)}")
    if validate and torch.any(seq_lens.to(token_mask.device) > token_mask.shape[1]):
        raise ValueError("token_mask: shorter than a sequence")
    if token_mask.stride(1) != 1:
        token_mask = token_mask.contiguous()
    return token_mask.to(dev).view(torch.uint8)


#: the per-split statistics the kernel stores (max ‖W‖, max s, max φ, max ν, the non-finite count, max κ)
STAT_COLUMNS = 6


class _Partials(NamedTuple):
    """The split partials the kernel writes and the merge reads ([B, Hq, S, ...] float32)."""
    m: torch.Tensor  # running maxima
    l: torch.Tensor  # noqa: E741 (the softmax denominators, the kernel's L_OUT)
    acc: torch.Tensor  # [.., D] output accumulators
    hist: torch.Tensor  # [.., NB] the level histograms and Σ p̂ φ (unmetered: a placeholder)
    stat: torch.Tensor  # [.., STAT_COLUMNS] (unmetered: a placeholder)
    ex: torch.Tensor | None = None  # [.., 2] the excess sums A, B (``excess_form``; else None); [.., EXCESS_COLS]: + the grid


class _Rows(NamedTuple):
    """The rows as the kernel reads them (int32, on q's device)."""
    bt: torch.Tensor  # the block table (CSR: the flat kv_indices)
    sl: torch.Tensor  # what the kernel and the merge read: the lengths, or the CSR row pointers (MergeConstants.csr_lens)
    tm: torch.Tensor  # the uint8 padding mask (without one: a placeholder)
    masked: bool


def _workspace(q: torch.Tensor, plan: DecodePlan) -> _Partials:
    Bsz, Hq, D = q.shape
    S = plan.num_splits
    f32 = dict(device=q.device, dtype=torch.float32)
    m_out = torch.empty(Bsz, Hq, S, **f32)
    l_out = torch.empty(Bsz, Hq, S, **f32)
    acc_out = torch.empty(Bsz, Hq, S, D, **f32)
    hist = torch.empty(Bsz, Hq, S, plan.hist_columns, **f32) if plan.meter else m_out
    stat = torch.empty(Bsz, Hq, S, STAT_COLUMNS, **f32) if plan.meter else m_out
    ex = torch.empty(Bsz, Hq, S, EXCESS_COLS if plan.grid else 2, **f32) if excess_form(plan) else None
    return _Partials(m_out, l_out, acc_out, hist, stat, ex)


def excess_form(plan: DecodePlan) -> bool:
    """Whether the launch accumulates the centred sketch box's excess sums (``plan.excess``: ``kernels.plan.launch_variant`` sets
    it only with the meter and the sketch radius, ``check_plan`` refuses a plan made otherwise): tier A's further closed
    form in the merge (``merge_terms._excess_form``)."""
    return plan.excess


def _kernel_args(cache: PagedKV, q: torch.Tensor, plan: DecodePlan, rows: _Rows, ws: _Partials, sm: float,
                 repair: RepairOverlay | None, window: ExactWindow | None, unmetered: UnmeteredSlots | None) -> tuple:
    """``_decode_kernel``'s tensors and runtime scalars, in its order (an absent input: a placeholder)."""
    sl, skb = rows.sl, plan.sketch_bits
    has_rep, has_win = repair is not None, window is not None
    return (
        q, cache.k_codes, cache.v_codes, cache.k_scale, cache.v_scale, cache.k_zero, cache.v_zero,
        cache.k_wit, cache.v_wit, cache.v_norm, cache.k_norm, rows.bt, rows.sl, rows.tm,
        *((repair.slot, repair.k, repair.v, repair.k_norm, repair.v_norm) if has_rep else (sl, q, q, ws.m, ws.m)),
        cache.k_sketch if skb else sl, cache.weights if plan.weighted else sl,
        *((window.k, window.v, window.k_norm, window.v_norm) if has_win else (q, q, ws.m, ws.m)),
        *((unmetered.slots, unmetered.every) if unmetered is not None else (sl, sl)),
        ws.m, ws.l, ws.acc, ws.hist, ws.stat, ws.ex if ws.ex is not None else ws.m,
        cache.seed, cache.layer, sm, plan.num_splits, window.sink if has_win else 0, window.recent if has_win else 0,
        unmetered.slots.shape[0] if unmetered is not None else 0,
        q.stride(0), q.stride(1),
        cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
        cache.k_scale.stride(0), cache.k_scale.stride(1), 0 if page_scaled_keys(cache.scheme) else cache.k_scale.stride(2),
        cache.v_scale.stride(0), cache.v_scale.stride(1), cache.v_scale.stride(2),
        cache.k_wit.stride(0), cache.k_wit.stride(1), cache.k_wit.stride(2),
        cache.v_wit.stride(0), cache.v_wit.stride(1), cache.v_norm.stride(0), cache.v_norm.stride(1),
        0 if plan.csr else rows.bt.stride(0), rows.tm.stride(0), repair.slot.stride(0) if has_rep else 0,
        *(cache.k_sketch.stride()[:3] if skb else (0, 0, 0)),
        *(window.k_norm.stride()[:2] if has_win else (0, 0)),
        q.shape[1],
    )


def _kernel_constants(cache: PagedKV, q: torch.Tensor, plan: DecodePlan, masked: bool, has_rep: bool,
                      has_win: bool, has_unmet: bool = False) -> dict:
    """``_decode_kernel``'s constexprs but PAGES (the kernel variant and its tile)."""
    lowp = plan.lowp
    grid = excess_form(plan) and plan.grid
    return dict(
        INFL=1.0 + KERNEL_REL_SLACK, X0=X0,
        GQ=q.shape[1] // cache.num_kv_heads, BLOCK_H=plan.head_columns, D=q.shape[2], T=cache.block_size,
        G=cache.num_groups, K=KEY_LEVELS, NB=plan.hist_columns,
        SCHEME=SCHEME_IDS[cache.scheme], METER=plan.meter, TIER_B=plan.tier_b, PER_TOKEN=cache.per_token_witness,
        LOWP=lowp, PREC32="tf32x3" if lowp else "ieee", PREC_HIST="tf32x3" if lowp else "ieee",
        HIST_BF16=plan.hist_split == "bf16x2", PAGE_LEVELS=plan.levels == "page", HAS_MASK=masked,
        PREFETCH_BT=plan.prefetch_bt, CSR=plan.csr, HAS_REP=has_rep,
        PACK_HIST=plan.pack_hist, PV_F32=plan.pv_f32, PF_AHEAD=plan.prefetch, SKB=plan.sketch_bits,
        WEIGHTED=plan.weighted, HAS_WIN=has_win,
        MAGIC_BF16=lowp and q.dtype == torch.bfloat16 and plan.sketch_bits in MAGIC_SKETCH_BITS, HEAD_LEVELS=plan.head_levels,
        HAS_UNMET=has_unmet, EXC=excess_form(plan), GRD=grid,
        NORMS_PT=cache.norms_per_token, GDC=gdc(q.device),
        KEY_F16=(lowp and q.dtype == torch.bfloat16 and cache.scheme in plan_mod.KEY_F16_SCHEMES and not has_rep
                 and (not plan.meter or plan_mod.KEY_F16_METERED)),
        **plan_mod.eviction_hints(), GRID_ONE=grid and plan_mod.grid_one_reduce(q.device),
    )


def _launch(cache: PagedKV, q: torch.Tensor, plan: DecodePlan, rows: _Rows, ws: _Partials, sm: float,
            repair: RepairOverlay | None, window: ExactWindow | None, unmetered: UnmeteredSlots | None = None):
    """Run the kernel on the grid (B, Hkv, S). Returns (the compiled kernel, the pages per tile it ran).

    A tile that does not fit the GPU's shared memory (OutOfResources at compile time: the fp32
    dequantized kivi2 tiles with G = 2 at 128 tokens on sm_90, 2026-12-02) is retried at half the
    tokens, logged once per configuration; the meter's constants take the tile that ran.
    A tile the caller chose (``plan.auto_tile`` False) is not changed."""
    args = _kernel_args(cache, q, plan, rows, ws, sm, repair, window, unmetered)
    consts = _kernel_constants(cache, q, plan, rows.masked, repair is not None, window is not None,
                               unmetered is not None)
    extra = {}
    if plan.num_stages is not None:
        extra["num_stages"] = plan.num_stages
    if plan.max_registers is not None and not INTERPRET:  # a register cap per thread (the plan's)
        extra["maxnreg"] = plan.max_registers
    D, T = q.shape[2], cache.block_size
    fit_key = (str(q.device), cache.scheme, plan.meter, plan.tier_b, cache.num_groups, cache.per_token_witness, D, T,
               plan.head_columns, plan.hist_columns, plan.num_stages, plan.num_warps, plan.levels, plan.hist_split,
               repair is not None, rows.masked, plan.csr, plan.max_registers, plan.pack_hist, plan.pv_f32,
               plan.prefetch, plan.sketch_bits, plan.weighted, window is not None, q.dtype, plan.head_levels,
               unmetered is not None, cache.norms_per_token)
    pages = plan.pages_per_tile
    if plan.auto_tile:
        pages = min(pages, _TILE_FIT.get(fit_key, pages))
    grid = (q.shape[0], cache.num_kv_heads, plan.num_splits)
    while True:
        try:
            return pdl_call(q.device, "decode", lambda kw: _decode_kernel[grid](
                *args, PAGES=pages, **consts, num_warps=plan.num_warps, **extra, **kw)), pages
        except OutOfResources as e:
            if not plan.auto_tile or pages <= 1:
                raise
            log.warning("decode: %s (scheme %s, meter %s, G %d, d %d, %d-token tiles): retrying at %d-token tiles",
                        e, cache.scheme, plan.meter, cache.num_groups, D, pages * T, pages * T // 2)
            pages //= 2
            _TILE_FIT[fit_key] = pages  # later calls of this configuration start there


def _merge_constants(cache: PagedKV, plan: DecodePlan, pages: int, sm: float, delta_step: float | None,
                     window: ExactWindow | None, gq: int) -> MergeConstants:
    """What the merge needs from the launch that ran (SPEC §7 terms of ``kernels.paged``)."""
    D, T = cache.head_dim, cache.block_size
    return MergeConstants(
        D=D, T=T, PAGES=pages, NB=plan.hist_columns, KA=KEY_LEVELS + 2, sm=sm, tier_b=plan.tier_b,
        delta_step=delta_step, gamma=dot_gamma(D, split3=dequantized_fp32(cache.scheme)),
        dither_u=abs(sm) * 2.0**-19 if cache.scheme == "int8_dither" and plan.lowp else 0.0,
        eta=mass_eta_terms(pages * T, plan.hist_split, packed=plan.pack_hist and plan.hist_split == "bf16x2"),
        out_rel0=2.0**-8 if plan.lowp else 0.0,
        weights=cache.weights if plan.weighted else None, gq=gq,
        ring_tiles=-(-window.columns // (pages * T)) if window is not None else 0, csr_lens=plan.csr,
    )


def _merge(plan: DecodePlan, ws: _Partials, q: torch.Tensor, sl: torch.Tensor, consts: MergeConstants,
           epilogue: bool, tilt_above: float, tilt_batch=None, tilt_layer: int | None = None, out=None, lse_out=None):
    """The split-KV merge and, with the meter and ``epilogue``, the meter record: (o, lse, record or None); into
    ``out`` / ``lse_out`` where given (``decode``)."""
    # (the torch twin has no deferred form: with a tilt_batch the kernel runs on any device)
    if q.device.type != "cuda" and MERGE_OFF_GPU == "torch" and tilt_batch is None:
        # the interpreter runs the fused merge at ~0.1 s per row: off the GPU its torch twin (the
        # same function, pinned to the kernel by test_fused_merge_matches_torch_merge) serves
        # instead; the conformance suites set MERGE_OFF_GPU = "kernel" and run the kernel itself
        if not _LOGGED.get("merge"):
            log.info("decode off the GPU: the merge / meter epilogue runs as kernels.epilogue.merge_torch")
            _LOGGED["merge"] = True
        with_rec = plan.meter and epilogue
        o, lse, rec = merge_torch(ws.m, ws.l, ws.acc, ws.hist if with_rec else None, ws.stat if with_rec else None, q,
                                  sl, consts, ex=ws.ex if with_rec else None)
        if out is not None:  # what the kernel writes into the caller's buffers
            o = out.copy_(o)
        if lse_out is not None:
            lse_out[..., 1:] = float("-inf")
            lse = lse_out[..., 0].copy_(lse)
        return o, lse, rec
    return merge(ws.m, ws.l, ws.acc, ws.hist if plan.meter else None, ws.stat if plan.meter else None, q, sl, consts,
                 epilogue=plan.meter and epilogue, tilt_above=tilt_above, tilt_batch=tilt_batch, tilt_layer=tilt_layer,
                 out=out, lse_out=lse_out, ex=ws.ex)


def _zero_dead_rows(o: torch.Tensor, rec: MeterRecord | None, sl: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """A row whose ``token_mask`` masks every token: what the reference gives (witcert.meter.softmax: p̂ = 0, so output
    0, TV⁺ and error bound 0, no flag), not the merge's 0/0 = NaN (issue 36); no host sync. (A row with seq_len 0 or an
    empty CSR row is the merge's own: ``epilogue.merge``.) Returns o (rec in place)."""
    dev = sl.device
    j = torch.arange(token_mask.shape[1], device=dev)
    live = (sl > 0) & (token_mask.to(dev) & (j[None] < sl[:, None].long())).any(-1)
    return zero_rows(o, rec, ~live)
