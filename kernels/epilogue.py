"""Decode epilogue (SPEC §3, §4, §7, §8): K-bin p̂-mass histograms → TV⁺ and the output bound.

Vectorised over rows (batch × heads) in torch float64, on the decode's device. The decode
kernel bins tokens on the key side (by ‖W_j‖ and by the scale s_j), so each row's bin k has
the level σ‖q_h‖·edge_k (Tier A) or c_h·edge_k (Tier B); the overflow bin's level is the row's
exact maximum. Each histogram is a distribution over levels, so the §3 bounds apply to it
exactly as to per-token radii rounded up onto levels:

* tanh: ``tanh(ε_max / 2)`` (ε_max = σ‖q‖·max_j ‖W_j‖, not rounded onto a level);
* e-form: ``½ (A² − 1)``, ``A = Σ_k w_k e^{L_k}``;
* dual-grid tilt: ``max_i min_λ max(g_λ(t_i), g_λ(t_{i+1}))``, g_λ(t) = t − D(t, λ) (convex in t:
  its maximum on an interval is at an end; Lean ``tilt_tv_le_dual_grid_endpoints``), on a uniform grid
  of ``COARSE`` intervals, then the intervals with the largest upper value are split into ``REFINE``
  sub-intervals one by one, at most ``REFINE_TOP`` (0 by default since run Y11: the coarse grid alone, half the
  record's time for a 0.6 % higher median TV⁺ on SmolLM2; ``epilogue_jit.REFINE_TOP``), each valued at the
  smaller of its coarse value and its
  sub-intervals' maximum, until no unrefined interval is above the refined maximum (refining on could not
  change the tilt). Every interval keeps its own (sound) upper value, so the maximum over the
  refined and unrefined intervals is sound for any grid (SPEC §3(c)); λ ranges over the knapsack's
  breakpoints at the interval's left end, and the float error of each D is bounded and subtracted.

Floating point of the decode pass (SPEC §7; ``kernels.decode``): the histogram is of the
distribution p̃ the kernel computed, whose log-ratio to the exact served p̂ is at most Ξ per row
(``xi``), and masses totalling at most Λ (``lam``, relative to the denominator) may be missing.
Every level and the maximum radius are raised by Ξ (p is a tilt of p̃ by δ + ξ, |δ + ξ| ≤ ε + Ξ),
and

    TV⁺ = min(min(tanh((ε_max + Ξ)/2), e-form, tilt) + tanh(Ξ/2)[, excess]) + ρ + FP64_SLACK,
    ρ = Λ (1 + e^{ε_max + Ξ} / m),   m = Σ_k w_k e^{−(L_k + Ξ)},

the excess form (tier A, where the decode summed the centred sketch box's two excess terms: ``merge``'s ``ex``,
``excess_form_torch``, Lean ``tilt_tv_le_excess_rescaled``; with the grid block the smaller of it and
``excess_grid.grid_form_torch``, Lean ``tilt_tv_le_grid_rescaled_capped``; Ξ is in both, so it takes ρ and not
tanh(Ξ/2)), tanh(Ξ/2) covering
TV(p̃, p̂) (log-ratio oscillation ≤ 2Ξ) and ρ the missing masses
(TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U) for the lost part U, p(U) ≤ Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}).
This replaces the former absolute 2^-9: when Ξ is small (moderate logit magnitudes) the floor
is tanh(Ξ/2) ≈ Ξ/2, and where fp32 cannot resolve the logits (σ‖q‖‖k̂‖ ≳ 10^5) Ξ is large
and the bound saturates honestly. Capped at 1; any non-finite input or counted non-finite
radius saturates it to 1, and the output bound to +inf, with ``flag`` set.

This module holds the launches and what they return: ``merge`` (the decode's split-KV merge + meter
record, one launch), ``tv_from_hist``, ``meter_epilogue``, ``merge_torch`` (the torch twin ``merge`` is
pinned to), ``MeterRecord``, ``MergeConstants``, ``tier_b_coefficients``. The Triton code is in
``kernels.epilogue_jit`` (``_merge_meter_kernel``, ``_tv_row``, ``_dense_u``; the tilt's grid
``COARSE`` / ``REFINE_TOP`` / ``REFINE``), the torch twin of TV⁺ in ``kernels.epilogue_torch``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton

from contract.constants import DITHER_BIAS_FACTOR

from .epilogue_jit import (
    COARSE,
    FP64_SLACK,
    REC_COLS,
    REC_EA,
    REC_EB,
    REC_EFORM,
    REC_EPS,
    REC_EXCESS,
    REC_RHO,
    REC_TANH,
    REC_TB,
    REC_TILT,
    REC_TVA,
    REC_TVB,
    REC_XI,
    REFINE,
    TILT_CHUNK,
    _merge_meter_kernel,
    _tv_kernel,
    refine_top,
)
from .epilogue_torch import tv_from_hist_torch
from .excess_grid import EXCESS_COLS, expm1_up_torch, grid_form_torch
from .fp_bounds import FP32_FLUSH, KERNEL_EXP_REL, KERNEL_REL_SLACK
from .key_levels import key_edges
from .pdl import gdc, pdl_call
from .plan import merge_parts_setting, merge_warps


@functools.lru_cache(maxsize=64)  # (a gate's few τ values; merge() calls it once per layer and step)
def tau_bracket(tau: float) -> tuple[float, float]:
    """(τ↓, τ↑): the float32 values just ≤ and ≥ ``tau``, the kernels' scalar arguments (a Python float
    reaches a Triton kernel as float32). They certify against τ↓ (TV⁺ ≤ τ↓ ≤ τ) and stop refining as not
    certified against τ↑ (TV⁺ > τ↑ ≥ τ), so rounding τ to float32 moves no gate decision: a row whose
    TV⁺ lies between the two only refines further."""
    t = torch.tensor(float(tau), dtype=torch.float64)
    f = t.float()
    lo = torch.where(f.double() > t, torch.nextafter(f, torch.tensor(-math.inf)), f)
    hi = torch.where(f.double() < t, torch.nextafter(f, torch.tensor(math.inf)), f)
    return float(lo), float(hi)


def scratch_per_tier(nbp: int) -> int:
    """float64 scratch per row and tier of ``_tv_row``: the masses, e^L, e^-L ([nbp] each) and U ([COARSE]);
    the kernels index it as 3·NBP + N1 (N1 = COARSE)."""
    return 3 * nbp + COARSE


@dataclasses.dataclass
class MeterRecord:
    """Per (sequence, query head): ``[B, Hq]`` tensors (float64) plus the histograms."""

    tv_upper_a: torch.Tensor
    tv_upper_b: torch.Tensor | None
    out_err_upper: torch.Tensor
    out_err_upper_b: torch.Tensor | None
    eps_max: torch.Tensor
    tb_max: torch.Tensor | None
    hist: torch.Tensor  # [B, Hq, K+1] p̂ mass per level (Tier A)
    hist_b: torch.Tensor | None
    tanh: torch.Tensor
    eform: torch.Tensor
    tilt: torch.Tensor
    flag: torch.Tensor  # bool: saturated because of non-finite inputs
    xi: torch.Tensor | None = None  # [B, Hq] Ξ: the decode pass's log-ratio bound (SPEC §7)
    rho: torch.Tensor | None = None  # [B, Hq] ρ: the lost-mass term (Tier A)
    #: [B, Hq] the centred sketch box's excess form (``merge_terms._excess_form``, and with the grid the smaller of it
    #: and ``excess_grid._grid_form``: Ξ in it, TV⁺ ≤ it + ρ + slack): a further closed form of tier A's TV⁺ where the
    #: decode accumulated its sums (``decode.excess_form``); else None
    excess: torch.Tensor | None = None




#: None: the [TP, K, K] form of the dense D off the GPU (numpy-fast in the interpreter), the loop
#: over bins on the GPU (registers); tests set it to run both forms in the interpreter
DENSE3D_OVERRIDE: bool | None = None


def _dense3d(dev) -> bool:
    return (torch.device(dev).type != "cuda") if DENSE3D_OVERRIDE is None else DENSE3D_OVERRIDE


#: the MeterRecord fields of the fused merge's record columns that every record has (tier A's; the Tier B ones
#: only with Tier B): the one place a field is tied to its column (``merge``, ``witcert.graphs``)
RECORD_COLUMNS = {"tv_upper_a": REC_TVA, "out_err_upper": REC_EA, "eps_max": REC_EPS, "tanh": REC_TANH,
                  "eform": REC_EFORM, "tilt": REC_TILT, "xi": REC_XI, "rho": REC_RHO}


#: a bench's forced chunk (bench/tilt_cost.py); None: TILT_CHUNK
TILT_CHUNK_OVERRIDE: int | None = None


def tilt_chunk() -> int:
    """Grid points of the tilt per [TC, bins] step (``_tv_row``'s TC): a power of two dividing COARSE and
    REFINE (the refinement walks one interval at a time). The bound does not depend on it."""
    tc = min(triton.next_power_of_2(TILT_CHUNK_OVERRIDE or TILT_CHUNK), COARSE, REFINE)
    if COARSE % tc or REFINE % tc:
        raise ValueError(f"tilt chunk {tc}: must divide COARSE {COARSE} and REFINE {REFINE}")
    return tc


def _epsc(nbp: int) -> float:
    """Relative rounding-error coefficient of one float64 D(t, λ) evaluation over nbp bins."""
    return (4.0 * nbp + 16.0) * 2.0**-52


def tv_from_hist(mass: torch.Tensor, lv: torch.Tensor, rmax: torch.Tensor, xi=None, lam=None, force_kernel: bool = False,
                 tilt_above: float = -1.0):
    """(TV⁺, tanh, e-form, tilt, ρ) for histograms ``mass`` [..., NB] whose bin k holds radii
    ≤ ``lv[..., k]`` (the last bin is the overflow bin, level ``rmax``), ``rmax`` [...] the
    row's exact maximum radius, ``xi`` / ``lam`` the decode's Ξ and Λ (None: 0).

    On CUDA (or ``force_kernel``) one Triton launch, a program per row (``_tv_row``, the code
    the decode's fused merge runs); CPU tensors use ``tv_from_hist_torch`` (a test pins the two).
    ``tilt_above`` ≥ 0: rows whose min(tanh, e-form) (no excess form here) is ≤ it skip the tilt (reported as 1); the others
    refine only until τ is settled either way (``_tv_row``: that grid's tilt is reported)."""
    if mass.device.type != "cuda" and not force_kernel:
        return tv_from_hist_torch(mass, lv, rmax, xi, lam)
    shp = mass.shape[:-1]
    nb = mass.shape[-1]
    w = mass.reshape(-1, nb).contiguous()
    Rn = w.shape[0]
    dev = w.device
    lvr = lv.double().reshape(Rn, -1)
    if lvr.shape[-1] == nb - 1:
        lvr = torch.cat([lvr, rmax.double().reshape(-1, 1)], dim=-1)
    lvr = lvr.contiguous()
    r = rmax.double().reshape(-1).contiguous()
    x = (torch.zeros_like(r) if xi is None else xi.double().reshape(-1).expand_as(r)).contiguous()
    la = (torch.zeros_like(r) if lam is None else lam.double().reshape(-1).expand_as(r)).contiguous()
    if Rn == 0:
        return tuple(torch.empty(shp, dtype=torch.float64, device=dev) for _ in range(5))
    NBP = triton.next_power_of_2(nb)
    out = torch.empty(Rn, 5, dtype=torch.float64, device=dev)
    scr = torch.empty(Rn, scratch_per_tier(NBP), dtype=torch.float64, device=dev)
    _tv_kernel[(Rn,)](w, lvr, r, x, la, out, scr, w.stride(0), lvr.stride(0), *tau_bracket(tilt_above),
                      NB=nb, NBP=NBP, N1=COARSE, RT=refine_top(), NR=REFINE, EPSC=_epsc(NBP),
                      DENSE3D=_dense3d(dev), TC=tilt_chunk())
    return tuple(t.reshape(shp) for t in out.unbind(-1))


def excess_form_torch(a: torch.Tensor, b: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``merge_terms._excess_form`` (float64): the centred box's closed form e^{2Ξ} max(Â, B̂) from the
    merged excess sums Â, B̂ (each divided by L, grown by 1 + Ξ + 2^-21) and Ξ, a bound of TV(p, p̂) itself (ρ is added
    to it, not tanh(Ξ/2)); 1 where a sum or Ξ is NaN, infinite or negative."""
    a, b, xi = a.double(), b.double(), xi.double()
    grow = 1.0 + xi + 2.0**-21
    a = a * grow
    b = b * grow
    y = (2.0 * xi).clamp(max=700.0)
    e2 = 1.0 + expm1_up_torch(y)
    f = e2 * torch.maximum(a, b) * (1.0 + 2.0**-40)
    ok = ~torch.isnan(f) & (a >= 0) & (b >= 0) & (xi >= 0) & (f < float("inf"))
    return torch.where(ok, f.clamp(max=1.0), torch.ones_like(f))


def meter_epilogue(mass, massb, lv_a, lv_b, eps_max, tb_max, pphi, phi_max, nu_max, bad, single=None,
                   xi=None, lam=None, out_rel: float | torch.Tensor = 0.0,
                   out_add: float | torch.Tensor = 0.0, excess: torch.Tensor | None = None) -> MeterRecord:
    """Histogram masses [B, Hq, K+2] with per-row bin levels [B, Hq, K+1] (the overflow bin's
    level is ``eps_max`` / ``tb_max``). ``single`` [B, Hq]: rows over exactly one token (TV = 0).
    ``xi``, ``lam`` [B, Hq]: the decode's Ξ and Λ (module doc). ``out_rel``: relative error of
    the kernel's own output accumulation (bf16 p̂·s_v on the GPU, fp32 sums): the output bound
    covers ‖ô_kernel − o‖, not only the exact-arithmetic ô of SPEC §4:

        E⁺ = TV⁺ (2ν_max + φ_max) + Σ p̃ φ + (tanh(Ξ/2) + Λ) φ_max + ν_max (e^{2Ξ + out_rel} − 1) + out_add

    (``out_add``: the rounding of an output served in a narrower float, ``MergeConstants.store``.)
    ``excess`` [B, Hq] (``excess_form_torch``): a further form of tier A, TV⁺ ≤ excess + ρ + slack (Ξ is in it; the
    fused merge's; not where ``tv_from_hist`` saturates a negative radius, Ξ or Λ).
    """
    bad_rows = (bad > 0) | ~torch.isfinite(mass).all(-1) | ~torch.isfinite(eps_max) | ~torch.isfinite(pphi)
    if xi is not None:
        bad_rows = bad_rows | ~torch.isfinite(xi)
        xi = torch.nan_to_num(xi.double(), posinf=1e30)
    lam = None if lam is None else torch.nan_to_num(lam.double(), nan=1.0, posinf=1.0)
    tv_a, tanh, eform, tilt, rho = tv_from_hist(torch.nan_to_num(mass), torch.nan_to_num(lv_a, posinf=1e30),
                                                torch.nan_to_num(eps_max, posinf=1e30), xi, lam)
    if excess is not None:
        x0 = torch.zeros_like(tv_a) if xi is None else xi
        la0 = torch.zeros_like(tv_a) if lam is None else lam
        fx = (excess.double() + rho + FP64_SLACK).clamp(max=1.0)
        use = (eps_max >= 0) & (x0 >= 0) & (la0 >= 0) & ~torch.isnan(fx)
        tv_a = torch.where(use, torch.minimum(tv_a, fx), tv_a)
    if single is not None:
        tv_a = torch.where(single, torch.zeros_like(tv_a), tv_a)
    tv_a = torch.where(bad_rows, torch.ones_like(tv_a), tv_a)
    x = torch.zeros_like(tv_a) if xi is None else xi
    la = torch.zeros_like(tv_a) if lam is None else lam

    def out_bound(tv):
        num = nu_max.double()
        fm = phi_max.double()
        own = num * torch.expm1((2.0 * x + out_rel).clamp(max=700.0))
        ob = (tv * (2.0 * num + fm) + pphi.double() + (torch.tanh(x / 2.0) + la) * fm + own + out_add) \
            * (1.0 + 2.0**-40) + FP64_SLACK
        return torch.where(bad_rows | ~torch.isfinite(ob), torch.full_like(ob, float("inf")), ob)

    tv_b = out_b = None
    if massb is not None:
        tv_b = tv_from_hist(torch.nan_to_num(massb), torch.nan_to_num(lv_b, posinf=1e30),
                            torch.nan_to_num(tb_max, posinf=1e30), xi, lam)[0]
        if single is not None:
            tv_b = torch.where(single, torch.zeros_like(tv_b), tv_b)
        tv_b = torch.where(bad_rows, torch.ones_like(tv_b), tv_b)
        out_b = out_bound(tv_b)
    return MeterRecord(
        tv_upper_a=tv_a, tv_upper_b=tv_b, out_err_upper=out_bound(tv_a), out_err_upper_b=out_b,
        eps_max=eps_max.double(), tb_max=None if tb_max is None else tb_max.double(),
        hist=mass, hist_b=massb, tanh=tanh, eform=eform, tilt=tilt, flag=bad_rows, xi=xi, rho=rho, excess=excess,
    )


@dataclasses.dataclass(frozen=True)
class MergeConstants:
    """What the merge needs from the decode launch (SPEC §7 terms of ``kernels.fp_bounds``)."""

    D: int
    T: int  # tokens per page
    PAGES: int  # pages per tile
    NB: int  # histogram columns (tier A bins, tier B bins, the Σ p̂ φ column)
    KA: int  # bins per tier
    sm: float  # σ
    tier_b: bool
    delta_step: float | None
    gamma: float  # ``fp_bounds.dot_gamma``
    dither_u: float  # |σ| 2^-19 for the bf16 hi + lo dither split, else 0
    eta: tuple  # ``fp_bounds.mass_eta_terms``
    out_rel0: float  # 2^-8 on the GPU (bf16 p̂·s_v), 0 in the interpreter
    #: the sketch radius's channel weights [Hkv, D] (``contract.sketch``): the Tier A head factor is then
    #: |σ|·‖a⊙q_h‖ (kv head h // gq); None: |σ|·‖q_h‖
    weights: torch.Tensor | None = None
    gq: int = 1
    #: tiles of the exact window's ring pass (split 0): counted into every split's mass error η
    ring_tiles: int = 0
    #: the merge's ``sl`` is SGLang's kv_indptr [B + 1] (the lengths its differences), not the lengths [B]
    csr_lens: bool = False
    #: the output served in a narrower float than fp32 (``fp_bounds.store_terms``: rel, abs·√D, max): its rounding joins
    #: E⁺ and an |o_i| above max is non-finite; (0, 0, 0): served as computed
    store: tuple = (0.0, 0.0, 0.0)


_EDGES: dict = {}


def _sms(dev) -> int:
    dev = torch.device(dev)
    return _cuda_sms(dev.index if dev.index is not None else torch.cuda.current_device()) if dev.type == "cuda" else 0


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count

#: tier A alone (KP == NB): tier A's bins taken from the merged histogram instead of merged a second time
#: from the partials (the same float64 sums: bit for bit in the interpreter; on the GPU the second load may
#: reduce in another order, last-bit differences, run M; tests flip it)
HA_FROM_MERGED = True


def _edges(dev, ka: int) -> torch.Tensor:
    """The decode's key-side level grid (``key_levels.key_edges``) on ``dev``, cached per device (no
    per-call kernels)."""
    key = (str(dev), ka)
    if key not in _EDGES:
        e = key_edges(dev)
        assert e.numel() == ka - 1
        _EDGES[key] = e.contiguous()
    return _EDGES[key]


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' byte ranges (from their first to their last element) share memory."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        lo = t.data_ptr()
        return lo, lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) * t.element_size() + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: the dimensions of more than one element, by increasing stride,
    must each step past everything the smaller ones span (the sufficient condition: a layout it refuses may still be
    free of overlap, never the converse)."""
    span = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda x: x[1]):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


#: the dtypes a decode's output is served in: the merge writes them (``check_outputs``) and ``decode(store_dtype=)``
#: meters a caller's cast into them (``contract.constants.STORE_ROUNDING``)
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class OutputBufferError(ValueError):
    """``decode(out=, lse_out=)`` was given buffers the merge cannot write (``check_outputs``): raised before any launch,
    so a caller may decode without them instead (the SGLang adapter then copies). ``kind``: "input" (a buffer shares
    memory with what this or a later call reads: no write into it is sound), "query" (with the query alone: a copy
    after the decode is, if the query is kept), "layout" (dtype, shape, device, strides)."""

    def __init__(self, msg: str, kind: str = "layout"):
        super().__init__(msg)
        self.kind = kind


def check_outputs(out: torch.Tensor | None, lse_out: torch.Tensor | None, B: int, Hq: int, D: int, device,
                  reads: tuple = (), query: tuple = ()) -> None:
    """A decode's own output buffers (``decode(out=, lse_out=)``, SGLang's ``o`` and ``attn_lse``): ``out`` [B, Hq, D] in
    one of ``OUT_DTYPES``, ``lse_out`` [B, Hq, W ≥ 1] float32, each on ``device`` with its last dimension contiguous (any
    other strides, no two elements in one place), neither sharing memory with the other, with a tensor of ``reads``
    (what the decode reads besides the query: a merge program reads its row's lengths and weights after other programs
    wrote their rows, and an output over the cache, its block table or overlays would corrupt what the next call reads)
    nor with one of ``query`` (read by a merge program after others wrote). The sharing is checked first, so its
    ``OutputBufferError.kind`` ("input", then "query") is never hidden by a layout error. Host checks only (no sync)."""
    for name, t in (("out", out), ("lse_out", lse_out)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise OutputBufferError(f"{name}: expected a tensor, got {type(t).__name__}")
    outs = [(name, t, t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
            for name, t in (("out", out), ("lse_out", lse_out)) if t is not None and t.numel()]
    for kind, group in (("input", reads), ("query", query)):
        for r in group:  # (an input whose storage lies apart from both outputs' is passed at the cost of two reads)
            if r is None or not r.numel():
                continue
            st = r.untyped_storage()
            s0 = st.data_ptr()
            s1 = s0 + st.nbytes()
            for name, t, o0, o1 in outs:
                if s0 < o1 and o0 < s1 and shares_memory(t, r):
                    what = ("the lengths, the cache, the block table, the overlays, the weights or a deferred tilt's "
                            "records: the merge reads some after it writes, the next call reads the cache"
                            if kind == "input" else "the query, which the merge reads after it writes")
                    raise OutputBufferError(f"{name}: shares memory with an input of the decode ({what})", kind)
    if out is not None:
        if out.dtype not in OUT_DTYPES:
            raise OutputBufferError(f"out: expected a float32 / bfloat16 / float16 tensor, got {out.dtype!r}")
        if tuple(out.shape) != (B, Hq, D) or out.stride(-1) != 1 or out.device != torch.device(device):
            raise OutputBufferError(f"out: expected [{B}, {Hq}, {D}] on {device} with its last dimension contiguous, "
                                    f"got {tuple(out.shape)} on {out.device}, strides {out.stride()}")
    if lse_out is not None:
        if lse_out.dtype != torch.float32:
            raise OutputBufferError(f"lse_out: expected a float32 tensor, got {lse_out.dtype!r}")
        if (lse_out.dim() != 3 or tuple(lse_out.shape[:2]) != (B, Hq) or lse_out.shape[2] < 1 or lse_out.stride(-1) != 1
                or lse_out.device != torch.device(device)):
            raise OutputBufferError(f"lse_out: expected [{B}, {Hq}, W ≥ 1] on {device} with its last dimension "
                                    f"contiguous, got {tuple(lse_out.shape)} on {lse_out.device}, strides {lse_out.stride()}")
    for name, t, _, _ in outs:
        if overlaps_itself(t):
            raise OutputBufferError(f"{name}: two of its elements share memory (strides {t.stride()})")
    if out is not None and lse_out is not None and shares_memory(out, lse_out):
        raise OutputBufferError("out / lse_out: share memory")


def merge(m_out, l_out, acc_out, hist, stat, q, sl, c: MergeConstants, epilogue: bool = True,
          tilt_above: float = -1.0, num_warps: int | None = None, tilt_batch=None, tilt_layer: int | None = None,
          out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None, ex: torch.Tensor | None = None):
    """The decode's split-KV merge and, with ``hist`` / ``stat`` and ``epilogue``, the meter
    record, in one launch (``_merge_meter_kernel``). Partials [B, Hq, S, ...] (contiguous);
    q [B, Hq, D] the query the kernel used; sl [B] int32 (``c.csr_lens``: kv_indptr [B + 1] int32). Returns (o [B, Hq, D]
    fp32, lse, rec).
    ``num_warps`` None: ``merge_warps`` (bench/merge_probe.py). ``tilt_batch`` (``kernels.tilt_batch.TiltBatch``):
    the record goes to its layer ``tilt_layer`` without the tilt (``tilt_above`` is then the finish's), and without the
    closed forms where the batch defers them too (``TiltBatch.forms``: TV⁺ 1 until the finish).
    ``out`` / ``lse_out`` (``check_outputs``): the caller's buffers, written by the launch itself (o in ``out``'s
    dtype; the log-sum-exp in ``lse_out[..., 0]``, −inf in its other columns); the returned o / lse are then
    ``out`` and ``lse_out[..., 0]``. ``ex`` [B, Hq, S, 2] fp32: the partials' excess sums (the record's ``excess``);
    [B, Hq, S, EXCESS_COLS]: with the grid block after them (``excess_grid``: the record's ``excess`` is the smaller
    form)."""
    Bsz, Hq, S = m_out.shape
    dev = m_out.device
    rows = Bsz * Hq
    meter = hist is not None
    o = torch.empty(Bsz, Hq, c.D, device=dev, dtype=torch.float32) if out is None else out
    lse3 = torch.empty(Bsz, Hq, 1, device=dev, dtype=torch.float32) if lse_out is None else lse_out
    lse = lse3[..., 0]
    KP = triton.next_power_of_2(c.KA)
    f64 = dict(device=dev, dtype=torch.float64)
    defer = tilt_batch is not None
    exc = ex is not None and meter and epilogue
    grd = exc and ex.shape[-1] == EXCESS_COLS
    if exc and not grd and ex.shape[-1] != 2:
        raise ValueError(f"ex: the excess sums' last axis is 2 or {EXCESS_COLS} (with the grid), got {tuple(ex.shape)}")
    if defer:
        if not (meter and epilogue) or c.tier_b:
            raise ValueError("tilt_batch: defers the meter record's tier-A tilt (meter and epilogue on, no Tier B)")
        # the merge in parts (``kernels.plan.MERGE_PARTS``, read now; with the closed forms deferred), refused before
        # the slot is claimed: a refused call leaves the layer writable
        parts, parts_warps = merge_parts_setting()
        rec, hout, flag, exs = tilt_batch.slot(tilt_layer, rows, c.NB, c.KA, (ex.shape[-1] if exc else 0))
        hout = hout.view(Bsz, Hq, c.NB)
        forms = exs is not None
        prt, cnt = tilt_batch.handover(tilt_layer)
        if not forms:
            parts, parts_warps = 1, None
        tilt_above = math.inf  # the merge skips the tilt (TV⁺ the closed forms', or 1 with forms); finish() runs it
    else:
        hout = torch.empty(Bsz, Hq, c.NB, **f64) if meter else lse
        rec = torch.empty(rows, REC_COLS.value, **f64) if meter and epilogue else lse
        flag = torch.empty(rows, device=dev, dtype=torch.int8) if meter and epilogue else lse
        exs, forms = None, False
        prt = cnt = None
        parts, parts_warps = 1, None
    scr = torch.empty(rows, 2 * scratch_per_tier(KP), **f64) if meter and epilogue else lse
    edges = _edges(dev, c.KA) if meter and epilogue else lse
    warps = num_warps or (parts > 1 and parts_warps) or merge_warps(
        triton.next_power_of_2(S), c.D, meter and epilogue, rows, _sms(dev), tilts=tilt_above != math.inf)
    pdl_call(dev, "merge", lambda kw: _merge_meter_kernel[(rows, parts)](
        m_out, l_out, acc_out, hist if meter else m_out, stat if meter else m_out, q, sl, edges, o, lse, rec, hout, scr,
        flag, c.weights if c.weights is not None else lse, ex if exc else lse, exs if forms else lse,
        prt if parts > 1 else lse, cnt if parts > 1 else lse, Hq, S, c.sm,
        abs(c.sm) * (1.0 + KERNEL_REL_SLACK), math.log(c.delta_step) if c.tier_b else 0.0, *tau_bracket(tilt_above),
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), lse3.stride(0), lse3.stride(1),
        D=c.D, SP=triton.next_power_of_2(S), T=c.T, PAGES=c.PAGES, NB=c.NB, KA=c.KA, KP=KP,
        METER=meter, EPI=meter and epilogue, TIER_B=c.tier_b,
        GAMMA=c.gamma, EXP_REL=KERNEL_EXP_REL, DITHER_U=c.dither_u, ETA0=c.eta[0], ETA1=c.eta[1],
        FLUSH=FP32_FLUSH, OUT_REL0=c.out_rel0, BIAS=DITHER_BIAS_FACTOR,
        N1=COARSE, RT=refine_top(), NR=REFINE, EPSC=_epsc(KP), DENSE3D=_dense3d(dev),
        TC=tilt_chunk(), HA_HM=HA_FROM_MERGED and KP == c.NB and not c.tier_b,
        WEIGHTED=c.weights is not None, GQ=c.gq,
        RING_TILES=c.ring_tiles, DEFER=defer, LSE_W=lse3.shape[-1], LSE_WP=triton.next_power_of_2(lse3.shape[-1]),
        SL_CSR=c.csr_lens, STORE_REL=c.store[0], STORE_ABS=c.store[1], STORE_MAX=c.store[2], EXC=exc, GRD=grd,
        GDC=gdc(dev), DEFER_FORMS=forms, PARTS=parts, num_warps=warps, **kw,
    ))
    record = None
    if meter and epilogue:
        cols = rec.t().view(REC_COLS.value, Bsz, Hq).unbind(0)  # every column's [B, Hq] view in one call (an
        # eager call's host time: the SGLang adapter's call with stubbed kernels 321 → 296 µs on the CPU)
        record = MeterRecord(
            **{f: cols[k.value] for f, k in RECORD_COLUMNS.items()},
            tv_upper_b=cols[REC_TVB.value] if c.tier_b else None,
            out_err_upper_b=cols[REC_EB.value] if c.tier_b else None, tb_max=cols[REC_TB.value] if c.tier_b else None,
            hist=hout[..., : c.KA], hist_b=hout[..., c.KA : 2 * c.KA] if c.tier_b else None,
            flag=flag.view(torch.bool).view(Bsz, Hq), excess=cols[REC_EXCESS.value] if exc else None,
        )
    return o, lse, record


def tier_b_coefficients(q: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, delta_step: float) -> torch.Tensor:
    """c[b, h] with Tier B radius t_j = c · s_j (SPEC §5 with per-token scale s_j):
    ``|σ| (‖q‖ sqrt(2 ln(2n/δ) / 12) + ‖q‖₁ · DITHER_BIAS_FACTOR)``, n = seq_lens[b]. float64.
    The torch form of the fused merge's ``cb`` (the bridge checks both)."""
    qd = q.double()
    n = seq_lens.double().to(q.device)[:, None]
    log_term = torch.sqrt(2.0 * torch.log(2.0 * n / delta_step) / 12.0)
    c = abs(sm_scale) * (qd.norm(dim=-1) * log_term + qd.abs().sum(-1) * DITHER_BIAS_FACTOR)
    return c * (1.0 + KERNEL_REL_SLACK)


def merge_torch(m_out, l_out, acc_out, hist, stat, q, sl, c: MergeConstants, ex: torch.Tensor | None = None):
    """Torch reference of ``merge`` (the former host-side path: float64 weights, the same Ξ, Λ
    and ``meter_epilogue``; ``ex``: the excess sums, as ``merge``'s); tests pin the kernel to it."""
    if c.csr_lens:
        sl = sl[1:] - sl[:-1]
    Bsz, Hq, S = m_out.shape
    dev = m_out.device
    M = m_out.max(dim=-1, keepdim=True).values
    w64 = torch.where(torch.isfinite(m_out), torch.exp((m_out - M).double()), torch.zeros_like(m_out, dtype=torch.float64))
    w = w64.float()
    L = (w * l_out).sum(-1)
    o = (w[..., None] * acc_out).sum(-2) / L[..., None]
    lse = M[..., 0] + torch.log(L)
    dead = sl.to(dev) <= 0  # a row without any token: output 0, TV⁺ and bound 0, no flag (the kernel's)
    if hist is None:
        return zero_rows(o, None, dead), lse, None
    sm = c.sm
    L64 = (w64 * l_out.double()).sum(-1)
    h = (w64[..., None] * hist.double()).sum(-2) / L64[..., None]
    mx = stat.amax(dim=-2)
    bad = stat[..., 4].sum(-1) + (~torch.isfinite(L)).double() + (~torch.isfinite(o).all(-1)).double()
    rel, ab, smax = c.store
    out_add = 0.0
    if rel > 0:  # served in a narrower float: the store's rounding (the fused merge's STORE_*)
        out_add = rel * o.double().norm(dim=-1) + ab
        bad = bad + (o.abs() > smax).any(-1).double()
    qd = q.double()
    qnorm = qd.norm(dim=-1) * (abs(sm) * (1.0 + KERNEL_REL_SLACK))
    qn_a = qnorm
    if c.weights is not None:  # the sketch radius's head factor |σ| ‖a⊙q_h‖ (contract.sketch)
        a = c.weights.double().to(dev).repeat_interleave(c.gq, dim=0)  # [Hq, D]
        qn_a = (qd * a).norm(dim=-1) * (abs(sm) * (1.0 + KERNEL_REL_SLACK))
    edges = _edges(dev, c.KA)
    lv_a = qn_a[..., None] * edges
    eps_max = qn_a * mx[..., 0].double()
    n_pages = (sl.double() + c.T - 1).div(c.T).floor()
    tiles = torch.ceil(torch.ceil((n_pages + c.ring_tiles * c.PAGES) / S) / c.PAGES)[:, None] + c.ring_tiles
    xi = qnorm * mx[..., 5].double() * c.gamma + KERNEL_EXP_REL + c.dither_u * qd.abs().sum(-1) * mx[..., 1].double()
    eta = c.eta[0] + tiles * c.eta[1]
    xi = (xi + 2.1 * eta) * (1.0 + 2.0**-20)
    lam = ((sl.double()[:, None] + c.NB * tiles * S + 16.0) * FP32_FLUSH / L64.clamp_min(1.0)).expand_as(xi)
    tb_max = lv_b = None
    if c.tier_b:
        cb = tier_b_coefficients(q, sl, sm, c.delta_step)
        lv_b = cb[..., None] * edges
        tb_max = cb * mx[..., 1].double()
    KA, NB = c.KA, c.NB
    excess = None
    if ex is not None:
        if ex.shape[-1] not in (2, EXCESS_COLS):
            raise ValueError(f"ex: the excess sums' last axis is 2 or {EXCESS_COLS} (with the grid), got {tuple(ex.shape)}")
        exw = (w64[..., None] * ex.double()).sum(-2) / L64[..., None]
        excess = excess_form_torch(exw[..., 0], exw[..., 1], xi)
        if ex.shape[-1] == EXCESS_COLS:  # the grid block: the smaller form
            excess = torch.minimum(excess, grid_form_torch(exw[..., 0], exw[..., 2:], xi))
    rec = meter_epilogue(
        h[..., :KA], h[..., KA : 2 * KA] if c.tier_b else None, lv_a, lv_b, eps_max, tb_max,
        pphi=h[..., NB - 1], phi_max=mx[..., 2], nu_max=mx[..., 3], bad=bad,
        single=(sl == 1)[:, None].expand(Bsz, Hq), xi=xi, lam=lam, out_rel=c.out_rel0 + eta, out_add=out_add,
        excess=excess,
    )
    return zero_rows(o, rec, dead), lse, rec


def zero_rows(o: torch.Tensor, rec: MeterRecord | None, dead: torch.Tensor) -> torch.Tensor:
    """Rows ``dead`` [B] without any attended token get what the reference gives them (witcert.meter.softmax: p̂ = 0):
    output 0, TV⁺ and output bound 0 (both tiers), no flag; ``rec`` in place, the new ``o`` returned (no host sync).
    The torch twin's form of the fused merge's, and ``decode._zero_dead_rows``'s for a fully masked row."""
    B = dead.shape[0]
    o = o.masked_fill(dead.view(B, *([1] * (o.dim() - 1))), 0.0)
    for f in ("tv_upper_a", "tv_upper_b", "out_err_upper", "out_err_upper_b", "flag") if rec is not None else ():
        t = getattr(rec, f, None)
        if t is not None:
            t.masked_fill_(dead.view(B, *([1] * (t.dim() - 1))), False if t.dtype == torch.bool else 0.0)
    return o
