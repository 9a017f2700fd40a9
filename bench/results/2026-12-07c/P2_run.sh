#!/bin/bash
# run P2 (2026-12-07, twenty-fifth session; P1's lease): with PDL on by default (kernels.pdl, the decode's
# launch_dependents before its partials' stores), the whole test suite on the GPU, then SGLang's call side by side with
# PDL off and on (bench/sglang_h200.py --pdl, one process each)
source bench/device_suite.sh >/dev/null 2>&1
suite 250 16 tests 2>&1 | tail -12
SG="--sglang-root $PWD/.carry/sg/sglang"
ARGS="--batches 1,8 --lens 4096,32768 --kv fp8 --defer-tilt --iters 20"
for p in none both; do
  timeout 70 python3 bench/sglang_h200.py $SG $ARGS --pdl $p > $OUT/P2_sg_$p.log 2>&1; echo "rc $?" >> $OUT/P2_sg_$p.log
  echo "== sglang --pdl $p"; grep -E "^\| fp8|^rc|Error|error" $OUT/P2_sg_$p.log | cut -c1-200
done
