#!/bin/bash
# run Y2 (2026-12-05f): scheme none's tile at 8 head columns against 16 (SGLang bf16: off / metered / SGLang, graph),
# then the GPU tests of the e5m2 read and the none tile
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
SG="--sglang-root $ROOT/.carry/sg/sglang"
for t in 128,2,4,16 128,2,4,8 128,2,4,16 128,2,4,8; do
  NONE_TILE=$t timeout 100 python3 .carry/tilepatch.py $SG --batches 1,8,32 --lens 4096,32768 --kv bf16 --iters 30 >> $OUT/ab.log 2>&1
done
grep -E "^# scheme|^\| bf16" $OUT/ab.log | cut -c1-120
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/kernels/test_kernels_conformance.py \
  tests/kernels/test_kernel_tiles.py tests/integrations/test_sglang_graphs.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; tail -3 $OUT/tests.log; grep FAILED $OUT/tests.log | head
