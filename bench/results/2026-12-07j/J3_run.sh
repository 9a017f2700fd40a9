# J3 (after J1 / J2, same tree): the grid's 13 tile sums in one reduction; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
# the grid's 13 tile sums in one reduction (kernels.plan.GRID_ONE_REDUCE, off by default: 128 -> 92 BAR.SYNC offline):
# its GPU test (bit for bit), then the default int8 kernel's graphed layer without and with it
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_grid_one_reduce.py > $OUT/grid_one_tests.log 2>&1
echo "grid-one tests rc $?"; tail -2 $OUT/grid_one_tests.log | cut -c1-300
for g in 0 1; do
  timeout 120 python3 bench/tilt_batch_probe.py --configs default --batches 1,8 --lens 4096,32768 --layers 32 --taus -1 \
    --grid-one-reduce $g > $OUT/probe_grid$g.log 2>&1
  echo "probe grid-one $g rc $?"; grep -E "^\| default|^# the grid" $OUT/probe_grid$g.log | cut -c1-220
done
