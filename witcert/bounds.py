"""fp64 reference of every WitCert formula (SPEC.md §1–§5, §7).

This module is the oracle the kernels, the proofs bridge and the integrations are checked
against. Everything is computed in float64 with numpy; inputs may be numpy arrays or torch
tensors of any float dtype, and the result has the input's library type (a torch input gives
a float64 tensor on the input's device).

Conventions
-----------
* Per-token quantities (``p_hat``, radii, value witnesses) have the **token axis last**.
* Vectors (queries, keys, values) have the **feature axis last**: ``q`` is ``[..., d]``,
  ``k`` / ``k_hat`` / ``v`` / ``v_hat`` are ``[..., n, d]``.
* Leading dimensions broadcast with numpy rules.
* Masking comes from ``mask`` (bool, True = attended), never from ``p_hat == 0``: a masked token
  is in no sum and no maximum. An attended token given ``p_hat == 0`` is taken at its word
  (exact p̂ = 0 means exact p = 0, since p is a tilt of p̂, SPEC §0) -- but a p̂ that came out of
  a floating-point softmax can have underflowed while its exact probability is large, so
  callers holding served **logits** use ``tv_bound_parts_logits`` (log domain, SPEC §7).

Floating point (SPEC §7)
------------------------
Witnesses and radii are rounded **up** by the relative slack ``FP64_REL_SLACK`` and one more
ulp (``_round_up``: the subnormal range, where a relative slack rounds away), and norms are
taken with the vector scaled by its largest entry first (``_safe_norm``), so neither squaring
nor a product can underflow a nonzero residual into a zero witness or radius; TV bounds get
``FP64_ABS_SLACK`` added. ``dot_rounding_radius`` bounds the rounding of a served logit
σ⟨q, k̂⟩ computed with unit roundoff u (fp64 here, fp32 in the kernels); callers add it to ε. Inside the dual-grid bound (§3(c)) the
rounding error of each dual value is bounded explicitly (``_dual_values``) and subtracted, so a
huge dual multiplier λ (tiny β) can never turn cancellation into an unsound bound.

NaN / Inf in the inputs of a bound give the saturated bound (1 for TV, +inf for an output or
logit radius) -- never 0, never NaN. Malformed inputs raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from contract.bands import _bands, _check_rope_dims, group_slices  # noqa: F401 (group_slices re-exported)
from contract.constants import DITHER_BIAS_FACTOR, DITHER_RESOLUTION_BITS  # noqa: F401 (re-exported)

__all__ = [
    "FP64_REL_SLACK",
    "FP64_ABS_SLACK",
    "PROB_SUM_TOL",
    "TILT_DEFAULT_TOL",
    "DITHER_RESOLUTION_BITS",
    "DITHER_BIAS_FACTOR",
    "group_slices",
    "group_norms",
    "rope",
    "key_witness",
    "value_witness",
    "logit_radius",
    "tv",
    "tv_bound_tanh",
    "tv_bound_eform",
    "tv_bound_tilt",
    "tv_bound",
    "tv_bound_parts",
    "tv_bound_parts_logits",
    "tv_bound_logits",
    "tv_sup_bruteforce",
    "dot_rounding_radius",
    "sketch_encode",
    "sketch_decode",
    "sketch_witness",
    "sketch_radius",
    "window_mask",
    "output_error_bound",
    "dither_variance_proxy",
    "dither_bias_bound",
    "dither_radius",
    "step_budget",
    "round_levels",
]

#: relative round-up applied to fp64 witnesses and radii (covers fp64 norm/dot rounding).
FP64_REL_SLACK = 2.0**-40
#: absolute slack added to every fp64 TV bound.
FP64_ABS_SLACK = 2.0**-40
#: a probability vector must sum to 1 within this (it is then renormalised).
PROB_SUM_TOL = 1e-4
#: default branch-and-bound tolerance of the dual-grid tilt bound (SPEC §3(c)).
TILT_DEFAULT_TOL = 2.0**-12

_EPS64 = np.finfo(np.float64).eps


# --------------------------------------------------------------------------- plumbing


def _is_torch(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def _as_np(x: Any, name: str) -> np.ndarray:
    """float64 numpy copy of ``x`` (numpy, torch, scalar or nested sequence)."""
    if _is_torch(x):
        import torch

        t = x.detach()
        if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16)):
            raise ValueError(f"{name}: unsupported tensor dtype {t.dtype}")
        return t.to(device="cpu", dtype=torch.float64).numpy()
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - defensive
        raise ValueError(f"{name}: cannot be read as an array ({exc})") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=True)


def _wrap(result: np.ndarray, *inputs: Any):
    """Return ``result`` in the library type of the first torch input (if any)."""
    for x in inputs:
        if _is_torch(x):
            import torch

            return torch.from_numpy(np.ascontiguousarray(result)).to(device=x.device)
    return result


def _need_ndim(arr: np.ndarray, ndim: int, name: str, what: str) -> None:
    if arr.ndim < ndim:
        raise ValueError(f"{name}: expected at least {ndim} dimension(s) ({what}), got shape {arr.shape}")


def _broadcast(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray):
    try:
        return np.broadcast_arrays(a, b)
    except ValueError:
        raise ValueError(f"{name_a} with shape {a.shape} does not broadcast with {name_b} with shape {b.shape}") from None


def _check_nonneg(arr: np.ndarray, name: str) -> None:
    if np.any(arr < 0):  # NaN compares False: NaN is handled by saturation, not here
        raise ValueError(f"{name}: must be >= 0 (found {float(np.nanmin(arr))})")


def _check_prob(p: np.ndarray, name: str) -> np.ndarray:
    """Validate a probability vector (token axis last); return the row-finite mask [...]."""
    if p.ndim < 1 or p.shape[-1] == 0:
        raise ValueError(f"{name}: expected a non-empty token axis (last), got shape {p.shape}")
    finite = np.all(np.isfinite(p), axis=-1)
    pf = np.where(finite[..., None], p, 0.0)
    if np.any(pf < 0):
        raise ValueError(f"{name}: probabilities must be >= 0 (found {float(pf.min())})")
    sums = pf.sum(axis=-1)
    bad = finite & (np.abs(sums - 1.0) > PROB_SUM_TOL)
    if np.any(bad):
        raise ValueError(
            f"{name}: probabilities must sum to 1 along the last axis within {PROB_SUM_TOL} "
            f"(found a row summing to {float(sums[bad].flat[0])})"
        )
    return finite


def _round_up_rel(x: np.ndarray) -> np.ndarray:
    """x·(1 + FP64_REL_SLACK), then one ulp up where x > 0: never below x, also in the
    subnormal range (where a relative slack rounds back down to x). 0, inf and NaN stay."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        up = x * (1.0 + FP64_REL_SLACK)
    return np.where((x > 0) & np.isfinite(x), np.nextafter(up, np.inf), x)


