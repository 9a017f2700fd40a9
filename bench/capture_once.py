"""Capture once (issue 35): what a graphed request pays for its CUDA graph, first request against later ones.

One process on the GPU, Llama-8B shapes with random bf16 weights (``bench/serving.py``'s ``build``), WitCert
graphed metered (int8, kernel path, ``cuda_graph=True``, the exact store in the reserved ``HostPool``, as
``bench/serving_host.py``). Per cell (batch × prompt) three requests in a row, each a fresh ``WitCertCache``
dropped after it: time to first token (prefill + argmax), the first decode step (request 1: the eager step
+ the capture; later requests: a replay of request 1's capture on the pooled storage, ``witcert.graph_pool``)
and the median of the next ``--steps`` steps, CUDA events, ms; and the pool's counters. ``--no-pool`` runs the
same with the pool emptied before every request (each request captures: the behaviour before issue 35).

    PYTHONPATH=$PWD python3 bench/capture_once.py --out "$OUT" [--cells 1x4096,8x4096]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from serving import _Timer, build  # noqa: E402

from witcert.cache import WitCertCache, reserve_host, use_witcert  # noqa: E402
from witcert.graph_pool import POOL  # noqa: E402
from witcert.hostpool import HostPool  # noqa: E402


def request(model, cfg, ids, cap: int, pool, steps: int) -> dict:
    """One request: TTFT, the first decode step, the median of the next ``steps``; whether it captured."""
    cache = WitCertCache(cfg, scheme="int8", backend="kernel", max_tokens=cap, cuda_graph=True, tilt_above=0.1,
                         host_pool=pool)
    with torch.no_grad():
        t = _Timer("cuda")
        with t:
            nxt = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)
        ttft = t.elapsed()
        times = []
        for _ in range(steps + 1):
            t = _Timer("cuda")
            with t:
                nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            times.append(t)
    captured = cache.summary()["host"]["syncs"].get("graph_capture", 0)
    del cache
    return dict(ttft_ms=ttft, first_step_ms=times[0].elapsed(), step_ms=statistics.median(x.elapsed() for x in times[1:]),
                captured=captured)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="1x4096,8x4096")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, model = build("llama8b", "cuda", torch.bfloat16)
    use_witcert(model)
    cells = [tuple(map(int, c.split("x"))) for c in args.cells.split(",")]
    pool = HostPool.configure()
    reserve_host(cfg, max(b for b, _ in cells), max(n for _, n in cells) + 64, torch.bfloat16, pool=pool)
    rows = []
    lines = ["| B | prompt | pool | request | TTFT ms | first step ms | step ms | captured |", "|---|---|---|---|---|---|---|---|"]
    warm = torch.randint(10, cfg.vocab_size, (1, 256), device="cuda")  # Triton compiles, cuBLAS workspaces
    request(model, cfg, warm, 256 + 64, pool, 2)
    for B, n in cells:
        ids = torch.randint(10, cfg.vocab_size, (B, n), device="cuda")
        for use_pool in (False, True):
            POOL.clear()
            for i in range(args.requests):
                if not use_pool:
                    POOL.clear()
                r = dict(B=B, n=n, pool=use_pool, request=i + 1, **request(model, cfg, ids, n + 64, pool, args.steps))
                rows.append(r)
                lines.append(f"| {B} | {n} | {'on' if use_pool else 'off'} | {i + 1} | {r['ttft_ms']:.1f} | "
                             f"{r['first_step_ms']:.1f} | {r['step_ms']:.2f} | {r['captured']} |")
                print(lines[-1], flush=True)
    s = POOL.stats()
    lines.append(f"\npool: {s}")
    (out / "capture_once.md").write_text("\n".join(lines) + "\n")
    (out / "capture_once.json").write_text(json.dumps(rows, indent=1))
    print(lines[-1])


if __name__ == "__main__":
    main()
