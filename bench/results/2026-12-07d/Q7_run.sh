#!/bin/bash
# run Q7 (2026-12-07, twenty-sixth session): kernels.plan.METERED_WHOLE_TILES (metered splits of whole tiles: the fewest
# splits of as many tile iterations), against the rule off (bench/split_ab.py, one process, interleaved), then SGLang's
# fp8 table at the plan's counts, then the whole test suite on the GPU
source bench/device_suite.sh >/dev/null 2>&1
nvidia-smi -L
timeout 200 python3 bench/split_ab.py --shapes 1:4096,1:8192,1:16384,2:4096,4:2048,8:1024,8:4096 --rounds 3 > $OUT/Q7_split_ab.log 2>&1
echo "split_ab rc $?"; cat $OUT/Q7_split_ab.log | cut -c1-200
timeout 120 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --batches 1,8 --lens 4096,8192,32768 --kv fp8 \
  --defer-tilt --iters 20 > $OUT/Q7_sg.log 2>&1; echo "sglang rc $?"
grep -E "^\| fp8|Error" $OUT/Q7_sg.log | cut -c1-200
suite 230 16 tests 2>&1 | tail -8
