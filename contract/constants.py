"""Constants of the contract (SPEC §5) that the fp64 reference, the kernels and the proofs
bridge all read from here (never restated)."""

#: the dither u takes 2**DITHER_RESOLUTION_BITS values, (2k+1)·2^-24 − ½ (see witcert.schemes).
DITHER_RESOLUTION_BITS = 23
#: per channel, |served residual − s·X| ≤ DITHER_BIAS_FACTOR · s, X the centred 2^23-point
#: uniform of proxy ≤ 1/12: the grid's mean offset (≤ 2^-24), the fp32 quotient y = x/s
#: (≤ 2 ulp of |y| ≤ 127: 2^-16), fp32 rounding of c − u (≤ 2^-18) and of s·(c − u)
#: (≤ 2^-24·128 = 2^-17). Their sum is < 2^-14.9; 2^-14 covers it with room.
DITHER_BIAS_FACTOR = 2.0**-14