def _safe_norm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """‖x‖₂ along ``axis`` without under/overflow: m·sqrt(Σ (x/m)²), m = max|x| (SPEC §7).
    Not yet rounded up; ≥ m (never 0 for a nonzero x); NaN/Inf propagate."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        m = np.max(np.abs(x), axis=-1, keepdims=True)
        fin = np.isfinite(m) & (m > 0)
        mm = np.where(fin, m, 1.0)
        scaled = np.where(fin, x / mm, 0.0)
        nrm = np.sqrt(np.sum(scaled * scaled, axis=-1, keepdims=True)) * mm
        nrm = np.where(fin, np.maximum(nrm, m), 0.0)
        nrm = np.where(np.any(np.isinf(x), axis=-1, keepdims=True), np.inf, nrm)
        nrm = np.where(np.any(np.isnan(x), axis=-1, keepdims=True), np.nan, nrm)
    return nrm[..., 0]


# --------------------------------------------------------------------------- §1 bands, groups


def _check_groups(groups: Sequence[Any], d: int, name: str = "groups") -> list[np.ndarray]:
    if isinstance(groups, np.ndarray) or not isinstance(groups, (list, tuple)) or len(groups) == 0:
        raise ValueError(f"{name}: expected a non-empty list of index arrays (see group_slices)")
    gs = [np.asarray(g, dtype=np.int64).reshape(-1) for g in groups]
    allidx = np.concatenate(gs)
    if allidx.size != d or not np.array_equal(np.sort(allidx), np.arange(d)):
        raise ValueError(f"{name}: the groups must partition the {d} feature coordinates exactly")
    return gs


def _group_norms_np(x: np.ndarray, gs: list[np.ndarray]) -> np.ndarray:
    """Group norms, scaled before squaring and rounded up (``_safe_norm``, ``_round_up_rel``)."""
    return _round_up_rel(np.stack([_safe_norm(x[..., g], axis=-1) for g in gs], axis=-1))


def group_norms(x, groups):
    """``‖x[g]‖₂`` for every group: ``[..., d] -> [..., G]``, rounded up (never below the
    exact norm, never 0 for a nonzero x[g], whatever its magnitude)."""
    xa = _as_np(x, "x")
    _need_ndim(xa, 1, "x", "feature axis last")
    gs = _check_groups(groups, xa.shape[-1])
    return _wrap(_group_norms_np(xa, gs), x)


def rope(x, positions, theta: float = 10000.0, layout: str = "half", rotary_dim: int | None = None):
    """Reference rotary embedding: ``x`` is ``[..., n, d]``, ``positions`` broadcasts to ``[..., n]``.

    Band b (frequency ``theta ** (-2b / r)``) is rotated by ``position * freq``; coordinates at or
    above ``rotary_dim`` are left unchanged (partial rotary).
    """
    xa = _as_np(x, "x")
    _need_ndim(xa, 2, "x", "[..., n, d]")
    pos = _as_np(positions, "positions")
    if not np.all(np.isfinite(pos)):
        raise ValueError("positions: must be finite")
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0):
        raise ValueError(f"theta: expected a positive finite number, got {theta!r}")
    d = xa.shape[-1]
    _, r = _check_rope_dims(d, rotary_dim)
    try:
        pos = np.broadcast_to(pos, xa.shape[:-1])
    except ValueError:
        raise ValueError(f"positions with shape {pos.shape} does not broadcast to x.shape[:-1] = {xa.shape[:-1]}") from None
    half = r // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / max(r, 1))
    ang = pos[..., None] * inv_freq  # [..., n, half]
    c, s = np.cos(ang), np.sin(ang)
    out = xa.copy()
    if layout == "half":
        x1, x2 = xa[..., :half], xa[..., half:r]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:r] = x2 * c + x1 * s
    elif layout == "interleaved":
        x1, x2 = xa[..., 0:r:2], xa[..., 1:r:2]
        out[..., 0:r:2] = x1 * c - x2 * s
        out[..., 1:r:2] = x2 * c + x1 * s
    else:
        raise ValueError(f"layout: expected 'half' or 'interleaved', got {layout!r}")
    return _wrap(out, x)


def _check_block_size(block_size: Any) -> int:
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    return int(block_size)


def _block_max(per_token: np.ndarray, block_size: int, axis: int) -> np.ndarray:
    """Max over blocks of ``block_size`` along ``axis`` (the token axis); NaN propagates."""
    per_token = np.moveaxis(per_token, axis, -1)
    n = per_token.shape[-1]
    nb = -(-n // block_size)
    pad = nb * block_size - n
    if pad:
        per_token = np.concatenate([per_token, np.zeros(per_token.shape[:-1] + (pad,))], axis=-1)
    blocks = per_token.reshape(per_token.shape[:-1] + (nb, block_size))
    mx = np.max(blocks, axis=-1)  # np.max propagates NaN
    return np.moveaxis(mx, -1, axis)


def _exact_and_served(x, x_hat, name: str):
    """Validate an exact/served pair ``[..., n, d]`` (same n, d; leading dims broadcast)."""
    xa, xh = _as_np(x, name), _as_np(x_hat, name + "_hat")
    _need_ndim(xa, 2, name, "[..., n, d]")
    _need_ndim(xh, 2, name + "_hat", "[..., n, d]")
    if xa.shape[-2:] != xh.shape[-2:]:
        raise ValueError(f"{name}_hat: shape {xh.shape} does not match {name} {xa.shape} in the last two axes [n, d]")
    return _broadcast(name, xa, name + "_hat", xh)


def key_witness(k, k_hat, groups, block_size: int = 16):
    """Key witnesses ``W[..., block, g] = max_{j in block} ‖(k̂_j - k_j)[g]‖`` (SPEC §1).

    ``k``, ``k_hat``: ``[..., n, d]``. Returns ``[..., num_blocks, G]``, rounded up by
    ``FP64_REL_SLACK``; a non-finite residual gives a NaN/Inf witness (saturates later bounds).
    """
    ka, kh = _exact_and_served(k, k_hat, "k")
    bs = _check_block_size(block_size)
    gs = _check_groups(groups, ka.shape[-1])
    norms = _group_norms_np(kh - ka, gs)  # [..., n, G], rounded up
    w = _block_max(norms, bs, axis=-2)
    return _wrap(w, k, k_hat)


def value_witness(v, v_hat, block_size: int = 16):
    """Value witnesses ``φ[..., block] = max_{j in block} ‖v̂_j - v_j‖`` (SPEC §1): ``[..., num_blocks]``."""
    va, vh = _exact_and_served(v, v_hat, "v")
    bs = _check_block_size(block_size)
    norms = _round_up_rel(_safe_norm(vh - va, axis=-1))
    return _wrap(_block_max(norms, bs, axis=-1), v, v_hat)


def logit_radius(q, key_witness, groups, scale, block_size: int = 16, n: int | None = None):
    """Tier A radius per token (SPEC §2): ``ε_j = |σ| · Σ_g ‖q[g]‖ · W[B(j), g] ≥ |δ_j|``.

    ``q``: ``[..., d]``; ``key_witness``: ``[..., num_blocks, G]``; returns ``[..., n]`` with
    ``n = num_blocks * block_size`` unless given. NaN/Inf anywhere gives ``+inf`` radii.
    """
    qa, wa = _as_np(q, "q"), _as_np(key_witness, "key_witness")
    _need_ndim(qa, 1, "q", "[..., d]")
    _need_ndim(wa, 2, "key_witness", "[..., num_blocks, G]")
    gs = _check_groups(groups, qa.shape[-1])
    if wa.shape[-1] != len(gs):
        raise ValueError(f"key_witness: last axis has {wa.shape[-1]} groups, but groups has {len(gs)}")
    _check_nonneg(wa, "key_witness")
    sc = _as_np(scale, "scale")
    if sc.ndim != 0:
        raise ValueError("scale: expected a scalar softmax scale")
    bs = _check_block_size(block_size)
    nb = wa.shape[-2]
    if n is None:
        n = nb * bs
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not (1 <= n <= nb * bs) or n <= (nb - 1) * bs:
        raise ValueError(f"n: expected an int in [{(nb - 1) * bs + 1}, {nb * bs}] for {nb} blocks of {bs}, got {n!r}")
    qn = _group_norms_np(qa, gs)  # [..., G], rounded up
    try:
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            terms = abs(float(sc)) * qn[..., None, :] * wa  # [..., nb, G]
    except ValueError:
        raise ValueError(f"q with shape {qa.shape} does not broadcast with key_witness with shape {wa.shape}") from None
    # a product of positive factors that underflowed to 0 is still a positive radius
    pos = (qn[..., None, :] > 0) & (wa > 0) & (float(sc) != 0.0)
    terms = np.where(pos & (terms == 0), np.nextafter(0.0, 1.0), terms)
    with np.errstate(over="ignore", invalid="ignore"):
        eps_blk = np.sum(terms, axis=-1)  # [..., nb]
    eps_blk = np.where(np.isfinite(eps_blk), eps_blk, np.inf)
    eps = np.repeat(eps_blk, bs, axis=-1)[..., :n]
    return _wrap(_round_up_rel(eps), q, key_witness)


def dot_rounding_radius(q, k_hat, scale, unit_roundoff: float = 2.0**-53):
    """Rounding of a served logit computed in floating point (SPEC §7): a d-term dot product
    with unit roundoff u is within ``γ_d Σ_i |q_i||k̂_{j,i}|`` of the exact one, γ_d = d·u/(1 − d·u)
    (recursive or blocked summation, any order), and the scaling by σ adds two more roundings:
    ``ρ_j = |σ| γ_{d+2} Σ_i |q_i||k̂_{j,i}|``, rounded up. Add it to ε_j (Tier A) or t_j
    (Tier B). ``q``: ``[..., d]``; ``k_hat``: ``[..., n, d]``; returns ``[..., n]``."""
    qa = _as_np(q, "q")
    ka = _as_np(k_hat, "k_hat")
    _need_ndim(qa, 1, "q", "[..., d]")
    _need_ndim(ka, 2, "k_hat", "[..., n, d]")
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"k_hat: feature axis {ka.shape[-1]} does not match q's {qa.shape[-1]}")
    sc = _as_np(scale, "scale")
    if sc.ndim != 0:
        raise ValueError("scale: expected a scalar softmax scale")
    if not (isinstance(unit_roundoff, (int, float)) and 0 < unit_roundoff < 1e-2):
        raise ValueError(f"unit_roundoff: expected a number in (0, 0.01), got {unit_roundoff!r}")
    d = qa.shape[-1] + 2
    if d * unit_roundoff >= 0.5:
        raise ValueError(f"unit_roundoff: d·u = {d * unit_roundoff} is too large for the γ_d bound")
    gamma = d * unit_roundoff / (1.0 - d * unit_roundoff)
    with np.errstate(over="ignore", invalid="ignore"):
        mag = np.einsum("...d,...nd->...n", np.abs(qa), np.abs(ka))
        out = abs(float(sc)) * gamma * mag * (1.0 + 4 * qa.shape[-1] * _EPS64)
    out = np.where(np.isfinite(out), _round_up_rel(out), np.inf)
    return _wrap(out, q, k_hat)


# --------------------------------------------------------------------------- §2 residual sketch, window


def _round_up_f16(x: np.ndarray) -> np.ndarray:
    """The smallest float16 value ≥ x (x ≥ 0, float64), as float64; above 65504: +inf; NaN stays."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float16)
        low = f.astype(np.float64) < x
        f = np.where(low, np.nextafter(f, np.float16(np.inf)), f)
    return f.astype(np.float64)


