# G2 (2026-12-07, twenty-eighth session): the finish in one-warp programs (bench/tilt_batch_probe.py's "forms 1w"),
# then the kernels of SGLang's graphed fp8 calls at B 8 (--kernels); carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 300 python3 bench/tilt_batch_probe.py --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8,1 --lens 4096,32768"
timeout 150 $SG --kernels > $OUT/sg_kernels.log 2>&1; echo "sg rc $?"; grep -E "^\| fp8|#   (metered|SGLang|off)" $OUT/sg_kernels.log | cut -c1-200
