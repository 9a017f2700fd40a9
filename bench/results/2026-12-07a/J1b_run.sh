#!/bin/bash
# run J1b (2026-12-07, twenty-third session): J1 cut to the device time left after eleven refused requests: witcert
# selftest on the first canary configuration (int8, fp8_e4m3, kivi2 at Llama-8B shapes, B 8 / 32K; its write canary
# checks each page's ν / κ max against every token's norm) and the page-maxima tests on the GPU
source bench/device_suite.sh
selftests "${CANARY_CONFIGS[0]}"
suite 100 15 tests/kernels/test_block_norms.py tests/kernels/test_window_write.py
