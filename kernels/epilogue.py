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
  of ``COARSE`` intervals, then the ``REFINE_TOP`` intervals with the largest upper value are split into
  ``REFINE`` sub-intervals. Every interval keeps its own (sound) upper value, so the maximum over the
  refined and unrefined intervals is sound for any grid (SPEC §3(c)); λ ranges over the knapsack's
  breakpoints at the interval's left end, and the float error of each D is bounded and subtracted.

Floating point of the decode pass (SPEC §7; ``kernels.decode``): the histogram is of the
distribution p̃ the kernel computed, whose log-ratio to the exact served p̂ is at most Ξ per row
(``xi``), and masses totalling at most Λ (``lam``, relative to the denominator) may be missing.
Every level and the maximum radius are raised by Ξ (p is a tilt of p̃ by δ + ξ, |δ + ξ| ≤ ε + Ξ),
and

    TV⁺ = min(tanh((ε_max + Ξ)/2), e-form, tilt) + tanh(Ξ/2) + ρ + FP64_SLACK,
    ρ = Λ (1 + e^{ε_max + Ξ} / m),   m = Σ_k w_k e^{−(L_k + Ξ)},

tanh(Ξ/2) covering TV(p̃, p̂) (log-ratio oscillation ≤ 2Ξ) and ρ the missing masses
(TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U) for the lost part U, p(U) ≤ Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}).
This replaces the former absolute 2^-9: when Ξ is small (moderate logit magnitudes) the floor
is tanh(Ξ/2) ≈ Ξ/2, and where fp32 cannot resolve the logits (σ‖q‖‖k̂‖ ≳ 10^5) Ξ is large
and the bound saturates honestly. Capped at 1; any non-finite input or counted non-finite
radius saturates it to 1, and the output bound to +inf, with ``flag`` set.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl

from contract.constants import DITHER_BIAS_FACTOR

from .key_levels import key_edges
from .paged import FP32_FLUSH, KERNEL_EXP_REL, KERNEL_REL_SLACK

#: absolute slack for the epilogue's own float64 arithmetic (the decode pass's rounding is Ξ, ρ)
FP64_SLACK = 2.0**-40
COARSE = 64
REFINE_TOP = 8
REFINE = 32
_EPS = torch.finfo(torch.float64).eps
FP64_SLACK_C: tl.constexpr = tl.constexpr(FP64_SLACK)
#: points of the tilt's grid evaluated at a time on the GPU (divides COARSE and REFINE): its [TC, bins]
#: float64 tiles are what set the fused merge's registers (sm_90: 250 at 4 warps with the whole coarse grid
#: at once, two programs per SM; bench/RESULTS.md run M)
TILT_CHUNK = 16
TC: tl.constexpr = tl.constexpr(TILT_CHUNK)


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


def _dual_lower(ts: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, m: torch.Tensor):
    """Safe lower value of D(t, λ_tight) per (row, t), and the float value.

    ts [R, T]; w, a, b [R, K]; m [R]. Mirrors ``witcert.bounds._dual_values``.
    """
    beta = (1.0 - ts)[..., None] * a[:, None, :] + ts[..., None] * b[:, None, :]  # [R, T, K]
    bs, order = torch.sort(beta, dim=-1, descending=True)
    ws = torch.gather(w[:, None, :].expand_as(beta), -1, order)
    cum = torch.cumsum(ws * bs, dim=-1)
    target = ts * m[:, None]
    Kn = beta.shape[-1]
    k = torch.clamp((cum < target[..., None]).sum(-1), max=Kn - 1)
    bstar = torch.gather(bs, -1, k[..., None])[..., 0]
    lam = 1.0 / bstar
    act = torch.clamp(lam[..., None] * bs - 1.0, min=0.0)
    D = lam * target - (ws * act).sum(-1)
    mag = lam * target + (ws * (lam[..., None] * bs + 1.0) * (act > 0)).sum(-1) + 1.0
    err = (4.0 * Kn + 16.0) * _EPS * mag
    return D - err, D


def _interval_upper(t0: torch.Tensor, h: float, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, m: torch.Tensor):
    """The torch form of the kernel's ``_dense_u`` (the same candidates, the same error bound): for intervals
    [t0, t0 + h] (t0 [R, T]), min over λ ∈ {1/β_c(t0) : w_c > 0} of max(g(t0), g(t0 + h)), g(t) = t − D(t, λ) +
    its rounding bound (Lean ``tilt_tv_le_dual_grid_endpoints``), capped at t0 + h."""
    t1 = t0 + h
    beta0 = (1.0 - t0)[..., None] * a[:, None, :] + t0[..., None] * b[:, None, :]  # [R, T, K]
    beta1 = (1.0 - t1)[..., None] * a[:, None, :] + t1[..., None] * b[:, None, :]
    live = (w > 0)[:, None, :]
    lam = torch.where(live, 1.0 / beta0, torch.zeros_like(beta0))  # [R, T, K] candidates
    Kn = w.shape[-1]
    eps = (4.0 * Kn + 16.0) * _EPS

    def g(t, beta):
        x = lam[..., :, None] * beta[..., None, :]  # [R, T, K cand, K bins]
        act = torch.clamp(x - 1.0, min=0.0)
        wb = w[:, None, None, :]
        d = (wb * act).sum(-1)
        mag = (torch.where(act > 0, wb * (x + 1.0), torch.zeros_like(x))).sum(-1)
        tm = (t * m[:, None])[..., None]
        return t[..., None] - (lam * tm - d) + eps * (lam * tm + mag + 1.0)

    u = torch.where(live, torch.maximum(g(t0, beta0), g(t1, beta1)), torch.full_like(beta0, float("inf"))).amin(-1)
    return torch.minimum(u, t1)


