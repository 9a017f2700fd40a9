"""``witcert tightness`` on a GPU: several configurations of the real model in one process, one JSON line each.

The interpreter (``TRITON_INTERPRET=1``) runs the kernel path's tightness on the CPU in fp32, 18-28 min a scheme; on a
GPU the same command runs the compiled kernels with the model in its serving dtype (bf16 by default), where the
interpreter's bf16 arithmetic and fp8 casts are not faithful. Each configuration is ``witcert.tightness.run`` with the
given overrides; the JSON adds ``dtype`` and the device's name.

    python bench/tightness_gpu.py --configs "int8;int8:backend=reference;int8:sketch_box=per-head;kivi2" \
        [--dtypes bf16,fp32] [--out results.jsonl]
    python bench/tightness_gpu.py --show results.jsonl     # one summary line per configuration

A configuration is ``SCHEME[:key=value,...]`` with keys ``backend``, ``sketch_box``, ``sketch_bits``, ``window``
(``S/R``), ``weights``, ``grid=0`` (the kernel without the excess form's (t, λ) grid, ``kernels.plan.EXCESS_GRID``)
and ``excess=0`` (the kernel without the centred box's excess sums, ``kernels.plan.EXCESS_FORM``
off for that configuration). The exit status is 1 if any row of any configuration is a violation (TV⁺ < realised TV).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def parse_config(text: str) -> tuple[str, dict]:
    """``SCHEME[:key=value,...]`` → (scheme, overrides of ``witcert.tightness.run``)."""
    scheme, _, rest = text.partition(":")
    kw: dict = {}
    for item in filter(None, rest.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"config {text!r}: expected key=value, got {item!r}")
        if key in ("backend", "sketch_box", "weights"):
            kw[key] = val
        elif key == "sketch_bits":
            kw[key] = int(val)
        elif key in ("excess", "grid"):
            kw[key] = val != "0"
        elif key == "window":
            s, _, r = val.partition("/")
            kw[key] = (int(s), int(r))
        else:
            raise ValueError(f"config {text!r}: unknown key {key!r}")
    return scheme, kw


def show(path: str) -> None:
    """One line per JSON line of ``path`` (``--out``'s file): the configuration, dtype, box, violations, medians,
    coverage at 0.05, memory and seconds, or its error."""
    for text in open(path):
        d = json.loads(text)
        if "error" in d:
            print(d["config"], "ERROR", d["error"][-900:])
            continue
        print(f"{d['config']:52s} {d['dtype']} {d['sketch_box']:9s} viol {d['violations']} med {d['median_bound']:.6f} "
              f"real {d['median_real']:.6f} ratio {d['median_ratio']:.3f} cov05 {d['cov_05']:.4f} "
              f"x{d['tokens_at_equal_memory']:.3f} {d['wall_s']}s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--show", default=None, metavar="JSONL", help="print the summary of an --out file, and stop")
    ap.add_argument("--configs", default="int8")
    ap.add_argument("--dtypes", default="bf16", help="model dtypes: bf16, fp16, fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)
    if args.show:
        show(args.show)
        return 0
    import torch

    from witcert.tightness import run

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    bad = 0
    for dname in filter(None, args.dtypes.split(",")):
        for cfg in filter(None, args.configs.split(";")):
            scheme, kw = parse_config(cfg)
            t0 = time.time()
            import kernels.plan as kernel_plan

            kernel_plan.EXCESS_FORM = kw.pop("excess", True)
            kernel_plan.EXCESS_GRID = kw.pop("grid", True)
            try:
                res = run(scheme=scheme, device=args.device, dtype=dtypes[dname], **kw)
            except Exception as e:  # one configuration failing does not lose the others' lines
                line = {"config": cfg, "dtype": dname, "error": f"{type(e).__name__}: {e}"[:2000]}
            else:
                line = {"config": cfg, "dtype": dname, "device": name, **res.to_json()}
                bad += res.violations
            finally:
                kernel_plan.EXCESS_FORM = True
                kernel_plan.EXCESS_GRID = True
            line["wall_s"] = round(time.time() - t0, 1)
            text = json.dumps(line)
            print(text, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
