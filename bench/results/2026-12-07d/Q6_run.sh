#!/bin/bash
# run Q6 (2026-12-07, twenty-sixth session): kernels.plan.METERED_MIN_SPLIT_TILES (no metered split shorter than two of
# its tiles), after run Q5's forced counts on SGLang's call: int8 on the paged layout at the plan's count with and
# without the rule (bench/split_ab.py, one process, interleaved), then SGLang's fp8 table at the plan's counts
source bench/device_suite.sh >/dev/null 2>&1
nvidia-smi -L
timeout 240 python3 bench/split_ab.py --shapes 1:4096,1:8192,1:16384,2:4096,4:2048,8:1024 --rounds 3 > $OUT/Q6_split_ab.log 2>&1
echo "split_ab rc $?"; cat $OUT/Q6_split_ab.log | cut -c1-200
timeout 200 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --batches 1,8 --lens 4096,8192,32768 --kv fp8 \
  --defer-tilt --iters 20 > $OUT/Q6_sg.log 2>&1; echo "sglang rc $?"
grep -E "^\| fp8|Error" $OUT/Q6_sg.log | cut -c1-200
