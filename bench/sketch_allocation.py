"""Where to spend the key sketch's bits (issue 33): the radius's tightness against its bytes.

Offline, fp64, on the embedded SmolLM2-135M-Instruct: captures post-RoPE queries and keys of the
calibration text and of the two ``witcert.tightness.PROMPTS`` (1024 tokens each), quantizes the keys with
the scheme, and meters the last ``--positions`` query positions of every (prompt, layer, query head) with
the sketch radius (``witcert.bounds.sketch_radius``, shared over the heads of a kv head as the kernel bins
it, and per head) and the Tier A TV bound of the served logits, against the realised TV — for several
allocations of the sketch's bits over the channels: uniform 1 / 2 / 4 bits, or 4 bits on the RoPE bands
with the most calibration-query energy and fewer (or none) on the rest. Channel weights are the
calibrated ones (``witcert.calibrate.band_weights`` of the calibration queries and the allocation's own
sketch remainder); the exact window (4, 64) as the cache's default.

    python bench/sketch_allocation.py [--scheme int8] [--positions 4] [--out FILE.json]

Prints one JSON line per (allocation, sharing): rows, violations, median TV⁺, median TV⁺/TV, share of rows
with TV⁺ ≤ 0.05, the sketch's bytes per token and kv head at d = 128 and the resulting tokens at equal
memory against bf16 (``witcert.tightness.memory`` with the sketch's bytes replaced).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from contract.bands import _bands
from witcert import bounds as B
from witcert.calibrate import CALIBRATION_TEXT, CALIBRATION_TOKENS, band_weights, capture, capture_ids
from witcert.model import _model_dims, load_model
from witcert.schemes import QuantContext, quantize, residual_range
from witcert.tightness import PROMPTS, memory, prompt_ids

#: allocations: (share of the RoPE bands, ordered by calibration-query energy, bits) from the top down
ALLOCATIONS = {
    "1b-all": [(1.0, 1)],
    "2b-all": [(1.0, 2)],
    "4b-all": [(1.0, 4)],
    "2b-top87": [(0.875, 2)],
    "4b-top25": [(0.25, 4)],
    "4b-top37": [(0.375, 4)],
    "4b-top50": [(0.5, 4)],
    "4b-top25+2b-25": [(0.25, 4), (0.25, 2)],
    "4b-top25+1b": [(0.25, 4), (0.75, 1)],
    "4b-top25+2b": [(0.25, 4), (0.75, 2)],
    "4b-top50+2b": [(0.5, 4), (0.5, 2)],
    "4b-top75+2b": [(0.75, 4), (0.25, 2)],
}
WINDOW = (4, 64)


class Experiment:
    def __init__(self, scheme: str, tokens: int = 1024):
        self.scheme = scheme
        model, tok = load_model(dtype=torch.float32)
        _, self.L, self.Hq, self.Hkv, self.D, rot = _model_dims(model.config)
        self.bands = _bands(self.D, rot, "half")
        self.cal = capture(model, tok, CALIBRATION_TEXT, CALIBRATION_TOKENS)
        self.caps = [capture_ids(model, prompt_ids(tok, p, tokens)) for p in PROMPTS]
        gq = self.Hq // self.Hkv
        self.cal_q = {layer: (q.numpy().reshape(self.Hkv, gq, q.shape[1], self.D) ** 2).mean((1, 2))
                      for layer, (q, _, _) in self.cal.items()}

    def quant(self, k, layer):
        kh, meta = quantize(self.scheme, k.float(), QuantContext(role="key", layer=layer, kv_head=torch.arange(self.Hkv)))
        beta = residual_range(self.scheme, kh, meta)
        return kh.double().numpy(), (None if beta is None else beta.numpy())

    def allocation(self, layer, spec) -> np.ndarray:
        """Bits per channel [Hkv, D]: the bands by calibration-query energy, top down, get spec's bits."""
        al = np.zeros((self.Hkv, self.D), int)
        for h in range(self.Hkv):
            energy = np.array([self.cal_q[layer][h][list(c)].sum() for c in self.bands])
            order, i = np.argsort(-energy), 0
            for frac, bits in spec:
                m = int(round(frac * len(self.bands)))
                for b in order[i:i + m]:
                    al[h, list(self.bands[b])] = bits
                i += m
        return al

    def sketch(self, r, beta, alloc):
        rt = np.zeros_like(r)
        for h in range(self.Hkv):
            for bits in (1, 2, 4):
                ch = np.nonzero(alloc[h] == bits)[0]
                if len(ch):
                    codes, bb = B.sketch_encode(r[h][:, ch], bits, beta[h][:, ch])
                    rt[h][:, ch] = B.sketch_decode(codes, bb, bits)
        return rt

    def weights(self, layer, alloc):
        q, k, _ = self.cal[layer]
        kh, beta = self.quant(k, layer)
        r = kh - k.numpy()
        r = r - self.sketch(r, beta, alloc)
        qn = q.numpy().reshape(self.Hkv, self.Hq // self.Hkv, q.shape[1], self.D)
        qe = np.stack([(qn[..., c] ** 2).sum(-1).mean((1, 2)) for c in self.bands], -1)
        re = np.stack([(r[..., c] ** 2).sum(-1).mean(1) for c in self.bands], -1)
        return band_weights(qe, re, self.D, self.D)

    def rows(self, layer, store, alloc, a, positions, shared):
        q, k, sc = store[layer]
        kh, beta = self.quant(k, layer)
        kn = k.numpy()
        r = kh - kn
        rt = self.sketch(r, beta, alloc)
        gq = self.Hq // self.Hkv
        for pos in positions:
            n = pos + 1
            win = B.window_mask(n, WINDOW)
            for h in range(self.Hkv):
                rr, rtt = r[h, :n].copy(), rt[h, :n].copy()
                rr[win], rtt[win] = 0, 0
                eps = B.sketch_radius(q[h * gq:(h + 1) * gq, pos].numpy(), rtt, B.sketch_witness(rr, rtt, a[h]), sc, a[h],
                                      shared=shared)
                qh = q[h * gq:(h + 1) * gq, pos].numpy()
                exact, served = sc * qh @ kn[h, :n].T, sc * qh @ (kn[h, :n] + rr).T
                pe = np.exp(exact - exact.max(-1, keepdims=True))
                ps = np.exp(served - served.max(-1, keepdims=True))
                real = 0.5 * np.abs(pe / pe.sum(-1, keepdims=True) - ps / ps.sum(-1, keepdims=True)).sum(-1)
                yield np.asarray(B.tv_bound_logits(served, eps)), real

    def run(self, name, spec, shared: bool, positions) -> dict:
        t0 = time.time()
        bs, rs = [], []
        for layer in range(self.L):
            alloc = self.allocation(layer, spec)
            a = self.weights(layer, alloc)
            for store in self.caps:
                for b, r in self.rows(layer, store, alloc, a, positions, shared):
                    bs.append(b)
                    rs.append(r)
        b, r = np.concatenate(bs), np.concatenate(rs)
        pos = r > 0
        sketch_b = sum(f * bits for f, bits in spec) * 128 / 8
        mem = memory(self.scheme, 0, WINDOW)
        total = mem["total"] + sketch_b
        return dict(allocation=name, shared=shared, rows=int(b.size), violations=int(np.sum(b < r)),
                    median_bound=float(np.median(b)), median_ratio=float(np.median(b[pos] / r[pos])),
                    cov_05=float(np.mean(b <= 0.05)), sketch_bytes_d128=sketch_b, bytes_per_token=total,
                    tokens_at_equal_memory=2 * 128 * 2 / total, seconds=round(time.time() - t0, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--positions", type=int, default=4, help="last query positions of each prompt metered")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--only", default="", help="comma-separated allocation names (default: all)")
    ap.add_argument("--out", default="", help="also write the rows as a JSON list here")
    args = ap.parse_args()
    exp = Experiment(args.scheme, args.tokens)
    positions = range(args.tokens - args.positions, args.tokens)
    names = [n for n in args.only.split(",") if n] or list(ALLOCATIONS)
    out = []
    for name in names:
        for shared in (True, False):
            res = exp.run(name, ALLOCATIONS[name], shared, positions)
            print(json.dumps(res), flush=True)
            out.append(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
