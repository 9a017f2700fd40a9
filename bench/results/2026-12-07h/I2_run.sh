# I2: I1's SGLang part again (I1's --evict value began with '-': argparse refused it) and the hints' GPU test (fixed: a
# bf16 query for the GPU path's refusal case)
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 200 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --evict=-:-,evict_first:-,evict_first:evict_last \
  > $OUT/sg_evict_kernels.log 2>&1
echo "sg evict kernels rc $?"; grep -E "^\| fp8|^# L2|#   (metered|SGLang|off): .*(µs|ms)" $OUT/sg_evict_kernels.log | grep -v "copy\|elementwise\|fill" | cut -c1-170
suite 150 4 tests/kernels/test_eviction_hints.py 2>&1 | tail -4
