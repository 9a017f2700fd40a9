"""The meter step (SPEC §2–§4, §6's risk, §7): one pure, model-free copy of the reference meter.

From the served logits ŝ (and the mask), per-token logit radii ε (Tier A; optionally Tier B's t),
and, for the output bound, the served values v̂ and value witnesses φ, ``measure`` returns:

* TV⁺ = min(tanh, e-form, tilt) per row and its three parts (SPEC §3), computed from the
  **logits** in the log domain (``witcert.bounds.tv_bound_parts_logits``): an underflowed p̂_j
  never hides a token (SPEC §7);
* E⁺ = TV⁺ (2ν_max + φ_max) + Σ p̂_j φ_j (SPEC §4, ``witcert.bounds.output_error_bound``; ν_j =
  ‖v̂_j‖ is taken there, rounded up, from the values);
* the per-token risk the gate ranks blocks by (SPEC §6): p̂_j (e^{ε_j} − 1) (+ p̂_j φ_j / τ_v),
  ``token_risk`` (``witcert.gate.block_risk`` sums it per block).

Rows (every axis but the last, the token axis) are independent. A row with no attended token
(left padding) gives 0 everywhere; a row with a non-finite attended logit or a NaN radius is
``bad``: TV⁺ = 1 and E⁺ = ∞ (saturated, the caller flags it). Masking comes only from ``mask``,
never from p̂ = 0.

The radii themselves: ``served_radius`` adds the fp64 rounding of the served logits
(``witcert.bounds.dot_rounding_radius``) to a Tier A (``bounds.logit_radius``) or Tier B
(``tier_b_radius``) radius; how witnesses are laid out (per token, block maxima) is the caller's.

Used by the cache's reference path (``witcert.cache``), ``witcert.synthetic`` and
``bench/real_model.py``. Inputs may be numpy arrays or torch tensors (any device); the results
are float64 in the library type (and on the device) of ``logits``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from . import bounds as B

__all__ = ["MeterResult", "measure", "softmax", "token_risk", "served_radius", "tier_b_radius", "FP64_UNIT_ROUNDOFF"]

#: unit roundoff of served logits computed in float64 (the reference path)
FP64_UNIT_ROUNDOFF = 2.0**-53


@dataclasses.dataclass
class MeterResult:
    """What ``measure`` returns; arrays [...] are per row (the inputs' shape without the token axis)."""

    tv: Any  # [...] Tier A TV⁺ = min(parts)
    parts: Any  # [3, ...] tanh, e-form, tilt (tilt = 1 where it was not computed)
    bad: Any  # [...] bool: non-finite attended logits or NaN radii (saturated)
    live: Any  # [...] bool: rows with at least one attended token
    err: Any | None = None  # [...] E⁺ (with values and value_witness)
    tv_b: Any | None = None  # [...] TV⁺ from the Tier B radii (with radius_b)
    parts_b: Any | None = None  # [3, ...]
    risk: Any | None = None  # [..., n] per-token risk (risk=True)

    @property
    def tanh(self):
        return self.parts[0]

    @property
    def eform(self):
        return self.parts[1]

    @property
    def tilt(self):
        return self.parts[2]


def _np(x, dtype=None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    return x if dtype is None else x.astype(dtype, copy=False)


def _torch(x, device=None) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x))  # a writable copy
    return t if device is None else t.to(device)


def softmax(logits, mask):
    """Masked softmax over the last axis (float64 torch): ``(p̂, live)``; rows without any
    attended token (``live`` False) give p̂ = 0. The served probabilities of the reference path."""
    logits = logits.masked_fill(~mask, float("-inf"))
    live_row = mask.any(-1)  # left-padded query rows have no key
    mx = torch.where(live_row, logits.amax(-1), torch.zeros_like(logits[..., 0]))
    e = torch.exp(logits - mx[..., None])
    e = torch.where(mask, e, torch.zeros_like(e))
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300), live_row


