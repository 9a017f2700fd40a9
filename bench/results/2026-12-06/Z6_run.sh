#!/bin/bash
# run Z6 (2026-12-06, fifteenth session; the lease of Z5 if it is still warm): the metered fp8 tile on SGLang's call,
# default (128 tokens, 4 warps, cap 168: 40 B spilled offline, Triton 3.6.0) against 64:4:168 (163 registers, no
# spill, three programs per SM) and 64:4:128 (no spill, four per SM)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
SG="--sglang-root $ROOT/.carry/sg/sglang"
ARGS="--batches 1,8,32 --lens 4096,32768 --kv fp8 --defer-tilt"
timeout 170 python3 bench/sglang_h200.py $SG $ARGS > $OUT/sg_def.log 2>&1; echo "rc $?" >> $OUT/sg_def.log
timeout 170 python3 bench/sglang_h200.py $SG $ARGS --metered-tile 64:4:168 > $OUT/sg_64_168.log 2>&1; echo "rc $?" >> $OUT/sg_64_168.log
timeout 170 python3 bench/sglang_h200.py $SG $ARGS --metered-tile 64:4:128 > $OUT/sg_64_128.log 2>&1; echo "rc $?" >> $OUT/sg_64_128.log
for f in sg_def sg_64_168 sg_64_128; do echo "== $f"; grep -E "^\| fp8|^rc|Error|error" $OUT/$f.log | cut -c1-130; done