def _check_sketch_bits(bits) -> int:
    from contract.sketch import check_bits

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


def sketch_radius(q, r_tilde, witness, scale, weights=None, shared: bool = True):
    """Tier A radius of the residual sketch (SPEC §2 as amended by issue 33; Lean
    ``WitCert.sketch_shared_radius_le``): for the query heads of one kv head, q ``[..., GQ, d]``, the
    tokens' sketches r̃ ``[..., n, d]`` (None: 0) and witnesses W ``[..., n]`` (``sketch_witness``),
    channel weights a ``[..., d]`` (None: 1) and softmax scale σ:

        c_h = |σ| ‖a⊙q_h‖,   u_j = max_h |σ⟨q_h, r̃_j⟩| / c_h,   ε_hj = c_h (W_j + u_j)   ≥ |σ⟨q_h, r_j⟩|

    (``shared=False``: u_hj = |σ⟨q_h, r̃_j⟩| / c_h per head, the tighter form; the kernels bin the shared
    one, one level per token for all the heads of a kv head). The fp64 dot ⟨q, r̃⟩ is covered
    explicitly (γ_{d+2}·‖r̃/a‖ added to W), c_h and ε are rounded up. Returns ε ``[..., GQ, n]``; NaN /
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
        dots = sig * np.einsum("...hd,...nd->...hn", qa, rt)  # [..., GQ, n]
        ratio = np.where(c[..., None] > 0, np.abs(dots) / np.where(c[..., None] > 0, c[..., None], 1.0), 0.0)
        ratio = _round_up_rel(ratio)
        u = np.max(ratio, axis=-2, keepdims=True) if shared else ratio
        wfull = wa + gamma * _round_up_rel(_safe_norm(rt / a[..., None, :], axis=-1))
        eps = c[..., None] * (wfull[..., None, :] + u)
        pos = (c[..., None] > 0) & ((wfull[..., None, :] + u) > 0)
        eps = np.where(pos & (eps == 0), np.nextafter(0.0, 1.0), eps)
        bad = ~np.isfinite(eps) | np.isnan(eps)
    eps = np.where(bad, np.inf, _round_up_rel(eps))
    return _wrap(eps, q, r_tilde, witness)


def window_mask(n: int, window) -> np.ndarray:
    """Which of a sequence's n tokens the exact window serves (bool ``[n]``): the first ``sink`` and
    the last ``recent`` of ``window = (sink, recent)`` (None: none). Their radius is 0 (δ_j = 0)."""
    from contract.sketch import check_window

    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n: expected a non-negative int, got {n!r}")
    sink, recent = check_window(window)
    j = np.arange(int(n))
    return (j < sink) | (j >= n - recent)


# --------------------------------------------------------------------------- §3 TV bounds


def tv(p, q):
    """Total variation ``½ Σ_j |p_j − q_j|`` along the last axis (both must be distributions)."""
    pa, qa = _as_np(p, "p"), _as_np(q, "q")
    if pa.shape[-1:] != qa.shape[-1:]:
        raise ValueError(f"q: last axis {qa.shape[-1:]} does not match p {pa.shape[-1:]}")
    pa, qa = _broadcast("p", pa, "q", qa)
    fp = _check_prob(pa, "p")
    fq = _check_prob(qa, "q")
    out = 0.5 * np.sum(np.abs(pa - qa), axis=-1)
    return _wrap(np.where(fp & fq, out, np.nan), p, q)


def _mask_np(mask, shape, name: str = "mask") -> np.ndarray:
    """Bool attention mask broadcast to ``shape`` (True = attended); None: all attended."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    if _is_torch(mask):
        ma = mask.detach().cpu().numpy()
    else:
        ma = np.asarray(mask)
    if ma.dtype != bool:
        raise ValueError(f"{name}: expected a boolean array (True = attended), got dtype {ma.dtype}")
    try:
        return np.broadcast_to(ma, shape)
    except ValueError:
        raise ValueError(f"{name} with shape {ma.shape} does not broadcast to {shape}") from None


