# G3 (2026-12-07, twenty-eighth session; replaces G2, which got no device; cut to fit the session's last device time):
# the GPU tests of the deferred record after the review's fixes, then the step probe at 4K with the one-warp finish
# column; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
suite 150 8 tests/kernels/test_tilt_batch.py tests/kernels/test_decode_outputs.py tests/kernels/test_excess_form.py \
  tests/kernels/test_kernel_epilogue.py tests/cache/test_graphs.py tests/integrations/test_sglang_graphs.py \
  tests/integrations/test_sglang_pool.py tests/kernels/test_pdl.py 2>&1 | tail -6
timeout 90 python3 bench/tilt_batch_probe.py --configs default --batches 1,8 --lens 4096 --layers 32 --taus -1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
