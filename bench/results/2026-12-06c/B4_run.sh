#!/bin/bash
# run B4 (2026-12-06, seventeenth session): the fp8 write without a clip before its cast (the cast's satfinite
# saturates): fp8_witness_probe.py, then the whole suite on the GPU
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
python3 bench/results/2026-12-06c/fp8_witness_probe.py > $OUT/probe.log 2>&1; echo "probe rc $?"; grep "^##" $OUT/probe.log
timeout 420 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -1 $OUT/gpu_tests.log | cut -c1-300