def _prep_bound(p_hat, radius, *, need_p: bool = True, mask=None):
    """Shared validation for the §3 bounds: returns (p [..., n], eps [..., n], ok [...], live [..., n]).

    ``live`` is the mask (True = attended). Masked tokens must have p̂ = 0; their radii are
    ignored (0), NaN/Inf included. ``ok``: the row's attended inputs are finite."""
    ea = _as_np(radius, "radius")
    if ea.ndim < 1 or ea.shape[-1] == 0:
        raise ValueError(f"radius: expected a non-empty token axis (last), got shape {ea.shape}")
    _check_nonneg(ea, "radius")
    if not need_p:
        live = _mask_np(mask, ea.shape)
        ea = np.where(live, ea, 0.0)
        return None, ea, np.all(np.isfinite(ea), axis=-1), live
    pa = _as_np(p_hat, "p_hat")
    if pa.ndim < 1 or pa.shape[-1] != ea.shape[-1]:
        raise ValueError(f"radius: last axis {ea.shape[-1:]} must equal p_hat's token axis {pa.shape[-1:]}")
    pa, ea = _broadcast("p_hat", pa, "radius", ea)
    live = _mask_np(mask, pa.shape)
    if np.any(np.where(live, 0.0, np.nan_to_num(pa, nan=1.0)) != 0):
        raise ValueError("p_hat: a masked token (mask False) must have p_hat == 0")
    ea = np.where(live, ea, 0.0)
    okp = _check_prob(pa, "p_hat")
    ok = okp & np.all(np.isfinite(ea), axis=-1)
    return pa, ea, ok, live


