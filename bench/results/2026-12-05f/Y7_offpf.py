"""bf16 (scheme none) meter-off tile / split sweep on SGLang's layout vs SGLang's own decode (graph replay, ms)."""
import math, os, sys, argparse, itertools
import torch
sys.path.insert(0, os.getcwd())
from bench.sglang_h200 import graph_ms, _time_call
import witcert.integrations.sglang as ws
from kernels.plan import Tile, plan_call
from kernels.decode import decode
from witcert.integrations.sglang_decode import paged_view

ap = argparse.ArgumentParser()
ap.add_argument("--sglang-root")
ap.add_argument("--cells", default="8:32768,32:4096,32:32768")
ap.add_argument("--iters", type=int, default=30)
ap.add_argument("--kv", default="bf16")
args = ap.parse_args()
root = args.sglang_root
mod = ws.import_bare(ws.DECODE_MODULE, root)
orig = mod.decode_attention_fwd
ws.install(force=True, targets=("decode",), bare=True, on_record=lambda lid, r: None, version="0.5.23")
dev = "cuda"
Hq, Hkv, D, max_splits = 32, 8, 128, 16
TILES = [Tile(128, 2, 4, head_columns=16), Tile(128, 2, 4, head_columns=8), Tile(64, 2, 4, head_columns=16),
         Tile(64, 2, 4, head_columns=8), Tile(32, 2, 4, head_columns=8), Tile(32, 2, 2, head_columns=8),
         Tile(64, 2, 2, head_columns=8), Tile(64, 3, 4, head_columns=8), Tile(32, 3, 2, head_columns=8),
         Tile(128, 2, 8, head_columns=16), Tile(64, 4, 4, head_columns=8), Tile(32, 4, 2, head_columns=8),
         Tile(64, 1, 4, head_columns=8), Tile(32, 1, 1, head_columns=8), Tile(32, 1, 2, head_columns=8)]
for cell in args.cells.split(","):
    Bsz, n = map(int, cell.split(":"))
    size = Bsz * n
    dtype = torch.bfloat16 if args.kv == "bf16" else torch.float8_e4m3fn
    scale = None if args.kv == "bf16" else 0.5
    s = 1.0 if scale is None else scale
    kb = torch.zeros(size, Hkv, D, dtype=dtype, device=dev)
    vb = torch.zeros_like(kb)
    k = torch.randn(size, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    loc = torch.randperm(size, device=dev)
    kb[loc] = (k.float() / s).to(dtype)
    vb[loc] = (v.float() / s).to(dtype)
    del k, v
    ws.record_write(kb, vb, 0, loc, kb[loc].to(torch.bfloat16) * s, vb[loc].to(torch.bfloat16) * s, scale, scale, dtype)
    indptr = torch.arange(0, size + 1, n, device=dev, dtype=torch.int32)
    q = torch.randn(Bsz, Hq, D, device=dev, dtype=torch.bfloat16)
    _, o_sg, call = _time_call(orig, q, kb, vb, indptr, loc, s, Bsz, Hq, D, max_splits, 3, dev)
    g_sg = graph_ms(call, args.iters)
    view = paged_view(ws.STATE.layers[kb.data_ptr()], kb, vb, s, s)
    loc32 = loc.int()
    dflt = plan_call(view, q, loc32, csr=True, meter=False)
    print(f"## {args.kv} B {Bsz} n {n}: SGLang graph {g_sg:.4f} ms; default plan splits {dflt.num_splits} tile {dflt.tile}", flush=True)
    ref = decode(view, q, loc32, None, kv_indptr=indptr, sm_scale=1 / math.sqrt(D), meter=False, validate=False).o.float()
    g0 = graph_ms(lambda: decode(view, q, loc32, None, kv_indptr=indptr, sm_scale=1 / math.sqrt(D), meter=False,
                                 validate=False), args.iters)
    print(f"| default | {dflt.num_splits} | {g0:.4f} | {g0 / g_sg:.3f} | 0 |", flush=True)
    for rep in range(2):
        for ns, pf in ((None, False), (None, True), (8, False), (8, True), (12, True)):
            kw = dict(kv_indptr=indptr, sm_scale=1 / math.sqrt(D), meter=False, validate=False, num_splits=ns, prefetch_bt=pf)
            o = decode(view, q, loc32, None, **kw).o.float()
            err = float((o - ref).abs().max() / ref.abs().max())
            g = graph_ms(lambda: decode(view, q, loc32, None, **kw), args.iters)
            print(f"| splits {ns} prefetch_bt {pf} | {g:.4f} | {g / g_sg:.3f} | {err:.1e} |", flush=True)
        g_sg = graph_ms(call, args.iters)
        print(f"| SGLang again | {g_sg:.4f} |", flush=True)
    del kb, vb, view, q, call, o_sg
    ws.STATE.layers.clear(); ws.STATE.by_buffer.clear(); ws.STATE.tilt.clear(); ws.STATE.static.clear()
    torch.cuda.empty_cache()
