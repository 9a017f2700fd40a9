#!/bin/bash
# run Q1 (2026-12-07, twenty-sixth session): the interpreter-exact casts (kernels.interpret f16 / f32 / narrow; on the
# GPU the plain casts, the decode's PTX unchanged) — the whole test suite on the GPU with the new
# tests/kernels/test_interpret_casts.py, the canary self-checks; on an H200 (the card issue 35 names, not lent since
# run R) also the decode table of issue 35 (bench/decode.py, Hq 32)
source bench/device_suite.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
suite 300 16 tests 2>&1 | tail -12
selftests "${CANARY_CONFIGS[@]}" 2>&1 | tail -12
if nvidia-smi -L | grep -q H200; then
  timeout 200 python3 bench/decode.py --heads 32 --batches 1,8,32 --lengths 32768,131072 > $OUT/Q1_decode_h200.log 2>&1
  echo "decode rc $?"; tail -12 $OUT/Q1_decode_h200.log | cut -c1-260
fi
