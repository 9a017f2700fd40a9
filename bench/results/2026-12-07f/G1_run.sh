# G1 (2026-12-07, twenty-eighth session): the deferred record's closed forms (kernels.plan.DEFER_FORMS): the step probe
# (group radius and the default kernel, forms deferred or not), the GPU tests of the changed paths, SGLang's captured
# call at B 1 / 8 with and without; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 260 python3 bench/tilt_batch_probe.py --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-240
suite 150 8 tests/kernels/test_tilt_batch.py tests/kernels/test_decode_outputs.py tests/kernels/test_excess_form.py \
  tests/kernels/test_kernel_epilogue.py tests/cache/test_graphs.py tests/integrations/test_sglang_graphs.py \
  tests/integrations/test_sglang_pool.py tests/kernels/test_key_f16.py 2>&1 | tail -6
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 1,8 --lens 4096,32768"
for f in 1 0; do timeout 70 $SG --defer-forms $f > $OUT/sg_forms$f.log 2>&1; echo "sg forms$f rc $?"; grep -E "^\| fp8|finish" $OUT/sg_forms$f.log | cut -c1-200; done
