#!/bin/bash
# run D5 (2026-12-06, nineteenth session, branch wip/two-sum-kernel): the decode kernel's two excess sums compiled on a
# GPU — witcert selftest (the canary's supremum over the centred box) on three configurations, the tests that run the
# new code, then the metered call's time with the sums (WITCERT_EXCESS=1) and without (0), bench/sketch_speed.py --lean
source bench/device_suite.sh
# (ran the inline form of this loop, on the branch)
selftests "--scheme int8,fp8_e4m3,kivi2 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 8 --context 32768" \
  "--scheme int8,int4_group,int8_dither --head-dim 64 --kv-heads 3 --q-heads 9 --batch 1 --context 4096" \
  "--scheme fp8_e5m2,int8 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 3 --context 8192 --window 0,0"
suite 200 12 tests/kernels/test_sketch_window.py tests/cache/test_decode_selftest.py tests/kernels/test_kernels_conformance.py tests/kernels/test_head_levels.py tests/cache/test_graphs.py tests/kernels/test_kernel_gate_cache.py
for e in 0 1; do
  echo "== WITCERT_EXCESS=$e"
  WITCERT_EXCESS=$e timeout 100 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | grep -v "Hq   B" | cut -c1-140
done
