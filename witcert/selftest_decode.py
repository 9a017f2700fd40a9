"""A once-per-process check of the compiled metered decode on the device it runs on (the kernel path's
``WitCertCache`` calls it before a layer's first metered decode of each launch configuration).

``witcert.selftest`` checks the write: every witness the kernel stores bounds the norm of the codes it stored. The
decode then turns those witnesses into TV⁺ and E⁺ through the sketch dot, the key levels, the histogram dots, the
split merge and the tilt, in code that Triton compiles per GPU architecture (inline PTX for the sketch's bf16 codes and
the L2 prefetch, tensor-core dots whose lowering differs between sm_80, sm_89 and sm_90). The conformance suites check
that arithmetic on the CPU (the interpreter) and on the GPUs the project has run; a user's GPU, driver or Triton may
compile it differently, and a bound that comes out low raises nothing.

``check_decode_kernel(paged, plan, q_dtype, sm_scale, q_heads, window=, delta_step=)`` runs the decode on a canary
with the caller's launch configuration (the plan's tile, split count and kernel variant: the binary the caller is about
to run; a later split count of the same ``split_class`` is not checked again) and checks every (sequence, query head)
row against float64, from what the canary's cache stores:

* TV⁺ ≥ the fractional supremum of TV over the box of the kernel's radius form before its binning and float32
  inflation: |δ_hj| ≤ c_h (W_j + max_h' |σ⟨q_h', r̃_j⟩| / c_h') (the shared sketch radius, ``bounds.sketch_radius``),
  c_h W_j + |σ⟨q_h, r̃_j⟩| (``head_levels``: ``shared=False``) or σ Σ_g ‖q_g‖ W_g (the group radius, ≤ the kernel's
  σ‖q‖‖W‖₂; ``bounds.logit_radius``), window tokens radius 0. The kernel's binned box contains it, so a sound kernel
  is never below its supremum;
* the realised TV against exact attention (the canary's exact keys) ≤ TV⁺, and the served output's distance to exact
  attention ≤ E⁺;
* no row flagged (the canary is finite: a flagged row would be a meter that says nothing).

The canary: two sequences (a few pages past the exact window, not whole pages), moderate keys with two outlier channels,
pages in permuted blocks, written by the write kernel (itself self-checked), the exact window's rings written as the
cache writes them, a random query in the model's dtype at the caller's softmax scale, the tilt on every row. Once per
configuration and process; never inside a CUDA-graph capture (logged); raises ``DecodeSelfTestError`` (logged first).
Where the caller reads a repaired-page overlay with pages in it (a gated cache after a page-in; kivi2's held partial
page), the canary pages in one page of each sequence (HAS_REP); where it passes a padding mask, the canary masks the
front of its second sequence (HAS_MASK). Not part of the canary: the graphed step's deferred
tilt (``kernels.tilt_batch``: the canary's merge runs the tilt itself) and SGLang's CSR rows.

    check_decode_kernel(...) → DecodeSelfTest | None (None: already checked, or skipped in a capture)
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from contract.schemes import BLOCK_SCHEMES

from .selftest import WriteSelfTestError

log = logging.getLogger("witcert.selftest")

#: launch configurations already checked in this process (``decode_key``)
_CHECKED: set = set()
#: the canary's sequences: this many pages past the exact window, less a few tokens (a partial last page)
CANARY_EXTRA_PAGES = (3, 1)
#: masked tokens at the front of the canary's second sequence when the caller passes a padding mask (HAS_MASK)
CANARY_PADDING = 3
#: the fractional supremum's branch-and-bound tolerance, subtracted from it (the conformance suite's)
SUP_TOL = 2.0**-14
#: float64 evaluation slack of the lower check (the conformance suite's; the kernel's own slack is far larger)
SUP_ABS_SLACK = 1e-7


class DecodeSelfTestError(WriteSelfTestError):
    """The compiled decode reported a bound below what its own stored witnesses imply, or below the realised error,
    on this device (a ``WriteSelfTestError`` too: callers that handle the write's failure handle this one)."""


@dataclasses.dataclass(frozen=True)
class DecodeSelfTest:
    """The outcome of one check: the configuration, the canary's rows (sequence × query head), the smallest
    TV⁺ − max(fractional supremum, realised TV) over them and the smallest TV⁺ / fractional supremum (how far a
    fault may lower TV⁺ before the check sees it), the largest realised output error / E⁺, and how many rows had
    TV⁺ < 1 (rows where the check says something)."""

    key: tuple
    rows: int
    worst_tv_margin: float
    worst_tv_ratio: float
    worst_err_ratio: float
    informative_rows: int


def split_class(num_splits: int) -> int:
    """The split count as the compiled kernels see it: Triton specializes an int argument on being 1 and on being a
    multiple of 16, so 1, 16 and 2 stand for the three binaries (a decode's split count follows its length: keying on
    the count itself would check again at every new count, ~50-80 ms each on an H100, run C2)."""
    return 1 if num_splits == 1 else 16 if num_splits % 16 == 0 else 2


def decode_key(paged, plan, q_dtype: torch.dtype, window, repair=None, masked: bool = False) -> tuple:
    """What the decode is compiled for: the cache's configuration, the plan (tile, kernel variant; the split count's
    ``split_class``), the query dtype, the window, whether a repaired-page overlay (HAS_REP) and a padding mask
    (HAS_MASK) are read, and the device."""
    dev = paged.k_codes.device
    win = None if window is None or window.columns == 0 else (window.sink, window.recent)
    return (paged.scheme, paged.head_dim, paged.num_kv_heads, paged.block_size, paged.num_groups,
            paged.per_token_witness, paged.sketch_bits, paged.has_weights, paged.head_levels, str(q_dtype), win,
            repair is not None and repair.count > 0, bool(masked),
            dataclasses.replace(plan, num_splits=split_class(plan.num_splits)), dev.type, dev.index)


def _canary_lens(T: int, win: tuple[int, int], scheme: str) -> tuple[int, int]:
    """Two sequence lengths a few pages past the window: partial last pages, except for the block schemes (whole pages
    per write)."""
    base = -(-(win[0] + win[1]) // T) * T
    if scheme in BLOCK_SCHEMES:
        return tuple(base + p * T for p in CANARY_EXTRA_PAGES)
    return tuple(base + p * T - 3 * (i + 1) + 2 for i, p in enumerate(CANARY_EXTRA_PAGES))


def _keys(N: int, H: int, D: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[N, H, D] moderate rows with two outlier channels (×4): logits spread enough for a peaked, unsaturated row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, D, generator=g)
    x[..., :2] *= 4
    return x.to(dtype)


def _radius(c, bt, b: int, n: int, q: torch.Tensor, sm: float, win: tuple[int, int], repaired=None) -> np.ndarray:
    """float64 radii [Hq, n] of sequence b: the sketch radius in the kernel's form (a sketch or channel weights; shared
    by a kv head's query heads, or per head with ``head_levels``) or the group radius, from the canary's stored
    witnesses (and sketch), 0 on the window's tokens and on ``repaired`` ones ([n] bool, every kv head)."""
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
        for h in range(H):
            out[h] = B.sketch_radius(qd[h], rt[h], w[h], sm, a[h], shared=not c.head_levels)
    else:
        groups = c.groups()
        for h in range(H):
            for g in range(GQ):
                out[h, g] = B.logit_radius(qd[h, g], W[:, h, :], groups, sm, block_size=1, n=n)
        out[..., exact] = 0.0
    return out.reshape(H * GQ, n)


def check_decode_kernel(paged, plan, q_dtype: torch.dtype, sm_scale: float, q_heads: int, window=None,
                        delta_step: float | None = None, repair=None, masked: bool = False) -> DecodeSelfTest | None:
    """Check the metered decode for ``paged``'s configuration (a ``kernels.paged.PagedKV``), launched with ``plan``
    (``kernels.plan.DecodePlan``) on ``q_heads`` query heads of ``q_dtype`` at softmax scale ``sm_scale``, with the
    exact ``window`` (``kernels.exact_window.ExactWindow`` or None), Tier B's ``delta_step`` and the caller's
    repaired-page overlay ``repair`` (``kernels.repair.RepairOverlay`` or None: with pages in it, the canary pages in
    one page of each sequence too) and whether the caller passes a padding mask (``masked``: the canary's second
    sequence then has CANARY_PADDING masked tokens in front), once per configuration and process; raise
    ``DecodeSelfTestError`` where a row's bound is below the float64 check (module doc)."""
    key = decode_key(paged, plan, q_dtype, window, repair, masked)
    if key in _CHECKED:
        return None
    dev = paged.k_codes.device
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        log.info("decode self-check skipped inside a CUDA-graph capture: %s", key[:11])
        return None
    from kernels.decode import decode
    from kernels.exact_window import ExactWindow
    from kernels.paged import PagedKV
    from kernels.plan import plan_decode
    from kernels.repair import RepairOverlay
    from kernels.write import write_kv

    from . import bounds as B
    from .cache_kernel import served_kv

    H, D, T = paged.num_kv_heads, paged.head_dim, paged.block_size
    win = (0, 0) if window is None or window.columns == 0 else (window.sink, window.recent)
    lens = _canary_lens(T, win, paged.scheme)
    pages = [-(-n // T) for n in lens]
    nb = sum(pages) + 2
    c = PagedKV.allocate(nb, H, D, scheme=paged.scheme, block_size=T, num_groups=paged.num_groups,
                         per_token_witness=paged.per_token_witness, model_dtype=q_dtype, device=dev, seed=paged.seed,
                         layer=paged.layer, with_exact=False, sketch_bits=paged.sketch_bits,
                         weights=paged.weights if paged.has_weights else None, head_levels=paged.head_levels)
    c.group_id = paged.group_id.clone()  # the caller's channel groups (RoPE bands)
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(5))
    bt = torch.zeros(2, max(pages), dtype=torch.int32)
    bt[0, : pages[0]] = perm[: pages[0]].int()
    bt[1, : pages[1]] = perm[pages[0]: pages[0] + pages[1]].int()
    bt = bt.to(dev)
    exact = [(_keys(n, H, D, q_dtype, 11 + b).to(dev), _keys(n, H, D, q_dtype, 21 + b).to(dev))
             for b, n in enumerate(lens)]
    rings = ExactWindow.allocate(2, H, D, q_dtype, *win, device=dev) if sum(win) else None
    for b, (n, (k, v)) in enumerate(zip(lens, exact)):
        seq = torch.full((n,), b, dtype=torch.long, device=dev)
        pos = torch.arange(n, device=dev)
        write_kv(c, k, v, bt, seq, pos, store_exact=False)
        if rings is not None:
            rings.write(seq, pos, k, v, n)
    ov, repaired = None, [None, None]
    if repair is not None and repair.count > 0:  # one page of each sequence served exact from an overlay (HAS_REP)
        ov = RepairOverlay.allocate(nb, H, T, D, q_dtype, device=dev).bind(c)
        for b, (n, (k, v)) in enumerate(zip(lens, exact)):
            pg = min(1, pages[b] - 1)
            lo, hi = pg * T, min((pg + 1) * T, n)
            for h in range(H):
                ov.page_in(int(bt[b, pg]), h, k[lo:hi, h], v[lo:hi, h])
            repaired[b] = (np.arange(n) >= lo) & (np.arange(n) < hi)
    q = (torch.randn(2, q_heads, D, generator=torch.Generator().manual_seed(7))).to(q_dtype).to(dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    tm = None
    if masked:  # left padding on the second sequence, as a batch's shorter prompt has it
        tm = torch.ones(2, bt.shape[1] * T, dtype=torch.bool, device=dev)
        tm[1, :CANARY_PADDING] = False
    # the caller's tile and split count; the variant follows the canary's cache, window and Tier B (as the caller's)
    cplan = plan_decode(c, 2, q_heads, q_dtype, dev, bt.shape[1] * T, meter=True, levels=plan.levels,
                        delta_step=delta_step, repair=ov, window=rings, num_splits=plan.num_splits, tile=plan.tile)
    if dataclasses.replace(cplan, pages_per_tile=plan.pages_per_tile, auto_tile=plan.auto_tile) != plan:
        log.info("decode self-check: the canary's plan differs from the caller's (%s against %s)", cplan, plan)
    out = decode(c, q, bt, sl, sm_scale=sm_scale, meter=True, plan=cplan, delta_step=delta_step, tilt_above=-1.0,
                 token_mask=tm, repair=ov, window=rings, store_dtype=q_dtype)
    rec = out.meter
    tv_k = rec.tv_upper_a.double().cpu().numpy()
    err_k = rec.out_err_upper.double().cpu().numpy()
    flag = rec.flag.cpu().numpy()
    served = out.o.to(q_dtype).double()
    GQ = q_heads // H
    margins, tv_ratios, ratios, fails = [], [], [], []
    for b, (n, (k, v)) in enumerate(zip(lens, exact)):
        kh, _ = served_kv(c, bt, n, repair=ov, rows=torch.tensor([b]), window=rings)
        kh = kh[0].repeat_interleave(GQ, dim=0)  # [Hq, n, D]
        kx = k.double().movedim(0, 1).repeat_interleave(GQ, dim=0)
        vx = v.double().movedim(0, 1).repeat_interleave(GQ, dim=0)
        qq = q[b].double()
        live = torch.ones(n, dtype=torch.bool, device=dev) if tm is None else tm[b, :n]
        p_hat = torch.softmax((sm_scale * torch.einsum("hd,hnd->hn", qq, kh)).masked_fill(~live, -torch.inf), -1)
        p = torch.softmax((sm_scale * torch.einsum("hd,hnd->hn", qq, kx)).masked_fill(~live, -torch.inf), -1)
        eps = _radius(c, bt, b, n, q[b], sm_scale, win, repaired[b]) * live.cpu().numpy()
        sup = B.tv_bound_tilt(p_hat.cpu().numpy(), eps, tol=SUP_TOL) - SUP_TOL - SUP_ABS_SLACK
        real = (0.5 * (p - p_hat).abs().sum(-1)).cpu().numpy()
        err = (torch.einsum("hn,hnd->hd", p, vx) - served[b]).norm(dim=-1).cpu().numpy()
        margin = tv_k[b] - np.maximum(sup, real)
        ratio = err / np.where(err_k[b] > 0, err_k[b], np.inf)
        ratio = np.where((err_k[b] == 0) & (err > 0), np.inf, ratio)
        margins.append(margin)
        tv_ratios.append(tv_k[b] / np.maximum(sup, 1e-300))
        ratios.append(ratio)
        for h in range(q_heads):
            why = []
            if flag[b, h]:
                why.append("flagged (non-finite) on a finite canary")
            if not tv_k[b, h] >= sup[h]:
                why.append(f"TV⁺ {tv_k[b, h]:.6g} below the fractional supremum {sup[h]:.6g} of its stored box")
            if not tv_k[b, h] >= real[h]:
                why.append(f"TV⁺ {tv_k[b, h]:.6g} below the realised TV {real[h]:.6g}")
            if not ratio[h] <= 1.0 + 1e-9:
                why.append(f"E⁺ {err_k[b, h]:.6g} below the served output's error {err[h]:.6g}")
            if why:
                fails.append(f"sequence {b} head {h}: " + "; ".join(why))
    margins, tv_ratios, ratios = np.concatenate(margins), np.concatenate(tv_ratios), np.concatenate(ratios)
    if fails:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        import triton

        msg = (
            f"WitCert's metered decode failed its self-check on {name} (Triton {triton.__version__}, torch "
            f"{torch.__version__}; scheme {paged.scheme}, head dim {D}, query dtype {q_dtype}, window {win}, tile "
            f"{plan.tile}, {plan.num_splits} splits): {len(fails)} of {margins.size} canary rows — "
            + " | ".join(fails[:4]) + ". The meter would not be sound here. Use the reference path "
            "(WitCertCache(backend='reference')), or report it with these versions (witcert/selftest_decode.py)")
        log.error(msg)  # logged first: a caller that keeps serving on it leaves the reason in the log
        raise DecodeSelfTestError(msg)
    _CHECKED.add(key)
    res = DecodeSelfTest(key=key, rows=int(margins.size), worst_tv_margin=float(margins.min()),
                         worst_tv_ratio=float(tv_ratios.min()),
                         worst_err_ratio=float(ratios.max()), informative_rows=int(np.sum(tv_k < 1.0)))
    log.info("decode self-check passed: %s (%d rows, %d with TV⁺ < 1; worst TV⁺ margin %.3g, TV⁺ / supremum ≥ %.4g, "
             "worst error / E⁺ %.3g)", key[:11], res.rows, res.informative_rows, res.worst_tv_margin, res.worst_tv_ratio,
             res.worst_err_ratio)
    return res
