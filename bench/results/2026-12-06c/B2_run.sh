#!/bin/bash
# run B2 (2026-12-06, seventeenth session; B1's lease): the embedded model reassembled, `witcert tightness` on the GPU's
# kernel path for the configurations the fixes touch (one-bit sketch at d 64; fp8) and int8's default again
# (this call ran the next lines inline; they are bench/device_model.sh's, which later calls source)
source bench/device_model.sh
C="int8:backend=kernel,sketch_bits=1;int8:backend=kernel,sketch_bits=1,sketch_box=per-head;int8:backend=reference,sketch_bits=1;int8:backend=kernel;fp8_e4m3:backend=kernel;fp8_e5m2:backend=kernel"
timeout 500 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16,fp16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
# (this call printed the summary with inline Python; bench/tightness_gpu.py --show prints the same lines)
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
