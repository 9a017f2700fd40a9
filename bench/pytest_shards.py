"""Run pytest files as N parallel shards on one machine (the device call's CUDA conformance: its time is
Triton compiles, which one process does on one core; the GPU work itself is small).

    WITCERT_DEVICE=cuda python3 bench/pytest_shards.py -n 4 tests/kernels/test_kernels_conformance.py tests/cache/test_graphs.py

Node ids are collected once and dealt round-robin; each shard's log is printed in turn, then one summary
line per shard and the total. The exit status is non-zero if any shard failed (or collected nothing)."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=4, help="shards")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    col = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args.files],
                         capture_output=True, text=True)
    ids = [ln for ln in col.stdout.splitlines() if "::" in ln and not ln.startswith(" ")]
    if not ids:
        print(col.stdout[-3000:], col.stderr[-3000:])
        return 2
    shards = [ids[i::args.n] for i in range(args.n) if ids[i::args.n]]
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *s],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for s in shards]
    outs = [p.communicate()[0] for p in procs]
    rc = 0
    totals: dict[str, int] = {}
    for i, (p, out) in enumerate(zip(procs, outs)):
        print(f"===== shard {i}: {len(shards[i])} tests, rc {p.returncode}")
        print(out)
        rc = rc or p.returncode
    for i, out in enumerate(outs):
        last = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        print(f"shard {i}: {last[-1].strip('= ') if last else 'no summary'}")
        for k, v in re.findall(r"(\d+) (passed|failed|skipped|xfailed|errors?)", last[-1] if last else ""):
            totals[v] = totals.get(v, 0) + int(k)
    print(f"collected {len(ids)}; total: " + ", ".join(f"{v} {k}" for k, v in totals.items()) + f"; rc {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
