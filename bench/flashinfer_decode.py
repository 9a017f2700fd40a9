"""FlashInfer's fp8 paged decode beside WitCert's int8 decode, on a CUDA GPU (issue 35's FlashInfer column).

Shapes as ``bench/decode.py`` (Hq / Hkv 32 / 8, d 128, page size 16, every sequence of length n, pages in a random
order, caches rotated past the L2). Per (B, n), in one process, ms of a CUDA-graph replay (``triton.testing.do_bench``
median):

* FlashInfer ``BatchDecodeWithPagedKVCacheWrapper``: bf16 q, fp8 e4m3 K / V ([pages, 2, 16, Hkv, D], NHD), one
  scale per tensor; the CUDA-core decode (``use_tensor_cores=False``) and the tensor-core one (``True``, what SGLang
  picks for GQA ≥ 4);
* WitCert's int8 decode (per-token fp16 scales and witnesses, G = 1): meter off, on (tilt where the closed forms
  exceed τ = 0.1) and full (the tilt on every row), as ``bench/decode.py``'s columns.

FlashInfer is not a dependency: it is JIT-built on the device from its sdist (``bench/results/<date>/*_run.sh``);
without it the script says so and exits 2.

    python bench/flashinfer_decode.py [--batches 1,8,32] [--lengths 32768,131072]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import bench.decode as bd  # noqa: E402  (its timing, CUDA-graph rotation and int8 caches, as bench/tilt_cost.py)

PAGE = 16
HQ, HKV, D = 32, 8, 128


def flashinfer_ms(fi, B, n, tensor_cores, dev):
    """ms of FlashInfer's fp8 e4m3 paged decode for B sequences of n tokens (graph replay, rotated caches)."""
    pages = math.ceil(n / PAGE)
    kv_bytes = B * n * HKV * D * 2  # fp8 K + V
    copies = max(1, math.ceil(4 * 60e6 / kv_bytes))
    g = torch.Generator(device=dev).manual_seed(0)
    caches = []
    for _ in range(copies):
        x = torch.randn(B * pages, 2, PAGE, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        caches.append(x.to(torch.float8_e4m3fn))
        del x
    indices = torch.randperm(B * pages, device=dev, dtype=torch.int32)
    indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * pages
    last = torch.full((B,), n - (pages - 1) * PAGE, device=dev, dtype=torch.int32)
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    q = torch.randn(B, HQ, D, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty_like(q) for _ in caches]
    fns = [lambda c=c, o=o: w.run(q, c, out=o, k_scale=0.5, v_scale=0.5) for c, o in zip(caches, outs)]
    # a sanity check of what is timed: the output against fp32 attention of the first sequence
    fns[0]()
    torch.cuda.synchronize()
    kv = caches[0][indices[:pages].long()].float()  # [pages, 2, PAGE, HKV, D] of sequence 0
    k = kv[:, 0].reshape(-1, HKV, D)[:n] * 0.5
    v = kv[:, 1].reshape(-1, HKV, D)[:n] * 0.5
    qf = q[0].float().view(HKV, HQ // HKV, D)
    p = torch.softmax(torch.einsum("hgd,nhd->hgn", qf, k) / math.sqrt(D), -1)
    ref = torch.einsum("hgn,nhd->hgd", p, v).reshape(HQ, D)
    err = float((outs[0][0].float() - ref).abs().max() / ref.abs().max())
    try:
        t = bd.bench(bd.graphed(fns), False)
        how = "graph"
    except Exception as exc:  # not capturable: eager, said in the row
        print(f"# flashinfer tc={tensor_cores} B={B} n={n}: capture failed ({type(exc).__name__}: {exc})"[:300])
        torch.cuda.synchronize()
        t = bd.bench(fns[0], False)
        how = "eager"
    del caches
    return t, how, err


def witcert_ms(B, n, dev, tau):
    """ms of WitCert's int8 decode, meter off / on (τ) / full (graph replay, rotated caches)."""
    from kernels.decode import decode

    kv_bytes = B * n * HKV * (D * 2 + 4)
    copies = max(1, math.ceil(4 * 60e6 / kv_bytes))
    torch.manual_seed(0)
    caches = [bd.fill_cache(B, n, HKV, D, "int8", dev) for _ in range(copies)]
    q = torch.randn(B, HQ, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), n, device=dev, dtype=torch.int32)

    def timed(meter, tilt_above):
        fns = [lambda c=c, bt=bt: decode(c, q, bt, sl, meter=meter, validate=False, tilt_above=tilt_above)
               for c, bt in caches]
        return bd.bench(bd.graphed(fns), False)

    r = (timed(False, -1.0), timed(True, tau), timed(True, -1.0))
    del caches
    return r


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--tau", type=float, default=0.1)
    ap.add_argument("--tensor-cores", default="0,1", help="FlashInfer variants: 0 CUDA-core decode, 1 tensor cores")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashinfer_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import flashinfer as fi
    except ImportError as exc:
        print(f"flashinfer_decode: flashinfer is not importable ({exc}); see the module doc", file=sys.stderr)
        return 2
    import triton

    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, torch {torch.__version__}, triton {triton.__version__}, flashinfer {fi.__version__}")
    print(f"# Hq / Hkv {HQ} / {HKV}, d {D}, page {PAGE}; CUDA-graph replay ms (do_bench median); FlashInfer fp8 e4m3"
          f" K/V (bf16 q); WitCert int8 (per-token scales, G 1 witnesses); on: tilt above tau {args.tau}; full: every row")
    tcs = [bool(int(x)) for x in args.tensor_cores.split(",")]
    print("| B | n | WitCert off | on | full | " + " | ".join(f"FlashInfer fp8 tc={int(t)}" for t in tcs)
          + " | on / FI (best) | full / FI (best) | off / FI (best) | FI err |")
    print("|---" * (8 + len(tcs)) + "|")
    for B in [int(x) for x in args.batches.split(",")]:
        for n in [int(x) for x in args.lengths.split(",")]:
            off, on, full = witcert_ms(B, n, "cuda", args.tau)
            fis = [flashinfer_ms(fi, B, n, t, "cuda") for t in tcs]
            best = min(f[0] for f in fis)
            cells = " | ".join(f"{t:.4f} ({how})" for t, how, _ in fis)
            errs = "/".join(f"{e:.1e}" for _, _, e in fis)
            print(f"| {B} | {n} | {off:.4f} | {on:.4f} | {full:.4f} | {cells} | {on / best:.3f} | {full / best:.3f} "
                  f"| {off / best:.3f} | {errs} |", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
