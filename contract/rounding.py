"""Directed rounding of non-negative values into a storage dtype (witnesses, scales): the result
is never below the input. Shared by the fp64 reference (``witcert.schemes``) and the kernels'
interpreter path (``kernels.write``)."""

from __future__ import annotations

import math

import torch


def round_up_f32(t: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor up to float32 (never below the input)."""
    t = t.to(torch.float64)
    f = t.to(torch.float32)
    low = f.to(torch.float64) < t
    return torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def round_up_to_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round non-negative values **up** into ``dtype`` (float32/float16/bfloat16/fp8 e4m3fn/e5m2).

    Values above the dtype's largest finite number become +inf (fp8 e4m3fn, which has no inf,
    stores NaN): both saturate the bounds downstream, never under-state them.
    """
    t64 = t.to(torch.float64)
    if torch.any(t64 < 0):
        raise ValueError("round_up_to_dtype: witnesses are non-negative")
    if dtype == torch.float32:
        return round_up_f32(t64)
    if dtype in (torch.float16, torch.bfloat16):
        f = t64.to(dtype)
        low = f.to(torch.float64) < t64
        bumped = (f.view(torch.int16) + 1).view(dtype)  # non-negative: next code = next value up
        out = torch.where(low, bumped, f)
        return torch.where(torch.isnan(t64), torch.full_like(out, float("nan")), out)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        fmax = float(torch.finfo(dtype).max)
        clamped = torch.clamp(t64, max=fmax)
        f = clamped.to(torch.float32).to(dtype)
        low = f.to(torch.float64) < clamped
        bits = f.view(torch.uint8)
        bumped = (bits + 1).view(dtype)  # non-negative fp8: the next code is the next value up
        out = torch.where(low, bumped, f)
        over = t64 > fmax
        bad = torch.tensor(float("nan") if dtype == torch.float8_e4m3fn else float("inf"), dtype=torch.float32).to(dtype)
        out = torch.where(over | torch.isnan(t64), bad.expand_as(out), out)
        return out
    raise ValueError(f"round_up_to_dtype: unsupported storage dtype {dtype}")


#: the scaled fp16 query of the int8 key dot (SPEC §7; ``kernels.decode`` F16_KEYS): each head's q is
#: multiplied by 2^e, e = clamp(QUERY_F16_TOP − ⌊log2 max|q|⌋, QUERY_F16_MIN_SHIFT, QUERY_F16_MAX_SHIFT), so its
#: largest entry lies in [2^14, 2^15) (fp16's largest finite value is 65504 < 2^16), then rounded to fp16
QUERY_F16_TOP = 14
#: the largest shift: the logits' 2^-e stays exact (|q·c| ≥ 2^-24 when nonzero, so |q·c|·2^-e ≥ 2^-124,
#: a normal fp32). A head whose largest |q| is under 2^(QUERY_F16_TOP − QUERY_F16_MAX_SHIFT) = 2^-86 does not
#: reach 2^14 and is flagged (its rounding is not covered by ``query_f16_rel``)
QUERY_F16_MAX_SHIFT = 100
#: the smallest shift: 2^e and 2^-e stay normal fp32 (⌊log2 max|q|⌋ ≤ 127)
QUERY_F16_MIN_SHIFT = -113


def query_f16_rel(head_dim: int) -> float:
    """The scaled fp16 query's share of the logit dot's γ (SPEC §7): q' = 2^e q with max |q'| in
    [2^14, 2^15). fp16's normal range holds every bf16 / fp16 value exactly, so only entries under 2^-14
    (fp16's subnormals) can round, each by ≤ 2^-14 even if flushed to 0: ‖Δq'‖ ≤ √D·2^-14 ≤ r‖q'‖ with
    r = √D·2^-28. The dot runs on q'' = q' + Δ: |fl⟨c, q''⟩ − ⟨c, q'⟩| ≤ γ‖c‖‖q''‖ + ‖c‖‖Δ‖ ≤
    ‖c‖‖q'‖(γ + r(1 + γ)) ≤ ‖c‖‖q'‖(γ + 2r) (γ < 1): the share is 2r (2^-e scales back exactly)."""
    return 2.0 * math.sqrt(head_dim) * 2.0 ** -(2 * QUERY_F16_TOP)


def scaled_f16_query(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference of the kernel's scaled fp16 query, per vector of q's last axis: (the exponent e
    [...], the query the dot uses, q'' / 2^e in float64 [..., D], and whether the vector is too small
    for the bound (max |q| > 0 but 2^e max |q| < 2^14) [...])."""
    q64 = q.to(torch.float64)
    qmax = q64.abs().amax(dim=-1)
    _, ex = torch.frexp(qmax)  # qmax = m·2^ex, m in [0.5, 1): ⌊log2 qmax⌋ = ex − 1 (0 → ex 0)
    flo = torch.where(qmax > 0, ex - 1, torch.full_like(ex, -127))
    e = torch.clamp(QUERY_F16_TOP - flo, QUERY_F16_MIN_SHIFT, QUERY_F16_MAX_SHIFT)
    scale = torch.pow(torch.tensor(2.0, dtype=torch.float64), e.to(torch.float64))
    q16 = (q64 * scale[..., None]).to(torch.float16).to(torch.float64) / scale[..., None]
    tiny = (qmax > 0) & (qmax * scale < 2.0**QUERY_F16_TOP)
    return e, q16, tiny