def tilt_from_hist(w: torch.Tensor, lv: torch.Tensor) -> torch.Tensor:
    """Dual-grid tilt bound for rows of (mass w [R, K], level lv [R, K]); sound for any grid. The kernel's
    grid and choices: COARSE intervals with endpoint upper values (``_interval_upper``), the REFINE_TOP largest
    split into REFINE."""
    R = w.shape[0]
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    w = torch.where(w > 0, w, torch.zeros_like(w))
    lvm = torch.where(w > 0, lv, torch.zeros_like(lv))
    a, b = torch.exp(lvm), torch.exp(-lvm)
    m = (w * b).sum(-1)
    dev = w.device
    ts = torch.linspace(0.0, 1.0, COARSE + 1, dtype=torch.float64, device=dev)[:-1].expand(R, -1)
    upper = _interval_upper(ts, 1.0 / COARSE, w, a, b, m)  # [R, COARSE]
    top = torch.topk(upper, min(REFINE_TOP, COARSE), dim=-1).indices  # intervals to refine
    lo = torch.gather(ts, 1, top)
    frac = torch.arange(REFINE, dtype=torch.float64, device=dev) * (1.0 / (COARSE * REFINE))
    sub = lo[..., None] + frac  # [R, TOP, REFINE]
    sub_upper = _interval_upper(sub.reshape(R, -1), 1.0 / (COARSE * REFINE), w, a, b, m).amax(-1)
    keep = torch.ones_like(upper, dtype=torch.bool)
    keep.scatter_(1, top, False)
    rest = torch.where(keep, upper, torch.full_like(upper, -1.0)).amax(-1)
    out = torch.maximum(sub_upper, rest).clamp(0.0, 1.0)
    # all radii 0 ⇒ TV = 0. (One non-empty bin is NOT one token: a bin holds many tokens of
    # equal level, whose fractional supremum is tanh(L/2) > 0 -- no shortcut for it.)
    out = torch.where(lvm.amax(-1) == 0, torch.zeros_like(out), out)
    return torch.where(lvm.amax(-1) > 700.0, torch.ones_like(out), out)


def tv_from_hist_torch(mass: torch.Tensor, lv: torch.Tensor, rmax: torch.Tensor, xi=None, lam=None):
    """Torch reference of ``tv_from_hist`` (same grid, tight λ by sorting).

    (TV⁺, tanh, e-form, tilt, ρ) for histograms ``mass`` [..., NB] whose bin k holds radii
    ≤ ``lv[..., k]`` (the last bin is the overflow bin, level ``rmax``), ``rmax`` [...] the
    row's exact maximum radius. Levels above ``rmax`` are lowered to it (every radius is ≤ it).
    ``xi`` [...]: the decode's log-ratio bound Ξ (levels and rmax are raised by it, and
    tanh(Ξ/2) is added); ``lam`` [...]: the lost mass Λ (ρ = Λ(1 + e^{rmax+Ξ}/m) is added)."""
    shp = mass.shape[:-1]
    nb = mass.shape[-1]
    w = mass.double().reshape(-1, nb).clamp_min(0.0)
    r = rmax.double().reshape(-1)
    x = torch.zeros_like(r) if xi is None else xi.double().reshape(-1).expand_as(r)
    la = torch.zeros_like(r) if lam is None else lam.double().reshape(-1).expand_as(r)
    lvr = lv.double().reshape(-1, lv.shape[-1])
    lvr = torch.cat([lvr[:, : nb - 1], r[:, None]], dim=-1) if lvr.shape[-1] == nb - 1 else lvr
    lvr = torch.minimum(lvr, r[:, None]).clamp_min(0.0) + x[:, None]
    r = r + x
    ws = w.sum(-1)
    okw = (ws >= 1e-300) & torch.isfinite(ws)  # masses that are a distribution (else e-form = tilt = 1)
    wn = torch.where(okw[:, None], w / torch.where(okw, ws, torch.ones_like(ws))[:, None], torch.zeros_like(w))
    tanh = torch.tanh(r / 2.0)
    live = wn > 0
    A = (wn * torch.exp(torch.where(live, lvr, torch.zeros_like(lvr)))).sum(-1)
    eform = (0.5 * (A * A - 1.0) * (1.0 + 8 * nb * _EPS)).clamp(max=1.0)
    eform = torch.where(torch.isfinite(eform) & okw, eform, torch.ones_like(eform))
    tilt = torch.where(okw, tilt_from_hist(torch.where(okw[:, None], w, torch.ones_like(w)), lvr), torch.ones_like(r))
    m = (wn * torch.exp(-torch.where(live, lvr, torch.zeros_like(lvr)))).sum(-1) * (1.0 - 2.0**-40)
    rho = torch.where(la > 0, la * (1.0 + torch.exp(r.clamp(max=700.0)) / m.clamp_min(1e-300)) * (1.0 + 2.0**-40),
                      torch.zeros_like(la))
    rho = torch.where(torch.isfinite(rho), rho, torch.ones_like(rho))
    tv = (torch.minimum(torch.minimum(tanh, eform), tilt) + torch.tanh(x / 2.0) + rho + FP64_SLACK).clamp(max=1.0)
    tv = torch.where(torch.isnan(tv), torch.ones_like(tv), tv)  # (a NaN radius, Ξ or Λ: saturated)
    return tuple(t.reshape(shp) for t in (tv, tanh, eform, tilt, rho))


