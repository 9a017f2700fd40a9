"""Why is the stock column of bench/serving.py slow, and where do the metered cache's extra
milliseconds per step go? (SmolLM2 shape, B = 1, 4K prompt, bf16, H200.) One decode step of stock
(sdpa + DynamicCache), of the pass-through WitCertCache (scheme none, meter off) and of the metered
int8 kernel path under torch.profiler (host time per op: launches, syncs, copies), host wall time
per step, and stock ms/token via generate().

    python3 bench/stock_probe.py
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.host_probe import probe_config  # noqa: E402
from bench.serving import build  # noqa: E402


def main():
    from torch.profiler import ProfilerActivity, profile

    dev = "cuda"
    cfg, model = build("smollm2", dev, torch.bfloat16)
    ids = torch.randint(10, cfg.vocab_size, (1, 4096), device=dev)
    for key in ("stock", "none", "int8"):
        make = probe_config(model, cfg, key)
        with torch.no_grad():
            c = make()
            out = model(ids, past_key_values=c, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1:].argmax(-1)
            ts = []
            for i in range(12):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(nxt, past_key_values=c, use_cache=True)
                torch.cuda.synchronize()
                ts.append((time.perf_counter() - t0) * 1e3)
            print(f"{key}: host wall ms per step (synchronized) median {statistics.median(ts[2:]):.2f}", flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                model(nxt, past_key_values=c, use_cache=True)
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=22), flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for new in (2, 34):
            g = []
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
                torch.cuda.synchronize()
                g.append(time.perf_counter() - t0)
            print(f"stock generate new={new}: {min(g) * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
