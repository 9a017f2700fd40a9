# F2 (2026-12-07, twenty-seventh session): the whole test suite on the GPU after the meter-off e4m3 key dot in fp16,
# ncu's duration of the decode pass and the merge apart (bench/ncu_launches.py), the unmetered whole-tiles A/B;
# carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
suite 330 16 tests 2>&1 | tail -12
for s in 1:32768 8:4096; do
  timeout 80 ncu --clock-control none --kernel-name regex:'_decode_kernel|_merge_meter_kernel' --launch-skip 6 \
    --launch-count 4 --metrics gpu__time_duration.sum python3 bench/ncu_launches.py --shapes $s --reps 5 > $OUT/ncu_$s.log 2>&1
  echo "ncu $s rc $?"; grep -E "_kernel|gpu__time" $OUT/ncu_$s.log | sed 's/  */ /g' | cut -c1-150
done
timeout 100 python3 bench/split_ab.py --unmetered --shapes 1:32768,1:8192,1:131072 --rounds 3 > $OUT/split_ab_off.log 2>&1
echo "split_ab rc $?"; cat $OUT/split_ab_off.log