@triton.jit
def _dense_u(ts, h, w, a, b, m, SCR, nl, NB: tl.constexpr, NBP: tl.constexpr, EPSC: tl.constexpr, DENSE3D: tl.constexpr):
    """For each interval [t, t + h] of ``ts`` [TP]: a sound upper value of the tilt bound on it (SPEC §3(c) with
    endpoints, Lean ``WitCert.tilt_tv_le_dual_grid_endpoints``): for any λ ≥ 0, D(·, λ) is concave in t (β is
    affine in t, the hinge convex), so g(t) = t − D(t, λ) is convex and its maximum on the interval is at an end:
    U = min over λ ∈ {1/β_c(t) : w_c > 0} of max(g(t), g(t + h)), each D minus its rounding-error bound, and
    at most t + h (λ = 0). The width h is not added: the coarse grid's slack is second order (the former form
    t + h − D(t, λ) carried h itself). ``w`` [NBP] bin weights with ``a``/``b`` their β at t = 0 / 1 (DENSE3D:
    one [TP, NBP, NBP] broadcast); else the live bins packed at the front of SCR (weights, a, b; ``nl`` of them),
    walked in a loop that loads bin c + 1 while bin c is used. ``EPSC``: the relative rounding bound of a D."""
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]  # [TP, NBP]: β_c(t)
    lam = tl.where(w[None, :] > 0, 1.0 / beta, 0.0)
    t1 = ts + h
    tm0 = (ts * m)[:, None]
    tm1 = (t1 * m)[:, None]
    if DENSE3D:
        beta1 = (1.0 - t1)[:, None] * a[None, :] + t1[:, None] * b[None, :]
        x0 = lam[:, :, None] * beta[:, None, :]
        x1 = lam[:, :, None] * beta1[:, None, :]
        act0 = tl.maximum(x0 - 1.0, 0.0)
        act1 = tl.maximum(x1 - 1.0, 0.0)
        d0 = tl.sum(w[None, None, :] * act0, axis=2)
        d1 = tl.sum(w[None, None, :] * act1, axis=2)
        m0 = tl.sum(tl.where(act0 > 0, w[None, None, :] * (x0 + 1.0), 0.0), axis=2)
        m1 = tl.sum(tl.where(act1 > 0, w[None, None, :] * (x1 + 1.0), 0.0), axis=2)
    else:
        d0 = tl.zeros_like(beta)
        d1 = tl.zeros_like(beta)
        m0 = tl.zeros_like(beta)
        m1 = tl.zeros_like(beta)
        w2n = tl.load(SCR)
        a2n = tl.load(SCR + NBP)
        b2n = tl.load(SCR + 2 * NBP)
        for c2 in range(nl):
            w2 = w2n
            a2 = a2n
            b2 = b2n
            nx = tl.minimum(c2 + 1, NBP - 1)
            w2n = tl.load(SCR + nx)
            a2n = tl.load(SCR + NBP + nx)
            b2n = tl.load(SCR + 2 * NBP + nx)
            x0 = lam * ((1.0 - ts)[:, None] * a2 + ts[:, None] * b2)
            x1 = lam * ((1.0 - t1)[:, None] * a2 + t1[:, None] * b2)
            act0 = tl.maximum(x0 - 1.0, 0.0)
            act1 = tl.maximum(x1 - 1.0, 0.0)
            d0 += w2 * act0
            d1 += w2 * act1
            m0 += tl.where(act0 > 0, w2 * (x0 + 1.0), 0.0)
            m1 += tl.where(act1 > 0, w2 * (x1 + 1.0), 0.0)
    g0 = ts[:, None] - (lam * tm0 - d0) + EPSC * (lam * tm0 + m0 + 1.0)
    g1 = t1[:, None] - (lam * tm1 - d1) + EPSC * (lam * tm1 + m1 + 1.0)
    u = tl.min(tl.where(w[None, :] > 0, tl.maximum(g0, g1), float("inf")), axis=1)
    return tl.minimum(u, t1)


