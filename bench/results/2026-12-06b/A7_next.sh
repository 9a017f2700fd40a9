#!/bin/bash
# RAN as runs B1 / B2 (seventeenth session, bench/results/2026-12-06c/). NOT RUN in the sixteenth session (its device budget was spent): the GPU check of 8b521b0 / 281a813 for the
# next session, one call after A5_run.sh-style setup (carry .carry/sg, .whl; the GGUF halves as in A5 / A6 for the
# tightness part). (1) the suite on the GPU; (2) the one-bit sketch's tightness now that it takes the exact tf32 dot
# (before: 0.1299 / ratio 57.3 from the four-bit masks; the reference path's one-bit figure on the CPU is 0.0208 / 6.93)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
WITCERT_DEVICE=cuda timeout 330 python3 bench/pytest_shards.py -n 15 tests > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | sort -u | cut -c1-200; tail -1 $OUT/gpu_tests.log
# with the model (A6_run.sh's set-up first):
# python3 bench/tightness_gpu.py --configs "int8:backend=kernel,sketch_bits=1;int8:backend=kernel,sketch_bits=1,sketch_box=per-head" --dtypes bf16,fp16
