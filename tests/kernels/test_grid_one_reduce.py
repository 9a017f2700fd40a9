"""The grid's 13 tile sums in one multi-operand reduction (``kernels.plan.GRID_ONE_REDUCE``, on by default
since run J3; ``excess_grid._grid_tile(ONE=True)``): fewer barriers in the default int8 kernel's tile loop
(bench/results/2026-12-07j/J3_run.sh).

* any device: the setting is checked, and taken on CUDA launches only (the interpreter folds a multi-operand reduction
  sequentially, in another order than its ``tl.sum``);
* CUDA: the decode with it gives the outputs and the record bit for bit as without (the same terms, and the reduction
  tree per operand expected the same: what this checks), on caches with and without the exact window;
* offline (Triton's bundled ptxas, no GPU): the sm_90 PTX of the default int8 tile has fewer ``bar.sync`` with it, and
  none of its other code changes the grid's terms (the same count of the grid's ``abs``)."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]

import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402
from tests.helpers.sketch_case import sketch_cache, window_over  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = ("tv_upper_a", "out_err_upper", "xi", "eps_max", "flag", "excess")


def test_the_setting_is_checked_and_taken_on_cuda_only(monkeypatch):
    monkeypatch.setattr(kp, "GRID_ONE_REDUCE", False)
    assert kp.grid_one_reduce("cuda") is False and kp.grid_one_reduce("cpu") is False
    monkeypatch.setattr(kp, "GRID_ONE_REDUCE", True)
    assert kp.grid_one_reduce("cuda") is True and kp.grid_one_reduce(torch.device("cuda", 0)) is True
    assert kp.grid_one_reduce("cpu") is False
    monkeypatch.setattr(kp, "GRID_ONE_REDUCE", 1)
    with pytest.raises(ValueError, match="kernels.plan.GRID_ONE_REDUCE = 1: True or False"):
        kp.grid_one_reduce("cuda")


@pytest.mark.skipif(DEV != "cuda", reason="the setting is taken on CUDA launches only")
@pytest.mark.parametrize("scheme,bits,window", [("int8", 2, (2, 8)), ("int8", 2, None), ("fp8_e4m3", 2, (4, 16))])
def test_one_reduction_changes_no_value(monkeypatch, scheme, bits, window):
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    n, H, gq, D = 300, 2, 4, 128
    c, bt, k, v, w = sketch_cache(scheme, bits, n=n, H=H, D=D, seed=7)
    q = (torch.randn(1, H * gq, D, generator=torch.Generator().manual_seed(3)) * 0.3).bfloat16().to(DEV)
    sl = torch.tensor([n], device=DEV)
    win = window_over(k, v, window)
    out = {}
    for one in (False, True):
        monkeypatch.setattr(kp, "GRID_ONE_REDUCE", one)
        out[one] = decode(c, q, bt, sl, num_splits=3, window=win, tilt_above=-1.0)
    a, b = out[False], out[True]
    assert a.meter.excess is not None and not bool(a.meter.flag.any())  # (a real record with the grid)
    assert torch.equal(a.o, b.o) and torch.equal(a.lse, b.lse)
    for f in FIELDS:
        assert torch.equal(getattr(a.meter, f), getattr(b.meter, f)), f


_PTX = r"""
import re, sys
sys.path.insert(0, "bench")
import sass_probe
for one in (False, True):
    ptx = sass_probe.compile_decode(True, 128, 1, 4, "int8", 168, SKB=2, WEIGHTED=True, HAS_WIN=True, HEAD_LEVELS=True,
                                    PAGE_LEVELS=True, EXC=True, GRD=True, GRID_ONE=one).asm["ptx"]
    print(one, len(re.findall(r"\bbar\.sync\b", ptx)), len(re.findall(r"\babs\.f32\b", ptx)))
"""


def _tools() -> bool:
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return os.path.exists(os.path.join(bin_dir, "ptxas")) or bool(shutil.which("ptxas"))


@pytest.mark.skipif(DEV == "cuda" or not _tools(), reason="offline sm_90 compile (Triton's bundled ptxas)")
def test_the_sm90_code_has_fewer_barriers():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _PTX], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {line.split()[0]: tuple(int(x) for x in line.split()[1:]) for line in r.stdout.splitlines()
           if re.match(r"^(True|False) \d+ \d+$", line)}
    (bar0, abs0), (bar1, abs1) = got["False"], got["True"]
    assert bar1 < bar0, (bar0, bar1)
    assert abs1 == abs0, (abs0, abs1)
