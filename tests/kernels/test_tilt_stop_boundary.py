"""The tilt's early stop (``_tv_row``: refine the largest coarse intervals one by one until no unrefined interval
is above the refined maximum) at its decision boundary: a row crafted by an adversarial review of a96bf71 so that
the first refined interval's maximum equals the next coarse value to the last bit in the torch twin. One float64
ulp of one bin's mass apart, the stop flips. Under a96bf71's rule (a refined interval valued at its sub-intervals'
maximum) the next interval's refined maximum was 1.24e-4 above its own coarse value, so the tilt jumped by that
much across the boundary, and the kernel (both forms of D) and the twin, whose D's round differently, decided
differently there. Now a refined interval is valued at min(coarse, refined) (both sound), so refining past the
stop changes nothing: the tilt is continuous across the boundary and the kernel matches the twin. Both sides are
checked against the exact fractional supremum."""

import os

import numpy as np
import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

from kernels import epilogue as E  # noqa: E402
from kernels import epilogue_torch as ET  # noqa: E402

_MASS = [float.fromhex(x) for x in (
    "0x1.a914422531828p-9", "0x1.91e05f03598c4p-9", "0x1.512253842773ep-6", "0x1.5461b46686234p-10",
    "0x1.9617c51bfbc7ep-1", "0x1.f008b0a073dc6p-6", "0x1.5c599cc006444p-1", "0x1.c2601dc8208aep-4")]
_LV = [float.fromhex(x) for x in (
    "0x1.7150cb56e3880p-6", "0x1.031a8237a3defp+0", "0x1.1b8647dbd4660p+0", "0x1.68b1c26b96850p+0",
    "0x1.eb6a59f6a17a6p+0", "0x1.247bd4f7924d8p+1", "0x1.5dd14282af8d4p+1", "0x1.7770786dd6cf8p+1")]


def _rows():
    """The two sides of the boundary: the last bin's mass and its next float64 up."""
    mass = torch.tensor([_MASS, _MASS], dtype=torch.float64)
    mass[1, -1] = float.fromhex("0x1.c2601dc8208afp-4")
    lv = torch.tensor([_LV, _LV], dtype=torch.float64)
    return mass, lv[:, :-1].clone(), lv[:, -1].clone()


def _fractional_sup(w, lv, points=64 * 512):
    """A lower value of the exact fractional supremum max_t (t − P*(t)) (P*: the greedy fractional knapsack on
    β_k(t) = (1 − t) e^{L_k} + t e^{−L_k}), on a grid holding every coarse and refined endpoint, in long double."""
    LD = np.longdouble
    w = np.asarray(w, dtype=LD)
    w = w / w.sum()
    lv = np.asarray(lv, dtype=LD)
    a, b = np.exp(lv), np.exp(-lv)
    m = (w * b).sum()
    ts = np.linspace(0, 1, points + 1).astype(LD)
    beta = (1 - ts)[:, None] * a[None] + ts[:, None] * b[None]
    o = np.argsort(-beta, axis=1, kind="stable")
    bs, ws = np.take_along_axis(beta, o, 1), w[o]
    cb, cw = np.cumsum(ws * bs, 1), np.cumsum(ws, 1)
    tgt = ts * m
    k = np.minimum((cb < tgt[:, None]).sum(1), bs.shape[1] - 1)
    r = np.arange(ts.size)
    pb = np.where(k > 0, cb[r, np.maximum(k - 1, 0)], 0)
    pw = np.where(k > 0, cw[r, np.maximum(k - 1, 0)], 0)
    return float((ts - (pw + (tgt - pb) / bs[r, k])).max())


def _kernel(monkeypatch, dense3d):
    if DEV == "cpu":
        monkeypatch.setattr(E, "DENSE3D_OVERRIDE", dense3d)
    mass, lv, rmax = (x.to(DEV) for x in _rows())
    return torch.stack([x.cpu() for x in E.tv_from_hist(mass, lv, rmax, force_kernel=True)])


@pytest.mark.usefixtures("refined_tilt")
@pytest.mark.parametrize("dense3d", [True, False] if DEV == "cpu" else [None])
def test_tilt_stop_boundary_is_sound(monkeypatch, dense3d):
    mass, lv, rmax = _rows()
    twin = torch.stack(ET.tv_from_hist_torch(mass, lv, rmax))
    got = _kernel(monkeypatch, dense3d)
    for row in range(2):
        sup = _fractional_sup(mass[row].tolist(), lv[row].tolist() + [rmax[row].item()])
        for name, out in (("twin", twin), ("kernel", got)):
            assert out[3, row].item() >= sup, (name, row, out[3, row].item(), sup)  # the tilt alone
            assert out[0, row].item() >= sup, (name, row, out[0, row].item(), sup)  # TV⁺
    # no jump across the boundary (a96bf71's rule: 1.24e-4)
    assert abs(twin[3, 1].item() - twin[3, 0].item()) < 1e-12


@pytest.mark.usefixtures("refined_tilt")
@pytest.mark.parametrize("dense3d", [True, False] if DEV == "cpu" else [None])
def test_tilt_stop_boundary_kernel_matches_twin(monkeypatch, dense3d):
    mass, lv, rmax = _rows()
    twin = torch.stack(ET.tv_from_hist_torch(mass, lv, rmax))
    torch.testing.assert_close(_kernel(monkeypatch, dense3d), twin, rtol=0, atol=1e-12)
