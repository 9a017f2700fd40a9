"""Quality evaluation: accuracy of exact / ungated / gated KV caches on RULER-style probes.

    python bench/quality.py --lengths 1024,2048,4096 --seeds 5      (or: witcert eval --lengths ...)

For every (task, length, seed) sample of ``witcert.tasks`` the embedded model answers greedily
with the exact cache and with each scheme, ungated and gated (``witcert.demo.demo_gate``).
Serving semantics: prefill attends exactly and writes the cache compressed; decode reads it.
Prints accuracy per configuration and length, the paired difference to exact with a 95 %
bootstrap interval (resampling samples, 10 000 draws, fixed seed), and the page-in rate
(blocks paged in / blocks in the cache across layers and kv heads) and bytes per request.
Writes every sample's outcome to ``--json`` at the end (atomically; nothing on a failed run).
``--sweep-layers``: the layer sweep of ``witcert.sweep``.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from .evalstats import paired_ci, write_json_atomic  # noqa: F401 (re-exported)
from .sweep import run_sweep

#: layers of the embedded SmolLM2-135M (witcert.model), to check --layers before loading it
EMBEDDED_LAYERS = 30


def add_eval_arguments(ap) -> None:
    """The flags of ``witcert eval`` / ``bench/quality.py`` (every value checked while parsing)."""
    from . import argtypes as A
    from .tasks import TASKS

    ap.add_argument("--lengths", type=A.int_list(64), default=[1024, 2048], help="prompt lengths in tokens (>= 64), e.g. 1024,2048")
    ap.add_argument("--tasks", type=A.choice_list(TASKS, "task"), default=list(TASKS), help=f"tasks, from {','.join(TASKS)}")
    ap.add_argument("--seeds", type=A.int_at_least(1), default=5, help="samples per (task, length)")
    ap.add_argument("--schemes", type=A.scheme_list, default=["fp8_e4m3", "int4_group", "kivi2", "int8_dither"],
                    help="KV schemes (aliases: fp8 = fp8_e4m3, int4 = int4_group, auto = none)")
    ap.add_argument("--json", type=A.out_file, default=pathlib.Path("quality.json"),
                    help="per-sample outcomes (written at the end, only when there are outcomes)")
    ap.add_argument("--model", type=A.model_dir, default=None, help="a local Hugging Face model folder (default: embedded SmolLM2)")
    ap.add_argument("--tau", type=A.float_in(0.0, 1.0), default=None,
                    help="gate: page in only where TV+ > tau, in [0, 1] (default: the demo gate's)")
    ap.add_argument("--max-blocks", type=A.int_at_least(0), default=None, help="gate: blocks per (step, layer, kv head)")
    ap.add_argument("--min-share", type=A.float_in(0.0, 1.0), default=None, help="gate: smallest share of a kv head's risk paged in")
    ap.add_argument("--sweep-layers", action="store_true",
                    help="layer sweep (witcert.sweep): compress one layer at a time, the others exact; per layer the "
                         "accuracy change [95%% CI], KL to exact and the meter's TV+ quantiles, and their rank correlation")
    ap.add_argument("--layers", type=A.layer_set, default=None, help="--sweep-layers: layers to sweep, e.g. 0-29 (default: all)")
    ap.add_argument("--sweep-out", type=A.out_dir, default=None,
                    help="--sweep-layers: folder for sweep.json and sweep.png (default: the --json file's folder)")


def main(argv=None) -> int:
    from .argtypes import OneLineParser

    ap = OneLineParser(prog="witcert eval", description=__doc__.split("\n\n")[0])
    add_eval_arguments(ap)
    args = ap.parse_args(argv)
    check_eval_args(ap, args)
    return run(args)


def check_eval_args(ap, args) -> None:
    """Checks across flags (argparse error, exit 2)."""
    if not args.sweep_layers and (args.layers is not None or args.sweep_out is not None):
        ap.error("--layers and --sweep-out need --sweep-layers")
    if args.sweep_layers and all(x == "none" for x in args.schemes):
        ap.error("argument --schemes: the sweep needs a compressed scheme (not only auto / none)")
    if args.layers is not None:
        n = EMBEDDED_LAYERS
        if args.model is not None:
            n = json.loads((pathlib.Path(args.model) / "config.json").read_text()).get("num_hidden_layers", n)
        if args.layers[-1] >= n:
            ap.error(f"argument --layers: the model has layers 0-{n - 1}, got {args.layers[-1]}")


def run(args) -> int:
    if args.sweep_layers:
        return run_sweep(args)
    import torch
    from tqdm import tqdm

    from . import tasks
    from .cache import WitCertCache, use_witcert
    from .model import load_model

    model, tok = load_model(args.model)
    use_witcert(model)
    L, Hkv = model.config.num_hidden_layers, model.config.num_key_value_heads
    configs = [("exact", "none", None)]
    gate = eval_gate(args)
    print(f"# gate: {gate}")
    for s in args.schemes:
        if s != "none":
            configs += [(s, s, None), (s + "+gate", s, gate)]
    jobs = [(t, n, sd) for n in args.lengths for t in args.tasks for sd in range(args.seeds)]
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
    if not rows:
        print("witcert eval: no samples were evaluated; nothing written")
        return 1
    write_json_atomic(args.json, rows)
    print(report(rows, [c[0] for c in configs]))
    print(f"# {len(jobs)} samples x {len(configs)} configurations in {time.time() - t0:.0f} s; outcomes in {args.json}")
    return 0


def eval_gate(args):
    from .demo import demo_gate
    from .gate import Gate

    g = demo_gate()
    return Gate("risk-ranked", tau=g.tau if args.tau is None else args.tau,
                max_pagein_blocks=g.max_pagein_blocks if args.max_blocks is None else args.max_blocks,
                min_share=g.min_share if args.min_share is None else args.min_share)


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
