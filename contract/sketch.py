"""The residual sketch and the exact window (SPEC §2 as amended by issue 33): the facts the fp64
reference (``witcert.bounds``), the kernels (``kernels.write``, ``kernels.decode``) and the memory
accounting (``kernels.memory_accounting.bytes_per_token``) share. Pure data: no torch, no numpy.

**Residual sketch.** At write time each token's key residual r = k̂ − k (what the cache serves minus
the exact key) is quantized once more, to ``bits`` bits per coordinate over a range β_i:

    code_i = clamp(floor((r_i/β_i + 1)·L/2), 0, L − 1),   L = 2^bits
    r̃_i   = β_i·(2·code_i + 1 − L) / L                    (exact in fp32: β is an fp16 scale / 2 or an fp8
                                                            spacing, the factor a small odd integer / L)

β_i is the scheme's a-priori bound on |r_i| from what the cache stores anyway (half a scale step: int8
per token, int4_group per 32 channels, kivi2 per channel of a block; half an fp8 spacing), so the sketch
costs only its codes; a scheme without one (a user scheme) takes each token's own range, a stored
float16 ρ ≥ max|r_i|.

``codes_per_byte(bits)`` codes are packed per byte, byte i holding channels i + k·D/c (c codes per
byte) in bits k·b … k·b + b − 1 (kivi2's layout for b = 2). The sketch costs D·b/8 bytes per token and
kv head, on the key side only; it is never served, only metered.

**Weights.** A positive weight a_i per channel of a kv head (powers of two, equal on the two channels
of a RoPE band; from calibration queries, never from the request metered): the key witness is
W_j ≥ ‖(r_j − r̃_j)/a‖ (+ the kernel's dot allowance), the head factor c_h = |σ|·‖a⊙q_h‖. a = 1 is
plain Cauchy–Schwarz. Powers of two make q·a and r/a exact in floating point.

**Radius** (Lean ``WitCert.sketch_shared_radius_le``): for the GQ query heads h of a kv head,
u_j = max_h |σ⟨q_h, r̃_j⟩| / c_h (0 where c_h = 0), ε_hj = c_h·(W_j + u_j) ≥ |δ_hj|. It factors into
a head part c_h and a token part W_j + u_j, so the decode kernel bins tokens once per kv head. The per-head
radius ε_hj = c_h W_j + |σ⟨q_h, r̃_j⟩| (Lean ``WitCert.sketch_logit_error_le``) is the tighter one (every
u_hj ≤ u_j); the kernel bins it with one level per (token, head) when a cache asks (``PagedKV.head_levels``).

**Exact window.** The first ``sink`` and the last ``recent`` tokens of every sequence are served in
the model's dtype (radius 0, φ = 0); older tokens are served compressed.
"""

from __future__ import annotations

import operator

#: sketch widths the kernels and the reference implement (0: no sketch, r̃ = 0)
SKETCH_BITS = (0, 1, 2, 4)
#: the library's default sketch width (issue 33's measurement: bench/TIGHTNESS.md)
DEFAULT_SKETCH_BITS = 2
#: the default exact window (sink tokens, most recent tokens). (4, 32) since 2026-12-07: with ν, κ as page maxima it
#: stores 1.7006× bf16's tokens at 4K (issue 33's ≥ 1.7×); (4, 64) serves a 14 % lower real TV at 1.678× (bench/TIGHTNESS.md)
DEFAULT_WINDOW = (4, 32)
#: channel weights are powers of two in [2^-WEIGHT_EXP_MAX, 2^WEIGHT_EXP_MAX]
WEIGHT_EXP_MAX = 8
#: how a cache meters the sketch box (``WitCertCache(sketch_box=)``): "centred" |δ − σ⟨q_h, r̃⟩| ≤ c_h W (the reference
#: path), "symmetric" |δ| ≤ c_h (W + max_h |σ⟨q_h, r̃⟩| / c_h) (one level per token: the kernels' default), "per-head"
#: |δ| ≤ c_h W + |σ⟨q_h, r̃⟩| (one level per (token, head); both paths), "auto" (centred on the reference path;
#: on the kernel path per-head or symmetric by the scheme's ``contract.schemes`` ``kernel_head_levels``), "grid" the
#: centred box unbinned on the fixed (t, λ) grid of ``contract.constants`` (the reference path: a kernel's one-pass form)
SKETCH_BOXES = ("auto", "centred", "symmetric", "per-head", "grid")


def check_bits(bits) -> int:
    """``bits`` as an int in ``SKETCH_BITS`` (ValueError otherwise)."""
    try:
        b = operator.index(bits)
    except TypeError:
        b = None
    if b is None or isinstance(bits, bool) or b not in SKETCH_BITS:
        raise ValueError(f"sketch_bits: expected one of {SKETCH_BITS}, got {bits!r}")
    return int(b)


def check_window(window) -> tuple[int, int]:
    """``window`` as a (sink, recent) pair of non-negative ints (ValueError otherwise); None is (0, 0)."""
    if window is None:
        return (0, 0)
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in window)):
        raise ValueError(f"window: expected (sink, recent), two non-negative ints, or None; got {window!r}")
    return (int(window[0]), int(window[1]))


def codes_per_byte(bits: int) -> int:
    """Sketch codes stored per byte (8 // bits; 0 bits: none)."""
    return 8 // bits if bits else 0


def sketch_bytes_per_token(bits: int, head_dim: int, range_bytes: int = 0) -> float:
    """Bytes of one token's key sketch per kv head: its codes, plus ``range_bytes`` for a stored range
    (a float16 ρ per token: only schemes without an a-priori residual range, i.e. user schemes; the
    built-in ones derive β from their stored scales / codes, ``witcert.schemes.residual_range``)."""
    return head_dim * bits / 8 + range_bytes if bits else 0.0
