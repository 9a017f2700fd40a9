"""A once-per-process check of the compiled metered decode on the device it runs on (the kernel path's
``WitCertCache`` calls it before a layer's decode calls whenever their launch configuration is one it has not checked).

``witcert.selftest`` checks the write: every witness the kernel stores bounds the norm of the codes it stored. The
decode then turns those witnesses into TV⁺ and E⁺ through the sketch dot, the key levels, the histogram dots, the
split merge and the tilt, in code that Triton compiles per GPU architecture (inline PTX for the sketch's bf16 codes and
the L2 prefetch, tensor-core dots whose lowering differs between sm_80, sm_89 and sm_90). The conformance suites check
that arithmetic on the CPU (the interpreter) and on the GPUs the project has run; a user's GPU, driver or Triton may
compile it differently, and a bound that comes out low raises nothing.

``check_decode_kernel(paged, plan, q_dtype, sm_scale, q_heads, ...)`` runs the decode on a canary shaped as the
caller's launch, so that it runs the binaries the caller is about to run: the plan's tile, split count and kernel
variant, the caller's batch size (the merge's warps follow its rows), block-table width, padding-mask stride, output
buffer dtype, repaired-page overlay, exact window and Tier B (ints Triton specializes by ``int_class``; the kernel does
not specialize the cache's seed and layer). It checks the rows of its two distinct sequences against float64, from what the canary's cache
stores:

* TV⁺ ≥ the fractional supremum of TV over the box of the kernel's radius form before its binning and float32
  inflation: |δ_hj| ≤ c_h (W_j + max_h' |σ⟨q_h', r̃_j⟩| / c_h') (the shared sketch radius, ``bounds.sketch_radius``),
  c_h W_j + |σ⟨q_h, r̃_j⟩| (``head_levels``: ``shared=False``) or σ Σ_g ‖q_g‖ W_g (the group radius, ≤ the kernel's
  σ‖q‖‖W‖₂; ``bounds.logit_radius``), window and repaired tokens radius 0, each radius rounded down onto powers of
  2^(1/64) (fewer distinct radii for the float64 branch and bound). The kernel's binned box contains it, so a sound
  kernel is never below its supremum; with Tier B (int8_dither and a ``delta_step``) its TV⁺ likewise over the
  dither radius (``bounds.dither_radius``, with the fewest tokens the union bound could count). Where the launch
  meters the centred sketch box's excess form (``kernels.plan.EXCESS_FORM``), which may undercut the symmetric box's
  supremum, the floor is ``_excess_floor``: the supremum over the centred box c_h W_j around σ⟨q_h, r̃_j⟩, or the
  smaller of the symmetric supremum and the form's own float64 value where that is higher;
* the realised TV against exact attention (the canary's exact keys) ≤ TV⁺, and the served output's distance to exact
  attention ≤ E⁺;
* no row flagged (the canary is finite: a flagged row would be a meter that says nothing);

and the rows of every other sequence (copies of the two) against theirs, bit for bit (TV⁺, E⁺, Tier B's two, the flag
and the float32 output): a fault that depends on where a program runs in the grid (the fp8 write's was one) shows there.
A caller's batch of 1 runs as 2 (the merge's warps agree unless Hq is in the hundreds).

The canary: its first sequence spans two of the caller's tiles per split (up to ``CANARY_MAX_TOKENS``), with a
page of keys three times larger (larger radii) and a run of keys pointing away from the queries (tiles the sketch's
cold path may skip); its second is one page past the window, with ``CANARY_PADDING`` masked tokens in front when the
caller passes a mask (a one-page table: one page each); moderate keys with two outlier channels, pages in permuted
blocks, written by the write kernel, the window's rings written as the cache writes them, one page of each sequence in
an overlay when the caller's has pages, a random query in the model's dtype at the caller's softmax scale, the tilt on
every row.

What it does not see (run C4's canary rows and a review's injected faults): a fault lowering TV⁺ by less than ~15 % on
every row (the canary's smallest TV⁺ / supremum is 1.04-1.17; ~1 % where the excess form binds, whose floor
``_excess_floor`` is within 1.002-1.005 of a sound TV⁺ on the configurations with a window, run E4), faults confined
to a few tokens or splits, the rounding terms Ξ and η (below its resolution), E⁺'s value-side terms (E⁺ is 5-30× the
canary's realised output error), Tier B's E⁺, the graphed step's deferred record (``kernels.tilt_batch``: its finish, a separately compiled
kernel, runs the tilt and the closed forms; the canary's merge runs them itself) and SGLang's CSR rows. Once per
configuration and process; never inside a CUDA-graph
capture (logged); raises
``DecodeSelfTestError`` (logged first).

    check_decode_kernel(...) → DecodeSelfTest | None (None: already checked, or skipped in a capture)
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch
import triton

from contract.schemes import BLOCK_SCHEMES

from .selftest import WriteSelfTestError

log = logging.getLogger("witcert.selftest")

#: launch configurations already checked in this process (``decode_key``)
_CHECKED: set = set()
#: the canary's second sequence: this many pages past the exact window (less a few tokens: a partial last page)
CANARY_SHORT_PAGES = 1
#: the first sequence's tokens past the window: two of the caller's tiles per split, at least 3 pages, at most this
#: many (on the GPU: B 1 / 32K's 128 one-warp splits take 8,192, checked in 0.35 s on an H100, run C7; Triton's
#: interpreter takes the CPU cap)
CANARY_MAX_TOKENS = {"cuda": 8192, "cpu": 256}
#: masked tokens at the front of the canary's second sequence when the caller passes a padding mask (HAS_MASK)
CANARY_PADDING = 3
#: the fractional supremum's branch-and-bound tolerance, subtracted from it (the conformance suite's)
SUP_TOL = 2.0**-14
#: the lower check's radii are rounded down onto powers of 2^(1/SHRINK_STEPS) (``_shrunk``): at most 1.1 % smaller
#: (1.7 % at subnormal radii)
SHRINK_STEPS = 64
#: float64 evaluation slack of the lower check (the conformance suite's; the kernel's own slack is far larger)
SUP_ABS_SLACK = 1e-7


class DecodeSelfTestError(WriteSelfTestError):
    """The compiled decode reported a bound below what its own stored witnesses imply, or below the realised error,
    on this device (a ``WriteSelfTestError`` too: callers that handle the write's failure handle this one)."""


@dataclasses.dataclass(frozen=True)
class DecodeSelfTest:
    """The outcome of one check: the configuration, the canary's rows checked against float64 (two sequences × query
    heads; the other sequences' rows are compared with theirs), the smallest TV⁺ − max(fractional supremum, realised
    TV) over them and the smallest TV⁺ / fractional supremum over the rows whose supremum is > 1e-9 (how far a fault may
    lower TV⁺ before the check sees it; inf without such a row), the largest realised output error / E⁺, and how many
    rows had TV⁺ < 1 (rows where the check says something; 0 is logged as a warning)."""

    key: tuple
    rows: int
    worst_tv_margin: float
    worst_tv_ratio: float
    worst_err_ratio: float
    informative_rows: int


def int_class(x: int) -> int:
    """An int argument as a compiled Triton kernel sees it: specialized on being 1 and on being a multiple of 16 (the
    pinned Triton's and 3.6.0's rule), so 1, 16 and 2 stand for its three binaries."""
    return 1 if x == 1 else 16 if x % 16 == 0 else 2


def _at_least(x: int, m: int) -> int:
    """The smallest int ≥ m of ``x``'s ``int_class`` (x itself when x ≥ m)."""
    if x >= m:
        return x
    if int_class(x) == 16:
        return -(-m // 16) * 16
    if int_class(x) == 2:
        return m if int_class(m) == 2 else m + 1
    return m  # (x = 1: no wider int shares its class)


def _mask_stride(token_mask: torch.Tensor) -> int:
    """The row stride of the padding mask as the kernel reads it (``kernels.decode`` makes rows contiguous first)."""
    return token_mask.stride(0) if token_mask.stride(1) == 1 else token_mask.shape[1]


def decode_key(paged, plan, q_dtype: torch.dtype, q_heads: int, window=None, repair=None, token_mask=None,
               batch: int = 2, table_width: int | None = None, out_dtype: torch.dtype | None = None) -> tuple:
    """What the decode and its merge are compiled for: the cache's configuration (not its seed and layer: the decode
    kernel does not specialize them), the plan (tile, kernel variant; the split count's class and its power of two, the merge's SP), the
    query dtype, the window, the overlay (HAS_REP), the padding mask (HAS_MASK, its stride's class), the batch's class
    and the merge's warps (they follow its rows), the block table's width class, the output buffer's dtype, the
    device."""
    from kernels.epilogue import _sms, merge_warps

    dev = paged.k_codes.device
    win = None if window is None or window.columns == 0 else (window.sink, window.recent)
    S = plan.num_splits
    sp = triton.next_power_of_2(S)
    return (paged.scheme, paged.head_dim, paged.num_kv_heads, paged.block_size, paged.num_groups,
            paged.per_token_witness, paged.sketch_bits, paged.has_weights, paged.head_levels, paged.block_norms,
            str(q_dtype), q_heads, win,
            repair is not None and repair.count > 0,
            None if token_mask is None else int_class(_mask_stride(token_mask)),
            int_class(batch), merge_warps(sp, paged.head_dim, True, batch * q_heads, _sms(dev)),
            None if table_width is None else int_class(table_width),
            None if out_dtype is None else str(out_dtype),
            dataclasses.replace(plan, num_splits=(int_class(S), sp)), dev.type, dev.index)


def _lens(T: int, win: tuple[int, int], scheme: str, plan, cap: int, table_width: int | None) -> tuple[int, int]:
    """The two distinct sequences' lengths: the first past the window by two of the caller's tiles per split (≥ 3
    pages, ≤ ``cap`` tokens), the second by ``CANARY_SHORT_PAGES``; partial last pages except for the block schemes
    (whole pages per write). A one-page block table (a cache of ≤ T tokens) takes one page each: no wider table has
    its ``int_class``."""
    if table_width == 1:
        return (T, T) if scheme in BLOCK_SCHEMES else (T - 1, max(1, T - 4))
    base = -(-(win[0] + win[1]) // T) * T
    body = max(3 * T, min(2 * plan.pages_per_tile * T * plan.num_splits, cap))
    body = -(-body // T) * T
    lens = (base + body, base + CANARY_SHORT_PAGES * T)
    return lens if scheme in BLOCK_SCHEMES else (lens[0] - 1, lens[1] - 4)


def _canary_kv(n: int, H: int, D: int, dtype: torch.dtype, seed: int, q: torch.Tensor | None, T: int,
               base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact K, V [n, H, D]: moderate rows with two outlier channels (×4); with ``q`` [Hq, D] (the first sequence) a
    page of keys ×3 at ``base + T`` and, from the middle, a quarter of the tokens (at least a page) pointing away from
    the mean query of their kv head (logits far below the row's maximum: tiles the sketch's cold path may take)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, H, D, generator=g)
    k[..., :2] *= 4
    v = torch.randn(n, H, D, generator=g)
    if q is not None:
        if base + 2 * T <= n:
            k[base + T: base + 2 * T] *= 3
        qm = q.float().cpu().view(H, -1, D).mean(1)
        qm = qm / qm.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        lo = n // 2
        hi = min(n, lo + max(T, n // 4))
        k[lo:hi] = -5 * k[lo:hi].norm(dim=-1, keepdim=True) * qm[None] + 0.1 * k[lo:hi]
    return k.to(dtype), v.to(dtype)


def _radius(c, bt, b: int, n: int, q: torch.Tensor, sm: float, win: tuple[int, int], repaired=None,
            centred: bool = False):
    """float64 radii [Hq, n] of sequence b and the box's centres (None: 0): the sketch radius in the kernel's form (a
    sketch or channel weights; shared by a kv head's query heads, or per head with ``head_levels``), or with
    ``centred`` (the launch's excess sums, ``kernels.decode.excess_form``) the centred box c_h W_j around
    σ⟨q_h, r̃_j⟩ (it lies inside the symmetric one, so a sound TV⁺ of either form is above its supremum), or the
    group radius, from the canary's stored witnesses (and sketch), 0 on the window's tokens and on ``repaired`` ones
    ([n] bool, every kv head)."""
    from . import bounds as B
    from .cache_kernel import served_sketch

    T, H = c.block_size, c.num_kv_heads
    dev = c.k_codes.device
    GQ = q.shape[0] // H
    j = torch.arange(n, device=dev)
    blk = bt[b, j // T].long()
    off = j % T if c.per_token_witness else torch.zeros_like(j)
    W = c.k_wit[blk, :, off].double().cpu().numpy()  # [n, H, G]
    exact = B.window_mask(n, win) if sum(win) else np.zeros(n, dtype=bool)
    if repaired is not None:
        exact = exact | repaired
    qd = q.double().cpu().numpy().reshape(H, GQ, -1)
    out = np.zeros((H, GQ, n))
    if c.weighted:
        rt = served_sketch(c, bt, n, torch.tensor([b]))
        rt = np.zeros((H, n, c.head_dim)) if rt is None else rt[0].cpu().numpy()
        rt[:, exact] = 0.0
        w = np.where(exact[None, :], 0.0, W[..., 0].T)  # [H, n]
        a = c.weights.double().cpu().numpy()
        if centred:
            cen = np.zeros((H, GQ, n))
            for h in range(H):
                out[h] = B.sketch_radius(qd[h], rt[h], w[h], sm, a[h], centered=True)
                cen[h] = B.sketch_center(qd[h], rt[h], sm)
            return out.reshape(H * GQ, n), cen.reshape(H * GQ, n)
        for h in range(H):
            out[h] = B.sketch_radius(qd[h], rt[h], w[h], sm, a[h], shared=not c.head_levels)
    else:
        groups = c.groups()
        for h in range(H):
            for g in range(GQ):
                out[h, g] = B.logit_radius(qd[h, g], W[:, h, :], groups, sm, block_size=1, n=n)
        out[..., exact] = 0.0
    return out.reshape(H * GQ, n), None


def _excess_floor(ph: np.ndarray, sup_sym: np.ndarray, eps: np.ndarray, cen: np.ndarray, live: np.ndarray,
                  xi: np.ndarray, grid: bool = False) -> np.ndarray:
    """The floor of a TV⁺ with the excess form (``kernels.plan.EXCESS_FORM``), per head: max(the fractional supremum
    over the centred box c ± ε, min(the form's own float64 value (1 − 2^-10)·min(e^{−2Ξ}·min(1, max(Σ p̂ (e^{−c+ε} −
    1)₊, Σ p̂ (1 − e^{−c−ε})₊)), G) − 2^-30, ``sup_sym``)), G the (t, λ) grid's form (``kernels.excess_grid``, with
    ``grid``) over p̂ itself at Ξ = 0. The kernel's TV⁺ is the smaller of its histogram forms (≥ the
    symmetric box's supremum ``sup_sym``) and its excess form, over p̃ (p̂ ≤ e^{2Ξ} p̃ after normalisation) and a box
    around its fp32 sketch dot c̃, inflated by 2^-12 ε + 2^-20 |c̃| + μ: that box holds this one up to the dot's own
    rounding |c̃ − c| (the witness's γ‖r̃/a‖ term bounds it; in practice far smaller than the inflation), and the
    2^-10 covers what it leaves (an adversarial review, helper-41: the kernel's value never came within 1e-4 of the
    float64 sums in 200 cases). The grid's form over p̃ is ≥ Σ p̂ g_j, its value over p̂ at Ξ = 0 (Lean
    ``sub_dualDBox_le_gridBound``), and grows with the box (``dualDBox_mono``). A floor above a sound TV⁺ would refuse
    the configuration (availability, not soundness). A TV⁺ scaled down by 1 % falls below the second term where the
    first (1.08-1.30× below a sound TV⁺ on the canary, run D5) would not see it."""
    from . import bounds as B

    eps, cen = eps * live, cen * live
    sup_c = B.tv_bound_tilt(ph, _shrunk(eps), tol=SUP_TOL, center=cen) - SUP_TOL - SUP_ABS_SLACK
    a = (ph * np.maximum(np.expm1(-cen + eps), 0.0)).sum(-1)
    b = (ph * np.maximum(-np.expm1(-cen - eps), 0.0)).sum(-1)
    own = np.exp(-2.0 * xi) * np.minimum(np.maximum(a, b), 1.0)
    if grid:
        own = np.minimum(own, _grid_own(ph, cen, eps))
    own = (1.0 - 2.0**-10) * own - 2.0**-30
    return np.maximum(sup_c, np.minimum(own, sup_sym))


def _grid_own(ph: np.ndarray, cen: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """The (t, λ) grid's form (``kernels.excess_grid.grid_form_torch``) over p̂ [H, n] and the centred box, float64,
    Ξ = 0 (the sums: ``excess_grid.grid_block_fp64``)."""
    from kernels.excess_grid import grid_block_fp64, grid_form_torch

    a_hat, gs = grid_block_fp64(ph, cen, eps)
    return grid_form_torch(torch.from_numpy(np.asarray(a_hat)), torch.from_numpy(gs),
                           torch.zeros(ph.shape[:-1], dtype=torch.float64)).numpy()


def _shrunk(eps: np.ndarray) -> np.ndarray:
    """Radii rounded **down** onto the grid 2^(k/``SHRINK_STEPS``) (0 stays 0): each token's box shrinks, so the
    supremum over the shrunk boxes is still below a sound kernel's TV⁺, and the branch and bound has ≤ a few hundred
    distinct radii per row instead of one per token (canary rows of up to 8,192 tokens)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.exp2(np.floor(np.log2(eps) * SHRINK_STEPS) / SHRINK_STEPS)
    return np.where(eps > 0, np.minimum(np.where(np.isfinite(e), e, eps), eps), eps)


def _tier_b_radius(c, bt, b: int, n: int, q: torch.Tensor, sm: float, delta: float, exact: np.ndarray) -> np.ndarray:
    """float64 Tier B radii [Hq, n] of sequence b (SPEC §5, ``bounds.dither_radius`` with its bias) from the canary's
    stored key scales, with the union bound over only the compressed live tokens (the kernel counts the whole length:
    a larger radius), 0 where ``exact``."""
    from . import bounds as B

    T, H = c.block_size, c.num_kv_heads
    dev = c.k_codes.device
    GQ = q.shape[0] // H
    j = torch.arange(n, device=dev)
    scales = c.k_scale[bt[b, j // T].long(), :, j % T].double().cpu().numpy()  # [n, H]
    m = max(1, int(np.sum(~exact)))
    out = np.zeros((H * GQ, n))
    for hq in range(H * GQ):
        qq, s = q[hq].double().cpu().numpy(), scales[:, hq // GQ]
        out[hq] = B.dither_radius(B.dither_variance_proxy(qq, s, sm), m, delta, bias=B.dither_bias_bound(qq, s, sm))
    out[:, exact] = 0.0
    return out


def check_decode_kernel(paged, plan, q_dtype: torch.dtype, sm_scale: float, q_heads: int, window=None,
                        delta_step: float | None = None, repair=None, token_mask=None, batch: int = 2,
                        table_width: int | None = None, out_dtype: torch.dtype | None = None,
                        force: bool = False) -> DecodeSelfTest | None:
    """Check the metered decode for ``paged``'s configuration (a ``kernels.paged.PagedKV``), launched with ``plan``
    (``kernels.plan.DecodePlan``) on ``batch`` sequences of ``q_heads`` query heads of ``q_dtype`` at softmax scale
    ``sm_scale``, with the exact ``window`` (``kernels.exact_window.ExactWindow`` or None), Tier B's ``delta_step``, the
    repaired-page overlay ``repair`` (``kernels.repair.RepairOverlay`` or None), the padding mask ``token_mask`` (the
    caller's, or None), a block table ``table_width`` pages wide and an output buffer of ``out_dtype`` (None: float32,
    cast by the caller), once per configuration (``decode_key``) and process; raise ``DecodeSelfTestError`` where a row
    fails the float64 check (module doc). ``force``: run even if this process has checked the configuration."""
    if token_mask is not None:
        out_dtype = None  # (decode writes a caller's buffer only without a mask)
    key = decode_key(paged, plan, q_dtype, q_heads, window, repair, token_mask, batch, table_width, out_dtype)
    if key in _CHECKED and not force:
        return None
    dev = paged.k_codes.device
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        log.info("decode self-check skipped inside a CUDA-graph capture: %s", key[:14])
        return None
    from kernels.decode import decode, excess_form
    from kernels.exact_window import ExactWindow
    from kernels.paged import PagedKV
    from kernels.plan import plan_decode
    from kernels.repair import RepairOverlay
    from kernels.write import write_kv

    from . import bounds as B
    from .cache_kernel import served_kv

    H, D, T = paged.num_kv_heads, paged.head_dim, paged.block_size
    GQ = q_heads // H
    Bc = max(2, batch)
    win = (0, 0) if window is None or window.columns == 0 else (window.sink, window.recent)
    base = -(-(win[0] + win[1]) // T) * T
    lens = _lens(T, win, paged.scheme, plan, CANARY_MAX_TOKENS["cuda" if dev.type == "cuda" else "cpu"], table_width)
    pages = [-(-n // T) for n in lens]
    seq_pages = [pages[b % 2] for b in range(Bc)]
    nb = sum(seq_pages) + 2
    c = PagedKV.allocate(nb, H, D, scheme=paged.scheme, block_size=T, num_groups=paged.num_groups,
                         per_token_witness=paged.per_token_witness, model_dtype=q_dtype, device=dev, seed=paged.seed,
                         layer=paged.layer, with_exact=False, sketch_bits=paged.sketch_bits,
                         weights=paged.weights if paged.has_weights else None, head_levels=paged.head_levels,
                         block_norms=paged.block_norms)
    c.group_id = paged.group_id.clone()  # the caller's channel groups (RoPE bands)
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(5)).int()
    W = max(pages) if table_width is None else _at_least(table_width, max(pages))
    bt = torch.zeros(Bc, W, dtype=torch.int32)
    first = 0
    for b in range(Bc):
        bt[b, : seq_pages[b]] = perm[first: first + seq_pages[b]]
        first += seq_pages[b]
    bt = bt.to(dev)
    q = torch.randn(Bc, q_heads, D, generator=torch.Generator().manual_seed(7)).to(q_dtype)
    q[2:] = q[torch.arange(2, Bc) % 2]  # copies of the two distinct sequences
    q = q.to(dev)
    exact = [tuple(t.to(dev) for t in _canary_kv(lens[0], H, D, q_dtype, 11, q[0], T, base)),
             tuple(t.to(dev) for t in _canary_kv(lens[1], H, D, q_dtype, 12, None, T, base))]
    rings = ExactWindow.allocate(Bc, H, D, q_dtype, *win, device=dev) if sum(win) else None
    for par in (0, 1):
        n, (k, v) = lens[par], exact[par]
        seqs = torch.arange(par, Bc, 2, device=dev)
        seq = seqs.repeat_interleave(n)
        pos = torch.arange(n, device=dev).repeat(len(seqs))
        kk, vv = k.repeat(len(seqs), 1, 1), v.repeat(len(seqs), 1, 1)
        write_kv(c, kk, vv, bt, seq, pos, store_exact=False)
        if rings is not None:
            rings.write(seq, pos, kk, vv, n)
    ov, repaired = None, [np.zeros(n, dtype=bool) for n in lens]
    if repair is not None and repair.count > 0:  # one page of each sequence served exact from an overlay (HAS_REP)
        ov = RepairOverlay.allocate(nb, H, T, D, q_dtype, device=dev).bind(c)
        for b in range(Bc):
            n, (k, v) = lens[b % 2], exact[b % 2]
            pg = min(1, pages[b % 2] - 1)
            lo, hi = pg * T, min((pg + 1) * T, n)
            for h in range(H):
                ov.page_in(int(bt[b, pg]), h, k[lo:hi, h], v[lo:hi, h])
            repaired[b % 2] = (np.arange(n) >= lo) & (np.arange(n) < hi)
    sl = torch.tensor([lens[b % 2] for b in range(Bc)], dtype=torch.int32, device=dev)
    tm = None
    if token_mask is not None:  # left padding on the odd sequences, in rows of the caller's stride class
        L = W * T
        tm = torch.ones(Bc, _at_least(_mask_stride(token_mask), L), dtype=torch.bool, device=dev)[:, :L]
        tm[1::2, :CANARY_PADDING] = False
    cplan = plan_decode(c, Bc, q_heads, q_dtype, dev, W * T, meter=True, levels=plan.levels, delta_step=delta_step,
                        repair=ov, window=rings, num_splits=plan.num_splits, tile=plan.tile)
    if dataclasses.replace(cplan, pages_per_tile=plan.pages_per_tile, auto_tile=plan.auto_tile) != plan:
        log.warning("decode self-check: the canary's plan differs from the caller's, so it checks another kernel "
                    "variant (%s against %s)", cplan, plan)
    o = None if out_dtype is None else torch.empty(Bc, q_heads, D, dtype=out_dtype, device=dev)
    out = decode(c, q, bt, sl, sm_scale=sm_scale, meter=True, plan=cplan, delta_step=delta_step, tilt_above=-1.0,
                 token_mask=tm, repair=ov, window=rings, out=o, store_dtype=None if o is not None else q_dtype)
    rec = out.meter
    tv_k = rec.tv_upper_a.double().cpu().numpy()
    tvb_k = None if rec.tv_upper_b is None else rec.tv_upper_b.double().cpu().numpy()
    err_k = rec.out_err_upper.double().cpu().numpy()
    flag = rec.flag.cpu().numpy()
    served = out.o.double() if o is not None else out.o.to(q_dtype).double()
    margins, tv_ratios, ratios, fails = [], [], [], []
    for b in (0, 1):
        n, (k, v) = lens[b], exact[b]
        kh, _ = served_kv(c, bt, n, repair=ov, rows=torch.tensor([b]), window=rings)
        kh = kh[0].repeat_interleave(GQ, dim=0)  # [Hq, n, D]
        kx = k.double().movedim(0, 1).repeat_interleave(GQ, dim=0)
        vx = v.double().movedim(0, 1).repeat_interleave(GQ, dim=0)
        qq = q[b].double()
        live = torch.ones(n, dtype=torch.bool, device=dev) if tm is None else tm[b, :n]
        p_hat = torch.softmax((sm_scale * torch.einsum("hd,hnd->hn", qq, kh)).masked_fill(~live, -torch.inf), -1)
        p = torch.softmax((sm_scale * torch.einsum("hd,hnd->hn", qq, kx)).masked_fill(~live, -torch.inf), -1)
        livec = live.cpu().numpy()
        eps, _ = _radius(c, bt, b, n, q[b], sm_scale, win, repaired[b])
        eps = eps * livec
        ph = p_hat.cpu().numpy()
        sup = B.tv_bound_tilt(ph, _shrunk(eps), tol=SUP_TOL) - SUP_TOL - SUP_ABS_SLACK
        if excess_form(cplan):  # (the excess form may undercut the symmetric box's supremum: module doc)
            sup = _excess_floor(ph, sup, *_radius(c, bt, b, n, q[b], sm_scale, win, repaired[b], centred=True), livec,
                                rec.xi[b].double().cpu().numpy(), grid=cplan.grid)
        real = (0.5 * (p - p_hat).abs().sum(-1)).cpu().numpy()
        err = (torch.einsum("hn,hnd->hd", p, vx) - served[b]).norm(dim=-1).cpu().numpy()
        ratio = np.where(err_k[b] > 0, err / np.where(err_k[b] > 0, err_k[b], 1.0), np.where(err > 0, np.inf, 0.0))
        margins.append(tv_k[b] - np.maximum(sup, real))
        tv_ratios.append(np.where(sup > 1e-9, tv_k[b] / np.maximum(sup, 1e-300), np.inf))
        ratios.append(ratio)
        supb = None
        if tvb_k is not None:
            exact_tok = (B.window_mask(n, win) if sum(win) else np.zeros(n, dtype=bool)) | repaired[b] | ~livec
            tb = _tier_b_radius(c, bt, b, n, q[b], sm_scale, delta_step, exact_tok)
            supb = B.tv_bound_tilt(ph, _shrunk(tb), tol=SUP_TOL) - SUP_TOL - SUP_ABS_SLACK
        for h in range(q_heads):
            why = []
            if flag[b, h]:
                why.append("flagged (non-finite) on a finite canary")
            if not tv_k[b, h] >= sup[h]:
                why.append(f"TV⁺ {tv_k[b, h]:.6g} below the fractional supremum {sup[h]:.6g} of its stored box"
                           + (" (with the excess form: _excess_floor)" if excess_form(cplan) else ""))
            if not tv_k[b, h] >= real[h]:
                why.append(f"TV⁺ {tv_k[b, h]:.6g} below the realised TV {real[h]:.6g}")
            if supb is not None and not tvb_k[b, h] >= supb[h]:
                why.append(f"Tier B's TV⁺ {tvb_k[b, h]:.6g} below the fractional supremum {supb[h]:.6g} of its box")
            if not ratio[h] <= 1.0 + 1e-9:
                why.append(f"E⁺ {err_k[b, h]:.6g} below the served output's error {err[h]:.6g}")
            if why:
                fails.append(f"sequence {b} head {h}: " + "; ".join(why))
    errb_k = None if rec.out_err_upper_b is None else rec.out_err_upper_b.double().cpu().numpy()
    raw = out.o.double()  # (the copies are compared before the cast into the model's dtype)
    for b in range(2, Bc):  # the copies: the same rows, bit for bit, wherever their programs ran
        same = [np.array_equal(tv_k[b], tv_k[b % 2]), np.array_equal(err_k[b], err_k[b % 2]),
                np.array_equal(flag[b], flag[b % 2]), bool(torch.equal(raw[b], raw[b % 2]))]
        if tvb_k is not None:  # (a Tier B gate decides on min(TV⁺_A, TV⁺_B))
            same += [np.array_equal(tvb_k[b], tvb_k[b % 2]), np.array_equal(errb_k[b], errb_k[b % 2])]
        if not all(same):
            fails.append(f"sequence {b} (a copy of sequence {b % 2}): its record or output differs from the copy's")
    margins, tv_ratios, ratios = np.concatenate(margins), np.concatenate(tv_ratios), np.concatenate(ratios)
    if fails:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        msg = (f"WitCert's metered decode failed its self-check on {name} (Triton {triton.__version__}, torch "
               f"{torch.__version__}; scheme {paged.scheme}, head dim {D}, query dtype {q_dtype}, window {win}, tile "
               f"{plan.tile}, {plan.num_splits} splits, batch {batch}): {len(fails)} canary rows — "
               + " | ".join(fails[:4]) + ". The meter would not be sound here. Use the reference path "
               "(WitCertCache(backend='reference')), or report it with these versions (witcert/selftest_decode.py)")
        log.error(msg)  # logged first: a caller that keeps serving on it leaves the reason in the log
        raise DecodeSelfTestError(msg)
    _CHECKED.add(key)
    res = DecodeSelfTest(key=key, rows=int(margins.size), worst_tv_margin=float(margins.min()),
                         worst_tv_ratio=float(tv_ratios.min()), worst_err_ratio=float(ratios.max()),
                         informative_rows=int(np.sum(tv_k[:2] < 1.0)))
    if res.informative_rows == 0:
        log.warning("decode self-check: every canary row's TV⁺ is 1 at softmax scale %g, so the check said nothing "
                    "about this configuration: %s", sm_scale, key[:14])
    log.info("decode self-check passed: %s (%d rows of %d sequences, %d with TV⁺ < 1; worst TV⁺ margin %.3g, TV⁺ / "
             "supremum ≥ %.4g, worst error / E⁺ %.3g)", key[:14], res.rows, Bc, res.informative_rows,
             res.worst_tv_margin, res.worst_tv_ratio, res.worst_err_ratio)
    return res
