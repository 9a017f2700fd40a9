"""Directed rounding of the fp64 reference (SPEC §7): the relative and absolute slacks, the round-up of
witnesses and radii (``_round_up_rel``: one ulp more, also in the subnormal range) and the norm taken
with the vector scaled by its largest entry first (``_safe_norm``: no under/overflow)."""

from __future__ import annotations

import numpy as np

#: relative round-up applied to fp64 witnesses and radii (covers fp64 norm/dot rounding).
FP64_REL_SLACK = 2.0**-40
#: absolute slack added to every fp64 TV bound.
FP64_ABS_SLACK = 2.0**-40
#: fp64 machine epsilon (2⁻⁵²): the unit of the explicit rounding-error bounds.
_EPS64 = np.finfo(np.float64).eps


def _underflow_abs(n_terms: int, sigma: float, unit_roundoff: float = 2.0**-53) -> float:
    """The absolute part of a dot product's rounding (SPEC §7): a product that lands in the subnormal range
    is off by up to half the smallest subnormal η, not by a relative u (fp64 η = 2⁻¹⁰⁷⁴; fp32 2⁻¹⁴⁹; a
    coarser unit roundoff takes fp16's 2⁻²⁴, the largest of the formats). For ``n_terms`` products, their
    sum and the scaling by σ: ≤ (n + 2)(1 + |σ|)·η. Negligible above the subnormal range; added so that the
    radius also covers a dot of subnormal products (found by the adversarial review of the centred box)."""
    eta = 2.0**-1074 if unit_roundoff <= 2.0**-53 else 2.0**-149 if unit_roundoff <= 2.0**-24 else 2.0**-24
    return (n_terms + 2) * (1.0 + abs(float(sigma))) * eta


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
