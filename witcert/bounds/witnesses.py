"""SPEC §1–§2 (Tier A) in fp64: group norms, the reference rotary embedding, the key and value witnesses
per block, the logit radius ε_j of the key witnesses and the rounding radius of a served logit
(SPEC §7)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from contract.bands import _check_rope_dims

from .inputs import _as_np, _broadcast, _check_nonneg, _dot_operands, _need_ndim, _wrap
from .rounding import _EPS64, _round_up_rel, _safe_norm, _underflow_abs


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
    qa, ka, sc = _dot_operands(q, k_hat, scale, "k_hat", "[..., d]", "[..., n, d]")
    if not (isinstance(unit_roundoff, (int, float)) and 0 < unit_roundoff < 1e-2):
        raise ValueError(f"unit_roundoff: expected a number in (0, 0.01), got {unit_roundoff!r}")
    d = qa.shape[-1] + 2
    if d * unit_roundoff >= 0.5:
        raise ValueError(f"unit_roundoff: d·u = {d * unit_roundoff} is too large for the γ_d bound")
    gamma = d * unit_roundoff / (1.0 - d * unit_roundoff)
    with np.errstate(over="ignore", invalid="ignore"):
        mag = np.einsum("...d,...nd->...n", np.abs(qa), np.abs(ka))
        out = abs(sc) * gamma * mag * (1.0 + 4 * qa.shape[-1] * _EPS64)
        out = out + _underflow_abs(qa.shape[-1], sc, unit_roundoff)  # subnormal products
    out = np.where(np.isfinite(out), _round_up_rel(out), np.inf)
    return _wrap(out, q, k_hat)
