"""KV quantization schemes (SPEC §1, §5): one tensor function ``x ↦ (x̂, meta)`` each.

A scheme takes a float tensor ``x`` of shape ``[..., n, d]`` (tokens, then channels; for the
dithered scheme the axis before ``n``, if any, is the kv head) and a :class:`QuantContext`, and
returns ``x̂`` (same shape, float32) and a ``meta`` dict of whatever it stores (codes, scales).
The witness is computed from ``x̂ − x`` by :mod:`witcert.bounds`, so every scheme -- built-in or
registered by a user -- is metered the same way.

Built-ins: ``none``, ``fp8_e4m3``, ``fp8_e5m2`` (raw casts: the failure mode users hit),
``fp8_e4m3_scaled``, ``int8``, ``int8_dither`` (SPEC §5), ``int4_group``, ``kivi2``; their facts
(kernel id, code dtype, scale rule and divisor, granularity) are the rows of ``contract.schemes``.

``int8_dither`` exactly (all fp32, as the write kernel does it):

* ``s`` = the smallest float16 with ``126.5 s ≥ max_i |x_i|``, per (token, kv head);
* ``u = (2k + 1)·2^-24 − ½`` with ``k`` = the top 23 bits of ``dither_hash(seed, layer,
  kv_head, position, channel, stream)`` -- a 2^23-point grid symmetric about 0 (``stream``
  0 for keys, 1 for values, so K and V dither are independent);
* ``y = fl(x / s)``; ``c = floor(y) + [y − floor(y) ≥ ½ − u]`` -- this is ``floor(y + u + ½)``
  evaluated **exactly** (``½ − u`` is an fp32 number), so no float rounding of ``y + u`` can
  move a code across a rounding boundary; ``c ∈ [−127, 127]``;
* ``x̂ = s·(c − u)``.

Given ``y``, ``c − u − y`` is uniform over a 2^23-point arithmetic progression in ``(−½, ½]``
(mean within 2^-24 of 0, sub-Gaussian with proxy ≤ 1/12 about it). The quotient and the fp32
reconstruction add a deterministic error; all of this is the ``dither_bias_bound`` term of the
Tier B radius (``witcert.bounds.DITHER_BIAS_FACTOR``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import numpy as np
import torch

from contract.rounding import fp8_codes, round_up_f32, round_up_to_dtype  # noqa: F401 (re-exported)
from contract.schemes import INT4_GROUP, SCHEMES

__all__ = [
    "QuantContext",
    "register_scheme",
    "get_scheme",
    "available_schemes",
    "quantize",
    "dither_hash",
    "dither_token_hash",
    "dither_u",
    "round_up_f32",
    "round_up_to_dtype",
    "round_down_f16",
    "INT8_DITHER_DIVISOR",
    "INT8_DIVISOR",
    "FP8_E4M3_MAX",
]

# the divisors of the scale rules, from the scheme table (contract.schemes)
INT8_DITHER_DIVISOR = SCHEMES["int8_dither"].divisor  # SPEC §5: |x/s| ≤ 126.5 and |u| < ½ keep the code in [−127, 127]
INT8_DIVISOR = SCHEMES["int8"].divisor
FP8_E4M3_MAX = SCHEMES["fp8_e4m3_scaled"].divisor  # the largest finite fp8 e4m3fn value
INT4_DIVISOR = SCHEMES["int4_group"].divisor  # codes 0 … 15
KIVI2_DIVISOR = SCHEMES["kivi2"].divisor  # codes 0 … 3
_MASK32 = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class QuantContext:
    """Where a tensor lives: needed by schemes whose output depends on it.

    ``role``: ``"key"`` or ``"value"``. ``kv_head``: an int, or ints broadcastable to
    ``x.shape[:-2]``; default: the index along axis ``-3`` (0 for 2-D inputs). ``positions``:
    ints broadcastable to ``x.shape[:-1]``; default ``arange(n)``. ``block_size``: the token
    block over which per-channel (``kivi2`` key) statistics are taken.
    """

    role: str = "key"
    seed: int = 0
    layer: int = 0
    kv_head: Any = None
    positions: Any = None
    block_size: int = 16

    def __post_init__(self):
        if self.role not in ("key", "value"):
            raise ValueError(f"QuantContext.role: expected 'key' or 'value', got {self.role!r}")
        for name in ("seed", "layer", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"QuantContext.{name}: expected a non-negative int, got {v!r}")
        if self.block_size < 1:
            raise ValueError("QuantContext.block_size: must be >= 1")


# --------------------------------------------------------------------------- numerics helpers


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 tensors holding uint32 values, without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """The 'lowbias32' integer finaliser on uint32 values held in int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    x = x ^ (x >> 16)
    return x


