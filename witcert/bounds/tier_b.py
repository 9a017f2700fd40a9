"""SPEC §5 (Tier B) in fp64: the dither's per-token variance proxy and deterministic bias, the radius
that holds with probability 1 − δ_step, and the per-(layer, head, step) failure budget."""

from __future__ import annotations

import math

import numpy as np

from contract.constants import DITHER_BIAS_FACTOR

from .inputs import _as_np, _check_nonneg, _need_ndim, _wrap
from .rounding import _round_up_rel


def _dither_inputs(q, scales, softmax_scale):
    qa, sa = _as_np(q, "q"), _as_np(scales, "scales")
    _need_ndim(qa, 1, "q", "[..., d]")
    sc = _as_np(softmax_scale, "softmax_scale")
    if sc.ndim != 0 or not np.isfinite(sc):
        raise ValueError("softmax_scale: expected a finite scalar")
    _check_nonneg(sa, "scales")
    if sa.ndim == qa.ndim + 1 and sa.shape[-1] == qa.shape[-1]:
        per_channel = True  # [..., n, d]
    elif sa.ndim == qa.ndim:
        per_channel = False  # [..., n], one scale per token (and kv head)
    else:
        raise ValueError(
            f"scales: expected [..., n] (per token) or [..., n, d] (per channel) with the same leading "
            f"dimensions as q {qa.shape}, got {sa.shape}"
        )
    return qa, sa, float(sc), per_channel


def dither_variance_proxy(q, scales, softmax_scale):
    """SPEC §5: ``V_j = σ² Σ_i q_i² s_{j,i}² / 12``, one proxy per token (never averaged).

    ``q``: ``[..., d]``; ``scales``: ``[..., n]`` (one scale per token-head) or ``[..., n, d]``.
    Returns ``[..., n]``; NaN/Inf give ``+inf``.
    """
    qa, sa, sc, per_channel = _dither_inputs(q, scales, softmax_scale)
    with np.errstate(over="ignore", invalid="ignore"):
        if per_channel:
            V = sc * sc * np.sum(qa[..., None, :] ** 2 * sa**2, axis=-1) / 12.0
        else:
            V = sc * sc * np.sum(qa**2, axis=-1)[..., None] * sa**2 / 12.0
    V = np.where(np.isfinite(V), _round_up_rel(V), np.inf)
    return _wrap(V, q, scales)


def dither_bias_bound(q, scales, softmax_scale):
    """Deterministic part of the Tier B radius: ``|σ| Σ_i |q_i| s_{j,i} · DITHER_BIAS_FACTOR``.

    Covers what the real scheme adds to the ideal model of SPEC §5: the dither grid's mean
    offset, the fp32 quotient ``x/s`` and the fp32 reconstruction ``s (c − u)``. ``[..., n]``.
    """
    qa, sa, sc, per_channel = _dither_inputs(q, scales, softmax_scale)
    with np.errstate(over="ignore", invalid="ignore"):
        if per_channel:
            bias = abs(sc) * np.sum(np.abs(qa)[..., None, :] * sa, axis=-1)
        else:
            bias = abs(sc) * np.sum(np.abs(qa), axis=-1)[..., None] * sa
    bias = bias * DITHER_BIAS_FACTOR
    return _wrap(np.where(np.isfinite(bias), _round_up_rel(bias), np.inf), q, scales)


def dither_radius(variance_proxy, n: int, delta_step, bias=None):
    """SPEC §5: ``t_j = sqrt(2 V_j ln(2n / δ_step))`` (+ ``bias``, see ``dither_bias_bound``).

    For a query fixed independently of the dither, ``P(∃ j: |δ_j| > t_j) ≤ δ_step``.
    ``delta_step``: a probability, or an array of them broadcasting to ``variance_proxy[..., 0]``
    (one budget per query row: a chunk of L rows spends L budgets, never one).
    """
    Va = _as_np(variance_proxy, "variance_proxy")
    _check_nonneg(Va, "variance_proxy")
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n: expected a positive int (number of tokens in the union bound), got {n!r}")
    ds = _as_np(delta_step, "delta_step")
    if ds.size == 0 or not np.all((ds > 0) & (ds < 1)):
        raise ValueError(f"delta_step: expected probabilities in (0, 1), got {delta_step!r}")
    if ds.ndim:
        try:
            ds = np.broadcast_to(ds, Va.shape[:-1])[..., None]
        except ValueError:
            raise ValueError(f"delta_step with shape {ds.shape} does not broadcast to variance_proxy's rows {Va.shape[:-1]}") from None
    t = np.sqrt(2.0 * Va * np.log(2.0 * n / ds))
    if bias is not None:
        ba = _as_np(bias, "bias")
        _check_nonneg(ba, "bias")
        t = t + ba
    t = np.where(np.isfinite(t), _round_up_rel(t), np.inf)
    return _wrap(t, variance_proxy, *(() if bias is None else (bias,)))


def step_budget(delta_req: float, num_layers: int, num_heads: int, *, horizon: int | None = None, step: int | None = None) -> float:
    """Per-(layer, head, step) failure budget (SPEC §5), summing to ≤ ``delta_req`` over a request.

    Fixed horizon: ``δ_req / (L·H·T_max)``; anytime (``step`` t ≥ 1): ``δ_req·6/(π² t²)/(L·H)``.
    """
    if not (isinstance(delta_req, (int, float)) and 0 < delta_req < 1):
        raise ValueError(f"delta_req: expected a probability in (0, 1), got {delta_req!r}")
    for name, val in (("num_layers", num_layers), ("num_heads", num_heads)):
        if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name}: expected a positive int, got {val!r}")
    if (horizon is None) == (step is None):
        raise ValueError("step_budget: give exactly one of horizon= (fixed schedule) or step= (anytime schedule)")
    if horizon is not None:
        if not isinstance(horizon, (int, np.integer)) or isinstance(horizon, bool) or horizon < 1:
            raise ValueError(f"horizon: expected a positive int, got {horizon!r}")
        return float(delta_req) / (num_layers * num_heads * int(horizon))
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 1:
        raise ValueError(f"step: expected a positive int (1-based decode step), got {step!r}")
    return float(delta_req) * 6.0 / (math.pi**2 * float(step) ** 2) / (num_layers * num_heads)
