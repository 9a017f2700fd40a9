#!/bin/bash
# run G1 (2026-12-06, twenty-first session), first call of a lease: the excess form's small (t, λ) grid in the decode
# (kernels.excess_grid) on a GPU — the metered call's time with the grid and without it (bench/sketch_speed.py --lean:
# "s+w no-grid" and "s+w no-exc" in the same process), witcert selftest on the canary configurations, the tests that
# run the new code; stashes the GGUF's first half for G2
source bench/device_suite.sh
mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
nvidia-smi -L
timeout 150 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-700
selftests "${CANARY_CONFIGS[@]}"
suite 130 14 tests/kernels/test_excess_grid.py tests/kernels/test_excess_form.py tests/kernels/test_sketch_window.py \
  tests/cache/test_decode_selftest.py tests/kernels/test_tilt_batch.py
