"""The exact window of a batch (``contract.sketch``, SPEC §2 as amended by issue 33): each sequence's first
``sink`` and last ``recent`` tokens in the model's dtype, served by the decode with radius 0, φ = 0.

    k, v            [B, Hkv, sink + recent + 1, D]  model dtype (the last column a scratch row, never read)
    k_norm, v_norm  [B, Hkv, sink + recent + 1]     float32 ≥ ‖k_j‖ / ‖v_j‖, rounded up; NaN until written
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from contract.sketch import check_window

from .fp_bounds import KERNEL_REL_SLACK
from .interpret import INTERPRET, INTERPRET_TILE_TOKENS, f32
from .repair import RepairOverlay

#: tokens per program of the window's write (the interpreter runs a program's ops once for the whole tile, so it takes
#: larger ones); a prefill's tokens outside the window cost a masked tile each, no load or store
WRITE_TOKENS = INTERPRET_TILE_TOKENS if INTERPRET else 16


@triton.jit
def _window_write_kernel(SEQ, POS, NE, K, V, RK, RV, RKN, RVN, ne_int, N, s_kn, s_kh, s_vn, s_vh,
                         sink, recent, H, C1, INFL: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                         NE_TENSOR: tl.constexpr):
    """Program (tile of BLOCK_T tokens, kv head h): each token's ring column (``columns_of``), and for the tokens
    in the window their exact K / V there and their norms ‖·‖ in float64, inflated by INFL and rounded up to
    float32 (``RepairOverlay.norms_up``). A token outside the window is neither read nor written (a prompt's
    middle: most of a prefill), so the scratch column is never touched."""
    i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    live = i < N
    p = tl.load(POS + i, mask=live, other=0).to(tl.int64)
    b = tl.load(SEQ + i, mask=live, other=0).to(tl.int64)
    if NE_TENSOR:
        ne = tl.load(NE + i, mask=live, other=0).to(tl.int64)
    else:
        ne = ne_int.to(tl.int64)
    keep = p < sink
    col = p
    if recent > 0:
        keep = keep | (p >= ne - recent)
        col = tl.where(p < sink, p, sink + p % recent)
    keep = keep & live
    d = tl.arange(0, D)
    row = (b * H + h) * C1 + col
    i64 = i.to(tl.int64)[:, None]  # (a prompt of B·n tokens: i·s_kn passes 2^31 at 2M tokens of Hkv·D = 1024)
    k = tl.load(K + i64 * s_kn + h * s_kh + d[None, :], mask=keep[:, None], other=0.0)
    v = tl.load(V + i64 * s_vn + h * s_vh + d[None, :], mask=keep[:, None], other=0.0)
    tl.store(RK + row[:, None] * D + d[None, :], k, mask=keep[:, None])
    tl.store(RV + row[:, None] * D + d[None, :], v, mask=keep[:, None])
    tl.store(RKN + row, _norm_up(k, INFL), mask=keep)
    tl.store(RVN + row, _norm_up(v, INFL), mask=keep)


@triton.jit
def _norm_up(x, INFL: tl.constexpr):
    """‖x‖ of each row of ``x`` [T, D] in float64 (squares of bf16 / fp16 / fp32 values are exact there), × INFL,
    rounded **up** to float32. bf16 is widened by its bits (exact: the interpreter's own conversion flushes
    subnormals, which gave norms below the exact ones on the CPU; review of 2026-12-07)."""
    x64 = f32(x).to(tl.float64)
    n = tl.sqrt(tl.sum(x64 * x64, axis=1)) * INFL
    f = n.to(tl.float32)
    up = (f.to(tl.float64) < n) & (f >= 0)  # (a finite non-negative f below n: its next float32 up)
    return tl.where(up, (f.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), f)


@dataclasses.dataclass
class ExactWindow:
    """The exact window of a batch (``contract.sketch``): each sequence's first ``sink`` and last
    ``recent`` tokens, kept in the model's dtype on the device and served by the decode with radius 0,
    φ = 0 (SPEC §2 as amended by issue 33). A ring per (sequence, kv head):

        k, v            [B, Hkv, sink + recent + 1, D]  model dtype: column j < sink holds token j,
                                                        column sink + (j mod recent) token j of the recent
                                                        window; the last column is a scratch row that
                                                        the torch form's writes of other tokens land in
                                                        (the kernel skips them; never read)
        k_norm, v_norm  [B, Hkv, sink + recent + 1]     float32 ≥ ‖k_j‖ / ‖v_j‖ (κ, ν of the served tokens),
                                                        rounded up; NaN until written

    The decode serves token j of a sequence of length n from the ring when j < sink or j ≥ n − recent
    (one predicate per token lane, no host work); ``write`` puts new tokens there (one launch: a
    CUDA graph can capture it). A token written while it is in the recent window stays in its column
    until the token ``recent`` positions later overwrites it, by which time it has left the window."""

    sink: int
    recent: int
    k: torch.Tensor
    v: torch.Tensor
    k_norm: torch.Tensor
    v_norm: torch.Tensor

    @property
    def columns(self) -> int:
        return self.sink + self.recent

    @staticmethod
    def allocate(batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, sink: int, recent: int,
                 device="cpu") -> "ExactWindow":
        sink, recent = check_window((sink, recent))
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"ExactWindow: the exact values are bf16 / fp16 / fp32, got {dtype}")
        c = sink + recent + 1
        kw = dict(device=device)
        return ExactWindow(sink, recent,
                           k=torch.zeros(batch, num_kv_heads, c, head_dim, dtype=dtype, **kw),
                           v=torch.zeros(batch, num_kv_heads, c, head_dim, dtype=dtype, **kw),
                           k_norm=torch.full((batch, num_kv_heads, c), float("nan"), dtype=torch.float32, **kw),
                           v_norm=torch.full((batch, num_kv_heads, c), float("nan"), dtype=torch.float32, **kw))

    def columns_of(self, positions: torch.Tensor, n_end) -> torch.Tensor:
        """The ring column [N] int64 of tokens at ``positions`` [N] of sequences whose length after this
        write is ``n_end`` (an int or [N]); the scratch column for a token in neither part."""
        pos = positions.to(torch.int64)
        scratch = torch.full_like(pos, self.columns)
        col = scratch
        if self.recent:
            # an int n_end stays a Python scalar: a tensor made of it on the host and copied would wait for the GPU
            col = torch.where(pos >= n_end - self.recent,
                              self.sink + pos % self.recent, scratch)
        return torch.where(pos < self.sink, pos, col)

    def write(self, seq: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_end) -> None:
        """Tokens (``seq`` [N], ``positions`` [N]) with exact ``k``, ``v`` [N, Hkv, D] (the ring's dtype)
        into their ring columns (device gathers and scatters, no host sync)."""
        if k.dtype != self.k.dtype or v.dtype != self.v.dtype:
            raise ValueError(f"ExactWindow.write: exact values of the ring's dtype {self.k.dtype} only, got {k.dtype}")
        if k.shape[0] == 0 or self.columns == 0:
            return
        dev = self.k.device
        D = self.k.shape[-1]
        if (dev.type == "cuda" or INTERPRET) and D & (D - 1) == 0:  # one launch (a CUDA graph captures it as one node)
            kd, vd = k.to(dev), v.to(dev)
            if kd.stride(-1) != 1 or vd.stride(-1) != 1:
                kd, vd = kd.contiguous(), vd.contiguous()
            ne_t = not isinstance(n_end, int)
            ne = n_end.to(dev).reshape(-1).expand(k.shape[0]).contiguous() if ne_t else positions
            N = k.shape[0]
            _window_write_kernel[(triton.cdiv(N, WRITE_TOKENS), self.k.shape[1])](
                seq.to(dev), positions.to(dev), ne.to(dev), kd, vd, self.k, self.v, self.k_norm, self.v_norm,
                0 if ne_t else int(n_end), N, kd.stride(0), kd.stride(1), vd.stride(0), vd.stride(1),
                self.sink, self.recent, self.k.shape[1], self.columns + 1,
                INFL=1.0 + KERNEL_REL_SLACK, D=D, BLOCK_T=WRITE_TOKENS, NE_TENSOR=ne_t)
            return
        self._write_torch(seq, positions, k, v, n_end)

    def _write_torch(self, seq: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     n_end) -> None:
        """``write`` as torch index ops (off the GPU without the interpreter, or a head dim that is not a power of two,
        which the kernel's ``tl.arange`` cannot span; the kernel's reference in the tests)."""
        dev = self.k.device
        col = self.columns_of(positions.to(dev), n_end if isinstance(n_end, int) else n_end.to(dev))
        b = seq.to(dev, torch.int64)
        H = self.k.shape[1]
        bb = b[:, None].expand(-1, H)
        hh = torch.arange(H, device=dev)[None, :].expand_as(bb)
        cc = col[:, None].expand_as(bb)
        kd, vd = k.to(dev), v.to(dev)
        self.k[bb, hh, cc] = kd
        self.v[bb, hh, cc] = vd
        self.k_norm[bb, hh, cc] = RepairOverlay.norms_up(kd)
        self.v_norm[bb, hh, cc] = RepairOverlay.norms_up(vd)

    def fill(self, k: torch.Tensor, v: torch.Tensor, n: int) -> None:
        """Refill every sequence's window from its exact tokens ``k``, ``v`` [B, Hkv, n, D] (a crop: the
        recent window moved back to tokens the ring no longer holds)."""
        B = k.shape[0]
        pos = torch.arange(n, device=self.k.device)
        keep = (pos < self.sink) | (pos >= n - self.recent)
        idx = pos[keep]
        if idx.numel() == 0:
            return
        seq = torch.arange(B, device=self.k.device).repeat_interleave(idx.numel())
        p = idx.repeat(B)
        kk = k.to(self.k.device)[:, :, idx].permute(0, 2, 1, 3).reshape(B * idx.numel(), k.shape[1], k.shape[3])
        vv = v.to(self.k.device)[:, :, idx].permute(0, 2, 1, 3).reshape(B * idx.numel(), v.shape[1], v.shape[3])
        self.write(seq, p, kk.to(self.k.dtype), vv.to(self.v.dtype), n)

    def select(self, index: torch.Tensor) -> "ExactWindow":
        """The rings of sequences ``index`` (copies: beam search reorders, a gate re-decodes some rows)."""
        index = index.to(self.k.device)
        return dataclasses.replace(self, k=self.k.index_select(0, index), v=self.v.index_select(0, index),
                                   k_norm=self.k_norm.index_select(0, index), v_norm=self.v_norm.index_select(0, index))

    def validate(self, cache, batch: int) -> None:
        """ValueError unless the rings fit ``cache`` (a ``kernels.paged.PagedKV``) and a batch of ``batch`` sequences."""
        H, D = cache.num_kv_heads, cache.head_dim
        c = self.columns + 1
        for name in ("k", "v"):
            t = getattr(self, name)
            if t.shape != (batch, H, c, D) or not t.is_contiguous():
                raise ValueError(f"window.{name}: expected a contiguous [{batch}, {H}, {c}, {D}] tensor, got "
                                 f"{tuple(t.shape)}")
            if t.device != cache.k_codes.device:
                raise ValueError(f"window.{name}: on {t.device}, the cache is on {cache.k_codes.device}")
        for name in ("k_norm", "v_norm"):
            t = getattr(self, name)
            if t.shape != (batch, H, c) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"window.{name}: expected a contiguous float32 [{batch}, {H}, {c}] tensor")
        if cache.scheme != "none" and self.k.dtype != cache.exact_k.dtype and cache.exact_k.numel() > 1:
            raise ValueError(f"window.k: the ring must hold the cache's model dtype {cache.exact_k.dtype}, got {self.k.dtype}")
