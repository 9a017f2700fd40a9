"""SPEC §4 in fp64: the bound on the attention output's error ‖ô − o‖ from the TV bound and the value
witnesses."""

from __future__ import annotations

import numpy as np

from contract.constants import store_rounding

from .inputs import _as_np, _check_nonneg, _check_prob, _mask_np, _wrap
from .rounding import _EPS64, FP64_ABS_SLACK, _round_up_rel, _safe_norm


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


def stored_output_error_bound(out_err, o, stored: str, computed: str = "float64"):
    """E⁺ of an output served in the float ``stored`` ("float32", "bfloat16", "float16") after it was computed as ``o``
    in ``computed`` (Lean ``WitCert.output_error_stored_le``; ``contract.constants.STORE_ROUNDING``): if ‖ô − o_exact‖ ≤
    ``out_err`` and each stored element is within rel·|ô_i| + abs of ô_i, the served output is within

        out_err + rel·‖ô‖₂ + abs·√D

    of o_exact (rounded up). ``o``: ``[..., D]``; ``out_err``: ``[...]``. +inf where an |ô_i| exceeds the stored dtype's
    largest finite value (it may store as ±inf) or anything is not finite; ``out_err`` unchanged where the store is
    exact (the same or a wider dtype)."""
    ea = _as_np(out_err, "out_err")
    oa = _as_np(o, "o")
    if oa.ndim < 1:
        raise ValueError("o: expected [..., D]")
    _check_nonneg(ea, "out_err")
    rel, ab, mx = store_rounding(stored, computed)
    if rel == 0.0:
        return _wrap(ea, out_err, o)
    d = oa.shape[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        nrm = _round_up_rel(_safe_norm(oa, axis=-1))
        try:
            out = ea + rel * nrm + ab * np.sqrt(d)
        except ValueError:
            raise ValueError(f"out_err {ea.shape} and o {oa.shape} have incompatible leading shapes") from None
        out = _round_up_rel(out * (1.0 + 4 * _EPS64))
        fits = np.all(np.isfinite(oa) & (np.abs(oa) <= mx), axis=-1)
        out = np.where(fits & np.isfinite(out), out, np.inf)
    return _wrap(out, out_err, o)
