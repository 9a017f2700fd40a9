"""Quality evaluation: accuracy of exact / ungated / gated KV caches on RULER-style probes.

    python bench/quality.py --lengths 1024,2048,4096 --seeds 5      (or: witcert eval -- ...)

For every (task, length, seed) sample of ``witcert.tasks`` the embedded model answers greedily
with the exact cache and with each scheme, ungated and gated (``witcert.demo.demo_gate``).
Serving semantics: prefill attends exactly and writes the cache compressed; decode reads it.
Prints accuracy per configuration and length, the paired difference to exact with a 95 %
bootstrap interval (resampling samples, 10 000 draws, fixed seed), and the page-in rate
(blocks paged in / blocks in the cache across layers and kv heads) and bytes per request.
Writes every sample's outcome to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def paired_ci(a, b, draws: int = 10000, seed: int = 0):
    """Mean of a − b and its 95 % paired bootstrap interval."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(draws, d.size))
    means = d[idx].mean(1)
    return float(d.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="witcert eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--tasks", default="single,multikey,multivalue,vartrack")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--schemes", default="fp8_e4m3,int4_group,kivi2,int8_dither")
    ap.add_argument("--json", default="quality.json")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tau", type=float, default=None, help="gate: page in only where TV+ > tau (default: the demo gate's)")
    ap.add_argument("--max-blocks", type=int, default=None, help="gate: blocks per (step, layer, kv head)")
    ap.add_argument("--min-share", type=float, default=None, help="gate: smallest share of a kv head's risk paged in")
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm

    from . import tasks
    from .cache import Gate, WitCertCache, use_witcert
    from .demo import demo_gate
    from .model import load_model

    model, tok = load_model(args.model)
    use_witcert(model)
    L, Hkv = model.config.num_hidden_layers, model.config.num_key_value_heads
    configs = [("exact", "none", None)]
    g = demo_gate()
    gate = Gate("risk-ranked", tau=g.tau if args.tau is None else args.tau,
                max_pagein_blocks=g.max_pagein_blocks if args.max_blocks is None else args.max_blocks,
                min_share=g.min_share if args.min_share is None else args.min_share)
    print(f"# gate: {gate}")
    for s in args.schemes.split(","):
        configs += [(s, s, None), (s + "+gate", s, gate)]
    jobs = [(t, int(n), sd) for n in args.lengths.split(",") for t in args.tasks.split(",") for sd in range(args.seeds)]
    rows = []
    t0 = time.time()
    for task, n, seed in tqdm(jobs, desc="samples", unit="sample"):
        smp = tasks.make(task, n, tok, seed)
        ids = torch.tensor([smp.prompt_ids], device=model.device)
        new = 18 if task == "multivalue" else 10
        for name, scheme, gate in configs:
            cache = WitCertCache(model.config, scheme=scheme, meter=gate is not None, gate=gate)
            with torch.no_grad():
                out = model.generate(ids, past_key_values=cache, max_new_tokens=new, do_sample=False,
                                     attention_mask=torch.ones_like(ids), pad_token_id=tok.eos_token_id)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            nblk = L * Hkv * -(-(out.shape[1]) // 16)
            rows.append({"task": task, "length": n, "tokens": ids.shape[1], "seed": seed, "config": name,
                         "correct": tasks.score(smp, text), "text": text[:40],
                         "pagein_blocks": int(cache.pagein_blocks.sum()), "pagein_bytes": int(cache.pagein_bytes.sum()),
                         "pagein_frac": float(cache.pagein_blocks.sum()) / nblk})
        with open(args.json, "w") as f:
            json.dump(rows, f)
    print(report(rows, [c[0] for c in configs]))
    print(f"# {len(jobs)} samples x {len(configs)} configurations in {time.time() - t0:.0f} s; outcomes in {args.json}")
    return 0


def report(rows, configs) -> str:
    lengths = sorted({r["length"] for r in rows})
    key = lambda r: (r["task"], r["length"], r["seed"])  # noqa: E731
    exact = {key(r): r["correct"] for r in rows if r["config"] == "exact"}
    out = [f"{'config':<18}" + "".join(f"{'acc@' + str(n):>10}" for n in lengths)
           + f"{'acc all':>9}{'diff vs exact [95% CI]':>28}{'page-in %':>11}{'MB/request':>12}"]
    for c in configs:
        rs = [r for r in rows if r["config"] == c]
        if not rs:
            continue
        line = f"{c:<18}"
        for n in lengths:
            a = [r["correct"] for r in rs if r["length"] == n]
            line += f"{np.mean(a):>10.2f}" if a else f"{'-':>10}"
        acc = np.mean([r["correct"] for r in rs])
        m, lo, hi = paired_ci([r["correct"] for r in rs], [exact[key(r)] for r in rs])
        line += f"{acc:>9.2f}{f'{m:+.2f} [{lo:+.2f}, {hi:+.2f}]':>28}"
        line += f"{100 * np.mean([r['pagein_frac'] for r in rs]):>11.2f}{np.mean([r['pagein_bytes'] for r in rs]) / 1e6:>12.2f}"
        out.append(line)
    tasks_ = sorted({r["task"] for r in rows})
    out.append("")
    out.append(f"{'config':<18}" + "".join(f"{t:>12}" for t in tasks_))
    for c in configs:
        rs = [r for r in rows if r["config"] == c]
        if rs:
            out.append(f"{c:<18}" + "".join(f"{np.mean([r['correct'] for r in rs if r['task'] == t]):>12.2f}" for t in tasks_))
    return "\n".join(out)
