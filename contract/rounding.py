"""Directed rounding of non-negative values into a storage dtype (witnesses, scales): the result
is never below the input. Shared by the fp64 reference (``witcert.schemes``) and the kernels'
interpreter path (``kernels.write``)."""

from __future__ import annotations

import torch


def round_up_f32(t: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor up to float32 (never below the input)."""
    t = t.to(torch.float64)
    f = t.to(torch.float32)
    low = f.to(torch.float64) < t
    return torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def round_up_to_dtype(t: torch.Tensor, dtype: torch.dtype, check: bool = True) -> torch.Tensor:
    """Round non-negative values **up** into ``dtype`` (float32/float16/bfloat16/fp8 e4m3fn/e5m2).

    Values above the dtype's largest finite number become +inf (fp8 e4m3fn, which has no inf,
    stores NaN): both saturate the bounds downstream, never under-state them. ``check``: raise on a
    negative value (a host synchronisation on a GPU tensor; a caller whose values are norms, non-negative
    by construction, passes False to stay sync-free, e.g. SGLang's record step inside a CUDA graph).
    """
    t64 = t.to(torch.float64)
    if check and torch.any(t64 < 0):
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


def saturate(x: torch.Tensor, code_max: float) -> torch.Tensor:
    """x clipped to [−code_max, code_max], NaN kept (``contract.schemes`` ``code_max``): the raw fp8 casts saturate on
    every path, here for the reference and the interpreter's precoded codes, on sm_90 by the GPU's own satfinite cast
    (``kernels.write._fp8_codes``, which says what differs below), whatever torch's own cast does out of range."""
    return torch.where(x > code_max, code_max, torch.where(x < -code_max, -code_max, x))


def fp8_codes(x: torch.Tensor, code_dtype: torch.dtype, code_max: float, divisor: float | None = None):
    """The codes of an fp8 scheme for rows ``x`` [..., D]: (codes in ``code_dtype``, the per-token scale [..., 1] float32
    or None). ``divisor`` None: a raw cast; else the scale is the smallest float16 with s·divisor ≥ max|x| and the codes
    are x / s. Either way saturated at ``code_max`` before torch's cast (``saturate``). The one definition the
    reference (``witcert.schemes``) and the interpreter's precoded codes (``kernels.interpret``) share; the GPU write
    kernel computes the same on sm_90 (``kernels.write._fp8_codes``)."""
    xf = x.to(torch.float32)
    s = None
    if divisor is not None:
        s = round_up_to_dtype(xf.abs().amax(dim=-1, keepdim=True).to(torch.float64) / divisor, torch.float16).to(
            torch.float32)
        xf = xf / torch.where(s > 0, s, torch.ones_like(s))
    return saturate(xf, code_max).to(code_dtype), s
