"""A once-per-process check of the compiled write kernel on the device it runs on (the kernel path's
``WitCertCache`` calls it when a layer allocates its paged cache).

Every bound WitCert reports rests on the write's witnesses: κ ≥ ‖k̂‖, ν ≥ ‖v̂‖, φ ≥ ‖v̂ − v‖ and the key witness W
(per group ≥ ‖(k̂ − k)_g‖, or with the sketch / channel weights ≥ ‖((k̂ − k) − r̃)/a‖), all of the codes the kernel
itself stored. The conformance tests check that on the CPU (Triton's interpreter) and on the GPUs the project has
run; a user's GPU, driver or Triton may compile the kernel differently. On an H100 with Triton 3.6.0 a clip
before the fp8 cast once made the write store right codes and wrong witnesses (off by up to two orders of
magnitude, either way; docs/testing.md, runs B1-B4 of 2026-12-06), which no exception and no NaN would have shown.

``check_write_kernel(cache, dtype)`` writes a small canary (``CANARY_PAGES`` pages of one sequence in descending
blocks, in three launches — a prefill ending mid-page, one token, the rest — with outlier channels, tokens past both
fp8 ranges, a zero and a tiny token) into a fresh paged cache of the same
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
#: the canary's pages: 8 × 16 tokens, 32 write programs on the GPU, in blocks 2 … 9 in descending order; at least
#: 32 tokens whatever the block size
CANARY_PAGES = 8
CANARY_MIN_TOKENS = 32


class WriteSelfTestError(RuntimeError):
    """The compiled write kernel stored a witness below the norm it bounds, on this device."""


@dataclasses.dataclass(frozen=True)
class WriteSelfTest:
    """The outcome of one check: the configuration, the canary's tokens × kv heads, and the smallest ratio
    stored witness / the norm it bounds over them (≥ 1: sound; ``inf`` where every norm is 0)."""

    key: tuple
    tokens: int
    worst_ratio: float


def _logged(message: str) -> WriteSelfTestError:
    """The error, logged first: a caller that keeps serving on it (the SGLang adapter leaves the layer unmetered)
    still leaves the reason in the log, not only in a counter."""
    log.error(message)
    return WriteSelfTestError(message)


def _key(cache, dtype: torch.dtype) -> tuple:
    """What the write kernel is compiled for (``kernels.write.write_kv``'s constexprs) and where it runs."""
    dev = cache.k_codes.device
    return (cache.scheme, cache.head_dim, cache.num_kv_heads, cache.block_size, cache.num_groups,
            cache.per_token_witness, cache.sketch_bits, cache.has_weights, cache.block_norms, str(dtype), dev.type,
            dev.index)


def _canary(H: int, D: int, N: int, dtype: torch.dtype, seed: int, device) -> torch.Tensor:
    """[N, H, D] rows: normal, two outlier channels (×20), every seventh token ×50 (past fp8 e4m3's 448), one token
    with a channel at 6e4 (past fp8 e5m2's 57344), an all-zero token (a zero scale) and a tiny one (×1e-6)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, D, generator=g)
    x[..., :2] *= 20
    x[3::7] *= 50
    x[5] = 0.0
    x[6] *= 1e-6
    x[9, :, 2] = 6e4
    return x.to(dtype).to(device)


def _ratio(witness: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """witness / norm, +inf where the norm is 0 and the witness is not negative; −inf (a violation) for a negative or
    NaN witness, or a norm that is not finite (a NaN code on finite inputs is a fault too)."""
    w = witness.double()
    ok_zero = torch.where(w >= 0, torch.inf, -torch.inf)
    r = torch.where(norm > 0, w / torch.where(norm > 0, norm, 1.0), ok_zero).nan_to_num(nan=-torch.inf)
    return torch.where(torch.isfinite(norm), r, -torch.inf)


def _dither_magnitudes(c, bt: torch.Tensor, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8_dither: s(‖c‖ + ‖u‖) of keys and values [N, H] (κ and ν bound these, not only ‖s(c − u)‖: the decode's
    rounding terms use them), the dither regenerated as ``served_kv`` does."""
    from . import schemes as S

    dev, T, H, D = c.k_codes.device, c.block_size, c.num_kv_heads, c.head_dim
    j = torch.arange(N, device=dev)
    blk, off = bt[0, j // T].long(), j % T
    hh, ch = torch.arange(H, device=dev)[None, :, None], torch.arange(D, device=dev)[None, None, :]
    out = []
    for codes, scale, stream in ((c.k_codes, c.k_scale, 0), (c.v_codes, c.v_scale, 1)):
        u = S.dither_u(c.seed, c.layer, hh, j[:, None, None], ch, stream).to(dev).double()
        out.append(scale[blk, :, off].double() * (codes[blk, :, off].double().norm(dim=-1) + u.norm(dim=-1)))
    return out[0], out[1]


def check_write_kernel(cache, dtype: torch.dtype, force: bool = False) -> WriteSelfTest | None:
    """Check the write kernel for ``cache``'s configuration (a ``kernels.paged.PagedKV``) and model ``dtype`` once
    per process; raise ``WriteSelfTestError`` if a stored witness is below the norm it bounds. None: already
    checked (``force``: run anyway), or skipped inside a CUDA-graph capture (logged)."""
    key = _key(cache, dtype)
    if key in _CHECKED and not force:
        return None
    if cache.k_codes.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        log.info("write kernel self-check skipped inside a CUDA-graph capture: %s", key)
        return None
    from kernels.fp_bounds import sketch_gamma
    from kernels.paged import PagedKV
    from kernels.write import write_kv

    from .bounds import sketch_witness
    from .cache_kernel import served_kv, served_sketch

    H, D, T, dev = cache.num_kv_heads, cache.head_dim, cache.block_size, cache.k_codes.device
    N = max(CANARY_PAGES * T, CANARY_MIN_TOKENS)  # (SGLang's side: T = 1)
    P = -(-N // T)
    N = P * T
    c = PagedKV.allocate(P + 2, H, D, scheme=cache.scheme, block_size=T, num_groups=cache.num_groups,
                         per_token_witness=cache.per_token_witness, model_dtype=dtype, device=dev, seed=cache.seed,
                         layer=cache.layer, with_exact=False, sketch_bits=cache.sketch_bits,
                         weights=cache.weights if cache.has_weights else None, block_norms=cache.block_norms)
    k, v = _canary(H, D, N, dtype, 1, dev), _canary(H, D, N, dtype, 2, dev)
    bt = torch.arange(P + 1, 1, -1, dtype=torch.int32, device=dev)[None]  # the pages in high, descending blocks
    if cache.scheme in BLOCK_SCHEMES:  # whole pages per launch
        cuts = (0, 2 * T, N)
    else:  # a prefill ending mid-page, one token (N = 1), the rest
        cuts = (0, max(1, 2 * T - 3), max(2, 2 * T - 2), N)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        write_kv(c, k[lo:hi], v[lo:hi], bt, torch.zeros(hi - lo, dtype=torch.long, device=dev),
                 torch.arange(lo, hi, device=dev), store_exact=False)
    kh, vh = (t[0].movedim(0, 1) for t in served_kv(c, bt, N))  # [N, H, D] float64
    kx, vx = k.double(), v.double()
    j = torch.arange(N, device=dev)
    blk, off = bt[0, j // T].long(), (j % T if cache.per_token_witness else torch.zeros_like(j))
    if cache.scheme == "int8_dither":
        kmag, vmag = _dither_magnitudes(c, bt, N)
    else:
        kmag, vmag = kh.norm(dim=-1), vh.norm(dim=-1)
    noff = off if c.norms_per_token else torch.zeros_like(off)  # block_norms: the page's running max
    ratios = {"k_norm (κ)": _ratio(c.k_norm[blk, :, noff], kmag), "v_norm (ν)": _ratio(c.v_norm[blk, :, noff], vmag),
              "v_wit (φ)": _ratio(c.v_wit[blk, :, off], (vh - vx).norm(dim=-1))}
    W = c.k_wit[blk, :, off]  # [N, H, G]
    if cache.sketch_bits or cache.has_weights:  # W ≥ ‖(r − r̃)/a‖ + γ‖r̃/a‖ (bounds.sketch_witness)
        rt = served_sketch(c, bt, N)
        rt = None if rt is None else rt[0].cpu()  # [H, N, D]
        a = c.weights.double().cpu() if cache.has_weights else None  # [H, D]
        gamma = sketch_gamma(cache.scheme, D, cache.sketch_bits) if cache.sketch_bits else 0.0
        need = sketch_witness((kh - kx).movedim(1, 0).cpu(), rt, a, dot_gamma=gamma)  # [H, N]
        ratios["k_wit (W, sketch)"] = _ratio(W[..., 0], torch.as_tensor(need, device=dev).movedim(0, 1))
    else:
        for g, idx in enumerate(c.groups()):
            gi = torch.as_tensor(idx, device=dev)
            ratios[f"k_wit (W, group {g})"] = _ratio(W[..., g], (kh - kx)[..., gi].norm(dim=-1))
    mins = torch.stack([r.min() for r in ratios.values()]).cpu()
    worst = float(mins.min())
    if not worst >= 1.0:
        field = list(ratios)[int(mins.argmin())]
        tok, head = divmod(int(ratios[field].argmin()), H)
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        import triton

        raise _logged(
            f"WitCert's write kernel failed its self-check on {name} (Triton {triton.__version__}, torch "
            f"{torch.__version__}; scheme {cache.scheme}, head dim {D}, model dtype {dtype}, configuration {key}): "
            f"the stored {field} of canary token {tok}, kv head {head} is {worst:.3g}× the norm it bounds, so the meter "
            f"would not be sound here. Use the reference path (WitCertCache(backend='reference'); in SGLang "
            f"scheme='sglang'), or report it with these versions (witcert/selftest.py)")
    _CHECKED.add(key)
    log.info("write kernel self-check passed: %s (worst witness / norm %.4g over %d tokens × %d kv heads)",
             key, worst, N, H)
    return WriteSelfTest(key=key, tokens=N * H, worst_ratio=worst)


def check_window_kernel(win, dtype: torch.dtype, force: bool = False) -> WriteSelfTest | None:
    """The same check for the exact window's write (``kernels.exact_window``, radius 0 on its tokens): a canary
    written into a fresh ring of ``win``'s shape, in two launches (the second with the lengths as a tensor, as a
    captured step passes them), must hold the values bit for bit and norms κ, ν ≥ their float64 norms."""
    H, D, dev = win.k.shape[1], win.k.shape[-1], win.k.device
    key = ("window", win.sink, win.recent, D, H, str(dtype), dev.type, dev.index)
    if (key in _CHECKED and not force) or win.columns == 0:
        return None
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        log.info("window write self-check skipped inside a CUDA-graph capture: %s", key)
        return None
    from kernels.exact_window import ExactWindow

    N = max(win.columns + 7, 16)
    c = ExactWindow.allocate(1, H, D, dtype, win.sink, win.recent, device=dev)
    k, v = _canary(H, D, N, dtype, 3, dev), _canary(H, D, N, dtype, 4, dev)
    seq = torch.zeros(N, dtype=torch.long, device=dev)
    pos = torch.arange(N, device=dev)
    c.write(seq[:-1], pos[:-1], k[:-1], v[:-1], N - 1)
    c.write(seq[-1:], pos[-1:], k[-1:], v[-1:], torch.full((1,), N, device=dev))
    j = torch.cat([pos[: win.sink], pos[N - win.recent:]]) if win.recent else pos[: win.sink]
    col = c.columns_of(j, N)
    exact = [bool(torch.equal(c.k[0, :, col], k[j].movedim(0, 1))), bool(torch.equal(c.v[0, :, col], v[j].movedim(0, 1)))]
    ratios = {"window k_norm (κ)": _ratio(c.k_norm[0, :, col], k[j].double().norm(dim=-1).movedim(0, 1)),
              "window v_norm (ν)": _ratio(c.v_norm[0, :, col], v[j].double().norm(dim=-1).movedim(0, 1))}
    mins = torch.stack([r.min() for r in ratios.values()]).cpu()
    worst = float(mins.min())
    if not (all(exact) and worst >= 1.0):
        what = "its values differ from the exact ones" if not all(exact) else \
            f"its {list(ratios)[int(mins.argmin())]} is {worst:.3g}× the norm it bounds"
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        import triton

        raise _logged(
            f"WitCert's exact-window write failed its self-check on {name} (Triton {triton.__version__}, torch "
            f"{torch.__version__}; window ({win.sink}, {win.recent}), head dim {D}, model dtype {dtype}): {what}, so "
            f"the meter would not be sound here. Use WitCertCache(backend='reference'), or report it with these "
            f"versions (witcert/selftest.py)")
    _CHECKED.add(key)
    log.info("window write self-check passed: %s (worst norm ratio %.4g)", key, worst)
    return WriteSelfTest(key=key, tokens=int(j.numel()) * H, worst_ratio=worst)
