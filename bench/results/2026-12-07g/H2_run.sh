# H2 (2026-12-07, twenty-ninth session), the tree with kernels.plan.MERGE_PARTS 2 (MERGE_PARTS_WARPS 1) as the default:
# the whole graphed step (the default kernel) against the one-program merge (--merge-parts 1); SGLang's fp8 call at
# 1 and 2 programs a row and with the one-warp metered tile for fp8_e4m3 (ONE_WARP_METERED_SCHEMES / SMALL_GRID_SCHEMES);
# the GPU tests of the changed paths at the new default; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 230 python3 bench/tilt_batch_probe.py --configs default --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 \
  --merge-parts 1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 1,8 --lens 4096,32768"
for a in "--merge-parts 2" "--merge-parts 1" "--one-warp-schemes int8,fp8_e4m3"; do
  f=$(echo $a | tr -d ' -,'); timeout 75 $SG $a > $OUT/sg_$f.log 2>&1; echo "sg $a rc $?"; grep -E "^\| fp8" $OUT/sg_$f.log | cut -c1-200; done
suite 120 8 tests/kernels/test_merge_parts.py tests/kernels/test_tilt_batch.py tests/cache/test_graphs.py \
  tests/integrations/test_sglang_graphs.py 2>&1 | tail -6
