"""Diagnosis helper of bench/stream_probe.py (issue 10): the PTX instruction mix, registers and kernel-only time of the
probe kernel variants (base / fastcvt, 128- / 64-token tiles, 1 / 2 pipeline stages) at B = 8, n = 32K on the H200:
    python3 bench/stream_mix.py          (log: bench/results/2026-12-01/stream_probe_2026-12-01_mix.log; ncu run: ..._ncu.txt)"""
import collections
import os
import re
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench.decode import bench, fill_cache, graphed  # noqa: E402
from bench.stream_probe import probe_decode  # noqa: E402

B, n, Hq, Hkv, D = 8, 32768, 32, 8, 128
torch.manual_seed(0)
caches = [fill_cache(B, n, Hkv, D, "int8", "cuda") for _ in range(2)]
q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
sl = torch.full((B,), n, device="cuda", dtype=torch.int32)
S = 16
out = os.environ.get("OUT", "/tmp")
KEYS = ("ld.shared.b8", "ld.shared.v2.b8", "ld.shared.b32", "ld.shared.v4.b32", "ldmatrix", "stmatrix", "st.shared",
        "cp.async", "ld.global", "prmt.b32", "sub.bf16x2", "fma.rn.bf16x2", "cvt", "wgmma", "bar.sync")
for meter in (False, True):
    for mode in ("base", "fastcvt"):
        for pages in (8, 4):
            for stages in (1, 2):
                kw = dict(meter=meter, mode=mode, pages=pages, num_warps=4, num_stages=stages)
                c, bt = caches[0]
                probe_decode(c, q, bt, sl, S, **kw)
                k = probe_decode.compiled
                ptx = k.asm["ptx"]
                ops = collections.Counter(re.findall(r"^\s*([a-z]+[a-z0-9_.]*)", ptx, re.M))
                mix = {key: sum(v for o, v in ops.items() if o.startswith(key)) for key in KEYS}
                t = bench(graphed([(lambda c=c, bt=bt: probe_decode(c, q, bt, sl, S, **kw)) for c, bt in caches]), False)
                print(f"{'on ' if meter else 'off'} {mode:7s} p{pages} s{stages}: {t:.4f} ms regs {k.n_regs} "
                      f"spills {k.n_spills} ptx lines {sum(ops.values())} {mix}", flush=True)