def tv_bound_tanh(radius, mask=None):
    """SPEC §3(a): ``TV ≤ tanh(ε_max / 2)`` over the attended tokens (osc ≤ 2 ε_max). NaN/Inf → 1."""
    _, ea, ok, _ = _prep_bound(None, radius, need_p=False, mask=mask)
    emax = np.max(np.where(np.isfinite(ea), ea, 0.0), axis=-1)
    out = np.minimum(np.tanh(emax / 2.0) + FP64_ABS_SLACK, 1.0)
    return _wrap(np.where(ok, out, 1.0), radius)


def tv_bound_eform(p_hat, radius, mask=None):
    """SPEC §3(b): ``TV ≤ ½ (A² − 1)``, ``A = Σ_j p̂_j e^{ε_j}`` (capped at 1). NaN/Inf → 1."""
    pa, ea, ok, _ = _prep_bound(p_hat, radius, mask=mask)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.where(ok[..., None], pa, 0.0)
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300)
        A = np.sum(w * np.exp(np.where(ok[..., None] & (w > 0), ea, 0.0)), axis=-1)
        out = 0.5 * (A * A - 1.0) * (1.0 + 8 * ea.shape[-1] * _EPS64) + FP64_ABS_SLACK
    out = np.where(np.isfinite(out), np.minimum(out, 1.0), 1.0)
    return _wrap(np.where(ok, out, 1.0), p_hat, radius)


def round_levels(radius, levels):
    """Round radii **up** onto ``levels`` (increasing, ≥ 0); radii above the top level are
    rounded to the largest radius of their row (SPEC §3(c), the kernel's overflow bin)."""
    ea = _as_np(radius, "radius")
    lv = _as_np(levels, "levels").reshape(-1)
    if lv.size == 0 or not np.all(np.isfinite(lv)) or np.any(lv < 0) or np.any(np.diff(lv) <= 0):
        raise ValueError("levels: expected a non-empty, strictly increasing array of finite values >= 0")
    idx = np.searchsorted(lv, ea, side="left")
    over = idx >= lv.size
    rowmax = np.max(ea, axis=-1, keepdims=True) if ea.ndim else ea
    out = np.where(over, np.broadcast_to(rowmax, ea.shape), lv[np.minimum(idx, lv.size - 1)])
    return _wrap(out, radius)


def _dual_values(ts: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float):
    """For each t in ``ts``: a safe lower value of ``D(t, λ_t)`` with the tight λ (SPEC §3(c)).

    ``D(t, λ) = λ t m − Σ_k w_k (λ β_k(t) − 1)₊``, ``β_k(t) = (1−t) a_k + t b_k``. λ is
    ``1/β`` of the marginal item of the greedy fractional knapsack (β descending). The
    returned value is the float value minus a bound on its rounding error, so it never
    exceeds the exact ``D(t, λ)`` for the λ used -- and any λ ≥ 0 is sound.
    """
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]  # [T, K]
    order = np.argsort(-beta, axis=1, kind="stable")
    bs = np.take_along_axis(beta, order, axis=1)
    ws = w[order]
    cum = np.cumsum(ws * bs, axis=1)
    target = ts * m
    k = np.minimum(np.sum(cum < target[:, None], axis=1), bs.shape[1] - 1)
    bstar = bs[np.arange(ts.size), k]
    lam = 1.0 / bstar
    act = np.maximum(lam[:, None] * bs - 1.0, 0.0)
    D = lam * target - np.sum(ws * act, axis=1)
    # rounding-error bound: every term is computed with relative error <= c·eps, c <= 4K+16.
    mag = lam * target + np.sum(ws * (lam[:, None] * bs + 1.0) * (act > 0), axis=1) + 1.0
    err = (4.0 * bs.shape[1] + 16.0) * _EPS64 * mag
    return D - err, D


