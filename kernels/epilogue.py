"""Decode epilogue (SPEC §3, §4, §7, §8): K-bin p̂-mass histograms → TV⁺ and the output bound.

Vectorised over rows (batch × heads) in torch float64, on the decode's device. The decode
kernel bins tokens on the key side (by ‖W_j‖ and by the scale s_j), so each row's bin k has
the level σ‖q_h‖·edge_k (Tier A) or c_h·edge_k (Tier B); the overflow bin's level is the row's
exact maximum. Each histogram is a distribution over levels, so the §3 bounds apply to it
exactly as to per-token radii rounded up onto levels:

* tanh: ``tanh(ε_max / 2)`` (ε_max = σ‖q‖·max_j ‖W_j‖, not rounded onto a level);
* e-form: ``½ (A² − 1)``, ``A = Σ_k w_k e^{L_k}``;
* dual-grid tilt: ``max_i t_{i+1} − D(t_i, λ_i)`` on a uniform grid of ``COARSE`` intervals,
  then the ``REFINE_TOP`` intervals with the largest upper value are split into ``REFINE``
  sub-intervals. Every interval keeps its own (sound) upper value, so the maximum over the
  refined and unrefined intervals is sound for any grid (SPEC §3(c)); λ is the tight
  knapsack multiplier, and the float error of each D is bounded and subtracted.

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

import torch
import triton
import triton.language as tl

#: absolute slack for the epilogue's own float64 arithmetic (the decode pass's rounding is Ξ, ρ)
FP64_SLACK = 2.0**-40
COARSE = 64
REFINE_TOP = 8
REFINE = 32
_EPS = torch.finfo(torch.float64).eps


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


def tilt_from_hist(w: torch.Tensor, lv: torch.Tensor) -> torch.Tensor:
    """Dual-grid tilt bound for rows of (mass w [R, K], level lv [R, K]); sound for any grid."""
    R = w.shape[0]
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    w = torch.where(w > 0, w, torch.zeros_like(w))
    lvm = torch.where(w > 0, lv, torch.zeros_like(lv))
    a, b = torch.exp(lvm), torch.exp(-lvm)
    m = (w * b).sum(-1)
    dev = w.device
    ts = torch.linspace(0.0, 1.0, COARSE + 1, dtype=torch.float64, device=dev).expand(R, -1)
    dl, dv = _dual_lower(ts, w, a, b, m)
    upper = ts[:, 1:] - dl[:, :-1]  # [R, COARSE]
    top = torch.topk(upper, min(REFINE_TOP, COARSE), dim=-1).indices  # intervals to refine
    lo = torch.gather(ts[:, :-1], 1, top)
    frac = torch.linspace(0.0, 1.0, REFINE + 1, dtype=torch.float64, device=dev)
    sub = lo[..., None] + frac * (1.0 / COARSE)  # [R, TOP, REFINE+1]
    sdl, _ = _dual_lower(sub.reshape(R, -1), w, a, b, m)
    sdl = sdl.reshape(sub.shape)
    sub_upper = (sub[..., 1:] - sdl[..., :-1]).amax(dim=(-1, -2))
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
    wn = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    tanh = torch.tanh(r / 2.0)
    live = wn > 0
    A = (wn * torch.exp(torch.where(live, lvr, torch.zeros_like(lvr)))).sum(-1)
    eform = (0.5 * (A * A - 1.0) * (1.0 + 8 * nb * _EPS)).clamp(max=1.0)
    eform = torch.where(torch.isfinite(eform), eform, torch.ones_like(eform))
    tilt = tilt_from_hist(w, lvr)
    m = (wn * torch.exp(-torch.where(live, lvr, torch.zeros_like(lvr)))).sum(-1) * (1.0 - 2.0**-40)
    rho = torch.where(la > 0, la * (1.0 + torch.exp(r.clamp(max=700.0)) / m.clamp_min(1e-300)) * (1.0 + 2.0**-40),
                      torch.zeros_like(la))
    rho = torch.where(torch.isfinite(rho), rho, torch.ones_like(rho))
    tv = (torch.minimum(torch.minimum(tanh, eform), tilt) + torch.tanh(x / 2.0) + rho + FP64_SLACK).clamp(max=1.0)
    return tuple(t.reshape(shp) for t in (tv, tanh, eform, tilt, rho))


@triton.jit
def _row_setup(MASS, LV, RMAX, XI, row, nb, s_m, s_l, NBP: tl.constexpr):
    """One row's normalised masses w, raised levels lv, a = e^lv, b = e^-lv, m = Σ w b, and r + Ξ."""
    k = tl.arange(0, NBP)
    km = k < nb
    w = tl.maximum(tl.load(MASS + row * s_m + k, mask=km, other=0.0).to(tl.float64), 0.0)
    r = tl.load(RMAX + row).to(tl.float64)
    xi = tl.load(XI + row).to(tl.float64)
    lv = tl.load(LV + row * s_l + k, mask=km, other=0.0).to(tl.float64)
    lv = tl.where(k == nb - 1, r, lv)
    lv = tl.maximum(tl.minimum(lv, r), 0.0) + xi
    w = w / tl.maximum(tl.sum(w, axis=0), 1e-300)
    lv = tl.where(w > 0, lv, 0.0)
    a = tl.exp(lv)
    b = tl.exp(-lv)
    m = tl.sum(w * b, axis=0)
    return w, lv, a, b, m, r + xi, xi


