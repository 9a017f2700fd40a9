# I3: SGLang's fp8 call, the kernels split with the tilt slots fresh before each capture (bench/sglang_h200.py
# fresh_slots: G4 / H3's --kernels capture was a second capture of the layer, whose merge took the tilt fused) and the
# deferred merge replayed alone (--merge-alone); the table with KV evict_first (trimmed to these two for the
# device time left: the paged int8 A/B and the 4-warp tile's L2 prefetch not run); carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 120 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --merge-alone \
  > $OUT/sg_kernels_fresh.log 2>&1
echo "sg kernels fresh rc $?"; grep -E "^\| fp8|^# L2|#   (metered|SGLang|off): " $OUT/sg_kernels_fresh.log | cut -c1-190
timeout 120 $SG --batches 1,8 --lens 4096,32768 --evict=-:-,evict_first:- > $OUT/sg_table_evict.log 2>&1
echo "sg table rc $?"; grep -E "^\| fp8|^# L2" $OUT/sg_table_evict.log | cut -c1-190
