#!/bin/bash
# run Y7 (2026-12-05f): bf16 meter-off on SGLang's layout: the block-id (slot) prefetch and the split count
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L
timeout 300 python3 .carry/offpf.py --sglang-root $ROOT/.carry/sg/sglang --iters 50 > $OUT/offpf.log 2>&1; echo "rc $?" >> $OUT/offpf.log
cat $OUT/offpf.log | grep -v "^WitCert"
