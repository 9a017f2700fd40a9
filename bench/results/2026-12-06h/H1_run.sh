#!/bin/bash
# run H1 (2026-12-06, twenty-second session), first call of a lease: the grid's cost (bench/sketch_speed.py --lean:
# the metered call against "s+w no-grid" and "s+w no-exc" in one process), witcert selftest on the first canary
# configuration (int8, fp8_e4m3, kivi2 at Llama-8B shapes, B 8 / 32K), the grid's and the excess form's tests on the
# GPU; stashes the GGUF's first half for H2 (bench/results/2026-12-06g/G2_run.sh, the GPU tightness, same lease)
source bench/device_suite.sh
mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
timeout 130 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-700
selftests "${CANARY_CONFIGS[0]}"
suite 90 14 tests/kernels/test_excess_grid.py tests/kernels/test_excess_form.py
