# I3: SGLang's fp8 call, the kernels split with the tilt slots fresh before each capture (bench/sglang_h200.py
# fresh_slots: G4 / H3's --kernels capture was a second capture of the layer, whose merge took the tilt fused) and the
# deferred merge replayed alone (--merge-alone); the table with KV evict_first; the 4-warp metered tile with the L2
# prefetch; the paged int8 call (bench/decode.py) with KV evict_first; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 120 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --merge-alone \
  > $OUT/sg_kernels_fresh.log 2>&1
echo "sg kernels fresh rc $?"; grep -E "^\| fp8|^# L2|#   (metered|SGLang|off): " $OUT/sg_kernels_fresh.log | cut -c1-190
timeout 150 $SG --batches 1,8 --lens 4096,32768 --evict=-:-,evict_first:- > $OUT/sg_table_evict.log 2>&1
echo "sg table rc $?"; grep -E "^\| fp8|^# L2" $OUT/sg_table_evict.log | cut -c1-190
for e in -:- evict_first:-; do
  timeout 120 python3 bench/decode.py --batches 1,8 --lengths 32768 --heads 32 --evict=$e > $OUT/decode_${e//[:-]/_}.log 2>&1
  echo "decode $e rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode_${e//[:-]/_}.log | cut -c1-220 | tail -6
done
timeout 90 $SG --batches 8 --lens 4096,32768 --metered-tile 128:4:168:1 --evict=evict_first:- > $OUT/sg_prefetch.log 2>&1
echo "sg prefetch rc $?"; grep -E "^\| fp8|^# (L2|metered 8-bit)" $OUT/sg_prefetch.log | cut -c1-190
