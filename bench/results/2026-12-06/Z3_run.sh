#!/bin/bash
# run Z3 (2026-12-06, the lease of Z1 / Z2): the two new or changed GPU test files, and the bf16 SGLang table A/B
# (A: the session's base tree 3aa5c7d carried as .carry/base; B: this tree)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
WITCERT_DEVICE=cuda timeout 150 python3 bench/pytest_shards.py -n 12 tests/kernels/test_decode_outputs.py tests/kernels/test_unmetered_slots.py > $OUT/tests2.log 2>&1
SG="--sglang-root $ROOT/.carry/sg/sglang"; ARGS="--batches 1,8,32 --lens 4096,32768 --kv bf16 --defer-tilt"
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:/tmp/site:$ROOT/.carry/sg timeout 120 python3 bench/sglang_h200.py $SG $ARGS) > $OUT/sg_a_bf16.log 2>&1
timeout 120 python3 bench/sglang_h200.py $SG $ARGS > $OUT/sg_b_bf16.log 2>&1