def token_risk(p_hat, logits, mask, live, radius, value_witness=None, tau_v: float | None = None) -> torch.Tensor:
    """Per-token risk (torch, [..., n]): p̂_j (e^{ε_j} − 1), taken in the log domain (a token whose
    p̂ underflowed still carries its risk), plus p̂_j φ_j / τ_v with ``tau_v``; 0 at masked tokens
    and in dead rows. ``p_hat``, ``logits``, ``mask``, ``radius`` broadcast to [..., n], ``live``
    [...]; ``value_witness`` broadcasts to [..., n]. NaN / overflow are the caller's
    (``witcert.gate.block_risk`` maps them to 0 / 1e300 before summing per block)."""
    lp = logits - torch.logsumexp(logits.masked_fill(~mask, float("-inf")), -1, keepdim=True)
    lp = torch.where(mask & live[..., None], lp, torch.full_like(lp, float("-inf")))
    rt = torch.exp(torch.clamp(lp + torch.clamp(radius, max=60.0), max=700.0)) - p_hat
    if tau_v is not None:
        rt = rt + p_hat * value_witness / tau_v
    return rt


def served_radius(radius, q, k_hat, scale, unit_roundoff: float = FP64_UNIT_ROUNDOFF, mask=None):
    """``radius`` (Tier A ε or Tier B t, [..., n]) plus the rounding of the served logits
    σ⟨q, k̂_j⟩ computed with ``unit_roundoff`` (``witcert.bounds.dot_rounding_radius``); 0 where
    ``mask`` is False. ``q`` [..., d], ``k_hat`` [..., n, d]."""
    rr = B.dot_rounding_radius(q, k_hat, scale, unit_roundoff)
    if isinstance(radius, torch.Tensor):
        out = radius + rr.to(radius.device)
        return out if mask is None else torch.where(mask, out, torch.zeros_like(out))
    out = radius + rr
    return out if mask is None else np.where(_np(mask, bool), out, 0.0)


def tier_b_radius(q, scales, scale, n: int, delta_step):
    """Tier B radius (SPEC §5, ``int8_dither``): ``witcert.bounds.dither_radius`` of the variance
    proxy with the fp32 scheme's bias (``dither_variance_proxy``, ``dither_bias_bound``); all |δ_j|
    at once with probability ≥ 1 − δ_step, for queries that do not depend on the dither.
    ``q`` [..., d], ``scales`` [..., n] (the per-token key scales)."""
    V = B.dither_variance_proxy(q, scales, scale)
    bias = B.dither_bias_bound(q, scales, scale)
    return B.dither_radius(V, n, delta_step, bias=bias)


def _tv_parts(logits: np.ndarray, radius: np.ndarray, mask: np.ndarray, live: np.ndarray, levels, tilt: bool,
              center: np.ndarray | None = None, grid: bool = False):
    """[3, rows] parts and [rows] bad for flat [rows, n] inputs (``center``: the centred box, or None)."""
    finite = ~(mask & ~np.isfinite(logits)).any(-1) & ~(mask & np.isnan(radius)).any(-1)
    if center is not None:
        finite &= ~(mask & ~np.isfinite(center)).any(-1)
    ok = live & finite
    parts = np.ones((3, logits.shape[0]))
    if ok.any():
        parts[:, ok] = np.stack(B.tv_bound_parts_logits(logits[ok], np.where(mask[ok], radius[ok], 0.0), mask=mask[ok],
                                                        levels=levels, tilt=tilt,
                                                        center=None if center is None else
                                                        np.where(mask[ok], center[ok], 0.0), grid=grid))
    bad = live & ~finite
    return np.where(bad, 1.0, np.where(live, parts, 0.0)), bad


