#!/bin/bash
# run Z4 (2026-12-06): the cache's GPU tests after the merge writes the model's dtype (graphed and eager kernel paths)
# and the output buffers' aliasing checks; then, time left, a sweep of the metered fp8 tile on SGLang's call
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 130 python3 bench/pytest_shards.py -n 15 tests/cache/test_graphs.py tests/kernels/test_sketch_window.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_head_levels.py tests/kernels/test_window_write.py \
  tests/cache/test_review_store_gate.py tests/kernels/test_decode_outputs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "total|FAILED|rc" $OUT/tests.log | tail -12 | cut -c1-250
# (the tile sweep that followed was dropped: the session's device time was spent on failed starts)
