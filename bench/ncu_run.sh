set -x
N="ncu --clock-control none -k regex:_decode_kernel --launch-skip 1 --launch-count 1"
S="--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section ComputeWorkloadAnalysis"
for m in on off; do timeout 150 $N $S python3 bench/ncu_probe.py --shape 8:32768 --meter $m > $OUT/ncu_${m}_sections.txt 2>&1; echo "rc $?"; done
for m in on off; do timeout 150 $N --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python3 bench/ncu_probe.py --shape 8:32768 --meter $m > $OUT/ncu_${m}_source.csv 2>&1; echo "rc $?"; done
ls -la $OUT; grep -E "Warp Cycles Per Issued|Issued Warp|No Eligible|Achieved Occupancy|DRAM Throughput|Duration|Stall|Theoretical Occ|Registers|Eligible Warps" $OUT/ncu_*_sections.txt | head -60
