# J1: is the metered SGLang graph's 12-16 µs beyond its kernels (I3) the deferred records' allocation captured in the
# graph? The graph column's capture was the first of its batch size, so TiltBatch.allocate ran inside it and its seven
# fills replay every time (the --kernels / --graph-dump captures came after, with the records already sized). The
# adapter now sizes them in SGLang's capture-mode warm-up; the benchmark emulates that flag (--capture-mode on) or not
# (off: as runs before J1). carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
mkdir -p $OUT/dot
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 150 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --capture-mode off,on --graph-dump $OUT/dot \
  > $OUT/sg_capture_mode.log 2>&1
echo "sg capture-mode rc $?"; grep -E "^\| fp8|^# SGLang capture|#   (metered|SGLang|off): |#   graph" $OUT/sg_capture_mode.log | cut -c1-200
for f in $OUT/dot/*.dot; do echo "== $f"; grep -oE 'label="[^"]{0,100}' $f | sort | uniq -c | sort -rn | head -8 | cut -c1-120; done
# issue 36's table (PDL as shipped, capture mode on as SGLang's runner), B 1 / 8 / 32 × 4K / 32K, then B 1 / 8 × 128K
# (B 32 / 128K: SGLang's own kernel returns NaN on a 4M-slot pool, bench/SGLANG.md run Y9)
timeout 200 $SG --batches 1,8,32 --lens 4096,32768 > $OUT/sg_table.log 2>&1
echo "sg table rc $?"; grep -E "^\| fp8|^# L2" $OUT/sg_table.log | cut -c1-200
timeout 120 $SG --batches 1,8 --lens 131072 > $OUT/sg_table128.log 2>&1
echo "sg table 128K rc $?"; grep -E "^\| fp8" $OUT/sg_table128.log | cut -c1-200
