"""The exact window's write (``ExactWindow.write``): one Triton launch (``_window_write_kernel``) in place of ~33 torch
index ops per layer (each a node of a captured decode step), against its torch form (``_write_torch``): the same ring
columns bit for bit, and norms that are upper bounds of the exact norms inflated by KERNEL_REL_SLACK (within one
float32 step of the torch form's), at every dtype, extreme magnitudes and non-finite values, with an int and a
per-token ``n_end``. In the interpreter and, in the device run, on the GPU."""

import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = pytest.mark.gpu
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.fp_bounds import KERNEL_REL_SLACK  # noqa: E402

B, H, D, N = 3, 2, 64, 40


def _exact_norms(x: torch.Tensor) -> torch.Tensor:
    """‖x_j‖ exactly rounded (math.fsum of the float64 squares, which are exact for these dtypes)."""
    x64 = x.double().reshape(-1, x.shape[-1]).tolist()
    return torch.tensor([math.sqrt(math.fsum(a * a for a in r)) for r in x64], dtype=torch.float64).view(x.shape[:-1])


# every dtype, window shape and form of n_end, each at least twice (not their product: CI's time)
CASES = [(torch.bfloat16, (4, 64), "int"), (torch.bfloat16, (0, 5), "per-token"), (torch.bfloat16, (3, 7), "tensor"),
         (torch.float16, (2, 0), "tensor"), (torch.float16, (3, 7), "per-token"), (torch.float16, (4, 64), "int"),
         (torch.float32, (4, 64), "tensor"), (torch.float32, (3, 7), "int"), (torch.float32, (0, 5), "per-token"),
         (torch.bfloat16, (2, 0), "int")]


@pytest.mark.parametrize("dtype,window,n_end", CASES)
def test_kernel_write_matches_the_torch_write(dtype, window, n_end):
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, B, (N,), generator=g)
    pos = torch.arange(N)
    big = torch.finfo(dtype).max / 64 if dtype != torch.float32 else 1e30
    k = torch.randn(N, H, D, generator=g) * 10
    for a, b in ((0, N - 1), (1, N - 2), (2, N - 3), (3, N - 4)):  # a sink token and a recent one of each kind
        k[a] *= big / 10  # extreme magnitudes: squares far past float32 (exact in float64)
        # the smallest normal magnitudes (squares ~1e-76: exact in float64, zero in float32); not subnormals, which
        # the interpreter converts wrongly from bf16 (the GPU's conversion is exact)
        k[b] = k[b].sign() * torch.finfo(dtype).tiny * (1 + k[b].abs())
    k[2, 0, 3] = k[N - 3, 0, 3] = float("inf")
    k[3, 1, 5] = k[N - 4, 1, 5] = float("nan")
    v = torch.randn(N, H, D, generator=g)
    k, v = k.to(dtype), v.to(dtype)
    # per token: sequence 0's tokens end one later (a different recent window per sequence)
    ne = {"int": N, "tensor": torch.full((N,), N), "per-token": N + (seq == 0).long()}[n_end]
    a = ExactWindow.allocate(B, H, D, dtype, *window, device=DEV)
    b = ExactWindow.allocate(B, H, D, dtype, *window, device=DEV)
    a.write(seq.to(DEV), pos.to(DEV), k.to(DEV), v.to(DEV), ne if isinstance(ne, int) else ne.to(DEV))
    b._write_torch(seq.to(DEV), pos.to(DEV), k.to(DEV), v.to(DEV), ne if isinstance(ne, int) else ne.to(DEV))
    # cells written by exactly one token (several writers of one cell, as a per-token n_end gives here, land in any
    # order on the GPU; the scratch column takes every token outside the window)
    cols = a.columns_of(pos, ne)
    writers = {}
    for j in range(N):
        writers.setdefault((int(seq[j]), int(cols[j])), []).append(j)
    single = {cell: js[0] for cell, js in writers.items() if len(js) == 1 and cell[1] != a.columns}
    assert len(single) >= min(3, sum(window))
    exact = {"k_norm": _exact_norms(k) * (1.0 + KERNEL_REL_SLACK), "v_norm": _exact_norms(v) * (1.0 + KERNEL_REL_SLACK)}
    for (bb, c), j in single.items():
        for f in ("k", "v"):
            assert torch.equal(getattr(a, f)[bb, :, c].cpu().view(torch.uint8), getattr(b, f)[bb, :, c].cpu().view(torch.uint8))
        for f in ("k_norm", "v_norm"):
            got, ref = getattr(a, f)[bb, :, c].cpu(), getattr(b, f)[bb, :, c].cpu()
            assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.isinf(), ref.isinf())
            fin = torch.isfinite(ref)
            step = torch.nextafter(ref[fin], torch.full_like(ref[fin], float("inf"))) - ref[fin]
            assert ((got[fin] - ref[fin]).abs() <= step).all()  # within one float32 step of the torch form
            for h in range(H):
                e, w = exact[f][j, h].item(), got[h].item()
                if math.isnan(e):
                    assert math.isnan(w)
                else:
                    assert w >= e, (f, j, h)  # an upper bound, inflated as the meter needs


