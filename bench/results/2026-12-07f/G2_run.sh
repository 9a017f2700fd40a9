# G2 (2026-12-07, twenty-eighth session): the finish in one-warp programs (bench/tilt_batch_probe.py's "forms 1w"),
# then the kernels of SGLang's graphed fp8 calls at B 8 (--kernels); carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
timeout 300 python3 bench/tilt_batch_probe.py --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 > $OUT/probe.log 2>&1
echo "probe rc $?"; grep -E "^\||^#|Error" $OUT/probe.log | cut -c1-260
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8,1 --lens 4096,32768"
timeout 150 $SG --kernels > $OUT/sg_kernels.log 2>&1; echo "sg rc $?"; grep -E "^\| fp8|#   (metered|SGLang|off)" $OUT/sg_kernels.log | cut -c1-200
# ncu of the paged int8 decode pass at B 8 / 32K, metered (group radius) and meter-off: where the metered pass's extra goes
export PYTHONPATH=$PWD:/tmp/site WITCERT_DEVICE=cuda
for m in 1 0; do
  timeout 120 ncu --clock-control none --set full --kernel-name regex:'_decode_kernel' --launch-skip 3 --launch-count 1 \
    python3 bench/ncu_launches.py --shapes 8:32768 --reps 4 --meter $m > $OUT/ncu_pass_m$m.txt 2>&1
  echo "ncu meter $m rc $?"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|DRAM Throughput|Executed Ipc A|Executed Instructions  |Block Size|Grid Size|spends|Local" $OUT/ncu_pass_m$m.txt | sed 's/  */ /g' | cut -c1-220 | head -24
done
