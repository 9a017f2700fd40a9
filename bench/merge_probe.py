"""The fused merge / meter epilogue alone on the GPU (``kernels.epilogue.merge``), on the partials of a
real decode: how much of the metered call it is at each batch, and what its launch shape costs.

    python3 bench/merge_probe.py                 # B 1 / 8 / 32 at 32K, Hq 32 (the benchmark's shapes)

For each shape the decode kernel runs once (meter on, ``choose_splits``' splits) and its partials are
captured; then, CUDA-graph replayed (``bench.decode.graphed``, median of ``do_bench``): the unmetered merge
(METER off), the metered merge without the record, the record at τ 0.1 (the benchmark's "on") at 1 / 2 / 4 /
8 warps and with the tilt on every row, and the record with tier A's bins merged a second time from the
partials (``HA_FROM_MERGED`` off, the code before run M). Also the share of rows whose tilt ran, and the
record at τ = 1.5 / 0.5 / 0.1 × the median refined TV⁺ (rows that take the tilt; how many stopped refining
early, certified or not: the lazy refinement of ``epilogue_jit._tv_row``).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

import kernels.decode as kd  # noqa: E402
import kernels.epilogue as ke  # noqa: E402
from bench.decode import bench, graphed, int8_shape  # noqa: E402


def capture(cache, q, bt, sl):
    """(args, kwargs) of the merge call a metered decode makes."""
    seen = {}
    real = kd.merge

    def spy(*a, **k):
        seen["call"] = (a, k)
        return real(*a, **k)

    kd.merge = spy
    try:
        kd.decode(cache, q, bt, sl, meter=True, validate=False, tilt_above=0.1)
    finally:
        kd.merge = real
    return seen["call"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:32768,8:32768,32:32768")
    ap.add_argument("--heads", type=int, default=32)
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("# fused merge alone (ms, CUDA-graph replay): off = METER off; hist = merged histograms, no record; "
          "rec τ = the record with the tilt above τ (-1: every row); w = warps per program; 2x = tier A merged twice")
    for shp in args.shapes.split(","):
        B, n = (int(x) for x in shp.split(":"))
        _, caches, q, sl, _ = int8_shape(B, n, args.heads, 8, 128, "cuda", sms)
        (m_out, l_out, acc, hist, stat, qq, sll, consts), kw = capture(caches[0][0], q, caches[0][1], sl)
        rows = m_out.shape[0] * m_out.shape[1]
        _, _, rec = ke.merge(m_out, l_out, acc, hist, stat, qq, sll, consts, tilt_above=0.1)
        tilted = float((rec.tilt < 1).double().mean())
        res = []

        def t(name, **k):
            def f():
                return ke.merge(m_out, l_out, acc, k.get("h", hist), k.get("st", stat), qq, sll, consts,
                                epilogue=k.get("epi", True), tilt_above=k.get("tau", 0.1), num_warps=k.get("w"))
            res.append((name, bench(graphed([f]), False)))

        for w in (1, 4):
            t(f"off w{w}", h=None, st=None, epi=False, w=w)
            t(f"hist w{w}", epi=False, w=w)
        for w in (1, 2, 4, 8):
            t(f"rec 0.1 w{w}", w=w)
        for w in (1, 2, 4, 8):
            t(f"rec -1 w{w}", tau=-1.0, w=w)
        # rows that take the tilt (as on keys with outlier channels, bench/TIGHTNESS.md): τ just above / below
        # the refined TV⁺ of each row's median; "stopped early": rows whose refinement stopped once τ was settled
        full = ke.merge(m_out, l_out, acc, hist, stat, qq, sll, consts, tilt_above=-1.0)[2]
        med = float(full.tv_upper_a.median())
        for name, tau in (("rec 1.5med", 1.5 * med), ("rec 0.5med", 0.5 * med), ("rec 0.1med", 0.1 * med)):
            r = ke.merge(m_out, l_out, acc, hist, stat, qq, sll, consts, tilt_above=tau)[2]
            ran = float((r.tilt < 1).double().mean())
            early = r.tilt > full.tilt + 1e-12  # refined less than in full (lazy: τ settled either way)
            cert = float((early & (r.tv_upper_a <= tau)).double().mean())
            unc = float((early & (r.tv_upper_a > tau)).double().mean())
            t(f"{name} (τ {tau:.3g}: tilt ran {ran:.2f}, stopped early certified {cert:.2f} / not {unc:.2f}) w4",
              tau=tau, w=4)
        ke.HA_FROM_MERGED = False
        t("rec 0.1 w4 2x", w=4)
        ke.HA_FROM_MERGED = True
        print(f"B={B} n={n} rows={rows} S={m_out.shape[2]} tilted(τ 0.1)={tilted:.3f}: "
              + "  ".join(f"{k} {v * 1e3:.1f}us" for k, v in res), flush=True)


if __name__ == "__main__":
    main()
