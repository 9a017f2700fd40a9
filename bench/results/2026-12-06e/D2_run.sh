#!/bin/bash
# run D2 (2026-12-06, nineteenth session): the arithmetic cost of carried-λ sums in the metered decode tile, a probe
# (bench/results/2026-12-06e/carry_probe.patch on this tree; not in main): CARRY_E evaluations per (token, head), each
# λ·(ŵa + t(ŵb − ŵa)) − ŵ, max 0, summed over the tile's tokens, plus the two exps of a, b per (token, head);
# bench/sketch_speed.py --lean (int8, Hq 32 / Hkv 8, d 128, sketch 2 bits + weights + window, whole call, graph replay)
patch -p1 < bench/results/2026-12-06e/carry_probe.patch && echo "probe applied"
source bench/device_suite.sh
for e in 0 16 32 64; do
  echo "== CARRY_E $e"
  WITCERT_PROBE_CARRY_E=$e timeout 140 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-400
done
