"""Layer sweep (``witcert eval --sweep-layers``): which single layer's KV compression hurts, and
does the meter rank the layers the way accuracy does?

For every sample (``witcert.tasks``; ``--tasks``, ``--lengths``, ``--seeds``) the model answers
greedily with the exact cache, then once per swept layer ℓ with ``WitCertCache(scheme,
compress_layers={ℓ})``: layer ℓ's cache is compressed and metered (Tier A, ungated), every other
layer is exact and unmetered. Per layer it reports

* the accuracy change against exact, with its 95 % paired bootstrap interval (``paired_ci``);
* ``agree``: the share of generated tokens equal to the exact run's (position by position);
* ``KL``: the mean KL(exact ‖ compressed) of the next-token distributions over the decode steps
  up to the first diverging token (same inputs on both sides; the first token comes from the
  exact prefill and is not counted): a continuous measure of harm when accuracy barely moves;
* the meter's Tier A TV⁺ quantiles (p50, p90, max) over that layer's (head, step) rows;

and the Spearman rank correlations of TV⁺ p90 with −Δaccuracy and with KL across layers.
Writes ``sweep.json`` (the ``SweepResult`` and every sample's outcome) and ``sweep.png``.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time

import numpy as np

from .evalstats import paired_ci, write_json_atomic

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LayerResult:
    layer: int
    acc: float
    acc_diff: float
    ci_lo: float
    ci_hi: float
    agree: float
    kl: float
    tv_p50: float
    tv_p90: float
    tv_max: float


@dataclasses.dataclass(frozen=True)
class SweepResult:
    scheme: str
    samples: int
    exact_acc: float
    layers: tuple
    spearman_acc: float  # TV+ p90 vs −Δaccuracy across layers (nan when either is constant)
    spearman_kl: float  # TV+ p90 vs KL
    seconds: float


def rankdata(x) -> np.ndarray:
    """Ranks 1..n with ties averaged."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation (nan when either side is constant or too short)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def _kl(p_logits, q_logits) -> float:
    import torch

    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return float((lp.exp() * (lp - lq)).sum())


def compare_generations(exact_tokens, exact_logits, tokens, logits) -> tuple[float, float]:
    """(agreement, mean KL over decode steps up to the first diverging token)."""
    n = min(len(exact_tokens), len(tokens))
    same = [int(exact_tokens[i]) == int(tokens[i]) for i in range(n)]
    agree = float(np.mean(same)) if n else float("nan")
    first_diff = same.index(False) if False in same else n
    steps = range(1, min(first_diff + 1, n, len(exact_logits), len(logits)))
    kls = [_kl(exact_logits[i][0], logits[i][0]) for i in steps]
    return agree, (float(np.mean(kls)) if kls else 0.0)


def summarize_sweep(scheme: str, layers, rows, meter: dict, seconds: float) -> SweepResult:
    """``rows``: per (sample, config) outcomes; ``meter``: layer → list of TV+ values."""
    key = lambda r: (r["task"], r["length"], r["seed"])  # noqa: E731
    exact = {key(r): r["correct"] for r in rows if r["config"] == "exact"}
    out = []
    for layer in layers:
        rs = [r for r in rows if r["config"] == f"layer{layer}"]
        m, lo, hi = paired_ci([r["correct"] for r in rs], [exact[key(r)] for r in rs])
        tv = np.asarray(meter.get(layer, []), dtype=float)
        q = np.quantile(tv, [0.5, 0.9]) if tv.size else [np.nan, np.nan]
        out.append(LayerResult(layer=layer, acc=float(np.mean([r["correct"] for r in rs])), acc_diff=m, ci_lo=lo, ci_hi=hi,
                               agree=float(np.mean([r["agree"] for r in rs])), kl=float(np.mean([r["kl"] for r in rs])),
                               tv_p50=float(q[0]), tv_p90=float(q[1]), tv_max=float(tv.max()) if tv.size else float("nan")))
    p90 = [r.tv_p90 for r in out]
    return SweepResult(scheme=scheme, samples=len(exact), exact_acc=float(np.mean(list(exact.values()))) if exact else float("nan"),
                       layers=tuple(out), spearman_acc=spearman(p90, [-r.acc_diff for r in out]),
                       spearman_kl=spearman(p90, [r.kl for r in out]), seconds=seconds)


def format_sweep(s: SweepResult) -> str:
    lines = [f"layer sweep: {s.scheme} on one layer at a time (others exact), {s.samples} samples, exact accuracy {s.exact_acc:.2f}",
             f"{'layer':>5}{'acc':>7}{'Δacc [95% CI]':>24}{'agree':>8}{'KL':>10}{'TV+ p50':>9}{'TV+ p90':>9}{'TV+ max':>9}"]
    for r in s.layers:
        ci = f"{r.acc_diff:+.2f} [{r.ci_lo:+.2f}, {r.ci_hi:+.2f}]"
        lines.append(f"{r.layer:>5}{r.acc:>7.2f}{ci:>24}{r.agree:>8.2f}{r.kl:>10.2e}{r.tv_p50:>9.3f}{r.tv_p90:>9.3f}{r.tv_max:>9.3f}")
    lines.append(f"Spearman rank correlation across layers: TV+ p90 vs -Δacc {s.spearman_acc:+.2f}; "
                 f"TV+ p90 vs KL {s.spearman_kl:+.2f} (nan: one side constant)")
    return "\n".join(lines)


