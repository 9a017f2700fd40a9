"""The scheme table: one row per built-in quantization scheme, the facts that the fp64 reference
(``witcert.schemes``, ``witcert.cache``), the kernels (``kernels.paged``, ``kernels.write``,
``kernels.decode``) and the memory accounting (``kernels.memory_accounting.bytes_per_token``) read from here
instead of restating them.

A row states what a scheme **is** (its code, scale and granularity); how it is computed lives in
``witcert.schemes`` (fp64 reference, bit for bit with the kernels) and ``kernels.write``.

    granularity   "token"          one token is quantized on its own (scale per token, or none)
                  "channel-group"  per token, one scale + zero per ``INT4_GROUP`` channels
                  "block"          key statistics span a block of T tokens: a block is quantized
                                   when it is full, its tokens stay exact until then (KIVI's
                                   full-precision residual)
    key_scales,   "none"           no scale stored
    value_scales  "token"          one scale per token (``scale_bytes`` each, fp16 rounded up)
                  "group"          fp16 scale + fp16 zero per 32 channels (per token)
                  "channel-block"  fp16 scale + fp16 zero per channel per block of T tokens

Pure data: no torch, no numpy (the kernels map ``code_dtype`` names to torch dtypes).
"""

from __future__ import annotations

import dataclasses

#: channels per scale / zero of the group schemes (int4_group; kivi2 values)
INT4_GROUP = 32

