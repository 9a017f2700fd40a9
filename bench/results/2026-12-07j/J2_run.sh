# J2 (after J1, same tree; J3 has the grid's one-reduction A/B): the GPU tests of the adapter's captured path, the paged int8 call with and without KV
# evict_first (cut from I3 / I4), the KV hint on SGLang's fp8 table, the 4-warp metered fp8 tile with the L2 prefetch;
# carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
# the GPU tests of the adapter's captured path
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/integrations/test_sglang_graphs.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/gpu_tests.log | cut -c1-300
# then what I3 cut: the paged int8 call with and without KV evict_first
for e in -:- evict_first:-; do
  timeout 100 python3 bench/decode.py --batches 1,8 --lengths 32768 --heads 32 --evict=$e > $OUT/decode_${e//[:-]/_}.log 2>&1
  echo "decode $e rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode_${e//[:-]/_}.log | cut -c1-220 | tail -6
done
timeout 120 $SG --batches 1,8 --lens 4096,32768 --evict=-:-,evict_first:- > $OUT/sg_evict.log 2>&1
echo "sg evict rc $?"; grep -E "^\| fp8|^# L2" $OUT/sg_evict.log | cut -c1-200
# the 4-warp metered fp8 tile with the L2 prefetch (cut from I3 and I4)
timeout 90 $SG --batches 8 --lens 4096,32768 --metered-tile 128:4:168:1 --evict=-:-,evict_first:- > $OUT/sg_prefetch.log 2>&1
echo "sg prefetch rc $?"; grep -E "^\| fp8|^# (L2|metered 8-bit)" $OUT/sg_prefetch.log | cut -c1-190