def plot_sweep(s: SweepResult, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.array([r.layer for r in s.layers])
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 0.28 * len(x) + 3), 8), sharex=True, constrained_layout=True)
    d = np.array([r.acc_diff for r in s.layers])
    err = np.array([[r.acc_diff - r.ci_lo for r in s.layers], [r.ci_hi - r.acc_diff for r in s.layers]])
    axes[0].bar(x, d, color="tab:red", alpha=0.7)
    axes[0].errorbar(x, d, yerr=err, fmt="none", ecolor="k", capsize=2, lw=0.8)
    axes[0].axhline(0, color="k", lw=0.6)
    axes[0].set_ylabel("Δ accuracy vs exact\n(95% bootstrap CI)")
    axes[1].bar(x, [max(r.kl, 1e-12) for r in s.layers], color="tab:purple", alpha=0.7)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("KL(exact ‖ compressed)\nnext token, mean")
    for q, st in (("tv_p50", "o-"), ("tv_p90", "s-"), ("tv_max", "^:")):
        axes[2].plot(x, [getattr(r, q) for r in s.layers], st, ms=3, label=q.replace("tv_", "TV+ "))
    axes[2].set_ylabel("meter: Tier A TV+")
    lo = min((r.tv_p50 for r in s.layers if np.isfinite(r.tv_p50)), default=0.0)
    axes[2].set_ylim(max(0.0, lo - 0.05), 1.005)  # near-saturated schemes: zoom in on the spread
    axes[2].set_xlabel("compressed layer (all others exact)")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"layer sweep, {s.scheme}, {s.samples} samples; Spearman(TV+ p90, −Δacc) = {s.spearman_acc:+.2f}, "
                 f"Spearman(TV+ p90, KL) = {s.spearman_kl:+.2f}", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def load_sweep(path) -> list[SweepResult]:
    """The SweepResults of a ``sweep.json`` (e.g. to re-plot without re-running)."""
    import json

    out = []
    for d in json.loads(pathlib.Path(path).read_text())["results"]:
        d = dict(d, layers=tuple(LayerResult(**r) for r in d["layers"]))
        out.append(SweepResult(**d))
    return out


def sweep_model(model, tok, scheme: str, layers, jobs, progress=None) -> tuple[list, dict]:
    """Run the sweep on a loaded model (``use_witcert`` applied). ``jobs``: (task, length, seed).
    Returns (per-sample rows, layer → TV+ values)."""
    import torch

    from . import tasks
    from .cache import WitCertCache

    rows, meter = [], {layer: [] for layer in layers}
    for task, n, seed in jobs:
        smp = tasks.make(task, n, tok, seed)
        ids = torch.tensor([smp.prompt_ids], device=model.device)
        new = 18 if task == "multivalue" else 10

        def gen(cache):
            with torch.no_grad():
                out = model.generate(ids, past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                     attention_mask=torch.ones_like(ids), pad_token_id=tok.eos_token_id,
                                     return_dict_in_generate=True, output_logits=True)
            toks = out.sequences[0, ids.shape[1]:]
            return toks, out.logits, tasks.score(smp, tok.decode(toks, skip_special_tokens=True))

        base = {"task": task, "length": n, "tokens": int(ids.shape[1]), "seed": seed}
        ex_toks, ex_logits, ex_ok = gen(WitCertCache(model.config, scheme="none", meter=False))
        rows.append({**base, "config": "exact", "correct": ex_ok, "agree": 1.0, "kl": 0.0})
        for layer in layers:
            cache = WitCertCache(model.config, scheme=scheme, compress_layers={layer})
            toks, logits, ok = gen(cache)
            agree, kl = compare_generations(ex_toks, ex_logits, toks, logits)
            rows.append({**base, "config": f"layer{layer}", "correct": ok, "agree": agree, "kl": kl})
            meter[layer] += [float(x) for r in cache.records for x in np.asarray(r.tv_a).reshape(-1)]
            if progress:
                progress()
    return rows, meter


def run_sweep(args) -> int:
    from tqdm import tqdm

    from .cache import use_witcert
    from .model import load_model

    model, tok = load_model(args.model)
    use_witcert(model)
    L = model.config.num_hidden_layers
    layers = list(range(L)) if args.layers is None else args.layers
    if any(layer >= L for layer in layers):
        print(f"witcert eval: error: --layers: the model has layers 0-{L - 1}, got {layers[-1]}", file=__import__("sys").stderr)
        return 2
    schemes = [s for s in args.schemes if s != "none"]
    jobs = [(t, n, sd) for n in args.lengths for t in args.tasks for sd in range(args.seeds)]
    outdir = pathlib.Path(args.sweep_out) if args.sweep_out is not None else pathlib.Path(args.json).parent
    log.info("sweep: %d layers x %d samples x %d schemes -> %s", len(layers), len(jobs), len(schemes), outdir)
    results, all_rows = [], {}
    for scheme in schemes:
        t0 = time.time()
        bar = tqdm(total=len(jobs) * len(layers), desc=f"sweep {scheme}", unit="gen")
        rows, meter = sweep_model(model, tok, scheme, layers, jobs, progress=bar.update)
        bar.close()
        res = summarize_sweep(scheme, layers, rows, meter, time.time() - t0)
        results.append(res)
        all_rows[scheme] = rows
        print(format_sweep(res))
    if not results:
        print("witcert eval --sweep-layers: no scheme to sweep; nothing written")
        return 1
    outdir.mkdir(parents=True, exist_ok=True)
    for res in results:
        suffix = "" if len(results) == 1 else f"_{res.scheme}"
        plot_sweep(res, outdir / f"sweep{suffix}.png")
    write_json_atomic(outdir / "sweep.json", {"results": [dataclasses.asdict(r) for r in results], "samples": all_rows,
                                              "jobs": jobs})
    print(f"# sweep: {outdir / 'sweep.json'}, plot(s) in {outdir}")
    return 0
