#!/bin/bash
# run K6 (2026-12-07, twenty-fourth session): the KV write's input offsets in int64 on the GPU -- writes of 2M + 32
# tokens of Hkv·D = 1024 (tests/kernels/test_write_offsets.py: the last pages against a small write), the write /
# decode conformance, and witcert selftest on the first canary configuration (B 8 / 32K writes)
source bench/device_suite.sh
suite 150 8 tests/kernels/test_write_offsets.py tests/kernels/test_kernels_conformance.py tests/kernels/test_window_write.py
selftests "${CANARY_CONFIGS[0]}"
