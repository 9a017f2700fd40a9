#!/bin/bash
# run B2 (2026-12-06, seventeenth session; B1's lease): the embedded model reassembled, `witcert tightness` on the GPU's
# kernel path for the configurations the fixes touch (one-bit sketch at d 64; fp8) and int8's default again
# (this call ran the next lines inline; they are bench/device_model.sh's, which later calls source)
source bench/device_model.sh
C="int8:backend=kernel,sketch_bits=1;int8:backend=kernel,sketch_bits=1,sketch_box=per-head;int8:backend=reference,sketch_bits=1;int8:backend=kernel;fp8_e4m3:backend=kernel;fp8_e5m2:backend=kernel"
timeout 500 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16,fp16 --out $OUT/tight_gpu.jsonl > $OUT/tight.log 2>&1; echo "rc $?"
python3 -c "
import json
for l in open('$OUT/tight_gpu.jsonl'):
    d = json.loads(l)
    if 'error' in d: print(d['config'], 'ERROR', d['error'][-900:]); continue
    print(f\"{d['config']:52s} {d['dtype']} {d['sketch_box']:9s} viol {d['violations']} med {d['median_bound']:.6f} real {d['median_real']:.6f} ratio {d['median_ratio']:.3f} cov05 {d['cov_05']:.4f} x{d['tokens_at_equal_memory']:.3f} {d['wall_s']}s\")
"
