"""Meter tightness on the real embedded model (SmolLM2-135M-Instruct), fp64 reference, CPU.

A prompt of about ``--tokens`` tokens runs through the model once; a registered attention
function (transformers' AttentionInterface, the mechanism the cache integration will use)
captures every layer's post-RoPE queries, keys and values. For the last ``--queries`` query
positions of every (layer, query head), the keys and values are quantized with each scheme and
the reference meter computes ε (witnesses per token, G = 1 and 4, or per 16-token block), the
§3 bounds and the realised TV against exact attention. Prints, per scheme and witness layout:
median TV⁺, coverage at τ = 0.05/0.1/0.2, median realised TV; and asserts realised ≤ bound.

    python bench/real_model.py [--tokens 1024] [--queries 4]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from witcert import bounds as B
from witcert.meter import measure
from witcert.model import load_model
from witcert.schemes import QuantContext, quantize
from witcert.synthetic import DEFAULT_LEVELS

HAYSTACK = (
    "The quick brown fox jumps over the lazy dog. In the archive of the old library, every shelf holds "
    "ledgers of ships, harbours and cargo, written in a careful hand. "
)


def capture(model, tok, n_tokens):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    store = {}

    def attn(module, query, key, value, attention_mask, scaling=None, **kw):
        store[module.layer_idx] = (query[0].detach().double(), key[0].detach().double(), value[0].detach().double(), scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)

    AttentionInterface.register("witcert_capture", attn)
    model.set_attn_implementation("witcert_capture")
    text = HAYSTACK * (n_tokens // 30 + 1) + " The secret code is 4096. What is the secret code?"
    ids = tok(text, return_tensors="pt")["input_ids"][:, -n_tokens:]
    with torch.no_grad():
        model(input_ids=ids)
    return store, ids.shape[1]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--schemes", default="fp8_e4m3,int8,int8_dither,int4_group,kivi2")
    args = ap.parse_args(argv)
    t0 = time.time()
    model, tok = load_model()
    store, n = capture(model, tok, args.tokens)
    d = next(iter(store.values()))[0].shape[-1]
    layouts = {"T=1,G=1": (1, 1), "T=1,G=4": (1, 4), "T=16,G=1": (16, 1)}
    rows = {}
    for sch in args.schemes.split(","):
        for lname in layouts:
            rows[(sch, lname)] = ([], [])
        for layer, (q, k, v, scaling) in sorted(store.items()):
            Hq, Hkv = q.shape[0], k.shape[0]
            kf = torch.from_numpy(k.float().numpy())
            k_hat = quantize(sch, kf, QuantContext(role="key", layer=layer, kv_head=torch.arange(Hkv)))[0].double().numpy()
            k64 = kf.double().numpy()
            for lname, (T, G) in layouts.items():
                groups = B.group_slices(d, G)
                W = B.key_witness(k64, k_hat, groups, block_size=T)  # [Hkv, nb, G]
                for pos in range(n - args.queries, n):
                    m = pos + 1  # causal: the query at pos sees keys 0..pos
                    for h in range(Hq):
                        kv = h // (Hq // Hkv)
                        qq = q[h, pos].numpy()
                        s = scaling * (k64[kv, :m] @ qq)
                        delta = scaling * ((k_hat[kv, :m] - k64[kv, :m]) @ qq)
                        p = np.exp(s - s.max())
                        p /= p.sum()
                        sh = s + delta
                        ph = np.exp(sh - sh.max())
                        ph /= ph.sum()
                        nb = math.ceil(m / T)
                        eps = B.logit_radius(qq, W[kv, :nb], groups, scaling, block_size=T, n=m)
                        assert np.all(np.abs(delta) <= eps)
                        # from the served logits (log domain: an underflowed p̂ never hides a token)
                        bound = float(measure(sh, eps, levels=DEFAULT_LEVELS).tv)
                        real = float(B.tv(p, ph))
                        assert real <= bound, (sch, layer, h, pos)
                        rows[(sch, lname)][0].append(bound)
                        rows[(sch, lname)][1].append(real)
    print(f"# SmolLM2-135M-Instruct (embedded), {n}-token prompt, last {args.queries} query positions x "
          f"{len(store)} layers x {Hq} heads per row; fp64 reference; {time.time() - t0:.0f}s")
    print(f"{'scheme':<12}{'witnesses':<11}{'median TV+':>11}{'cov@.05':>9}{'cov@.1':>8}{'cov@.2':>8}{'med real':>10}{'med ratio':>10}")
    for (sch, lname), (b, r) in rows.items():
        b, r = np.array(b), np.array(r)
        ok = r > 0
        ratio = np.median(b[ok] / r[ok]) if ok.any() else float("nan")
        print(f"{sch:<12}{lname:<11}{np.median(b):>11.4f}{np.mean(b <= .05):>9.2f}{np.mean(b <= .1):>8.2f}"
              f"{np.mean(b <= .2):>8.2f}{np.median(r):>10.2e}{ratio:>10.1f}")
    print("# every (layer, head, position): |δ| ≤ ε and realised TV ≤ TV⁺ (asserted)")


if __name__ == "__main__":
    main()
