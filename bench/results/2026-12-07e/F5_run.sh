# F5 (prepared 2026-12-07, twenty-seventh session; not run: no device came): the new GPU cases, then the paged A/B of the untilted record merge's
# warps (it compares the two forms' outputs and records first) and SGLang's fp8 call at B 8; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
# the GPU cases written after the last lease (KEY_F16's review patterns, tiny meter-off queries; pdl_call's wiring)
suite 150 8 tests/kernels/test_key_f16.py tests/kernels/test_pdl.py tests/kernels/test_kernel_epilogue.py 2>&1 | tail -6
timeout 90 python3 bench/merge_warps_ab.py --rounds 3 --shapes 1:32768,8:4096,8:32768 > $OUT/merge_warps_ab.log 2>&1
echo "ab rc $?"; cat $OUT/merge_warps_ab.log
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 --lens 4096,32768"
for w in 4 1; do timeout 50 $SG --merge-warps $w > $OUT/sg_w$w.log 2>&1; echo "sg w$w rc $?"; grep -E "^\| fp8" $OUT/sg_w$w.log | cut -d'|' -f2-12; done
