"""Where does the host time of a metered decode step go? (issue 11; SmolLM2 shape, B = 1, 4K
prompt, bf16, H200.) The metered kernel path is host-bound (bench/stock_probe.py: 3.3 ms of GPU
work in a ~99 ms step), so this times the host, not the GPU:

* the SDPA calls of stock (DynamicCache) and of the pass-through cache: their arguments (shapes,
  strides, mask, flags) and which backend runs them — why the stock step is slower;
* host wall per step of stock with PyTorch's cuDNN SDPA on / off, of the pass-through cache and of
  the metered int8 kernel path;
* the metered step's host time by phase (cache update / write kernel / metered decode / the rest)
  with perf_counter wrappers (no synchronisation added), and a cProfile of three steps.

    python3 bench/host_probe.py
    TRITON_INTERPRET=1 python3 bench/host_probe.py --smoke     # CPU: checks the script runs
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.serving import _cudnn_sdp, build  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def steps(model, cache, ids, n):
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1:].argmax(-1)
        ts = []
        for _ in range(n):
            _sync()
            t0 = time.perf_counter()
            model(nxt, past_key_values=cache, use_cache=True)
            _sync()
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts[2:]), nxt


class Phase:
    """Accumulated host seconds of a wrapped function (no synchronisation)."""

    def __init__(self):
        self.t, self.calls = 0.0, 0

    def wrap(self, obj, name):
        fn = getattr(obj, name)

        def w(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t += time.perf_counter() - t0
                self.calls += 1
        setattr(obj, name, w)
        return fn


def probe_config(model, cfg, key):
    """Set ``model``'s attention for configuration ``key`` and return its cache factory: stock*
    (sdpa, DynamicCache), none (the pass-through WitCertCache), int8 (metered, kernel path)."""
    from transformers import DynamicCache

    from witcert.cache import WitCertCache, use_witcert

    if key.startswith("stock"):
        model.set_attn_implementation("sdpa")
        return lambda: DynamicCache(config=cfg)
    use_witcert(model)
    if key == "none":
        return lambda: WitCertCache(cfg, scheme="none", meter=False)
    return lambda: WitCertCache(cfg, scheme="int8", backend="kernel", tilt_above=0.1)


def main():
    import kernels.decode as KD
    import kernels.write as KW
    import witcert.cache as WC
    from witcert.cache import WitCertCache, use_witcert

    smoke = "--smoke" in sys.argv  # tiny shape on the CPU (interpreter): checks the script runs
    dev = "cpu" if smoke else "cuda"
    cfg, model = build("tiny" if smoke else "smollm2", dev, torch.float32 if smoke else torch.bfloat16)
    ids = torch.randint(10, cfg.vocab_size, (1, 40 if smoke else 4096), device=dev)

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if len(seen) < 1 and q.shape[-2] == 1:
            seen.append(dict(q=(tuple(q.shape), q.stride()), k=(tuple(k.shape), k.stride(), k.is_contiguous()),
                             mask=None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype),
                             is_causal=is_causal, enable_gqa=enable_gqa))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    res = {}
    for key in ("stock", "stock_nocudnn", "none", "int8"):
        make = probe_config(model, cfg, key)
        with _cudnn_sdp(key != "stock_nocudnn"):
            steps(model, make(), ids, 4)
            torch.nn.functional.scaled_dot_product_attention = spy
            seen.clear()
            cache = make()
            res[key], _ = steps(model, cache, ids, 4 if smoke else 14)
            torch.nn.functional.scaled_dot_product_attention = real
        print(f"{key}: host wall ms per decode step (synchronised), median {res[key]:.2f}; first SDPA call of the "
              f"prefill or step: {seen[:1]}", flush=True)

    # the metered step by phase
    use_witcert(model)
    cache = WitCertCache(cfg, scheme="int8", backend="kernel", tilt_above=0.1)
    phases = {"WitCertCache.update (all)": (WC.WitCertCache, "update"),
              "WitCertLayer._write_kernel": (WC.WitCertLayer, "_write_kernel"),
              "kernels.write.write_kv": (KW, "write_kv"),
              "WitCertCache._kernel_attention": (WC.WitCertCache, "_kernel_attention"),
              "kernels.decode.decode": (KD, "decode"),
              "model forward (all)": (type(model), "forward")}
    ph = {k: Phase() for k in phases}
    orig = {k: ph[k].wrap(*v) for k, v in phases.items()}
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(3):
            model(nxt, past_key_values=cache, use_cache=True)
        _sync()
        for p in ph.values():
            p.t, p.calls = 0.0, 0
        N = 2 if smoke else 10
        for _ in range(N):
            model(nxt, past_key_values=cache, use_cache=True)
        _sync()
    for k, p in ph.items():
        print(f"phase {k}: {p.t / N * 1e3:.2f} ms per step ({p.calls // N} calls per step)", flush=True)
    for k, (obj, name) in phases.items():
        setattr(obj, name, orig[k])
    with torch.no_grad():
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            model(nxt, past_key_values=cache, use_cache=True)
        _sync()
        pr.disable()
    for order in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(order).print_stats(45)
        print(s.getvalue(), flush=True)


if __name__ == "__main__":
    main()