def dither_token_hash(seed, layer, kv_head, position, stream) -> torch.Tensor:
    """Per-token part of the dither key: ``mix(…mix(mix(seed ^ φ) ^ layer)… ^ stream)``."""
    def as_t(v):
        return torch.as_tensor(v, dtype=torch.int64) & _MASK32

    h = _mix32(as_t(seed) ^ 0x9E3779B9)
    for f in (layer, kv_head, position, stream):
        h = _mix32(h ^ as_t(f))
    return h


def dither_hash(seed, layer, kv_head, position, channel, stream) -> torch.Tensor:
    """Counter-based 32-bit hash of (seed, layer, kv_head, position, stream, channel).

    All arguments are ints or int64 tensors (broadcast); the result is int64 in [0, 2^32).
    One chain per token (``dither_token_hash``), then one mix per channel:
    ``mix(h_token ^ (channel · 0x9E3779B9 mod 2^32))``. The kernels evaluate the same chain in
    uint32 arithmetic (``stream`` is 0 for keys, 1 for values).
    """
    ch = _mul32(torch.as_tensor(channel, dtype=torch.int64) & _MASK32, 0x9E3779B9)
    return _mix32(dither_token_hash(seed, layer, kv_head, position, stream) ^ ch)


def dither_u(seed, layer, kv_head, position, channel, stream) -> torch.Tensor:
    """The dither ``u = (2k + 1)·2^-24 − ½`` (float32), ``k`` = top 23 bits of ``dither_hash``."""
    k = dither_hash(seed, layer, kv_head, position, channel, stream) >> 9
    return ((2 * k + 1).to(torch.float32) * 2.0**-24) - 0.5


# --------------------------------------------------------------------------- built-in schemes


def _absmax_scale(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """The smallest float16 ``s`` with ``s · divisor ≥ max|x|`` (per token), as float32.

    Scales are stored in float16, rounded up (SPEC §1, §5): the write kernel computes the
    same value exactly (``s·divisor`` is exact in fp32 for an fp16 ``s`` and these divisors).
    """
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float64)
    return round_up_to_dtype(amax / divisor, torch.float16).to(torch.float32)


def _none(x, ctx):
    return x.to(torch.float32).clone(), {}


def _fp8_raw(dtype, code_max):
    def fn(x, ctx):
        codes, _ = fp8_codes(x, dtype, code_max)
        return codes.to(torch.float32), {"codes": codes}

    return fn


def _fp8_e4m3_scaled(x, ctx):
    row = SCHEMES["fp8_e4m3_scaled"]  # (|x/s| ≤ 448 by the rounded-up s; the saturation is for a NaN / inf row)
    codes, s = fp8_codes(x, torch.float8_e4m3fn, row.code_max, row.divisor)
    return codes.to(torch.float32) * s, {"codes": codes, "scale": s[..., 0]}


def _int8(x, ctx):
    x = x.to(torch.float32)
    s = _absmax_scale(x, INT8_DIVISOR)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    y = x / safe
    f = torch.floor(y)
    c = torch.clamp(f + (y - f >= 0.5).to(torch.float32), -127, 127)  # round half up, exactly
    return s * c, {"codes": c.to(torch.int8), "scale": s[..., 0]}


