#!/bin/bash
# run B1 (2026-12-06, seventeenth session): A7_next.sh — the whole suite on the GPU after 8b521b0 (the one-bit sketch's
# exact tf32 dot) and 281a813 (fp8 saturation by min / max); stashes the GGUF's first half for B2
ROOT=$PWD; mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
WITCERT_DEVICE=cuda timeout 420 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -3 $OUT/gpu_tests.log | cut -c1-300