def _dual_at(ts: np.ndarray, lam: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float) -> np.ndarray:
    """A safe lower value of ``D(t, λ)`` for given λ per t (the float value minus its rounding bound)."""
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]
    act = np.maximum(lam[:, None] * beta - 1.0, 0.0)
    target = ts * m
    D = lam * target - np.sum(w[None, :] * act, axis=1)
    mag = lam * target + np.sum(w[None, :] * (lam[:, None] * beta + 1.0) * (act > 0), axis=1) + 1.0
    return D - (4.0 * beta.shape[1] + 16.0) * _EPS64 * mag


def _lambda_at(ts: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, m: float) -> np.ndarray:
    """The tight λ at each t (``_dual_values``' greedy knapsack)."""
    beta = (1.0 - ts)[:, None] * a[None, :] + ts[:, None] * b[None, :]
    order = np.argsort(-beta, axis=1, kind="stable")
    bs = np.take_along_axis(beta, order, axis=1)
    cum = np.cumsum(w[order] * bs, axis=1)
    k = np.minimum(np.sum(cum < (ts * m)[:, None], axis=1), bs.shape[1] - 1)
    return 1.0 / bs[np.arange(ts.size), k]


def _tilt_row(w: np.ndarray, eps: np.ndarray, tol: float, max_points: int) -> float:
    """The §3(c) bound of one row by branch and bound over intervals [t_i, t_{i+1}], each with the upper value
    max(t_i − D(t_i, λ_i), t_{i+1} − D(t_{i+1}, λ_i)) (λ_i tight at t_i; t − D(t, λ) is convex in t, so that is its
    maximum on the interval: Lean ``tilt_tv_le_dual_grid_endpoints``), splitting every interval whose upper value
    exceeds the best achievable value by more than ``tol``."""
    keep = w > 0
    w, eps = w[keep], eps[keep]
    if w.size <= 1 or float(eps.max()) == 0.0:
        return 0.0
    if float(eps.max()) > 700.0:  # e^ε overflows: the bound is saturated
        return 1.0
    w = w / w.sum()
    eu, inv = np.unique(eps, return_inverse=True)
    wu = np.bincount(inv.reshape(-1), weights=w, minlength=eu.size)
    a, b = np.exp(eu), np.exp(-eu)
    m = float(np.dot(wu, b))
    ts = np.linspace(0.0, 1.0, 33)
    dsafe, dval = _dual_values(ts, wu, a, b, m)
    lam = _lambda_at(ts, wu, a, b, m)

    def uppers(ts, dsafe, lam):
        right = ts[1:] - _dual_at(ts[1:], lam[:-1], wu, a, b, m)
        return np.minimum(np.maximum(ts[:-1] - dsafe[:-1], right), ts[1:])

    while True:
        upper = uppers(ts, dsafe, lam)
        best = float(np.max(ts - dval))  # achievable (fractional relaxation), up to rounding
        bad = np.nonzero(upper > best + tol)[0]
        if bad.size == 0 or ts.size + bad.size > max_points:
            break
        mids = 0.5 * (ts[bad] + ts[bad + 1])
        ms, mv = _dual_values(mids, wu, a, b, m)
        ts = np.concatenate([ts, mids])
        dsafe = np.concatenate([dsafe, ms])
        dval = np.concatenate([dval, mv])
        lam = np.concatenate([lam, _lambda_at(mids, wu, a, b, m)])
        o = np.argsort(ts, kind="stable")
        ts, dsafe, dval, lam = ts[o], dsafe[o], dval[o], lam[o]
    return float(min(1.0, max(0.0, float(np.max(uppers(ts, dsafe, lam)))) + FP64_ABS_SLACK))


def tv_bound_tilt(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, max_points: int = 1 << 15, mask=None):
    """SPEC §3(c): the dual-grid tilt bound, refined by branch and bound to within ``tol``.

    ``p_hat``, ``radius``: ``[..., n]``. With ``levels`` the radii are first rounded up onto
    them (``round_levels``) and p̂ mass is summed per level, exactly as a K-bin histogram.
    Sound for any grid; ``tol`` only controls tightness (the result is within ``tol`` of the
    fractional-relaxation supremum unless ``max_points`` grid points were not enough).
    """
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol: expected a positive finite number, got {tol!r}")
    pa, ea, ok, _ = _prep_bound(p_hat, radius, mask=mask)
    if levels is not None:
        ea = _as_np(round_levels(np.where(np.isfinite(ea), ea, 0.0), levels), "radius")
    flat_p = pa.reshape(-1, pa.shape[-1])
    flat_e = ea.reshape(-1, ea.shape[-1])
    flat_ok = ok.reshape(-1)
    out = np.ones(flat_ok.shape)
    for i in np.nonzero(flat_ok)[0]:
        out[i] = _tilt_row(flat_p[i], flat_e[i], float(tol), int(max_points))
    return _wrap(out.reshape(ok.shape), p_hat, radius)


def tv_bound_parts(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, mask=None):
    """The three §3 bounds ``(tanh, e-form, tilt)`` of ``tv_bound`` (each NaN/Inf → 1).

    ``p_hat`` is taken as exact; masking comes from ``mask`` only. For p̂ out of a
    floating-point softmax use ``tv_bound_parts_logits``."""
    pa, ea, ok, live = _prep_bound(p_hat, radius, mask=mask)
    parts = (tv_bound_tanh(ea, mask=live), tv_bound_eform(pa, ea, mask=live),
             tv_bound_tilt(pa, ea, levels=levels, tol=tol, mask=live))
    return tuple(_wrap(np.where(ok, _as_np(x, "bound"), 1.0), p_hat, radius) for x in parts)


