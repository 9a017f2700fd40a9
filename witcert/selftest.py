"""A once-per-process check of the compiled write kernel on the device it runs on (the kernel path's
``WitCertCache`` calls it when a layer allocates its paged cache).

Every bound WitCert reports rests on the write's witnesses: κ ≥ ‖k̂‖, ν ≥ ‖v̂‖, φ ≥ ‖v̂ − v‖ and the key witness W
(per group ≥ ‖(k̂ − k)_g‖, or with the sketch / channel weights ≥ ‖((k̂ − k) − r̃)/a‖), all of the codes the kernel
itself stored. The conformance tests check that on the CPU (Triton's interpreter) and on the GPUs the project has
run; a user's GPU, driver or Triton may compile the kernel differently. On an H100 with Triton 3.6.0 a clip
before the fp8 cast once made the write store right codes and wrong witnesses (off by up to two orders of
magnitude, either way; docs/testing.md, runs B1-B4 of 2026-12-06), which no exception and no NaN would have shown.

``check_write_kernel(cache, dtype)`` writes a small canary (three pages of one sequence, in two launches like a
prefill and an append, with outlier channels and tokens past the fp8 range) into a fresh paged cache of the same
configuration and compares every stored witness with the norms of the stored codes (``served_kv`` /
``served_sketch``, float64). It runs once per configuration and process, never during CUDA-graph capture, and
raises ``WriteSelfTestError`` on a violation: the meter would not be sound there.

    check_write_kernel(paged: kernels.paged.PagedKV, dtype) → WriteSelfTest | None (None: already checked)
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from contract.schemes import BLOCK_SCHEMES

log = logging.getLogger("witcert.selftest")

#: configurations already checked in this process (``_key``)
_CHECKED: set = set()


class WriteSelfTestError(RuntimeError):
    """The compiled write kernel stored a witness below the norm it bounds, on this device."""


@dataclasses.dataclass(frozen=True)
class WriteSelfTest:
    """The outcome of one check: the configuration, the canary's tokens × kv heads, and the smallest ratio
    stored witness / the norm it bounds over them (≥ 1: sound; ``inf`` where every norm is 0)."""

    key: tuple
    tokens: int
    worst_ratio: float


def _key(cache, dtype: torch.dtype) -> tuple:
    """What the write kernel is compiled for (``kernels.write.write_kv``'s constexprs) and where it runs."""
    dev = cache.k_codes.device
    return (cache.scheme, cache.head_dim, cache.num_kv_heads, cache.block_size, cache.num_groups,
            cache.per_token_witness, cache.sketch_bits, cache.has_weights, str(dtype), dev.type, dev.index)


def _canary(H: int, D: int, N: int, dtype: torch.dtype, seed: int, device) -> torch.Tensor:
    """[N, H, D] rows: normal, two outlier channels (×20), every seventh token ×50 (past fp8 e4m3's 448)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, D, generator=g)
    x[..., :2] *= 20
    x[3::7] *= 50
    return x.to(dtype).to(device)


def _ratio(witness: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """witness / norm, +inf where the norm is 0 and the witness is not negative (−inf for a negative or NaN
    witness: a NaN witness on finite inputs is a fault too)."""
    w = witness.double()
    ok_zero = torch.where(w >= 0, torch.inf, -torch.inf)
    return torch.where(norm > 0, w / torch.where(norm > 0, norm, 1.0), ok_zero).nan_to_num(nan=-torch.inf)


def check_write_kernel(cache, dtype: torch.dtype) -> WriteSelfTest | None:
    """Check the write kernel for ``cache``'s configuration (a ``kernels.paged.PagedKV``) and model ``dtype`` once
    per process; raise ``WriteSelfTestError`` if a stored witness is below the norm it bounds. None: already
    checked, or skipped inside a CUDA-graph capture (logged)."""
    key = _key(cache, dtype)
    if key in _CHECKED:
        return None
    if cache.k_codes.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        log.info("write kernel self-check skipped inside a CUDA-graph capture: %s", key)
        return None
    from kernels.paged import PagedKV
    from kernels.write import write_kv

    from .cache_kernel import served_kv, served_sketch

    H, D, T, dev = cache.num_kv_heads, cache.head_dim, cache.block_size, cache.k_codes.device
    N = 3 * T
    c = PagedKV.allocate(3, H, D, scheme=cache.scheme, block_size=T, num_groups=cache.num_groups,
                         per_token_witness=cache.per_token_witness, model_dtype=dtype, device=dev, seed=cache.seed,
                         layer=cache.layer, with_exact=False, sketch_bits=cache.sketch_bits,
                         weights=cache.weights if cache.has_weights else None)
    k, v = _canary(H, D, N, dtype, 1, dev), _canary(H, D, N, dtype, 2, dev)
    bt = torch.arange(3, dtype=torch.int32, device=dev)[None]
    cut = 2 * T if cache.scheme in BLOCK_SCHEMES else 2 * T - 3  # a block scheme writes whole pages
    for sl in (slice(0, cut), slice(cut, N)):  # a prefill, then an append (the running maxima of per-block witnesses)
        n = sl.stop - sl.start
        write_kv(c, k[sl], v[sl], bt, torch.zeros(n, dtype=torch.long, device=dev),
                 torch.arange(sl.start, sl.stop, device=dev), store_exact=False)
    kh, vh = (t[0].movedim(0, 1) for t in served_kv(c, bt, N))  # [N, H, D] float64
    kx, vx = k.double(), v.double()
    j = torch.arange(N, device=dev)
    blk, off = bt[0, j // T].long(), (j % T if cache.per_token_witness else torch.zeros_like(j))
    ratios = [_ratio(c.k_norm[blk, :, off], kh.norm(dim=-1)), _ratio(c.v_norm[blk, :, off], vh.norm(dim=-1)),
              _ratio(c.v_wit[blk, :, off], (vh - vx).norm(dim=-1))]
    W = c.k_wit[blk, :, off]  # [N, H, G]
    if cache.sketch_bits or cache.has_weights:  # W ≥ ‖(r − r̃)/a‖ + γ‖r̃/a‖ ≥ ‖(r − r̃)/a‖
        rt = served_sketch(c, bt, N)
        rt = 0.0 if rt is None else rt[0].movedim(0, 1)
        a = c.weights.double() if cache.has_weights else 1.0  # [H, D]
        ratios.append(_ratio(W[..., 0], (((kh - kx) - rt) / a).norm(dim=-1)))
    else:
        for g, idx in enumerate(c.groups()):
            ratios.append(_ratio(W[..., g], (kh - kx)[..., torch.as_tensor(idx, device=dev)].norm(dim=-1)))
    worst = min(float(r.min()) for r in ratios)
    _CHECKED.add(key)
    if not worst >= 1.0:
        _CHECKED.discard(key)
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        import triton

        raise WriteSelfTestError(
            f"WitCert's write kernel failed its self-check on {name} (Triton {triton.__version__}, torch "
            f"{torch.__version__}; scheme {cache.scheme}, head dim {D}, model dtype {dtype}): a stored witness is "
            f"{worst:.3g}× the norm it bounds over a {N}-token canary, so the meter would not be sound here. Use "
            f"WitCertCache(backend='reference'), or report it with these versions (witcert/selftest.py)")
    log.info("write kernel self-check passed: %s (worst witness / norm %.4g over %d tokens × %d kv heads)",
             key, worst, N, H)
    return WriteSelfTest(key=key, tokens=N * H, worst_ratio=worst)
