#!/bin/bash
# run G1b (2026-12-06, twenty-first session; ~370 s of device time were left): the metered call's time with the grid
# and without it (bench/sketch_speed.py --lean: "s+w no-grid" and "s+w no-exc" in the same process), witcert selftest
# on the first canary configuration (int8, fp8_e4m3, kivi2 at Llama-8B shapes, B 8 / 32K), the grid's tests on the GPU
source bench/device_suite.sh
nvidia-smi -L
timeout 120 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-700
selftests "${CANARY_CONFIGS[0]}"
suite 70 14 tests/kernels/test_excess_grid.py tests/kernels/test_excess_form.py
