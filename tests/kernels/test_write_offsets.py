"""The writes at input offsets past 2^31 elements (GPU only: ~15 GB): one ``write_kv`` or ``ExactWindow.write`` of
B·n tokens with Hkv·D = 1024 passes 2^31 elements of its K / V input at 2M tokens (a batch-16 prefill of 128K). The
kernels form those offsets in int64 (2026-12-07; int32 before, which wrapped to other rows): the last tokens of such a
write are stored exactly as a small write of the same tokens stores them."""

import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cpu", reason="~15 GB of device memory; the interpreter's numpy offsets too")]

from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.write import write_kv  # noqa: E402

H, D, T = 8, 128, 16
N = (1 << 31) // (H * D) + 2 * T  # the last 2 pages' input rows start past 2^31 elements


def _inputs():
    g = torch.Generator(device=DEV).manual_seed(0)
    k = torch.randn(N, H, D, generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(N, H, D, generator=g, device=DEV, dtype=torch.bfloat16)
    return k, v


def test_kv_write_past_2_31_input_elements():
    k, v = _inputs()
    pages = N // T
    big = PagedKV.allocate(pages, H, D, scheme="int8", block_size=T, num_groups=1, device=DEV, with_exact=False,
                           block_norms=True)
    write_kv(big, k, v, torch.arange(pages, dtype=torch.int32, device=DEV)[None], torch.zeros(N, dtype=torch.int32,
             device=DEV), torch.arange(N, dtype=torch.int32, device=DEV), store_exact=False, validate=False)
    tail = slice(N - 2 * T, N)
    small = PagedKV.allocate(2, H, D, scheme="int8", block_size=T, num_groups=1, device=DEV, with_exact=False,
                             block_norms=True)
    write_kv(small, k[tail].contiguous(), v[tail].contiguous(), torch.arange(2, dtype=torch.int32, device=DEV)[None],
             torch.zeros(2 * T, dtype=torch.int32, device=DEV), torch.arange(2 * T, dtype=torch.int32, device=DEV),
             store_exact=False, validate=False)
    for f in ("k_codes", "v_codes", "k_scale", "v_scale", "k_wit", "v_wit", "k_norm", "v_norm"):
        a, b = getattr(big, f)[pages - 2:], getattr(small, f)
        assert torch.equal(a, b), f


def test_window_write_past_2_31_input_elements():
    k, v = _inputs()
    w = ExactWindow.allocate(1, H, D, torch.bfloat16, 4, 32, device=DEV)
    pos = torch.arange(N, device=DEV)
    w.write(torch.zeros(N, dtype=torch.int64, device=DEV), pos, k, v, N)
    ref = ExactWindow.allocate(1, H, D, torch.bfloat16, 4, 32, device=DEV)
    keep = torch.cat([pos[:4], pos[-32:]])
    ref._write_torch(torch.zeros(36, dtype=torch.int64, device=DEV), keep, k[keep], v[keep], N)
    c = w.columns
    assert torch.equal(w.k[..., :c, :], ref.k[..., :c, :]) and torch.equal(w.v[..., :c, :], ref.v[..., :c, :])
    for f in ("k_norm", "v_norm"):
        a, b = getattr(w, f)[..., :c], getattr(ref, f)[..., :c]
        assert ((a - b).abs() <= b * 2.0**-23).all(), f
