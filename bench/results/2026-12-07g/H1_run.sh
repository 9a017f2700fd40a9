# H1 (2026-12-07, twenty-ninth session): the deferred record merge alone by part and in 2 / 3 programs a row
# (kernels.plan.MERGE_PARTS), SGLang's fp8 call at each count, the GPU tests of the changed paths; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 170 python3 bench/merge_parts.py --shapes 8:4096,8:32768,1:32768,1:4096 --warps 1,2 --out $OUT > $OUT/parts.log 2>&1
echo "parts rc $?"; python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/merge_parts.json"))
print(d["device"])
for r in d["rows"]:
    print(r["B"], r["n"], "S", r["S"], "rows", r["rows"], "w", r["plan_warps"], " ".join(f"{k[:-3]}={min(v):.1f}" for k, v in r.items() if k.endswith("_us")))
    print("  errors:", {k: v[:120] for k, v in r.items() if k.endswith("_error")})
PY
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 1,8 --lens 4096,32768"
for p in 1 2 3; do timeout 75 $SG --merge-parts $p > $OUT/sg_parts$p.log 2>&1; echo "sg parts$p rc $?"; grep -E "^\| fp8" $OUT/sg_parts$p.log | cut -c1-200; done
suite 150 8 tests/kernels/test_merge_parts.py tests/kernels/test_tilt_batch.py tests/kernels/test_kernel_epilogue.py \
  tests/cache/test_graphs.py tests/integrations/test_sglang_graphs.py tests/kernels/test_decode_outputs.py 2>&1 | tail -6
