#!/bin/bash
# run C5 (2026-12-06, eighteenth session): issue 36's fp8 metered tile on SGLang's call, the default (128 tokens,
# 4 warps, register cap 168: 40 B spilled in the sm_90 SASS) against the same tile uncapped (182 registers, no spill
# offline; never timed: run Z8 timed 64:4:128 only), one process each, side by side in one lease (B 8 / 32K only: the device budget had ~250 s left)
ROOT=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
SG="--sglang-root $ROOT/.carry/sg/sglang"
ARGS="--batches 8 --lens 32768 --kv fp8 --defer-tilt"
timeout 105 python3 bench/sglang_h200.py $SG $ARGS > $OUT/sg_def.log 2>&1; echo "rc $?" >> $OUT/sg_def.log
timeout 105 python3 bench/sglang_h200.py $SG $ARGS --metered-tile 128:4:0 > $OUT/sg_nocap.log 2>&1; echo "rc $?" >> $OUT/sg_nocap.log
for f in sg_def sg_nocap; do echo "== $f"; grep -E "^\| fp8|^rc|Error|error" $OUT/$f.log | cut -c1-160; done