def _context_grid(x: torch.Tensor, ctx: QuantContext):
    n, d = x.shape[-2], x.shape[-1]
    lead = x.shape[:-2]
    if ctx.kv_head is None:
        if x.dim() >= 3:
            kvh = torch.arange(x.shape[-3], dtype=torch.int64).view(-1, 1, 1)
        else:
            kvh = torch.zeros(1, 1, dtype=torch.int64)
    else:
        kvh = torch.as_tensor(ctx.kv_head, dtype=torch.int64)
        kvh = kvh.view(kvh.shape + (1, 1))
    pos = torch.arange(n, dtype=torch.int64) if ctx.positions is None else torch.as_tensor(ctx.positions, dtype=torch.int64)
    if torch.any(kvh < 0) or torch.any(pos < 0):
        raise ValueError("QuantContext: kv_head and positions must be non-negative")
    try:
        kvh = torch.broadcast_to(kvh, lead + (n, d))
        pos = torch.broadcast_to(pos.unsqueeze(-1), lead + (n, d))
    except RuntimeError:
        raise ValueError(
            f"QuantContext: kv_head {tuple(torch.as_tensor(ctx.kv_head).shape) if ctx.kv_head is not None else None} / "
            f"positions {tuple(pos.shape)} do not broadcast to x's shape {tuple(x.shape)}"
        ) from None
    ch = torch.arange(d, dtype=torch.int64)
    return kvh, pos, ch


def _int8_dither(x, ctx):
    x = x.to(torch.float32)
    s = _absmax_scale(x, INT8_DITHER_DIVISOR)
    kvh, pos, ch = _context_grid(x, ctx)
    stream = 0 if ctx.role == "key" else 1
    u = dither_u(ctx.seed, ctx.layer, kvh, pos, ch, stream)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    y = x / safe
    f = torch.floor(y)
    c = f + (y - f >= 0.5 - u).to(torch.float32)
    c = torch.where(s > 0, c, torch.zeros_like(c))
    if torch.any(c.abs() > 127):  # impossible by construction; never clip silently
        raise AssertionError("int8_dither produced a code outside [-127, 127]")
    x_hat = s * (c - u)
    return x_hat, {"codes": c.to(torch.int8), "scale": s[..., 0], "dither": u}


def round_down_f16(t: torch.Tensor) -> torch.Tensor:
    """Largest float16 ≤ t (float32 in, float16 out)."""
    h = t.to(torch.float16)
    bits = h.view(torch.int16)
    step = torch.where(h > 0, bits - 1, torch.where(h < 0, bits + 1, torch.full_like(bits, -32767)))  # 0 → −2^-24
    return torch.where(h.to(torch.float32) > t, step.view(torch.float16), h)


def _asym_f16(g: torch.Tensor, divisor: float, dim: int):
    """Asymmetric quantization of ``g`` (float32) with statistics over ``dim`` -- the kernels'
    arithmetic, bit for bit (``kernels.write``): z = largest fp16 ≤ min, s = smallest fp16 with
    divisor·s ≥ max − z (the fp32 difference), y = (x − z)/s, c = floor(y) + [y − floor(y) ≥ ½]
    clamped to [0, divisor] (the divisor is the largest code), x̂ = z + s·c (two fp32 roundings);
    s = 0 (a constant range) gives c = 0. Returns (x̂, codes as float32, s, z) with s, z of ``g``'s
    shape but size 1 along ``dim``."""
    mn = g.amin(dim, keepdim=True)
    mx = g.amax(dim, keepdim=True)
    z = round_down_f16(mn).to(torch.float32)
    s = round_up_to_dtype((mx - z).to(torch.float64) / divisor, torch.float16).to(torch.float32)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    y = (g - z) / safe
    f = torch.floor(y)
    c = torch.clamp(f + (y - f >= 0.5).to(torch.float32), 0, divisor)
    c = torch.where(s > 0, c, torch.zeros_like(c))
    return z + s * c, c, s, z


