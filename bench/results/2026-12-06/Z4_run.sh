#!/bin/bash
# run Z4 (2026-12-06): the cache's GPU tests after the merge writes the model's dtype (graphed and eager kernel paths),
# then the graphed serving step against stock's (bench/serving.py, as run W2), A: the base tree, B: this one
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/cache/test_graphs.py tests/kernels/test_sketch_window.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_head_levels.py tests/kernels/test_window_write.py \
  tests/cache/test_review_store_gate.py tests/cache/test_hostpool.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "^shard|total|FAILED|rc" $OUT/tests.log | tail -20 | cut -c1-250
SV="--shapes llama8b --prompts 4096,32768 --batches 1 --new 16 --configs int8_graph --stock-graphed --tau -1 --no-warm"
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:/tmp/site timeout 170 python3 bench/serving.py $SV) > $OUT/serving_a.log 2>&1; echo "rc $?" >> $OUT/serving_a.log
timeout 170 python3 bench/serving.py $SV > $OUT/serving_b.log 2>&1; echo "rc $?" >> $OUT/serving_b.log
for f in serving_a serving_b; do echo "== $f"; grep -E "^\||rc" $OUT/$f.log | tail -6 | cut -c1-250; done
