#!/bin/bash
# run Q4 (2026-12-07, twenty-sixth session, issue 36): the metered SGLang fp8 call's split count, forced (the plan gives
# 49 splits at B 1 and 12 at B 8 on 132 SMs, page size 1: at 4K a B 1 program reads ~84 tokens, under one 128-token
# tile); bench/sglang_h200.py --metered-splits, one process, the table at the plan's count then at each forced one
source bench/device_suite.sh >/dev/null 2>&1
nvidia-smi -L
timeout 540 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --batches 1,8 --lens 4096,32768 --kv fp8 \
  --defer-tilt --iters 20 --metered-splits 8,16,24,33 > $OUT/Q4_sg_splits.log 2>&1; echo "rc $?"
grep -E "^\| fp8|^# metered call|Error" $OUT/Q4_sg_splits.log | cut -c1-200
