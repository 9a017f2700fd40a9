"""Triton's interpreter (the kernels on the CPU): whether it runs, and what the write path does differently there.

    INTERPRET                    Triton's own knob, read at import (as its ``@jit`` decides for the kernels' modules)
    torch_fp8_codes(scheme, x)   the fp8 codes torch makes for the write kernel to load (the interpreter's float → fp8
                                 cast is wrong): saturated at the format's largest code, as the GPU kernel's own cast
    f32(x)                       (``@triton.jit``) x as float32, a bf16 x widened by its bits: exact on the GPU and in
                                 the interpreter, whose own bf16 → float32 conversion flushes subnormals (0x0001 → 0)
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from contract.rounding import fp8_codes
from contract.schemes import SCHEMES


def _interpret_knob() -> bool:
    """Whether Triton runs its interpreter: its own knob (``TRITON_INTERPRET`` = 1, true, on or yes), read when this
    module is imported, as Triton's ``@jit`` decides it for the kernels' modules (``"true"`` was taken for "off"
    here while Triton interpreted: the fp8 codes then came from the interpreter's cast; a review, 2026-12-06)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # (a Triton without knobs: its environment parse)
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


#: the kernels run in Triton's interpreter (the CPU path): every interpreter-only branch reads this one flag
INTERPRET = _interpret_knob()


@triton.jit
def f32(x):
    """``x`` as float32; a bf16 ``x`` widened by its bits (int16 → int32 << 16), which is exact everywhere: the
    interpreter's own conversion flushes bf16 subnormals, so a kernel reading model-dtype K / V there (the exact
    window's ring, a repaired page, scheme none's codes, the write's input, a bf16 query) would compute with other
    values than those stored, below a bound that takes them as exact (reviews of 2026-12-07)."""
    if x.dtype.is_bf16():
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


def torch_fp8_codes(scheme: str, x: torch.Tensor) -> torch.Tensor:
    """The codes of an fp8 scheme (``contract.schemes`` row) for rows ``x``, as the GPU write kernel makes them
    (``contract.rounding.fp8_codes``, the reference's own)."""
    row = SCHEMES[scheme]
    return fp8_codes(x, getattr(torch, row.code_dtype), row.code_max, row.divisor)[0].contiguous()