@triton.jit
def _dual_max(t, w, a, b, m, EPSC: tl.constexpr):
    """max over λ ∈ {0} ∪ {1/β_c : w_c > 0} of D(t, λ) minus its rounding-error bound.
    D(t, ·) is concave piecewise linear with breakpoints 1/β_c, so this is the tight D."""
    beta = (1.0 - t) * a + t * b
    lam = tl.where(w > 0, 1.0 / beta, 0.0)
    x = lam[:, None] * beta[None, :]
    act = tl.maximum(x - 1.0, 0.0)
    D = lam * (t * m) - tl.sum(w[None, :] * act, axis=1)
    mag = lam * (t * m) + tl.sum(tl.where(act > 0, w[None, :] * (x + 1.0), 0.0), axis=1) + 1.0
    return tl.maximum(tl.max(D - EPSC * mag, axis=0), 0.0)


@triton.jit
def _epi_coarse_kernel(MASS, LV, RMAX, XI, LAM, U, STATS, nb, s_m, s_l,
                       NBP: tl.constexpr, N1: tl.constexpr, TB: tl.constexpr, EPSC: tl.constexpr):
    """Program (row, c): the coarse upper values U_i = t_{i+1} − D(t_i) for TB grid points; the
    first program of a row also writes (tanh, e-form, ρ, max level) to STATS."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    w, lv, a, b, m, r, xi = _row_setup(MASS, LV, RMAX, XI, row, nb, s_m, s_l, NBP)
    for j in range(TB):
        i = c * TB + j
        tl.store(U + row * N1 + i, (i + 1) * (1.0 / N1) - _dual_max(i * (1.0 / N1), w, a, b, m, EPSC))
    if c == 0:
        e2 = tl.exp(-r)
        tanh = (1.0 - e2) / (1.0 + e2)  # tanh(r/2)
        A = tl.sum(w * a, axis=0)
        eform = tl.minimum(0.5 * (A * A - 1.0) * (1.0 + 8.0 * NBP * 2.220446049250313e-16), 1.0)
        eform = tl.where(eform == eform, eform, 1.0)
        lam = tl.load(LAM + row).to(tl.float64)
        mlo = m * (1.0 - 9.094947017729282e-13)
        rho = lam * (1.0 + tl.exp(tl.minimum(r, 700.0)) / tl.maximum(mlo, 1e-300)) * (1.0 + 9.094947017729282e-13)
        rho = tl.where(lam > 0, rho, 0.0)
        rho = tl.where(rho == rho, rho, 1.0)
        tl.store(STATS + row * 4 + 0, tanh)
        tl.store(STATS + row * 4 + 1, eform)
        tl.store(STATS + row * 4 + 2, rho)
        tl.store(STATS + row * 4 + 3, tl.max(lv, axis=0))


@triton.jit
def _epi_refine_kernel(MASS, LV, RMAX, XI, TOP, SUB, nb, s_m, s_l,
                       NBP: tl.constexpr, N1: tl.constexpr, R: tl.constexpr, NR: tl.constexpr, TB: tl.constexpr,
                       EPSC: tl.constexpr):
    """Program (row, c): TB of the R·NR sub-interval upper values inside the R refined coarse
    intervals (their indices in TOP)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    w, lv, a, b, m, r, xi = _row_setup(MASS, LV, RMAX, XI, row, nb, s_m, s_l, NBP)
    for j in range(TB):
        q = c * TB + j
        t0 = tl.load(TOP + row * R + q // NR).to(tl.float64) * (1.0 / N1)
        s = q % NR
        ts = t0 + s * (1.0 / (N1 * NR))
        tl.store(SUB + row * (R * NR) + q, t0 + (s + 1) * (1.0 / (N1 * NR)) - _dual_max(ts, w, a, b, m, EPSC))


#: grid points per program of the epilogue kernels: few rows (small batches) are latency-bound,
#: so their points spread over many programs; many rows fill the GPU with one program each
#: (measured on the H200, bench/RESULTS.md: spreading 1024 rows' points was slower)
EPI_TB_FEW_ROWS, EPI_ROWS_FEW = 8, 128


def tv_from_hist(mass: torch.Tensor, lv: torch.Tensor, rmax: torch.Tensor, xi=None, lam=None, force_kernel: bool = False):
    """(TV⁺, tanh, e-form, tilt, ρ) for histograms ``mass`` [..., NB] whose bin k holds radii
    ≤ ``lv[..., k]`` (the last bin is the overflow bin, level ``rmax``), ``rmax`` [...] the
    row's exact maximum radius, ``xi`` / ``lam`` the decode's Ξ and Λ (None: 0).

    On CUDA two Triton launches, parallel over rows and grid points: the COARSE upper values
    (EPI_TB_FEW_ROWS points per program for ≤ EPI_ROWS_FEW rows, else a row per program), then,
    for each row's REFINE_TOP largest, the REFINE
    sub-intervals; the combination is a few tensor ops. The same numbers as
    ``tv_from_hist_torch`` (which CPU tensors use: the interpreter is slow; a test pins the two)."""
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
    epsc = (4.0 * NBP + 16.0) * 2.0**-52
    U = torch.empty(Rn, COARSE, dtype=torch.float64, device=dev)
    stats = torch.empty(Rn, 4, dtype=torch.float64, device=dev)
    few = Rn <= EPI_ROWS_FEW
    tb = EPI_TB_FEW_ROWS if few else COARSE
    _epi_coarse_kernel[(Rn, COARSE // tb)](w, lvr, r, x, la, U, stats, nb, w.stride(0), lvr.stride(0),
                                          NBP=NBP, N1=COARSE, TB=tb, EPSC=epsc)
    R = min(REFINE_TOP, COARSE)
    top = torch.topk(U, R, dim=-1).indices.to(torch.int32).contiguous()
    sub = torch.empty(Rn, R * REFINE, dtype=torch.float64, device=dev)
    tb = EPI_TB_FEW_ROWS if few else R * REFINE
    _epi_refine_kernel[(Rn, R * REFINE // tb)](w, lvr, r, x, top, sub, nb, w.stride(0), lvr.stride(0),
                                              NBP=NBP, N1=COARSE, R=R, NR=REFINE, TB=tb, EPSC=epsc)
    rest = U.scatter(1, top.long(), -1.0).amax(-1)
    tanh, eform, rho, lmax = stats.unbind(-1)
    tilt = torch.maximum(sub.amax(-1), rest).clamp(0.0, 1.0)
    tilt = torch.where(lmax == 0, torch.zeros_like(tilt), tilt)
    tilt = torch.where(lmax > 700.0, torch.ones_like(tilt), tilt)
    tv = (torch.minimum(torch.minimum(tanh, eform), tilt) + torch.tanh(x / 2.0) + rho + FP64_SLACK).clamp(max=1.0)
    return tuple(t.reshape(shp) for t in (tv, tanh, eform, tilt, rho))


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
