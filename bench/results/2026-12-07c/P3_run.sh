#!/bin/bash
# Ran as an inline command of the same content (SGLang A/B only, timeout 70 each, no test): P3_sg_none.log, P3_sg_both.log
# run P3 (2026-12-07, twenty-fifth session): SGLang's call side by side with PDL off and on (bench/sglang_h200.py --pdl,
# one process each; pydantic's wheels now carried: the device image lacks pydantic_core, which SGLang's import chain
# needs), then the PDL codegen / GPU test after its launch_dependents moved before the partials' stores
source bench/device_suite.sh >/dev/null 2>&1
SG="--sglang-root $PWD/.carry/sg/sglang"
ARGS="--batches 1,8 --lens 4096,32768 --kv fp8 --defer-tilt --iters 20"
for p in none both; do
  timeout 80 python3 bench/sglang_h200.py $SG $ARGS --pdl $p > $OUT/P3_sg_$p.log 2>&1; echo "rc $?" >> $OUT/P3_sg_$p.log
  echo "== sglang --pdl $p"; grep -E "^\| fp8|^rc|Error|error" $OUT/P3_sg_$p.log | cut -c1-200
done
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py 2>&1 | tail -1
