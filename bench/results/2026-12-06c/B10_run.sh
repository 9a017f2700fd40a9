#!/bin/bash
# run B10 (2026-12-06, seventeenth session): witcert.selftest on the GPU — its tests, and the cache tests whose kernel
# path now runs it (including CUDA-graph capture and pooled storage)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 125 python3 bench/pytest_shards.py -n 14 tests/cache/test_write_selftest.py tests/cache/test_cache_edges.py tests/cache/test_graphs.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -1 $OUT/gpu_tests.log | cut -c1-300
