#!/bin/bash
# run C1 (2026-12-06, eighteenth session): the whole suite on the GPU on the session's base tree (7555692):
# the write kernel's do_not_specialize and the window self-check had run there only in B10's subset
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,power.limit --format=csv
timeout 420 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -1 $OUT/gpu_tests.log | cut -c1-300
