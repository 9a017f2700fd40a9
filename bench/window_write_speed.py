"""The exact window's write in a prefill, side by side in one process (issue 35: time to first token): the
write as it is (``kernels.exact_window._window_write_kernel``: a program per ``WRITE_TOKENS`` tokens and kv head,
tokens outside the window masked off) against the form it replaced on 2026-12-07 (a program per token and kv head,
every token loaded and stored: the ones outside the window into the scratch column), kept here only as the
baseline. Both write the same ring (checked before timing).

    python3 bench/window_write_speed.py [--shapes 1x32768,8x4096,1x4096] [--kv-heads 8] [--head-dim 128]

Per shape (B sequences × n prompt tokens, as one prefill writes them): the median of 20 launches, µs, timed with
CUDA events after 3 untimed; a prefill runs it once per layer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from serving import _Timer  # noqa: E402

from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.fp_bounds import KERNEL_REL_SLACK  # noqa: E402


@triton.jit
def _per_token_write(SEQ, POS, K, V, RK, RV, RKN, RVN, ne_int, s_kn, s_kh, s_vn, s_vh, sink, recent, H, C1,
                     INFL: tl.constexpr, D: tl.constexpr):
    """The replaced form (an int ``n_end``): program (token i, kv head h), its column or the scratch one."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.load(POS + i).to(tl.int64)
    b = tl.load(SEQ + i).to(tl.int64)
    ne = ne_int.to(tl.int64)
    col = (C1 - 1).to(tl.int64)
    if recent > 0:
        col = tl.where(p >= ne - recent, sink + p % recent, col)
    col = tl.where(p < sink, p, col)
    d = tl.arange(0, D)
    row = (b * H + h) * C1 + col
    k = tl.load(K + i * s_kn + h * s_kh + d)
    v = tl.load(V + i * s_vn + h * s_vh + d)
    tl.store(RK + row * D + d, k)
    tl.store(RV + row * D + d, v)
    tl.store(RKN + row, _norm_up_1d(k, INFL))
    tl.store(RVN + row, _norm_up_1d(v, INFL))


@triton.jit
def _norm_up_1d(x, INFL: tl.constexpr):
    """The replaced form's norm of one row (``kernels.exact_window._norm_up`` on a [D] vector)."""
    x64 = x.to(tl.float64)
    n = tl.sqrt(tl.sum(x64 * x64, axis=0)) * INFL
    f = n.to(tl.float32)
    up = (f.to(tl.float64) < n) & (f >= 0)
    return tl.where(up, (f.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), f)


def _old(win: ExactWindow, seq, pos, k, v, n: int) -> None:
    _per_token_write[(k.shape[0], win.k.shape[1])](
        seq, pos, k, v, win.k, win.v, win.k_norm, win.v_norm, n, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        win.sink, win.recent, win.k.shape[1], win.columns + 1, INFL=1.0 + KERNEL_REL_SLACK, D=k.shape[-1])


def _time(fn, reps: int = 20) -> float:
    """Median µs of ``reps`` calls (``serving._Timer``'s CUDA events around each) after 3 untimed."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        with _Timer("cuda") as t:
            fn()
        ts.append(t.elapsed() * 1e3)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x32768,8x4096,1x4096")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--window", default="4,32")
    args = ap.parse_args()
    sink, recent = (int(x) for x in args.window.split(","))
    H, D, dev = args.kv_heads, args.head_dim, "cuda"
    print(f"# {torch.cuda.get_device_name(0)}, Hkv {H}, d {D}, bf16, window ({sink}, {recent}); µs per launch (a layer)")
    print("| B | n | tokens | per token (replaced) | tiles, window only (now) | replaced / now |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        B, n = (int(x) for x in shape.split("x"))
        seq = torch.arange(B, device=dev).repeat_interleave(n)
        pos = torch.arange(n, device=dev).repeat(B)
        k, v = (torch.randn(B * n, H, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
        a = ExactWindow.allocate(B, H, D, torch.bfloat16, sink, recent, device=dev)
        b = ExactWindow.allocate(B, H, D, torch.bfloat16, sink, recent, device=dev)
        a.write(seq, pos, k, v, n)
        _old(b, seq, pos, k, v, n)
        c = a.columns
        assert torch.equal(a.k[:, :, :c], b.k[:, :, :c]) and torch.equal(a.k_norm[:, :, :c], b.k_norm[:, :, :c])
        t_old = _time(lambda: _old(b, seq, pos, k, v, n))
        t_new = _time(lambda: a.write(seq, pos, k, v, n))
        print(f"| {B} | {n} | {B * n} | {t_old:.1f} | {t_new:.1f} | {t_old / t_new:.2f} |")


if __name__ == "__main__":
    main()
