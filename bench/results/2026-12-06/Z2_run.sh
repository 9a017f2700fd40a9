#!/bin/bash
# run Z2 (2026-12-06): the GPU tests of the files this session's changes touch (the same lease as Z1 when it came)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 280 python3 bench/pytest_shards.py -n 15 tests/kernels/test_kernels_conformance.py \
  tests/kernels/test_kernel_tiles.py tests/kernels/test_kernel_epilogue.py tests/kernels/test_tilt_batch.py \
  tests/integrations/test_sglang_graphs.py tests/cache/test_graphs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; grep -E "passed|failed|FAILED|Error|rc" $OUT/tests.log | tail -25 | cut -c1-300
