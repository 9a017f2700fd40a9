#!/bin/bash
# run K1 (2026-12-07, twenty-fourth session), first call of a lease: the twenty-third session's J1 (unrun: every
# device request refused), with its timeouts back: ν / κ as float32 page maxima (PagedKV.block_norms) on the GPU --
# the metered call's time with and without them (bench/sketch_speed.py --lean, "s+w pagenorms" against "sketch+win"
# in one process), witcert selftest on all three canary configurations, and the page-maxima / write / decode tests;
# stashes the GGUF's first half for K3 (same lease)
source bench/device_suite.sh
[ -f .carry/m1/part ] && mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
timeout 170 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-900
selftests "${CANARY_CONFIGS[@]}"
suite 150 15 tests/kernels/test_block_norms.py tests/kernels/test_kernels_conformance.py \
  tests/kernels/test_window_write.py tests/kernels/test_decode_outputs.py
