"""``witcert demo``: meter and gate a compressed KV cache on the embedded SmolLM2-135M.

A needle-in-a-haystack prompt (``witcert.tasks``, ~2K tokens) is answered with the exact
cache and with fp8_e4m3 (raw cast), int4_group, kivi2 and int8_dither, each ungated and gated.
Prefill attends exactly; every decode step reads the compressed cache and is metered per
(layer, head, step) — with ``audit`` the realised TV against exact attention is computed too,
and every bound is checked against it. Prints a table and writes two plots under ``--out``:

* ``risk_heatmap.png``: layer × query head, the largest Tier A TV⁺ over the decode steps (ungated);
* ``risk_coverage.png``: coverage (fraction of (layer, head, step) with bound ≤ τ) against τ
  for the tanh, e-form and tilt bounds and Tier B (int8_dither, ungated), and the realised TV.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

DEMO_SCHEMES = ("fp8_e4m3", "int4_group", "kivi2", "int8_dither")
DELTA_REQ = 1e-3


def demo_gate():
    from .cache import Gate

    # where the Tier A bound is near saturation (TV+ > 0.9, SPEC §6's risk-ranked case), repair the
    # blocks that carry >= 20 % of a kv head's risk, at most 2 per (step, layer, kv head)
    return Gate("risk-ranked", tau=0.9, max_pagein_blocks=2, min_share=0.2)


def run(tokens: int = 2000, seed: int = 0, new_tokens: int = 10, out: str = "witcert-demo", model_path=None,
        taus=(0.1, 0.5)) -> dict:
    import torch
    from tqdm import tqdm

    from . import tasks
    from .cache import TIER_B_CAVEAT, WitCertCache, use_witcert
    from .model import load_model

    t0 = time.time()
    model, tok = load_model(model_path)
    use_witcert(model)
    sample = tasks.make("single", tokens, tok, seed)
    ids = torch.tensor([sample.prompt_ids], device=model.device)
    n = ids.shape[1]
    L = model.config.num_hidden_layers
    Hkv = model.config.num_key_value_heads
    total_blocks = L * Hkv * -(-(n + new_tokens) // 16)
    configs = [("exact", "none", None)]
    for s in DEMO_SCHEMES:
        configs += [(s, s, None), (s + " +gate", s, demo_gate())]
    results, caches = [], {}
    for name, scheme, gate in tqdm(configs, desc="configs", unit="run"):
        cache = WitCertCache(model.config, scheme=scheme, meter=scheme != "none", gate=gate, audit=True,
                             delta_req=DELTA_REQ if scheme == "int8_dither" else None)
        t = time.time()
        with torch.no_grad():
            gen = model.generate(ids, past_key_values=cache, max_new_tokens=new_tokens, do_sample=False,
                                 attention_mask=torch.ones_like(ids), pad_token_id=tok.eos_token_id)
        text = tok.decode(gen[0, n:], skip_special_tokens=True)
        recs = cache.records
        row = {"config": name, "answer": text.strip()[:24], "correct": tasks.score(sample, text), "seconds": time.time() - t}
        if recs:
            tv = np.stack([r.tv_a[0] for r in recs])  # [steps*layers, Hq]
            per_layer = np.array([np.stack([r.tv_a[0] for r in recs if r.layer == i]).max() for i in range(L)])
            row.update(
                max_tv=float(tv.max()), median_tv=float(np.median(tv)),
                median_layer_max=float(np.median(per_layer)), worst_layer=int(per_layer.argmax()),
                **{f"cert@{t}": float(np.mean(tv <= t)) for t in taus},
                pagein_blocks=int(cache.pagein_blocks.sum()), pagein_bytes=int(cache.pagein_bytes.sum()),
                pagein_frac=float(cache.pagein_blocks.sum() / total_blocks),
                max_real=float(np.max([r.tv_real.max() for r in recs])),
                violations=int(sum(r.audit_violations for r in recs)),
            )
            if recs[0].tv_b is not None:
                row["median_tv_b"] = float(np.median(np.stack([r.tv_b[0] for r in recs])))
        results.append(row)
        caches[name] = cache
    outdir = pathlib.Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    _plots(caches, outdir, L, model.config.num_attention_heads)
    (outdir / "results.json").write_text(json.dumps({"tokens": n, "answer": sample.answers, "rows": results}, indent=1))
    _print(results, n, sample, taus, outdir, time.time() - t0)
    print(TIER_B_CAVEAT)
    return {"rows": results, "tokens": n}


def _print(rows, n, sample, taus, outdir, secs):
    print(f"\nWitCert demo: SmolLM2-135M-Instruct, single-needle prompt of {n} tokens, answer {sample.answers[0]}; "
          "prefill exact, decode reads the compressed cache (K and V), per-token witnesses.")
    print("TV+ = Tier A bound per (layer, head, decode step); cert@t = share of them with TV+ <= t; "
          "real = realised TV vs exact attention (audit); gate: where TV+ > 0.9, risk-ranked, "
          "<= 2 blocks/(step, layer, kv head), blocks with >= 20% of the risk.")
    hdr = f"{'config':<20}{'answer':<14}{'ok':>3}{'max TV+':>9}{'med TV+':>9}{'med lyr max':>12}"
    hdr += "".join(f"{'cert@' + str(t):>10}" for t in taus)
    hdr += f"{'page-in blk':>12}{'bytes':>10}{'% blk':>7}{'max real':>10}{'viol':>5}"
    print(hdr)
    for r in rows:
        line = f"{r['config']:<20}{r['answer'][:13]:<14}{'yes' if r['correct'] else 'no':>3}"
        if "max_tv" in r:
            line += f"{r['max_tv']:>9.3f}{r['median_tv']:>9.3f}{r['median_layer_max']:>12.3f}"
            line += "".join(f"{r[f'cert@{t}']:>10.2f}" for t in taus)
            line += f"{r['pagein_blocks']:>12}{r['pagein_bytes']:>10}{100 * r['pagein_frac']:>7.2f}{r['max_real']:>10.3f}{r['violations']:>5}"
        else:
            line += f"{'(exact cache, no meter)':>30}"
        print(line)
    tb = [r for r in rows if "median_tv_b" in r]
    for r in tb:
        print(f"Tier B ({r['config']}, delta_req={DELTA_REQ}, anytime schedule): median TV+_B {r['median_tv_b']:.3f}")
    print(f"plots: {outdir / 'risk_heatmap.png'}, {outdir / 'risk_coverage.png'}; table: {outdir / 'results.json'} "
          f"({secs:.0f} s)")


def _plots(caches, outdir, L, Hq):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ungated = [k for k in caches if k != "exact" and "+gate" not in k]
    fig, axes = plt.subplots(1, len(ungated), figsize=(3.2 * len(ungated), 6), sharey=True)
    for ax, name in zip(np.atleast_1d(axes), ungated):
        grid = np.zeros((L, Hq))
        for r in caches[name].records:
            grid[r.layer] = np.maximum(grid[r.layer], r.tv_a_pre[0])
        im = ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="magma", origin="lower")
        ax.set_title(name)
        ax.set_xlabel("query head")
        ax.set_xticks(range(Hq))
    np.atleast_1d(axes)[0].set_ylabel("layer")
    fig.colorbar(im, ax=axes, label="max Tier A TV+ over decode steps")
    fig.savefig(outdir / "risk_heatmap.png", dpi=110)
    plt.close(fig)

    taus = np.linspace(0, 1, 201)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name in ungated:
        recs = caches[name].records
        parts = np.concatenate([r.parts_pre[:, 0] for r in recs], axis=1)  # [3, rows]
        for i, (lab, ls) in enumerate((("tanh", ":"), ("e-form", "--"), ("tilt", "-"))):
            if name == "int8_dither" or lab == "tilt":
                ax.plot(taus, [(parts[i] <= t).mean() for t in taus], ls, label=f"{name} {lab}")
        if recs[0].tv_b_pre is not None:
            tb = np.concatenate([r.tv_b_pre[0] for r in recs])
            ax.plot(taus, [(tb <= t).mean() for t in taus], "-.", label=f"{name} Tier B")
        real = np.concatenate([r.tv_real[0] for r in recs]) if name == "int8_dither" else None
        if real is not None:
            ax.plot(taus, [(real <= t).mean() for t in taus], color="gray", lw=3, alpha=0.4, label=f"{name} realised TV")
    ax.set_xlabel("tau")
    ax.set_ylabel("coverage: share of (layer, head, step) with bound <= tau")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(outdir / "risk_coverage.png", dpi=110)
    plt.close(fig)
