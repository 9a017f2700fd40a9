"""SPEC §2 as amended by issue 33, in fp64: the residual sketch (encode, decode, its witness and its
shared radius over the query heads of a kv head) and the exact window's mask (radius 0)."""

from __future__ import annotations

import numpy as np

from contract.sketch import check_bits, check_window

from .inputs import _as_np, _check_nonneg, _dot_operands, _need_ndim, _wrap
from .rounding import _round_up_rel, _safe_norm, _underflow_abs


def _round_up_f16(x: np.ndarray) -> np.ndarray:
    """The smallest float16 value ≥ x (x ≥ 0, float64), as float64; above 65504: +inf; NaN stays."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float16)
        low = f.astype(np.float64) < x
        f = np.where(low, np.nextafter(f, np.float16(np.inf)), f)
    return f.astype(np.float64)


def _check_sketch_bits(bits) -> int:
    b = check_bits(bits)
    if b == 0:
        raise ValueError("bits: a sketch needs 1, 2 or 4 bits (0 means no sketch: r̃ = 0)")
    return b


def sketch_encode(r, bits: int, beta=None):
    """The residual sketch of ``r`` ``[..., n, d]`` (contract.sketch; SPEC §2 as amended by issue 33):
    ``(codes, beta)``, codes ``[..., n, d]`` int64 in [0, 2^bits), code_i = clamp(floor((r_i/β_i + 1)·L/2),
    0, L − 1). ``beta`` is the per-coordinate range: the scheme's a-priori bound on |r_i|
    (``witcert.schemes.residual_range``, from what the cache stores: no bytes of its own), broadcastable
    to r; None: the token's own range, the smallest float16 ≥ max_i |r_i| (returned ``[..., n, 1]``;
    stored as a float16 per token). β = 0 gives code 0 (r̃ = 0). Any β is sound: the witness is taken
    from the reconstruction, so a residual beyond β (a clamped code) only loosens the radius; a
    non-finite β gives r̃ = NaN / inf and a saturated witness."""
    ra = _as_np(r, "r")
    _need_ndim(ra, 2, "r", "[..., n, d]")
    L = 2 ** _check_sketch_bits(bits)
    if beta is None:
        with np.errstate(invalid="ignore"):
            amax = np.max(np.abs(ra), axis=-1, keepdims=True)
        ba = _round_up_f16(amax)
    else:
        ba = _as_np(beta, "beta")
        try:
            np.broadcast_shapes(ba.shape, ra.shape)
        except ValueError:
            raise ValueError(f"beta: shape {ba.shape} does not broadcast to r's {ra.shape}") from None
        if np.any(ba < 0):
            raise ValueError("beta: the residual range must be non-negative")
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ok = (ba > 0) & np.isfinite(ba)
        y = np.floor((ra / np.where(ok, ba, 1.0) + 1.0) * (L / 2))
        codes = np.clip(np.where(np.isfinite(y), y, 0.0), 0, L - 1)
    codes = np.where(ok, codes, 0).astype(np.int64)
    return _wrap(codes, r), _wrap(np.asarray(ba, dtype=np.float64), r, beta)


def sketch_decode(codes, beta, bits: int):
    """r̃ ``[..., n, d]`` = β·(2·code + 1 − L)/L (float64) from ``sketch_encode``'s output (β
    broadcasts: ``[..., n, 1]`` per token or ``[..., n, d]`` per coordinate)."""
    ca = _as_np(codes, "codes")
    ba = _as_np(beta, "beta")
    L = 2 ** _check_sketch_bits(bits)
    if np.any((ca < 0) | (ca >= L) | (ca != np.floor(ca))):
        raise ValueError(f"codes: expected integers in [0, {L})")
    with np.errstate(invalid="ignore"):
        return _wrap(ba * (2.0 * ca + 1.0 - L) / L, codes, beta)


def _check_weights(weights, d: int) -> np.ndarray:
    if weights is None:
        return np.ones(d)
    w = _as_np(weights, "weights")
    if w.shape[-1:] != (d,):
        raise ValueError(f"weights: expected a last axis of {d} channel weights, got shape {w.shape}")
    if not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError("weights: every channel weight must be positive and finite")
    return w


def sketch_witness(r, r_tilde=None, weights=None, dot_gamma: float = 0.0):
    """Key witness of the sketch radius: ``W_j ≥ ‖(r_j − r̃_j)/a‖ + dot_gamma·‖r̃_j/a‖`` ``[..., n]``,
    rounded up (``r_tilde`` None: r̃ = 0, the plain weighted witness ‖r/a‖; ``weights`` a ``[..., d]``,
    None: 1). ``dot_gamma`` is the relative rounding of the decode's fp32 dot ⟨q, r̃⟩ (the kernels pass
    ``kernels.fp_bounds.dot_gamma(D)``; 0 for an exact dot): |fl(⟨q, r̃⟩) − ⟨q, r̃⟩| ≤ γ Σ|q_i||r̃_i| ≤
    γ ‖a⊙q‖ ‖r̃/a‖, so the served u_j may be that much low and W carries it."""
    ra = _as_np(r, "r")
    _need_ndim(ra, 2, "r", "[..., n, d]")
    rt = np.zeros_like(ra) if r_tilde is None else _as_np(r_tilde, "r_tilde")
    if rt.shape[-1] != ra.shape[-1]:
        raise ValueError(f"r_tilde: feature axis {rt.shape[-1]} does not match r's {ra.shape[-1]}")
    a = _check_weights(weights, ra.shape[-1])
    if not (isinstance(dot_gamma, (int, float)) and 0 <= dot_gamma < 1):
        raise ValueError(f"dot_gamma: expected a number in [0, 1), got {dot_gamma!r}")
    with np.errstate(invalid="ignore", over="ignore"):
        e = _round_up_rel(_safe_norm((ra - rt) / a[..., None, :], axis=-1))
        t = _round_up_rel(_safe_norm(rt / a[..., None, :], axis=-1)) if dot_gamma else 0.0
        w = e + dot_gamma * t
    return _wrap(_round_up_rel(np.where(np.isnan(w), np.nan, w)), r, r_tilde)


def sketch_center(q, r_tilde, scale):
    """The centre of the centred sketch box (SPEC §3(c) as amended): ``c_hj = σ⟨q_h, r̃_j⟩`` ``[..., GQ, n]``
    in fp64, for q ``[..., GQ, d]`` and r̃ ``[..., n, d]``. With ``sketch_radius(..., centered=True)`` (whose
    witness carries this dot's rounding), ``|δ_hj − c_hj| ≤ ε_hj`` for δ = σ⟨q_h, r_j⟩ = served − exact logit."""
    qa, rt, sc = _dot_operands(q, r_tilde, scale, "r_tilde", "[..., GQ, d]", "[..., n, d]", q_ndim=2)
    with np.errstate(over="ignore", invalid="ignore"):
        c = sc * np.einsum("...hd,...nd->...hn", qa, rt)
    return _wrap(c, q, r_tilde)


def sketch_radius(q, r_tilde, witness, scale, weights=None, shared: bool = True, centered: bool = False):
    """Tier A radius of the residual sketch (SPEC §2 as amended by issue 33; Lean
    ``WitCert.sketch_shared_radius_le``): for the query heads of one kv head, q ``[..., GQ, d]``, the
    tokens' sketches r̃ ``[..., n, d]`` (None: 0) and witnesses W ``[..., n]`` (``sketch_witness``),
    channel weights a ``[..., d]`` (None: 1) and softmax scale σ:

        c_h = |σ| ‖a⊙q_h‖,   u_j = max_h |σ⟨q_h, r̃_j⟩| / c_h,   ε_hj = c_h (W_j + u_j)   ≥ |σ⟨q_h, r_j⟩|

    (``shared=False``: u_hj = |σ⟨q_h, r̃_j⟩| / c_h per head, the tighter form; the kernels bin the shared
    one, one level per token for all the heads of a kv head). ``centered=True``: u = 0, ε_hj = c_h W_j, the
    radius of the centred box ``|δ_hj − σ⟨q_h, r̃_j⟩| ≤ ε_hj`` (centre: ``sketch_center``; TV bound:
    ``tv_bound_parts_logits(..., center=)``). The fp64 dot ⟨q, r̃⟩ is covered
    explicitly (γ_{d+2}·‖r̃/a‖ added to W, and its subnormal products' absolute error (d + 2)(1 + |σ|)·2⁻¹⁰⁷⁴
    added to ε where r̃ ≠ 0), c_h and ε are rounded up. Returns ε ``[..., GQ, n]``; NaN /
    Inf anywhere give +inf radii."""
    qa = _as_np(q, "q")
    _need_ndim(qa, 2, "q", "[..., GQ, d]")
    wa = _as_np(witness, "witness")
    _need_ndim(wa, 1, "witness", "[..., n]")
    _check_nonneg(wa, "witness")
    d = qa.shape[-1]
    rt = np.zeros(wa.shape + (d,)) if r_tilde is None else _as_np(r_tilde, "r_tilde")
    _need_ndim(rt, 2, "r_tilde", "[..., n, d]")
    if rt.shape[-1] != d or rt.shape[-2] != wa.shape[-1]:
        raise ValueError(f"r_tilde: expected [..., n={wa.shape[-1]}, d={d}], got {rt.shape}")
    a = _check_weights(weights, d)
    sc = _as_np(scale, "scale")
    if sc.ndim != 0:
        raise ValueError("scale: expected a scalar softmax scale")
    sig = abs(float(sc))
    gamma = (d + 2) * 2.0**-53 / (1.0 - (d + 2) * 2.0**-53)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        c = _round_up_rel(sig * _safe_norm(qa * a[..., None, :], axis=-1))  # [..., GQ]
        if centered:  # the dot is the box's centre (``sketch_center``), not part of its radius
            u = 0.0
        else:
            dots = sig * np.einsum("...hd,...nd->...hn", qa, rt)  # [..., GQ, n]
            ratio = np.where(c[..., None] > 0, np.abs(dots) / np.where(c[..., None] > 0, c[..., None], 1.0), 0.0)
            ratio = _round_up_rel(ratio)
            u = np.max(ratio, axis=-2, keepdims=True) if shared else ratio
        wfull = wa + gamma * _round_up_rel(_safe_norm(rt / a[..., None, :], axis=-1))
        eps = c[..., None] * (wfull[..., None, :] + u)
        # the dot's subnormal products are off by an absolute amount, which no relative γ covers
        eps = eps + np.where(np.any(rt != 0, axis=-1), _underflow_abs(d, sig), 0.0)[..., None, :]
        pos = (c[..., None] > 0) & ((wfull[..., None, :] + u) > 0)
        eps = np.where(pos & (eps == 0), np.nextafter(0.0, 1.0), eps)
        bad = ~np.isfinite(eps) | np.isnan(eps)
    eps = np.where(bad, np.inf, _round_up_rel(eps))
    return _wrap(eps, q, r_tilde, witness)


def window_mask(n: int, window) -> np.ndarray:
    """Which of a sequence's n tokens the exact window serves (bool ``[n]``): the first ``sink`` and
    the last ``recent`` of ``window = (sink, recent)`` (None: none). Their radius is 0 (δ_j = 0)."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n: expected a non-negative int, got {n!r}")
    sink, recent = check_window(window)
    j = np.arange(int(n))
    return (j < sink) | (j >= n - recent)