@triton.jit
def _tv_row(w, lvl, r, xi, lam, tilt_above, tilt_hi, SCR,
            NB: tl.constexpr, NBP: tl.constexpr, N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr,
            EPSC: tl.constexpr, DENSE3D: tl.constexpr):
    """One row of ``tv_from_hist`` (float64): masses ``w`` [NBP] (≥ 0, finite; bins ≥ NB are 0),
    bin levels ``lvl`` [NBP] (the last bin NB − 1 is the overflow bin, its level ``r``), the row's
    maximum radius ``r``, the decode's Ξ and Λ. Returns (TV⁺, tanh, e-form, tilt, ρ).

    The dual-grid tilt (coarse N1 intervals, then the RT of largest upper value split into NR)
    is computed only when the closed forms' TV⁺ (min(tanh, e-form) + tanh(Ξ/2) + ρ + slack) is
    above ``tilt_above`` (a gate's τ: at or below it the row is certified without the tilt);
    otherwise ``tilt`` is reported as 1 (the trivial bound), which keeps TV⁺ sound. With
    ``tilt_above`` ≥ 0 the refinement is lazy too, interval by interval: it stops (possibly before the
    first) once the grid reached certifies TV⁺ ≤ τ, or once the refined intervals alone put TV⁺ above
    τ; ``tilt`` is then that grid's bound (sound for any grid, SPEC §3(c); ≥ the fully refined one up to
    rounding), and the gate's decision is the fully refined one's. τ arrives as float32 (``tau_bracket``):
    ``tilt_above`` = τ↓ for the skip and the certified stop, ``tilt_hi`` = τ↑ for the not-certified one.
    Masses whose sum is not positive and finite give e-form = tilt = 1; a NaN TV⁺ is reported as 1."""
    k = tl.arange(0, NBP)
    lv = tl.where(k == NB - 1, r, lvl)
    lv = tl.maximum(tl.minimum(lv, r), 0.0) + xi
    # masses whose sum is not a positive finite number (all 0, underflowed, overflowed, NaN / inf) carry no
    # distribution: the e-form and the tilt are then 1 (tanh, from the maximum radius alone, still holds)
    ws = tl.sum(w, axis=0)
    okw = (ws >= 1e-300) & (ws < float("inf"))
    w = w / tl.maximum(ws, 1e-300)  # (not okw: garbage, unused below; a tl.where here broke Triton 3.6's
    # layout pass at 32+ bins, "operand does not dominate this use", 2026-12-03)
    live = w > 0
    lv = tl.where(live, lv, 0.0)
    a = tl.exp(lv)
    b = tl.exp(-lv)
    m = tl.sum(w * b, axis=0)
    rx = r + xi
    e2 = tl.exp(-rx)
    tanh = (1.0 - e2) / (1.0 + e2)  # tanh((r + Ξ)/2)
    A = tl.sum(w * a, axis=0)
    eform = tl.minimum(0.5 * (A * A - 1.0) * (1.0 + 8.0 * NBP * 2.220446049250313e-16), 1.0)
    eform = tl.where((eform == eform) & okw, eform, 1.0)
    mlo = m * (1.0 - 9.094947017729282e-13)
    rho = lam * (1.0 + tl.exp(tl.minimum(rx, 700.0)) / tl.maximum(mlo, 1e-300)) * (1.0 + 9.094947017729282e-13)
    rho = tl.where(lam > 0, rho, 0.0)
    rho = tl.where(rho == rho, rho, 1.0)
    lmax = tl.where(okw, tl.max(lv, axis=0), float("inf"))  # (no distribution: neither branch below, tilt 1)
    cheap = tl.minimum(tanh, eform)
    e1 = tl.exp(-xi)
    fp_terms = (1.0 - e1) / (1.0 + e1) + rho + FP64_SLACK_C  # tanh(Ξ/2) + ρ + slack
    tilt = tl.full([], 1.0, tl.float64)
    if lmax == 0:
        tilt = tl.full([], 0.0, tl.float64)  # all radii 0 (and Ξ = 0): TV = 0
    elif (lmax <= 700.0) & (cheap + fp_terms > tilt_above):
        # the live bins (w > 0), in bin order, packed to the front of SCR: the loop form of _dense_u
        # visits only those (the dead ones add exactly +0: the same sums, bit for bit)
        live_i = live.to(tl.int32)
        pos = tl.cumsum(live_i, axis=0) - 1
        nl = tl.sum(live_i, axis=0)
        tl.store(SCR + pos, w, mask=live)
        tl.store(SCR + NBP + pos, a, mask=live)
        tl.store(SCR + 2 * NBP + pos, b, mask=live)
        tl.debug_barrier()
        i = tl.arange(0, N1)
        if DENSE3D:
            U = _dense_u(i.to(tl.float64) * (1.0 / N1), 1.0 / N1, w, a, b, m, SCR, nl, NB, NBP, EPSC, DENSE3D)
        else:  # (GPU) TC points at a time, through SCR: [TC, NBP] float64 tiles fit any warp count's registers
            for c0 in range(0, N1, TC):
                ic = c0 + tl.arange(0, TC)
                tl.store(SCR + 3 * NBP + ic, _dense_u(ic.to(tl.float64) * (1.0 / N1), 1.0 / N1, w, a, b, m, SCR, nl,
                                                      NB, NBP, EPSC, DENSE3D))
            tl.debug_barrier()
            U = tl.load(SCR + 3 * NBP + i)
        coarse = tl.minimum(tl.maximum(tl.max(U, axis=0), 0.0), 1.0)
        # lazy (τ ≥ 0): the refinement stops once the gate's question is settled either way. Every interval
        # keeps a sound upper value (its refined maximum, or its coarse U if not refined), so the reported
        # tilt — the maximum over all intervals — is sound for whatever grid was reached (SPEC §3(c)):
        #  * certified: the current tilt already puts TV⁺ ≤ τ (before any refinement: the coarse grid);
        #  * not certified: the refined intervals' maximum alone puts TV⁺ > τ, and the full refinement's
        #    tilt is ≥ it (it refines the same intervals to the same values), so its TV⁺ is > τ too.
        # Non-lazy (τ < 0): all RT intervals, the tight bound.
        lazy = tilt_above >= 0.0
        done = (lazy & (tl.minimum(cheap, coarse) + fp_terms <= tilt_above)).to(tl.int32)
        sel = i < 0
        best = tl.full([], -1.0, tl.float64)
        s = tl.arange(0, NR)
        if DENSE3D:  # (interpreter) pick the RT intervals first, then one dense evaluation of all
            rr = tl.arange(0, RT)  # their RT·NR points: the same values, far fewer interpreted calls
            idxv = tl.zeros([RT], tl.int32)
            selv = i < 0
            for _r in range(RT):
                um = tl.where(selv, -2.0, U)
                mx = tl.max(um, axis=0)
                idx = tl.min(tl.where(um == mx, i, N1), axis=0)
                selv = selv | (i == idx)
                idxv = tl.where(rr == _r, idx, idxv)
            ts = tl.reshape(idxv.to(tl.float64)[:, None] * (1.0 / N1)
                            + s.to(tl.float64)[None, :] * (1.0 / (N1 * NR)), [RT * NR])
            up = _dense_u(ts, 1.0 / (N1 * NR), w, a, b, m, SCR, nl, NB, NBP, EPSC, DENSE3D)
            bm = tl.max(tl.reshape(up, [RT, NR]), axis=1)  # each picked interval's refined maximum
        for _r in range(RT):  # the RT largest upper values (ties: the lowest index), refined in that order
            if done == 0:
                if DENSE3D:
                    idx = tl.max(tl.where(rr == _r, idxv, -1), axis=0)
                    bi = tl.max(tl.where(rr == _r, bm, -2.0), axis=0)
                else:
                    um = tl.where(sel, -2.0, U)
                    mx = tl.max(um, axis=0)
                    idx = tl.min(tl.where(um == mx, i, N1), axis=0)
                    t0 = idx.to(tl.float64) * (1.0 / N1)
                    bi = tl.full([], -2.0, tl.float64)
                    for s0 in range(0, NR, TC):
                        sc = s0 + tl.arange(0, TC)
                        up = _dense_u(t0 + sc.to(tl.float64) * (1.0 / (N1 * NR)), 1.0 / (N1 * NR), w, a, b, m, SCR, nl,
                                      NB, NBP, EPSC, DENSE3D)
                        bi = tl.maximum(bi, tl.max(up, axis=0))
                sel = sel | (i == idx)
                best = tl.maximum(best, bi)
                cur = tl.minimum(tl.maximum(tl.maximum(best, tl.max(tl.where(sel, -1.0, U), axis=0)), 0.0), 1.0)
                low = tl.minimum(tl.maximum(best, 0.0), 1.0)
                done = (lazy & ((tl.minimum(cheap, cur) + fp_terms <= tilt_above)
                                | (tl.minimum(cheap, low) + fp_terms > tilt_hi))).to(tl.int32)
        rest = tl.max(tl.where(sel, -1.0, U), axis=0)
        tilt = tl.minimum(tl.maximum(tl.maximum(best, rest), 0.0), 1.0)
        tl.debug_barrier()  # SCR is reused by the next call
    tv = tl.minimum(tl.minimum(cheap, tilt) + fp_terms, 1.0)
    # a NaN radius, Ξ or Λ saturates (the GPU's min / max drop NaN operands, so test the inputs themselves)
    tv = tl.where((tv == tv) & (r == r) & (xi == xi) & (lam == lam), tv, 1.0)
    return tv, tanh, eform, tilt, rho



