#!/bin/bash
# run Y6 (2026-12-05f): fp8_e4m3's metered tile on SGLang's layout: cap, stages, tokens, warps, L2 prefetch (B 8 / 32, deferred tilt)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
SG="--sglang-root $ROOT/.carry/sg/sglang"
for r in 1 2; do
for t in fp8_e4m3,128,1,4,8,168,0 fp8_e4m3,128,1,4,8,0,0 fp8_e4m3,128,2,4,8,168,0 fp8_e4m3,64,1,4,8,168,0 fp8_e4m3,128,1,4,8,168,1 fp8_e4m3,128,1,8,8,0,0 fp8_e4m3,64,2,4,8,168,0 fp8_e4m3,128,1,4,8,232,0; do
  FORCE_TILE=$t timeout 60 python3 .carry/tilepatch2.py $SG --batches 8,32 --lens 4096,32768 --kv fp8 --iters 30 --defer-tilt >> $OUT/ab.log 2>&1
done; done
grep -E "^# fp8|^\| fp8" $OUT/ab.log | cut -c1-100
