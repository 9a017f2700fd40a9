# G3 (2026-12-07, twenty-eighth session; replaces G2, which got no device): the GPU tests of the deferred record after
# the review's fixes, the step probe with the one-warp finish column, the kernels of SGLang's graphed fp8 calls at B 8;
# carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
suite 150 8 tests/kernels/test_tilt_batch.py tests/kernels/test_decode_outputs.py tests/kernels/test_excess_form.py \
  tests/kernels/test_kernel_epilogue.py tests/cache/test_graphs.py tests/integrations/test_sglang_graphs.py \
  tests/integrations/test_sglang_pool.py tests/kernels/test_pdl.py 2>&1 | tail -6
timeout 200 python3 bench/tilt_batch_probe.py --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 --lens 4096,32768"
timeout 80 $SG --kernels > $OUT/sg_kernels.log 2>&1; echo "sg rc $?"; grep -E "^\| fp8|#   (metered|SGLang|off)" $OUT/sg_kernels.log | cut -c1-200
