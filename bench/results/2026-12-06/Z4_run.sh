#!/bin/bash
# run Z4 (2026-12-06): the cache's GPU tests after the merge writes the model's dtype (graphed and eager kernel paths);
# a sweep of the metered fp8 tile on SGLang's call (B 8 / 32 at 32K); the graphed serving step against stock's
# (bench/serving.py, as run W2; this tree only: the device time left)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 150 python3 bench/pytest_shards.py -n 15 tests/cache/test_graphs.py tests/kernels/test_sketch_window.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_head_levels.py tests/kernels/test_window_write.py \
  tests/cache/test_review_store_gate.py tests/cache/test_hostpool.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "total|FAILED|rc" $OUT/tests.log | tail -12 | cut -c1-250
SG="--sglang-root $ROOT/.carry/sg/sglang"
for t in default 64:4:168 128:4:0; do
  X=""; [ $t != default ] && X="--metered-tile $t"
  timeout 45 python3 bench/sglang_h200.py $SG --batches 8,32 --lens 32768 --kv fp8 --defer-tilt $X > $OUT/tile_$t.log 2>&1
  echo "== $t"; grep -E "^\| fp8|forced|Error" $OUT/tile_$t.log | cut -c1-110
done
SV="--shapes llama8b --prompts 4096,32768 --batches 1 --new 16 --configs int8_graph --stock-graphed --tau -1 --no-warm"
timeout 100 python3 bench/serving.py $SV > $OUT/serving_b.log 2>&1; echo "rc $?" >> $OUT/serving_b.log
echo "== serving_b"; grep -E "^\||rc" $OUT/serving_b.log | tail -6 | cut -c1-250
