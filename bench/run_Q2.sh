# run Q (2026-12-03), second call: the prefetch distance A/B and ncu of the prefetching metered kernel
# ran at commit f9e1ce2: --prefetch-distance was removed since (two tiles ahead was slower); the record is
# bench/results/2026-12-03/tile_ab_distance_2026-12-03_Q.log and bench/results/2026-12-03/ncu_on_prefetch_2026-12-03_Q.txt
for sh in 8:32768 32:32768; do
  timeout 60 python3 bench/tile_ab.py --shape $sh --prefetch 0,1 --only on 2>&1 | grep -v Warning
  timeout 60 python3 bench/tile_ab.py --shape $sh --prefetch 1 --prefetch-distance 2 --only on 2>&1 | grep -v Warning
done > $OUT/tile_ab_distance.log 2>&1
cat $OUT/tile_ab_distance.log
N="ncu --clock-control none -k regex:_decode_kernel --launch-skip 1 --launch-count 1"
S="--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
timeout 100 $N $S python3 bench/ncu_probe.py --shape 8:32768 --meter on > $OUT/ncu_on_prefetch.txt 2>&1
timeout 100 $N --section SourceCounters --page source --print-source sass --csv python3 bench/ncu_probe.py --shape 8:32768 --meter on > $OUT/ncu_on_prefetch_source.csv 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Local Memory" $OUT/ncu_on_prefetch.txt
