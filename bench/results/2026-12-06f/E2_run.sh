#!/bin/bash
# run E2 (2026-12-06, twentieth session; E1's lease): the metered call's time with the two excess sums and without
# (bench/sketch_speed.py --lean: "s+w no-exc" in the same process), then `witcert tightness` on the GPU's kernel path
# (bf16) with the sums (every scheme) and int8 without them
source bench/device_model.sh
nvidia-smi -L
timeout 150 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768 2>&1 | grep -v "^#" | cut -c1-400
C="int8;int8:excess=0;fp8_e4m3;int4_group;kivi2"
timeout 320 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
