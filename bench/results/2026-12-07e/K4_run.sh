# K4 (2026-12-07, twenty-seventh session): the untilted record merge in one-warp programs (MERGE_UNTILTED_WARPS):
# the GPU tests of the merge, the record and the graphs; the paged A/B; SGLang's fp8 call A/B; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
suite 100 8 tests/kernels/test_kernel_epilogue.py tests/kernels/test_tilt_batch.py tests/kernels/test_decode_outputs.py \
  tests/integrations/test_sglang_graphs.py tests/cache/test_graphs.py 2>&1 | tail -6
timeout 90 python3 bench/merge_warps_ab.py --rounds 3 --shapes 1:32768,8:4096,8:32768 > $OUT/merge_warps_ab.log 2>&1
echo "ab rc $?"; cat $OUT/merge_warps_ab.log
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 1,8 --lens 4096,32768"
for w in 4 1; do timeout 60 $SG --merge-warps $w > $OUT/sg_w$w.log 2>&1; echo "sg w$w rc $?"; grep -E "^\| fp8" $OUT/sg_w$w.log | cut -d'|' -f2-12; done
