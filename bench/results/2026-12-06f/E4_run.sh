#!/bin/bash
# run E4 (2026-12-06, twentieth session), first call of a second lease: the excess form as e^{2Ξ} max(Â, B̂) (branch
# excess-direct) — witcert selftest on three configurations, the tests that run the merge's forms; stashes the GGUF's
# first half for E5
source bench/device_suite.sh
mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
selftests "--scheme int8,fp8_e4m3,kivi2 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 8 --context 32768" \
  "--scheme int8,int4_group,int8_dither --head-dim 64 --kv-heads 3 --q-heads 9 --batch 1 --context 4096" \
  "--scheme fp8_e5m2,int8 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 3 --context 8192 --window 0,0"
suite 200 14 tests/kernels/test_excess_form.py tests/kernels/test_tilt_batch.py tests/kernels/test_sketch_window.py \
  tests/cache/test_decode_selftest.py tests/kernels/test_kernel_epilogue.py tests/cache/test_graphs.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_tilt_stop_boundary.py
