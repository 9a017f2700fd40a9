# K3 (2026-12-07, twenty-seventh session, issue 36): the fp8 table on this tree (meter-off e4m3 key dot in fp16),
# B 1 / 8 / 32 x 4K / 32K, then B 1 / 8 at 128K; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 280 $SG --batches 1,8,32 --lens 4096,32768 > $OUT/K3_sg.log 2>&1; echo "sg rc $?"
timeout 200 $SG --batches 1,8 --lens 131072 > $OUT/K3_sg128.log 2>&1; echo "sg128 rc $?"
grep -hE "^\| fp8" $OUT/K3_sg.log $OUT/K3_sg128.log | cut -d'|' -f2-12
