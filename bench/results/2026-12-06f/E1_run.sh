#!/bin/bash
# run E1 (2026-12-06, twentieth session), first call of a lease: the centred box's two excess sums in the fused merge
# (branch two-sum) on a GPU — witcert selftest on three configurations (the canary's supremum over the centred box),
# then the tests that run the new code; stashes the GGUF's first half for E2
source bench/device_suite.sh
mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
selftests "${CANARY_CONFIGS[@]}"  # (as run: the three configuration strings written out)
suite 330 14 tests/kernels/test_excess_form.py tests/kernels/test_tilt_batch.py tests/kernels/test_sketch_window.py \
  tests/cache/test_decode_selftest.py tests/kernels/test_kernels_conformance.py tests/kernels/test_head_levels.py \
  tests/cache/test_graphs.py tests/kernels/test_kernel_gate_cache.py tests/kernels/test_kernel_epilogue.py
