"""Memory accounting of the paged cache (SPEC §8): bytes per token and kv head of what the kernels store.

    bytes_per_token(scheme, head_dim, …) → {"codes", "scales", "witnesses", "sketch", "window", "total",
                                            "ratio_vs_model_dtype"}   (bytes, K + V)

The layout it counts is ``kernels.paged`` (module doc); the scheme table (``contract.schemes``) and the
sketch (``contract.sketch``) give the per-scheme sizes.
"""

from __future__ import annotations

from contract.schemes import SCHEMES, scale_bytes_per_token
from contract.sketch import check_bits, check_window, sketch_bytes_per_token


def bytes_per_token(
    scheme: str,
    head_dim: int = 128,
    num_groups: int = 4,
    per_token_witness: bool = True,
    block_size: int = 16,
    witness_bytes: int = 2,
    scale_bytes: int = 2,
    model_bytes: int = 2,
    sketch_bits: int = 0,
    window=None,
    context: int = 4096,
    block_norms: bool = False,
) -> dict:
    """Bytes per token and kv head of the served cache (K + V), including scales and witnesses.

    ``witness_bytes``: 2 (float16, the kernels' per-token layout) or 1 (fp8 e4m3 rounded up);
    per-block witnesses are counted as float32 shared by ``block_size`` tokens; ``block_norms``: ν and κ as
    float32 page maxima beside per-token key / value witnesses (``PagedKV.block_norms``). ``sketch_bits``: the
    key residual sketch (``contract.sketch``: D·b/8 bytes + a float16 range per token). ``window``
    (sink, recent): the exact window's model-dtype K / V (+ two float32 norms) per sequence, amortised
    over ``context`` tokens. The exact backing store lives in host memory and is not counted. Returns
    the breakdown and the ratio of tokens that fit at equal memory versus an unquantized
    ``model_bytes`` cache.
    """
    row = SCHEMES.get(scheme)
    if row is None:
        raise ValueError(f"scheme: unknown {scheme!r}")
    sketch_bits = check_bits(sketch_bits)
    sink, recent = check_window(window)
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context: expected a positive int, got {context!r}")
    if row.code_bits is None:  # "none": the model's dtype
        code_bytes = model_bytes
    else:  # what the kernels store: codes_per_byte codes in a byte (int4_group 2, kivi2 1)
        code_bytes = 1 if row.codes_per_byte == 1 else 1 / row.codes_per_byte
    codes = 2 * head_dim * code_bytes
    # K and V: one fp16 scale per token ("token"); fp16 scale + zero per 32 channels ("group");
    # kivi2 keys: fp16 scale + zero per channel per block, shared by block_size tokens
    scales = (scale_bytes_per_token(row.key_scales, head_dim, block_size, scale_bytes)
              + scale_bytes_per_token(row.value_scales, head_dim, block_size, scale_bytes))
    if per_token_witness and block_norms:  # G key witnesses + φ per token, ν + κ per page
        wit = (num_groups + 1) * witness_bytes + 2 * 4 / block_size
    elif per_token_witness:
        wit = (num_groups + 3) * witness_bytes  # G key witnesses + φ + ν + κ
    else:
        wit = (num_groups + 3) * 4 / block_size
    sketch = sketch_bytes_per_token(sketch_bits, head_dim) if row.lossy else 0.0
    if not row.lossy:
        wit = 0
    win = (sink + recent) * (2 * head_dim * model_bytes + 8) / context if row.lossy else 0.0
    total = codes + scales + wit + sketch + win
    base = 2 * head_dim * model_bytes
    return {"codes": codes, "scales": scales, "witnesses": wit, "sketch": sketch, "window": win, "total": total,
            "ratio_vs_model_dtype": base / total}
