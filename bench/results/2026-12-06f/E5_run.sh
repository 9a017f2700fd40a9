#!/bin/bash
# run E5 (2026-12-06, twentieth session; E4's lease): `witcert tightness` on the GPU's kernel path (bf16) with the
# excess form as e^{2Ξ} max(Â, B̂), every scheme, and int8 without the sums
source bench/device_model.sh
nvidia-smi -L
C="int8;int8:excess=0;fp8_e4m3;int4_group;kivi2"
timeout 240 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
