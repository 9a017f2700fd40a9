#!/bin/bash
# run K3 (2026-12-07, twenty-fourth session; K1's lease): `witcert tightness` on the GPU's kernel path (bf16 model) with
# ν / κ as page maxima (the WitCertCache layout) at the default window and at (4, 64), and the other schemes
source bench/device_model.sh
C="int8;int8:window=4/64;kivi2;fp8_e4m3"
timeout 240 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
tail -3 $OUT/tight.log | cut -c1-300
