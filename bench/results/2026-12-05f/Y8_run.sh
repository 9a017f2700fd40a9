#!/bin/bash
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
SG="--sglang-root $ROOT/.carry/sg/sglang"
echo "== table deferred (warm-up)" >> $OUT/table.log
timeout 200 python3 bench/sglang_h200.py $SG --batches 1,8,32 --lens 4096,32768 --kv fp8,bf16 --defer-tilt >> $OUT/table.log 2>&1; echo "rc $?" >> $OUT/table.log
echo "== 128K deferred (warm-up)" >> $OUT/table.log
timeout 150 python3 bench/sglang_h200.py $SG --batches 1,8 --lens 131072 --kv fp8,bf16 --defer-tilt >> $OUT/table.log 2>&1; echo "rc $?" >> $OUT/table.log
grep -E "^==|^\| (bf16|fp8)|^rc" $OUT/table.log | cut -c1-110
