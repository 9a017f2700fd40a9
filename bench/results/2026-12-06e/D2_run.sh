#!/bin/bash
# run D2 (2026-12-06, nineteenth session): the arithmetic cost of the fixed (t, λ) grid's sums in the metered decode tile,
# a probe (bench/results/2026-12-06e/carry_probe.patch on this tree; not in main): WITCERT_PROBE_CARRY_E = N intervals,
# (N + 1) grid points × 3 multipliers, each max(λ·(ŵa + t(ŵb − ŵa)) − ŵ, 0) summed over the tile, plus the two exps per (token, head);
# bench/sketch_speed.py --lean (int8, Hq 32 / Hkv 8, d 128, sketch 2 bits + weights + window, whole call, graph replay)
(patch -p1 < bench/results/2026-12-06e/carry_probe.patch || git apply bench/results/2026-12-06e/carry_probe.patch) && echo "probe applied" || exit 1
source bench/device_suite.sh
for e in 0 4 8 16; do
  echo "== CARRY_E $e"
  WITCERT_PROBE_CARRY_E=$e timeout 140 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-400
done
