#!/bin/bash
# run C6 (2026-12-06, eighteenth session): the whole suite on the GPU after the decode self-check took the caller's
# launch shape and the decode kernel stopped specializing seed / layer; then the check's one-time cost again
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 400 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-300; tail -1 $OUT/gpu_tests.log | cut -c1-300
timeout 100 python3 bench/results/2026-12-06d/decode_selftest_cost.py > $OUT/cost.jsonl 2> $OUT/cost.err; echo "cost rc $?"
cat $OUT/cost.jsonl; tail -3 $OUT/cost.err
