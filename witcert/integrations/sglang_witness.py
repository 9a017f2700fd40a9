"""The witness arithmetic of WitCert's SGLang patch, shared by the KV write (``witcert.integrations.sglang``)
and the gate's overlay (``sglang_gate``): fp64 group norms, witnesses rounded up into float16 (a relative
slack and, for a lossy residual, an absolute floor), a scale as the metered kernel applies it (fp32), and a
pool buffer read in its logical dtype."""

from __future__ import annotations

import functools

import numpy as np
import torch

from witcert import schemes as S

#: relative round-up of a witness (its fp64 norm and the float16 storage: ``_round_up_f16``)
WITNESS_SLACK = 2.0**-12
#: absolute floor added to a lossy residual's witness (a nonzero residual never gets a zero witness)
WITNESS_FLOOR = 2.0**-100


def _round_up_f16(x64: torch.Tensor, lossy: torch.Tensor | bool) -> torch.Tensor:
    """A norm (≥ 0 by construction) rounded up into float16 with the witness slack, plus the floor where
    ``lossy``; device ops only (no host synchronisation: the record step runs inside CUDA graphs)."""
    w = x64 * (1.0 + WITNESS_SLACK)
    if isinstance(lossy, torch.Tensor):
        w = torch.where(lossy, w + WITNESS_FLOOR, w)
    elif lossy:
        w = w + WITNESS_FLOOR
    return S.round_up_to_dtype(w, torch.float16, check=False)


def _group_norms64(x: torch.Tensor, gid: torch.Tensor, G: int) -> torch.Tensor:
    sq = torch.zeros(*x.shape[:-1], G, dtype=torch.float64, device=x.device)
    sq.index_add_(x.dim() - 1, gid.long(), x * x)
    return sq.sqrt()


def kernel_scale(scale) -> float:
    """The scale as the metered kernel applies it: rounded to float32 (``paged_view`` hands the
    kernel a float32 tensor). Witnesses are taken against this value, not the float64 one: the
    kernel's k̂ is code · fp32(k_scale), so a float64-scale witness can undershoot (issue 36;
    ``tests/integrations/test_sglang_pool.py::test_witness_uses_the_kernels_fp32_scale``)."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"k_scale/v_scale: expected a scalar, got shape {tuple(scale.shape)}")
        scale = scale.reshape(()).item()
    return _f32(float(scale))


@functools.lru_cache(maxsize=256)
def _f32(x: float) -> float:
    """x rounded to float32 (nearest; ±inf past its range). Memoised: SGLang passes the same Python float every call,
    and the rounding under ``np.errstate`` was ~10 µs of an eager metered call's host time (two per call)."""
    with np.errstate(over="ignore"):  # (numpy, not a torch tensor: no tensor op for a Python number)
        return float(np.float32(x))


def kernel_scale_tensor(scale, device) -> torch.Tensor:
    """``kernel_scale`` as a 0-dim float32 tensor on ``device``, without a host synchronisation: a tensor
    scale (SGLang's ``layer.k_scale``) is rounded to float32 on its device, a Python number (or None: 1)
    is filled in by a kernel, which a CUDA graph captures. The same float32 value as ``kernel_scale``
    (round to nearest either way)."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"k_scale/v_scale: expected a scalar, got shape {tuple(scale.shape)}")
        return scale.reshape(()).to(device=device, dtype=torch.float32)
    return torch.full((), kernel_scale(scale), dtype=torch.float32, device=device)


def _as_logical(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return buf.view(dtype) if buf.dtype != dtype and buf.element_size() == torch.empty(0, dtype=dtype).element_size() else buf