def tv_bound(p_hat, radius, levels=None, tol: float = TILT_DEFAULT_TOL, mask=None):
    """The reported §3 bound: ``min(tanh, e-form, dual-grid tilt)``; NaN/Inf → 1."""
    a, b, c = (_as_np(x, "bound") for x in tv_bound_parts(p_hat, radius, levels=levels, tol=tol, mask=mask))
    return _wrap(np.minimum(np.minimum(a, b), c), p_hat, radius)


#: log p̂ below which a token's mass is not represented in the tilt's linear arithmetic: it is
#: accounted for by the underflow term of ``tv_bound_parts_logits`` instead (SPEC §7)
LOG_MASS_FLOOR = -700.0


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log Σ exp(x) along ``axis`` (−inf entries are empty; an all-empty row gives −inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        mf = np.where(np.isfinite(m), m, 0.0)
        s = np.sum(np.exp(x - mf), axis=axis, keepdims=True)
        with np.errstate(divide="ignore"):
            out = np.log(s) + mf
    return np.squeeze(out, axis=axis)


def tv_bound_parts_logits(logits, radius, mask=None, levels=None, tol: float = TILT_DEFAULT_TOL, tilt: bool = True):
    """The three §3 bounds ``(tanh, e-form, tilt)`` from served **logits** ŝ (SPEC §3, §7).

    ``logits``, ``radius``, ``mask``: ``[..., n]`` (mask True = attended; None: all). p̂ =
    softmax(ŝ) over the attended tokens is never formed where it could underflow:

    * tanh: ``tanh(ε_max/2)`` over every attended token, whatever its p̂;
    * e-form: ``log A = logsumexp(log p̂ + ε)`` in the log domain;
    * tilt: on the tokens with ``log p̂ ≥ LOG_MASS_FLOOR`` (set V), renormalised, plus the
      underflow term ``ρ = p̂(U) + Σ_U p̂_j e^{ε_j} / Σ_V p̂_j e^{−ε_j}`` for the rest U: with
      p' = p|V and p̂' = p̂|V (p' is the same tilt of p̂'), ``TV(p, p̂) ≤ TV(p', p̂') + p(U) + p̂(U)``
      and ``p(U) ≤ Σ_U p̂ e^{ε} / Σ p̂ e^{−ε}``. The fp64 error of exp(log p̂) (≤ (|log p̂| + 4)
      ulp relative) is added as ``2·η``.

    Non-finite attended logits or radii saturate (1). A row with no attended token gives 0.
    ``tilt=False`` skips (c) (reported as 1): the closed forms only, for long prefill chunks.
    """
    la = _as_np(logits, "logits")
    ea = _as_np(radius, "radius")
    if la.ndim < 1 or la.shape[-1] == 0:
        raise ValueError(f"logits: expected a non-empty token axis (last), got shape {la.shape}")
    if ea.shape[-1:] != la.shape[-1:]:
        raise ValueError(f"radius: last axis {ea.shape[-1:]} must equal the logits' token axis {la.shape[-1:]}")
    _check_nonneg(ea, "radius")
    la, ea = _broadcast("logits", la, "radius", ea)
    live = _mask_np(mask, la.shape)
    n = la.shape[-1]
    fl_l, fl_e, fl_live = la.reshape(-1, n), ea.reshape(-1, n), live.reshape(-1, n)
    out = np.ones((3, fl_l.shape[0]))
    for i in range(fl_l.shape[0]):
        out[:, i] = _parts_logits_row(fl_l[i], fl_e[i], fl_live[i], levels, float(tol), bool(tilt))
    shp = la.shape[:-1]
    return tuple(_wrap(out[k].reshape(shp), logits, radius) for k in range(3))


def tv_bound_logits(logits, radius, mask=None, levels=None, tol: float = TILT_DEFAULT_TOL):
    """``min(tanh, e-form, tilt)`` of ``tv_bound_parts_logits``."""
    a, b, c = (_as_np(x, "bound") for x in tv_bound_parts_logits(logits, radius, mask=mask, levels=levels, tol=tol))
    return _wrap(np.minimum(np.minimum(a, b), c), logits, radius)


def _parts_logits_row(s: np.ndarray, e: np.ndarray, live: np.ndarray, levels, tol: float, tilt: bool = True) -> np.ndarray:
    if not live.any():
        return np.zeros(3)
    s, e = s[live], e[live]
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(e))):
        return np.ones(3)
    emax = float(e.max())
    tanh = min(math.tanh(emax / 2.0) + FP64_ABS_SLACK, 1.0)
    if s.size == 1:
        return np.array([tanh, 0.0, 0.0])  # one token: p = p̂ = 1
    lp = s - _logsumexp(s)
    # e-form in the log domain; the rounding of logsumexp is bounded explicitly
    x = lp + e
    logA = float(_logsumexp(x))
    errA = (4.0 * s.size + 8.0 + 2.0 * float(np.max(np.abs(x))) + 2.0 * float(np.max(np.abs(s)))) * _EPS64
    with np.errstate(over="ignore"):
        A2 = math.exp(min(2.0 * (logA + errA), 700.0))
    eform = min(0.5 * (A2 - 1.0) + FP64_ABS_SLACK, 1.0)
    if not tilt:
        return np.array([tanh, eform, 1.0])
    # tilt on the represented tokens V, plus the underflow term for U
    if levels is not None:
        e = _as_np(round_levels(e, levels), "radius")
    V = lp >= LOG_MASS_FLOOR
    w = np.exp(lp[V])
    eta = (float(np.max(np.abs(lp[V]))) + 4.0 + 2.0 * float(np.max(np.abs(s)))) * _EPS64
    tilt = _tilt_row(w, e[V], tol, 1 << 15) + 2.0 * eta
    if not V.all():
        logm = float(_logsumexp(lp[V] - e[V]))
        log_rho = np.logaddexp(float(_logsumexp(lp[~V])), float(_logsumexp(lp[~V] + e[~V])) - logm)
        tilt += math.exp(min(float(log_rho) + 1e-12, 10.0))
    return np.array([tanh, eform, min(tilt, 1.0)])


