"""Offline (CPU, float64, the torch twin's interval values): how many of the tilt's REFINE_TOP intervals the
epilogue's refinement takes before it stops, and what valuing a refined interval at min(coarse, refined) changes.

    python3 bench/tilt_refinement.py        # 3 kinds × 2,000 random histogram rows, ~1 min on 2 cores

Per kind: the mean / max number of intervals refined before no unrefined interval is above the refined maximum
(the kernels' stop, ``kernels.epilogue_jit._tv_row``); the share of refined intervals whose sub-intervals'
maximum exceeds their coarse value (and by how much, relative); the share of rows whose tilt is lower than
refining all REFINE_TOP with the sub-intervals' maximum alone (the rule before bench/RESULTS.md run T), and by
how much. Results: bench/RESULTS.md, run T.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from kernels import epilogue_torch as Et  # noqa: E402
from kernels.epilogue_jit import COARSE, REFINE  # noqa: E402

REFINE_TOP = 8  # the refinement run T studied (the kernels' default is 0 since run Y11: the coarse grid alone)


def stats(w, lv):
    """(intervals refined, tilt now, tilt before, refined > coarse [R, TOP] bool, relative excess [R, TOP])."""
    R = w.shape[0]
    w = w / w.sum(-1, keepdim=True)
    a, b = torch.exp(lv), torch.exp(-lv)
    m = (w * b).sum(-1)
    ts = torch.linspace(0, 1, COARSE + 1, dtype=torch.float64)[:-1].expand(R, -1)
    U = Et._interval_upper(ts, 1 / COARSE, w, a, b, m)
    order = torch.sort(U, dim=-1, descending=True, stable=True).indices
    top = order[:, :REFINE_TOP]
    sub = torch.gather(ts, 1, top)[..., None] + torch.arange(REFINE, dtype=torch.float64) / (COARSE * REFINE)
    raw = Et._interval_upper(sub.reshape(R, -1), 1 / (COARSE * REFINE), w, a, b, m).reshape(R, REFINE_TOP, -1).amax(-1)
    cu = torch.gather(U, 1, top)
    su = torch.minimum(raw, cu)
    nxt = torch.gather(U, 1, order[:, 1 : REFINE_TOP + 1])
    stop = torch.cummax(su, -1).values >= nxt
    stop[:, -1] = True
    k = stop.int().argmax(-1) + 1
    now = torch.maximum(su.amax(-1), nxt[:, -1])
    before = torch.maximum(raw.amax(-1), nxt[:, -1])
    return k.double(), now, before, raw > cu, (raw - cu) / cu


def main():
    g = torch.Generator().manual_seed(0)
    f64 = dict(dtype=torch.float64, generator=g)
    kinds = {
        "8 live bins, levels to 0.3": lambda: (torch.rand(2000, 32, **f64) * (torch.arange(32) < 8),
                                              torch.sort(torch.rand(2000, 32, **f64) * 0.3, -1).values),
        "32 bins, masses ** 6, levels to 3": lambda: (torch.rand(2000, 32, **f64) ** 6,
                                                     torch.sort(torch.rand(2000, 32, **f64) * 3, -1).values),
        "32 bins, masses ** 2, levels to 0.02": lambda: (torch.rand(2000, 32, **f64) ** 2,
                                                        torch.sort(torch.rand(2000, 32, **f64) * 0.02, -1).values),
    }
    for name, make in kinds.items():
        w, lv = make()
        k, now, before, above, excess = (torch.cat(x) for x in zip(*(stats(w[i : i + 200], lv[i : i + 200])
                                                                     for i in range(0, w.shape[0], 200))))
        print(f"{name}: refined mean {k.mean():.2f} max {int(k.max())} of {REFINE_TOP}; refined > coarse in "
              f"{above.double().mean():.4f} of refined intervals (max excess {excess.max():.2e} relative); tilt below "
              f"the former rule's in {(now < before).double().mean():.4f} of rows (max {((before - now) / before).max():.2e}"
              f" relative); above it in {(now > before).double().mean():.4f}", flush=True)


if __name__ == "__main__":
    main()
