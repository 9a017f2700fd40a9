#!/bin/bash
# run C2 (2026-12-06, eighteenth session): witcert.selftest_decode on the GPU: its tests and the cache tests that
# run it on every kernel-path cache (eager and graphed), then its one-time cost at Llama-8B shapes
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 330 python3 bench/pytest_shards.py -n 8 tests/cache/test_decode_selftest.py tests/cache/test_write_selftest.py \
  tests/cache/test_cache_edges.py tests/cache/test_graphs.py tests/cache/test_cache.py tests/cache/test_gate.py \
  > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-300; tail -1 $OUT/gpu_tests.log | cut -c1-300
timeout 120 python3 bench/results/2026-12-06d/decode_selftest_cost.py > $OUT/cost.jsonl 2> $OUT/cost.err; echo "cost rc $?"
cat $OUT/cost.jsonl; tail -3 $OUT/cost.err
