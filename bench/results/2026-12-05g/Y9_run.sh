#!/bin/bash
# run Y9 (2026-12-05f): the tests this session added or changed on the GPU; the deferred SGLang table with a 0.2 s warm-up
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
WITCERT_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_conformance.py \
  tests/kernels/test_kernel_tiles.py -k "nonfinite or tile_config or csr" > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; tail -2 $OUT/tests.log
SG="--sglang-root $ROOT/.carry/sg/sglang"
timeout 200 python3 bench/sglang_h200.py $SG --batches 1,8,32 --lens 4096,32768 --kv fp8,bf16 --defer-tilt > $OUT/table.log 2>&1; echo "rc $?" >> $OUT/table.log
grep -E "^\| (bf16|fp8)|^rc" $OUT/table.log | cut -c1-110