def tv_sup_bruteforce(p_hat, radius, mask=None):
    """Exact ``sup TV(p, p̂)`` over the radius box by subset enumeration (n ≤ 16):
    ``max_S A_S / (A_S + C_S) − p̂(S)``, ``A_S = Σ_S p̂ e^{ε}``, ``C_S = Σ_{S^c} p̂ e^{−ε}``."""
    pa, ea, ok, _ = _prep_bound(p_hat, radius, mask=mask)
    n = pa.shape[-1]
    if n > 16:
        raise ValueError(f"p_hat: brute force enumerates 2^n subsets and supports n <= 16, got n = {n}")
    masks = ((np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1).astype(np.float64)  # [S, n]
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where(ok[..., None], ea, 0.0)
        p = np.where(ok[..., None], pa, 0.0)
        p = p / np.maximum(p.sum(axis=-1, keepdims=True), 1e-300)
        up, dn = p * np.exp(e), p * np.exp(-e)
        A = up @ masks.T
        C = dn @ (1.0 - masks).T
        P = p @ masks.T
        tS = np.where(A + C > 0, A / np.where(A + C > 0, A + C, 1.0), 0.0)
        sup = np.max(tS - P, axis=-1)
    sup = np.clip(sup, 0.0, 1.0)
    return _wrap(np.where(ok, sup, 1.0), p_hat, radius)


# --------------------------------------------------------------------------- §4 output bound


def output_error_bound(p_hat, v_hat, value_witness_per_token, tv_upper, mask=None):
    """SPEC §4: ``‖ô − o‖ ≤ TV⁺ (D_v + φ_max) + Σ_j p̂_j φ_j`` with ``D_v = 2 max_j ‖v̂_j‖``.

    ``p_hat``: ``[..., n]``; ``v_hat``: ``[..., n, d_v]``; ``value_witness_per_token``:
    ``[..., n]``; ``tv_upper``: ``[...]``; ``mask`` (True = attended, default all): maxima run
    over the attended tokens, never over ``p̂ > 0`` alone. Where p̂ came out of an fp64
    softmax, an attended token's mass may have underflowed below the smallest normal double:
    ``n · tiny · φ_max`` covers what Σ p̂ φ lost there.
    NaN/Inf anywhere attended (or TV⁺ ≥ 1 with an unbounded value) gives ``+inf``.
    """
    pa = _as_np(p_hat, "p_hat")
    va = _as_np(v_hat, "v_hat")
    fa = _as_np(value_witness_per_token, "value_witness_per_token")
    ta = _as_np(tv_upper, "tv_upper")
    if pa.ndim < 1 or va.ndim < 2 or va.shape[-2] != pa.shape[-1]:
        raise ValueError(f"v_hat: expected [..., n, d_v] with n = {pa.shape[-1:]} (p_hat's token axis), got {va.shape}")
    if fa.shape[-1:] != pa.shape[-1:]:
        raise ValueError(f"value_witness_per_token: last axis {fa.shape[-1:]} must equal p_hat's token axis {pa.shape[-1:]}")
    _check_nonneg(fa, "value_witness_per_token")
    _check_nonneg(ta, "tv_upper")
    okp = _check_prob(pa, "p_hat")
    with np.errstate(over="ignore", invalid="ignore"):
        nu = _round_up_rel(_safe_norm(va, axis=-1))  # [..., n]
        try:
            pa_b, nu_b, fa_b = np.broadcast_arrays(pa, nu, fa)
            live = _mask_np(mask, pa_b.shape)
            vmax = np.max(np.where(live, nu_b, 0.0), axis=-1)
            fmax = np.max(np.where(live, fa_b, 0.0), axis=-1)
            pf = np.sum(np.where(live, pa_b * fa_b, 0.0), axis=-1)
            pf = pf + np.sum(live, axis=-1) * np.finfo(np.float64).tiny * fmax
            finite_in = np.all(np.isfinite(np.where(live, nu_b + fa_b, 0.0)), axis=-1) & okp
            out = np.minimum(ta, 1.0) * (2.0 * vmax + fmax) + pf
            out, finite_in, ta_b = np.broadcast_arrays(out, finite_in, ta)
        except ValueError:
            raise ValueError("p_hat, v_hat, value_witness_per_token and tv_upper have incompatible leading shapes") from None
        out = _round_up_rel(out * (1.0 + 4 * pa.shape[-1] * _EPS64)) + FP64_ABS_SLACK
        out = np.where(finite_in & np.isfinite(ta_b) & np.isfinite(out), out, np.inf)
    return _wrap(out, p_hat, v_hat, value_witness_per_token, tv_upper)


# --------------------------------------------------------------------------- §5 Tier B


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
