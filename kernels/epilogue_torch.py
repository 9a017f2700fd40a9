"""Torch twin of the epilogue's TV⁺ (SPEC §3, §7): the float64 reference of ``_tv_row`` / ``_dense_u``
(``kernels.epilogue_jit``) that CPU tensors are served by and the tests pin the kernels to. The bounds are
stated in ``kernels.epilogue`` (module doc).

    tv_from_hist_torch(mass [..., NB], lv [..., NB] or [..., NB − 1], rmax [...], xi [...], lam [...])
        → (TV⁺, tanh, e-form, tilt, ρ), each [...] float64
    tilt_from_hist(w [R, K], lv [R, K]) → [R]          the dual-grid tilt on the kernel's grid
    _interval_upper(t0 [R, T], h, w, a, b [R, K], m [R]) → [R, T]   one upper value per interval
"""

from __future__ import annotations

import torch

from .epilogue_jit import COARSE, FP64_SLACK, REFINE, refine_top

_EPS = torch.finfo(torch.float64).eps


def _dual_lower(ts: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, m: torch.Tensor):
    """Safe lower value of D(t, λ_tight) per (row, t), and the float value.

    ts [R, T]; w, a, b [R, K]; m [R]. Mirrors ``witcert.bounds.dual_grid._dual_values``.
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
    grid and choices: COARSE intervals with endpoint upper values (``_interval_upper``); at most the REFINE_TOP
    largest split into REFINE, largest first, each then valued at the smaller of its coarse value and its
    sub-intervals' maximum, until no unrefined interval is above the refined maximum."""
    R = w.shape[0]
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    w = torch.where(w > 0, w, torch.zeros_like(w))
    lvm = torch.where(w > 0, lv, torch.zeros_like(lv))
    a, b = torch.exp(lvm), torch.exp(-lvm)
    m = (w * b).sum(-1)
    dev = w.device
    ts = torch.linspace(0.0, 1.0, COARSE + 1, dtype=torch.float64, device=dev)[:-1].expand(R, -1)
    upper = _interval_upper(ts, 1.0 / COARSE, w, a, b, m)  # [R, COARSE]
    rt = refine_top()  # 0 (the default): the coarse grid alone, no interval refined
    order = torch.sort(upper, dim=-1, descending=True, stable=True).indices  # largest first (ties: lowest index)
    best = torch.full_like(upper[:, 0], -1.0)  # the refined intervals' maximum (none refined: −1, as the kernel's)
    if rt:
        top = order[:, :rt]
        lo = torch.gather(ts, 1, top)
        frac = torch.arange(REFINE, dtype=torch.float64, device=dev) * (1.0 / (COARSE * REFINE))
        sub = lo[..., None] + frac  # [R, TOP, REFINE]
        sub_upper = _interval_upper(sub.reshape(R, -1), 1.0 / (COARSE * REFINE), w, a, b, m).reshape(R, rt, REFINE)
        # each at the smaller of its refined maximum and its coarse value (both sound); the kernel stops refining
        # once no unrefined interval is above the refined maximum: with refined values ≤ coarse ones that is
        # exactly the tilt of refining all of them, computed here
        best = torch.minimum(sub_upper.amax(-1), torch.gather(upper, 1, top)).amax(-1)
    rest = torch.gather(upper, 1, order[:, rt : rt + 1])[:, 0] if COARSE > rt else torch.full_like(upper[:, 0], -1.0)
    out = torch.maximum(best, rest).clamp(0.0, 1.0)
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
    w = mass.double().reshape(-1, nb)
    w = torch.where(w >= 0, w, torch.full_like(w, float("inf")))  # a NaN or negative mass: no distribution
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
    tilt = torch.where(torch.isnan(tilt), torch.ones_like(tilt), tilt)  # a NaN level: the trivial tilt (as the kernel)
    m = (wn * torch.exp(-torch.where(live, lvr, torch.zeros_like(lvr)))).sum(-1) * (1.0 - 2.0**-40)
    rho = torch.where(la > 0, la * (1.0 + torch.exp(r.clamp(max=700.0)) / m.clamp_min(1e-300)) * (1.0 + 2.0**-40),
                      torch.zeros_like(la))
    rho = torch.where(torch.isfinite(rho), rho, torch.ones_like(rho))
    tv = (torch.minimum(torch.minimum(tanh, eform), tilt) + torch.tanh(x / 2.0) + rho + FP64_SLACK).clamp(max=1.0)
    # a NaN or negative radius, Ξ or Λ: saturated (a negative radius would put tanh below 0)
    ok = (rmax.double().reshape(-1) >= 0) & (x >= 0) & (la >= 0) & ~torch.isnan(tv)
    tv = torch.where(ok, tv, torch.ones_like(tv))
    return tuple(t.reshape(shp) for t in (tv, tanh, eform, tilt, rho))
