#!/bin/bash
# run B5 (2026-12-06, seventeenth session), first call: write_witness_sweep.py on the GPU (every scheme's write,
# after 732c46f dropped the fp8 clip); stashes the GGUF's first half for B6
ROOT=$PWD; mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site WITCERT_DEVICE=cuda
nvidia-smi -L
timeout 400 python3 bench/results/2026-12-06c/write_witness_sweep.py > $OUT/sweep.log 2>&1; echo "sweep rc $?"; tail -15 $OUT/sweep.log
