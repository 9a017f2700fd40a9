#!/bin/bash
# run Y12 (2026-12-05g): the coarse tilt grid (26d8128) on the GPU: the epilogue, tilt and conformance tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site:$PWD/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 150 python3 bench/pytest_shards.py -n 15 tests/kernels/test_kernel_epilogue.py \
  tests/kernels/test_tilt_stop_boundary.py tests/kernels/test_tilt_batch.py tests/kernels/test_kernels_conformance.py \
  tests/integrations/test_sglang_graphs.py > $OUT/y12.log 2>&1
echo "rc $?" >> $OUT/y12.log; grep -E "^shard|total|^rc|FAILED" $OUT/y12.log | tail -22
