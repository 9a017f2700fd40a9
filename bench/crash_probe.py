"""Which decode launches read out of bounds on the GPU? (an illegal memory access in the CUDA
conformance run and in bench/decode.py, 2026-12-01 run G; compute-sanitizer then found an
out-of-bounds __shared__ read at the tl.dot(vcT, pvT) line). One case per process:

    python3 bench/crash_probe.py --list                  # the case names
    compute-sanitizer --tool memcheck python3 bench/crash_probe.py CASE

CASE = kind-scheme-m{meter}-p{pages per tile}-s{stages} (0: the plan's)-f{prefetch_bt}-e{epilogue}[-g], kind small
(the conformance suite's [50, 3] x 2 kv heads, GQ 4, d 128), mid (B 8, n 2048, 32/8 heads), big
(B 8, n 32K: the benchmark's row that faulted) or csr (SGLang's layout: block size 1, kv_indptr, B 8, n 2048); -g: the call captured in a CUDA graph as
bench/decode.py does (``graphed``) and replayed 5 times (the fault was seen under replay).
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def cases():
    out = []
    for sch, m, (p, s), f in itertools.product(("none", "int8", "int8_dither", "fp8_e4m3"), (1, 0),
                                               ((8, 1), (4, 1), (8, 2), (4, 2)), (0, 1)):
        out.append(f"small-{sch}-m{m}-p{p}-s{s}-f{f}-e1")
    for m, (p, s), e in itertools.product((1, 0), ((8, 1), (4, 1), (8, 2)), (1, 0)):
        if m or e:
            out.append(f"mid-int8-m{m}-p{p}-s{s}-f{m}-e{e}")
    # the fp32-dequantizing schemes (int4_group; kivi2 since 2026-12-02) at the production tiles
    # (kernels.plan.tile_config: metered 128 tokens / one stage with table prefetch; unmetered two stages)
    for sch, (m, s, f) in itertools.product(("int4_group", "kivi2"), ((1, 1, 1), (1, 1, 0), (0, 2, 0), (1, 2, 1))):
        out.append(f"small-{sch}-m{m}-p8-s{s}-f{f}-e1")
    # the one-stage tiles of the transposed 8-bit loads (2026-12-02, run J)
    out += ["mid-int8-m0-p8-s1-f0-e1", "mid-int8-m1-p4-s1-f1-e1", "big-int8-m0-p8-s1-f0-e1-g", "big-int8-m1-p8-s1-f1-e1"]
    for kind in ("mid", "big"):  # graph-replayed, as the benchmark runs them
        out += [f"{kind}-int8-m0-p4-s1-f0-e1-g", f"{kind}-int8-m0-p8-s2-f0-e1-g", f"{kind}-int8-m1-p8-s1-f1-e1-g",
                f"{kind}-int8-m1-p8-s1-f1-e0-g", f"{kind}-none-m0-p8-s2-f0-e1-g"]
    # SGLang's layout (block size 1, kv_indptr; B 8, n 2048, 32 / 8 heads) at the plan's own tile (p0), as the
    # SGLang backend launches it (2026-12-05f: scheme none's tile went to 8 head columns)
    for sch, m, g in itertools.product(("none", "fp8_e4m3"), (1, 0), ("", "-g")):
        out.append(f"csr-{sch}-m{m}-p0-s0-f{m}-e1{g}")
    return out


def one(name):
    if not name.endswith("-g"):
        # without PyTorch's caching allocator every tensor is its own allocation, so memcheck also
        # sees a read past a tensor that stays inside a cached segment (graph capture needs the cache)
        os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    import torch

    from kernels.decode import decode
    parts = name.split("-")
    graph = parts[-1] == "g"
    kind, sch, m, p, s, f, e = parts[:7]
    m, p, s, f, e = (int(x[1:]) for x in (m, p, s, f, e))
    csr = None
    if kind == "csr":  # SGLang's layout: token slots of block size 1, permuted, read through kv_indptr
        from kernels.paged import PagedKV
        from kernels.write import write_kv
        B, n, Hkv = 8, 2048, 8
        g = torch.Generator().manual_seed(7)
        cache = PagedKV.allocate(B * n + 5, Hkv, 128, scheme=sch, block_size=1, num_groups=1, device="cuda")
        slots = torch.randperm(B * n + 5, generator=g)[:B * n].int().cuda()
        bt = slots.view(B, n)
        for b in range(B):
            kv = torch.randn(2, n, Hkv, 128, generator=g).bfloat16().cuda()
            write_kv(cache, kv[0], kv[1], bt, torch.full((n,), b, device="cuda"), torch.arange(n, device="cuda"))
        q = torch.randn(B, 32, 128, device="cuda", dtype=torch.bfloat16)
        csr = torch.arange(0, B * n + 1, n, device="cuda", dtype=torch.int32)
        bt, sl, S = slots, None, 16
    elif kind == "small":
        from tests.helpers.conformance import build
        cache, bt, _ = build(sch, [50, 3], 2, 128, G=1, per_token=True, seed=7)
        q = (torch.randn(2, 8, 128) * 1.5).bfloat16().cuda()
        bt, sl, S = bt.cuda(), torch.tensor([50, 3]).cuda(), 2
    else:  # mid: n 2048; big: the benchmark's B 8 / n 32K
        from bench.decode import fill_cache
        n = 2048 if kind == "mid" else 32768
        cache, bt = fill_cache(8, n, 8, 128, sch, torch.device("cuda"))
        q = torch.randn(8, 32, 128, device="cuda", dtype=torch.bfloat16)
        sl, S = torch.full((8,), n, device="cuda", dtype=torch.int32), 16
    def call():
        return decode(cache, q, bt, sl, num_splits=S, meter=bool(m), pages_per_tile=p or None, num_stages=s or None,
                      prefetch_bt=bool(f), epilogue=bool(e), delta_step=1e-3 if m else None, validate=not graph,
                      kv_indptr=csr)

    out = call()
    torch.cuda.synchronize()
    if graph:
        from bench.decode import graphed
        replay = graphed([call])
        for _ in range(5):
            replay()
        torch.cuda.synchronize()
    print("ok", float(out.o.float().abs().max()), "regs", out.compiled.n_regs, "spills", out.compiled.n_spills,
          "shared", out.compiled.metadata.shared)


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        print("\n".join(cases()))
    else:
        one(sys.argv[1])