def _int4_group(x, ctx):
    """4-bit asymmetric per 32-channel group (the kernels' layout and arithmetic, bit for bit:
    ``_asym_f16`` with divisor 15 over each group of a token)."""
    x = x.to(torch.float32)
    d = x.shape[-1]
    g = min(INT4_GROUP, d)
    if d % g:
        raise ValueError(f"int4_group: head dim {d} is not a multiple of the group size {g}")
    xh, c, s, z = _asym_f16(x.reshape(*x.shape[:-1], d // g, g), INT4_DIVISOR, -1)
    return xh.reshape(x.shape), {"codes": c.reshape(x.shape).to(torch.uint8), "scale": s[..., 0], "zero": z[..., 0], "group": g}


def _kivi2(x, ctx):
    """2-bit asymmetric (KIVI): keys per channel over each block of ``ctx.block_size`` tokens
    (the last block may be partial: its statistics are over its tokens), values per 32 channels of
    a token; both ``_asym_f16`` with divisor 3 (codes 0..3), the write kernel's arithmetic bit for
    bit (a kernel page is one key block). Meta: ``codes`` (x's shape), ``scale`` / ``zero``
    ([..., nblocks, d] for keys, [..., n, d/32] for values)."""
    x = x.to(torch.float32)
    n, d = x.shape[-2], x.shape[-1]
    if ctx.role == "key":  # per channel, over blocks of tokens
        T = ctx.block_size
        nb = -(-n // T)
        parts = [_asym_f16(x[..., i * T:(i + 1) * T, :], KIVI2_DIVISOR, -2) for i in range(nb)]
        xh = torch.cat([p[0] for p in parts], dim=-2)
        c = torch.cat([p[1] for p in parts], dim=-2)
        return xh, {"codes": c.to(torch.uint8), "scale": torch.cat([p[2] for p in parts], dim=-2),
                    "zero": torch.cat([p[3] for p in parts], dim=-2), "block": T}
    g = min(INT4_GROUP, d)
    if d % g:
        raise ValueError(f"kivi2: head dim {d} is not a multiple of the value group size {g}")
    xh, c, s, z = _asym_f16(x.reshape(*x.shape[:-1], d // g, g), KIVI2_DIVISOR, -1)
    return xh.reshape(x.shape), {"codes": c.reshape(x.shape).to(torch.uint8), "scale": s[..., 0], "zero": z[..., 0], "group": g}


def residual_range(scheme: str, x_hat: torch.Tensor, meta: dict):
    """β ``[..., n, d]`` (float64) with |x̂_i − x_i| ≤ β_i by the scheme's construction, from what the
    cache stores (scales, codes): the range of the key residual sketch (``witcert.bounds.sketch_encode``;
    the write kernel computes the same values). The scheme table's ``residual_range``: "half-scale" (half
    a scale step: int8 per token, int4_group per 32 channels, kivi2 per channel of a block), "fp8" (half
    an fp8 spacing, ≤ |x̂|·``residual_rel``, at least ``residual_floor`` times the scale); None for scheme
    ``none`` and user schemes (the sketch then takes each token's own range). Only a tightness choice:
    the witness is taken from the reconstruction, so a β that is not a bound costs tightness, never
    soundness."""
    row = SCHEMES.get(scheme)
    if row is None or row.residual_range == "none":
        return None
    xh = x_hat.to(torch.float64)
    if row.residual_range == "fp8":
        s = meta["scale"].to(torch.float64)[..., None] if "scale" in meta else torch.ones_like(xh[..., :1])
        return torch.maximum(xh.abs() * row.residual_rel, row.residual_floor * s)
    sc = meta["scale"].to(torch.float64)
    if row.key_scales == "channel-block" and "block" in meta:  # kivi2 keys: per channel of each block of T tokens
        return sc.repeat_interleave(meta["block"], dim=-2)[..., : xh.shape[-2], :] / 2
    if "group" in meta:  # per 32-channel group of a token (int4_group, kivi2 values)
        return (sc.repeat_interleave(meta["group"], dim=-1) / 2).reshape(xh.shape)
    return (sc[..., None] / 2).expand_as(xh)  # per token


# --------------------------------------------------------------------------- registry


_REGISTRY: dict[str, Callable[[torch.Tensor, QuantContext], tuple[torch.Tensor, dict]]] = {}


def _adapt(fn: Callable) -> Callable[[torch.Tensor, QuantContext], tuple[torch.Tensor, dict]]:
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = [None, None]
    if len(params) == 1:
        return lambda x, ctx: fn(x)
    return fn


def register_scheme(name: str, fn: Callable, *, overwrite: bool = False) -> None:
    """Register ``fn(x) -> (x_hat, meta)`` (or ``fn(x, ctx)``) under ``name``."""
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"register_scheme: name must be a non-empty identifier-like string, got {name!r}")
    if not callable(fn):
        raise ValueError(f"register_scheme: fn for {name!r} is not callable")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"register_scheme: a scheme named {name!r} exists (pass overwrite=True to replace it)")
    _REGISTRY[name] = _adapt(fn)


def get_scheme(name: str) -> Callable[[torch.Tensor, QuantContext], tuple[torch.Tensor, dict]]:
    """The scheme function registered under ``name`` (``ValueError`` listing the known ones)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown quantization scheme {name!r}; available: {', '.join(available_schemes())}") from None


def resolve_scheme(name: str) -> str:
    """The registered scheme ``name`` stands for: itself, or the built-in an alias of the scheme
    table names (``contract.schemes.ALIASES``: ``fp8`` → ``fp8_e4m3``, ``int4`` → ``int4_group``,
    ``kivi`` → ``kivi2``, ``auto`` → ``none``). A registered scheme of an alias's name wins.
    ``ValueError`` listing the known schemes and aliases otherwise."""
    from contract.schemes import ALIASES, canonical_name

    if isinstance(name, str) and name in _REGISTRY:
        return name
    canon = canonical_name(name)
    if isinstance(canon, str) and canon in _REGISTRY:
        return canon
    raise ValueError(f"unknown quantization scheme {name!r}; available: {', '.join(available_schemes())}; "
                     f"aliases: {', '.join(f'{k} = {v}' for k, v in sorted(ALIASES.items()))}")


def available_schemes() -> list[str]:
    return sorted(_REGISTRY)


def quantize(name: str, x, ctx: QuantContext | None = None) -> tuple[torch.Tensor, dict]:
    """Apply scheme ``name`` to ``x`` (``[..., n, d]``), checking what the scheme returns."""
    fn = get_scheme(name)
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"quantize: x must be a floating-point tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"quantize: x must be [..., n, d], got shape {tuple(x.shape)}")
    ctx = ctx or QuantContext()
    out = fn(x, ctx)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor) and isinstance(out[1], dict)):
        raise ValueError(f"scheme {name!r} must return (x_hat: Tensor, meta: dict)")
    x_hat, meta = out
    if tuple(x_hat.shape) != tuple(x.shape):
        raise ValueError(f"scheme {name!r} returned x_hat of shape {tuple(x_hat.shape)} for x of shape {tuple(x.shape)}")
    return x_hat.to(torch.float32), meta


_BUILTINS = {
    "none": _none,
    "fp8_e4m3": _fp8_raw(torch.float8_e4m3fn, SCHEMES["fp8_e4m3"].code_max),
    "fp8_e5m2": _fp8_raw(torch.float8_e5m2, SCHEMES["fp8_e5m2"].code_max),
    "fp8_e4m3_scaled": _fp8_e4m3_scaled,
    "int8": _int8,
    "int8_dither": _int8_dither,
    "int4_group": _int4_group,
    "kivi2": _kivi2,
}
if set(_BUILTINS) != set(SCHEMES):  # the table (contract.schemes) lists exactly the built-ins
    raise ImportError(f"witcert.schemes: built-ins {sorted(_BUILTINS)} differ from the scheme table {sorted(SCHEMES)}")
for _name, _fn in _BUILTINS.items():
    register_scheme(_name, _fn)
