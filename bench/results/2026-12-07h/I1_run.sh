# I1 (2026-12-07, thirtieth session): is SGLang's in-graph merge slow because its partials come from DRAM? The HF
# record merge alone with the L2 flushed before each launch; SGLang's fp8 call's kernels (PDL off) with the pass's L2
# eviction hints (kernels.plan.KV_EVICT / PARTIALS_EVICT); the hints' GPU test; carry [".whl", ".carry/sg"]
# (as run, the --evict value followed a space: argparse took "-:-,…" for an option and the SGLang part exited 2; I2 ran it
# again as written here)
source bench/device_suite.sh > $OUT/setup.log 2>&1
for f in 0 128; do
  timeout 100 python3 bench/merge_parts.py --shapes 8:4096,1:32768 --warps "" --flush-mb $f > $OUT/parts_flush$f.log 2>&1
  echo "parts flush $f rc $?"; python3 - $OUT/parts_flush$f.log <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["B"], r["n"], "S", r["S"], "flush", r.get("flush_us"), " ".join(f"{k[:-3]}={min(v):.1f}" for k, v in r.items() if k.endswith("_us") and isinstance(v, list)))
PY
done
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 200 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --evict=-:-,evict_first:-,evict_first:evict_last \
  > $OUT/sg_evict_kernels.log 2>&1
echo "sg evict kernels rc $?"; grep -E "^\| fp8|^# L2|#   (metered|SGLang|off): .*(µs|ms)" $OUT/sg_evict_kernels.log | grep -v "copy\|elementwise\|fill" | cut -c1-170
suite 150 4 tests/kernels/test_eviction_hints.py 2>&1 | tail -4
