#!/bin/bash
# run C7 (2026-12-06, eighteenth session): after C6 — the gate test no longer counts the canary's decode calls, the
# lower check's radii rounded down onto 2^(1/64) steps (a faster float64 supremum): those tests and the check's cost
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 200 python3 bench/pytest_shards.py -n 8 tests/cache/test_decode_selftest.py tests/kernels/test_kernel_gate_cache.py \
  tests/cache/test_graphs.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-300; tail -1 $OUT/gpu_tests.log | cut -c1-300
timeout 100 python3 bench/results/2026-12-06d/decode_selftest_cost.py > $OUT/cost.jsonl 2> $OUT/cost.err; echo "cost rc $?"
cat $OUT/cost.jsonl; tail -3 $OUT/cost.err