GRANULARITIES = ("token", "channel-group", "block")
SCALE_KINDS = ("none", "token", "group", "channel-block")


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One built-in scheme (see the module doc for the vocabulary)."""

    name: str
    #: the kernels' constexpr SCHEME id; None: no kernel implements it (reference path only)
    kernel_id: int | None
    #: the torch dtype (by name) codes are stored in; None: the model's dtype (no quantization)
    code_dtype: str | None
    #: bits of information per code element (what ``bytes_per_token`` counts, packed); None: the
    #: model dtype's width
    code_bits: int | None
    #: how the scale is chosen, in words (the arithmetic is in witcert.schemes / kernels.write)
    scale_rule: str
    granularity: str
    key_scales: str
    value_scales: str
    #: the divisor of the scale rule (s = the smallest fp16 with s·divisor ≥ the range: max|x| or
    #: max − zero; for the asymmetric schemes it is also the largest code); None: no scale
    divisor: float | None = None
    #: the codes depend on the token's logical index (the dither key): a writer must know it
    position_keyed: bool = False
    #: codes the kernels store per byte (int4_group: 2, kivi2: 4); what ``bytes_per_token`` counts
    codes_per_byte: int = 1
    #: the a-priori bound β_i ≥ |x̂_i − x_i| the key residual sketch takes as its range (``contract.sketch``):
    #: "half-scale" (half the scale step that applies to channel i: per token, per group or per channel of a
    #: block), "fp8" (max(|x̂_i|·``residual_rel``, s·``residual_floor``): half an fp8 spacing, s the scale or 1),
    #: "none" (no residual: the model's values)
    residual_range: str = "half-scale"
    residual_rel: float = 0.0
    residual_floor: float = 0.0
    #: the residual sketch's default width for this scheme (``contract.sketch``: 2 bits on the 8-bit
    #: schemes, 4 on the 4- and 2-bit ones, whose own codes carry fewer bits; bench/TIGHTNESS.md)
    default_sketch_bits: int = 2
    #: the kernels' default sketch box (``WitCertCache(sketch_box="auto")`` on the kernel path): one key level per
    #: (token, query head) (the per-head radius, ``PagedKV.head_levels``) instead of one per token. On where the
    #: GQ one-hot dots per tile add ≤ ~10 % to the metered tile loop's sm_90 instructions (``bench/sass_probe.py``:
    #: kivi2 +8.5 %, int4_group +9.2 %, fp8 +10 %) and the shared levels lose most (SmolLM2 on the kernel path,
    #: median TV⁺ shared → per head: kivi2 0.319 → 0.238, fp8_e4m3 0.077 → 0.068; bench/TIGHTNESS.md); off for
    #: int8 / int8_dither, whose lean tile loop grows +41 % (the H200: +13-31 % of the metered call, run U)
    kernel_head_levels: bool = False
    #: the largest finite code (fp8: e4m3fn 448, e5m2 57344): the raw casts saturate there, |x| beyond it is
    #: stored as ±code_max on every path — torch's own cast of an out-of-range float differs by version and format
    #: (2.13 saturates e4m3fn, 2.11 gives NaN; e5m2 gives ±inf); the witness measures the clipped residual, so the
    #: bound covers it. A NaN x stays a NaN code (torch, and the GPU write kernel's saturating cast); its witness
    #: is NaN, which flags the row. None: no such clip
    code_max: float | None = None

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"Scheme {self.name}: granularity {self.granularity!r} not in {GRANULARITIES}")
        for role in (self.key_scales, self.value_scales):
            if role not in SCALE_KINDS:
                raise ValueError(f"Scheme {self.name}: scale kind {role!r} not in {SCALE_KINDS}")
        if self.residual_range not in ("half-scale", "fp8", "none"):
            raise ValueError(f"Scheme {self.name}: residual_range {self.residual_range!r}")
        if self.codes_per_byte < 1 or (self.code_bits or 8) * self.codes_per_byte > 8:
            raise ValueError(f"Scheme {self.name}: {self.codes_per_byte} codes of {self.code_bits} bits do not fit a byte")

    @property
    def kernel_supported(self) -> bool:
        """Whether the Triton kernels implement this scheme (write and metered decode)."""
        return self.kernel_id is not None

    @property
    def lossy(self) -> bool:
        """Whether the served values can differ from the exact ones (every scheme but ``none``)."""
        return self.code_bits is not None

    @property
    def per_block(self) -> bool:
        """Whether a token waits for its block to fill before it is quantized (``granularity == "block"``)."""
        return self.granularity == "block"


_ROWS = (
    Scheme("none", 0, None, None, "none (the model's values)", "token", "none", "none", residual_range="none",
           default_sketch_bits=0),
    Scheme("int8", 1, "int8", 8, "per-token fp16 rounded up (amax/127), round half up", "token", "token", "token",
           127.0),
    Scheme("int8_dither", 2, "int8", 8, "per-token fp16 rounded up (amax/126.5), subtractive dither (SPEC §5)",
           "token", "token", "token", 126.5, position_keyed=True),
    # fp8 residual ranges: e4m3 has 3 mantissa bits (half a spacing ≤ |x̂|·2^-4, smallest subnormal step 2^-9),
    # e5m2 2 bits (≤ |x̂|·2^-3, step 2^-16)
    Scheme("fp8_e4m3", 3, "float8_e4m3fn", 8, "none (raw cast, saturating at ±448)", "token", "none", "none",
           residual_range="fp8", residual_rel=2.0**-4, residual_floor=2.0**-10, kernel_head_levels=True,
           code_max=448.0),
    Scheme("fp8_e5m2", 4, "float8_e5m2", 8, "none (raw cast, saturating at ±57344)", "token", "none", "none",
           residual_range="fp8", residual_rel=2.0**-3, residual_floor=2.0**-17, kernel_head_levels=True,
           code_max=57344.0),
    Scheme("fp8_e4m3_scaled", 5, "float8_e4m3fn", 8, "per-token fp16 rounded up (amax/448)", "token", "token",
           "token", 448.0, residual_range="fp8", residual_rel=2.0**-4, residual_floor=2.0**-10,
           kernel_head_levels=True, code_max=448.0),
    Scheme("int4_group", 6, "uint8", 4,
           "per-32-channel fp16 scale (rounded up, range/15) + zero (rounded down); two codes per byte",
           "channel-group", "group", "group", 15.0, codes_per_byte=2, default_sketch_bits=4, kernel_head_levels=True),
    Scheme("kivi2", 7, "uint8", 2,
           "keys: per channel over a block of T tokens, values: per 32 channels of a token; fp16 scale (rounded up, "
           "range/3) + zero (rounded down), codes 0..3, four per byte",
           "block", "channel-block", "group", 3.0, codes_per_byte=4, default_sketch_bits=4, kernel_head_levels=True),
)

#: the table, by name (insertion order = kernel id order, then the reference-only schemes)
SCHEMES: dict[str, Scheme] = {s.name: s for s in _ROWS}

#: scheme name → kernel id, for the schemes the kernels implement
KERNEL_SCHEME_IDS: dict[str, int] = {s.name: s.kernel_id for s in _ROWS if s.kernel_supported}
#: schemes whose key statistics are taken over a block of tokens: quantized per full block
BLOCK_SCHEMES: frozenset[str] = frozenset(s.name for s in _ROWS if s.per_block)


#: other spellings of built-in schemes: vLLM / SGLang's ``--kv-cache-dtype`` values (``fp8`` is
#: fp8_e4m3 as they store it, ``auto`` the model's dtype) and short names. The command line and the
#: Python API (``witcert.schemes.resolve_scheme``) accept both; records, traces and metrics carry
#: the canonical name.
ALIASES: dict[str, str] = {"auto": "none", "fp8": "fp8_e4m3", "int4": "int4_group", "kivi": "kivi2"}


def canonical_name(name: str) -> str:
    """``name`` with an alias replaced by its scheme (other names unchanged, not checked)."""
    return ALIASES.get(name, name) if isinstance(name, str) else name


def scheme(name: str) -> Scheme:
    """The table's row for ``name`` (``ValueError`` naming the known schemes)."""
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"scheme: unknown {name!r}; the table has {sorted(SCHEMES)}") from None


def kernel_id(name: str) -> int:
    """The kernels' constexpr id of ``name`` (``ValueError`` if no kernel implements it)."""
    row = scheme(name)
    if row.kernel_id is None:
        raise ValueError(f"scheme {name!r} has no kernel (kernel schemes: {sorted(KERNEL_SCHEME_IDS)})")
    return row.kernel_id


def kernel_supported(name: str) -> bool:
    """Whether the kernels implement ``name`` (False for schemes outside the table: user schemes)."""
    row = SCHEMES.get(name)
    return row is not None and row.kernel_supported


def scale_bytes_per_token(kind: str, head_dim: int, block_size: int, scale_bytes: int) -> float:
    """Bytes of scales (and zeros) per token for one role (K or V) stored with ``kind``."""
    if kind == "none":
        return 0
    if kind == "token":
        return scale_bytes
    if kind == "group":  # fp16 scale + fp16 zero per INT4_GROUP channels
        return 2 * 2 * (head_dim // INT4_GROUP)
    if kind == "channel-block":  # fp16 scale + fp16 zero per channel, shared by a block of T tokens
        return 2 * 2 * head_dim / block_size
    raise ValueError(f"scale kind: {kind!r} not in {SCALE_KINDS}")
