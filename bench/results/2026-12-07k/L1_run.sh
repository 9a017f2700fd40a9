# L1 (next session; an H200 if one comes, else an H100: say which): issue 36's table with the metered+gate column (eager,
# bench/sglang_gate_cell.py: the certified gate at τ 0.1 and at 0.02, a HostExactStore of the cell's exact K / V),
# B 1 / 8 / 32 × 4K / 32K, B 1 / 8 × 128K, bf16 and fp8, library defaults. carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --defer-tilt --iters 20 --gate 0.1,0.02"
timeout 300 $SG --kv bf16,fp8 --batches 1,8,32 --lens 4096,32768 > $OUT/sg_table.log 2>&1
echo "sg table rc $?"; grep -E "^\| (fp8|bf16)|^#   metered\+gate|^# L2" $OUT/sg_table.log | cut -c1-230
timeout 200 $SG --kv bf16,fp8 --batches 1,8 --lens 131072 > $OUT/sg_table128.log 2>&1
echo "sg table 128K rc $?"; grep -E "^\| (fp8|bf16)|^#   metered\+gate" $OUT/sg_table128.log | cut -c1-230
