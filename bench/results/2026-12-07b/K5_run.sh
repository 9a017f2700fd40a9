#!/bin/bash
# run K5 (2026-12-07, twenty-fourth session): the review's mends on the GPU -- the window's norms widening bf16 by
# its bits (the subnormal test with the bit patterns the interpreter flushed), the capture key with the rings -- and
# witcert selftest on the second canary configuration (SmolLM2's shape, the default window)
source bench/device_suite.sh
suite 130 6 tests/kernels/test_window_write.py tests/cache/test_graphs.py tests/kernels/test_block_norms.py
selftests "${CANARY_CONFIGS[1]}"
