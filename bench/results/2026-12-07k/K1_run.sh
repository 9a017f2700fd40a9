# K1 (2026-12-07): the library's new defaults on the GPU: KV evict_first (kernels.plan.KV_EVICT, run J2) and the grid's
# one reduction (GRID_ONE_REDUCE, run J3). Issue 36's fp8 table as shipped first, then the GPU tests of the changed
# settings and the captured SGLang path, the canary selftests, B 32 / 32K's kernels, the paged int8 call with and
# without the hint. carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 200 $SG --batches 1,8,32 --lens 4096,32768 > $OUT/sg_table.log 2>&1
echo "sg table rc $?"; grep -E "^\| fp8|^# (L2|the grid)" $OUT/sg_table.log | cut -c1-200
timeout 120 $SG --batches 1,8 --lens 131072 > $OUT/sg_table128.log 2>&1
echo "sg table 128K rc $?"; grep -E "^\| fp8" $OUT/sg_table128.log | cut -c1-200
suite 150 6 tests/kernels/test_grid_one_reduce.py tests/kernels/test_eviction_hints.py tests/integrations/test_sglang_graphs.py
selftests "${CANARY_CONFIGS[@]}" > $OUT/selftests.log 2>&1; cat $OUT/selftests.log | cut -c1-200
# where B 32 / 32K's time goes: the captured call's kernels (PDL off), metered and off
timeout 90 $SG --batches 32 --lens 32768 --pdl none --kernels > $OUT/sg_kernels32.log 2>&1
echo "sg kernels B32 rc $?"; grep -E "^\| fp8|^#   (metered|SGLang|off)" $OUT/sg_kernels32.log | cut -c1-200
for e in "" -:-; do
  timeout 100 python3 bench/decode.py --batches 1,8 --lengths 32768 --heads 32 --evict="$e" > $OUT/decode_${e//[:-]/_}.log 2>&1
  echo "decode '$e' rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode_${e//[:-]/_}.log | cut -c1-220 | tail -5
done
