"""The decode kernel's sm_90 code without a GPU: registers, spills and the main loop's SASS
instruction mix of ``kernels.decode_kernel._decode_kernel`` for a configuration (bench/RESULTS.md run J).

    python3 bench/sass_probe.py                       # the tile_config configurations, int8
    python3 bench/sass_probe.py --meter 1 --tokens 64 --stages 1 --warps 4 --maxnreg 168

Triton compiles an ``ASTSource`` for ``GPUTarget("cuda", 90, 64)`` with the JIT's own argument
specialisation (16-divisible pointers and ints marked divisible, ints equal to 1 made constants;
the values are the benchmark's B 8 / n 32K / Hq 32 / Hkv 8 / d 128 int8 cache), then its bundled
``ptxas -v`` (registers, spill bytes) and ``nvdisasm`` (the tile loop: of the innermost backward
branches' bodies, the one with the most tensor-core dots; the longest body can be a branch from the kernel's end
back into the loop, which a grid-summing tile produced on 2026-12-06). SASS_TOP=N prints the N most frequent
opcodes (8), SASS_LOOPS=1 every backward branch. Use the device's Triton version (3.6.0: ``pip install --target DIR triton==3.6.0`` and
put DIR first on PYTHONPATH) to see what the H200 runs.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.decode_kernel as kk  # noqa: E402
import kernels.key_levels as kl  # noqa: E402
import kernels.plan as kp  # noqa: E402
from kernels.decode_steps import MAGIC_SKETCH_BITS  # noqa: E402
from kernels.paged import SCHEME_IDS  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTRS = {"Q": "*bf16", "KC": "*i8", "VC": "*i8", "KS": "*fp16", "VS": "*fp16", "KZ": "*fp16", "VZ": "*fp16",
        "KW": "*fp16", "VW": "*fp16", "VN": "*fp16", "KN": "*fp16", "BT": "*i32", "SL": "*i32", "TM": "*i32",
        "RS": "*i32", "RK": "*bf16", "RV": "*bf16", "RKN": "*fp32", "RVN": "*fp32",
        "M_OUT": "*fp32", "L_OUT": "*fp32", "ACC_OUT": "*fp32", "HIST_OUT": "*fp32", "STAT_OUT": "*fp32",
        "EX_OUT": "*fp32",
        "SK": "*u8", "WGT": "*fp32", "WK": "*bf16", "WV": "*bf16", "WKN": "*fp32", "WVN": "*fp32",
        "UM": "*u8", "UMA": "*u8"}
# the benchmark's B 8 / n 32K int8 cache: strides and sizes as the JIT sees them
INTS = dict(seed=12345, layer=0, num_splits=16, s_qb=4096, s_qh=128, s_cb=16384, s_ch=2048, s_ct=128,
            s_sb=128, s_sh=16, s_st=1, s_vsb=128, s_vsh=16, s_vst=1, s_wb=128, s_wh=16, s_wt=1, s_vwb=128, s_vwh=16,
            s_nb=128, s_nh=16, s_btb=2048, s_tmb=1, s_rsb=0, Hq=32, sink=4, recent=64, s_skb=1024, s_skh=512, s_skt=32, s_wnb=552,
            s_wnh=69, um_rows=262147)


def compile_decode(meter: bool, tokens: int, stages: int, warps: int = 4, scheme: str = "int8",
                   maxnreg: int | None = None, head_columns: int = 8, prefetch: int = 0, **constexprs):
    """The compiled kernel (``.asm["ptx"]`` etc.) of one configuration, for sm_90 (GQ 4; the histogram
    packed as ``decode`` packs it unless PACK_HIST is given; ``prefetch``: ``Tile.prefetch``, the L2 prefetch)."""
    fn = kk._decode_kernel
    names = fn.arg_names
    const = dict(INFL=1.0, X0=kl.X0, GQ=4, BLOCK_H=head_columns, D=128, T=16, G=1, PAGES=tokens // 16, K=kl.KEY_LEVELS,
                 NB=32, SCHEME=SCHEME_IDS[scheme], METER=meter, TIER_B=False, PER_TOKEN=True, LOWP=True,
                 PREC32="tf32x3", PREC_HIST="tf32x3", HIST_BF16=True, PAGE_LEVELS=False, HAS_MASK=False,
                 PREFETCH_BT=meter, CSR=False, HAS_REP=False, PV_F32=False, PF_AHEAD=prefetch, SKB=0, WEIGHTED=False,
                 HAS_WIN=False, MAGIC_BF16=False, HEAD_LEVELS=False, HAS_UNMET=False, EXC=False, GRD=False,
                 NORMS_PT=True, GDC=False, KEY_F16=False, KV_EVICT="", PARTIALS_EVICT="", GRID_ONE=False)
    const.update(constexprs)
    const.setdefault("PACK_HIST", meter and kp.packs_histogram(const["GQ"], const["BLOCK_H"]))
    ptrs = dict(PTRS, **({"VN": "*fp32", "KN": "*fp32"} if not const.get("NORMS_PT", True) else {}),
                **({"KC": "*bf16", "VC": "*bf16"} if scheme == "none" else
                         {"KC": "*fp8e4nv", "VC": "*fp8e4nv"} if scheme.startswith("fp8_e4m3") else
                         {"KC": "*fp8e5", "VC": "*fp8e5"} if scheme == "fp8_e5m2" else {}))
    sig, attrs = {}, {}
    ints = dict(INTS, **({"s_nb": 8, "s_nh": 1} if not const.get("NORMS_PT", True) else {}))  # page maxima [NB, 8, 1]
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in ptrs:
            sig[n], attrs[(names.index(n),)] = ptrs[n], [["tt.divisibility", 16]]
        elif n == "sm_scale":
            sig[n] = "fp32"
        elif ints[n] == 1:
            sig[n], const[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if ints[n] % 16 == 0:
                attrs[(names.index(n),)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    opts = dict(num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=opts)


def analyze(ptx: str):
    """(registers, spill-store bytes, loop SASS instructions, Counter of opcodes in the loop); SASS_LOOPS=1 in the
    environment prints every backward branch's body."""
    with tempfile.TemporaryDirectory() as tmp:
        p, cub = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        open(p, "w").write(ptx)
        r = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", p, "-o", cub],
                           capture_output=True, text=True, check=True)
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cub], capture_output=True, text=True,
                              check=True).stdout.split("\n")
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))
    ins, labels, pending = [], {}, []  # labels: name -> address of the instruction after it
    for line in sass:
        lm = re.match(r"\.L_x_(\d+):", line.strip())
        if lm:
            pending.append(lm.group(1))
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
            labels.update((name, ins[-1][0]) for name in pending)
            pending = []
    idx = {a: i for i, (a, _) in enumerate(ins)}
    best, loops = (0, -1), []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA.*\.L_x_(\d+)", text)
        if m and labels.get(m.group(1)) is not None and labels[m.group(1)] < a:
            s = idx[labels[m.group(1)]]
            loops.append((s, i))
    # the tile loop: of the innermost backward branches, the one whose body has the most tensor-core dots (the longest
    # among those); a branch from the kernel's end back into it can be longer
    inner = [(s, e) for s, e in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
    if inner:
        best = max(inner, key=lambda se: (sum("MMA" in t for _, t in ins[se[0]:se[1] + 1]), se[1] - se[0]))
    if os.environ.get("SASS_LOOPS"):  # every backward branch's body: (first, last instruction, length, PRMTs)
        print("# loops", len(ins), "instructions:", [(s, e, e - s + 1, sum("PRMT" in t for _, t in ins[s:e + 1]))
                                                 for s, e in loops if e - s > 100])
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t.strip()).split()[0] for _, t in ins[best[0]:best[1] + 1])
    return regs, spill, best[1] - best[0] + 1, ops


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--meter", type=int, choices=(0, 1))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--maxnreg", type=int)
    ap.add_argument("--head-columns", type=int, default=8)
    ap.add_argument("--prefetch", type=int, choices=(0, 1), default=0, help="with --meter: Tile.prefetch (L2)")
    ap.add_argument("--sketch-bits", type=int, choices=(0, 1, 2, 4), default=0, help="the key residual sketch (SKB)")
    ap.add_argument("--weighted", type=int, choices=(0, 1), default=0, help="channel weights (WEIGHTED)")
    ap.add_argument("--window", type=int, choices=(0, 1), default=0, help="the exact window's rings (HAS_WIN)")
    ap.add_argument("--head-levels", type=int, choices=(0, 1), default=0,
                    help="per-head key levels (HEAD_LEVELS; with a sketch or weights)")
    ap.add_argument("--const", action="append", default=[], metavar="NAME=INT",
                    help="another constexpr of the kernel (e.g. PAGE_LEVELS=1, TIER_B=1, PACK_HIST=0), repeatable")
    args = ap.parse_args(argv)
    extra = dict(SKB=args.sketch_bits, WEIGHTED=bool(args.weighted), HAS_WIN=bool(args.window),
                 MAGIC_BF16=args.sketch_bits in MAGIC_SKETCH_BITS, HEAD_LEVELS=bool(args.head_levels))
    for kv in args.const:
        name, _, val = kv.partition("=")
        if name not in kk._decode_kernel.arg_names or not val.lstrip("-").isdigit():
            ap.error(f"--const {kv!r}: expected NAME=INT with NAME a constexpr of the decode kernel")
        extra[name] = int(val)
    print(f"# triton {triton.__version__}, sm_90a, scheme {args.scheme}")
    if args.meter is None:
        configs = []
        for m, p in ((True, 8.0), (True, 2.0), (False, 8.0), (False, 2.0)):
            t = kp.tile_config(m, args.scheme, p)
            c = (m, t.tokens, t.stages, t.warps, t.max_registers, t.head_columns, t.prefetch)
            if c not in configs:
                configs.append(c)
    else:
        configs = [(bool(args.meter), args.tokens, args.stages, args.warps, args.maxnreg, args.head_columns, args.prefetch)]
    for meter, tokens, stages, warps, cap, hc, pf in configs:
        k = compile_decode(meter, tokens, stages, warps, args.scheme, cap, hc, pf, **extra)
        regs, spill, n, ops = analyze(k.asm["ptx"])
        shared = sum(v for o, v in ops.items() if o.startswith(("LDS", "LDSM")))
        byte_lds = sum(v for o, v in ops.items() if o in ("LDS.U8", "LDS.S8", "LDS.U16", "LDS.S16"))
        glob = sum(v for o, v in ops.items() if o.startswith("LDG"))
        sel = sum(v for o, v in ops.items() if o.split(".")[0] == "SEL")
        # byte tensors a loop carries to its next iteration (the unmetered marks, read a tile ahead of their use)
        carried = sum(len(re.findall(r"xi8>", y)) for y in k.asm["ttir"].splitlines() if "scf.yield" in y)
        print(f"meter {'on ' if meter else 'off'} {tokens:>3} tokens, {stages} stage(s), {warps} warps, {hc} head columns"
              f"{f', cap {cap}' if cap else ''}{', L2 prefetch' if pf else ''}"
              f"{f', sketch {args.sketch_bits} bits' if args.sketch_bits else ''}{', weighted' if args.weighted else ''}"
              f"{', window' if args.window else ''}{', per-head levels' if args.head_levels else ''}"
              f"{''.join(', ' + c for c in args.const)}: {regs} registers, "
              f"{spill} B spilled, loop {n} SASS ({shared} shared loads, {byte_lds} of them 1-2 bytes; {glob} global loads; {sel} selects; {carried} carried i8); "
              + " ".join(f"{o}:{c}" for o, c in ops.most_common(int(os.environ.get("SASS_TOP", "8")))), flush=True)


if __name__ == "__main__":
    main()
