#!/bin/bash
# run Z5 (2026-12-06, fifteenth session): Z4's GPU tests (the cache's out= paths, the output buffers' checks, int64
# offsets: never run on a GPU), then the int8 sketch + window tile forced to other shapes (bench/sketch_speed.py
# --tiles): the default 128-token / 4-warp tile runs at the 232-register sketch cap (two programs per SM); a
# 64-token tile fits 168 registers with no spill (Triton 3.6.0 offline, bench/sass_probe.py): three per SM
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/cache/test_graphs.py tests/kernels/test_sketch_window.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_head_levels.py tests/kernels/test_window_write.py \
  tests/cache/test_review_store_gate.py tests/kernels/test_decode_outputs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "total|FAILED|rc|passed|failed" $OUT/tests.log | tail -14 | cut -c1-250
timeout 300 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768,131072 \
  --tiles 64:4:168,128:4:168 > $OUT/sketch_tiles.log 2>&1; echo "rc $?" >> $OUT/sketch_tiles.log
cat $OUT/sketch_tiles.log | cut -c1-700
