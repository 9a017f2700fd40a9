"""Where a metered prefill's time goes (issue 35: time to first token at B 1 / 4K).

One process on the GPU, Llama-8B shapes with random bf16 weights (``bench/serving.py``'s ``build``):
for each column — stock eager (``DynamicCache``, sdpa) and WitCert graphed metered (int8, kernel path,
``cuda_graph=True``, the exact store in the process's reserved ``HostPool``, as ``bench/serving_host.py``)
— ``--reps`` prefills + argmax timed with CUDA events after two untimed, then one prefill under
``torch.profiler`` (CPU + CUDA): the top operators by self CPU time and by CUDA time, and the wall
time split into GPU busy vs host-only.

    PYTHONPATH=$PWD python3 bench/prefill_profile.py --out "$OUT" [--batch 1] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from serving import _Timer, build  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from witcert.cache import WitCertCache, reserve_host, use_witcert  # noqa: E402
from witcert.hostpool import HostPool  # noqa: E402


def prefill(model, ids, cache):
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1:].argmax(-1)


def timed(model, ids, make, reps: int, device: str) -> list[float]:
    times = []
    for i in range(reps + 2):
        cache = make()
        t = _Timer(device)
        with t:
            prefill(model, ids, cache)
        if i >= 2:
            times.append(t.elapsed())
        del cache
    return times


def profile(model, ids, make, out: pathlib.Path, name: str) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    cache = make()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False) as p:
        prefill(model, ids, cache)
        torch.cuda.synchronize()
    ka = p.key_averages()
    text = (f"## {name}: top by self CPU time\n" + ka.table(sort_by="self_cpu_time_total", row_limit=30)
            + f"\n## {name}: top by CUDA time\n" + ka.table(sort_by="self_cuda_time_total", row_limit=20))
    p.export_chrome_trace(str(out / f"prefill_{name.replace(' ', '_')}.json"))
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    cfg, model = build("llama8b", device, torch.bfloat16)
    pool = HostPool.configure()
    cap = args.tokens + 64
    reserve_host(cfg, args.batch, cap, torch.bfloat16, pool=pool)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.tokens), device=device)
    columns = {
        "stock eager": lambda: DynamicCache(config=cfg),
        "WitCert metered": lambda: WitCertCache(cfg, scheme="int8", backend="kernel", max_tokens=cap, cuda_graph=True,
                                                tilt_above=0.1, host_pool=pool),
    }
    report = [f"# prefill profile, B {args.batch} / {args.tokens} tokens, {torch.cuda.get_device_name(0)}\n"]
    def attention(name):
        if name.startswith("stock"):
            model.set_attn_implementation("sdpa")
        else:
            use_witcert(model)

    for name, make in columns.items():
        attention(name)
        ts = timed(model, ids, make, args.reps, device)
        report.append(f"{name}: TTFT median {statistics.median(ts):.1f} ms over {len(ts)} ({', '.join(f'{t:.1f}' for t in ts)})")
    for name, make in columns.items():
        attention(name)
        report.append(profile(model, ids, make, out, name))
    text = "\n".join(report)
    print(text)
    (out / "prefill_profile.md").write_text(text)


if __name__ == "__main__":
    main()
