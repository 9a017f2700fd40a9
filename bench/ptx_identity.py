"""Is a refactor of the decode kernel code-neutral? Compiles ``kernels.decode_kernel._decode_kernel`` for sm_90
without a GPU (``bench.sass_probe.compile_decode``: Triton's bundled compiler) over a list of configurations that
together reach every constexpr branch, strips the PTX's debug information (``.loc`` / ``.file`` lines, the debug
sections, comments: they carry source line numbers) and prints a hash per configuration.

    python3 bench/ptx_identity.py --save /tmp/ptx_before      # before the change
    python3 bench/ptx_identity.py --compare /tmp/ptx_before   # after it: "identical" per configuration, else a diff

``--only 3,7`` compiles a subset (indices as printed). Run from the repository root (or set PYTHONPATH to it).
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sass_probe import compile_decode  # noqa: E402

#: (name, compile_decode keyword arguments): meter on / off, every scheme, every constexpr feature
CONFIGS = [
    ("int8_meter", dict(meter=True, tokens=128, stages=1)),
    ("int8_nometer", dict(meter=False, tokens=64, stages=1)),
    ("int8_onewarp_pf", dict(meter=True, tokens=32, stages=1, warps=1, prefetch=1)),
    ("dither_tierb", dict(meter=True, tokens=128, stages=1, scheme="int8_dither", TIER_B=True, NB=64)),
    ("dither_rep_fp32pv", dict(meter=True, tokens=64, stages=1, scheme="int8_dither", HAS_REP=True, PV_F32=True)),
    ("int4_group", dict(meter=True, tokens=64, stages=1, scheme="int4_group")),
    ("int4_group_rep_sketch", dict(meter=True, tokens=64, stages=1, scheme="int4_group", HAS_REP=True, SKB=2,
                                   WEIGHTED=True)),
    ("kivi2", dict(meter=True, tokens=64, stages=1, scheme="kivi2", TIER_B=True, NB=64)),
    ("kivi2_nometer", dict(meter=False, tokens=64, stages=1, scheme="kivi2")),
    ("fp8_e4m3", dict(meter=True, tokens=128, stages=1, scheme="fp8_e4m3")),
    ("fp8_e5m2", dict(meter=True, tokens=128, stages=1, scheme="fp8_e5m2")),
    ("fp8_scaled_sketch4", dict(meter=True, tokens=64, stages=1, scheme="fp8_e4m3_scaled", SKB=4, WEIGHTED=True)),
    ("none_win", dict(meter=True, tokens=128, stages=2, scheme="none", head_columns=16, HAS_WIN=True, PV_F32=True)),
    ("none_nometer", dict(meter=False, tokens=64, stages=1, scheme="none", PV_F32=True)),
    ("page_levels", dict(meter=True, tokens=128, stages=1, PAGE_LEVELS=True, HIST_BF16=False, head_columns=16)),
    ("page_levels_tierb", dict(meter=True, tokens=64, stages=1, PAGE_LEVELS=True, TIER_B=True, NB=64)),
    ("rep_mask_csr", dict(meter=True, tokens=128, stages=1, HAS_REP=True, HAS_MASK=True, CSR=True)),
    ("skb2_weighted", dict(meter=True, tokens=128, stages=1, SKB=2, WEIGHTED=True, MAGIC_BF16=True)),
    ("skb4_weighted", dict(meter=True, tokens=64, stages=1, SKB=4, WEIGHTED=True, MAGIC_BF16=True)),
    ("skb2_plain", dict(meter=True, tokens=64, stages=1, SKB=2, MAGIC_BF16=False)),
    ("skb1_dither", dict(meter=True, tokens=64, stages=1, scheme="int8_dither", SKB=1, MAGIC_BF16=False)),
    ("weighted_only", dict(meter=True, tokens=64, stages=1, WEIGHTED=True)),
    ("pack_hist_off", dict(meter=True, tokens=128, stages=1, PACK_HIST=False)),
    ("pack_hist_fp32", dict(meter=True, tokens=64, stages=1, HIST_BF16=False, PACK_HIST=True)),
    ("nopack_fp32", dict(meter=True, tokens=64, stages=1, HIST_BF16=False, PACK_HIST=False)),
    ("groups_per_block", dict(meter=True, tokens=64, stages=1, G=4, PER_TOKEN=False)),
    ("win_mask_nometer", dict(meter=False, tokens=64, stages=1, HAS_WIN=True, HAS_MASK=True, PREFETCH_BT=True)),
    ("win_sketch_pf", dict(meter=True, tokens=32, stages=1, warps=1, prefetch=1, HAS_WIN=True, SKB=2,
                           WEIGHTED=True, MAGIC_BF16=True, HAS_REP=True)),
    ("fp32_interp_like", dict(meter=True, tokens=64, stages=1, LOWP=False, scheme="int8_dither", SKB=2,
                              HAS_WIN=True, HAS_REP=True)),
    ("fp8_key_f16_nometer", dict(meter=False, tokens=64, stages=1, scheme="fp8_e4m3", KEY_F16=True)),
    ("fp8_key_f16_meter_csr", dict(meter=True, tokens=128, stages=1, scheme="fp8_e4m3", KEY_F16=True, T=1, PAGES=128,
                                   CSR=True, HAS_UNMET=True)),
]


def stripped_ptx(ptx: str) -> str:
    """The PTX without what moves with the source lines: debug sections, .loc / .file, labels of the debug
    ranges, comments."""
    i = ptx.find(".section\t.debug")
    if i >= 0:
        ptx = ptx[:i]
    out = []
    for line in ptx.split("\n"):
        if re.match(r"\s*\.(loc|file)\b", line) or re.match(r"\s*\$L__(tmp|func_end|func_begin)\d*:", line):
            continue
        line = re.sub(r"//.*$", "", line).rstrip()
        if line:
            out.append(line)
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--save", help="write each configuration's stripped PTX to this folder")
    ap.add_argument("--compare", help="compare against the stripped PTX saved in this folder")
    ap.add_argument("--only", help="comma-separated configuration indices")
    args = ap.parse_args(argv)
    picked = [int(i) for i in args.only.split(",")] if args.only else range(len(CONFIGS))
    if args.save:
        os.makedirs(args.save, exist_ok=True)
    same = 0
    for i in picked:
        name, kw = CONFIGS[i]
        try:
            ptx = stripped_ptx(compile_decode(**kw).asm["ptx"])
        except Exception as e:  # noqa: BLE001 (a configuration that does not compile is reported, not fatal)
            print(f"{i:2d} {name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        digest = hashlib.sha256(ptx.encode()).hexdigest()[:16]
        line = f"{i:2d} {name}: {digest} ({ptx.count(chr(10)) + 1} lines)"
        if args.save:
            with open(os.path.join(args.save, f"{i:02d}_{name}.ptx"), "w") as f:
                f.write(ptx)
        saved = os.path.join(args.compare or "", f"{i:02d}_{name}.ptx")
        if args.compare and not os.path.exists(saved):  # (a configuration added after the save)
            line += " new: not in the saved folder"
        elif args.compare:
            with open(saved) as f:
                old = f.read()
            if old == ptx:
                same += 1
                line += " identical"
            else:
                diff = difflib.unified_diff(old.split("\n"), ptx.split("\n"), "before", "after", lineterm="", n=1)
                line += " DIFFERS\n" + "\n".join(list(diff)[:40])
        print(line, flush=True)
    if args.compare:
        print(f"{same} / {len(picked)} identical")
        return 0 if same == len(picked) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