def measure(logits, radius, *, mask=None, p_hat=None, values=None, value_witness=None, radius_b=None, levels=None,
            tilt: bool = True, risk: bool = False, tau_v: float | None = None, center=None,
            grid: bool = False) -> MeterResult:
    """One meter step (module doc).

    ``logits`` ŝ, ``radius`` ε, ``mask`` (True = attended; None: all), ``radius_b`` (Tier B t):
    broadcast to [..., n]. ``p_hat``: the served probabilities (default: the masked softmax of
    ``logits``; E⁺ and the risk read it). ``values`` v̂ [..., n, d_v] and ``value_witness`` φ
    [..., n] (broadcastable): E⁺. ``levels``: the tilt's radius levels (``bounds.round_levels``);
    ``tilt=False``: the closed forms only (tilt reported as 1). ``risk``: also the per-token risk
    (``token_risk``, with φ / τ_v when ``tau_v`` is given). ``center`` c (broadcast to [..., n]; None: 0):
    Tier A's box is centred, |δ_j − c_j| ≤ ε_j (``bounds.tv_bound_parts_logits``); the risk reads |c| + ε. ``grid``:
    Tier A's tilt on the fixed (t, λ) grid over the unbinned box (``bounds.tv_bound_parts_logits(grid=True)``)."""
    is_t = isinstance(logits, torch.Tensor)
    dev = logits.device if is_t else None
    ln_full = _np(logits, np.float64)
    en_full = _np(radius, np.float64)
    mk_full = np.ones(ln_full.shape, dtype=bool) if mask is None else _np(mask, bool)
    ln_full, en_full, mk_full = np.broadcast_arrays(ln_full, en_full, mk_full)
    shp = ln_full.shape[:-1]
    n = ln_full.shape[-1]
    live_full = mk_full.any(-1)
    ln_, en, mk, lv = ln_full.reshape(-1, n), en_full.reshape(-1, n), mk_full.reshape(-1, n), live_full.reshape(-1)
    cn_full = None
    if center is not None:
        cn = _np(center, np.float64)
        try:
            cn_full = np.broadcast_to(cn, ln_full.shape)
        except ValueError:
            raise ValueError(f"center: shape {cn.shape} does not broadcast to the logits' {ln_full.shape}") from None
    parts, bad = _tv_parts(ln_, en, mk, lv, levels, tilt, None if cn_full is None else cn_full.reshape(-1, n), grid)
    tv = parts.min(0)

    def out(x):  # [k, rows] -> [k, ...], [rows] -> [...], in the library type of ``logits``
        x = np.ascontiguousarray(x).reshape(x.shape[:-1] + shp)
        return _torch(x, dev) if is_t else x

    res = MeterResult(tv=out(tv), parts=out(parts), bad=out(bad), live=out(lv))

    if radius_b is not None:
        eb = np.broadcast_to(_np(radius_b, np.float64), ln_full.shape).reshape(-1, n)
        parts_b, _ = _tv_parts(ln_, eb, mk, lv, levels, tilt)
        res.tv_b, res.parts_b = out(parts_b.min(0)), out(parts_b)

    p = None
    if values is not None or risk:
        if p_hat is None:
            p, _ = softmax(_torch(ln_full), _torch(mk_full))
        else:
            p = p_hat
    if values is not None:
        if value_witness is None:
            raise ValueError("measure: values need value_witness (φ) for E⁺")
        pa = np.broadcast_to(_np(p, np.float64), ln_full.shape)
        # rows without any attended token: a placeholder distribution on token 0, zeroed below
        first = np.broadcast_to(np.arange(n) == 0, ln_full.shape)
        dead = ~live_full[..., None]
        pz = np.where(dead, first.astype(np.float64), pa)
        err = _np(B.output_error_bound(pz, values, value_witness, tv.reshape(shp), mask=mk_full | (dead & first)),
                  np.float64).reshape(-1)
        err = np.where(bad, np.inf, np.where(lv, err, 0.0))
        res.err = out(err)
    if risk:
        tdev = dev if is_t else None
        pt = _torch(p, tdev)
        esym = en_full if cn_full is None else np.abs(cn_full) + en_full  # the box ⊆ |δ| ≤ |c| + ε
        rt = token_risk(pt, _torch(ln_full, tdev), _torch(mk_full, tdev), _torch(live_full, tdev), _torch(esym, tdev),
                        None if tau_v is None else _torch(_np(value_witness, np.float64), tdev), tau_v)
        res.risk = rt if is_t else rt.numpy()
    return res