@triton.jit
def _tv_kernel(MASS, LV, RMAX, XI, LAM, OUT, SCR, s_m, s_l, tilt_above, tilt_hi,
               NB: tl.constexpr, NBP: tl.constexpr, N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr,
               EPSC: tl.constexpr, DENSE3D: tl.constexpr):
    """Program ``row``: ``_tv_row`` on one histogram row; OUT[row] = (TV⁺, tanh, e-form, tilt, ρ)."""
    row = tl.program_id(0)
    k = tl.arange(0, NBP)
    km = k < NB
    w = tl.load(MASS + row * s_m + k, mask=km, other=0.0).to(tl.float64)
    w = tl.where(w == w, tl.maximum(w, 0.0), float("inf"))  # a NaN mass: no distribution (_tv_row saturates)
    lvl = tl.load(LV + row * s_l + k, mask=km, other=0.0).to(tl.float64)
    r = tl.load(RMAX + row).to(tl.float64)
    tv, tanh, eform, tilt, rho = _tv_row(w, lvl, r, tl.load(XI + row).to(tl.float64), tl.load(LAM + row).to(tl.float64),
                                         tilt_above, tilt_hi, SCR + row * (3 * NBP + N1), NB, NBP, N1, RT, NR, EPSC, DENSE3D)
    o = OUT + row * 5
    tl.store(o + 0, tv)
    tl.store(o + 1, tanh)
    tl.store(o + 2, eform)
    tl.store(o + 3, tilt)
    tl.store(o + 4, rho)


@triton.jit
def _expm1_up(y):
    """An upper bound of e^y − 1 for 0 ≤ y (float64): the series y + y²/2 + y³ below 2^-10 (its
    tail y³/6 + … ≤ y³ there), else e^y − 1; both with a relative 2^-40 for their rounding."""
    small = y + 0.5 * y * y + y * y * y
    big = tl.exp(y) - 1.0
    return tl.where(y < 0.0009765625, small, big) * (1.0 + 9.094947017729282e-13)


