"""A small paged cache with a key sketch and channel weights (``sketch_cache``) and its fp64 served attention and
sketch radius (``fp64_sketch_case``): the decode tests of the sketch radius (tests/kernels/test_sketch_window.py,
tests/kernels/test_head_levels.py) share them."""

from __future__ import annotations

import math
import os

import torch

from kernels.paged import PagedKV
from kernels.write import write_kv
from witcert import bounds as B
from witcert.schemes import QuantContext, quantize, residual_range

DEV = os.environ.get("WITCERT_DEVICE", "cpu")


def sketch_cache(scheme, bits, n=70, H=2, D=64, seed=0, weights=True, outliers=True, head_levels=False):
    """A one-sequence cache of ``n`` random tokens (bf16, two outlier channels) written by the write kernel,
    random power-of-two channel weights: (cache, block table, k, v, weights)."""
    g = torch.Generator().manual_seed(seed)
    T = 16
    nb = math.ceil(n / T) + 1
    w = 2.0 ** torch.randint(-2, 3, (H, D), generator=g).float() if weights else None
    c = PagedKV.allocate(nb, H, D, scheme, num_groups=1, sketch_bits=bits, weights=w, device=DEV,
                         head_levels=head_levels)
    k = torch.randn(n, H, D, generator=g) * 2
    if outliers:
        k[..., :2] *= 10
    k = k.bfloat16()
    v = torch.randn(n, H, D, generator=g).bfloat16()
    perm = torch.randperm(nb, generator=g)[: math.ceil(n / T)].int()
    bt = perm[None].to(DEV)
    if scheme == "kivi2":
        write_kv(c, k.to(DEV), v.to(DEV), bt, torch.zeros(n, dtype=torch.long, device=DEV), torch.arange(n, device=DEV))
    else:
        cut = n // 2
        for a, b in ((0, cut), (cut, n)):
            write_kv(c, k[a:b].to(DEV), v[a:b].to(DEV), bt, torch.zeros(b - a, dtype=torch.long, device=DEV),
                     torch.arange(a, b, device=DEV))
    return c, bt, k, v, w



def window_over(k, v, window):
    """An exact window ``(sink, recent)`` over ``sketch_cache``'s one sequence (its keys ``k`` and values ``v``), or
    None for ``window`` None."""
    if window is None:
        return None
    from kernels.exact_window import ExactWindow

    n, H, D = k.shape
    win = ExactWindow.allocate(1, H, D, torch.bfloat16, *window, device=DEV)
    win.write(torch.zeros(n, dtype=torch.long), torch.arange(n), k.to(DEV), v.to(DEV), n)
    return win

def fp64_sketch_case(scheme, bits, k, v, w, q, window, sig):
    """fp64 served attention and the sketch radius of the reference (window tokens exact, radius 0)."""
    H = k.shape[1]
    n = k.shape[0]
    kf, vf = k.float().permute(1, 0, 2), v.float().permute(1, 0, 2)
    ctx = dict(kv_head=torch.arange(H), block_size=16)
    kh, meta = quantize(scheme, kf, QuantContext(role="key", **ctx))
    vh, _ = quantize(scheme, vf, QuantContext(role="value", **ctx))
    r = kh.double() - kf.double()
    beta = residual_range(scheme, kh, meta)
    codes, _ = B.sketch_encode(r, bits, beta) if bits else (None, None)
    rt = B.sketch_decode(codes, beta, bits) if bits else torch.zeros_like(r)
    W = B.sketch_witness(r, rt, w.double())
    ex = torch.from_numpy(B.window_mask(n, window))
    khs = torch.where(ex[None, :, None], kf, kh).double()
    vhs = torch.where(ex[None, :, None], vf, vh).double()
    rt = torch.where(ex[None, :, None], 0.0, rt)
    W = torch.where(ex[None, :], 0.0, W)
    return kf.double(), vf.double(), khs, vhs, rt, W

