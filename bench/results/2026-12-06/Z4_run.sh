#!/bin/bash
# run Z4 (2026-12-06, fifteenth session): the cache's GPU tests after the merge writes the model's dtype (graphed and
# eager kernel paths) and the output buffers' aliasing checks / int64 offsets (never run on a GPU); then the metered
# fp8 tile on SGLang's call, default (128 tokens, 4 warps, cap 168: 40 B spilled offline) against 64:4:168 (no spill)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/cache/test_graphs.py tests/kernels/test_sketch_window.py \
  tests/kernels/test_kernel_gate_cache.py tests/kernels/test_head_levels.py tests/kernels/test_window_write.py \
  tests/cache/test_review_store_gate.py tests/kernels/test_decode_outputs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "total|FAILED|rc|passed|failed" $OUT/tests.log | tail -14 | cut -c1-250
SG="--sglang-root $ROOT/.carry/sg/sglang"
ARGS="--batches 1,8,32 --lens 4096,32768 --kv fp8 --defer-tilt"
timeout 140 python3 bench/sglang_h200.py $SG $ARGS > $OUT/sg_def.log 2>&1; echo "rc $?" >> $OUT/sg_def.log
timeout 140 python3 bench/sglang_h200.py $SG $ARGS --metered-tile 64:4:168 > $OUT/sg_64.log 2>&1; echo "rc $?" >> $OUT/sg_64.log
for f in sg_def sg_64; do echo "== $f"; grep -E "^\| fp8|^rc|Error|error" $OUT/$f.log | cut -c1-130; done
