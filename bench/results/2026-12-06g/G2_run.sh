#!/bin/bash
# run G2 (2026-12-06, twenty-first session; G1's lease): `witcert tightness` on the GPU's kernel path (bf16) with the
# grid and without it (int8), and kivi2 / fp8_e4m3 with it
source bench/device_model.sh
C="int8;int8:grid=0;kivi2;fp8_e4m3"
timeout 200 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
tail -3 $OUT/tight.log | cut -c1-300
