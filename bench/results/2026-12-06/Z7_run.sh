#!/bin/bash
# run Z7 (2026-12-06, fifteenth session; Z5 trimmed to the device time left): the GPU tests of what this session and
# the last changed (the served output's bound on a GPU: the bf16 store rounds to nearest there; the cache's out= paths;
# the output buffers' checks; int64 offsets), then the int8 sketch + window tile forced to 64 tokens / 4 warps / 168
# registers (no spill, three programs per SM) against the default
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/kernels/test_decode_outputs.py tests/cache/test_graphs.py \
  tests/kernels/test_sketch_window.py tests/kernels/test_kernel_gate_cache.py tests/cache/test_review_store_gate.py \
  tests/integrations/test_sglang_graphs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "total|FAILED|rc|passed|failed" $OUT/tests.log | tail -14 | cut -c1-250
timeout 150 python3 bench/sketch_speed.py --lean --batches 8,32 --lengths 32768 --tiles 64:4:168 > $OUT/sketch_tiles.log 2>&1
echo "rc $?" >> $OUT/sketch_tiles.log; cut -c1-700 $OUT/sketch_tiles.log
