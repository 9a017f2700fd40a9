"""The scheme ids and divisors of ``contract.schemes`` as Triton constexpr globals, for use inside
``@triton.jit`` code (``if SCHEME == INT4_GROUP_ID:`` is resolved at compile time).

Triton 3.x lets a jitted function read a module-level global only if it is an instance of
``tl.constexpr`` (``X = tl.constexpr(6)``; an annotation ``X: tl.constexpr = 6`` is refused);
under ``TRITON_INTERPRET=1`` they compare like the plain numbers they wrap.
"""

from __future__ import annotations

import triton.language as tl

from contract.schemes import INT4_GROUP, SCHEMES, kernel_id

NONE_ID = tl.constexpr(kernel_id("none"))
INT8_ID = tl.constexpr(kernel_id("int8"))
INT8_DITHER_ID = tl.constexpr(kernel_id("int8_dither"))
FP8_E4M3_ID = tl.constexpr(kernel_id("fp8_e4m3"))
FP8_E5M2_ID = tl.constexpr(kernel_id("fp8_e5m2"))
FP8_E4M3_SCALED_ID = tl.constexpr(kernel_id("fp8_e4m3_scaled"))
INT4_GROUP_ID = tl.constexpr(kernel_id("int4_group"))
KIVI2_ID = tl.constexpr(kernel_id("kivi2"))

#: fp8_e4m3_scaled: s = the smallest fp16 with s·448 ≥ max|x|
FP8_SCALED_DIVISOR = tl.constexpr(float(SCHEMES["fp8_e4m3_scaled"].divisor))
#: int4_group: s = the smallest fp16 with s·15 ≥ max − z (codes 0 … 15)
INT4_DIVISOR = tl.constexpr(float(SCHEMES["int4_group"].divisor))
#: kivi2: s = the smallest fp16 with s·3 ≥ max − z (codes 0 … 3), keys per channel of a page,
#: values per 32 channels of a token
KIVI2_DIVISOR = tl.constexpr(float(SCHEMES["kivi2"].divisor))
#: channels per int4_group scale / zero
GROUP = tl.constexpr(INT4_GROUP)

#: the fp8 residual ranges of the key sketch (``contract.schemes``: β = max(|x̂|·REL, s·FLOOR))
FP8_E4M3_RES_REL = tl.constexpr(SCHEMES["fp8_e4m3"].residual_rel)
FP8_E4M3_RES_FLOOR = tl.constexpr(SCHEMES["fp8_e4m3"].residual_floor)
FP8_E5M2_RES_REL = tl.constexpr(SCHEMES["fp8_e5m2"].residual_rel)
FP8_E5M2_RES_FLOOR = tl.constexpr(SCHEMES["fp8_e5m2"].residual_floor)
