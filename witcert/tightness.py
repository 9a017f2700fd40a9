"""``witcert tightness``: how close the meter's bound is to the truth, on the embedded model.

For each of ``PROMPTS`` (at least two), the embedded SmolLM2-135M-Instruct prefills ``tokens`` tokens
and decodes ``steps`` tokens greedily into an audited ``WitCertCache`` (the cache's defaults unless
overridden: scheme, residual sketch, exact window; channel weights from the embedded model's
calibration, ``witcert.calibrate``, computed from a calibration text that is not among the prompts).
Every (prompt, decode step, layer, query head) is a row: the meter's Tier A bound TV⁺ against the
realised TV between exact attention (float64, over the exact keys and values of the backing store)
and the attention the cache served. Reported (``TightnessResult``, JSON with ``--json``):

    sketch_box ("centred": the reference path's centred sketch box; "symmetric": the kernels' form;
    "per-head": each query head's own symmetric radius, both paths),
    rows, violations (rows with TV⁺ < realised TV), median_bound, median_real,
    median_ratio (median TV⁺ / TV over rows with TV > 0), cov_05 / cov_10 (share of rows with
    TV⁺ ≤ 0.05 / 0.1), bytes_per_token (per kv head at d = 128: codes, scales, witnesses, sketch, the
    window amortised at ``context`` tokens), tokens_at_equal_memory (vs a bf16 cache, d = 128),
    tokens_at_equal_memory_by_context (the same ratio with the window amortised at each of
    ``MEMORY_CONTEXTS``; the window is a fixed cost per sequence, so the ratio grows with the context
    towards the per-token figure, key "per_token": the window left out)

    witcert tightness --scheme int8 [--json] [--tokens 1024] [--steps 2] [--sketch-bits 2] [--window 4,32]
                      [--sketch-box auto|centred|symmetric|per-head]
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np

#: the prompts metered (two texts of different kind; none is the calibration text)
PROMPTS = (
    ("haystack", "The quick brown fox jumps over the lazy dog. In the archive of the old library, every shelf holds "
                 "ledgers of ships, harbours and cargo, written in a careful hand. ", " The secret code is 4096. "
                 "What is the secret code?"),
    ("story", "Alice wrote a letter to Bob about the weather in Paris, the price of bread and the train schedule. "
              "Once upon a time, in a small village by the sea, there lived an old fisherman who told stories about "
              "the storms of his youth, the nets he mended and the friends he had lost. ", " Summarize the story in "
              "one sentence."),
)
#: context length at which the exact window's bytes are amortised in ``bytes_per_token``
AMORTISE_CONTEXT = 4096
#: head dim of the memory figures (the issue's d = 128)
MEMORY_HEAD_DIM = 128
#: contexts at which ``tokens_at_equal_memory_by_context`` amortises the window
MEMORY_CONTEXTS = (4096, 32768, 131072)


@dataclasses.dataclass
class TightnessResult:
    scheme: str
    sketch_bits: int
    sketch_box: str
    window: tuple
    weights: str
    backend: str
    tokens: int
    steps: int
    prompts: int
    rows: int
    violations: int
    median_bound: float
    median_real: float
    median_ratio: float
    cov_05: float
    cov_10: float
    rows_real_zero: int
    bytes_per_token: float
    tokens_at_equal_memory: float
    tokens_at_equal_memory_by_context: dict
    seconds: float

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        return d


def prompt_ids(tok, prompt, tokens: int):
    """Token ids [1, tokens] of a built-in prompt: its body repeated, then its question."""
    _, body, question = prompt
    q = tok(question, add_special_tokens=False)["input_ids"]
    b = tok(body, add_special_tokens=False)["input_ids"]
    reps = max(1, math.ceil(max(1, tokens - len(q)) / max(1, len(b))))
    ids = (b * reps)[: max(0, tokens - len(q))] + q
    import torch

    return torch.tensor([ids[:tokens]])


def memory(scheme: str, sketch_bits: int, window, context: int = AMORTISE_CONTEXT, head_dim: int = MEMORY_HEAD_DIM) -> dict:
    """``kernels.memory_accounting.bytes_per_token`` of the WitCertCache kernel layout (one key witness, ν and κ as
    page maxima: ``PagedKV.block_norms``) with the sketch and the window amortised at ``context`` tokens."""
    from kernels.memory_accounting import bytes_per_token

    return bytes_per_token(scheme, head_dim=head_dim, num_groups=1, sketch_bits=sketch_bits, window=window,
                           context=context, block_norms=True)


def memory_by_context(scheme: str, sketch_bits: int, window) -> dict:
    """Tokens at equal memory vs bf16 with the window amortised at each of ``MEMORY_CONTEXTS`` (keys "4096", …) and
    without it ("per_token": the limit of a long context)."""
    out = {str(c): float(memory(scheme, sketch_bits, window, context=c)["ratio_vs_model_dtype"])
           for c in MEMORY_CONTEXTS}
    out["per_token"] = float(memory(scheme, sketch_bits, None)["ratio_vs_model_dtype"])
    return out


def resolve_backend(backend: str, device: str, dtype, config, scheme: str = "int8", sketch_box: str = "auto") -> str:
    """The cache backend ``run`` asks for: "auto" is what ``WitCertCache(backend="auto").use_kernel`` picks for this
    model, device, dtype and scheme without the audit the command needs (the audit alone sends the cache's "auto" to the
    float64 reference path), and the reference path for ``sketch_box="centred"`` / ``"grid"`` (only it meters them);
    "reference" / "kernel" as given."""
    import torch

    from .cache import WitCertCache

    if backend != "auto":
        return backend
    if sketch_box in ("centred", "grid"):
        return "reference"
    probe = WitCertCache(config, scheme=scheme, backend="auto")
    return "kernel" if probe.use_kernel(torch.device(device), 1, dtype) else "reference"


def run(scheme: str = "int8", tokens: int = 1024, steps: int = 2, sketch_bits: int | None = None, window="default",
        weights: str = "calibrated", device: str = "cpu", backend: str = "auto", dtype=None,
        sketch_box: str = "auto") -> TightnessResult:
    """Meter ``steps`` decode steps of every prompt (module doc) and summarise."""
    import torch

    from contract.sketch import DEFAULT_SKETCH_BITS, DEFAULT_WINDOW

    from .cache import WitCertCache
    from .calibrate import embedded_calibration
    from .model import load_model

    t0 = time.time()
    from contract.schemes import SCHEMES

    bits = (SCHEMES[scheme].default_sketch_bits if scheme in SCHEMES else DEFAULT_SKETCH_BITS) \
        if sketch_bits is None else sketch_bits
    win = DEFAULT_WINDOW if window == "default" else window
    dt = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    model, tok = load_model(dtype=dt)
    backend = resolve_backend(backend, device, dt, model.config, scheme, sketch_box)
    model.to(device)
    from .cache import use_witcert

    use_witcert(model)
    w = None
    if weights == "calibrated":
        w = embedded_calibration(scheme, bits, model=model, tok=tok)
    bounds, real = [], []
    used = backend
    for prompt in PROMPTS:
        ids = prompt_ids(tok, prompt, tokens).to(device)
        cache = WitCertCache(model.config, scheme=scheme, sketch_bits=bits, window=win, weights=w, audit=True,
                             backend=backend, max_tokens=tokens + steps + 16, sketch_box=sketch_box)
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=steps + 1,
                           min_new_tokens=steps + 1, do_sample=False, pad_token_id=tok.eos_token_id)
        used = "kernel" if cache.layers[0].paged is not None else "reference"
        box = cache.metered_sketch_box(used == "kernel")
        for rec in cache.records:
            bounds.append(np.asarray(rec.tv_a, dtype=np.float64).ravel())
            real.append(np.asarray(rec.tv_real, dtype=np.float64).ravel())
    b = np.concatenate(bounds) if bounds else np.zeros(0)
    r = np.concatenate(real) if real else np.zeros(0)
    pos = r > 0
    mem = memory(scheme, bits, win)
    return TightnessResult(
        scheme=scheme, sketch_bits=bits, sketch_box=box, window=tuple(win or (0, 0)), weights=weights, backend=used, tokens=tokens,
        steps=steps, prompts=len(PROMPTS), rows=int(b.size), violations=int(np.sum(b < r)),
        median_bound=float(np.median(b)) if b.size else float("nan"),
        median_real=float(np.median(r)) if r.size else float("nan"),
        median_ratio=float(np.median(b[pos] / r[pos])) if pos.any() else float("nan"),
        cov_05=float(np.mean(b <= 0.05)) if b.size else float("nan"),
        cov_10=float(np.mean(b <= 0.1)) if b.size else float("nan"),
        rows_real_zero=int(np.sum(~pos)), bytes_per_token=float(mem["total"]),
        tokens_at_equal_memory=float(mem["ratio_vs_model_dtype"]),
        tokens_at_equal_memory_by_context=memory_by_context(scheme, bits, win), seconds=round(time.time() - t0, 1),
    )


def format_result(res: TightnessResult) -> str:
    return "\n".join([
        f"witcert tightness: {res.scheme}, sketch {res.sketch_bits} bits ({res.sketch_box} box), window "
        f"{tuple(res.window)}, weights "
        f"{res.weights}, {res.backend} path; {res.prompts} prompts x {res.tokens} tokens x {res.steps} decode steps",
        f"  rows {res.rows}, violations {res.violations}",
        f"  median TV+ {res.median_bound:.4f}, median real TV {res.median_real:.2e}, median TV+/TV {res.median_ratio:.2f}",
        f"  share of rows with TV+ <= 0.05: {res.cov_05:.3f}, <= 0.1: {res.cov_10:.3f}",
        f"  bytes per token and kv head (d = {MEMORY_HEAD_DIM}, window amortised at {AMORTISE_CONTEXT}): "
        f"{res.bytes_per_token:.1f}; tokens at equal memory vs bf16: {res.tokens_at_equal_memory:.2f}x",
        "  the same with the window amortised at longer contexts: " + ", ".join(
            f"{k} {v:.3f}x" for k, v in res.tokens_at_equal_memory_by_context.items()),
        f"  ({res.seconds:.0f} s)",
    ])


def main(args) -> int:
    res = run(scheme=args.scheme, tokens=args.tokens, steps=args.steps, sketch_bits=args.sketch_bits,
              window="default" if args.window is None else args.window, weights=args.weights, device=args.device,
              backend=args.backend, sketch_box=args.sketch_box)
    print(json.dumps(res.to_json(), indent=1) if args.json else format_result(res))
    return 1 if res.violations else 0
