#!/bin/bash
# run B9 (2026-12-06, seventeenth session): scaled_norm keeps a NaN (max with NaN propagation) and the fp8 saturation
# test writes a NaN (B8 found its witness finite on the GPU): the whole suite on the GPU
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 330 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -1 $OUT/gpu_tests.log | cut -c1-300
