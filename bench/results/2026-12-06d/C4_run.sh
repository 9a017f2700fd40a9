#!/bin/bash
# run C4 (2026-12-06, eighteenth session; C3's lease, after 3809fbf): the embedded model reassembled, `witcert tightness` on
# the GPU's kernel path in bf16 for every scheme's default (and int8's per-head / group forms): each kernel-path cache runs
# the write and decode self-checks; their log lines counted
# (C4 ran these lines inline; they are bench/device_model.sh's, which later calls source)
source bench/device_model.sh
C="int8:backend=kernel;int8:backend=kernel,sketch_box=per-head;int8_dither:backend=kernel;fp8_e4m3:backend=kernel;fp8_e5m2:backend=kernel;fp8_e4m3_scaled:backend=kernel;int4_group:backend=kernel;kivi2:backend=kernel;int8:backend=kernel,sketch_bits=0,window=0/0,weights=none"
timeout 500 python3 bench/results/2026-12-06d/tight_logged.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
# (this call printed the summary with inline Python; bench/tightness_gpu.py --show prints the same lines)
python3 bench/tightness_gpu.py --show $OUT/tight_gpu.jsonl
grep -c "decode self-check passed" $OUT/tight.log; grep -E "selftest (ERROR|WARNING)|self-check failed" $OUT/tight.log | cut -c1-400 | head; grep "decode self-check passed" $OUT/tight.log | cut -c1-300 | head -30
