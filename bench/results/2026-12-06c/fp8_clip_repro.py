"""Run B7 (2026-12-06, seventeenth session): a reduction attempt of the fp8 write's miscompile (runs A5 / B3): one
Triton kernel with the write's steps only — bf16 rows → fp32, div_rn by the scale, an optional clip at ±448, the
e4m3 cast, stored codes, x̂ = code in fp32, and kernels.write.scaled_norm(x̂) — per program of 4 rows × D channels.
Prints, per clip form, the largest |stored ‖x̂‖ − ‖stored codes‖| / ‖stored codes‖ over the rows."""
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from kernels.write import scaled_norm  # noqa: E402


@triton.jit
def _repro(X, C, M, N, D: tl.constexpr, BLOCK_T: tl.constexpr, CLIP: tl.constexpr):
    i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)
    m2 = (i < N)[:, None]
    x = tl.load(X + i[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
    sf = tl.full([BLOCK_T], 1.0, tl.float16).to(tl.float32)[:, None]
    y = tl.math.div_rn(x, tl.where(sf > 0, sf, 1.0))
    if CLIP == 1:
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    elif CLIP == 2:
        y = tl.clamp(y, -448.0, 448.0)
    code = y.to(C.dtype.element_ty)
    tl.store(C + i[:, None] * D + d[None, :], code, mask=m2)
    xh = sf * code.to(tl.float32)
    mag = scaled_norm(xh, d[None, :] >= 0)
    tl.store(M + i, mag, mask=i < N)


for D in (64, 128, 256):
    for clip in (0, 1, 2):
        N = 64
        x = (torch.randn(N, D, device="cuda") * (1 + torch.arange(N, device="cuda")[:, None] % 7)).bfloat16()
        c = torch.empty(N, D, device="cuda", dtype=torch.float8_e4m3fn)
        m = torch.empty(N, device="cuda")
        _repro[(N // 4,)](x, c, m, N, D=D, BLOCK_T=4, CLIP=clip)
        ref = c.float().norm(dim=-1)
        err = ((m - ref).abs() / ref).max().item()
        print(f"D {D} clip {clip}: max rel |mag - ||codes||| {err:.3e}{'  WRONG' if err > 1e-3 else ''}")
