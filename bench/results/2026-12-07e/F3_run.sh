# F3: ncu's durations with no row tilted (tau inf: the merge's record without the tilt, as SGLang's deferred call),
# then the unmetered whole-tiles A/B
export PYTHONPATH=$PWD:/tmp/site WITCERT_DEVICE=cuda
for s in 1:32768 8:4096; do
  timeout 80 ncu --clock-control none --kernel-name regex:'_decode_kernel|_merge_meter_kernel' --launch-skip 6 \
    --launch-count 4 --metrics gpu__time_duration.sum python3 bench/ncu_launches.py --shapes $s --reps 5 --tau inf > $OUT/ncu_inf_${s/:/_}.log 2>&1
  echo "ncu $s rc $?"; grep -E "_kernel|gpu__time" $OUT/ncu_inf_${s/:/_}.log | sed 's/  */ /g' | cut -c1-150
done
timeout 100 python3 bench/split_ab.py --unmetered --shapes 1:32768,1:8192,1:131072 --rounds 3 > $OUT/split_ab_off.log 2>&1
echo "split_ab rc $?"; cat $OUT/split_ab_off.log
