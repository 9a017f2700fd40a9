"""Constants of the contract (SPEC §5) that the fp64 reference, the kernels and the proofs
bridge all read from here (never restated)."""

import math

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
#: the unbinned centred tilt's fixed grid (SPEC §3(c); the decode kernel's merge, ``kernels.merge_terms._excess_form``, and
#: the fp64 reference's ``sketch_box="grid"``): [0, 1] cut at GRID_TILT_POINTS; interval i takes, among the multipliers
#: GRID_TILT_LAMBDAS[i] (and λ = 0, whose value is the cap t_{i+1}), the one whose larger end value t − D(t, λ) is
#: smallest. Any cover and any λ ≥ 0 are sound (Lean ``tilt_tv_le_dual_grid_box_endpoints``); the points and the
#: multipliers are dyadic (exact in float32 and float64: the kernel's tile, its merge and the reference use the same
#: numbers). The choice is bench/TIGHTNESS.md "A small grid in the fused merge" (int8 ratio 4.44 → 3.79 offline with 12
#: sums per (token, head); the tight λ's are within ±1.6 % of 1 on 90 % of these rows, the first interval's below 1, the last's
#: above). The one interval [0, 1] with λ = 1 alone is the two-sum excess form
GRID_TILT_POINTS = (0.0, 0.3125, 0.6875, 1.0)
GRID_TILT_LAMBDAS = ((1.0, 1.0 - 3.0 / 512, 1.0 - 7.0 / 512), (1.0,), (1.0, 1.0 + 3.0 / 512, 1.0 + 7.0 / 512))


def check_grid(points, lams) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """``points`` (t_0 = 0 < t_1 < … < t_N = 1) and ``lams`` (N tuples of finite multipliers ≥ 0; an empty one leaves
    its interval the cap t_{i+1}, λ = 0) as float tuples; ValueError otherwise."""
    try:
        ts = tuple(float(x) for x in points)
        ls = tuple(tuple(float(x) for x in row) for row in lams)
    except (TypeError, ValueError):
        raise ValueError(f"grid: points a sequence of floats and lams a sequence of sequences, got {points!r}, {lams!r}") from None
    if len(ts) < 2 or ts[0] != 0.0 or ts[-1] != 1.0 or any(not (x < y) for x, y in zip(ts, ts[1:])):
        raise ValueError(f"grid points: increasing from 0 to 1, got {points!r}")
    if len(ls) != len(ts) - 1:
        raise ValueError(f"grid multipliers: one tuple per interval ({len(ts) - 1}), got {lams!r}")
    if not all(math.isfinite(x) and x >= 0.0 for r in ls for x in r):
        raise ValueError(f"grid multipliers: finite and ≥ 0, got {lams!r}")
    return ts, ls


def grid_sum_points(points=GRID_TILT_POINTS, lams=GRID_TILT_LAMBDAS) -> tuple[tuple[float, float], ...]:
    """The distinct (t, λ) at which the grid needs Σ_j p̂_j (λ β_j(t) − 1)₊: both ends of every interval at each of its
    multipliers, in order of first use (the kernel's tile accumulates them in this order, the point (0, 1) excepted:
    that sum is the excess form's A, ``GRID_A_POINT``)."""
    ts, ls = check_grid(points, lams)
    out: list = []
    for i, row in enumerate(ls):
        for lam in row:
            for t in (ts[i], ts[i + 1]):
                if (t, lam) not in out:
                    out.append((t, lam))
    return tuple(sorted(out, key=lambda x: (x[0], out.index(x))))


#: the grid point whose sum is the two-sum excess form's A = Σ p̂ (e^{−c+ε} − 1)₊ (t = 0, λ = 1)
GRID_A_POINT = (0.0, 1.0)


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
