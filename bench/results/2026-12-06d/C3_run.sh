#!/bin/bash
# run C3 (2026-12-06, eighteenth session), first call: the decode self-check's GPU tests after C2 (the graphed case
# empties the graph pool before its faulty request; split counts keyed by class); stashes the GGUF's first half for C4
ROOT=$PWD; mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 300 python3 bench/pytest_shards.py -n 8 tests/cache/test_decode_selftest.py tests/cache/test_graphs.py \
  tests/kernels/test_sketch_window.py tests/kernels/test_head_levels.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-300; tail -1 $OUT/gpu_tests.log | cut -c1-300
