"""Input plumbing of the fp64 reference (``witcert.bounds``): arrays of either library read as float64
numpy, results given back in the caller's library type, and the shared validation of shapes,
signs, probability vectors and attention masks (every message names the argument)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: a probability vector must sum to 1 within this (it is then renormalised).
PROB_SUM_TOL = 1e-4


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

            # np.array(order="C") keeps a 0-d result 0-d (np.ascontiguousarray makes it shape (1,))
            return torch.from_numpy(np.array(result, order="C")).to(device=x.device)
    return result


def _dot_operands(q, x, scale, x_name: str, q_what: str, x_what: str, q_ndim: int = 1):
    """The operands of σ⟨q, x_j⟩ as float64: q (≥ ``q_ndim`` dims, ``q_what``), x ``[..., n, d]`` (``x_what``)
    with q's feature axis, and the scalar softmax scale as a float. ValueError names the argument."""
    qa = _as_np(q, "q")
    _need_ndim(qa, q_ndim, "q", q_what)
    xa = _as_np(x, x_name)
    _need_ndim(xa, 2, x_name, x_what)
    if xa.shape[-1] != qa.shape[-1]:
        raise ValueError(f"{x_name}: feature axis {xa.shape[-1]} does not match q's {qa.shape[-1]}")
    sc = _as_np(scale, "scale")
    if sc.ndim != 0:
        raise ValueError("scale: expected a scalar softmax scale")
    return qa, xa, float(sc)


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
