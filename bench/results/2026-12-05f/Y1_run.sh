#!/bin/bash
# run Y1 (2026-12-05f): the GPU tests the eleventh session left (e5m2 non-finite logits, unmetered slots), then the
# bf16 meter-off tile / split sweep against SGLang's own decode (B 8 / 32)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
WITCERT_DEVICE=cuda timeout 200 python3 bench/pytest_shards.py -n 15 tests/kernels/test_unmetered_slots.py \
  tests/integrations/test_sglang_graphs.py tests/cache/test_graphs.py tests/kernels/test_kernels_conformance.py > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log; tail -3 $OUT/tests.log
timeout 300 python3 .carry/offsweep.py --sglang-root $ROOT/.carry/sg/sglang > $OUT/offsweep.log 2>&1; echo "sweep rc $?" >> $OUT/offsweep.log
grep -E "^##|default|rc" $OUT/offsweep.log
