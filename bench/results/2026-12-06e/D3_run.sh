#!/bin/bash
# run D3 (2026-12-06, nineteenth session): D2's probe (bench/results/2026-12-06e/grid_probe2.patch on this tree; not in
# main) at the small grids: N intervals × GK multipliers (GK 1: λ = 1 alone, so N = 1 is the two sums
# Σ ŵ (a − 1)₊ and Σ ŵ (1 − b)₊; GK 3: λ ∈ e^{0, ±0.05}); bench/sketch_speed.py --lean, as D2
(patch -p1 < bench/results/2026-12-06e/grid_probe2.patch || git apply bench/results/2026-12-06e/grid_probe2.patch) && echo "probe applied" || exit 1
source bench/device_suite.sh
for cfg in "0 3" "1 1" "2 3" "4 1" "8 3"; do
  set -- $cfg
  echo "== N $1 GK $2"
  WITCERT_PROBE_CARRY_E=$1 WITCERT_PROBE_GK=$2 timeout 140 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | grep -v "Hq   B" | cut -c1-200
done
