#!/bin/bash
# run C4 (2026-12-06, eighteenth session; C3's lease, after 3809fbf): the embedded model reassembled, `witcert tightness` on
# the GPU's kernel path in bf16 for every scheme's default (and int8's per-head / group forms): each kernel-path cache runs
# the write and decode self-checks; their log lines counted
# (C4 ran these lines inline; they are bench/device_model.sh's, which later calls source)
source bench/device_model.sh
C="int8:backend=kernel;int8:backend=kernel,sketch_box=per-head;int8_dither:backend=kernel;fp8_e4m3:backend=kernel;fp8_e5m2:backend=kernel;fp8_e4m3_scaled:backend=kernel;int4_group:backend=kernel;kivi2:backend=kernel;int8:backend=kernel,sketch_bits=0,window=0/0,weights=none"
timeout 500 python3 bench/results/2026-12-06d/tight_logged.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 -c "
import json
for l in open('$OUT/tight_gpu.jsonl'):
    d = json.loads(l)
    if 'error' in d: print(d['config'], 'ERROR', d['error'][-900:]); continue
    print(f\"{d['config']:52s} {d['dtype']} {d['sketch_box']:9s} viol {d['violations']} med {d['median_bound']:.6f} real {d['median_real']:.6f} ratio {d['median_ratio']:.3f} cov05 {d['cov_05']:.4f} x{d['tokens_at_equal_memory']:.3f} {d['wall_s']}s\")
"
grep -c "decode self-check passed" $OUT/tight.log; grep -E "selftest (ERROR|WARNING)|self-check failed" $OUT/tight.log | cut -c1-400 | head; grep "decode self-check passed" $OUT/tight.log | cut -c1-300 | head -30
