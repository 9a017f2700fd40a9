"""Where the fused merge's record spends its time on the GPU: the tilt, by warps, grid points per step and grid.

    python3 bench/tilt_cost.py --out DIR        # B 1 / 8 / 32 at 32K, Hq 32, int8 (bench.decode's data)
    python3 bench/tilt_cost.py --grids 64:8:32,64:4:32,64:8:16,32:8:32 --out DIR

For each shape the metered decode runs once and the partials its merge reads are captured. Then,
CUDA-graph replayed (median of ``do_bench``), ``kernels.epilogue.merge`` alone: without the record, the
record with no row tilted (τ 0.1 on this data), and the record with the tilt on every row, fully refined
(τ −1) and lazily (τ half the median TV⁺), for each warp count (``--warps``) and grid points per step
(``--chunks``, ``epilogue.TILT_CHUNK_OVERRIDE``; at one warp count the records must be bit-identical to the
default chunk's: counted in ``records_differing_from_the_default``). ``--grids`` times the fully refined record for other tilt grids
(COARSE:REFINE_TOP:REFINE; production 64:0:32 since run Y11, 64:8:32 before): a coarser grid is looser (still sound), so these are timed
to see what the production grid's time is made of, with each grid's median tilt. Also: live bins per row
(the histogram bins with mass, the tilt's inner loop count).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

import kernels.decode as kd  # noqa: E402
import kernels.epilogue as ke  # noqa: E402
import kernels.epilogue_jit as ej  # noqa: E402
from bench.decode import bench, graphed, int8_shape, run_shapes  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402


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


GRID = (ke.COARSE, ej.REFINE_TOP, ke.REFINE)


def shape_rows(B, n, heads, sms, chunks, warps, grids=()):
    _, caches, q, sl, _ = int8_shape(B, n, heads, 8, 128, "cuda", sms)
    (m_out, l_out, acc, hist, stat, qq, sll, consts), _kw = capture(caches[0][0], q, caches[0][1], sl)
    out = {"B": B, "n": n, "rows": m_out.shape[0] * m_out.shape[1], "S": m_out.shape[2],
           "plan_warps": ke.merge_warps(m_out.shape[2], 128, True, m_out.shape[0] * m_out.shape[1], sms)}

    def call(tau, epi=True, w=None, h=hist, st=stat):
        return ke.merge(m_out, l_out, acc, h, st, qq, sll, consts, epilogue=epi, tilt_above=tau, num_warps=w)

    def t(name, **k):
        out[name + "_us"] = round(bench(graphed([lambda: call(**k)]), False) * 1e3, 2)

    full = call(-1.0)[2]
    live = (full.hist > 0).sum(-1).double()
    out["live_bins_median"] = float(live.median())
    out["live_bins_max"] = float(live.max())
    med = float(full.tv_upper_a.median())
    t("merge_off", tau=0.1, epi=False, h=None, st=None)
    t("record_no_tilt", tau=0.1)
    for w in warps:  # the record whose tilt is skipped (a gate's τ) at each warp count
        t(f"record_no_tilt_w{w}", tau=0.1, w=w)
    tb = TiltBatch.allocate(1, out["rows"], hist.shape[-1], hist.device)

    def deferred(w):  # the record with its tilt deferred (kernels.tilt_batch: the graphed default)
        tb.written.clear()
        return ke.merge(m_out, l_out, acc, hist, stat, qq, sll, consts, tilt_batch=tb, tilt_layer=0, num_warps=w)

    for w in [None, *warps]:
        out[f"deferred_w{w or 'plan'}_us"] = round(bench(graphed([lambda: deferred(w)]), False) * 1e3, 2)
    mismatch = 0
    for tau, tag in ((-1.0, "full"), (0.5 * med, "lazy")):
        for w in warps:
            ref = call(tau, w=w)[2]  # (the warps may change the merge's summation order: compare within one count)
            for tc in chunks:
                ke.TILT_CHUNK_OVERRIDE = tc
                try:
                    rec = call(tau, w=w)[2]
                    same = all(torch.equal(getattr(rec, f), getattr(ref, f)) for f in ("tv_upper_a", "tilt", "out_err_upper"))
                    mismatch += not same
                    t(f"{tag}_w{w}_tc{ke.tilt_chunk()}", tau=tau, w=w)
                except Exception as e:  # noqa: BLE001 (a configuration that fails to build is reported)
                    out[f"error_{tag}_w{w}_tc{tc}"] = f"{type(e).__name__}: {e}"[:300]
                finally:
                    ke.TILT_CHUNK_OVERRIDE = None
    out["records_differing_from_the_default"] = mismatch
    for n1, rt, nr in grids:
        ke.COARSE, ke.REFINE = n1, nr
        ej.REFINE_TOP = rt
        try:
            out[f"tilt_median_{n1}_{rt}_{nr}"] = float(call(-1.0)[2].tilt.median())
            t(f"full_{n1}_{rt}_{nr}", tau=-1.0)
        except Exception as e:  # noqa: BLE001
            out[f"error_{n1}_{rt}_{nr}"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            ke.COARSE, ke.REFINE = GRID[0], GRID[2]
            ej.REFINE_TOP = GRID[1]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:32768,8:32768,32:32768")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--chunks", default="16,32,64")
    ap.add_argument("--warps", default="1,2,4,8")
    ap.add_argument("--grids", default="", help="COARSE:REFINE_TOP:REFINE,… (REFINE_TOP 0: the coarse grid alone)")
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunks, warps = [int(x) for x in args.chunks.split(",")], [int(x) for x in args.warps.split(",")]
    grids = [tuple(int(v) for v in g.split(":")) for g in args.grids.split(",") if g]
    run_shapes(args.shapes, lambda B, n: shape_rows(B, n, args.heads, sms, chunks, warps, grids), args.out,
               "tilt_cost.json")


if __name__ == "__main__":
    main()
