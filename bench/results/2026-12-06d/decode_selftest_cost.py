"""Run C2 (2026-12-06, eighteenth session): the one-time cost of witcert.selftest_decode's check on the GPU, at
Llama-8B's attention shapes (Hkv 8, GQ 4, d 128) with the int8 defaults (2-bit sketch, channel weights, window (4, 64))
and the plan of a B 1 / 32K and a B 8 / 32K decode: the first call (the canary's write and decode compile too) and a
second one after the process's memo is cleared (the check alone). Prints one JSON line per plan. (C2 ran it before the canary took the caller's batch, table width and output dtype; C7 adds an 8,192-token cap.)"""
import json
import sys
import time

import torch

sys.path.insert(0, ".")
from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.plan import plan_decode  # noqa: E402
from witcert import selftest_decode as SD  # noqa: E402

H, GQ, D = 8, 4, 128
w = 2.0 ** torch.randint(-1, 2, (H, D), generator=torch.Generator().manual_seed(3)).float()
for cap, B, n in ((4096, 1, 32768), (4096, 8, 32768), (8192, 1, 32768)):
    SD.CANARY_MAX_TOKENS["cuda"] = cap
    p = PagedKV.allocate(8, H, D, scheme="int8", num_groups=1, sketch_bits=2, weights=w, with_exact=False,
                         device="cuda")
    win = ExactWindow.allocate(B, H, D, torch.bfloat16, 4, 64, device="cuda")
    plan = plan_decode(p, B, H * GQ, torch.bfloat16, "cuda", n, meter=True, window=win)
    times = []
    for rep in range(3):
        SD._CHECKED.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        r = SD.check_decode_kernel(p, plan, torch.bfloat16, D ** -0.5, H * GQ, window=win, batch=B,
                                   table_width=n // 16, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    print(json.dumps(dict(cap=cap, B=B, n=n, splits=plan.num_splits, tile=str(plan.tile), seconds=times, rows=r.rows,
                          worst_tv_ratio=r.worst_tv_ratio, worst_err_ratio=r.worst_err_ratio,
                          informative=r.informative_rows)))
