#!/bin/bash
# run E4 (2026-12-06, twentieth session), first call of a second lease: the excess form as e^{2Ξ} max(Â, B̂) (branch
# excess-direct) — witcert selftest on three configurations, the tests that run the merge's forms; stashes the GGUF's
# first half for E5
source bench/device_suite.sh
mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
selftests "${CANARY_CONFIGS[@]}"  # (as run: the three configuration strings written out)
suite 200 14 tests/kernels/test_excess_form.py tests/kernels/test_tilt_batch.py tests/kernels/test_sketch_window.py \
  tests/cache/test_decode_selftest.py tests/kernels/test_kernel_epilogue.py tests/cache/test_graphs.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_tilt_stop_boundary.py