@triton.jit
def _merge_meter_kernel(
    M_IN, L_IN, ACC_IN, HIST_IN, STAT_IN, Q, SL, EDGES, O, LSE, REC, HOUT, SCR, FLAG, WGT,
    Hq, S, sm, qn_infl, log_delta, tilt_above, tilt_hi, s_qb, s_qh,
    D: tl.constexpr, SP: tl.constexpr, T: tl.constexpr, PAGES: tl.constexpr,
    NB: tl.constexpr, KA: tl.constexpr, KP: tl.constexpr,
    METER: tl.constexpr, EPI: tl.constexpr, TIER_B: tl.constexpr,
    GAMMA: tl.constexpr, EXP_REL: tl.constexpr, DITHER_U: tl.constexpr, ETA0: tl.constexpr, ETA1: tl.constexpr,
    FLUSH: tl.constexpr, OUT_REL0: tl.constexpr, BIAS: tl.constexpr,
    N1: tl.constexpr, RT: tl.constexpr, NR: tl.constexpr, EPSC: tl.constexpr, DENSE3D: tl.constexpr,
    HA_HM: tl.constexpr, WEIGHTED: tl.constexpr, GQ: tl.constexpr, RING_TILES: tl.constexpr,
):
    """Program ``row`` = (b, h): the split-KV merge of the decode's S partials (log-sum-exp rule,
    float64 weights) → O[row] (fp32), LSE[row]; with METER the merged histograms (float64, HOUT)
    and, with EPI, the meter record REC[row] (columns ``REC_*``): Ξ, Λ, both tiers' TV⁺ and E⁺.
    The same arithmetic as the torch path it replaced (``decode_epilogue_torch``), in one launch."""
    row = tl.program_id(0)
    b = row // Hq
    h = row % Hq
    s = tl.arange(0, SP)
    smask = s < S
    ms = tl.load(M_IN + row * S + s, mask=smask, other=float("-inf"))
    ls = tl.load(L_IN + row * S + s, mask=smask, other=0.0)
    mx = tl.max(ms, axis=0)
    fin = (ms == ms) & (ms != float("inf")) & (ms != float("-inf"))
    w64 = tl.where(fin, tl.exp((ms - mx).to(tl.float64)), 0.0)
    w32 = w64.to(tl.float32)
    L = tl.sum(w32 * ls, axis=0)
    d = tl.arange(0, D)
    acc = tl.load(ACC_IN + (row * S + s)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(w32[:, None] * acc, axis=0) / L
    tl.store(O + row * D + d, o)
    tl.store(LSE + row, mx + tl.log(L))
    if METER:
        L64 = tl.sum(w64 * ls.to(tl.float64), axis=0)
        c = tl.arange(0, NB)
        hs = tl.load(HIST_IN + (row * S + s)[:, None] * NB + c[None, :], mask=smask[:, None], other=0.0)
        hm = tl.sum(w64[:, None] * hs.to(tl.float64), axis=0) / L64
        tl.store(HOUT + row * NB + c, hm)
        if EPI:
            st = STAT_IN + (row * S + s) * 6
            wmx = tl.max(tl.load(st + 0, mask=smask, other=0.0), axis=0)
            smx = tl.max(tl.load(st + 1, mask=smask, other=0.0), axis=0)
            phmx = tl.max(tl.load(st + 2, mask=smask, other=0.0), axis=0)
            numx = tl.max(tl.load(st + 3, mask=smask, other=0.0), axis=0)
            kpmx = tl.max(tl.load(st + 5, mask=smask, other=0.0), axis=0)
            # non-finite: counted radii, the partials' stats (a max may drop a NaN), L, o, the masses
            bad = tl.sum(tl.load(st + 4, mask=smask, other=0.0), axis=0)
            for col in tl.static_range(6):
                sv = tl.load(st + col, mask=smask, other=0.0)
                bad += tl.sum(((sv != sv) | (sv == float("inf"))).to(tl.float32), axis=0)
            bad += ((L != L) | (L == float("inf")) | (L == float("-inf"))).to(tl.float32)
            bad += tl.sum(((o != o) | (o == float("inf")) | (o == float("-inf"))).to(tl.float32), axis=0)
            bad += tl.sum(((hm != hm) | (hm == float("inf"))).to(tl.float32), axis=0)
            n = tl.load(SL + b)
            qv = tl.load(Q + b * s_qb + h * s_qh + d).to(tl.float64)
            qnorm = tl.sqrt(tl.sum(qv * qv, axis=0))
            qn = qnorm * qn_infl  # |σ| ‖q_h‖ (1 + KERNEL_REL_SLACK)
            q1 = tl.sum(tl.abs(qv), axis=0)
            if WEIGHTED:  # the sketch radius's head factor c_h = |σ| ‖a⊙q_h‖ (contract.sketch), rounded up
                qa = qv * tl.load(WGT + (h // GQ) * D + d).to(tl.float64)
                qn_a = tl.sqrt(tl.sum(qa * qa, axis=0)) * qn_infl
            else:
                qn_a = qn
            eps_max = qn_a * wmx.to(tl.float64)
            n_pages = (n + T - 1) // T
            tiles = ((n_pages + RING_TILES * PAGES + S - 1) // S + PAGES - 1) // PAGES + RING_TILES
            eta = ETA0 + ETA1 * tiles.to(tl.float64)
            # SPEC §7: Ξ bounds |log p̃_j/p̂_j| (up to normalisation) of the kernel's masses
            xi = qn * kpmx.to(tl.float64) * GAMMA + EXP_REL + DITHER_U * q1 * smx.to(tl.float64)
            xi = (xi + 2.1 * eta) * (1.0 + 9.5367431640625e-07)
            lam = (n.to(tl.float64) + NB * tiles.to(tl.float64) * S + 16.0) * FLUSH / tl.maximum(L64, 1.0)
            bad += ((xi != xi) | (xi == float("inf")) | (eps_max != eps_max) | (eps_max == float("inf"))
                    | (lam != lam)).to(tl.float32)
            single = n == 1
            k = tl.arange(0, KP)
            km = k < KA
            edge = tl.load(EDGES + k, mask=k < KA - 1, other=0.0)
            if HA_HM:  # KP == NB (tier A alone): tier A's bins are the merged row's first KA (the same sums)
                ha = tl.where(km, hm, 0.0)
            else:  # tier A's bins, merged again from the partials (a register vector has no slices)
                ha = tl.load(HIST_IN + (row * S + s)[:, None] * NB + k[None, :], mask=smask[:, None] & km[None, :],
                             other=0.0)
                ha = tl.sum(w64[:, None] * ha.to(tl.float64), axis=0) / L64
            ha = tl.maximum(tl.where(ha == ha, ha, 0.0), 0.0)
            pphi = tl.sum(tl.where(c == NB - 1, hm, 0.0), axis=0)
            out_rel = OUT_REL0 + eta
            fm = phmx.to(tl.float64)
            num = numx.to(tl.float64)
            e1 = tl.exp(-xi)
            own = num * _expm1_up(tl.minimum(2.0 * xi + out_rel, 700.0))
            extra = pphi + ((1.0 - e1) / (1.0 + e1) + lam) * fm + own
            r = REC + row * REC_COLS
            tva = tl.full([], 1.0, tl.float64)
            if bad == 0:
                tva, tanh, eform, tilt, rho = _tv_row(ha, qn_a * edge, eps_max, xi, lam, tilt_above, tilt_hi,
                                                      SCR + row * 2 * (3 * KP + N1), KA, KP, N1, RT, NR, EPSC, DENSE3D)
                tl.store(r + REC_TANH, tanh)
                tl.store(r + REC_EFORM, eform)
                tl.store(r + REC_TILT, tilt)
                tl.store(r + REC_RHO, rho)
                if single:
                    tva = tl.full([], 0.0, tl.float64)
                ea = (tva * (2.0 * num + fm) + extra) * (1.0 + 9.094947017729282e-13) + FP64_SLACK_C
                ea = tl.where((ea == ea) & (ea != float("inf")), ea, float("inf"))
            else:
                tl.store(r + REC_TANH, 1.0)
                tl.store(r + REC_EFORM, 1.0)
                tl.store(r + REC_TILT, 1.0)
                tl.store(r + REC_RHO, 1.0)
                ea = tl.full([], float("inf"), tl.float64)
            tl.store(r + REC_TVA, tva)
            tl.store(r + REC_EA, ea)
            tl.store(r + REC_EPS, eps_max)
            tl.store(r + REC_XI, xi)
            tl.store(FLAG + row, (bad > 0).to(tl.int8))  # the record's bool flag (viewed as bool: no launch after)
            if TIER_B:
                # c_h = |σ| (‖q‖ sqrt(2 ln(2n/δ)/12) + ‖q‖₁ DITHER_BIAS_FACTOR) (1 + KERNEL_REL_SLACK)
                lt = tl.sqrt(2.0 * (tl.log(2.0 * n.to(tl.float64)) - log_delta) / 12.0)
                cb = (qnorm * lt + q1 * BIAS) * qn_infl
                tbm = cb * smx.to(tl.float64)
                tl.store(r + REC_TB, tbm)
                tvb = tl.full([], 1.0, tl.float64)
                eb = tl.full([], float("inf"), tl.float64)
                hb = tl.load(HIST_IN + (row * S + s)[:, None] * NB + KA + k[None, :], mask=smask[:, None] & km[None, :],
                             other=0.0)
                hb = tl.sum(w64[:, None] * hb.to(tl.float64), axis=0) / L64
                hb = tl.maximum(tl.where(hb == hb, hb, 0.0), 0.0)
                if (bad == 0) & (tbm == tbm) & (tbm != float("inf")):
                    # (a scratch of its own: no store / load of tier A's bins may be reordered past it)
                    tvb, _t, _e, _l, _r = _tv_row(hb, cb * edge, tbm, xi, lam, tilt_above, tilt_hi,
                                                  SCR + row * 2 * (3 * KP + N1) + 3 * KP + N1, KA, KP, N1, RT, NR, EPSC,
                                                  DENSE3D)
                    if single:
                        tvb = tl.full([], 0.0, tl.float64)
                    eb = (tvb * (2.0 * num + fm) + extra) * (1.0 + 9.094947017729282e-13) + FP64_SLACK_C
                    eb = tl.where((eb == eb) & (eb != float("inf")), eb, float("inf"))
                tl.store(r + REC_TVB, tvb)
                tl.store(r + REC_EB, eb)


#: columns of the fused merge's record (float64 per row; the flag is its own int8 output, ``FLAG``)
REC_TVA, REC_TVB, REC_EA, REC_EB, REC_EPS, REC_TB, REC_TANH, REC_EFORM, REC_TILT, REC_XI, REC_RHO = range(11)
REC_COLS = 16
for _name in ("REC_TVA", "REC_TVB", "REC_EA", "REC_EB", "REC_EPS", "REC_TB", "REC_TANH", "REC_EFORM", "REC_TILT",
              "REC_XI", "REC_RHO", "REC_COLS"):
    globals()[_name] = tl.constexpr(globals()[_name])


#: None: the [TP, K, K] form of the dense D off the GPU (numpy-fast in the interpreter), the loop
#: over bins on the GPU (registers); tests set it to run both forms in the interpreter
DENSE3D_OVERRIDE: bool | None = None


def _dense3d(dev) -> bool:
    return (torch.device(dev).type != "cuda") if DENSE3D_OVERRIDE is None else DENSE3D_OVERRIDE


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
    ``tilt_above`` ≥ 0: rows whose min(tanh, e-form) is ≤ it skip the tilt (reported as 1); the others
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
                      NB=nb, NBP=NBP, N1=COARSE, RT=min(REFINE_TOP, COARSE), NR=REFINE, EPSC=_epsc(NBP),
                      DENSE3D=_dense3d(dev))
    return tuple(t.reshape(shp) for t in out.unbind(-1))


def meter_epilogue(mass, massb, lv_a, lv_b, eps_max, tb_max, pphi, phi_max, nu_max, bad, single=None,
                   xi=None, lam=None, out_rel: float | torch.Tensor = 0.0) -> MeterRecord:
    """Histogram masses [B, Hq, K+2] with per-row bin levels [B, Hq, K+1] (the overflow bin's
    level is ``eps_max`` / ``tb_max``). ``single`` [B, Hq]: rows over exactly one token (TV = 0).
    ``xi``, ``lam`` [B, Hq]: the decode's Ξ and Λ (module doc). ``out_rel``: relative error of
    the kernel's own output accumulation (bf16 p̂·s_v on the GPU, fp32 sums): the output bound
    covers ‖ô_kernel − o‖, not only the exact-arithmetic ô of SPEC §4:

        E⁺ = TV⁺ (2ν_max + φ_max) + Σ p̃ φ + (tanh(Ξ/2) + Λ) φ_max + ν_max (e^{2Ξ + out_rel} − 1)
    """
    bad_rows = (bad > 0) | ~torch.isfinite(mass).all(-1) | ~torch.isfinite(eps_max) | ~torch.isfinite(pphi)
    if xi is not None:
        bad_rows = bad_rows | ~torch.isfinite(xi)
        xi = torch.nan_to_num(xi.double(), posinf=1e30)
    lam = None if lam is None else torch.nan_to_num(lam.double(), nan=1.0, posinf=1.0)
    tv_a, tanh, eform, tilt, rho = tv_from_hist(torch.nan_to_num(mass), torch.nan_to_num(lv_a, posinf=1e30),
                                                torch.nan_to_num(eps_max, posinf=1e30), xi, lam)
    if single is not None:
        tv_a = torch.where(single, torch.zeros_like(tv_a), tv_a)
    tv_a = torch.where(bad_rows, torch.ones_like(tv_a), tv_a)
    x = torch.zeros_like(tv_a) if xi is None else xi
    la = torch.zeros_like(tv_a) if lam is None else lam

    def out_bound(tv):
        num = nu_max.double()
        fm = phi_max.double()
        own = num * torch.expm1((2.0 * x + out_rel).clamp(max=700.0))
        ob = (tv * (2.0 * num + fm) + pphi.double() + (torch.tanh(x / 2.0) + la) * fm + own) * (1.0 + 2.0**-40) + FP64_SLACK
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
        hist=mass, hist_b=massb, tanh=tanh, eform=eform, tilt=tilt, flag=bad_rows, xi=xi, rho=rho,
    )


@dataclasses.dataclass(frozen=True)
class MergeConstants:
    """What the merge needs from the decode launch (SPEC §7 terms of ``kernels.paged``)."""

    D: int
    T: int  # tokens per page
    PAGES: int  # pages per tile
    NB: int  # histogram columns (tier A bins, tier B bins, the Σ p̂ φ column)
    KA: int  # bins per tier
    sm: float  # σ
    tier_b: bool
    delta_step: float | None
    gamma: float  # ``paged.dot_gamma``
    dither_u: float  # |σ| 2^-19 for the bf16 hi + lo dither split, else 0
    eta: tuple  # ``paged.mass_eta_terms``
    out_rel0: float  # 2^-8 on the GPU (bf16 p̂·s_v), 0 in the interpreter
    #: the sketch radius's channel weights [Hkv, D] (``contract.sketch``): the Tier A head factor is then
    #: |σ|·‖a⊙q_h‖ (kv head h // gq); None: |σ|·‖q_h‖
    weights: torch.Tensor | None = None
    gq: int = 1
    #: tiles of the exact window's ring pass (split 0): counted into every split's mass error η
    ring_tiles: int = 0


_EDGES: dict = {}


#: warps per program of the fused merge (one program per row). With the meter record: four (the tilt is
#: a float64 grid search that wants the threads; bench/merge_probe.py, run N2, d 128, every row tilted:
#: 51.4 / 54.1 µs at B 1 / 8 with four warps, 95.6 / 90.7 with one), except on grids of at least
#: MERGE_RECORD_ONE_WARP_ROWS_PER_SM rows per SM, where one warp per row is faster whatever the tilt does
#: (B 32, Hq 32: 1024 rows on 132 SMs, every row tilted 120.2 µs with one warp against 164.5 with four;
#: no row tilted 13.2 against 33.0). Without the record (the unmetered merge, or the histograms alone): one
#: while a row's partial outputs (SP × D floats) are at most MERGE_ONE_WARP_ELEMS (run M: unmetered 7.1 / 8.0 /
#: 9.4 µs against 7.5 / 7.8 / 10.0 with four, histograms 9.4 / 9.6 / 11.2 against 9.4 / 9.4 / 13.5), else four
#: (not measured).
MERGE_ONE_WARP_ELEMS = 64 * 128
MERGE_RECORD_WARPS = 4
MERGE_RECORD_ONE_WARP_ROWS_PER_SM = 4


def merge_warps(sp: int, d: int, record: bool, rows: int = 0, sms: int = 0) -> int:
    """Warps per program of the fused merge for ``sp`` (power of two ≥ S) partials of ``d`` channels, over
    ``rows`` programs on ``sms`` SMs (0: unknown, e.g. off the GPU)."""
    if record:
        return 1 if sms and rows >= MERGE_RECORD_ONE_WARP_ROWS_PER_SM * sms else MERGE_RECORD_WARPS
    return 1 if sp * d <= MERGE_ONE_WARP_ELEMS else 4


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
    key = (str(dev), ka)
    if key not in _EDGES:
        e = key_edges(dev)
        assert e.numel() == ka - 1
        _EDGES[key] = e.contiguous()
    return _EDGES[key]


def merge(m_out, l_out, acc_out, hist, stat, q, sl, c: MergeConstants, epilogue: bool = True,
          tilt_above: float = -1.0, num_warps: int | None = None):
    """The decode's split-KV merge and, with ``hist`` / ``stat`` and ``epilogue``, the meter
    record, in one launch (``_merge_meter_kernel``). Partials [B, Hq, S, ...] (contiguous);
    q [B, Hq, D] the query the kernel used; sl [B] int32. Returns (o [B, Hq, D] fp32, lse, rec).
    ``num_warps`` None: ``merge_warps`` (bench/merge_probe.py)."""
    Bsz, Hq, S = m_out.shape
    dev = m_out.device
    rows = Bsz * Hq
    meter = hist is not None
    o = torch.empty(Bsz, Hq, c.D, device=dev, dtype=torch.float32)
    lse = torch.empty(Bsz, Hq, device=dev, dtype=torch.float32)
    KP = triton.next_power_of_2(c.KA)
    f64 = dict(device=dev, dtype=torch.float64)
    hout = torch.empty(Bsz, Hq, c.NB, **f64) if meter else lse
    rec = torch.empty(rows, REC_COLS.value, **f64) if meter and epilogue else lse
    scr = torch.empty(rows, 2 * scratch_per_tier(KP), **f64) if meter and epilogue else lse
    flag = torch.empty(rows, device=dev, dtype=torch.int8) if meter and epilogue else lse
    edges = _edges(dev, c.KA) if meter and epilogue else lse
    _merge_meter_kernel[(rows,)](
        m_out, l_out, acc_out, hist if meter else m_out, stat if meter else m_out, q, sl, edges, o, lse, rec, hout, scr,
        flag, c.weights if c.weights is not None else lse, Hq, S, c.sm, abs(c.sm) * (1.0 + KERNEL_REL_SLACK),
        math.log(c.delta_step) if c.tier_b else 0.0, *tau_bracket(tilt_above), q.stride(0), q.stride(1),
        D=c.D, SP=triton.next_power_of_2(S), T=c.T, PAGES=c.PAGES, NB=c.NB, KA=c.KA, KP=KP,
        METER=meter, EPI=meter and epilogue, TIER_B=c.tier_b,
        GAMMA=c.gamma, EXP_REL=KERNEL_EXP_REL, DITHER_U=c.dither_u, ETA0=c.eta[0], ETA1=c.eta[1],
        FLUSH=FP32_FLUSH, OUT_REL0=c.out_rel0, BIAS=DITHER_BIAS_FACTOR,
        N1=COARSE, RT=min(REFINE_TOP, COARSE), NR=REFINE, EPSC=_epsc(KP), DENSE3D=_dense3d(dev),
        HA_HM=HA_FROM_MERGED and KP == c.NB and not c.tier_b, WEIGHTED=c.weights is not None, GQ=c.gq,
        RING_TILES=c.ring_tiles,
        num_warps=num_warps or merge_warps(triton.next_power_of_2(S), c.D, meter and epilogue, rows, _sms(dev)),
    )
    record = None
    if meter and epilogue:
        col = lambda k: rec[:, k.value].view(Bsz, Hq)  # noqa: E731
        record = MeterRecord(
            tv_upper_a=col(REC_TVA), tv_upper_b=col(REC_TVB) if c.tier_b else None,
            out_err_upper=col(REC_EA), out_err_upper_b=col(REC_EB) if c.tier_b else None,
            eps_max=col(REC_EPS), tb_max=col(REC_TB) if c.tier_b else None,
            hist=hout[..., : c.KA], hist_b=hout[..., c.KA : 2 * c.KA] if c.tier_b else None,
            tanh=col(REC_TANH), eform=col(REC_EFORM), tilt=col(REC_TILT), flag=flag.view(torch.bool).view(Bsz, Hq),
            xi=col(REC_XI), rho=col(REC_RHO),
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


def merge_torch(m_out, l_out, acc_out, hist, stat, q, sl, c: MergeConstants):
    """Torch reference of ``merge`` (the former host-side path: float64 weights, the same Ξ, Λ
    and ``meter_epilogue``); tests pin the kernel to it."""
    Bsz, Hq, S = m_out.shape
    dev = m_out.device
    M = m_out.max(dim=-1, keepdim=True).values
    w64 = torch.where(torch.isfinite(m_out), torch.exp((m_out - M).double()), torch.zeros_like(m_out, dtype=torch.float64))
    w = w64.float()
    L = (w * l_out).sum(-1)
    o = (w[..., None] * acc_out).sum(-2) / L[..., None]
    lse = M[..., 0] + torch.log(L)
    if hist is None:
        return o, lse, None
    sm = c.sm
    L64 = (w64 * l_out.double()).sum(-1)
    h = (w64[..., None] * hist.double()).sum(-2) / L64[..., None]
    mx = stat.amax(dim=-2)
    bad = stat[..., 4].sum(-1) + (~torch.isfinite(L)).double() + (~torch.isfinite(o).all(-1)).double()
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
    rec = meter_epilogue(
        h[..., :KA], h[..., KA : 2 * KA] if c.tier_b else None, lv_a, lv_b, eps_max, tb_max,
        pphi=h[..., NB - 1], phi_max=mx[..., 2], nu_max=mx[..., 3], bad=bad,
        single=(sl == 1)[:, None].expand(Bsz, Hq), xi=xi, lam=lam, out_rel=c.out_rel0 + eta,
    )
    return o, lse, rec
