# H3 (2026-12-07, twenty-ninth session), the tree with kernels.plan.MERGE_PARTS 3 at the one-program merge's warps
# (MERGE_PARTS_WARPS None: the output bit for bit): the graphed step (default kernel) against 1 and 2 programs a row,
# SGLang's fp8 call at 3 and 1, the GPU tests of the changed paths; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 200 python3 bench/tilt_batch_probe.py --configs default --batches 1 --lens 4096,32768 --layers 32 --taus -1 \
  --merge-parts 1,2 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
timeout 100 python3 bench/tilt_batch_probe.py --configs default --batches 8 --lens 4096 --layers 32 --taus -1 \
  --merge-parts 1 > $OUT/probe8.log 2>&1
echo "probe8 rc $?"; grep -E "^\| default|^#  " $OUT/probe8.log | cut -c1-260
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 1,8 --lens 4096,32768"
for p in 3 1; do timeout 75 $SG --merge-parts $p > $OUT/sg_parts$p.log 2>&1; echo "sg parts$p rc $?"; grep -E "^\| fp8" $OUT/sg_parts$p.log | cut -c1-200; done
timeout 80 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 \
  --lens 4096,32768 --pdl none --kernels > $OUT/sg_kernels_nopdl.log 2>&1
echo "sg kernels (PDL off) rc $?"; grep -E "^\| fp8|#   (metered|SGLang|off)" $OUT/sg_kernels_nopdl.log | cut -c1-200
suite 120 8 tests/kernels/test_merge_parts.py tests/kernels/test_tilt_batch.py tests/cache/test_graphs.py \
  tests/integrations/test_sglang_graphs.py 2>&1 | tail -6
