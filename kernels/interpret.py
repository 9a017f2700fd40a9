"""Triton's interpreter (the kernels on the CPU): whether it runs, and what the write path does differently there.

    INTERPRET                    Triton's own knob, read at import (as its ``@jit`` decides for the kernels' modules)
    INTERPRET_TILE_TOKENS        tokens a write program takes there (the interpreter's time grows with the tile count)
    torch_fp8_codes(scheme, x)   the fp8 codes torch makes for the write kernel to load (the interpreter's float → fp8
                                 cast is wrong): saturated at the format's largest code, as the GPU kernel's own cast
    f32(x)                       (``@triton.jit``) x as float32, a bf16 x widened by its bits: exact on the GPU and in
                                 the interpreter, whose own bf16 → float32 conversion flushes subnormals (0x0001 → 0);
                                 in the interpreter an fp8 x decoded from its bits (its own cast reads e4m3's NaN code
                                 as 480 and e5m2's ±inf / NaN codes as finite, as the GPU does not)
    f16(x)                       (``@triton.jit``) x as float16; in the interpreter an fp8_e5m2 x by its bits (the upper
                                 byte of an fp16: exact), where the interpreter's own cast flushes the subnormal codes
    narrow(x, P)                 (``@triton.jit``) float32 x rounded to nearest-even into P's element type; a bf16 P in
                                 the interpreter by the bits (its own float32 → bf16 cast truncates, 1 + 3·2^-9 → 1,
                                 garbles subnormals, 0x1f → 0x78, and turns a NaN of low mantissa bits into ±inf)
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
#: tokens a write program takes in the interpreter (``write_kv``, ``ExactWindow.write``): it runs a program's ops once per
#: tile, so longer tiles take less time (64 tokens: 3.6× less than 4); on the GPU each launch keeps its own
INTERPRET_TILE_TOKENS = 64


#: (the flag as the kernels' helpers read it: a compile-time branch, so the GPU's code is the plain casts)
_INTERP = tl.constexpr(INTERPRET)
#: the bf16 bits of a quiet NaN
_QNAN16 = tl.constexpr(0x7FC0)


@triton.jit
def f32(x):
    """``x`` as float32; a bf16 ``x`` widened by its bits (int16 → int32 << 16), which is exact everywhere: the
    interpreter's own conversion flushes bf16 subnormals, so a kernel reading model-dtype K / V there (the exact
    window's ring, a repaired page, scheme none's codes, the write's input, a bf16 query) would compute with other
    values than those stored, below a bound that takes them as exact (reviews of 2026-12-07). In the interpreter an
    fp8 ``x`` is decoded from its bits too: its own cast reads e4m3's NaN code 0x7f as 480 and e5m2's ±inf / NaN codes
    as ±65536 … 114688, finite values the GPU never serves (2026-12-07, every code checked against torch)."""
    if x.dtype.is_bf16():
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    if _INTERP:
        if x.dtype.is_fp8e5():
            return f16(x).to(tl.float32)
        if x.dtype.is_fp8e4nv():
            return _e4m3_f32(x)
    return x.to(tl.float32)


@triton.jit
def _e4m3_f32(x):
    """fp8_e4m3fn codes as float32 from their bits (interpreter only): sign, 4 exponent bits of bias 7 (0: subnormal,
    m/8·2^-6), 3 mantissa bits; 0x7f / 0xff NaN, no infinity. Each step is exact in float32."""
    u = x.to(tl.uint8, bitcast=True).to(tl.int32)
    e = (u >> 3) & 15
    m = (u & 7).to(tl.float32)
    mag = tl.where(e == 0, m * 0.001953125, (8.0 + m) * 0.125 * tl.exp2((e - 7).to(tl.float32)))
    mag = tl.where((e == 15) & (m == 7.0), float("nan"), mag)
    return (mag.to(tl.int32, bitcast=True) | ((u >> 7) << 31)).to(tl.float32, bitcast=True)  # (the sign bit: −0 too)


@triton.jit
def f16(x):
    """``x`` as float16; an fp8_e5m2 ``x`` in the interpreter by its bits (e5m2 is an fp16's upper byte: exact, ±inf and
    NaN kept), where the interpreter's own cast flushes the subnormal codes (0x01 → 0, 0x03 → 3.05e-5 for 4.58e-5)."""
    if _INTERP:
        if x.dtype.is_fp8e5():
            return (x.to(tl.uint8, bitcast=True).to(tl.int16) << 8).to(tl.float16, bitcast=True)
    return x.to(tl.float16)


@triton.jit
def narrow(x, P):
    """float32 ``x`` rounded to nearest-even into ``P``'s element type (the store's); a bf16 target in the interpreter
    by the bits (+0x7fff + the kept lsb, then the upper half; NaN a quiet NaN), where the interpreter's own cast
    truncates (Triton 3.7.1: 1 + 3·2^-9 → 1 where torch rounds to 1 + 2^-7), garbles subnormals (0x0001 → 0, 0x001f →
    0x0078) and makes a NaN of low mantissa bits ±inf: a stored value other than the one the kernel computed with."""
    if _INTERP:
        if P.dtype.element_ty.is_bf16():
            u = x.to(tl.int32, bitcast=True)
            r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
            r = tl.where(x != x, _QNAN16, r)
            return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return x.to(P.dtype.element_ty)


def torch_fp8_codes(scheme: str, x: torch.Tensor) -> torch.Tensor:
    """The codes of an fp8 scheme (``contract.schemes`` row) for rows ``x``, as the GPU write kernel makes them
    (``contract.rounding.fp8_codes``, the reference's own)."""
    row = SCHEMES[scheme]
    return fp8_codes(x, getattr(torch, row.code_dtype), row.code_max, row.divisor)[0].contiguous()