def test_a_head_dim_that_is_not_a_power_of_two_takes_the_torch_write():
    """The kernel's ``tl.arange`` spans powers of two only (review, 2026-12-05: D = 80 raised in the launch)."""
    g = torch.Generator().manual_seed(3)
    a = ExactWindow.allocate(1, H, 80, torch.bfloat16, 1, 2, device=DEV)
    k, v = (torch.randn(3, H, 80, generator=g).bfloat16().to(DEV) for _ in range(2))
    pos = torch.arange(3, device=DEV)
    a.write(torch.zeros(3, dtype=torch.int64, device=DEV), pos, k, v, 3)
    cols = a.columns_of(pos, 3).cpu()
    assert torch.equal(a.k[0][:, cols].cpu(), k.permute(1, 0, 2).cpu())
    assert (a.k_norm[0][:, cols].cpu().double() >= _exact_norms(k.cpu()).T * (1.0 + KERNEL_REL_SLACK)).all()


def test_write_refuses_another_dtype():
    a = ExactWindow.allocate(1, H, D, torch.bfloat16, 1, 2, device=DEV)
    x = torch.zeros(1, H, D, device=DEV)
    with pytest.raises(ValueError, match="ring's dtype"):
        a.write(torch.zeros(1, dtype=torch.int64, device=DEV), torch.zeros(1, dtype=torch.int64, device=DEV), x, x, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_subnormal_keys_get_norms_at_least_their_exact_norms(dtype):
    """A ring of subnormal keys and values only (~1e-40 in bf16): the kernel's norm must not flush them to 0
    (a flush would serve a nonzero token with κ = 0, below its exact norm). The interpreter's own bf16 conversion
    flushes some (review, 2026-12-07: 9.2e-41 → 0): the kernel widens bf16 by its bits, so this runs on the CPU too."""
    g = torch.Generator().manual_seed(11)
    tiny = torch.finfo(dtype).tiny
    k = (torch.rand(4, H, D, generator=g) * tiny * 0.5).to(dtype)  # every entry subnormal (or 0)
    if dtype == torch.bfloat16:  # token 0: bit patterns the interpreter's conversion flushed or shrank (0x0001 → 0)
        bits = torch.tensor([0x0001, 0x0002, 0x0021, 0x0078, 0x8001 - 0x10000, 0x8021 - 0x10000], dtype=torch.int16)
        k[0] = bits.repeat(H * D // 6 + 1)[: H * D].view(torch.bfloat16).view(H, D)
    v = -k
    assert (k.float().abs() < tiny).all() and (k.float() != 0).any()
    a = ExactWindow.allocate(1, H, D, dtype, 2, 2, device=DEV)
    pos = torch.arange(4, device=DEV)
    a.write(torch.zeros(4, dtype=torch.int64, device=DEV), pos, k.to(DEV), v.to(DEV), 4)
    cols = a.columns_of(pos, 4).cpu()
    for f, x in (("k_norm", k), ("v_norm", v)):
        got = getattr(a, f)[0][:, cols].cpu().double()
        assert (got >= _exact_norms(x).T * (1.0 + KERNEL_REL_SLACK)).all(), f
        assert (got > 0).all(), f


@pytest.mark.parametrize("window", [(4, 32), (0, 5), (3, 0)])
def test_a_long_prefill_over_several_tiles_writes_the_window_only(window):
    """A prefill of several write tiles (``WRITE_TOKENS``) for two sequences of different lengths: every ring column
    equals the torch form's, and the scratch column is never touched by the kernel (the tokens outside the window,
    most of a prompt, are neither read nor written: their values here are NaN, which no column may take)."""
    from kernels.exact_window import WRITE_TOKENS

    g = torch.Generator().manual_seed(5)
    lens = (2 * WRITE_TOKENS + 7, WRITE_TOKENS + 3)
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    pos = torch.cat([torch.arange(n) for n in lens])
    ne = torch.cat([torch.full((n,), n) for n in lens])
    k, v = (torch.randn(len(seq), H, D, generator=g).bfloat16() for _ in range(2))
    a = ExactWindow.allocate(2, H, D, torch.bfloat16, *window, device=DEV)
    outside = a.columns_of(pos, ne) == a.columns
    k[outside], v[outside] = float("nan"), float("nan")
    b = ExactWindow.allocate(2, H, D, torch.bfloat16, *window, device=DEV)
    a.write(seq.to(DEV), pos.to(DEV), k.to(DEV), v.to(DEV), ne.to(DEV))
    b._write_torch(seq.to(DEV), pos.to(DEV), k.to(DEV), v.to(DEV), ne.to(DEV))
    c = a.columns
    assert torch.equal(a.k[:, :, :c].cpu(), b.k[:, :, :c].cpu()) and torch.equal(a.v[:, :, :c].cpu(), b.v[:, :, :c].cpu())
    for f in ("k_norm", "v_norm"):
        got, ref = getattr(a, f)[:, :, :c].cpu(), getattr(b, f)[:, :, :c].cpu()
        w = ~ref.isnan()  # (a ring the shorter sequence does not fill keeps NaN there: on the GPU's 16-token tiles)
        assert torch.equal(got.isnan(), ref.isnan()) and w.sum() == H * sum(min(sum(window), n) for n in lens)
        assert (got[w] >= ref[w] * (1 - 2.0**-23)).all() and (got[w] <= ref[w] * (1 + 2.0**-22)).all()
        assert getattr(a, f)[:, :, c].isnan().all()  # the scratch column: still the allocation's NaN
    assert (a.k[:, :, c] == 0).all() and (a.v[:, :, c] == 0).all()
    assert b.k[:, :, c].isnan().any()  # (the torch form does land outside tokens there: the check above can fail)


@pytest.mark.parametrize("part", ["values", "keys"])
def test_a_window_of_subnormal_values_or_keys_is_served_exactly(part, monkeypatch):
    """The decode serves the ring's tokens as exact (radius 0, φ = 0): its loads must not change them. A window of bf16
    subnormal values (or keys), with bit patterns the interpreter's own bf16 → float32 conversion flushed to 0: the
    decode's output is within E⁺ of the exact attention, and served values are the stored ones (interpreter and GPU;
    before the decode widened the ring's bf16 by its bits, the interpreter served subnormal keys as 0: output error
    0.042 against E⁺ 0.0048, and values 10× too small)."""
    import kernels.decode as Dk
    from kernels.decode import decode
    from kernels.paged import PagedKV

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    g = torch.Generator().manual_seed(3)
    n, gq = 6, 2
    bits = torch.tensor([0x0001, 0x0002, 0x0021, 0x0078, 0x8001 - 0x10000, 0x8021 - 0x10000], dtype=torch.int16)
    tiny = bits.repeat(n * H * D // 6 + 1)[: n * H * D].view(torch.bfloat16).view(n, H, D)
    k = torch.randn(n, H, D, generator=g).bfloat16()
    v = torch.randn(n, H, D, generator=g).bfloat16()
    if part == "values":
        v = tiny
    else:  # keys of subnormal size and a query large enough for their logits to matter (~1e-38·1e37)
        k = tiny
    q = torch.randn(1, H * gq, D, generator=g).bfloat16() * (1e37 if part == "keys" else 1.0)
    win = ExactWindow.allocate(1, H, D, torch.bfloat16, 2, 4, device=DEV)  # every token in the window
    win.write(torch.zeros(n, dtype=torch.long, device=DEV), torch.arange(n, device=DEV), k.to(DEV), v.to(DEV), n)
    c = PagedKV.allocate(2, H, D, "int8", num_groups=1, device=DEV)  # (the paged loop has no page to read)
    bt = torch.arange(1, dtype=torch.int32, device=DEV)[None]
    qd = q.to(DEV) if DEV == "cuda" else q.float()
    out = decode(c, qd, bt, torch.tensor([n], device=DEV), window=win)
    rec = out.meter
    assert not rec.flag.cpu().any()
    sig = 1 / math.sqrt(D)
    for hq in range(H * gq):
        h = hq // gq
        p = torch.softmax(sig * k[:, h].double() @ q[0, hq].double(), 0)
        o_ref = p @ v[:, h].double()
        err = (out.o[0, hq].cpu().double() - o_ref).norm().item()
        assert err <= rec.out_err_upper[0, hq].item(), (hq, err, rec.out_err_upper[0, hq].item())
        if part == "values":  # the values as stored (the interpreter served 3.6e-41 for 3.6e-40, 4 % of the largest)
            rel = 1e-4 if DEV == "cpu" else 1e-2  # (the GPU's PV dot takes p̂ in bf16)
            assert (out.o[0, hq].cpu().double() - o_ref).abs().max() <= rel * o_ref.abs().max()
