"""Constants of the contract (SPEC §5) that the fp64 reference, the kernels and the proofs
bridge all read from here (never restated)."""

import math
import struct

#: the dither u takes 2**DITHER_RESOLUTION_BITS values, (2k+1)·2^-24 − ½ (see witcert.schemes).
DITHER_RESOLUTION_BITS = 23
#: per channel, |served residual − s·X| ≤ DITHER_BIAS_FACTOR · s, X the centred 2^23-point
#: uniform of proxy ≤ 1/12: the grid's mean offset (≤ 2^-24), the fp32 quotient y = x/s
#: (≤ 2 ulp of |y| ≤ 127: 2^-16), fp32 rounding of c − u (≤ 2^-18) and of s·(c − u)
#: (≤ 2^-24·128 = 2^-17). Their sum is < 2^-14.9; 2^-14 covers it with room.
DITHER_BIAS_FACTOR = 2.0**-14
#: a served attention output stored in a narrower float than the one it was computed in (the decode's merge writing a
#: caller's bfloat16 / float16 buffer, an adapter casting the output to the model's dtype): per element
#: |fl(x) − x| ≤ rel·|x| + abs, with rel one ulp of the stored dtype (round-to-nearest and truncation both) and abs the
#: spacing of its subnormals, at least 2^-126 (a GPU conversion with .ftz flushes fp32 subnormal inputs), so
#: ‖fl(o) − o‖₂ ≤ rel·‖o‖₂ + abs·√D; an |x| beyond the dtype's largest finite value may store as ±inf (counted as
#: non-finite). Stored dtype → (rel, abs); storing into a dtype at least as wide as the computed one adds nothing
#: (Lean ``WitCert.output_error_stored_le``)
STORE_ROUNDING = {"float32": (2.0**-23, 2.0**-126), "bfloat16": (2.0**-7, 2.0**-126), "float16": (2.0**-10, 2.0**-24)}
#: the largest finite value of each stored dtype (a larger |x| may store as ±inf)
STORE_MAX = {"float32": 3.4028234663852886e38, "bfloat16": 3.3895313892515355e38, "float16": 65504.0}
#: the unbinned centred tilt's fixed grid (SPEC §3(c), ``sketch_box="grid"``): [0, 1] cut into GRID_TILT_INTERVALS
#: equal intervals; at every grid point the dual D(t, λ) at the GRID_TILT_CANDIDATES multipliers λ_k = e^{k·δ}, k
#: centred on 0, δ = GRID_TILT_LOG_STEP, rounded to float32 (``grid_tilt_lambdas``: a kernel's constants and the fp64
#: reference's exact values); each interval takes the candidate (or λ = 0, the cap t_{i+1}) whose larger end value is
#: smallest. Any cover and any λ ≥ 0 are sound (Lean ``tilt_tv_le_dual_grid_box_endpoints``); these three are the
#: tightness / cost choice of bench/TIGHTNESS.md "The centred box unbinned, in one pass" ((N + 1)·K = 27 sums per
#: token and head; one interval with λ = 1 alone is the two-sum closed form there)
GRID_TILT_INTERVALS = 8
GRID_TILT_CANDIDATES = 3
GRID_TILT_LOG_STEP = 0.05


def grid_tilt_lambdas(candidates: int = GRID_TILT_CANDIDATES, log_step: float = GRID_TILT_LOG_STEP) -> tuple:
    """The grid's multipliers e^{k·log_step}, k = −(K − 1)/2 … (K − 1)/2 (K odd), each rounded to the nearest float32
    (returned as Python floats, exact in float32 and float64)."""
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1 or candidates % 2 == 0:
        raise ValueError(f"candidates: an odd count ≥ 1, got {candidates!r}")
    half = candidates // 2
    if not (math.isfinite(log_step) and 0.0 <= log_step * half <= 40.0):
        raise ValueError(f"log_step: finite, ≥ 0 and at most 40 / (candidates // 2) (float32's range), got {log_step!r}")
    return tuple(struct.unpack("f", struct.pack("f", math.exp(k * log_step)))[0] for k in range(-half, half + 1))


#: floats by width, widest first (a store into a dtype at or before the computed one's is exact)
STORE_WIDTH = ("float64", "float32")


def store_rounding(stored: str, computed: str) -> tuple[float, float, float]:
    """(rel, abs, max) of ``STORE_ROUNDING`` / ``STORE_MAX`` for an output computed in the float named ``computed`` and
    served in ``stored`` ("float64", "float32", "bfloat16", "float16"); (0, 0, 0) where the store is exact (the same
    dtype, or one of ``STORE_WIDTH`` at least as wide). A dtype an output cannot be served in raises ValueError."""
    wider = STORE_WIDTH[: STORE_WIDTH.index(computed) + 1] if computed in STORE_WIDTH else STORE_WIDTH
    if stored == computed or stored in wider:
        return 0.0, 0.0, 0.0
    if stored not in STORE_ROUNDING:
        raise ValueError(f"stored: an attention output is served as float32, bfloat16 or float16, not {stored!r}")
    return (*STORE_ROUNDING[stored], STORE_MAX[stored])
